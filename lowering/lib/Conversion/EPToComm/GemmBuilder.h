//===- GemmBuilder.h - the grouped GEMM kernels' shared builder ------------*- C++ -*-===//
//
// What both grouped GEMM kernels (the BF16/F16 one in GroupedGemm.cpp, the
// warp-specialized FP8 one in GroupedGemmFp8.cpp) are written with: index
// arithmetic, shared-memory views and TMA descriptor types, the kernel's
// setup (record, descriptors, the aligned ring, the ring's barriers) and the
// persistent tile walk over the experts' row ranges.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LOWERING_CONVERSION_EPTOCOMM_GEMMBUILDER_H
#define EPIC_LOWERING_CONVERSION_EPTOCOMM_GEMMBUILDER_H

#include "ArithBuilder.h"
#include "GroupedGemm.h"

#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

namespace epic::detail {

/// The tiling a kernel was built for: output tiles of `tileM` x kGemmTileN, a
/// ring of `stages` stages of `stageBytes`.
struct GemmTiling {
  int64_t tileM, stages, stageBytes;
};

struct GemmBuilder : epic::expand::ArithBuilder<GemmBuilder> {
  using Value = mlir::Value;
  using Type = mlir::Type;
  using MemRefType = mlir::MemRefType;

  mlir::ImplicitLocOpBuilder &b;
  const GroupedGemmShape &shape;
  const GemmTiling tiling;
  mlir::MLIRContext *ctx;
  mlir::Attribute workgroup;

  GemmBuilder(mlir::ImplicitLocOpBuilder &b, const GroupedGemmShape &shape, GemmTiling tiling)
      : b(b), shape(shape), tiling(tiling), ctx(b.getContext()),
        workgroup(
            mlir::gpu::AddressSpaceAttr::get(b.getContext(), mlir::gpu::AddressSpace::Workgroup)) {}

  // --- index arithmetic -----------------------------------------------------
  Value idx(int64_t v) { return mlir::arith::ConstantIndexOp::create(b, v); }
  /// Rounds `x` up to a multiple of `a`.
  Value alignUp(Value x, int64_t a) {
    return a == 1 ? x : mul(divu(add(x, idx(a - 1)), idx(a)), idx(a));
  }
  Value ceilDiv(Value x, int64_t d) { return divu(add(x, idx(d - 1)), idx(d)); }
  Value i64(Value index) { return mlir::arith::IndexCastOp::create(b, b.getI64Type(), index); }
  Value i32(Value index) { return mlir::arith::IndexCastOp::create(b, b.getI32Type(), index); }

