//===- EntryIR.cpp - the ep entry functions the runtime compiles ----------===//

#include "epic/runtime/EntryIR.h"
#include "epic/runtime/Calls.h"

#include "epic/Dialect/EP/IR/EPLimits.h"

#include <cstdint>
#include <sstream>
#include <stdexcept>

using namespace epic::runtime;

namespace {
void require(bool ok, const std::string &message) {
  if (!ok)
    throw std::invalid_argument(message);
}
std::string dim(int n) { return std::to_string(n); }

/// The kernels' wait bound, when not the compiler's default.
std::string timeoutAttr(const epic::runtime::EPSpec &spec) {
  return spec.timeoutMs
             ? " attributes {epic.timeout_ms = " + std::to_string(spec.timeoutMs) + " : i64}"
             : "";
}
} // namespace

int EPSpec::elementBytes() const {
  if (dtype == "bf16" || dtype == "f16")
    return 2;
  if (dtype == "f32")
    return 4;
  if (isFP8())
    return 1;
  throw std::invalid_argument("dtype must be bf16, f16, f32, f8E4M3FN or f8E5M2, got \"" + dtype +
                              "\"");
}

// The same rules as #ep.config's verifier (the bounds from EPLimits.def), checked before
// anything compiles, with the Python API's argument names.
void EPSpec::validate() const {
  namespace lim = epic::ep::limits;
  // [low, high] of a field (EPLimits.def), named as the Python API spells it.
  auto inRange = [](const lim::Limit &limit, int64_t value, int64_t low = -1) {
    low = low < 0 ? limit.low : low;
    require(value >= low && value <= limit.high,
            std::string(limit.argument) + " must be in [" + std::to_string(low) + ", " +
                std::to_string(limit.high) + "], got " + std::to_string(value));
  };
  inRange(lim::kRanks, ranks);
  inRange(lim::kExperts, experts);
  require(experts % ranks == 0, "num_experts (" + dim(experts) +
                                    ") must be divisible by the number of ranks (" + dim(ranks) +
                                    ")");
  require(experts / ranks <= lim::kMaxLocalExperts, "experts per rank must be at most " +
                                                        std::to_string(lim::kMaxLocalExperts) +
                                                        ", got " + dim(experts / ranks));
  inRange(lim::kTopk, topk);
  require(topk <= experts,
          "num_topk (" + dim(topk) + ") exceeds num_experts (" + dim(experts) + ")");
  inRange(lim::kHidden, hidden);
  int bytes = elementBytes();
  require(hidden * bytes % 16 == 0,
          "hidden (" + dim(hidden) + ") x " + dim(bytes) + " bytes must be a multiple of 16");
  require(hidden % 8 == 0, "hidden (" + dim(hidden) +
                               ") must be a multiple of 8 (combine reduces 8 channels a step)");
  inRange(lim::kScalePacks, scalePacks);
  require(!isFP8() || scalePacks > 0, "FP8 data needs scale packs (num_scale_packs > 0)");
  require(isFP8() || scalePacks == 0,
          "scale packs (" + dim(scalePacks) + ") are only allowed with FP8 data, not " + dtype);
  inRange(lim::kExpertAlignment, expertAlignment);
  inRange(lim::kMaxTokensPerRank, maxTokensPerRank, 1); // a call's cap: at least one token
  inRange(lim::kNumSms, numSms);
  require(timeoutMs >= lim::kMinTimeoutMs && timeoutMs <= lim::kMaxTimeoutMs,
          "the GPU timeout must be in [1, 2^31] ms (0: the default), got " +
              std::to_string(timeoutMs));
  // The kernels index rows and their elements with 32-bit values.
  int64_t rows = receiveRows(*this);
  int64_t widest = lim::widestRowArray(topk, scalePacks);
  require(rows * widest <= lim::kMaxElementIndex,
          "num_max_tokens_per_rank " + dim(maxTokensPerRank) + " needs " + std::to_string(rows) +
              " rows of up to " + std::to_string(widest) +
              " elements (ids and metadata, scale packs): more than the kernels' 32-bit "
              "element indices address (" +
              std::to_string(lim::kMaxElementIndex) + ")");
}

