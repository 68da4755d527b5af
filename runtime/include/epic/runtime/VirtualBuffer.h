//===- VirtualBuffer.h - R virtual ranks on one GPU -------------*- C++ -*-===//
//
// The ElasticBuffer of the virtual world: R ranks on one GPU, one window of R
// equal slices, the EpicVirtualComm descriptor, one launch for every rank.
// What it shares with the NCCL buffer (NcclBuffer.h) is KernelHost.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_VIRTUALBUFFER_H
#define EPIC_RUNTIME_VIRTUALBUFFER_H

#include "epic/runtime/KernelHost.h"

#include <cstdint>

namespace epic::runtime {

/// R virtual ranks on one GPU: one window of R equal slices and the
/// EpicVirtualComm descriptor; one launch serves every rank.
class VirtualElasticBuffer : public KernelHost {
public:
  /// `windowBytes` per rank (at least the entries' `window_bytes`);
  /// `blocksPerRank` blocks of every kernel serve each rank.
  VirtualElasticBuffer(int ranks, int64_t windowBytes, KernelProvider &provider,
                       int blocksPerRank = 16);
  ~VirtualElasticBuffer() override;
  int ranks() const { return servedRanks; }
  /// Every rank's kernels are in the same launches on one stream: stream
  /// order already is the barrier, so there is nothing to launch.
  void barrier(void *stream = nullptr) override;
  void *windowMemory(int servedRank) const override;

private:
  void *window = nullptr, *signals = nullptr, *counters = nullptr, *barriers = nullptr;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_VIRTUALBUFFER_H
