//===- ArithBuilder.h - convert-ep-to-comm: integer math and `when` for builders --===//
//
// What both kernel builders (KernelBuilder for the communication kernels,
// the grouped GEMM's builder) write their index arithmetic and conditionals
// with, once: a mixin over the derived builder's ImplicitLocOpBuilder `b`.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LOWERING_CONVERSION_EPTOCOMM_ARITHBUILDER_H
#define EPIC_LOWERING_CONVERSION_EPTOCOMM_ARITHBUILDER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

namespace epic::expand {

/// Integer arithmetic, comparisons and a one-armed `when` on `Derived::b`.
template <typename Derived> class ArithBuilder {
  mlir::ImplicitLocOpBuilder &builder() { return static_cast<Derived *>(this)->b; }

public:
  using Value = mlir::Value;
  Value add(Value x, Value y) { return mlir::arith::AddIOp::create(builder(), x, y); }
  Value sub(Value x, Value y) { return mlir::arith::SubIOp::create(builder(), x, y); }
  Value mul(Value x, Value y) { return mlir::arith::MulIOp::create(builder(), x, y); }
  Value divu(Value x, Value y) { return mlir::arith::DivUIOp::create(builder(), x, y); }
  Value remu(Value x, Value y) { return mlir::arith::RemUIOp::create(builder(), x, y); }
  Value divs(Value x, Value y) { return mlir::arith::DivSIOp::create(builder(), x, y); }
  Value rems(Value x, Value y) { return mlir::arith::RemSIOp::create(builder(), x, y); }
  Value cmp(mlir::arith::CmpIPredicate p, Value x, Value y) {
    return mlir::arith::CmpIOp::create(builder(), p, x, y);
  }
  Value lt(Value x, Value y) { return cmp(mlir::arith::CmpIPredicate::slt, x, y); }
  Value eq(Value x, Value y) { return cmp(mlir::arith::CmpIPredicate::eq, x, y); }
  Value ult(Value x, Value y) { return cmp(mlir::arith::CmpIPredicate::ult, x, y); }
  Value ule(Value x, Value y) { return cmp(mlir::arith::CmpIPredicate::ule, x, y); }
  Value select(Value c, Value x, Value y) {
    return mlir::arith::SelectOp::create(builder(), c, x, y);
  }
  Value andi(Value x, Value y) { return mlir::arith::AndIOp::create(builder(), x, y); }

  /// `body` at the start of an scf.if on `cond` without an else branch.
  void when(Value cond, llvm::function_ref<void()> body) {
    auto op = mlir::scf::IfOp::create(builder(), cond, /*withElseRegion=*/false);
    mlir::OpBuilder::InsertionGuard guard(builder());
    builder().setInsertionPointToStart(op.thenBlock());
    body();
  }
  /// An scf.if on `cond` with both branches and no results.
  void ifElse(Value cond, llvm::function_ref<void()> then, llvm::function_ref<void()> otherwise) {
    auto op = mlir::scf::IfOp::create(builder(), cond, /*withElseRegion=*/true);
    mlir::OpBuilder::InsertionGuard guard(builder());
    builder().setInsertionPointToStart(op.thenBlock());
    then();
    builder().setInsertionPointToStart(op.elseBlock());
    otherwise();
  }
};

} // namespace epic::expand

#endif // EPIC_LOWERING_CONVERSION_EPTOCOMM_ARITHBUILDER_H
