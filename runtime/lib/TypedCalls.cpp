//===- TypedCalls.cpp - DeepEP's calls as plans of ep entries -------------===//
//
// The typed entry points of KernelHost: each checks its calls (Calls.h) and
// the world, asks for the kernels of its ep op (a KernelRequest) and makes a
// plan.

#include "epic/runtime/KernelHost.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

using namespace epic::runtime;
using detail::check;

namespace {

/// Reads every rank's routing (`topkIdx(call)`) back in one synchronization
/// and range-checks it (skipped while `stream` is being captured: a graph
/// cannot synchronize).
template <typename Call, typename TopkIdx>
void checkRoutingOf(const EPSpec &spec, const std::vector<Call> &calls, TopkIdx topkIdx,
                    void *stream) {
  if (detail::capturing(stream))
    return;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  std::vector<std::vector<int64_t>> routing;
  for (const Call &call : calls) {
    const DeviceTensor &idx = topkIdx(call);
    routing.emplace_back(size_t(idx.shape[0]) * spec.topk);
    check(cudaMemcpyAsync(routing.back().data(), reinterpret_cast<const void *>(idx.data),
                          routing.back().size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                          cudaStream),
          "reading topk_idx back");
  }
  check(cudaStreamSynchronize(cudaStream), "cudaStreamSynchronize");
  for (size_t i = 0; i < calls.size(); ++i)
    checkTopkIndices(spec, routing[i].data(), topkIdx(calls[i]).shape[0]);
}

} // namespace

