//===- NcclShim.cu - the nccl backend's device functions -----------------===//
//
// The project's own thin `extern "C"` layer over the NCCL device API (LSA
// pointers and barriers, GIN put / putValue / signal / flush): every entry
// takes scalars and pointers only, instantiates the NCCL templates for one
// cooperation level and one signal/counter action, and is inlined into the
// generated kernels after the bitcode link. The device communicator is passed
// by pointer (it lives in device memory). Rebuilt per NCCL version: the build
// compiles it against the headers of the NCCL it links, and of each extra NCCL
// it is configured with (EPIC_EXTRA_NCCL_ROOTS: the same source over 2.28.9's
// and 2.32.3's headers; 2.32 needs PTX ISA 8.4, see EpicDependencies.cmake).
//
// Not over the LLVM bitcode the 2.32 wheel ships (lib/libnccl_device.bc, a C
// API: ncclGin_C_init, ncclGinPut_v3, ...): measured on 2.32.3 for one warp put
// with a signal, the headers give 1,176 PTX lines and no call, the bitcode
// 1,805 lines, an indirect call (ncclCoopAny's vtable) and two __assertfail;
// and the C API's names change between releases (_v2, _v3), where this source
// compiled unchanged for 2.28.9 and 2.32.3.
//
// Waits are bounded here rather than in NCCL (2.28.9 has no device timeouts):
// signals are polled with readSignal, and the LSA barrier is NCCL's session
// with its wait loop replaced by a bounded one (lsaBarrier). The GIN barriers
// stay NCCL's: the runtime's device communicator has no GIN resources.
//
//===----------------------------------------------------------------------===//

#define EPIC_SHIM_PREFIX __epic_nccl_
#include "ShimCommon.cuh"

#include <nccl_device.h>

using namespace epic_device;

