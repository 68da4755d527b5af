//===- FusionCostModel.h - does a fused schedule beat its two steps? -*- C++ -*-===//
//
// The one fusion cost model, header-only and free of MLIR: the compiler's
// fusion passes (ep-fuse-dispatch-gemm, ep-fuse-gemm-combine) and the Python
// API's dispatch_gemm / gemm_combine ask it alike. It counts what each
// schedule moves and computes on one GPU (bytes of the copy or the send,
// FLOPs and weight bytes of the GEMM, kernel boundaries, waits) and prices
// them with a chip's numbers (FusionCosts.def). docs/fusion.md explains it.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_FUSIONCOSTMODEL_H
#define EPIC_RUNTIME_FUSIONCOSTMODEL_H

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace epic::fusion {

/// What the model assumes about a GPU (FusionCosts.def explains each).
struct Costs {
  double copyGBps = 0, weightGBps = 0, linkGBps = 0, gemmTflops = 0;
  double launchUs = 0, waitUs = 0;
  double dispatchGemmSlowdown = 0, gemmCombineSlowdown = 0;
};

/// The numbers of `chip` from FusionCosts.def, if it has a row.
inline std::optional<Costs> costsOf(const std::string &chip) {
#define FUSION_CHIP(name, copy, weight, link, tflops, launch, wait, dispatchGemm, gemmCombine)     \
  if (chip == name)                                                                                \
    return Costs{copy, weight, link, tflops, launch, wait, dispatchGemm, gemmCombine};
#include "epic/runtime/FusionCosts.def"
  return std::nullopt;
}

/// The configuration's counts, at its token cap (the size the kernels are
/// built for).
struct Shape {
  double ranks = 1, experts = 1, topk = 1, hidden = 0, n = 0, elementBytes = 2;
  double tokens = 0;         ///< max_tokens_per_rank
  double ranksPerDevice = 1; ///< ranks sharing one GPU; 0: all (the virtual world)

  double perDevice() const {
    return ranksPerDevice <= 0 ? ranks : std::clamp(ranksPerDevice, 1.0, ranks);
  }
  /// Expanded rows the GPU's ranks receive.
  double rows() const { return perDevice() * tokens * topk; }
  double localExperts() const { return perDevice() * experts / ranks; }
  /// Rows the GEMM computes: whole 128-row tiles of each expert's expected
  /// tokens x topk x ranks / experts rows.
  double gemmRows() const {
    return localExperts() * std::ceil(tokens * topk * ranks / experts / 128) * 128;
  }
};

/// One prediction, in microseconds on one GPU.
struct Prediction {
  double fusedUs = 0; ///< the fused schedule
  double stepsUs = 0; ///< the two steps it replaces
  std::string why;    ///< what decides, in words
  bool pays() const { return fusedUs < stepsUs; }
  /// "predicted 2.8 us fused vs 6.1 us in two steps: <why>".
  std::string describe() const {
    char head[96];
    std::snprintf(head, sizeof head, "predicted %.1f us fused vs %.1f us in two steps: ", fusedUs,
                  stepsUs);
    return head + why;
  }
};

namespace detail {
inline double microseconds(double bytes, double gigabytesPerSecond) {
  return bytes / (gigabytesPerSecond * 1e3);
}

/// The grouped GEMM alone: its FLOPs at the dense rate or its weights at HBM
/// read bandwidth, whichever is slower.
inline double gemmUs(const Costs &c, const Shape &s) {
  const double flops = 2 * s.gemmRows() * s.hidden * s.n;
  const double weightBytes = s.localExperts() * s.hidden * s.n * s.elementBytes;
  return std::max(flops / (c.gemmTflops * 1e6), microseconds(weightBytes, c.weightGBps));
}

/// Both fusions hide one transfer (`what`) under the GEMM: in two steps the
/// transfer, a kernel boundary and the GEMM run one after the other; fused,
/// the slower of the transfer and the fused kernel's GEMM, plus a flag round
/// trip.
inline Prediction overlap(const Costs &c, const char *what, double transferUs, double gemm,
                          double slowdown) {
  const double fusedGemm = slowdown * gemm;
  Prediction p;
  p.stepsUs = transferUs + c.launchUs + gemm;
  p.fusedUs = std::max(transferUs, fusedGemm) + c.waitUs;
  char text[320];
  if (p.pays())
    std::snprintf(text, sizeof text,
                  "the %s (%.1f us) and a kernel boundary (%.1f us) hide under the GEMM (%.1f us, "
                  "x%.2f in the fused kernel)",
                  what, transferUs, c.launchUs, gemm, slowdown);
  else
    std::snprintf(text, sizeof text,
                  "the fused kernel's GEMM runs x%.2f slower (%.1f -> %.1f us), more than the %s "
                  "(%.1f us) and the kernel boundary (%.1f us) it hides",
                  slowdown, gemm, fusedGemm, what, transferUs, c.launchUs);
  p.why = text;
  return p;
}
} // namespace detail

/// ep.dispatch -> ep.grouped_gemm: the copy of the received rows into the
/// expert layout, then the GEMM; or one kernel whose GEMM tiles start as
/// their rows land (the send before both is the same and not counted).
inline Prediction predictDispatchGemm(const Costs &c, const Shape &s) {
  const double copy = detail::microseconds(s.rows() * s.hidden * s.elementBytes, c.copyGBps);
  return detail::overlap(c, "copy", copy, detail::gemmUs(c, s), c.dispatchGemmSlowdown);
}

/// ep.grouped_gemm -> ep.combine: the GEMM, then the combine's send; or one
/// kernel that sends tokens as their rows are computed (the reduce after both
/// is the same and not counted). The send's bf16 rows bound for a rank of
/// this GPU stay in its memory, the others cross NVLink.
inline Prediction predictGemmCombine(const Costs &c, const Shape &s) {
  const double remote = (s.ranks - s.perDevice()) / s.ranks;
  const double bytes = s.rows() * s.hidden * 2;
  const double send = remote * detail::microseconds(bytes, c.linkGBps) +
                      (1 - remote) * detail::microseconds(bytes, c.copyGBps);
  return detail::overlap(c, "send", send, detail::gemmUs(c, s), c.gemmCombineSlowdown);
}

} // namespace epic::fusion

#endif // EPIC_RUNTIME_FUSIONCOSTMODEL_H
