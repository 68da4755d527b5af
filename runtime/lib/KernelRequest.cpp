//===- KernelRequest.cpp - what the runtime asks the compiler for ---------===//

#include "epic/runtime/KernelRequest.h"
#include "epic/runtime/Calls.h"
#include "epic/runtime/Json.h"

#include "epic/Dialect/EP/IR/EPLimits.h"

#include <cctype>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <type_traits>

using namespace epic::runtime;

// The .def's types are the members' types: a request writes what the
// runtime holds, and the compiler reads it back as the same type.
#define EP_REQUEST_MEMBER_TYPE(Struct, member, Type)                                               \
  static_assert(std::is_same_v<decltype(Struct::member), Type>,                                    \
                "KernelRequest.def: " #Struct "::" #member " is not " #Type);
#define EP_REQUEST_HEADER(member, name, Type) EP_REQUEST_MEMBER_TYPE(KernelRequest, member, Type)
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) EP_REQUEST_MEMBER_TYPE(EPSpec, member, Type)
#define EP_REQUEST_SPEC_FIELD EP_REQUEST_CONFIG_FIELD
#define EP_REQUEST_DISPATCH_FIELD(member, name, Type)                                              \
  EP_REQUEST_MEMBER_TYPE(DispatchVariant, member, Type)
#define EP_REQUEST_COMBINE_FIELD(member, name, Type)                                               \
  EP_REQUEST_MEMBER_TYPE(CombineVariant, member, Type)
#define EP_REQUEST_GEMM_FIELD(member, name, Type) EP_REQUEST_MEMBER_TYPE(GemmVariant, member, Type)
#include "epic/runtime/KernelRequest.def"
#undef EP_REQUEST_MEMBER_TYPE

namespace {

void require(bool ok, const std::string &message) {
  if (!ok)
    throw std::invalid_argument(message);
}
std::string dim(int64_t n) { return std::to_string(n); }

/// A row of KernelRequest.def's kinds.
struct KindInfo {
  KernelKind kind;
  const char *name, *entryName;
  bool dispatch, combine, gemm, staticTokenCap;
};
const KindInfo kKinds[] = {
#define EP_REQUEST_KIND(Enumerator, kind, entryName, dispatch, combine, gemm, staticTokenCap)      \
  {KernelKind::Enumerator, kind, entryName, dispatch, combine, gemm, staticTokenCap},
#include "epic/runtime/KernelRequest.def"
};
const KindInfo &infoOf(KernelKind kind) { return kKinds[static_cast<int>(kind)]; }

#define EP_REQUEST_SECTION(Name, key) constexpr const char *k##Name##Section = key;
#include "epic/runtime/KernelRequest.def"

void add(JsonObjectWriter &out, const char *name, KernelKind kind) {
  out.add(name, kindName(kind));
}
template <typename T> void add(JsonObjectWriter &out, const char *name, const T &value) {
  out.add(name, value);
}

/// A symbol the compiler can name its kernels after (`<name>_send`, ...).
bool isEntryName(const std::string &name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])))
    return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '$')
      return false;
  return true;
}

/// What the expert GEMM asks of the rows it multiplies; `entry` names the
/// kind in the message. `fp8`: the grouped GEMM also multiplies e4m3 rows
/// (with their block scales); the fused kernels do not.
void requireGemmRows(const EPSpec &spec, const std::string &entry, bool fp8 = false) {
  require(spec.expanded, entry + " needs the expanded layout");
  require(spec.dtype == "bf16" || spec.dtype == "f16" || (fp8 && spec.dtype == "f8E4M3FN"),
          entry + " multiplies bf16" + (fp8 ? ", f16 or f8E4M3FN" : " or f16") + " rows, got " +
              spec.dtype);
}

/// The GEMM's N and output type; `gemmName` names the GEMM ("grouped_gemm's").
void requireGemmShape(const EPSpec &spec, const GemmVariant &gemm, const std::string &gemmName) {
  require(gemm.inDtype == spec.dtype, gemmName + " rows are the configuration's " + spec.dtype +
                                          ": gemm.in_dtype must say so, got \"" + gemm.inDtype +
                                          "\"");
  require(gemm.n > 0, gemmName + " N must be positive, got " + dim(gemm.n));
  require(gemm.k >= 0, gemmName + " K must be positive (0: the hidden size), got " + dim(gemm.k));
  require(gemm.outDtype == "bf16" || gemm.outDtype == "f16" || gemm.outDtype == "f32",
          gemmName + " output must be bf16, f16 or f32, got " + gemm.outDtype);
}

} // namespace

