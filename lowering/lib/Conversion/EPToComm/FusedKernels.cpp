//===- FusedKernels.cpp - convert-ep-to-comm: kernels fused with the GEMM ------------===//
//
// ep.dispatch_gemm's copy + GEMM kernel, ep.gemm_combine's GEMM + send
// kernel and ep.moe_layer's persistent kernel, built from the dispatch,
// combine, grouped GEMM and SwiGLU kernels.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "mlir/IR/IRMapping.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

void inlineKernelBody(OpBuilder &b, gpu::GPUFuncOp from, gpu::GPUFuncOp to, Value block,
                      Value blocks, Value table) {
  IRMapping map;
  for (unsigned i = 0; i < from.getNumArguments(); ++i)
    map.map(from.getArgument(i), table && i == 2 ? table : to.getArgument(i));
  assert(from.getNumWorkgroupAttributions() <= to.getNumWorkgroupAttributions() &&
         "the kernel must have the part's shared attributions");
  for (auto [a, c] : llvm::zip(from.getWorkgroupAttributions(), to.getWorkgroupAttributions()))
    map.map(a, c);
  SmallVector<Operation *> cloned;
  for (Operation &op : from.getBody().front().without_terminator())
    cloned.push_back(b.clone(op, map));
  // Only the copies: `block`/`blocks` may themselves be ids of this block.
  auto rename = [&](Operation *op) {
    if (auto id = dyn_cast<gpu::BlockIdOp>(op); id && id.getDimension() == gpu::Dimension::x) {
      id.replaceAllUsesWith(block);
      id.erase();
    } else if (auto dim = dyn_cast<gpu::GridDimOp>(op);
               dim && dim.getDimension() == gpu::Dimension::x) {
      dim.replaceAllUsesWith(blocks);
      dim.erase();
    }
  };
  for (Operation *top : cloned)
    top->walk(rename);
}

/// `<name>_copy_gemm`: every block first copies its share of the dispatch's
/// rows, counting placed rows per 128-row tile, then takes grouped GEMM
/// tiles, each tile waiting for its count. All blocks copy because the copy is
/// latency-bound (it runs at the speed of the warps that do it; a few blocks
/// took longer than the whole GEMM), and a block done with its rows starts
/// the tiles whose rows are placed while the others still copy. Built as two
/// kernels, then merged into one.
void buildCopyGemmKernel(OpBuilder &builder, Location loc, StringRef name, const EPLayout &L,
                         DispatchShape shape, const epic::detail::GroupedGemmShape &gemm) {
  gpu::GPUFuncOp copy = createKernel(builder, loc, (name + "_copy_role").str(), false);
  buildDispatchCopy(copy, L, shape);
  gpu::GPUFuncOp compute = createKernel(builder, loc, (name + "_gemm_role").str(), false);
  epic::detail::buildGroupedGemmKernel(compute, gemm);
  gpu::GPUFuncOp kernel = createKernel(builder, loc, name, false);

  OpBuilder b(kernel.getBody().front().getTerminator());
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  inlineKernelBody(b, copy, kernel, block, blocks);
  inlineKernelBody(b, compute, kernel, block, blocks);
  copy.erase();
  compute.erase();
}

//===----------------------------------------------------------------------===//
// The grouped GEMM fused with the combine
//===----------------------------------------------------------------------===//

