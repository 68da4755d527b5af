//===- RunProgramTest.cpp - run plans, inputs and the host reference ------===//
//
// What epic-run does on the host, without a GPU: element conversions, the
// deterministic inputs, the dispatch/combine checkers (they must accept any
// arrival order and catch every wrong byte), run-plan parsing and caching.
//
//===----------------------------------------------------------------------===//

#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/RunProgram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

using namespace epic::runtime;
namespace fs = std::filesystem;

namespace {

bool mentions(const std::vector<std::string> &problems, const std::string &needle) {
  for (const std::string &p : problems)
    if (p.find(needle) != std::string::npos)
      return true;
  return false;
}

// --- Elements ---------------------------------------------------------------------

TEST(Elements, KnownEncodings) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 1.0f / 256), 0x3f80); // tie to even
  EXPECT_EQ(floatToF16(1.0f), 0x3c00);
  EXPECT_EQ(floatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(floatToF16(1e6f), 0x7c00);      // overflow: infinity
  EXPECT_EQ(floatToF16(-0x1p-24f), 0x8001); // smallest subnormal
  EXPECT_EQ(floatToF8E4M3FN(1.0f), 0x38);
  EXPECT_EQ(floatToF8E4M3FN(448.0f), 0x7e);
  EXPECT_EQ(floatToF8E4M3FN(1000.0f), 0x7e); // saturates
  EXPECT_EQ(floatToF8E4M3FN(-0x1p-9f), 0x81);
  EXPECT_EQ(floatToF8E5M2(1.0f), 0x3c);
  EXPECT_EQ(floatToF8E5M2(1e6f), 0x7b); // saturates to 57344
  for (int b = 0; b < 256; ++b) {
    float e4 = f8E4M3FNToFloat(uint8_t(b)), e5 = f8E5M2ToFloat(uint8_t(b));
    if (!std::isnan(e4))
      EXPECT_EQ(floatToF8E4M3FN(e4), b == 0x80 ? 0x80 : b) << b;
    if (!std::isnan(e5) && !std::isinf(e5))
      EXPECT_EQ(floatToF8E5M2(e5), b) << b;
  }
  EXPECT_TRUE(std::isnan(f8E4M3FNToFloat(0x7f)));
  EXPECT_THROW(dtypeBytes("f64"), std::invalid_argument);
}

// --- Inputs -----------------------------------------------------------------------

TEST(Inputs, RoutingIsDeterministicDistinctAndMasked) {
  HostTensor a = randomRouting(64, 0.25, 7, 3, 2000, 8);
  HostTensor b = randomRouting(64, 0.25, 7, 3, 2000, 8);
  EXPECT_EQ(a.data, b.data);
  EXPECT_NE(a.data, randomRouting(64, 0.25, 7, 4, 2000, 8).data); // another rank
  EXPECT_NE(a.data, randomRouting(64, 0.25, 8, 3, 2000, 8).data); // another seed
  int64_t masked = 0;
  std::set<int64_t> used;
  for (int64_t t = 0; t < 2000; ++t) {
    std::set<int64_t> row;
    for (int j = 0; j < 8; ++j) {
      int64_t e = a.as<int64_t>()[t * 8 + j];
      ASSERT_GE(e, -1);
      ASSERT_LT(e, 64);
      if (e < 0) {
        ++masked;
        continue;
      }
      EXPECT_TRUE(row.insert(e).second) << "expert " << e << " twice in row " << t;
      used.insert(e);
    }
  }
  EXPECT_NEAR(double(masked) / 16000, 0.25, 0.02);
  EXPECT_EQ(used.size(), 64u);
  EXPECT_THROW(randomRouting(4, 0, 1, 0, 1, 5), std::invalid_argument);
}

TEST(Inputs, RandomValuesFollowTheirDistribution) {
  HostTensor n = randomTensor("normal", 2.0, 1, 0, 1000, 64, "f32");
  EXPECT_EQ(n.data, randomTensor("normal", 2.0, 1, 0, 1000, 64, "f32").data);
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < 64000; ++i)
    sum += n.at(i), squares += n.at(i) * n.at(i);
  EXPECT_NEAR(sum / 64000, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(squares / 64000), 2.0, 0.05);
  HostTensor u = randomTensor("uniform", 3.0, 1, 0, 100, 10, "bf16");
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_GE(u.at(i), 0.0);
    EXPECT_LE(u.at(i), 3.0);
  }
  HostTensor f8 = randomTensor("normal", 1000.0, 1, 0, 10, 16, "f8E4M3FN");
  for (int64_t i = 0; i < 160; ++i)
    EXPECT_LE(std::fabs(f8.at(i)), 448.0); // saturated, never NaN
  EXPECT_THROW(randomTensor("cauchy", 1, 1, 0, 1, 1, "f32"), std::invalid_argument);
}

// --- The checkers -----------------------------------------------------------------

/// A tiny world whose dispatch outputs are built here in canonical order
/// (sources ascending), the way DeepEP defines them.
struct TinyWorld {
  EPSpec spec;
  std::vector<DispatchRecord> ranks;

  TinyWorld(bool expanded, int alignment = 1) {
    spec.ranks = 2, spec.experts = 4, spec.topk = 2, spec.hidden = 8;
    spec.maxTokensPerRank = 3, spec.expanded = expanded, spec.expertAlignment = alignment;
    const int R = 2, L = 2, K = 2, H = 8, Tmax = 3;
    // Rank 0: 3 tokens, rank 1: 2 tokens. Experts 0,1 on rank 0, 2,3 on rank 1.
    std::vector<std::vector<int64_t>> idx = {{0, 2, 1, -1, 3, 1}, {2, 3, -1, -1}};
    ranks.resize(R);
    for (int s = 0; s < R; ++s) {
      int64_t T = int64_t(idx[s].size()) / K;
      DispatchRecord &r = ranks[s];
      r.topkIdx = HostTensor("i64", {T, K});
      std::copy(idx[s].begin(), idx[s].end(), r.topkIdx.as<int64_t>());
      r.x = HostTensor("bf16", {T, H});
      r.topkWeights = HostTensor("f32", {T, K});
      for (int64_t i = 0; i < T * H; ++i) // small integers: every sum is exact
        r.x.as<uint16_t>()[i] = floatToBf16(float(1 + (s * 7 + i) % 5));
      for (int64_t i = 0; i < T * K; ++i)
        r.topkWeights.as<float>()[i] = 0.5f + float(s * 10 + i);
    }
    for (int d = 0; d < R; ++d) {
      DispatchRecord &out = ranks[d];
      std::vector<std::pair<int, int>> tokens; // canonical: (source, token)
      std::vector<int32_t> perSource(R, 0), counts(L, 0);
      for (int s = 0; s < R; ++s)
        for (int t = 0; t < ranks[s].topkIdx.rows(); ++t) {
          bool here = false;
          for (int j = 0; j < K; ++j) {
            int64_t e = ranks[s].topkIdx.as<int64_t>()[t * K + j];
            if (e >= 0 && e / L == d)
              here = true, counts[e % L]++;
          }
          if (here)
            tokens.push_back({s, t}), perSource[s]++;
        }
      auto align = [&](int n) { return (n + alignment - 1) / alignment * alignment; };
      const int n = int(tokens.size());
      out.hostCounts = {n};
      std::vector<int> starts(L, 0);
      int psum = 0;
      for (int e = 0; e < L; ++e) {
        starts[e] = psum;
        psum += align(counts[e]);
        out.hostCounts.push_back(align(counts[e]));
        out.numRecvPerExpert.push_back(counts[e]);
        out.psumRecvPerExpert.push_back(expanded ? starts[e] + counts[e] : psum);
      }
      for (int s = 0, sum = 0; s < R; ++s)
        out.psumRank.push_back(sum += perSource[s]);
      const int rows = expanded ? psum : n;
      out.recvX = HostTensor("bf16", {rows, H});
      out.recvTopkIdx = HostTensor("i64", {rows, K});
      out.recvTopkWeights = expanded ? HostTensor("f32", {rows}) : HostTensor("f32", {rows, K});
      out.meta.assign(size_t(n) * (K + 2), -1);
      std::vector<int> fill = starts;
      for (int i = 0; i < n; ++i) {
        auto [s, t] = tokens[i];
        const DispatchRecord &src = ranks[s];
        int master = -1;
        for (int j = 0; j < K; ++j) {
          int64_t e = src.topkIdx.as<int64_t>()[t * K + j];
          bool here = e >= 0 && e / L == d;
          if (here)
            master = j;
          if (!expanded) {
            out.recvTopkIdx.as<int64_t>()[i * K + j] = here ? e % L : -1;
            out.recvTopkWeights.as<float>()[i * K + j] = src.topkWeights.as<float>()[t * K + j];
          } else if (here) {
            int row = fill[e % L]++;
            out.meta[i * (K + 2) + 2 + j] = row;
            std::memcpy(out.recvX.row(row), src.x.row(t), out.recvX.rowBytes());
            out.recvTopkWeights.as<float>()[row] = src.topkWeights.as<float>()[t * K + j];
          }
        }
        out.meta[i * (K + 2)] = s * Tmax + t;
        out.meta[i * (K + 2) + 1] = s * K + master;
        if (!expanded)
          std::memcpy(out.recvX.row(i), src.x.row(t), out.recvX.rowBytes());
      }
      if (expanded)
        out.recvTopkIdx = HostTensor();
    }
  }

