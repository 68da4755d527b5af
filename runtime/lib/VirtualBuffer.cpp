//===- VirtualBuffer.cpp - R virtual ranks on one GPU ---------------------===//

#include "epic/runtime/VirtualBuffer.h"

#include "epic/device/VirtualWorld.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

using namespace epic::runtime;

using detail::check;

namespace {
constexpr int kSignals = 64, kCounters = 64, kBarriers = 1024;
} // namespace

VirtualElasticBuffer::VirtualElasticBuffer(int ranks, int64_t windowBytes, KernelProvider &provider,
                                           int blocksPerRank)
    : KernelHost(provider, ranks, windowBytes, blocksPerRank) {
  if (provider.settings().backend != "virtual")
    throw std::invalid_argument("a virtual world needs kernels compiled for backend=virtual, "
                                "not " +
                                provider.settings().backend);
  check(cudaFree(nullptr), "cudaFree(0) (creating the CUDA context)");
  check(cudaMalloc(&window, size_t(ranks) * bytesPerRank), "cudaMalloc(window)");
  check(cudaMemset(window, 0, size_t(ranks) * bytesPerRank), "cudaMemset(window)");
  check(cudaMalloc(&signals, sizeof(uint64_t) * ranks * kSignals), "cudaMalloc(signals)");
  check(cudaMemset(signals, 0, sizeof(uint64_t) * ranks * kSignals), "cudaMemset(signals)");
  check(cudaMalloc(&counters, sizeof(uint64_t) * ranks * kCounters), "cudaMalloc(counters)");
  check(cudaMemset(counters, 0, sizeof(uint64_t) * ranks * kCounters), "cudaMemset(counters)");
  check(cudaMalloc(&barriers, sizeof(uint64_t) * kBarriers), "cudaMalloc(barriers)");
  check(cudaMemset(barriers, 0, sizeof(uint64_t) * kBarriers), "cudaMemset(barriers)");
  EpicVirtualComm comm{};
  comm.num_ranks = ranks;
  comm.num_contexts = 1;
  comm.num_signals = kSignals;
  comm.num_counters = kCounters;
  comm.num_barriers = kBarriers;
  comm.signals = static_cast<uint64_t *>(signals);
  comm.counters = static_cast<uint64_t *>(counters);
  comm.barriers = static_cast<uint64_t *>(barriers);
  EpicVirtualWindow desc{static_cast<char *>(window), uint64_t(bytesPerRank), ranks, 0};
  check(cudaMalloc(&commArgument, sizeof comm), "cudaMalloc(comm descriptor)");
  check(cudaMemcpy(commArgument, &comm, sizeof comm, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMalloc(&windowArgument, sizeof desc), "cudaMalloc(window descriptor)");
  check(cudaMemcpy(windowArgument, &desc, sizeof desc, cudaMemcpyHostToDevice), "cudaMemcpy");
}

VirtualElasticBuffer::~VirtualElasticBuffer() {
  // Nothing may still run on the window when it goes.
  cudaDeviceSynchronize();
  for (void *p : {windowArgument, commArgument, barriers, counters, signals, window})
    if (p)
      cudaFree(p);
}

// All R ranks run inside the same launches, queued on one stream: whatever
// any rank queued before is finished before any rank's later work starts.
void VirtualElasticBuffer::barrier(void *) {}

void *VirtualElasticBuffer::windowMemory(int servedRank) const {
  if (servedRank < 0 || servedRank >= servedRanks)
    throw std::out_of_range("window of rank " + std::to_string(servedRank) + ": the world has " +
                            std::to_string(servedRanks) + " ranks");
  return static_cast<char *>(window) + int64_t(servedRank) * bytesPerRank;
}
