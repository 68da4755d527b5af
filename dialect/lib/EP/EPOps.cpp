//===- EPOps.cpp - ep dialect operations ----------------------------------===//

#include "epic/Dialect/EP/IR/EPDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace epic::ep;

//===----------------------------------------------------------------------===//
// Shape helpers shared by the verifiers
//===----------------------------------------------------------------------===//

namespace {
/// Checks a ranked tensor against an expected shape, where kDynamic in
/// `expected` means "any size" and a dynamic size in the tensor matches
/// anything. Errors name the operand or result and the dimension.
struct ShapeChecker {
  Operation *op;

  LogicalResult rank(StringRef name, ShapedType type, int64_t rank) const {
    if (type.getRank() != rank)
      return op->emitOpError() << name << " must have rank " << rank << ", got " << type;
    return success();
  }

  LogicalResult dim(StringRef name, ShapedType type, unsigned index, int64_t expected,
                    StringRef what) const {
    if (expected == ShapedType::kDynamic || type.isDynamicDim(index))
      return success();
    if (type.getDimSize(index) != expected)
      return op->emitOpError() << name << " dimension " << index << " (" << what << ") must be "
                               << expected << ", got " << type.getDimSize(index);
    return success();
  }

  LogicalResult staticDim(StringRef name, ShapedType type, unsigned index, int64_t expected,
                          StringRef what) const {
    if (type.isDynamicDim(index))
      return op->emitOpError() << name << " dimension " << index << " (" << what
                               << ") must be static";
    return dim(name, type, index, expected, what);
  }

  LogicalResult elementType(StringRef name, ShapedType type, Type expected) const {
    if (type.getElementType() != expected)
      return op->emitOpError() << name << " element type must be " << expected << ", got "
                               << type.getElementType();
    return success();
  }

  /// No bound (`max` empty) when the token cap is a run-time value.
  LogicalResult maxDim(StringRef name, ShapedType type, unsigned index, std::optional<uint64_t> max,
                       StringRef what) const {
    if (max && !type.isDynamicDim(index) && uint64_t(type.getDimSize(index)) > *max)
      return op->emitOpError() << name << " dimension " << index << " (" << what << ") is "
                               << type.getDimSize(index) << ", more than the maximum " << *max;
    return success();
  }

  /// Two token dimensions that must agree when both are static.
  LogicalResult sameDim(StringRef nameA, ShapedType a, StringRef nameB, ShapedType b,
                        StringRef what) const {
    if (a.isDynamicDim(0) || b.isDynamicDim(0) || a.getDimSize(0) == b.getDimSize(0))
      return success();
    return op->emitOpError() << nameA << " and " << nameB << " disagree on " << what << ": "
                             << a.getDimSize(0) << " vs " << b.getDimSize(0);
  }
};

ShapedType shaped(Value v) { return cast<ShapedType>(v.getType()); }
ShapedType shaped(Type t) { return cast<ShapedType>(t); }
} // namespace

//===----------------------------------------------------------------------===//
// DispatchLayoutOp
//===----------------------------------------------------------------------===//

LogicalResult epic::ep::verifyOnHost(Operation *op) {
  for (Operation *parent = op->getParentOp(); parent; parent = parent->getParentOp())
    if (parent->getName().getStringRef() == "gpu.func" ||
        parent->getName().getStringRef() == "gpu.module")
      return op->emitOpError("is a host-level op (it becomes kernels and their launch): it "
                             "cannot be inside ")
             << parent->getName();
  return success();
}

LogicalResult DispatchLayoutOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  ShapedType idx = shaped(getTopkIdx());
  ShapedType perRank = shaped(getNumTokensPerRank());
  ShapedType perExpert = shaped(getNumTokensPerExpert());
  ShapedType inRank = shaped(getIsTokenInRank());
  if (failed(check.staticDim("topk_idx", idx, 1, cfg.getTopk(), "top-k")) ||
      failed(check.maxDim("topk_idx", idx, 0, cfg.getTokenCap(), "tokens")) ||
      failed(check.staticDim("num_tokens_per_rank", perRank, 0, cfg.getRanks(), "ranks")) ||
      failed(check.staticDim("num_tokens_per_expert", perExpert, 0, cfg.getExperts(), "experts")) ||
      failed(check.staticDim("is_token_in_rank", inRank, 1, cfg.getRanks(), "ranks")) ||
      failed(check.sameDim("topk_idx", idx, "is_token_in_rank", inRank, "the token count")))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// DispatchOp
//===----------------------------------------------------------------------===//

/// The result types a dispatch has for these operands: the single source of
/// truth for the builder; the verifier accepts static refinements of them.
static void inferDispatchResultTypes(ConfigAttr cfg, Value topkIdx, Value scalePacks,
                                     Value topkWeights, Type &recvX, Type &recvScales,
                                     Type &recvIdx, Type &recvWeights, Type &handle) {
  MLIRContext *ctx = cfg.getContext();
  int64_t dyn = ShapedType::kDynamic;
  int64_t k = cfg.getTopk();
  recvX = RankedTensorType::get({dyn, int64_t(cfg.getHidden())}, cfg.getDtype());
  recvScales = scalePacks ? RankedTensorType::get({dyn, int64_t(cfg.getScalePacks())},
                                                  shaped(scalePacks).getElementType())
                          : Type();
  Type idxElem = topkIdx ? shaped(topkIdx).getElementType() : IntegerType::get(ctx, 64);
  recvIdx = cfg.isExpanded() ? Type() : RankedTensorType::get({dyn, k}, idxElem);
  Type f32 = Float32Type::get(ctx);
  recvWeights = !topkWeights       ? Type()
                : cfg.isExpanded() ? RankedTensorType::get({dyn}, f32)
                                   : RankedTensorType::get({dyn, k}, f32);
  handle = HandleType::get(ctx, cfg);
}