  /// Combine of the received rows as they are (the identity expert).
  std::vector<CombineRecord> identityCombine(std::vector<float> multiplicity) const {
    std::vector<CombineRecord> out(2);
    for (int s = 0; s < 2; ++s) {
      out[s].x = ranks[s].recvX;
      out[s].topkWeights = ranks[s].recvTopkWeights;
      int64_t T = ranks[s].topkIdx.rows();
      out[s].combinedX = HostTensor("bf16", {T, 8});
      out[s].combinedTopkWeights = HostTensor("f32", {T, 2});
      for (int64_t t = 0; t < T; ++t) {
        float m = multiplicity[size_t(s * 3 + t)];
        for (int h = 0; h < 8; ++h)
          out[s].combinedX.as<uint16_t>()[t * 8 + h] =
              floatToBf16(m * bf16ToFloat(ranks[s].x.as<uint16_t>()[t * 8 + h]));
        for (int j = 0; j < 2; ++j)
          out[s].combinedTopkWeights.as<float>()[t * 2 + j] =
              ranks[s].topkIdx.as<int64_t>()[t * 2 + j] < 0
                  ? 0.f
                  : ranks[s].topkWeights.as<float>()[t * 2 + j];
      }
    }
    return out;
  }
};

TEST(Reference, PlainDispatchAcceptsAnyArrivalOrderAndCatchesWrongBytes) {
  TinyWorld w(false);
  EXPECT_TRUE(checkDispatch(w.spec, true, false, w.ranks).empty());
  // Rank 1 received tokens 0 and 2 of rank 0 (group of source 0): swap them.
  TinyWorld swapped(false);
  DispatchRecord &r1 = swapped.ranks[1];
  ASSERT_EQ(r1.hostCounts[0], 3);
  for (int64_t k = 0; k < 4; ++k)
    std::swap(r1.meta[k], r1.meta[4 + k]);
  std::vector<uint8_t> row(r1.recvX.row(0), r1.recvX.row(0) + r1.recvX.rowBytes());
  std::memcpy(r1.recvX.row(0), r1.recvX.row(1), r1.recvX.rowBytes());
  std::memcpy(r1.recvX.row(1), row.data(), row.size());
  for (int j = 0; j < 2; ++j) {
    std::swap(r1.recvTopkIdx.as<int64_t>()[j], r1.recvTopkIdx.as<int64_t>()[2 + j]);
    std::swap(r1.recvTopkWeights.as<float>()[j], r1.recvTopkWeights.as<float>()[2 + j]);
  }
  EXPECT_TRUE(checkDispatch(swapped.spec, true, false, swapped.ranks).empty());
  std::vector<int64_t> canonical = canonicalRows(swapped.spec, r1);
  EXPECT_EQ(canonical, (std::vector<int64_t>{1, 0, 2}));

  TinyWorld bad(false);
  bad.ranks[1].recvX.as<uint16_t>()[9] ^= 1;
  auto problems = checkDispatch(bad.spec, true, false, bad.ranks);
  EXPECT_TRUE(mentions(problems, "rank 1: recv_x[1] differs")) << problems.at(0);
  bad = TinyWorld(false);
  bad.ranks[0].hostCounts[0] = 1;
  EXPECT_TRUE(mentions(checkDispatch(bad.spec, true, false, bad.ranks), "rank 0: received 1"));
  bad = TinyWorld(false);
  bad.ranks[0].meta[1] = 1; // master slot of rank 0's first token is 0
  EXPECT_TRUE(mentions(checkDispatch(bad.spec, true, false, bad.ranks), "master slot"));
  bad = TinyWorld(false);
  bad.ranks[1].recvTopkWeights.as<float>()[0] = 9.f;
  EXPECT_TRUE(mentions(checkDispatch(bad.spec, true, false, bad.ranks), "recv_topk_weights"));
  EXPECT_TRUE(checkDispatch(bad.spec, false, false, bad.ranks).empty()); // weights not sent
  bad = TinyWorld(false);
  bad.ranks[1].psumRank[0] = 7;
  EXPECT_TRUE(mentions(checkDispatch(bad.spec, true, false, bad.ranks),
                       "psum_num_recv_tokens_per_rank[0]"));
}

TEST(Reference, ExpandedDispatchAndZeroPadding) {
  TinyWorld w(true, 4);
  EXPECT_TRUE(checkDispatch(w.spec, true, true, w.ranks).empty());
  // Canonical rows: every expert block's used rows, padding left out; the
  // handle alone (no rows read back) is enough.
  DispatchRecord handleOnly = w.ranks[0];
  handleOnly.recvX = HostTensor();
  EXPECT_EQ(canonicalRows(w.spec, handleOnly), (std::vector<int64_t>{0, 4, 5}));
  TinyWorld dirty(true, 4);
  DispatchRecord &r0 = dirty.ranks[0];
  // Local expert 0 of rank 0 received one row; rows 1..3 are its padding.
  ASSERT_EQ(r0.numRecvPerExpert[0], 1);
  r0.recvX.as<uint16_t>()[8 * 2] = floatToBf16(1.f);
  EXPECT_TRUE(checkDispatch(dirty.spec, true, false, dirty.ranks).empty());
  EXPECT_TRUE(mentions(checkDispatch(dirty.spec, true, true, dirty.ranks), "padding"));
  TinyWorld bad(true, 4);
  bad.ranks[1].meta[3] = 100; // slot 1 of rank 0's token 0: expert 2, here
  EXPECT_TRUE(mentions(checkDispatch(bad.spec, true, false, bad.ranks), "outside local expert"));
}

TEST(Reference, CombineIsCheckedBitwise) {
  // Multiplicity of each source token = the ranks that own one of its experts
  // (plain), or its valid slots (expanded: each expert's row is summed).
  TinyWorld plain(false);
  std::vector<float> ranksOwning = {2, 1, 2, 1, 0};
  EXPECT_TRUE(checkCombine(plain.spec, plain.ranks, plain.identityCombine(ranksOwning)).empty());
  auto wrong = plain.identityCombine(ranksOwning);
  wrong[1].combinedX.as<uint16_t>()[3] ^= 1;
  auto problems = checkCombine(plain.spec, plain.ranks, wrong);
  EXPECT_TRUE(mentions(problems, "rank 1: combined_x[0][3]")) << problems.at(0);
  wrong = plain.identityCombine(ranksOwning);
  wrong[0].combinedTopkWeights.as<float>()[3] = 1.f; // a masked slot must be 0
  EXPECT_TRUE(mentions(checkCombine(plain.spec, plain.ranks, wrong), "combined_topk_weights"));

  TinyWorld expanded(true, 4);
  std::vector<float> slots = {2, 1, 2, 2, 0};
  EXPECT_TRUE(checkCombine(expanded.spec, expanded.ranks, expanded.identityCombine(slots)).empty());
  EXPECT_FALSE(
      checkCombine(expanded.spec, expanded.ranks, expanded.identityCombine(ranksOwning)).empty());
}

