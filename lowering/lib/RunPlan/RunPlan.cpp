//===- RunPlan.cpp - an epic-run program as a run plan --------------------===//
//
// epic-run executes programs on machines without MLIR: the program is
// checked and translated here, into a JSON list of steps over numbered
// values, which the runtime (runtime/include/epic/runtime/RunProgram.h)
// executes. Every ep op keeps its full configuration, spelled as a kernel
// request's spec (KernelRequest.def), so the runtime asks for exactly the
// kernels the op would compile to.
//
//===----------------------------------------------------------------------===//

#include "epic/Compiler.h"
#include "epic/EntryBuilder.h"

#include "epic/Dialect/EP/IR/EPDialect.h"
#include "epic/Dialect/Run/IR/RunDialect.h"
#include "epic/InitAllDialects.h"
#include "epic/Support/SourceParser.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/DebugStringHelper.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;
namespace json = llvm::json;

namespace {

std::string locString(Location loc) {
  if (auto file = dyn_cast<FileLineColLoc>(loc))
    return (file.getFilename().strref() + ":" + std::to_string(file.getLine()) + ":" +
            std::to_string(file.getColumn()))
        .str();
  return "<unknown>";
}

/// Walks @main once, numbering values and writing one step per op.
class Translator {
public:
  explicit Translator(func::FuncOp main) : main(main) {}

  /// The plan, or failure after diagnostics at the offending ops.
  FailureOr<json::Object> run() {
    if (main.getNumArguments() || main.getNumResults())
      return main.emitError("epic-run: @main takes no arguments and returns nothing (inputs "
                            "come from run.tokens, run.random and run.routing)");
    if (!main.getBody().hasOneBlock())
      return main.emitError("epic-run: @main must be one block (no control flow)");
    for (Operation &op : main.getBody().front())
      if (failed(step(&op)))
        return failure();
    if (ranks < 0)
      ranks = tokensRanks < 0 ? 1 : tokensRanks;
    if (tokensRanks >= 0 && tokensRanks != ranks)
      return tokensOp->emitError()
             << "epic-run: per_rank has " << tokensRanks
             << " entries but the program's ep ops run on " << ranks << " ranks";
    json::Object plan{{"epic_run_plan", 1},
                      {"ranks", ranks},
                      {"values", int64_t(ids.size())},
                      {"steps", std::move(steps)}};
    if (gpusPerNode > 0 && gpusPerNode < ranks) // one node: the plan as it always was
      plan["gpus_per_node"] = gpusPerNode;
    return plan;
  }

private:
  /// A new value id for `value`; -1 for an optional result that is absent.
  int64_t define(Value value) {
    if (!value)
      return -1;
    int64_t id = int64_t(ids.size());
    ids[value] = id;
    return id;
  }
  int64_t use(Value value) { return value ? ids.lookup(value) : -1; }

  LogicalResult world(Operation *op, epic::ep::ConfigAttr config) {
    if (ranks < 0) {
      ranks = config.getRanks();
      gpusPerNode = config.getRanksPerNode();
      return success();
    }
    if (int64_t(config.getRanks()) != ranks)
      return op->emitError() << "epic-run: every ep op of a program runs on one EP world; this "
                                "one has "
                             << config.getRanks() << " ranks, an earlier one " << ranks;
    if (int64_t(config.getRanksPerNode()) != gpusPerNode)
      return op->emitError() << "epic-run: every ep op of a program runs on one EP world; this "
                                "one has "
                             << config.getRanksPerNode()
                             << " ranks per node (scaleup_ranks), an earlier one " << gpusPerNode;
    return success();
  }

  /// epic-run allocates every tensor in device memory, outside the window.
  LogicalResult windowOutputsRefused(Operation *op) {
    return op->emitError("epic-run: window_outputs is not supported: the runner allocates a "
                         "program's tensors in device memory, outside the buffer's window (drop "
                         "the attribute; ElasticBuffer's window_outputs places them)");
  }

  /// An AGRS op: its `ranks` is the world's (one NVLink domain).
  LogicalResult agrsWorld(Operation *op, int64_t opRanks) {
    if (ranks < 0) {
      ranks = gpusPerNode = opRanks;
      return success();
    }
    if (opRanks != ranks || gpusPerNode != ranks)
      return op->emitError()
             << "epic-run: AGRS and PP ops run on the program's world of one NVLink "
                "domain; this one has "
             << opRanks << " ranks, the world " << ranks << " ranks in nodes of " << gpusPerNode;
    return success();
  }

