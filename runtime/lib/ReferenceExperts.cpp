//===- ReferenceExperts.cpp - the expert MLP's steps checked on the host ---===//
//
// epic-run's checks of the steps between a dispatch and its combine (Reference.h):
// the grouped GEMM against a float64 product of its (dequantized) operands, the
// SwiGLU against a float64 activation and, for FP8 results, DeepSeek's block
// quantization of it. Only the experts' rows are the ops': padding rows must stay
// as the program allocated them (zero).
//
//===----------------------------------------------------------------------===//

#include "ReferenceChecks.h"

#include <cmath>

using namespace epic::runtime;
using namespace epic::runtime::checks;

namespace {

/// Decoded once (HostTensor::at reads one element of any dtype: too slow for a GEMM).
std::vector<double> decode(const HostTensor &t) {
  std::vector<double> values(t.data.size() / size_t(dtypeBytes(t.dtype)));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = t.at(int64_t(i));
  return values;
}

/// Rows [start, end) of each local expert e (the expanded layout's), in a callback.
template <typename F> void forEachExpertRow(const World &w, const DispatchRecord &handle, F f) {
  int64_t end = 0;
  for (int64_t e = 0; e < w.L; ++e) {
    const int64_t start = w.align(end);
    end = handle.psumRecvPerExpert.at(size_t(e));
    for (int64_t row = start; row < end; ++row)
      f(e, row);
  }
}

} // namespace

std::vector<std::string> epic::runtime::checkGroupedGemm(const EPSpec &spec,
                                                         const std::vector<DispatchRecord> &handles,
                                                         const std::vector<GemmRecord> &ranks,
                                                         size_t limit) {
  Problems p{limit};
  const World w(spec);
  if (handles.size() != ranks.size()) {
    p.add("expected one handle per grouped GEMM record");
    return p.result();
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    const GemmRecord &g = ranks[r];
    const bool fp8 = !g.xScales.data.empty();
    // K: the rows' width.
    const int64_t K = g.x.shape.at(1), N = g.weights.shape.at(gemmWeightsLayout(fp8).n);
    std::vector<double> x = decode(g.x), weights = decode(g.weights);
    if (fp8) { // dequantized: rows per 128 channels, weights per 128 x 128 block
      const std::vector<double> xs = decode(g.xScales), ws = decode(g.weightScales);
      const int64_t blocks = K / 128;
      for (size_t i = 0; i < x.size(); ++i)
        x[i] *= xs[(i / size_t(K)) * size_t(blocks) + (i % size_t(K)) / 128];
      // [L, N, K] -> [L, K, N] (the loop below reads weights K-major per expert)
      std::vector<double> kn(weights.size());
      for (int64_t e = 0; e < w.L; ++e)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            kn[size_t((e * K + k) * N + n)] =
                weights[size_t((e * N + n) * K + k)] *
                ws[size_t((e * (N / 128) + n / 128) * blocks + k / 128)];
      weights = std::move(kn);
    }
    std::vector<bool> expertRow(size_t(g.out.rows()), false);
    std::vector<double> want(static_cast<size_t>(N), 0.0), magnitude(static_cast<size_t>(N), 0.0);
    // Hopper's FP8 wgmma adds its products in an accumulator narrower than fp32 (the kernel
    // promotes it to fp32 every 128 channels), so an FP8 result carries an error proportional
    // to the sum of its products' magnitudes, not to the (possibly cancelled) result.
    const double fp8Accumulation = fp8 ? 2e-3 : 0.0;
    int64_t end = 0;
    for (int64_t e = 0; e < w.L; ++e) {
      // Expert e's rows: [align(psum[e - 1]), psum[e]) of the expanded layout.
      const int64_t start = w.align(end);
      end = handles[r].psumRecvPerExpert.at(size_t(e));
      const double *we = weights.data() + size_t(e * K * N);
      for (int64_t row = start; row < end && row < g.out.rows(); ++row) {
        expertRow[size_t(row)] = true;
        std::fill(want.begin(), want.end(), 0.0);
        std::fill(magnitude.begin(), magnitude.end(), 0.0);
        for (int64_t h = 0; h < K; ++h) {
          const double xv = x[size_t(row * K + h)];
          for (int64_t n = 0; n < N; ++n) {
            want[size_t(n)] += xv * we[h * N + n];
            magnitude[size_t(n)] += std::abs(xv * we[h * N + n]);
          }
        }
        for (int64_t n = 0; n < N; ++n) {
          double got = g.out.at(row * N + n);
          // The kernel sums in fp32 in its own order and rounds once to the output type.
          const double tolerance =
              1e-2 + 1.6e-2 * std::abs(want[size_t(n)]) + fp8Accumulation * magnitude[size_t(n)];
          if (!(std::abs(got - want[size_t(n)]) <= tolerance)) {
            p.add(where(int64_t(r), "grouped GEMM out", row) + " column " + std::to_string(n) +
                  " (expert " + std::to_string(e) + ") is " + std::to_string(got) + ", expected " +
                  std::to_string(want[size_t(n)]));
            break;
          }
        }
      }
    }
    for (int64_t row = 0; row < g.out.rows(); ++row)
      if (!expertRow[size_t(row)] && !rowIsZero(g.out, row))
        p.add(where(int64_t(r), "grouped GEMM out", row) + " is a padding row and not zero");
  }
  return p.result();
}

