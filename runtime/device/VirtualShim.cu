//===- VirtualShim.cu - the virtual backend's device functions -----------===//
//
// R virtual ranks on one GPU, no NCCL: a rank is a contiguous group of
// gridDim.x / R blocks of one cooperative launch, windows are R equal slices
// of one allocation, signals and barrier counters are global-memory atomics.
// convert-comm-to-nvvm{backend=virtual} inlines the simple operations (ranks,
// pointers, signals) itself and calls these for the loops (copies, waits,
// barriers). Compiled to LLVM bitcode by clang and linked before NVPTX.
//
//===----------------------------------------------------------------------===//

#define EPIC_SHIM_PREFIX __epic_virtual_
#include "ShimCommon.cuh"

#include "epic/device/VirtualWorld.h"

using namespace epic_device;

namespace {

__device__ __forceinline__ const EpicVirtualComm &vcomm(void *comm) {
  return *static_cast<const EpicVirtualComm *>(comm);
}

__device__ __forceinline__ int32_t myRank(void *comm) {
  int32_t blocksPerRank = gridDim.x / vcomm(comm).num_ranks;
  return blockIdx.x / blocksPerRank;
}

/// The teams of N nodes of M GPUs, ranks node-major (w = node * M + GPU):
/// world {R, w, 1}, LSA {M, w % M, 1}, rail {N, w / M, M} as (ranks, rank,
/// stride) by team kind (0 world, 1 LSA, 2 rail).
__device__ __forceinline__ int32_t teamRanks(void *comm, int32_t kind) {
  const EpicVirtualComm &c = vcomm(comm);
  return kind == 0 ? c.num_ranks : kind == 1 ? c.lsa_size : c.num_ranks / c.lsa_size;
}
__device__ __forceinline__ int32_t teamRank(void *comm, int32_t kind) {
  int32_t w = myRank(comm), m = vcomm(comm).lsa_size;
  return kind == 0 ? w : kind == 1 ? w % m : w / m;
}
__device__ __forceinline__ int32_t teamStride(void *comm, int32_t kind) {
  return kind == 2 ? vcomm(comm).lsa_size : 1;
}

__device__ __forceinline__ int32_t worldPeer(void *comm, int32_t teamRank, int32_t teamStride,
                                             int32_t peer) {
  return myRank(comm) + (peer - teamRank) * teamStride;
}

__device__ __forceinline__ char *slice(void *window, int32_t rank, int64_t offset) {
  const EpicVirtualWindow &w = *static_cast<const EpicVirtualWindow *>(window);
  return w.base + uint64_t(rank) * w.stride + offset;
}

__device__ __forceinline__ uint64_t *signalSlot(void *comm, int32_t rank, int32_t context,
                                                int32_t signal) {
  const EpicVirtualComm &c = vcomm(comm);
  return c.signals + (uint64_t(rank) * c.num_contexts + context) * c.num_signals + signal;
}

// The cooperation groups: their size, this thread's index in it, and a sync.
struct Thread {
  __device__ int rank() const { return 0; }
  __device__ int size() const { return 1; }
  __device__ void sync() const {}
};
struct Warp {
  __device__ int rank() const { return threadIdx.x % 32; }
  __device__ int size() const { return 32; }
  __device__ void sync() const { __syncwarp(); }
};
struct Block {
  __device__ int rank() const {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  }
  __device__ int size() const { return blockDim.x * blockDim.y * blockDim.z; }
  __device__ void sync() const { __syncthreads(); }
};

/// The group copies `bytes` bytes, 16 at a time where both ends allow it.
template <typename Coop>
__device__ __forceinline__ void copy(Coop coop, char *dst, const char *src, int64_t bytes) {
  if (((uintptr_t(dst) | uintptr_t(src)) & 15) == 0) {
    int64_t vectors = bytes / 16;
    for (int64_t i = coop.rank(); i < vectors; i += coop.size())
      reinterpret_cast<int4 *>(dst)[i] = reinterpret_cast<const int4 *>(src)[i];
    for (int64_t i = vectors * 16 + coop.rank(); i < bytes; i += coop.size())
      dst[i] = src[i];
  } else {
    for (int64_t i = coop.rank(); i < bytes; i += coop.size())
      dst[i] = src[i];
  }
}

/// Whether rank `me`'s network is down (EpicVirtualComm::drop_network_from):
/// its put, put_value and signal then do nothing, as a stalled node's would,
/// but for those raising the spared signal (drop_spares_signal).
__device__ __forceinline__ bool networkDropped(void *comm, int32_t me, int32_t signalMode,
                                               int32_t signal) {
  const EpicVirtualComm &c = vcomm(comm);
  if (c.drop_network_from != me)
    return false;
  return signalMode == kSignalNone || signal != c.drop_spares_signal;
}

/// Counts what a GIN operation from `me` to `target` would send
/// (EpicVirtualComm::traffic, when the runtime asked for it).
__device__ __forceinline__ void countTraffic(void *comm, int32_t me, int32_t target, int32_t kind,
                                             uint64_t amount) {
  const EpicVirtualComm &c = vcomm(comm);
  if (!c.traffic)
    return;
  uint64_t pair = uint64_t(me) * c.num_ranks + target;
  atomicAdd(reinterpret_cast<unsigned long long *>(c.traffic + pair * EPIC_TRAFFIC_KINDS + kind),
            (unsigned long long)amount);
}

/// Remote signal action, once for the group, after everything the group
/// wrote before is visible at system scope; counted as one signal operation.
__device__ __forceinline__ void signalPeer(void *comm, int32_t me, int32_t peerWorld,
                                           int32_t context, int32_t signal, int32_t mode,
                                           int64_t add) {
  if (mode == kSignalNone)
    return;
  uint64_t delta = mode == kSignalInc ? 1 : uint64_t(add);
  uint64_t *slot = signalSlot(comm, peerWorld, context, signal);
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(slot), "l"(delta) : "memory");
  countTraffic(comm, me, peerWorld, EPIC_TRAFFIC_SIGNALS, 1);
}

