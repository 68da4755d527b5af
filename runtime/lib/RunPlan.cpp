//===- RunPlan.cpp - run plans: parsing, inputs, printing (host only) -----===//

#include "epic/runtime/RunProgram.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

using namespace epic::runtime;

namespace {

enum class Kind { undefined, index, tensor, handle };

const char *kindName(Kind kind) {
  switch (kind) {
  case Kind::index:
    return "an index";
  case Kind::tensor:
    return "a tensor";
  case Kind::handle:
    return "a handle";
  default:
    return "undefined";
  }
}

void read(const Json &j, int &value) { value = int(j.integer()); }
void read(const Json &j, bool &value) { value = j.flag(); }
void read(const Json &j, std::string &value) { value = j.text(); }

/// An ep op's configuration, spelled as a kernel request's (the compiler
/// writes it so, lowering/lib/RunPlan).
EPSpec specFrom(const Json &j) {
  EPSpec s;
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) read(j.at(name), s.member);
#include "epic/runtime/KernelRequest.def"
  return s;
}

/// Checks value ids while a plan is parsed: defined once, used after.
struct ValueTable {
  std::vector<Kind> kinds;
  std::string where;

  [[noreturn]] void fail(const std::string &what) const {
    throw std::runtime_error("run plan: " + where + ": " + what);
  }
  void define(const RunStep &step, const char *field, Kind kind, bool optional = false) {
    define(step.integer(field), field, kind, optional);
  }
  void define(int64_t id, const std::string &field, Kind kind, bool optional = false) {
    if (optional && id < 0)
      return;
    if (id < 0 || id >= int64_t(kinds.size()))
      fail(field + " is value " + std::to_string(id) + ", outside the plan's " +
           std::to_string(kinds.size()) + " values");
    if (kinds[id] != Kind::undefined)
      fail(field + " defines value " + std::to_string(id) + " a second time");
    kinds[id] = kind;
  }
  void use(int64_t id, const std::string &field, Kind kind, bool optional = false) const {
    if (optional && id < 0)
      return;
    if (id < 0 || id >= int64_t(kinds.size()) || kinds[id] == Kind::undefined)
      fail(field + " uses value " + std::to_string(id) + " before it is defined");
    if (kind != Kind::undefined && kinds[id] != kind)
      fail(field + " must be " + kindName(kind) + ", value " + std::to_string(id) + " is " +
           kindName(kinds[id]));
  }
  /// A combine's biases: at most two tensors.
  void useBiases(const RunStep &step) const {
    const auto &biases = step.fields.at("biases").list();
    if (biases.size() > 2)
      fail("at most two biases");
    for (const Json &bias : biases)
      use(bias.integer(), "biases", Kind::tensor);
  }
  void use(const RunStep &step, const char *field, Kind kind, bool optional = false) const {
    use(step.integer(field), field, kind, optional);
  }
};

/// splitmix64: a good 64-bit mix, the generator's whole state is a counter.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t streamKey(int64_t seed, int rank, uint64_t salt) {
  return mix(mix(uint64_t(seed) ^ 0x5eedull) ^ (uint64_t(rank) << 32) ^ salt);
}
/// Uniform in [0, 1) with 53 random bits.
double unit(uint64_t bits) { return double(bits >> 11) * 0x1.0p-53; }

} // namespace

KernelRequest PlanKernel::request() const {
  switch (kind) {
  case KernelKind::dispatch:
    return dispatchRequest(spec, dispatchVariant);
  case KernelKind::combine:
    return combineRequest(spec, combineVariant);
  case KernelKind::groupedGemm:
    return groupedGemmRequest(spec, gemmN, gemmOutDtype, "", gemmK);
  case KernelKind::swiglu:
    return swigluRequest(spec, gemmN, gemmInDtype, gemmOutDtype);
  case KernelKind::dispatchGemm:
    return dispatchGemmRequest(spec, dispatchVariant, gemmN, gemmOutDtype);
  case KernelKind::gemmCombine:
    return gemmCombineRequest(spec, combineVariant.biases);
  case KernelKind::moeLayer:
    return moeLayerRequest(spec, dispatchVariant.topkIdxBits, gemmN);
  case KernelKind::dispatchLayout:
    return dispatchLayoutRequest(spec);
  case KernelKind::engramFetch:
    return engramFetchRequest(spec);
  }
  throw std::logic_error("PlanKernel::request: unknown kind");
}

