//===- GroupedGemmFp8.cpp - ep.grouped_gemm's warp-specialized FP8 kernel -===//
//
// The FP8 grouped GEMM (e4m3 rows with a scale per 128 channels, e4m3 weights
// [L, N, hidden] with a scale per 128 x 128 block, fp32 sums, BF16/F16/F32
// results), persistent over the same tiles as the BF16 kernel (GemmBuilder's
// walk) with 128 x 128 output tiles and K steps of 128 (one scale block):
//
//   * the producer (thread 0 of the block's last warpgroup, which gives its
//     registers to the consumers with setmaxnreg) walks the tiles and,
//     step after step, waits for the stage's `empty` barrier, arms its `full`
//     barrier with the stage's bytes and issues two TMA loads: the 128 x 128
//     lhs box, the 128 x 128 weight box (N rows, K contiguous);
//   * consumer warpgroup w (w = 0, 1) owns rows 64w..64w+63 of the tile: per
//     step it waits for `full`, issues four m64n128k32 wgmma as one group into
//     fresh partial sums (the weight tile is shared by both warpgroups; the
//     descriptors are stage 0's plus an offset), waits for them,
//     arrives on `empty` (the stage may be refilled), and then adds the sums
//     times the rows' and the weight block's scales into its totals (the
//     promotion, DeepSeek's fp32 accumulation of FP8 products) while the other
//     warpgroup's MMAs run;
//   * a warpgroup whose 64 rows are all past its expert's (a decode-sized
//     expert of up to 64 rows) skips its MMAs and keeps the ring's rhythm;
//   * epilogue: each thread stores its fragment's column pairs of the rows
//     that belong to the expert straight from registers, converted to the
//     result type (no shared memory: the producer is already filling the ring
//     with the next tile).
//
// No block-wide barrier after the setup: the warpgroups and the producer meet
// only at the stages' barriers. Step g (counted over all tiles of the block)
// uses stage g % kFp8Stages in lap g / kFp8Stages; `full` is waited on with
// the lap's parity, `empty` with the opposite one (a fresh barrier's previous
// phase counts as complete: the first lap's stages are free).
//
//===----------------------------------------------------------------------===//

#include "GemmBuilder.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace epic::detail;

namespace {

constexpr int64_t kConsumerThreads = kFp8ConsumerWarpgroups * 128;
constexpr int64_t kWgmmaK = 32;                      ///< bytes of K per FP8 wgmma
constexpr int64_t kFragment = 64 * kGemmTileN / 128; ///< f32 sums a consumer thread holds

struct Fp8Gemm : GemmBuilder {
  Fp8Gemm(ImplicitLocOpBuilder &b, const GroupedGemmShape &shape)
      : GemmBuilder(b, shape, {kFp8TileM, kFp8Stages, kFp8StageBytes}) {}

  const int64_t kSteps = shape.hidden / kFp8TileK;
  const int64_t kBlocks = shape.hidden / kFp8ScaleBlock;
  static constexpr int64_t kLhsBytes = kFp8TileM * kFp8TileK;

  void build(gpu::GPUFuncOp func) {
    Value empty;
    Setup s = begin(func, {kFp8TileM, kFp8TileK}, {kGemmTileN, kFp8TileK}, [&](const Setup &s) {
      // A stage is free again once every consumer thread's MMAs are done with it.
      empty = nvgpu::MBarrierCreateOp::create(b, barriersT());
      for (int64_t stage = 0; stage < kFp8Stages; ++stage)
        nvgpu::MBarrierInitOp::create(b, empty, idx(kConsumerThreads), idx(stage), s.leader);
    });
    Value total = totalTiles(s.psum);
    // The register file is split per warpgroup (setmaxnreg): the producer's
    // few registers go to the consumers' partial and total sums.
    auto setMaxRegisters = [&](int64_t count, NVVM::SetMaxRegisterAction action) {
      NVVM::SetMaxRegisterOp::create(b, b.getI32IntegerAttr(count),
                                     NVVM::SetMaxRegisterActionAttr::get(ctx, action));
    };
    ifElse(
        ult(s.tid, idx(kConsumerThreads)),
        [&] {
          setMaxRegisters(kFp8ConsumerRegisters, NVVM::SetMaxRegisterAction::increase);
          consume(s, empty, total);
          if (shape.restoreRegisters) {
            setMaxRegisters(kFp8EvenRegisters, NVVM::SetMaxRegisterAction::decrease);
            // Theirs are back in the pool: the producer warpgroup may take its own back.
            NVVM::BarrierArriveOp::create(b, i32(idx(kFp8RegisterBarrier)), i32(idx(kFp8Threads)));
          }
        },
        [&] {
          setMaxRegisters(kFp8ProducerRegisters, NVVM::SetMaxRegisterAction::decrease);
          when(eq(s.tid, idx(kConsumerThreads)), [&] { produce(s, empty, total); });
          if (shape.restoreRegisters) {
            // Only once the consumers have given theirs back. setmaxnreg takes from the
            // block's pool whatever is there, and the warps of this warpgroup that issue
            // no load get here at once: where they took their registers back before the
            // consumers' increase, the pool was short, the consumers waited in setmaxnreg
            // (unbounded, unreported) and the producer for a stage they never freed: the
            // persistent layer's stall, about one call of ten on a staged world of 8.
            NVVM::BarrierOp::create(b, TypeRange{}, i32(idx(kFp8RegisterBarrier)),
                                    i32(idx(kFp8Threads)), {}, Value());
            setMaxRegisters(kFp8EvenRegisters, NVVM::SetMaxRegisterAction::increase);
          }
        });
  }

