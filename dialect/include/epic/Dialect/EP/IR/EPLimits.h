//===- EPLimits.h - #ep.config's bounds as C++ constants ------------------===//
//
// No MLIR here: the runtime includes it too. The values live in EPLimits.def.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_EP_IR_EPLIMITS_H
#define EPIC_DIALECT_EP_IR_EPLIMITS_H

#include <algorithm>
#include <cstdint>

namespace epic::ep::limits {
/// One bound: the #ep.config field and the Python argument it applies to.
struct Limit {
  const char *field, *argument;
  int64_t low, high;
  bool holds(int64_t value) const { return value >= low && value <= high; }
};
#define EP_LIMIT(Name, field, argument, low, high)                                                 \
  inline constexpr Limit k##Name{field, argument, low, high};                                      \
  inline constexpr int64_t kMin##Name = low;                                                       \
  inline constexpr int64_t kMax##Name = high;
#include "epic/Dialect/EP/IR/EPLimits.def"

/// The most rows any kernel of a configuration indexes: the plain receive
/// layout's R x Tmax, or the expanded one's align(R x Tmax x min(K, L) +
/// (A - 1) x L, A).
inline int64_t worstCaseRows(int64_t ranks, int64_t experts, int64_t topk, int64_t alignment,
                             int64_t tokenCap, bool expanded) {
  int64_t plain = ranks * tokenCap;
  if (!expanded)
    return plain;
  int64_t local = experts / ranks;
  int64_t rows = plain * std::min(topk, local) + (alignment - 1) * local;
  return (rows + alignment - 1) / alignment * alignment;
}
/// The widest per-row array the kernels index by row: metadata (K + 2 ints)
/// or the scale packs.
inline int64_t widestRowArray(int64_t topk, int64_t scalePacks) {
  return std::max(topk + 2, scalePacks);
}
} // namespace epic::ep::limits

#endif // EPIC_DIALECT_EP_IR_EPLIMITS_H
