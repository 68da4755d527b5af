//===- Hybrid.cpp - convert-ep-to-comm: hybrid mode's forwarders ---------------------===//
//
// Hybrid mode across N nodes of M ranks (DeepEP V2's): a token crosses the
// network once per destination node, to its forwarder there, the rail peer
// F = node(d) x M + lsa(src) (the source itself for its own node), which sends
// it on over NVLink to each rank of its node that owns one of its experts.
// The combine reverses it: each rank writes its partial row of a token into
// the forwarder's window over NVLink, the forwarder sums its node's partials
// and sends one row back over the network, and the origin sums the nodes'.
//
// Dispatch: send (phase 1: records to the forwarders' forward regions, counts
// with the rail peers), forward (phase 2: each forwarded record to its ranks'
// receive regions, counts with the node, as direct mode does on one node),
// copy (direct mode's, rows grouped by forwarder index). Combine: send (to
// the forwarders, done flags with the node), forward (node sums to the
// origins, done flags with the rail peers), reduce (per node master slot).
// The forwarder keeps what the combine and cached dispatches need in the
// handle: fwd_counts (items per source node) and fwd_src_metadata (per item:
// the source id, the node master slot and where each slot's row went).
// docs/semantics.md has the protocol.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {
using namespace mlir;
namespace comm = epic::comm;
namespace window = epic::ep::window;

Value KernelBuilder::forwarderOf(Value rank) {
  return railPeer(divu(rank, i32(layout.ranksPerNode)));
}

Value KernelBuilder::forwardRecordAt(Value srcNode, Value slot) {
  Value index = add(mul(add(i64(layout.ranks), wide(srcNode)), wide(tmax)), wide(slot));
  return add(i64(layout.data), mul(index, i64(layout.record)));
}

Value KernelBuilder::partialRecordAt(Value master, Value item) {
  // [K][Tmax] origin records, then [K][N x Tmax].
  Value perSlot = mul(wide(tmax), i64(layout.nodes));
  Value index = add(add(mul(i64(layout.topk), wide(tmax)), mul(wide(master), perSlot)), wide(item));
  return add(i64(layout.data), mul(index, i64(layout.combineRecord)));
}

namespace {

/// The items a forwarder holds, `counts[n]` from each source node n (n < N
/// <= 32), numbered q = 0.. across nodes in node order: lane n keeps the
/// inclusive prefix sum of the counts up to n (lanes >= N the total).
struct ForwardItems {
  Value prefix, total;
  ForwardItems(KernelBuilder &k, Value counts) {
    const int64_t nodes = k.layout.nodes;
    Value c = k.choose(
        k.lt(k.lane, k.i32(nodes)), k.i32T(), [&]() -> Value { return k.loadI32(counts, k.lane); },
        [&]() -> Value { return k.i32(0); });
    prefix = c;
    for (int64_t d = 1; d < 32; d *= 2) {
      Value up = gpu::ShuffleOp::create(k.b, prefix, k.i32(d), k.i32(32), gpu::ShuffleMode::UP)
                     .getShuffleResult();
      prefix =
          k.select(k.cmp(arith::CmpIPredicate::sge, k.lane, k.i32(d)), k.add(prefix, up), prefix);
    }
    total = k.shuffle(prefix, k.i32(31));
  }
  /// Item q (warp-uniform): its source node and its slot there; `item` is
  /// node x Tmax + slot, its index in the forward region and the handle.
  struct Item {
    Value node, slot, item;
  };
  Item at(KernelBuilder &k, Value q) const {
    Value node = k.popc(k.ballot(k.cmp(arith::CmpIPredicate::sle, prefix, q)));
    Value previous =
        k.shuffle(prefix, k.select(k.eq(node, k.i32(0)), k.i32(0), k.sub(node, k.i32(1))));
    Value before = k.select(k.eq(node, k.i32(0)), k.i32(0), previous);
    Value slot = k.sub(q, before);
    return {node, slot, k.add(k.mul(node, k.tmax), slot)};
  }
};

} // namespace

