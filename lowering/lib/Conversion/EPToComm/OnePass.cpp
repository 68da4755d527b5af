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

/// Lane j (valid, else -1): the row token `token` of this rank has among d_j's
/// received tokens: d_j's prefix sum before this rank (record field
/// `psumField`, read through d_j's parameter record) plus the slot the
/// dispatch gave it (`dstSlots` at the master lane of d_j).
static Value receivedRow(KernelBuilder &k, const KernelBuilder::Routing &r, Value token,
                         Value dstSlots, int64_t psumField) {
  return k.choose(
      r.valid, k.i32T(),
      [&]() -> Value {
        Value psum = k.peerRecord(r.dst).pointer(psumField);
        Value before = k.choose(
            k.cmp(arith::CmpIPredicate::sgt, k.me, k.i32(0)), k.i32T(),
            [&]() -> Value { return k.loadI32(psum, k.sub(k.me, k.i32(1))); },
            [&]() -> Value { return k.i32(0); });
        Value slot = k.loadI32(dstSlots, k.add(k.mul(token, k.i32(k.layout.topk)), r.masterLane));
        return k.add(before, slot);
      },
      [&]() -> Value { return k.i32(-1); });
}

/// Window-resident tensors (the op's `window_outputs`; several processes):
/// the record peers read is published and every rank's earlier kernels
/// (counts, prefix sums) are done before any rank reads another's tensors...
static void windowEntry(KernelBuilder &k) {
  if (!k.layout.peersInWindow)
    return;
  k.publishRecord();
  k.entryBarrier();
}

/// ... and no rank's kernel ends before every rank is done with its tensors:
/// a dispatch's outputs are complete when it returns, and neither the
/// published record nor a combine's inputs change under a peer still
/// reading them. (One launch serving every rank needs neither barrier.)
static void windowExit(KernelBuilder &k) {
  if (k.layout.peersInWindow)
    k.entryBarrier();
}

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
  windowEntry(k);

  k.loop(k.globalWarp, numTokens, k.numWarps, [&](Value token) {
    auto r = k.route(topkIdx, token);
    Value slotCell = k.add(k.mul(token, k.i32(L.topk)), k.lane);
    // Lane j (valid): the row the token has among d_j's received tokens.
    Value tokenRow = receivedRow(k, r, token, dstSlots, kPsumPerRank);
    // Lane j: its target row (plain: the token row on masters; expanded: slot
    // j's expanded row) and that row's address in d_j's recv_x.
    Value targetRow = tokenRow;
    Value targets = r.masters;
    if (shape.expanded) {
      targetRow = k.choose(
          r.valid, k.i32T(),
          [&]() -> Value {
            auto theirs = k.peerRecord(r.dst);
            if (!fresh) { // the row d_j's metadata recorded
              Value metadata = theirs.pointer(kRecvSrcMetadata);
              Value column = k.add(k.lane, k.i32(2));
              return k.loadI32(metadata, k.add(k.mul(tokenRow, k.i32(metaColumns)), column));
            }
            // The expert's first row at d_j (its end minus its count), this
            // rank's first row in its block (the count exchange's cell) and
            // the slot's row among them.
            Value e = k.remu(r.expert, k.i32(L.local));
            Value end = k.loadI32(theirs.pointer(kPsumPerExpert), e);
            Value count = k.loadI32(theirs.pointer(kExpertCounts), e);
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
          Value recvX = k.peerRecord(r.dst).pointer(kRecvX);
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
      auto theirs = k.peerRecord(dst);
      if (shape.scalePacks) {
        Value recvPacks = theirs.pointer(kRecvScalePacks);
        k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
          Value v = k.loadI32(scalePacks, k.add(k.mul(token, k.i32(L.packs)), p));
          k.storeI32(v, recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
        });
      }
      if (!shape.expanded) {
        // Lane i < K: slot i's local expert id at d, or -1; and its weight.
        Value recvIdx = theirs.pointer(kRecvTopkIdx);
        k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
          Value localId = k.select(k.eq(r.dst, dst), k.rems(r.expert, k.i32(L.local)), k.i32(-1));
          Value element = k.add(k.mul(row, k.i32(L.topk)), k.lane);
          k.storeTopkId(localId, recvIdx, element);
          if (weight)
            k.store(weight, k.elementAt(theirs.pointer(kRecvTopkWeights), element, 4), 4);
        });
      } else if (weight) {
        // The expanded row of slot j holds slot j's weight.
        Value w = k.shuffle(weight, j);
        k.when(k.eq(k.lane, k.i32(0)),
               [&] { k.store(w, k.elementAt(theirs.pointer(kRecvTopkWeights), row, 4), 4); });
      }
    });
    if (!fresh)
      return;
    // Each destination's metadata row of the token: (me x Tmax + token,
    // me x K + master slot), then per slot its expanded row there or -1.
    k.forEachLane(r.masters, [&](Value m) {
      Value dst = k.shuffle(r.dst, m);
      Value row = k.shuffle(tokenRow, m);
      Value metadata = k.peerRecord(dst).pointer(kRecvSrcMetadata);
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
  windowExit(k);
}

} // namespace epic::expand

