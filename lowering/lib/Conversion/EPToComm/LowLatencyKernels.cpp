//===- LowLatencyKernels.cpp - DeepEP V1's low-latency dispatch and combine ===//
//
// ep.low_latency_dispatch and ep.low_latency_combine, two kernels each, in
// the window layout of EPWindow.h (LowLatencyLayout). Nothing is exchanged
// before data moves: every (local expert, source rank) owns `cap` fixed
// slots in the receiver's window, and a source fills its slots for an expert
// in its tokens' order (a token's slot is the number of earlier routing
// entries with the same expert), then posts the count.
//
//   dispatch send    a token's row split among warps: each casts its part
//                    to FP8 (or not) once and stores it into every
//                    destination's slot; the rank's last block stores the
//                    count per destination expert, then a release flag per rank.
//   dispatch recv    every block waits for every source's flag to reach
//                    this call's epoch and scans the counts in (local
//                    expert, source) order into shared memory; the rows are
//                    then shared evenly over the grid's warps (a row's pair
//                    found by a binary search), laid out by source rank:
//                    rows, scales (column-major per expert) and headers.
//                    Nothing is reset: flags only grow, counts are
//                    overwritten by the next call.
//   combine send     each received row (all of them shared evenly over the
//                    warps) goes back to its source's window, to the slot of
//                    its (token, top-k slot); the last block raises its
//                    combine epoch at every rank (release).
//   combine reduce   per token: its routing and weights loaded, every rank's
//                    epoch waited for, then the weighted sum of its present
//                    slots (f32, k order, one rounding).
//
// Kernel boundaries order a rank's phases: a send kernel moves the rank's
// epoch of its region on, the receive after it waits for every rank's flag
// to reach it. A region is reused two calls later only (the host alternates
// parities), after the calls in between have met.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

