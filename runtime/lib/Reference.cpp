//===- Reference.cpp - DeepEP's dispatch/combine semantics on the host ----===//

#include "epic/runtime/Reference.h"

#include "ReferenceChecks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

using namespace epic::runtime;
using namespace epic::runtime::checks;

//===----------------------------------------------------------------------===//
// Elements
//===----------------------------------------------------------------------===//

int epic::runtime::dtypeBytes(const std::string &dtype) {
  if (dtype == "bf16" || dtype == "f16")
    return 2;
  if (dtype == "f32" || dtype == "i32")
    return 4;
  if (dtype == "i64")
    return 8;
  if (dtype == "f8E4M3FN" || dtype == "f8E5M2" || dtype == "i1")
    return 1;
  throw std::invalid_argument("unknown dtype \"" + dtype +
                              "\" (bf16, f16, f32, f8E4M3FN, f8E5M2, i1, i32, i64)");
}

HostTensor::HostTensor(std::string dtype, std::vector<int64_t> shape)
    : dtype(std::move(dtype)), shape(std::move(shape)) {
  int64_t elements = 1;
  for (int64_t d : this->shape) {
    if (d < 0)
      throw std::invalid_argument("a host tensor has no dynamic dimensions");
    elements *= d;
  }
  data.assign(size_t(elements) * dtypeBytes(this->dtype), 0);
}

int64_t HostTensor::rowElements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i)
    n *= shape[i];
  return n;
}

namespace {

/// A small binary float format: bf16 is done with bit tricks, the others here.
struct MiniFormat {
  int exponentBits, mantissaBits, bias;
  double maxFinite;
  bool saturate; ///< FP8: overflow gives the largest finite value, not inf
  bool hasInfinity;
};
constexpr MiniFormat kF16{5, 10, 15, 65504.0, false, true};
constexpr MiniFormat kE4M3FN{4, 3, 7, 448.0, true, false};
constexpr MiniFormat kE5M2{5, 2, 15, 57344.0, true, true};

uint32_t encode(float value, const MiniFormat &f) {
  const int signShift = f.exponentBits + f.mantissaBits;
  const uint32_t sign = std::signbit(value) ? 1u << signShift : 0u;
  const uint32_t maxField = (1u << f.exponentBits) - 1;
  if (std::isnan(value))
    return f.hasInfinity ? (maxField << f.mantissaBits) | (1u << (f.mantissaBits - 1))
                         : sign | (maxField << f.mantissaBits) | ((1u << f.mantissaBits) - 1);
  double a = std::fabs(double(value));
  if (a == 0)
    return sign;
  const int emin = 1 - f.bias;
  int e;
  std::frexp(a, &e);
  int exponent = std::max(e - 1, emin);
  double quantum = std::ldexp(1.0, exponent - f.mantissaBits);
  double rounded = std::nearbyint(a / quantum) * quantum; // ties to even
  if (rounded > f.maxFinite) {
    if (f.saturate || !f.hasInfinity)
      rounded = f.maxFinite;
    else
      return sign | (maxField << f.mantissaBits);
  }
  std::frexp(rounded, &e);
  exponent = e - 1;
  if (exponent < emin)
    return sign | uint32_t(rounded / std::ldexp(1.0, emin - f.mantissaBits));
  uint32_t mantissa =
      uint32_t(rounded / std::ldexp(1.0, exponent - f.mantissaBits)) - (1u << f.mantissaBits);
  return sign | (uint32_t(exponent + f.bias) << f.mantissaBits) | mantissa;
}

float decode(uint32_t bits, const MiniFormat &f) {
  const int signShift = f.exponentBits + f.mantissaBits;
  const uint32_t maxField = (1u << f.exponentBits) - 1;
  uint32_t field = (bits >> f.mantissaBits) & maxField;
  uint32_t mantissa = bits & ((1u << f.mantissaBits) - 1);
  double sign = (bits >> signShift) & 1 ? -1.0 : 1.0;
  if (f.hasInfinity && field == maxField)
    return mantissa ? NAN : float(sign * INFINITY);
  if (!f.hasInfinity && field == maxField && mantissa == (1u << f.mantissaBits) - 1)
    return NAN;
  if (field == 0)
    return float(sign * std::ldexp(double(mantissa), 1 - f.bias - f.mantissaBits));
  return float(sign * std::ldexp(double(mantissa + (1u << f.mantissaBits)),
                                 int(field) - f.bias - f.mantissaBits));
}

} // namespace