RunPlan RunPlan::parse(const std::string &text) {
  Json json;
  try {
    json = Json::parse(text);
  } catch (const std::exception &e) {
    throw std::runtime_error(std::string("run plan: not JSON: ") + e.what());
  }
  RunPlan plan;
  try {
    if (json.kind != Json::Kind::object || !json.object.count("epic_run_plan"))
      throw std::runtime_error("run plan: not an epic run plan (no \"epic_run_plan\" version)");
    if (json.at("epic_run_plan").integer() != 1)
      throw std::runtime_error("run plan: version " +
                               std::to_string(json.at("epic_run_plan").integer()) +
                               " is not supported (this runtime reads version 1)");
    plan.ranks = int(json.at("ranks").integer());
    plan.values = json.at("values").integer();
    if (plan.ranks < 1)
      throw std::runtime_error("run plan: ranks must be positive");
    plan.gpusPerNode = plan.ranks;
    if (json.object.count("gpus_per_node")) {
      plan.gpusPerNode = int(json.at("gpus_per_node").integer());
      if (plan.gpusPerNode < 1 || plan.ranks % plan.gpusPerNode)
        throw std::runtime_error("run plan: gpus_per_node (" + std::to_string(plan.gpusPerNode) +
                                 ") must divide ranks (" + std::to_string(plan.ranks) + ")");
    }
    for (const Json &step : json.at("steps").list())
      plan.steps.push_back({step.at("op").text(), step.at("loc").text(), step});
  } catch (const std::runtime_error &e) {
    if (std::string(e.what()).rfind("run plan:", 0) == 0)
      throw;
    throw std::runtime_error(std::string("run plan: malformed: ") + e.what());
  }

  ValueTable values{std::vector<Kind>(size_t(std::max<int64_t>(0, plan.values)), Kind::undefined),
                    ""};
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const RunStep &step = plan.steps[i];
    values.where = "step " + std::to_string(i) + " (" + step.op + " at " + step.loc + ")";
    try {
      if (step.op == "tokens") {
        const auto &counts = step.fields.at("per_rank").list();
        if (int(counts.size()) != plan.ranks)
          values.fail("per_rank has " + std::to_string(counts.size()) + " entries for " +
                      std::to_string(plan.ranks) + " ranks");
        for (const Json &count : counts)
          if (count.integer() < 0)
            values.fail("a negative token count");
        values.define(step, "result", Kind::index);
      } else if (step.op == "constant") {
        step.integer("value");
        values.define(step, "result", Kind::index);
      } else if (step.op == "dim") {
        values.use(step, "source", Kind::tensor);
        if (step.integer("dim") < 0 || step.integer("dim") > 1)
          values.fail("dim must be 0 or 1 (tensors of run programs are 2-D)");
        values.define(step, "result", Kind::index);
      } else if (step.op == "random") {
        values.use(step, "rows", Kind::index);
        const std::string &d = step.fields.at("distribution").text();
        if (d != "normal" && d != "uniform")
          values.fail("unknown distribution \"" + d + "\"");
        dtypeBytes(step.fields.at("dtype").text());
        if (step.integer("cols") < 1)
          values.fail("cols must be positive");
        if (step.fields.object.count("row_shape")) { // a 3-D tensor: [rows, D1, D2]
          int64_t elements = 1;
          for (const Json &d : step.fields.at("row_shape").list())
            elements *= d.integer() > 0 ? d.integer() : 0;
          if (elements != step.integer("cols"))
            values.fail("row_shape's elements must be cols (" +
                        std::to_string(step.integer("cols")) + ")");
        }
        // The run dialect's rules (run.random's verifier).
        double scale = step.fields.at("scale").real();
        if (!(scale > 0) || std::isinf(scale))
          values.fail("scale must be positive and finite, got " + std::to_string(scale));
        step.integer("seed");
        values.define(step, "result", Kind::tensor);
      } else if (step.op == "routing") {
        values.use(step, "rows", Kind::index);
        if (step.integer("topk") < 1 || step.integer("topk") > step.integer("experts"))
          values.fail("topk must be in [1, experts]");
        double masked = step.fields.at("masked").real(); // run.routing's verifier
        if (!(masked >= 0 && masked <= 1))
          values.fail("masked must be a probability in [0, 1], got " + std::to_string(masked));
        step.integer("seed");
        values.define(step, "result", Kind::tensor);
      } else if (step.op == "dispatch") {
        specFrom(step.fields.at("spec")).validate();
        values.use(step, "x", Kind::tensor);
        values.use(step, "topk_idx", Kind::tensor, true);
        values.use(step, "scale_packs", Kind::tensor, true);
        values.use(step, "topk_weights", Kind::tensor, true);
        values.use(step, "cached_handle", Kind::handle, true);
        bool cached = step.fields.at("cached").flag();
        if (cached != (step.integer("cached_handle") >= 0) ||
            cached == (step.integer("topk_idx") >= 0))
          values.fail("a dispatch takes either topk_idx or a cached handle");
        values.define(step, "recv_x", Kind::tensor);
        for (const char *field : {"recv_scale_packs", "recv_topk_idx", "recv_topk_weights"})
          values.define(step, field, Kind::tensor, true);
        values.define(step, "handle", Kind::handle);
      } else if (step.op == "combine") {
        specFrom(step.fields.at("spec")).validate();
        values.use(step, "x", Kind::tensor);
        values.use(step, "handle", Kind::handle);
        values.use(step, "topk_weights", Kind::tensor, true);
        values.useBiases(step);
        values.define(step, "combined_x", Kind::tensor);
        values.define(step, "combined_topk_weights", Kind::tensor, true);
      } else if (step.op == "dispatch_layout") {
        specFrom(step.fields.at("spec")).validate();
        values.use(step, "topk_idx", Kind::tensor);
        for (const char *field :
             {"num_tokens_per_rank", "num_tokens_per_expert", "is_token_in_rank"})
          values.define(step, field, Kind::tensor);
      } else if (step.op == "grouped_gemm" || step.op == "dispatch_gemm") {
        specFrom(step.fields.at("spec")).validate();
        if (step.integer("n") < 1)
          values.fail("n must be positive");
        const std::string &out = step.fields.at("out_dtype").text();
        if (out != "bf16" && out != "f16" && out != "f32")
          values.fail("out_dtype must be bf16, f16 or f32, got \"" + out + "\"");
        values.use(step, "x", Kind::tensor);
        if (step.op == "grouped_gemm") {
          values.use(step, "weights", Kind::tensor);
          values.use(step, "handle", Kind::handle);
          // FP8: the rows' and the weights' block scales, both or neither.
          values.use(step, "x_scales", Kind::tensor, true);
          values.use(step, "weight_scales", Kind::tensor, true);
          if ((step.integer("x_scales") >= 0) != (step.integer("weight_scales") >= 0))
            values.fail("an FP8 grouped_gemm takes x_scales and weight_scales, both or neither");
          if (step.integer("k") < 1)
            values.fail("k (the rows' width) must be positive, got " +
                        std::to_string(step.integer("k")));
          values.define(step, "result", Kind::tensor);
        } else {
          values.use(step, "topk_idx", Kind::tensor);
          values.use(step, "topk_weights", Kind::tensor, true);
          values.use(step, "experts", Kind::tensor);
          values.define(step, "recv_x", Kind::tensor);
          values.define(step, "recv_topk_weights", Kind::tensor, true);
          values.define(step, "result", Kind::tensor);
          values.define(step, "handle", Kind::handle);
        }
      } else if (step.op == "swiglu") {
        specFrom(step.fields.at("spec")).validate();
        const int64_t n = step.integer("n");
        if (n < 1 || n % 128)
          values.fail("n (the intermediate size) must be a positive multiple of 128, got " +
                      std::to_string(n));
        const std::string &in = step.fields.at("in_dtype").text();
        const std::string &out = step.fields.at("out_dtype").text();
        if (in != "bf16" && in != "f16" && in != "f32")
          values.fail("in_dtype must be bf16, f16 or f32, got \"" + in + "\"");
        if (out != "bf16" && out != "f16" && out != "f32" && out != "f8E4M3FN")
          values.fail("out_dtype must be bf16, f16, f32 or f8E4M3FN, got \"" + out + "\"");
        values.use(step, "gate_up", Kind::tensor);
        values.use(step, "handle", Kind::handle);
        values.use(step, "weights", Kind::tensor, true);
        values.define(step, "result", Kind::tensor);
        values.define(step, "scales", Kind::tensor, true);
        if ((out == "f8E4M3FN") != (step.integer("scales") >= 0))
          values.fail("an f8E4M3FN result comes with its scales, another result without");
      } else if (step.op == "moe_layer") {
        specFrom(step.fields.at("spec")).validate();
        const int64_t n = step.integer("n");
        if (n < 1 || n % 128)
          values.fail("n (the intermediate size) must be a positive multiple of 128, got " +
                      std::to_string(n));
        for (const char *field : {"x", "topk_idx", "scale_packs", "topk_weights", "gate_up_weights",
                                  "gate_up_scales", "down_weights", "down_scales"})
          values.use(step, field, Kind::tensor);
        values.define(step, "combined_x", Kind::tensor);
      } else if (step.op == "gemm_combine") {
        specFrom(step.fields.at("spec")).validate();
        values.use(step, "x", Kind::tensor);
        values.use(step, "weights", Kind::tensor);
        values.use(step, "handle", Kind::handle);
        values.useBiases(step);
        values.define(step, "result", Kind::tensor);
        values.define(step, "combined_x", Kind::tensor);
      } else if (step.op == "all_gather") {
        const auto &inputs = step.fields.at("inputs").list();
        const auto &gathered = step.fields.at("gathered").list();
        if (inputs.empty() || inputs.size() != gathered.size())
          values.fail("an all_gather gathers one tensor per input (" +
                      std::to_string(inputs.size()) + " inputs, " +
                      std::to_string(gathered.size()) + " results)");
        for (const Json &input : inputs)
          values.use(input.integer(), "inputs", Kind::tensor);
        for (const Json &result : gathered)
          values.define(result.integer(), "gathered", Kind::tensor);
      } else if (step.op == "reduce_scatter") {
        values.use(step, "input", Kind::tensor);
        values.define(step, "result", Kind::tensor);
      } else if (step.op == "pp_send_recv") {
        const std::string &to = step.fields.at("to").text();
        if (to != "next" && to != "prev")
          values.fail("to must be \"next\" or \"prev\", got \"" + to + "\"");
        values.use(step, "input", Kind::tensor);
        values.define(step, "result", Kind::tensor);
      } else if (step.op == "print") {
        values.use(step, "value", Kind::undefined);
        if (step.integer("rows") < 0)
          values.fail("rows must be non-negative");
      } else {
        values.fail("unknown op \"" + step.op + "\"");
      }
    } catch (const std::invalid_argument &e) {
      values.fail(e.what());
    } catch (const std::runtime_error &e) {
      if (std::string(e.what()).rfind("run plan:", 0) == 0)
        throw;
      values.fail(std::string("malformed: ") + e.what());
    }
  }
  return plan;
}