const char *epic::runtime::kindName(KernelKind kind) { return infoOf(kind).name; }

const char *epic::runtime::defaultEntryName(KernelKind kind) { return infoOf(kind).entryName; }

KernelKind epic::runtime::kindNamed(const std::string &name) {
  std::string names;
  for (const KindInfo &info : kKinds) {
    if (name == info.name)
      return info.kind;
    names += names.empty() ? "" : &info == &kKinds[std::size(kKinds) - 1] ? " or " : ", ";
    names += info.name;
  }
  throw std::invalid_argument("kind must be " + names + ", got \"" + name + "\"");
}

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
  inRange(lim::kScaleupRanks, scaleupRanks);
  require(scaleupRanks <= ranks && (scaleupRanks == 0 || ranks % scaleupRanks == 0),
          "num_scaleup_ranks (" + dim(scaleupRanks) + ") must divide the number of ranks (" +
              dim(ranks) + ")");
  if (hybrid) {
    const int perNode = ranksPerNode();
    require(ranks / perNode > 1, "hybrid mode needs more than one node (num_scaleup_ranks " +
                                     dim(perNode) + " of " + dim(ranks) + " ranks)");
    inRange(lim::kHybridNodes, ranks / perNode);
    inRange(lim::kHybridRanksPerNode, perNode);
    // recv_src_metadata column 1 is item x K + master slot, item < N x Tmax.
    require(int64_t(ranks / perNode) * maxTokensPerRank * topk <= lim::kMaxElementIndex,
            "num_max_tokens_per_rank " + dim(maxTokensPerRank) + ": hybrid metadata holds item x " +
                "K + slot with item < " + dim(ranks / perNode) + " nodes x Tmax, which exceeds " +
                std::to_string(lim::kMaxElementIndex) + " at top-" + dim(topk));
  }
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

