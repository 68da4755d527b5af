//===- DispatchKernels.cpp - convert-ep-to-comm: the dispatch kernels ----------------===//
//
// The dispatch's send (routing, counts, records to every destination), its
// copy epilogue (records into the plain or expanded layout, zero padding)
// and the one-pass scatter of a cached dispatch.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;
namespace window = epic::ep::window;

/// The fused copy's chunks in flight per lane: its blocks are the GEMM's (8
/// warps per SM, not 32), so each warp must keep more of a row in flight to
/// stay bandwidth bound, and the GEMM's register budget (~200) pays for it.
/// The most, up to 16, that tiles the row exactly (no range checks), else 8
/// (with range checks) for rows of at least 256 chunks.
int64_t fusedRowUnroll(int64_t rowBytes) {
  if (int64_t unroll = KernelBuilder::tilingUnroll(rowBytes, 16))
    return unroll;
  return rowBytes / 16 >= 32 * 8 ? 8 : KernelBuilder::kCopyUnroll;
}

/// What the dispatch send reads of a token before it routes it: everything
/// its records hold, loaded at once, so that these loads are in flight while
/// the routing is read and the slots are taken, and each destination's record
/// is then only stores (reading them per destination cost a memory round trip
/// each: three per destination rank, on top of the row's groups in turn).
struct TokenReads {
  /// The row, when it is one group of at most kMaxHeldChunks 16-byte chunks
  /// per lane (chunk `lane + 32 u` at rowOffsets[u]); else empty, and the row
  /// is copied group by group.
  SmallVector<Value> row, rowOffsets;
  /// Scale pack `lane + 32 u` (where packInRange[u]).
  SmallVector<Value> packs, packInRange;
  /// The weight of slot `lane` (lane < K; null without weights).
  Value weight;
};
/// 32 registers of a lane (1024-thread blocks leave 64 per thread): FP8 rows
/// up to 4 KiB, bf16 rows up to 2 Ki wide.
constexpr int64_t kMaxHeldChunks = 8;

TokenReads readToken(KernelBuilder &k, const DispatchShape &shape, Value x, Value scalePacks,
                     Value weights, Value token) {
  const EPLayout &L = k.layout;
  TokenReads reads;
  const int64_t chunks = L.rowBytes / 16;
  if (chunks % 32 == 0 && chunks / 32 <= kMaxHeldChunks) {
    Value laneBytes = k.wide(k.mul(k.lane, k.i32(16)));
    for (int64_t u = 0; u < chunks / 32; ++u)
      reads.rowOffsets.push_back(k.add(laneBytes, k.i64(32 * 16 * u)));
    reads.row =
        k.loadChunks(VectorType::get({4}, k.i32T()),
                     k.at(x, k.mul(k.wide(token), k.i64(L.rowBytes))), reads.rowOffsets, {});
  }
  if (shape.scalePacks) {
    for (int64_t u = 0; u * 32 < L.packs; ++u) {
      Value p = k.add(k.lane, k.i32(32 * u));
      Value inRange = k.lt(p, k.i32(L.packs));
      reads.packInRange.push_back(inRange);
      reads.packs.push_back(k.choose(
          inRange, k.i32T(),
          [&]() -> Value { return k.loadI32(scalePacks, k.add(k.mul(token, k.i32(L.packs)), p)); },
          [&]() -> Value { return k.i32(0); }));
    }
  }
  if (shape.weights) {
    FloatType f32 = k.b.getF32Type();
    reads.weight = k.choose(
        k.lt(k.lane, k.i32(L.topk)), f32,
        [&]() -> Value {
          return k.load(f32, k.elementAt(weights, k.add(k.mul(token, k.i32(L.topk)), k.lane), 4),
                        4);
        },
        [&]() -> Value { return arith::ConstantFloatOp::create(k.b, f32, APFloat(0.0f)); });
  }
  return reads;
}

