//===- KernelHost.h - load, prepare and launch compiled kernels -*- C++ -*-===//
//
// What both ElasticBuffers (the virtual world, VirtualBuffer.h; NCCL,
// NcclBuffer.h) share: the kernels of a request from the provider, the
// per-rank parameter records checked against the kernels' metadata and laid
// out as the by-value table every kernel takes (comm.param_table), and the
// launches. A Plan is a call whose signature was checked once; its next
// calls only bind new tensor addresses, so a launch costs a few microseconds
// of host time, no allocation and no copy, and can be captured in a CUDA graph.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_KERNELHOST_H
#define EPIC_RUNTIME_KERNELHOST_H

#include "epic/device/WaitReport.h"
#include "epic/runtime/Calls.h"
#include "epic/runtime/Json.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/LaunchMetadata.h"
#include "epic/runtime/WindowBytes.h"

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
/// The text takeDeviceWaitReports makes of `reports` (those marked valid):
/// disagreements and NVLink violations one per report, timed-out waits one
/// line per rank, flag and value seen, naming the blocks ("blocks 8-15").
std::string formatDeviceWaitReports(const std::vector<epic_device::WaitReport> &reports);

/// Every report of a stream wait on a peer's flag (AGRS, PP) that outlasted
/// its bound, in order (runtime/lib/StreamWaits.h): each names the flags and
/// the values the stream still waits for.
std::vector<std::string> streamWaitReports();

struct Loaded;