  /// The ring position of a step: its stage and the parity of its lap,
  /// carried from step to step (a modulo and a division by kFp8Stages, on
  /// 64-bit indices, per step and thread cost more than the step's MMA issue).
  struct Ring {
    Value stage, parity;
  };
  Ring next(Ring r) {
    Value following = add(r.stage, idx(1));
    Value wrap = eq(following, idx(kFp8Stages));
    return {select(wrap, idx(0), following), arith::XOrIOp::create(b, r.parity, wrap)};
  }

  /// The tile loop every role runs: block b takes tiles b, b + B, ...; `body`
  /// gets the tile and the ring position of its first step, and returns the
  /// position after its last.
  void forEachTile(const Setup &s, Value total,
                   function_ref<SmallVector<Value>(const Tile &, Ring)> body) {
    loop(s.block, total, s.blocks, ValueRange{idx(0), arith::ConstantIntOp::create(b, 0, 1)},
         [&](Value tileIndex, ValueRange carried) -> SmallVector<Value> {
           return body(locate(s.psum, tileIndex), {carried[0], carried[1]});
         });
  }

  void produce(const Setup &s, Value empty, Value total) {
    forEachTile(s, total, [&](const Tile &t, Ring first) {
      Value weightRow0 = add(mul(t.expert, idx(shape.n)), t.col0); // [L * N, hidden]
      ValueRange last =
          loop(idx(0), idx(kSteps), idx(1), ValueRange{first.stage, first.parity},
               [&](Value k, ValueRange c) -> SmallVector<Value> {
                 Ring at{c[0], c[1]};
                 // The stage's previous lap must have been consumed (a fresh barrier's
                 // previous phase counts as complete: the first lap's stages are free).
                 Value free =
                     arith::XOrIOp::create(b, at.parity, arith::ConstantIntOp::create(b, 1, 1));
                 waitPhase(s, empty, at.stage, free);
                 Value offset = stageAt(s, at.stage);
                 nvgpu::MBarrierArriveExpectTxOp::create(b, s.full, idx(kFp8StageBytes), at.stage,
                                                         Value());
                 Value kCol = mul(k, idx(kFp8TileK));
                 nvgpu::TmaAsyncLoadOp::create(
                     b, view(s.dynamic, offset, smem({kFp8TileM, kFp8TileK}, shape.inType)), s.full,
                     s.lhsMap, ValueRange{kCol, t.row0}, at.stage, Value(), Value());
                 nvgpu::TmaAsyncLoadOp::create(b,
                                               view(s.dynamic, add(offset, idx(kLhsBytes)),
                                                    smem({kGemmTileN, kFp8TileK}, shape.inType)),
                                               s.full, s.rhsMap, ValueRange{kCol, weightRow0},
                                               at.stage, Value(), Value());
                 Ring following = next(at);
                 return {following.stage, following.parity};
               });
      return SmallVector<Value>{last[0], last[1]};
    });
  }

