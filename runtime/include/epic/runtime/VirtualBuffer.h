//===- VirtualBuffer.h - R virtual ranks on one GPU -------------*- C++ -*-===//
//
// The ElasticBuffer of the virtual world: R ranks on one GPU, one window of R
// equal slices, the EpicVirtualComm descriptor, one launch for every rank.
// The ranks form N nodes of M GPUs (node-major): NVLink (LSA) pointers reach
// the own node only, GIN operations (put, put_value, signal) any rank, and
// are counted per pair of ranks. What it shares with the NCCL buffer
// (NcclBuffer.h) is KernelHost.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_VIRTUALBUFFER_H
#define EPIC_RUNTIME_VIRTUALBUFFER_H

#include "epic/runtime/HostSegment.h"
#include "epic/runtime/KernelHost.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace epic::runtime {

/// R virtual ranks on one GPU: one window of R equal slices and the
/// EpicVirtualComm descriptor; one launch serves every rank.
class VirtualElasticBuffer : public KernelHost {
public:
  /// `windowBytes` per rank (at least the entries' `window_bytes`);
  /// `blocksPerRank` blocks of every kernel serve each rank; `gpusPerNode`
  /// (M, dividing `ranks`; none: all of them) ranks per node; `hostBytes`
  /// of host memory after each rank's window (HostSegment.h), 0: none.
  VirtualElasticBuffer(int ranks, int64_t windowBytes, KernelProvider &provider,
                       int blocksPerRank = 16, std::optional<int> gpusPerNode = std::nullopt,
                       int64_t hostBytes = 0);
  ~VirtualElasticBuffer() override;
  int ranks() const { return servedRanks; }
  int gpusPerNode() const override { return lsaSize; }
  /// Every rank's kernels are in the same launches on one stream: stream
  /// order already is the barrier, so there is nothing to launch.
  void barrier(void *stream = nullptr) override;
  void *windowMemory(int servedRank) const override;
  void *peerWindowMemory(int servedRank, int peer) const override;

  /// What the GIN operations sent since the last call, [R][R][3] (from, to,
  /// kind: put bytes, put_value bytes, signal operations), then zero. Waits
  /// for the device's work first.
  std::vector<uint64_t> takeTraffic();
  /// From now on rank `rank`'s put, put_value and signal do nothing (its
  /// node's network stalls); -1: every rank's work again. After the
  /// device's work so far. `afterEntry`: the rank still joins the ep
  /// kernels' entry barriers (their GIN signal), so it stalls inside an op.
  void setDropNetworkFrom(int rank, bool afterEntry = false);
  int dropNetworkFrom() const { return droppedRank; }

  /// Signals per (rank, context): the most of 64 and 8 + 2R.
  static int signalsPerRank(int ranks);

private:
  int lsaSize, droppedRank = -1;
  /// The windows when they have host segments (else `window` is cudaMalloc'd).
  std::unique_ptr<MixedWindows> mixed;
  void *window = nullptr, *signals = nullptr, *counters = nullptr, *barriers = nullptr,
       *traffic = nullptr;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_VIRTUALBUFFER_H