namespace epic::expand {
namespace {
using LowLatency = epic::ep::window::LowLatencyLayout;

/// The window offsets (i64) of the region a call uses. Its scratch (send
/// counters, last-block counters) is the region's too: two calls in flight on
/// one rank (an async call on the communication stream, the next on the
/// compute stream) have different parities.
struct Region {
  LowLatency ll;
  Value control, slots, combine;
  Region(KernelBuilder &k, const EPLayout &L, Value parity)
      : ll(L.experts, L.ranks, L.topk, L.hidden) {
    Value p = k.wide(parity), cap = k.wide(k.tmax);
    control = k.add(k.i64(ll.controlAt(0)), k.mul(p, k.i64(ll.control)));
    Value oneParity = k.mul(cap, k.i64(ll.experts * ll.message));
    Value base = k.i64(ll.slotsAt(0, 0));
    slots = k.add(base, k.mul(p, oneParity));
    Value rows = k.add(base, k.mul(k.i64(2), oneParity));
    combine = k.add(rows, k.mul(p, k.mul(cap, k.i64(ll.topk * ll.combineRow))));
  }
  /// i32 cell `index` of this region's control array at `array`.
  Value cell(KernelBuilder &k, int64_t array, Value index) const {
    return k.add(control, k.add(k.i64(array), k.mul(k.wide(index), k.i64(4))));
  }
  Value sendCount(KernelBuilder &k, Value expert) const { return cell(k, ll.sendCounts, expert); }
  Value blockCounter(KernelBuilder &k, LowLatency::BlockCounter which) const {
    return cell(k, ll.blockCounters, k.i32(which));
  }
  /// This rank's calls of this parity so far (LowLatency::Epoch), as its
  /// previous kernel left it.
  Value epochCell(KernelBuilder &k, LowLatency::Epoch which) const {
    return k.local(cell(k, ll.epochs, k.i32(which)));
  }
  Value epoch(KernelBuilder &k, LowLatency::Epoch which) const {
    return comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu,
                                epochCell(k, which));
  }
};

Value f32(KernelBuilder &k, double v) {
  return arith::ConstantOp::create(k.b, k.b.getF32FloatAttr(v));
}
Value bitsToF32(KernelBuilder &k, Value bits) {
  return arith::BitcastOp::create(k.b, k.b.getF32Type(), bits);
}

/// Sum of `v` over the warp's lanes (every lane gets it).
Value warpSum(KernelBuilder &k, Value v) {
  for (int64_t d = 16; d >= 1; d /= 2)
    v = k.add(v, gpu::ShuffleOp::create(k.b, v, k.i32(d), k.i32(32), gpu::ShuffleMode::XOR)
                     .getShuffleResult());
  return v;
}

/// Lane j < K: how many routing entries before (token t, slot j) in the
/// flattened [T, K] table name the same expert `e` (lane j's): the slot of
/// its row among this rank's rows for that expert. A warp reads the table up
/// to the token, kScanUnroll x 32 entries a step with every load in flight
/// (each a round trip to L2: one per step, not one per 32 entries), then one
/// ballot per (32 entries, top-k slot).
constexpr int64_t kScanUnroll = 8;
Value slotAmongEarlier(KernelBuilder &k, const EPLayout &L, Value ids, Value t, Value e) {
  const int64_t K = L.topk;
  SmallVector<Value> experts;
  for (int64_t j = 0; j < K; ++j)
    experts.push_back(k.shuffle(e, k.i32(j)));
  Value first = k.mul(t, k.i32(K));
  Value end = k.add(first, k.i32(K)), last = k.sub(end, k.i32(1));
  Value limit = k.add(first, k.lane); // lane j counts entries before t x K + j
  auto loop = scf::ForOp::create(k.b, k.i32(0), end, k.i32(32 * kScanUnroll), ValueRange{k.i32(0)});
  {
    OpBuilder::InsertionGuard guard(k.b);
    k.b.setInsertionPointToStart(loop.getBody());
    Value c = loop.getInductionVar(), count = loop.getRegionIterArgs()[0];
    // Every load first (at an index clamped into the table), then the ballots;
    // -2 past the end: no expert id and not "none" (-1).
    SmallVector<Value> id, base;
    for (int64_t u = 0; u < kScanUnroll; ++u) {
      base.push_back(k.add(c, k.i32(32 * u)));
      Value p = k.add(base.back(), k.lane);
      id.push_back(k.loadTopkId(ids, k.select(k.lt(p, end), p, last)));
    }
    for (int64_t u = 0; u < kScanUnroll; ++u) {
      Value inTable = k.lt(k.add(base[u], k.lane), end);
      Value entry = k.select(inTable, id[u], k.i32(-2));
      Value rel = k.sub(limit, base[u]);
      Value below = k.select(k.cmp(arith::CmpIPredicate::sge, rel, k.i32(32)), k.i32(-1),
                             k.select(k.cmp(arith::CmpIPredicate::sle, rel, k.i32(0)), k.i32(0),
                                      k.sub(arith::ShLIOp::create(k.b, k.i32(1), rel), k.i32(1))));
      for (int64_t j = 0; j < K; ++j) {
        Value hits = k.popc(k.andi(k.ballot(k.eq(entry, experts[j])), below));
        count = k.select(k.eq(k.lane, k.i32(j)), k.add(count, hits), count);
      }
    }
    if (loop.getBody()->mightHaveTerminator())
      k.b.setInsertionPoint(loop.getBody()->getTerminator());
    scf::YieldOp::create(k.b, ValueRange{count});
  }
  return loop.getResult(0);
}

/// A group of 8 bf16 channels (16 bytes, one lane's) cast to FP8 (castF32ToFp8).
std::pair<Value, Value> castToFp8(KernelBuilder &k, Value chunk, bool round) {
  auto f32x8 = VectorType::get({8}, k.b.getF32Type());
  return castF32ToFp8(k, arith::ExtFOp::create(k.b, f32x8, chunk), round);
}

} // namespace

