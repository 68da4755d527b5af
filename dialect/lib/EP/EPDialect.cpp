//===- EPDialect.cpp - ep dialect, attributes and types -------------------===//

#include "epic/Dialect/EP/IR/EPDialect.h"
#include "epic/Dialect/EP/IR/EPLimits.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace epic::ep;

#include "epic/Dialect/EP/IR/EPOpsDialect.cpp.inc"
#include "epic/Dialect/EP/IR/EPEnums.cpp.inc"
#include "epic/Dialect/EP/IR/EPInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "epic/Dialect/EP/IR/EPAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "epic/Dialect/EP/IR/EPTypes.cpp.inc"

namespace {
/// Prints every configuration once at the top of a module (`#ep_config = ...`)
/// so ops and handle types refer to it by name instead of repeating it.
struct EPOpAsmDialectInterface : public OpAsmDialectInterface {
  using OpAsmDialectInterface::OpAsmDialectInterface;
  AliasResult getAlias(Attribute attr, raw_ostream &os) const override {
    if (isa<ConfigAttr>(attr)) {
      os << "ep_config";
      return AliasResult::OverridableAlias;
    }
    return AliasResult::NoAlias;
  }
};
} // namespace

void EPDialect::initialize() {
  registerAttributes();
  registerTypes();
  addOperations<
#define GET_OP_LIST
#include "epic/Dialect/EP/IR/EPOps.cpp.inc"
      >();
  addInterfaces<EPOpAsmDialectInterface>();
}

std::optional<FusionMode> epic::ep::parseFusionMode(StringRef mode) {
  if (mode == "auto")
    return FusionMode::automatic;
  if (mode == "always")
    return FusionMode::always;
  if (mode == "never")
    return FusionMode::never;
  return std::nullopt;
}

LogicalResult EPDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  if (attr.getName() != kFusionAttrName)
    return op->emitError() << "unknown ep dialect attribute '" << attr.getName().getValue()
                           << "' (the ep dialect's only discardable attribute is '"
                           << kFusionAttrName << "')";
  if (!isa<FunctionOpInterface>(op))
    return op->emitError() << "'" << kFusionAttrName << "' belongs on a function, not on '"
                           << op->getName() << "'";
  auto mode = dyn_cast<StringAttr>(attr.getValue());
  if (!mode || !parseFusionMode(mode.getValue()))
    return op->emitError() << "'" << kFusionAttrName
                           << "' must be \"auto\", \"always\" or \"never\", got "
                           << attr.getValue();
  return success();
}

void EPDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "epic/Dialect/EP/IR/EPAttrs.cpp.inc"
      >();
}

void EPDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "epic/Dialect/EP/IR/EPTypes.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// ConfigAttr
//===----------------------------------------------------------------------===//

static bool isFP8Type(Type t) { return isa<Float8E4M3FNType, Float8E5M2Type>(t); }

static bool isSupportedDataType(Type t) {
  return isFP8Type(t) || isa<BFloat16Type, Float16Type, Float32Type>(t);
}

bool ConfigAttr::isFP8() const { return isFP8Type(getDtype()); }

uint64_t ConfigAttr::getHiddenBytes() const {
  return uint64_t(getHidden()) * getDtype().getIntOrFloatBitWidth() / 8;
}

std::optional<uint64_t> ConfigAttr::getTokenCap() const {
  if (!hasStaticTokenCap())
    return std::nullopt;
  return getMaxTokensPerRank();
}

std::optional<uint64_t> ConfigAttr::getMaxRecvTokens() const {
  if (!hasStaticTokenCap())
    return std::nullopt;
  return uint64_t(getRanks()) * getMaxTokensPerRank();
}

std::optional<uint64_t> ConfigAttr::getMaxExpandedTokens() const {
  if (!hasStaticTokenCap())
    return std::nullopt;
  return epic::ep::limits::worstCaseRows(getRanks(), getExperts(), getTopk(), getExpertAlignment(),
                                         getMaxTokensPerRank(),
                                         /*expanded=*/true);
}

FailureOr<unsigned> epic::ep::parseCount(AsmParser &parser) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t value;
  if (parser.parseInteger(value))
    return failure();
  if (value < 0 || value > int64_t(std::numeric_limits<unsigned>::max()))
    return parser.emitError(loc) << "expected a non-negative integer below 2^32, got " << value;
  return unsigned(value);
}

