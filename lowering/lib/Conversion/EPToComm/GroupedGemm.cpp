//===- GroupedGemm.cpp - ep.grouped_gemm's Hopper kernels ------------------===//
//
// A persistent grouped GEMM over a dispatch's expanded layout. This file: what
// both kernels share (shape checks, TMA descriptors, the setup and the tile
// walk of GemmBuilder.h) and the BF16/F16 kernel; the FP8 kernel is in
// GroupedGemmFp8.cpp.
//
//   * tiles: (local expert e, 128-column tile of N, 128-row tile of e's rows),
//     numbered expert by expert, row tiles fastest (the blocks at work share
//     weight tiles through L2); block b of a rank takes tiles b, b + B, ...
//     (B: the rank's blocks, less those kept for communication)
//     (the expert ranges come from the handle's per-expert prefix sums);
//   * per tile, K in steps of 64 through a ring of kGemmStages shared-memory stages:
//     thread 0 issues the TMA loads of a stage (two 64 x 64 lhs boxes, two
//     64 x 64 weight boxes, 128-byte swizzle) with an mbarrier transaction; the
//     warpgroup waits for the stage's phase and runs wgmma m64n128k16 x 8
//     (NVGPU's warpgroup.mma, fp32 accumulators in registers) keeping one
//     wgmma group in flight; the stage the previous step read is then refilled
//     with the step kGemmStages - 1 ahead of this one;
//   * epilogue: accumulators to shared memory (warpgroup.mma.store), then
//     16-byte stores of the rows that belong to the expert, converted to the
//     result type. Rows of the next expert that a tile's loads covered are
//     computed and dropped; rows past the lhs are TMA's zero fill.
//
// The stage and parity of step g (counted over all tiles of the block) are
// g % kStages and (g / kStages) % 2, so the ring continues across tiles.
//
//===----------------------------------------------------------------------===//

#include "GroupedGemm.h"

#include "GemmBuilder.h"

#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

#include <utility>

using namespace mlir;
namespace comm = epic::comm;
using namespace epic::detail;

bool epic::detail::isFp8Gemm(const GroupedGemmShape &shape) {
  return isa<Float8E4M3FNType>(shape.inType);
}

int64_t epic::detail::gemmDynamicSharedBytes(const GroupedGemmShape &shape) {
  return isFp8Gemm(shape) ? kFp8DynamicSharedBytes : kGemmDynamicSharedBytes;
}

int64_t epic::detail::gemmThreads(const GroupedGemmShape &shape) {
  return isFp8Gemm(shape) ? kFp8Threads : kGemmThreads;
}

int64_t epic::detail::gemmCtasPerSm(const GroupedGemmShape &shape) {
  return isFp8Gemm(shape) ? kFp8CtasPerSm : kGemmCtasPerSm;
}

LogicalResult epic::detail::checkGroupedGemmShape(Operation *op, const GroupedGemmShape &s) {
  if (isFp8Gemm(s)) {
    if (s.hidden % kFp8ScaleBlock != 0 || s.n % kFp8ScaleBlock != 0)
      return op->emitError("convert-ep-to-comm: the FP8 grouped GEMM scales blocks of ")
             << kFp8ScaleBlock << " channels: K (" << s.hidden << ") and N (" << s.n
             << ") must be multiples";
    if (s.tileDone >= 0 || s.afterTile || s.commBlocks > 0)
      return op->emitError("convert-ep-to-comm: the FP8 grouped GEMM is not fused with the "
                           "dispatch or the combine yet");
  }
  if (s.hidden % kGemmTileK != 0)
    return op->emitError("convert-ep-to-comm: the grouped GEMM steps through K (")
           << s.hidden << ") in tiles of " << kGemmTileK << ": it must be a multiple";
  if (s.n % kGemmTileN != 0)
    return op->emitError("convert-ep-to-comm: the grouped GEMM's output tiles are ")
           << kGemmTileN << " columns wide: N (" << s.n << ") must be a multiple";
  if (s.alignment < 1)
    return op->emitError("convert-ep-to-comm: expert_alignment must be positive");
  return success();
}

