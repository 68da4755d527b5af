//===- VirtualBuffer.cpp - R virtual ranks on one GPU ---------------------===//

#include "epic/runtime/VirtualBuffer.h"

#include "epic/Dialect/EP/IR/EPWindow.h"
#include "epic/device/VirtualWorld.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

using namespace epic::runtime;

using detail::check;

namespace {
constexpr int kCounters = 64;
/// Barrier indices of each team (VirtualWorld.def: barriers).
constexpr int kBarrierIndices = 1024;

/// `ranks`, once `gpusPerNode` is known to split them into nodes: checked
/// before the base class touches the device (which checks `ranks` itself).
int checkedRanks(int ranks, std::optional<int> gpusPerNode) {
  if (ranks >= 1 && gpusPerNode && (*gpusPerNode < 1 || ranks % *gpusPerNode != 0))
    throw std::invalid_argument("gpus_per_node must be a positive divisor of num_ranks (" +
                                std::to_string(ranks) + "), got " + std::to_string(*gpusPerNode));
  return ranks;
}

/// cudaMalloc + cudaMemset(0), named in the error.
void *zeroed(size_t bytes, const char *what) {
  void *p = nullptr;
  check(cudaMalloc(&p, bytes), std::string("cudaMalloc(") + what + ")");
  check(cudaMemset(p, 0, bytes), std::string("cudaMemset(") + what + ")");
  return p;
}
} // namespace

int VirtualElasticBuffer::signalsPerRank(int ranks) { return std::max(64, 8 + 2 * ranks); }

VirtualElasticBuffer::VirtualElasticBuffer(int ranks, int64_t windowBytes, KernelProvider &provider,
                                           int blocksPerRank, std::optional<int> gpusPerNode,
                                           int64_t hostBytes)
    : KernelHost(provider, checkedRanks(ranks, gpusPerNode), windowBytes, blocksPerRank, hostBytes),
      lsaSize(gpusPerNode.value_or(ranks)) {
  if (provider.settings().backend != "virtual")
    throw std::invalid_argument("a virtual world needs kernels compiled for backend=virtual, "
                                "not " +
                                provider.settings().backend);
  check(cudaFree(nullptr), "cudaFree(0) (creating the CUDA context)");
  const size_t nodes = size_t(ranks / lsaSize), signalCount = signalsPerRank(ranks);
  if (cpuBytesPerRank) {
    mixed = std::make_unique<MixedWindows>(ranks, bytesPerRank, cpuBytesPerRank);
    window = mixed->base();
  } else {
    window = zeroed(size_t(ranks) * bytesPerRank, "window");
  }
  signals = zeroed(sizeof(uint64_t) * ranks * signalCount, "signals");
  counters = zeroed(sizeof(uint64_t) * ranks * kCounters, "counters");
  barriers = zeroed(sizeof(uint64_t) * kBarrierIndices * (1 + nodes + lsaSize), "barriers");
  traffic = zeroed(sizeof(uint64_t) * ranks * ranks * EPIC_TRAFFIC_KINDS, "traffic");
  EpicVirtualComm comm{};
  comm.num_ranks = ranks;
  comm.num_contexts = 1;
  comm.num_signals = int32_t(signalCount);
  comm.num_counters = kCounters;
  comm.num_barriers = kBarrierIndices;
  comm.lsa_size = lsaSize;
  ginSignals = int64_t(signalCount);
  comm.signals = static_cast<uint64_t *>(signals);
  comm.counters = static_cast<uint64_t *>(counters);
  comm.barriers = static_cast<uint64_t *>(barriers);
  comm.traffic = static_cast<uint64_t *>(traffic);
  comm.drop_network_from = -1;
  comm.gin_mode = 0;
  comm.drop_spares_signal = -1;
  comm.reserved = 0;
  EpicVirtualWindow desc{static_cast<char *>(window), uint64_t(windowStride()), ranks, 0};
  check(cudaMalloc(&commArgument, sizeof comm), "cudaMalloc(comm descriptor)");
  check(cudaMemcpy(commArgument, &comm, sizeof comm, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMalloc(&windowArgument, sizeof desc), "cudaMalloc(window descriptor)");
  check(cudaMemcpy(windowArgument, &desc, sizeof desc, cudaMemcpyHostToDevice), "cudaMemcpy");
}

VirtualElasticBuffer::~VirtualElasticBuffer() {
  // Nothing may still run on the window when it goes.
  cudaDeviceSynchronize();
  for (void *p : {windowArgument, commArgument, traffic, barriers, counters, signals,
                  mixed ? nullptr : window})
    if (p)
      cudaFree(p);
}

// All R ranks run inside the same launches, queued on one stream: whatever
// any rank queued before is finished before any rank's later work starts.
void VirtualElasticBuffer::barrier(void *) {}

void *VirtualElasticBuffer::peerWindowMemory(int servedRank, int peer) const {
  windowMemory(servedRank); // checks the served rank
  const int perNode = gpusPerNode();
  if (peer < 0 || peer >= servedRanks || peer / perNode != servedRank / perNode)
    throw std::out_of_range("rank " + std::to_string(peer) + " is not in rank " +
                            std::to_string(servedRank) + "'s NVLink domain (nodes of " +
                            std::to_string(perNode) + " ranks)");
  return windowMemory(peer);
}

void *VirtualElasticBuffer::windowMemory(int servedRank) const {
  if (servedRank < 0 || servedRank >= servedRanks)
    throw std::out_of_range("window of rank " + std::to_string(servedRank) + ": the world has " +
                            std::to_string(servedRanks) + " ranks");
  return static_cast<char *>(window) + int64_t(servedRank) * windowStride();
}

std::vector<uint64_t> VirtualElasticBuffer::takeTraffic() {
  std::vector<uint64_t> out(size_t(servedRanks) * servedRanks * EPIC_TRAFFIC_KINDS);
  size_t bytes = out.size() * sizeof(uint64_t);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before reading the traffic)");
  check(cudaMemcpy(out.data(), traffic, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(traffic)");
  check(cudaMemset(traffic, 0, bytes), "cudaMemset(traffic)");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after zeroing the traffic)");
  return out;
}

void VirtualElasticBuffer::setDropNetworkFrom(int rank, bool afterEntry) {
  if (rank < -1 || rank >= servedRanks)
    throw std::invalid_argument("rank must be a rank of the world, [0, " +
                                std::to_string(servedRanks - 1) + "], or -1 for none, got " +
                                std::to_string(rank));
  int32_t value = rank;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before dropping a rank's network)");
  check(cudaMemcpy(static_cast<char *>(commArgument) + offsetof(EpicVirtualComm, drop_network_from),
                   &value, sizeof value, cudaMemcpyHostToDevice),
        "cudaMemcpy(drop_network_from)");
  int32_t spared = afterEntry ? int32_t(epic::ep::window::kSigEntry) : -1;
  check(
      cudaMemcpy(static_cast<char *>(commArgument) + offsetof(EpicVirtualComm, drop_spares_signal),
                 &spared, sizeof spared, cudaMemcpyHostToDevice),
      "cudaMemcpy(drop_spares_signal)");
  droppedRank = rank;
}
