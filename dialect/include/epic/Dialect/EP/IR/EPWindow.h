//===- EPWindow.h - The byte layout of an ElasticBuffer's window ---------===//
//
// No MLIR here: convert-ep-to-comm generates kernels that address these offsets and
// the runtime sizes buffers and cleans scratch by them, so both include it.
//
// A rank's window is, in order:
//   [0, kControlEnd)          the control region: entry barriers' arrival
//                             counters and epochs, the counters of one
//                             dispatch or combine (all zero between ops),
//                             the ops' signatures (KernelBuilder::entryBarrier),
//                             the multi-node entry release, the record
//                             an op with window-resident outputs publishes,
//                             the AGRS sessions' and PP channels' arrival
//                             and release flags;
//   [kControlEnd, ...)        the data region: dispatch records
//                             ([source rank][Tmax][record]) or combine
//                             records ([master slot][Tmax][record]);
//   after the data region, multi-node kernels' staging slots (a ring
//   per warp of the launch, kStagingSlots), and, single-node, after every
//   layout's data the fused GEMM kernels' scratch.
//
// The control region's offsets are the same for every configuration,
// sized by the limits of EPLimits.def: one buffer serves calls of any
// expert count, token cap, hidden size, dtype or layout, because no call
// reads another configuration's counters at other offsets (the barrier
// epochs persist across calls; every other counter is back at zero when a
// call ends). The data region may hold any bytes between calls. The fused
// kernels' scratch must be zero when they start, and its place depends on
// the configuration: it may lie where another configuration's data was, so
// the runtime zeroes it first when it does (KernelHost: window_scratch_at).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_EP_IR_EPWINDOW_H
#define EPIC_DIALECT_EP_IR_EPWINDOW_H

#include "epic/Dialect/EP/IR/EPLimits.h"

#include <algorithm>
#include <cstdint>

