//===- CommToNVVM.cpp - comm dialect to NVVM, LLVM and shim calls ---------===//
//
// See ConvertCommToNVVM in Passes.td for what each op becomes in each backend.
//
//===----------------------------------------------------------------------===//

#include "Lowering.h"

#include "epic/device/VirtualWorld.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Func/Transforms/FuncConversions.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/Transforms/Patterns.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Transforms/DialectConversion.h"

#include <type_traits>

namespace epic {
#define GEN_PASS_DEF_CONVERTCOMMTONVVM
#include "epic/Conversion/Passes.h.inc"
} // namespace epic

using namespace mlir;
using namespace epic;
using namespace epic::comm_to_nvvm;

llvm::StringRef epic::getShimPrefix(CommBackend backend) {
  return backend == CommBackend::nccl ? "__epic_nccl_" : "__epic_virtual_";
}

//===----------------------------------------------------------------------===//
// The shim ABI, from ShimABI.def
//===----------------------------------------------------------------------===//

namespace {
template <typename T> Type shimType(MLIRContext *ctx) {
  if constexpr (std::is_same_v<T, int32_t>)
    return IntegerType::get(ctx, 32);
  else if constexpr (std::is_same_v<T, int64_t>)
    return IntegerType::get(ctx, 64);
  else {
    static_assert(std::is_same_v<T, void *>, "shim ABI: i32, i64 and pointers only");
    return LLVM::LLVMPointerType::get(ctx);
  }
}

template <typename Signature> struct ShimSignature;
template <typename R, typename... Args> struct ShimSignature<R(Args...)> {
  static LLVM::LLVMFunctionType get(MLIRContext *ctx) {
    Type result;
    if constexpr (std::is_void_v<R>)
      result = LLVM::LLVMVoidType::get(ctx);
    else
      result = shimType<R>(ctx);
    return LLVM::LLVMFunctionType::get(result, {shimType<Args>(ctx)...});
  }
};

struct ShimEntry {
  llvm::StringLiteral name;
  LLVM::LLVMFunctionType (*type)(MLIRContext *);
};

#define I32 int32_t
#define I64 int64_t
#define PTR void *
#define VOID void
#define EPIC_SHIM(Name, Result, ...)                                                               \
  ShimEntry{llvm::StringLiteral(#Name), &ShimSignature<Result(__VA_ARGS__)>::get},
constexpr ShimEntry kShims[] = {
#include "epic/device/ShimABI.def"
};
#undef I32
#undef I64
#undef PTR
#undef VOID

} // namespace

LLVM::LLVMFunctionType epic::comm_to_nvvm::lookupShimType(MLIRContext *ctx, StringRef name) {
  for (const ShimEntry &entry : kShims)
    if (entry.name == name)
      return entry.type(ctx);
  llvm::report_fatal_error(llvm::Twine("epic: no shim function '") + name + "' in ShimABI.def");
}

bool epic::comm_to_nvvm::needsInlineWaits(Operation *op) {
  auto func = op->getParentOfType<gpu::GPUFuncOp>();
  if (!func)
    return false;
  if (func->hasAttr("comm.inline_waits"))
    return true;
  return func
      .walk([](Operation *inner) {
        return isa<nvgpu::WarpgroupMmaOp, NVVM::WgmmaMmaAsyncOp>(inner) ? WalkResult::interrupt()
                                                                        : WalkResult::advance();
      })
      .wasInterrupted();
}

namespace {

//===----------------------------------------------------------------------===//
// Teams and the virtual world's descriptors
//===----------------------------------------------------------------------===//

/// The team struct: (ranks, rank, stride, kind, world rank, LSA size, world
/// size). The last two are the virtual world's topology (M and R), which its
/// peer_ptr checks; the nccl backend leaves them 0.
enum TeamField : int64_t {
  kTeamRanks = 0,
  kTeamRank,
  kTeamStride,
  kTeamKind,
  kTeamWorldRank,
  kTeamLsaSize,
  kTeamWorldSize,
  kTeamNumFields
};

LLVM::LLVMStructType teamStructType(MLIRContext *ctx) {
  SmallVector<Type> fields(kTeamNumFields, IntegerType::get(ctx, 32));
  return LLVM::LLVMStructType::getLiteral(ctx, fields);
}

/// The virtual rank of the calling block: blockIdx.x / (gridDim.x / R).
Value virtualRank(const LLVMBuilder &b, Value numRanks) {
  Value blocks = NVVM::GridDimXOp::create(b.rewriter, b.loc, b.i32());
  Value block = NVVM::BlockIdXOp::create(b.rewriter, b.loc, b.i32());
  Value blocksPerRank = b.udiv(blocks, numRanks);
  return b.udiv(block, blocksPerRank);
}

/// The field types of the virtual backend's descriptors, from VirtualWorld.def.
Type virtualFieldType(MLIRContext *ctx, StringRef type) {
  if (type == "I32")
    return IntegerType::get(ctx, 32);
  if (type == "U64")
    return IntegerType::get(ctx, 64);
  if (type == "U64_PTR" || type == "CHAR_PTR")
    return LLVM::LLVMPointerType::get(ctx);
  llvm::report_fatal_error(llvm::Twine("VirtualWorld.def: unknown field type ") + type);
}
SmallVector<Type> virtualCommFields(MLIRContext *ctx) {
  return {
#define EPIC_VCOMM_FIELD(INDEX, name, Type) virtualFieldType(ctx, #Type),
#include "epic/device/VirtualWorld.def"
  };
}
SmallVector<Type> virtualWindowFields(MLIRContext *ctx) {
  return {
#define EPIC_VWIN_FIELD(INDEX, name, Type) virtualFieldType(ctx, #Type),
#include "epic/device/VirtualWorld.def"
  };
}

/// base + rank * stride + offset in a virtual window.
Value virtualSlice(const LLVMBuilder &b, Value window, Value rank, Value offset) {
  auto fields = virtualWindowFields(b.ctx());
  Value base = b.loadField(window, fields, EPIC_VWIN_BASE, b.ptr());
  Value stride = b.loadField(window, fields, EPIC_VWIN_STRIDE, b.i64());
  Value rankBytes = b.mul(b.sext64(rank), stride);
  Value bytes = b.add(rankBytes, offset);
  return LLVM::GEPOp::create(b.rewriter, b.loc, b.ptr(), b.rewriter.getI8Type(), base,
                             ValueRange{bytes});
}

Value virtualRankFromWindow(const LLVMBuilder &b, Value window) {
  Value numRanks = b.loadField(window, virtualWindowFields(b.ctx()), EPIC_VWIN_NUM_RANKS, b.i32());
  return virtualRank(b, numRanks);
}

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

struct TeamLowering : CommPattern<comm::TeamOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::TeamOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    int32_t kind = static_cast<int32_t>(op.getKind());
    Value ranks, rank, stride, world, lsaSize, worldSize;
    if (backend == CommBackend::nccl) {
      Value dc = adaptor.getComm(), k = b.i32(kind);
      ranks = b.callShim(op, backend, "team_nranks", {dc, k});
      rank = b.callShim(op, backend, "team_rank", {dc, k});
      stride = b.callShim(op, backend, "team_stride", {dc, k});
      world = b.callShim(op, backend, "world_rank", {dc});
      lsaSize = worldSize = b.i32(0);
    } else {
      // N nodes of M GPUs, ranks node-major (w = node * M + GPU): the world is
      // {R, w, 1}, the LSA team {M, w % M, 1}, the rail {N, w / M, M}.
      auto fields = virtualCommFields(b.ctx());
      worldSize = b.loadField(adaptor.getComm(), fields, EPIC_VCOMM_NUM_RANKS, b.i32());
      lsaSize = b.loadField(adaptor.getComm(), fields, EPIC_VCOMM_LSA_SIZE, b.i32());
      world = virtualRank(b, worldSize);
      switch (op.getKind()) {
      case comm::TeamKind::world:
        ranks = worldSize;
        rank = world;
        stride = b.i32(1);
        break;
      case comm::TeamKind::lsa:
        ranks = lsaSize;
        rank = b.urem(world, lsaSize);
        stride = b.i32(1);
        break;
      case comm::TeamKind::rail:
        ranks = b.udiv(worldSize, lsaSize);
        rank = b.udiv(world, lsaSize);
        stride = lsaSize;
        break;
      }
    }
    Value team = LLVM::UndefOp::create(rewriter, op.getLoc(), teamStructType(b.ctx()));
    Value fields[] = {ranks, rank, stride, b.i32(kind), world, lsaSize, worldSize};
    for (auto [i, field] : llvm::enumerate(fields))
      team = LLVM::InsertValueOp::create(rewriter, op.getLoc(), team, field, i);
    rewriter.replaceOp(op, team);
    return success();
  }
};

template <typename Op, int64_t Field> struct TeamFieldLowering : CommPattern<Op> {
  using CommPattern<Op>::CommPattern;
  LogicalResult matchAndRewrite(Op op, typename Op::Adaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOp(op, LLVMBuilder{rewriter, op.getLoc()}.extract(adaptor.getTeam(), Field));
    return success();
  }
};

/// A team as the ABI passes it: (ranks, rank, stride).
struct TeamScalars {
  Value ranks, rank, stride;
};
TeamScalars teamScalars(const LLVMBuilder &b, Value team) {
  Value ranks = b.extract(team, kTeamRanks);
  Value rank = b.extract(team, kTeamRank);
  Value stride = b.extract(team, kTeamStride);
  return {ranks, rank, stride};
}

/// World rank of member `rank` of `team`: world + (rank - team.rank) * stride.
Value teamToWorld(const LLVMBuilder &b, Value team, Value rank) {
  Value world = b.extract(team, kTeamWorldRank);
  Value teamRank = b.extract(team, kTeamRank);
  Value stride = b.extract(team, kTeamStride);
  return b.add(world, b.mul(b.sub(rank, teamRank), stride));
}

struct TeamToWorldLowering : CommPattern<comm::TeamToWorldOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::TeamToWorldOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    rewriter.replaceOp(op, teamToWorld(b, adaptor.getTeam(), adaptor.getRank()));
    return success();
  }
};

