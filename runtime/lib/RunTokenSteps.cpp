//===- RunTokenSteps.cpp - a run plan's token traffic: dispatch, combine --===//
//
// The steps that move tokens between ranks (ep.dispatch, its fusion with the
// expert GEMM, ep.combine) and ep.dispatch_layout, each checked against the
// reference (Reference.h) under --check.
//
//===----------------------------------------------------------------------===//

#include "RunExecutor.h"

#include <map>
#include <numeric>
#include <stdexcept>

using namespace epic::runtime;

namespace epic::runtime::run {

/// The handle (new, or the cached one) and every rank's call, outputs allocated.
DispatchCalls Executor::dispatchCalls(const RunStep &step, const PlanKernel &k) {
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
  return {handle, std::move(calls)};
}

/// After the launch: the handle read back (an uncached dispatch wrote it),
/// the received rows defined, every rank's record for the checks.
std::vector<DispatchRecord> Executor::dispatchResults(const RunStep &step, const PlanKernel &k,
                                                      const DispatchCalls &d) {
  const EPSpec &spec = k.spec;
  const int64_t L = spec.experts / spec.ranks, K = spec.topk;
  const bool cached = k.dispatchVariant.cached;
  const std::shared_ptr<HandleValue> &handle = d.handle;
  const std::vector<DispatchCall> &calls = d.calls;
  // A field the step does not name (ep.moe_layer's rows are its own): -1.
  auto id = [&](const char *field) {
    return step.fields.object.count(field) ? step.integer(field) : int64_t(-1);
  };
  auto optional = [&](const char *field) -> Value * {
    int64_t i = id(field);
    return i < 0 ? nullptr : &at(i);
  };
  const Value &x = at(step.integer("x"));
  Value *packs = optional("scale_packs"), *w = optional("topk_weights");
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
    int64_t i = id(field);
    RankTensor t = received(device, rows);
    if (i >= 0) {
      Value &v = at(i);
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
  if (int64_t i = id("handle"); i >= 0)
    at(i).handle = handle;
  return checked;
}

void Executor::dispatch(const RunStep &step, const PlanKernel &k) {
  const EPSpec &spec = k.spec;
  const int64_t capacity = receiveRows(spec);
  const bool weights = k.dispatchVariant.weights;
  DispatchCalls d = dispatchCalls(step, k);
  // The fused dispatch + expert GEMM: the same dispatch, and the GEMM's output.
  const bool gemm = k.kind == KernelKind::dispatchGemm;
  std::vector<DispatchGemmCall> gemmCalls;
  if (gemm) {
    const Value &experts = at(step.integer("experts"));
    for (int r = 0; r < R(); ++r)
      gemmCalls.push_back(
          {d.calls[r], experts.tensor[r].device, allocate(k.gemmOutDtype, {capacity, k.gemmN})});
    buffer.dispatchGemm(spec, k.dispatchVariant, gemmCalls);
  } else {
    buffer.dispatch(spec, k.dispatchVariant, d.calls);
  }

  std::vector<DispatchRecord> checked = dispatchResults(step, k, d);
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

void Executor::dispatchLayout(const RunStep &step, const PlanKernel &k) {
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
void Executor::bindBiases(CombineCall &c, const std::vector<Json> &biasIds, int r) {
  if (biasIds.size() >= 1)
    c.bias0 = at(biasIds[0].integer()).tensor[r].device;
  if (biasIds.size() == 2)
    c.bias1 = at(biasIds[1].integer()).tensor[r].device;
}

void Executor::combine(const RunStep &step, const PlanKernel &k) {
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

} // namespace epic::runtime::run