std::string EPSpec::configAttr(bool staticTokenCap) const {
  std::ostringstream os;
  os << "#ep.config<ranks = " << ranks << ", experts = " << experts << ", topk = " << topk
     << ", hidden = " << hidden << ", dtype = " << dtype << ", scale_packs = " << scalePacks
     << ", expert_alignment = " << expertAlignment
     << ", layout = " << (expanded ? "expanded" : "plain") << ", num_sms = " << numSms;
  if (staticTokenCap)
    os << ", max_tokens_per_rank = " << maxTokensPerRank;
  os << ">";
  return os.str();
}

std::string epic::runtime::dispatchEntryIR(const EPSpec &spec, const DispatchVariant &v,
                                           const std::string &name) {
  spec.validate();
  require(v.topkIdxBits == 8 || v.topkIdxBits == 16 || v.topkIdxBits == 32 || v.topkIdxBits == 64,
          "topk_idx must be an 8, 16, 32 or 64-bit integer, got " + dim(v.topkIdxBits) + " bits");
  require(!v.zeroPadding || spec.expanded, "do_zero_padding needs do_expand");
  require(!(v.cached && v.weights), "a cached dispatch takes no topk_weights");
  // The configuration goes in an alias: written inline in the op, the
  // attribute parser would take the `: type` after it as the attribute's type.
  const std::string cfg = "#" + name + "_config";
  const std::string k = dim(spec.topk), h = dim(spec.hidden), p = dim(spec.scalePacks);
  const std::string x = "tensor<?x" + h + "x" + spec.dtype + ">";
  const std::string idx = "tensor<?x" + k + "xi" + dim(v.cached ? 64 : v.topkIdxBits) + ">";
  const std::string sf = "tensor<?x" + p + "xf32>";
  const std::string w = "tensor<?x" + k + "xf32>";
  const std::string handle = "!ep.handle<" + cfg + ">";

  // Operands in the op's syntax order: topk, scales, weights, cached.
  std::string args = "%x: " + x, operands, results = x, values = "%rx";
  if (!v.cached) {
    args += ", %idx: " + idx;
    operands += " topk(%idx : " + idx + ")";
  }
  if (spec.isFP8()) {
    args += ", %sf: " + sf;
    operands += " scales(%sf : " + sf + ")";
    results += ", " + sf;
    values += ", %rsf";
  }
  if (v.weights) {
    args += ", %w: " + w;
    operands += " weights(%w : " + w + ")";
  }
  if (v.cached) {
    args += ", %h: " + handle;
    operands += " cached(%h : " + handle + ")";
  }
  if (!spec.expanded) {
    results += ", " + idx;
    values += ", %ri";
  }
  if (v.weights) {
    results += ", " + (spec.expanded ? std::string("tensor<?xf32>") : w);
    values += ", %rw";
  }
  results += ", " + handle;
  values += ", %h2";
  std::ostringstream os;
  os << cfg << " = " << spec.configAttr() << "\n"
     << "func.func @" << name << "(" << args << ") -> (" << results << ")" << timeoutAttr(spec)
     << " {\n"
     << "  " << values << " = ep.dispatch %x" << operands << (v.zeroPadding ? " zero_padding" : "")
     << " config " << cfg << " : " << x << " -> " << results << "\n"
     << "  return " << values << " : " << results << "\n}\n";
  return os.str();
}

