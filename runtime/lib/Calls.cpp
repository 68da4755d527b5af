//===- Calls.cpp - typed dispatch/combine arguments, validated ------------===//

#include "epic/runtime/Calls.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

using namespace epic::runtime;

namespace {

std::string shapeText(const std::vector<int64_t> &shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i)
    os << (i ? ", " : "") << (shape[i] < 0 ? std::string("?") : std::to_string(shape[i]));
  os << "]";
  return os.str();
}

/// One argument's expectations. A negative dimension is free; `minRows`
/// bounds dimension 0 from below where it is a capacity, not a size.
struct Expect {
  const char *name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t minRows = -1;
};

void fail(const std::string &message) { throw std::invalid_argument(message); }

/// Checks a tensor that must be given; 16-byte aligned when rows are moved
/// with 16-byte vectors (`vectorized`).
void check(const DeviceTensor &t, const Expect &e, bool vectorized = false) {
  if (!t.given())
    fail(std::string(e.name) + " is required here but was not given (a null pointer)");
  if (t.dtype != e.dtype)
    fail(std::string(e.name) + " must be " + e.dtype + ", got " + t.dtype +
         (e.dtype != "i32" && e.dtype != "i64" && e.dtype != "f32"
              ? " (the buffer was configured for " + e.dtype + ")"
              : ""));
  bool ok = t.shape.size() == e.shape.size();
  for (size_t i = 0; ok && i < e.shape.size(); ++i)
    ok = e.shape[i] < 0 ? t.shape[i] >= 0 : t.shape[i] == e.shape[i];
  if (!ok)
    fail(std::string(e.name) + " must have shape " + e.dtype + shapeText(e.shape) + ", got " +
         t.describe());
  if (e.minRows >= 0 && t.shape[0] < e.minRows)
    fail(std::string(e.name) + " has " + std::to_string(t.shape[0]) + " rows but the buffer can receive " +
         std::to_string(e.minRows) + " (receive buffers are sized for the worst case)");
  if (vectorized && t.data % 16)
    fail(std::string(e.name) + " must be 16-byte aligned (rows move as 16-byte vectors)");
  if (t.data % 4)
    fail(std::string(e.name) + " must be 4-byte aligned");
}

void forbid(const DeviceTensor &t, const char *name, const std::string &why) {
  if (t.given())
    fail(std::string(name) + " was given but " + why);
}

/// `holder` (the tensor that fixes the token count) holds `tokens` tokens.
void checkTokens(const EPSpec &s, int64_t tokens, const std::string &holder) {
  if (tokens > s.maxTokensPerRank)
    fail(holder + " has " + std::to_string(tokens) +
         " tokens, more than num_max_tokens_per_rank (" + std::to_string(s.maxTokensPerRank) +
         ") the buffer was sized for");
}

void checkHandle(const EPSpec &s, const Handle &h, int64_t tokens) {
  const int64_t R = s.ranks, L = s.experts / s.ranks, K = s.topk;
  check(h.topkIdx, {"handle.topk_idx", "i64", {tokens, K}});
  check(h.dstBufferSlotIdx, {"handle.dst_buffer_slot_idx", "i32", {tokens, K}});
  check(h.recvSrcMetadata,
        {"handle.recv_src_metadata", "i32", {R * s.maxTokensPerRank, K + 2}});
  check(h.psumNumRecvTokensPerRank, {"handle.psum_num_recv_tokens_per_rank", "i32", {R}});
  check(h.numRecvTokensPerExpert, {"handle.num_recv_tokens_per_expert", "i32", {L}});
  check(h.psumNumRecvTokensPerExpert, {"handle.psum_num_recv_tokens_per_expert", "i32", {L}});
}

void putHandle(ParamRecord &r, const Handle &h) {
  r["topk_idx"] = h.topkIdx.data;
  r["recv_src_metadata"] = h.recvSrcMetadata.data;
  r["psum_num_recv_tokens_per_rank"] = h.psumNumRecvTokensPerRank.data;
}

} // namespace

std::string DeviceTensor::describe() const { return dtype + shapeText(shape); }

int64_t epic::runtime::receiveRows(const EPSpec &s) {
  const int64_t rows = int64_t(s.ranks) * s.maxTokensPerRank;
  if (!s.expanded)
    return rows;
  const int64_t L = s.experts / s.ranks, A = s.expertAlignment;
  const int64_t pairs = rows * std::min<int64_t>(s.topk, L) + (A - 1) * L;
  return (pairs + A - 1) / A * A;
}

