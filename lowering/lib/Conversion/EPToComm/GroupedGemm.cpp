//===- GroupedGemm.cpp - ep.grouped_gemm's Hopper kernel -------------------===//
//
// A persistent grouped GEMM over a dispatch's expanded layout:
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

#include "ArithBuilder.h"

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
  // FP8: lhs [num_rows, hidden] in 64-row boxes, weights as [L * N, hidden]
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

namespace {

struct GemmBuilder : epic::expand::ArithBuilder<GemmBuilder> {
  ImplicitLocOpBuilder &b;
  const GroupedGemmShape &shape;
  MLIRContext *ctx;
  Attribute workgroup;

  /// The tiling of the kernel's element type (see GroupedGemm.h).
  const bool fp8;
  const int64_t tileM, tileK, stages, stageBytes;

  GemmBuilder(ImplicitLocOpBuilder &b, const GroupedGemmShape &shape)
      : b(b), shape(shape), ctx(b.getContext()),
        workgroup(gpu::AddressSpaceAttr::get(b.getContext(), gpu::AddressSpace::Workgroup)),
        fp8(isFp8Gemm(shape)), tileM(fp8 ? kFp8TileM : kGemmTileM),
        tileK(fp8 ? kFp8TileK : kGemmTileK), stages(fp8 ? kFp8Stages : kGemmStages),
        stageBytes(fp8 ? kFp8StageBytes : kGemmStageBytes) {}

