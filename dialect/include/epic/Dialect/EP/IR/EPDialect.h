//===- EPDialect.h - ep dialect ---------------------------------*- C++ -*-===//
//
// The ep dialect: MoE dispatch / combine at the tensor level (see EPBase.td).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_EP_IR_EPDIALECT_H
#define EPIC_DIALECT_EP_IR_EPDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <optional>

namespace epic::ep {
/// A non-negative #ep.config field, parsed as a signed 64-bit integer so that
/// a negative or too large value is refused as written, not wrapped to
/// unsigned.
mlir::FailureOr<unsigned> parseCount(mlir::AsmParser &parser);

/// `op` is not inside a gpu.func or gpu.module (ep ops become kernels).
mlir::LogicalResult verifyOnHost(mlir::Operation *op);
/// The trait of every ep op (EP_HostOp).
template <typename ConcreteType>
class HostOp : public mlir::OpTrait::TraitBase<ConcreteType, HostOp> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) { return verifyOnHost(op); }
};

/// `ep.fusion` on a func.func: how the ep-fuse-* passes decide in it: by
/// their cost model ("auto"), or as told ("always", "never"). The dialect
/// verifies the attribute.
enum class FusionMode { automatic, always, never };
inline constexpr llvm::StringLiteral kFusionAttrName = "ep.fusion";
std::optional<FusionMode> parseFusionMode(llvm::StringRef mode);
} // namespace epic::ep

#include "epic/Dialect/EP/IR/EPOpsDialect.h.inc"
#include "epic/Dialect/EP/IR/EPEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "epic/Dialect/EP/IR/EPAttrs.h.inc"

#define GET_TYPEDEF_CLASSES
#include "epic/Dialect/EP/IR/EPTypes.h.inc"

#include "epic/Dialect/EP/IR/EPInterfaces.h.inc"

#define GET_OP_CLASSES
#include "epic/Dialect/EP/IR/EPOps.h.inc"

#endif // EPIC_DIALECT_EP_IR_EPDIALECT_H