  LogicalResult requireI64(Operation *op, Value value, StringRef what) {
    if (!value)
      return success();
    Type element = cast<ShapedType>(value.getType()).getElementType();
    if (!element.isInteger(64))
      return op->emitError() << "epic-run: " << what
                             << " must be i64 (the runtime's topk_idx_t), got " << element;
    return success();
  }

  void add(Operation *op, StringRef kind, json::Object step) {
    step["op"] = kind;
    step["loc"] = locString(op->getLoc());
    steps.push_back(std::move(step));
  }

  LogicalResult step(Operation *op) {
    using namespace epic;
    if (auto tokens = dyn_cast<run::TokensOp>(op)) {
      if (tokensRanks >= 0)
        return op->emitError("epic-run: a program has one run.tokens (the token count of "
                             "each rank)");
      tokensRanks = int64_t(tokens.getPerRank().size());
      tokensOp = op;
      json::Array counts;
      for (int64_t count : tokens.getPerRank())
        counts.push_back(count);
      add(op, "tokens", json::Object{{"result", define(tokens)}, {"per_rank", std::move(counts)}});
      return success();
    }
    if (auto random = dyn_cast<run::RandomOp>(op)) {
      auto type = random.getResult().getType();
      add(op, "random",
          json::Object{{"result", define(random)},
                       {"rows", use(random.getRows())},
                       {"distribution", run::stringifyDistribution(random.getDistribution()).str()},
                       {"scale", random.getScale().convertToDouble()},
                       {"seed", random.getSeed()},
                       {"dtype", debugString(type.getElementType())},
                       {"cols", ShapedType::getNumElements(type.getShape().drop_front())}});
      if (type.getRank() > 2) // the row's shape (expert weights: [L, hidden, N])
        steps.back().getAsObject()->insert(
            {"row_shape", json::Array(type.getShape().drop_front())});
      return success();
    }
    if (auto routing = dyn_cast<run::RoutingOp>(op)) {
      add(op, "routing",
          json::Object{{"result", define(routing)},
                       {"rows", use(routing.getRows())},
                       {"experts", routing.getExperts()},
                       {"masked", routing.getMasked().convertToDouble()},
                       {"seed", routing.getSeed()},
                       {"topk", routing.getResult().getType().getDimSize(1)}});
      return success();
    }
    if (auto print = dyn_cast<run::PrintOp>(op)) {
      std::string what = "%" + std::to_string(use(print.getValue()));
      if (Operation *producer = print.getValue().getDefiningOp()) {
        what = producer->getName().getStringRef().str();
        if (producer->getNumResults() > 1)
          what += " result #" + std::to_string(cast<OpResult>(print.getValue()).getResultNumber());
        what += " (" + locString(producer->getLoc()) + ")";
      }
      add(op, "print",
          json::Object{
              {"value", use(print.getValue())}, {"rows", print.getRows()}, {"what", what}});
      return success();
    }
    if (auto constant = dyn_cast<arith::ConstantOp>(op)) {
      auto value = dyn_cast<IntegerAttr>(constant.getValue());
      if (!value || !constant.getType().isIndex())
        return op->emitError("epic-run: only index constants are supported (token counts, "
                             "dimensions)");
      add(op, "constant", json::Object{{"result", define(constant)}, {"value", value.getInt()}});
      return success();
    }
    if (auto dim = dyn_cast<tensor::DimOp>(op)) {
      std::optional<int64_t> index = dim.getConstantIndex();
      if (!index)
        return op->emitError("epic-run: tensor.dim needs a constant dimension index");
      add(op, "dim",
          json::Object{{"result", define(dim)}, {"source", use(dim.getSource())}, {"dim", *index}});
      return success();
    }
    if (auto dispatch = dyn_cast<ep::DispatchOp>(op)) {
      if (dispatch.getWindowOutputs())
        return windowOutputsRefused(op);
      ep::ConfigAttr config = dispatch.getConfig();
      if (failed(world(op, config)) || failed(requireI64(op, dispatch.getTopkIdx(), "topk_idx")) ||
          failed(requireI64(op, dispatch.getRecvTopkIdx(), "recv_topk_idx")))
        return failure();
      for (Value packs : {dispatch.getScalePacks(), dispatch.getRecvScalePacks()})
        if (packs && !cast<ShapedType>(packs.getType()).getElementType().isF32())
          return op->emitError("epic-run: scale packs must be f32 (the runtime passes "
                               "float32 scales)");
      json::Object step{{"spec", epic::configJson(config)},
                        {"cached", dispatch.isCached()},
                        {"zero_padding", dispatch.getZeroPadding()},
                        {"x", use(dispatch.getX())},
                        {"topk_idx", use(dispatch.getTopkIdx())},
                        {"scale_packs", use(dispatch.getScalePacks())},
                        {"topk_weights", use(dispatch.getTopkWeights())},
                        {"cached_handle", use(dispatch.getCachedHandle())}};
      step["recv_x"] = define(dispatch.getRecvX());
      step["recv_scale_packs"] = define(dispatch.getRecvScalePacks());
      step["recv_topk_idx"] = define(dispatch.getRecvTopkIdx());
      step["recv_topk_weights"] = define(dispatch.getRecvTopkWeights());
      step["handle"] = define(dispatch.getHandle());
      add(op, "dispatch", std::move(step));
      return success();
    }
    if (auto combine = dyn_cast<ep::CombineOp>(op)) {
      if (combine.getWindowOutputs())
        return windowOutputsRefused(op);
      if (failed(world(op, combine.getConfig())))
        return failure();
      json::Array biases;
      for (Value bias : combine.getBiases())
        biases.push_back(use(bias));
      json::Object step{{"spec", epic::configJson(combine.getConfig())},
                        {"x", use(combine.getX())},
                        {"handle", use(combine.getHandle())},
                        {"topk_weights", use(combine.getTopkWeights())},
                        {"biases", std::move(biases)}};
      step["combined_x"] = define(combine.getCombinedX());
      step["combined_topk_weights"] = define(combine.getCombinedTopkWeights());
      add(op, "combine", std::move(step));
      return success();
    }
    if (auto call = dyn_cast<func::CallOp>(op))
      return inlineCall(call);
    if (auto cast = dyn_cast<tensor::CastOp>(op)) { // a type refinement: the same tensor
      ids[cast.getResult()] = use(cast.getSource());
      return success();
    }
    if (auto layout = dyn_cast<ep::DispatchLayoutOp>(op)) {
      if (failed(world(op, layout.getConfig())) ||
          failed(requireI64(op, layout.getTopkIdx(), "topk_idx")))
        return failure();
      add(op, "dispatch_layout",
          json::Object{{"spec", epic::configJson(layout.getConfig())},
                       {"topk_idx", use(layout.getTopkIdx())},
                       {"num_tokens_per_rank", define(layout.getNumTokensPerRank())},
                       {"num_tokens_per_expert", define(layout.getNumTokensPerExpert())},
                       {"is_token_in_rank", define(layout.getIsTokenInRank())}});
      return success();
    }
    if (auto gemm = dyn_cast<ep::GroupedGemmOp>(op)) {
      ep::ConfigAttr config = gemm.getConfig();
      if (failed(world(op, config)))
        return failure();
      auto out = cast<ShapedType>(gemm.getResult().getType());
      // K: the rows' width (the hidden size, or an expert's intermediate size for
      // its down GEMM); FP8 rows and weights come with their block scales (-1: none).
      add(op, "grouped_gemm",
          json::Object{{"spec", epic::configJson(config)},
                       {"x", use(gemm.getLhs())},
                       {"weights", use(gemm.getRhs())},
                       {"handle", use(gemm.getHandle())},
                       {"x_scales", use(gemm.getLhsScales())},
                       {"weight_scales", use(gemm.getRhsScales())},
                       {"n", out.getDimSize(1)},
                       {"k", cast<ShapedType>(gemm.getLhs().getType()).getDimSize(1)},
                       {"out_dtype", debugString(out.getElementType())},
                       {"result", define(gemm.getResult())}});
      return success();
    }
    if (auto swiglu = dyn_cast<ep::SwigluOp>(op)) {
      ep::ConfigAttr config = swiglu.getConfig();
      if (failed(world(op, config)))
        return failure();
      auto in = cast<ShapedType>(swiglu.getGateUp().getType());
      auto out = cast<ShapedType>(swiglu.getResult().getType());
      // n: the intermediate size I (gate_up is [rows, 2 I]); FP8 results define their scales.
      add(op, "swiglu",
          json::Object{{"spec", epic::configJson(config)},
                       {"gate_up", use(swiglu.getGateUp())},
                       {"handle", use(swiglu.getHandle())},
                       {"weights", use(swiglu.getWeights())},
                       {"n", out.getDimSize(1)},
                       {"in_dtype", debugString(in.getElementType())},
                       {"out_dtype", debugString(out.getElementType())},
                       {"result", define(swiglu.getResult())},
                       {"scales", define(swiglu.getScales())}});
      return success();
    }
    if (auto fused = dyn_cast<ep::DispatchGemmOp>(op)) {
      ep::ConfigAttr config = fused.getConfig();
      if (failed(world(op, config)) || failed(requireI64(op, fused.getTopkIdx(), "topk_idx")))
        return failure();
      auto out = cast<ShapedType>(fused.getResult().getType());
      // The dispatch's fields (a fused dispatch takes no scale packs and is
      // never cached), then the GEMM's.
      json::Object step{{"spec", epic::configJson(config)},
                        {"cached", false},
                        {"cached_handle", -1},
                        {"scale_packs", -1},
                        {"recv_scale_packs", -1},
                        {"recv_topk_idx", -1},
                        {"zero_padding", fused.getZeroPadding()},
                        {"x", use(fused.getX())},
                        {"topk_idx", use(fused.getTopkIdx())},
                        {"topk_weights", use(fused.getTopkWeights())},
                        {"experts", use(fused.getExperts())},
                        {"n", out.getDimSize(1)},
                        {"out_dtype", debugString(out.getElementType())}};
      step["recv_x"] = define(fused.getRecvX());
      step["recv_topk_weights"] = define(fused.getRecvTopkWeights());
      step["result"] = define(fused.getResult());
      step["handle"] = define(fused.getHandle());
      add(op, "dispatch_gemm", std::move(step));
      return success();
    }
    if (auto layer = dyn_cast<ep::MoeLayerOp>(op)) {
      ep::ConfigAttr config = layer.getConfig();
      if (failed(world(op, config)) || failed(requireI64(op, layer.getTopkIdx(), "topk_idx")))
        return failure();
      // What ep-fuse-moe-layer made of the five ops: their inputs, the
      // intermediate size I (n), and the combine's result. The intermediate
      // rows are the kernel's own; the runtime checks each step from them.
      add(op, "moe_layer",
          json::Object{{"spec", epic::configJson(config)},
                       {"x", use(layer.getX())},
                       {"topk_idx", use(layer.getTopkIdx())},
                       {"scale_packs", use(layer.getScales())},
                       {"topk_weights", use(layer.getTopkWeights())},
                       {"gate_up_weights", use(layer.getGateUpWeights())},
                       {"gate_up_scales", use(layer.getGateUpScales())},
                       {"down_weights", use(layer.getDownWeights())},
                       {"down_scales", use(layer.getDownScales())},
                       {"n", layer.getIntermediateSize()},
                       {"combined_x", define(layer.getCombinedX())}});
      return success();
    }
    if (auto fused = dyn_cast<ep::GemmCombineOp>(op)) {
      if (failed(world(op, fused.getConfig())))
        return failure();
      // The GEMM's fields, then the combine's (a fused combine sends no
      // weights back: ep-fuse-gemm-combine refuses those).
      json::Array biases;
      for (Value bias : fused.getBiases())
        biases.push_back(use(bias));
      json::Object step{{"spec", epic::configJson(fused.getConfig())},
                        {"x", use(fused.getLhs())},
                        {"weights", use(fused.getRhs())},
                        {"handle", use(fused.getHandle())},
                        {"biases", std::move(biases)}};
      step["result"] = define(fused.getResult());
      step["combined_x"] = define(fused.getCombinedX());
      add(op, "gemm_combine", std::move(step));
      return success();
    }
    if (auto gather = dyn_cast<ep::AllGatherOp>(op)) {
      if (failed(agrsWorld(op, int64_t(gather.getRanks()))))
        return failure();
      json::Array inputs, gathered;
      for (Value input : gather.getInputs())
        inputs.push_back(use(input));
      for (Value result : gather.getGathered())
        gathered.push_back(define(result));
      add(op, "all_gather",
          json::Object{{"inputs", std::move(inputs)}, {"gathered", std::move(gathered)}});
      return success();
    }
    if (auto scatter = dyn_cast<ep::ReduceScatterOp>(op)) {
      if (failed(agrsWorld(op, int64_t(scatter.getRanks()))))
        return failure();
      add(op, "reduce_scatter",
          json::Object{{"input", use(scatter.getInput())},
                       {"result", define(scatter.getResult())}});
      return success();
    }
    if (auto pp = dyn_cast<ep::PpSendRecvOp>(op)) {
      if (failed(agrsWorld(op, int64_t(pp.getRanks()))))
        return failure();
      add(op, "pp_send_recv",
          json::Object{{"input", use(pp.getX())},
                       {"to", ep::stringifyRingDirection(pp.getTo()).str()},
                       {"result", define(pp.getResult())}});
      return success();
    }
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      if (!callStack.empty()) { // the callee's results are the call's
        for (auto [result, value] : llvm::zip(callStack.back()->getResults(), ret.getOperands()))
          ids[result] = use(value);
      }
      return success();
    }
    return op->emitError()
           << "epic-run: '" << op->getName()
           << "' is not supported in a run program (it may use run.tokens, "
              "run.random, run.routing, run.print, ep.dispatch_layout, "
              "ep.dispatch, ep.grouped_gemm, ep.swiglu, ep.combine, the fused ops, ep.all_gather, "
              "ep.reduce_scatter, ep.pp_send_recv, func.call, "
              "tensor.dim, tensor.cast and index arith.constant)";
  }

