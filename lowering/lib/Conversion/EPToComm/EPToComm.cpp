//===- EPToComm.cpp - ep ops to communication kernels ---------------------===//
//
// See ConvertEPToComm in Conversion/Passes.td for the protocol. A dialect
// conversion: one pattern per op of ep::KernelOpInterface. Each pattern
// plans the op's kernels (names, parameter record, window, launch shape),
// builds them into the module's gpu.module (Kernels.h), and replaces the
// entry function that holds the op with the launch function the runtime
// calls, carrying the launch metadata. The pass checks the entry form first,
// so its diagnostics name what is wrong rather than "failed to legalize".
// Layout.h has the window and records, KernelBuilder.h the builder the
// kernels are written with.
//
//===----------------------------------------------------------------------===//

#include "epic/Conversion/LaunchAttributes.h"
#include "epic/Conversion/Passes.h"

#include "Kernels.h"

#include "mlir/IR/SymbolTable.h"
#include "mlir/Transforms/DialectConversion.h"
#include "llvm/Support/xxhash.h"

namespace epic {
#define GEN_PASS_DEF_CONVERTEPTOCOMM
#include "epic/Conversion/Passes.h.inc"
} // namespace epic

using namespace mlir;
using namespace epic::expand;
namespace records = epic::ep::records;

