//===- EPFuseMoeLayer.cpp - the FP8 MoE layer's five ops -> ep.moe_layer ---===//
//
// See EPFuseMoeLayer in Passes.td: the chain it matches, when it fuses and
// what keeps a chain from fusing (each with a remark on the dispatch).
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"

#include "mlir/IR/Dominance.h"

namespace epic {
#define GEN_PASS_DEF_EPFUSEMOELAYER
#include "epic/Transforms/Passes.h.inc"
} // namespace epic

using namespace mlir;
namespace ep = epic::ep;

namespace {

constexpr StringLiteral kPass = "ep-fuse-moe-layer";

/// The five ops of one layer, found from its dispatch.
struct Chain {
  ep::DispatchOp dispatch;
  ep::GroupedGemmOp gateUp;
  ep::SwigluOp swiglu;
  ep::GroupedGemmOp down;
  ep::CombineOp combine;
};

/// The single user of `v` of type OpT, or null.
template <typename OpT> OpT onlyUser(Value v) {
  if (!v || !v.hasOneUse())
    return nullptr;
  return dyn_cast<OpT>(*v.getUsers().begin());
}

/// The layer that starts at `dispatch`, or a remark on it naming what keeps
/// the chain from being one (nothing to say where the rows feed no GEMM).
FailureOr<Chain> findChain(ep::DispatchOp dispatch) {
  auto refuse = [&](const Twine &why) {
    dispatch.emitRemark() << kPass << ": not fused: " << why;
    return failure();
  };
  Chain c{dispatch, {}, {}, {}, {}};
  Value rows = dispatch.getRecvX();
  if (rows.use_empty() || !isa<ep::GroupedGemmOp>(*rows.getUsers().begin()))
    return failure(); // not the head of a layer: nothing to say
  ep::ConfigAttr cfg = dispatch.getConfig();
  if (!cfg.isFP8() || !dispatch.getScalePacks())
    return refuse("the layer kernel runs FP8 rows with scale packs, which the dispatch does not "
                  "send");
  if (dispatch.isCached())
    return refuse("a cached dispatch replays its routing; the layer routes its tokens");
  if (dispatch.getWindowOutputs())
    return refuse("the dispatch's outputs lie in the window (window_outputs)");
  if (dispatch.getZeroPadding())
    return refuse("the dispatch zeroes its padding rows, which the layer never reads");
  if (!dispatch.getTopkWeights())
    return refuse("the dispatch has no routing weights for the SwiGLU to apply");
  if (!cfg.hasStaticTokenCap())
    return refuse("the token cap is a run-time value; the layer kernel sizes its rows by "
                  "max_tokens_per_rank");
  if (cfg.isMultiNode())
    return refuse("the configuration spans " + Twine(cfg.getNumNodes()) + " nodes");
  Value handle = dispatch.getHandle();
  if (Value idx = dispatch.getRecvTopkIdx(); idx && !idx.use_empty())
    return refuse("recv_topk_idx is read by '" +
                  (*idx.getUsers().begin())->getName().getStringRef() + "'");
  auto onlyReadBy = [&](Value v, StringRef what, ArrayRef<Operation *> readers) -> LogicalResult {
    for (Operation *user : v.getUsers())
      if (!llvm::is_contained(readers, user)) {
        refuse(what + " is also read by '" + user->getName().getStringRef() + "'");
        return failure();
      }
    return success();
  };
  c.gateUp = onlyUser<ep::GroupedGemmOp>(rows);
  if (!c.gateUp || c.gateUp.getHandle() != handle ||
      c.gateUp.getLhsScales() != dispatch.getRecvScalePacks())
    return refuse("the rows feed more than one gate/up ep.grouped_gemm on the dispatch's handle "
                  "and scale packs");
  if (failed(onlyReadBy(dispatch.getRecvScalePacks(), "recv_scale_packs", {c.gateUp})))
    return failure();
  c.swiglu = onlyUser<ep::SwigluOp>(c.gateUp.getResult());
  if (!c.swiglu || c.swiglu.getHandle() != handle)
    return refuse("the gate/up GEMM's result feeds something else than one ep.swiglu on the "
                  "handle");
  if (c.swiglu.getWeights() != dispatch.getRecvTopkWeights())
    return refuse("the ep.swiglu does not weight its rows by the dispatch's recv_topk_weights");
  if (failed(onlyReadBy(dispatch.getRecvTopkWeights(), "recv_topk_weights", {c.swiglu})))
    return failure();
  if (!c.swiglu.getScales())
    return refuse("the ep.swiglu's results are not FP8 with block scales");
  c.down = onlyUser<ep::GroupedGemmOp>(c.swiglu.getResult());
  if (!c.down || c.down.getHandle() != handle || c.down.getLhsScales() != c.swiglu.getScales())
    return refuse("the SwiGLU's rows feed something else than one down ep.grouped_gemm with "
                  "their scales");
  if (failed(onlyReadBy(c.swiglu.getScales(), "the SwiGLU's scales", {c.down})))
    return failure();
  c.combine = onlyUser<ep::CombineOp>(c.down.getResult());
  if (!c.combine || c.combine.getHandle() != handle)
    return refuse("the down GEMM's result feeds something else than one ep.combine on the "
                  "handle");
  if (c.combine.getTopkWeights() || !c.combine.getBiases().empty() || c.combine.getWindowOutputs())
    return refuse("the ep.combine has weights, biases or window outputs; the layer's combine "
                  "sums the weighted rows");
  Operation *steps[] = {c.gateUp, c.swiglu, c.down, c.combine};
  if (failed(onlyReadBy(handle, "the handle", steps)))
    return failure();
  auto out = [](ep::GroupedGemmOp gemm) {
    return cast<ShapedType>(gemm.getResult().getType()).getElementType();
  };
  Type bf16 = BFloat16Type::get(dispatch.getContext());
  if (out(c.gateUp) != bf16 || out(c.down) != bf16)
    return refuse("the layer's GEMMs write bf16 rows");
  for (Operation *op : steps)
    if (op->getBlock() != dispatch->getBlock())
      return refuse("'" + op->getName().getStringRef() + "' is in another block");
  return c;
}

struct EPFuseMoeLayerPass : public epic::impl::EPFuseMoeLayerBase<EPFuseMoeLayerPass> {
  using EPFuseMoeLayerBase::EPFuseMoeLayerBase;