std::pair<Value, Value> castF32ToFp8(KernelBuilder &k, Value x, bool round) {
  auto f32x8 = VectorType::get({8}, k.b.getF32Type());
  Value magnitude = arith::MaxNumFOp::create(k.b, x, arith::NegFOp::create(k.b, x));
  Value amax = vector::ExtractOp::create(k.b, magnitude, int64_t(0));
  for (int64_t i = 1; i < 8; ++i)
    amax = arith::MaxNumFOp::create(k.b, amax, vector::ExtractOp::create(k.b, magnitude, i));
  for (int64_t d = 8; d >= 1; d /= 2) // the 16 lanes of the group
    amax = arith::MaxNumFOp::create(
        k.b, amax,
        gpu::ShuffleOp::create(k.b, amax, k.i32(d), k.i32(32), gpu::ShuffleMode::XOR)
            .getShuffleResult());
  amax = arith::MaxNumFOp::create(k.b, amax, f32(k, 1e-4));
  Value scale = arith::DivFOp::create(k.b, amax, f32(k, 448.0));
  Value inverse;
  if (round) {
    // 2^ceil(log2(scale)): the exponent, one up unless a power of two already.
    Value bits = arith::BitcastOp::create(k.b, k.i32T(), scale);
    Value exponent = k.andi(arith::ShRUIOp::create(k.b, bits, k.i32(23)), k.i32(0xff));
    Value mantissa = k.andi(bits, k.i32((1 << 23) - 1));
    Value e = k.add(
        exponent,
        arith::ExtUIOp::create(k.b, k.i32T(), k.cmp(arith::CmpIPredicate::ne, mantissa, k.i32(0))));
    scale = bitsToF32(k, arith::ShLIOp::create(k.b, e, k.i32(23)));
    inverse = bitsToF32(k, arith::ShLIOp::create(k.b, k.sub(k.i32(254), e), k.i32(23)));
  } else {
    inverse = arith::DivFOp::create(k.b, f32(k, 448.0), amax);
  }
  Value scaled = arith::MulFOp::create(k.b, x, vector::BroadcastOp::create(k.b, f32x8, inverse));
  Value packed = k.i64(0);
  auto i8x2 = VectorType::get({2}, k.b.getI8Type());
  for (int64_t i = 0; i < 8; i += 2) {
    Value lo = vector::ExtractOp::create(k.b, scaled, i);
    Value hi = vector::ExtractOp::create(k.b, scaled, i + 1);
    Value pair = NVVM::ConvertF32x2ToF8x2Op::create(
        k.b, i8x2, hi, lo, NVVM::FPRoundingMode::RN, NVVM::SaturationMode::SATFINITE,
        /*relu=*/false, k.b.getType<Float8E4M3FNType>());
    Value half = LLVM::BitcastOp::create(k.b, k.b.getI16Type(), pair);
    Value wide = arith::ExtUIOp::create(k.b, k.i64T(), half);
    packed = arith::OrIOp::create(k.b, packed, arith::ShLIOp::create(k.b, wide, k.i64(8 * i)));
  }
  return {packed, scale};
}