namespace {

constexpr StringLiteral kKernelModule = "ep_kernels";

OpBuilder kernelInsertionPoint(gpu::GPUModuleOp module) {
  Block *body = module.getBody();
  if (!body->empty() && body->back().hasTrait<OpTrait::IsTerminator>())
    return OpBuilder(&body->back());
  return OpBuilder::atBlockEnd(body);
}

/// The entry function's bound of the kernels' waits (epic.timeout_ms), or
/// the default; a diagnostic on the function if it is out of range.
FailureOr<int64_t> entryTimeout(func::FuncOp func) {
  Attribute attr = func->getAttr(epic::launchAttributeName(epic::LaunchField::timeoutMs));
  if (!attr)
    return kDefaultTimeoutMs;
  auto value = dyn_cast<IntegerAttr>(attr);
  if (!value || value.getInt() < 1 || value.getInt() > (int64_t(1) << 31))
    return func.emitError("convert-ep-to-comm: epic.timeout_ms must be an integer in [1, 2^31] "
                          "(milliseconds), got ")
           << attr;
  return value.getInt();
}

/// The entry form: `func` holds one ep op with kernels and its return. A
/// diagnostic otherwise; whether `func` has such an op to lower.
FailureOr<bool> checkEntryForm(func::FuncOp func) {
  Operation *epOp = nullptr;
  bool hasKernelOp = false;
  func.walk([&](ep::KernelOpInterface) { hasKernelOp = true; });
  if (!hasKernelOp)
    return false;
  // An ep op nested in a region is reported at the op that holds it.
  for (Operation &op : func.getBody().front()) {
    if (isa<ep::KernelOpInterface>(op)) {
      if (epOp)
        return func.emitError("convert-ep-to-comm: expected one ep.dispatch, ep.combine or "
                              "ep.grouped_gemm per function, found a second one");
      epOp = &op;
    } else if (!isa<func::ReturnOp>(op)) {
      return op.emitError("convert-ep-to-comm: an ep op must be alone in its function (the "
                          "entry form the runtime generates); found '")
             << op.getName() << "'";
    }
  }
  if (failed(entryTimeout(func)))
    return failure();
  return true;
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

/// The entry being lowered: its name, the bound of its waits and the pass's
/// options.
struct Entry {
  std::string name;
  int64_t timeoutMs;
  unsigned threads;
  /// Every rank's tensors in one address space: rows go straight to their place.
  bool onePassDispatch, onePassCombine;
};

/// What an op lowers to: its kernels (made by `build` into the gpu.module),
/// their launch, the parameter record they read and the window they need.
struct KernelPlan {
  Location loc; ///< the op's: of its kernels and launch
  ep::ConfigAttr cfg;
  SmallVector<std::string> kernels;
  SmallVector<StringRef> fields;
  int64_t tensorMaps = 0; // TMA descriptors at the end of each record
  unsigned threads;
  bool cooperative = true;
  int64_t windowBytes = -1; // the configuration's layout unless set
  int64_t scratchAt = -1;   // fused entries: [scratchAt, windowBytes) must be zero at entry
  int64_t signature = 0;
  int64_t timeoutMs = 0;
  /// The GEMM entries' launch (shared memory, CTAs per SM, TMA descriptors);
  /// emitLaunch fills in the rest.
  epic::LaunchMetadata launch;
  /// Builds the kernels (the plan passed back: its loc, layout(), kernel names).
  std::function<void(const KernelPlan &, gpu::GPUModuleOp, const RecordLayout &)> build;

  /// The signature hashes the pass's block size even where the op's kernels
  /// launch their own (`threads`): it names the lowering the ranks ran.
  KernelPlan(Operation *op, ep::ConfigAttr cfg, const Entry &entry, unsigned threads)
      : loc(op->getLoc()), cfg(cfg), threads(threads),
        signature(opSignatureOf(op, entry.timeoutMs, entry.threads)), timeoutMs(entry.timeoutMs) {}

  RecordLayout record() const { return RecordLayout(fields.size(), tensorMaps); }
  /// An empty kernel named `kernels[i]` (createKernel) where `b` points.
  gpu::GPUFuncOp kernel(OpBuilder &b, size_t i, bool sharedFlag, int64_t sharedWords = 0) const {
    return createKernel(b, loc, kernels[i], sharedFlag, sharedWords);
  }
  /// The layout the kernels see, with the entry's timeout and record.
  EPLayout layout(unsigned idxBits, const RecordLayout &record, int64_t tmaxField) const {
    EPLayout layout(cfg, idxBits);
    layout.signature = signature;
    layout.timeoutMs = timeoutMs;
    layout.paramStride = record.stride;
    layout.tmaxField = tmaxField;
    return layout;
  }
  /// The grouped GEMM's launch: shared memory, CTAs per SM, TMA descriptors.
  void addGemmMetadata(const epic::detail::GroupedGemmShape &gemm, StringRef lhs, StringRef weights,
                       epic::IntOrField rows) {
    launch.dynamicSharedBytes = epic::detail::gemmDynamicSharedBytes(gemm);
    launch.ctasPerSm = epic::detail::gemmCtasPerSm(gemm);
    launch.tensorMaps = epic::detail::groupedGemmTensorMaps(gemm, lhs, weights, std::move(rows),
                                                            record().mapsOffset);
  }
};

/// The grouped GEMM of `op`'s local experts: `k` x `n` weights (k: the hidden
/// size unless given), rows of `lhs`, results of `out`; a diagnostic on `op` if
/// the kernel cannot tile it.
FailureOr<epic::detail::GroupedGemmShape> gemmShapeOf(Operation *op, const Entry &entry,
                                                      ep::ConfigAttr cfg, int64_t n, Type lhs,
                                                      Type out, int64_t k = 0) {
  epic::detail::GroupedGemmShape shape{
      k ? k : int64_t(cfg.getHidden()), n,   cfg.getNumLocalExperts(),
      cfg.getExpertAlignment(),         lhs, out};
  shape.timeoutMs = entry.timeoutMs; // its pipeline's waits are bounded too
  if (failed(epic::detail::checkGroupedGemmShape(op, shape)))
    return failure();
  return shape;
}

/// Builds `plan`'s kernels into the module's gpu.module and replaces `func`
/// with the launch function of the same name, carrying the launch metadata.
void emitLaunch(func::FuncOp func, ep::KernelOpInterface op, const KernelPlan &plan,
                ConversionPatternRewriter &rewriter) {
  MLIRContext *ctx = func.getContext();
  Location loc = plan.loc;
  const RecordLayout record = plan.record();
  auto kernelModule = SymbolTable::lookupNearestSymbolFrom<gpu::GPUModuleOp>(
      func, StringAttr::get(ctx, kKernelModule));
  plan.build(plan, kernelModule, record);
  // The launch's block size, known to the kernels: ptxas sizes their register
  // budget for it (.reqntid), so a launch of `threads` always fits an SM. The
  // records travel by value, one per rank a launch serves.
  auto table = comm::ParamTableAttr::get(ctx, 2, record.stride, plan.cfg.getRanks());
  for (const std::string &kernel : plan.kernels)
    if (auto fn = kernelModule.lookupSymbol<gpu::GPUFuncOp>(kernel)) {
      fn.setKnownBlockSizeAttr(rewriter.getDenseI32ArrayAttr({int32_t(plan.threads), 1, 1}));
      fn->setAttr(comm::ParamTableAttr::getAttrName(), table);
    }

  // The launch function replaces the entry function.
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPoint(func);
  Type args[] = {comm::DevCommType::get(ctx), comm::WindowType::get(ctx),
                 LLVM::LLVMPointerType::get(ctx), rewriter.getIndexType()};
  auto launch =
      func::FuncOp::create(rewriter, loc, func.getName(), rewriter.getFunctionType(args, {}));
  Block *body = rewriter.createBlock(&launch.getBody(), {}, args,
                                     SmallVector<Location>(std::size(args), loc));
  Value one = arith::ConstantIndexOp::create(rewriter, loc, 1);
  Value threadCount = arith::ConstantIndexOp::create(rewriter, loc, plan.threads);
  Value grid = body->getArgument(3);
  for (const std::string &kernel : plan.kernels) {
    auto symbol = SymbolRefAttr::get(ctx, kKernelModule, {FlatSymbolRefAttr::get(ctx, kernel)});
    gpu::LaunchFuncOp::create(
        rewriter, loc, symbol, gpu::KernelDim3{grid, one, one},
        gpu::KernelDim3{threadCount, one, one}, Value(),
        ValueRange{body->getArgument(0), body->getArgument(1), body->getArgument(2)});
  }
  func::ReturnOp::create(rewriter, loc);

  EPLayout layout(plan.cfg, 64);
  epic::LaunchMetadata md = plan.launch;
  md.entry = op.getEntryKind().str();
  md.kernels.assign(plan.kernels.begin(), plan.kernels.end());
  md.threads = plan.threads;
  for (StringRef field : plan.fields)
    md.paramFields.push_back(field.str());
  md.paramStride = record.stride;
  md.windowBytes = plan.windowBytes >= 0 ? plan.windowBytes : layout.windowBytes;
  // A run-time Tmax: the window needs window_bytes + Tmax x this.
  if (plan.windowBytes < 0 && !plan.cfg.hasStaticTokenCap())
    md.windowBytesPerToken = layout.windowPerToken;
  // Across nodes the kernels that send stage records per warp after the data
  // region, and signal over GIN (EPWindow.h).
  if (plan.windowBytes < 0 && plan.cfg.isMultiNode()) {
    md.windowBytesPerWarp = layout.stagingPerWarp;
    md.ginSignals = epic::ep::window::ginSignals(plan.cfg.getRanks());
  }
  // The fused kernels' scratch: zero when they start (they leave it so), but
  // another configuration's data may have been there (EPWindow.h).
  md.windowScratchAt = plan.scratchAt;
  md.maxBlocksPerRank = kMaxBlocksPerRank;
  // The blocks of a launch wait for each other (entry barriers, the count
  // exchange): the runtime must launch them cooperatively (all resident).
  md.cooperative = plan.cooperative;
  md.timeoutMs = plan.timeoutMs;
  epic::setLaunchAttributes(launch, md);
  launch->setAttr(epic::launchAttributeName(epic::LaunchField::config), plan.cfg);
  rewriter.eraseOp(func);
}

/// The common part of every op's pattern: the entry, the plan (each op's
/// own), then the kernels and the launch. Plans check everything before
/// building anything, so a pattern that fails has changed nothing.
template <typename OpT> class KernelOpLowering : public OpConversionPattern<OpT> {
public:
  KernelOpLowering(MLIRContext *ctx, unsigned threads, bool onePassDispatch, bool onePassCombine)
      : OpConversionPattern<OpT>(ctx), threads(threads), onePassDispatch(onePassDispatch),
        onePassCombine(onePassCombine) {}

  LogicalResult matchAndRewrite(OpT op, typename OpT::Adaptor,
                                ConversionPatternRewriter &rewriter) const final {
    auto func = dyn_cast<func::FuncOp>(op->getParentOp());
    if (!func) // the pass checked the entry form
      return rewriter.notifyMatchFailure(op, "not in an entry function");
    FailureOr<int64_t> timeoutMs = entryTimeout(func);
    if (failed(timeoutMs))
      return failure();
    Entry entry{func.getName().str(), *timeoutMs, threads, onePassDispatch, onePassCombine};
    FailureOr<KernelPlan> plan = planKernels(op, entry, rewriter);
    if (failed(plan))
      return failure();
    emitLaunch(func, cast<ep::KernelOpInterface>(op.getOperation()), *plan, rewriter);
    return success();
  }

protected:
  /// The op's kernels, checked, not yet built.
  virtual FailureOr<KernelPlan> planKernels(OpT op, const Entry &entry, Builder &b) const = 0;

private:
  unsigned threads;
  bool onePassDispatch;
  /// A combine that reads every contribution where it lies (one address space).
  bool onePassCombine;
};

/// DeepEP's get_dispatch_layout: counts zeroed, then a thread per token.
struct DispatchLayoutOpLowering : KernelOpLowering<ep::DispatchLayoutOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::DispatchLayoutOp op, const Entry &entry,
                                    Builder &) const override {
    KernelPlan plan(op, op.getConfig(), entry, entry.threads);
    unsigned idxBits = cast<ShapedType>(op.getTopkIdx().getType()).getElementTypeBitWidth();
    plan.kernels = {entry.name + "_zero", entry.name + "_count"};
    plan.fields = fieldNames(kLayoutFields);
    plan.cooperative = false; // nothing waits
    plan.windowBytes = 0;     // nothing crosses ranks
    plan.build = [idxBits](const KernelPlan &plan, gpu::GPUModuleOp module,
                           const RecordLayout &record) {
      EPLayout layout = plan.layout(idxBits, record, kLNumTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildLayoutZero(plan.kernel(b, 0, false), layout);
      buildLayoutCount(plan.kernel(b, 1, false), layout);
    };
    return plan;
  }
};

/// An op with window-resident tensors publishes its parameter record in the
/// window's control region for peers to read (KernelBuilder::publishRecord).
static LogicalResult checkPublishable(Operation *op, const KernelPlan &plan) {
  const int64_t stride = plan.record().stride;
  if (stride <= epic::ep::window::kMaxPublishedRecordBytes)
    return success();
  return op->emitOpError("window_outputs: the parameter record (")
         << stride << " bytes) exceeds the window's published-record slot ("
         << epic::ep::window::kMaxPublishedRecordBytes << " bytes)";
}

struct DispatchOpLowering : KernelOpLowering<ep::DispatchOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::DispatchOp dispatch, const Entry &entry,
                                    Builder &) const override {
    KernelPlan plan(dispatch, dispatch.getConfig(), entry, entry.threads);
    // A cached dispatch reads the handle's routing, which the runtime keeps as int64.
    unsigned idxBits =
        dispatch.isCached()
            ? 64
            : cast<ShapedType>(dispatch.getTopkIdx().getType()).getElementTypeBitWidth();
    DispatchShape shape{static_cast<bool>(dispatch.getScalePacks()),
                        static_cast<bool>(dispatch.getTopkWeights()), plan.cfg.isExpanded(),
                        dispatch.isCached(), dispatch.getZeroPadding()};
    plan.fields = fieldNames(kDispatchFields);
    // The one-pass scatter stores into every destination's tensors: in one
    // address space, or where they lie in the window (window_outputs), which
    // ranks of other nodes do not reach. Uncached, a count kernel takes every
    // slot first.
    const bool window = dispatch.getWindowOutputs();
    if (window && failed(checkPublishable(dispatch, plan)))
      return failure();
    const bool onePass = (entry.onePassDispatch || window) && !plan.cfg.isMultiNode();
    const bool scatter = shape.cached && onePass;
    shape.onePass = onePass && !shape.cached;
    if (scatter) {
      plan.kernels = {entry.name + "_scatter"};
      plan.cooperative = window; // in the window, ranks meet before and after
    } else if (shape.onePass) {
      plan.kernels = {entry.name + "_count", entry.name + "_scatter"};
    } else if (plan.cfg.isMultiNode() && plan.cfg.isHybrid()) {
      plan.kernels = {entry.name + "_send", entry.name + "_forward", entry.name + "_copy"};
      plan.fields = fieldNames(kDispatchFields, kDispatchForwarderFields);
    } else {
      plan.kernels = {entry.name + "_send", entry.name + "_copy"};
    }
    plan.build = [idxBits, shape, scatter, window](const KernelPlan &plan, gpu::GPUModuleOp module,
                                                   const RecordLayout &record) {
      EPLayout layout = plan.layout(idxBits, record, kDispatchMaxTokens);
      layout.peersInWindow = window;
      OpBuilder b = kernelInsertionPoint(module);
      if (scatter)
        return buildDispatchScatter(plan.kernel(b, 0, false), layout, shape);
      buildDispatchSend(plan.kernel(b, 0, true), layout, shape); // one pass: counts only
      if (shape.onePass)
        return buildDispatchScatter(plan.kernel(b, 1, false), layout, shape);
      if (layout.hybrid)
        buildDispatchForward(plan.kernel(b, 1, true), layout, shape);
      buildDispatchCopy(plan.kernel(b, plan.kernels.size() - 1, false), layout, shape);
    };
    return plan;
  }
};