  /// A call of a function of the module: its ops become steps here, its
  /// arguments the call's operands, its results what it returns.
  LogicalResult inlineCall(func::CallOp call) {
    auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(call, call.getCalleeAttr());
    if (!callee || callee.isExternal())
      return call.emitError() << "epic-run: @" << call.getCallee()
                              << " is not a function with a body in this module";
    if (!callee.getBody().hasOneBlock())
      return callee.emitError("epic-run: a called function must be one block (no control flow)");
    for (func::CallOp outer : callStack)
      if (outer.getCallee() == call.getCallee())
        return call.emitError() << "epic-run: @" << call.getCallee()
                                << " calls itself (recursion has no plan)";
    for (auto [argument, operand] : llvm::zip(callee.getArguments(), call.getOperands()))
      ids[argument] = use(operand);
    callStack.push_back(call);
    for (Operation &op : callee.getBody().front())
      if (failed(step(&op)))
        return failure();
    callStack.pop_back();
    return success();
  }

  func::FuncOp main;
  SmallVector<func::CallOp> callStack;
  llvm::DenseMap<Value, int64_t> ids;
  json::Array steps;
  int64_t ranks = -1, tokensRanks = -1, gpusPerNode = -1;
  Operation *tokensOp = nullptr;
};

} // namespace