void KernelRequest::validate() const {
  require(version == kKernelRequestVersion,
          "version must be " + dim(kKernelRequestVersion) +
              " (the kernel request format this runtime writes), got " + dim(version));
  require(isEntryName(name), "name must be an entry function name (letters, digits, _, . and $, "
                             "not starting with a digit), got \"" +
                                 name + "\"");
  spec.validate();
  const DispatchVariant &d = dispatch;
  switch (kind) {
  case KernelKind::dispatch:
  case KernelKind::combine:
    break;
  case KernelKind::groupedGemm:
    requireGemmRows(spec, "grouped_gemm", /*fp8=*/true);
    requireGemmShape(spec, gemm, "grouped_gemm's");
    break;
  case KernelKind::dispatchGemm:
    require(!d.cached, "the fused dispatch + GEMM routes tokens: it cannot be a cached dispatch");
    requireGemmRows(spec, "the fused dispatch + GEMM");
    requireGemmShape(spec, gemm, "the expert GEMM's");
    require(gemm.k == 0, "the fused dispatch + GEMM multiplies the dispatch's rows: gemm.k must "
                         "be 0 (the hidden size), got " +
                             dim(gemm.k));
    break;
  case KernelKind::swiglu: {
    require(spec.expanded, "swiglu runs on an expanded dispatch's rows (one per (token, local "
                           "expert) pair): the configuration's layout is plain");
    require(gemm.n > 0 && gemm.n % 128 == 0,
            "swiglu's intermediate size (gemm.n) must be a positive multiple of 128, got " +
                dim(gemm.n));
    require(gemm.k == 2 * gemm.n, "swiglu's gate/up rows (gemm.k) are twice its intermediate "
                                  "size (gemm.n = " +
                                      dim(gemm.n) + "), got " + dim(gemm.k));
    require(gemm.inDtype == "bf16" || gemm.inDtype == "f16" || gemm.inDtype == "f32",
            "swiglu's gate/up rows (gemm.in_dtype) must be bf16, f16 or f32, got \"" +
                gemm.inDtype + "\"");
    const std::string &out = gemm.outDtype;
    require(out == "bf16" || out == "f16" || out == "f32" || out == "f8E4M3FN",
            "swiglu's result (gemm.out_dtype) must be bf16, f16, f32 or f8E4M3FN, got \"" + out +
                "\"");
    break;
  }
  case KernelKind::dispatchLayout:
    require(!d.cached && !d.weights && !d.zeroPadding,
            "dispatch_layout counts a routing table: its dispatch section holds topk_idx_bits "
            "only (weights, cached and zero_padding false)");
    break;
  case KernelKind::gemmCombine:
    requireGemmRows(spec, "the fused GEMM + combine");
    require(!combine.weights, "the fused GEMM + combine takes no topk_weights");
    break;
  case KernelKind::moeLayer:
    require(spec.expanded && spec.dtype == "f8E4M3FN" && spec.hidden % 128 == 0 &&
                spec.scalePacks == spec.hidden / 128,
            "the MoE layer runs FP8 rows of the expanded layout with a scale per 128 channels: "
            "dtype f8E4M3FN, expanded, scale_packs = hidden / 128");
    require(spec.ranksPerNode() == spec.ranks, "the MoE layer's kernel stores into NVLink peers "
                                               "only: every rank in one NVLink domain");
    require(d.weights && !d.cached && !d.zeroPadding,
            "the MoE layer routes its tokens with their weights (weights true, cached and "
            "zero_padding false)");
    require(!combine.weights && combine.biases == 0,
            "the MoE layer's combine sums the weighted rows: no weights, no biases");
    require(gemm.n > 0 && gemm.n % 128 == 0,
            "the MoE layer's intermediate size (gemm.n) must be a positive multiple of 128, got " +
                dim(gemm.n));
    require(gemm.inDtype == "f8E4M3FN" && gemm.outDtype == "bf16" && gemm.k == 0,
            "the MoE layer's gemm section holds its intermediate size only (in_dtype f8E4M3FN, "
            "out_dtype bf16, k 0)");
    break;
  case KernelKind::lowLatencyDispatch:
  case KernelKind::lowLatencyCombine: {
    const bool dispatching = kind == KernelKind::lowLatencyDispatch;
    const bool fp8 = spec.dtype == "f8E4M3FN";
    require(dispatching ? (fp8 || spec.dtype == "bf16") : spec.dtype == "bf16",
            dispatching ? "the low-latency dispatch's dtype (the received rows) must be bf16 or "
                          "f8E4M3FN, got " +
                              spec.dtype
                        : "the low-latency combine's dtype must be bf16, got " + spec.dtype);
    require(spec.hidden % 128 == 0,
            "low-latency mode needs hidden to be a multiple of 128, got " + dim(spec.hidden));
    require(spec.scalePacks == (fp8 ? spec.hidden / 128 : 0) && spec.expertAlignment == 1 &&
                !spec.expanded && !spec.hybrid && spec.ranksPerNode() == spec.ranks,
            "low-latency mode's configuration is normalized: scale_packs = hidden / 128 for "
            "FP8 rows (else 0), expert_alignment = 1, plain, one NVLink domain "
            "(lowLatencyDispatchRequest / lowLatencyCombineRequest make it)");
    require(!d.cached && !d.weights && !d.zeroPadding && !d.windowOutputs,
            "low-latency mode's dispatch section holds topk_idx_bits, round_scale and use_ue8m0 "
            "only");
    require(dispatching ? (!d.useUe8m0 || d.roundScale) && (fp8 || !d.roundScale)
                        : !d.roundScale && !d.useUe8m0,
            dispatching ? "use_ue8m0 needs round_scale, and both need FP8 rows"
                        : "the low-latency combine has no round_scale or use_ue8m0");
    break;
  }
  case KernelKind::engramFetch: {
    const bool fp8 = spec.dtype.rfind("f8", 0) == 0;
    require(spec.experts == spec.ranks && spec.topk == 1 && spec.scalePacks == (fp8 ? 1 : 0) &&
                spec.expertAlignment == 1 && !spec.expanded && !spec.hybrid,
            "engram_fetch's configuration is normalized: experts = ranks, topk = 1, "
            "scale_packs = 1 for FP8 rows (else 0), expert_alignment = 1, plain, direct "
            "(engramFetchRequest makes it)");
    break;
  }
  }
  const KindInfo &info = infoOf(kind);
  if (kind != KernelKind::lowLatencyDispatch)
    require(!d.roundScale && !d.useUe8m0,
            "round_scale and use_ue8m0 are options of the low-latency dispatch only");
  if (info.dispatch) {
    require(d.topkIdxBits == 8 || d.topkIdxBits == 16 || d.topkIdxBits == 32 || d.topkIdxBits == 64,
            "topk_idx must be an 8, 16, 32 or 64-bit integer, got " + dim(d.topkIdxBits) + " bits");
    require(!d.zeroPadding || spec.expanded, "do_zero_padding needs do_expand");
    require(!(d.cached && d.weights), "a cached dispatch takes no topk_weights");
  }
  if (info.combine)
    require(combine.biases >= 0 && combine.biases <= 2,
            "combine takes 0, 1 or 2 biases, got " + dim(combine.biases));
  const bool window = (info.dispatch && d.windowOutputs) || (info.combine && combine.windowOutputs);
  if (window) {
    require(kind == KernelKind::dispatch || kind == KernelKind::combine,
            "window_outputs is a dispatch's or a combine's option, not " + std::string(info.name) +
                "'s");
    require(spec.ranksPerNode() == spec.ranks,
            "window_outputs needs every rank in one NVLink domain (scaleup_ranks = ranks): "
            "senders store into the destination's window by its NVLink pointer");
  }
}

