//===- MemoryOps.cpp - comm's memory-ordering operations to NVVM/LLVM -----===//
//
// The same in both backends: comm.load/store become atomic llvm.load/store
// with an ordering and a sync scope, comm.fence an llvm.fence, comm.red and
// comm.atomic_rmw/atomic_cas exact PTX, comm.wait_flag and comm.agree calls
// of the shim's bounded wait and check (call-free in kernels that must not
// call). See ConvertCommToNVVM in Passes.td.
//
//===----------------------------------------------------------------------===//

#include "Lowering.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"

#include <string>

using namespace mlir;
using namespace epic;
using namespace epic::comm_to_nvvm;

namespace {

LLVM::AtomicOrdering toLLVM(comm::Ordering ordering) {
  switch (ordering) {
  case comm::Ordering::relaxed:
    return LLVM::AtomicOrdering::monotonic;
  case comm::Ordering::acquire:
    return LLVM::AtomicOrdering::acquire;
  case comm::Ordering::release:
    return LLVM::AtomicOrdering::release;
  case comm::Ordering::acq_rel:
    return LLVM::AtomicOrdering::acq_rel;
  case comm::Ordering::sc:
    return LLVM::AtomicOrdering::seq_cst;
  }
  llvm_unreachable("unknown ordering");
}

/// NVPTX's names for the scopes; the empty one is the system.
StringRef syncScope(comm::Scope scope) {
  switch (scope) {
  case comm::Scope::cta:
    return "block";
  case comm::Scope::cluster:
    return "cluster";
  case comm::Scope::gpu:
    return "device";
  case comm::Scope::sys:
    return "";
  }
  llvm_unreachable("unknown scope");
}

struct FenceLowering : CommPattern<comm::FenceOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::FenceOp op, OpAdaptor,
                                ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<LLVM::FenceOp>(op, toLLVM(op.getOrdering()),
                                               syncScope(op.getScope()));
    return success();
  }
};

struct LoadLowering : CommPattern<comm::LoadOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::LoadOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    Type type = op.getType();
    rewriter.replaceOpWithNewOp<LLVM::LoadOp>(
        op, type, adaptor.getPtr(), type.getIntOrFloatBitWidth() / 8, /*isVolatile=*/false,
        /*isNonTemporal=*/false, /*isInvariant=*/false, /*isInvariantGroup=*/false,
        toLLVM(op.getOrdering()), syncScope(op.getScope()));
    return success();
  }
};

struct StoreLowering : CommPattern<comm::StoreOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::StoreOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<LLVM::StoreOp>(op, adaptor.getValue(), adaptor.getPtr(),
                                               op.getValue().getType().getIntOrFloatBitWidth() / 8,
                                               /*isVolatile=*/false,
                                               /*isNonTemporal=*/false, /*isInvariantGroup=*/false,
                                               toLLVM(op.getOrdering()), syncScope(op.getScope()));
    return success();
  }
};

/// PTX of an atomic: `red` or `atom`, ordering, scope, operation and type,
/// e.g. "red.release.sys.add.u32". Written out (inline asm) because NVPTX
/// drops the ordering of `atomicrmw` on sm_90.
std::string atomicInstruction(StringRef opcode, comm::AtomicKind kind, comm::Ordering ordering,
                              comm::Scope scope, unsigned bits, std::string &prefix) {
  StringRef order;
  switch (ordering) {
  case comm::Ordering::relaxed:
    order = "relaxed";
    break;
  case comm::Ordering::acquire:
    order = "acquire";
    break;
  case comm::Ordering::release:
    order = "release";
    break;
  case comm::Ordering::acq_rel:
    order = "acq_rel";
    break;
  case comm::Ordering::sc:
    order = "acq_rel";
    break; // + a leading fence.sc
  }
  StringRef scopeName = stringifyScope(scope);
  if (ordering == comm::Ordering::sc)
    prefix = ("fence.sc." + scopeName + "; ").str();
  StringRef operation, typeClass;
  switch (kind) {
  case comm::AtomicKind::add:
    operation = "add";
    typeClass = "u";
    break;
  case comm::AtomicKind::max:
    operation = "max";
    typeClass = "s";
    break;
  case comm::AtomicKind::min:
    operation = "min";
    typeClass = "s";
    break;
  case comm::AtomicKind::bit_or:
    operation = "or";
    typeClass = "b";
    break;
  case comm::AtomicKind::bit_and:
    operation = "and";
    typeClass = "b";
    break;
  case comm::AtomicKind::bit_xor:
    operation = "xor";
    typeClass = "b";
    break;
  case comm::AtomicKind::exch:
    operation = "exch";
    typeClass = "b";
    break;
  }
  return (opcode + "." + order + "." + scopeName + "." + operation + "." + typeClass +
          std::to_string(bits))
      .str();
}