void DispatchOp::build(OpBuilder &builder, OperationState &state, ConfigAttr config, Value x,
                       Value topkIdx, Value scalePacks, Value topkWeights, Value cachedHandle,
                       bool zeroPadding) {
  Type recvX, recvScales, recvIdx, recvWeights, handle;
  inferDispatchResultTypes(config, topkIdx, scalePacks, topkWeights, recvX, recvScales, recvIdx,
                           recvWeights, handle);
  build(builder, state, recvX, recvScales, recvIdx, recvWeights, handle, config, x, topkIdx,
        scalePacks, topkWeights, cachedHandle, zeroPadding);
}

/// `window_outputs`: senders (or gathering origins) reach every peer's
/// window by its NVLink pointer, so every rank is in one NVLink domain.
static LogicalResult verifyWindowOutputs(Operation *op, bool windowOutputs, ConfigAttr cfg) {
  if (!windowOutputs || !cfg.isMultiNode())
    return success();
  return op->emitOpError("window_outputs needs one NVLink domain: peers' windows are reached by "
                         "their NVLink pointers, and the configuration spans ")
         << cfg.getNumNodes() << " nodes of " << cfg.getRanksPerNode() << " ranks";
}

LogicalResult DispatchOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  int64_t hidden = cfg.getHidden(), k = cfg.getTopk();
  int64_t packs = cfg.getScalePacks();
  ShapedType x = shaped(getX());

  // Inputs: this rank's T tokens.
  if (failed(check.elementType("x", x, cfg.getDtype())) ||
      failed(check.staticDim("x", x, 1, hidden, "hidden")) ||
      failed(check.maxDim("x", x, 0, cfg.getTokenCap(), "tokens")))
    return failure();

  if (getZeroPadding() && !cfg.isExpanded())
    return emitOpError("zero_padding needs the expanded layout: the plain layout "
                       "has no padding rows");
  if (failed(verifyWindowOutputs(*this, getWindowOutputs(), cfg)))
    return failure();
  if (getTopkIdx() && getCachedHandle())
    return emitOpError("takes either topk(...) or cached(...), not both: a "
                       "cached dispatch reuses the handle's routing");
  if (!getTopkIdx() && !getCachedHandle())
    return emitOpError("needs topk(...) routing or a cached(...) handle");
  if (getCachedHandle() && getTopkWeights())
    return emitOpError("takes no weights(...) with cached(...): a cached "
                       "dispatch moves rows along the handle's routing, which "
                       "has no weights (DeepEP's cached dispatch takes none)");

  if (Value idx = getTopkIdx()) {
    if (failed(check.staticDim("topk_idx", shaped(idx), 1, k, "top-k")) ||
        failed(check.sameDim("x", x, "topk_idx", shaped(idx), "the token count")))
      return failure();
  }
  if (Value handle = getCachedHandle()) {
    ConfigAttr handleCfg = cast<HandleType>(handle.getType()).getConfig();
    if (handleCfg != cfg)
      return emitOpError("cached handle was made by a dispatch with another "
                         "configuration: ")
             << handleCfg << " vs " << cfg;
  }

  if (cfg.isFP8() && !getScalePacks())
    return emitOpError("FP8 data (") << cfg.getDtype() << ") needs scales(...) scale packs";
  if (!cfg.isFP8() && getScalePacks())
    return emitOpError("scale packs are only allowed with FP8 data, not ") << cfg.getDtype();
  if (Value sf = getScalePacks()) {
    if (failed(check.staticDim("scale_packs", shaped(sf), 1, packs, "packs per row")) ||
        failed(check.sameDim("x", x, "scale_packs", shaped(sf), "the token count")))
      return failure();
  }
  if (Value w = getTopkWeights()) {
    if (failed(check.staticDim("topk_weights", shaped(w), 1, k, "top-k")) ||
        failed(check.sameDim("x", x, "topk_weights", shaped(w), "the token count")))
      return failure();
  }

  // Results: which ones exist follows from the operands and the layout.
  if (static_cast<bool>(getRecvScalePacks()) != static_cast<bool>(getScalePacks()))
    return emitOpError("has a recv_scale_packs result iff it has scale packs");
  if (static_cast<bool>(getRecvTopkIdx()) == cfg.isExpanded())
    return emitOpError(cfg.isExpanded() ? "with the expanded layout has no recv_topk_idx "
                                          "result"
                                        : "with the plain layout needs a recv_topk_idx "
                                          "result");
  if (static_cast<bool>(getRecvTopkWeights()) != static_cast<bool>(getTopkWeights()))
    return emitOpError("has a recv_topk_weights result iff it has weights");

  ShapedType recvX = shaped(getRecvX());
  std::optional<uint64_t> maxRows = cfg.getMaxOutputRows();
  if (failed(check.elementType("recv_x", recvX, cfg.getDtype())) ||
      failed(check.staticDim("recv_x", recvX, 1, hidden, "hidden")) ||
      failed(check.maxDim("recv_x", recvX, 0, maxRows, "received rows")))
    return failure();
  if (Value sf = getRecvScalePacks()) {
    if (failed(check.elementType("recv_scale_packs", shaped(sf),
                                 shaped(getScalePacks()).getElementType())) ||
        failed(check.staticDim("recv_scale_packs", shaped(sf), 1, packs, "packs per row")) ||
        failed(check.sameDim("recv_x", recvX, "recv_scale_packs", shaped(sf),
                             "the received row count")))
      return failure();
  }
  if (Value idx = getRecvTopkIdx()) {
    if ((getTopkIdx() && failed(check.elementType("recv_topk_idx", shaped(idx),
                                                  shaped(getTopkIdx()).getElementType()))) ||
        failed(check.staticDim("recv_topk_idx", shaped(idx), 1, k, "top-k")) ||
        failed(
            check.sameDim("recv_x", recvX, "recv_topk_idx", shaped(idx), "the received row count")))
      return failure();
  }
  if (Value w = getRecvTopkWeights()) {
    ShapedType wt = shaped(w);
    if (failed(check.rank("recv_topk_weights", wt, cfg.isExpanded() ? 1 : 2)) ||
        (!cfg.isExpanded() && failed(check.staticDim("recv_topk_weights", wt, 1, k, "top-k"))) ||
        failed(check.sameDim("recv_x", recvX, "recv_topk_weights", wt, "the received row count")))
      return failure();
  }
  if (cast<HandleType>(getHandle().getType()).getConfig() != cfg)
    return emitOpError("result handle type must carry the op's configuration");
  return success();
}

