//===- RuntimePlan.h - what the runtime GPU test runs ------------*- C++ -*-===//
//
// The kernel requests of test/gpu/runtime_virtual.cpp, shared with
// prepare_kernels.cpp, which compiles them into the kernel cache here (the
// GPU machine has no compiler): the same spec gives the same request and key.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_TEST_GPU_RUNTIMEPLAN_H
#define EPIC_TEST_GPU_RUNTIMEPLAN_H

#include "epic/runtime/KernelRequest.h"

#include <string>
#include <vector>

namespace epic::test {

inline runtime::EPSpec planSpec(int ranks) {
  runtime::EPSpec s;
  s.ranks = ranks;
  s.experts = 8 * ranks;
  s.topk = 4;
  s.hidden = 512;
  s.maxTokensPerRank = 192;
  return s;
}

inline const runtime::DispatchVariant planDispatchVariant = {/*weights=*/true, false, false, 64};
inline const runtime::CombineVariant planCombineVariant = {/*weights=*/true, /*biases=*/2};

/// The requests the typed API (KernelHost::dispatch/combine) makes.
inline runtime::KernelRequest planDispatch(int ranks) {
  return runtime::dispatchRequest(planSpec(ranks), planDispatchVariant);
}

inline runtime::KernelRequest planCombine(int ranks) {
  return runtime::combineRequest(planSpec(ranks), planCombineVariant);
}

/// DeepEP's V3 configuration (EP8, 256 experts, top-8, hidden 7168, FP8
/// dispatch with 56 packs, BF16 combine): compile and load times.
inline runtime::EPSpec v3Spec() {
  runtime::EPSpec s;
  s.ranks = 8, s.experts = 256, s.topk = 8, s.hidden = 7168, s.dtype = "f8E4M3FN";
  s.scalePacks = 56, s.expertAlignment = 128, s.maxTokensPerRank = 4096;
  return s;
}
inline runtime::KernelRequest planV3Dispatch() {
  return runtime::dispatchRequest(v3Spec(), {/*weights=*/true, false, false, 64}, "v3_dispatch");
}
inline runtime::KernelRequest planV3Combine() {
  return runtime::combineRequest(v3Spec(), {/*weights=*/true, /*biases=*/0}, "v3_combine");
}

inline const std::vector<int> &planRanks() {
  static const std::vector<int> ranks = {1, 2, 4, 8};
  return ranks;
}

} // namespace epic::test

#endif // EPIC_TEST_GPU_RUNTIMEPLAN_H
