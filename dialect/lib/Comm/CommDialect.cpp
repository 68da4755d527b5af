//===- CommDialect.cpp - comm dialect, attributes and types ---------------===//

#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace epic::comm;

#include "epic/Dialect/Comm/IR/CommOpsDialect.cpp.inc"
#include "epic/Dialect/Comm/IR/CommEnums.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "epic/Dialect/Comm/IR/CommTypes.cpp.inc"

void CommDialect::initialize() {
  registerTypes();
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