std::vector<epic::TensorMapSpec>
epic::detail::groupedGemmTensorMaps(const GroupedGemmShape &s, StringRef lhsField,
                                    StringRef weightsField, IntOrField rows, int64_t mapsOffset) {
  auto map = [&](StringRef field, IntOrField rows, int64_t cols, int64_t offset,
                 int64_t boxRows = 64) {
    TensorMapSpec spec;
    spec.field = field.str(), spec.offset = offset, spec.rows = std::move(rows);
    spec.cols = cols, spec.elemBytes = 2, spec.boxRows = 64, spec.boxCols = 64;
    if (isFp8Gemm(s)) // a box row is 128 one-byte channels: one scale block
      spec.elemBytes = 1, spec.boxRows = boxRows, spec.boxCols = kFp8TileK;
    spec.swizzle = 128;
    return spec;
  };
  // FP8: lhs [num_rows, hidden] in kFp8TileM-row boxes, weights as [L * N, hidden]
  // (K contiguous) in 128-row boxes.
  if (isFp8Gemm(s))
    return {map(lhsField, std::move(rows), s.hidden, mapsOffset, kFp8TileM),
            map(weightsField, IntOrField{s.localExperts * s.n, {}}, s.hidden,
                mapsOffset + LaunchMetadata::kTensorMapBytes, kGemmTileN)};
  // lhs: [num_rows, hidden]; weights as [L * hidden, N] (N contiguous).
  return {map(lhsField, std::move(rows), s.hidden, mapsOffset),
          map(weightsField, IntOrField{s.localExperts * s.hidden, {}}, s.n,
              mapsOffset + LaunchMetadata::kTensorMapBytes)};
}

//===----------------------------------------------------------------------===//
// The shared builder: setup and tile walk
//===----------------------------------------------------------------------===//

namespace epic::detail {

GemmBuilder::Setup GemmBuilder::begin(gpu::GPUFuncOp func, ArrayRef<int64_t> lhsBox,
                                      ArrayRef<int64_t> rhsBox,
                                      function_ref<void(const Setup &)> more) {
  Setup s;
  s.comm = func.getArgument(0), s.window = func.getArgument(1);
  Value table = func.getArgument(2);
  s.record = comm::RankParamsOp::create(b, table, shape.paramStride, s.comm);
  s.out = field(s.record, shape.outField, ptrT());
  s.psum = field(s.record, shape.psumField, ptrT());
  // The runtime encodes the two descriptors into the record, 128 bytes apart
  // (epic.tensor_maps): the TMA reads them where they lie, in the kernel's
  // parameter space (generic addresses of a grid-constant parameter).
  Value maps = gep(s.record, i64(idx(shape.mapsOffset)));
  s.lhsMap = UnrealizedConversionCastOp::create(b, mapT(lhsBox), maps).getResult(0);
  s.rhsMap =
      UnrealizedConversionCastOp::create(b, mapT(rhsBox), gep(maps, i64(idx(128)))).getResult(0);

  s.tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
  s.block = gpu::BlockIdOp::create(b, gpu::Dimension::x);
  s.blocks = gpu::GridDimOp::create(b, gpu::Dimension::x);
  s.leader = eq(s.tid, idx(0));
  s.me = comm::TeamRankOp::create(
      b, b.getI32Type(),
      comm::TeamOp::create(b, comm::TeamType::get(ctx), comm::TeamKind::world, s.comm));

  // Stages start on a 1024-byte boundary (128-byte swizzle atoms).
  s.dynamic = gpu::DynamicSharedMemoryOp::create(
      b, MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), MemRefLayoutAttrInterface(),
                         workgroup));
  Value address = memref::ExtractAlignedPointerAsIndexOp::create(b, s.dynamic);
  s.pad = remu(sub(idx(1024), remu(address, idx(1024))), idx(1024));

  s.full = nvgpu::MBarrierCreateOp::create(b, barriersT());
  for (int64_t stage = 0; stage < tiling.stages; ++stage)
    nvgpu::MBarrierInitOp::create(b, s.full, idx(1), idx(stage), s.leader);
  if (more)
    more(s);
  // The TMA's complete_tx reaches the barriers through the async proxy: without
  // this fence it may act on the memory as it was before the init (the last
  // launch's barrier there) and be lost, and the stage's phase never completes
  // (a rare hang of the GEMM steps in the persistent layer kernel at EP8).
  NVVM::FenceProxyOp::create(b, NVVM::ProxyKind::async_shared,
                             NVVM::SharedSpaceAttr::get(ctx, NVVM::SharedSpace::shared_cta));
  nvgpu::TmaPrefetchOp::create(b, s.lhsMap, s.leader);
  nvgpu::TmaPrefetchOp::create(b, s.rhsMap, s.leader);
  gpu::BarrierOp::create(b);
  return s;
}

