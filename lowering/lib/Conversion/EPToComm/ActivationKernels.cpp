//===- ActivationKernels.cpp - ep.swiglu's kernel ---------------------------===//
//
// The activation between an expert MLP's two GEMMs: silu(gate) * up of the
// gate/up GEMM's rows, in f32, then rounded (BF16, F16, F32) or cast to FP8
// with DeepSeek's block scales, the rows the FP8 down GEMM reads. Half a warp
// per (row, 128-channel block): each lane loads 8 gate and 8 up channels (16
// bytes of BF16 each), and the FP8 cast's amax is a 16-lane butterfly, the
// same cast the low-latency dispatch fuses (castF32ToFp8). Expert by expert
// (the handle's prefix sums), so padding rows are never read: the grouped
// GEMM leaves them unwritten. A row's weight, where the record has weights (a
// MoE layer's routing weight, applied before the linear down GEMM), multiplies
// its activations before the cast. Nothing waits: no cooperative launch.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {

namespace {

/// e^x of each f32 lane as 2^(x log2 e) through PTX's ex2.approx.ftz (the
/// NVVM lowering of math.exp calls libdevice, which the pipeline does not
/// link; ex2.approx is a few ulp of f32, subnormal results flushed to 0).
Value exp(KernelBuilder &k, Value x) {
  auto type = cast<VectorType>(x.getType());
  Value log2e =
      arith::ConstantOp::create(k.b, type, DenseElementsAttr::get(type, 1.4426950408889634f));
  Value scaled = arith::MulFOp::create(k.b, x, log2e);
  Value result = scaled;
  for (int64_t i = 0; i < type.getNumElements(); ++i) {
    Value lane = vector::ExtractOp::create(k.b, scaled, i);
    auto ex2 = LLVM::InlineAsmOp::create(
        k.b, TypeRange{k.b.getF32Type()}, ValueRange{lane}, "ex2.approx.ftz.f32 $0, $1;", "=f,f",
        /*has_side_effects=*/false, /*is_align_stack=*/false,
        LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(), ArrayAttr());
    result = vector::InsertOp::create(k.b, ex2.getResult(0), result, i);
  }
  return result;
}

} // namespace