struct CombineOpLowering : KernelOpLowering<ep::CombineOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::CombineOp combine, const Entry &entry,
                                    Builder &) const override {
    KernelPlan plan(combine, combine.getConfig(), entry, entry.threads);
    if (plan.cfg.getHidden() % 8 != 0)
      return combine->emitError("convert-ep-to-comm: combine reduces 8 bf16 channels per step, "
                                "so hidden (")
             << plan.cfg.getHidden() << ") must be a multiple of 8";
    CombineShape shape{static_cast<bool>(combine.getTopkWeights()),
                       static_cast<unsigned>(combine.getBiases().size()), plan.cfg.isExpanded()};
    const bool hybrid = plan.cfg.isMultiNode() && plan.cfg.isHybrid();
    const bool window = combine.getWindowOutputs();
    shape.onePass = (entry.onePassCombine || window) && !plan.cfg.isMultiNode();
    plan.fields = fieldNames(kCombineFields);
    if (window && failed(checkPublishable(combine, plan)))
      return failure();
    if (shape.onePass) {
      plan.kernels = {entry.name + "_gather"};
      plan.cooperative = window; // in the window, ranks meet before and after
    } else if (hybrid) {
      plan.kernels = {entry.name + "_send", entry.name + "_forward", entry.name + "_reduce"};
      plan.fields = fieldNames(kCombineFields, kCombineForwarderFields);
    } else {
      plan.kernels = {entry.name + "_send", entry.name + "_reduce"};
    }
    plan.build = [shape, window](const KernelPlan &plan, gpu::GPUModuleOp module,
                                 const RecordLayout &record) {
      // The routing comes from the handle (topk_idx of the dispatch); int64.
      EPLayout layout = plan.layout(64, record, kCMaxTokens);
      layout.peersInWindow = window;
      OpBuilder b = kernelInsertionPoint(module);
      if (shape.onePass)
        return buildCombineGather(plan.kernel(b, 0, false), layout, shape);
      buildCombineSend(plan.kernel(b, 0, true), layout, shape);
      if (layout.hybrid)
        buildCombineForward(plan.kernel(b, 1, true), layout, shape);
      buildCombineReduce(plan.kernel(b, plan.kernels.size() - 1, false), layout, shape);
    };
    return plan;
  }
};