uint16_t epic::runtime::floatToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if (std::isnan(value))
    return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
float epic::runtime::bf16ToFloat(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t epic::runtime::floatToF16(float v) { return uint16_t(encode(v, kF16)); }
float epic::runtime::f16ToFloat(uint16_t b) { return decode(b, kF16); }
uint8_t epic::runtime::floatToF8E4M3FN(float v) { return uint8_t(encode(v, kE4M3FN)); }
float epic::runtime::f8E4M3FNToFloat(uint8_t b) { return decode(b, kE4M3FN); }
uint8_t epic::runtime::floatToF8E5M2(float v) { return uint8_t(encode(v, kE5M2)); }
float epic::runtime::f8E5M2ToFloat(uint8_t b) { return decode(b, kE5M2); }

void epic::runtime::storeElement(const std::string &dtype, double value, uint8_t *out) {
  if (dtype == "bf16") {
    uint16_t b = floatToBf16(float(value));
    std::memcpy(out, &b, 2);
  } else if (dtype == "f16") {
    uint16_t b = floatToF16(float(value));
    std::memcpy(out, &b, 2);
  } else if (dtype == "f32") {
    float f = float(value);
    std::memcpy(out, &f, 4);
  } else if (dtype == "f8E4M3FN") {
    *out = floatToF8E4M3FN(float(value));
  } else if (dtype == "f8E5M2") {
    *out = floatToF8E5M2(float(value));
  } else if (dtype == "i32") {
    int32_t i = int32_t(value);
    std::memcpy(out, &i, 4);
  } else if (dtype == "i64") {
    int64_t i = int64_t(value);
    std::memcpy(out, &i, 8);
  } else {
    dtypeBytes(dtype); // throws for unknown dtypes
  }
}

double HostTensor::at(int64_t i) const {
  const uint8_t *p = data.data() + size_t(i) * dtypeBytes(dtype);
  if (dtype == "bf16" || dtype == "f16") {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return dtype == "bf16" ? bf16ToFloat(b) : f16ToFloat(b);
  }
  if (dtype == "f32") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dtype == "f8E4M3FN")
    return f8E4M3FNToFloat(*p);
  if (dtype == "f8E5M2")
    return f8E5M2ToFloat(*p);
  if (dtype == "i1") // a byte, 0 or 1
    return *p;
  if (dtype == "i32") {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return double(v);
}

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

namespace {

int64_t topk(const DispatchRecord &r, int64_t t, int64_t j, int64_t K) {
  return r.topkIdx.as<int64_t>()[t * K + j];
}

bool rowsEqual(const HostTensor &a, int64_t i, const HostTensor &b, int64_t j) {
  return a.rowBytes() == b.rowBytes() && std::memcmp(a.row(i), b.row(j), a.rowBytes()) == 0;
}

/// Expert starts of a destination: plain and expanded share the aligned counts.
std::vector<int64_t> expertStarts(const World &w, const std::vector<int64_t> &counts) {
  std::vector<int64_t> starts(w.L, 0);
  for (int64_t e = 1; e < w.L; ++e)
    starts[e] = starts[e - 1] + w.align(counts[e - 1]);
  return starts;
}

std::string token(int64_t t, int64_t s) {
  return "token " + std::to_string(t) + " of rank " + std::to_string(s);
}

/// Receive order: the scale-up peer group of a source (direct: the source rank; hybrid: its
/// forwarder index lsa(src)) and the sort key of a source id inside the world.
struct Groups {
  int64_t M, count, Tmax;
  bool hybrid;
  Groups(const EPSpec &spec, const NodeLayout &topology)
      : M(topology.lsaSize(spec.ranks)), count(topology.hybrid ? M : spec.ranks),
        Tmax(spec.maxTokensPerRank), hybrid(topology.hybrid) {
    topology.validate(spec.ranks);
  }
  int64_t of(int64_t source) const { return hybrid ? source % M : source; }
  std::pair<int64_t, int64_t> key(int64_t gid) const { return {of(gid / Tmax), gid}; }
};

/// Hybrid metadata column 1 (`m[1]`) of row `i` at receiver `d`: `item·K + master` with
/// item / Tmax = node(src); one item per (forwarder, token), one token per (forwarder, item).
void checkHybridColumn1(
    Problems &p, const World &w, const Groups &groups, int64_t d, int64_t i, const int32_t *m,
    int64_t master, std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, std::string>> &itemOf,
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, std::string>> &tokenOf) {
  const int64_t gid = m[0], s = gid / w.Tmax, t = gid % w.Tmax, M = groups.M;
  const std::string here = where(d, "recv_src_metadata", i);
  const int64_t item = m[1] / w.K;
  if (m[1] < 0 || m[1] % w.K != master || item / w.Tmax != s / M) {
    p.add(here + "[1] is " + std::to_string(m[1]) + ", expected item x K + " +
          std::to_string(master) + " (the highest slot here) with item / Tmax = " +
          std::to_string(s / M) + " (hybrid: item = node(src) x Tmax + slot at the forwarder)");
    return;
  }
  const int64_t forwarder = d / M * M + s % M;
  const std::string at = " at forwarder " + std::to_string(forwarder);
  auto [byToken, freshToken] = itemOf.try_emplace({forwarder, gid}, item, here);
  if (!freshToken && byToken->second.first != item)
    p.add(here + ": " + token(t, s) + " has item " + std::to_string(item) + at + ", but " +
          std::to_string(byToken->second.first) + " in " + byToken->second.second +
          " (a forwarder gives a token one item, the same at every receiver of its node)");
  auto [byItem, freshItem] = tokenOf.try_emplace({forwarder, item}, gid, here);
  if (!freshItem && byItem->second.first != gid)
    p.add(here + ": " + token(t, s) + " shares item " + std::to_string(item) + at + " with " +
          token(byItem->second.first % w.Tmax, byItem->second.first / w.Tmax) + " in " +
          byItem->second.second);
}

} // namespace

void NodeLayout::validate(int ranks) const {
  const std::string m = std::to_string(lsaSize(ranks)), r = std::to_string(ranks);
  if (gpusPerNode < 0)
    throw std::invalid_argument("gpus_per_node: expected >= 0 (0: one node), got " + m);
  if (ranks < 1 || ranks % lsaSize(ranks))
    throw std::invalid_argument("gpus_per_node: " + m + " does not divide the " + r +
                                " ranks (the world is N nodes of gpus_per_node ranks each)");
  const int nodes = ranks / lsaSize(ranks);
  if (!hybrid)
    return;
  if (nodes < 2)
    throw std::invalid_argument("hybrid: needs more than one node, but gpus_per_node (" + m +
                                ") == number of ranks (" + r + "); use direct mode");
  if (nodes > 32)
    throw std::invalid_argument("hybrid: at most 32 nodes, got " + std::to_string(nodes));
  if (lsaSize(ranks) > 64)
    throw std::invalid_argument("gpus_per_node: hybrid allows at most 64 GPUs per node, got " + m);
}

std::vector<std::string> epic::runtime::checkDispatch(const EPSpec &spec, bool weights,
                                                      bool zeroPadding,
                                                      const std::vector<DispatchRecord> &ranks,
                                                      const NodeLayout &topology, size_t limit) {
  Problems p{limit};
  const World w(spec);
  const Groups groups(spec, topology);
  // Hybrid: per (forwarder, source id) the item first seen, and per (forwarder, item) the
  // source id, each with where it was seen.
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, std::string>> itemOf, tokenOf;
  if (int64_t(ranks.size()) != w.R) {
    p.add("expected one record per rank (" + std::to_string(w.R) + "), got " +
          std::to_string(ranks.size()));
    return p.result();
  }
  for (int64_t d = 0; d < w.R; ++d) {
    const DispatchRecord &out = ranks[d];
    auto owns = [&](int64_t e) { return e >= 0 && e / w.L == d; };
    // What rank d must receive.
    int64_t expected = 0;
    std::vector<int64_t> counts(w.L, 0), perSource(groups.count, 0);
    for (int64_t s = 0; s < w.R; ++s)
      for (int64_t t = 0; t < ranks[s].topkIdx.rows(); ++t) {
        bool here = false;
        for (int64_t j = 0; j < w.K; ++j) {
          int64_t e = topk(ranks[s], t, j, w.K);
          if (owns(e)) {
            here = true;
            counts[e % w.L]++;
          }
        }
        expected += here, perSource[groups.of(s)] += here;
      }
    const std::string rank = "rank " + std::to_string(d) + ": ";
    if (out.hostCounts.size() != size_t(1 + w.L) || out.hostCounts[0] != expected) {
      p.add(rank + "received " +
            (out.hostCounts.empty() ? std::string("?") : std::to_string(out.hostCounts[0])) +
            " tokens, expected " + std::to_string(expected));
      continue;
    }
    std::vector<int64_t> starts = expertStarts(w, counts);
    int64_t psum = 0;
    for (int64_t e = 0; e < w.L; ++e) {
      int64_t aligned = w.align(counts[e]);
      psum += aligned;
      if (out.hostCounts[1 + e] != aligned)
        p.add(rank + "host count of local expert " + std::to_string(e) + " is " +
              std::to_string(out.hostCounts[1 + e]) + ", expected " + std::to_string(aligned));
      if (out.numRecvPerExpert.at(e) != counts[e])
        p.add(rank + "num_recv_tokens_per_expert[" + std::to_string(e) + "] is " +
              std::to_string(out.numRecvPerExpert[e]) + ", expected " + std::to_string(counts[e]));
      int64_t want = spec.expanded ? starts[e] + counts[e] : psum;
      if (out.psumRecvPerExpert.at(e) != want)
        p.add(rank + "psum_num_recv_tokens_per_expert[" + std::to_string(e) + "] is " +
              std::to_string(out.psumRecvPerExpert[e]) + ", expected " + std::to_string(want));
    }
    std::vector<int64_t> sourceEnd(groups.count);
    for (int64_t s = 0, sum = 0; s < groups.count; ++s) {
      sum += perSource[s];
      sourceEnd[s] = sum;
      if (s >= int64_t(out.psumRank.size()) || out.psumRank[s] != sum)
        p.add(rank + "psum_num_recv_tokens_per_rank[" + std::to_string(s) + "] is " +
              (s < int64_t(out.psumRank.size()) ? std::to_string(out.psumRank[s]) : "missing") +
              ", expected " + std::to_string(sum) +
              (groups.hybrid ? " (hybrid: rows per forwarder index)" : ""));
    }
    if (int64_t(out.psumRank.size()) > groups.count)
      p.add(rank + "psum_num_recv_tokens_per_rank has " + std::to_string(out.psumRank.size()) +
            " entries, expected " + std::to_string(groups.count));
    if (out.meta.size() < size_t(expected * (w.K + 2))) {
      p.add(rank + "recv_src_metadata has fewer rows than received tokens");
      continue;
    }
    std::vector<char> seen(size_t(w.R * w.Tmax), 0);
    std::vector<char> used(size_t(out.recvX.rows()), 0);
    for (int64_t i = 0; i < expected; ++i) {
      const int32_t *m = &out.meta[size_t(i * (w.K + 2))];
      int64_t gid = m[0], s = gid / w.Tmax, t = gid % w.Tmax;
      if (gid < 0 || s >= w.R || t >= ranks[s].topkIdx.rows()) {
        p.add(where(d, "recv_src_metadata", i) + " names source id " + std::to_string(gid) +
              ", which is no token");
        continue;
      }
      if (seen[gid]++) {
        p.add(where(d, "recv_src_metadata", i) + ": token " + std::to_string(t) + " of rank " +
              std::to_string(s) + " arrived twice");
        continue;
      }
      int64_t master = -1;
      for (int64_t j = 0; j < w.K; ++j)
        if (owns(topk(ranks[s], t, j, w.K)))
          master = j;
      if (master < 0) {
        p.add(where(d, "recv_src_metadata", i) + ": token " + std::to_string(t) + " of rank " +
              std::to_string(s) + " has no expert here");
        continue;
      }
      const int64_t g = groups.of(s);
      const bool inGroup = i >= (g ? sourceEnd[g - 1] : 0) && i < sourceEnd[g];
      if (!groups.hybrid) {
        if (m[1] != s * w.K + master)
          p.add(where(d, "recv_src_metadata", i) + "[1] is " + std::to_string(m[1]) +
                ", expected " + std::to_string(s * w.K + master) +
                " (source rank x K + master slot)");
      } else {
        checkHybridColumn1(p, w, groups, d, i, m, master, itemOf, tokenOf);
        if (!inGroup)
          p.add(where(d, "recv_src_metadata", i) + ": " + token(t, s) + " (forwarder index " +
                std::to_string(g) + ") lies outside that forwarder's rows");
      }
      const DispatchRecord &src = ranks[s];
      if (!spec.expanded) {
        if (!groups.hybrid && !inGroup)
          p.add(where(d, "recv_x", i) + " holds a token of rank " + std::to_string(s) +
                " outside that rank's group");
        if (!rowsEqual(out.recvX, i, src.x, t))
          p.add(where(d, "recv_x", i) + " differs from token " + std::to_string(t) + " of rank " +
                std::to_string(s));
        if (spec.isFP8() && !rowsEqual(out.recvScalePacks, i, src.scalePacks, t))
          p.add(where(d, "recv_x_scale_packs", i) + " differs from the source's");
        for (int64_t j = 0; j < w.K; ++j) {
          int64_t e = topk(src, t, j, w.K);
          int64_t want = owns(e) ? e % w.L : -1;
          int64_t got = out.recvTopkIdx.as<int64_t>()[i * w.K + j];
          if (got != want) {
            p.add(where(d, "recv_topk_idx", i) + "[" + std::to_string(j) + "] is " +
                  std::to_string(got) + ", expected " + std::to_string(want));
            break;
          }
        }
        if (weights && !rowsEqual(out.recvTopkWeights, i, src.topkWeights, t))
          p.add(where(d, "recv_topk_weights", i) + " differs from the source's weights");
        continue;
      }
      for (int64_t j = 0; j < w.K; ++j) {
        int64_t e = topk(src, t, j, w.K), row = m[2 + j];
        if (!owns(e)) {
          if (row != -1)
            p.add(where(d, "recv_src_metadata", i) + "[" + std::to_string(2 + j) +
                  "] should be -1 (slot " + std::to_string(j) + " is not here), got " +
                  std::to_string(row));
          continue;
        }
        int64_t local = e % w.L;
        if (row < starts[local] || row >= starts[local] + counts[local] ||
            row >= out.recvX.rows()) {
          p.add(where(d, "recv_src_metadata", i) + "[" + std::to_string(2 + j) +
                "] = " + std::to_string(row) + " is outside local expert " + std::to_string(local) +
                "'s rows [" + std::to_string(starts[local]) + ", " +
                std::to_string(starts[local] + counts[local]) + ")");
          continue;
        }
        if (used[row]++) {
          p.add(where(d, "recv_x", row) + " is used by two (token, expert) pairs");
          continue;
        }
        if (!rowsEqual(out.recvX, row, src.x, t))
          p.add(where(d, "recv_x", row) + " differs from token " + std::to_string(t) + " of rank " +
                std::to_string(s));
        if (spec.isFP8() && !rowsEqual(out.recvScalePacks, row, src.scalePacks, t))
          p.add(where(d, "recv_x_scale_packs", row) + " differs from the source's");
        if (weights && std::memcmp(out.recvTopkWeights.as<float>() + row,
                                   src.topkWeights.as<float>() + t * w.K + j, 4) != 0)
          p.add(where(d, "recv_topk_weights", row) + " is not slot " + std::to_string(j) +
                "'s weight");
      }
    }
    if (spec.expanded && zeroPadding)
      for (int64_t e = 0; e < w.L; ++e)
        for (int64_t row = starts[e] + counts[e];
             row < starts[e] + w.align(counts[e]) && row < out.recvX.rows(); ++row) {
          bool zero = rowIsZero(out.recvX, row) &&
                      (!spec.isFP8() || rowIsZero(out.recvScalePacks, row)) &&
                      (!weights || out.recvTopkWeights.as<float>()[row] == 0.f);
          if (!zero)
            p.add(where(d, "recv_x", row) + " is padding of local expert " + std::to_string(e) +
                  " but not zero (zero_padding)");
        }
  }
  return p.result();
}

std::vector<std::string> epic::runtime::checkCombine(const EPSpec &spec,
                                                     const std::vector<DispatchRecord> &handles,
                                                     const std::vector<CombineRecord> &ranks,
                                                     const NodeLayout &topology, size_t limit) {
  Problems p{limit};
  const World w(spec);
  const Groups groups(spec, topology);
  const int64_t H = spec.hidden;
  if (int64_t(handles.size()) != w.R || int64_t(ranks.size()) != w.R) {
    p.add("expected one handle and one combine record per rank (" + std::to_string(w.R) + ")");
    return p.result();
  }
  // Destination d: source id -> its metadata row.
  std::vector<std::unordered_map<int64_t, int64_t>> rowOf(w.R);
  for (int64_t d = 0; d < w.R; ++d)
    for (int64_t i = 0; i < handles[d].hostCounts.at(0); ++i)
      rowOf[d][handles[d].meta[size_t(i * (w.K + 2))]] = i;

  std::vector<float> acc(H), stage(H);
  std::vector<std::vector<float>> rankRows; // stage 1 of each rank in `order`
  for (int64_t s = 0; s < w.R; ++s) {
    const DispatchRecord &src = handles[s];
    const CombineRecord &out = ranks[s];
    const bool withWeights = !out.combinedTopkWeights.dtype.empty();
    for (int64_t t = 0; t < src.topkIdx.rows(); ++t) {
      // Destination ranks in increasing order of their master (highest) slot.
      std::vector<std::pair<int64_t, int64_t>> order; // (master slot, rank)
      for (int64_t j = 0; j < w.K; ++j) {
        int64_t e = topk(src, t, j, w.K);
        if (e < 0)
          continue;
        auto it =
            std::find_if(order.begin(), order.end(), [&](auto &o) { return o.second == e / w.L; });
        if (it == order.end())
          order.push_back({j, e / w.L});
        else
          it->first = j;
      }
      std::sort(order.begin(), order.end());
      std::fill(acc.begin(), acc.end(), 0.f);
      for (const HostTensor &bias : out.biases)
        for (int64_t h = 0; h < H; ++h)
          acc[h] += bf16ToFloat(bias.as<uint16_t>()[t * H + h]);
      bool found = true;
      rankRows.assign(order.size(), std::vector<float>(size_t(H), 0.f));
      for (size_t k = 0; k < order.size(); ++k) {
        auto [master, d] = order[k];
        std::vector<float> &row = rankRows[k];
        auto it = rowOf[d].find(s * w.Tmax + t);
        if (it == rowOf[d].end()) {
          found = p.add("rank " + std::to_string(d) + " has no row for token " + std::to_string(t) +
                        " of rank " + std::to_string(s));
          break;
        }
        const int32_t *m = &handles[d].meta[size_t(it->second * (w.K + 2))];
        const uint16_t *y = ranks[d].x.as<uint16_t>();
        if (!spec.expanded) {
          for (int64_t h = 0; h < H; ++h)
            row[h] = bf16ToFloat(y[it->second * H + h]);
          continue;
        }
        // Stage 1: the destination sums its rows of the token in slot order.
        std::fill(stage.begin(), stage.end(), 0.f);
        for (int64_t j = 0; j < w.K; ++j) {
          int64_t e = topk(src, t, j, w.K);
          if (e >= 0 && e / w.L == d)
            for (int64_t h = 0; h < H; ++h)
              stage[h] += bf16ToFloat(y[int64_t(m[2 + j]) * H + h]);
        }
        for (int64_t h = 0; h < H; ++h)
          row[h] = bf16ToFloat(floatToBf16(stage[h]));
      }
      if (!found)
        continue;
      if (!groups.hybrid) { // the ranks in increasing master slot
        for (const std::vector<float> &row : rankRows)
          for (int64_t h = 0; h < H; ++h)
            acc[h] += row[h];
      } else {
        // Per node at the forwarder: its ranks in increasing master slot from +0, rounded
        // once; at the origin the nodes in increasing node master (their highest slot).
        std::vector<std::pair<int64_t, int64_t>> nodes; // (node master, node)
        for (auto [master, d] : order) {
          auto it = std::find_if(nodes.begin(), nodes.end(),
                                 [&](auto &n) { return n.second == d / groups.M; });
          if (it == nodes.end())
            nodes.push_back({master, d / groups.M});
          else
            it->first = std::max(it->first, master);
        }
        std::sort(nodes.begin(), nodes.end());
        for (auto [nodeMaster, node] : nodes) {
          std::fill(stage.begin(), stage.end(), 0.f);
          for (size_t k = 0; k < order.size(); ++k)
            if (order[k].second / groups.M == node)
              for (int64_t h = 0; h < H; ++h)
                stage[h] += rankRows[k][h];
          for (int64_t h = 0; h < H; ++h)
            acc[h] += bf16ToFloat(floatToBf16(stage[h]));
        }
      }
      const uint16_t *got = out.combinedX.as<uint16_t>() + t * H;
      for (int64_t h = 0; h < H; ++h)
        if (got[h] != floatToBf16(acc[h])) {
          p.add(where(s, "combined_x", t) + "[" + std::to_string(h) + "] is " +
                std::to_string(bf16ToFloat(got[h])) + ", expected " +
                std::to_string(bf16ToFloat(floatToBf16(acc[h]))) + " (fp32 sum in DeepEP's " +
                (groups.hybrid ? "hybrid order: per node, then nodes)" : "order)"));
          break;
        }
      if (!withWeights)
        continue;
      for (int64_t j = 0; j < w.K; ++j) {
        int64_t e = topk(src, t, j, w.K);
        float want = 0.f;
        if (e >= 0) {
          int64_t d = e / w.L, i = rowOf[d].at(s * w.Tmax + t);
          const float *rw = ranks[d].topkWeights.as<float>();
          want =
              spec.expanded ? rw[handles[d].meta[size_t(i * (w.K + 2) + 2 + j)]] : rw[i * w.K + j];
        }
        float got = out.combinedTopkWeights.as<float>()[t * w.K + j];
        if (std::memcmp(&got, &want, 4) != 0) {
          p.add(where(s, "combined_topk_weights", t) + "[" + std::to_string(j) + "] is " +
                std::to_string(got) + ", expected " + std::to_string(want));
          break;
        }
      }
    }
  }
  return p.result();
}

std::vector<int64_t> epic::runtime::canonicalRows(const EPSpec &spec, const DispatchRecord &record,
                                                  const NodeLayout &topology) {
  const World w(spec);
  const Groups groups(spec, topology);
  const int64_t n = record.hostCounts.empty() ? 0 : record.hostCounts[0];
  auto gid = [&](int64_t i) { return record.meta[size_t(i * (w.K + 2))]; };
  std::vector<int64_t> rows;
  if (!spec.expanded) {
    rows.resize(size_t(n));
    std::iota(rows.begin(), rows.end(), 0);
    std::sort(rows.begin(), rows.end(),
              [&](int64_t a, int64_t b) { return groups.key(gid(a)) < groups.key(gid(b)); });
    return rows;
  }
  // Expanded: each used row's source id, then every expert block in order.
  // The handle's counts size the blocks (the record may hold no rows).
  int64_t rowsTotal = 0;
  for (size_t e = 1; e < record.hostCounts.size(); ++e)
    rowsTotal += record.hostCounts[e];
  std::vector<int64_t> owner(size_t(rowsTotal), -1);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w.K; ++j) {
      int64_t row = record.meta[size_t(i * (w.K + 2) + 2 + j)];
      if (row >= 0 && row < int64_t(owner.size()))
        owner[row] = gid(i);
    }
  int64_t start = 0;
  for (int64_t e = 0; e < w.L; ++e) {
    int64_t count = record.numRecvPerExpert.at(e);
    std::vector<int64_t> block;
    for (int64_t row = start; row < start + count && row < int64_t(owner.size()); ++row)
      block.push_back(row);
    std::sort(block.begin(), block.end(),
              [&](int64_t a, int64_t b) { return groups.key(owner[a]) < groups.key(owner[b]); });
    rows.insert(rows.end(), block.begin(), block.end());
    start += w.align(count);
  }
  return rows;
}