namespace {

/// Row parts of a row of `bytes` copied `unroll` chunks per lane at a time.
int64_t partsOf(int64_t bytes, int64_t unroll) { return KernelBuilder::maxRowParts(bytes, unroll); }

/// Every thread of the grid: for i in [0, n).
void loopGridThreads(KernelBuilder &k, Value n, function_ref<void(Value)> body) {
  k.loop(k.add(k.mul(k.block, k.threads), k.tid), n, k.mul(k.blocks, k.threads), body);
}

/// The block's exclusive prefix sums of `n` i32 terms into the shared array:
/// word i the sum of the terms before i, word n the total (returned). Warp 0
/// reads every term (all its loads in flight, one round trip) and scans; the
/// block's barrier after it.
Value sharedExclusiveScan(KernelBuilder &k, int64_t n, function_ref<Value(Value)> term) {
  k.when(k.lt(k.tid, k.i32(32)), [&] {
    k.when(k.eq(k.tid, k.i32(0)), [&] { k.storeShared(k.i32(0), k.i32(0)); });
    k.warpInclusiveScan(
        n, [&](Value i) { return std::pair<Value, Value>{term(i), Value()}; },
        [&](Value i, Value sum, Value) { k.storeShared(sum, k.add(i, k.i32(1))); });
  });
  k.barrier();
  return k.loadShared(k.i32(n));
}

/// The entry p in [0, n) of the shared prefix sums whose rows hold flat row
/// `f` (< word n): the largest p with word p <= f (an entry without rows has
/// the next one's start, so it is never taken). log2(n) shared loads.
Value entryOfRow(KernelBuilder &k, int64_t n, Value f) {
  Value p = k.i32(0);
  for (int64_t step = int64_t(llvm::bit_floor(uint64_t(n))); step >= 1; step /= 2) {
    Value q = k.add(p, k.i32(step));
    // Word n (the total) is above every row: past the end is never taken.
    Value start = k.loadShared(k.select(k.lt(q, k.i32(n)), q, k.i32(n)));
    p = k.select(k.cmp(arith::CmpIPredicate::sle, start, f), q, p);
  }
  return p;
}

/// The rank's last block, after its earlier stores: raises flag `flags` of
/// this rank at every rank to the rank's next epoch `which` (release: the
/// block's barrier orders every earlier store of the rank before it), keeps
/// that epoch, and clears the block counter `counter` for the next call.
void postEpoch(KernelBuilder &k, const Region &g, const EPLayout &L, int64_t flags,
               LowLatency::Epoch which, LowLatency::BlockCounter counter) {
  Value next = k.add(g.epoch(k, which), k.i32(1));
  k.barrier(); // the stores before, and the epoch read before thread 0 moves it on
  k.loop(k.tid, k.i32(L.ranks), k.threads, [&](Value r) {
    comm::StoreOp::create(k.b, comm::Ordering::release, comm::Scope::sys, next,
                          k.peer(g.cell(k, flags, k.me), r));
  });
  k.when(k.eq(k.tid, k.i32(0)), [&] {
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, next,
                          g.epochCell(k, which));
  });
  k.resetCounter(g.blockCounter(k, counter));
}

