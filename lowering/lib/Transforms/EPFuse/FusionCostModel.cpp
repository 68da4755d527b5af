//===- FusionCostModel.cpp - the fusion passes' use of the cost model -----===//
//
// See epic/Transforms/FusionCostModel.h.
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Interfaces/FunctionInterfaces.h"

using namespace epic;
using namespace mlir;

fusion::Shape epic::fusionShapeOf(ep::ConfigAttr config, int64_t n, int ranksPerDevice) {
  fusion::Shape s;
  s.ranks = config.getRanks();
  s.experts = config.getExperts();
  s.topk = config.getTopk();
  s.hidden = config.getHidden();
  s.n = double(n);
  s.elementBytes = config.getDtype().getIntOrFloatBitWidth() / 8.0;
  s.tokens = config.getMaxTokensPerRank();
  s.ranksPerDevice = ranksPerDevice;
  return s;
}

FailureOr<std::optional<bool>> epic::decideByMode(Operation *anchor, StringRef pass,
                                                  StringRef option) {
  std::optional<ep::FusionMode> mode = ep::parseFusionMode(option);
  if (!mode)
    return anchor->emitError() << pass << ": option mode must be auto, always or never, got '"
                               << option << "'";
  StringRef from = "option mode";
  if (auto func = anchor->getParentOfType<FunctionOpInterface>())
    if (auto attr = func->getAttrOfType<StringAttr>(ep::kFusionAttrName)) {
      mode = ep::parseFusionMode(attr.getValue()); // verified by the dialect
      from = ep::kFusionAttrName;
    }
  if (*mode == ep::FusionMode::automatic)
    return std::optional<bool>();
  const bool fuse = *mode == ep::FusionMode::always;
  anchor->emitRemark() << pass << (fuse ? ": fused" : ": not fused") << ": " << from << " is "
                       << (fuse ? "\"always\"" : "\"never\"");
  return std::optional<bool>(fuse);
}

FailureOr<bool> epic::decideFusion(Operation *anchor, StringRef pass, const FusionPolicy &policy,
                                   FusedPair pair, ep::ConfigAttr config, int64_t n) {
  FailureOr<std::optional<bool>> decided = decideByMode(anchor, pass, policy.mode);
  if (failed(decided))
    return failure();
  if (*decided)
    return **decided;
  fusion::Costs costs = fusion::costsOf(policy.chip).value_or(fusion::Costs{});
  const fusion::Costs &o = policy.overrides;
  auto take = [](double &field, double override) {
    if (override > 0)
      field = override;
  };
  take(costs.copyGBps, o.copyGBps);
  take(costs.weightGBps, o.weightGBps);
  take(costs.linkGBps, o.linkGBps);
  take(costs.gemmTflops, o.gemmTflops);
  take(costs.launchUs, o.launchUs);
  take(costs.waitUs, o.waitUs);
  take(costs.dispatchGemmSlowdown, o.dispatchGemmSlowdown);
  take(costs.gemmCombineSlowdown, o.gemmCombineSlowdown);
  if (costs.copyGBps <= 0 || costs.weightGBps <= 0 || costs.linkGBps <= 0 ||
      costs.gemmTflops <= 0 || costs.dispatchGemmSlowdown <= 0 || costs.gemmCombineSlowdown <= 0)
    return anchor->emitError() << pass << ": the cost model has no numbers for chip '"
                               << policy.chip
                               << "' (FusionCosts.def): give copy-gbps, weight-gbps, link-gbps, "
                                  "gemm-tflops and slowdown, or mode=always / mode=never";
  const fusion::Shape shape = fusionShapeOf(config, n, policy.ranksPerDevice);
  fusion::Prediction p = pair == FusedPair::dispatchGemm ? fusion::predictDispatchGemm(costs, shape)
                                                         : fusion::predictGemmCombine(costs, shape);
  anchor->emitRemark() << pass << (p.pays() ? ": fused: " : ": not fused: ") << p.describe() << " ("
                       << policy.chip << ")";
  return p.pays();
}

void epic::addEntryFusionPasses(OpPassManager &pm, StringRef chip) {
  EPFuseDispatchGemmOptions dispatchGemm;
  dispatchGemm.mode = "always";
  dispatchGemm.chip = chip.str();
  EPFuseGemmCombineOptions gemmCombine;
  gemmCombine.mode = "always";
  gemmCombine.chip = chip.str();
  pm.addNestedPass<func::FuncOp>(createEPFuseDispatchGemm(dispatchGemm));
  pm.addNestedPass<func::FuncOp>(createEPFuseGemmCombine(gemmCombine));
}
