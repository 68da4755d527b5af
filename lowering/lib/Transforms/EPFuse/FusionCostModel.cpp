//===- FusionCostModel.cpp - does a fused schedule beat its two steps? ----===//
//
// See FusionCostModel.h. Every time is microseconds on one GPU; a GPU that
// serves several ranks (the virtual world) does all of their work.
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>

using namespace epic;
using namespace mlir;

std::optional<FusionCosts> epic::fusionCostsOf(llvm::StringRef chip) {
#define FUSION_CHIP(name, copy, weight, link, tflops, launch, wait, dispatchGemm, gemmCombine)     \
  if (chip == name)                                                                                \
    return FusionCosts{copy, weight, link, tflops, launch, wait, dispatchGemm, gemmCombine};
#include "epic/Transforms/FusionCosts.def"
  return std::nullopt;
}

std::string FusionPrediction::describe() const {
  return llvm::formatv("predicted {0:f1} us fused vs {1:f1} us in two steps: {2}", fusedUs, stepsUs,
                       why)
      .str();
}

FusionShape FusionShape::of(ep::ConfigAttr config, int64_t n, int ranksPerDevice) {
  FusionShape s;
  s.ranks = config.getRanks();
  s.ranksPerDevice = ranksPerDevice <= 0 ? s.ranks : std::clamp<double>(ranksPerDevice, 1, s.ranks);
  const double tokens = config.getMaxTokensPerRank(), topk = config.getTopk();
  s.rowsPerDevice = s.ranksPerDevice * tokens * topk;
  s.expertsPerDevice = s.ranksPerDevice * config.getNumLocalExperts();
  // The GEMM computes whole 128-row tiles of each expert's rows (an expert
  // expects tokens x topk x ranks / experts of them).
  const double rowsPerExpert = tokens * topk * s.ranks / config.getExperts();
  s.gemmRowsPerDevice = s.expertsPerDevice * std::ceil(rowsPerExpert / 128) * 128;
  s.hidden = config.getHidden();
  s.n = double(n);
  s.elementBytes = config.getDtype().getIntOrFloatBitWidth() / 8.0;
  return s;
}

namespace {

double microseconds(double bytes, double gigabytesPerSecond) {
  return bytes / (gigabytesPerSecond * 1e3);
}

/// The grouped GEMM alone: its FLOPs at the dense rate or its weights at
/// HBM read bandwidth, whichever is slower.
double gemmUs(const FusionCosts &c, const FusionShape &s) {
  const double flops = 2 * s.gemmRowsPerDevice * s.hidden * s.n;
  const double weightBytes = s.expertsPerDevice * s.hidden * s.n * s.elementBytes;
  return std::max(flops / (c.gemmTflops * 1e6), microseconds(weightBytes, c.weightGBps));
}

/// Both fusions hide one transfer (`what`, `transferUs`) under the GEMM: in
/// two steps the transfer, a kernel boundary and the GEMM run one after the
/// other; fused, the slower of the transfer and the fused kernel's GEMM, plus
/// a flag round trip.
FusionPrediction overlap(const FusionCosts &c, StringRef what, double transferUs, double gemm,
                         double slowdown) {
  const double fusedGemm = slowdown * gemm;
  FusionPrediction p;
  p.stepsUs = transferUs + c.launchUs + gemm;
  p.fusedUs = std::max(transferUs, fusedGemm) + c.waitUs;
  if (p.pays())
    p.why = llvm::formatv("the {0} ({1:f1} us) and a kernel boundary ({2:f1} us) hide under the "
                          "GEMM ({3:f1} us, x{4} in the fused kernel)",
                          what, transferUs, c.launchUs, gemm, slowdown);
  else
    p.why = llvm::formatv("the fused kernel's GEMM runs x{0} slower ({1:f1} -> {2:f1} us), more "
                          "than the {3} ({4:f1} us) and the kernel boundary ({5:f1} us) it hides",
                          slowdown, gemm, fusedGemm, what, transferUs, c.launchUs);
  return p;
}

} // namespace

FusionPrediction epic::predictDispatchGemm(const FusionCosts &c, const FusionShape &s) {
  const double copy = microseconds(s.rowsPerDevice * s.hidden * s.elementBytes, c.copyGBps);
  return overlap(c, "copy", copy, gemmUs(c, s), c.dispatchGemmSlowdown);
}

FusionPrediction epic::predictGemmCombine(const FusionCosts &c, const FusionShape &s) {
  // The combine sends bf16 rows; those bound for a rank of this GPU stay in
  // its memory, the others cross NVLink.
  const double remote = (s.ranks - s.ranksPerDevice) / s.ranks;
  const double bytes = s.rowsPerDevice * s.hidden * 2;
  const double send =
      remote * microseconds(bytes, c.linkGBps) + (1 - remote) * microseconds(bytes, c.copyGBps);
  return overlap(c, "send", send, gemmUs(c, s), c.gemmCombineSlowdown);
}

FailureOr<bool>
epic::decideFusion(Operation *anchor, StringRef pass, const FusionPolicy &policy,
                   llvm::function_ref<FusionPrediction(const FusionCosts &)> predict) {
  std::optional<ep::FusionMode> mode = ep::parseFusionMode(policy.mode);
  if (!mode)
    return anchor->emitError() << pass << ": option mode must be auto, always or never, got '"
                               << policy.mode << "'";
  StringRef from = "option mode";
  if (auto func = anchor->getParentOfType<FunctionOpInterface>())
    if (auto attr = func->getAttrOfType<StringAttr>(ep::kFusionAttrName)) {
      mode = ep::parseFusionMode(attr.getValue()); // verified by the dialect
      from = ep::kFusionAttrName;
    }
  if (*mode != ep::FusionMode::automatic) {
    const bool fuse = *mode == ep::FusionMode::always;
    anchor->emitRemark() << pass << (fuse ? ": fused" : ": not fused") << ": " << from << " is "
                         << (fuse ? "\"always\"" : "\"never\"");
    return fuse;
  }
  FusionCosts costs = fusionCostsOf(policy.chip).value_or(FusionCosts{});
  const FusionCosts &o = policy.overrides;
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
  FusionPrediction p = predict(costs);
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