std::string KernelRequest::json() const {
  validate();
  const KindInfo &info = infoOf(kind);
  // What the kernels are specialized on, and nothing else: the token cap only
  // where the kind keeps it, the routing's width only where it is read.
  EPSpec config = spec;
  if (!info.staticTokenCap)
    config.maxTokensPerRank = 0;
  DispatchVariant routed = dispatch;
  if (routed.cached)
    routed.topkIdxBits = 64;

  JsonObjectWriter out;
#define EP_REQUEST_HEADER(member, name, Type) add(out, name, member);
#include "epic/runtime/KernelRequest.def"
  JsonObjectWriter specJson;
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) add(specJson, name, config.member);
#define EP_REQUEST_SPEC_FIELD EP_REQUEST_CONFIG_FIELD
#include "epic/runtime/KernelRequest.def"
  out.add(kSpecSection, specJson);
  if (info.dispatch) {
    JsonObjectWriter section;
#define EP_REQUEST_DISPATCH_FIELD(member, name, Type) add(section, name, routed.member);
#include "epic/runtime/KernelRequest.def"
    out.add(kDispatchSection, section);
  }
  if (info.combine) {
    JsonObjectWriter section;
#define EP_REQUEST_COMBINE_FIELD(member, name, Type) add(section, name, combine.member);
#include "epic/runtime/KernelRequest.def"
    out.add(kCombineSection, section);
  }
  if (info.gemm) {
    JsonObjectWriter section;
#define EP_REQUEST_GEMM_FIELD(member, name, Type) add(section, name, gemm.member);
#include "epic/runtime/KernelRequest.def"
    out.add(kGemmSection, section);
  }
  return out.str();
}

namespace {
/// A validated request of `kind`, named `name` or the kind's default.
KernelRequest request(KernelKind kind, const EPSpec &spec, std::string name) {
  KernelRequest r;
  r.kind = kind;
  r.name = name.empty() ? defaultEntryName(kind) : std::move(name);
  r.spec = spec;
  return r;
}
KernelRequest validated(KernelRequest r) {
  r.validate();
  return r;
}
} // namespace

KernelRequest epic::runtime::dispatchRequest(const EPSpec &spec, const DispatchVariant &variant,
                                             std::string name) {
  KernelRequest r = request(KernelKind::dispatch, spec, std::move(name));
  r.dispatch = variant;
  return validated(std::move(r));
}