ParamRecord epic::runtime::dispatchRecord(const EPSpec &s, const DispatchVariant &v,
                                          const DispatchCall &c) {
  s.validate();
  const int64_t H = s.hidden, K = s.topk, S = s.scalePacks, L = s.experts / s.ranks;
  if (!c.x.given() || c.x.shape.size() != 2)
    fail("x must be a [num_tokens, " + std::to_string(H) + "] tensor, got " +
         (c.x.given() ? c.x.describe() : std::string("nothing")));
  const int64_t T = c.x.shape[0];
  checkTokens(s, T, "x");
  check(c.x, {"x", s.dtype, {T, H}}, true);
  if (v.topkIdxBits != 64)
    fail("the typed API takes topk_idx as int64 (DeepEP's topk_idx_t)");
  checkHandle(s, c.handle, T);
  if (s.isFP8()) {
    check(c.scalePacks, {"x_scale_packs", "f32", {T, S}});
  } else {
    forbid(c.scalePacks, "x_scale_packs", "x is " + s.dtype + ", not FP8");
  }
  if (v.cached)
    forbid(c.topkWeights, "topk_weights", "a cached dispatch sends no weights");
  else if (v.weights)
    check(c.topkWeights, {"topk_weights", "f32", {T, K}});
  else
    forbid(c.topkWeights, "topk_weights", "the dispatch was asked for without weights");

  const int64_t rows = receiveRows(s);
  check(c.recvX, {"recv_x", s.dtype, {-1, H}, rows}, true);
  if (s.isFP8())
    check(c.recvScalePacks, {"recv_x_scale_packs", "f32", {-1, S}, rows});
  else
    forbid(c.recvScalePacks, "recv_x_scale_packs", "x is not FP8");
  if (!s.expanded)
    check(c.recvTopkIdx, {"recv_topk_idx", "i64", {-1, K}, rows});
  else
    forbid(c.recvTopkIdx, "recv_topk_idx", "the expanded layout receives no top-k ids");
  if (v.weights && !v.cached) {
    if (s.expanded)
      check(c.recvTopkWeights, {"recv_topk_weights", "f32", {-1}, rows});
    else
      check(c.recvTopkWeights, {"recv_topk_weights", "f32", {-1, K}, rows});
  } else {
    forbid(c.recvTopkWeights, "recv_topk_weights", "no weights are dispatched");
  }
  check(c.hostCounts, {"host_counts", "i32", {1 + L}});

  ParamRecord r;
  putHandle(r, c.handle);
  r["x"] = c.x.data;
  r["scale_packs"] = c.scalePacks.data;
  r["topk_weights"] = c.topkWeights.data;
  r["recv_x"] = c.recvX.data;
  r["recv_scale_packs"] = c.recvScalePacks.data;
  r["recv_topk_idx"] = c.recvTopkIdx.data;
  r["recv_topk_weights"] = c.recvTopkWeights.data;
  r["num_recv_tokens_per_expert"] = c.handle.numRecvTokensPerExpert.data;
  r["psum_num_recv_tokens_per_expert"] = c.handle.psumNumRecvTokensPerExpert.data;
  r["host_counts"] = c.hostCounts.data;
  r["num_tokens"] = uint64_t(T);
  r["dst_buffer_slot_idx"] = c.handle.dstBufferSlotIdx.data;
  return r;
}

ParamRecord epic::runtime::combineRecord(const EPSpec &s, const CombineVariant &v,
                                         const CombineCall &c) {
  s.validate();
  if (v.biases < 0 || v.biases > 2)
    fail("combine takes 0, 1 or 2 biases, got " + std::to_string(v.biases));
  const int64_t H = s.hidden, K = s.topk;
  if (!c.handle.topkIdx.given() || c.handle.topkIdx.shape.size() != 2)
    fail("handle.topk_idx must be the [num_tokens, " + std::to_string(K) +
         "] routing of the dispatch");
  const int64_t T = c.handle.topkIdx.shape[0];
  checkTokens(s, T, "handle.topk_idx");
  checkHandle(s, c.handle, T);
  const int64_t rows = receiveRows(s);
  check(c.x, {"x", "bf16", {-1, H}}, true);
  if (c.x.shape[0] > rows)
    fail("x has " + std::to_string(c.x.shape[0]) + " rows, more than a dispatch can receive (" +
         std::to_string(rows) + ")");
  if (v.weights) {
    if (s.expanded)
      check(c.topkWeights, {"topk_weights", "f32", {c.x.shape[0]}});
    else
      check(c.topkWeights, {"topk_weights", "f32", {c.x.shape[0], K}});
    check(c.combinedTopkWeights, {"combined_topk_weights", "f32", {T, K}});
  } else {
    forbid(c.topkWeights, "topk_weights", "the combine was asked for without weights");
    forbid(c.combinedTopkWeights, "combined_topk_weights", "no weights are combined");
  }
  if (v.biases >= 1)
    check(c.bias0, {"bias_0", "bf16", {T, H}}, true);
  else
    forbid(c.bias0, "bias_0", "the combine was asked for without biases");
  if (v.biases == 2)
    check(c.bias1, {"bias_1", "bf16", {T, H}}, true);
  else
    forbid(c.bias1, "bias_1", "the combine was asked for with fewer than two biases");
  check(c.combinedX, {"combined_x", "bf16", {T, H}}, true);

  ParamRecord r;
  putHandle(r, c.handle);
  r["x"] = c.x.data;
  r["topk_weights"] = c.topkWeights.data;
  r["bias0"] = c.bias0.data;
  r["bias1"] = c.bias1.data;
  r["combined_x"] = c.combinedX.data;
  r["combined_topk_weights"] = c.combinedTopkWeights.data;
  r["num_tokens"] = uint64_t(T);
  return r;
}