std::vector<std::string> epic::runtime::checkSwiglu(const EPSpec &spec,
                                                    const std::vector<DispatchRecord> &handles,
                                                    const std::vector<SwigluRecord> &ranks,
                                                    size_t limit) {
  Problems p{limit};
  const World w(spec);
  if (handles.size() != ranks.size()) {
    p.add("expected one handle per SwiGLU record");
    return p.result();
  }
  constexpr int64_t block = 128;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const SwigluRecord &s = ranks[r];
    const int64_t I = s.out.shape.at(1), rows = s.out.rows();
    const bool fp8 = s.out.dtype == "f8E4M3FN";
    // The result's rounding (half an ulp) and the kernel's f32 arithmetic, ex2.approx's
    // few ulp included.
    const double rounding = s.out.dtype == "bf16" ? 4e-3 : s.out.dtype == "f16" ? 1e-3 : 2e-6;
    const std::vector<double> in = decode(s.gateUp), out = decode(s.out);
    const std::vector<double> scales = fp8 ? decode(s.scales) : std::vector<double>();
    std::vector<bool> expertRow(size_t(rows), false);
    std::vector<double> y(static_cast<size_t>(I));
    forEachExpertRow(w, handles[r], [&](int64_t e, int64_t row) {
      if (row >= rows)
        return;
      expertRow[size_t(row)] = true;
      const double weight = s.weights.data.empty() ? 1.0 : s.weights.at(row);
      for (int64_t c = 0; c < I; ++c) {
        const double g = in[size_t(row * 2 * I + c)], u = in[size_t(row * 2 * I + I + c)];
        y[size_t(c)] = g / (1.0 + std::exp(-g)) * u * weight;
      }
      const std::string at =
          where(int64_t(r), "swiglu out", row) + " (expert " + std::to_string(e) + ") column ";
      if (!fp8) {
        for (int64_t c = 0; c < I; ++c) {
          const double got = out[size_t(row * I + c)], want = y[size_t(c)];
          if (!(std::abs(got - want) <= rounding * std::abs(want) + 1e-30)) {
            p.add(at + std::to_string(c) + " is " + std::to_string(got) + ", expected " +
                  std::to_string(want));
            return;
          }
        }
        return;
      }
      for (int64_t b = 0; b < I / block; ++b) {
        double amax = 0;
        for (int64_t c = b * block; c < (b + 1) * block; ++c)
          amax = std::max(amax, std::abs(y[size_t(c)]));
        const double want = std::max(amax, 1e-4) / 448.0,
                     scale = scales[size_t(row * (I / block) + b)];
        if (!(std::abs(scale - want) <= 1e-5 * want)) {
          p.add(where(int64_t(r), "swiglu scales", row) + " block " + std::to_string(b) + " is " +
                std::to_string(scale) +
                ", expected max(amax, 1e-4) / 448 = " + std::to_string(want));
          return;
        }
        // The nearest e4m3 of y / scale (the kernel's scale), or a value as near where
        // y / scale sits on a rounding boundary within the kernel's f32 error.
        for (int64_t c = b * block; c < (b + 1) * block; ++c) {
          const double q = y[size_t(c)] / scale, got = out[size_t(row * I + c)];
          const double nearest = f8E4M3FNToFloat(floatToF8E4M3FN(float(q)));
          if (got != nearest &&
              !(std::abs(got - q) <= std::abs(nearest - q) + 1e-5 * std::abs(q))) {
            p.add(at + std::to_string(c) + " is e4m3 " + std::to_string(got) + ", expected " +
                  std::to_string(nearest) + " (y / scale = " + std::to_string(q) + ")");
            return;
          }
        }
      }
    });
    for (int64_t row = 0; row < rows; ++row)
      if (!expertRow[size_t(row)] && (!rowIsZero(s.out, row) || (fp8 && !rowIsZero(s.scales, row))))
        p.add(where(int64_t(r), "swiglu out", row) + " is a padding row and was written");
  }
  return p.result();
}
