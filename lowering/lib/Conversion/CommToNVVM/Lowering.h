//===- Lowering.h - what the comm lowering's patterns share ------*- C++ -*-===//
//
// Private to convert-comm-to-nvvm: the shim calls (declared from
// runtime/include/epic/device/ShimABI.def), the small LLVM builder its
// patterns write with, and the pattern base. CommToNVVM.cpp lowers ranks,
// teams, pointers, network operations and barriers and runs the pass;
// MemoryOps.cpp lowers the memory-ordering operations (fences, scoped loads,
// stores and atomics, bounded flag waits, agreement checks).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LIB_CONVERSION_COMMTONVVM_LOWERING_H
#define EPIC_LIB_CONVERSION_COMMTONVVM_LOWERING_H

#include "epic/Conversion/Passes.h"
#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Transforms/DialectConversion.h"

namespace epic::comm_to_nvvm {

using namespace mlir;
namespace comm = epic::comm;

/// The LLVM type of shim function `name` (ShimABI.def); a name it does not
/// list is a fatal error.
LLVM::LLVMFunctionType lookupShimType(MLIRContext *ctx, StringRef name);

/// The shim functions' suffix of a cooperation level.
inline StringRef coopSuffix(comm::Coop coop) {
  switch (coop) {
  case comm::Coop::thread:
    return "thread";
  case comm::Coop::warp:
    return "warp";
  case comm::Coop::block:
    return "block";
  }
  llvm_unreachable("unknown coop");
}

/// A wait's bound in nanoseconds of %globaltimer.
inline int64_t timeoutNs(int64_t timeoutMs) { return timeoutMs * 1000000; }

/// Whether the waits (and checks) of `op`'s kernel must not call (a timeout's
/// printf): ptxas serializes every wgmma of a function that calls.
bool needsInlineWaits(Operation *op);

/// LLVM dialect ops at one location, and calls of the backend's shim.
struct LLVMBuilder {
  ConversionPatternRewriter &rewriter;
  Location loc;
  MLIRContext *ctx() const { return rewriter.getContext(); }

  Type i32() const { return rewriter.getI32Type(); }
  Type i64() const { return rewriter.getI64Type(); }
  Type ptr() const { return LLVM::LLVMPointerType::get(ctx()); }

  Value i32(int64_t v) const {
    return LLVM::ConstantOp::create(rewriter, loc, i32(), rewriter.getI32IntegerAttr(v));
  }
  Value i64(int64_t v) const {
    return LLVM::ConstantOp::create(rewriter, loc, i64(), rewriter.getI64IntegerAttr(v));
  }
  Value null() const { return LLVM::ZeroOp::create(rewriter, loc, ptr()); }
  Value orI32(Value v, int64_t fallback) const { return v ? v : i32(fallback); }
  Value orI64(Value v, int64_t fallback) const { return v ? v : i64(fallback); }

  Value add(Value a, Value b) const { return LLVM::AddOp::create(rewriter, loc, a, b); }
  Value sub(Value a, Value b) const { return LLVM::SubOp::create(rewriter, loc, a, b); }
  Value mul(Value a, Value b) const { return LLVM::MulOp::create(rewriter, loc, a, b); }
  Value udiv(Value a, Value b) const { return LLVM::UDivOp::create(rewriter, loc, a, b); }
  Value urem(Value a, Value b) const { return LLVM::URemOp::create(rewriter, loc, a, b); }
  Value sext64(Value v) const {
    return v.getType() == i64() ? v : LLVM::SExtOp::create(rewriter, loc, i64(), v);
  }

  Value extract(Value aggregate, int64_t index) const {
    return LLVM::ExtractValueOp::create(rewriter, loc, aggregate, index);
  }

  /// Loads field `index` (of type `type`) of a C struct of the given field
  /// types at `base`.
  Value loadField(Value base, ArrayRef<Type> fields, int32_t index, Type type) const {
    auto structType = LLVM::LLVMStructType::getLiteral(ctx(), fields);
    Value address = LLVM::GEPOp::create(rewriter, loc, ptr(), structType, base,
                                        ArrayRef<LLVM::GEPArg>{0, index});
    return LLVM::LoadOp::create(rewriter, loc, type, address);
  }

  /// A pointer in the generic address space (what the shim ABI takes).
  Value generic(Value pointer) const {
    auto type = cast<LLVM::LLVMPointerType>(pointer.getType());
    if (type.getAddressSpace() == 0)
      return pointer;
    return LLVM::AddrSpaceCastOp::create(rewriter, loc, ptr(), pointer);
  }

  /// `pointer` (generic) as `type` (any address space).
  Value as(Value pointer, Type type) const {
    if (pointer.getType() == type)
      return pointer;
    return LLVM::AddrSpaceCastOp::create(rewriter, loc, type, pointer);
  }

  /// Calls the backend's shim function `name`, declaring it on first use.
  Value callShim(Operation *anchor, CommBackend backend, StringRef name, ValueRange args) const {
    std::string symbol = (getShimPrefix(backend) + name).str();
    Operation *table = anchor->getParentWithTrait<OpTrait::SymbolTable>();
    auto type = lookupShimType(ctx(), name);
    if (!SymbolTable::lookupSymbolIn(table, symbol)) {
      OpBuilder::InsertionGuard guard(rewriter);
      rewriter.setInsertionPointToStart(&table->getRegion(0).front());
      auto decl = LLVM::LLVMFuncOp::create(rewriter, rewriter.getUnknownLoc(), symbol, type);
      decl.setPrivate();
    }
    auto call = LLVM::CallOp::create(rewriter, loc, type, SymbolRefAttr::get(ctx(), symbol), args);
    return call.getNumResults() ? call.getResult() : Value();
  }
};

template <typename Op> struct CommPattern : public OpConversionPattern<Op> {
  CommPattern(TypeConverter &converter, MLIRContext *ctx, CommBackend backend)
      : OpConversionPattern<Op>(converter, ctx), backend(backend) {}
  CommBackend backend;
};

/// The patterns of MemoryOps.cpp.
void populateMemoryOpPatterns(TypeConverter &converter, RewritePatternSet &patterns,
                              CommBackend backend);

} // namespace epic::comm_to_nvvm

#endif // EPIC_LIB_CONVERSION_COMMTONVVM_LOWERING_H
