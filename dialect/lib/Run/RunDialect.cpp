//===- RunDialect.cpp - run dialect operations ----------------------------===//

#include "epic/Dialect/Run/IR/RunDialect.h"

#include "epic/Dialect/EP/IR/EPDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"

#include <cmath>

using namespace mlir;
using namespace epic::run;

#include "epic/Dialect/Run/IR/RunOpsDialect.cpp.inc"
#include "epic/Dialect/Run/IR/RunEnums.cpp.inc"

void RunDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "epic/Dialect/Run/IR/RunOps.cpp.inc"
      >();
}

#define GET_OP_CLASSES
#include "epic/Dialect/Run/IR/RunOps.cpp.inc"

namespace {
/// `[rows, N]` with rows dynamic (it is the `rows` operand) and N static.
LogicalResult verifyRowsShape(Operation *op, ShapedType type, StringRef what) {
  if (!type.isDynamicDim(0))
    return op->emitOpError() << "result dimension 0 must be dynamic (it is the `rows` "
                                "operand), got "
                             << type;
  for (int64_t d = 1; d < type.getRank(); ++d)
    if (type.isDynamicDim(d) || type.getDimSize(d) < 1)
      return op->emitOpError() << "result dimension " << d << " (" << what
                               << ") must be static and positive, got " << type;
  return success();
}
} // namespace

LogicalResult TokensOp::verify() {
  ArrayRef<int64_t> counts = getPerRank();
  if (counts.empty())
    return emitOpError() << "per_rank must have one entry per rank, got none";
  for (auto [rank, count] : llvm::enumerate(counts))
    if (count < 0)
      return emitOpError() << "per_rank[" << rank << "] = " << count << " is negative";
  return success();
}

LogicalResult RandomOp::verify() {
  double scale = getScale().convertToDouble();
  if (!(scale > 0) || std::isinf(scale))
    return emitOpError() << "scale must be positive and finite, got " << scale;
  return verifyRowsShape(*this, getResult().getType(), "columns");
}

LogicalResult RoutingOp::verify() {
  auto type = getResult().getType();
  if (failed(verifyRowsShape(*this, type, "top-k")))
    return failure();
  int64_t topk = type.getDimSize(1);
  if (topk > getExperts())
    return emitOpError() << "top-k (" << topk << ") cannot exceed experts (" << getExperts()
                         << "): the experts of a token are distinct";
  double masked = getMasked().convertToDouble();
  if (!(masked >= 0 && masked <= 1))
    return emitOpError() << "masked must be a probability in [0, 1], got " << masked;
  return success();
}

LogicalResult PrintOp::verify() {
  Type type = getValue().getType();
  if (!type.isIndex() && !isa<RankedTensorType>(type) && !isa<epic::ep::HandleType>(type))
    return emitOpError() << "prints an index, a ranked tensor or an !ep.handle, got " << type;
  if (int64_t(getRows()) < 0)
    return emitOpError() << "rows must be non-negative, got " << int64_t(getRows());
  return success();
}