/// Result types are printed as a plain list; which optional results are in it
/// follows from the operands already parsed (scale packs, weights) and the
/// configuration's layout (recv_topk_idx only in the plain layout).
static ParseResult parseDispatchResultTypes(OpAsmParser &parser, Type &recvX, Type &recvScales,
                                            Type &recvIdx, Type &recvWeights, Type &handle,
                                            Type scalePacksType, Type topkWeightsType,
                                            ConfigAttr config) {
  if (parser.parseType(recvX))
    return failure();
  if (scalePacksType && (parser.parseComma() || parser.parseType(recvScales)))
    return failure();
  if (!config.isExpanded() && (parser.parseComma() || parser.parseType(recvIdx)))
    return failure();
  if (topkWeightsType && (parser.parseComma() || parser.parseType(recvWeights)))
    return failure();
  return failure(parser.parseComma() || parser.parseType(handle));
}

static void printDispatchResultTypes(OpAsmPrinter &printer, Operation *, Type recvX,
                                     Type recvScales, Type recvIdx, Type recvWeights, Type handle,
                                     Type, Type, ConfigAttr) {
  printer << recvX;
  for (Type t : {recvScales, recvIdx, recvWeights, handle})
    if (t)
      printer << ", " << t;
}

/// ep.dispatch_gemm's results: recv_x, recv_topk_weights iff weights were
/// given, the GEMM's result, the handle.
static ParseResult parseDispatchGemmResultTypes(OpAsmParser &parser, Type &recvX, Type &recvWeights,
                                                Type &result, Type &handle, Type topkWeightsType) {
  if (parser.parseType(recvX) ||
      (topkWeightsType && (parser.parseComma() || parser.parseType(recvWeights))))
    return failure();
  return failure(parser.parseComma() || parser.parseType(result) || parser.parseComma() ||
                 parser.parseType(handle));
}

static void printDispatchGemmResultTypes(OpAsmPrinter &printer, Operation *, Type recvX,
                                         Type recvWeights, Type result, Type handle, Type) {
  printer << recvX;
  for (Type t : {recvWeights, result, handle})
    if (t)
      printer << ", " << t;
}