/// Across nodes, a token's records for ranks of other nodes: the record is
/// the same for each (the copy kernel derives the master slot from the ids),
/// so it is written once, into the warp's staging slot, and put to each.
struct RemoteSends {
  /// Lane: the slot its destination gave it (master lanes; else -1).
  Value slot;
  /// The master lanes whose destination is in another node (a ballot).
  Value masters;
  /// The staging slot's window offset (i64; used where `masters` != 0).
  Value staging;
  /// The records the warp writes: one per same-node master lane (in the
  /// peer's window) and, if any destination is remote, the lowest remote
  /// master's (the staging slot).
  Value writes;
};
RemoteSends stageRemoteRecord(KernelBuilder &k, const KernelBuilder::Routing &r, Value token,
                              function_ref<Value()> takeSlot) {
  RemoteSends s;
  s.slot = k.choose(r.isMaster, k.i32T(), takeSlot, [&]() -> Value { return k.i32(-1); });
  Value local = k.ballot(k.andi(r.isMaster, k.sameNode(r.dst)));
  s.masters = arith::XOrIOp::create(k.b, r.masters, local);
  Value staged = k.cmp(arith::CmpIPredicate::ne, s.masters, k.i32(0));
  s.staging = k.stagingSlot(token, staged);
  Value stageLane = k.select(staged, k.cttz(s.masters), k.i32(0));
  Value stageBit = k.select(staged, arith::ShLIOp::create(k.b, k.i32(1), stageLane), k.i32(0));
  s.writes = arith::OrIOp::create(k.b, local, stageBit);
  return s;
}

/// The count exchange that ends an uncached dispatch's sending, by the rank's
/// last block, over `peers` (this rank is peer `self` among them): direct
/// mode, the world; hybrid mode, the node, after forwarding. Per-expert
/// counts to each peer, then the token counts; every peer's counts awaited,
/// then the prefix sums per peer and per local expert and the host counts.
/// The counters it reads are [peer index][local expert] (kExpertLocal) and
/// [world rank] (kSlots); the cells it fills at a peer [self] (kCountsIn)
/// and [self][local expert] (kExpertIn).
void exchangeDispatchCounts(KernelBuilder &k, const DispatchShape &shape, const PeerGroup &peers,
                            Value self) {
  const EPLayout &L = k.layout;
  Value psumPerRank = k.pointerParam(kPsumPerRank);
  Value expertCounts = k.pointerParam(kExpertCounts);
  Value psumPerExpert = k.pointerParam(kPsumPerExpert);
  Value hostCounts = k.pointerParam(kHostCounts);
  // Per-expert counts to each destination (relaxed), then the token
  // counts encoded as -c-1 with release: a peer that sees a count sees
  // the expert counts and every record this rank sent it.
  k.loop(k.tid, k.i32(peers.count * L.local), k.threads, [&](Value i) {
    Value from = k.counter(L.expertLocal, i); // [peer index][local expert]
    Value v = comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu, from);
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), from);
    Value dst = peers.rank(k.divu(i, k.i32(L.local)));
    Value slot = k.add(k.mul(self, k.i32(L.local)), k.remu(i, k.i32(L.local)));
    Value cell = k.add(k.i32(L.expertIn), k.mul(slot, k.i32(4)));
    if (peers.nvlinkOnly) {
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::sys, v, k.peer(cell, dst));
      return;
    }
    // A zero needs no message: the receiver left the cell zero after its
    // last read, before this op's entry barrier.
    k.when(k.cmp(arith::CmpIPredicate::ne, v, k.i32(0)),
           [&] { k.storeCell(v, k.wide(cell), dst, comm::Ordering::relaxed); });
  });
  k.barrier();
  // The block's expert counts have left before any count signal is posted
  // (as each warp's records did, by its flush), whatever queue each took.
  if (!peers.nvlinkOnly)
    comm::FlushOp::create(k.b, k.comm, k.i32(0), comm::Coop::block);
  k.loop(k.tid, k.i32(peers.count), k.threads, [&](Value i) {
    Value dst = peers.rank(i);
    Value from = k.counter(L.slots, dst);
    Value c = comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu, from);
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), from);
    Value encoded = k.sub(k.i32(-1), c);
    Value cell = k.add(k.i32(L.countsIn), k.mul(self, k.i32(4)));
    if (peers.nvlinkOnly) {
      comm::StoreOp::create(k.b, comm::Ordering::release, comm::Scope::sys, encoded,
                            k.peer(cell, dst));
      return;
    }
    // Another node: the count's signal lands after the expert counts above
    // and every record (strong signals; each warp flushed its puts).
    k.storeCell(encoded, k.wide(cell), dst, comm::Ordering::release,
                k.add(k.i32(window::kSigCountBase), k.me));
  });
  k.resetCounter(L.dispatchDone);
  // The copy epilogue of the previous call is over: its row cursors can go back to zero.
  k.loop(k.tid, k.i32(L.local), k.threads,
         [&](Value e) { k.storeI32(k.i32(0), k.local(k.i32(L.expertCursor)), e); });
  // Every source's count (bounded acquire wait), reset for the next call.
  k.loop(k.tid, k.i32(peers.count), k.threads, [&](Value i) {
    Value src = peers.rank(i);
    Value cell = k.counter(L.countsIn, i);
    auto nvlinkCount = [&]() -> Value {
      return comm::WaitFlagOp::create(k.b, k.i32T(), cell, comm::Predicate::ne, k.i32(0), k.me, src,
                                      comm::Scope::sys, L.timeoutMs);
    };
    Value seen = peers.nvlinkOnly
                     ? nvlinkCount()
                     : k.choose(k.sameNode(src), k.i32T(), nvlinkCount, [&]() -> Value {
                         k.awaitSignalOnce(k.add(k.i32(window::kSigCountBase), src), src);
                         return comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed,
                                                     comm::Scope::sys, cell);
                       });
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), cell);
    k.storeI32(k.sub(k.i32(-1), seen), psumPerRank, i);
  });
  k.barrier();
  // Warp 0: the inclusive prefix sums per source rank and per local expert
  // (of the counts rounded up to the alignment), the experts' counts
  // (summed over sources, their cells reset) and the host-visible counts.
  k.when(k.lt(k.tid, k.i32(32)), [&] {
    Value received = k.warpInclusiveScan(
        peers.count,
        [&](Value src) { return std::pair<Value, Value>{k.loadI32(psumPerRank, src), Value()}; },
        [&](Value src, Value total, Value) { k.storeI32(total, psumPerRank, src); });
    k.when(k.eq(k.lane, k.i32(0)), [&] { k.storeI32(received, hostCounts, k.i32(0)); });
    k.warpInclusiveScan(
        L.local,
        [&](Value e) {
          auto sum =
              scf::ForOp::create(k.b, k.i32(0), k.i32(peers.count), k.i32(1), ValueRange{k.i32(0)});
          {
            OpBuilder::InsertionGuard g(k.b);
            k.b.setInsertionPointToStart(sum.getBody());
            Value cell =
                k.counter(L.expertIn, k.add(k.mul(sum.getInductionVar(), k.i32(L.local)), e));
            Value v = k.load(k.i32T(), cell, 4);
            // One pass: the cell keeps the source's first row in the expert's
            // block (relative to its start), which the source's scatter reads;
            // every source overwrites its cells in the next dispatch.
            k.store(shape.onePass ? sum.getRegionIterArg(0) : k.i32(0), cell, 4);
            scf::YieldOp::create(k.b, ValueRange{k.add(sum.getRegionIterArg(0), v)});
          }
          Value count = sum.getResult(0);
          return std::pair<Value, Value>{k.alignUp(count, L.alignment), count};
        },
        [&](Value e, Value end, Value count) {
          Value aligned = k.alignUp(count, L.alignment);
          k.storeI32(count, expertCounts, e);
          // Plain: inclusive prefix of the aligned counts. Expanded: the end of
          // the expert's real rows, start_e + count_e.
          k.storeI32(shape.expanded ? k.add(k.sub(end, aligned), count) : end, psumPerExpert, e);
          k.storeI32(aligned, hostCounts, k.add(e, k.i32(1)));
        });
  });
}

