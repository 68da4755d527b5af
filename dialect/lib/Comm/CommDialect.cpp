//===- CommDialect.cpp - comm dialect, attributes and types ---------------===//

#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace epic::comm;

#include "epic/Dialect/Comm/IR/CommOpsDialect.cpp.inc"
#include "epic/Dialect/Comm/IR/CommEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "epic/Dialect/Comm/IR/CommAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "epic/Dialect/Comm/IR/CommTypes.cpp.inc"

void CommDialect::initialize() {
  registerTypes();
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "epic/Dialect/Comm/IR/CommOps.cpp.inc"
      >();
}

void CommDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "epic/Dialect/Comm/IR/CommTypes.cpp.inc"
      >();
}

void CommDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "epic/Dialect/Comm/IR/CommAttrs.cpp.inc"
      >();
}

LogicalResult ParamTableAttr::verify(function_ref<InFlightDiagnostic()> emitError, unsigned arg,
                                     unsigned stride, unsigned ranks) {
  (void)arg;
  // Records start 64-byte aligned: a TMA descriptor in a record must be.
  if (stride == 0 || stride % 64 != 0)
    return emitError() << "param_table stride must be a positive multiple of 64 bytes, got "
                       << stride;
  if (ranks < 1 || ranks > 1024)
    return emitError() << "param_table ranks must be in [1, 1024], got " << ranks;
  return success();
}

LogicalResult CommDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  if (attr.getName() == "comm.inline_waits") { // see comm.wait_flag
    if (!isa<UnitAttr>(attr.getValue()) || !isa<FunctionOpInterface>(op))
      return op->emitError("'comm.inline_waits' is a unit attribute of a kernel function");
    return success();
  }
  if (attr.getName() != ParamTableAttr::getAttrName())
    return op->emitError() << "unknown comm attribute '" << attr.getName().getValue() << "'";
  auto table = dyn_cast<ParamTableAttr>(attr.getValue());
  if (!table)
    return op->emitError() << "'comm.param_table' must be a #comm.param_table<...>, got "
                           << attr.getValue();
  auto func = dyn_cast<FunctionOpInterface>(op);
  if (!func)
    return op->emitError("'comm.param_table' belongs on a kernel function");
  if (table.getArg() >= func.getNumArguments())
    return op->emitError() << "'comm.param_table' names argument " << table.getArg()
                           << " of a function with " << func.getNumArguments();
  auto type = dyn_cast<LLVM::LLVMPointerType>(func.getArgumentTypes()[table.getArg()]);
  if (!type || type.getAddressSpace() != 0)
    return op->emitError() << "'comm.param_table' argument " << table.getArg()
                           << " must be a generic !llvm.ptr (the table travels by value), got "
                           << func.getArgumentTypes()[table.getArg()];
  return success();
}