/// `<name>_gemm_send` (see EPFuseGemmCombine in Passes.td): the combine's
/// entry barrier, row -> token map and per-token counts, a barrier of the
/// rank's blocks, the persistent grouped GEMM on all blocks but the send
/// block (each stored tile counted in its 128-row tile's slot), then every
/// warp claims chunks of 32 rows in expert order, each lane waiting for its
/// row's tile, and sends every token whose last row that was; the rank's last
/// warp ends the combine's send (done flags).
void buildGemmSendKernel(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape,
                         epic::detail::GroupedGemmShape gemm, GemmCombineScratch scratch) {
  KernelBuilder k(func, L);
  Value x = k.pointerParam(kCX); // the GEMM's output, the rows the combine sends
  Value metadata = k.pointerParam(kCSrcMetadata);
  Value psumPerExpert = k.pointerParam(kGCPsumPerExpert);
  Value received = k.loadI32(k.pointerParam(kCPsumPerRank), k.i32(L.ranks - 1));
  k.entryBarrier();

  // Every received token: its expanded rows point back at it; count them.
  k.loop(k.globalWarp, received, k.numWarps, [&](Value t) {
    Value meta = k.elementAt(metadata, k.mul(t, k.i32(L.topk + 2)), 4);
    Value row = k.choose(
        k.lt(k.lane, k.i32(L.topk)), k.i32T(),
        [&]() -> Value { return k.loadI32(meta, k.add(k.lane, k.i32(2))); },
        [&]() -> Value { return k.i32(-1); });
    Value mine = k.cmp(arith::CmpIPredicate::sge, row, k.i32(0));
    k.when(mine, [&] { k.store(t, k.counter(scratch.rowToken, row), 4); });
    Value count = k.popc(k.ballot(mine));
    k.when(k.eq(k.lane, k.i32(0)), [&] { k.store(count, k.counter(scratch.pending, t), 4); });
  });
  // The rank's blocks meet: the map is complete before any row is counted.
  k.barrier();
  k.when(k.eq(k.tid, k.i32(0)), [&] {
    comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::release, comm::Scope::gpu,
                        k.i32(1), k.local(k.i32(scratch.arrivals)));
    comm::WaitFlagOp::create(k.b, k.i32T(), k.local(k.i32(scratch.arrivals)), comm::Predicate::ge,
                             k.blocks, k.me, Value(), comm::Scope::gpu, L.timeoutMs);
  });
  k.barrier();

  // A tile block: thread 0 counts each stored tile in its 128-row tile's
  // slot (release: the block's stores met at a barrier before it).
  gemm.afterTile = [&](OpBuilder &at, Value expert, Value rowTile) {
    OpBuilder::InsertionGuard guard(k.b);
    k.b.setInsertionPoint(at.getInsertionBlock(), at.getInsertionPoint());
    Value slot = k.add(k.mul(k.index(expert), k.i32(scratch.maxTiles)), k.index(rowTile));
    k.when(k.eq(k.tid, k.i32(0)), [&] {
      comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::release, comm::Scope::gpu,
                          k.i32(1), k.counter(scratch.colDone, slot));
    });
  };
  gemm.commBlocks = kGemmCombineSendBlocks;
  epic::detail::buildGroupedGemmKernel(func, gemm);

  // Every warp, the send block's at once and the tile blocks' after their last
  // tile: claim the rank's next chunk of 32 rows (chunks in expert order, the
  // order the tiles finish in; a lane per row). A lane waits until every
  // column tile of its row's 128-row tile is stored, takes one of its token's
  // rows off the count, and the warp sends the tokens whose count that ended.
  k.b.setInsertionPoint(func.getBody().front().getTerminator());
  auto chunksOf = [&](Value start, Value end) {
    return k.divu(k.add(k.sub(end, start), k.i32(31)), k.i32(32));
  };
  // Chunk c's expert, the expert's first and end rows, and the chunk's index
  // in it: a scan of the experts (the counts are in L1 after the first).
  auto locate = [&](Value c) {
    auto scan =
        scf::ForOp::create(k.b, k.i32(0), k.i32(L.local), k.i32(1),
                           ValueRange{k.i32(0), k.i32(0), k.i32(0), k.i32(0), k.i32(0), k.i32(0)});
    OpBuilder::InsertionGuard guard(k.b);
    k.b.setInsertionPointToStart(scan.getBody());
    Value e = scan.getInductionVar();
    // Carried: the previous expert's end, the chunks before e, then the found
    // chunk's expert, first row, end row and index in its expert.
    ValueRange carried = scan.getRegionIterArgs();
    Value start = k.alignUp(carried[0], L.alignment);
    Value end = k.loadI32(psumPerExpert, e);
    Value after = k.add(carried[1], chunksOf(start, end));
    Value here = k.andi(k.cmp(arith::CmpIPredicate::ule, carried[1], c),
                        k.cmp(arith::CmpIPredicate::ult, c, after));
    scf::YieldOp::create(k.b, ValueRange{end, after, k.select(here, e, carried[2]),
                                         k.select(here, start, carried[3]),
                                         k.select(here, end, carried[4]),
                                         k.select(here, k.sub(c, carried[1]), carried[5])});
    return scan;
  };
  Value totalChunks = locate(k.i32(-1)).getResult(1);
  auto claims = scf::WhileOp::create(k.b, TypeRange{k.i32T()}, ValueRange{});
  {
    OpBuilder::InsertionGuard guard(k.b);
    k.b.createBlock(&claims.getBefore());
    Value claim = k.choose(
        k.eq(k.lane, k.i32(0)), k.i32T(),
        [&]() -> Value {
          return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                           comm::Ordering::relaxed, comm::Scope::gpu, k.i32(1),
                                           k.local(k.i32(scratch.claimed())));
        },
        [&]() -> Value { return k.i32(0); });
    claim = k.shuffle(claim, k.i32(0));
    scf::ConditionOp::create(k.b, k.lt(claim, totalChunks), ValueRange{claim});
    Block *body = k.b.createBlock(&claims.getAfter(), {}, {k.i32T()}, {k.b.getLoc()});
    auto where = locate(body->getArgument(0));
    Value e = where.getResult(2), start = where.getResult(3), end = where.getResult(4);
    Value row = k.add(start, k.add(k.mul(where.getResult(5), k.i32(32)), k.lane));
    Value valid = k.lt(row, end);
    Value token = k.choose(
        valid, k.i32T(),
        [&]() -> Value {
          Value rowTile = k.divu(k.sub(row, start), k.i32(epic::detail::kGemmTileM));
          Value slot = k.add(k.mul(e, k.i32(scratch.maxTiles)), rowTile);
          comm::WaitFlagOp::create(k.b, k.i32T(), k.counter(scratch.colDone, slot),
                                   comm::Predicate::ge, k.i32(scratch.columnTiles), k.me, Value(),
                                   comm::Scope::gpu, L.timeoutMs);
          return k.load(k.i32T(), k.counter(scratch.rowToken, row), 4);
        },
        [&]() -> Value { return k.i32(-1); });
    Value left = k.choose(
        valid, k.i32T(),
        [&]() -> Value {
          return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                           comm::Ordering::acq_rel, comm::Scope::gpu, k.i32(-1),
                                           k.counter(scratch.pending, token));
        },
        [&]() -> Value { return k.i32(0); });
    // Every row of those tokens is final (their lanes acquired it).
    k.forEachLane(k.ballot(k.eq(left, k.i32(1))), [&](Value lane) {
      // What the completing lane acquired, for the warp (a ballot or a
      // shuffle is no memory synchronization; a warp barrier is).
      NVVM::SyncWarpOp::create(k.b, k.fullMask());
      comm::FenceOp::create(k.b, comm::Ordering::acq_rel, comm::Scope::gpu);
      auto [meta, record] = combineDestination(k, L, metadata, k.shuffle(token, lane));
      sendExpandedToken(k, L, shape, x, Value(), meta, record);
    });
    scf::YieldOp::create(k.b, ValueRange{});
  }

  // The rank's last warp (every chunk claimed and sent) resets the rank
  // barrier, the claims and the tile counts, tells every peer it is done, and
  // waits for all (the combine send's ending).
  NVVM::SyncWarpOp::create(k.b, k.fullMask()); // the warp's sends, before lane 0's release
  Value before = k.choose(
      k.eq(k.lane, k.i32(0)), k.i32T(),
      [&]() -> Value {
        return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                         comm::Ordering::acq_rel, comm::Scope::sys, k.i32(1),
                                         k.local(k.i32(L.combineDone)));
      },
      [&]() -> Value { return k.i32(0); });
  k.when(k.eq(k.shuffle(before, k.i32(0)), k.sub(k.numWarps, k.i32(1))), [&] {
    NVVM::SyncWarpOp::create(k.b, k.fullMask()); // what lane 0 acquired, for the warp
    k.when(k.eq(k.lane, k.i32(0)), [&] {
      for (int64_t cell : {L.combineDone, scratch.arrivals, scratch.claimed()})
        comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0),
                              k.local(k.i32(cell)));
    });
    k.loop(k.lane, k.i32(L.local * scratch.maxTiles), k.i32(32),
           [&](Value slot) { k.store(k.i32(0), k.counter(scratch.colDone, slot), 4); });
    exchangeDoneFlags(k, L.combineFlags, k.lane, k.i32(32));
  });
}