void emitLowLatencySend(KernelBuilder &k, const Region &g, const EPLayout &L, bool fp8,
                        bool roundScale) {
  Value x = k.pointerParam(kLdX), ids = k.pointerParam(kLdTopkIdx);
  const int64_t K = L.topk, H = L.hidden, inBytes = 2 * H;
  const int64_t unroll = kDefaultRowUnroll;
  k.loopRowParts(
      k.intParam(kLdNumTokens), partsOf(inBytes, unroll), [&](Value t, const RowPart &share) {
        Value e = k.choose(
            k.lt(k.lane, k.i32(K)), k.i32T(),
            [&] { return k.loadTopkId(ids, k.add(k.mul(t, k.i32(K)), k.lane)); },
            [&] { return k.i32(-1); });
        Value valid = k.cmp(arith::CmpIPredicate::sge, e, k.i32(0));
        Value slot = slotAmongEarlier(k, L, ids, t, e);
        Value safe = k.select(valid, e, k.i32(0));
        Value dst = k.divu(safe, k.i32(L.local));
        Value message = k.add(
            k.mul(k.add(k.mul(k.remu(safe, k.i32(L.local)), k.i32(L.ranks)), k.me), k.tmax), slot);
        Value msg = k.peer(k.add(g.slots, k.mul(k.wide(message), k.i64(g.ll.message))), dst);
        k.inFirstPart(share, [&] {
          k.when(valid, [&] {
            k.store(t, msg, 4);
            k.store(k.lane, k.at(msg, k.i64(4)), 4);
            comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::relaxed,
                                comm::Scope::gpu, k.i32(1), k.local(g.sendCount(k, e)));
          });
        });
        // Every lane learns each slot's destination row (null-free: invalid
        // slots point at this rank's own window and store nothing).
        SmallVector<Value> rows, present;
        Value validBits = arith::ExtUIOp::create(k.b, k.i32T(), valid);
        for (int64_t j = 0; j < K; ++j) {
          rows.push_back(k.at(k.shufflePointer(msg, k.i32(j)), k.i64(LowLatency::kHeaderBytes)));
          present.push_back(k.eq(k.shuffle(validBits, k.i32(j)), k.i32(1)));
        }
        Value src = k.at(x, k.mul(k.wide(t), k.i64(inBytes)));
        if (!fp8) {
          auto vec = VectorType::get({4}, k.i32T());
          k.forEachChunkGroup(
              inBytes, unroll, /*warpUniform=*/false,
              [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
                SmallVector<Value> values = k.loadChunks(vec, src, offsets, inRange);
                for (int64_t j = 0; j < K; ++j)
                  k.when(present[j], [&] { k.storeChunks(rows[j], values, offsets, inRange); });
              },
              share);
          return;
        }
        // FP8: the shuffles of a 128-channel group need all 32 lanes in step.
        auto bf16x8 = VectorType::get({8}, k.b.getBF16Type());
        k.forEachChunkGroup(
            inBytes, unroll, /*warpUniform=*/true,
            [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
              SmallVector<Value> values = k.loadChunks(bf16x8, src, offsets, inRange);
              for (size_t u = 0; u < values.size(); ++u) {
                auto [bytes, scale] = castToFp8(k, values[u], roundScale);
                Value chunk = arith::TruncIOp::create(
                    k.b, k.i32T(), arith::DivUIOp::create(k.b, offsets[u], k.i64(16)));
                Value dataAt = k.mul(k.wide(chunk), k.i64(8));
                Value scaleAt = k.add(k.i64(g.ll.fp8ScalesAt - LowLatency::kHeaderBytes),
                                      k.mul(k.wide(k.divu(chunk, k.i32(16))), k.i64(4)));
                Value lead = k.eq(k.remu(k.lane, k.i32(16)), k.i32(0));
                for (int64_t j = 0; j < K; ++j) {
                  Value go = inRange.empty() ? present[j] : k.andi(present[j], inRange[u]);
                  k.when(go, [&] {
                    k.store(bytes, k.at(rows[j], dataAt), 8);
                    k.when(lead, [&] { k.store(scale, k.at(rows[j], scaleAt), 4); });
                  });
                }
              }
            },
            share);
      });
  // Every row is written: the rank's last block stores each expert's count
  // at its rank (relaxed), then, after its barrier, tells every rank they are
  // there with one release each (R system-scope fences, not one per expert).
  Value last = k.lastBlockOfRank(g.blockCounter(k, LowLatency::kDispatchSend));
  k.when(last, [&] {
    k.loop(k.tid, k.i32(L.experts), k.threads, [&](Value e) {
      Value counter = k.local(g.sendCount(k, e));
      Value count =
          comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu, counter);
      Value cell =
          g.cell(k, g.ll.arrivals, k.add(k.mul(k.remu(e, k.i32(L.local)), k.i32(L.ranks)), k.me));
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::sys, count,
                            k.peer(cell, k.divu(e, k.i32(L.local))));
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), counter);
    });
    postEpoch(k, g, L, g.ll.posted, LowLatency::kDispatchEpoch, LowLatency::kDispatchSend);
  });
}