void GemmBuilder::waitPhase(const Setup &s, Value barriers, Value stage, Value parity) {
  Value barrier = nvgpu::MBarrierGetOp::create(b, b.getI32Type(), barriers, stage);
  comm::WaitPhaseOp::create(b, barrier, parity, s.me, shape.timeoutMs);
}

Value GemmBuilder::expertEnd(Value psum, Value e) {
  Value at = gep(psum, i64(mul(e, idx(4))));
  Value end = LLVM::LoadOp::create(b, b.getI32Type(), at, 4);
  return arith::IndexCastUIOp::create(b, b.getIndexType(), end);
}

Value GemmBuilder::tilesOf(Value start, Value end) {
  return mul(ceilDiv(sub(end, start), tiling.tileM), idx(shape.n / kGemmTileN));
}

Value GemmBuilder::totalTiles(Value psum) {
  return loop(idx(0), idx(shape.localExperts), idx(1), ValueRange{idx(0), idx(0)},
              [&](Value e, ValueRange carried) -> SmallVector<Value> {
                Value start = alignUp(carried[1], shape.alignment);
                Value end = expertEnd(psum, e);
                return {add(carried[0], tilesOf(start, end)), end};
              })[0];
}

GemmBuilder::Tile GemmBuilder::locate(Value psum, Value tile) {
  // Scan the experts' tile counts. Carried: tiles before e, the previous
  // expert's end, then the chosen expert, its start, its end and the tiles
  // before it.
  ValueRange found = loop(idx(0), idx(shape.localExperts), idx(1),
                          ValueRange{idx(0), idx(0), idx(0), idx(0), idx(0), idx(0)},
                          [&](Value e, ValueRange c) -> SmallVector<Value> {
                            Value start = alignUp(c[1], shape.alignment);
                            Value end = expertEnd(psum, e);
                            Value after = add(c[0], tilesOf(start, end));
                            Value mine = andi(ule(c[0], tile), ult(tile, after));
                            return {after,
                                    end,
                                    select(mine, e, c[2]),
                                    select(mine, start, c[3]),
                                    select(mine, end, c[4]),
                                    select(mine, c[0], c[5])};
                          });
  Tile t;
  t.expert = found[2], t.start = found[3], t.end = found[4];
  Value local = sub(tile, found[5]);
  t.rowTiles = ceilDiv(sub(t.end, t.start), tiling.tileM);
  t.rowTile = remu(local, t.rowTiles);
  t.row0 = add(t.start, mul(t.rowTile, idx(tiling.tileM)));
  t.col0 = mul(divu(local, t.rowTiles), idx(kGemmTileN));
  return t;
}

} // namespace epic::detail

//===----------------------------------------------------------------------===//
// The BF16/F16 kernel
//===----------------------------------------------------------------------===//

namespace {

struct Bf16Gemm : GemmBuilder {
  Bf16Gemm(ImplicitLocOpBuilder &b, const GroupedGemmShape &shape)
      : GemmBuilder(b, shape, {kGemmTileM, kGemmStages, kGemmStageBytes}) {}

