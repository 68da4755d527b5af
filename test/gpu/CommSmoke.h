//===- CommSmoke.h - what the comm smoke test's drivers share ---*- C++ -*-===//
//
// Checked CUDA calls, loading the cubins epic-compile made from
// comm_kernels.mlir, launching them, and the virtual world's descriptors as
// the runtime would build them: shared by comm_smoke.cu (one node, NCCL) and
// comm_smoke_nodes.cu (virtual worlds of several nodes).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_TEST_GPU_COMMSMOKE_H
#define EPIC_TEST_GPU_COMMSMOKE_H

#include "epic/device/VirtualWorld.h"
#include "epic/device/WaitReport.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define CHECK_CU(call)                                                                             \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      const char *s_ = nullptr;                                                                    \
      cuGetErrorString(r_, &s_);                                                                   \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, s_);               \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)
#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    cudaError_t r_ = (call);                                                                       \
    if (r_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                    \
                   cudaGetErrorString(r_));                                                        \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace comm_smoke {

inline int failures = 0;

inline void expect(bool ok, const char *what) {
  std::printf("  %-58s %s\n", what, ok ? "ok" : "FAILED");
  failures += !ok;
}

inline CUmodule loadModule(const char *path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(1);
  }
  std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CUmodule module;
  CHECK_CU(cuModuleLoadData(&module, image.data()));
  return module;
}

inline CUfunction kernel(CUmodule module, const char *name) {
  CUfunction f;
  CHECK_CU(cuModuleGetFunction(&f, module, name));
  return f;
}

/// One launch of `blocks` x `threads`; cooperative so that every virtual
/// rank's blocks are resident together.
inline void launch(CUfunction f, unsigned blocks, unsigned threads, std::vector<void *> args) {
  CHECK_CU(cuLaunchCooperativeKernel(f, blocks, 1, 1, threads, 1, 1, 0, nullptr, args.data()));
  CHECK_CU(cuCtxSynchronize());
}

/// The same for a launch that must fail (a trap): its error, printed; the
/// context is lost afterwards, so the caller's process ends after it.
inline CUresult launchFailing(CUfunction f, unsigned blocks, unsigned threads,
                              std::vector<void *> args) {
  CHECK_CU(cuLaunchCooperativeKernel(f, blocks, 1, 1, threads, 1, 1, 0, nullptr, args.data()));
  CUresult r = cuCtxSynchronize();
  const char *message = nullptr;
  cuGetErrorString(r, &message);
  std::printf("  kernel ended with: %s\n", message ? message : "?");
  return r;
}

inline int32_t pattern(int rank, int i) { return rank * 1000003 + i * 7 + 1; }

template <typename T> T *deviceCopy(const T &value) {
  T *p;
  CHECK_CUDA(cudaMalloc(&p, sizeof(T)));
  CHECK_CUDA(cudaMemcpy(p, &value, sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

/// Pinned host report slots, mapped, that `module`'s epic_wait_report points
/// at (as the runtime sets them up: runtime/lib/WaitReports.cpp); zeroed.
inline epic_device::WaitReport *mapWaitReports(CUmodule module) {
  using epic_device::WaitReport;
  WaitReport *host = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void **>(&host),
                           sizeof(WaitReport) * epic_device::kWaitReportSlots,
                           cudaHostAllocMapped));
  std::memset(host, 0, sizeof(WaitReport) * epic_device::kWaitReportSlots);
  void *device = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(&device, host, 0));
  CUdeviceptr global = 0;
  size_t bytes = 0;
  CHECK_CU(cuModuleGetGlobal(&global, &bytes, module, EPIC_WAIT_REPORT_SYMBOL));
  CHECK_CU(cuMemcpyHtoD(global, &device, sizeof(device)));
  return host;
}

// --- The virtual world: R ranks, each a group of blocks of one launch, in
//     nodes of M (VirtualWorld.def) -------------------------------------------

struct VirtualWorld {
  static constexpr int kSignals = 4, kBarriers = 64;
  int ranks, gpusPerNode;
  uint64_t stride;
  char *data = nullptr, *flagData = nullptr;
  EpicVirtualComm comm{};
  EpicVirtualComm *commDev = nullptr;
  EpicVirtualWindow *window = nullptr, *flags = nullptr;

  /// `gpusPerNode` 0: one node of every rank. `dropNetworkFrom`: the rank
  /// whose put, put_value and signal do nothing (-1: none).
  VirtualWorld(int ranks, uint64_t stride, int gpusPerNode = 0, int dropNetworkFrom = -1)
      : ranks(ranks), gpusPerNode(gpusPerNode ? gpusPerNode : ranks), stride(stride) {
    CHECK_CUDA(cudaMalloc(&data, ranks * stride));
    CHECK_CUDA(cudaMalloc(&flagData, ranks * 4096));
    comm.num_ranks = ranks;
    comm.num_contexts = 1;
    comm.num_signals = kSignals;
    comm.num_counters = 1;
    comm.num_barriers = kBarriers;
    comm.lsa_size = this->gpusPerNode;
    comm.drop_network_from = dropNetworkFrom;
    comm.gin_mode = 0;
    comm.drop_spares_signal = -1;
    comm.reserved = 0;
    CHECK_CUDA(cudaMalloc(&comm.signals, sizeof(uint64_t) * ranks * kSignals));
    CHECK_CUDA(cudaMalloc(&comm.counters, sizeof(uint64_t) * ranks));
    CHECK_CUDA(cudaMalloc(&comm.barriers, sizeof(uint64_t) * barrierSlots()));
    CHECK_CUDA(cudaMemset(comm.barriers, 0, sizeof(uint64_t) * barrierSlots()));
    CHECK_CUDA(cudaMalloc(&comm.traffic, trafficBytes()));
    reset();
    commDev = deviceCopy(comm);
    window = deviceCopy(EpicVirtualWindow{data, stride, ranks, 0});
    flags = deviceCopy(EpicVirtualWindow{flagData, 4096, ranks, 0});
  }
  /// Every team kind's indices: world, each node's LSA team, each rail.
  size_t barrierSlots() const {
    return size_t(kBarriers) * (1 + ranks / gpusPerNode + gpusPerNode);
  }
  size_t trafficBytes() const { return sizeof(uint64_t) * ranks * ranks * EPIC_TRAFFIC_KINDS; }
  void reset() {
    CHECK_CUDA(cudaMemset(data, 0, ranks * stride));
    CHECK_CUDA(cudaMemset(flagData, 0, ranks * 4096));
    CHECK_CUDA(cudaMemset(comm.signals, 0, sizeof(uint64_t) * ranks * kSignals));
    CHECK_CUDA(cudaMemset(comm.counters, 0, sizeof(uint64_t) * ranks));
    CHECK_CUDA(cudaMemset(comm.traffic, 0, trafficBytes()));
    // Barrier counters are monotonic and never reset: the kernels must work
    // from whatever generation the previous launch left.
  }
  /// [from][to][kind] (EPIC_TRAFFIC_*).
  std::vector<uint64_t> traffic() const {
    std::vector<uint64_t> out(size_t(ranks) * ranks * EPIC_TRAFFIC_KINDS);
    CHECK_CUDA(cudaMemcpy(out.data(), comm.traffic, trafficBytes(), cudaMemcpyDeviceToHost));
    return out;
  }
};

} // namespace comm_smoke

#endif // EPIC_TEST_GPU_COMMSMOKE_H