/// The receive: `epoch` is this call's dispatch epoch of the region. Rows
/// are shared evenly over the grid's warps in (local expert, source, slot)
/// order: a fixed group of warps per (expert, source) left the busiest
/// expert's rows, one round trip after another, as the phase's tail.
void emitLowLatencyRecv(KernelBuilder &k, const Region &g, const EPLayout &L, bool fp8, bool ue8m0,
                        Value epoch) {
  Value recvX = k.pointerParam(kLdRecvX), counts = k.pointerParam(kLdRecvCount);
  Value srcInfo = k.pointerParam(kLdSrcInfo), ranges = k.pointerParam(kLdLayoutRange);
  Value routes = k.pointerParam(kLdRoute), stats = k.pointerParam(kLdStats);
  Value scales = fp8 ? k.pointerParam(kLdRecvScales) : Value();
  const int64_t R = L.ranks, K = L.topk, H = L.hidden, pairs = L.local * R;
  const int64_t rowBytes = fp8 ? H : 2 * H, groups = H / 128, packs = (groups + 3) / 4;
  const int64_t parts = partsOf(rowBytes, KernelBuilder::kCopyUnroll);
  Value rt = k.mul(k.i32(R), k.tmax); // rows per local expert
  // Every source's flag at this call's epoch: its counts and rows are here.
  k.loop(k.tid, k.i32(R), k.threads, [&](Value r) {
    comm::WaitFlagOp::create(k.b, k.i32T(), k.local(g.cell(k, g.ll.posted, r)), comm::Predicate::ge,
                             epoch, k.me, r, comm::Scope::sys, L.timeoutMs);
  });
  k.barrier();
  // The counts in (local expert, source) order -- the arrivals array's -- as
  // prefix sums: pair p = l R + s starts at word p; expert l's rows at word l R.
  Value total = sharedExclusiveScan(k, pairs, [&](Value p) {
    return comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::sys,
                                k.local(g.cell(k, g.ll.arrivals, p)))
        .getResult();
  });
  // Each pair's layout range (begin in its expert << 32 | count); per expert
  // its rows, and the cumulative statistics.
  loopGridThreads(k, k.i32(pairs), [&](Value p) {
    Value l = k.divu(p, k.i32(R)), first = k.loadShared(k.mul(l, k.i32(R)));
    Value begin = k.loadShared(p), end = k.loadShared(k.add(p, k.i32(1)));
    Value range = arith::OrIOp::create(
        k.b, arith::ShLIOp::create(k.b, k.wide(k.sub(begin, first)), k.i64(32)),
        arith::ExtUIOp::create(k.b, k.i64T(), k.sub(end, begin)));
    k.store(range, k.elementAt(ranges, p, 8), 8);
    k.when(k.eq(k.remu(p, k.i32(R)), k.i32(R - 1)), [&] {
      Value rows = k.sub(end, first);
      k.storeI32(rows, counts, l);
      k.when(k.isGiven(stats), [&] { k.storeI32(k.add(k.loadI32(stats, l), rows), stats, l); });
    });
  });
  k.loop(k.globalWarp, k.mul(total, k.i32(parts)), k.numWarps, [&](Value unit) {
    Value f = k.divu(unit, k.i32(parts)), part = k.remu(unit, k.i32(parts));
    Value p = entryOfRow(k, pairs, f);
    Value l = k.divu(p, k.i32(R)), s = k.remu(p, k.i32(R));
    Value j = k.sub(f, k.loadShared(p));                    // among the pair's slots
    Value row = k.sub(f, k.loadShared(k.mul(l, k.i32(R)))); // among the expert's rows
    Value message = k.add(k.mul(p, k.tmax), j);
    Value msg = k.local(k.add(g.slots, k.mul(k.wide(message), k.i64(g.ll.message))));
    Value element = k.add(k.mul(l, rt), row);
    k.when(k.eq(part, k.i32(0)), [&] {
      k.when(k.eq(k.lane, k.i32(0)), [&] {
        Value t = k.load(k.i32T(), msg, 4);
        Value slot = k.load(k.i32T(), k.at(msg, k.i64(4)), 4);
        k.storeI32(t, srcInfo, element);
        k.storeI32(k.add(k.mul(k.add(k.mul(s, k.tmax), t), k.i32(K)), slot), routes, element);
      });
      if (!fp8)
        return;
      // Scales, column-major per expert: [l][group][row].
      k.loop(k.lane, k.i32(ue8m0 ? packs * 4 : groups), k.i32(32), [&](Value gi) {
        Value inGroups = k.lt(gi, k.i32(groups));
        Value scale = k.choose(
            inGroups, k.b.getF32Type(),
            [&] {
              return k.load(k.b.getF32Type(),
                            k.at(msg, k.add(k.i64(g.ll.fp8ScalesAt), k.mul(k.wide(gi), k.i64(4)))),
                            4);
            },
            [&] { return f32(k, 0.0); });
        if (!ue8m0) {
          Value at = k.add(k.mul(k.add(k.mul(l, k.i32(groups)), gi), rt), row);
          k.store(scale, k.elementAt(scales, at, 4), 4);
          return;
        }
        // UE8M0: the scale's exponent byte (a power of two), four per i32.
        Value bits = arith::BitcastOp::create(k.b, k.i32T(), scale);
        Value byte = arith::TruncIOp::create(
            k.b, k.b.getI8Type(),
            k.andi(arith::ShRUIOp::create(k.b, bits, k.i32(23)), k.i32(0xff)));
        Value word = k.add(k.mul(k.add(k.mul(l, k.i32(packs)), k.divu(gi, k.i32(4))), rt), row);
        Value at = k.add(k.mul(k.wide(word), k.i64(4)), k.wide(k.remu(gi, k.i32(4))));
        k.store(byte, k.at(scales, at), 1);
      });
    });
    k.copyRow(k.elementAt(recvX, element, rowBytes), k.at(msg, k.i64(LowLatency::kHeaderBytes)),
              rowBytes, RowPart{part, k.i32(parts)});
  });
  // Nothing to clear: the next call of this parity overwrites the counts and
  // waits for the next epoch.
}