template <typename Coop>
__device__ __forceinline__ void
put(Coop coop, void *comm, int32_t context, int32_t teamRank, int32_t teamStride, int32_t peer,
    void *dstWindow, int64_t dstOffset, void *srcWindow, int64_t srcOffset, int64_t bytes,
    int32_t signalMode, int32_t signal, int64_t signalAdd, int32_t counterMode, int32_t counter) {
  int32_t me = myRank(comm);
  if (networkDropped(comm, me, signalMode, signal))
    return;
  int32_t target = worldPeer(comm, teamRank, teamStride, peer);
  coop.sync(); // the group's earlier writes to the source are done
  copy(coop, slice(dstWindow, target, dstOffset), slice(srcWindow, me, srcOffset), bytes);
  coop.sync();
  if (coop.rank() == 0) {
    __threadfence_system(); // cumulative: covers the whole group's copy
    countTraffic(comm, me, target, EPIC_TRAFFIC_PUT_BYTES, uint64_t(bytes));
    signalPeer(comm, me, target, context, signal, signalMode, signalAdd);
    if (counterMode) {
      const EpicVirtualComm &c = vcomm(comm);
      atomicAdd(
          reinterpret_cast<unsigned long long *>(
              c.counters + (uint64_t(me) * c.num_contexts + context) * c.num_counters + counter),
          1ull);
    }
  }
  coop.sync();
}

template <typename Coop>
__device__ __forceinline__ void putValue(Coop coop, void *comm, int32_t context, int32_t teamRank,
                                         int32_t teamStride, int32_t peer, void *dstWindow,
                                         int64_t dstOffset, int64_t value, int32_t valueBytes,
                                         int32_t signalMode, int32_t signal, int64_t signalAdd) {
  int32_t me = myRank(comm);
  if (networkDropped(comm, me, signalMode, signal))
    return;
  int32_t target = worldPeer(comm, teamRank, teamStride, peer);
  coop.sync();
  if (coop.rank() == 0) {
    char *dst = slice(dstWindow, target, dstOffset);
    if (valueBytes == 8)
      asm volatile("st.relaxed.sys.b64 [%0], %1;" ::"l"(dst), "l"(value) : "memory");
    else
      asm volatile("st.relaxed.sys.b32 [%0], %1;" ::"l"(dst), "r"(int32_t(value)) : "memory");
    __threadfence_system();
    countTraffic(comm, me, target, EPIC_TRAFFIC_PUT_VALUE_BYTES, uint64_t(valueBytes));
    signalPeer(comm, me, target, context, signal, signalMode, signalAdd);
  }
  coop.sync();
}

template <typename Coop>
__device__ __forceinline__ void signalOnly(Coop coop, void *comm, int32_t context, int32_t teamRank,
                                           int32_t teamStride, int32_t peer, int32_t signal,
                                           int32_t signalMode, int64_t signalAdd) {
  int32_t me = myRank(comm);
  if (networkDropped(comm, me, signalMode, signal))
    return;
  coop.sync();
  if (coop.rank() == 0) {
    __threadfence_system();
    signalPeer(comm, me, worldPeer(comm, teamRank, teamStride, peer), context, signal, signalMode,
               signalAdd);
  }
  coop.sync();
}

/// NCCL's rolling comparison: `seen` has reached `least` (modulo 2^64).
__device__ __forceinline__ bool reached(uint64_t seen, uint64_t least) {
  return int64_t(seen - least) >= 0;
}