std::vector<int64_t> epic::runtime::expectedNetworkBytes(const std::vector<HostTensor> &topkIdx,
                                                         int experts, const NodeLayout &topology,
                                                         int64_t recordBytes) {
  const int64_t R = int64_t(topkIdx.size());
  if (R < 1)
    throw std::invalid_argument("topk_idx: expected one routing tensor per rank, got none");
  if (experts < 1 || experts % R)
    throw std::invalid_argument("experts: " + std::to_string(experts) +
                                " is not a positive multiple of the " + std::to_string(R) +
                                " ranks");
  if (recordBytes < 1)
    throw std::invalid_argument("record_bytes: expected >= 1, got " + std::to_string(recordBytes));
  topology.validate(int(R));
  const int64_t M = topology.lsaSize(int(R)), L = experts / R;
  std::vector<int64_t> bytes(size_t(R * R), 0);
  for (int64_t s = 0; s < R; ++s) {
    const HostTensor &idx = topkIdx[size_t(s)];
    if (idx.shape.size() != 2)
      throw std::invalid_argument("topk_idx[" + std::to_string(s) + "]: expected [T, K]");
    const int64_t K = idx.shape[1];
    for (int64_t t = 0; t < idx.rows(); ++t) {
      std::vector<bool> hit(size_t(R), false); // remote ranks (direct) or rail peers (hybrid)
      for (int64_t j = 0; j < K; ++j) {
        const double e = idx.at(t * K + j);
        if (e < 0)
          continue;
        if (e >= experts)
          throw std::invalid_argument("topk_idx[" + std::to_string(s) + "]: expert id " +
                                      std::to_string(int64_t(e)) + " out of range");
        const int64_t d = int64_t(e) / L;
        if (d / M != s / M)
          hit[size_t(topology.hybrid ? d / M * M + s % M : d)] = true;
      }
      for (int64_t d = 0; d < R; ++d)
        bytes[size_t(s * R + d)] += hit[size_t(d)] ? recordBytes : 0;
    }
  }
  return bytes;
}