  void consume(const Setup &s, Value empty, Value total) {
    Type f32 = b.getF32Type();
    Value xScales = field(s.record, shape.xScalesField, ptrT());
    Value wScales = field(s.record, shape.weightScalesField, ptrT());
    Value numRows = arith::IndexCastUIOp::create(
        b, b.getIndexType(), field(s.record, shape.numRowsField, b.getI64Type()));
    // The warpgroup's rows of the tile, and the thread's two rows of its m64
    // accumulator fragment: warp w of the warpgroup holds rows 16w..16w+15,
    // lane l rows l/4 and l/4 + 8 (element i: row + 8 if bit 1 of i), columns
    // 8 (i / 4) + 2 (l % 4) + i % 2.
    Value warpgroup = divu(s.tid, idx(128));
    Value lane = remu(s.tid, idx(32));
    Value fragmentRow = add(mul(remu(divu(s.tid, idx(32)), idx(4)), idx(16)), divu(lane, idx(4)));
    Value fragmentCol = mul(remu(lane, idx(4)), idx(2));
    // The wgmma descriptors of stage 0's first k32 slice (the warpgroup's 64
    // rows of the lhs box: 64 x 128 bytes further, whole 1024-byte swizzle
    // atoms; the weight box): a step's are these plus its stage's and slice's
    // offset (the descriptor's address field counts 16 bytes).
    auto raw = [&](Value desc) {
      return UnrealizedConversionCastOp::create(b, b.getI64Type(), desc).getResult(0);
    };
    Value lhsDesc = raw(descriptor(s.dynamic, add(s.pad, mul(warpgroup, idx(64 * kFp8TileK))),
                                   smem({64, kWgmmaK}, shape.inType), s.lhsMap));
    Value rhsDesc = raw(descriptor(s.dynamic, add(s.pad, idx(kLhsBytes)),
                                   smem({kWgmmaK, kGemmTileN}, shape.inType), s.rhsMap));
    auto loadF32 = [&](Value base, Value element) {
      return Value(LLVM::LoadOp::create(b, f32, gep(base, i64(mul(element, idx(4)))), 4));
    };
    // A thread's fragment of the warpgroup's 64 x 128 sums, as NVVM's wgmma
    // takes and returns it.
    Value zeros = LLVM::ZeroOp::create(
        b, LLVM::LLVMStructType::getLiteral(ctx, SmallVector<Type>(kFragment, f32)));

    forEachTile(s, total, [&](const Tile &t, Ring first) {
      Value rows0 = add(t.row0, mul(warpgroup, idx(64)));
      // Warpgroup-uniform: whether any of the warpgroup's rows is the expert's.
      Value active = ult(rows0, t.end);
      // A row past the lhs (TMA's zero fill) reads row 0's scale: its sums are 0 and dropped.
      auto rowScales = [&](Value r) {
        Value row = add(rows0, r);
        return select(ult(row, numRows), mul(row, idx(kBlocks)), idx(0));
      };
      Value scaleRow0 = rowScales(fragmentRow), scaleRow8 = rowScales(add(fragmentRow, idx(8)));
      Value weightScales =
          mul(add(mul(t.expert, idx(shape.n / kFp8ScaleBlock)), divu(t.col0, idx(kFp8ScaleBlock))),
              idx(kBlocks));
      // The scales of step k are loaded during step k - 1 (carried): a load issued at
      // the top of its own step stalled the step on the global memory latency.
      auto scalesOf = [&](Value k) -> SmallVector<Value> {
        return {loadF32(xScales, add(scaleRow0, k)), loadF32(xScales, add(scaleRow8, k)),
                loadF32(wScales, add(weightScales, k))};
      };
      SmallVector<Value> init{zeros, first.stage, first.parity};
      llvm::append_range(init, scalesOf(idx(0)));
      ValueRange steps =
          loop(idx(0), idx(kSteps), idx(1), init, [&](Value k, ValueRange c) -> SmallVector<Value> {
            Ring at{c[1], c[2]};
            Value following = add(k, idx(1));
            SmallVector<Value> ahead = scalesOf(select(ult(following, idx(kSteps)), following, k));
            waitPhase(s, s.full, at.stage, at.parity);
            Value totals = step(empty, at.stage, lhsDesc, rhsDesc, active, c[0], c[3], c[4], c[5]);
            Ring after = next(at);
            SmallVector<Value> carried{totals, after.stage, after.parity};
            llvm::append_range(carried, ahead);
            return carried;
          });
      when(active, [&] { storeRows(s, t, steps[0], add(rows0, fragmentRow), fragmentCol); });
      return SmallVector<Value>{steps[1], steps[2]};
    });
  }