template <typename Coop>
__device__ __forceinline__ int64_t waitSignal(Coop coop, void *comm, int32_t context,
                                              int32_t signal, int64_t expected, int64_t timeoutNs,
                                              int32_t peer) {
  int32_t me = myRank(comm);
  const uint64_t *slot = signalSlot(comm, me, context, signal);
  if (coop.rank() == 0) {
    uint64_t seen = loadAcquire64(slot, kSys);
    uint64_t start = nowNs();
    while (!reached(seen, expected)) {
      if (int64_t(nowNs() - start) > timeoutNs)
        signalTimeoutTrap(me, signal, peer, expected, int64_t(seen), timeoutNs);
      seen = loadAcquire64(slot, kSys);
    }
  }
  coop.sync();
  return loadAcquire64(slot, kSys);
}

/// A barrier of one team (kind 0 world, 1 LSA, 2 rail): the calling rank's
/// team arrives at its own counter (VirtualWorld.def: barriers), and waits
/// until every member of its team arrived as often as it did.
template <typename Coop>
__device__ __forceinline__ void barrier(Coop coop, void *comm, int32_t teamKind, int32_t index,
                                        int64_t timeoutNs) {
  const EpicVirtualComm &c = vcomm(comm);
  int32_t me = myRank(comm), m = c.lsa_size, n = c.num_ranks / m;
  int32_t members = teamRanks(comm, teamKind);
  int64_t slot = teamKind == 0   ? index
                 : teamKind == 1 ? c.num_barriers + int64_t(index) * n + me / m
                                 : int64_t(c.num_barriers) * (1 + n) + int64_t(index) * m + me % m;
  coop.sync();
  if (coop.rank() == 0 && (index < 0 || index >= c.num_barriers))
    timeoutTrap(teamKind == 0   ? "a world barrier index < num_barriers, not index"
                : teamKind == 1 ? "an LSA barrier index < num_barriers, not index"
                                : "a rail barrier index < num_barriers, not index",
                me, index, "<", c.num_barriers, index, 0);
  if (coop.rank() == 0 && members > 1) {
    uint64_t *counter = c.barriers + slot;
    __threadfence_system();
    // Arrivals only grow: generation g is complete once members * (g + 1) arrived.
    uint64_t old = atomicAdd(reinterpret_cast<unsigned long long *>(counter), 1ull);
    uint64_t target = (old / members + 1) * members;
    uint64_t seen = loadAcquire64(counter, kSys);
    uint64_t start = nowNs();
    while (seen < target) {
      if (int64_t(nowNs() - start) > timeoutNs)
        timeoutTrap(teamKind == 0   ? "world barrier index"
                    : teamKind == 1 ? "LSA barrier index"
                                    : "rail barrier index",
                    me, index, ">=", int64_t(target), int64_t(seen), timeoutNs);
      seen = loadAcquire64(counter, kSys);
    }
  }
  coop.sync();
}

} // namespace

// --- The ABI --------------------------------------------------------------------

EPIC_SHIM_ATTR int32_t __epic_virtual_team_nranks(void *comm, int32_t kind) {
  return teamRanks(comm, kind);
}
EPIC_SHIM_ATTR int32_t __epic_virtual_team_rank(void *comm, int32_t kind) {
  return teamRank(comm, kind);
}
EPIC_SHIM_ATTR int32_t __epic_virtual_team_stride(void *comm, int32_t kind) {
  return teamStride(comm, kind);
}
EPIC_SHIM_ATTR int32_t __epic_virtual_world_rank(void *comm) { return myRank(comm); }

EPIC_SHIM_ATTR void *__epic_virtual_local_ptr(void *comm, void *window, int64_t offset) {
  return slice(window, myRank(comm), offset);
}
EPIC_SHIM_ATTR void *__epic_virtual_peer_ptr(void *comm, void *window, int64_t offset,
                                             int32_t teamNranks, int32_t teamRank,
                                             int32_t teamStride, int32_t peer) {
  (void)teamNranks;
  return slice(window, worldPeer(comm, teamRank, teamStride, peer), offset);
}