bool epic::runtime::isKernelStep(const RunStep &step) {
  return step.op == "dispatch" || step.op == "combine" || step.op == "dispatch_layout" ||
         step.op == "grouped_gemm" || step.op == "swiglu" || step.op == "dispatch_gemm" ||
         step.op == "gemm_combine" || step.op == "moe_layer";
}

std::vector<PlanKernel> RunPlan::kernels() const {
  std::vector<PlanKernel> out;
  for (const RunStep &step : steps) {
    if (!isKernelStep(step))
      continue;
    PlanKernel k;
    k.kind = kindNamed(step.op);
    k.spec = specFrom(step.fields.at("spec"));
    k.loc = step.loc;
    if (k.kind == KernelKind::moeLayer) { // an FP8 dispatch with weights, never cached
      k.dispatchVariant.weights = true;
      k.gemmN = step.integer("n");
    } else if (k.kind == KernelKind::dispatch || k.kind == KernelKind::dispatchGemm) {
      k.dispatchVariant.cached = k.kind == KernelKind::dispatch && step.fields.at("cached").flag();
      k.dispatchVariant.weights = step.integer("topk_weights") >= 0;
      k.dispatchVariant.zeroPadding = step.fields.at("zero_padding").flag();
    } else if (k.kind == KernelKind::combine) {
      k.combineVariant.weights = step.integer("topk_weights") >= 0;
      k.combineVariant.biases = int(step.fields.at("biases").list().size());
    } else if (k.kind == KernelKind::gemmCombine) { // rows only: no weights travel back
      k.combineVariant.biases = int(step.fields.at("biases").list().size());
    }
    if (k.kind == KernelKind::groupedGemm || k.kind == KernelKind::dispatchGemm) {
      k.gemmN = step.integer("n");
      k.gemmOutDtype = step.fields.at("out_dtype").text();
    }
    if (k.kind == KernelKind::groupedGemm)
      k.gemmK = step.integer("k");
    if (k.kind == KernelKind::swiglu) {
      k.gemmN = step.integer("n");
      k.gemmInDtype = step.fields.at("in_dtype").text();
      k.gemmOutDtype = step.fields.at("out_dtype").text();
    }
    out.push_back(k);
  }
  return out;
}