  /// One K step of the warpgroup's 64 rows in `stage`: four k32 wgmma into
  /// fresh partial sums (the first one's scale-d 0), issued back to back and
  /// committed as one group, the stage freed once they are complete, then the
  /// promotion into `totals`. A warpgroup that is not `active` only frees the
  /// stage. Returns the new totals. (NVVM's wgmma, not NVGPU's warpgroup.mma:
  /// that one commits and waits after every MMA, which kept a warpgroup from
  /// queueing its next MMA while the previous one ran.)
  Value step(Value empty, Value stage, Value lhsDesc, Value rhsDesc, Value active, Value totals,
             Value x0, Value x8, Value w) {
    auto op = scf::IfOp::create(b, TypeRange{totals.getType()}, active, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.thenBlock());
    Value stageDelta = i64(mul(stage, idx(kFp8StageBytes / 16)));
    auto at = [&](Value desc, int64_t kk) -> Value {
      return arith::AddIOp::create(
          b, desc,
          arith::AddIOp::create(b, stageDelta,
                                arith::ConstantIntOp::create(b, kk * kWgmmaK / 16, 64)));
    };
    NVVM::WgmmaFenceAlignedOp::create(b);
    // Read by none (the first MMA's scale-d is 0): not the totals, whose
    // registers would be copied for it.
    Value partial = LLVM::UndefOp::create(b, totals.getType());
    for (int64_t kk = 0; kk < kFp8TileK / kWgmmaK; ++kk)
      // K-major boxes with a 128-byte swizzle: the next 32 channels start 32
      // bytes further into each row.
      partial = NVVM::WgmmaMmaAsyncOp::create(
          b, totals.getType(), partial, at(lhsDesc, kk), at(rhsDesc, kk),
          NVVM::MMAShapeAttr::get(ctx, 64, kGemmTileN, kWgmmaK), NVVM::WGMMATypes::e4m3,
          NVVM::WGMMATypes::e4m3, NVVM::WGMMATypes::f32,
          kk == 0 ? NVVM::WGMMAScaleOut::zero : NVVM::WGMMAScaleOut::one, NVVM::WGMMAScaleIn::one,
          NVVM::WGMMAScaleIn::one, NVVM::MMALayout::row, NVVM::MMALayout::col,
          NVVM::MMAIntOverflowAttr());
    NVVM::WgmmaGroupSyncAlignedOp::create(b);
    NVVM::WgmmaWaitGroupSyncOp::create(b, 0); // the step's sums, before the stage is freed
    nvgpu::MBarrierArriveOp::create(b, empty, stage);
    scf::YieldOp::create(b, promote(partial, totals, x0, x8, w));
    b.setInsertionPointToStart(op.elseBlock());
    nvgpu::MBarrierArriveOp::create(b, empty, stage);
    scf::YieldOp::create(b, totals);
    return op.getResult(0);
  }

  /// totals[r, c] += partial[r, c] * x_scale[row, k] * w_scale[e, col0 / 128, k].
  Value promote(Value partial, Value totals, Value x0, Value x8, Value w) {
    Value s0 = LLVM::FMulOp::create(b, x0, w);
    Value s8 = LLVM::FMulOp::create(b, x8, w);
    Value next = totals;
    for (int64_t i = 0; i < kFragment; ++i) {
      Value p = LLVM::ExtractValueOp::create(b, partial, i);
      Value t = LLVM::ExtractValueOp::create(b, next, i);
      Value sum = LLVM::FMAOp::create(b, p, (i >> 1) & 1 ? s8 : s0, t);
      next = LLVM::InsertValueOp::create(b, next, sum, i);
    }
    return next;
  }

  /// The thread's fragment (`sums`, rows `row` and `row + 8`) as column pairs
  /// of the result type, the rows of the tile's expert only.
  void storeRows(const Setup &s, const Tile &t, Value sums, Value row, Value fragmentCol) {
    const int64_t outBytes = shape.outType.getIntOrFloatBitWidth() / 8;
    auto pairF32 = VectorType::get({2}, b.getF32Type());
    auto pairOut = VectorType::get({2}, shape.outType);
    for (int64_t half = 0; half < 2; ++half) {
      Value r = add(row, idx(8 * half));
      when(ult(r, t.end), [&] {
        Value rowStart = add(mul(r, idx(shape.n)), add(t.col0, fragmentCol));
        for (int64_t group = 0; group < kGemmTileN / 8; ++group) {
          int64_t i = 4 * group + 2 * half;
          Value v = vector::FromElementsOp::create(
              b, pairF32,
              ValueRange{LLVM::ExtractValueOp::create(b, sums, i),
                         LLVM::ExtractValueOp::create(b, sums, i + 1)});
          if (shape.outType != b.getF32Type())
            v = arith::TruncFOp::create(b, pairOut, v);
          Value element = add(rowStart, idx(8 * group));
          LLVM::StoreOp::create(b, v, gep(s.out, i64(mul(element, idx(outBytes)))), 2 * outBytes);
        }
      });
    }
  }
};

} // namespace

void epic::detail::buildFp8GroupedGemm(ImplicitLocOpBuilder &b, gpu::GPUFuncOp func,
                                       const GroupedGemmShape &shape) {
  Fp8Gemm(b, shape).build(func);
}
