//===- EntryBuilder.cpp - the entry IR of a kernel request ----------------===//
//
// One entry function per request, its arguments in the op's operand order
// and its results the op's (for a fused pair: what both ops make that the
// caller reads), built with the ops' builders, which infer the result types
// from the configuration. test/Tools/epic-compile-request.mlir holds the
// printed entry of every kind and variant.
//
//===----------------------------------------------------------------------===//

#include "epic/EntryBuilder.h"
#include "epic/runtime/LaunchMetadata.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;
using epic::EntryRequest;
using epic::KernelKind;

namespace {

/// The element type `text` names, or null after an error naming `field`.
Type parseElementType(llvm::StringRef text, Location loc, llvm::StringRef field) {
  if (Type type = parseType(text, loc.getContext()))
    return type;
  emitError(loc) << "kernel request: " << field << ": \"" << text << "\" is not a type";
  return nullptr;
}

/// Argument types in order; each optional argument's index, or -1 if absent.
struct Signature {
  SmallVector<Type> types;
  int add(Type type, bool present = true) {
    if (!present)
      return -1;
    types.push_back(type);
    return int(types.size()) - 1;
  }
};

class EntryBuilder {
public:
  EntryBuilder(const EntryRequest &request, Location loc)
      : request(request), loc(loc), builder(loc.getContext()) {}

  OwningOpRef<ModuleOp> build();

private:
  /// [?, cols] of `element`: a tensor with one row per token.
  RankedTensorType rows(int64_t cols, Type element) const {
    return RankedTensorType::get({ShapedType::kDynamic, cols}, element);
  }
  /// The experts' weights, [L, hidden, n] of the rows' type.
  RankedTensorType expertWeights(int64_t n) const {
    return RankedTensorType::get({config.getNumLocalExperts(), config.getHidden(), n}, dtype);
  }
  Type f32() { return builder.getF32Type(); }
  Type bf16() { return builder.getBF16Type(); }

  /// Starts `@<name>` with `signature`'s arguments; the body goes in next.
  func::FuncOp begin(const Signature &signature);
  /// Returns `results`, which make the function's result types.
  void finish(func::FuncOp func, ValueRange results);
  Value argument(func::FuncOp func, int index) {
    return index < 0 ? Value() : func.getArgument(index);
  }
  /// Errors naming the field for what the ops cannot be built with.
  LogicalResult checkBiases(int biases);
  LogicalResult checkTopkIdxBits(int bits);

  LogicalResult buildDispatch();
  LogicalResult buildCombine();
  LogicalResult buildGroupedGemm();
  LogicalResult buildSwiglu();
  LogicalResult buildDispatchGemm();
  LogicalResult buildGemmCombine();
  LogicalResult buildMoeLayer();
  LogicalResult buildDispatchLayout();
  LogicalResult buildEngramFetch();
  LogicalResult buildLowLatencyDispatch();
  LogicalResult buildLowLatencyCombine();