ParamRecord epic::runtime::groupedGemmRecord(const EPSpec &s, const GroupedGemmCall &c) {
  s.validate();
  if (!s.expanded)
    fail("grouped_gemm needs an expanded dispatch (one row per (token, local expert) pair)");
  if (s.dtype != "bf16" && s.dtype != "f16")
    fail("grouped_gemm multiplies bf16 or f16 rows; the buffer dispatches " + s.dtype);
  const int64_t H = s.hidden, L = s.experts / s.ranks;
  check(c.x, {"x", s.dtype, {-1, H}}, true);
  if (c.x.shape[0] > receiveRows(s))
    fail("x has " + std::to_string(c.x.shape[0]) + " rows, more than a dispatch can receive (" +
         std::to_string(receiveRows(s)) + ")");
  if (c.weights.shape.size() != 3 || c.weights.shape[0] != L || c.weights.shape[1] != H)
    fail("weights must have shape " + s.dtype + "[" + std::to_string(L) + ", " +
         std::to_string(H) + ", N], got " + c.weights.describe());
  const int64_t N = c.weights.shape[2];
  check(c.weights, {"weights", s.dtype, {L, H, N}}, true);
  if (c.out.dtype != "bf16" && c.out.dtype != "f16" && c.out.dtype != "f32")
    fail("out must be bf16, f16 or f32, got " + c.out.dtype);
  check(c.out, {"out", c.out.dtype, {c.x.shape[0], N}}, true);
  check(c.psumNumRecvTokensPerExpert, {"handle.psum_num_recv_tokens_per_expert", "i32", {L}});
  ParamRecord r;
  r["x"] = c.x.data;
  r["weights"] = c.weights.data;
  r["out"] = c.out.data;
  r["psum_num_recv_tokens_per_expert"] = c.psumNumRecvTokensPerExpert.data;
  r["num_rows"] = uint64_t(c.x.shape[0]);
  return r;
}

ParamRecord epic::runtime::dispatchGemmRecord(const EPSpec &s, const DispatchVariant &v,
                                              const DispatchGemmCall &c) {
  ParamRecord r = dispatchRecord(s, v, c.dispatch);
  const int64_t H = s.hidden, L = s.experts / s.ranks;
  if (c.experts.shape.size() != 3 || c.experts.shape[0] != L || c.experts.shape[1] != H)
    fail("experts must have shape " + s.dtype + "[" + std::to_string(L) + ", " +
         std::to_string(H) + ", N], got " + c.experts.describe());
  const int64_t N = c.experts.shape[2];
  check(c.experts, {"experts", s.dtype, {L, H, N}}, true);
  if (c.gemmOut.dtype != "bf16" && c.gemmOut.dtype != "f16" && c.gemmOut.dtype != "f32")
    fail("gemm_out must be bf16, f16 or f32, got " + c.gemmOut.dtype);
  check(c.gemmOut, {"gemm_out", c.gemmOut.dtype, {c.dispatch.recvX.shape[0], N}}, true);
  r["experts"] = c.experts.data;
  r["gemm_out"] = c.gemmOut.data;
  return r;
}

ParamRecord epic::runtime::gemmCombineRecord(const EPSpec &s, int biases,
                                             const GemmCombineCall &c) {
  ParamRecord r = combineRecord(s, CombineVariant{false, biases}, c.combine);
  GroupedGemmCall gemm{c.lhs, c.weights, c.combine.x, c.combine.handle.psumNumRecvTokensPerExpert};
  ParamRecord g = groupedGemmRecord(s, gemm);
  if (c.weights.shape.size() == 3 && c.weights.shape[2] != s.hidden)
    fail("weights must be [" + std::to_string(s.experts / s.ranks) + ", " +
         std::to_string(s.hidden) + ", " + std::to_string(s.hidden) +
         "]: the combine sends hidden-wide rows, got " + c.weights.describe());
  r["lhs"] = g.at("x");
  r["weights"] = g.at("weights");
  r["psum_num_recv_tokens_per_expert"] = g.at("psum_num_recv_tokens_per_expert");
  r["num_rows"] = g.at("num_rows");
  return r;
}

void epic::runtime::checkTopkIndices(const EPSpec &s, const int64_t *idx, int64_t tokens) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < s.topk; ++j) {
      int64_t e = idx[t * s.topk + j];
      if (e < -1 || e >= s.experts)
        fail("topk_idx[" + std::to_string(t) + "][" + std::to_string(j) + "] = " +
             std::to_string(e) + " is out of range: expert ids are in [0, " +
             std::to_string(s.experts) + "), -1 masks a slot");
    }
}