KernelRequest epic::runtime::combineRequest(const EPSpec &spec, const CombineVariant &variant,
                                            std::string name) {
  KernelRequest r = request(KernelKind::combine, spec, std::move(name));
  r.combine = variant;
  return validated(std::move(r));
}

KernelRequest epic::runtime::groupedGemmRequest(const EPSpec &spec, int64_t n,
                                                const std::string &outDtype, std::string name,
                                                int64_t k) {
  KernelRequest r = request(KernelKind::groupedGemm, spec, std::move(name));
  r.gemm = {n, outDtype, k == spec.hidden ? 0 : k, spec.dtype};
  return validated(std::move(r));
}

KernelRequest epic::runtime::swigluRequest(const EPSpec &spec, int64_t inter,
                                           const std::string &inDtype, const std::string &outDtype,
                                           std::string name) {
  KernelRequest r = request(KernelKind::swiglu, spec, std::move(name));
  r.gemm = {inter, outDtype, 2 * inter, inDtype};
  return validated(std::move(r));
}

KernelRequest epic::runtime::dispatchGemmRequest(const EPSpec &spec, const DispatchVariant &variant,
                                                 int64_t n, const std::string &outDtype,
                                                 std::string name) {
  KernelRequest r = request(KernelKind::dispatchGemm, spec, std::move(name));
  r.dispatch = variant;
  r.gemm = {n, outDtype, 0, spec.dtype};
  return validated(std::move(r));
}

KernelRequest epic::runtime::dispatchLayoutRequest(const EPSpec &spec, int topkIdxBits,
                                                   std::string name) {
  KernelRequest r = request(KernelKind::dispatchLayout, spec, std::move(name));
  r.dispatch.topkIdxBits = topkIdxBits;
  return validated(std::move(r));
}

KernelRequest epic::runtime::engramFetchRequest(const EPSpec &spec, std::string name) {
  EPSpec s = spec;
  s.experts = s.ranks, s.topk = 1, s.expertAlignment = 1, s.expanded = false, s.hybrid = false;
  s.scalePacks = s.dtype.rfind("f8", 0) == 0 ? 1 : 0;
  return validated(request(KernelKind::engramFetch, s, std::move(name)));
}

namespace {
/// Low-latency mode's configuration: what the kernels are specialized on.
EPSpec lowLatencySpec(const EPSpec &spec) {
  EPSpec s = spec;
  s.scalePacks = s.dtype == "f8E4M3FN" ? s.hidden / 128 : 0;
  s.expertAlignment = 1, s.expanded = false, s.hybrid = false;
  return s;
}
} // namespace

KernelRequest epic::runtime::lowLatencyDispatchRequest(const EPSpec &spec, int topkIdxBits,
                                                       bool roundScale, bool useUe8m0,
                                                       std::string name) {
  KernelRequest r = request(KernelKind::lowLatencyDispatch, lowLatencySpec(spec), std::move(name));
  r.dispatch.topkIdxBits = topkIdxBits;
  r.dispatch.roundScale = roundScale;
  r.dispatch.useUe8m0 = useUe8m0;
  return validated(std::move(r));
}

KernelRequest epic::runtime::lowLatencyCombineRequest(const EPSpec &spec, int topkIdxBits,
                                                      std::string name) {
  EPSpec s = spec;
  s.dtype = "bf16";
  KernelRequest r = request(KernelKind::lowLatencyCombine, lowLatencySpec(s), std::move(name));
  r.dispatch.topkIdxBits = topkIdxBits;
  return validated(std::move(r));
}

KernelRequest epic::runtime::gemmCombineRequest(const EPSpec &spec, int biases, std::string name) {
  KernelRequest r = request(KernelKind::gemmCombine, spec, std::move(name));
  r.combine.biases = biases;
  return validated(std::move(r));
}

KernelRequest epic::runtime::moeLayerRequest(const EPSpec &spec, int topkIdxBits, int64_t inter,
                                             std::string name) {
  KernelRequest r = request(KernelKind::moeLayer, spec, std::move(name));
  r.dispatch.weights = true;
  r.dispatch.topkIdxBits = topkIdxBits;
  r.gemm = {inter, "bf16", 0, spec.dtype};
  return validated(std::move(r));
}