namespace {

__device__ __forceinline__ const ncclDevComm &dcomm(void *comm) {
  return *static_cast<const ncclDevComm *>(comm);
}

__device__ __forceinline__ ncclTeam team(void *comm, int32_t kind) {
  switch (kind) {
  case 0:
    return ncclTeamWorld(dcomm(comm));
  case 1:
    return ncclTeamLsa(dcomm(comm));
  default:
    return ncclTeamRail(dcomm(comm));
  }
}

__device__ __forceinline__ ncclTeam team(int32_t n, int32_t rank, int32_t stride) {
  ncclTeam t;
  t.nRanks = n;
  t.rank = rank;
  t.stride = stride;
  return t;
}

/// Calls `f(remoteAction)` with the NCCL remote action for `mode`. The callers'
/// lambdas are always_inline: with a GIN of four backends (2.32), clang would
/// leave a large one a call, and `mode` would not fold.
template <typename F>
__device__ __forceinline__ void withRemoteAction(int32_t mode, int32_t signal, int64_t add, F f) {
  switch (mode) {
  case kSignalInc:
    f(ncclGin_SignalInc{uint32_t(signal)});
    break;
  case kSignalAdd:
    f(ncclGin_SignalAdd{uint32_t(signal), uint64_t(add)});
    break;
  default:
    f(ncclGin_None{});
    break;
  }
}

template <typename Coop>
__device__ __forceinline__ void
put(Coop coop, void *comm, int32_t context, ncclTeam tm, int32_t peer, void *dstWindow,
    int64_t dstOffset, void *srcWindow, int64_t srcOffset, int64_t bytes, int32_t signalMode,
    int32_t signal, int64_t signalAdd, int32_t counterMode, int32_t counter) {
  ncclGin gin(dcomm(comm), context);
  withRemoteAction(signalMode, signal, signalAdd, [&](auto remote) __attribute__((always_inline)) {
    if (counterMode)
      gin.put(tm, peer, ncclWindow_t(dstWindow), size_t(dstOffset), ncclWindow_t(srcWindow),
              size_t(srcOffset), size_t(bytes), remote, ncclGin_CounterInc{uint32_t(counter)},
              coop);
    else
      gin.put(tm, peer, ncclWindow_t(dstWindow), size_t(dstOffset), ncclWindow_t(srcWindow),
              size_t(srcOffset), size_t(bytes), remote, ncclGin_None{}, coop);
  });
}

template <typename Coop>
__device__ __forceinline__ void putValue(Coop coop, void *comm, int32_t context, ncclTeam tm,
                                         int32_t peer, void *dstWindow, int64_t dstOffset,
                                         int64_t value, int32_t valueBytes, int32_t signalMode,
                                         int32_t signal, int64_t signalAdd) {
  ncclGin gin(dcomm(comm), context);
  withRemoteAction(signalMode, signal, signalAdd, [&](auto remote) __attribute__((always_inline)) {
    if (valueBytes == 8)
      gin.putValue(tm, peer, ncclWindow_t(dstWindow), size_t(dstOffset), uint64_t(value), remote,
                   coop);
    else
      gin.putValue(tm, peer, ncclWindow_t(dstWindow), size_t(dstOffset), uint32_t(value), remote,
                   coop);
  });
}

template <typename Coop>
__device__ __forceinline__ void signalOnly(Coop coop, void *comm, int32_t context, ncclTeam tm,
                                           int32_t peer, int32_t signal, int32_t signalMode,
                                           int64_t signalAdd) {
  ncclGin gin(dcomm(comm), context);
  if (signalMode == kSignalAdd)
    gin.signal(tm, peer, ncclGin_SignalAdd{uint32_t(signal), uint64_t(signalAdd)}, coop);
  else
    gin.signal(tm, peer, ncclGin_SignalInc{uint32_t(signal)}, coop);
}

template <typename Coop>
__device__ __forceinline__ int64_t waitSignal(Coop coop, void *comm, int32_t context,
                                              int32_t signal, int64_t expected, int64_t timeoutNs,
                                              int32_t peer) {
  ncclGin gin(dcomm(comm), context);
  if (coop.thread_rank() == 0) {
    uint64_t seen = gin.readSignal(uint32_t(signal));
    uint64_t start = nowNs();
    while (int64_t(seen - uint64_t(expected)) < 0) {
      if (int64_t(nowNs() - start) > timeoutNs)
        signalTimeoutTrap(ncclTeamWorld(dcomm(comm)).rank, signal, peer, expected, int64_t(seen),
                          timeoutNs);
      seen = gin.readSignal(uint32_t(signal));
    }
  }
  coop.sync();
  return int64_t(gin.readSignal(uint32_t(signal)));
}

/// Printed by a timed-out LSA barrier before it traps: the slot, the peer
/// that did not arrive, and the epochs expected and seen.
__device__ __noinline__ void barrierTimeoutTrap(int32_t rank, int32_t slot, int32_t peer,
                                                uint32_t expected, uint32_t seen,
                                                int64_t timeoutNs) {
  printf("epic: device wait timed out after %lld ms: rank %d block %d thread %d waited for "
         "peer %d at LSA barrier slot %d (epoch %u, seen %u)\n",
         (long long)(timeoutNs / 1000000), (int)rank, (int)blockIdx.x, (int)threadIdx.x, (int)peer,
         (int)slot, expected, seen);
  __trap();
}

/// NCCL's LSA barrier (ncclLsaBarrierSession, unicast) with a bounded wait:
/// its arrive, then its wait's loop (nccl_device/impl/lsa_barrier__funcs.h of
/// the NCCL this shim is compiled against) polling each peer's inbox word
/// until `timeoutNs`, since NCCL's own wait spins forever. The session's
/// destructor stores the advanced epoch, as after NCCL's wait.
template <typename Coop>
__device__ __forceinline__ void lsaBarrier(Coop coop, const ncclDevComm &c, int32_t index,
                                           int64_t timeoutNs) {
  int32_t me = ncclTeamWorld(c).rank;
  // The session reads slot `index` of the barrier state: a slot the
  // communicator does not have is reported, not read out of bounds.
  if (index < 0 || index >= c.lsaBarrier.nBarriers) {
    if (coop.thread_rank() == 0)
      timeoutTrap("an LSA barrier slot < lsaBarrierCount, not slot", me, index, "<",
                  c.lsaBarrier.nBarriers, index, 0);
    coop.sync(); // the others wait for thread 0's report and trap
  }
  ncclLsaBarrierSession<Coop> bar(coop, c, ncclTeamTagLsa(), uint32_t(index));
  bar.arrive(coop, cuda::memory_order_acq_rel);
  uint32_t expected = bar.epoch + 1;
#pragma unroll 1
  for (int i = coop.thread_rank(); i < bar.team.nRanks - 1; i += coop.size()) {
    int peer = i + (bar.team.rank <= i ? 1 : 0);
    cuda::atomic_ref<uint32_t> inbox(*bar.ucInbox(bar.team.rank, peer));
    uint32_t seen = inbox.load(cuda::memory_order_acquire);
    uint64_t start = nowNs();
    // Arrived once the inbox reached the epoch (wrapping compare, as NCCL's).
    while (seen - expected > uint32_t(-1) >> 1) {
      if (int64_t(nowNs() - start) > timeoutNs)
        barrierTimeoutTrap(me, index, peer, expected, seen, timeoutNs);
      seen = inbox.load(cuda::memory_order_acquire);
    }
  }
  bar.epoch = expected;
  coop.sync();
}

template <typename Coop>
__device__ __forceinline__ void barrier(Coop coop, void *comm, int32_t teamKind, int32_t index,
                                        int64_t timeoutNs) {
  const ncclDevComm &c = dcomm(comm);
  bool singleNode = ncclTeamLsa(c).nRanks == ncclTeamWorld(c).nRanks;
  if (teamKind == 1 || (teamKind == 0 && singleNode)) {
    lsaBarrier(coop, c, index, timeoutNs);
  } else if (teamKind == 2) {
    ncclGin gin(c, 0);
    ncclGinBarrierSession<Coop> bar(coop, gin, ncclTeamTagRail(), uint32_t(index));
    bar.sync(coop, cuda::memory_order_acq_rel, ncclGinFenceLevel::Relaxed);
  } else {
    ncclGin gin(c, 0);
    ncclBarrierSession<Coop> bar(coop, ncclTeamTagWorld(), gin, uint32_t(index));
    bar.sync(coop, cuda::memory_order_acq_rel, ncclGinFenceLevel::Relaxed);
  }
}

} // namespace