// --- NodeLayout: hybrid mode (issue 21) ------------------------------------------------

/// A plain dispatch over ranks of one expert each (K from `idx`, rows of value 10 s + t),
/// built here in DeepEP's receive order for `topology`. Hybrid column 1: each forwarder numbers
/// a source's tokens for its node from the last one (an order its atomics may give).
struct NodeWorld {
  EPSpec spec;
  NodeLayout topology;
  std::vector<DispatchRecord> ranks;

  NodeWorld(NodeLayout topo, int K, int Tmax, const std::vector<std::vector<int64_t>> &idx)
      : topology(topo) {
    const int R = int(idx.size()), H = 8, M = topo.lsaSize(R);
    spec.ranks = R, spec.experts = R, spec.topk = K, spec.hidden = H;
    spec.maxTokensPerRank = Tmax;
    ranks.resize(size_t(R));
    for (int s = 0; s < R; ++s) {
      const int64_t T = int64_t(idx[size_t(s)].size()) / K;
      DispatchRecord &r = ranks[size_t(s)];
      r.topkIdx = HostTensor("i64", {T, K});
      std::copy(idx[size_t(s)].begin(), idx[size_t(s)].end(), r.topkIdx.as<int64_t>());
      r.x = HostTensor("bf16", {T, H});
      for (int64_t i = 0; i < T * H; ++i)
        r.x.as<uint16_t>()[i] = floatToBf16(float(10 * s + i / H));
    }
    auto expert = [&](int s, int64_t t, int j) {
      return ranks[size_t(s)].topkIdx.as<int64_t>()[t * K + j];
    };
    auto toNode = [&](int s, int64_t t, int node) {
      for (int j = 0; j < K; ++j)
        if (expert(s, t, j) >= 0 && expert(s, t, j) / M == node)
          return true;
      return false;
    };
    for (int d = 0; d < R; ++d) {
      std::vector<std::pair<int, int64_t>> rows; // (source, token) in receive order
      const int groups = topo.hybrid ? M : R;
      for (int g = 0; g < groups; ++g) {
        for (int s = 0; s < R; ++s)
          if ((topo.hybrid ? s % M : s) == g)
            for (int64_t t = 0; t < ranks[size_t(s)].topkIdx.rows(); ++t)
              for (int j = 0; j < K; ++j)
                if (expert(s, t, j) == d) {
                  rows.push_back({s, t});
                  break;
                }
        ranks[size_t(d)].psumRank.push_back(int32_t(rows.size()));
      }
      DispatchRecord &out = ranks[size_t(d)];
      const int64_t n = int64_t(rows.size());
      out.hostCounts = {int32_t(n), int32_t(n)};
      out.numRecvPerExpert = {int32_t(n)};
      out.psumRecvPerExpert = {int32_t(n)};
      out.recvX = HostTensor("bf16", {n, H});
      out.recvTopkIdx = HostTensor("i64", {n, K});
      out.meta.assign(size_t(n * (K + 2)), -1);
      for (int64_t i = 0; i < n; ++i) {
        auto [s, t] = rows[size_t(i)];
        int master = 0;
        for (int j = 0; j < K; ++j) {
          out.recvTopkIdx.as<int64_t>()[i * K + j] = expert(s, t, j) == d ? 0 : -1;
          master = expert(s, t, j) == d ? j : master;
        }
        std::memcpy(out.recvX.row(i), ranks[size_t(s)].x.row(t), out.recvX.rowBytes());
        int32_t *m = &out.meta[size_t(i * (K + 2))];
        m[0] = int32_t(s * Tmax + t);
        if (!topo.hybrid) {
          m[1] = s * K + master;
          continue;
        }
        int64_t slot = 0; // the source's later tokens for this node come first
        for (int64_t u = t + 1; u < ranks[size_t(s)].topkIdx.rows(); ++u)
          slot += toNode(s, u, d / M);
        m[1] = int32_t(((s / M) * Tmax + slot) * K + master);
      }
    }
  }
  std::vector<std::string> check() const {
    return checkDispatch(spec, false, false, ranks, topology);
  }
};

// python: test_reference_hybrid.py's IDX_2X2 (2 nodes x 2 GPUs, expert e on rank e, Tmax 2).
const std::vector<std::vector<int64_t>> kIdx2x2 = {
    {0, 3, 2, -1}, {1, 3}, {3, 0, -1, -1}, {2, 1, 0, 1}};

std::vector<int32_t> column(const DispatchRecord &r, int c, int K) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < r.meta.size(); i += size_t(K + 2))
    out.push_back(r.meta[i + size_t(c)]);
  return out;
}

TEST(Reference, HybridDispatchOrderAndColumnOne) {
  NodeWorld w({2, true}, 2, 2, kIdx2x2);
  // The values test_reference_hybrid.py works out by hand (reference.dispatch's, with the
  // kernel-like column 1 that check_hybrid_metadata accepts).
  EXPECT_EQ(column(w.ranks[0], 0, 2), (std::vector<int32_t>{0, 4, 7}));
  EXPECT_EQ(column(w.ranks[0], 1, 2), (std::vector<int32_t>{0, 5, 4}));
  EXPECT_EQ(column(w.ranks[3], 0, 2), (std::vector<int32_t>{0, 4, 2}));
  EXPECT_EQ(w.ranks[1].psumRank, (std::vector<int32_t>{0, 3}));
  auto problems = w.check();
  EXPECT_TRUE(problems.empty()) << problems.at(0);
  // The same records are not direct mode's (prefix sums per source rank, column 1).
  EXPECT_TRUE(mentions(checkDispatch(w.spec, false, false, w.ranks), "psum_num_recv_tokens"));
  EXPECT_TRUE(mentions(checkDispatch(w.spec, false, false, w.ranks), "source rank x K"));
  NodeWorld direct({2, false}, 2, 2, kIdx2x2);
  EXPECT_TRUE(direct.check().empty());
  EXPECT_TRUE(mentions(checkDispatch(direct.spec, false, false, direct.ranks, {2, true}),
                       "(hybrid: rows per forwarder index)"));
  // Canonical rows: forwarder index first.
  DispatchRecord r3 = w.ranks[3];
  std::swap(r3.meta[0], r3.meta[8]); // rows 0 (gid 0) and 2 (gid 2): meta only, enough here
  EXPECT_EQ(canonicalRows(w.spec, r3, w.topology), (std::vector<int64_t>{2, 1, 0}));
  EXPECT_EQ(canonicalRows(w.spec, w.ranks[3]), (std::vector<int64_t>{0, 2, 1}));

  NodeWorld bad = w;
  bad.ranks[0].meta[4 + 1] = 1 * 2 + 1; // gid 4 (node 1) given item 1, of node 0
  EXPECT_TRUE(mentions(bad.check(), "rank 0: recv_src_metadata[1][1] is 3")) << bad.check().at(0);
  bad = w;
  bad.ranks[0].meta[1] = 1; // gid 0's master slot is 0
  EXPECT_TRUE(mentions(bad.check(), "expected item x K + 0"));
  bad = w;
  bad.ranks[1].meta[8 + 1] = (2 + 1) * 2 + 1; // gid 7 at rank 1: item 3, at rank 0 item 2
  EXPECT_TRUE(mentions(bad.check(), "token 1 of rank 3 has item 3 at forwarder 1, but 2"))
      << bad.check().at(0);
  bad = w;
  bad.ranks[1].meta[4 + 1] = 2 * 2 + 1; // gid 6 takes gid 7's item 2 at forwarder 1
  EXPECT_TRUE(mentions(bad.check(), "shares item 2 at forwarder 1 with token"))
      << bad.check().at(0);
  bad = w;
  for (int k = 0; k < 4; ++k) // rank 0: gid 4 (forwarder index 0) and gid 7 (1) trade rows
    std::swap(bad.ranks[0].meta[size_t(4 + k)], bad.ranks[0].meta[size_t(8 + k)]);
  std::vector<uint8_t> row(bad.ranks[0].recvX.row(1),
                           bad.ranks[0].recvX.row(1) + bad.ranks[0].recvX.rowBytes());
  std::memcpy(bad.ranks[0].recvX.row(1), bad.ranks[0].recvX.row(2), row.size());
  std::memcpy(bad.ranks[0].recvX.row(2), row.data(), row.size());
  for (int j = 0; j < 2; ++j)
    std::swap(bad.ranks[0].recvTopkIdx.as<int64_t>()[2 + j],
              bad.ranks[0].recvTopkIdx.as<int64_t>()[4 + j]);
  problems = bad.check();
  ASSERT_EQ(problems.size(), 2u) << problems.at(0);
  EXPECT_TRUE(mentions(problems, "rank 0: recv_src_metadata[1]: token 1 of rank 3 (forwarder "
                                 "index 1) lies outside that forwarder's rows"));

  EXPECT_THROW(NodeWorld({3, false}, 2, 2, kIdx2x2).check(), std::invalid_argument);
  EXPECT_THROW(NodeWorld({4, true}, 2, 2, kIdx2x2).check(), std::invalid_argument);
  EXPECT_THROW(NodeLayout({0, true}).validate(4), std::invalid_argument);
  EXPECT_NO_THROW(NodeLayout({0, false}).validate(4));
  EXPECT_THROW(NodeLayout({2, true}).validate(66), std::invalid_argument);   // 33 nodes
  EXPECT_THROW(NodeLayout({65, true}).validate(130), std::invalid_argument); // 65 per node
  EXPECT_NO_THROW(NodeLayout({64, true}).validate(128));
}

