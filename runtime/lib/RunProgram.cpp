//===- RunProgram.cpp - executing a run plan on an ElasticBuffer ----------===//

#include "epic/runtime/RunProgram.h"

#include "epic/Dialect/EP/IR/EPWindow.h"
#include "epic/runtime/Agrs.h"
#include "epic/runtime/Pp.h"
#include "epic/runtime/VirtualBuffer.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>

using namespace epic::runtime;
using detail::check;

namespace {

/// How the checks see the spec's nodes (the reference's hybrid order and metadata).
NodeLayout topologyOf(const EPSpec &spec) {
  NodeLayout t;
  t.gpusPerNode = spec.scaleupRanks;
  t.hybrid = spec.hybridNodes() > 0;
  return t;
}

/// One rank's tensor: where it lives on the GPU and its host copy.
struct RankTensor {
  DeviceTensor device;
  HostTensor host;
};

/// What a dispatch left: the handle on the GPU and its host copy (routing,
/// metadata, counts), for combine, cached dispatches, printing and checks.
struct HandleValue {
  EPSpec spec;
  std::vector<Handle> device;
  std::vector<DispatchRecord> records;
};

struct Value {
  std::vector<int64_t> index;     ///< per rank
  std::vector<RankTensor> tensor; ///< per rank
  std::shared_ptr<HandleValue> handle;
  /// Received rows of this dispatch: printed in canonical order.
  std::shared_ptr<HandleValue> receivedBy;
};

class Executor {
public:
  Executor(const RunPlan &plan, KernelHost &buffer, const RunOptions &options)
      : plan(plan), buffer(buffer), options(options), values(size_t(plan.values)) {}
  ~Executor() {
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

  RunSummary run() {
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

private:
  int R() const { return plan.ranks; }
  Value &at(int64_t id) { return values.at(size_t(id)); }

  DeviceTensor allocate(const std::string &dtype, std::vector<int64_t> shape, int fill = 0) {
    size_t bytes = size_t(dtypeBytes(dtype));
    for (int64_t d : shape)
      bytes *= size_t(d);
    void *p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    allocations.push_back(p);
    check(cudaMemset(p, fill, std::max<size_t>(bytes, 16)), "cudaMemset");
    return DeviceTensor{reinterpret_cast<uint64_t>(p), dtype, std::move(shape)};
  }
  RankTensor upload(HostTensor host) {
    RankTensor t{allocate(host.dtype, host.shape), std::move(host)};
    check(cudaMemcpy(reinterpret_cast<void *>(t.device.data), t.host.data.data(),
                     t.host.data.size(), cudaMemcpyHostToDevice),
          "cudaMemcpy (upload)");
    return t;
  }
  /// The first `rows` rows of `device` (all of dimension 1..).
  static HostTensor download(const DeviceTensor &device, int64_t rows) {
    std::vector<int64_t> shape = device.shape;
    shape[0] = rows;
    HostTensor host(device.dtype, shape);
    check(cudaMemcpy(host.data.data(), reinterpret_cast<void *>(device.data), host.data.size(),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy (download)");
    return host;
  }
  static std::vector<int32_t> downloadInts(const DeviceTensor &device, int64_t count) {
    std::vector<int32_t> out(size_t(std::max<int64_t>(count, 0)));
    check(cudaMemcpy(out.data(), reinterpret_cast<void *>(device.data), out.size() * 4,
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy (download)");
    return out;
  }
  /// `tensor` cut to its first `rows` rows (same memory).
  static RankTensor received(const DeviceTensor &device, int64_t rows) {
    RankTensor t{device, download(device, rows)};
    t.device.shape[0] = rows;
    return t;
  }

  void host(const RunStep &step) {
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
                ? randomTensor(step.fields.at("distribution").text(),
                               step.fields.at("scale").real(), step.integer("seed"), r,
                               rows.index[r], step.integer("cols"), step.fields.at("dtype").text())
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
  const HostTensor &alikeOnEveryRank(const Value &v, const char *op) const {
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
  AgrsSessions &session(const std::vector<int64_t> &slotBytes) {
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

  void agrsStep(const RunStep &step) {
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
  void ppStep(const RunStep &step) {
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
      check(cudaMemcpy(got.host.data.data(), reinterpret_cast<void *>(got.device.data),
                       size_t(bytes), cudaMemcpyDeviceToHost),
            "cudaMemcpy (reading a PP receive)");
      if (options.check && got.host.data != input.tensor[from].host.data)
        problems.push_back("rank " + std::to_string(r) + " did not receive rank " +
                           std::to_string(from) + "'s tensor bit for bit");
      result.tensor.push_back(std::move(got));
    }
    if (options.check)
      report(step, problems);
  }

  void print(const RunStep &step) {
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

  void dispatch(const RunStep &step, const PlanKernel &k) {
    const EPSpec &spec = k.spec;
    const int64_t L = spec.experts / spec.ranks, K = spec.topk, H = spec.hidden;
    const int64_t capacity = receiveRows(spec);
    const bool cached = k.dispatchVariant.cached, weights = k.dispatchVariant.weights;
    std::shared_ptr<HandleValue> handle;
    if (cached) {
      handle = at(step.integer("cached_handle")).handle;
    } else {
      handle = std::make_shared<HandleValue>();
      handle->spec = spec;
      handle->records.resize(static_cast<size_t>(R()));
    }
    auto optional = [&](const char *field) -> Value * {
      int64_t id = step.integer(field);
      return id < 0 ? nullptr : &at(id);
    };
    const Value &x = at(step.integer("x"));
    Value *packs = optional("scale_packs"), *w = optional("topk_weights");
    std::vector<DispatchCall> calls(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      DispatchCall &c = calls[r];
      const int64_t T = x.tensor[r].device.shape[0];
      c.x = x.tensor[r].device;
      if (packs)
        c.scalePacks = packs->tensor[r].device;
      if (w)
        c.topkWeights = w->tensor[r].device;
      if (cached) {
        c.handle = handle->device[r];
      } else {
        // The handle's tensors as the runtime shapes them (hybrid: per
        // forwarder index, and the forwarder's own).
        std::map<std::string, DeviceTensor> outputs;
        for (const TensorSpec &t : dispatchOutputs(spec, k.dispatchVariant, T))
          outputs[t.name] = allocate(t.dtype, t.shape);
        const Value &idx = at(step.integer("topk_idx"));
        c.handle = Handle{idx.tensor[r].device,
                          outputs.at("dst_buffer_slot_idx"),
                          outputs.at("recv_src_metadata"),
                          outputs.at("psum_num_recv_tokens_per_rank"),
                          outputs.at("num_recv_tokens_per_expert"),
                          outputs.at("psum_num_recv_tokens_per_expert")};
        if (outputs.count("fwd_src_metadata")) {
          c.handle.fwdSrcMetadata = outputs.at("fwd_src_metadata");
          c.handle.fwdCounts = outputs.at("fwd_counts");
        }
        handle->device.push_back(c.handle);
      }
      c.recvX = allocate(spec.dtype, {capacity, H});
      if (spec.isFP8())
        c.recvScalePacks = allocate("f32", {capacity, spec.scalePacks});
      if (!spec.expanded)
        c.recvTopkIdx = allocate("i64", {capacity, K});
      if (weights)
        c.recvTopkWeights =
            spec.expanded ? allocate("f32", {capacity}) : allocate("f32", {capacity, K});
      c.hostCounts = allocate("i32", {1 + L});
    }
    // The fused dispatch + expert GEMM: the same dispatch, and the GEMM's output.
    const bool gemm = k.kind == KernelKind::dispatchGemm;
    std::vector<DispatchGemmCall> gemmCalls;
    if (gemm) {
      const Value &experts = at(step.integer("experts"));
      for (int r = 0; r < R(); ++r)
        gemmCalls.push_back(
            {calls[r], experts.tensor[r].device, allocate(k.gemmOutDtype, {capacity, k.gemmN})});
      buffer.dispatchGemm(spec, k.dispatchVariant, gemmCalls);
    } else {
      buffer.dispatch(spec, k.dispatchVariant, calls);
    }

    // Read back the handle (an uncached dispatch wrote it) and the rows.
    for (int r = 0; r < R() && !cached; ++r) {
      DispatchRecord &rec = handle->records[r];
      const Handle &h = handle->device[r];
      rec.topkIdx = download(h.topkIdx, h.topkIdx.shape[0]);
      rec.hostCounts = downloadInts(calls[r].hostCounts, 1 + L);
      rec.meta = downloadInts(h.recvSrcMetadata, int64_t(rec.hostCounts[0]) * (K + 2));
      rec.psumRank = downloadInts(h.psumNumRecvTokensPerRank, h.psumNumRecvTokensPerRank.shape[0]);
      rec.numRecvPerExpert = downloadInts(h.numRecvTokensPerExpert, L);
      rec.psumRecvPerExpert = downloadInts(h.psumNumRecvTokensPerExpert, L);
    }
    std::vector<DispatchRecord> checked(static_cast<size_t>(R()));
    auto define = [&](const char *field, const DeviceTensor &device, int64_t rows) {
      int64_t id = step.integer(field);
      RankTensor t = received(device, rows);
      if (id >= 0) {
        Value &v = at(id);
        v.receivedBy = handle;
        v.tensor.push_back(t);
      }
      return t.host;
    };
    for (int r = 0; r < R(); ++r) {
      DispatchRecord rec = handle->records[r]; // routing, metadata and counts
      const DispatchCall &c = calls[r];
      int64_t rows = rec.hostCounts[0];
      if (spec.expanded)
        rows = std::accumulate(rec.hostCounts.begin() + 1, rec.hostCounts.end(), int64_t(0));
      rec.x = x.tensor[r].host;
      if (packs)
        rec.scalePacks = packs->tensor[r].host;
      if (w)
        rec.topkWeights = w->tensor[r].host;
      rec.recvX = define("recv_x", c.recvX, rows);
      if (c.recvScalePacks.given())
        rec.recvScalePacks = define("recv_scale_packs", c.recvScalePacks, rows);
      if (c.recvTopkIdx.given())
        rec.recvTopkIdx = define("recv_topk_idx", c.recvTopkIdx, rows);
      if (c.recvTopkWeights.given())
        rec.recvTopkWeights = define("recv_topk_weights", c.recvTopkWeights, rows);
      checked[r] = std::move(rec);
    }
    at(step.integer("handle")).handle = handle;
    std::vector<GemmRecord> products;
    for (int r = 0; r < R() && gemm; ++r) {
      RankTensor out = received(gemmCalls[r].gemmOut, checked[r].recvX.rows());
      products.push_back({checked[r].recvX, at(step.integer("experts")).tensor[r].host, out.host});
      at(step.integer("result")).tensor.push_back(std::move(out));
    }
    if (options.check) {
      std::vector<std::string> problems =
          checkDispatch(spec, weights, k.dispatchVariant.zeroPadding, checked, topologyOf(spec));
      if (gemm)
        for (std::string &p : checkGroupedGemm(spec, checked, products))
          problems.push_back(std::move(p));
      report(step, problems);
    }
  }

  void groupedGemm(const RunStep &step, const PlanKernel &k) {
    const Value &x = at(step.integer("x")), &weights = at(step.integer("weights"));
    std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
    const bool fp8 = step.integer("x_scales") >= 0;
    const Value *xScales = fp8 ? &at(step.integer("x_scales")) : nullptr;
    const Value *weightScales = fp8 ? &at(step.integer("weight_scales")) : nullptr;
    std::vector<GroupedGemmCall> calls(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      const int64_t rows = x.tensor[r].device.shape[0];
      // Padding rows stay as allocated: zero.
      calls[r] = {x.tensor[r].device, weights.tensor[r].device,
                  allocate(k.gemmOutDtype, {rows, k.gemmN}),
                  handle->device[r].psumNumRecvTokensPerExpert};
      if (fp8) {
        calls[r].xScales = xScales->tensor[r].device;
        calls[r].weightScales = weightScales->tensor[r].device;
      }
    }
    buffer.groupedGemm(k.spec, calls);
    std::vector<GemmRecord> products;
    for (int r = 0; r < R(); ++r) {
      RankTensor out = received(calls[r].out, calls[r].out.shape[0]);
      products.push_back({x.tensor[r].host, weights.tensor[r].host, out.host});
      if (fp8) {
        products.back().xScales = xScales->tensor[r].host;
        products.back().weightScales = weightScales->tensor[r].host;
      }
      Value &result = at(step.integer("result"));
      result.receivedBy = x.receivedBy; // rows of the dispatch: printed in canonical order
      result.tensor.push_back(std::move(out));
    }
    if (options.check)
      report(step, checkGroupedGemm(k.spec, handle->records, products));
  }

  void swiglu(const RunStep &step, const PlanKernel &k) {
    const Value &gateUp = at(step.integer("gate_up"));
    std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
    const bool fp8 = step.integer("scales") >= 0;
    const Value *weights = step.integer("weights") >= 0 ? &at(step.integer("weights")) : nullptr;
    std::vector<SwigluCall> calls(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      const int64_t rows = gateUp.tensor[r].device.shape[0];
      // Padding rows stay as allocated: zero (the check says so).
      calls[r] = {gateUp.tensor[r].device, allocate(k.gemmOutDtype, {rows, k.gemmN}),
                  handle->device[r].psumNumRecvTokensPerExpert};
      if (fp8)
        calls[r].scales = allocate("f32", {rows, k.gemmN / 128});
      if (weights)
        calls[r].weights = weights->tensor[r].device;
    }
    buffer.swiglu(k.spec, calls);
    std::vector<SwigluRecord> records;
    Value &result = at(step.integer("result"));
    result.receivedBy = gateUp.receivedBy; // rows of the dispatch: printed in canonical order
    for (int r = 0; r < R(); ++r) {
      RankTensor out = received(calls[r].out, calls[r].out.shape[0]);
      records.push_back({gateUp.tensor[r].host, out.host, {}, {}});
      if (weights)
        records.back().weights = weights->tensor[r].host;
      result.tensor.push_back(std::move(out));
      if (fp8) {
        RankTensor scales = received(calls[r].scales, calls[r].scales.shape[0]);
        records.back().scales = scales.host;
        Value &scaleValue = at(step.integer("scales"));
        scaleValue.receivedBy = gateUp.receivedBy;
        scaleValue.tensor.push_back(std::move(scales));
      }
    }
    if (options.check)
      report(step, checkSwiglu(k.spec, handle->records, records));
  }

  void dispatchLayout(const RunStep &step, const PlanKernel &k) {
    const EPSpec &spec = k.spec;
    const Value &idx = at(step.integer("topk_idx"));
    std::vector<LayoutCall> calls(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      const DeviceTensor &routing = idx.tensor[r].device;
      calls[r] = {routing, allocate("i32", {spec.ranks}), allocate("i32", {spec.experts}),
                  allocate("i1", {routing.shape[0], spec.ranks})};
    }
    buffer.dispatchLayout(spec, calls);
    std::vector<LayoutRecord> checked(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      const LayoutCall &c = calls[r];
      RankTensor perRank = received(c.numTokensPerRank, spec.ranks);
      RankTensor perExpert = received(c.numTokensPerExpert, spec.experts);
      RankTensor inRank = received(c.isTokenInRank, c.isTokenInRank.shape[0]);
      const int32_t *ranks = perRank.host.as<int32_t>(), *experts = perExpert.host.as<int32_t>();
      checked[r] = {idx.tensor[r].host, std::vector<int32_t>(ranks, ranks + spec.ranks),
                    std::vector<int32_t>(experts, experts + spec.experts), inRank.host};
      at(step.integer("num_tokens_per_rank")).tensor.push_back(std::move(perRank));
      at(step.integer("num_tokens_per_expert")).tensor.push_back(std::move(perExpert));
      at(step.integer("is_token_in_rank")).tensor.push_back(std::move(inRank));
    }
    if (options.check)
      report(step, checkDispatchLayout(spec, checked));
  }

  /// A combine's biases (at most two; RunPlan::parse checks) for rank r.
  void bindBiases(CombineCall &c, const std::vector<Json> &biasIds, int r) {
    if (biasIds.size() >= 1)
      c.bias0 = at(biasIds[0].integer()).tensor[r].device;
    if (biasIds.size() == 2)
      c.bias1 = at(biasIds[1].integer()).tensor[r].device;
  }

  void combine(const RunStep &step, const PlanKernel &k) {
    const EPSpec &spec = k.spec;
    const int64_t K = spec.topk, H = spec.hidden;
    const Value &x = at(step.integer("x"));
    std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
    const int64_t weightsId = step.integer("topk_weights");
    const auto &biasIds = step.fields.at("biases").list();
    std::vector<CombineCall> calls(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      CombineCall &c = calls[r];
      const int64_t T = handle->device[r].topkIdx.shape[0];
      c.x = x.tensor[r].device;
      c.handle = handle->device[r];
      if (weightsId >= 0) {
        c.topkWeights = at(weightsId).tensor[r].device;
        c.combinedTopkWeights = allocate("f32", {T, K});
      }
      bindBiases(c, biasIds, r);
      c.combinedX = allocate("bf16", {T, H});
    }
    buffer.combine(spec, k.combineVariant, calls);

    std::vector<CombineRecord> checked(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      const CombineCall &c = calls[r];
      CombineRecord &rec = checked[r];
      RankTensor out = received(c.combinedX, c.combinedX.shape[0]);
      rec.combinedX = out.host;
      at(step.integer("combined_x")).tensor.push_back(std::move(out));
      if (weightsId >= 0) {
        RankTensor ow = received(c.combinedTopkWeights, c.combinedTopkWeights.shape[0]);
        rec.combinedTopkWeights = ow.host;
        rec.topkWeights = at(weightsId).tensor[r].host;
        if (int64_t id = step.integer("combined_topk_weights"); id >= 0)
          at(id).tensor.push_back(std::move(ow));
      }
      rec.x = x.tensor[r].host;
      for (const Json &id : biasIds)
        rec.biases.push_back(at(id.integer()).tensor[r].host);
    }
    if (options.check)
      report(step, checkCombine(spec, handle->records, checked, topologyOf(spec)));
  }

  /// The expert GEMM fused with the combine of its output: both results are
  /// checked, the GEMM's against a float64 product and the combine's against
  /// the reference combine of the rows the kernel computed (the fused kernel
  /// is bitwise the two ops one after the other).
  void gemmCombine(const RunStep &step, const PlanKernel &k) {
    const EPSpec &spec = k.spec;
    const Value &x = at(step.integer("x")), &weights = at(step.integer("weights"));
    std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
    const auto &biasIds = step.fields.at("biases").list();
    std::vector<GemmCombineCall> calls(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      GemmCombineCall &c = calls[r];
      const int64_t T = handle->device[r].topkIdx.shape[0];
      c.lhs = x.tensor[r].device;
      c.weights = weights.tensor[r].device;
      // The GEMM's output: padding rows stay as allocated (zero).
      c.combine.x = allocate("bf16", {c.lhs.shape[0], spec.hidden});
      c.combine.handle = handle->device[r];
      bindBiases(c.combine, biasIds, r);
      c.combine.combinedX = allocate("bf16", {T, spec.hidden});
    }
    buffer.gemmCombine(spec, k.combineVariant.biases, calls);

    std::vector<GemmRecord> products;
    std::vector<CombineRecord> combined(static_cast<size_t>(R()));
    for (int r = 0; r < R(); ++r) {
      const GemmCombineCall &c = calls[r];
      RankTensor y = received(c.combine.x, c.combine.x.shape[0]);
      RankTensor out = received(c.combine.combinedX, c.combine.combinedX.shape[0]);
      products.push_back({x.tensor[r].host, weights.tensor[r].host, y.host});
      CombineRecord &rec = combined[r];
      rec.x = y.host;
      rec.combinedX = out.host;
      for (const Json &id : biasIds)
        rec.biases.push_back(at(id.integer()).tensor[r].host);
      Value &result = at(step.integer("result"));
      result.receivedBy = x.receivedBy; // rows of the dispatch: printed in canonical order
      result.tensor.push_back(std::move(y));
      at(step.integer("combined_x")).tensor.push_back(std::move(out));
    }
    if (options.check) {
      std::vector<std::string> problems = checkGroupedGemm(spec, handle->records, products);
      for (std::string &p : checkCombine(spec, handle->records, combined, topologyOf(spec)))
        problems.push_back(std::move(p));
      report(step, problems);
    }
  }

  void report(const RunStep &step, const std::vector<std::string> &problems) {
    ++summary.checks;
    summary.failures += !problems.empty();
    std::fprintf(options.out, "check %s at %s: %s\n", step.op.c_str(), step.loc.c_str(),
                 problems.empty() ? "ok" : "FAILED");
    for (const std::string &problem : problems)
      std::fprintf(options.out, "  %s\n", problem.c_str());
  }

  const RunPlan &plan;
  KernelHost &buffer;
  const RunOptions &options;
  std::vector<Value> values;
  std::vector<void *> allocations;
  RunSummary summary;
  std::unique_ptr<AgrsSessions> agrs; ///< made by the first AGRS step
  cudaStream_t agrsStream = nullptr;
  std::unique_ptr<PpChannels> pp; ///< made by the first PP step, its slots of ppBytes
  int64_t ppBytes = 0;
};

} // namespace

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
  return Executor(plan, buffer, options).run();
}