/// `instruction $0, [$1], $2[, $3]` returning the old value: the address operand first, then
/// the values (all of `type`, 32 or 64 bits).
Value atomicAsm(ConversionPatternRewriter &rewriter, Location loc, Type type,
                const std::string &instruction, ValueRange operands) {
  bool wide = type.getIntOrFloatBitWidth() == 64;
  std::string constraints = wide ? "=l,l" : "=r,l";
  std::string text = instruction + " $0, [$1]";
  for (unsigned i = 1; i < operands.size(); ++i) {
    constraints += wide ? ",l" : ",r";
    text += ", $" + std::to_string(i + 1);
  }
  auto asmOp =
      LLVM::InlineAsmOp::create(rewriter, loc, TypeRange{type}, operands, text + ";",
                                constraints + ",~{memory}", /*has_side_effects=*/true,
                                /*is_align_stack=*/false, LLVM::tailcallkind::TailCallKind::None,
                                LLVM::AsmDialectAttr(), ArrayAttr());
  return asmOp.getResult(0);
}

struct RedLowering : CommPattern<comm::RedOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::RedOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    unsigned bits = op.getValue().getType().getIntOrFloatBitWidth();
    std::string prefix;
    std::string instruction =
        atomicInstruction("red", op.getKind(), op.getOrdering(), op.getScope(), bits, prefix);
    std::string constraints = bits == 64 ? "l,l,~{memory}" : "l,r,~{memory}";
    LLVM::InlineAsmOp::create(rewriter, op.getLoc(), TypeRange{},
                              ValueRange{b.generic(adaptor.getPtr()), adaptor.getValue()},
                              prefix + instruction + " [$0], $1;", constraints,
                              /*has_side_effects=*/true, /*is_align_stack=*/false,
                              LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
                              ArrayAttr());
    rewriter.eraseOp(op);
    return success();
  }
};

struct AtomicRMWLowering : CommPattern<comm::AtomicRMWOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::AtomicRMWOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    Type type = op.getValue().getType();
    unsigned bits = type.getIntOrFloatBitWidth();
    std::string prefix;
    std::string instruction =
        atomicInstruction("atom", op.getKind(), op.getOrdering(), op.getScope(), bits, prefix);
    rewriter.replaceOp(op, atomicAsm(rewriter, op.getLoc(), type, prefix + instruction,
                                     {b.generic(adaptor.getPtr()), adaptor.getValue()}));
    return success();
  }
};

struct AtomicCASLowering : CommPattern<comm::AtomicCASOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::AtomicCASOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    Type type = op.getValue().getType();
    unsigned bits = type.getIntOrFloatBitWidth();
    std::string prefix;
    // atomicInstruction spells "<op>.<order>.<scope>.exch.b<bits>"; cas has the same shape.
    std::string instruction = atomicInstruction("atom", comm::AtomicKind::exch, op.getOrdering(),
                                                op.getScope(), bits, prefix);
    instruction.replace(instruction.rfind(".exch."), 6, ".cas.");
    rewriter.replaceOp(
        op, atomicAsm(rewriter, op.getLoc(), type, prefix + instruction,
                      {b.generic(adaptor.getPtr()), adaptor.getCompare(), adaptor.getValue()}));
    return success();
  }
};

struct WaitFlagLowering : CommPattern<comm::WaitFlagOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::WaitFlagOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    bool wide = op.getValue().getType().getIntOrFloatBitWidth() == 64;
    std::string shim = wide ? "wait_flag_i64" : "wait_flag_i32";
    if (needsInlineWaits(op))
      shim += "_inline";
    Value seen =
        b.callShim(op, backend, shim,
                   {b.generic(adaptor.getPtr()), b.i32(static_cast<int32_t>(op.getPredicate())),
                    adaptor.getValue(), b.i32(static_cast<int32_t>(op.getScope())),
                    b.i64(timeoutNs(op.getTimeoutMs())), b.orI32(adaptor.getRank(), -1),
                    b.orI32(adaptor.getPeer(), -1)});
    rewriter.replaceOp(op, seen);
    return success();
  }
};

struct WaitPhaseLowering : CommPattern<comm::WaitPhaseOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::WaitPhaseOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    Value parity = LLVM::ZExtOp::create(rewriter, op.getLoc(), b.i32(), adaptor.getParity());
    b.callShim(op, backend, needsInlineWaits(op) ? "wait_phase_inline" : "wait_phase",
               {adaptor.getBarrier(), parity, b.i64(timeoutNs(op.getTimeoutMs())),
                b.orI32(adaptor.getRank(), -1)});
    rewriter.eraseOp(op);
    return success();
  }
};

struct AgreeLowering : CommPattern<comm::AgreeOp> {
  using CommPattern::CommPattern;
  LogicalResult matchAndRewrite(comm::AgreeOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    LLVMBuilder b{rewriter, op.getLoc()};
    b.callShim(op, backend, needsInlineWaits(op) ? "agree_i64_inline" : "agree_i64",
               {adaptor.getValue(), adaptor.getTheirs(), adaptor.getRank(), adaptor.getPeer()});
    rewriter.eraseOp(op);
    return success();
  }
};

} // namespace

void epic::comm_to_nvvm::populateMemoryOpPatterns(TypeConverter &converter,
                                                  RewritePatternSet &patterns,
                                                  CommBackend backend) {
  patterns.add<FenceLowering, LoadLowering, StoreLowering, RedLowering, AtomicRMWLowering,
               AtomicCASLowering, WaitFlagLowering, WaitPhaseLowering, AgreeLowering>(
      converter, patterns.getContext(), backend);
}
