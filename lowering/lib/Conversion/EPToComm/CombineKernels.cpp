//===- CombineKernels.cpp - convert-ep-to-comm: the combine kernels ------------------===//
//
// The combine's send (received rows back to their sources, the expanded
// layout's rows of a token summed first) and its reduce (each token's records
// summed in fp32 in slot order, weights and biases).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

/// The expanded combine's send of one received token (`meta`: its row of
/// recv_src_metadata) by the calling warp: this rank's rows of the token (one
/// per local slot, columns 2.. of the metadata) summed in fp32 from +0.0 in
/// increasing slot order and rounded once, into `record` of the source.
void sendExpandedToken(KernelBuilder &k, const EPLayout &L, const CombineShape &shape, Value x,
                       Value weights, Value meta, Value record, const RowPart &share) {
  Type f32 = k.b.getF32Type();
  // Lane j < K: the token's expanded row of slot j here (-1: none).
  Value expandedRow = k.choose(
      k.lt(k.lane, k.i32(L.topk)), k.i32T(),
      [&]() -> Value { return k.loadI32(meta, k.add(k.lane, k.i32(2))); },
      [&]() -> Value { return k.i32(-1); });
  Value present = k.ballot(k.cmp(arith::CmpIPredicate::sge, expandedRow, k.i32(0)));
  k.sumMaskedRows(
      record, L.hidden * 2, present,
      [&](Value j) {
        return k.at(x, k.mul(k.wide(k.shuffle(expandedRow, j)), k.i64(L.hidden * 2)));
      },
      {}, share);
  if (shape.weights) {
    // Slot j's weight is that of its expanded row (1-D weights), else 0.
    k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
      Value w = k.choose(
          k.cmp(arith::CmpIPredicate::sge, expandedRow, k.i32(0)), f32,
          [&]() -> Value { return k.load(f32, k.elementAt(weights, expandedRow, 4), 4); },
          [&]() -> Value {
            return arith::ConstantFloatOp::create(k.b, cast<FloatType>(f32), APFloat(0.0f));
          });
      k.store(w, k.at(record, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
    });
  }
}

CombineTarget combineTarget(KernelBuilder &k, const EPLayout &L, Value metadata, Value row) {
  Value meta = k.elementAt(metadata, k.mul(row, k.i32(L.topk + 2)), 4);
  Value gid = k.load(k.i32T(), meta, 4);
  Value back = k.loadI32(meta, k.i32(1));
  Value src = k.divu(gid, k.tmax);
  Value token = k.remu(gid, k.tmax);
  Value master = k.remu(back, k.i32(L.topk));
  Value index = k.add(k.mul(k.wide(master), k.wide(k.tmax)), k.wide(token));
  Value offset = k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord)));
  return {meta, src, offset};
}

std::pair<Value, Value> combineDestination(KernelBuilder &k, const EPLayout &L, Value metadata,
                                           Value row) {
  CombineTarget t = combineTarget(k, L, metadata, row);
  return {t.meta, k.peer(t.offset, t.src)};
}