KernelHost::Plan KernelHost::planDispatch(const EPSpec &spec, const DispatchVariant &variant,
                                          const std::vector<DispatchCall> &calls, int blocks,
                                          void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records = recordsOf(
      calls, [&](const DispatchCall &call) { return dispatchRecord(spec, variant, call); });
  return plan(dispatchRequest(spec, variant), records, blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planCombine(const EPSpec &spec, const CombineVariant &variant,
                                         const std::vector<CombineCall> &calls, int blocks,
                                         void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records =
      recordsOf(calls, [&](const CombineCall &call) { return combineRecord(spec, variant, call); });
  return plan(combineRequest(spec, variant), records, blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planGroupedGemm(const EPSpec &spec,
                                             const std::vector<GroupedGemmCall> &calls, int blocks,
                                             void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records =
      recordsOf(calls, [&](const GroupedGemmCall &call) { return groupedGemmRecord(spec, call); });
  checkRanksAgree(calls, "the weights' shape or the output dtype", gemmOperands);
  const GroupedGemmCall &first = calls.front();
  const int64_t n = first.weights.shape[gemmWeightsLayout(spec.isFP8()).n];
  return plan(groupedGemmRequest(spec, n, first.out.dtype, "", first.x.shape[1]), records, blocks,
              stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planSwiglu(const EPSpec &spec, const std::vector<SwigluCall> &calls,
                                        int blocks, void *stream,
                                        std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records =
      recordsOf(calls, [&](const SwigluCall &call) { return swigluRecord(spec, call); });
  checkRanksAgree(calls, "the gate/up widths or the dtypes", swigluOperands);
  const SwigluCall &first = calls.front();
  return plan(swigluRequest(spec, first.gateUp.shape[1] / 2, first.gateUp.dtype, first.out.dtype),
              records, blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planDispatchGemm(const EPSpec &spec, const DispatchVariant &variant,
                                              const std::vector<DispatchGemmCall> &calls,
                                              int blocks, void *stream,
                                              std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records = recordsOf(
      calls, [&](const DispatchGemmCall &call) { return dispatchGemmRecord(spec, variant, call); });
  checkRanksAgree(calls, "the experts' shape or the output dtype", fusedGemmOperands);
  const DispatchGemmCall &first = calls.front();
  return plan(dispatchGemmRequest(spec, variant, first.experts.shape[2], first.gemmOut.dtype),
              records, blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planMoeLayer(const EPSpec &spec, const DispatchVariant &variant,
                                          const std::vector<MoeLayerCall> &calls, int blocks,
                                          void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records = recordsOf(
      calls, [&](const MoeLayerCall &call) { return moeLayerRecord(spec, variant, call); });
  // One kernel serves every rank: the experts' intermediate size (the weights'
  // shapes were checked against it per rank).
  checkRanksAgree(calls, "the experts' intermediate sizes", moeLayerOperands);
  return plan(moeLayerRequest(spec, variant.topkIdxBits, moeLayerOperands(calls.front())), records,
              blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planDispatchLayout(const EPSpec &spec,
                                                const std::vector<LayoutCall> &calls, int blocks,
                                                void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records =
      recordsOf(calls, [&](const LayoutCall &call) { return layoutRecord(spec, call); });
  checkRanksAgree(calls, "topk_idx's dtype", layoutOperands);
  const std::string &idx = calls.front().topkIdx.dtype; // i32 or i64 (layoutRecord)
  return plan(dispatchLayoutRequest(spec, idx == "i32" ? 32 : 64), records, blocks, stream,
              std::move(slotNames));
}

KernelHost::Plan KernelHost::planEngramFetch(const EPSpec &spec, int64_t entriesPerRank,
                                             const std::vector<EngramCall> &calls, int blocks,
                                             void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  if (!cpuBytesPerRank)
    throw std::invalid_argument("engram_fetch: this buffer has no host segment for the tables "
                                "(num_cpu_bytes = 0)");
  if (gpusPerNode() != worldSize())
    throw std::invalid_argument("engram_fetch reads the owners' tables through NVLink: the "
                                "world of " +
                                std::to_string(worldSize()) + " ranks has nodes of " +
                                std::to_string(gpusPerNode()));
  const int64_t rowBytes = int64_t(spec.hidden) * spec.elementBytes();
  if (entriesPerRank * ((rowBytes + 31) / 32 * 32) > cpuBytesPerRank)
    throw std::invalid_argument("engram_fetch: " + std::to_string(entriesPerRank) + " entries of " +
                                std::to_string(rowBytes) +
                                " bytes do not fit the host segment of " +
                                std::to_string(cpuBytesPerRank) + " bytes");
  std::vector<ParamRecord> records;
  for (size_t s = 0; s < calls.size(); ++s) {
    // The served rank's own table, as this process maps it.
    const auto own = reinterpret_cast<uint64_t>(windowMemory(int(s))) + uint64_t(bytesPerRank);
    records.push_back(engramRecord(spec, entriesPerRank, bytesPerRank, own, calls[s]));
  }
  return plan(engramFetchRequest(spec), records, blocks, stream, std::move(slotNames));
}

KernelHost::Plan
KernelHost::planLowLatencyDispatch(const EPSpec &spec, const DispatchVariant &variant, int parity,
                                   const std::vector<LowLatencyDispatchCall> &calls, int blocks,
                                   void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records = recordsOf(calls, [&](const LowLatencyDispatchCall &call) {
    return lowLatencyDispatchRecord(spec, variant, parity, call);
  });
  checkRanksAgree(calls, "topk_idx's dtype", lowLatencyOperands);
  const int bits = calls.front().topkIdx.dtype == "i32" ? 32 : 64;
  return plan(lowLatencyDispatchRequest(spec, bits, variant.roundScale, variant.useUe8m0), records,
              blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planLowLatencyCombine(const EPSpec &spec, int parity,
                                                   const std::vector<LowLatencyCombineCall> &calls,
                                                   int blocks, void *stream,
                                                   std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records = recordsOf(calls, [&](const LowLatencyCombineCall &call) {
    return lowLatencyCombineRecord(spec, parity, call);
  });
  checkRanksAgree(calls, "topk_idx's dtype", lowLatencyCombineOperands);
  const int bits = calls.front().topkIdx.dtype == "i32" ? 32 : 64;
  return plan(lowLatencyCombineRequest(spec, bits), records, blocks, stream, std::move(slotNames));
}

KernelHost::Plan KernelHost::planGemmCombine(const EPSpec &spec, int biases,
                                             const std::vector<GemmCombineCall> &calls, int blocks,
                                             void *stream, std::vector<std::string> slotNames) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records = recordsOf(
      calls, [&](const GemmCombineCall &call) { return gemmCombineRecord(spec, biases, call); });
  return plan(gemmCombineRequest(spec, biases), records, blocks, stream, std::move(slotNames));
}

KernelHost::Run KernelHost::engramFetch(const EPSpec &spec, int64_t entriesPerRank,
                                        const std::vector<EngramCall> &calls, void *stream,
                                        int blocks) {
  return launchAndWait(planEngramFetch(spec, entriesPerRank, calls, blocks, stream).prepared(),
                       stream);
}

KernelHost::Run KernelHost::dispatch(const EPSpec &spec, const DispatchVariant &variant,
                                     const std::vector<DispatchCall> &calls, void *stream,
                                     bool checkRouting, int blocks) {
  Plan p = planDispatch(spec, variant, calls, blocks, stream);
  if (checkRouting)
    checkRoutingOf(
        spec, calls, [](const DispatchCall &c) -> const DeviceTensor & { return c.handle.topkIdx; },
        stream);
  return launchAndWait(p.prepared(), stream);
}

KernelHost::Run KernelHost::combine(const EPSpec &spec, const CombineVariant &variant,
                                    const std::vector<CombineCall> &calls, void *stream,
                                    int blocks) {
  return launchAndWait(planCombine(spec, variant, calls, blocks, stream).prepared(), stream);
}

KernelHost::Run KernelHost::dispatchGemm(const EPSpec &spec, const DispatchVariant &variant,
                                         const std::vector<DispatchGemmCall> &calls, void *stream,
                                         int blocks) {
  return launchAndWait(planDispatchGemm(spec, variant, calls, blocks, stream).prepared(), stream);
}

KernelHost::Run KernelHost::dispatchLayout(const EPSpec &spec, const std::vector<LayoutCall> &calls,
                                           void *stream, int blocks) {
  return launchAndWait(planDispatchLayout(spec, calls, blocks, stream).prepared(), stream);
}

KernelHost::Run KernelHost::groupedGemm(const EPSpec &spec,
                                        const std::vector<GroupedGemmCall> &calls, void *stream,
                                        int blocks) {
  return launchAndWait(planGroupedGemm(spec, calls, blocks, stream).prepared(), stream);
}

KernelHost::Run KernelHost::swiglu(const EPSpec &spec, const std::vector<SwigluCall> &calls,
                                   void *stream, int blocks) {
  return launchAndWait(planSwiglu(spec, calls, blocks, stream).prepared(), stream);
}

KernelHost::Run KernelHost::gemmCombine(const EPSpec &spec, int biases,
                                        const std::vector<GemmCombineCall> &calls, void *stream,
                                        int blocks) {
  return launchAndWait(planGemmCombine(spec, biases, calls, blocks, stream).prepared(), stream);
}

KernelHost::Run KernelHost::moeLayer(const EPSpec &spec, const DispatchVariant &variant,
                                     const std::vector<MoeLayerCall> &calls, void *stream,
                                     int blocks) {
  Plan p = planMoeLayer(spec, variant, calls, blocks, stream);
  checkRoutingOf(
      spec, calls,
      [](const MoeLayerCall &c) -> const DeviceTensor & { return c.dispatch.handle.topkIdx; },
      stream);
  return launchAndWait(p.prepared(), stream);
}
