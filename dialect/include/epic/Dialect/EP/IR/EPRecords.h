//===- EPRecords.h - The kernels' parameter records (EPRecords.def) -------===//
//
// No MLIR here: convert-ep-to-comm (field indices) and the runtime (field names)
// include it. Per entry kind: an enum of field indices in record order, the
// names in that order, and a namespace of name constants for the runtime
// (records::dispatch::recv_x is "recv_x"): a misspelled field does not
// compile.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_EP_IR_EPRECORDS_H
#define EPIC_DIALECT_EP_IR_EPRECORDS_H

#include <iterator>
#include <string>
#include <vector>

namespace epic::ep::records {

enum DispatchField {
#define EP_DISPATCH_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumDispatchFields
};
enum CombineField {
#define EP_COMBINE_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumCombineFields
};
enum DispatchForwarderField {
  kDispatchForwarderFirst = kNumDispatchFields - 1,
#define EP_DISPATCH_FORWARDER_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumDispatchForwarderFields
};
enum CombineForwarderField {
  kCombineForwarderFirst = kNumCombineFields - 1,
#define EP_COMBINE_FORWARDER_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumCombineForwarderFields
};
enum DispatchGemmField {
  kDispatchGemmFirst = kNumDispatchFields - 1,
#define EP_DISPATCH_GEMM_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumDispatchGemmFields
};
enum GemmCombineField {
  kGemmCombineFirst = kNumCombineFields - 1,
#define EP_GEMM_COMBINE_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumGemmCombineFields
};
enum GroupedGemmField {
#define EP_GROUPED_GEMM_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumGroupedGemmFields
};
enum SwigluField {
#define EP_SWIGLU_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumSwigluFields
};
enum LayoutField {
#define EP_LAYOUT_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumLayoutFields
};
enum EngramField {
#define EP_ENGRAM_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumEngramFields
};
enum LowLatencyDispatchField {
#define EP_LL_DISPATCH_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumLowLatencyDispatchFields
};
enum LowLatencyCombineField {
#define EP_LL_COMBINE_FIELD(Enumerator, name) Enumerator,
#include "epic/Dialect/EP/IR/EPRecords.def"
  kNumLowLatencyCombineFields
};

/// The names in record order (the fused entries and hybrid mode: only the
/// fields they add).
inline constexpr const char *kDispatchFields[] = {
#define EP_DISPATCH_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kCombineFields[] = {
#define EP_COMBINE_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kDispatchForwarderFields[] = {
#define EP_DISPATCH_FORWARDER_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kCombineForwarderFields[] = {
#define EP_COMBINE_FORWARDER_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kDispatchGemmExtraFields[] = {
#define EP_DISPATCH_GEMM_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kGemmCombineExtraFields[] = {
#define EP_GEMM_COMBINE_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kGroupedGemmFields[] = {
#define EP_GROUPED_GEMM_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kSwigluFields[] = {
#define EP_SWIGLU_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kLayoutFields[] = {
#define EP_LAYOUT_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kEngramFields[] = {
#define EP_ENGRAM_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kLowLatencyDispatchFields[] = {
#define EP_LL_DISPATCH_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};
inline constexpr const char *kLowLatencyCombineFields[] = {
#define EP_LL_COMBINE_FIELD(Enumerator, name) #name,
#include "epic/Dialect/EP/IR/EPRecords.def"
};

/// ep.moe_layer's record (one kernel runs the whole layer): the dispatch's
/// fields, then the record of each later step under the step's name, in
/// this order ("gate_up.x", ..., "swiglu.gate_up", ..., "combine.x", ...).
/// Each step's code reads its own record starting at its part's first field,
/// so the kernels' field indices (kGGX, kSOut, kCX, ...) stay theirs.
enum MoeLayerPart { kLayerGateUp, kLayerSwiglu, kLayerDown, kLayerCombine, kNumLayerParts };
/// Each part's name and its step's record (the one list of the parts).
struct MoeLayerPartRecord {
  const char *name;
  const char *const *fields;
  int count;
};
inline constexpr MoeLayerPartRecord kMoeLayerParts[kNumLayerParts] = {
    {"gate_up", kGroupedGemmFields, kNumGroupedGemmFields},
    {"swiglu", kSwigluFields, kNumSwigluFields},
    {"down", kGroupedGemmFields, kNumGroupedGemmFields},
    {"combine", kCombineFields, kNumCombineFields}};
/// The index of part `part`'s first field.
constexpr int moeLayerPartFirst(int part) {
  int first = kNumDispatchFields;
  for (int p = 0; p < part; ++p)
    first += kMoeLayerParts[p].count;
  return first;
}
/// Field `name` of part `part` as the record names it ("swiglu.out").
inline std::string moeLayerField(int part, const char *name) {
  return std::string(kMoeLayerParts[part].name) + "." + name;
}
/// The record's field names in order.
inline const std::vector<std::string> &moeLayerFields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all(std::begin(kDispatchFields), std::end(kDispatchFields));
    for (int part = 0; part < kNumLayerParts; ++part)
      for (int f = 0; f < kMoeLayerParts[part].count; ++f)
        all.push_back(moeLayerField(part, kMoeLayerParts[part].fields[f]));
    return all;
  }();
  return names;
}

/// Name constants for the runtime, which fills records by name.
namespace dispatch {
#define EP_DISPATCH_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#define EP_DISPATCH_FORWARDER_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#define EP_DISPATCH_GEMM_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace dispatch
namespace combine {
#define EP_COMBINE_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#define EP_COMBINE_FORWARDER_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#define EP_GEMM_COMBINE_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace combine
namespace grouped_gemm {
#define EP_GROUPED_GEMM_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace grouped_gemm
namespace swiglu {
#define EP_SWIGLU_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace swiglu
namespace layout {
#define EP_LAYOUT_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace layout
namespace engram {
#define EP_ENGRAM_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace engram
namespace ll_dispatch {
#define EP_LL_DISPATCH_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace ll_dispatch
namespace ll_combine {
#define EP_LL_COMBINE_FIELD(Enumerator, name) inline constexpr const char name[] = #name;
#include "epic/Dialect/EP/IR/EPRecords.def"
} // namespace ll_combine

} // namespace epic::ep::records

#endif // EPIC_DIALECT_EP_IR_EPRECORDS_H