namespace epic::ep::window {

constexpr int64_t align(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

/// Entry barriers keep one arrival counter and one epoch per block index of
/// a rank (the most blocks a rank may launch).
inline constexpr int64_t kMaxBlocksPerRank = 1024;

namespace detail {
/// The next counter array, on its own 256-byte boundary.
constexpr int64_t after(int64_t at, int64_t bytes) { return align(at + bytes, 256); }
} // namespace detail

// The control region, in order. i32 counters unless said otherwise.
/// [block] i64: arrivals of every rank's block b at entry barrier b.
inline constexpr int64_t kBarrierArrivals = 0;
/// [block] i64: how many entry barriers block b of this rank has passed.
inline constexpr int64_t kBarrierEpochs = detail::after(kBarrierArrivals, kMaxBlocksPerRank * 8);
/// [source rank]: tokens each source sends here.
inline constexpr int64_t kCountsIn = detail::after(kBarrierEpochs, kMaxBlocksPerRank * 8);
/// [source rank][local expert]: rows each source sends to each local expert.
inline constexpr int64_t kExpertIn = detail::after(kCountsIn, limits::kMaxRanks * 4);
/// [destination rank]: slots claimed at each destination.
inline constexpr int64_t kSlots = detail::after(kExpertIn, limits::kMaxExperts * 4);
/// [source rank][local expert]: a source's first row in each expert's block.
inline constexpr int64_t kExpertLocal = detail::after(kSlots, limits::kMaxRanks * 4);
/// [local expert]: rows placed so far in each expert's block.
inline constexpr int64_t kExpertCursor = detail::after(kExpertLocal, limits::kMaxExperts * 4);
/// Blocks of this rank done with the dispatch send, then [source rank] flags.
inline constexpr int64_t kDispatchDone = detail::after(kExpertCursor, limits::kMaxLocalExperts * 4);
inline constexpr int64_t kDispatchFlags = detail::after(kDispatchDone, 4);
/// The same for the combine.
inline constexpr int64_t kCombineDone = detail::after(kDispatchFlags, limits::kMaxRanks * 4);
inline constexpr int64_t kCombineFlags = detail::after(kCombineDone, 4);
/// [entry barrier parity][source rank] i64: the signature of the op each
/// rank's block 0 entered (its configuration, variant, grid and token cap),
/// stored before its barrier arrival and compared after the barrier (two
/// parities: a rank one barrier ahead writes the other one).
inline constexpr int64_t kOpSignatures = detail::after(kCombineFlags, limits::kMaxRanks * 4);
/// i64, multi-node configurations only: nonzero once block 0 of this rank
/// has passed the entry barrier of the running op (KernelBuilder::
/// nodeEntryBarrier), which releases the rank's other blocks; the op's last
/// block sets it back to zero.
inline constexpr int64_t kEntryPassed = detail::after(kOpSignatures, 2 * limits::kMaxRanks * 8);
/// Ops with window-resident outputs (`window_outputs`): this rank's parameter
/// record as its kernel got it (at most kMaxPublishedRecordBytes), then at
/// +kMaxPublishedRecordBytes this window's address in this rank's process
/// (i64). A peer reads a field through its LSA pointer and finds the tensor
/// at the same offset from the peer's window (KernelBuilder::peerRecord).
inline constexpr int64_t kMaxPublishedRecordBytes = 1024;
inline constexpr int64_t kPublishedRecord = detail::after(kEntryPassed, 8);
/// AGRS sessions (all-gathers by copy engines, runtime/lib/Agrs.cpp):
/// [source rank] i32, the number of the last all-gather whose data that
/// source has copied into this window (written after the data by a stream
/// memory operation with a fence); then [source rank] i32, the last AGRS
/// session that source has ended, after which this rank may copy into its
/// window again. Never reset: the numbers grow for the buffer's life and are
/// compared with wrap-around (a wait for >= n).
inline constexpr int64_t kAgrsArrived =
    detail::after(kPublishedRecord, kMaxPublishedRecordBytes + 8);
inline constexpr int64_t kAgrsReleased = detail::after(kAgrsArrived, limits::kMaxRanks * 4);
/// PP channels to the ring neighbours (runtime/lib/Pp.cpp), i32 each, never
/// reset: [0] from the previous rank, [1] from the next: how many tensors it
/// has copied into this window; then [0] to the next rank, [1] to the
/// previous: how many of this rank's tensors it has copied out (its slots
/// free again).
inline constexpr int64_t kPpArrived = detail::after(kAgrsReleased, limits::kMaxRanks * 4);
inline constexpr int64_t kPpReleased = detail::after(kPpArrived, 2 * 4);
/// Where the data region starts, for every configuration (an AGRS session's
/// tensors and the PP slots too).
inline constexpr int64_t kControlEnd = align(detail::after(kPpReleased, 2 * 4), 4096);

/// Bytes of one dispatch record: the row, its scale packs, the top-k ids
/// (i32) and weights (f32), then the source token and its master slot (across
/// nodes one record serves every destination, which derives the master slot
/// from the ids instead).
struct DispatchRecord {
  int64_t rowBytes, rowPad, packPad, idsOff, weightsOff, tokenOff, bytes;
  constexpr DispatchRecord(int64_t hidden, int64_t elemBytes, int64_t packs, int64_t topk)
      : rowBytes(hidden * elemBytes), rowPad(align(rowBytes, 16)), packPad(align(packs * 4, 16)),
        idsOff(rowPad + packPad), weightsOff(idsOff + topk * 4), tokenOff(weightsOff + topk * 4),
        bytes(align(tokenOff + 8, 16)) {}
};

/// Bytes of one combine record: the bf16 row, then the top-k weights (f32).
struct CombineRecord {
  int64_t rowBytes, bytes;
  constexpr CombineRecord(int64_t hidden, int64_t topk)
      : rowBytes(align(hidden * 2, 16)), bytes(rowBytes + align(topk * 4, 16)) {}
};

/// Multi-node configurations: each warp stages the records it sends to
/// another node in a ring of kStagingSlots slots (a GIN put reads its source
/// after it returns, so a slot is rewritten only after a flush), after the
/// data region: `stagingPerWarp` bytes per warp of the launch.
inline constexpr int64_t kStagingSlots = 2;
constexpr int64_t stagingSlotBytes(const DispatchRecord &dispatch, const CombineRecord &combine) {
  return std::max(dispatch.bytes, combine.bytes);
}
constexpr int64_t stagingPerWarp(const DispatchRecord &dispatch, const CombineRecord &combine) {
  return kStagingSlots * stagingSlotBytes(dispatch, combine);
}

/// The GIN signals (context 0) of multi-node kernels, by id: the entry
/// barrier's (monotonic), then per source rank its dispatch count and its
/// done flag (each waited for, then reset, once per op). Hybrid mode uses
/// the same ids for its rail peers: a source's forward count, its done flag
/// (cached dispatch, combine).
inline constexpr int64_t kSigEntry = 0;
inline constexpr int64_t kSigCountBase = 8;
constexpr int64_t sigCount(int64_t source) { return kSigCountBase + source; }
constexpr int64_t sigDone(int64_t ranks, int64_t source) { return kSigCountBase + ranks + source; }
/// Signals a world of `ranks` needs (the launch metadata's gin_signals).
constexpr int64_t ginSignals(int64_t ranks) { return kSigCountBase + 2 * ranks; }

/// Data bytes per token of the cap: the larger of the dispatch region
/// ([source rank][Tmax][record]) and the combine region ([slot][Tmax][record]).
///
/// Hybrid mode (`hybridNodes` N > 1 nodes of M = ranks / N) adds the
/// forwarder's regions after them. Dispatch: the receive region
/// [forwarder index][N x Tmax][record] (as large as direct mode's), then the
/// forward region [source node][Tmax][record] that rail peers put their
/// tokens into. Combine: the origin's region [node master slot][Tmax][record]
/// (direct mode's), then the forwarder's [rank master slot][N x Tmax][record]
/// that the node's ranks write their partial rows into.
constexpr int64_t dataBytesPerToken(int64_t ranks, int64_t topk, const DispatchRecord &dispatch,
                                    const CombineRecord &combine, int64_t hybridNodes = 0) {
  if (hybridNodes > 1)
    return std::max((ranks + hybridNodes) * dispatch.bytes,
                    topk * (hybridNodes + 1) * combine.bytes);
  return std::max(ranks * dispatch.bytes, topk * combine.bytes);
}

/// DeepEP V1's low-latency mode (ep.low_latency_dispatch / _combine), in the
/// data region. Two regions (parities 0 and 1): consecutive calls alternate,
/// so that two calls may be in flight (DeepEP's two buffers). A region is a
/// control block, the dispatch's receive slots and the combine's rows:
///
///   control, per parity (i32 cells, each array on its own 256 bytes):
///     arrivals [L][R]     rows that source rank s sent local expert l
///                         (written relaxed, then `posted`; overwritten each call)
///     posted [R]          rank s wrote all its arrivals here: its dispatch epoch
///                         (release)
///     sendCounts [E]      this rank's rows per destination expert (scratch)
///     combineDone [R]     rank r sent this rank its combined rows: its combine
///                         epoch (release)
///     epochs [2]          this rank's dispatch and combine calls of this
///                         parity so far: flags are compared with them, never
///                         reset (every rank makes the same calls)
///     kBlockCounters      last-block counters of the two send kernels
///   slots [L][R][cap][message]  a message: 16-byte header (source token,
///                         top-k slot), then the row: bf16, or FP8 and its
///                         f32 scales (the same size serves both)
///   combine [cap][K][bf16 row]  the origin's rows back, by (token, slot)
///
/// The cap (num_max_dispatch_tokens_per_rank) is a run-time value: the
/// window needs bytes(0) + cap x bytesPerToken(). The flags and epochs only
/// grow; other modes' data may overwrite them (DeepEP's
/// clean_low_latency_buffer zeroes the control blocks, on every rank).
struct LowLatencyLayout {
  static constexpr int64_t kHeaderBytes = 16;
  static constexpr int64_t kBlockCounters = 2;
  enum BlockCounter { kDispatchSend, kCombineSend };
  enum Epoch { kDispatchEpoch, kCombineEpoch };
  int64_t experts, ranks, topk, hidden;
  int64_t message, combineRow, fp8ScalesAt;
  int64_t arrivals, posted, sendCounts, combineDone, epochs, blockCounters, control;

  constexpr LowLatencyLayout(int64_t experts, int64_t ranks, int64_t topk, int64_t hidden)
      : experts(experts), ranks(ranks), topk(topk), hidden(hidden),
        message(kHeaderBytes + align(2 * hidden, 16)), combineRow(align(2 * hidden, 16)),
        fp8ScalesAt(kHeaderBytes + align(hidden, 16)), arrivals(0),
        posted(detail::after(arrivals, experts * 4)), sendCounts(detail::after(posted, ranks * 4)),
        combineDone(detail::after(sendCounts, experts * 4)),
        epochs(detail::after(combineDone, ranks * 4)), blockCounters(detail::after(epochs, 2 * 4)),
        control(detail::after(blockCounters, kBlockCounters * 4)) {}

  /// Window offsets of parity `p`'s control block, slots and combine rows.
  constexpr int64_t controlAt(int64_t p) const { return kControlEnd + p * control; }
  constexpr int64_t slotsAt(int64_t p, int64_t cap) const {
    return kControlEnd + 2 * control + p * cap * experts * message;
  }
  constexpr int64_t combineAt(int64_t p, int64_t cap) const {
    return slotsAt(2, cap) + p * cap * topk * combineRow;
  }
  /// The window this mode needs: bytes(cap) = bytes(0) + cap x bytesPerToken().
  constexpr int64_t bytesPerToken() const { return 2 * (experts * message + topk * combineRow); }
  constexpr int64_t bytes(int64_t cap) const {
    return kControlEnd + 2 * control + cap * bytesPerToken();
  }
};

} // namespace epic::ep::window

#endif // EPIC_DIALECT_EP_IR_EPWINDOW_H