struct GroupedGemmOpLowering : KernelOpLowering<ep::GroupedGemmOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::GroupedGemmOp gemm, const Entry &entry,
                                    Builder &b) const override {
    // BF16: one warpgroup per block (FP8: gemmThreads); blocks never wait for each other.
    KernelPlan plan(gemm, gemm.getConfig(), entry, epic::detail::kGemmThreads);
    ep::ConfigAttr cfg = plan.cfg;
    auto lhs = cast<ShapedType>(gemm.getLhs().getType());
    // N: the result's columns (the verifier ties them to the weights, whatever their layout).
    auto out = cast<ShapedType>(gemm.getResult().getType());
    FailureOr<epic::detail::GroupedGemmShape> checked =
        gemmShapeOf(gemm, entry, cfg, out.getDimSize(1), lhs.getElementType(), out.getElementType(),
                    lhs.getDimSize(1));
    if (failed(checked))
      return failure();
    epic::detail::GroupedGemmShape shape = *checked;
    plan.threads = unsigned(epic::detail::gemmThreads(shape)); // FP8: warp-specialized
    plan.kernels = {entry.name + "_gemm"};
    plan.fields = fieldNames(epic::detail::kGroupedGemmFields);
    plan.tensorMaps = 2;
    plan.cooperative = false;
    plan.windowBytes = 0;
    plan.addGemmMetadata(shape, records::grouped_gemm::x, records::grouped_gemm::weights,
                         {0, records::grouped_gemm::num_rows});
    plan.build = [shape](const KernelPlan &plan, gpu::GPUModuleOp module,
                         const RecordLayout &record) {
      OpBuilder b = kernelInsertionPoint(module);
      epic::detail::buildGroupedGemmKernel(plan.kernel(b, 0, false), withRecord(shape, record));
    };
    return plan;
  }
};