/// Loads the kernels of requests from the provider, checks and lays out the
/// per-rank parameter records, and launches. A launch serves `servedRanks`
/// ranks (all R in the virtual world, one per process with NCCL) with
/// `blocksPerRank` blocks each.
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

  /// A checked launch: the kernels, the block count and the parameter table
  /// (every served rank's record, TMA descriptors included) in host memory.
  /// Launching it passes the table by value: kernel launches only, nothing
  /// to keep alive on the device, capturable in a CUDA graph (the tensors the
  /// records point to must stay valid while the graph replays).
  class Prepared {
  public:
    const Run &info() const { return run; }
    int blocksPerRank() const { return blocks; }

  private:
    friend class KernelHost;
    Run run{};
    Loaded *kernels = nullptr;
    std::vector<uint64_t> table; ///< servedRanks records of param_stride bytes
    int blocks = 0;
    int64_t dataEnd = 0;    ///< the window's data region ends here (EPWindow.h)
    int64_t kernelsEnd = 0; ///< the kernels use the window up to here (scratch included)
  };

  /// A call whose signature (configuration, every tensor's dtype and shape,
  /// the world) was checked when the plan was made: the kernels are loaded,
  /// the table laid out and its counts filled in. launch() binds the served
  /// ranks' tensor addresses and launches; it checks only what an address
  /// alone can break (given, aligned as the signature's checks required).
  class Plan {
  public:
    /// Addresses per served rank, in the slot order the call's tensors were
    /// numbered with (DeviceTensor::slot).
    int slotsPerRank() const { return bindings.slotsPerRank(); }
    const Prepared &prepared() const { return ready; }
    /// `addresses`: servedRanks x slotsPerRank(), rank-major; 0 for a slot
    /// whose tensor the signature does not have (or has empty). Throws
    /// std::invalid_argument naming the tensor (`slotNames`, with the rank
    /// where several are served) before anything is launched.
    /// `kernels` of the entry's kernels from `first` only (-1: the rest): an
    /// entry's phases launched apart (low-latency mode's receive hook).
    void launch(const uint64_t *addresses, size_t count, void *stream, int first = 0,
                int kernels = -1);
    /// Launches with the addresses the plan was made with.
    void launch(void *stream);

  private:
    friend class KernelHost;
    KernelHost *host = nullptr;
    Prepared ready;
    AddressBindings bindings;
    /// Where its window-resident tensors may lie (fixed for the buffer's life,
    /// so found once, not on every call).
    std::vector<WindowRange> windows;
    /// The table words TMA descriptors are encoded from, as last encoded.
    std::vector<uint64_t> encodedFrom;
  };

  /// Loads the kernels of `input` (a request, or entry IR) and lays out
  /// `records[i]` for the i-th rank this launch serves. Validates: one
  /// record per served rank, known field names, the window large enough
  /// (for the record's max_tokens_per_rank where the kernels take the cap at
  /// run time), every block of the launch resident at once (they wait for
  /// each other through the entry barriers), the table the size the kernels
  /// declare. `blocks` per rank: 0 for the buffer's number, else at most that
  /// (DeepEP's per-call num_sms). `stream`, when given and being captured
  /// into a CUDA graph, refuses to load kernels (that needs a warm-up call).
  Prepared prepare(const KernelInput &input, const std::vector<ParamRecord> &records,
                   int blocks = 0, void *stream = nullptr);

  /// Launches a prepared entry's kernels, in order, on `stream` (no host
  /// synchronization, no allocation: graph-capturable), with the launch
  /// attributes the metadata asks for (cooperative, dynamic shared memory).
  void launch(const Prepared &prepared, void *stream = nullptr, int first = 0, int kernels = -1);

  /// DeepEP's overlap controls: the stream first waits for `previousEvent`
  /// (a cudaEvent_t, e.g. recorded on the compute stream); with
  /// `recordEvent` an event is recorded after the kernels and returned (the
  /// caller makes its compute stream wait on it, then cudaEventDestroy's it).
  struct LaunchOptions {
    void *previousEvent = nullptr;
    bool recordEvent = false;
  };
  void *launch(const Prepared &prepared, void *stream, const LaunchOptions &options);

  /// prepare() + launch() + waiting for the stream.
  Run run(const KernelInput &input, const std::vector<ParamRecord> &records,
          void *stream = nullptr);

  /// The typed entry points (DeepEP's dispatch / cached dispatch / combine,
  /// the expert GEMM and its fusions): `calls[i]` is the i-th served rank's
  /// call. Every argument is checked against `spec` (Calls.h) and the world,
  /// the kernels of `spec` and the variant are loaded (compiled once, then
  /// cached), and the plan keeps what later calls of the same signature need
  /// (`slotNames`: the names of the call's tensor slots, for errors).
  Plan planDispatch(const EPSpec &spec, const DispatchVariant &variant,
                    const std::vector<DispatchCall> &calls, int blocks = 0, void *stream = nullptr,
                    std::vector<std::string> slotNames = {});
  Plan planCombine(const EPSpec &spec, const CombineVariant &variant,
                   const std::vector<CombineCall> &calls, int blocks = 0, void *stream = nullptr,
                   std::vector<std::string> slotNames = {});
  /// ep.grouped_gemm of each served rank's expanded rows (Hopper: TMA +
  /// wgmma; the TMA descriptors are encoded into the records per call).
  Plan planGroupedGemm(const EPSpec &spec, const std::vector<GroupedGemmCall> &calls,
                       int blocks = 0, void *stream = nullptr,
                       std::vector<std::string> slotNames = {});
  /// ep.swiglu of each served rank's gate/up rows (the expert MLP's activation, FP8
  /// re-quantization fused): one kernel, nothing waits.
  Plan planSwiglu(const EPSpec &spec, const std::vector<SwigluCall> &calls, int blocks = 0,
                  void *stream = nullptr, std::vector<std::string> slotNames = {});
  /// ep.dispatch_layout (DeepEP's get_dispatch_layout) of each served rank's
  /// routing: no communication, two small kernels.
  Plan planDispatchLayout(const EPSpec &spec, const std::vector<LayoutCall> &calls, int blocks = 0,
                          void *stream = nullptr, std::vector<std::string> slotNames = {});
  /// ep.engram_fetch of each served rank's ids from the tables in the
  /// ranks' host segments (`entriesPerRank` entries each, written by the
  /// caller): one kernel, nothing waits. Throws if the buffer has no host
  /// segment.
  /// DeepEP V1's low-latency mode: ep.low_latency_dispatch (kernels: send,
  /// receive) and ep.low_latency_combine (send, weighted sum), on window
  /// region `parity` (0 or 1; consecutive calls alternate). One NVLink
  /// domain; the cap is spec.maxTokensPerRank.
  Plan planLowLatencyDispatch(const EPSpec &spec, const DispatchVariant &variant, int parity,
                              const std::vector<LowLatencyDispatchCall> &calls, int blocks = 0,
                              void *stream = nullptr, std::vector<std::string> slotNames = {});
  Plan planLowLatencyCombine(const EPSpec &spec, int parity,
                             const std::vector<LowLatencyCombineCall> &calls, int blocks = 0,
                             void *stream = nullptr, std::vector<std::string> slotNames = {});
  Plan planEngramFetch(const EPSpec &spec, int64_t entriesPerRank,
                       const std::vector<EngramCall> &calls, int blocks = 0, void *stream = nullptr,
                       std::vector<std::string> slotNames = {});
  /// An expanded dispatch and the expert GEMM on its rows, fused by the
  /// compiler (ep-fuse-dispatch-gemm): GEMM tiles start as their rows land.
  Plan planDispatchGemm(const EPSpec &spec, const DispatchVariant &variant,
                        const std::vector<DispatchGemmCall> &calls, int blocks = 0,
                        void *stream = nullptr, std::vector<std::string> slotNames = {});
  /// The expert GEMM and the combine of its output, fused by the compiler
  /// (ep-fuse-gemm-combine): tokens travel as soon as their rows are computed.
  Plan planGemmCombine(const EPSpec &spec, int biases, const std::vector<GemmCombineCall> &calls,
                       int blocks = 0, void *stream = nullptr,
                       std::vector<std::string> slotNames = {});
  /// The whole FP8 MoE layer (ep.moe_layer): dispatch, gate/up GEMM, SwiGLU,
  /// down GEMM and combine in one persistent kernel, no host step between.
  Plan planMoeLayer(const EPSpec &spec, const DispatchVariant &variant,
                    const std::vector<MoeLayerCall> &calls, int blocks = 0, void *stream = nullptr,
                    std::vector<std::string> slotNames = {});

  /// Plan, launch and wait for `stream`. With `checkRouting`, topk_idx is
  /// first read back and range-checked (skipped while `stream` is being
  /// captured: a graph cannot synchronize).
  Run dispatch(const EPSpec &spec, const DispatchVariant &variant,
               const std::vector<DispatchCall> &calls, void *stream = nullptr,
               bool checkRouting = true, int blocks = 0);
  Run combine(const EPSpec &spec, const CombineVariant &variant,
              const std::vector<CombineCall> &calls, void *stream = nullptr, int blocks = 0);
  Run groupedGemm(const EPSpec &spec, const std::vector<GroupedGemmCall> &calls,
                  void *stream = nullptr, int blocks = 0);
  Run swiglu(const EPSpec &spec, const std::vector<SwigluCall> &calls, void *stream = nullptr,
             int blocks = 0);
  Run dispatchGemm(const EPSpec &spec, const DispatchVariant &variant,
                   const std::vector<DispatchGemmCall> &calls, void *stream = nullptr,
                   int blocks = 0);
  Run dispatchLayout(const EPSpec &spec, const std::vector<LayoutCall> &calls,
                     void *stream = nullptr, int blocks = 0);
  Run gemmCombine(const EPSpec &spec, int biases, const std::vector<GemmCombineCall> &calls,
                  void *stream = nullptr, int blocks = 0);
  Run moeLayer(const EPSpec &spec, const DispatchVariant &variant,
               const std::vector<MoeLayerCall> &calls, void *stream = nullptr, int blocks = 0);
  Run engramFetch(const EPSpec &spec, int64_t entriesPerRank, const std::vector<EngramCall> &calls,
                  void *stream = nullptr, int blocks = 0);

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
  /// After how long a stream wait of AGRS or PP on a peer's flag is reported
  /// (the buffer's GPU timeout; StreamWaits.h).
  double streamWaitTimeout() const { return waitTimeoutSecs; }
  void setStreamWaitTimeout(double secs) { waitTimeoutSecs = secs; }
  /// Bytes of host memory after each rank's window (DeepEP's num_cpu_bytes,
  /// Engram's tables; HostSegment.h): at window offset windowBytes(). 0: none.
  int64_t hostSegmentBytes() const { return cpuBytesPerRank; }
  /// Bytes from one served rank's window to the next's (the device part and
  /// the host segment).
  int64_t windowStride() const { return bytesPerRank + cpuBytesPerRank; }
  /// The device memory of the `servedRank`-th served rank's window (what its
  /// kernels see at window offset 0), for inspection and tests.
  virtual void *windowMemory(int servedRank) const = 0;
  /// World rank `peer`'s window as the `servedRank`-th served rank reaches
  /// it (the virtual world's slice; NCCL: the peer's NVLink mapping in this
  /// process, its LSA pointer). Throws naming a peer outside the served
  /// rank's NVLink domain.
  virtual void *peerWindowMemory(int servedRank, int peer) const = 0;
  /// Throws std::invalid_argument unless the world is one NVLink domain:
  /// "<what> copies between the ranks of one NVLink domain; ...".
  void requireOneNvlinkDomain(const std::string &what) const;
  /// World rank of the `servedRank`-th served rank.
  virtual int worldRankOf(int servedRank) const { return servedRank; }
  /// Window bytes [begin, end) of every served rank now hold data written
  /// outside a kernel (copy engines): the fused kernels' scratch is zeroed
  /// before use there, as after a kernel's data.
  void noteWindowData(int64_t begin, int64_t end, void *stream);
  /// Where each served rank's window-resident tensors may lie: its window
  /// past the region `prepared`'s kernels use (EPWindow.h's data region).
  std::vector<WindowRange> windowRanges(const Prepared &prepared) const;
  int blocks() const { return blocksPerRank; }
  /// Ranks of the whole EP world (all of them are served in the virtual
  /// world; one per process with NCCL).
  virtual int worldSize() const { return servedRanks; }
  /// Ranks per node (NVLink domain) of that world, numbered node-major: the
  /// world is worldSize() / gpusPerNode() nodes.
  virtual int gpusPerNode() const { return worldSize(); }
  int servedRankCount() const { return servedRanks; }