//===----------------------------------------------------------------------===//
// ep.moe_layer: the whole FP8 layer, one persistent kernel
//===----------------------------------------------------------------------===//
//
// Each step is built by its own op's builder into a kernel of its own (the
// same code the unfused ops run, so the results are bitwise theirs), then
// copied into the layer kernel with the parameter table moved to the step's
// part of the layer's record; between steps the rank's blocks meet at a
// barrier in the window. The kernel runs at the FP8 GEMM's shape (three
// warpgroups, one block per SM): the GEMMs split the registers between their
// producer and consumers and give them back after their last tile, so the
// other steps run with the even split of 384 threads.

namespace {

/// Every block of this rank waits here until all have arrived. One counter
/// in the window serves all the barriers of a call: it only grows during
/// the call, so the block that adds `old` is in barrier old / blocks, which
/// ends when the counter reaches the next multiple of the rank's blocks
/// (all resident: the launch is cooperative). The block's writes before are
/// visible to every block after (release, acquire at GPU scope), also to the
/// TMA loads of the next GEMM (the async proxy).
void rankBarrier(KernelBuilder &k, int64_t counter) {
  // Each thread's shared-memory writes of the step before, ahead of the next
  // GEMM's TMA loads into the same bytes (the async proxy), as a TMA store's
  // writers fence before their barrier.
  NVVM::FenceProxyOp::create(
      k.b, NVVM::ProxyKind::async_shared,
      NVVM::SharedSpaceAttr::get(k.b.getContext(), NVVM::SharedSpace::shared_cta));
  k.barrier(); // the block's writes, before thread 0's release
  k.when(k.eq(k.tid, k.i32(0)), [&] {
    Value old =
        comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add, comm::Ordering::release,
                                  comm::Scope::gpu, k.i32(1), k.local(k.i32(counter)));
    Value target = k.mul(k.add(k.divu(old, k.blocks), k.i32(1)), k.blocks);
    comm::WaitFlagOp::create(k.b, k.i32T(), k.local(k.i32(counter)), comm::Predicate::ge, target,
                             k.me, Value(), comm::Scope::gpu, k.layout.timeoutMs);
  });
  k.barrier(); // what thread 0 acquired, for the whole block
  NVVM::FenceProxyOp::create(k.b, NVVM::ProxyKind::async_global, NVVM::SharedSpaceAttr());
}

