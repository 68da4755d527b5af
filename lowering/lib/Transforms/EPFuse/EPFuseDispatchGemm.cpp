//===- EPFuseDispatchGemm.cpp - ep.dispatch + ep.grouped_gemm -> one op ---===//
//
// See EPFuseDispatchGemm in Passes.td: the pattern, the schedule it selects
// and when fusion is refused (with a remark naming the reason).
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"

#include "mlir/IR/Dominance.h"

namespace epic {
#define GEN_PASS_DEF_EPFUSEDISPATCHGEMM
#include "epic/Transforms/Passes.h.inc"
} // namespace epic

using namespace mlir;
namespace ep = epic::ep;

namespace {

/// The one ep.grouped_gemm that multiplies `dispatch`'s rows on its handle,
/// or a remark on `dispatch` saying why there is none to fuse with.
FailureOr<ep::GroupedGemmOp> fusableGemm(ep::DispatchOp dispatch) {
  Value rows = dispatch.getRecvX();
  if (rows.use_empty())
    return failure(); // nothing consumes the rows: nothing to say
  auto refuse = [&](const Twine &why) {
    dispatch.emitRemark("ep-fuse-dispatch-gemm: not fused: ") << why;
    return failure();
  };
  SmallVector<ep::GroupedGemmOp> gemms;
  for (Operation *user : rows.getUsers()) {
    auto gemm = dyn_cast<ep::GroupedGemmOp>(user);
    if (!gemm)
      continue;
    if (gemm.getLhs() != rows || gemm.getHandle() != dispatch.getHandle())
      return refuse("the ep.grouped_gemm reading the rows takes them with another handle");
    gemms.push_back(gemm);
  }
  if (gemms.empty())
    return refuse("the rows feed '" + (*rows.getUsers().begin())->getName().getStringRef() +
                  "', not an ep.grouped_gemm");
  if (gemms.size() > 1)
    return refuse(Twine(gemms.size()) + " ep.grouped_gemm ops read the rows; one schedule can "
                                        "feed one of them");
  if (dispatch.isCached())
    return refuse("a cached dispatch replays its routing; fusion covers the routed dispatch");
  if (dispatch.getWindowOutputs())
    return refuse("its outputs lie in the window (window_outputs), which the fused kernel does "
                  "not write");
  ep::ConfigAttr cfg = dispatch.getConfig();
  if (cfg.isFP8() || dispatch.getScalePacks())
    return refuse("FP8 rows with scale packs are not multiplied by the fused kernel yet");
  if (!cfg.hasStaticTokenCap())
    return refuse("the token cap is a run-time value; the fused kernel sizes its tile counters "
                  "by max_tokens_per_rank");
  if (cfg.isMultiNode())
    return refuse("the configuration spans " + Twine(cfg.getNumNodes()) +
                  " nodes; the fused kernel stores into NVLink peers only");
  ep::GroupedGemmOp gemm = gemms.front();
  if (gemm->getBlock() != dispatch->getBlock())
    return refuse("the ep.grouped_gemm is in another block");
  return gemm;
}

struct EPFuseDispatchGemmPass : public epic::impl::EPFuseDispatchGemmBase<EPFuseDispatchGemmPass> {
  using EPFuseDispatchGemmBase::EPFuseDispatchGemmBase;

  void runOnOperation() override {
    SmallVector<ep::DispatchOp> dispatches;
    getOperation().walk([&](ep::DispatchOp op) { dispatches.push_back(op); });
    DominanceInfo dominance(getOperation());
    const epic::FusionPolicy policy{
        mode,
        chip,
        ranksPerDevice,
        {copyGBps, weightGBps, linkGBps, gemmTflops, launchUs, waitUs, slowdown, slowdown}};
    for (ep::DispatchOp dispatch : dispatches) {
      FailureOr<ep::GroupedGemmOp> found = fusableGemm(dispatch);
      if (failed(found))
        continue;
      ep::GroupedGemmOp gemm = *found;
      // The fused op goes where the dispatch is if the weights exist there,
      // else where the GEMM is if nothing uses the dispatch's results before.
      Operation *at = dispatch;
      if (!dominance.properlyDominates(gemm.getRhs(), dispatch)) {
        at = gemm;
        for (Value result : dispatch->getResults())
          for (Operation *user : result.getUsers())
            if (user != gemm && !gemm->isBeforeInBlock(user) &&
                user->getBlock() == gemm->getBlock()) {
              dispatch.emitRemark("ep-fuse-dispatch-gemm: not fused: '")
                  << user->getName()
                  << "' uses the dispatch before the expert weights of the "
                     "ep.grouped_gemm are defined";
              at = nullptr;
            }
        if (!at)
          continue;
      }
      const int64_t n = cast<ShapedType>(gemm.getResult().getType()).getShape().back();
      FailureOr<bool> fuse =
          epic::decideFusion(dispatch, "ep-fuse-dispatch-gemm", policy,
                             epic::FusedPair::dispatchGemm, dispatch.getConfig(), n);
      if (failed(fuse))
        return signalPassFailure();
      if (!*fuse)
        continue;
      OpBuilder b(at);
      Value weights = dispatch.getTopkWeights();
      auto fused = ep::DispatchGemmOp::create(
          b, dispatch.getLoc(), dispatch.getRecvX().getType(),
          weights ? dispatch.getRecvTopkWeights().getType() : Type(), gemm.getResult().getType(),
          dispatch.getHandle().getType(), dispatch.getConfig(), dispatch.getX(),
          dispatch.getTopkIdx(), weights, gemm.getRhs(), dispatch.getZeroPadding());
      dispatch.getRecvX().replaceAllUsesWith(fused.getRecvX());
      if (weights)
        dispatch.getRecvTopkWeights().replaceAllUsesWith(fused.getRecvTopkWeights());
      dispatch.getHandle().replaceAllUsesWith(fused.getHandle());
      gemm.getResult().replaceAllUsesWith(fused.getResult());
      gemm.erase();
      dispatch.erase();
    }
  }
};

} // namespace