protected:
  void checkWorld(const EPSpec &spec, size_t calls) const;
  /// launch() and wait for the stream.
  Run launchAndWait(const Prepared &prepared, void *stream);
  /// With `hostBytes` (a multiple of 2 MiB), the window's device part is
  /// rounded up to 2 MiB too, so that the host segment can follow it.
  KernelHost(KernelProvider &provider, int servedRanks, int64_t windowBytes, int blocksPerRank,
             int64_t hostBytes = 0);
  /// The loaded kernels of `input`; `mayLoad` false refuses (naming why)
  /// to load a module that is not loaded yet.
  Loaded &load(const KernelInput &input, Run &run, bool mayLoad);
  /// A plan of `records` for `request` (the typed entry points' common part).
  Plan plan(const KernelRequest &request, const std::vector<ParamRecord> &records, int blocks,
            void *stream, std::vector<std::string> slotNames);

  KernelProvider &provider;
  int servedRanks;
  int64_t bytesPerRank;
  int64_t cpuBytesPerRank;
  double waitTimeoutSecs = 100;
  int blocksPerRank;
  int deviceSms = 0;
  /// The kernels' first two arguments: the device communicator and window.
  void *commArgument = nullptr, *windowArgument = nullptr;
  /// GIN signals per context of the device communicator, which kernels that
  /// reach other nodes need (launch metadata gin_signals): 0 where it has no
  /// GIN; -1 where the buffer does not say (then prepare() does not check).
  int64_t ginSignals = -1;
  std::map<std::string, Loaded *> modules;

private:
  /// Encodes the TMA descriptors of `prepared`'s kernels into its records.
  void encodeTensorMaps(Prepared &prepared) const;
  /// Before a launch: zeroes the fused kernels' scratch on every served rank
  /// (stream-ordered) where calls may have written data, and remembers the
  /// data region this launch writes. Every op starts with an entry barrier
  /// that waits for all ranks, so no peer writes this launch's data before
  /// the zeroing is done on each rank.
  void trackWindow(const Prepared &prepared, void *stream);
  /// Window bytes (of every served rank) that calls may have written data
  /// to: by launches here, and by launches captured into CUDA graphs (whose
  /// replays may run at any time, so those bytes stay written).
  WindowBytes written, writtenByGraphs;

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

} // namespace epic::runtime

#endif // EPIC_RUNTIME_KERNELHOST_H