struct LocalPtrLowering : CommPattern<comm::LocalPtrOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::LocalPtrOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    Value window = adaptor.getWindow(), offset = adaptor.getOffset();
    Value pointer = backend == CommBackend::nccl
                        ? b.callShim(op, backend, "local_ptr", {b.null(), window, offset})
                        : virtualSlice(b, window, virtualRankFromWindow(b, window), offset);
    rewriter.replaceOp(op, b.as(pointer, op.getType()));
    return success();
  }
};

struct PeerPtrLowering : CommPattern<comm::PeerPtrOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::PeerPtrOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    Value team = adaptor.getTeam(), window = adaptor.getWindow();
    Value pointer;
    if (backend == CommBackend::nccl) {
      TeamScalars t = teamScalars(b, team);
      pointer = b.callShim(
          op, backend, "peer_ptr",
          {b.null(), window, adaptor.getOffset(), t.ranks, t.rank, t.stride, adaptor.getPeer()});
    } else {
      // An NVLink (LSA) pointer reaches the own node only: one to a rank of
      // another node traps, naming both (the check is a compare and a
      // branch while the world is one node).
      Value target = teamToWorld(b, team, adaptor.getPeer());
      b.callShim(op, backend, needsInlineWaits(op) ? "check_lsa_peer_inline" : "check_lsa_peer",
                 {b.extract(team, kTeamWorldRank), target, b.extract(team, kTeamLsaSize),
                  b.extract(team, kTeamWorldSize)});
      pointer = virtualSlice(b, window, target, adaptor.getOffset());
    }
    rewriter.replaceOp(op, b.as(pointer, op.getType()));
    return success();
  }
};