/// The combine send: every received row back to its source, the rows
/// shared evenly over the grid's warps (local expert by local expert).
void emitLowLatencyCombineSend(KernelBuilder &k, const Region &g, const EPLayout &L) {
  Value x = k.pointerParam(kLcX), ranges = k.pointerParam(kLcLayoutRange);
  Value routes = k.pointerParam(kLcRoute);
  const int64_t R = L.ranks, K = L.topk, rowBytes = 2 * L.hidden;
  const int64_t parts = partsOf(rowBytes, KernelBuilder::kCopyUnroll);
  Value rt = k.mul(k.i32(R), k.tmax);
  // Expert l's rows: [0, end of its last source's range), as prefix sums.
  Value total = sharedExclusiveScan(k, L.local, [&](Value l) {
    Value range =
        k.load(k.i64T(), k.elementAt(ranges, k.add(k.mul(l, k.i32(R)), k.i32(R - 1)), 8), 8);
    Value begin =
        arith::TruncIOp::create(k.b, k.i32T(), arith::ShRUIOp::create(k.b, range, k.i64(32)));
    return k.add(begin, arith::TruncIOp::create(k.b, k.i32T(), range).getResult());
  });
  Value perSource = k.mul(k.tmax, k.i32(K)); // a source's (token, slot) rows
  k.loop(k.globalWarp, k.mul(total, k.i32(parts)), k.numWarps, [&](Value unit) {
    Value f = k.divu(unit, k.i32(parts)), part = k.remu(unit, k.i32(parts));
    Value l = entryOfRow(k, L.local, f);
    Value element = k.add(k.mul(l, rt), k.sub(f, k.loadShared(l)));
    // The route names the source and where it keeps its (token, slot) row.
    Value route = k.loadI32(routes, element);
    Value s = k.divu(route, perSource), slot = k.remu(route, perSource);
    Value dst = k.peer(k.add(g.combine, k.mul(k.wide(slot), k.i64(g.ll.combineRow))), s);
    k.copyRow(dst, k.elementAt(x, element, rowBytes), rowBytes, RowPart{part, k.i32(parts)});
  });
  // The rank's last block raises its combine epoch at every rank.
  Value last = k.lastBlockOfRank(g.blockCounter(k, LowLatency::kCombineSend));
  k.when(last, [&] {
    postEpoch(k, g, L, g.ll.combineDone, LowLatency::kCombineEpoch, LowLatency::kCombineSend);
  });
}