  const EntryRequest &request;
  Location loc;
  OpBuilder builder;
  epic::ep::ConfigAttr config;
  Type dtype; ///< of the dispatched rows
};

func::FuncOp EntryBuilder::begin(const Signature &signature) {
  auto func = func::FuncOp::create(builder, loc, request.name,
                                   builder.getFunctionType(signature.types, {}));
  // The bound of the kernels' waits (convert-ep-to-comm reads it); absent: the
  // default.
  if (request.spec.timeoutMs)
    func->setAttr(epic::launchAttributeName(epic::LaunchField::timeoutMs),
                  builder.getI64IntegerAttr(request.spec.timeoutMs));
  builder.setInsertionPointToStart(func.addEntryBlock());
  return func;
}

void EntryBuilder::finish(func::FuncOp func, ValueRange results) {
  func::ReturnOp::create(builder, loc, results);
  func.setFunctionType(builder.getFunctionType(func.getArgumentTypes(), results.getTypes()));
}

LogicalResult EntryBuilder::checkBiases(int biases) {
  if (biases <= 2)
    return success();
  return emitError(loc) << "kernel request: combine.biases: combine takes 0, 1 or 2 biases, got "
                        << biases;
}

LogicalResult EntryBuilder::checkTopkIdxBits(int bits) {
  if (bits == 8 || bits == 16 || bits == 32 || bits == 64)
    return success();
  return emitError(loc) << "kernel request: dispatch.topk_idx_bits: topk_idx must be an 8, 16, 32 "
                           "or 64-bit integer, got "
                        << bits << " bits";
}

LogicalResult EntryBuilder::buildDispatch() {
  const EntryRequest::Dispatch &variant = request.dispatch;
  if (failed(checkTopkIdxBits(variant.topkIdxBits)))
    return failure();
  // A cached dispatch reads the handle's routing, which is int64.
  Type idx =
      rows(config.getTopk(), builder.getIntegerType(variant.cached ? 64 : variant.topkIdxBits));
  Signature signature;
  int x = signature.add(rows(config.getHidden(), dtype));
  int topkIdx = signature.add(idx, !variant.cached);
  int scales = signature.add(rows(config.getScalePacks(), f32()), config.isFP8());
  int weights = signature.add(rows(config.getTopk(), f32()), variant.weights);
  int cached =
      signature.add(epic::ep::HandleType::get(builder.getContext(), config), variant.cached);
  func::FuncOp func = begin(signature);
  auto dispatch = epic::ep::DispatchOp::create(
      builder, loc, config, argument(func, x), argument(func, topkIdx), argument(func, scales),
      argument(func, weights), argument(func, cached), variant.zeroPadding);
  dispatch.setWindowOutputs(variant.windowOutputs);
  finish(func, dispatch->getResults());
  return success();
}

LogicalResult EntryBuilder::buildDispatchLayout() {
  const EntryRequest::Dispatch &variant = request.dispatch;
  if (failed(checkTopkIdxBits(variant.topkIdxBits)))
    return failure();
  Signature signature;
  int topkIdx = signature.add(rows(config.getTopk(), builder.getIntegerType(variant.topkIdxBits)));
  func::FuncOp func = begin(signature);
  MLIRContext *ctx = builder.getContext();
  Type i32 = builder.getI32Type();
  auto layout = epic::ep::DispatchLayoutOp::create(
      builder, loc, RankedTensorType::get({int64_t(config.getRanks())}, i32),
      RankedTensorType::get({int64_t(config.getExperts())}, i32),
      RankedTensorType::get({ShapedType::kDynamic, int64_t(config.getRanks())},
                            IntegerType::get(ctx, 1)),
      config, argument(func, topkIdx));
  finish(func, layout->getResults());
  return success();
}

LogicalResult EntryBuilder::buildEngramFetch() {
  // [T, M] ids in, [T, M x hidden] rows out: T and M are the call's.
  const int64_t dyn = ShapedType::kDynamic;
  Signature signature;
  int indices = signature.add(RankedTensorType::get({dyn, dyn}, builder.getI32Type()));
  func::FuncOp func = begin(signature);
  auto fetch = epic::ep::EngramFetchOp::create(
      builder, loc, RankedTensorType::get({dyn, dyn}, dtype), config, argument(func, indices));
  finish(func, fetch->getResults());
  return success();
}

LogicalResult EntryBuilder::buildLowLatencyDispatch() {
  // bf16 tokens and their routing in; per local expert [L, R x Tmax, ...]
  // out, Tmax a run-time value.
  const EntryRequest::Dispatch &variant = request.dispatch;
  if (failed(checkTopkIdxBits(variant.topkIdxBits)))
    return failure();
  const int64_t dyn = ShapedType::kDynamic, local = config.getNumLocalExperts();
  const int64_t groups = config.getHidden() / 128;
  Type i32 = builder.getI32Type();
  Signature signature;
  int x = signature.add(rows(config.getHidden(), bf16()));
  int topkIdx = signature.add(rows(config.getTopk(), builder.getIntegerType(variant.topkIdxBits)));
  func::FuncOp func = begin(signature);
  Type scales;
  if (config.isFP8())
    scales = variant.useUe8m0 ? RankedTensorType::get({local, dyn, (groups + 3) / 4}, i32)
                              : RankedTensorType::get({local, dyn, groups}, f32());
  auto dispatch = epic::ep::LowLatencyDispatchOp::create(
      builder, loc, RankedTensorType::get({local, dyn, int64_t(config.getHidden())}, dtype), scales,
      RankedTensorType::get({local}, i32), RankedTensorType::get({local, dyn}, i32),
      RankedTensorType::get({local, int64_t(config.getRanks())}, builder.getI64Type()),
      RankedTensorType::get({local, dyn}, i32), config, argument(func, x), argument(func, topkIdx),
      variant.roundScale, variant.useUe8m0);
  finish(func, dispatch->getResults());
  return success();
}

LogicalResult EntryBuilder::buildLowLatencyCombine() {
  const EntryRequest::Dispatch &variant = request.dispatch;
  if (failed(checkTopkIdxBits(variant.topkIdxBits)))
    return failure();
  const int64_t dyn = ShapedType::kDynamic, local = config.getNumLocalExperts();
  Type i32 = builder.getI32Type();
  Signature signature;
  int x = signature.add(RankedTensorType::get({local, dyn, int64_t(config.getHidden())}, bf16()));
  int range = signature.add(
      RankedTensorType::get({local, int64_t(config.getRanks())}, builder.getI64Type()));
  int route = signature.add(RankedTensorType::get({local, dyn}, i32));
  int topkIdx = signature.add(rows(config.getTopk(), builder.getIntegerType(variant.topkIdxBits)));
  int weights = signature.add(rows(config.getTopk(), f32()));
  func::FuncOp func = begin(signature);
  auto combine = epic::ep::LowLatencyCombineOp::create(
      builder, loc, rows(config.getHidden(), bf16()), config, argument(func, x),
      argument(func, range), argument(func, route), argument(func, topkIdx),
      argument(func, weights));
  finish(func, combine->getResults());
  return success();
}

LogicalResult EntryBuilder::buildCombine() {
  const EntryRequest::Combine &variant = request.combine;
  if (failed(checkBiases(variant.biases)))
    return failure();
  // Weights travel back per row: [rows, K] in the plain layout, one per row expanded.
  Type weightsType = config.isExpanded() ? RankedTensorType::get({ShapedType::kDynamic}, f32())
                                         : Type(rows(config.getTopk(), f32()));
  Type y = rows(config.getHidden(), bf16());
  Signature signature;
  int x = signature.add(y);
  int handle = signature.add(epic::ep::HandleType::get(builder.getContext(), config));
  int weights = signature.add(weightsType, variant.weights);
  int firstBias = int(signature.types.size());
  for (int i = 0; i < variant.biases; ++i)
    signature.add(y);
  func::FuncOp func = begin(signature);
  auto combine = epic::ep::CombineOp::create(
      builder, loc, y, variant.weights ? Type(rows(config.getTopk(), f32())) : Type(),
      argument(func, x), argument(func, handle), argument(func, weights),
      func.getArguments().slice(firstBias, variant.biases));
  combine.setWindowOutputs(variant.windowOutputs);
  finish(func, combine->getResults());
  return success();
}

LogicalResult EntryBuilder::buildGroupedGemm() {
  Type out = parseElementType(request.gemm.outDtype, loc, "gemm.out_dtype");
  if (!out)
    return failure();
  Signature signature;
  // K: the hidden size (the dispatch's rows), or gemm.k (an expert's intermediate rows).
  const int64_t k = request.gemm.k ? request.gemm.k : config.getHidden();
  int x = signature.add(rows(k, dtype));
  // FP8 rows: [L, N, K] weights (K contiguous) and the block scales of both.
  const bool fp8 = config.isFP8();
  const int64_t n = request.gemm.n, block = 128;
  const int64_t local = config.getNumLocalExperts();
  int weights = signature.add(RankedTensorType::get(
      fp8 ? ArrayRef<int64_t>{local, n, k} : ArrayRef<int64_t>{local, k, n}, dtype));
  int handle = signature.add(epic::ep::HandleType::get(builder.getContext(), config));
  int xScales = signature.add(rows(k / block, f32()), fp8);
  int weightScales =
      signature.add(RankedTensorType::get({local, n / block, k / block}, f32()), fp8);
  func::FuncOp func = begin(signature);
  Value y = epic::ep::GroupedGemmOp::create(builder, loc, rows(n, out), argument(func, x),
                                            argument(func, weights), argument(func, handle),
                                            argument(func, xScales), argument(func, weightScales));
  finish(func, y);
  return success();
}

LogicalResult EntryBuilder::buildSwiglu() {
  Type in = parseElementType(request.gemm.inDtype, loc, "gemm.in_dtype");
  Type out = parseElementType(request.gemm.outDtype, loc, "gemm.out_dtype");
  if (!in || !out)
    return failure();
  const int64_t inter = request.gemm.n, block = 128;
  if (inter < 1 || inter % block || request.gemm.k != 2 * inter)
    return emitError(loc) << "kernel request: gemm: swiglu's intermediate size (n) must be a "
                             "positive multiple of 128 and its gate/up rows (k) twice it, got n = "
                          << inter << ", k = " << request.gemm.k;
  Signature signature;
  int gateUp = signature.add(rows(2 * inter, in));
  int handle = signature.add(epic::ep::HandleType::get(builder.getContext(), config));
  func::FuncOp func = begin(signature);
  // Without weights: the kernel reads the record's weights field either way (null: 1), so
  // the op with and without them is one kernel.
  const bool fp8 = isa<Float8E4M3FNType>(out);
  auto swiglu = epic::ep::SwigluOp::create(builder, loc, rows(inter, out),
                                           fp8 ? Type(rows(inter / block, f32())) : Type(),
                                           argument(func, gateUp), argument(func, handle),
                                           /*weights=*/Value());
  finish(func, swiglu->getResults());
  return success();
}

LogicalResult EntryBuilder::buildDispatchGemm() {
  const EntryRequest::Dispatch &variant = request.dispatch;
  Type out = parseElementType(request.gemm.outDtype, loc, "gemm.out_dtype");
  if (!out)
    return failure();
  if (variant.cached)
    return emitError(loc) << "kernel request: dispatch.cached: the fused dispatch + GEMM routes "
                             "tokens: it cannot be a cached dispatch";
  if (failed(checkTopkIdxBits(variant.topkIdxBits)))
    return failure();
  Signature signature;
  int x = signature.add(rows(config.getHidden(), dtype));
  int topkIdx = signature.add(rows(config.getTopk(), builder.getIntegerType(variant.topkIdxBits)));
  int weights = signature.add(rows(config.getTopk(), f32()), variant.weights);
  int experts = signature.add(expertWeights(request.gemm.n));
  func::FuncOp func = begin(signature);
  // ep-fuse-dispatch-gemm makes one op of the pair.
  auto dispatch = epic::ep::DispatchOp::create(
      builder, loc, config, argument(func, x), argument(func, topkIdx), /*scalePacks=*/Value(),
      argument(func, weights), /*cachedHandle=*/Value(), variant.zeroPadding);
  Value y =
      epic::ep::GroupedGemmOp::create(builder, loc, rows(request.gemm.n, out), dispatch.getRecvX(),
                                      argument(func, experts), dispatch.getHandle());
  SmallVector<Value> results{dispatch.getRecvX()};
  if (Value recvWeights = dispatch.getRecvTopkWeights())
    results.push_back(recvWeights);
  results.append({y, dispatch.getHandle()});
  finish(func, results);
  return success();
}

LogicalResult EntryBuilder::buildGemmCombine() {
  const EntryRequest::Combine &variant = request.combine;
  if (variant.weights)
    return emitError(loc)
           << "kernel request: combine.weights: the fused GEMM + combine takes no topk_weights";
  if (failed(checkBiases(variant.biases)))
    return failure();
  // The GEMM maps hidden to hidden in bf16, the combine's input.
  Type y = rows(config.getHidden(), bf16());
  Signature signature;
  int x = signature.add(rows(config.getHidden(), dtype));
  int weights = signature.add(expertWeights(config.getHidden()));
  int handle = signature.add(epic::ep::HandleType::get(builder.getContext(), config));
  int firstBias = int(signature.types.size());
  for (int i = 0; i < variant.biases; ++i)
    signature.add(y);
  func::FuncOp func = begin(signature);
  // ep-fuse-gemm-combine makes one op of the pair.
  Value gemm = epic::ep::GroupedGemmOp::create(builder, loc, y, argument(func, x),
                                               argument(func, weights), argument(func, handle));
  auto combine = epic::ep::CombineOp::create(
      builder, loc, y, /*combined_topk_weights=*/Type(), gemm, argument(func, handle),
      /*topk_weights=*/Value(), func.getArguments().slice(firstBias, variant.biases));
  finish(func, {gemm, combine.getCombinedX()});
  return success();
}

/// The whole FP8 layer (ep.moe_layer): gemm.n is each expert's intermediate
/// size I; the dispatch sends routing weights, which the SwiGLU applies.
LogicalResult EntryBuilder::buildMoeLayer() {
  const EntryRequest::Dispatch &variant = request.dispatch;
  if (variant.cached || !variant.weights || variant.zeroPadding || variant.windowOutputs)
    return emitError(loc) << "kernel request: dispatch: the MoE layer routes its tokens with "
                             "their weights: weights must be true and cached, zero_padding and "
                             "window_outputs false";
  if (failed(checkTopkIdxBits(variant.topkIdxBits)))
    return failure();
  const int64_t inter = request.gemm.n, block = 128, hidden = config.getHidden();
  const int64_t local = config.getNumLocalExperts();
  if (inter < 1 || inter % block)
    return emitError(loc) << "kernel request: gemm.n: the layer's intermediate size must be a "
                             "positive multiple of 128, got "
                          << inter;
  auto weights = [&](int64_t n, int64_t k) { return RankedTensorType::get({local, n, k}, dtype); };
  auto scales = [&](int64_t n, int64_t k) {
    return RankedTensorType::get({local, n / block, k / block}, f32());
  };
  Signature signature;
  int x = signature.add(rows(hidden, dtype));
  int topkIdx = signature.add(rows(config.getTopk(), builder.getIntegerType(variant.topkIdxBits)));
  int packs = signature.add(rows(hidden / block, f32()));
  int topkWeights = signature.add(rows(config.getTopk(), f32()));
  int w13 = signature.add(weights(2 * inter, hidden));
  int s13 = signature.add(scales(2 * inter, hidden));
  int w2 = signature.add(weights(hidden, inter));
  int s2 = signature.add(scales(hidden, inter));
  func::FuncOp func = begin(signature);
  Value out = epic::ep::MoeLayerOp::create(
      builder, loc, rows(hidden, bf16()), config, argument(func, x), argument(func, topkIdx),
      argument(func, packs), argument(func, topkWeights), argument(func, w13), argument(func, s13),
      argument(func, w2), argument(func, s2));
  finish(func, out);
  return success();
}

OwningOpRef<ModuleOp> EntryBuilder::build() {
  config = epic::configOf(request.spec, loc);
  if (!config)
    return nullptr;
  dtype = config.getDtype();
  if ((request.kind == KernelKind::groupedGemm || request.kind == KernelKind::dispatchGemm) &&
      request.gemm.n < 1) {
    emitError(loc) << "kernel request: gemm.n: the expert GEMM's N must be positive, got "
                   << request.gemm.n;
    return nullptr;
  }

  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  builder.setInsertionPointToEnd(module->getBody());
  LogicalResult built = failure();
  switch (request.kind) {
  case KernelKind::dispatch:
    built = buildDispatch();
    break;
  case KernelKind::combine:
    built = buildCombine();
    break;
  case KernelKind::groupedGemm:
    built = buildGroupedGemm();
    break;
  case KernelKind::swiglu:
    built = buildSwiglu();
    break;
  case KernelKind::dispatchGemm:
    built = buildDispatchGemm();
    break;
  case KernelKind::gemmCombine:
    built = buildGemmCombine();
    break;
  case KernelKind::moeLayer:
    built = buildMoeLayer();
    break;
  case KernelKind::dispatchLayout:
    built = buildDispatchLayout();
    break;
  case KernelKind::engramFetch:
    built = buildEngramFetch();
    break;
  case KernelKind::lowLatencyDispatch:
    built = buildLowLatencyDispatch();
    break;
  case KernelKind::lowLatencyCombine:
    built = buildLowLatencyCombine();
    break;
  }
  if (failed(built))
    return nullptr;
  return module;
}

} // namespace

epic::ep::ConfigAttr epic::configOf(const EntryRequest::Spec &spec, Location loc) {
  Type dtype = parseElementType(spec.dtype, loc, "spec.dtype");
  if (!dtype)
    return nullptr;
  // The reader refused negative values: each fits the parameter's unsigned.
  auto count = [](int value) { return unsigned(value); };
  // #ep.config's verifier names the parameter, which "spec" spells alike.
  return ep::ConfigAttr::getChecked(
      [&] { return emitError(loc) << "kernel request: spec: "; }, loc.getContext(),
      count(spec.ranks), count(spec.experts), count(spec.topk), count(spec.hidden), dtype,
      count(spec.scalePacks), count(spec.expertAlignment),
      spec.expanded ? ep::Layout::expanded : ep::Layout::plain, count(spec.numSms),
      count(spec.maxTokensPerRank), count(spec.scaleupRanks),
      spec.hybrid ? ep::Mode::hybrid : ep::Mode::direct);
}

OwningOpRef<ModuleOp> epic::buildEntryModule(const EntryRequest &request, Location loc) {
  return EntryBuilder(request, loc).build();
}