/// Combine of NodeWorld `w` where rank d's row of token t of rank s is values[{d, s, t}], and
/// the expected output of every token of rank `origin` is `want` (all channels), with a bias of
/// `bias` there when it is not 0.
std::vector<std::string> combineWith(const NodeWorld &w, const NodeLayout &topology,
                                     const std::map<std::array<int, 3>, float> &values, float want,
                                     int origin = 0, float bias = 0.f) {
  const int R = w.spec.ranks, H = 8;
  std::vector<CombineRecord> out(static_cast<size_t>(R));
  for (int d = 0; d < R; ++d) {
    const DispatchRecord &h = w.ranks[size_t(d)];
    out[size_t(d)].x = HostTensor("bf16", {h.recvX.rows(), H});
    for (int64_t i = 0; i < h.recvX.rows(); ++i) {
      int gid = h.meta[size_t(i * (w.spec.topk + 2))];
      auto it = values.find({d, gid / w.spec.maxTokensPerRank, gid % w.spec.maxTokensPerRank});
      for (int c = 0; c < H; ++c)
        out[size_t(d)].x.as<uint16_t>()[i * H + c] =
            floatToBf16(it == values.end() ? 0.f : it->second);
    }
    const int64_t T = w.ranks[size_t(d)].topkIdx.rows();
    out[size_t(d)].combinedX = HostTensor("bf16", {T, H});
    for (int64_t i = 0; i < T * H; ++i)
      out[size_t(d)].combinedX.as<uint16_t>()[i] = floatToBf16(d == origin ? want : 0.f);
    if (d == origin && bias != 0.f) {
      out[size_t(d)].biases.emplace_back("bf16", std::vector<int64_t>{T, H});
      for (int64_t i = 0; i < T * H; ++i)
        out[size_t(d)].biases.back().as<uint16_t>()[i] = floatToBf16(bias);
    }
  }
  return checkCombine(w.spec, w.ranks, out, topology);
}

TEST(Reference, HybridCombineRoundsPerNodeThenAddsNodesInNodeMasterOrder) {
  // test_reference_hybrid.py's test_hybrid_rounds_once_per_node_2x2: token 0 of rank 0 picks
  // experts 2, 1, 3, with rows 1, 2^-8, 2^-8. Direct: 1 + 2^-7 = 1.0078125; hybrid: node 1
  // rounds 1 + 2^-8 to 1, then 2^-8 + 1 rounds to 1.
  const std::vector<std::vector<int64_t>> idx = {{2, 1, 3}, {}, {}, {}};
  const std::map<std::array<int, 3>, float> values = {
      {{2, 0, 0}, 1.f}, {{1, 0, 0}, 0x1p-8f}, {{3, 0, 0}, 0x1p-8f}};
  NodeWorld hybrid({2, true}, 3, 1, idx), direct({2, false}, 3, 1, idx);
  EXPECT_TRUE(combineWith(hybrid, hybrid.topology, values, 1.f).empty());
  EXPECT_TRUE(combineWith(direct, direct.topology, values, 1.0078125f).empty());
  auto problems = combineWith(hybrid, hybrid.topology, values, 1.0078125f);
  EXPECT_TRUE(mentions(problems, "hybrid order")) << problems.at(0);
  EXPECT_FALSE(combineWith(direct, direct.topology, values, 1.f).empty());

  // test_hybrid_adds_nodes_in_node_master_order_2x2: rank 1 picks experts 0, 2, 1 (node 0:
  // slots 0 and 2, node 1: slot 1) with rows 2^-24, -1, 0 and bias 1. Hybrid: node 1 (node
  // master 1) before node 0 (2): 1 - 1 + 2^-24 = 2^-24; direct (or nodes by their lowest
  // slot): 1 + 2^-24 rounds to 1, then - 1: 0.
  const std::vector<std::vector<int64_t>> idx2 = {{}, {0, 2, 1}, {}, {}};
  const std::map<std::array<int, 3>, float> order = {
      {{0, 1, 0}, 0x1p-24f}, {{2, 1, 0}, -1.f}, {{1, 1, 0}, 0.f}};
  NodeWorld hybrid2({2, true}, 3, 1, idx2), direct2({2, false}, 3, 1, idx2);
  EXPECT_TRUE(combineWith(hybrid2, hybrid2.topology, order, 0x1p-24f, 1, 1.f).empty());
  EXPECT_FALSE(combineWith(hybrid2, hybrid2.topology, order, 0.f, 1, 1.f).empty());
  EXPECT_TRUE(combineWith(direct2, direct2.topology, order, 0.f, 1, 1.f).empty());

  // test_hybrid_node_sum_in_rank_master_order_2x4's first token, from rank 0 here: 2 x 4,
  // experts 3, 1, 2, 5 with rows 1, 2^-24, -1, 0: node 0 in master order (1 + 2^-24) - 1 = 0;
  // by rank index it would be (2^-24 - 1) + 1 = 2^-24.
  std::vector<std::vector<int64_t>> idx8(8);
  idx8[0] = {3, 1, 2, 5};
  NodeWorld wide({4, true}, 4, 1, idx8);
  const std::map<std::array<int, 3>, float> sums = {
      {{3, 0, 0}, 1.f}, {{1, 0, 0}, 0x1p-24f}, {{2, 0, 0}, -1.f}, {{5, 0, 0}, 0.f}};
  EXPECT_TRUE(combineWith(wide, wide.topology, sums, 0.f).empty());
  EXPECT_FALSE(combineWith(wide, wide.topology, sums, 0x1p-24f).empty());
}