  void build(gpu::GPUFuncOp func) {
    const int64_t kSteps = shape.hidden / kGemmTileK;
    const int64_t nTiles = shape.n / kGemmTileN;
    Setup s = begin(func, {64, 64}, {64, 64});
    Value total = totalTiles(s.psum);

    const int64_t inBytes = shape.inType.getIntOrFloatBitWidth() / 8;
    const int64_t lhsBytes = kGemmTileM * kGemmTileK * inBytes, boxBytes = 64 * 64 * 2;
    // Thread 0 loads step `k` of a tile into the stage of global step `g`:
    // two 64 x 64 lhs boxes, then two 64 x 64 halves of the weight tile.
    auto issue = [&](Value g, Value k, Value row0, Value weightRow0, Value col0) {
      Value stage = stageOf(g);
      Value offset = stageOffset(s, g);
      nvgpu::MBarrierArriveExpectTxOp::create(b, s.full, idx(kGemmStageBytes), stage, s.leader);
      Value kCol = mul(k, idx(kGemmTileK));
      MemRefType box = smem({64, 64}, shape.inType);
      for (int64_t rows = 0; rows < kGemmTileM / 64; ++rows)
        nvgpu::TmaAsyncLoadOp::create(b, view(s.dynamic, add(offset, idx(rows * boxBytes)), box),
                                      s.full, s.lhsMap, ValueRange{kCol, add(row0, idx(rows * 64))},
                                      stage, Value(), s.leader);
      Value wRow = add(weightRow0, kCol);
      for (int64_t half = 0; half < kGemmTileN / 64; ++half)
        nvgpu::TmaAsyncLoadOp::create(
            b, view(s.dynamic, add(offset, idx(lhsBytes + half * boxBytes)), box), s.full, s.rhsMap,
            ValueRange{add(col0, idx(half * 64)), wRow}, stage, Value(), s.leader);
    };

    // The rank's last `commBlocks` blocks take no tile: the others share them.
    Value tileBlocks = s.blocks, first = s.block;
    if (shape.commBlocks > 0) {
      tileBlocks = sub(s.blocks, idx(shape.commBlocks));
      first = select(ult(s.block, tileBlocks), s.block, total);
    }
    loop(first, total, tileBlocks, ValueRange{idx(0)},
         [&](Value tileIndex, ValueRange carried) -> SmallVector<Value> {
           Value g0 = carried[0];
           Tile t = locate(s.psum, tileIndex);
           Value row0 = t.row0, col0 = t.col0, start = t.start, end = t.end;
           Value weightRow0 = mul(t.expert, idx(shape.hidden)); // [hidden, N] matrices

           // Fused: wait until the copy role has placed every row of the tile's
           // expert, not only the tile's: the blocks on the row tiles that share a
           // weight column tile then start together and stream it through L2 once.
           // (Waiting per row tile let the first row tiles race ahead, so every
           // weight tile came from memory twice: L2 hits 34% instead of 49%, the
           // fused GEMM 1.45x slower on the H200.)
           auto tileCounter = [&](int64_t base, Value rowTile) {
             Value slot = add(mul(t.expert, idx(shape.maxTiles)), rowTile);
             return comm::LocalPtrOp::create(b, ptrT(), s.window,
                                             i64(add(idx(base), mul(slot, idx(4)))));
           };
           if (shape.tileDone >= 0) {
             when(s.leader, [&] {
               loop(idx(0), t.rowTiles, idx(1), ValueRange{}, [&](Value m, ValueRange) {
                 Value left = sub(end, add(start, mul(m, idx(kGemmTileM))));
                 Value rows = select(ult(left, idx(kGemmTileM)), left, idx(kGemmTileM));
                 comm::WaitFlagOp::create(b, b.getI32Type(), tileCounter(shape.tileDone, m),
                                          comm::Predicate::ge, i32(rows), s.me, Value(),
                                          comm::Scope::gpu, shape.timeoutMs);
                 return SmallVector<Value>{};
               });
               // The rows were written by generic stores; TMA reads through the async proxy.
               NVVM::FenceProxyOp::create(b, NVVM::ProxyKind::async_global,
                                          NVVM::SharedSpaceAttr());
             });
             gpu::BarrierOp::create(b);
           }

           // Fill the ring, then: wait for a stage, multiply (one wgmma group stays
           // in flight: the tensor cores do not idle while the warps wait), and
           // refill the stage the previous step read with the step kGemmStages - 1
           // ahead of this one.
           for (int64_t i = 0; i < std::min(kGemmStages, kSteps); ++i)
             issue(add(g0, idx(i)), idx(i), row0, weightRow0, col0);
           Value acc =
               loop(idx(0), idx(kSteps), idx(1),
                    ValueRange{nvgpu::WarpgroupMmaInitAccumulatorOp::create(b, accT(kGemmTileM))},
                    [&](Value k, ValueRange c) -> SmallVector<Value> {
                      Value g = add(g0, k);
                      waitPhase(s, s.full, stageOf(g), parityOf(g));
                      Value offset = stageOffset(s, g);
                      Value dA = descriptor(s.dynamic, offset,
                                            smem({kGemmTileM, kGemmTileK}, shape.inType), s.lhsMap);
                      Value dB = descriptor(s.dynamic, add(offset, idx(lhsBytes)),
                                            smem({kGemmTileK, kGemmTileN}, shape.inType), s.rhsMap);
                      // waitGroup 1: step k - 1's group is complete, this step's may run on.
                      Value d = nvgpu::WarpgroupMmaOp::create(b, accT(kGemmTileM), dA, dB,
                                                              b.getI64IntegerAttr(1), UnitAttr(),
                                                              b.getUnitAttr(), c[0]);
                      gpu::BarrierOp::create(b); // every warp is done with step k - 1's stage
                      Value next = add(k, idx(kGemmStages - 1));
                      when(andi(ult(idx(0), k), ult(next, idx(kSteps))), [&] {
                        issue(add(g, idx(kGemmStages - 1)), next, row0, weightRow0, col0);
                      });
                      return {d};
                    })[0];
           // The last group, before the accumulators are read.
           NVVM::WgmmaWaitGroupSyncOp::create(b, 0);

           // Epilogue: through shared memory (the ring is idle: every load was
           // consumed), 8 columns per thread and step, only the expert's rows.
           MemRefType accTile = smem({kGemmTileM, kGemmTileN}, b.getF32Type());
           Value staged = view(s.dynamic, s.pad, accTile);
           nvgpu::WarpgroupMmaStoreOp::create(b, acc, staged);
           gpu::BarrierOp::create(b);
           const int64_t outBytes = shape.outType.getIntOrFloatBitWidth() / 8;
           auto chunkF32 = VectorType::get({8}, b.getF32Type());
           auto chunkOut = VectorType::get({8}, shape.outType);
           constexpr int64_t chunksPerRow = kGemmTileN / 8;
           for (int64_t it = 0; it < kGemmTileM * chunksPerRow / kGemmThreads; ++it) {
             Value chunk = add(idx(it * kGemmThreads), s.tid);
             Value r = divu(chunk, idx(chunksPerRow));
             Value c = mul(remu(chunk, idx(chunksPerRow)), idx(8));
             Value v = vector::LoadOp::create(b, chunkF32, staged, ValueRange{r, c});
             if (shape.outType != b.getF32Type())
               v = arith::TruncFOp::create(b, chunkOut, v);
             Value row = add(row0, r);
             when(ult(row, end), [&] {
               Value element = add(mul(row, idx(shape.n)), add(col0, c));
               Value at = gep(s.out, i64(mul(element, idx(outBytes))));
               LLVM::StoreOp::create(b, v, at, 16);
             });
           }
           if (shape.tileDone >= 0) {
             // Every tile of the expert waited on all its row tiles' counters: the
             // expert's last tile (counted in its first row tile's slot) resets them.
             when(s.leader, [&] {
               Value consumed = tileCounter(shape.tileConsumed, idx(0));
               Value one = arith::ConstantIntOp::create(b, 1, 32);
               Value before = comm::AtomicRMWOp::create(b, b.getI32Type(), comm::AtomicKind::add,
                                                        comm::Ordering::relaxed, comm::Scope::gpu,
                                                        one, consumed);
               Value tiles = i32(mul(t.rowTiles, idx(nTiles)));
               when(eq(before, arith::SubIOp::create(b, tiles, one)), [&] {
                 Value zero = arith::ConstantIntOp::create(b, 0, 32);
                 loop(idx(0), t.rowTiles, idx(1), ValueRange{}, [&](Value m, ValueRange) {
                   LLVM::StoreOp::create(b, zero, tileCounter(shape.tileDone, m), 4);
                   return SmallVector<Value>{};
                 });
                 LLVM::StoreOp::create(b, zero, consumed, 4);
               });
             });
           }
           gpu::BarrierOp::create(b);
           if (shape.afterTile) // every thread's stores of the tile are done
             shape.afterTile(b, t.expert, t.rowTile);
           // The next tile's TMA writes (async proxy) follow these generic accesses.
           NVVM::FenceProxyOp::create(
               b, NVVM::ProxyKind::async_shared,
               NVVM::SharedSpaceAttr::get(ctx, NVVM::SharedSpace::shared_cta));
           return {add(g0, idx(kSteps))};
         });
  }
};

} // namespace

void epic::detail::buildGroupedGemmKernel(gpu::GPUFuncOp func, const GroupedGemmShape &shape) {
  ImplicitLocOpBuilder b(func.getLoc(), func.getContext());
  b.setInsertionPoint(func.getBody().front().getTerminator());
  if (isFp8Gemm(shape))
    return buildFp8GroupedGemm(b, func, shape);
  Bf16Gemm(b, shape).build(func);
}
