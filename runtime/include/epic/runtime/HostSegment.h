//===- HostSegment.h - Windows with a host-memory segment -------*- C++ -*-===//
//
// DeepEP's num_cpu_bytes: every rank's window is followed by a segment of
// pinned host memory (on the NUMA node nearest the GPU) in the same virtual
// address range, so a kernel reaches a rank's host segment at window offset
// `deviceBytes` like any other window byte (Engram's tables live there).
// One allocation holds `count` such windows, `stride()` bytes apart: the
// virtual world's R ranks, or an NCCL rank's one window.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_HOSTSEGMENT_H
#define EPIC_RUNTIME_HOSTSEGMENT_H

#include <cstdint>
#include <vector>

namespace epic::runtime {

/// `count` windows of [deviceBytes GPU | hostBytes host] memory, zeroed.
class MixedWindows {
public:
  /// The granularity both parts must be multiples of (2 MiB).
  static constexpr int64_t kGranularity = int64_t(2) << 20;
  /// Throws CudaError naming what the driver refused (e.g. a GPU without
  /// host-NUMA virtual memory support), std::invalid_argument for sizes
  /// that are not multiples of kGranularity.
  MixedWindows(int count, int64_t deviceBytes, int64_t hostBytes);
  ~MixedWindows();
  MixedWindows(const MixedWindows &) = delete;
  MixedWindows &operator=(const MixedWindows &) = delete;

  char *base() const { return reinterpret_cast<char *>(reserved); }
  int64_t stride() const { return deviceBytes + hostBytes; }

private:
  void release();
  int count;
  int64_t deviceBytes, hostBytes;
  uint64_t reserved = 0;
  /// The physical allocations (CUmemGenericAllocationHandle), mapped in order.
  std::vector<unsigned long long> handles;
  int mapped = 0;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_HOSTSEGMENT_H