struct RankParamsLowering : CommPattern<comm::RankParamsOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::RankParamsOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    if (backend == CommBackend::nccl) {
      rewriter.replaceOp(op, adaptor.getBase()); // one rank per process
      return success();
    }
    LLVMBuilder b{rewriter, op.getLoc()};
    Value numRanks =
        b.loadField(adaptor.getComm(), virtualCommFields(b.ctx()), EPIC_VCOMM_NUM_RANKS, b.i32());
    Value rank = virtualRank(b, numRanks);
    Value rank64 = b.sext64(rank);
    Value bytes = b.mul(rank64, b.i64(op.getStride()));
    rewriter.replaceOpWithNewOp<LLVM::GEPOp>(op, op.getType(), rewriter.getI8Type(),
                                             adaptor.getBase(), ValueRange{bytes});
    return success();
  }
};

/// Virtual backend only (the pass refuses it for nccl before converting).
struct PeerParamsLowering : CommPattern<comm::PeerParamsOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::PeerParamsOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    if (backend == CommBackend::nccl)
      return rewriter.notifyMatchFailure(op, "the nccl backend has only this rank's record");
    LLVMBuilder b{rewriter, op.getLoc()};
    Value bytes = b.mul(b.sext64(adaptor.getPeer()), b.i64(op.getStride()));
    rewriter.replaceOpWithNewOp<LLVM::GEPOp>(op, op.getType(), rewriter.getI8Type(),
                                             adaptor.getBase(), ValueRange{bytes});
    return success();
  }
};