void endForwardSends(KernelBuilder &k, const DispatchShape &shape) {
  const EPLayout &L = k.layout;
  k.resetCounter(L.dispatchDone);
  PeerGroup rail = PeerGroup::rail(k);
  if (shape.cached) // the handle has the counts: only say that everything was put
    return exchangeDoneFlags(k, L.dispatchFlags, {}, {}, &rail);
  // To each forwarder (this rank for its own node) the tokens it got from
  // here, as -c-1 with release; its signal lands after the records (strong
  // signals; every warp flushed its puts).
  k.loop(k.tid, k.i32(L.nodes), k.threads, [&](Value n) {
    Value dst = k.railPeer(n);
    Value from = k.counter(L.slots, dst);
    Value c = comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu, from);
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), from);
    Value cell = k.add(k.i32(L.countsIn), k.mul(k.me, k.i32(4)));
    k.storeCell(k.sub(k.i32(-1), c), k.wide(cell), dst, comm::Ordering::release,
                k.add(k.i32(window::kSigCountBase), k.me));
  });
  // What each rail peer put into this rank's forward region (bounded wait,
  // naming the peer), reset for the next call, into the handle's fwd_counts.
  Value fwdCounts = k.pointerParam(kFwdCounts);
  k.loop(k.tid, k.i32(L.nodes), k.threads, [&](Value n) {
    Value src = k.railPeer(n);
    Value cell = k.counter(L.countsIn, src);
    Value seen = k.choose(
        k.eq(src, k.me), k.i32T(),
        [&]() -> Value {
          return comm::WaitFlagOp::create(k.b, k.i32T(), cell, comm::Predicate::ne, k.i32(0), k.me,
                                          src, comm::Scope::sys, L.timeoutMs);
        },
        [&]() -> Value {
          k.awaitSignalOnce(k.add(k.i32(window::kSigCountBase), src), src);
          return comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::sys,
                                      cell);
        });
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), cell);
    k.storeI32(k.sub(k.i32(-1), seen), fwdCounts, n);
  });
}

void buildDispatchForward(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  KernelBuilder k(func, L);
  const int64_t M = L.ranksPerNode, metaColumns = L.topk + 2;
  Value fwdMeta = k.pointerParam(kFwdSrcMetadata);
  ForwardItems items(k, k.pointerParam(kFwdCounts));
  Value lsa = k.remu(k.me, k.i32(M));
  // This rank's records in a node peer's receive region: [lsa][N x Tmax].
  Value regionStart = k.mul(k.wide(lsa), k.mul(k.wide(k.tmax), k.i64(L.nodes)));

  // One warp per forwarded token: to each rank of this node with one of its experts.
  k.loop(k.globalWarp, items.total, k.numWarps, [&](Value q) {
    ForwardItems::Item it = items.at(k, q);
    Value record = k.local(k.forwardRecordAt(it.node, it.slot));
    Value meta = k.elementAt(fwdMeta, k.mul(it.item, k.i32(metaColumns)), 4);
    // Lane j < K: slot j's expert where it lives in this node, else -1.
    Value e = k.choose(
        k.lt(k.lane, k.i32(L.topk)), k.i32T(),
        [&]() -> Value { return k.loadI32(k.at(record, k.i32(L.idsOff)), k.lane); },
        [&]() -> Value { return k.i32(-1); });
    Value inNode = k.andi(k.cmp(arith::CmpIPredicate::sge, e, k.i32(0)),
                          k.eq(k.divu(k.divs(e, k.i32(L.local)), k.i32(M)), k.node));
    auto r = k.routeExperts(k.select(inNode, e, k.i32(-1)));
    Value nodeMaster = k.sub(k.i32(31), k.ctlz(k.ballot(r.valid)));
    Value token = k.load(k.i32T(), k.at(record, k.i32(L.tokenOff)), 4);
    Value source = k.add(k.mul(k.add(k.mul(it.node, k.i32(M)), lsa), k.tmax), token);
    // Each master lane's slot at its destination: taken here, or the handle's.
    Value slot = k.choose(
        r.isMaster, k.i32T(),
        [&]() -> Value {
          if (shape.cached)
            return k.divu(k.loadI32(meta, k.add(k.lane, k.i32(2))), k.i32(M));
          return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                           comm::Ordering::relaxed, comm::Scope::gpu, k.i32(1),
                                           k.counter(L.slots, r.dst));
        },
        [&]() -> Value { return k.i32(-1); });
    if (!shape.cached) {
      // Per-(node peer, local expert) counts, and the handle's row of the item.
      k.when(r.valid, [&] {
        Value cell =
            k.add(k.mul(k.remu(r.dst, k.i32(M)), k.i32(L.local)), k.remu(r.expert, k.i32(L.local)));
        comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::relaxed, comm::Scope::gpu,
                            k.i32(1), k.counter(L.expertLocal, cell));
      });
      Value placed = k.add(k.mul(k.shuffle(slot, r.masterLane), k.i32(M)), k.remu(r.dst, k.i32(M)));
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
        k.storeI32(k.select(r.valid, placed, k.i32(-1)), meta, k.add(k.lane, k.i32(2)));
      });
      k.when(k.eq(k.lane, k.i32(0)), [&] {
        k.storeI32(source, meta, k.i32(0));
        k.storeI32(nodeMaster, meta, k.i32(1));
      });
    }
    // The receivers' metadata: the source id and the item in place of the
    // token and master slot (every lane has read the token first).
    NVVM::SyncWarpOp::create(k.b, k.fullMask());
    k.when(k.eq(k.lane, k.i32(0)), [&] {
      k.store(source, k.at(record, k.i32(L.tokenOff)), 4);
      k.store(it.item, k.at(record, k.i32(L.tokenOff + 4)), 4);
    });
    NVVM::SyncWarpOp::create(k.b, k.fullMask());
    Value target = k.choose(
        r.isMaster, k.ptrT(),
        [&]() -> Value {
          Value index = k.add(regionStart, k.wide(slot));
          return k.peer(k.add(k.i64(L.data), k.mul(index, k.i64(L.record))), r.dst);
        },
        [&]() -> Value { return LLVM::ZeroOp::create(k.b, k.ptrT()); });
    k.copyRowToEach(
        record, L.record, r.masters, [&](Value j) { return k.shufflePointer(target, j); },
        KernelBuilder::wholeRowUnroll(L.record));
  });

  // The node's count exchange, as direct mode's on one node with this rank
  // as source `lsa` (cached: done flags only).
  PeerGroup nodePeers = PeerGroup::node(k);
  Value last = k.lastBlockOfRank(L.dispatchDone);
  k.when(last, [&] {
    if (!shape.cached)
      return exchangeDispatchCounts(k, shape, nodePeers, lsa);
    k.resetCounter(L.dispatchDone);
    exchangeDoneFlags(k, L.dispatchFlags, {}, {}, &nodePeers);
  });
}