void buildSwiglu(gpu::GPUFuncOp func, const EPLayout &L, const SwigluShape &shape) {
  KernelBuilder k(func, L);
  constexpr int64_t block = 128, perLane = 8;
  const int64_t inter = shape.inter, blocks = inter / block;
  const int64_t inBytes = shape.inType.getIntOrFloatBitWidth() / 8;
  const int64_t outBytes = shape.outType.getIntOrFloatBitWidth() / 8;
  const bool fp8 = isa<Float8E4M3FNType>(shape.outType);
  auto f32x8 = VectorType::get({perLane}, k.b.getF32Type());
  auto inChunk = VectorType::get({perLane}, shape.inType);
  Value gateUp = k.pointerParam(kSGateUp), out = k.pointerParam(kSOut);
  Value scales = k.pointerParam(kSScales), psum = k.pointerParam(kSPsumPerExpert);
  Value weights = k.pointerParam(kSWeights);
  Value weighted = k.isGiven(weights);
  Value half = k.divu(k.lane, k.i32(16)), sub = k.remu(k.lane, k.i32(16));
  auto toF32 = [&](Value chunk) {
    return shape.inType.isF32() ? chunk : arith::ExtFOp::create(k.b, f32x8, chunk).getResult();
  };
  // The experts in turn, carrying the pairs of items before expert e: global
  // pair g goes to warp g mod numWarps, so at decode sizes (a few pairs an
  // expert) the warps work on many experts at once instead of every warp
  // waiting on each expert's round trip to memory in turn (32 experts of 32
  // rows took 42 us, latency-bound, where dealing them out takes a few).
  auto experts = scf::ForOp::create(k.b, k.i32(0), k.i32(L.local), k.i32(1), ValueRange{k.i32(0)});
  OpBuilder::InsertionGuard guard(k.b);
  k.b.setInsertionPointToStart(experts.getBody());
  {
    Value e = experts.getInductionVar(), before = experts.getRegionIterArgs()[0];
    // Expert e's rows: [align(psum[e - 1]), psum[e]), as the grouped GEMM's.
    Value end = k.loadI32(psum, e);
    Value previous = k.choose(
        k.eq(e, k.i32(0)), k.i32T(), [&] { return k.i32(0); },
        [&] { return k.loadI32(psum, k.sub(e, k.i32(1))); });
    Value start = k.alignUp(previous, L.alignment);
    Value rows = k.select(k.lt(start, end), k.sub(end, start), k.i32(0));
    Value items = k.mul(rows, k.i32(blocks));
    // Two items a warp: every lane takes part in the cast's shuffles, the
    // second half of an odd count's last pair redoing the last item unstored.
    Value pairs = k.divu(k.add(items, k.i32(1)), k.i32(2));
    Value first =
        k.remu(k.sub(k.add(k.globalWarp, k.numWarps), k.remu(before, k.numWarps)), k.numWarps);
    k.loop(first, pairs, k.numWarps, [&](Value pair) {
      Value item = k.add(k.mul(pair, k.i32(2)), half);
      Value valid = k.lt(item, items);
      item = k.select(valid, item, k.sub(items, k.i32(1)));
      Value row = k.add(start, k.divu(item, k.i32(blocks)));
      Value channel =
          k.add(k.mul(k.remu(item, k.i32(blocks)), k.i32(block)), k.mul(sub, k.i32(perLane)));
      Value inRow = k.at(gateUp, k.mul(k.wide(row), k.i64(2 * inter * inBytes)));
      Value gate = toF32(k.load(inChunk, k.at(inRow, k.mul(channel, k.i32(inBytes))), 16));
      Value up = toF32(
          k.load(inChunk, k.at(inRow, k.mul(k.add(channel, k.i32(inter)), k.i32(inBytes))), 16));
      // silu(g) * u = g / (1 + e^-g) * u
      auto ones = arith::ConstantOp::create(k.b, f32x8, DenseElementsAttr::get(f32x8, 1.0f));
      Value y = arith::MulFOp::create(
          k.b,
          arith::DivFOp::create(
              k.b, gate,
              arith::AddFOp::create(k.b, ones, exp(k, arith::NegFOp::create(k.b, gate)))),
          up);
      // The row's weight (1 without weights): a uniform branch, one load per item.
      Value weight = k.choose(
          weighted, k.b.getF32Type(),
          [&] { return k.load(k.b.getF32Type(), k.at(weights, k.mul(k.wide(row), k.i64(4))), 4); },
          [&] { return Value(arith::ConstantOp::create(k.b, k.b.getF32FloatAttr(1.0f))); });
      y = arith::MulFOp::create(k.b, y, vector::BroadcastOp::create(k.b, f32x8, weight));
      Value outRow = k.at(out, k.mul(k.wide(row), k.i64(inter * outBytes)));
      Value dst = k.at(outRow, k.mul(channel, k.i32(outBytes)));
      if (fp8) {
        auto [bytes, scale] = castF32ToFp8(k, y, /*round=*/false);
        k.when(valid, [&] {
          k.store(bytes, dst, 8);
          k.when(k.eq(sub, k.i32(0)), [&] {
            Value at = k.add(k.mul(row, k.i32(blocks)), k.remu(item, k.i32(blocks)));
            k.store(scale, k.at(scales, k.mul(k.wide(at), k.i64(4))), 4);
          });
        });
        return;
      }
      Value rounded =
          shape.outType.isF32()
              ? y
              : arith::TruncFOp::create(k.b, VectorType::get({perLane}, shape.outType), y)
                    .getResult();
      k.when(valid, [&] { k.store(rounded, dst, 16); });
    });
    scf::YieldOp::create(k.b, ValueRange{k.add(before, pairs)});
  }
}

} // namespace epic::expand