/// The expert MLP's activation: half a warp per (row, 128 channels), nothing waits.
struct SwigluOpLowering : KernelOpLowering<ep::SwigluOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::SwigluOp op, const Entry &entry, Builder &) const override {
    KernelPlan plan(op, op.getConfig(), entry, entry.threads);
    auto out = cast<ShapedType>(op.getResult().getType());
    SwigluShape shape{cast<ShapedType>(op.getGateUp().getType()).getElementType(),
                      out.getElementType(), out.getDimSize(1)};
    plan.kernels = {entry.name + "_swiglu"};
    plan.fields = fieldNames(kSwigluFields);
    plan.cooperative = false;
    plan.windowBytes = 0; // nothing crosses ranks
    plan.build = [shape](const KernelPlan &plan, gpu::GPUModuleOp module,
                         const RecordLayout &record) {
      EPLayout layout = plan.layout(64, record, kSNumRows);
      OpBuilder b = kernelInsertionPoint(module);
      buildSwiglu(plan.kernel(b, 0, false), layout, shape);
    };
    return plan;
  }
};

struct DispatchGemmOpLowering : KernelOpLowering<ep::DispatchGemmOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::DispatchGemmOp fused, const Entry &entry,
                                    Builder &b) const override {
    KernelPlan plan(fused, fused.getConfig(), entry, epic::detail::kGemmThreads);
    ep::ConfigAttr cfg = plan.cfg;
    auto experts = cast<ShapedType>(fused.getExperts().getType());
    FailureOr<epic::detail::GroupedGemmShape> checked =
        gemmShapeOf(fused, entry, cfg, experts.getDimSize(2), cfg.getDtype(),
                    cast<ShapedType>(fused.getResult().getType()).getElementType());
    if (failed(checked))
      return failure();
    epic::detail::GroupedGemmShape gemm = *checked;
    unsigned idxBits = cast<ShapedType>(fused.getTopkIdx().getType()).getElementTypeBitWidth();
    EPLayout layout(cfg, idxBits);
    // The tile counters follow the windows (FusedScratch).
    FusedScratch at(cfg);
    plan.windowBytes = at.tileConsumed + at.counters, plan.scratchAt = at.tileDone;
    gemm.outField = kDGGemmOut, gemm.psumField = kPsumPerExpert;
    gemm.tileDone = at.tileDone, gemm.tileConsumed = at.tileConsumed, gemm.maxTiles = at.maxTiles;
    DispatchShape shape{false,
                        static_cast<bool>(fused.getTopkWeights()),
                        true,
                        false,
                        fused.getZeroPadding(),
                        at.tileDone,
                        at.maxTiles,
                        fusedRowUnroll(layout.rowBytes)};
    plan.kernels = {entry.name + "_send", entry.name + "_copy_gemm"};
    plan.fields = fieldNames(kDispatchFields, kDispatchGemmExtraFields);
    plan.tensorMaps = 2;
    // The verifier asks for a static Tmax: the recv_x rows are a constant.
    plan.addGemmMetadata(gemm, records::dispatch::recv_x, records::dispatch::experts,
                         {*cfg.getMaxOutputRows(), {}});
    plan.build = [idxBits, shape, gemm](const KernelPlan &plan, gpu::GPUModuleOp module,
                                        const RecordLayout &record) {
      EPLayout fusedLayout = plan.layout(idxBits, record, kDispatchMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildDispatchSend(plan.kernel(b, 0, true), fusedLayout, shape);
      buildCopyGemmKernel(b, plan.loc, plan.kernels[1], fusedLayout, shape,
                          withRecord(gemm, record));
    };
    return plan;
  }
};