void buildCombineForward(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape) {
  KernelBuilder k(func, L);
  const int64_t M = L.ranksPerNode, metaColumns = L.topk + 2;
  Value fwdMeta = k.pointerParam(kCFwdSrcMetadata);
  ForwardItems items(k, k.pointerParam(kCFwdCounts));
  Type f32 = k.b.getF32Type();

  // One warp per forwarded token: its node's partial rows, summed in fp32 from
  // +0.0 in increasing rank-master slot and rounded once, back to its origin
  // into [node master slot][token] (the origin's own: a local store).
  k.loop(k.globalWarp, items.total, k.numWarps, [&](Value q) {
    ForwardItems::Item it = items.at(k, q);
    Value meta = k.elementAt(fwdMeta, k.mul(it.item, k.i32(metaColumns)), 4);
    Value source = k.loadI32(meta, k.i32(0));
    Value nodeMaster = k.loadI32(meta, k.i32(1));
    // Lane j < K: the LSA rank slot j went to in this node (-1: another node).
    Value placed = k.choose(
        k.lt(k.lane, k.i32(L.topk)), k.i32T(),
        [&]() -> Value { return k.loadI32(meta, k.add(k.lane, k.i32(2))); },
        [&]() -> Value { return k.i32(-1); });
    auto r = k.routeTo(k.select(k.cmp(arith::CmpIPredicate::sge, placed, k.i32(0)),
                                k.remu(placed, k.i32(M)), k.i32(-1)));
    Value origin = k.divu(source, k.tmax);
    Value token = k.remu(source, k.tmax);
    Value index = k.add(k.mul(k.wide(nodeMaster), k.wide(k.tmax)), k.wide(token));
    Value offset = k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord)));
    Value remote = k.cmp(arith::CmpIPredicate::ne, origin, k.me);
    Value staging = k.stagingSlot(q, remote);
    Value out = k.choose(
        remote, k.ptrT(), [&]() -> Value { return k.local(staging); },
        [&]() -> Value { return k.local(offset); });
    k.sumMaskedRows(out, L.hidden * 2, r.masters,
                    [&](Value j) { return k.local(k.partialRecordAt(j, it.item)); });
    if (shape.weights) {
      // Slot j's weight, from the partial record of its rank's master slot.
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
        Value w = k.choose(
            r.valid, f32,
            [&]() -> Value {
              Value from = k.local(k.partialRecordAt(r.masterLane, it.item));
              return k.load(f32, k.at(from, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))),
                            4);
            },
            [&]() -> Value {
              return arith::ConstantFloatOp::create(k.b, cast<FloatType>(f32), APFloat(0.0f));
            });
        k.store(w, k.at(out, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
      });
    }
    k.when(remote, [&] {
      k.putWarp(staging, origin, offset, k.i64(shape.weights ? L.combineRecord : L.combineRow));
    });
  });
  // The warp's puts have read their sources, before the done signals.
  k.flushWarp();

  PeerGroup rail = PeerGroup::rail(k);
  Value last = k.lastBlockOfRank(L.combineDone);
  k.when(last, [&] {
    k.resetCounter(L.combineDone);
    exchangeDoneFlags(k, L.combineFlags, {}, {}, &rail);
  });
}

} // namespace epic::expand