std::string epic::runtime::groupedGemmEntryIR(const EPSpec &spec, int64_t n,
                                              const std::string &outDtype,
                                              const std::string &name) {
  spec.validate();
  require(spec.expanded, "grouped_gemm needs the expanded layout");
  require(spec.dtype == "bf16" || spec.dtype == "f16",
          "grouped_gemm multiplies bf16 or f16 rows, got " + spec.dtype);
  require(n > 0, "grouped_gemm's N must be positive, got " + std::to_string(n));
  require(outDtype == "bf16" || outDtype == "f16" || outDtype == "f32",
          "grouped_gemm's output must be bf16, f16 or f32, got " + outDtype);
  const std::string cfg = "#" + name + "_config";
  const std::string h = dim(spec.hidden), l = dim(spec.experts / spec.ranks);
  const std::string x = "tensor<?x" + h + "x" + spec.dtype + ">";
  const std::string w = "tensor<" + l + "x" + h + "x" + std::to_string(n) + "x" + spec.dtype + ">";
  const std::string y = "tensor<?x" + std::to_string(n) + "x" + outDtype + ">";
  const std::string handle = "!ep.handle<" + cfg + ">";
  std::ostringstream os;
  os << cfg << " = " << spec.configAttr() << "\n"
     << "func.func @" << name << "(%x: " << x << ", %w: " << w << ", %h: " << handle << ") -> " << y
     << timeoutAttr(spec) << " {\n"
     << "  %y = ep.grouped_gemm %x, %w layout(%h : " << handle << ") : " << x << ", " << w << " -> "
     << y << "\n"
     << "  return %y : " << y << "\n}\n";
  return os.str();
}

std::string epic::runtime::dispatchGemmEntryIR(const EPSpec &spec, const DispatchVariant &v,
                                               int64_t n, const std::string &outDtype,
                                               const std::string &name) {
  spec.validate();
  require(spec.expanded, "the fused dispatch + GEMM needs the expanded layout");
  require(!v.cached, "the fused dispatch + GEMM routes tokens: it cannot be a cached dispatch");
  require(spec.dtype == "bf16" || spec.dtype == "f16",
          "the fused dispatch + GEMM multiplies bf16 or f16 rows, got " + spec.dtype);
  require(n > 0, "the expert GEMM's N must be positive, got " + std::to_string(n));
  require(outDtype == "bf16" || outDtype == "f16" || outDtype == "f32",
          "the expert GEMM's output must be bf16, f16 or f32, got " + outDtype);
  const std::string cfg = "#" + name + "_config";
  const std::string k = dim(spec.topk), h = dim(spec.hidden), l = dim(spec.experts / spec.ranks);
  const std::string x = "tensor<?x" + h + "x" + spec.dtype + ">";
  const std::string idx = "tensor<?x" + k + "xi" + dim(v.topkIdxBits) + ">";
  const std::string w = "tensor<?x" + k + "xf32>";
  const std::string e = "tensor<" + l + "x" + h + "x" + std::to_string(n) + "x" + spec.dtype + ">";
  const std::string y = "tensor<?x" + std::to_string(n) + "x" + outDtype + ">";
  const std::string handle = "!ep.handle<" + cfg + ">";
  std::string args = "%x: " + x + ", %idx: " + idx, operands = " topk(%idx : " + idx + ")";
  std::string dispatched = "%rx", types = x;
  if (v.weights) {
    args += ", %w: " + w;
    operands += " weights(%w : " + w + ")";
    dispatched += ", %rw";
    types += ", tensor<?xf32>";
  }
  if (v.zeroPadding)
    operands += " zero_padding";
  std::ostringstream os;
  os << cfg << " = " << spec.configAttr(/*staticTokenCap=*/true) << "\n"
     << "func.func @" << name << "(" << args << ", %e: " << e << ") -> (" << types << ", " << y
     << ", " << handle << ")" << timeoutAttr(spec) << " {\n"
     << "  " << dispatched << ", %h = ep.dispatch %x" << operands << " config " << cfg << " : " << x
     << " -> " << types << ", " << handle << "\n"
     << "  %y = ep.grouped_gemm %rx, %e layout(%h : " << handle << ") : " << x << ", " << e
     << " -> " << y << "\n"
     << "  return " << dispatched << ", %y, %h : " << types << ", " << y << ", " << handle
     << "\n}\n";
  return os.str();
}