struct GemmCombineOpLowering : KernelOpLowering<ep::GemmCombineOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::GemmCombineOp fused, const Entry &entry,
                                    Builder &b) const override {
    KernelPlan plan(fused, fused.getConfig(), entry, epic::detail::kGemmThreads);
    ep::ConfigAttr cfg = plan.cfg;
    FailureOr<epic::detail::GroupedGemmShape> checked =
        gemmShapeOf(fused, entry, cfg, cfg.getHidden(),
                    cast<ShapedType>(fused.getLhs().getType()).getElementType(), b.getBF16Type());
    if (failed(checked))
      return failure();
    epic::detail::GroupedGemmShape gemm = *checked;
    // Scratch after the windows (FusedScratch): row -> token, each token's rows
    // still to compute, each 128-row tile's finished column tiles, a rank
    // barrier and the count of row chunks claimed.
    FusedScratch at(cfg);
    plan.windowBytes = at.end, plan.scratchAt = at.tileDone;
    gemm.outField = kCX, gemm.psumField = kGCPsumPerExpert;
    CombineShape shape{false, static_cast<unsigned>(fused.getBiases().size()), true};
    plan.kernels = {entry.name + "_gemm_send", entry.name + "_reduce"};
    plan.fields = fieldNames(kCombineFields, kGemmCombineExtraFields);
    plan.tensorMaps = 2;
    plan.addGemmMetadata(gemm, records::combine::lhs, records::combine::weights,
                         {0, records::combine::num_rows});
    GemmCombineScratch scratch{at.rowToken, at.pending,
                               at.colDone,  at.arrivals,
                               at.maxTiles, cfg.getHidden() / epic::detail::kGemmTileN};
    plan.build = [shape, gemm, scratch](const KernelPlan &plan, gpu::GPUModuleOp module,
                                        const RecordLayout &record) {
      EPLayout fusedLayout = plan.layout(64, record, kCMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildGemmSendKernel(plan.kernel(b, 0, false), fusedLayout, shape, withRecord(gemm, record),
                          scratch);
      buildCombineReduce(plan.kernel(b, 1, false), fusedLayout, shape);
    };
    return plan;
  }
};