TEST(Reference, NetworkBytesByHand) {
  // test_reference_hybrid.py's test_network_bytes_2x2_by_hand.
  std::vector<HostTensor> idx;
  for (const std::vector<int64_t> &r : kIdx2x2) {
    idx.emplace_back("i64", std::vector<int64_t>{int64_t(r.size()) / 2, 2});
    std::copy(r.begin(), r.end(), idx.back().as<int64_t>());
  }
  EXPECT_EQ(expectedNetworkBytes(idx, 4, {2, false}, 100),
            (std::vector<int64_t>{0, 0, 100, 100, 0, 0, 0, 100, 100, 0, 0, 0, 100, 200, 0, 0}));
  EXPECT_EQ(expectedNetworkBytes(idx, 4, {2, true}, 100),
            (std::vector<int64_t>{0, 0, 200, 0, 0, 0, 0, 100, 100, 0, 0, 0, 0, 200, 0, 0}));
  EXPECT_EQ(expectedNetworkBytes(idx, 4, {}, 100), std::vector<int64_t>(16, 0));
  EXPECT_THROW(expectedNetworkBytes(idx, 4, {4, true}, 100), std::invalid_argument);
  EXPECT_THROW(expectedNetworkBytes(idx, 4, {2, true}, 0), std::invalid_argument);
  EXPECT_THROW(expectedNetworkBytes(idx, 6, {2, true}, 1), std::invalid_argument);
  EXPECT_THROW(expectedNetworkBytes({}, 4, {}, 1), std::invalid_argument);
}

// --- Run plans --------------------------------------------------------------------

std::string planWith(const std::string &steps, int values, int ranks = 2) {
  return "{\"epic_run_plan\": 1, \"ranks\": " + std::to_string(ranks) +
         ", \"values\": " + std::to_string(values) + ", \"steps\": [" + steps + "]}";
}
const char *kTokens = R"({"op": "tokens", "loc": "p.mlir:1:1", "result": 0, "per_rank": [4, 2]})";

void expectPlanError(const std::string &text, const std::string &needle) {
  try {
    RunPlan::parse(text);
    FAIL() << "accepted: " << text;
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RunPlan, ParsesAndChecksValues) {
  std::string random = R"({"op": "random", "loc": "p.mlir:2:1", "result": 1, "rows": 0,
      "distribution": "normal", "scale": 1, "seed": 1, "dtype": "bf16", "cols": 64})";
  RunPlan plan = RunPlan::parse(planWith(std::string(kTokens) + "," + random, 2));
  EXPECT_EQ(plan.ranks, 2);
  EXPECT_EQ(plan.steps.size(), 2u);
  EXPECT_TRUE(plan.kernels().empty());

  expectPlanError("[1, 2]", "not an epic run plan");
  expectPlanError("{\"epic_run_plan\": 2}", "version 2");
  expectPlanError(planWith(random, 2), "step 0 (random at p.mlir:2:1): rows uses value 0 before");
  expectPlanError(planWith(std::string(kTokens) + "," + kTokens, 1), "a second time");
  expectPlanError(planWith(kTokens, 1, 3), "per_rank has 2 entries for 3 ranks");
  expectPlanError(planWith(R"({"op": "fly", "loc": "p.mlir:9:9"})", 0), "unknown op \"fly\"");
  std::string print = R"({"op": "print", "loc": "p.mlir:3:1", "value": 0, "rows": 2})";
  RunPlan::parse(planWith(std::string(kTokens) + "," + print, 1));
  std::string badRows = R"({"op": "random", "loc": "p.mlir:2:1", "result": 1, "rows": 1,
      "distribution": "normal", "scale": 1, "seed": 1, "dtype": "bf16", "cols": 64})";
  expectPlanError(planWith(std::string(kTokens) + "," + random + "," +
                               R"({"op": "random", "loc": "p.mlir:3:1", "result": 2, "rows": 1,
      "distribution": "normal", "scale": 1, "seed": 1, "dtype": "bf16", "cols": 64})",
                           3),
                  "rows must be an index, value 1 is a tensor");
}

TEST(RunPlan, NodesOfTheWorld) {
  auto withNodes = [](const std::string &perNode) {
    std::string text = planWith(kTokens, 1);
    return text.insert(text.find("\"values\""), "\"gpus_per_node\": " + perNode + ", ");
  };
  EXPECT_EQ(RunPlan::parse(planWith(kTokens, 1)).gpusPerNode, 2); // one node: every rank
  EXPECT_EQ(RunPlan::parse(withNodes("1")).gpusPerNode, 1);
  expectPlanError(withNodes("3"), "gpus_per_node (3) must divide ranks (2)");
  expectPlanError(withNodes("0"), "gpus_per_node (0) must divide ranks (2)");
}

TEST(RunPlan, RefusesWhatTheRunDialectRefuses) {
  auto random = [](const std::string &scale) {
    return std::string(kTokens) + R"(, {"op": "random", "loc": "p.mlir:2:1", "result": 1,
        "rows": 0, "distribution": "normal", "seed": 1, "dtype": "bf16", "cols": 64, "scale": )" +
           scale + "}";
  };
  expectPlanError(planWith(random("0"), 2), "scale must be positive and finite, got 0");
  expectPlanError(planWith(random("-1.5"), 2), "scale must be positive and finite, got -1.5");
  expectPlanError(planWith(random("true"), 2), "expected a number, got a bool");
  auto routing = [](const std::string &masked) {
    return std::string(kTokens) + R"(, {"op": "routing", "loc": "p.mlir:2:1", "result": 1,
        "rows": 0, "experts": 8, "topk": 2, "seed": 2, "masked": )" +
           masked + "}";
  };
  expectPlanError(planWith(routing("2.0"), 2), "masked must be a probability in [0, 1], got 2");
  expectPlanError(planWith(routing("true"), 2), "expected a number, got a bool");
  RunPlan::parse(planWith(routing("0.25"), 2));
  // Token counts are integers, and lists are lists.
  expectPlanError(planWith(R"({"op": "tokens", "loc": "p.mlir:1:1", "result": 0,
      "per_rank": [4.5, 2]})",
                           1),
                  "expected an integer, got a number 4.5");
  expectPlanError(planWith(R"({"op": "tokens", "loc": "p.mlir:1:1", "result": 0,
      "per_rank": 4})",
                           1),
                  "expected a list, got a number");
}

namespace {
/// A bf16 expanded configuration of 2 ranks, 4 experts, hidden 64.
const char *const kExpandedSpec =
    R"({"dtype": "bf16", "expanded": true, "expert_alignment": 32, "experts": 4,
      "hidden": 64, "hybrid": false, "max_tokens_per_rank": 8, "num_sms": 0, "ranks": 2,
      "scale_packs": 0, "scaleup_ranks": 0, "topk": 2})";

std::string randomStep(int result, int cols) {
  return R"({"op": "random", "loc": "p.mlir:2:1", "rows": 0, "distribution": "normal",
        "scale": 1, "seed": 1, "dtype": "bf16", "cols": )" +
         std::to_string(cols) + ", \"result\": " + std::to_string(result) + "}";
}

/// Steps making the tokens (value 0), x (1), the routing (2), its expanded dispatch (recv_x 3,
/// handle 4) and expert weights of `weightCols` elements a row (5).
std::string dispatchedRows(int weightCols) {
  return std::string(kTokens) + "," + randomStep(1, 64) + "," +
         R"({"op": "routing", "loc": "p.mlir:3:1", "result": 2, "rows": 0, "experts": 4,
          "topk": 2, "seed": 2, "masked": 0},
         {"op": "dispatch", "loc": "p.mlir:4:1", "spec": )" +
         kExpandedSpec + R"(, "cached": false, "zero_padding": false, "x": 1, "topk_idx": 2,
          "scale_packs": -1, "topk_weights": -1, "cached_handle": -1, "recv_x": 3,
          "recv_scale_packs": -1, "recv_topk_idx": -1, "recv_topk_weights": -1, "handle": 4},)" +
         randomStep(5, weightCols);
}
} // namespace

TEST(RunPlan, GemmCombineStepIsOneKernelWithItsBiases) {
  const std::string spec = kExpandedSpec;
  const std::string prefix = dispatchedRows(64 * 64) + "," + randomStep(6, 64) + ",";
  auto fused = [&](const std::string &weights, const std::string &biases) {
    return prefix + R"({"op": "gemm_combine", "loc": "p.mlir:5:1", "spec": )" + spec +
           R"(, "x": 3, "weights": )" + weights + R"(, "handle": 4, "biases": )" + biases +
           R"(, "result": 7, "combined_x": 8})";
  };
  RunPlan plan = RunPlan::parse(planWith(fused("5", "[6]"), 9));
  std::vector<PlanKernel> kernels = plan.kernels();
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[1].kind, KernelKind::gemmCombine);
  EXPECT_EQ(kernels[1].combineVariant.biases, 1);
  EXPECT_FALSE(kernels[1].combineVariant.weights);
  EXPECT_EQ(kernels[1].request().kind, KernelKind::gemmCombine);
  expectPlanError(planWith(fused("4", "[6]"), 9), "weights must be a tensor, value 4 is a handle");
  expectPlanError(planWith(fused("5", "[6, 6, 6]"), 9), "at most two biases");
}

