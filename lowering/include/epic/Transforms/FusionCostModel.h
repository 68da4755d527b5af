//===- FusionCostModel.h - does a fused schedule beat its two steps? -*- C++ -*-===//
//
// ep-fuse-dispatch-gemm and ep-fuse-gemm-combine fuse only where this model
// predicts a win. It counts what each schedule moves and computes on one GPU
// (bytes of the copy or the send, FLOPs and weight bytes of the GEMM, kernel
// boundaries, waits) and prices them with a chip's numbers (FusionCosts.def,
// each overridable by a pass option). The token count is the configuration's
// cap (max_tokens_per_rank): the size the kernels are built for.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_TRANSFORMS_FUSIONCOSTMODEL_H
#define EPIC_TRANSFORMS_FUSIONCOSTMODEL_H

#include "epic/Dialect/EP/IR/EPDialect.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace epic {

/// What the model assumes about a GPU (FusionCosts.def explains each).
struct FusionCosts {
  double copyGBps = 0, weightGBps = 0, linkGBps = 0, gemmTflops = 0;
  double launchUs = 0, waitUs = 0;
  double dispatchGemmSlowdown = 0, gemmCombineSlowdown = 0;
};

/// The numbers of `chip` from FusionCosts.def, if it has a row.
std::optional<FusionCosts> fusionCostsOf(llvm::StringRef chip);

/// One prediction, in microseconds on one GPU.
struct FusionPrediction {
  double fusedUs = 0; ///< the fused schedule
  double stepsUs = 0; ///< the two steps it replaces
  std::string why;    ///< what decides, in words (for the remark)
  bool pays() const { return fusedUs < stepsUs; }
  /// "predicted 2.8 us fused vs 6.1 us in two steps: <why>".
  std::string describe() const;
};

/// The counts both predictions share, from the configuration.
struct FusionShape {
  double ranksPerDevice;    ///< ranks sharing one GPU (given 0: all, the virtual world)
  double rowsPerDevice;     ///< expanded rows the GPU's ranks receive
  double gemmRowsPerDevice; ///< the same in 128-row tiles per expert
  double expertsPerDevice;
  double hidden, n, elementBytes, ranks;
  static FusionShape of(ep::ConfigAttr config, int64_t n, int ranksPerDevice);
};

/// ep.dispatch -> ep.grouped_gemm: the copy of the received rows into the
/// expert layout, then the GEMM; or one kernel whose GEMM tiles start as
/// their rows land (the send before both is the same and not counted).
FusionPrediction predictDispatchGemm(const FusionCosts &costs, const FusionShape &shape);

/// ep.grouped_gemm -> ep.combine: the GEMM, then the combine's send; or one
/// kernel that sends tokens as their rows are computed (the reduce after both
/// is the same and not counted).
FusionPrediction predictGemmCombine(const FusionCosts &costs, const FusionShape &shape);

/// The fusion passes' options (Passes.td: FusionCostOptions); each pass
/// passes its own `slowdown` as its kind's.
struct FusionPolicy {
  std::string mode = "auto";
  std::string chip = "sm_90a";
  int ranksPerDevice = 1;
  FusionCosts overrides; ///< fields left 0 take the chip's number
};

/// Whether `pass` fuses at `anchor`: as the enclosing function's `ep.fusion`
/// or the policy's mode says, else as `predict` says with the policy's
/// numbers. Emits a remark on `anchor` ("<pass>: fused: ..." or "<pass>:
/// not fused: ...", with the prediction); fails with an error for a mode
/// that is none of auto / always / never, or a chip without numbers.
mlir::FailureOr<bool>
decideFusion(mlir::Operation *anchor, llvm::StringRef pass, const FusionPolicy &policy,
             llvm::function_ref<FusionPrediction(const FusionCosts &)> predict);

/// The fusion passes as a compiled entry needs them: a function holds one ep
/// op or one pair to fuse (convert-ep-to-comm lowers one op per function),
/// so every pair that can be fused is (mode=always), on `chip`.
void addEntryFusionPasses(mlir::OpPassManager &pm, llvm::StringRef chip);

} // namespace epic

#endif // EPIC_TRANSFORMS_FUSIONCOSTMODEL_H
