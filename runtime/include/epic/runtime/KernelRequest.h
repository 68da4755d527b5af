//===- KernelRequest.h - what the runtime asks the compiler for -*- C++ -*-===//
//
// The runtime asks the compiler for the kernels of one ep op (or of a pair
// the compiler fuses) with a typed request: its kind, the configuration
// (EPSpec), the variant and the entry function's name. The request's
// canonical JSON (KernelRequest.def's keys in their order) is the kernel
// cache key's main part, so it is deterministic and leaves the token cap out
// (a run-time value of the kernels) except for the fused GEMM entries; the
// compiler (`epic-compile --request`) builds the entry IR from it with the
// ops' builders. Requests are validated here, before anything compiles, with
// errors that name the bad argument. No MLIR: the runtime writes no IR.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_KERNELREQUEST_H
#define EPIC_RUNTIME_KERNELREQUEST_H

#include <cstdint>
#include <string>

namespace epic::runtime {

/// The configuration every kernel is specialized on (#ep.config), and the
/// bound of the kernels' waits.
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
  int scaleupRanks = 0;  ///< ranks per NVLink domain; 0: all (one node)
  bool hybrid = false;   ///< hybrid mode (more than one node), else direct
  int64_t timeoutMs = 0; ///< bound of the kernels' waits; 0: the compiler's default (100 s)

  /// Throws std::invalid_argument naming the first bad field.
  void validate() const;
  /// Bytes of one element of `dtype`.
  int elementBytes() const;
  /// Ranks per node (NVLink domain): scaleupRanks, or every rank on one node.
  int ranksPerNode() const { return scaleupRanks ? scaleupRanks : ranks; }
  /// Hybrid mode's nodes (its forwarders' handle tensors, its row groups), or 0
  /// in direct mode and on one node.
  int hybridNodes() const {
    return hybrid && ranks / ranksPerNode() > 1 ? ranks / ranksPerNode() : 0;
  }
  bool isFP8() const { return dtype == "f8E4M3FN" || dtype == "f8E5M2"; }
};

struct DispatchVariant {
  bool weights = false;
  bool cached = false;
  bool zeroPadding = false;
  int topkIdxBits = 64; ///< i64 (DeepEP's topk_idx_t); a cached dispatch reads int64
  /// Outputs and handle in the symmetric window (every tensor a peer writes
  /// or reads): the one-pass kernels on any backend.
  bool windowOutputs = false;
  /// The low-latency dispatch's FP8 scales: powers of two, and as UE8M0 bytes.
  bool roundScale = false;
  bool useUe8m0 = false;
};

struct CombineVariant {
  bool weights = false;
  int biases = 0; ///< 0, 1 or 2
  /// x, the weights and the handle in the symmetric window: the one-pass
  /// gather on any backend.
  bool windowOutputs = false;
};

/// The expert GEMM's N, output element type and K.
struct GemmVariant {
  int64_t n = 0;
  std::string outDtype = "bf16"; ///< bf16, f16 or f32
  int64_t k = 0;                 ///< the rows' width; 0: the hidden size
  std::string inDtype;           ///< the rows': the spec's dtype (GEMMs), gate/up's (swiglu)
};

/// Where K and N lie in the grouped GEMM's [L, ., .] weights: bf16/f16 [L, K, N] (N
/// contiguous), FP8 [L, N, K] (K contiguous: FP8 tensor cores read B K-major).
struct GemmWeightsLayout {
  size_t k, n;
};
constexpr GemmWeightsLayout gemmWeightsLayout(bool fp8) {
  return fp8 ? GemmWeightsLayout{2, 1} : GemmWeightsLayout{1, 2};
}

/// What a request asks for (KernelRequest.def): one ep op, or a pair the
/// compiler fuses.
enum class KernelKind {
#define EP_REQUEST_KIND(Enumerator, kind, entryName, dispatch, combine, gemm, staticTokenCap)      \
  Enumerator,
#include "epic/runtime/KernelRequest.def"
};

/// The request format this runtime writes.
#define EP_REQUEST_VERSION(number) inline constexpr int kKernelRequestVersion = number;
#include "epic/runtime/KernelRequest.def"

/// The JSON name of `kind` ("dispatch", "grouped_gemm", ...).
const char *kindName(KernelKind kind);
/// The kind named `name`; throws std::invalid_argument listing the kinds.
KernelKind kindNamed(const std::string &name);
/// The entry name the typed API (KernelHost::planDispatch, ...) gives it.
const char *defaultEntryName(KernelKind kind);