/// signal_mode of the ABI: 0 none, 1 increment, 2 add.
int32_t signalMode(Value signal, Value add) { return !signal ? 0 : add ? 2 : 1; }

struct PutLowering : CommPattern<comm::PutOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::PutOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    TeamScalars t = teamScalars(b, adaptor.getTeam());
    b.callShim(op, backend, ("put_" + coopSuffix(op.getCoop())).str(),
               {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0), t.ranks, t.rank, t.stride,
                adaptor.getPeer(), adaptor.getDstWindow(), adaptor.getDstOffset(),
                adaptor.getSrcWindow(), adaptor.getSrcOffset(), adaptor.getBytes(),
                b.i32(signalMode(op.getSignal(), op.getSignalAdd())),
                b.orI32(adaptor.getSignal(), 0), b.orI64(adaptor.getSignalAdd(), 0),
                b.i32(op.getCounter() ? 1 : 0), b.orI32(adaptor.getCounter(), 0)});
    rewriter.eraseOp(op);
    return success();
  }
};

struct PutValueLowering : CommPattern<comm::PutValueOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::PutValueOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    TeamScalars t = teamScalars(b, adaptor.getTeam());
    int64_t bytes = op.getValue().getType().getIntOrFloatBitWidth() / 8;
    b.callShim(op, backend, ("put_value_" + coopSuffix(op.getCoop())).str(),
               {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0), t.ranks, t.rank, t.stride,
                adaptor.getPeer(), adaptor.getWindow(), adaptor.getOffset(),
                b.sext64(adaptor.getValue()), b.i32(bytes),
                b.i32(signalMode(op.getSignal(), op.getSignalAdd())),
                b.orI32(adaptor.getSignal(), 0), b.orI64(adaptor.getSignalAdd(), 0)});
    rewriter.eraseOp(op);
    return success();
  }
};

struct SignalLowering : CommPattern<comm::SignalOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::SignalOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    TeamScalars t = teamScalars(b, adaptor.getTeam());
    b.callShim(op, backend, ("signal_" + coopSuffix(op.getCoop())).str(),
               {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0), t.ranks, t.rank, t.stride,
                adaptor.getPeer(), adaptor.getSignal(), b.i32(op.getSignalAdd() ? 2 : 1),
                b.orI64(adaptor.getSignalAdd(), 0)});
    rewriter.eraseOp(op);
    return success();
  }
};

struct WaitSignalLowering : CommPattern<comm::WaitSignalOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::WaitSignalOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    Value seen = b.callShim(op, backend, ("wait_signal_" + coopSuffix(op.getCoop())).str(),
                            {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0),
                             adaptor.getSignal(), adaptor.getExpected(),
                             b.i64(timeoutNs(op.getTimeoutMs())), b.orI32(adaptor.getPeer(), -1)});
    rewriter.replaceOp(op, seen);
    return success();
  }
};

struct ReadSignalLowering : CommPattern<comm::ReadSignalOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::ReadSignalOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    rewriter.replaceOp(op, b.callShim(op, backend, "read_signal",
                                      {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0),
                                       adaptor.getSignal()}));
    return success();
  }
};

struct ResetSignalLowering : CommPattern<comm::ResetSignalOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::ResetSignalOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    b.callShim(op, backend, "reset_signal",
               {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0), adaptor.getSignal()});
    rewriter.eraseOp(op);
    return success();
  }
};

struct FlushLowering : CommPattern<comm::FlushOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::FlushOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    b.callShim(op, backend, ("flush_" + coopSuffix(op.getCoop())).str(),
               {adaptor.getComm(), b.orI32(adaptor.getContextIndex(), 0)});
    rewriter.eraseOp(op);
    return success();
  }
};

struct BarrierLowering : CommPattern<comm::BarrierOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::BarrierOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    b.callShim(op, backend, ("barrier_" + coopSuffix(op.getCoop())).str(),
               {adaptor.getComm(), b.extract(adaptor.getTeam(), kTeamKind), adaptor.getIndex(),
                b.i64(timeoutNs(op.getTimeoutMs()))});
    rewriter.eraseOp(op);
    return success();
  }
};

