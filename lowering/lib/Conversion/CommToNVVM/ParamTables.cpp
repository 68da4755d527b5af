//===- ParamTables.cpp - kernel parameter tables by value -----------------===//
//
// See CommParamTablesByValue in Passes.td. Kept apart from the comm lowering:
// it runs after the GPU-to-NVVM conversion, which drops `llvm.byval` from
// gpu.func arguments, on the llvm.func kernels it made.
//
//===----------------------------------------------------------------------===//

#include "epic/Conversion/Passes.h"
#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

namespace epic {
#define GEN_PASS_DEF_COMMPARAMTABLESBYVALUE
#include "epic/Conversion/Passes.h.inc"
} // namespace epic

using namespace mlir;
using namespace epic;

namespace {
struct CommParamTablesByValuePass
    : public epic::impl::CommParamTablesByValueBase<CommParamTablesByValuePass> {
  using CommParamTablesByValueBase::CommParamTablesByValueBase;

  void runOnOperation() override {
    StringRef name = comm::ParamTableAttr::getAttrName();
    WalkResult result = getOperation().walk([&](Operation *op) {
      auto table = op->getAttrOfType<comm::ParamTableAttr>(name);
      if (!table)
        return WalkResult::advance();
      auto func = dyn_cast<LLVM::LLVMFuncOp>(op);
      if (!func) {
        op->emitError("comm-param-tables-by-value: '")
            << name << "' on a '" << op->getName()
            << "': run the pass after the GPU-to-NVVM lowering, on llvm.func kernels";
        return WalkResult::interrupt();
      }
      const int64_t records = backend == CommBackend::nccl ? 1 : table.getRanks();
      const int64_t bytes = records * int64_t(table.getStride());
      if (bytes > kMaxParamTableBytes) {
        func.emitError("comm-param-tables-by-value: the parameter table of kernel '")
            << func.getName() << "' would be " << records << " records x " << table.getStride()
            << " bytes = " << bytes << " bytes, more than the " << kMaxParamTableBytes
            << " bytes CUDA allows for it (kernel parameters are limited to 32,764 bytes): "
               "a virtual world of "
            << table.getRanks() << " ranks is too large for this kernel";
        return WalkResult::interrupt();
      }
      MLIRContext *ctx = func.getContext();
      Builder b(ctx);
      unsigned arg = table.getArg();
      func.setArgAttr(arg, LLVM::LLVMDialect::getByValAttrName(),
                      TypeAttr::get(LLVM::LLVMArrayType::get(b.getI8Type(), bytes)));
      func.setArgAttr(arg, LLVM::LLVMDialect::getAlignAttrName(), b.getI64IntegerAttr(64));
      func.setArgAttr(arg, NVVM::NVVMDialect::getGridConstantAttrName(), b.getUnitAttr());
      func->removeAttr(name);
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};
} // namespace
