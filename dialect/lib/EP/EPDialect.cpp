//===- EPDialect.cpp - ep dialect, attributes and types -------------------===//

#include "epic/Dialect/EP/IR/EPDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace epic::ep;

#include "epic/Dialect/EP/IR/EPOpsDialect.cpp.inc"
#include "epic/Dialect/EP/IR/EPEnums.cpp.inc"

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

static uint64_t alignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
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
  std::optional<uint64_t> received = getMaxRecvTokens();
  if (!received)
    return std::nullopt;
  uint64_t local = getNumLocalExperts();
  uint64_t align = getExpertAlignment();
  uint64_t rows = *received * std::min<uint64_t>(getTopk(), local) + (align - 1) * local;
  return alignUp(rows, align);
}

LogicalResult ConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 unsigned ranks, unsigned experts, unsigned topk,
                                 unsigned hidden, Type dtype, unsigned scalePacks,
                                 unsigned expertAlignment, Layout layout,
                                 unsigned numSms, unsigned maxTokensPerRank) {
  if (ranks < 1 || ranks > 1024)
    return emitError() << "ranks must be in [1, 1024], got " << ranks;
  if (experts < 1 || experts > 2048)
    return emitError() << "experts must be in [1, 2048], got " << experts;
  if (experts % ranks != 0)
    return emitError() << "experts (" << experts
                       << ") must be divisible by ranks (" << ranks << ")";
  if (experts / ranks > 256)
    return emitError() << "experts per rank must be at most 256, got "
                       << experts / ranks;
  if (topk < 1 || topk > 32)
    return emitError() << "topk must be in [1, 32], got " << topk;
  if (topk > experts)
    return emitError() << "topk (" << topk << ") exceeds experts (" << experts
                       << ")";
  if (!isSupportedDataType(dtype))
    return emitError() << "dtype must be bf16, f16, f32, f8E4M3FN or f8E5M2, got "
                       << dtype;
  if (hidden < 1)
    return emitError() << "hidden must be positive";
  uint64_t rowBytes = uint64_t(hidden) * dtype.getIntOrFloatBitWidth() / 8;
  if (rowBytes % 16 != 0)
    return emitError() << "hidden bytes (" << hidden << " x " << dtype << " = "
                       << rowBytes
                       << " bytes) must be a multiple of 16 for vector copies";
  if (isFP8Type(dtype) && scalePacks == 0)
    return emitError() << "FP8 data (" << dtype
                       << ") needs scale packs: scale_packs must be positive";
  if (!isFP8Type(dtype) && scalePacks != 0)
    return emitError() << "scale_packs (" << scalePacks
                       << ") are only allowed with FP8 data, not " << dtype;
  if (expertAlignment < 1)
    return emitError() << "expert_alignment must be at least 1";
  // max_tokens_per_rank 0 (omitted): a run-time value, checked by the runtime.
  // Source global ids (src_rank * Tmax + token) are stored as int32.
  if (uint64_t(ranks) * maxTokensPerRank > uint64_t(INT32_MAX))
    return emitError() << "ranks x max_tokens_per_rank (" << ranks << " x "
                       << maxTokensPerRank << ") overflows the int32 source ids";
  (void)layout;
  (void)numSms; // 0 means "the analytic choice"; the runtime caps by the device.
  return success();
}