/// gpu.func signatures: convert the inputs, keep the workgroup and private
/// attributions (extra entry-block arguments the generic function pattern
/// does not know about).
struct GPUFuncSignature : public OpConversionPattern<gpu::GPUFuncOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult matchAndRewrite(gpu::GPUFuncOp op, OpAdaptor,
                                ConversionPatternRewriter &rewriter) const override {
    FunctionType type = op.getFunctionType();
    Block &entry = op.getBody().front();
    TypeConverter::SignatureConversion conversion(entry.getNumArguments());
    for (auto [i, input] : llvm::enumerate(type.getInputs())) {
      Type converted = getTypeConverter()->convertType(input);
      if (!converted)
        return rewriter.notifyMatchFailure(op, "argument type has no conversion");
      conversion.addInputs(i, converted);
    }
    for (unsigned i = type.getNumInputs(); i < entry.getNumArguments(); ++i)
      conversion.addInputs(i, entry.getArgument(i).getType());
    SmallVector<Type> results;
    if (failed(getTypeConverter()->convertTypes(type.getResults(), results)))
      return rewriter.notifyMatchFailure(op, "result type has no conversion");
    if (!rewriter.applySignatureConversion(&entry, conversion, getTypeConverter()))
      return failure();
    auto inputs = conversion.getConvertedTypes().take_front(type.getNumInputs());
    rewriter.modifyOpInPlace(
        op, [&] { op.setFunctionType(FunctionType::get(op.getContext(), inputs, results)); });
    return success();
  }
};

