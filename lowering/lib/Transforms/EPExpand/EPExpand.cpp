//===- EPExpand.cpp - ep ops to communication kernels ---------------------===//
//
// See EPExpand in Passes.td for the protocol. The pass: for each entry
// function (one ep op), the kernels (Kernels.h) in the module's gpu.module,
// and the launch function that replaces the entry, with the launch metadata
// the runtime reads. Layout.h has the window and records, KernelBuilder.h the
// builder the kernels are written with.
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/Passes.h"

#include "Kernels.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/xxhash.h"

namespace epic {
#define GEN_PASS_DEF_EPEXPAND
#include "epic/Transforms/Passes.h.inc"
} // namespace epic

using namespace mlir;
using namespace epic::expand;
namespace records = epic::ep::records;

namespace {

OpBuilder kernelInsertionPoint(gpu::GPUModuleOp module) {
  Block *body = module.getBody();
  if (!body->empty() && body->back().hasTrait<OpTrait::IsTerminator>())
    return OpBuilder(&body->back());
  return OpBuilder::atBlockEnd(body);
}

/// The one ep op of an entry function, or a diagnostic.
FailureOr<Operation *> entryOp(func::FuncOp func) {
  Operation *epOp = nullptr;
  for (Operation &op : func.getBody().front()) {
    if (isa<ep::DispatchOp, ep::CombineOp, ep::GroupedGemmOp, ep::DispatchGemmOp,
            ep::GemmCombineOp>(op)) {
      if (epOp)
        return func.emitError("ep-expand: expected one ep.dispatch, ep.combine or "
                              "ep.grouped_gemm per function, found a second one"),
               failure();
      epOp = &op;
    } else if (!isa<func::ReturnOp>(op)) {
      return op.emitError("ep-expand: an ep op must be alone in its function (the entry form "
                          "the runtime generates); found '")
                 << op.getName() << "'",
             failure();
    }
  }
  return epOp;
}

/// A hash of what the ranks' kernels must agree on, the same in every
/// process (of the op's text, not of context pointers): the op's name,
/// attributes (the configuration included) and operand and result types
/// (which say whether weights, scale packs and biases are there, and their
/// dtypes), the timeout and the block size.
int64_t opSignatureOf(Operation *op, int64_t timeoutMs, unsigned threads) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getName() << op->getAttrDictionary() << " timeout " << timeoutMs << " threads "
     << threads;
  for (Type type : op->getOperandTypes())
    os << " in " << type;
  for (Type type : op->getResultTypes())
    os << " out " << type;
  return int64_t(llvm::xxh3_64bits(text));
}