TEST(RunPlan, GroupedGemmStepCarriesKAndFp8Scales) {
  auto gemm = [](int k, int xScales, int weightScales) {
    return dispatchedRows(64 * 128) + R"(, {"op": "grouped_gemm", "loc": "p.mlir:5:1", "spec": )" +
           kExpandedSpec +
           R"(, "x": 3, "weights": 5, "handle": 4, "n": 128, "out_dtype": "bf16", "k": )" +
           std::to_string(k) + R"(, "x_scales": )" + std::to_string(xScales) +
           R"(, "weight_scales": )" + std::to_string(weightScales) + R"(, "result": 6})";
  };
  // K = the hidden size: the request's k is 0 (one kernel key for both spellings).
  std::vector<PlanKernel> kernels = RunPlan::parse(planWith(gemm(64, -1, -1), 7)).kernels();
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[1].gemmK, 64);
  EXPECT_EQ(kernels[1].request().gemm.k, 0);
  // An expert's down GEMM: rows 128 wide.
  kernels = RunPlan::parse(planWith(gemm(128, -1, -1), 7)).kernels();
  EXPECT_EQ(kernels[1].request().gemm.k, 128);
  EXPECT_EQ(kernels[1].request().gemm.n, 128);
  // FP8: both scales are values of the program.
  RunPlan::parse(planWith(gemm(64, 5, 5), 7));
  expectPlanError(planWith(gemm(64, 5, -1), 7),
                  "an FP8 grouped_gemm takes x_scales and weight_scales, both or neither");
  expectPlanError(planWith(gemm(64, 4, 5), 7), "x_scales must be a tensor, value 4 is a handle");
  expectPlanError(planWith(gemm(0, -1, -1), 7), "k (the rows' width) must be positive, got 0");
}

TEST(RunPlan, SwigluStepSaysItsDtypesAndScales) {
  // Value 3: the dispatched rows, standing in for the gate/up rows; 6 and 7: the results.
  auto swiglu = [](int n, const std::string &in, const std::string &out, int scales,
                   int weights = -1) {
    return dispatchedRows(64 * 256) + R"(, {"op": "swiglu", "loc": "p.mlir:5:1", "spec": )" +
           kExpandedSpec + R"(, "gate_up": 3, "handle": 4, "n": )" + std::to_string(n) +
           R"(, "in_dtype": ")" + in + R"(", "out_dtype": ")" + out + R"(", "result": 6, )" +
           R"("scales": )" + std::to_string(scales) + R"(, "weights": )" + std::to_string(weights) +
           "}";
  };
  std::vector<PlanKernel> kernels =
      RunPlan::parse(planWith(swiglu(128, "bf16", "f8E4M3FN", 7), 8)).kernels();
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[1].kind, KernelKind::swiglu);
  KernelRequest request = kernels[1].request();
  EXPECT_EQ(request.gemm.n, 128);
  EXPECT_EQ(request.gemm.k, 256);
  EXPECT_EQ(request.gemm.inDtype, "bf16");
  EXPECT_EQ(request.gemm.outDtype, "f8E4M3FN");
  RunPlan::parse(planWith(swiglu(128, "f32", "bf16", -1), 8));
  RunPlan::parse(planWith(swiglu(128, "bf16", "bf16", -1, 5), 8)); // per-row weights: a tensor
  expectPlanError(planWith(swiglu(128, "bf16", "bf16", -1, 4), 8),
                  "weights must be a tensor, value 4 is a handle");
  expectPlanError(planWith(swiglu(128, "bf16", "f8E4M3FN", -1), 8),
                  "an f8E4M3FN result comes with its scales, another result without");
  expectPlanError(planWith(swiglu(128, "bf16", "bf16", 7), 8),
                  "an f8E4M3FN result comes with its scales, another result without");
  expectPlanError(planWith(swiglu(100, "bf16", "bf16", -1), 8),
                  "n (the intermediate size) must be a positive multiple of 128, got 100");
  expectPlanError(planWith(swiglu(128, "i8", "bf16", -1), 8),
                  "in_dtype must be bf16, f16 or f32, got \"i8\"");
}

TEST(RunPlan, MoeLayerStepIsOneKernelOfTheLayer) {
  // What ep-fuse-moe-layer leaves of the FP8 layer's five ops: one step, one kernel.
  const std::string spec =
      R"({"dtype": "f8E4M3FN", "expanded": true, "expert_alignment": 128, "experts": 4,
          "hidden": 128, "hybrid": false, "max_tokens_per_rank": 8, "num_sms": 0, "ranks": 2,
          "scale_packs": 1, "scaleup_ranks": 0, "topk": 2})";
  auto layer = [&](int n, int weights) {
    std::string steps = std::string(kTokens) + "," + randomStep(1, 128) + "," +
                        R"({"op": "routing", "loc": "p.mlir:3:1", "result": 2, "rows": 0,
                            "experts": 4, "topk": 2, "seed": 2, "masked": 0})";
    for (int value = 3; value <= 8; ++value)
      steps += "," + randomStep(value, 128);
    return steps + R"(, {"op": "moe_layer", "loc": "p.mlir:9:1", "spec": )" + spec +
           R"(, "x": 1, "topk_idx": 2, "scale_packs": 3, "topk_weights": )" +
           std::to_string(weights) +
           R"(, "gate_up_weights": 5, "gate_up_scales": 6, "down_weights": 7, "down_scales": 8,
               "n": )" +
           std::to_string(n) + R"(, "combined_x": 9})";
  };
  std::vector<PlanKernel> kernels = RunPlan::parse(planWith(layer(256, 4), 10)).kernels();
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].kind, KernelKind::moeLayer);
  EXPECT_TRUE(kernels[0].dispatchVariant.weights);
  EXPECT_FALSE(kernels[0].dispatchVariant.cached);
  KernelRequest request = kernels[0].request();
  EXPECT_EQ(request.kind, KernelKind::moeLayer);
  EXPECT_EQ(request.gemm.n, 256);
  EXPECT_EQ(request.dispatch.topkIdxBits, 64);
  expectPlanError(planWith(layer(100, 4), 10),
                  "n (the intermediate size) must be a positive multiple of 128, got 100");
  // The SwiGLU weights every row by its routing weight: the weights are no option.
  expectPlanError(planWith(layer(256, -1), 10), "topk_weights");
}

