//===- RunProgram.cpp - executing a run plan on an ElasticBuffer ----------===//
//
// The executor's loop, its host steps (inputs, printing) and its copy-engine
// steps (AGRS, PP); the kernel steps are in RunTokenSteps.cpp and
// RunExpertSteps.cpp (RunExecutor.h says which is where).
//
//===----------------------------------------------------------------------===//

#include "RunExecutor.h"

#include "epic/Dialect/EP/IR/EPWindow.h"
#include "epic/runtime/VirtualBuffer.h"

#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>

using namespace epic::runtime;
using detail::check;

namespace epic::runtime::run {

NodeLayout topologyOf(const EPSpec &spec) {
  NodeLayout t;
  t.gpusPerNode = spec.scaleupRanks;
  t.hybrid = spec.hybridNodes() > 0;
  return t;
}

Executor::~Executor() {
  if (agrs && agrs->isOpen()) {
    try {
      agrs->destroy(nullptr);
    } catch (...) { // a destructor throws nothing; the buffer goes with the program
    }
  }
  if (agrsStream)
    cudaStreamDestroy(agrsStream);
  for (void *p : allocations)
    cudaFree(p);
}

RunSummary Executor::run() {
  std::vector<PlanKernel> kernels = plan.kernels();
  size_t next = 0;
  for (const RunStep &step : plan.steps) {
    try {
      if (!isKernelStep(step)) {
        host(step);
        continue;
      }
      const PlanKernel &k = kernels.at(next++);
      switch (k.kind) {
      case KernelKind::dispatch:
      case KernelKind::dispatchGemm:
        dispatch(step, k);
        break;
      case KernelKind::combine:
        combine(step, k);
        break;
      case KernelKind::groupedGemm:
        groupedGemm(step, k);
        break;
      case KernelKind::swiglu:
        swiglu(step, k);
        break;
      case KernelKind::dispatchLayout:
        dispatchLayout(step, k);
        break;
      case KernelKind::gemmCombine:
        gemmCombine(step, k);
        break;
      case KernelKind::moeLayer:
        moeLayer(step, k);
        break;
      case KernelKind::engramFetch:
        // Its tables are a buffer's state (engram_write), not a program's values.
        throw std::invalid_argument("engram_fetch is not a run-plan step: fetch through "
                                    "ElasticBuffer.engram_fetch");
      }
    } catch (const std::invalid_argument &e) {
      throw std::invalid_argument(step.op + " at " + step.loc + ": " + e.what());
    }
  }
  return summary;
}

void Executor::host(const RunStep &step) {
  if (step.op == "tokens") {
    Value &v = at(step.integer("result"));
    for (const Json &count : step.fields.at("per_rank").list())
      v.index.push_back(count.integer());
  } else if (step.op == "constant") {
    at(step.integer("result")).index.assign(size_t(R()), step.integer("value"));
  } else if (step.op == "dim") {
    const Value &source = at(step.integer("source"));
    Value &v = at(step.integer("result"));
    for (const RankTensor &t : source.tensor)
      v.index.push_back(t.device.shape.at(size_t(step.integer("dim"))));
  } else if (step.op == "random" || step.op == "routing") {
    const Value &rows = at(step.integer("rows"));
    Value &v = at(step.integer("result"));
    for (int r = 0; r < R(); ++r) {
      HostTensor t =
          step.op == "random"
              ? randomTensor(step.fields.at("distribution").text(), step.fields.at("scale").real(),
                             step.integer("seed"), r, rows.index[r], step.integer("cols"),
                             step.fields.at("dtype").text())
              : randomRouting(step.integer("experts"), step.fields.at("masked").real(),
                              step.integer("seed"), r, rows.index[r], step.integer("topk"));
      if (step.fields.object.count("row_shape")) { // [rows, D1, D2]
        t.shape.resize(1);
        for (const Json &d : step.fields.at("row_shape").list())
          t.shape.push_back(d.integer());
      }
      v.tensor.push_back(upload(std::move(t)));
    }
  } else if (step.op == "print") {
    print(step);
  } else if (step.op == "all_gather" || step.op == "reduce_scatter") {
    agrsStep(step);
  } else if (step.op == "pp_send_recv") {
    ppStep(step);
  }
}

/// Rank 0's tensor of `v`, after checking every rank's has its shape (the
/// copy-engine steps move slots of one size); `op` names the step.
const HostTensor &Executor::alikeOnEveryRank(const Value &v, const char *op) const {
  const HostTensor &first = v.tensor.at(0).host;
  for (int r = 1; r < R(); ++r)
    if (v.tensor[r].host.shape != first.shape)
      throw std::invalid_argument("rank " + std::to_string(r) +
                                  "'s input has another shape than rank 0's (" + op +
                                  "'s inputs are alike on every rank)");
  return first;
}

/// The program's AGRS session (copy engines, no kernel): one session as
/// large as the window allows, ended and opened again when a step does not
/// fit in it; every step's results are copied out of the window at once.
AgrsSessions &Executor::session(const std::vector<int64_t> &slotBytes) {
  if (!agrs) {
    // The copies need a stream of their own (a batch cannot go on the legacy stream).
    check(cudaStreamCreate(&agrsStream), "cudaStreamCreate (the AGRS copies' stream)");
    agrs = std::make_unique<AgrsSessions>(buffer);
    agrs->setConfig(buffer.windowBytes() - epic::ep::window::kControlEnd, 32);
  }
  if (agrs->isOpen() && !agrs->fits(slotBytes))
    agrs->destroy(nullptr);
  if (!agrs->isOpen())
    agrs->create();
  return *agrs;
}

void Executor::agrsStep(const RunStep &step) {
  const bool scatter = step.op == "reduce_scatter";
  std::vector<int64_t> inputIds, resultIds;
  if (scatter) {
    inputIds.push_back(step.integer("input"));
    resultIds.push_back(step.integer("result"));
  } else {
    for (const Json &id : step.fields.at("inputs").list())
      inputIds.push_back(id.integer());
    for (const Json &id : step.fields.at("gathered").list())
      resultIds.push_back(id.integer());
  }
  // Every rank's tensor i alike (the slots have one size).
  std::vector<int64_t> bytes, slotBytes;
  for (int64_t id : inputIds) {
    const HostTensor &first = alikeOnEveryRank(at(id), "an AGRS op");
    bytes.push_back(int64_t(first.data.size()));
    slotBytes.push_back(bytes.back() / (scatter ? R() : 1));
  }
  AgrsSessions &s = session(slotBytes);
  std::vector<std::vector<uint64_t>> addresses(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r)
    for (int64_t id : inputIds)
      addresses[r].push_back(at(id).tensor[r].device.data);
  AgrsSessions::Issued issued = scatter ? s.scatterBlocks(addresses, bytes, nullptr, agrsStream)
                                        : s.allGather(addresses, bytes, nullptr, agrsStream);
  s.wait(issued.sequence, nullptr);
  check(cudaDeviceSynchronize(), "waiting for the AGRS step");

  std::vector<std::string> problems;
  for (size_t i = 0; i < inputIds.size(); ++i) {
    const Value &input = at(inputIds[i]);
    const AgrsBlock &block = issued.blocks[i];
    const HostTensor &like = input.tensor[0].host;
    std::vector<HostTensor> inputs, results;
    for (int r = 0; r < R(); ++r) {
      inputs.push_back(input.tensor[r].host);
      // Rank r's window block: [R][slot], copied out of the window.
      HostTensor slots(like.dtype, {int64_t(R()) * block.slotBytes / dtypeBytes(like.dtype)});
      check(cudaMemcpy(slots.data.data(),
                       static_cast<char *>(buffer.windowMemory(r)) + block.offset,
                       slots.data.size(), cudaMemcpyDeviceToHost),
            "cudaMemcpy (reading the AGRS block)");
      HostTensor result;
      if (scatter) {
        // The blocks moved by the copy engines, summed here on the host (f32 in rank
        // order): the runtime has no reduction kernel; Python's reduce_scatter sums on
        // the GPU.
        std::vector<HostTensor> parts;
        for (int s = 0; s < R(); ++s) {
          HostTensor part(like.dtype, like.shape);
          part.shape[0] /= R();
          std::memcpy(part.data.data(), slots.data.data() + size_t(s) * block.slotBytes,
                      size_t(block.slotBytes));
          parts.push_back(std::move(part));
        }
        // The slots of rank r are every rank's block r: check the transport first.
        for (int s = 0; s < R(); ++s)
          if (std::memcmp(parts[s].data.data(),
                          input.tensor[s].host.data.data() + size_t(r) * block.slotBytes,
                          size_t(block.slotBytes)) != 0)
            problems.push_back("rank " + std::to_string(r) + ": the block from rank " +
                               std::to_string(s) + " differs from its input's block " +
                               std::to_string(r));
        result = sumInRankOrder(parts);
      } else {
        result = slots;
        result.shape = {int64_t(R())};
        result.shape.insert(result.shape.end(), like.shape.begin(), like.shape.end());
      }
      results.push_back(result);
      at(resultIds[i]).tensor.push_back(upload(std::move(result)));
    }
    if (options.check)
      for (std::string &p :
           scatter ? checkReduceScatter(inputs, results) : checkAllGather(inputs, results))
        problems.push_back(std::move(p));
  }
  if (options.check)
    report(step, problems);
}

/// Every rank sends its input to its neighbour `to` through the PP slots
/// (copy engines), then every rank receives from the other side: all sends
/// before any receive, as one stream orders a virtual world's ranks.
void Executor::ppStep(const RunStep &step) {
  const Value &input = at(step.integer("input"));
  const HostTensor &like = alikeOnEveryRank(input, "a PP step");
  const int64_t bytes = int64_t(like.data.size());
  // The PP slots lie where an AGRS session's blocks do.
  if (agrs && agrs->isOpen())
    agrs->destroy(nullptr);
  if (!pp)
    pp = std::make_unique<PpChannels>(buffer);
  if (!pp->configured() || bytes > ppBytes) {
    pp->setConfig(bytes, 1);
    ppBytes = bytes;
  }
  const bool next = step.fields.at("to").text() == "next";
  auto ring = [&](int r, int step) { return ((r + step) % R() + R()) % R(); };
  for (int r = 0; r < R(); ++r)
    pp->send(r, input.tensor[r].device.data, bytes, ring(r, next ? 1 : -1), nullptr);
  Value &result = at(step.integer("result"));
  std::vector<std::string> problems;
  for (int r = 0; r < R(); ++r) {
    RankTensor got{allocate(like.dtype, like.shape), HostTensor(like.dtype, like.shape)};
    const int from = ring(r, next ? -1 : 1);
    pp->recv(r, got.device.data, bytes, from, nullptr);
    check(cudaMemcpy(got.host.data.data(), reinterpret_cast<void *>(got.device.data), size_t(bytes),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy (reading a PP receive)");
    if (options.check && got.host.data != input.tensor[from].host.data)
      problems.push_back("rank " + std::to_string(r) + " did not receive rank " +
                         std::to_string(from) + "'s tensor bit for bit");
    result.tensor.push_back(std::move(got));
  }
  if (options.check)
    report(step, problems);
}

void Executor::print(const RunStep &step) {
  const Value &v = at(step.integer("value"));
  std::FILE *out = options.out;
  std::fprintf(out, "%s at %s:\n", step.fields.at("what").text().c_str(), step.loc.c_str());
  for (int r = 0; r < R(); ++r) {
    std::fprintf(out, "  rank %d: ", r);
    if (!v.index.empty()) {
      std::fprintf(out, "%lld\n", (long long)v.index[r]);
    } else if (v.handle) {
      const DispatchRecord &rec = v.handle->records[r];
      std::fprintf(out, "received %d tokens; per local expert (aligned):", rec.hostCounts[0]);
      for (size_t e = 1; e < rec.hostCounts.size(); ++e)
        std::fprintf(out, " %d", rec.hostCounts[e]);
      std::fprintf(out, "\n");
    } else {
      const HostTensor &t = v.tensor[r].host;
      std::vector<int64_t> rows;
      if (v.receivedBy) {
        rows = canonicalRows(v.receivedBy->spec, v.receivedBy->records[r]);
      } else {
        rows.resize(size_t(t.rows()));
        std::iota(rows.begin(), rows.end(), 0);
      }
      printTensor(out, t, rows, step.integer("rows"));
    }
  }
}

void Executor::report(const RunStep &step, const std::vector<std::string> &problems) {
  ++summary.checks;
  summary.failures += !problems.empty();
  std::fprintf(options.out, "check %s at %s: %s\n", step.op.c_str(), step.loc.c_str(),
               problems.empty() ? "ok" : "FAILED");
  for (const std::string &problem : problems)
    std::fprintf(options.out, "  %s\n", problem.c_str());
}

} // namespace epic::runtime::run

RunSummary epic::runtime::executePlan(const RunPlan &plan, KernelHost &buffer,
                                      const RunOptions &options) {
  if (buffer.worldSize() != plan.ranks)
    throw std::invalid_argument("the program runs on " + std::to_string(plan.ranks) +
                                " ranks but the buffer's world has " +
                                std::to_string(buffer.worldSize()));
  if (buffer.gpusPerNode() != plan.gpusPerNode)
    throw std::invalid_argument("the program runs on nodes of " + std::to_string(plan.gpusPerNode) +
                                " ranks but the buffer's world has nodes of " +
                                std::to_string(buffer.gpusPerNode()));
  return run::Executor(plan, buffer, options).run();
}