void buildDispatchSend(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  KernelBuilder k(func, L);
  TokenInputs in(k, shape);
  Value numTokens = in.numTokens, x = in.x, topkIdx = in.topkIdx, scalePacks = in.scalePacks,
        dstSlots = in.dstSlots;
  Value weights = shape.weights ? k.pointerParam(kTopkWeights) : Value();
  // DeepEP's do_handle_copy: the handle's own copy of the routing (i64), or null.
  Value idxCopy = shape.cached ? Value() : k.pointerParam(kTopkIdxCopy);
  Value copyIds = shape.cached ? Value() : k.isGiven(idxCopy);
  k.entryBarrier();

  // One warp per token: send it once to each destination rank (hybrid: to
  // its forwarder in each destination node, Hybrid.cpp).
  k.loop(k.globalWarp, numTokens, k.numWarps, [&](Value token) {
    TokenReads reads =
        shape.onePass ? TokenReads{} : readToken(k, shape, x, scalePacks, weights, token);
    auto r = L.hybrid ? k.route(topkIdx, token, [&](Value rank) { return k.forwarderOf(rank); })
                      : k.route(topkIdx, token);
    Value slotCell = k.add(k.mul(token, k.i32(L.topk)), k.lane);
    if (!shape.cached) {
      // The routing into the handle's copy as it was given (the warp read it).
      k.when(k.andi(copyIds, k.lt(k.lane, k.i32(L.topk))), [&] {
        Type idxType = k.b.getIntegerType(L.idxBytes * 8);
        Value id = k.load(idxType, k.elementAt(topkIdx, slotCell, L.idxBytes), L.idxBytes);
        if (L.idxBytes < 8)
          id = arith::ExtSIOp::create(k.b, k.i64T(), id);
        k.store(id, k.elementAt(idxCopy, slotCell, 8), 8);
      });
      // Per-(destination rank, local expert) counts of this rank's tokens
      // (hybrid: the forwarders count what they forward).
      if (!L.hybrid)
        k.when(r.valid, [&] {
          Value slot = k.add(k.mul(r.dst, k.i32(L.local)), k.remu(r.expert, k.i32(L.local)));
          if (!(shape.onePass && shape.expanded)) {
            comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::relaxed,
                                comm::Scope::gpu, k.i32(1), k.counter(L.expertLocal, slot));
            return;
          }
          // One pass, expanded: the slot's row among this rank's rows of the
          // expert at the destination, for the scatter (the window's data
          // region holds them: [token][K]).
          Value row = comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                                comm::Ordering::relaxed, comm::Scope::gpu, k.i32(1),
                                                k.counter(L.expertLocal, slot));
          k.storeI32(row, k.local(k.i64(L.data)), slotCell);
        });
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] { k.storeI32(k.i32(-1), dstSlots, slotCell); });
    }
    // Each master lane takes its slot at its destination (all at once), and
    // the address of record [me][slot] of the destination's receive region.
    auto takeSlot = [&]() -> Value {
      if (shape.cached)
        return k.loadI32(dstSlots, slotCell);
      Value slot =
          comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add, comm::Ordering::relaxed,
                                    comm::Scope::gpu, k.i32(1), k.counter(L.slots, r.dst));
      k.storeI32(slot, dstSlots, slotCell);
      return slot;
    };
    auto recordAt = [&](Value slot) {
      if (L.hybrid) // record [my node][slot] of the forwarder's forward region
        return k.forwardRecordAt(k.node, slot);
      Value index = k.add(k.mul(k.wide(k.me), k.wide(k.tmax)), k.wide(slot));
      return k.add(k.i64(L.data), k.mul(index, k.i64(L.record)));
    };
    if (shape.onePass) // the scatter kernel moves the rows
      return k.when(r.isMaster, [&] { takeSlot(); });
    // The records written here (bits: master lanes), each at `myRecord` of its lane.
    Value myRecord, writes = r.masters;
    RemoteSends remote;
    if (!L.multiNode) {
      myRecord = k.choose(
          r.isMaster, k.ptrT(), [&]() -> Value { return k.peer(recordAt(takeSlot()), r.dst); },
          [&]() -> Value { return LLVM::ZeroOp::create(k.b, k.ptrT()); });
    } else {
      remote = stageRemoteRecord(k, r, token, takeSlot);
      myRecord = k.choose(
          r.isMaster, k.ptrT(),
          [&]() -> Value {
            return k.choose(
                k.sameNode(r.dst), k.ptrT(),
                [&]() -> Value { return k.peer(recordAt(remote.slot), r.dst); },
                [&]() -> Value { return k.local(remote.staging); });
          },
          [&]() -> Value { return LLVM::ZeroOp::create(k.b, k.ptrT()); });
      writes = remote.writes;
    }
    // The row is stored to every destination's record (read once: above, or
    // group by group here when it is too wide to hold); then each record's
    // scale packs, ids, weights, token and master slot.
    if (reads.row.empty())
      k.copyRowToEach(
          k.at(x, k.mul(k.wide(token), k.i64(L.rowBytes))), L.rowBytes, writes,
          [&](Value master) { return k.shufflePointer(myRecord, master); },
          KernelBuilder::wholeRowUnroll(L.rowBytes));
    k.forEachLane(writes, [&](Value master) {
      Value record = k.shufflePointer(myRecord, master);
      if (!reads.row.empty())
        k.storeChunks(record, reads.row, reads.rowOffsets, {});
      for (auto [u, v] : llvm::enumerate(reads.packs)) {
        Value p = k.add(k.lane, k.i32(32 * int64_t(u)));
        k.when(reads.packInRange[u], [&] { k.storeI32(v, k.at(record, k.i32(L.rowPad)), p); });
      }
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
        k.storeI32(r.expert, k.at(record, k.i32(L.idsOff)), k.lane);
        if (reads.weight)
          k.store(reads.weight, k.at(record, k.add(k.i32(L.weightsOff), k.mul(k.lane, k.i32(4)))),
                  4);
      });
      k.when(k.eq(k.lane, k.i32(0)), [&] {
        k.store(token, k.at(record, k.i32(L.tokenOff)), 4);
        k.store(master, k.at(record, k.i32(L.tokenOff + 4)), 4);
      });
    });
    // Across nodes: the staged record, put to each destination of another node.
    if (L.multiNode)
      k.forEachLane(remote.masters, [&](Value master) {
        k.putWarp(remote.staging, k.shuffle(r.dst, master),
                  recordAt(k.shuffle(remote.slot, master)), k.i64(L.record));
      });
  });
  // The warp's puts have read their sources: its staging is free for the next
  // call, and no count or done signal leaves before its records.
  if (L.multiNode)
    k.flushWarp();

  Value last = k.lastBlockOfRank(L.dispatchDone);
  if (L.hybrid) // the forwarders' counts; the forward kernel goes on
    return k.when(last, [&] { endForwardSends(k, shape); });
  if (shape.cached) {
    // The counts are the handle's: only say that everything was sent.
    k.when(last, [&] {
      k.resetCounter(L.dispatchDone);
      exchangeDoneFlags(k, L.dispatchFlags);
    });
    return;
  }
  PeerGroup world = PeerGroup::world(k);
  k.when(last, [&] { exchangeDispatchCounts(k, shape, world, k.me); });
}

