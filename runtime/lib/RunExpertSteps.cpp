//===- RunExpertSteps.cpp - a run plan's expert steps: GEMMs, SwiGLU, layer ===//
//
// The steps that compute on the received rows (ep.grouped_gemm, ep.swiglu),
// the GEMM fused with the combine, and the whole FP8 layer in one kernel
// (ep.moe_layer), each checked against the reference (Reference.h) under
// --check.
//
//===----------------------------------------------------------------------===//

#include "RunExecutor.h"

#include <stdexcept>

using namespace epic::runtime;

namespace epic::runtime::run {

void Executor::groupedGemm(const RunStep &step, const PlanKernel &k) {
  const Value &x = at(step.integer("x")), &weights = at(step.integer("weights"));
  std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
  const bool fp8 = step.integer("x_scales") >= 0;
  const Value *xScales = fp8 ? &at(step.integer("x_scales")) : nullptr;
  const Value *weightScales = fp8 ? &at(step.integer("weight_scales")) : nullptr;
  std::vector<GroupedGemmCall> calls(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r) {
    const int64_t rows = x.tensor[r].device.shape[0];
    // Padding rows stay as allocated: zero.
    calls[r] = {x.tensor[r].device, weights.tensor[r].device,
                allocate(k.gemmOutDtype, {rows, k.gemmN}),
                handle->device[r].psumNumRecvTokensPerExpert};
    if (fp8) {
      calls[r].xScales = xScales->tensor[r].device;
      calls[r].weightScales = weightScales->tensor[r].device;
    }
  }
  buffer.groupedGemm(k.spec, calls);
  std::vector<GemmRecord> products;
  for (int r = 0; r < R(); ++r) {
    RankTensor out = received(calls[r].out, calls[r].out.shape[0]);
    products.push_back({x.tensor[r].host, weights.tensor[r].host, out.host});
    if (fp8) {
      products.back().xScales = xScales->tensor[r].host;
      products.back().weightScales = weightScales->tensor[r].host;
    }
    Value &result = at(step.integer("result"));
    result.receivedBy = x.receivedBy; // rows of the dispatch: printed in canonical order
    result.tensor.push_back(std::move(out));
  }
  if (options.check)
    report(step, checkGroupedGemm(k.spec, handle->records, products));
}

void Executor::swiglu(const RunStep &step, const PlanKernel &k) {
  const Value &gateUp = at(step.integer("gate_up"));
  std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
  const bool fp8 = step.integer("scales") >= 0;
  const Value *weights = step.integer("weights") >= 0 ? &at(step.integer("weights")) : nullptr;
  std::vector<SwigluCall> calls(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r) {
    const int64_t rows = gateUp.tensor[r].device.shape[0];
    // Padding rows stay as allocated: zero (the check says so).
    calls[r] = {gateUp.tensor[r].device, allocate(k.gemmOutDtype, {rows, k.gemmN}),
                handle->device[r].psumNumRecvTokensPerExpert};
    if (fp8)
      calls[r].scales = allocate("f32", {rows, k.gemmN / 128});
    if (weights)
      calls[r].weights = weights->tensor[r].device;
  }
  buffer.swiglu(k.spec, calls);
  std::vector<SwigluRecord> records;
  Value &result = at(step.integer("result"));
  result.receivedBy = gateUp.receivedBy; // rows of the dispatch: printed in canonical order
  for (int r = 0; r < R(); ++r) {
    RankTensor out = received(calls[r].out, calls[r].out.shape[0]);
    records.push_back({gateUp.tensor[r].host, out.host, {}, {}});
    if (weights)
      records.back().weights = weights->tensor[r].host;
    result.tensor.push_back(std::move(out));
    if (fp8) {
      RankTensor scales = received(calls[r].scales, calls[r].scales.shape[0]);
      records.back().scales = scales.host;
      Value &scaleValue = at(step.integer("scales"));
      scaleValue.receivedBy = gateUp.receivedBy;
      scaleValue.tensor.push_back(std::move(scales));
    }
  }
  if (options.check)
    report(step, checkSwiglu(k.spec, handle->records, records));
}

/// The expert GEMM fused with the combine of its output: both results are
/// checked, the GEMM's against a float64 product and the combine's against
/// the reference combine of the rows the kernel computed (the fused kernel
/// is bitwise the two ops one after the other).
void Executor::gemmCombine(const RunStep &step, const PlanKernel &k) {
  const EPSpec &spec = k.spec;
  const Value &x = at(step.integer("x")), &weights = at(step.integer("weights"));
  std::shared_ptr<HandleValue> handle = at(step.integer("handle")).handle;
  const auto &biasIds = step.fields.at("biases").list();
  std::vector<GemmCombineCall> calls(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r) {
    GemmCombineCall &c = calls[r];
    const int64_t T = handle->device[r].topkIdx.shape[0];
    c.lhs = x.tensor[r].device;
    c.weights = weights.tensor[r].device;
    // The GEMM's output: padding rows stay as allocated (zero).
    c.combine.x = allocate("bf16", {c.lhs.shape[0], spec.hidden});
    c.combine.handle = handle->device[r];
    bindBiases(c.combine, biasIds, r);
    c.combine.combinedX = allocate("bf16", {T, spec.hidden});
  }
  buffer.gemmCombine(spec, k.combineVariant.biases, calls);

  std::vector<GemmRecord> products;
  std::vector<CombineRecord> combined(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r) {
    const GemmCombineCall &c = calls[r];
    RankTensor y = received(c.combine.x, c.combine.x.shape[0]);
    RankTensor out = received(c.combine.combinedX, c.combine.combinedX.shape[0]);
    products.push_back({x.tensor[r].host, weights.tensor[r].host, y.host});
    CombineRecord &rec = combined[r];
    rec.x = y.host;
    rec.combinedX = out.host;
    for (const Json &id : biasIds)
      rec.biases.push_back(at(id.integer()).tensor[r].host);
    Value &result = at(step.integer("result"));
    result.receivedBy = x.receivedBy; // rows of the dispatch: printed in canonical order
    result.tensor.push_back(std::move(y));
    at(step.integer("combined_x")).tensor.push_back(std::move(out));
  }
  if (options.check) {
    std::vector<std::string> problems = checkGroupedGemm(spec, handle->records, products);
    for (std::string &p : checkCombine(spec, handle->records, combined, topologyOf(spec)))
      problems.push_back(std::move(p));
    report(step, problems);
  }
}

void Executor::moeLayer(const RunStep &step, const PlanKernel &k) {
  const EPSpec &spec = k.spec;
  const int64_t I = k.gemmN, H = spec.hidden, capacity = receiveRows(spec);
  DispatchCalls d = dispatchCalls(step, k);
  const Value &gateUpWeights = at(step.integer("gate_up_weights")),
              &gateUpScales = at(step.integer("gate_up_scales")),
              &downWeights = at(step.integer("down_weights")),
              &downScales = at(step.integer("down_scales"));
  std::vector<MoeLayerCall> calls(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r) {
    // The intermediate rows as the five ops would hold them: padding rows
    // stay as allocated (zero), which the checks require.
    calls[r] = {d.calls[r],
                gateUpWeights.tensor[r].device,
                gateUpScales.tensor[r].device,
                downWeights.tensor[r].device,
                downScales.tensor[r].device,
                allocate("bf16", {capacity, 2 * I}),
                allocate("f8E4M3FN", {capacity, I}),
                allocate("f32", {capacity, I / 128}),
                allocate("bf16", {capacity, H}),
                allocate("bf16", {d.calls[r].x.shape[0], H})};
  }
  buffer.moeLayer(spec, k.dispatchVariant, calls);

  std::vector<DispatchRecord> checked = dispatchResults(step, k, d);
  for (const MoeLayerCall &c : calls)
    at(step.integer("combined_x")).tensor.push_back(received(c.combinedX, c.combinedX.shape[0]));
  if (!options.check)
    return;
  // The intermediate rows (the kernel's own, read back only for the checks).
  std::vector<GemmRecord> gateUp, down;
  std::vector<SwigluRecord> swiglus;
  std::vector<CombineRecord> combined(static_cast<size_t>(R()));
  for (int r = 0; r < R(); ++r) {
    const MoeLayerCall &c = calls[r];
    const DispatchRecord &rec = checked[r];
    const int64_t rows = rec.recvX.rows();
    HostTensor gu = download(c.gateUp, rows), act = download(c.act, rows),
               actScales = download(c.actScales, rows), y = download(c.down, rows);
    gateUp.push_back({rec.recvX, gateUpWeights.tensor[r].host, gu, rec.recvScalePacks,
                      gateUpScales.tensor[r].host});
    swiglus.push_back({gu, act, actScales, rec.recvTopkWeights});
    down.push_back({act, downWeights.tensor[r].host, y, actScales, downScales.tensor[r].host});
    combined[r].x = y;
    combined[r].combinedX = at(step.integer("combined_x")).tensor[r].host;
  }
  // Each step as its own op's check sees it, in the layer's order.
  std::vector<std::string> problems = checkDispatch(spec, true, false, checked, topologyOf(spec));
  auto append = [&](const char *part, std::vector<std::string> more) {
    for (std::string &p : more)
      problems.push_back(std::string(part) + ": " + p);
  };
  append("gate/up GEMM", checkGroupedGemm(spec, checked, gateUp));
  append("SwiGLU", checkSwiglu(spec, checked, swiglus));
  append("down GEMM", checkGroupedGemm(spec, checked, down));
  append("combine", checkCombine(spec, checked, combined, topologyOf(spec)));
  report(step, problems);
}

} // namespace epic::runtime::run
