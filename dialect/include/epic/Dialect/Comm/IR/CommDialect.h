//===- CommDialect.h - comm dialect -----------------------------*- C++ -*-===//
//
// The comm dialect: one-sided device communication over symmetric windows
// (see CommBase.td).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_COMM_IR_COMMDIALECT_H
#define EPIC_DIALECT_COMM_IR_COMMDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/LLVMIR/LLVMTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace epic::comm {
/// Every rank's copy of every symmetric window.
struct WindowMemoryResource : public mlir::SideEffects::Resource::Base<WindowMemoryResource> {
  llvm::StringRef getName() final { return "comm.window"; }
};
/// The network signal slots of the device communicator.
struct SignalMemoryResource : public mlir::SideEffects::Resource::Base<SignalMemoryResource> {
  llvm::StringRef getName() final { return "comm.signal"; }
};
} // namespace epic::comm

#include "epic/Dialect/Comm/IR/CommOpsDialect.h.inc"
#include "epic/Dialect/Comm/IR/CommEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "epic/Dialect/Comm/IR/CommAttrs.h.inc"

#define GET_TYPEDEF_CLASSES
#include "epic/Dialect/Comm/IR/CommTypes.h.inc"

#define GET_OP_CLASSES
#include "epic/Dialect/Comm/IR/CommOps.h.inc"

#endif // EPIC_DIALECT_COMM_IR_COMMDIALECT_H