//===----------------------------------------------------------------------===//
// CombineOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedGemmOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  if (!cfg.isExpanded())
    return emitOpError("needs the expanded layout (one row per (token, local expert) pair, "
                       "grouped by expert); the handle's configuration is plain");
  ShapedType lhs = shaped(getLhs()), rhs = shaped(getRhs()), out = shaped(getResult());
  const int64_t local = cfg.getNumLocalExperts();
  // K: the rows' width, the hidden size for the dispatch's rows, an expert's intermediate
  // size for its down GEMM's.
  if (lhs.isDynamicDim(1))
    return emitOpError("lhs dimension 1 (K) must be static");
  const int64_t k = lhs.getDimSize(1);
  if (failed(check.maxDim("lhs", lhs, 0, cfg.getMaxOutputRows(), "rows")))
    return failure();
  if (cfg.getDtype() != lhs.getElementType())
    return emitOpError("lhs element type ")
           << lhs.getElementType() << " differs from the dispatch's " << cfg.getDtype();
  if (failed(check.elementType("rhs", rhs, lhs.getElementType())))
    return failure();
  const bool fp8 = isa<Float8E4M3FNType>(lhs.getElementType());
  if (bool(getLhsScales()) != bool(getRhsScales()))
    return emitOpError("takes both block scales (lhs_scales and rhs_scales) or neither");
  if (fp8 && !getLhsScales())
    return emitOpError("FP8 rows need their block scales: scales(lhs_scales, rhs_scales)");
  if (!fp8 && getLhsScales())
    return emitOpError("scales apply to FP8 rows only; lhs is ") << lhs.getElementType();
  if (!fp8) {
    if (failed(check.staticDim("rhs", rhs, 0, local, "local experts")) ||
        failed(check.staticDim("rhs", rhs, 1, k, "K")))
      return failure();
    if (rhs.isDynamicDim(2))
      return emitOpError("rhs dimension 2 (N) must be static");
    if (failed(check.staticDim("result", out, 1, rhs.getDimSize(2), "N")) ||
        failed(check.sameDim("lhs", lhs, "result", out, "the row count")))
      return failure();
    return success();
  }
  // FP8: [L, N, K] weights (K contiguous), block scales per 128 channels.
  constexpr int64_t block = 128;
  if (failed(check.staticDim("rhs", rhs, 0, local, "local experts")) ||
      failed(check.staticDim("rhs", rhs, 2, k, "K")))
    return failure();
  if (rhs.isDynamicDim(1))
    return emitOpError("rhs dimension 1 (N) must be static");
  const int64_t n = rhs.getDimSize(1);
  if (k % block || n % block)
    return emitOpError("FP8 block scales cover 128 channels: K (")
           << k << ") and N (" << n << ") must be multiples of 128";
  ShapedType lhsScales = shaped(getLhsScales()), rhsScales = shaped(getRhsScales());
  if (!lhsScales.isDynamicDim(1) && lhsScales.getDimSize(1) != k / block)
    return emitOpError("lhs_scales dimension 1 (K / 128) must be ")
           << k / block << ", got " << lhsScales.getDimSize(1)
           << (lhsScales.getDimSize(1) == int64_t(cfg.getScalePacks())
                   ? ": the dispatch's scale packs, UE8M0-packed scales are not multiplied yet"
                   : "");
  if (failed(check.staticDim("lhs_scales", lhsScales, 1, k / block, "K / 128")) ||
      failed(check.sameDim("lhs", lhs, "lhs_scales", lhsScales, "the row count")) ||
      failed(check.staticDim("rhs_scales", rhsScales, 0, local, "local experts")) ||
      failed(check.staticDim("rhs_scales", rhsScales, 1, n / block, "N / 128")) ||
      failed(check.staticDim("rhs_scales", rhsScales, 2, k / block, "K / 128")) ||
      failed(check.staticDim("result", out, 1, n, "N")) ||
      failed(check.sameDim("lhs", lhs, "result", out, "the row count")))
    return failure();
  return success();
}

LogicalResult SwigluOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  if (!cfg.isExpanded())
    return emitOpError("needs the expanded layout (one row per (token, local expert) pair, "
                       "grouped by expert); the handle's configuration is plain");
  ShapedType in = shaped(getGateUp()), out = shaped(getResult());
  if (in.isDynamicDim(1))
    return emitOpError("gate_up dimension 1 (2 x the intermediate size) must be static");
  constexpr int64_t block = 128;
  const int64_t width = in.getDimSize(1);
  if (width % (2 * block))
    return emitOpError("gate_up holds the gate then the up columns of 128-channel blocks: its ")
           << width << " columns must be a multiple of 256";
  if (failed(check.maxDim("gate_up", in, 0, cfg.getMaxOutputRows(), "rows")) ||
      failed(check.staticDim("result", out, 1, width / 2, "the intermediate size")) ||
      failed(check.sameDim("gate_up", in, "result", out, "the row count")))
    return failure();
  if (getWeights()) {
    ShapedType weights = shaped(getWeights());
    if (!in.isDynamicDim(0) && !weights.isDynamicDim(0) &&
        in.getDimSize(0) != weights.getDimSize(0))
      return emitOpError("weights has ") << weights.getDimSize(0) << " rows, gate_up "
                                         << in.getDimSize(0) << ": one weight per row";
  }
  const bool fp8 = isa<Float8E4M3FNType>(out.getElementType());
  if (fp8 && !getScales())
    return emitOpError("an FP8 result comes with its block scales: add a second result, f32 "
                       "[rows, ")
           << width / 2 / block << "]";
  if (!fp8 && getScales())
    return emitOpError("block scales come with FP8 results only; the result is ")
           << out.getElementType();
  if (fp8) {
    ShapedType scales = shaped(getScales());
    if (failed(check.staticDim("scales", scales, 1, width / 2 / block, "I / 128")) ||
        failed(check.sameDim("gate_up", in, "scales", scales, "the row count")))
      return failure();
  }
  return success();
}