namespace epic::expand {

namespace {

/// `carried` through one step per set bit of the warp-uniform `mask`, lowest
/// first: `step(bit, carried)` returns the next values.
SmallVector<Value> foldBits(KernelBuilder &k, Value mask, ArrayRef<Value> carried,
                            function_ref<SmallVector<Value>(Value, ArrayRef<Value>)> step) {
  SmallVector<Type> types{k.i32T()};
  for (Value v : carried)
    types.push_back(v.getType());
  SmallVector<Value> init{mask};
  init.append(carried.begin(), carried.end());
  auto loop = scf::WhileOp::create(k.b, types, init);
  OpBuilder::InsertionGuard guard(k.b);
  SmallVector<Location> locs(types.size(), k.b.getLoc());
  Block *before = k.b.createBlock(&loop.getBefore(), {}, types, locs);
  scf::ConditionOp::create(k.b, k.cmp(arith::CmpIPredicate::ne, before->getArgument(0), k.i32(0)),
                           before->getArguments());
  Block *after = k.b.createBlock(&loop.getAfter(), {}, types, locs);
  Value pending = after->getArgument(0);
  SmallVector<Value> next{k.andi(pending, k.sub(pending, k.i32(1)))};
  SmallVector<Value> values(after->getArguments().drop_front());
  next.append(step(k.cttz(pending), values));
  scf::YieldOp::create(k.b, next);
  k.b.setInsertionPointAfter(loop);
  return SmallVector<Value>(loop.getResults().drop_front());
}

/// 16-byte chunks per lane and group of sumRoundedGroups: it keeps two sets of
/// fp32 sums (the rank's and the total), so half of sumMaskedRows' chunks keep
/// a 1024-thread block's 64 registers free of spills.
constexpr int64_t kGroupSumChunks = KernelBuilder::kSumChunks / 2;

/// The bf16 row at `dst`: per chunk group of a lane, from +0.0 in fp32, the
/// rows `firstRows`, then each group (set bits m of `groups`, increasing):
/// its rows (set bits of `members(m)`, increasing, `row(bit)` their bases)
/// summed from +0.0 and rounded to bf16, as the rank that owns them sends it
/// in the staged combine; rounded once at the end.
void sumRoundedGroups(KernelBuilder &k, Value dst, int64_t bytes, Value groups,
                      function_ref<Value(Value)> members, function_ref<Value(Value)> row,
                      ArrayRef<Value> firstRows, const RowPart &share) {
  auto f32 = VectorType::get({8}, k.b.getF32Type());
  auto bf16 = VectorType::get({8}, k.b.getBF16Type());
  const int64_t chunks = kGroupSumChunks;
  auto zeros = [&] {
    return SmallVector<Value>(chunks, arith::ConstantOp::create(k.b, f32, k.b.getZeroAttr(f32)));
  };
  auto plus = [&](ArrayRef<Value> sums, ArrayRef<Value> values) {
    SmallVector<Value> next;
    for (auto [sum, value] : llvm::zip(sums, values))
      next.push_back(arith::AddFOp::create(k.b, sum, arith::ExtFOp::create(k.b, f32, value)));
    return next;
  };
  k.forEachChunkGroup(
      bytes, chunks, /*warpUniform=*/true,
      [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
        SmallVector<Value> sums = zeros();
        for (Value first : firstRows)
          sums = plus(sums, k.loadChunks(bf16, first, offsets, inRange));
        sums = foldBits(k, groups, sums, [&](Value m, ArrayRef<Value> outer) {
          SmallVector<Value> inner =
              foldBits(k, members(m), zeros(), [&](Value j, ArrayRef<Value> partial) {
                return plus(partial, k.loadChunks(bf16, row(j), offsets, inRange));
              });
          SmallVector<Value> rounded;
          for (Value v : inner)
            rounded.push_back(arith::TruncFOp::create(k.b, bf16, v));
          return plus(outer, rounded);
        });
        SmallVector<Value> out;
        for (Value v : sums)
          out.push_back(arith::TruncFOp::create(k.b, bf16, v));
        k.storeChunks(dst, out, offsets, inRange);
      },
      share);
}

} // namespace

/// One warp per origin token (or a share of its row): its route, then for
/// each destination rank d of its experts the row d received it at (d's
/// prefix sum before this rank plus the dispatch's slot), read from d's
/// `x` where it lies. Plain: that row is d's contribution; expanded: the
/// token's rows at d (d's recv_src_metadata) summed and rounded, as d's
/// staged send would. Biases first, then the contributions in increasing
/// master slot, fp32, rounded once: bitwise the staged combine. Weights:
/// slot j's from d's topk_weights (plain: its row's entry j; expanded: slot
/// j's row). No window traffic and no waits: the launch serves every rank.
void buildCombineGather(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape) {
  KernelBuilder k(func, L);
  CombineOutputs io(k, shape);
  Value numTokens = io.numTokens, topkIdx = io.topkIdx, out = io.out, outWeights = io.outWeights;
  Value dstSlots = k.pointerParam(kCDstSlots);
  ArrayRef<Value> biases = io.biases;
  FloatType f32 = k.b.getF32Type();
  const int64_t rowBytes = L.hidden * 2, metaColumns = L.topk + 2;

  const int64_t chunks = shape.expanded ? kGroupSumChunks : KernelBuilder::kSumChunks;
  windowEntry(k);
  k.loopRowParts(
      numTokens, KernelBuilder::maxRowParts(rowBytes, chunks),
      [&](Value token, const RowPart &share) {
        auto r = k.route(topkIdx, token);
        // Lane j (valid): the token's received row at d_j (prefix + slot).
        Value tokenRow = receivedRow(k, r, token, dstSlots, kCPsumPerRank);
        // The row d_j holds it at. Plain: that slot's row (a deterministic
        // buffer sorted them); expanded: slot j's row, from d_j's metadata.
        Value sourceRow = k.choose(
            r.valid, k.i32T(),
            [&]() -> Value {
              auto theirs = k.peerRecord(r.dst);
              if (shape.expanded) {
                Value metadata = theirs.pointer(kCSrcMetadata);
                Value column = k.add(k.lane, k.i32(2));
                return k.loadI32(metadata, k.add(k.mul(tokenRow, k.i32(metaColumns)), column));
              }
              Value rowOfSlot = theirs.raw(kCRowOfSlot);
              return k.choose(
                  k.isGiven(rowOfSlot), k.i32T(),
                  [&]() -> Value { return k.loadI32(theirs.reach(rowOfSlot), tokenRow); },
                  [&]() -> Value { return tokenRow; });
            },
            [&]() -> Value { return k.i32(-1); });
        Value rowAddress = k.choose(
            r.valid, k.ptrT(),
            [&]() -> Value {
              Value x = k.peerRecord(r.dst).pointer(kCX);
              return k.at(x, k.mul(k.wide(sourceRow), k.i64(rowBytes)));
            },
            [&]() -> Value { return out; });
        Value outRow = k.at(out, k.mul(k.wide(token), k.i64(rowBytes)));
        SmallVector<Value> biasRows;
        for (Value bias : biases)
          biasRows.push_back(k.at(bias, k.mul(k.wide(token), k.i64(rowBytes))));
        auto rowOf = [&](Value j) { return k.shufflePointer(rowAddress, j); };
        if (!shape.expanded)
          k.sumMaskedRows(outRow, rowBytes, r.masters, rowOf, biasRows, share);
        else {
          // A master's group: the valid lanes of its destination.
          Value group = k.andi(k.matchAny(r.dst), k.ballot(r.valid));
          sumRoundedGroups(
              k, outRow, rowBytes, r.masters, [&](Value m) { return k.shuffle(group, m); }, rowOf,
              biasRows, share);
        }
        if (!shape.weights)
          return;
        // Slot j's weight, from its rank's topk_weights.
        k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
          Value w = k.choose(
              r.valid, f32,
              [&]() -> Value {
                Value weights = k.peerRecord(r.dst).pointer(kCTopkWeights);
                Value element =
                    shape.expanded ? sourceRow : k.add(k.mul(sourceRow, k.i32(L.topk)), k.lane);
                return k.load(f32, k.elementAt(weights, element, 4), 4);
              },
              [&]() -> Value { return arith::ConstantFloatOp::create(k.b, f32, APFloat(0.0f)); });
          k.store(w, k.elementAt(outWeights, k.add(k.mul(token, k.i32(L.topk)), k.lane), 4), 4);
        });
      });
  windowExit(k);
}

} // namespace epic::expand