HostTensor epic::runtime::randomTensor(const std::string &distribution, double scale, int64_t seed,
                                       int rank, int64_t rows, int64_t cols,
                                       const std::string &dtype) {
  HostTensor t(dtype, {rows, cols});
  const uint64_t key = streamKey(seed, rank, 1);
  const int bytes = dtypeBytes(dtype);
  for (int64_t i = 0; i < rows * cols; ++i) {
    double value;
    if (distribution == "normal") {
      // Box-Muller on two uniforms of this element's counter.
      double u1 = unit(mix(key ^ mix(2 * uint64_t(i)))),
             u2 = unit(mix(key ^ mix(2 * uint64_t(i) + 1)));
      value = scale * std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2 * M_PI * u2);
    } else if (distribution == "uniform") {
      value = scale * unit(mix(key ^ mix(uint64_t(i))));
    } else {
      throw std::invalid_argument("distribution must be normal or uniform, got \"" + distribution +
                                  "\"");
    }
    storeElement(dtype, value, t.data.data() + size_t(i) * bytes);
  }
  return t;
}

HostTensor epic::runtime::randomRouting(int64_t experts, double masked, int64_t seed, int rank,
                                        int64_t rows, int64_t topk) {
  if (topk < 1 || topk > experts)
    throw std::invalid_argument("topk must be in [1, experts]");
  HostTensor t("i64", {rows, topk});
  int64_t *idx = t.as<int64_t>();
  const uint64_t key = streamKey(seed, rank, 2);
  std::vector<int64_t> pool(static_cast<size_t>(experts));
  for (int64_t row = 0; row < rows; ++row) {
    uint64_t state = mix(key ^ mix(uint64_t(row)));
    for (int64_t e = 0; e < experts; ++e)
      pool[e] = e;
    for (int64_t j = 0; j < topk; ++j) { // partial Fisher-Yates: distinct experts
      state = mix(state);
      int64_t pick = j + int64_t(state % uint64_t(experts - j));
      std::swap(pool[j], pool[pick]);
      state = mix(state);
      idx[row * topk + j] = unit(state) < masked ? -1 : pool[j];
    }
  }
  return t;
}

