//===- EPFuseGemmCombine.cpp - ep.grouped_gemm + ep.combine -> one op -----===//
//
// See EPFuseGemmCombine in Passes.td: the pattern, the schedule it selects
// and when fusion is refused (with a remark naming the reason).
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"

namespace epic {
#define GEN_PASS_DEF_EPFUSEGEMMCOMBINE
#include "epic/Transforms/Passes.h.inc"
} // namespace epic

using namespace mlir;
namespace ep = epic::ep;

namespace {

/// The one ep.combine of `gemm`'s output, or a remark on `gemm` saying why
/// there is none to fuse with.
FailureOr<ep::CombineOp> fusableCombine(ep::GroupedGemmOp gemm) {
  Value out = gemm.getResult();
  if (out.use_empty())
    return failure();
  auto refuse = [&](const Twine &why) {
    gemm.emitRemark("ep-fuse-gemm-combine: not fused: ") << why;
    return failure();
  };
  SmallVector<ep::CombineOp> combines;
  for (Operation *user : out.getUsers())
    if (auto combine = dyn_cast<ep::CombineOp>(user); combine && combine.getX() == out)
      combines.push_back(combine);
  if (combines.empty())
    return refuse("the output feeds '" + (*out.getUsers().begin())->getName().getStringRef() +
                  "', not an ep.combine");
  if (combines.size() > 1)
    return refuse("the output is combined more than once");
  ep::CombineOp combine = combines.front();
  if (gemm.getLhsScales())
    return refuse("FP8 rows: the fused kernel multiplies BF16 or F16 rows");
  if (int64_t k = cast<ShapedType>(gemm.getLhs().getType()).getDimSize(1);
      k != int64_t(gemm.getConfig().getHidden()))
    return refuse("the rows are " + Twine(k) + " wide (an expert's down GEMM); the fused kernel " +
                  "multiplies rows of the hidden size (" + Twine(gemm.getConfig().getHidden()) +
                  ")");
  if (combine.getWindowOutputs())
    return refuse("the combine reads its input in the window (window_outputs), which the fused "
                  "kernel does not write");
  auto type = cast<ShapedType>(out.getType());
  if (!type.getElementType().isBF16())
    return refuse("the combine sends bf16 rows; the GEMM's output is " +
                  llvm::Twine(type.getElementType().isF32() ? "f32" : "f16"));
  if (combine.getHandle() != gemm.getHandle())
    return refuse("the combine reverses another dispatch (another handle)");
  if (combine.getTopkWeights())
    return refuse("the combine sends weights back; the fused epilogue sends rows only");
  if (!combine.getConfig().hasStaticTokenCap())
    return refuse("the token cap is a run-time value; the fused kernel sizes its scratch by "
                  "max_tokens_per_rank");
  if (combine.getConfig().isMultiNode())
    return refuse("the configuration spans " + Twine(combine.getConfig().getNumNodes()) +
                  " nodes; the fused epilogue stores into NVLink peers only");
  if (combine->getBlock() != gemm->getBlock())
    return refuse("the ep.combine is in another block");
  return combine;
}

struct EPFuseGemmCombinePass : public epic::impl::EPFuseGemmCombineBase<EPFuseGemmCombinePass> {
  using EPFuseGemmCombineBase::EPFuseGemmCombineBase;

  void runOnOperation() override {
    SmallVector<ep::GroupedGemmOp> gemms;
    getOperation().walk([&](ep::GroupedGemmOp op) { gemms.push_back(op); });
    const epic::FusionPolicy policy{
        mode,
        chip,
        ranksPerDevice,
        {copyGBps, weightGBps, linkGBps, gemmTflops, launchUs, waitUs, slowdown, slowdown}};
    for (ep::GroupedGemmOp gemm : gemms) {
      FailureOr<ep::CombineOp> found = fusableCombine(gemm);
      if (failed(found))
        continue;
      ep::CombineOp combine = *found;
      // At the combine (its biases are defined there, the GEMM's operands
      // too), unless the GEMM's output is used before it.
      bool usedBefore = false;
      for (Operation *user : gemm.getResult().getUsers())
        usedBefore |= user != combine && user->getBlock() == combine->getBlock() &&
                      user->isBeforeInBlock(combine);
      if (usedBefore) {
        gemm.emitRemark("ep-fuse-gemm-combine: not fused: the GEMM's output is used before "
                        "the combine (the fused op stands where the combine is)");
        continue;
      }
      const int64_t n = cast<ShapedType>(gemm.getResult().getType()).getShape().back();
      FailureOr<bool> fuse =
          epic::decideFusion(gemm, "ep-fuse-gemm-combine", policy, epic::FusedPair::gemmCombine,
                             combine.getConfig(), n);
      if (failed(fuse))
        return signalPassFailure();
      if (!*fuse)
        continue;
      OpBuilder b(combine);
      auto fused = ep::GemmCombineOp::create(b, gemm.getLoc(), gemm.getResult().getType(),
                                             combine.getCombinedX().getType(), gemm.getLhs(),
                                             gemm.getRhs(), gemm.getHandle(), combine.getBiases());
      combine.getCombinedX().replaceAllUsesWith(fused.getCombinedX());
      gemm.getResult().replaceAllUsesWith(fused.getResult());
      combine.erase();
      gemm.erase();
    }
  }
};

} // namespace