/// gpu.launch_func takes kernel operands of any type: convert them.
struct LaunchFuncOperands : public OpConversionPattern<gpu::LaunchFuncOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult matchAndRewrite(gpu::LaunchFuncOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    rewriter.modifyOpInPlace(op, [&] { op->setOperands(adaptor.getOperands()); });
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Virtual backend: kernels see the blocks of their own rank only
//===----------------------------------------------------------------------===//

/// In kernels with a !comm.dev_comm argument, `gpu.block_id x` becomes the
/// block index within the calling block's virtual rank and `gpu.grid_dim x`
/// the number of blocks per rank.
void rewriteBlockIdsToRankLocal(ModuleOp module) {
  module.walk([](gpu::GPUFuncOp func) {
    if (!func.isKernel() || func.getBody().empty())
      return;
    BlockArgument comm;
    for (BlockArgument arg : func.getArguments())
      if (isa<comm::DevCommType>(arg.getType()))
        comm = arg;
    if (!comm)
      return;
    SmallVector<gpu::BlockIdOp> blockIds;
    SmallVector<gpu::GridDimOp> gridDims;
    func.walk([&](gpu::BlockIdOp op) {
      if (op.getDimension() == gpu::Dimension::x)
        blockIds.push_back(op);
    });
    func.walk([&](gpu::GridDimOp op) {
      if (op.getDimension() == gpu::Dimension::x)
        gridDims.push_back(op);
    });
    if (blockIds.empty() && gridDims.empty())
      return;
    OpBuilder b(func.getContext());
    b.setInsertionPointToStart(&func.getBody().front());
    Location loc = func.getLoc();
    Type i32 = b.getI32Type();
    Value commPtr =
        UnrealizedConversionCastOp::create(b, loc, LLVM::LLVMPointerType::get(b.getContext()), comm)
            .getResult(0);
    Value numRanks = LLVM::LoadOp::create(b, loc, i32, commPtr); // field 0: num_ranks
    Value blocks = NVVM::GridDimXOp::create(b, loc, i32);
    Value perRank = LLVM::UDivOp::create(b, loc, blocks, numRanks);
    Value block = NVVM::BlockIdXOp::create(b, loc, i32);
    Value inRank = LLVM::URemOp::create(b, loc, block, perRank);
    Value blockIndex = arith::IndexCastUIOp::create(b, loc, b.getIndexType(), inRank);
    Value perRankIndex = arith::IndexCastUIOp::create(b, loc, b.getIndexType(), perRank);
    for (gpu::BlockIdOp op : blockIds) {
      op.replaceAllUsesWith(blockIndex);
      op.erase();
    }
    for (gpu::GridDimOp op : gridDims) {
      op.replaceAllUsesWith(perRankIndex);
      op.erase();
    }
  });
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct ConvertCommToNVVMPass : public epic::impl::ConvertCommToNVVMBase<ConvertCommToNVVMPass> {
  using ConvertCommToNVVMBase::ConvertCommToNVVMBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    // comm ops are device code: outside a gpu.module they would lower into
    // special-register reads in host code without a word.
    WalkResult onHost = module.walk([](Operation *op) {
      if (!isa_and_nonnull<comm::CommDialect>(op->getDialect()) ||
          op->getParentOfType<gpu::GPUModuleOp>())
        return WalkResult::advance();
      auto func = op->getParentOfType<FunctionOpInterface>();
      op->emitOpError("is device code: it must be in a gpu.func of a gpu.module")
          << (func ? ", not in host function @" + func.getName().str() : std::string());
      return WalkResult::interrupt();
    });
    if (onHost.wasInterrupted())
      return signalPassFailure();
    if (backend == CommBackend::nccl) {
      // Said before converting: a failed legalization would not say why.
      WalkResult refused = module.walk([](comm::PeerParamsOp op) {
        op.emitError("comm.peer_params needs the virtual backend: a process of the nccl "
                     "backend has only its own parameter record");
        return WalkResult::interrupt();
      });
      if (refused.wasInterrupted())
        return signalPassFailure();
    }
    if (backend == CommBackend::virtual_)
      rewriteBlockIdsToRankLocal(module);

    TypeConverter converter;
    populateCommToNVVMTypeConversions(converter);
    RewritePatternSet patterns(ctx);
    populateCommToNVVMConversionPatterns(converter, patterns, backend);

    ConversionTarget target(*ctx);
    target.addIllegalDialect<comm::CommDialect>();
    target.addLegalOp<UnrealizedConversionCastOp>();
    target.markUnknownOpDynamicallyLegal([&](Operation *op) {
      if (auto func = dyn_cast<FunctionOpInterface>(op)) {
        // llvm.func (e.g. the shim declarations) has an LLVM function type.
        auto type = dyn_cast<FunctionType>(func.getFunctionType());
        return !type ||
               (converter.isSignatureLegal(type) && converter.isLegal(&func.getFunctionBody()));
      }
      return converter.isLegal(op);
    });
    scf::populateSCFStructuralTypeConversionsAndLegality(converter, patterns, target);
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

void epic::populateCommToNVVMTypeConversions(TypeConverter &converter) {
  converter.addConversion([](Type type) { return type; });
  converter.addConversion(
      [](comm::DevCommType type) -> Type { return LLVM::LLVMPointerType::get(type.getContext()); });
  converter.addConversion(
      [](comm::WindowType type) -> Type { return LLVM::LLVMPointerType::get(type.getContext()); });
  converter.addConversion(
      [](comm::TeamType type) -> Type { return teamStructType(type.getContext()); });
  auto cast = [](OpBuilder &builder, Type type, ValueRange inputs, Location loc) -> Value {
    return UnrealizedConversionCastOp::create(builder, loc, type, inputs).getResult(0);
  };
  converter.addSourceMaterialization(cast);
  converter.addTargetMaterialization(cast);
}

void epic::populateCommToNVVMConversionPatterns(TypeConverter &converter,
                                                RewritePatternSet &patterns, CommBackend backend) {
  MLIRContext *ctx = patterns.getContext();
  patterns.add<TeamLowering, TeamFieldLowering<comm::TeamRankOp, kTeamRank>,
               TeamFieldLowering<comm::TeamSizeOp, kTeamRanks>, TeamToWorldLowering,
               LocalPtrLowering, PeerPtrLowering, RankParamsLowering, PeerParamsLowering,
               PutLowering, PutValueLowering, SignalLowering, WaitSignalLowering,
               ReadSignalLowering, ResetSignalLowering, FlushLowering, BarrierLowering>(
      converter, ctx, backend);
  populateMemoryOpPatterns(converter, patterns, backend);
  patterns.add<LaunchFuncOperands, GPUFuncSignature>(converter, ctx);
  populateFunctionOpInterfaceTypeConversionPattern<func::FuncOp>(patterns, converter);
  populateCallOpTypeConversionPattern(patterns, converter);
  populateReturnOpTypeConversionPattern(patterns, converter);
}
