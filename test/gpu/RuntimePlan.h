//===- RuntimePlan.h - what the runtime GPU test runs ------------*- C++ -*-===//
//
// The entry functions of test/gpu/runtime_virtual.cpp, shared with
// prepare_kernels.cpp, which compiles them into the kernel cache here (the
// GPU machine has no compiler): the same spec gives the same IR and key.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_TEST_GPU_RUNTIMEPLAN_H
#define EPIC_TEST_GPU_RUNTIMEPLAN_H

#include "epic/runtime/EntryIR.h"

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

inline std::string planDispatch(int ranks) {
  return runtime::dispatchEntryIR(planSpec(ranks), {/*weights=*/true, false, false, 64},
                                  "dispatch_r" + std::to_string(ranks));
}

inline std::string planCombine(int ranks) {
  return runtime::combineEntryIR(planSpec(ranks), {/*weights=*/true, /*biases=*/2},
                                 "combine_r" + std::to_string(ranks));
}

inline const std::vector<int> &planRanks() {
  static const std::vector<int> ranks = {1, 2, 4, 8};
  return ranks;
}

} // namespace epic::test

#endif // EPIC_TEST_GPU_RUNTIMEPLAN_H