LogicalResult DispatchGemmOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  if (!cfg.isExpanded())
    return emitOpError("fuses an expanded dispatch: the configuration's layout is plain");
  if (cfg.isFP8())
    return emitOpError("multiplies BF16 or F16 rows; the configuration dispatches ")
           << cfg.getDtype();
  if (!cfg.hasStaticTokenCap())
    return emitOpError("needs max_tokens_per_rank in its configuration: the fused kernel sizes "
                       "its tile counters by it");
  if (cfg.isMultiNode())
    return emitOpError("needs one NVLink domain: the configuration spans ")
           << cfg.getNumNodes() << " nodes of " << cfg.getRanksPerNode() << " ranks";
  int64_t hidden = cfg.getHidden(), k = cfg.getTopk(), local = cfg.getNumLocalExperts();
  ShapedType x = shaped(getX()), rows = shaped(getRecvX()), w = shaped(getExperts()),
             out = shaped(getResult());
  if (failed(check.elementType("x", x, cfg.getDtype())) ||
      failed(check.staticDim("x", x, 1, hidden, "hidden")) ||
      failed(check.maxDim("x", x, 0, cfg.getTokenCap(), "tokens")) ||
      failed(check.staticDim("topk_idx", shaped(getTopkIdx()), 1, k, "top-k")) ||
      failed(check.sameDim("x", x, "topk_idx", shaped(getTopkIdx()), "the token count")))
    return failure();
  if (Value tw = getTopkWeights())
    if (failed(check.staticDim("topk_weights", shaped(tw), 1, k, "top-k")) ||
        failed(check.sameDim("x", x, "topk_weights", shaped(tw), "the token count")))
      return failure();
  if (static_cast<bool>(getRecvTopkWeights()) != static_cast<bool>(getTopkWeights()))
    return emitOpError("has a recv_topk_weights result iff it has weights");
  if (failed(check.elementType("recv_x", rows, cfg.getDtype())) ||
      failed(check.staticDim("recv_x", rows, 1, hidden, "hidden")) ||
      failed(check.maxDim("recv_x", rows, 0, cfg.getMaxOutputRows(), "rows")) ||
      failed(check.elementType("experts", w, cfg.getDtype())) ||
      failed(check.staticDim("experts", w, 0, local, "local experts")) ||
      failed(check.staticDim("experts", w, 1, hidden, "hidden")))
    return failure();
  if (w.isDynamicDim(2))
    return emitOpError("experts dimension 2 (N) must be static");
  if (failed(check.staticDim("result", out, 1, w.getDimSize(2), "N")) ||
      failed(check.sameDim("recv_x", rows, "result", out, "the row count")))
    return failure();
  if (cast<HandleType>(getHandle().getType()).getConfig() != cfg)
    return emitOpError("handle type must carry the op's configuration");
  return success();
}

LogicalResult MoeLayerOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  constexpr int64_t block = 128; // DeepSeek's scale block: channels, and 128 x 128 weights
  if (!cfg.isExpanded())
    return emitOpError("runs an expanded dispatch's rows: the configuration's layout is plain");
  if (cfg.getDtype() != Float8E4M3FNType::get(getContext()))
    return emitOpError("runs the FP8 layer: the configuration must dispatch f8E4M3FN, not ")
           << cfg.getDtype();
  int64_t hidden = cfg.getHidden(), k = cfg.getTopk(), local = cfg.getNumLocalExperts();
  if (hidden % block || cfg.getScalePacks() != hidden / block)
    return emitOpError("needs one f32 scale per 128 channels: scale_packs must be hidden / 128 = ")
           << hidden / block << " (hidden " << hidden << " a multiple of 128), got "
           << cfg.getScalePacks();
  if (!cfg.hasStaticTokenCap())
    return emitOpError("needs max_tokens_per_rank in its configuration: the kernel's "
                       "intermediate rows are sized by it");
  if (cfg.isMultiNode())
    return emitOpError("needs one NVLink domain: the configuration spans ")
           << cfg.getNumNodes() << " nodes of " << cfg.getRanksPerNode() << " ranks";
  ShapedType x = shaped(getX()), idx = shaped(getTopkIdx()), sf = shaped(getScales()),
             w = shaped(getTopkWeights()), w13 = shaped(getGateUpWeights()),
             s13 = shaped(getGateUpScales()), w2 = shaped(getDownWeights()),
             s2 = shaped(getDownScales()), out = shaped(getCombinedX());
  if (failed(check.staticDim("x", x, 1, hidden, "hidden")) ||
      failed(check.maxDim("x", x, 0, cfg.getTokenCap(), "tokens")) ||
      failed(check.staticDim("topk_idx", idx, 1, k, "top-k")) ||
      failed(check.sameDim("x", x, "topk_idx", idx, "the token count")) ||
      failed(check.staticDim("scales", sf, 1, hidden / block, "hidden / 128")) ||
      failed(check.sameDim("x", x, "scales", sf, "the token count")) ||
      failed(check.staticDim("topk_weights", w, 1, k, "top-k")) ||
      failed(check.sameDim("x", x, "topk_weights", w, "the token count")) ||
      failed(check.staticDim("combined_x", out, 1, hidden, "hidden")) ||
      failed(check.sameDim("x", x, "combined_x", out, "the token count")))
    return failure();
  if (failed(check.staticDim("down_weights", w2, 0, local, "local experts")) ||
      failed(check.staticDim("down_weights", w2, 1, hidden, "hidden")) ||
      failed(check.staticDim("down_weights", w2, 2, ShapedType::kDynamic, "I")))
    return failure();
  int64_t inter = w2.getDimSize(2);
  if (inter % block)
    return emitOpError("down_weights dimension 2 (I) must be a multiple of 128 (the SwiGLU's "
                       "FP8 scale blocks), got ")
           << inter;
  if (failed(check.staticDim("gate_up_weights", w13, 0, local, "local experts")) ||
      failed(check.staticDim("gate_up_weights", w13, 1, 2 * inter, "2 I")) ||
      failed(check.staticDim("gate_up_weights", w13, 2, hidden, "hidden")) ||
      failed(check.staticDim("gate_up_scales", s13, 0, local, "local experts")) ||
      failed(check.staticDim("gate_up_scales", s13, 1, 2 * inter / block, "2 I / 128")) ||
      failed(check.staticDim("gate_up_scales", s13, 2, hidden / block, "hidden / 128")) ||
      failed(check.staticDim("down_scales", s2, 0, local, "local experts")) ||
      failed(check.staticDim("down_scales", s2, 1, hidden / block, "hidden / 128")) ||
      failed(check.staticDim("down_scales", s2, 2, inter / block, "I / 128")))
    return failure();
  return success();
}

