//===- ShimCommon.cuh - what both device shims share ---------------------===//
//
// Included by NcclShim.cu and VirtualShim.cu after they define
// EPIC_SHIM_PREFIX: declares their part of the ABI from ShimABI.def, and
// defines the bounded waits (timeout -> message naming who waited for what,
// then trap) and the cooperation groups of the virtual backend.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_DEVICE_SHIMCOMMON_CUH
#define EPIC_RUNTIME_DEVICE_SHIMCOMMON_CUH

#include "epic/device/WaitReport.h"

#include <stdint.h>

#ifndef EPIC_SHIM_PREFIX
#error "define EPIC_SHIM_PREFIX (__epic_nccl_ or __epic_virtual_) first"
#endif

// Inlined into the generated kernels: never a real call after linking.
#define EPIC_SHIM_ATTR extern "C" __device__ __attribute__((always_inline))
#define EPIC_CAT2(a, b) a##b
#define EPIC_CAT(a, b) EPIC_CAT2(a, b)
#define EPIC_NAME(Name) EPIC_CAT(EPIC_SHIM_PREFIX, Name)

// Declarations of this backend's ABI (and a compile error if a definition
// below disagrees with ShimABI.def).
#define I32 int32_t
#define I64 int64_t
#define PTR void *
#define VOID void
#define EPIC_SHIM(Name, Result, ...) EPIC_SHIM_ATTR Result EPIC_NAME(Name)(__VA_ARGS__);
#include "epic/device/ShimABI.def"
#undef I32
#undef I64
#undef PTR
#undef VOID