#define EPIC_DEFINE_COOP(Coop, Type)                                                               \
  EPIC_SHIM_ATTR void __epic_virtual_put_##Coop(                                                   \
      void *comm, int32_t context, int32_t teamNranks, int32_t teamRank, int32_t teamStride,       \
      int32_t peer, void *dstWindow, int64_t dstOffset, void *srcWindow, int64_t srcOffset,        \
      int64_t bytes, int32_t signalMode, int32_t signal, int64_t signalAdd, int32_t counterMode,   \
      int32_t counter) {                                                                           \
    (void)teamNranks;                                                                              \
    put(Type{}, comm, context, teamRank, teamStride, peer, dstWindow, dstOffset, srcWindow,        \
        srcOffset, bytes, signalMode, signal, signalAdd, counterMode, counter);                    \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_virtual_put_value_##Coop(                                             \
      void *comm, int32_t context, int32_t teamNranks, int32_t teamRank, int32_t teamStride,       \
      int32_t peer, void *dstWindow, int64_t dstOffset, int64_t value, int32_t valueBytes,         \
      int32_t signalMode, int32_t signal, int64_t signalAdd) {                                     \
    (void)teamNranks;                                                                              \
    putValue(Type{}, comm, context, teamRank, teamStride, peer, dstWindow, dstOffset, value,       \
             valueBytes, signalMode, signal, signalAdd);                                           \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_virtual_signal_##Coop(                                                \
      void *comm, int32_t context, int32_t teamNranks, int32_t teamRank, int32_t teamStride,       \
      int32_t peer, int32_t signal, int32_t signalMode, int64_t signalAdd) {                       \
    (void)teamNranks;                                                                              \
    signalOnly(Type{}, comm, context, teamRank, teamStride, peer, signal, signalMode, signalAdd);  \
  }                                                                                                \
  EPIC_SHIM_ATTR int64_t __epic_virtual_wait_signal_##Coop(void *comm, int32_t context,            \
                                                           int32_t signal, int64_t expected,       \
                                                           int64_t timeoutNs, int32_t peer) {      \
    return waitSignal(Type{}, comm, context, signal, expected, timeoutNs, peer);                   \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_virtual_flush_##Coop(void *comm, int32_t context) {                   \
    (void)comm;                                                                                    \
    (void)context;                                                                                 \
    /* Virtual puts complete before they return: only order them. */                               \
    __threadfence_system();                                                                        \
    Type{}.sync();                                                                                 \
  }                                                                                                \
  EPIC_SHIM_ATTR void __epic_virtual_barrier_##Coop(void *comm, int32_t teamKind, int32_t index,   \
                                                    int64_t timeoutNs) {                           \
    barrier(Type{}, comm, teamKind, index, timeoutNs);                                             \
  }

EPIC_DEFINE_COOP(thread, Thread)
EPIC_DEFINE_COOP(warp, Warp)
EPIC_DEFINE_COOP(block, Block)

EPIC_SHIM_ATTR int64_t __epic_virtual_read_signal(void *comm, int32_t context, int32_t signal) {
  return loadAcquire64(signalSlot(comm, myRank(comm), context, signal), kSys);
}
EPIC_SHIM_ATTR void __epic_virtual_reset_signal(void *comm, int32_t context, int32_t signal) {
  *signalSlot(comm, myRank(comm), context, signal) = 0;
}

// --- The node check of comm.peer_ptr: after every report above, so that their
//     string constants keep their names in the PTX. -------------------------------

namespace {

/// Printed when a rank used an NVLink (LSA) pointer to a rank of another
/// node, before the trap.
__device__ __noinline__ void lsaViolationTrap(int32_t rank, int32_t peer, int32_t lsaSize,
                                              int32_t numRanks) {
  printf("epic: rank %d used an NVLink (LSA) pointer to rank %d of another node (block %d "
         "thread %d; a virtual world of %d nodes of %d GPUs): only the network (comm.put, "
         "put_value, signal) reaches another node\n",
         (int)rank, (int)peer, (int)blockIdx.x, (int)threadIdx.x, (int)(numRanks / lsaSize),
         (int)lsaSize);
  __trap();
}

/// Whether `peer` is in another node than `rank` (only when there are nodes).
__device__ __forceinline__ bool otherNode(int32_t rank, int32_t peer, int32_t lsaSize,
                                          int32_t numRanks) {
  return lsaSize < numRanks &&
         uint32_t(peer) / uint32_t(lsaSize) != uint32_t(rank) / uint32_t(lsaSize);
}

} // namespace

EPIC_SHIM_ATTR void __epic_virtual_check_lsa_peer(int32_t rank, int32_t peer, int32_t lsaSize,
                                                  int32_t numRanks) {
  if (otherNode(rank, peer, lsaSize, numRanks))
    lsaViolationTrap(rank, peer, lsaSize, numRanks);
}
EPIC_SHIM_ATTR void __epic_virtual_check_lsa_peer_inline(int32_t rank, int32_t peer,
                                                         int32_t lsaSize, int32_t numRanks) {
  if (otherNode(rank, peer, lsaSize, numRanks))
    flagTimeoutReportTrap(nullptr, kLsaViolation, lsaSize, numRanks, 0, rank, peer);
}