LogicalResult GemmCombineOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  if (!cfg.isExpanded())
    return emitOpError("needs the expanded layout: the handle's configuration is plain");
  if (!cfg.hasStaticTokenCap())
    return emitOpError("needs max_tokens_per_rank in its configuration: the fused kernel sizes "
                       "its scratch by it");
  if (cfg.isMultiNode())
    return emitOpError("needs one NVLink domain: the configuration spans ")
           << cfg.getNumNodes() << " nodes of " << cfg.getRanksPerNode() << " ranks";
  int64_t hidden = cfg.getHidden(), local = cfg.getNumLocalExperts();
  ShapedType lhs = shaped(getLhs()), rhs = shaped(getRhs()), y = shaped(getResult()),
             out = shaped(getCombinedX());
  if (lhs.getElementType() != cfg.getDtype())
    return emitOpError("lhs element type ")
           << lhs.getElementType() << " differs from the dispatch's " << cfg.getDtype();
  if (failed(check.staticDim("lhs", lhs, 1, hidden, "hidden")) ||
      failed(check.maxDim("lhs", lhs, 0, cfg.getMaxOutputRows(), "rows")) ||
      failed(check.elementType("rhs", rhs, lhs.getElementType())) ||
      failed(check.staticDim("rhs", rhs, 0, local, "local experts")) ||
      failed(check.staticDim("rhs", rhs, 1, hidden, "hidden")) ||
      failed(check.staticDim("rhs", rhs, 2, hidden, "N: the combine sends hidden-wide rows")) ||
      failed(check.staticDim("result", y, 1, hidden, "hidden")) ||
      failed(check.sameDim("lhs", lhs, "result", y, "the row count")) ||
      failed(check.staticDim("combined_x", out, 1, hidden, "hidden")) ||
      failed(check.maxDim("combined_x", out, 0, cfg.getTokenCap(), "tokens")))
    return failure();
  if (getBiases().size() > 2)
    return emitOpError("takes at most two biases, got ") << getBiases().size();
  for (auto [i, bias] : llvm::enumerate(getBiases())) {
    std::string name = "bias #" + std::to_string(i);
    if (failed(check.staticDim(name, shaped(bias), 1, hidden, "hidden")) ||
        failed(check.sameDim("combined_x", out, name, shaped(bias), "the token count")))
      return failure();
  }
  return success();
}

LogicalResult CombineOp::verify() {
  ConfigAttr cfg = getConfig();
  ShapeChecker check{*this};
  int64_t hidden = cfg.getHidden(), k = cfg.getTopk();
  ShapedType x = shaped(getX());
  if (failed(check.staticDim("x", x, 1, hidden, "hidden")) ||
      failed(check.maxDim("x", x, 0, cfg.getMaxOutputRows(), "rows")))
    return failure();
  if ((2 * uint64_t(hidden)) % 16 != 0)
    return emitOpError("combine moves bf16 rows of hidden x 2 = ")
           << 2 * hidden << " bytes, which must be a multiple of 16";
  if (failed(verifyWindowOutputs(*this, getWindowOutputs(), cfg)))
    return failure();

  if (Value w = getTopkWeights()) {
    ShapedType wt = shaped(w);
    if (failed(check.rank("topk_weights", wt, cfg.isExpanded() ? 1 : 2)) ||
        (!cfg.isExpanded() && failed(check.staticDim("topk_weights", wt, 1, k, "top-k"))) ||
        failed(check.sameDim("x", x, "topk_weights", wt, "the row count")))
      return failure();
  }

  if (getBiases().size() > 2)
    return emitOpError("takes at most two biases, got ") << getBiases().size();
  ShapedType out = shaped(getCombinedX());
  if (failed(check.staticDim("combined_x", out, 1, hidden, "hidden")) ||
      failed(check.maxDim("combined_x", out, 0, cfg.getTokenCap(), "tokens")))
    return failure();
  for (auto [i, bias] : llvm::enumerate(getBiases())) {
    std::string name = "bias #" + std::to_string(i);
    if (failed(check.staticDim(name, shaped(bias), 1, hidden, "hidden")) ||
        failed(check.sameDim("combined_x", out, name, shaped(bias), "the token count")))
      return failure();
  }

  if (static_cast<bool>(getCombinedTopkWeights()) != static_cast<bool>(getTopkWeights()))
    return emitOpError("has a combined_topk_weights result iff it has weights");
  if (Value w = getCombinedTopkWeights()) {
    if (failed(check.staticDim("combined_topk_weights", shaped(w), 1, k, "top-k")) ||
        failed(check.sameDim("combined_x", out, "combined_topk_weights", shaped(w),
                             "the token count")))
      return failure();
  }
  return success();
}

static ParseResult parseCombineResultTypes(OpAsmParser &parser, Type &combinedX,
                                           Type &combinedWeights, Type topkWeightsType) {
  if (parser.parseType(combinedX))
    return failure();
  if (topkWeightsType && (parser.parseComma() || parser.parseType(combinedWeights)))
    return failure();
  return success();
}

static void printCombineResultTypes(OpAsmPrinter &printer, Operation *, Type combinedX,
                                    Type combinedWeights, Type) {
  printer << combinedX;
  if (combinedWeights)
    printer << ", " << combinedWeights;
}