LogicalResult ConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError, unsigned ranks,
                                 unsigned experts, unsigned topk, unsigned hidden, Type dtype,
                                 unsigned scalePacks, unsigned expertAlignment, Layout layout,
                                 unsigned numSms, unsigned maxTokensPerRank, unsigned scaleupRanks,
                                 Mode mode) {
  namespace lim = epic::ep::limits;
  // [low, high] of a field (EPLimits.def), named as #ep.config spells it.
  auto inRange = [&](const lim::Limit &limit, int64_t value) -> LogicalResult {
    if (limit.holds(value))
      return success();
    return emitError() << limit.field << " must be in [" << limit.low << ", " << limit.high
                       << "], got " << value;
  };
  if (failed(inRange(lim::kRanks, ranks)) || failed(inRange(lim::kExperts, experts)))
    return failure();
  if (experts % ranks != 0)
    return emitError() << "experts (" << experts << ") must be divisible by ranks (" << ranks
                       << ")";
  if (experts / ranks > lim::kMaxLocalExperts)
    return emitError() << "experts per rank must be at most " << lim::kMaxLocalExperts << ", got "
                       << experts / ranks;
  if (failed(inRange(lim::kTopk, topk)))
    return failure();
  if (topk > experts)
    return emitError() << "topk (" << topk << ") exceeds experts (" << experts << ")";
  if (!isSupportedDataType(dtype))
    return emitError() << "dtype must be bf16, f16, f32, f8E4M3FN or f8E5M2, got " << dtype;
  if (failed(inRange(lim::kHidden, hidden)))
    return failure();
  uint64_t rowBytes = uint64_t(hidden) * dtype.getIntOrFloatBitWidth() / 8;
  if (rowBytes % 16 != 0)
    return emitError() << "hidden bytes (" << hidden << " x " << dtype << " = " << rowBytes
                       << " bytes) must be a multiple of 16 for vector copies";
  if (failed(inRange(lim::kScalePacks, scalePacks)))
    return failure();
  if (isFP8Type(dtype) && scalePacks == 0)
    return emitError() << "FP8 data (" << dtype
                       << ") needs scale packs: scale_packs must be positive";
  if (!isFP8Type(dtype) && scalePacks != 0)
    return emitError() << "scale_packs (" << scalePacks << ") are only allowed with FP8 data, not "
                       << dtype;
  if (failed(inRange(lim::kExpertAlignment, expertAlignment)) ||
      failed(inRange(lim::kNumSms, numSms)) ||
      failed(inRange(lim::kMaxTokensPerRank, maxTokensPerRank)))
    return failure();
  // max_tokens_per_rank 0 (omitted): a run-time value, checked by the runtime.
  // The kernels index rows and their elements with 32-bit values.
  int64_t rows = lim::worstCaseRows(ranks, experts, topk, expertAlignment, maxTokensPerRank,
                                    layout == Layout::expanded);
  int64_t widest = lim::widestRowArray(topk, scalePacks);
  if (rows * widest > lim::kMaxElementIndex)
    return emitError() << "max_tokens_per_rank " << maxTokensPerRank << " needs " << rows
                       << " rows of up to " << widest
                       << " elements (ids and metadata, scale packs): more than the kernels' "
                          "32-bit element indices address ("
                       << lim::kMaxElementIndex << ")";
  if (failed(inRange(lim::kScaleupRanks, scaleupRanks)))
    return failure();
  if (scaleupRanks > ranks || (scaleupRanks && ranks % scaleupRanks))
    return emitError() << "scaleup_ranks (" << scaleupRanks << ") must divide ranks (" << ranks
                       << "): every node has the same number of ranks";
  const unsigned perNode = scaleupRanks ? scaleupRanks : ranks, nodes = ranks / perNode;
  if (mode == Mode::hybrid) {
    if (nodes < 2)
      return emitError() << "mode = hybrid needs more than one node, but scaleup_ranks (" << perNode
                         << ") puts all " << ranks << " ranks in one: use mode = direct";
    if (failed(inRange(lim::kHybridNodes, nodes)) ||
        failed(inRange(lim::kHybridRanksPerNode, perNode)))
      return failure();
  }
  return success();
}
