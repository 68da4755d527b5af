//===- GroupedGemm.h - ep.grouped_gemm's Hopper kernel ----------*- C++ -*-===//
//
// convert-ep-to-comm's builder of the grouped GEMM kernel (TMA + wgmma through the
// NVGPU dialect), kept apart from the communication kernels (Kernels.h).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LOWERING_CONVERSION_EPTOCOMM_GROUPEDGEMM_H
#define EPIC_LOWERING_CONVERSION_EPTOCOMM_GROUPEDGEMM_H

#include "epic/Dialect/EP/IR/EPRecords.h"
#include "epic/runtime/LaunchMetadata.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinAttributes.h"

#include <functional>

namespace epic::detail {

/// Everything the kernel is specialized on.
struct GroupedGemmShape {
  int64_t hidden; ///< K of the GEMM (the dispatch's hidden size)
  int64_t n;      ///< columns of every expert's weight matrix
  int64_t localExperts;
  int64_t alignment;  ///< the dispatch's expert_alignment (where expert rows start)
  mlir::Type inType;  ///< bf16, f16 or f8E4M3FN (lhs and weights)
  mlir::Type outType; ///< bf16, f16 or f32
  /// Where the kernel's inputs are in the rank's parameter record: fields
  /// (8 bytes each), and the two TMA descriptors (lhs, then weights, 128
  /// bytes apart) at `mapsOffset` within the record.
  int64_t paramStride = 128;
  int64_t outField = epic::ep::records::kGGOut, psumField = epic::ep::records::kGGPsumPerExpert,
          mapsOffset = 64;
  /// FP8 only (ep.grouped_gemm's record): the row count and the two scale tensors.
  int64_t numRowsField = epic::ep::records::kGGNumRows,
          xScalesField = epic::ep::records::kGGXScales,
          weightScalesField = epic::ep::records::kGGWeightScales;
  /// Fused behind the dispatch's copy (ep.dispatch_gemm): window offsets of
  /// the per-(expert, kGemmTileM-row tile) arrival counters and of the counters of
  /// column tiles done with them, or -1; `maxTiles` row tiles per expert.
  int64_t tileDone = -1, tileConsumed = -1, maxTiles = 0;
  int64_t timeoutMs = 100000;
  /// Fused with the combine (ep.gemm_combine): called by the block after each
  /// output tile is stored (its threads met at a barrier), with the tile's
  /// expert and 128-row tile index (index values), at `b`'s insertion point.
  std::function<void(mlir::OpBuilder &b, mlir::Value expert, mlir::Value rowTile)> afterTile;
  /// Blocks kept for communication (0: none): the rank's last `commBlocks`
  /// blocks take no tile and go straight to what the caller builds after the
  /// kernel's tile loop, which the other blocks reach after their last tile.
  /// Communication in blocks that take no tile never stalls one: the tile
  /// blocks stay in step and keep sharing weight and lhs tiles through L2
  /// (sends between tiles put them out of step, and an extra warp in every
  /// block pushed the GEMM's registers into local memory: 1.7-2.2x slower on
  /// the H200).
  int64_t commBlocks = 0;
  /// FP8 inside a longer kernel (ep.moe_layer): after its last tile every
  /// warpgroup sets its registers back to kFp8EvenRegisters (setmaxnreg), the
  /// even split the code after the GEMM is compiled for. Else the kernel
  /// ends with the GEMM.
  bool restoreRegisters = false;
};

/// Tile and pipeline of the kernel: one warpgroup computes 128 x 128 output
/// tiles (two m64 wgmma per k16 step, sharing the weight tile) over K in steps
/// of 64, through a ring of kStages shared-memory stages. 128 rows: an expert
/// of an EP8 V3 batch has ~250 rows, so its weights are read by two row tiles
/// instead of four (the weights are most of the GEMM's bytes).
constexpr int64_t kGemmTileM = 128, kGemmTileN = 128, kGemmTileK = 64, kGemmStages = 3;
constexpr int64_t kGemmThreads = 128;
/// A stage: the 128 x 64 lhs tile as two 64 x 64 boxes, then the 64 x 128
/// weight tile as two 64 x 64 halves (128-byte swizzle: a TMA box row is at
/// most 128 bytes).
constexpr int64_t kGemmStageBytes = (kGemmTileM * kGemmTileK + kGemmTileK * kGemmTileN) * 2;
/// The stages plus slack to align them to 1024 bytes (128-byte swizzle atoms).
constexpr int64_t kGemmDynamicSharedBytes = kGemmStages * kGemmStageBytes + 1024;
/// Blocks per SM the runtime launches for the GEMM kernels (one warpgroup each: a second
/// block's MMAs fill the tensor cores while one waits for TMA or stores its tile).
constexpr int64_t kGemmCtasPerSm = 2;
static_assert(kGemmCtasPerSm * kGemmDynamicSharedBytes <= 227 * 1024,
              "two GEMM blocks must fit in an SM's shared memory");
static_assert(kGemmTileM * kGemmTileN * 4 <= kGemmStages * kGemmStageBytes,
              "the epilogue stages the fp32 tile in the ring");

/// The FP8 kernel (e4m3 rows and weights with DeepSeek's block scales) is
/// warp-specialized: a producer warp issues the TMA loads of a ring of
/// kFp8Stages stages (the 128 x 128 lhs box, then the 128 x 128 weight box, N
/// rows with K contiguous: FP8 wgmma reads B K-major only; 128-byte swizzle)
/// as the consumers free them (an mbarrier per stage each way); two consumer
/// warpgroups compute the 128 x 128 output tile, rows 0-63 and 64-127, sharing
/// the weight tile. Per K step of 128 (one scale block) a warpgroup issues four
/// m64n128k32 wgmma into fresh partial sums as one group, frees the stage, and adds the
/// sums times the rows' and the weight block's scales into its totals (the
/// promotion) while the other warpgroup's MMAs run. 128 rows: per byte loaded
/// into shared memory a 128 x 128 tile does 1.5x the MMA work of the 64 x 128
/// one, whose kernel was bound by the SM's load bandwidth (~40% of the FP8
/// peak); 64 rows a warpgroup: partial and total sums of 64 x 128 are 128
/// registers a thread. One block per SM (the two warpgroups take its registers).
/// (The producer: see kFp8Threads.)
constexpr int64_t kFp8TileM = 128, kFp8TileK = 128, kFp8Stages = 6;
constexpr int64_t kFp8ConsumerWarpgroups = 2;
/// Three warpgroups: ptxas budgets registers per warpgroup (a block of 288
/// threads got 168 a thread, the budget of 384, and spilled), so the
/// producer is a whole warpgroup that keeps kFp8ProducerRegisters and hands
/// the rest to the consumers (setmaxnreg): 2 x 128 x 224 + 128 x 56 <= 64 Ki.
constexpr int64_t kFp8Threads = (kFp8ConsumerWarpgroups + 1) * 128;
constexpr int64_t kFp8ConsumerRegisters = 224, kFp8ProducerRegisters = 56;
static_assert(kFp8ConsumerWarpgroups * 128 * kFp8ConsumerRegisters + 128 * kFp8ProducerRegisters <=
                  64 * 1024,
              "the warpgroups' registers must fit the SM's register file");
/// A thread's registers where all three warpgroups have the same (the launch's
/// 384 threads with one block per SM: the register file divided, in the unit
/// of 8 setmaxnreg counts in).
constexpr int64_t kFp8EvenRegisters = 64 * 1024 / kFp8Threads / 8 * 8;
/// The named barrier (not 0: every block barrier's) at which the consumers,
/// having set their registers back to kFp8EvenRegisters, let the producer
/// warpgroup take its own back (restoreRegisters).
constexpr int64_t kFp8RegisterBarrier = 1;
constexpr int64_t kFp8CtasPerSm = 1;
constexpr int64_t kFp8ScaleBlock = 128; ///< channels per scale (rows' and weights')
constexpr int64_t kFp8StageBytes = kFp8TileM * kFp8TileK + kFp8TileK * kGemmTileN;
constexpr int64_t kFp8DynamicSharedBytes = kFp8Stages * kFp8StageBytes + 1024;
static_assert(kFp8CtasPerSm * kFp8DynamicSharedBytes <= 227 * 1024,
              "the FP8 GEMM's ring must fit in an SM's shared memory");
static_assert(kFp8TileM == kFp8ConsumerWarpgroups * 64, "a consumer warpgroup's rows are m64");
static_assert(kFp8TileK == kFp8ScaleBlock && kGemmTileN == kFp8ScaleBlock,
              "an FP8 step covers one scale block of K, a tile one of N");

/// Whether `shape` is the FP8 kernel's.
bool isFp8Gemm(const GroupedGemmShape &shape);
/// The dynamic shared memory, the threads of a block and the blocks per SM
/// the kernel of `shape` takes.
int64_t gemmDynamicSharedBytes(const GroupedGemmShape &shape);
int64_t gemmThreads(const GroupedGemmShape &shape);
int64_t gemmCtasPerSm(const GroupedGemmShape &shape);

/// Fields of the kernel's per-rank parameter record, in order (the TMA
/// descriptors follow them, see GroupedGemmShape::mapsOffset).
using epic::ep::records::kGroupedGemmFields; // its record (EPRecords.def)

/// Checks what the kernel supports (tile multiples, element types); emits the
/// diagnostic on `op`.
mlir::LogicalResult checkGroupedGemmShape(mlir::Operation *op, const GroupedGemmShape &shape);

/// Fills `func` (convert-ep-to-comm's kernel signature: device communicator, window,
/// parameter table) with the persistent grouped GEMM.
void buildGroupedGemmKernel(mlir::gpu::GPUFuncOp func, const GroupedGemmShape &shape);

/// The launch metadata the runtime needs to encode the kernel's two TMA
/// descriptors into each record (`epic.tensor_maps`).
/// `lhsField`/`weightsField`: the record fields of the two tensors; `rows`:
/// the lhs row count, a record field name or a constant; `mapsOffset`: where
/// in the record the first descriptor goes (the second 128 bytes after it).
std::vector<TensorMapSpec> groupedGemmTensorMaps(const GroupedGemmShape &shape,
                                                 llvm::StringRef lhsField,
                                                 llvm::StringRef weightsField, IntOrField rows,
                                                 int64_t mapsOffset);

} // namespace epic::detail

#endif // EPIC_LOWERING_CONVERSION_EPTOCOMM_GROUPEDGEMM_H