/// The FP8 layer in one cooperative kernel at the FP8 GEMM's shape; its
/// record is the dispatch's, then each later step's under its name
/// (EPRecords.h), the four TMA descriptors after them.
struct MoeLayerOpLowering : KernelOpLowering<ep::MoeLayerOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::MoeLayerOp layer, const Entry &entry,
                                    Builder &b) const override {
    KernelPlan plan(layer, layer.getConfig(), entry, unsigned(epic::detail::kFp8Threads));
    ep::ConfigAttr cfg = plan.cfg;
    const int64_t inter = layer.getIntermediateSize();
    Type fp8 = cfg.getDtype(), bf16 = b.getBF16Type();
    FailureOr<epic::detail::GroupedGemmShape> gateUp =
        gemmShapeOf(layer, entry, cfg, 2 * inter, fp8, bf16);
    FailureOr<epic::detail::GroupedGemmShape> down =
        gemmShapeOf(layer, entry, cfg, cfg.getHidden(), fp8, bf16, inter);
    if (failed(gateUp) || failed(down))
      return failure();
    unsigned idxBits = cast<ShapedType>(layer.getTopkIdx().getType()).getElementTypeBitWidth();
    FusedScratch at(cfg);
    plan.scratchAt = at.layerBarrier, plan.windowBytes = at.layerEnd;
    plan.kernels = {entry.name + "_layer"};
    for (const std::string &field : records::moeLayerFields())
      plan.fields.push_back(field);
    plan.tensorMaps = 4;
    const int64_t mapBytes = epic::LaunchMetadata::kTensorMapBytes;
    const int64_t mapsAt = plan.record().mapsOffset;
    // A GEMM's descriptors: its part's lhs, weights and row count, at `maps` descriptors in.
    auto gemmMaps = [&](const epic::detail::GroupedGemmShape &gemm, int part, int64_t maps) {
      auto field = [&](int index) {
        return StringRef(plan.fields[records::moeLayerPartFirst(part) + index]);
      };
      return epic::detail::groupedGemmTensorMaps(gemm, field(kGGX), field(kGGWeights),
                                                 {0, field(kGGNumRows).str()},
                                                 mapsAt + maps * mapBytes);
    };
    plan.launch.dynamicSharedBytes = epic::detail::gemmDynamicSharedBytes(*gateUp);
    plan.launch.ctasPerSm = epic::detail::gemmCtasPerSm(*gateUp);
    plan.launch.tensorMaps = gemmMaps(*gateUp, records::kLayerGateUp, 0);
    for (epic::TensorMapSpec &map : gemmMaps(*down, records::kLayerDown, 2))
      plan.launch.tensorMaps.push_back(map);
    // In one address space (the virtual world) the steps that cross ranks run
    // in one pass, as the unfused ops there do.
    DispatchShape dispatchShape{true, true, true, false, false};
    dispatchShape.onePass = entry.onePassDispatch;
    CombineShape combineShape{false, 0, true};
    combineShape.onePass = entry.onePassCombine;
    plan.build = [=](const KernelPlan &plan, gpu::GPUModuleOp module, const RecordLayout &record) {
      // Each GEMM reads its part of the record: its descriptors' offset from there.
      auto gemmOf = [&](epic::detail::GroupedGemmShape gemm, int part, int64_t maps) {
        gemm = withRecord(gemm, record);
        gemm.mapsOffset =
            record.mapsOffset + maps * mapBytes - records::moeLayerPartFirst(part) * 8;
        gemm.restoreRegisters = true;
        return gemm;
      };
      MoeLayerParts parts{plan.layout(idxBits, record, kDispatchMaxTokens),
                          plan.layout(64, record, kSNumRows),
                          plan.layout(64, record, kCMaxTokens),
                          dispatchShape,
                          gemmOf(*gateUp, records::kLayerGateUp, 0),
                          gemmOf(*down, records::kLayerDown, 2),
                          SwigluShape{bf16, fp8, inter},
                          combineShape,
                          at.layerBarrier,
                          at.layerExits};
      OpBuilder b = kernelInsertionPoint(module);
      buildMoeLayerKernel(b, plan.loc, plan.kernels[0], parts);
    };
    return plan;
  }
};

/// DeepEP's engram_fetch: a warp per fetched row, nothing waits.
struct EngramFetchOpLowering : KernelOpLowering<ep::EngramFetchOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::EngramFetchOp op, const Entry &entry,
                                    Builder &) const override {
    KernelPlan plan(op, op.getConfig(), entry, entry.threads);
    plan.kernels = {entry.name + "_fetch"};
    plan.fields = fieldNames(kEngramFields);
    plan.cooperative = false;
    // The tables lie past the window's device part, at the record's
    // table_offset: the kernel needs no window bytes of its own.
    plan.windowBytes = 0;
    plan.build = [](const KernelPlan &plan, gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout layout = plan.layout(64, record, kENumRows);
      OpBuilder b = kernelInsertionPoint(module);
      buildEngramFetch(plan.kernel(b, 0, false), layout);
    };
    return plan;
  }
};

/// DeepEP V1's low-latency mode: each op's two phases as two kernels (a
/// kernel waits only for the previous kernels of other ranks) and as one
/// cooperative kernel. The window: the low-latency layout's, the cap a
/// run-time value.
/// The dispatch's blocks are at most kLowLatencyDispatchThreads threads:
/// ptxas then budgets 128 registers a thread (the FP8 cast keeps a chunk
/// group, its scales and the top-k destinations' row pointers live; at 1024
/// threads' 64 registers it spilled), and its few rows need no more warps.
/// The combine keeps the entry's block size: its copies want the warps (on
/// the H200 at 128 tokens, 512 threads: dispatch 22.2 -> 21.1 us, combine
/// 16.8 -> 17.9 us).
constexpr unsigned kLowLatencyDispatchThreads = 512;

template <typename OpT>
KernelPlan lowLatencyPlan(OpT op, const Entry &entry, ArrayRef<StringRef> fields,
                          std::array<StringRef, 2> suffixes, unsigned threads) {
  ep::ConfigAttr cfg = op.getConfig();
  KernelPlan plan(op, cfg, entry, threads);
  // The two phases, then both in one kernel: the runtime launches the third,
  // or the first and (a receive hook) later the second.
  plan.kernels = {entry.name + suffixes[0].str(), entry.name + suffixes[1].str(),
                  entry.name + "_fused"};
  plan.fields.assign(fields.begin(), fields.end());
  // The fused kernel's receive waits for every rank's last send block.
  plan.cooperative = true;
  epic::ep::window::LowLatencyLayout ll(cfg.getExperts(), cfg.getRanks(), cfg.getTopk(),
                                        cfg.getHidden());
  plan.windowBytes = ll.bytes(0);
  plan.launch.windowBytesPerToken = ll.bytesPerToken();
  return plan;
}