void buildCombineSend(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape) {
  KernelBuilder k(func, L);
  Value x = k.pointerParam(kCX);
  Value weights = shape.weights ? k.pointerParam(kCTopkWeights) : Value();
  Value metadata = k.pointerParam(kCSrcMetadata);
  // The prefix sums per source rank (hybrid: per forwarder index).
  Value received =
      k.loadI32(k.pointerParam(kCPsumPerRank), k.i32((L.hybrid ? L.ranksPerNode : L.ranks) - 1));
  k.entryBarrier();

  // Every received token (a warp, or a share of its row): back to its source,
  // into [master slot][token]. Across nodes a warp sends whole rows: a record
  // for another node is staged whole, then put. Hybrid: to the token's
  // forwarder in this node, over NVLink.
  int64_t maxParts =
      L.multiNode && !L.hybrid
          ? 1
          : KernelBuilder::maxRowParts(L.hidden * 2, shape.expanded ? KernelBuilder::kSumChunks
                                                                    : KernelBuilder::kCopyUnroll);
  auto writeRecord = [&](Value row, Value meta, Value record, const RowPart &share) {
    if (!shape.expanded) {
      k.copyRow(record, k.at(x, k.mul(k.wide(row), k.i64(L.hidden * 2))), L.hidden * 2, share);
      if (shape.weights) {
        k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
          Value w = k.load(k.b.getF32Type(),
                           k.elementAt(weights, k.add(k.mul(row, k.i32(L.topk)), k.lane), 4), 4);
          k.store(w, k.at(record, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
        });
      }
    } else {
      sendExpandedToken(k, L, shape, x, weights, meta, record, share);
    }
  };
  k.loopRowParts(received, maxParts, [&](Value row, const RowPart &share) {
    if (L.hybrid) {
      // Into the forwarder's [master slot][item] (column 1: item x K + master).
      Value meta = k.elementAt(metadata, k.mul(row, k.i32(L.topk + 2)), 4);
      Value src = k.divu(k.load(k.i32T(), meta, 4), k.tmax);
      Value back = k.loadI32(meta, k.i32(1));
      Value forwarder =
          k.add(k.mul(k.node, k.i32(L.ranksPerNode)), k.remu(src, k.i32(L.ranksPerNode)));
      Value offset = k.partialRecordAt(k.remu(back, k.i32(L.topk)), k.divu(back, k.i32(L.topk)));
      return writeRecord(row, meta, k.peer(offset, forwarder), share);
    }
    if (!L.multiNode) {
      auto [meta, record] = combineDestination(k, L, metadata, row);
      return writeRecord(row, meta, record, share);
    }
    // Same node: into the source's window, as on one node. Another node: into
    // the warp's staging slot, then put (the row and, with weights, the K
    // weights after it).
    CombineTarget t = combineTarget(k, L, metadata, row);
    Value remote = k.otherNode(t.src);
    Value staging = k.stagingSlot(row, remote);
    Value record = k.choose(
        remote, k.ptrT(), [&]() -> Value { return k.local(staging); },
        [&]() -> Value { return k.peer(t.offset, t.src); });
    writeRecord(row, t.meta, record, share);
    k.when(remote, [&] {
      k.putWarp(staging, t.src, t.offset, k.i64(shape.weights ? L.combineRecord : L.combineRow));
    });
  });
  // The warp's puts have read their sources (its staging is free for the next
  // call), before the last block's done signals.
  if (L.multiNode && !L.hybrid)
    k.flushWarp();

  // The rank's last block tells every peer it is done, and waits for all
  // (hybrid: every rank of the node; the forward kernel goes on).
  std::optional<PeerGroup> nodePeers;
  if (L.hybrid)
    nodePeers = PeerGroup::node(k);
  Value last = k.lastBlockOfRank(L.combineDone);
  k.when(last, [&] {
    k.resetCounter(L.combineDone);
    exchangeDoneFlags(k, L.combineFlags, {}, {}, nodePeers ? &*nodePeers : nullptr);
  });
}

void buildCombineReduce(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape) {
  KernelBuilder k(func, L);
  CombineOutputs io(k, shape);
  Value numTokens = io.numTokens, topkIdx = io.topkIdx, out = io.out, outWeights = io.outWeights;
  ArrayRef<Value> biases = io.biases;
  Type f32 = k.b.getF32Type();

  k.loopRowParts(
      numTokens, KernelBuilder::maxRowParts(L.hidden * 2, KernelBuilder::kSumChunks),
      [&](Value token, const RowPart &share) {
        // Hybrid: one record per node, at the node's master slot (the highest
        // slot whose expert lives there), holding the node's sum.
        auto r = L.hybrid ? k.route(topkIdx, token,
                                    [&](Value rank) { return k.divu(rank, k.i32(L.ranksPerNode)); })
                          : k.route(topkIdx, token);
        Value rowBytes = k.mul(k.wide(token), k.i64(L.hidden * 2));
        // fp32 from +0.0: the biases, then the master slots' rows in increasing
        // slot order; one rounding.
        SmallVector<Value> biasRows;
        for (Value bias : biases)
          biasRows.push_back(k.at(bias, rowBytes));
        k.sumMaskedRows(
            k.at(out, rowBytes), L.hidden * 2, r.masters,
            [&](Value j) {
              Value index = k.add(k.mul(k.wide(j), k.wide(k.tmax)), k.wide(token));
              return k.local(k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord))));
            },
            biasRows, share);
        if (shape.weights) {
          // Slot j's weight comes from the record of its rank's master slot.
          k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
            Value w = k.choose(
                r.valid, f32,
                [&]() -> Value {
                  Value index = k.add(k.mul(k.wide(r.masterLane), k.wide(k.tmax)), k.wide(token));
                  Value record =
                      k.local(k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord))));
                  return k.load(
                      f32, k.at(record, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
                },
                [&]() -> Value {
                  return arith::ConstantFloatOp::create(k.b, cast<FloatType>(f32), APFloat(0.0f));
                });
            k.store(w, k.elementAt(outWeights, k.add(k.mul(token, k.i32(L.topk)), k.lane), 4), 4);
          });
        }
      });
}

} // namespace epic::expand