std::string epic::runtime::gemmCombineEntryIR(const EPSpec &spec, int biases,
                                              const std::string &name) {
  spec.validate();
  require(spec.expanded, "the fused GEMM + combine needs the expanded layout");
  require(spec.dtype == "bf16" || spec.dtype == "f16",
          "the fused GEMM + combine multiplies bf16 or f16 rows, got " + spec.dtype);
  require(biases >= 0 && biases <= 2, "combine takes 0, 1 or 2 biases, got " + dim(biases));
  const std::string cfg = "#" + name + "_config";
  const std::string h = dim(spec.hidden), l = dim(spec.experts / spec.ranks);
  const std::string x = "tensor<?x" + h + "x" + spec.dtype + ">";
  const std::string w = "tensor<" + l + "x" + h + "x" + h + "x" + spec.dtype + ">";
  const std::string y = "tensor<?x" + h + "xbf16>";
  const std::string handle = "!ep.handle<" + cfg + ">";
  std::string args = "%x: " + x + ", %w: " + w + ", %h: " + handle, bias;
  if (biases) {
    std::string names = "%b0", types = y;
    args += ", %b0: " + y;
    if (biases == 2) {
      args += ", %b1: " + y;
      names += ", %b1";
      types += ", " + y;
    }
    bias = " bias(" + names + " : " + types + ")";
  }
  std::ostringstream os;
  os << cfg << " = " << spec.configAttr(/*staticTokenCap=*/true) << "\n"
     << "func.func @" << name << "(" << args << ") -> (" << y << ", " << y << ")"
     << timeoutAttr(spec) << " {\n"
     << "  %y = ep.grouped_gemm %x, %w layout(%h : " << handle << ") : " << x << ", " << w << " -> "
     << y << "\n"
     << "  %out = ep.combine %y, %h" << bias << " : " << y << ", " << handle << " -> " << y << "\n"
     << "  return %y, %out : " << y << ", " << y << "\n}\n";
  return os.str();
}

std::string epic::runtime::combineEntryIR(const EPSpec &spec, const CombineVariant &v,
                                          const std::string &name) {
  spec.validate();
  require(v.biases >= 0 && v.biases <= 2, "combine takes 0, 1 or 2 biases, got " + dim(v.biases));
  const std::string cfg = "#" + name + "_config";
  const std::string h = dim(spec.hidden), k = dim(spec.topk);
  const std::string x = "tensor<?x" + h + "xbf16>";
  const std::string w = spec.expanded ? "tensor<?xf32>" : "tensor<?x" + k + "xf32>";
  const std::string handle = "!ep.handle<" + cfg + ">";
  std::string args = "%y: " + x + ", %h: " + handle, operands, results = x, values = "%out";
  if (v.weights) {
    args += ", %w: " + w;
    operands += " weights(%w : " + w + ")";
    results += ", tensor<?x" + k + "xf32>";
    values += ", %ow";
  }
  if (v.biases) {
    std::string names = "%b0", types = x;
    args += ", %b0: " + x;
    if (v.biases == 2) {
      args += ", %b1: " + x;
      names += ", %b1";
      types += ", " + x;
    }
    operands += " bias(" + names + " : " + types + ")";
  }
  std::ostringstream os;
  os << cfg << " = " << spec.configAttr() << "\n"
     << "func.func @" << name << "(" << args << ") -> (" << results << ")" << timeoutAttr(spec)
     << " {\n"
     << "  " << values << " = ep.combine %y, %h" << operands << " : " << x << ", " << handle
     << " -> " << results << "\n"
     << "  return " << values << " : " << results << "\n}\n";
  return os.str();
}
