//===- prepare_kernels.cpp - fill the kernel cache for the GPU tests ------===//
//
//   EPIC_CACHE_DIR=build/device/cache build/bin/epic-prepare-gpu-kernels
//
// Compiles (here, where epic-compile exists) every entry of RuntimePlan.h
// for backend=virtual (and the one-rank entries for backend=nccl) into the kernel cache that a GPU
// run carries.
//
//===----------------------------------------------------------------------===//

#include "RuntimePlan.h"

#include "epic/runtime/KernelProvider.h"

#include <cstdio>

int main() {
  using namespace epic::runtime;
  KernelCache cache;
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  for (int ranks : epic::test::planRanks())
    for (const KernelRequest &request :
         {epic::test::planDispatch(ranks), epic::test::planCombine(ranks)}) {
      auto result = provider.get(request);
      std::printf("%s %s (%.2f s)\n", result.key.c_str(),
                  result.source == KernelCache::Source::compiled ? "compiled" : "cached",
                  result.seconds);
    }
  // The NCCL backend runs one rank per process: one rank on one GPU.
  KernelProvider nccl(cache, {"nccl", "sm_90", ""});
  for (const KernelRequest &request : {epic::test::planDispatch(1), epic::test::planCombine(1)}) {
    auto result = nccl.get(request);
    std::printf("nccl %s %s\n", result.key.c_str(),
                result.source == KernelCache::Source::compiled ? "compiled" : "cached");
  }
  for (const KernelRequest &request : {epic::test::planV3Dispatch(), epic::test::planV3Combine()}) {
    auto result = provider.get(request);
    std::printf("V3 %s %s %s in %.3f s\n", kindName(request.kind), result.key.c_str(),
                result.source == KernelCache::Source::compiled ? "compiled (cold)"
                                                               : "found in the cache",
                result.seconds);
  }
  return 0;
}