/// Rows [start_e + count_e, start_e + align(count_e)) of each local expert
/// of this rank's outputs: zero (data, scale packs, weight).
void zeroPaddingRows(KernelBuilder &k, const EPLayout &L, const DispatchShape &shape, Value recvX,
                     Value recvPacks, Value recvWeights, Value expertCounts, Value psumPerExpert) {
  k.loop(k.globalWarp, k.i32(L.local), k.numWarps, [&](Value e) {
    Value count = k.loadI32(expertCounts, e);
    Value end = k.loadI32(psumPerExpert, e);
    Value aligned = k.alignUp(count, L.alignment);
    Value stop = k.add(k.sub(end, count), aligned);
    k.loop(end, stop, k.i32(1), [&](Value row) {
      Type vec = VectorType::get({4}, k.i32T());
      Value zero =
          arith::ConstantOp::create(k.b, vec, DenseElementsAttr::get(cast<ShapedType>(vec), 0));
      Value base = k.at(recvX, k.mul(k.wide(row), k.i64(L.rowBytes)));
      k.loop(k.lane, k.i32(L.rowBytes / 16), k.i32(32),
             [&](Value chunk) { k.store(zero, k.elementAt(base, chunk, 16), 16); });
      if (shape.scalePacks)
        k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
          k.storeI32(k.i32(0), recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
        });
      if (shape.weights)
        k.when(k.eq(k.lane, k.i32(0)), [&] {
          k.store(arith::ConstantFloatOp::create(k.b, k.b.getF32Type(), APFloat(0.0f)),
                  k.elementAt(recvWeights, row, 4), 4);
        });
    });
  });
}