  // --- types ----------------------------------------------------------------
  Type ptrT(unsigned space = 1) { return mlir::LLVM::LLVMPointerType::get(ctx, space); }
  MemRefType smem(llvm::ArrayRef<int64_t> dims, Type element) {
    return MemRefType::get(dims, element, mlir::MemRefLayoutAttrInterface(), workgroup);
  }
  /// The descriptor types name the tile's shape in address space 3 (as the
  /// upstream NVGPU tests spell it).
  MemRefType smemSpaceless(MemRefType tile) {
    return MemRefType::get(tile.getShape(), tile.getElementType(),
                           mlir::MemRefLayoutAttrInterface(),
                           mlir::IntegerAttr::get(mlir::IntegerType::get(ctx, 64), 3));
  }
  mlir::nvgpu::MBarrierGroupType barriersT() {
    return mlir::nvgpu::MBarrierGroupType::get(ctx, workgroup, tiling.stages);
  }
  /// A tensor map of `box` boxes of the kernel's input type, 128-byte swizzle.
  mlir::nvgpu::TensorMapDescriptorType mapT(llvm::ArrayRef<int64_t> box) {
    return mlir::nvgpu::TensorMapDescriptorType::get(
        ctx, smemSpaceless(smem(box, shape.inType)),
        mlir::nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
        mlir::nvgpu::TensorMapL2PromoKind::L2PROMO_NONE, mlir::nvgpu::TensorMapOOBKind::OOB_ZERO,
        mlir::nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
  }
  /// A warpgroup's fp32 accumulators of `rows` x kGemmTileN.
  mlir::nvgpu::WarpgroupAccumulatorType accT(int64_t rows) {
    return mlir::nvgpu::WarpgroupAccumulatorType::get(
        ctx, mlir::VectorType::get({rows, kGemmTileN}, b.getF32Type()));
  }

  // --- memory ---------------------------------------------------------------
  Value gep(Value base, Value bytes) {
    return mlir::LLVM::GEPOp::create(b, base.getType(), b.getI8Type(), base,
                                     mlir::ValueRange{bytes});
  }
  Value field(Value record, int64_t index, Type type) {
    Value at = gep(record, i64(idx(index * 8)));
    return mlir::LLVM::LoadOp::create(b, type, at, 8);
  }
  /// A typed view of dynamic shared memory at `offset`.
  Value view(Value dynamic, Value offset, MemRefType type) {
    return mlir::memref::ViewOp::create(b, type, dynamic, offset, mlir::ValueRange{});
  }
  /// A wgmma descriptor of the `tile` at `offset` of dynamic shared memory,
  /// loaded through `map`.
  Value descriptor(Value dynamic, Value offset, MemRefType tile, Value map) {
    return mlir::nvgpu::WarpgroupGenerateDescriptorOp::create(
        b, mlir::nvgpu::WarpgroupMatrixDescriptorType::get(ctx, smemSpaceless(tile)),
        view(dynamic, offset, tile), map);
  }

  // --- control flow ---------------------------------------------------------
  /// for (iv = lb; iv < ub; iv += step) with carried values (maybe none);
  /// `body` returns the next values.
  mlir::ValueRange
  loop(Value lb, Value ub, Value step, mlir::ValueRange init,
       llvm::function_ref<llvm::SmallVector<Value>(Value, mlir::ValueRange)> body) {
    auto op = mlir::scf::ForOp::create(b, lb, ub, step, init);
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    llvm::SmallVector<Value> next = body(op.getInductionVar(), op.getRegionIterArgs());
    if (init.empty()) // the builder made the body's (empty) yield already
      return op.getResults();
    mlir::scf::YieldOp::create(b, next);
    return op.getResults();
  }

  // --- the kernel's setup ---------------------------------------------------
  /// What every kernel starts from: its record and the fields all read, the
  /// two descriptors (as their types name the boxes), the thread and block,
  /// the ring's dynamic shared memory (`pad` aligns a stage to 1024 bytes) and
  /// the stages' full barriers (one arrival each, plus the TMA's bytes).
  struct Setup {
    Value comm, window, record, out, psum, lhsMap, rhsMap, tid, block, blocks, leader, dynamic, pad,
        full;
    Value me; ///< the rank (i32), for the reports of timed-out waits
  };
  /// Builds the setup; the descriptors' boxes are `lhsBox` and `rhsBox`.
  /// `more` runs where thread 0 initializes barriers (before the block's
  /// barrier that publishes them).
  Setup begin(mlir::gpu::GPUFuncOp func, llvm::ArrayRef<int64_t> lhsBox,
              llvm::ArrayRef<int64_t> rhsBox, llvm::function_ref<void(const Setup &)> more = {});

  /// Waits until barrier `stage` of `barriers` completes its phase of
  /// `parity` (i1), bounded by the op's timeout (comm.wait_phase): a pipeline
  /// whose roles disagree on its steps traps naming the block, not hangs.
  void waitPhase(const Setup &s, Value barriers, Value stage, Value parity);

  /// Where stage `stage` starts in dynamic shared memory.
  Value stageAt(const Setup &s, Value stage) {
    return add(s.pad, mul(stage, idx(tiling.stageBytes)));
  }
  /// The stage of global step `step`, and where it starts.
  Value stageOf(Value step) { return remu(step, idx(tiling.stages)); }
  Value stageOffset(const Setup &s, Value step) { return stageAt(s, stageOf(step)); }
  /// The parity of step `g`'s use of its stage (the ring's lap, mod 2).
  Value parityOf(Value step) {
    return mlir::arith::IndexCastOp::create(b, b.getI1Type(),
                                            remu(divu(step, idx(tiling.stages)), idx(2)));
  }

  // --- the tile walk --------------------------------------------------------
  /// The tiles: (local expert e, kGemmTileN-column tile, tileM-row tile of
  /// e's rows [alignUp(psum[e - 1]), psum[e])), numbered expert by expert,
  /// column tile major within the expert (the blocks at work at once share a
  /// weight column tile through L2: the weights are most of the bytes).
  struct Tile {
    Value expert, start, end, rowTile, rowTiles, row0, col0;
  };
  Value expertEnd(Value psum, Value e);
  Value tilesOf(Value start, Value end);
  /// Every tile of this rank.
  Value totalTiles(Value psum);
  /// Tile number `tile`'s expert and position.
  Tile locate(Value psum, Value tile);
};

/// The FP8 kernel (GroupedGemmFp8.cpp), built at `b`'s insertion point in `func`.
void buildFp8GroupedGemm(mlir::ImplicitLocOpBuilder &b, mlir::gpu::GPUFuncOp func,
                         const GroupedGemmShape &shape);

} // namespace epic::detail

#endif // EPIC_LOWERING_CONVERSION_EPTOCOMM_GEMMBUILDER_H