/// The table through which a step reads part `part`'s record (the dispatch's
/// is the record's start: the kernel's own table).
Value partTable(KernelBuilder &k, int part) {
  return k.at(k.table, k.i64(int64_t(moeLayerPartFirst(part)) * 8));
}

} // namespace

void buildMoeLayerKernel(OpBuilder &builder, Location loc, StringRef name,
                         const MoeLayerParts &parts) {
  // The steps, each an ordinary kernel first. In one address space (the
  // virtual world) the dispatch places every row straight at its destination
  // and the combine reads every contribution where it lies (OnePass.cpp), as
  // the unfused ops there do.
  const bool onePassDispatch = parts.dispatch.onePass, onePassCombine = parts.combine.onePass;
  auto role = [&](StringRef step, bool sharedFlag) {
    return createKernel(builder, loc, (name + "_" + step + "_step").str(), sharedFlag);
  };
  gpu::GPUFuncOp send = role("send", true), place = role("place", false),
                 gateUp = role("gate_up", false), swiglu = role("swiglu", false),
                 down = role("down", false), reduce = role("reduce", false);
  gpu::GPUFuncOp combineSend = onePassCombine ? nullptr : role("combine_send", true);
  buildDispatchSend(send, parts.dispatchLayout, parts.dispatch); // one pass: counts only
  if (onePassDispatch)
    buildDispatchScatter(place, parts.dispatchLayout, parts.dispatch);
  else
    buildDispatchCopy(place, parts.dispatchLayout, parts.dispatch);
  epic::detail::buildGroupedGemmKernel(gateUp, parts.gateUp);
  buildSwiglu(swiglu, parts.swigluLayout, parts.swiglu);
  epic::detail::buildGroupedGemmKernel(down, parts.down);
  if (onePassCombine) {
    buildCombineGather(reduce, parts.combineLayout, parts.combine);
  } else {
    buildCombineSend(combineSend, parts.combineLayout, parts.combine);
    buildCombineReduce(reduce, parts.combineLayout, parts.combine);
  }

  gpu::GPUFuncOp kernel = createKernel(builder, loc, name, true);
  KernelBuilder k(kernel, parts.dispatchLayout);
  Value block = gpu::BlockIdOp::create(k.b, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(k.b, gpu::Dimension::x);
  auto run = [&](gpu::GPUFuncOp step, Value table) {
    inlineKernelBody(k.b, step, kernel, block, blocks, table);
    step.erase();
  };
  // One pass reads and writes other ranks' tensors: every block of every rank
  // meets (block b of each rank meets block b of the others, then the rank's
  // blocks meet), where the unfused ops had a kernel boundary.
  auto meet = [&](bool everyRank) {
    if (everyRank)
      k.entryBarrier();
    rankBarrier(k, parts.barrier);
  };
  run(send, {});
  meet(onePassDispatch); // every count exchanged, before the rows are placed
  run(place, {});
  meet(onePassDispatch); // the rows placed, before the gate/up tiles load them
  run(gateUp, partTable(k, kLayerGateUp));
  meet(false); // every column of a row, before its SwiGLU
  run(swiglu, partTable(k, kLayerSwiglu));
  meet(false); // the activations, before the down tiles load them
  run(down, partTable(k, kLayerDown));
  meet(onePassCombine); // every row of a token, before its sum is sent (read)
  if (combineSend) {
    run(combineSend, partTable(k, kLayerCombine));
    meet(false); // the rank's sends ended, as the send kernel's end was
  }
  run(reduce, partTable(k, kLayerCombine));
  // The rank's last block out sets both counters back to zero for the next
  // call (every block of the rank has passed every barrier by then).
  Value last = k.lastBlockOfRank(parts.exits);
  k.when(last, [&] {
    k.resetCounter(parts.barrier);
    k.resetCounter(parts.exits);
  });
}

} // namespace epic::expand