uint64_t epic::runtime::rowChecksum(const HostTensor &tensor, const std::vector<int64_t> &rows) {
  uint64_t sum = 0;
  for (int64_t i : rows) {
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a of the row's bytes
    const uint8_t *p = tensor.row(i);
    for (size_t b = 0; b < tensor.rowBytes(); ++b)
      h = (h ^ p[b]) * 0x100000001b3ull;
    sum += mix(h);
  }
  return sum;
}

void epic::runtime::printTensor(std::FILE *out, const HostTensor &tensor,
                                const std::vector<int64_t> &rows, int64_t show) {
  std::string shape;
  for (size_t i = 0; i < tensor.shape.size(); ++i)
    shape += (i ? "x" : "") + std::to_string(tensor.shape[i]);
  std::fprintf(out, "%s[%s] checksum %016llx\n", tensor.dtype.c_str(), shape.c_str(),
               (unsigned long long)rowChecksum(tensor, rows));
  const bool integer = tensor.dtype == "i32" || tensor.dtype == "i64";
  const int64_t columns = tensor.rowElements(), shown = std::min<int64_t>(columns, 8);
  for (int64_t k = 0; k < std::min<int64_t>(show, int64_t(rows.size())); ++k) {
    int64_t i = rows[k];
    std::fprintf(out, "      row %lld:", (long long)i);
    for (int64_t c = 0; c < shown; ++c) {
      double v = tensor.at(i * columns + c);
      if (integer)
        std::fprintf(out, " %lld", (long long)v);
      else
        std::fprintf(out, " %.5g", v);
    }
    std::fprintf(out, "%s\n", columns > shown ? " ..." : "");
  }
}