  // --- index arithmetic -----------------------------------------------------
  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, v); }
  /// Rounds `x` up to a multiple of `a`.
  Value alignUp(Value x, int64_t a) {
    return a == 1 ? x : mul(divu(add(x, idx(a - 1)), idx(a)), idx(a));
  }
  Value ceilDiv(Value x, int64_t d) { return divu(add(x, idx(d - 1)), idx(d)); }

  // --- types ----------------------------------------------------------------
  Type ptrT(unsigned space = 1) { return LLVM::LLVMPointerType::get(ctx, space); }
  MemRefType smem(ArrayRef<int64_t> shape, Type element) {
    return MemRefType::get(shape, element, MemRefLayoutAttrInterface(), workgroup);
  }
  nvgpu::MBarrierGroupType barriersT() {
    return nvgpu::MBarrierGroupType::get(ctx, workgroup, stages);
  }
  /// A tensor map of `box` boxes (bf16: 64 x 64 for both operands).
  nvgpu::TensorMapDescriptorType mapT(ArrayRef<int64_t> box = {64, 64}) {
    return nvgpu::TensorMapDescriptorType::get(
        ctx, smemSpaceless(smem(box, shape.inType)), nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
        nvgpu::TensorMapL2PromoKind::L2PROMO_NONE, nvgpu::TensorMapOOBKind::OOB_ZERO,
        nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
  }
  nvgpu::WarpgroupAccumulatorType accT() {
    return nvgpu::WarpgroupAccumulatorType::get(
        ctx, VectorType::get({tileM, kGemmTileN}, b.getF32Type()));
  }
  /// The accumulators of one warpgroup.mma as convert-nvgpu-to-nvvm lowers them: a
  /// struct of 64 floats a thread per m64 row block (the FP8 promotion reads them).
  LLVM::LLVMStructType accStructT() {
    SmallVector<Type> floats(tileM * kGemmTileN / kGemmThreads, b.getF32Type());
    return LLVM::LLVMStructType::getLiteral(
        ctx, SmallVector<Type>(tileM / 64, LLVM::LLVMStructType::getLiteral(ctx, floats)));
  }

  // --- memory ---------------------------------------------------------------
  Value gep(Value base, Value bytes) {
    return LLVM::GEPOp::create(b, base.getType(), b.getI8Type(), base, ValueRange{bytes});
  }
  Value i64(Value index) { return arith::IndexCastOp::create(b, b.getI64Type(), index); }
  Value field(Value record, int64_t index, Type type) {
    Value at = gep(record, i64(idx(index * 8)));
    return LLVM::LoadOp::create(b, type, at, 8);
  }
  /// A typed view of `bytes` of dynamic shared memory at `offset`.
  Value view(Value dynamic, Value offset, MemRefType type) {
    return memref::ViewOp::create(b, type, dynamic, offset, ValueRange{});
  }

  // --- control flow ---------------------------------------------------------
  /// for (iv = lb; iv < ub; iv += step) with carried values (maybe none);
  /// `body` returns the next values.
  ValueRange loop(Value lb, Value ub, Value step, ValueRange init,
                  function_ref<SmallVector<Value>(Value, ValueRange)> body) {
    auto op = scf::ForOp::create(b, lb, ub, step, init);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    SmallVector<Value> next = body(op.getInductionVar(), op.getRegionIterArgs());
    if (init.empty()) // the builder made the body's (empty) yield already
      return op.getResults();
    scf::YieldOp::create(b, next);
    return op.getResults();
  }

  void build(gpu::GPUFuncOp func) {
    const int64_t kSteps = shape.hidden / tileK;
    const int64_t nTiles = shape.n / kGemmTileN;
    const int64_t L = shape.localExperts;
    Value comm = func.getArgument(0), window = func.getArgument(1), table = func.getArgument(2);

    Value record = comm::RankParamsOp::create(b, table, shape.paramStride, comm);
    Value out = field(record, shape.outField, ptrT());
    Value psum = field(record, shape.psumField, ptrT());
    // The runtime encodes the two descriptors into the record, 128 bytes apart
    // (epic.tensor_maps): the TMA reads them where they lie, in the kernel's
    // parameter space (generic addresses of a grid-constant parameter).
    Value maps = gep(record, i64(idx(shape.mapsOffset)));
    nvgpu::TensorMapDescriptorType lhsMapT = fp8 ? mapT({kFp8TileM, kFp8TileK}) : mapT();
    nvgpu::TensorMapDescriptorType rhsMapT = fp8 ? mapT({kGemmTileN, kFp8TileK}) : mapT();
    Value lhsMap = UnrealizedConversionCastOp::create(b, lhsMapT, maps).getResult(0);
    Value rhsMap =
        UnrealizedConversionCastOp::create(b, rhsMapT, gep(maps, i64(idx(128)))).getResult(0);

    Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
    Value block = gpu::BlockIdOp::create(b, gpu::Dimension::x);
    Value blocks = gpu::GridDimOp::create(b, gpu::Dimension::x);
    Value leader = arith::CmpIOp::create(b, arith::CmpIPredicate::eq, tid, idx(0));

    // Stages start on a 1024-byte boundary (128-byte swizzle atoms).
    Value dynamic = gpu::DynamicSharedMemoryOp::create(
        b, MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), MemRefLayoutAttrInterface(),
                           workgroup));
    Value address = memref::ExtractAlignedPointerAsIndexOp::create(b, dynamic);
    Value pad = remu(sub(idx(1024), remu(address, idx(1024))), idx(1024));

    Value bars = nvgpu::MBarrierCreateOp::create(b, barriersT());
    for (int64_t s = 0; s < stages; ++s)
      nvgpu::MBarrierInitOp::create(b, bars, idx(1), idx(s), leader);
    nvgpu::TmaPrefetchOp::create(b, lhsMap, leader);
    nvgpu::TmaPrefetchOp::create(b, rhsMap, leader);
    gpu::BarrierOp::create(b);

    // The expert of a row range: [alignUp(psum[e - 1]), psum[e]).
    auto expertEnd = [&](Value e) {
      Value at = gep(psum, i64(mul(e, idx(4))));
      Value end = LLVM::LoadOp::create(b, b.getI32Type(), at, 4);
      return Value(arith::IndexCastUIOp::create(b, b.getIndexType(), end));
    };
    auto tilesOf = [&](Value start, Value end) {
      return mul(ceilDiv(sub(end, start), tileM), idx(nTiles));
    };
    // Total tiles of this rank.
    Value total = loop(idx(0), idx(L), idx(1), ValueRange{idx(0), idx(0)},
                       [&](Value e, ValueRange carried) -> SmallVector<Value> {
                         Value start = alignUp(carried[1], shape.alignment);
                         Value end = expertEnd(e);
                         return {add(carried[0], tilesOf(start, end)), end};
                       })[0];

    auto stageOffset = [&](Value step) {
      return add(pad, mul(remu(step, idx(stages)), idx(stageBytes)));
    };
    const int64_t inBytes = shape.inType.getIntOrFloatBitWidth() / 8;
    const int64_t lhsBytes = tileM * tileK * inBytes, boxBytes = 64 * 64 * 2;
    // Thread 0 loads step `k` of a tile into the stage of global step `g`.
    auto issue = [&](Value g, Value k, Value row0, Value weightRow0, Value col0) {
      Value stage = remu(g, idx(stages));
      Value offset = stageOffset(g);
      nvgpu::MBarrierArriveExpectTxOp::create(b, bars, idx(stageBytes), stage, leader);
      Value kCol = mul(k, idx(tileK));
      if (fp8) { // one box each; the weights' rows are the expert's N rows
        nvgpu::TmaAsyncLoadOp::create(b, view(dynamic, offset, smem({tileM, tileK}, shape.inType)),
                                      bars, lhsMap, ValueRange{kCol, row0}, stage, Value(), leader);
        nvgpu::TmaAsyncLoadOp::create(
            b, view(dynamic, add(offset, idx(lhsBytes)), smem({kGemmTileN, tileK}, shape.inType)),
            bars, rhsMap, ValueRange{kCol, add(weightRow0, col0)}, stage, Value(), leader);
        return;
      }
      MemRefType box = smem({64, 64}, shape.inType);
      for (int64_t rows = 0; rows < tileM / 64; ++rows)
        nvgpu::TmaAsyncLoadOp::create(b, view(dynamic, add(offset, idx(rows * boxBytes)), box),
                                      bars, lhsMap, ValueRange{kCol, add(row0, idx(rows * 64))},
                                      stage, Value(), leader);
      Value wRow = add(weightRow0, kCol);
      for (int64_t half = 0; half < kGemmTileN / 64; ++half)
        nvgpu::TmaAsyncLoadOp::create(
            b, view(dynamic, add(offset, idx(lhsBytes + half * boxBytes)), box), bars, rhsMap,
            ValueRange{add(col0, idx(half * 64)), wRow}, stage, Value(), leader);
    };

    // The rank's last `commBlocks` blocks take no tile: the others share them.
    Value tileBlocks = blocks, first = block;
    if (shape.commBlocks > 0) {
      tileBlocks = sub(blocks, idx(shape.commBlocks));
      first = select(ult(block, tileBlocks), block, total);
    }
    loop(
        first, total, tileBlocks, ValueRange{idx(0)},
        [&](Value tile, ValueRange carried) -> SmallVector<Value> {
          Value g0 = carried[0];
          // The tile's expert: scan the experts' tile counts. Carried: tiles
          // before e, the previous expert's end, then the chosen expert, its start,
          // its end and the tiles before it.
          ValueRange found = loop(idx(0), idx(L), idx(1),
                                  ValueRange{idx(0), idx(0), idx(0), idx(0), idx(0), idx(0)},
                                  [&](Value e, ValueRange c) -> SmallVector<Value> {
                                    Value start = alignUp(c[1], shape.alignment);
                                    Value end = expertEnd(e);
                                    Value after = add(c[0], tilesOf(start, end));
                                    Value mine = andi(ule(c[0], tile), ult(tile, after));
                                    return {after,
                                            end,
                                            select(mine, e, c[2]),
                                            select(mine, start, c[3]),
                                            select(mine, end, c[4]),
                                            select(mine, c[0], c[5])};
                                  });
          Value expert = found[2], start = found[3], end = found[4];
          // Column tile major within the expert: the blocks working at once share
          // a weight column tile (read from memory once, then from L2) across the
          // expert's row tiles; the weights are most of the bytes.
          Value local = sub(tile, found[5]);
          Value mTiles = ceilDiv(sub(end, start), tileM);
          Value mt = remu(local, mTiles);
          Value row0 = add(start, mul(mt, idx(tileM)));
          Value col0 = mul(divu(local, mTiles), idx(kGemmTileN));
          // The expert's first weight row: bf16 [hidden, N] matrices, FP8 [N, hidden].
          Value weightRow0 = mul(expert, idx(fp8 ? shape.n : shape.hidden));

          // Fused: wait until the copy role has placed every row of the tile's
          // expert, not only the tile's: the blocks on the row tiles that share a
          // weight column tile then start together and stream it through L2 once.
          // (Waiting per row tile let the first row tiles race ahead, so every
          // weight tile came from memory twice: L2 hits 34% instead of 49%, the
          // fused GEMM 1.45x slower on the H200.)
          auto tileCounter = [&](int64_t base, Value rowTile) {
            Value slot = add(mul(expert, idx(shape.maxTiles)), rowTile);
            return comm::LocalPtrOp::create(b, ptrT(), window,
                                            i64(add(idx(base), mul(slot, idx(4)))));
          };
          if (shape.tileDone >= 0) {
            when(leader, [&] {
              Value me = comm::TeamRankOp::create(
                  b, b.getI32Type(),
                  comm::TeamOp::create(b, comm::TeamType::get(ctx), comm::TeamKind::world, comm));
              loop(idx(0), mTiles, idx(1), ValueRange{}, [&](Value m, ValueRange) {
                Value left = sub(end, add(start, mul(m, idx(kGemmTileM))));
                Value rows = select(ult(left, idx(kGemmTileM)), left, idx(kGemmTileM));
                Value needed = arith::IndexCastOp::create(b, b.getI32Type(), rows);
                comm::WaitFlagOp::create(b, b.getI32Type(), tileCounter(shape.tileDone, m),
                                         comm::Predicate::ge, needed, me, Value(), comm::Scope::gpu,
                                         shape.timeoutMs);
                return SmallVector<Value>{};
              });
              // The rows were written by generic stores; TMA reads through the async proxy.
              NVVM::FenceProxyOp::create(b, NVVM::ProxyKind::async_global, NVVM::SharedSpaceAttr());
            });
            gpu::BarrierOp::create(b);
          }

          // Fill the ring, then: wait for a stage, multiply (one wgmma group stays
          // in flight: the tensor cores do not idle while the warps wait), and
          // refill the stage the previous step read with the step kGemmStages - 1
          // ahead of this one.
          for (int64_t i = 0; i < std::min(stages, kSteps); ++i)
            issue(add(g0, idx(i)), idx(i), row0, weightRow0, col0);
          auto waitStage = [&](Value g) {
            Value stage = remu(g, idx(stages));
            Value parity =
                arith::IndexCastOp::create(b, b.getI1Type(), remu(divu(g, idx(stages)), idx(2)));
            nvgpu::MBarrierTryWaitParityOp::create(b, bars, parity, idx(10000000), stage);
          };
          Value acc =
              fp8 ? fp8Steps(record, row0, col0, expert, g0, kSteps, dynamic, lhsMap, rhsMap,
                             waitStage, stageOffset,
                             [&](Value g, Value k) { issue(g, k, row0, weightRow0, col0); })
                  : loop(idx(0), idx(kSteps), idx(1),
                         ValueRange{nvgpu::WarpgroupMmaInitAccumulatorOp::create(b, accT())},
                         [&](Value k, ValueRange c) -> SmallVector<Value> {
                           Value g = add(g0, k);
                           waitStage(g);
                           Value offset = stageOffset(g);
                           MemRefType lhsTile = smem({kGemmTileM, kGemmTileK}, shape.inType);
                           MemRefType rhsTile = smem({kGemmTileK, kGemmTileN}, shape.inType);
                           Value dA = nvgpu::WarpgroupGenerateDescriptorOp::create(
                               b,
                               nvgpu::WarpgroupMatrixDescriptorType::get(ctx,
                                                                         smemSpaceless(lhsTile)),
                               view(dynamic, offset, lhsTile), lhsMap);
                           Value dB = nvgpu::WarpgroupGenerateDescriptorOp::create(
                               b,
                               nvgpu::WarpgroupMatrixDescriptorType::get(ctx,
                                                                         smemSpaceless(rhsTile)),
                               view(dynamic, add(offset, idx(lhsBytes)), rhsTile), rhsMap);
                           // waitGroup 1: step k - 1's group is complete, this step's may run on.
                           Value d = nvgpu::WarpgroupMmaOp::create(
                               b, accT(), dA, dB, b.getI64IntegerAttr(1), UnitAttr(),
                               b.getUnitAttr(), c[0]);
                           gpu::BarrierOp::create(b); // every warp is done with step k - 1's stage
                           Value next = add(k, idx(kGemmStages - 1));
                           when(andi(ult(idx(0), k), ult(next, idx(kSteps))), [&] {
                             issue(add(g, idx(kGemmStages - 1)), next, row0, weightRow0, col0);
                           });
                           return {d};
                         })[0];
          NVVM::WgmmaWaitGroupSyncOp::create(b,
                                             0); // the last group, before the accumulators are read

          // Epilogue: through shared memory (the ring is idle: every load was
          // consumed), 8 columns per thread and step, only the expert's rows.
          MemRefType accTile = smem({tileM, kGemmTileN}, b.getF32Type());
          Value staged = view(dynamic, pad, accTile);
          nvgpu::WarpgroupMmaStoreOp::create(b, acc, staged);
          gpu::BarrierOp::create(b);
          const int64_t outBytes = shape.outType.getIntOrFloatBitWidth() / 8;
          auto chunkF32 = VectorType::get({8}, b.getF32Type());
          auto chunkOut = VectorType::get({8}, shape.outType);
          constexpr int64_t chunksPerRow = kGemmTileN / 8;
          for (int64_t it = 0; it < tileM * chunksPerRow / kGemmThreads; ++it) {
            Value chunk = add(idx(it * kGemmThreads), tid);
            Value r = divu(chunk, idx(chunksPerRow));
            Value c = mul(remu(chunk, idx(chunksPerRow)), idx(8));
            Value v = vector::LoadOp::create(b, chunkF32, staged, ValueRange{r, c});
            if (shape.outType != b.getF32Type())
              v = arith::TruncFOp::create(b, chunkOut, v);
            Value row = add(row0, r);
            when(ult(row, end), [&] {
              Value element = add(mul(row, idx(shape.n)), add(col0, c));
              Value at = gep(out, i64(mul(element, idx(outBytes))));
              LLVM::StoreOp::create(b, v, at, 16);
            });
          }
          if (shape.tileDone >= 0) {
            // Every tile of the expert waited on all its row tiles' counters: the
            // expert's last tile (counted in its first row tile's slot) resets them.
            when(leader, [&] {
              Value consumed = tileCounter(shape.tileConsumed, idx(0));
              Value before = comm::AtomicRMWOp::create(
                  b, b.getI32Type(), comm::AtomicKind::add, comm::Ordering::relaxed,
                  comm::Scope::gpu, arith::ConstantIntOp::create(b, 1, 32), consumed);
              Value tiles = arith::IndexCastOp::create(b, b.getI32Type(), mul(mTiles, idx(nTiles)));
              Value last = arith::CmpIOp::create(
                  b, arith::CmpIPredicate::eq, before,
                  arith::SubIOp::create(b, tiles, arith::ConstantIntOp::create(b, 1, 32)));
              when(last, [&] {
                Value zero = arith::ConstantIntOp::create(b, 0, 32);
                loop(idx(0), mTiles, idx(1), ValueRange{}, [&](Value m, ValueRange) {
                  LLVM::StoreOp::create(b, zero, tileCounter(shape.tileDone, m), 4);
                  return SmallVector<Value>{};
                });
                LLVM::StoreOp::create(b, zero, consumed, 4);
              });
            });
          }
          gpu::BarrierOp::create(b);
          if (shape.afterTile) // every thread's stores of the tile are done
            shape.afterTile(b, expert, mt);
          // The next tile's TMA writes (async proxy) follow these generic accesses.
          NVVM::FenceProxyOp::create(
              b, NVVM::ProxyKind::async_shared,
              NVVM::SharedSpaceAttr::get(ctx, NVVM::SharedSpace::shared_cta));
          return {add(g0, idx(kSteps))};
        });
  }

  /// The FP8 tile's steps over K: per step (one scale block), four m64n128k32
  /// wgmma into zeroed partial sums, then the promotion
  ///   total[r, c] += partial[r, c] * x_scale[row0 + r, k] * w_scale[e, col0 / 128, k]
  /// on the registers; the stage is refilled with step k + stages once every
  /// warp's wgmma is done with it. Returns the totals as a warpgroup accumulator.
  Value fp8Steps(Value record, Value row0, Value col0, Value expert, Value g0, int64_t kSteps,
                 Value dynamic, Value lhsMap, Value rhsMap, function_ref<void(Value)> waitStage,
                 function_ref<Value(Value)> stageOffset,
                 function_ref<void(Value g, Value k)> issueStep) {
    Type f32 = b.getF32Type();
    Value xScales = field(record, shape.xScalesField, ptrT());
    Value wScales = field(record, shape.weightScalesField, ptrT());
    Value numRows = arith::IndexCastUIOp::create(b, b.getIndexType(),
                                                 field(record, shape.numRowsField, b.getI64Type()));
    const int64_t kBlocks = shape.hidden / kFp8ScaleBlock;
    // The thread's two rows of the m64 accumulator fragment: warp w holds rows
    // 16w..16w+15, lane l rows l/4 and l/4 + 8 (element i: row + 8 if bit 1 of i).
    Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
    Value fragmentRow = add(mul(divu(tid, idx(32)), idx(16)), divu(remu(tid, idx(32)), idx(4)));
    // A row past the lhs (TMA's zero fill) reads row 0's scale: its sums are 0 and dropped.
    auto rowScales = [&](Value r) {
      Value row = add(row0, r);
      return select(ult(row, numRows), mul(row, idx(kBlocks)), idx(0));
    };
    Value scaleRow0 = rowScales(fragmentRow), scaleRow8 = rowScales(add(fragmentRow, idx(8)));
    Value weightScales =
        mul(add(mul(expert, idx(shape.n / kFp8ScaleBlock)), divu(col0, idx(kFp8ScaleBlock))),
            idx(kBlocks));
    auto loadF32 = [&](Value base, Value element) {
      return Value(LLVM::LoadOp::create(b, f32, gep(base, i64(mul(element, idx(4)))), 4));
    };
    LLVM::LLVMStructType totalT = accStructT();
    auto asStruct = [&](Value acc) {
      return UnrealizedConversionCastOp::create(b, totalT, acc).getResult(0);
    };
    // The scales of step k are loaded during step k - 1 (carried): a load issued at
    // the top of its own step stalled the step on the global memory latency (the
    // product of the scales came before the stage wait and the MMAs in the issue
    // order), about 3,000 cycles a step on the H100 instead of about 500.
    auto scalesOf = [&](Value k) -> SmallVector<Value> {
      return {loadF32(xScales, add(scaleRow0, k)), loadF32(xScales, add(scaleRow8, k)),
              loadF32(wScales, add(weightScales, k))};
    };
    Value zero = nvgpu::WarpgroupMmaInitAccumulatorOp::create(b, accT());
    SmallVector<Value> init{asStruct(zero)};
    llvm::append_range(init, scalesOf(idx(0)));
    Value total =
        loop(idx(0), idx(kSteps), idx(1), init, [&](Value k, ValueRange c) -> SmallVector<Value> {
          Value g = add(g0, k);
          // The next step's scales (the last step reloads its own: no branch).
          Value following = add(k, idx(1));
          SmallVector<Value> ahead = scalesOf(select(ult(following, idx(kSteps)), following, k));
          waitStage(g);
          Value offset = stageOffset(g);
          constexpr int64_t kWgmmaK = 32; // bytes of K per FP8 wgmma
          MemRefType lhsK = smem({kFp8TileM, kWgmmaK}, shape.inType);
          MemRefType rhsK = smem({kWgmmaK, kGemmTileN}, shape.inType);
          const int64_t lhsBytes = kFp8TileM * kFp8TileK;
          Value partial = nvgpu::WarpgroupMmaInitAccumulatorOp::create(b, accT());
          for (int64_t kk = 0; kk < kFp8TileK / kWgmmaK; ++kk) {
            // K-major boxes with a 128-byte swizzle: the next 32 channels start 32
            // bytes further into each row (the descriptor's address).
            Value dA = nvgpu::WarpgroupGenerateDescriptorOp::create(
                b, nvgpu::WarpgroupMatrixDescriptorType::get(ctx, smemSpaceless(lhsK)),
                view(dynamic, add(offset, idx(kk * kWgmmaK)), lhsK), lhsMap);
            Value dB = nvgpu::WarpgroupGenerateDescriptorOp::create(
                b, nvgpu::WarpgroupMatrixDescriptorType::get(ctx, smemSpaceless(rhsK)),
                view(dynamic, add(offset, idx(lhsBytes + kk * kWgmmaK)), rhsK), rhsMap);
            partial = nvgpu::WarpgroupMmaOp::create(b, accT(), dA, dB, b.getI64IntegerAttr(1),
                                                    UnitAttr(), UnitAttr(), partial);
          }
          NVVM::WgmmaWaitGroupSyncOp::create(b, 0); // the step's sums, before they are read
          // The stage is free once every warp's MMAs are done: refill it before the
          // promotion, so that the TMA runs during it.
          gpu::BarrierOp::create(b);
          Value refill = add(k, idx(stages));
          when(ult(refill, idx(kSteps)), [&] { issueStep(add(g, idx(stages)), refill); });
          Value s0 = LLVM::FMulOp::create(b, c[1], c[3]);
          Value s8 = LLVM::FMulOp::create(b, c[2], c[3]);
          Value sums = asStruct(partial), next = c[0];
          const int64_t perThread = kFp8TileM * kGemmTileN / kGemmThreads;
          for (int64_t i = 0; i < perThread; ++i) {
            SmallVector<int64_t> at{0, i};
            Value p = LLVM::ExtractValueOp::create(b, sums, at);
            Value t = LLVM::ExtractValueOp::create(b, next, at);
            Value sum = LLVM::FMAOp::create(b, p, (i >> 1) & 1 ? s8 : s0, t);
            next = LLVM::InsertValueOp::create(b, next, sum, at);
          }
          SmallVector<Value> carried{next};
          llvm::append_range(carried, ahead);
          return carried;
        })[0];
    return UnrealizedConversionCastOp::create(b, accT(), total).getResult(0);
  }

  /// The descriptor types name the tile's shape in address space 3 (as the
  /// upstream NVGPU tests spell it).
  MemRefType smemSpaceless(MemRefType tile) {
    return MemRefType::get(tile.getShape(), tile.getElementType(), MemRefLayoutAttrInterface(),
                           IntegerAttr::get(IntegerType::get(ctx, 64), 3));
  }
};

} // namespace

void epic::detail::buildGroupedGemmKernel(gpu::GPUFuncOp func, const GroupedGemmShape &shape) {
  ImplicitLocOpBuilder b(func.getLoc(), func.getContext());
  b.setInsertionPoint(func.getBody().front().getTerminator());
  GemmBuilder(b, shape).build(func);
}