namespace {
/// A bias that is a splat of +0.0 adds nothing: the fp32 accumulator starts
/// at +0.0 either way, so dropping it keeps the result bitwise identical.
/// (-0.0 is kept: -0.0 + -0.0 = -0.0 differs from +0.0 + -0.0 = +0.0.)
struct DropZeroBias : public OpRewritePattern<CombineOp> {
  using OpRewritePattern::OpRewritePattern;

  static bool isPositiveZeroSplat(Value v) {
    SplatElementsAttr splat;
    if (!matchPattern(v, m_Constant(&splat)))
      return false;
    return isa<FloatType>(splat.getElementType()) && splat.getSplatValue<APFloat>().isPosZero();
  }

  LogicalResult matchAndRewrite(CombineOp op, PatternRewriter &rewriter) const override {
    SmallVector<Value> kept;
    for (Value bias : op.getBiases())
      if (!isPositiveZeroSplat(bias))
        kept.push_back(bias);
    if (kept.size() == op.getBiases().size())
      return failure();
    rewriter.modifyOpInPlace(op, [&] { op.getBiasesMutable().assign(kept); });
    return success();
  }
};
} // namespace

void CombineOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *context) {
  results.add<DropZeroBias>(context);
}

#define GET_OP_CLASSES
#include "epic/Dialect/EP/IR/EPOps.cpp.inc"

//===----------------------------------------------------------------------===//
// AllGatherOp, ReduceScatterOp
//===----------------------------------------------------------------------===//

LogicalResult AllGatherOp::verify() {
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  if (getGathered().size() != getInputs().size())
    return emitOpError() << "has " << getInputs().size() << " inputs but " << getGathered().size()
                         << " results (one gathered tensor per input)";
  const int64_t ranks = int64_t(getRanks());
  for (auto [i, pair] : llvm::enumerate(llvm::zip(getInputs(), getGathered()))) {
    ShapedType in = shaped(std::get<0>(pair)), out = shaped(std::get<1>(pair));
    SmallVector<int64_t> want{ranks};
    llvm::append_range(want, in.getShape());
    if (out.getElementType() != in.getElementType() || out.getShape() != ArrayRef(want))
      return emitOpError() << "result " << i << " must be "
                           << RankedTensorType::get(want, in.getElementType()) << " (ranks x input "
                           << i << "), got " << out;
  }
  return success();
}