LogicalResult expand(func::FuncOp func, Operation *op, unsigned threads,
                     bool onePassCachedDispatch) {
  int64_t timeoutMs = kDefaultTimeoutMs;
  if (Attribute attr = func->getAttr("epic.timeout_ms")) {
    auto value = dyn_cast<IntegerAttr>(attr);
    if (!value || value.getInt() < 1 || value.getInt() > (int64_t(1) << 31))
      return func.emitError("ep-expand: epic.timeout_ms must be an integer in [1, 2^31] "
                            "(milliseconds), got ")
             << attr;
    timeoutMs = value.getInt();
  }
  OpBuilder builder(func);
  Location loc = op->getLoc();
  MLIRContext *ctx = func.getContext();
  std::string name = func.getName().str();
  const std::string moduleName = "ep_kernels";

  SmallVector<std::string> kernelNames;
  SmallVector<StringRef> fields;
  int64_t tensorMaps = 0; // TMA descriptors at the end of each record
  ep::ConfigAttr cfg;
  // Builds the kernels; gets the record's stride.
  std::function<void(gpu::GPUModuleOp, const RecordLayout &)> build;
  SmallVector<NamedAttribute> extraMetadata;
  bool cooperative = true;
  int64_t windowBytes = -1; // the configuration's layout unless set
  int64_t scratchAt = -1;   // fused entries: [scratchAt, windowBytes) must be zero at entry
  // The layout the kernels see, with the entry's timeout and record.
  const int64_t signature = opSignatureOf(op, timeoutMs, threads);
  auto layoutFor = [&](unsigned idxBits, const RecordLayout &record, int64_t tmaxField) {
    EPLayout layout(cfg, idxBits);
    layout.signature = signature;
    layout.timeoutMs = timeoutMs;
    layout.paramStride = record.stride;
    layout.tmaxField = tmaxField;
    return layout;
  };
  auto gemmMetadata = [&](const epic::detail::GroupedGemmShape &gemm, StringRef lhs,
                          StringRef weights, Attribute rows, const RecordLayout &record) {
    extraMetadata.push_back(
        builder.getNamedAttr("epic.dynamic_shared_bytes",
                             builder.getI64IntegerAttr(epic::detail::kGemmDynamicSharedBytes)));
    extraMetadata.push_back(builder.getNamedAttr(
        "epic.ctas_per_sm", builder.getI64IntegerAttr(epic::detail::kGemmCtasPerSm)));
    extraMetadata.push_back(builder.getNamedAttr(
        "epic.tensor_maps",
        epic::detail::groupedGemmTensorMaps(builder, gemm, lhs, weights, rows, record.mapsOffset)));
  };

  if (auto gemm = dyn_cast<ep::GroupedGemmOp>(op)) {
    cfg = gemm.getConfig();
    auto lhs = cast<ShapedType>(gemm.getLhs().getType());
    auto rhs = cast<ShapedType>(gemm.getRhs().getType());
    epic::detail::GroupedGemmShape shape{
        cfg.getHidden(),          rhs.getDimSize(2),
        cfg.getNumLocalExperts(), cfg.getExpertAlignment(),
        lhs.getElementType(),     cast<ShapedType>(gemm.getResult().getType()).getElementType()};
    if (failed(epic::detail::checkGroupedGemmShape(op, shape)))
      return failure();
    kernelNames = {name + "_gemm"};
    fields = fieldNames(epic::detail::kGroupedGemmFields);
    tensorMaps = 2;
    threads = epic::detail::kGemmThreads; // one warpgroup
    cooperative = false;                  // blocks never wait for each other
    windowBytes = 0;
    RecordLayout record(fields.size(), tensorMaps);
    gemmMetadata(shape, records::grouped_gemm::x, records::grouped_gemm::weights,
                 builder.getStringAttr(records::grouped_gemm::num_rows), record);
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      OpBuilder b = kernelInsertionPoint(module);
      epic::detail::buildGroupedGemmKernel(createKernel(b, loc, kernelNames[0], false),
                                           withRecord(shape, record));
    };
  } else if (auto fused = dyn_cast<ep::GemmCombineOp>(op)) {
    cfg = fused.getConfig();
    epic::detail::GroupedGemmShape gemm{cfg.getHidden(),
                                        cfg.getHidden(),
                                        cfg.getNumLocalExperts(),
                                        cfg.getExpertAlignment(),
                                        cast<ShapedType>(fused.getLhs().getType()).getElementType(),
                                        builder.getBF16Type()};
    if (failed(epic::detail::checkGroupedGemmShape(op, gemm)))
      return failure();
    // Scratch after the windows (FusedScratch): row -> token, each token's rows
    // still to compute, each 128-row tile's finished column tiles, a rank
    // barrier and the count of row chunks claimed.
    FusedScratch at(cfg);
    windowBytes = at.end, scratchAt = at.tileDone;
    gemm.outField = kCX, gemm.psumField = kGCPsumPerExpert;
    gemm.timeoutMs = timeoutMs;
    CombineShape shape{false, static_cast<unsigned>(fused.getBiases().size()), true};
    kernelNames = {name + "_gemm_send", name + "_reduce"};
    fields = fieldNames(kCombineFields, kGemmCombineExtraFields);
    tensorMaps = 2;
    threads = epic::detail::kGemmThreads;
    RecordLayout record(fields.size(), tensorMaps);
    gemmMetadata(gemm, records::combine::lhs, records::combine::weights,
                 builder.getStringAttr(records::combine::num_rows), record);
    GemmCombineScratch scratch{at.rowToken, at.pending,
                               at.colDone,  at.arrivals,
                               at.maxTiles, cfg.getHidden() / epic::detail::kGemmTileN};
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout fusedLayout = layoutFor(64, record, kCMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildGemmSendKernel(createKernel(b, loc, kernelNames[0], false), fusedLayout, shape,
                          withRecord(gemm, record), scratch);
      buildCombineReduce(createKernel(b, loc, kernelNames[1], false), fusedLayout, shape);
    };
  } else if (auto fused = dyn_cast<ep::DispatchGemmOp>(op)) {
    cfg = fused.getConfig();
    auto experts = cast<ShapedType>(fused.getExperts().getType());
    epic::detail::GroupedGemmShape gemm{
        cfg.getHidden(),          experts.getDimSize(2),
        cfg.getNumLocalExperts(), cfg.getExpertAlignment(),
        cfg.getDtype(),           cast<ShapedType>(fused.getResult().getType()).getElementType()};
    if (failed(epic::detail::checkGroupedGemmShape(op, gemm)))
      return failure();
    unsigned idxBits = cast<ShapedType>(fused.getTopkIdx().getType()).getElementTypeBitWidth();
    EPLayout layout(cfg, idxBits);
    // The tile counters follow the windows (FusedScratch).
    FusedScratch at(cfg);
    int64_t maxTiles = at.maxTiles, tileDone = at.tileDone;
    windowBytes = at.tileConsumed + at.counters, scratchAt = at.tileDone;
    gemm.outField = kDGGemmOut, gemm.psumField = kPsumPerExpert;
    gemm.tileDone = tileDone, gemm.tileConsumed = at.tileConsumed, gemm.maxTiles = maxTiles;
    gemm.timeoutMs = timeoutMs;
    DispatchShape shape{false,
                        static_cast<bool>(fused.getTopkWeights()),
                        true,
                        false,
                        fused.getZeroPadding(),
                        tileDone,
                        maxTiles,
                        fusedRowUnroll(layout.rowBytes)};
    kernelNames = {name + "_send", name + "_copy_gemm"};
    fields = fieldNames(kDispatchFields, kDispatchGemmExtraFields);
    tensorMaps = 2;
    threads = epic::detail::kGemmThreads;
    RecordLayout record(fields.size(), tensorMaps);
    // The verifier asks for a static Tmax: the recv_x rows are a constant.
    gemmMetadata(gemm, records::dispatch::recv_x, records::dispatch::experts,
                 builder.getI64IntegerAttr(*cfg.getMaxOutputRows()), record);
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout fusedLayout = layoutFor(idxBits, record, kDispatchMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildDispatchSend(createKernel(b, loc, kernelNames[0], true), fusedLayout, shape);
      buildCopyGemmKernel(b, loc, kernelNames[1], fusedLayout, shape, withRecord(gemm, record));
    };
  } else if (auto dispatch = dyn_cast<ep::DispatchOp>(op)) {
    cfg = dispatch.getConfig();
    // A cached dispatch reads the handle's routing, which the runtime keeps as int64.
    unsigned idxBits =
        dispatch.isCached()
            ? 64
            : cast<ShapedType>(dispatch.getTopkIdx().getType()).getElementTypeBitWidth();
    DispatchShape shape{static_cast<bool>(dispatch.getScalePacks()),
                        static_cast<bool>(dispatch.getTopkWeights()), cfg.isExpanded(),
                        dispatch.isCached(), dispatch.getZeroPadding()};
    fields = fieldNames(kDispatchFields);
    const bool scatter = shape.cached && onePassCachedDispatch;
    if (scatter) {
      kernelNames = {name + "_scatter"};
      cooperative = false; // no rank waits for another
    } else {
      kernelNames = {name + "_send", name + "_copy"};
    }
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout layout = layoutFor(idxBits, record, kDispatchMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      if (scatter) {
        buildDispatchScatter(createKernel(b, loc, kernelNames[0], false), layout, shape);
        return;
      }
      buildDispatchSend(createKernel(b, loc, kernelNames[0], true), layout, shape);
      buildDispatchCopy(createKernel(b, loc, kernelNames[1], false), layout, shape);
    };
  } else {
    auto combine = cast<ep::CombineOp>(op);
    cfg = combine.getConfig();
    if (cfg.getHidden() % 8 != 0)
      return op->emitError("ep-expand: combine reduces 8 bf16 channels per step, so hidden (")
             << cfg.getHidden() << ") must be a multiple of 8";
    CombineShape shape{static_cast<bool>(combine.getTopkWeights()),
                       static_cast<unsigned>(combine.getBiases().size()), cfg.isExpanded()};
    kernelNames = {name + "_send", name + "_reduce"};
    fields = fieldNames(kCombineFields);
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      // The routing comes from the handle (topk_idx of the dispatch); int64.
      EPLayout layout = layoutFor(64, record, kCMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildCombineSend(createKernel(b, loc, kernelNames[0], true), layout, shape);
      buildCombineReduce(createKernel(b, loc, kernelNames[1], false), layout, shape);
    };
  }
  const RecordLayout record(fields.size(), tensorMaps);

  // The kernels, in the module's one gpu.module (one cubin for the runtime).
  ModuleOp parent = func->getParentOfType<ModuleOp>();
  parent->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), builder.getUnitAttr());
  auto kernels = SymbolTable::lookupSymbolIn(parent, moduleName);
  auto kernelModule = dyn_cast_or_null<gpu::GPUModuleOp>(kernels);
  if (!kernelModule) {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(parent.getBody());
    kernelModule = gpu::GPUModuleOp::create(builder, loc, moduleName);
  }
  build(kernelModule, record);
  // The launch's block size, known to the kernels: ptxas sizes their register
  // budget for it (.reqntid), so a launch of `threads` always fits an SM. The
  // records travel by value, one per rank a launch serves.
  auto table = comm::ParamTableAttr::get(ctx, 2, record.stride, cfg.getRanks());
  for (const std::string &kernel : kernelNames)
    if (auto fn = kernelModule.lookupSymbol<gpu::GPUFuncOp>(kernel)) {
      fn.setKnownBlockSizeAttr(builder.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
      fn->setAttr(comm::ParamTableAttr::getAttrName(), table);
    }
  builder.setInsertionPoint(func);

  // The launch function replaces the entry function.
  Type args[] = {comm::DevCommType::get(ctx), comm::WindowType::get(ctx),
                 LLVM::LLVMPointerType::get(ctx), builder.getIndexType()};
  auto launch = func::FuncOp::create(builder, loc, name, builder.getFunctionType(args, {}));
  Block *body = launch.addEntryBlock();
  OpBuilder lb = OpBuilder::atBlockEnd(body);
  Value one = arith::ConstantIndexOp::create(lb, loc, 1);
  Value threadCount = arith::ConstantIndexOp::create(lb, loc, threads);
  Value grid = body->getArgument(3);
  for (const std::string &kernel : kernelNames) {
    auto symbol = SymbolRefAttr::get(ctx, moduleName, {FlatSymbolRefAttr::get(ctx, kernel)});
    gpu::LaunchFuncOp::create(
        lb, loc, symbol, gpu::KernelDim3{grid, one, one}, gpu::KernelDim3{threadCount, one, one},
        Value(), ValueRange{body->getArgument(0), body->getArgument(1), body->getArgument(2)});
  }
  func::ReturnOp::create(lb, loc);

  EPLayout layout(cfg, 64);
  SmallVector<Attribute> fieldAttrs;
  for (StringRef field : fields)
    fieldAttrs.push_back(builder.getStringAttr(field));
  SmallVector<Attribute> kernelAttrs;
  for (const std::string &kernel : kernelNames)
    kernelAttrs.push_back(builder.getStringAttr(kernel));
  launch->setAttr("epic.entry",
                  builder.getStringAttr(isa<ep::DispatchOp>(op)       ? "dispatch"
                                        : isa<ep::CombineOp>(op)      ? "combine"
                                        : isa<ep::GroupedGemmOp>(op)  ? "grouped_gemm"
                                        : isa<ep::DispatchGemmOp>(op) ? "dispatch_gemm"
                                                                      : "gemm_combine"));
  launch->setAttr("epic.config", cfg);
  launch->setAttr("epic.kernels", builder.getArrayAttr(kernelAttrs));
  launch->setAttr("epic.threads", builder.getI64IntegerAttr(threads));
  launch->setAttr("epic.param_fields", builder.getArrayAttr(fieldAttrs));
  launch->setAttr("epic.param_stride", builder.getI64IntegerAttr(record.stride));
  launch->setAttr("epic.window_bytes",
                  builder.getI64IntegerAttr(windowBytes >= 0 ? windowBytes : layout.windowBytes));
  // A run-time Tmax: the window needs window_bytes + Tmax x this.
  if (windowBytes < 0 && !cfg.hasStaticTokenCap())
    launch->setAttr("epic.window_bytes_per_token",
                    builder.getI64IntegerAttr(layout.windowPerToken));
  // The fused kernels' scratch: zero when they start (they leave it so), but
  // another configuration's data may have been there (EPWindow.h).
  if (scratchAt >= 0)
    launch->setAttr("epic.window_scratch_at", builder.getI64IntegerAttr(scratchAt));
  launch->setAttr("epic.max_blocks_per_rank", builder.getI64IntegerAttr(kMaxBlocksPerRank));
  // The blocks of a launch wait for each other (entry barriers, the count
  // exchange): the runtime must launch them cooperatively (all resident).
  launch->setAttr("epic.cooperative", builder.getI64IntegerAttr(cooperative ? 1 : 0));
  launch->setAttr("epic.timeout_ms", builder.getI64IntegerAttr(timeoutMs));
  for (NamedAttribute attr : extraMetadata)
    launch->setAttr(attr.getName(), attr.getValue());
  func.erase();
  return success();
}

