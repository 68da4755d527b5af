//===- OnePass.cpp - convert-ep-to-comm: dispatch in one pass ------------------------===//
//
// With every rank's tensors in one address space (the virtual backend,
// `one-pass-dispatch`), a dispatch places each row straight at its final
// row of its destination's outputs: each source row is read once and each
// received row written once, no window records and no copy epilogue.
//
// Uncached, the send kernel runs first in count-only mode (DispatchShape::
// onePass): every master lane takes the token's slot at its destination
// (dst_buffer_slot_idx) and, expanded, every slot its row among this rank's
// rows of the expert there (the window's data region, [token][K]); the count
// exchange then leaves in each destination's expertIn[src][e] the source's
// first row in the expert's block. The scatter kernel below reads the
// destinations' prefix sums (their parameter records, comm.peer_params) and
// those cells, and writes rows, scale packs, ids, weights and the
// destination's recv_src_metadata row. Cached, the handle replays the slots
// and the metadata's expanded rows, and nothing but rows and packs is written.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {
using namespace mlir;
namespace comm = epic::comm;

/// One warp per token: lane j's destination d_j and the token's received row
/// there (d_j's prefix sum before this rank + the slot), then each target row
/// (plain: one per destination; expanded: one per slot). The warp reads the
/// token's row once and stores it to every target row, then each target's
/// scale packs, ids or weight, and (uncached) each destination's metadata
/// row. No rank waits for another: the launch serves every rank, and its end
/// is the end of every rank's writes.
void buildDispatchScatter(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  const bool fresh = !shape.cached; // the count kernel took the slots; metadata written here
  KernelBuilder k(func, L);
  TokenInputs in(k, shape);
  Value numTokens = in.numTokens, x = in.x, topkIdx = in.topkIdx, scalePacks = in.scalePacks,
        dstSlots = in.dstSlots;
  Value weights = shape.weights ? k.pointerParam(kTopkWeights) : Value();
  const int64_t metaColumns = L.topk + 2;
  FloatType f32 = k.b.getF32Type();

  k.loop(k.globalWarp, numTokens, k.numWarps, [&](Value token) {
    auto r = k.route(topkIdx, token);
    Value slotCell = k.add(k.mul(token, k.i32(L.topk)), k.lane);
    // Lane j (valid): the row the token has among d_j's received tokens.
    Value tokenRow = k.choose(
        r.valid, k.i32T(),
        [&]() -> Value {
          Value psum = k.pointerField(k.peerParams(r.dst), kPsumPerRank);
          Value before = k.choose(
              k.cmp(arith::CmpIPredicate::sgt, k.me, k.i32(0)), k.i32T(),
              [&]() -> Value { return k.loadI32(psum, k.sub(k.me, k.i32(1))); },
              [&]() -> Value { return k.i32(0); });
          Value slot = k.loadI32(dstSlots, k.add(k.mul(token, k.i32(L.topk)), r.masterLane));
          return k.add(before, slot);
        },
        [&]() -> Value { return k.i32(-1); });
    // Lane j: its target row (plain: the token row on masters; expanded: slot
    // j's expanded row) and that row's address in d_j's recv_x.
    Value targetRow = tokenRow;
    Value targets = r.masters;
    if (shape.expanded) {
      targetRow = k.choose(
          r.valid, k.i32T(),
          [&]() -> Value {
            Value theirs = k.peerParams(r.dst);
            if (!fresh) { // the row d_j's metadata recorded
              Value metadata = k.pointerField(theirs, kRecvSrcMetadata);
              Value column = k.add(k.lane, k.i32(2));
              return k.loadI32(metadata, k.add(k.mul(tokenRow, k.i32(metaColumns)), column));
            }
            // The expert's first row at d_j (its end minus its count), this
            // rank's first row in its block (the count exchange's cell) and
            // the slot's row among them.
            Value e = k.remu(r.expert, k.i32(L.local));
            Value end = k.loadI32(k.pointerField(theirs, kPsumPerExpert), e);
            Value count = k.loadI32(k.pointerField(theirs, kExpertCounts), e);
            Value cell =
                k.add(k.i32(L.expertIn), k.mul(k.add(k.mul(k.me, k.i32(L.local)), e), k.i32(4)));
            Value first = k.load(k.i32T(), k.peer(cell, r.dst), 4);
            Value row = k.loadI32(k.local(k.i64(L.data)), slotCell);
            return k.add(k.add(k.sub(end, count), first), row);
          },
          [&]() -> Value { return k.i32(-1); });
      targets = k.ballot(k.cmp(arith::CmpIPredicate::sge, targetRow, k.i32(0)));
    }
    Value rowAddress = k.choose(
        k.cmp(arith::CmpIPredicate::sge, targetRow, k.i32(0)), k.ptrT(),
        [&]() -> Value {
          Value recvX = k.pointerField(k.peerParams(r.dst), kRecvX);
          return k.at(recvX, k.mul(k.wide(targetRow), k.i64(L.rowBytes)));
        },
        [&]() -> Value { return x; });
    k.copyRowToEach(k.at(x, k.mul(k.wide(token), k.i64(L.rowBytes))), L.rowBytes, targets,
                    [&](Value j) { return k.shufflePointer(rowAddress, j); });
    // Lane i < K: the token's weight of slot i (read once for every target).
    Value weight = Value();
    if (weights)
      weight = k.choose(
          k.lt(k.lane, k.i32(L.topk)), f32,
          [&]() -> Value { return k.load(f32, k.elementAt(weights, slotCell, 4), 4); },
          [&]() -> Value { return arith::ConstantFloatOp::create(k.b, f32, APFloat(0.0f)); });
    k.forEachLane(targets, [&](Value j) {
      Value dst = k.shuffle(r.dst, j);
      Value row = k.shuffle(targetRow, j);
      Value theirs = k.peerParams(dst);
      if (shape.scalePacks) {
        Value recvPacks = k.pointerField(theirs, kRecvScalePacks);
        k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
          Value v = k.loadI32(scalePacks, k.add(k.mul(token, k.i32(L.packs)), p));
          k.storeI32(v, recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
        });
      }
      if (!shape.expanded) {
        // Lane i < K: slot i's local expert id at d, or -1; and its weight.
        Value recvIdx = k.pointerField(theirs, kRecvTopkIdx);
        k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
          Value localId = k.select(k.eq(r.dst, dst), k.rems(r.expert, k.i32(L.local)), k.i32(-1));
          Value element = k.add(k.mul(row, k.i32(L.topk)), k.lane);
          k.storeTopkId(localId, recvIdx, element);
          if (weight)
            k.store(weight, k.elementAt(k.pointerField(theirs, kRecvTopkWeights), element, 4), 4);
        });
      } else if (weight) {
        // The expanded row of slot j holds slot j's weight.
        Value w = k.shuffle(weight, j);
        k.when(k.eq(k.lane, k.i32(0)), [&] {
          k.store(w, k.elementAt(k.pointerField(theirs, kRecvTopkWeights), row, 4), 4);
        });
      }
    });
    if (!fresh)
      return;
    // Each destination's metadata row of the token: (me x Tmax + token,
    // me x K + master slot), then per slot its expanded row there or -1.
    k.forEachLane(r.masters, [&](Value m) {
      Value dst = k.shuffle(r.dst, m);
      Value row = k.shuffle(tokenRow, m);
      Value metadata = k.pointerField(k.peerParams(dst), kRecvSrcMetadata);
      Value metaRow = k.mul(row, k.i32(metaColumns));
      k.when(k.eq(k.lane, k.i32(0)), [&] {
        k.storeI32(k.add(k.mul(k.me, k.tmax), token), metadata, metaRow);
        k.storeI32(k.add(k.mul(k.me, k.i32(L.topk)), m), metadata, k.add(metaRow, k.i32(1)));
      });
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
        Value expandedRow =
            shape.expanded ? k.select(k.eq(r.dst, dst), targetRow, k.i32(-1)) : k.i32(-1);
        k.storeI32(expandedRow, metadata, k.add(metaRow, k.add(k.lane, k.i32(2))));
      });
    });
  });

  if (shape.zeroPadding)
    zeroPaddingRows(k, L, shape, k.pointerParam(kRecvX),
                    shape.scalePacks ? k.pointerParam(kRecvScalePacks) : Value(),
                    weights ? k.pointerParam(kRecvTopkWeights) : Value(),
                    k.pointerParam(kExpertCounts), k.pointerParam(kPsumPerExpert));
}

} // namespace epic::expand