class RunPlanCache : public ::testing::Test {
protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("epic-run-plan-test-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(RunPlanCache, TextArtifactsAreStoredAtomically) {
  KernelCache cache((dir / "cache").string());
  std::string key(32, 'a');
  EXPECT_FALSE(cache.loadText("plans", key));
  cache.storeText("plans", key, "{}");
  cache.storeText("plans", key, "{}"); // a second writer replaces it whole
  EXPECT_EQ(*cache.loadText("plans", key), "{}");
  EXPECT_THROW(cache.loadText("plans", "../x"), std::invalid_argument);
}

TEST_F(RunPlanCache, ProviderMakesThePlanOnceThenLoadsIt) {
  std::string program = (dir / "p.mlir").string();
  std::ofstream(program) << R"(#cfg = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 64,
                  dtype = bf16, max_tokens_per_rank = 16>
func.func @main() {
  %t = run.tokens per_rank [16, 3]
  %x = run.random normal seed 1 rows %t : tensor<?x64xbf16>
  %i = run.routing experts 8 seed 2 rows %t : tensor<?x2xi64>
  %rx, %ri, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #cfg
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#cfg>
  %y = ep.combine %rx, %h : tensor<?x64xbf16>, !ep.handle<#cfg> -> tensor<?x64xbf16>
  return
})";
  KernelCache cache((dir / "cache").string());
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  RunPlan plan = RunPlan::parse(provider.runPlan(program));
  ASSERT_EQ(plan.kernels().size(), 2u);
  EXPECT_EQ(plan.kernels()[0].kind, KernelKind::dispatch);
  EXPECT_EQ(plan.kernels()[0].spec.hidden, 64);
  EXPECT_EQ(plan.kernels()[1].request().kind, KernelKind::combine);
  EXPECT_NE(plan.kernels()[1].request().json().find(
                R"("combine":{"weights":false,"biases":0,"window_outputs":false})"),
            std::string::npos);
  KernelProvider offline(cache, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  EXPECT_EQ(offline.runPlan(program), provider.runPlan(program));

  std::string broken = (dir / "broken.mlir").string();
  std::ofstream(broken) << "func.func @main() {\n  %t = run.tokens per_rank [-1]\n  return\n}\n";
  try {
    provider.runPlan(broken);
    FAIL() << "a negative token count went through";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("per_rank[0] = -1 is negative"), std::string::npos)
        << e.what();
  }
}

} // namespace

// --- dispatch_layout and grouped GEMM references ------------------------------------

namespace {
/// Two ranks, 4 experts (2 per rank), top-2: token 0 -> experts 0, 1 (rank 0 twice),
/// token 1 -> experts 3, -1, token 2 -> experts 2, 0.
LayoutRecord layoutOfThreeTokens(EPSpec &spec) {
  spec.ranks = 2, spec.experts = 4, spec.topk = 2, spec.hidden = 8, spec.maxTokensPerRank = 4;
  LayoutRecord rec;
  rec.topkIdx = HostTensor("i64", {3, 2});
  const int64_t ids[] = {0, 1, 3, -1, 2, 0};
  std::memcpy(rec.topkIdx.data.data(), ids, sizeof(ids));
  rec.perRank = {2, 2};
  rec.perExpert = {2, 1, 1, 1};
  rec.inRank = HostTensor("i1", {3, 2});
  const uint8_t in[] = {1, 0, 0, 1, 1, 1};
  std::memcpy(rec.inRank.data.data(), in, sizeof(in));
  return rec;
}
} // namespace

TEST(Reference, DispatchLayoutCountsATokenOncePerRank) {
  EPSpec spec;
  LayoutRecord rec = layoutOfThreeTokens(spec);
  EXPECT_TRUE(checkDispatchLayout(spec, {rec}).empty());
  LayoutRecord twice = rec;
  twice.perRank[0] = 3; // token 0 counted for each of its two experts on rank 0
  EXPECT_TRUE(
      mentions(checkDispatchLayout(spec, {twice}), "num_tokens_per_rank[0] is 3, expected 2"));
  LayoutRecord masked = rec;
  masked.perExpert[3] = 2;
  EXPECT_TRUE(mentions(checkDispatchLayout(spec, {masked}), "num_tokens_per_expert[3]"));
  LayoutRecord flag = rec;
  flag.inRank.data[2] = 1; // token 1 has no expert on rank 0
  EXPECT_TRUE(mentions(checkDispatchLayout(spec, {flag}), "is_token_in_rank[1, 0]"));
}

TEST(Reference, GroupedGemmChecksExpertRowsAndPadding) {
  // One rank, two local experts, alignment 2: expert 0 has rows [0, 1), padding row 1,
  // expert 1 rows [2, 4). hidden 2, N 1; weights: expert 0 sums, expert 1 takes the first.
  EPSpec spec;
  spec.ranks = 1, spec.experts = 2, spec.topk = 1, spec.hidden = 2, spec.expertAlignment = 2;
  DispatchRecord handle;
  handle.psumRecvPerExpert = {1, 4};
  GemmRecord g;
  g.x = HostTensor("f32", {4, 2});
  const float x[] = {1, 2, 9, 9, 3, 4, 5, 6};
  std::memcpy(g.x.data.data(), x, sizeof(x));
  g.weights = HostTensor("f32", {2, 2, 1});
  const float w[] = {1, 1, 1, 0};
  std::memcpy(g.weights.data.data(), w, sizeof(w));
  g.out = HostTensor("f32", {4, 1});
  const float out[] = {3, 0, 3, 5};
  std::memcpy(g.out.data.data(), out, sizeof(out));
  EXPECT_TRUE(checkGroupedGemm(spec, {handle}, {g}).empty());
  GemmRecord wrong = g;
  wrong.out.as<float>()[3] = 6;
  EXPECT_TRUE(mentions(checkGroupedGemm(spec, {handle}, {wrong}), "out[3] column 0 (expert 1)"));
  GemmRecord padding = g;
  padding.out.as<float>()[1] = 1;
  EXPECT_TRUE(mentions(checkGroupedGemm(spec, {handle}, {padding}), "padding row"));
  // Rows narrower than the hidden size (an expert's down GEMM): K is the rows' width.
  EPSpec wide = spec;
  wide.hidden = 8;
  EXPECT_TRUE(checkGroupedGemm(wide, {handle}, {g}).empty());
}

TEST(Reference, GroupedGemmDequantizesFp8Operands) {
  // One rank, one local expert, rows [0, 2), K = N = 128. e4m3 1.0 is 0x38, 2.0 is 0x40.
  // Row 0: 1.0 x 0.5; row 1: 2.0 x 0.5; weights 1.0 x 0.125: sums 128 x 0.0625 = 8 and 16.
  EPSpec spec;
  spec.ranks = 1, spec.experts = 1, spec.topk = 1, spec.hidden = 128, spec.expertAlignment = 1;
  spec.dtype = "f8E4M3FN", spec.scalePacks = 1;
  DispatchRecord handle;
  handle.psumRecvPerExpert = {2};
  GemmRecord g;
  g.x = HostTensor("f8E4M3FN", {2, 128});
  std::fill(g.x.data.begin(), g.x.data.begin() + 128, uint8_t(0x38));
  std::fill(g.x.data.begin() + 128, g.x.data.end(), uint8_t(0x40));
  g.xScales = HostTensor("f32", {2, 1});
  g.xScales.as<float>()[0] = g.xScales.as<float>()[1] = 0.5f;
  g.weights = HostTensor("f8E4M3FN", {1, 128, 128});
  std::fill(g.weights.data.begin(), g.weights.data.end(), uint8_t(0x38));
  g.weightScales = HostTensor("f32", {1, 1, 1});
  g.weightScales.as<float>()[0] = 0.125f;
  g.out = HostTensor("f32", {2, 128});
  std::fill(g.out.as<float>(), g.out.as<float>() + 128, 8.0f);
  std::fill(g.out.as<float>() + 128, g.out.as<float>() + 256, 16.0f);
  EXPECT_TRUE(checkGroupedGemm(spec, {handle}, {g}).empty());
  GemmRecord unscaled = g; // the weight scale forgotten: 8x too large
  std::fill(unscaled.out.as<float>(), unscaled.out.as<float>() + 256, 64.0f);
  EXPECT_TRUE(mentions(checkGroupedGemm(spec, {handle}, {unscaled}), "out[0] column 0 (expert 0)"));

  // Row 0 as 64 channels of +1.0 and 64 of -1.0 (0xb8): the products cancel to 0, but FP8
  // wgmma accumulates them narrower than fp32, so an error small beside their magnitudes
  // (128 x 0.0625 = 8) passes; one the size of a product does not.
  GemmRecord cancelled = g;
  std::fill(cancelled.x.data.begin() + 64, cancelled.x.data.begin() + 128, uint8_t(0xb8));
  std::fill(cancelled.out.as<float>(), cancelled.out.as<float>() + 128, 0.02f);
  EXPECT_TRUE(checkGroupedGemm(spec, {handle}, {cancelled}).empty());
  std::fill(cancelled.out.as<float>(), cancelled.out.as<float>() + 128, 0.0625f);
  EXPECT_TRUE(
      mentions(checkGroupedGemm(spec, {handle}, {cancelled}), "out[0] column 0 (expert 0)"));
}