/// The entry function of one ep op (or fused pair) for the configuration at
/// hand; the compiler turns it into kernels.
struct KernelRequest {
  int version = kKernelRequestVersion;
  KernelKind kind = KernelKind::dispatch;
  std::string name; ///< the entry function's symbol
  EPSpec spec;
  DispatchVariant dispatch; ///< dispatch, dispatch_gemm
  CombineVariant combine;   ///< combine, gemm_combine (biases only)
  GemmVariant gemm;         ///< grouped_gemm, dispatch_gemm

  /// Throws std::invalid_argument naming the first bad field: the spec, then
  /// what the kind asks of it and of the variant.
  void validate() const;
  /// The canonical JSON (validated first): compact, KernelRequest.def's keys
  /// in its order, the kind's sections only, max_tokens_per_rank 0 unless
  /// the kind keeps the token cap.
  std::string json() const;
};

/// `@<name>` holding one ep.dispatch (scale packs iff FP8). Validated; `name`
/// empty: the kind's default entry name (so for the others).
KernelRequest dispatchRequest(const EPSpec &spec, const DispatchVariant &variant,
                              std::string name = "");
/// `@<name>` holding one ep.combine.
KernelRequest combineRequest(const EPSpec &spec, const CombineVariant &variant,
                             std::string name = "");
/// `@<name>` holding one ep.grouped_gemm of an expanded dispatch's rows by
/// [L, hidden, n] weights into `outDtype` (bf16, f16 or f32).
/// `k`: the rows' width when it is not the hidden size (an expert's down GEMM); a `k` equal
/// to the hidden size is written as 0, so both spellings are one request (one cache key).
KernelRequest groupedGemmRequest(const EPSpec &spec, int64_t n, const std::string &outDtype,
                                 std::string name = "", int64_t k = 0);
/// `@<name>` holding one ep.swiglu of an expanded dispatch's gate/up rows ([rows, 2 inter] of
/// `inDtype`) into `outDtype` rows (bf16, f16, f32, or f8E4M3FN with block scales).
KernelRequest swigluRequest(const EPSpec &spec, int64_t inter, const std::string &inDtype,
                            const std::string &outDtype, std::string name = "");
/// `@<name>` holding an expanded ep.dispatch whose rows feed an
/// ep.grouped_gemm: the compiler fuses the pair (ep-fuse-dispatch-gemm).
KernelRequest dispatchGemmRequest(const EPSpec &spec, const DispatchVariant &variant, int64_t n,
                                  const std::string &outDtype, std::string name = "");
/// `@<name>` holding an ep.grouped_gemm (N = hidden, bf16 output) whose
/// output an ep.combine with `biases` sums: the compiler fuses the pair
/// (ep-fuse-gemm-combine).
KernelRequest gemmCombineRequest(const EPSpec &spec, int biases, std::string name = "");
/// `@<name>` holding one ep.moe_layer: the FP8 layer (dispatch of
/// `topkIdxBits`-bit routing with weights, gate/up GEMM, SwiGLU of `inter`
/// channels, down GEMM, combine) as one persistent kernel.
KernelRequest moeLayerRequest(const EPSpec &spec, int topkIdxBits, int64_t inter,
                              std::string name = "");
/// ep.dispatch_layout of a routing table of `topkIdxBits`-bit expert ids.
KernelRequest dispatchLayoutRequest(const EPSpec &spec, int topkIdxBits = 64,
                                    std::string name = "");
/// ep.engram_fetch of rows of `spec.hidden` elements of `spec.dtype` from the
/// tables of `spec.ranks` ranks (NVLink domains of `spec.scaleupRanks`). The
/// request's configuration is normalized (experts = ranks, top-1, no scale
/// packs but FP8's one, alignment 1, plain): one kernel per row shape.
KernelRequest engramFetchRequest(const EPSpec &spec, std::string name = "");
/// ep.low_latency_dispatch of bf16 rows routed by `topkIdxBits`-bit ids into
/// rows of `spec.dtype` (bf16, or f8E4M3FN with `roundScale` / `useUe8m0`
/// scales), and ep.low_latency_combine (bf16). Normalized configuration:
/// FP8's scale packs are its hidden / 128 scale groups, alignment 1, plain.
KernelRequest lowLatencyDispatchRequest(const EPSpec &spec, int topkIdxBits, bool roundScale,
                                        bool useUe8m0, std::string name = "");
KernelRequest lowLatencyCombineRequest(const EPSpec &spec, int topkIdxBits, std::string name = "");

} // namespace epic::runtime

#endif // EPIC_RUNTIME_KERNELREQUEST_H