namespace epic_device {

enum SignalMode : int32_t { kSignalNone = 0, kSignalInc = 1, kSignalAdd = 2 };
enum Predicate : int32_t { kEq = 0, kNe = 1, kGe = 2, kGt = 3 };
enum Scope : int32_t { kCta = 0, kCluster = 1, kGpu = 2, kSys = 3 };

__device__ __forceinline__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ int64_t loadAcquire64(const void *p, int32_t scope) {
  int64_t v;
  switch (scope) {
  case kCta:
    asm volatile("ld.acquire.cta.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    break;
  case kCluster:
    asm volatile("ld.acquire.cluster.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    break;
  case kGpu:
    asm volatile("ld.acquire.gpu.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    break;
  default:
    asm volatile("ld.acquire.sys.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    break;
  }
  return v;
}

__device__ __forceinline__ int32_t loadAcquire32(const void *p, int32_t scope) {
  int32_t v;
  switch (scope) {
  case kCta:
    asm volatile("ld.acquire.cta.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    break;
  case kCluster:
    asm volatile("ld.acquire.cluster.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    break;
  case kGpu:
    asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    break;
  default:
    asm volatile("ld.acquire.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    break;
  }
  return v;
}

template <typename T> __device__ __forceinline__ bool holds(T seen, int32_t pred, T value) {
  switch (pred) {
  case kEq:
    return seen == value;
  case kNe:
    return seen != value;
  case kGe:
    return seen >= value;
  default:
    return seen > value;
  }
}

/// Printed by every timed-out wait before it traps: which rank, block and
/// thread waited for what, and what it saw.
__device__ __noinline__ void timeoutTrap(const char *what, int32_t rank, int64_t detail,
                                         const char *relation, int64_t expected, int64_t seen,
                                         int64_t timeoutNs) {
  printf("epic: device wait timed out after %lld ms: rank %d block %d thread %d waited for "
         "%s %lld %s %lld (seen %lld)\n",
         (long long)(timeoutNs / 1000000), (int)rank, (int)blockIdx.x, (int)threadIdx.x, what,
         (long long)detail, relation, (long long)expected, (long long)seen);
  __trap();
}

/// The same for a flag in memory: rank and peer when the caller named them.
__device__ __noinline__ void flagTimeoutTrap(const void *flag, const char *relation,
                                             int64_t expected, int64_t seen, int64_t timeoutNs,
                                             int32_t rank, int32_t peer) {
  printf("epic: device wait timed out after %lld ms: rank %d block %d thread %d waited for "
         "peer %d: the flag at %p %s %lld (seen %lld)\n",
         (long long)(timeoutNs / 1000000), (int)rank, (int)blockIdx.x, (int)threadIdx.x, (int)peer,
         flag, relation, (long long)expected, (long long)seen);
  __trap();
}

/// Printed by comm.agree before it traps: the ranks did not make the same call.
__device__ __noinline__ void disagreementTrap(int64_t value, int64_t theirs, int32_t rank,
                                              int32_t peer) {
  printf("epic: rank %d and rank %d disagree (block %d thread %d): signature %llx here, %llx "
         "there: every rank must make the same call at the same time (the same op, "
         "configuration, variant, num_sms and token cap)\n",
         (int)rank, (int)peer, (int)blockIdx.x, (int)threadIdx.x, (unsigned long long)value,
         (unsigned long long)theirs);
  __trap();
}

} // namespace epic_device

/// Set by the runtime after loading a module (0: nobody reads reports, trap only).
extern "C" __device__ epic_device::WaitReport *epic_wait_report;
__device__ epic_device::WaitReport *epic_wait_report = nullptr;

namespace epic_device {

/// Which report slots a timed-out wait of this module has taken (device memory:
/// atomics on the mapped host slots need platform support).
__device__ unsigned int waitReportClaims[kWaitReportSlots];

/// How long a block that wrote its report waits before its trap ends the
/// grid: the other blocks stuck with it time out moments later (each wait's
/// clock starts when the block reaches it), and a trap ends them mid-report.
constexpr uint64_t kReportGraceNs = 50000000;

/// flagTimeoutTrap without a call: the report into this block's slot of the
/// runtime's mapped memory (fields, then `valid`, each fenced system-wide).
/// The first thread of the slot writes it; the block's other threads that
/// timed out with it wait until it is valid before they trap (a trap ends the
/// whole grid, a report half written included).
__device__ __forceinline__ void flagTimeoutReportTrap(const void *flag, int32_t pred,
                                                      int64_t expected, int64_t seen,
                                                      int64_t timeoutNs, int32_t rank,
                                                      int32_t peer) {
  const unsigned slot = blockIdx.x % kWaitReportSlots;
  WaitReport *reports = epic_wait_report;
  if (!reports)
    __trap();
  volatile WaitReport *r = reports + slot;
  if (atomicCAS(&waitReportClaims[slot], 0u, 1u) != 0u) {
    while (r->valid != 1) {
    }
  } else {
    r->flag = uint64_t(flag);
    r->expected = expected;
    r->seen = seen;
    r->timeoutNs = timeoutNs;
    r->predicate = pred;
    r->rank = rank;
    r->peer = peer;
    r->block = int32_t(blockIdx.x);
    r->thread = int32_t(threadIdx.x);
    __threadfence_system();
    r->valid = 1;
    __threadfence_system();
    for (const uint64_t written = nowNs(); nowNs() - written < kReportGraceNs;) {
    }
  }
  __trap();
}

/// Polls `load` until `pred` holds, at most `timeoutNs`; then reports (printf
/// and trap, or with `Inline` the call-free report) naming rank and peer.
template <bool Inline, typename T, typename Load>
__device__ __forceinline__ T boundedFlagWait(const void *flag, Load load, int32_t pred, T value,
                                             int64_t timeoutNs, int32_t rank, int32_t peer) {
  T seen = load();
  if (holds(seen, pred, value))
    return seen;
  uint64_t start = nowNs();
  while (true) {
    seen = load();
    if (holds(seen, pred, value))
      return seen;
    if (int64_t(nowNs() - start) > timeoutNs) {
      if (Inline)
        flagTimeoutReportTrap(flag, pred, int64_t(value), int64_t(seen), timeoutNs, rank, peer);
      else
        flagTimeoutTrap(flag, waitPredicateName(pred), int64_t(value), int64_t(seen), timeoutNs,
                        rank, peer);
    }
  }
}

} // namespace epic_device

// Agreement checks are backend independent too.
EPIC_SHIM_ATTR void EPIC_NAME(agree_i64)(int64_t value, int64_t theirs, int32_t rank,
                                         int32_t peer) {
  if (value != theirs)
    epic_device::disagreementTrap(value, theirs, rank, peer);
}
EPIC_SHIM_ATTR void EPIC_NAME(agree_i64_inline)(int64_t value, int64_t theirs, int32_t rank,
                                                int32_t peer) {
  if (value != theirs)
    epic_device::flagTimeoutReportTrap(nullptr, epic_device::kDisagreed, value, theirs, 0, rank,
                                       peer);
}

// Flag waits are backend independent: both shims define them.
#define EPIC_FLAG_WAIT(Name, Inline, T, Load)                                                      \
  EPIC_SHIM_ATTR T EPIC_NAME(Name)(void *flag, int32_t pred, T value, int32_t scope,               \
                                   int64_t timeoutNs, int32_t rank, int32_t peer) {                \
    return epic_device::boundedFlagWait<Inline, T>(                                                \
        flag, [&] { return epic_device::Load(flag, scope); }, pred, value, timeoutNs, rank, peer); \
  }
EPIC_FLAG_WAIT(wait_flag_i32, false, int32_t, loadAcquire32)
EPIC_FLAG_WAIT(wait_flag_i64, false, int64_t, loadAcquire64)
EPIC_FLAG_WAIT(wait_flag_i32_inline, true, int32_t, loadAcquire32)
EPIC_FLAG_WAIT(wait_flag_i64_inline, true, int64_t, loadAcquire64)
#undef EPIC_FLAG_WAIT

namespace epic_device {

/// Whether the mbarrier at shared address `barrier` has completed the phase
/// of parity `parity` (acquire at CTA scope, as the unbounded waits of the
/// TMA pipelines). The thread may be suspended up to a system-chosen time
/// (a few microseconds) before it says no, so a poll costs no issue slots.
__device__ __forceinline__ bool phaseCompleted(uint32_t barrier, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n\t.reg .pred p;\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
               "selp.u32 %0, 1, 0, p;\n\t}"
               : "=r"(done)
               : "r"(barrier), "r"(parity)
               : "memory");
  return done != 0;
}

inline __device__ __noinline__ void phaseTimeoutTrap(uint32_t barrier, uint32_t parity,
                                                     int64_t timeoutNs, int32_t rank);

/// Waits until the phase of `parity` completes, at most about `timeoutNs`;
/// then reports the barrier and the parity (printf, or with
/// `Inline` the call-free report slot) and traps. The first poll is the whole
/// cost when the phase is done: the clock is read only once it was not, in
/// units of 2^20 ns (~1 ms) in 32 bits (one register: the FP8 GEMM's
/// consumers hold their sums in nearly all they have).
template <bool Inline>
__device__ __forceinline__ void boundedPhaseWait(uint32_t barrier, uint32_t parity,
                                                 int64_t timeoutNs, int32_t rank) {
  if (phaseCompleted(barrier, parity))
    return;
  const uint32_t start = uint32_t(nowNs() >> 20);
  while (!phaseCompleted(barrier, parity)) {
    if (uint32_t(nowNs() >> 20) - start <= uint32_t(timeoutNs >> 20))
      continue;
    if (Inline)
      flagTimeoutReportTrap(reinterpret_cast<const void *>(uintptr_t(barrier)), kPhaseNotCompleted,
                            int64_t(parity), 0, timeoutNs, rank, -1);
    phaseTimeoutTrap(barrier, parity, timeoutNs, rank);
  }
}

} // namespace epic_device

EPIC_SHIM_ATTR void EPIC_NAME(wait_phase)(int32_t barrier, int32_t parity, int64_t timeoutNs,
                                          int32_t rank) {
  epic_device::boundedPhaseWait<false>(uint32_t(barrier), uint32_t(parity) & 1u, timeoutNs, rank);
}
EPIC_SHIM_ATTR void EPIC_NAME(wait_phase_inline)(int32_t barrier, int32_t parity, int64_t timeoutNs,
                                                 int32_t rank) {
  epic_device::boundedPhaseWait<true>(uint32_t(barrier), uint32_t(parity) & 1u, timeoutNs, rank);
}

namespace epic_device {

/// Printed by a timed-out comm.wait_signal before it traps: whom the signal
/// was waited from, when the op named the peer. Last and `inline` (emitted
/// with the templates that call it), so that the string constants above keep
/// their names in the PTX of kernels without a signal wait.
inline __device__ __noinline__ void signalTimeoutTrap(int32_t rank, int32_t signal, int32_t peer,
                                                      int64_t expected, int64_t seen,
                                                      int64_t timeoutNs) {
  if (peer >= 0)
    printf("epic: device wait timed out after %lld ms: rank %d waited for signal %d from rank %d "
           "(expected >= %lld, seen %lld; block %d thread %d)\n",
           (long long)(timeoutNs / 1000000), (int)rank, (int)signal, (int)peer, (long long)expected,
           (long long)seen, (int)blockIdx.x, (int)threadIdx.x);
  else
    printf("epic: device wait timed out after %lld ms: rank %d waited for signal %d (expected >= "
           "%lld, seen %lld; block %d thread %d)\n",
           (long long)(timeoutNs / 1000000), (int)rank, (int)signal, (long long)expected,
           (long long)seen, (int)blockIdx.x, (int)threadIdx.x);
  __trap();
}

/// Printed by a timed-out comm.wait_phase before it traps (last and `inline`,
/// as signalTimeoutTrap).
inline __device__ __noinline__ void phaseTimeoutTrap(uint32_t barrier, uint32_t parity,
                                                     int64_t timeoutNs, int32_t rank) {
  printf("epic: device wait timed out after %lld ms: rank %d block %d thread %d waited for the "
         "mbarrier at shared 0x%x to complete its phase of parity %u: " EPIC_PHASE_STALL_CAUSES
         "\n",
         (long long)(timeoutNs / 1000000), (int)rank, (int)blockIdx.x, (int)threadIdx.x,
         (unsigned)barrier, (unsigned)parity);
  __trap();
}

} // namespace epic_device

#endif // EPIC_RUNTIME_DEVICE_SHIMCOMMON_CUH
