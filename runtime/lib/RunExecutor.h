//===- RunExecutor.h - the run plan's executor, shared by its steps -------===//
//
// Internal to the runtime: executePlan (RunProgram.h) runs a plan through one
// Executor. Its steps are defined by what they move: RunProgram.cpp holds the
// loop, the host steps (inputs, printing) and the copy-engine steps (AGRS,
// PP); RunTokenSteps.cpp the token traffic (dispatch, combine, layout);
// RunExpertSteps.cpp the experts' steps (GEMMs, SwiGLU, the fused ops and
// the whole MoE layer). Every kernel step checks its results against the
// reference (Reference.h) under --check.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_LIB_RUNEXECUTOR_H
#define EPIC_RUNTIME_LIB_RUNEXECUTOR_H

#include "epic/runtime/Agrs.h"
#include "epic/runtime/Pp.h"
#include "epic/runtime/RunProgram.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

namespace epic::runtime::run {

/// How the checks see the spec's nodes (the reference's hybrid order and metadata).
NodeLayout topologyOf(const EPSpec &spec);

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

/// A dispatch's calls before its launch: the handle (new, or the cached one)
/// and every rank's call, its outputs allocated.
struct DispatchCalls {
  std::shared_ptr<HandleValue> handle;
  std::vector<DispatchCall> calls;
};

class Executor {
public:
  Executor(const RunPlan &plan, KernelHost &buffer, const RunOptions &options)
      : plan(plan), buffer(buffer), options(options), values(size_t(plan.values)) {}
  ~Executor();
  RunSummary run();

private:
  int R() const { return plan.ranks; }
  Value &at(int64_t id) { return values.at(size_t(id)); }

  DeviceTensor allocate(const std::string &dtype, std::vector<int64_t> shape, int fill = 0) {
    size_t bytes = size_t(dtypeBytes(dtype));
    for (int64_t d : shape)
      bytes *= size_t(d);
    void *p = nullptr;
    detail::check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    allocations.push_back(p);
    detail::check(cudaMemset(p, fill, std::max<size_t>(bytes, 16)), "cudaMemset");
    return DeviceTensor{reinterpret_cast<uint64_t>(p), dtype, std::move(shape)};
  }
  RankTensor upload(HostTensor host) {
    RankTensor t{allocate(host.dtype, host.shape), std::move(host)};
    detail::check(cudaMemcpy(reinterpret_cast<void *>(t.device.data), t.host.data.data(),
                             t.host.data.size(), cudaMemcpyHostToDevice),
                  "cudaMemcpy (upload)");
    return t;
  }
  /// The first `rows` rows of `device` (all of dimension 1..).
  static HostTensor download(const DeviceTensor &device, int64_t rows) {
    std::vector<int64_t> shape = device.shape;
    shape[0] = rows;
    HostTensor host(device.dtype, shape);
    detail::check(cudaMemcpy(host.data.data(), reinterpret_cast<void *>(device.data),
                             host.data.size(), cudaMemcpyDeviceToHost),
                  "cudaMemcpy (download)");
    return host;
  }
  static std::vector<int32_t> downloadInts(const DeviceTensor &device, int64_t count) {
    std::vector<int32_t> out(size_t(std::max<int64_t>(count, 0)));
    detail::check(cudaMemcpy(out.data(), reinterpret_cast<void *>(device.data), out.size() * 4,
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

  // Host and copy-engine steps (RunProgram.cpp).
  void host(const RunStep &step);
  /// Rank 0's tensor of `v`, after checking every rank's has its shape (the
  /// copy-engine steps move slots of one size); `op` names the step.
  const HostTensor &alikeOnEveryRank(const Value &v, const char *op) const;
  /// The program's AGRS session (copy engines, no kernel): one session as
  /// large as the window allows, ended and opened again when a step does not
  /// fit in it; every step's results are copied out of the window at once.
  AgrsSessions &session(const std::vector<int64_t> &slotBytes);
  void agrsStep(const RunStep &step);
  /// Every rank sends its input to its neighbour `to` through the PP slots
  /// (copy engines), then every rank receives from the other side: all sends
  /// before any receive, as one stream orders a virtual world's ranks.
  void ppStep(const RunStep &step);
  void print(const RunStep &step);
  void report(const RunStep &step, const std::vector<std::string> &problems);

  // Token traffic (RunTokenSteps.cpp).
  void dispatch(const RunStep &step, const PlanKernel &k);
  /// A dispatch step's handle and calls, outputs allocated (`k`'s variant).
  DispatchCalls dispatchCalls(const RunStep &step, const PlanKernel &k);
  /// After the launch: the handle read back, the step's received tensors
  /// defined (those it names), and every rank's record for the checks.
  std::vector<DispatchRecord> dispatchResults(const RunStep &step, const PlanKernel &k,
                                              const DispatchCalls &d);
  void dispatchLayout(const RunStep &step, const PlanKernel &k);
  /// A combine's biases (at most two; RunPlan::parse checks) for rank r.
  void bindBiases(CombineCall &c, const std::vector<Json> &biasIds, int r);
  void combine(const RunStep &step, const PlanKernel &k);

  // The experts' steps (RunExpertSteps.cpp).
  void groupedGemm(const RunStep &step, const PlanKernel &k);
  void swiglu(const RunStep &step, const PlanKernel &k);
  /// The expert GEMM fused with the combine of its output: both results are
  /// checked, the GEMM's against a float64 product and the combine's against
  /// the reference combine of the rows the kernel computed (the fused kernel
  /// is bitwise the two ops one after the other).
  void gemmCombine(const RunStep &step, const PlanKernel &k);
  /// The whole FP8 layer in one kernel (ep.moe_layer): each of its five
  /// steps checked from the intermediate rows the kernel wrote, as the five
  /// ops' steps are.
  void moeLayer(const RunStep &step, const PlanKernel &k);

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

} // namespace epic::runtime::run

#endif // EPIC_RUNTIME_LIB_RUNEXECUTOR_H