/// The weighted sum: `epoch` is this call's combine epoch of the region. A
/// warp loads its token's routing and weights, then waits for the flags
/// (those loads in flight meanwhile), then sums the rows.
void emitLowLatencyCombineReduce(KernelBuilder &k, const Region &g, const EPLayout &L,
                                 Value epoch) {
  Value ids = k.pointerParam(kLcTopkIdx), weights = k.pointerParam(kLcTopkWeights);
  Value out = k.pointerParam(kLcOut);
  const int64_t R = L.ranks, K = L.topk, rowBytes = 2 * L.hidden;
  k.loopRowParts(
      k.intParam(kLcNumTokens), partsOf(rowBytes, KernelBuilder::kSumChunks),
      [&](Value t, const RowPart &share) {
        Value entry = k.add(k.mul(t, k.i32(K)), k.lane);
        Value inTopk = k.lt(k.lane, k.i32(K));
        Value e = k.choose(
            inTopk, k.i32T(), [&] { return k.loadTopkId(ids, entry); }, [&] { return k.i32(-1); });
        Value w = k.choose(
            inTopk, k.b.getF32Type(),
            [&] { return k.load(k.b.getF32Type(), k.elementAt(weights, entry, 4), 4); },
            [&] { return f32(k, 0.0); });
        // Every rank has sent its rows back (its combine epoch reached this
        // call's): lane r waits for rank r, the warp's barrier orders what
        // each lane acquired before every lane's row loads.
        k.loop(k.lane, k.i32(R), k.i32(32), [&](Value r) {
          comm::WaitFlagOp::create(k.b, k.i32T(), k.local(g.cell(k, g.ll.combineDone, r)),
                                   comm::Predicate::ge, epoch, k.me, r, comm::Scope::sys,
                                   L.timeoutMs);
        });
        NVVM::SyncWarpOp::create(k.b, k.fullMask());
        Value mask = k.ballot(k.cmp(arith::CmpIPredicate::sge, e, k.i32(0)));
        k.sumMaskedRows(
            k.elementAt(out, t, rowBytes), rowBytes, mask,
            [&](Value slot) {
              Value at = k.add(k.mul(t, k.i32(K)), slot);
              return k.local(k.add(g.combine, k.mul(k.wide(at), k.i64(g.ll.combineRow))));
            },
            {}, share, [&](Value slot) { return k.shuffle(w, slot); });
      });
}

} // namespace

int64_t lowLatencyRecvSharedWords(const EPLayout &L) { return L.local * L.ranks + 1; }
int64_t lowLatencyCombineSendSharedWords(const EPLayout &L) { return L.local + 1; }

// The kernels of an entry: the phases apart (a receive hook launches the
// second later: it reads the epoch the first moved on), then both in one
// kernel (cooperative: a block's receive waits for every rank's last send
// block). The fused kernel reads the epoch before its send phase; its last
// block moves the epoch on only after every block has read it (they all
// arrived at the last-block counter first), so the receive waits for it + 1.
void buildLowLatencySend(gpu::GPUFuncOp func, const EPLayout &L, bool fp8, bool roundScale) {
  KernelBuilder k(func, L);
  Region g(k, L, k.intParam(kLdParity));
  emitLowLatencySend(k, g, L, fp8, roundScale);
}

void buildLowLatencyRecv(gpu::GPUFuncOp func, const EPLayout &L, bool fp8, bool ue8m0) {
  KernelBuilder k(func, L);
  Region g(k, L, k.intParam(kLdParity));
  emitLowLatencyRecv(k, g, L, fp8, ue8m0, g.epoch(k, LowLatency::kDispatchEpoch));
}

void buildLowLatencyDispatch(gpu::GPUFuncOp func, const EPLayout &L, bool fp8, bool roundScale,
                             bool ue8m0) {
  KernelBuilder k(func, L);
  Region g(k, L, k.intParam(kLdParity));
  Value epoch = k.add(g.epoch(k, LowLatency::kDispatchEpoch), k.i32(1));
  emitLowLatencySend(k, g, L, fp8, roundScale);
  emitLowLatencyRecv(k, g, L, fp8, ue8m0, epoch);
}

void buildLowLatencyCombineSend(gpu::GPUFuncOp func, const EPLayout &L) {
  KernelBuilder k(func, L);
  Region g(k, L, k.intParam(kLcParity));
  emitLowLatencyCombineSend(k, g, L);
}

void buildLowLatencyCombineReduce(gpu::GPUFuncOp func, const EPLayout &L) {
  KernelBuilder k(func, L);
  Region g(k, L, k.intParam(kLcParity));
  emitLowLatencyCombineReduce(k, g, L, g.epoch(k, LowLatency::kCombineEpoch));
}

void buildLowLatencyCombine(gpu::GPUFuncOp func, const EPLayout &L) {
  KernelBuilder k(func, L);
  Region g(k, L, k.intParam(kLcParity));
  Value epoch = k.add(g.epoch(k, LowLatency::kCombineEpoch), k.i32(1));
  emitLowLatencyCombineSend(k, g, L);
  emitLowLatencyCombineReduce(k, g, L, epoch);
}

} // namespace epic::expand
