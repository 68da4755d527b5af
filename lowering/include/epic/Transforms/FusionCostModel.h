//===- FusionCostModel.h - the fusion passes' use of the cost model -*- C++ -*-===//
//
// ep-fuse-dispatch-gemm and ep-fuse-gemm-combine fuse only where the cost
// model (epic/runtime/FusionCostModel.h, shared with the runtime) predicts a
// win. This is how they ask it: the counts of an #ep.config, the passes'
// options, the function's ep.fusion, and the remark every decision leaves.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_TRANSFORMS_FUSIONCOSTMODEL_H
#define EPIC_TRANSFORMS_FUSIONCOSTMODEL_H

#include "epic/Dialect/EP/IR/EPDialect.h"
#include "epic/runtime/FusionCostModel.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace epic {

/// The model's counts of `config` (its token cap) for a GEMM of N = `n`.
fusion::Shape fusionShapeOf(ep::ConfigAttr config, int64_t n, int ranksPerDevice);

/// The fusion passes' options (Passes.td: FusionCostOptions); each pass
/// passes its own `slowdown` as its kind's.
struct FusionPolicy {
  std::string mode = "auto";
  std::string chip = "sm_90a";
  int ranksPerDevice = 1;
  fusion::Costs overrides; ///< fields left 0 take the chip's number
};

/// The pair a fusion pass rewrites.
enum class FusedPair { dispatchGemm, gemmCombine };

/// What `mode` (auto, always or never; the enclosing function's `ep.fusion`
/// overrides it) decides at `anchor` without a model: true or false, with a
/// remark on `anchor` ("<pass>: fused: ... is \"always\""), or nothing for auto;
/// fails with an error for a mode that is none of the three.
mlir::FailureOr<std::optional<bool>> decideByMode(mlir::Operation *anchor, llvm::StringRef pass,
                                                  llvm::StringRef mode);

/// Whether `pass` fuses `pair` at `anchor` (its configuration `config`, the
/// GEMM's N `n`): as the enclosing function's `ep.fusion` or the policy's
/// mode says, else as the model predicts with the policy's numbers. Emits a remark on `anchor`
/// ("<pass>: fused: ..." or "<pass>: not fused: ...", with the prediction); fails with an error for
/// a mode that is none of auto / always / never, or a chip without numbers.
mlir::FailureOr<bool> decideFusion(mlir::Operation *anchor, llvm::StringRef pass,
                                   const FusionPolicy &policy, FusedPair pair,
                                   ep::ConfigAttr config, int64_t n);

/// The fusion passes as a compiled entry needs them: a function holds one ep
/// op or one pair to fuse (convert-ep-to-comm lowers one op per function),
/// so every pair that can be fused is (mode=always), on `chip`.
void addEntryFusionPasses(mlir::OpPassManager &pm, llvm::StringRef chip);

} // namespace epic

#endif // EPIC_TRANSFORMS_FUSIONCOSTMODEL_H