std::vector<std::string> epic::runtime::checkDispatchLayout(const EPSpec &spec,
                                                            const std::vector<LayoutRecord> &ranks,
                                                            size_t limit) {
  Problems p{limit};
  const World w(spec);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const LayoutRecord &rec = ranks[r];
    const int64_t T = rec.topkIdx.rows();
    std::vector<int32_t> perRank(size_t(w.R), 0), perExpert(size_t(w.E), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<bool> in(size_t(w.R), false);
      for (int64_t j = 0; j < w.K; ++j) {
        int64_t e = int64_t(rec.topkIdx.at(t * w.K + j));
        if (e < 0 || e >= w.E)
          continue;
        ++perExpert[size_t(e)];
        in[size_t(e / w.L)] = true;
      }
      for (int64_t d = 0; d < w.R; ++d) {
        perRank[size_t(d)] += in[size_t(d)];
        if ((rec.inRank.at(t * w.R + d) != 0) != in[size_t(d)])
          p.add("rank " + std::to_string(r) + ": is_token_in_rank[" + std::to_string(t) + ", " +
                std::to_string(d) + "] is " + (in[size_t(d)] ? "false" : "true") + ", expected " +
                (in[size_t(d)] ? "true" : "false"));
      }
    }
    auto compare = [&](const char *name, const std::vector<int32_t> &got,
                       const std::vector<int32_t> &want) {
      for (size_t i = 0; i < want.size(); ++i)
        if (i >= got.size() || got[i] != want[i])
          p.add(where(int64_t(r), name, int64_t(i)) + " is " +
                (i < got.size() ? std::to_string(got[i]) : std::string("missing")) + ", expected " +
                std::to_string(want[i]));
    };
    compare("num_tokens_per_rank", rec.perRank, perRank);
    compare("num_tokens_per_expert", rec.perExpert, perExpert);
  }
  return p.result();
}
