//===- RunDialect.h - run dialect -------------------------------*- C++ -*-===//
//
// The run dialect: the host side of an epic-run program (see RunOps.td).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_RUN_IR_RUNDIALECT_H
#define EPIC_DIALECT_RUN_IR_RUNDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "epic/Dialect/Run/IR/RunOpsDialect.h.inc"
#include "epic/Dialect/Run/IR/RunEnums.h.inc"

#define GET_OP_CLASSES
#include "epic/Dialect/Run/IR/RunOps.h.inc"

#endif // EPIC_DIALECT_RUN_IR_RUNDIALECT_H
