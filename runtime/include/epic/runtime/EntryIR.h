//===- EntryIR.h - the ep entry functions the runtime compiles -*- C++ -*-===//
//
// The runtime asks the compiler for kernels by writing the entry function of
// one ep op (the form ep-expand takes, see lowering/include/epic/Transforms/
// Passes.td) for the configuration at hand. The text is the cache key's main
// part, so it is deterministic; it leaves the token cap out (a run-time
// value of the kernels) except for the fused GEMM entries. Arguments are
// validated here, before any compilation, with errors that name the bad
// argument.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_ENTRYIR_H
#define EPIC_RUNTIME_ENTRYIR_H

#include <string>

namespace epic::runtime {

/// The configuration every kernel is specialized on (#ep.config).
struct EPSpec {
  int ranks = 1;
  int experts = 1;
  int topk = 1;
  int hidden = 0;
  std::string dtype = "bf16"; ///< bf16, f16, f32, f8E4M3FN, f8E5M2
  int scalePacks = 0;         ///< with FP8 only
  int expertAlignment = 1;
  bool expanded = false;
  int maxTokensPerRank = 0;
  int numSms = 0;
  int64_t timeoutMs = 0; ///< bound of the kernels' waits; 0: the compiler's default (100 s)

  /// Throws std::invalid_argument naming the first bad field.
  void validate() const;
  /// `#ep.config<...>` with every parameter written out, except
  /// max_tokens_per_rank unless `staticTokenCap`: the kernels then read the
  /// cap from their parameter record, so one kernel set serves every cap
  /// that fits the window (the fused GEMM entries size scratch by it).
  std::string configAttr(bool staticTokenCap = false) const;
  /// Bytes of one element of `dtype`.
  int elementBytes() const;
  bool isFP8() const { return dtype == "f8E4M3FN" || dtype == "f8E5M2"; }
};

struct DispatchVariant {
  bool weights = false;
  bool cached = false;
  bool zeroPadding = false;
  int topkIdxBits = 64; ///< i64 (DeepEP's topk_idx_t); a cached dispatch reads int64
};

struct CombineVariant {
  bool weights = false;
  int biases = 0; ///< 0, 1 or 2
};

/// The entry names the typed API (KernelHost::dispatch/combine) uses.
inline constexpr const char *kDispatchEntryName = "ep_dispatch";
inline constexpr const char *kCombineEntryName = "ep_combine";

/// `func.func @<name>` holding one ep.dispatch (scale packs iff FP8).
std::string dispatchEntryIR(const EPSpec &spec, const DispatchVariant &variant,
                            const std::string &name);
/// `func.func @<name>` holding one ep.grouped_gemm of an expanded dispatch's
/// rows by [L, hidden, n] weights into `outDtype` (bf16, f16 or f32).
std::string groupedGemmEntryIR(const EPSpec &spec, int64_t n, const std::string &outDtype,
                               const std::string &name);
inline constexpr const char *kGroupedGemmEntryName = "ep_grouped_gemm";

/// `func.func @<name>` holding an expanded ep.dispatch whose rows feed an
/// ep.grouped_gemm: the compiler fuses the pair (ep-fuse-dispatch-gemm).
std::string dispatchGemmEntryIR(const EPSpec &spec, const DispatchVariant &variant, int64_t n,
                                const std::string &outDtype, const std::string &name);
inline constexpr const char *kDispatchGemmEntryName = "ep_dispatch_gemm";

/// `func.func @<name>` holding an ep.grouped_gemm (N = hidden, bf16 output)
/// whose output an ep.combine with `biases` sums: the compiler fuses the pair
/// (ep-fuse-gemm-combine).
std::string gemmCombineEntryIR(const EPSpec &spec, int biases, const std::string &name);
inline constexpr const char *kGemmCombineEntryName = "ep_gemm_combine";

/// `func.func @<name>` holding one ep.combine.
std::string combineEntryIR(const EPSpec &spec, const CombineVariant &variant,
                           const std::string &name);

} // namespace epic::runtime

#endif // EPIC_RUNTIME_ENTRYIR_H
