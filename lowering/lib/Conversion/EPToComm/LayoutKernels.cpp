//===- LayoutKernels.cpp - ep.dispatch_layout's kernels -------------------===//
//
// DeepEP's get_dispatch_layout as two kernels of the launch, in stream order:
// `<name>_zero` clears the rank's counts, `<name>_count` gives a thread to each
// token. Nothing crosses ranks: the kernels take the communication
// signature only so that a virtual world's ranks each get their record and
// their share of the blocks (convert-comm-to-nvvm).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {

namespace {
/// The rank's threads, numbered across its blocks: (first, stride).
std::pair<Value, Value> rankThreads(KernelBuilder &k) {
  return {k.add(k.mul(k.block, k.threads), k.tid), k.mul(k.blocks, k.threads)};
}
} // namespace

void buildLayoutZero(gpu::GPUFuncOp func, const EPLayout &L) {
  KernelBuilder k(func, L);
  auto [first, stride] = rankThreads(k);
  Value perRank = k.pointerParam(kLPerRank);
  Value perExpert = k.pointerParam(kLPerExpert);
  k.loop(first, k.i32(L.ranks), stride,
         [&](Value r) { k.store(k.i32(0), k.elementAt(perRank, r, 4), 4); });
  k.loop(first, k.i32(L.experts), stride,
         [&](Value e) { k.store(k.i32(0), k.elementAt(perExpert, e, 4), 4); });
}

void buildLayoutCount(gpu::GPUFuncOp func, const EPLayout &L) {
  KernelBuilder k(func, L);
  auto [first, stride] = rankThreads(k);
  Value topkIdx = k.pointerParam(kLTopkIdx);
  Value perRank = k.pointerParam(kLPerRank);
  Value perExpert = k.pointerParam(kLPerExpert);
  Value inRank = k.pointerParam(kLInRank);
  Type byteType = k.b.getI8Type();
  k.loop(first, k.intParam(kLNumTokens), stride, [&](Value t) {
    // The token's row of is_token_in_rank (bytes), all false first; this
    // thread alone writes and reads it.
    Value row = k.mul(t, k.i32(L.ranks));
    k.loop(k.i32(0), k.i32(L.ranks), k.i32(1), [&](Value r) {
      k.store(arith::ConstantIntOp::create(k.b, 0, 8), k.elementAt(inRank, k.add(row, r), 1), 1);
    });
    k.loop(k.i32(0), k.i32(L.topk), k.i32(1), [&](Value slot) {
      Value expert = k.loadTopkId(topkIdx, k.add(k.mul(t, k.i32(L.topk)), slot));
      // -1 (and anything outside [0, E), which the dispatch refuses) counts nowhere.
      k.when(k.ult(expert, k.i32(L.experts)), [&] {
        comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::relaxed, comm::Scope::gpu,
                            k.i32(1), k.elementAt(perExpert, expert, 4));
        Value rank = k.divu(expert, k.i32(L.local));
        Value flag = k.elementAt(inRank, k.add(row, rank), 1);
        // A token counts once per destination rank.
        k.when(k.eq(k.load(byteType, flag, 1), arith::ConstantIntOp::create(k.b, 0, 8)), [&] {
          k.store(arith::ConstantIntOp::create(k.b, 1, 8), flag, 1);
          comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::relaxed, comm::Scope::gpu,
                              k.i32(1), k.elementAt(perRank, rank, 4));
        });
      });
    });
  });
}

} // namespace epic::expand