  /// Whether to fuse `c` (a remark on its dispatch says which way and why);
  /// failure for a bad mode.
  FailureOr<bool> decide(Chain c) {
    FailureOr<std::optional<bool>> decided = epic::decideByMode(c.dispatch, kPass, mode);
    if (failed(decided))
      return failure();
    if (*decided)
      return **decided;
    const int64_t cap = c.dispatch.getConfig().getMaxTokensPerRank(), most = maxTokens;
    if (most <= 0) { // the default: what the GPU measured (bench/NOTES.md)
      c.dispatch.emitRemark()
          << kPass << ": not fused: mode=auto fuses no layer (max-tokens=0): the persistent "
          << "kernel measured slower than the five ops at every size, its barriers costing "
          << "what the launches did; mode=always, ep.fusion = \"always\" or max-tokens fuses it";
      return false;
    }
    const bool fuse = cap <= most;
    auto remark = c.dispatch.emitRemark() << kPass << (fuse ? ": fused" : ": not fused")
                                          << ": the token cap is " << cap << " per rank, ";
    if (fuse)
      remark << "at most " << most
             << ": a decode-sized layer, whose launches and step tails one kernel removes";
    else
      remark << "above " << most
             << ": the GEMMs compute for most of the layer, one kernel would save nothing";
    return fuse;
  }

  void runOnOperation() override {
    SmallVector<ep::DispatchOp> dispatches;
    getOperation().walk([&](ep::DispatchOp op) { dispatches.push_back(op); });
    DominanceInfo dominance(getOperation());
    for (ep::DispatchOp dispatch : dispatches) {
      FailureOr<Chain> found = findChain(dispatch);
      if (failed(found))
        continue;
      Chain c = *found;
      // The layer op goes where the combine is: every input exists there.
      // Nothing else reads the chain's values, so moving its start is free.
      Value inputs[] = {c.gateUp.getRhs(), c.gateUp.getRhsScales(), c.down.getRhs(),
                        c.down.getRhsScales()};
      if (llvm::any_of(inputs, [&](Value v) { return !dominance.dominates(v, c.combine); })) {
        dispatch.emitRemark() << kPass << ": not fused: the expert weights are defined after "
                              << "the combine";
        continue;
      }
      FailureOr<bool> fuse = decide(c);
      if (failed(fuse))
        return signalPassFailure();
      if (!*fuse)
        continue;
      OpBuilder b(c.combine);
      auto layer = ep::MoeLayerOp::create(
          b, dispatch.getLoc(), c.combine.getCombinedX().getType(), dispatch.getConfig(),
          dispatch.getX(), dispatch.getTopkIdx(), dispatch.getScalePacks(),
          dispatch.getTopkWeights(), c.gateUp.getRhs(), c.gateUp.getRhsScales(), c.down.getRhs(),
          c.down.getRhsScales());
      c.combine.getCombinedX().replaceAllUsesWith(layer.getCombinedX());
      c.combine.erase();
      c.down.erase();
      c.swiglu.erase();
      c.gateUp.erase();
      dispatch.erase();
    }
  }
};

} // namespace