struct EPExpandPass : public epic::impl::EPExpandBase<EPExpandPass> {
  using EPExpandBase::EPExpandBase;
  void runOnOperation() override {
    if (threadsPerBlock % 32 != 0 || threadsPerBlock == 0 || threadsPerBlock > 1024) {
      getOperation().emitError("ep-expand: threads-per-block must be a multiple of 32 in "
                               "[32, 1024], got ")
          << threadsPerBlock;
      return signalPassFailure();
    }
    SmallVector<std::pair<func::FuncOp, Operation *>> entries;
    bool failed = false;
    getOperation().walk([&](func::FuncOp func) {
      bool hasEP = false;
      func.walk([&](Operation *op) {
        hasEP |= isa<ep::DispatchOp, ep::CombineOp, ep::GroupedGemmOp, ep::DispatchGemmOp,
                     ep::GemmCombineOp>(op);
      });
      if (!hasEP)
        return;
      FailureOr<Operation *> op = entryOp(func);
      if (mlir::failed(op)) {
        failed = true;
        return;
      }
      entries.push_back({func, *op});
    });
    for (auto [func, op] : entries)
      failed |= mlir::failed(expand(func, op, threadsPerBlock, onePassCachedDispatch));
    if (failed)
      signalPassFailure();
  }
};

} // namespace