// --- The ABI --------------------------------------------------------------------

EPIC_SHIM_ATTR int32_t __epic_nccl_team_nranks(void *comm, int32_t kind) {
  return team(comm, kind).nRanks;
}
EPIC_SHIM_ATTR int32_t __epic_nccl_team_rank(void *comm, int32_t kind) {
  return team(comm, kind).rank;
}
EPIC_SHIM_ATTR int32_t __epic_nccl_team_stride(void *comm, int32_t kind) {
  return team(comm, kind).stride;
}
EPIC_SHIM_ATTR int32_t __epic_nccl_world_rank(void *comm) {
  return ncclTeamWorld(dcomm(comm)).rank;
}

EPIC_SHIM_ATTR void *__epic_nccl_local_ptr(void *comm, void *window, int64_t offset) {
  (void)comm;
  return ncclGetLocalPointer(ncclWindow_t(window), size_t(offset));
}
EPIC_SHIM_ATTR void *__epic_nccl_peer_ptr(void *comm, void *window, int64_t offset,
                                          int32_t teamNranks, int32_t teamRank, int32_t teamStride,
                                          int32_t peer) {
  (void)comm;
  return ncclGetPeerPointer(ncclWindow_t(window), size_t(offset),
                            team(teamNranks, teamRank, teamStride), peer);
}

#define EPIC_DEFINE_COOP(Coop, Type)                                                               \
  EPIC_SHIM_ATTR void __epic_nccl_put_##Coop(                                                      \
      void *comm, int32_t context, int32_t teamNranks, int32_t teamRank, int32_t teamStride,       \
      int32_t peer, void *dstWindow, int64_t dstOffset, void *srcWindow, int64_t srcOffset,        \
      int64_t bytes, int32_t signalMode, int32_t signal, int64_t signalAdd, int32_t counterMode,   \
      int32_t counter) {                                                                           \
    put(Type{}, comm, context, team(teamNranks, teamRank, teamStride), peer, dstWindow, dstOffset, \
        srcWindow, srcOffset, bytes, signalMode, signal, signalAdd, counterMode, counter);         \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_nccl_put_value_##Coop(                                                \
      void *comm, int32_t context, int32_t teamNranks, int32_t teamRank, int32_t teamStride,       \
      int32_t peer, void *dstWindow, int64_t dstOffset, int64_t value, int32_t valueBytes,         \
      int32_t signalMode, int32_t signal, int64_t signalAdd) {                                     \
    putValue(Type{}, comm, context, team(teamNranks, teamRank, teamStride), peer, dstWindow,       \
             dstOffset, value, valueBytes, signalMode, signal, signalAdd);                         \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_nccl_signal_##Coop(                                                   \
      void *comm, int32_t context, int32_t teamNranks, int32_t teamRank, int32_t teamStride,       \
      int32_t peer, int32_t signal, int32_t signalMode, int64_t signalAdd) {                       \
    signalOnly(Type{}, comm, context, team(teamNranks, teamRank, teamStride), peer, signal,        \
               signalMode, signalAdd);                                                             \
  }                                                                                                \
  EPIC_SHIM_ATTR int64_t __epic_nccl_wait_signal_##Coop(void *comm, int32_t context,               \
                                                        int32_t signal, int64_t expected,          \
                                                        int64_t timeoutNs, int32_t peer) {         \
    return waitSignal(Type{}, comm, context, signal, expected, timeoutNs, peer);                   \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_nccl_flush_##Coop(void *comm, int32_t context) {                      \
    ncclGin gin(dcomm(comm), context);                                                             \
    gin.flush(Type{});                                                                             \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_nccl_barrier_##Coop(void *comm, int32_t teamKind, int32_t index,      \
                                                 int64_t timeoutNs) {                              \
    barrier(Type{}, comm, teamKind, index, timeoutNs);                                             \
  }

EPIC_DEFINE_COOP(thread, ncclCoopThread)
EPIC_DEFINE_COOP(warp, ncclCoopWarp)
EPIC_DEFINE_COOP(block, ncclCoopCta)

EPIC_SHIM_ATTR int64_t __epic_nccl_read_signal(void *comm, int32_t context, int32_t signal) {
  ncclGin gin(dcomm(comm), context);
  return int64_t(gin.readSignal(uint32_t(signal)));
}
EPIC_SHIM_ATTR void __epic_nccl_reset_signal(void *comm, int32_t context, int32_t signal) {
  ncclGin gin(dcomm(comm), context);
  gin.resetSignal(uint32_t(signal));
}