/// The master slot of a received record across nodes, where one record
/// serves every destination: the highest slot whose expert lives here.
Value receivedMaster(KernelBuilder &k, const EPLayout &L, Value record) {
  Value e = k.choose(
      k.lt(k.lane, k.i32(L.topk)), k.i32T(),
      [&]() -> Value { return k.loadI32(k.at(record, k.i32(L.idsOff)), k.lane); },
      [&]() -> Value { return k.i32(-1); });
  Value mine =
      k.andi(k.cmp(arith::CmpIPredicate::sge, e, k.i32(0)), k.eq(k.divs(e, k.i32(L.local)), k.me));
  return k.sub(k.i32(31), k.ctlz(k.ballot(mine)));
}

void buildDispatchCopy(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  KernelBuilder k(func, L);
  Value psum = k.pointerParam(kPsumPerRank);
  Value recvX = k.pointerParam(kRecvX);
  Value recvPacks = shape.scalePacks ? k.pointerParam(kRecvScalePacks) : Value();
  Value recvIdx = shape.expanded ? Value() : k.pointerParam(kRecvTopkIdx);
  Value recvWeights = shape.weights ? k.pointerParam(kRecvTopkWeights) : Value();
  Value metadata = k.pointerParam(kRecvSrcMetadata);
  Value expertCounts = k.pointerParam(kExpertCounts);
  Value psumPerExpert = k.pointerParam(kPsumPerExpert);
  // Rows come in groups: per source rank, or (hybrid) per forwarder index,
  // whose receive region holds N x Tmax records.
  const int64_t groups = L.hybrid ? L.ranksPerNode : L.ranks;
  Value groupRecords = L.hybrid ? k.mul(k.wide(k.tmax), k.i64(L.nodes)) : k.wide(k.tmax);
  Value received = k.loadI32(psum, k.i32(groups - 1));
  int64_t metaColumns = L.topk + 2;

  // Output row `row` of recv_x.
  auto rowOf = [&](Value row) { return k.at(recvX, k.mul(k.wide(row), k.i64(L.rowBytes))); };
  // The record's scale packs to output row `row`.
  auto copyPacks = [&](Value record, Value row) {
    if (!shape.scalePacks)
      return;
    k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
      Value v = k.loadI32(k.at(record, k.i32(L.rowPad)), p);
      k.storeI32(v, recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
    });
  };
  auto recordWeight = [&](Value record, Value slot) {
    return k.load(k.b.getF32Type(), k.at(record, k.add(k.i32(L.weightsOff), k.mul(slot, k.i32(4)))),
                  4);
  };

  // A plain row may be split among warps; an expanded one takes row cursors
  // once per token, so one warp does all of it.
  int64_t maxParts =
      shape.expanded ? 1 : KernelBuilder::maxRowParts(L.rowBytes, KernelBuilder::kCopyUnroll);
  k.loopRowParts(received, maxParts, [&](Value row, const RowPart &share) {
    // Source rank (group): how many prefix sums are <= row (32 per step).
    auto search = scf::ForOp::create(k.b, k.i32(0), k.i32(groups), k.i32(32), ValueRange{k.i32(0)});
    {
      OpBuilder::InsertionGuard g(k.b);
      k.b.setInsertionPointToStart(search.getBody());
      Value s = k.add(search.getInductionVar(), k.lane);
      Value bound = k.choose(
          k.lt(s, k.i32(groups)), k.i32T(), [&]() -> Value { return k.loadI32(psum, s); },
          [&]() -> Value { return k.i32(INT32_MAX); });
      Value below = k.ballot(k.cmp(arith::CmpIPredicate::sle, bound, row));
      scf::YieldOp::create(k.b, ValueRange{k.add(search.getRegionIterArg(0), k.popc(below))});
    }
    Value src = search.getResult(0);
    Value before = k.choose(
        k.cmp(arith::CmpIPredicate::sgt, src, k.i32(0)), k.i32T(),
        [&]() -> Value { return k.loadI32(psum, k.sub(src, k.i32(1))); },
        [&]() -> Value { return k.i32(0); });
    Value slot = k.sub(row, before);
    Value index = k.add(k.mul(k.wide(src), groupRecords), k.wide(slot));
    Value record = k.local(k.add(k.i64(L.data), k.mul(index, k.i64(L.record))));

    // Lane j < K: the slot's global expert id, and whether it lives here
    // (read after a plain row's copy is issued: its loads need not wait).
    Value inTopk = k.lt(k.lane, k.i32(L.topk));
    Value mine, localId;
    auto readIds = [&] {
      Value e = k.choose(
          inTopk, k.i32T(),
          [&]() -> Value { return k.loadI32(k.at(record, k.i32(L.idsOff)), k.lane); },
          [&]() -> Value { return k.i32(-1); });
      mine = k.andi(k.cmp(arith::CmpIPredicate::sge, e, k.i32(0)),
                    k.eq(k.divs(e, k.i32(L.local)), k.me));
      localId = k.select(mine, k.rems(e, k.i32(L.local)), k.i32(-1));
    };
    Value metaRow = k.mul(row, k.i32(metaColumns));

    if (!shape.expanded) {
      k.copyRow(rowOf(row), record, L.rowBytes, share);
      k.inFirstPart(share, [&] {
        readIds();
        copyPacks(record, row);
        k.when(inTopk, [&] {
          Value element = k.add(k.mul(row, k.i32(L.topk)), k.lane);
          k.storeTopkId(localId, recvIdx, element);
          if (shape.weights)
            k.store(recordWeight(record, k.lane), k.elementAt(recvWeights, element, 4), 4);
        });
      });
    } else {
      readIds();
      // One output row per local slot: the expert's start plus a cursor
      // (or, cached, the row the handle recorded).
      Value myRow = k.choose(
          mine, k.i32T(),
          [&]() -> Value {
            if (shape.cached)
              return k.loadI32(metadata, k.add(metaRow, k.add(k.lane, k.i32(2))));
            Value start =
                k.sub(k.loadI32(psumPerExpert, localId), k.loadI32(expertCounts, localId));
            Value offset = comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                                     comm::Ordering::relaxed, comm::Scope::gpu,
                                                     k.i32(1), k.counter(L.expertCursor, localId));
            return k.add(start, offset);
          },
          [&]() -> Value { return k.i32(-1); });
      if (!shape.cached)
        k.when(inTopk,
               [&] { k.storeI32(myRow, metadata, k.add(metaRow, k.add(k.lane, k.i32(2)))); });
      // The record's row is read once and written to every row of the token
      // here; then each row's packs, weight and, fused, its count.
      Value targets = k.ballot(mine);
      k.copyRowToEach(
          record, L.rowBytes, targets, [&](Value j) { return rowOf(k.shuffle(myRow, j)); },
          shape.rowUnroll);
      k.forEachLane(targets, [&](Value j) {
        Value out = k.shuffle(myRow, j);
        copyPacks(record, out);
        if (shape.weights)
          k.when(k.eq(k.lane, k.i32(0)),
                 [&] { k.store(recordWeight(record, j), k.elementAt(recvWeights, out, 4), 4); });
        if (shape.tileDone >= 0) {
          // The row is in place: count it in its GEMM row tile of the expert
          // (every lane's stores, then one release by lane 0).
          Value expert = k.shuffle(localId, j);
          Value start = k.sub(k.loadI32(psumPerExpert, expert), k.loadI32(expertCounts, expert));
          Value tile = k.add(k.mul(expert, k.i32(shape.maxTiles)),
                             k.divu(k.sub(out, start), k.i32(epic::detail::kGemmTileM)));
          comm::FenceOp::create(k.b, comm::Ordering::acq_rel, comm::Scope::gpu);
          NVVM::SyncWarpOp::create(k.b, k.fullMask());
          k.when(k.eq(k.lane, k.i32(0)), [&] {
            comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::release,
                                comm::Scope::gpu, k.i32(1), k.counter(shape.tileDone, tile));
          });
        }
      });
    }
    if (!shape.cached) {
      // recv_src_metadata[row][0..1] = (src * Tmax + token, src * K + master);
      // hybrid: the forwarder wrote the source id and its item for column 1
      // (item * K + master). Plain layout: the expanded rows (columns 2..) are -1.
      k.inFirstPart(share, [&] {
        Value token = k.load(k.i32T(), k.at(record, k.i32(L.tokenOff)), 4);
        Value master = L.multiNode ? receivedMaster(k, L, record)
                                   : k.load(k.i32T(), k.at(record, k.i32(L.tokenOff + 4)), 4);
        k.when(k.eq(k.lane, k.i32(0)), [&] {
          if (L.hybrid) {
            Value item = k.load(k.i32T(), k.at(record, k.i32(L.tokenOff + 4)), 4);
            k.storeI32(token, metadata, metaRow);
            k.storeI32(k.add(k.mul(item, k.i32(L.topk)), master), metadata,
                       k.add(metaRow, k.i32(1)));
            return;
          }
          k.storeI32(k.add(k.mul(src, k.tmax), token), metadata, metaRow);
          k.storeI32(k.add(k.mul(src, k.i32(L.topk)), master), metadata, k.add(metaRow, k.i32(1)));
        });
        if (!shape.expanded)
          k.when(inTopk,
                 [&] { k.storeI32(k.i32(-1), metadata, k.add(metaRow, k.add(k.lane, k.i32(2)))); });
      });
    }
  });

  if (shape.zeroPadding)
    zeroPaddingRows(k, L, shape, recvX, recvPacks, recvWeights, expertCounts, psumPerExpert);
}

} // namespace epic::expand