std::string epic::translateRunProgram(const std::string &source, const std::string &sourceName) {
  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  context.printOpOnDiagnostic(false); // the location says which op

  SourceParser parser(context, source, sourceName);
  const std::string &diagnostics = parser.diagnostics();
  OwningOpRef<ModuleOp> module = parser.parse();
  if (!module)
    throw CompileError("cannot parse " + sourceName + ":\n" + diagnostics);
  // The fusion passes rewrite the pairs their cost model predicts faster fused
  // (a remark on each says which way and why); a pair left unfused runs as two
  // steps. The model prices one rank per GPU (NCCL): a virtual world's run
  // follows the same plan. A decode-sized FP8 layer written as five ops
  // becomes one ep.moe_layer first (its GEMMs take FP8 rows, which the pair
  // fusions leave alone anyway).
  PassManager fuse(&context);
  fuse.addNestedPass<func::FuncOp>(createEPFuseMoeLayer());
  fuse.addNestedPass<func::FuncOp>(createEPFuseDispatchGemm());
  fuse.addNestedPass<func::FuncOp>(createEPFuseGemmCombine());
  if (failed(fuse.run(*module)))
    throw CompileError("fusing the ep ops of " + sourceName + " failed:\n" + diagnostics);
  auto main = module->lookupSymbol<func::FuncOp>("main");
  if (!main)
    throw CompileError(sourceName + ": an epic-run program needs a func.func @main");
  FailureOr<json::Object> plan = Translator(main).run();
  if (failed(plan))
    throw CompileError(sourceName + " is not a valid epic-run program:\n" + diagnostics);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}", json::Value(std::move(*plan))) << "\n";
  return text;
}