struct LowLatencyDispatchOpLowering : KernelOpLowering<ep::LowLatencyDispatchOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::LowLatencyDispatchOp op, const Entry &entry,
                                    Builder &) const override {
    unsigned idxBits = cast<ShapedType>(op.getTopkIdx().getType()).getElementTypeBitWidth();
    bool fp8 = op.getConfig().isFP8(), round = op.getRoundScale(), ue8m0 = op.getUseUe8m0();
    KernelPlan plan =
        lowLatencyPlan(op, entry, fieldNames(kLowLatencyDispatchFields), {"_send", "_recv"},
                       std::min(entry.threads, kLowLatencyDispatchThreads));
    plan.build = [=](const KernelPlan &plan, gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout layout = plan.layout(idxBits, record, kLdMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      int64_t words = lowLatencyRecvSharedWords(layout);
      buildLowLatencySend(plan.kernel(b, 0, true), layout, fp8, round);
      buildLowLatencyRecv(plan.kernel(b, 1, true, words), layout, fp8, ue8m0);
      buildLowLatencyDispatch(plan.kernel(b, 2, true, words), layout, fp8, round, ue8m0);
    };
    return plan;
  }
};

struct LowLatencyCombineOpLowering : KernelOpLowering<ep::LowLatencyCombineOp> {
  using KernelOpLowering::KernelOpLowering;
  FailureOr<KernelPlan> planKernels(ep::LowLatencyCombineOp op, const Entry &entry,
                                    Builder &) const override {
    unsigned idxBits = cast<ShapedType>(op.getTopkIdx().getType()).getElementTypeBitWidth();
    KernelPlan plan = lowLatencyPlan(op, entry, fieldNames(kLowLatencyCombineFields),
                                     {"_send", "_reduce"}, entry.threads);
    plan.build = [=](const KernelPlan &plan, gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout layout = plan.layout(idxBits, record, kLcMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      int64_t words = lowLatencyCombineSendSharedWords(layout);
      buildLowLatencyCombineSend(plan.kernel(b, 0, true, words), layout);
      buildLowLatencyCombineReduce(plan.kernel(b, 1, true), layout);
      buildLowLatencyCombine(plan.kernel(b, 2, true, words), layout);
    };
    return plan;
  }
};

struct ConvertEPToCommPass : public epic::impl::ConvertEPToCommBase<ConvertEPToCommPass> {
  using ConvertEPToCommBase::ConvertEPToCommBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (threadsPerBlock % 32 != 0 || threadsPerBlock == 0 || threadsPerBlock > 1024) {
      module.emitError("convert-ep-to-comm: threads-per-block must be a multiple of 32 in "
                       "[32, 1024], got ")
          << threadsPerBlock;
      return signalPassFailure();
    }
    bool failed = false, any = false;
    module.walk([&](func::FuncOp func) {
      FailureOr<bool> entry = checkEntryForm(func);
      failed |= mlir::failed(entry);
      any |= mlir::succeeded(entry) && *entry;
    });
    if (failed)
      return signalPassFailure();
    if (!any)
      return;

    // The kernels go into the module's one gpu.module (one cubin for the runtime).
    OpBuilder builder(module.getBodyRegion());
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), builder.getUnitAttr());
    if (!isa_and_nonnull<gpu::GPUModuleOp>(SymbolTable::lookupSymbolIn(module, kKernelModule)))
      gpu::GPUModuleOp::create(builder, module.getLoc(), kKernelModule);

    ConversionTarget target(getContext());
    target.markUnknownOpDynamicallyLegal(
        [](Operation *op) { return !isa<ep::KernelOpInterface>(op); });
    RewritePatternSet patterns(&getContext());
    epic::populateEPToCommConversionPatterns(patterns, threadsPerBlock, onePassDispatch,
                                             onePassCombine);
    if (mlir::failed(applyPartialConversion(module, target, std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace

void epic::populateEPToCommConversionPatterns(RewritePatternSet &patterns, unsigned threads,
                                              bool onePassDispatch, bool onePassCombine) {
  patterns
      .add<DispatchLayoutOpLowering, DispatchOpLowering, CombineOpLowering, GroupedGemmOpLowering,
           SwigluOpLowering, DispatchGemmOpLowering, GemmCombineOpLowering, MoeLayerOpLowering,
           EngramFetchOpLowering, LowLatencyDispatchOpLowering, LowLatencyCombineOpLowering>(
          patterns.getContext(), threads, onePassDispatch, onePassCombine);
}