LogicalResult ReduceScatterOp::verify() {
  ShapedType in = shaped(getInput()), out = shaped(getResult());
  const int64_t ranks = int64_t(getRanks());
  if (in.getRank() < 1 || in.getRank() != out.getRank())
    return emitOpError() << "input and result must have the same rank (at least 1), got " << in
                         << " and " << out;
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "result element type must be the input's (" << in.getElementType()
                         << "), got " << out.getElementType();
  if (!in.isDynamicDim(0) && in.getDimSize(0) % ranks)
    return emitOpError() << "input dimension 0 (" << in.getDimSize(0)
                         << ") must be a multiple of ranks (" << ranks
                         << "): rank r gets block r of it";
  ShapeChecker check{*this};
  const int64_t block = in.isDynamicDim(0) ? ShapedType::kDynamic : in.getDimSize(0) / ranks;
  if (failed(check.dim("result", out, 0, block, "the input's rows / ranks")))
    return failure();
  for (unsigned d = 1; d < unsigned(in.getRank()); ++d)
    if (failed(check.dim("result", out, d,
                         in.isDynamicDim(d) ? ShapedType::kDynamic : in.getDimSize(d),
                         "the input's")))
      return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// EngramFetchOp
//===----------------------------------------------------------------------===//

LogicalResult EngramFetchOp::verify() {
  ConfigAttr cfg = getConfig();
  if (cfg.isMultiNode())
    return emitOpError() << "reads the owners' tables through NVLink: every rank must be in one "
                            "NVLink domain (scaleup_ranks "
                         << cfg.getRanksPerNode() << " of " << cfg.getRanks()
                         << " ranks; across nodes a fetch needs GIN get)";
  ShapeChecker check{*this};
  ShapedType idx = shaped(getIndices()), rows = shaped(getRows());
  const int64_t hidden = cfg.getHidden();
  if (failed(check.elementType("rows", rows, cfg.getDtype())) ||
      failed(check.sameDim("indices", idx, "rows", rows, "the token count")))
    return failure();
  if (!rows.isDynamicDim(1) && rows.getDimSize(1) % hidden)
    return emitOpError() << "rows dimension 1 (" << rows.getDimSize(1)
                         << ") must be a multiple of hidden (" << hidden
                         << "): M entries side by side";
  const int64_t m = idx.getDimSize(1);
  return check.dim("rows", rows, 1, idx.isDynamicDim(1) ? ShapedType::kDynamic : m * hidden,
                   "entries per token x hidden");
}

//===----------------------------------------------------------------------===//
// PpSendRecvOp
//===----------------------------------------------------------------------===//

LogicalResult PpSendRecvOp::verify() {
  // Every rank sends a tensor like the one it receives: the result is the input's type.
  if (getX().getType() != getResult().getType())
    return emitOpError() << "result must have the input's type " << getX().getType()
                         << " (every rank sends and receives a tensor alike), got "
                         << getResult().getType();
  return success();
}

//===----------------------------------------------------------------------===//
// LowLatencyDispatchOp / LowLatencyCombineOp
//===----------------------------------------------------------------------===//

namespace {
/// What both low-latency ops ask of the configuration: one NVLink domain,
/// rows of whole 128-channel groups, and the per-expert shapes of `rows`
/// ([L, R x Tmax, ...]) and of the dispatch's `layoutRange` / `route`.
LogicalResult verifyLowLatency(Operation *op, ConfigAttr cfg, ShapedType rows,
                               ShapedType layoutRange, ShapedType route) {
  if (cfg.isMultiNode())
    return op->emitOpError() << "sends through NVLink: every rank must be in one NVLink domain "
                                "(scaleup_ranks "
                             << cfg.getRanksPerNode() << " of " << cfg.getRanks()
                             << " ranks; across nodes low-latency mode needs GIN puts)";
  if (cfg.getHidden() % 128)
    return op->emitOpError() << "hidden (" << cfg.getHidden()
                             << ") must be a multiple of 128 (one FP8 scale per 128 channels)";
  ShapeChecker check{op};
  const int64_t local = cfg.getNumLocalExperts(), ranks = cfg.getRanks();
  const int64_t slots =
      cfg.hasStaticTokenCap() ? ranks * int64_t(cfg.getMaxTokensPerRank()) : ShapedType::kDynamic;
  return success(succeeded(check.dim("x", rows, 0, local, "local experts")) &&
                 succeeded(check.dim("x", rows, 1, slots, "ranks x token cap")) &&
                 succeeded(check.dim("x", rows, 2, cfg.getHidden(), "hidden")) &&
                 succeeded(check.dim("layout_range", layoutRange, 0, local, "local experts")) &&
                 succeeded(check.dim("layout_range", layoutRange, 1, ranks, "ranks")) &&
                 succeeded(check.dim("route", route, 0, local, "local experts")) &&
                 succeeded(check.dim("route", route, 1, slots, "ranks x token cap")));
}
} // namespace

LogicalResult LowLatencyDispatchOp::verify() {
  ConfigAttr cfg = getConfig();
  Type dtype = cfg.getDtype();
  const bool fp8 = isa<Float8E4M3FNType>(dtype);
  if (!fp8 && !dtype.isBF16())
    return emitOpError() << "dtype must be bf16 or f8E4M3FN (the received rows), got " << dtype;
  ShapeChecker check{*this};
  ShapedType x = shaped(getX()), idx = shaped(getTopkIdx()), recv = shaped(getRecvX());
  if (failed(check.dim("x", x, 1, cfg.getHidden(), "hidden")) ||
      failed(check.dim("topk_idx", idx, 1, cfg.getTopk(), "top-k")) ||
      failed(check.sameDim("x", x, "topk_idx", idx, "the token count")) ||
      failed(check.elementType("recv_x", recv, dtype)) ||
      failed(verifyLowLatency(*this, cfg, recv, shaped(getLayoutRange()), shaped(getRoute()))) ||
      failed(check.dim("recv_count", shaped(getRecvCount()), 0, cfg.getNumLocalExperts(),
                       "local experts")) ||
      failed(check.dim("src_info", shaped(getSrcInfo()), 0, cfg.getNumLocalExperts(),
                       "local experts")))
    return failure();
  if (getUseUe8m0() && !getRoundScale())
    return emitOpError() << "ue8m0 scales need round_scale (a UE8M0 scale is a power of two)";
  if (!fp8) {
    if (getRoundScale() || getRecvScales())
      return emitOpError() << "a bf16 dispatch has no scales (round_scale, ue8m0 and the scales "
                              "result need dtype f8E4M3FN)";
    return success();
  }
  if (!getRecvScales())
    return emitOpError() << "an FP8 dispatch returns its scales (a `scales` result)";
  ShapedType scales = shaped(getRecvScales());
  const int64_t groups = cfg.getHidden() / 128;
  Type want = getUseUe8m0() ? Type(IntegerType::get(getContext(), 32))
                            : Type(Float32Type::get(getContext()));
  return success(
      succeeded(check.elementType("scales", scales, want)) &&
      succeeded(check.dim("scales", scales, 0, cfg.getNumLocalExperts(), "local experts")) &&
      succeeded(check.dim("scales", scales, 2, getUseUe8m0() ? (groups + 3) / 4 : groups,
                          getUseUe8m0() ? "scale groups / 4" : "scale groups")));
}

LogicalResult LowLatencyCombineOp::verify() {
  ConfigAttr cfg = getConfig();
  if (!cfg.getDtype().isBF16())
    return emitOpError() << "dtype must be bf16 (the expert outputs), got " << cfg.getDtype();
  ShapeChecker check{*this};
  ShapedType idx = shaped(getTopkIdx()), w = shaped(getTopkWeights()), out = shaped(getCombinedX());
  return success(succeeded(verifyLowLatency(*this, cfg, shaped(getX()), shaped(getLayoutRange()),
                                            shaped(getRoute()))) &&
                 succeeded(check.dim("topk_idx", idx, 1, cfg.getTopk(), "top-k")) &&
                 succeeded(check.dim("topk_weights", w, 1, cfg.getTopk(), "top-k")) &&
                 succeeded(check.sameDim("topk_idx", idx, "topk_weights", w, "the token count")) &&
                 succeeded(check.sameDim("topk_idx", idx, "combined_x", out, "the token count")) &&
                 succeeded(check.dim("combined_x", out, 1, cfg.getHidden(), "hidden")));
}