// --- AGRS ---------------------------------------------------------------------------

namespace {
HostTensor floats(const std::string &dtype, std::vector<int64_t> shape,
                  const std::vector<double> &values) {
  HostTensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i)
    storeElement(dtype, values[i], t.data.data() + i * size_t(dtypeBytes(dtype)));
  return t;
}
} // namespace

TEST(Reference, SwigluChecksTheActivationAndItsFp8Quantization) {
  // One rank, one local expert owning rows [0, 2) of 3 (row 2: padding), I = 128. Gate 1.0
  // and up 2.0 (bf16 0x3f80, 0x4000): y = 2 silu(1) = 1.4621171...
  EPSpec spec;
  spec.ranks = 1, spec.experts = 1, spec.topk = 1, spec.hidden = 128, spec.expertAlignment = 1;
  spec.expanded = true;
  DispatchRecord handle;
  handle.psumRecvPerExpert = {2};
  SwigluRecord s;
  s.gateUp = floats("bf16", {3, 256}, {});
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t c = 0; c < 256; ++c)
      storeElement("bf16", c < 128 ? 1.0 : 2.0, s.gateUp.data.data() + (row * 256 + c) * 2);
  const double y = 2.0 / (1.0 + std::exp(-1.0));
  // BF16: y rounded once; silu(g) without the up factor is wrong by name.
  s.out = floats("bf16", {3, 128}, {});
  for (int64_t i = 0; i < 256; ++i)
    storeElement("bf16", y, s.out.data.data() + i * 2);
  EXPECT_TRUE(checkSwiglu(spec, {handle}, {s}).empty());
  SwigluRecord noUp = s;
  storeElement("bf16", y / 2, noUp.out.data.data() + 130 * 2);
  EXPECT_TRUE(mentions(checkSwiglu(spec, {handle}, {noUp}), "swiglu out[1] (expert 0) column 2"));
  SwigluRecord padding = s; // the row after the expert's: not the op's to write
  storeElement("bf16", 1.0, padding.out.data.data() + 256 * 2);
  EXPECT_TRUE(mentions(checkSwiglu(spec, {handle}, {padding}), "swiglu out[2] is a padding row"));
  // FP8: every y of a block is its amax, so the scale is y / 448 and every value e4m3 448.
  SwigluRecord fp8 = s;
  fp8.out = floats("f8E4M3FN", {3, 128}, {});
  std::fill(fp8.out.data.begin(), fp8.out.data.begin() + 256, uint8_t(0x7e));
  fp8.scales = floats("f32", {3, 1}, {y / 448, y / 448, 0});
  EXPECT_TRUE(checkSwiglu(spec, {handle}, {fp8}).empty());
  SwigluRecord rescaled = fp8; // a scale off by 1%
  rescaled.scales.as<float>()[1] = float(1.01 * y / 448);
  EXPECT_TRUE(mentions(checkSwiglu(spec, {handle}, {rescaled}), "swiglu scales[1] block 0"));
  // Weights scale each row's y (row 1 by 0.5): its scale halves, its values stay 448.
  SwigluRecord weighted = fp8;
  weighted.weights = floats("f32", {3}, {1.0, 0.5, 1.0});
  EXPECT_TRUE(mentions(checkSwiglu(spec, {handle}, {weighted}), "swiglu scales[1] block 0"));
  weighted.scales.as<float>()[1] = float(0.5 * y / 448);
  EXPECT_TRUE(checkSwiglu(spec, {handle}, {weighted}).empty());
  SwigluRecord rounded = fp8; // 416, a neighbour of the nearest e4m3 (448)
  rounded.out.data[5] = 0x7d;
  EXPECT_TRUE(mentions(checkSwiglu(spec, {handle}, {rounded}), "column 5 is e4m3 416"));
}

TEST(Reference, AllGatherStacksEveryRankInRankOrder) {
  std::vector<HostTensor> inputs = {floats("f32", {2}, {1, 2}), floats("f32", {2}, {3, 4})};
  HostTensor gathered = floats("f32", {2, 2}, {1, 2, 3, 4});
  EXPECT_TRUE(checkAllGather(inputs, {gathered, gathered}).empty());
  HostTensor swapped = floats("f32", {2, 2}, {3, 4, 1, 2});
  EXPECT_TRUE(mentions(checkAllGather(inputs, {gathered, swapped}),
                       "rank 1: gathered[0] differs from rank 0's input at byte "));
  EXPECT_TRUE(mentions(checkAllGather(inputs, {gathered, floats("f32", {2, 1}, {1, 3})}),
                       "rank 1: gathered is f32[2x1]"));
  EXPECT_THROW(checkAllGather({inputs[0], floats("f32", {3}, {1, 2, 3})}, {}),
               std::invalid_argument);
}

TEST(Reference, ReduceScatterSumsInRankOrderInFloat32AndRoundsOnce) {
  // Element 0 of block 0: 2^24 + (-2^24) + 1 + 1 = 2 in rank order; 2^24 + 1 first loses the 1.
  const double big = 16777216.0;
  std::vector<HostTensor> inputs = {
      floats("f32", {4}, {big, 0, 0, 0}), floats("f32", {4}, {-big, 0, 0, 0}),
      floats("f32", {4}, {1, 0, 0, 0}), floats("f32", {4}, {1, 0, 0, 0})};
  std::vector<HostTensor> want = referenceReduceScatter(inputs);
  ASSERT_EQ(want.size(), 4u);
  EXPECT_EQ(want[0].shape, std::vector<int64_t>{1});
  EXPECT_EQ(want[0].at(0), 2.0);
  EXPECT_TRUE(checkReduceScatter(inputs, want).empty());
  // bf16: 1 + 3 x 2^-9 in f32, rounded once, is 1 + 2^-7 (step-by-step bf16 stays at 1).
  std::vector<HostTensor> bf = {floats("bf16", {1}, {1.0}), floats("bf16", {1}, {0.001953125}),
                                floats("bf16", {1}, {0.001953125}),
                                floats("bf16", {1}, {0.001953125})};
  HostTensor sum = sumInRankOrder(bf);
  EXPECT_EQ(sum.at(0), 1.0078125);
  std::vector<HostTensor> wrong = want;
  storeElement("f32", 3.0, wrong[0].data.data());
  EXPECT_TRUE(mentions(checkReduceScatter(inputs, wrong), "rank 0: element 0 is 3"));
  EXPECT_THROW(
      referenceReduceScatter({floats("f32", {3}, {1, 2, 3}), floats("f32", {3}, {1, 2, 3})}),
      std::invalid_argument);
  EXPECT_THROW(referenceReduceScatter({floats("i32", {2}, {1, 2}), floats("i32", {2}, {1, 2})}),
               std::invalid_argument);
}

TEST(RunPlan, AgrsStepsParseAndRefuseMalformedOnes) {
  const std::string random = R"({"op": "random", "loc": "p.mlir:2:1", "result": 1, "rows": 0,
      "distribution": "normal", "scale": 1, "seed": 1, "dtype": "bf16", "cols": 64})";
  const std::string prefix = std::string(kTokens) + "," + random + ",";
  RunPlan plan = RunPlan::parse(planWith(
      prefix + R"({"op": "all_gather", "loc": "p.mlir:3:1", "inputs": [1], "gathered": [2]},
                  {"op": "reduce_scatter", "loc": "p.mlir:4:1", "input": 1, "result": 3})",
      4));
  EXPECT_TRUE(plan.kernels().empty()); // copy engines: no kernel
  expectPlanError(planWith(prefix + R"({"op": "all_gather", "loc": "p.mlir:3:1", "inputs": [1],
                            "gathered": [2, 3]})",
                           4),
                  "one tensor per input (1 inputs, 2 results)");
  expectPlanError(planWith(prefix + R"({"op": "reduce_scatter", "loc": "p.mlir:4:1",
                                        "input": 0, "result": 2})",
                           3),
                  "input must be a tensor, value 0 is an index");
}
