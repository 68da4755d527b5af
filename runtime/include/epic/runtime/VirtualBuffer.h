//===- VirtualBuffer.h - R virtual ranks on one GPU -------------*- C++ -*-===//
//
// The ElasticBuffer state that launches ep-expand's kernels. KernelHost is
// the common part; the virtual world (R ranks on one GPU: one window of R
// equal slices, the EpicVirtualComm descriptor, one launch for every rank)
// is here, the NCCL one in NcclBuffer.h. The kernels find their tensors in
// per-rank parameter records.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_VIRTUALBUFFER_H
#define EPIC_RUNTIME_VIRTUALBUFFER_H

#include "epic/runtime/Calls.h"
#include "epic/runtime/KernelProvider.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace epic::runtime {

/// A CUDA driver or runtime call failed.
struct CudaError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The timeout reports that call-free device waits (kernels with a wgmma
/// pipeline, see epic/device/WaitReport.h) left in the process's mapped report
/// slots, each as "; device wait timed out after ...", and clears them; "" if
/// none. Every CudaError the runtime throws already ends with them; call this
/// after a CUDA error seen elsewhere (e.g. torch.cuda.synchronize).
std::string takeDeviceWaitReports();

struct Loaded;

/// What the two ElasticBuffers share: loading the kernels of an entry from
/// the provider, validating and uploading the per-rank parameter records, and
/// launching. A launch serves `servedRanks` ranks (all R in the virtual
/// world, one per process with NCCL) with `blocksPerRank` blocks each.
class KernelHost {
public:
  KernelHost(const KernelHost &) = delete;
  KernelHost &operator=(const KernelHost &) = delete;
  virtual ~KernelHost();

  struct Run {
    std::string key;
    KernelCache::Source source;
    double seconds; ///< compile or load time of the kernels
  };

  /// A validated launch whose parameter records already live on the device:
  /// launching it is kernel launches only, so it can be captured in a CUDA
  /// graph and replayed (the records and tensors must stay valid).
  class Prepared {
  public:
    Prepared() = default;
    Prepared(Prepared &&other) noexcept;
    Prepared &operator=(Prepared &&other) noexcept;
    ~Prepared();
    const Run &info() const { return run; }
    int blocksPerRank() const { return blocks; }

  private:
    friend class KernelHost;
    Run run{};
    Loaded *kernels = nullptr;
    void *params = nullptr;
    int blocks = 0;
  };

  /// Loads the kernels of the entry function in `entryIR` and uploads
  /// `records[i]` for the i-th rank this launch serves. Validates: one
  /// record per served rank, known field names, the window large enough,
  /// every block of the launch resident at once (they wait for each other
  /// through the entry barriers). `blocks` per rank: 0 for the buffer's
  /// number, else at most that (DeepEP's per-call num_sms).
  Prepared prepare(const std::string &entryIR, const std::vector<ParamRecord> &records,
                   int blocks = 0);

  /// Launches a prepared entry's kernels, in order, on `stream` (no host
  /// synchronization, no allocation: graph-capturable), with the launch
  /// attributes the metadata asks for (cooperative, dynamic shared memory).
  void launch(const Prepared &prepared, void *stream = nullptr);

  /// DeepEP's overlap controls: the stream first waits for `previousEvent`
  /// (a cudaEvent_t, e.g. recorded on the compute stream); with
  /// `recordEvent` an event is recorded after the kernels and returned (the
  /// caller makes its compute stream wait on it, then cudaEventDestroy's it).
  struct LaunchOptions {
    void *previousEvent = nullptr;
    bool recordEvent = false;
  };
  void *launch(const Prepared &prepared, void *stream, const LaunchOptions &options);

  /// prepare() + launch() + waiting for the stream (the records are freed).
  Run run(const std::string &entryIR, const std::vector<ParamRecord> &records,
          void *stream = nullptr);

  /// The typed entry points (DeepEP's dispatch / cached dispatch /
  /// combine): `calls[i]` is the i-th served rank's call. Checks every
  /// argument against `spec` (Calls.h) and the world, gets the kernels of
  /// `spec` and `variant` (compiled once, then cached), launches them on
  /// `stream` and waits for it. With `checkRouting`, topk_idx is first read
  /// back and range-checked (skipped while `stream` is being captured: a
  /// graph cannot synchronize). For graphs, use prepareDispatch + launch.
  Run dispatch(const EPSpec &spec, const DispatchVariant &variant,
               const std::vector<DispatchCall> &calls, void *stream = nullptr,
               bool checkRouting = true, int blocks = 0);
  Run combine(const EPSpec &spec, const CombineVariant &variant,
              const std::vector<CombineCall> &calls, void *stream = nullptr, int blocks = 0);
  Prepared prepareDispatch(const EPSpec &spec, const DispatchVariant &variant,
                           const std::vector<DispatchCall> &calls, int blocks = 0);
  Prepared prepareCombine(const EPSpec &spec, const CombineVariant &variant,
                          const std::vector<CombineCall> &calls, int blocks = 0);
  /// ep.grouped_gemm of each served rank's expanded rows (Hopper: TMA +
  /// wgmma; the runtime encodes the TMA descriptors per call).
  Run groupedGemm(const EPSpec &spec, const std::vector<GroupedGemmCall> &calls,
                  void *stream = nullptr, int blocks = 0);
  Prepared prepareGroupedGemm(const EPSpec &spec, const std::vector<GroupedGemmCall> &calls,
                              int blocks = 0);
  /// An expanded dispatch and the expert GEMM on its rows, fused by the
  /// compiler (ep-fuse-dispatch-gemm): GEMM tiles start as their rows land.
  Prepared prepareDispatchGemm(const EPSpec &spec, const DispatchVariant &variant,
                               const std::vector<DispatchGemmCall> &calls, int blocks = 0);
  /// The expert GEMM and the combine of its output, fused by the compiler
  /// (ep-fuse-gemm-combine): tokens travel as soon as their rows are computed.
  Prepared prepareGemmCombine(const EPSpec &spec, int biases,
                              const std::vector<GemmCombineCall> &calls, int blocks = 0);

  /// Every rank's work queued on `stream` before the barrier happens before
  /// any rank's work queued after it (DeepEP's barrier). No host wait.
  virtual void barrier(void *stream = nullptr) = 0;

  /// Per-kernel timing (a profiler-free measurement, for benchmarks): while
  /// on, launch() records a CUDA event before the first kernel and after
  /// each one on streams that are not being captured. takeKernelTimes()
  /// waits for the recorded kernels and returns (kernel, seconds) in launch
  /// order since the last call, then forgets them. Off by default: events
  /// cost a few microseconds per launch.
  void setKernelTiming(bool on);
  std::vector<std::pair<std::string, double>> takeKernelTimes();

  int64_t windowBytes() const { return bytesPerRank; }
  /// The device memory of the `servedRank`-th served rank's window (what its
  /// kernels see at window offset 0), for inspection and tests.
  virtual void *windowMemory(int servedRank) const = 0;
  int blocks() const { return blocksPerRank; }
  /// Ranks of the whole EP world (all of them are served in the virtual
  /// world; one per process with NCCL).
  virtual int worldSize() const { return servedRanks; }

protected:
  void checkWorld(const EPSpec &spec, size_t calls) const;
  /// launch() and wait for the stream (the prepared records die after).
  Run launchAndWait(const Prepared &prepared, void *stream);
  KernelHost(KernelProvider &provider, int servedRanks, int64_t windowBytes, int blocksPerRank);
  Loaded &load(const std::string &entryIR, Run &run);

  KernelProvider &provider;
  int servedRanks;
  int64_t bytesPerRank;
  int blocksPerRank;
  /// The kernels' first two arguments: the device communicator and window.
  void *commArgument = nullptr, *windowArgument = nullptr;
  std::map<std::string, Loaded *> modules;

private:
  struct TimedKernel {
    std::string name;
    void *start, *stop; ///< cudaEvent_t, owned by timingEvents
  };
  bool kernelTiming = false;
  std::vector<TimedKernel> timedKernels;
  /// Every event of timedKernels, once (a kernel's stop is the next one's start).
  std::vector<void *> timingEvents;
  void releaseTimedKernels();
};

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
