//===- Calls.cpp - typed dispatch/combine arguments, validated ------------===//

#include "epic/runtime/Calls.h"
#include "epic/runtime/Reference.h"

#include "epic/Dialect/EP/IR/EPLimits.h"
#include "epic/Dialect/EP/IR/EPRecords.h"

#include <algorithm>
#include <sstream>
#include <string_view>
#include <stdexcept>
#include <tuple>

using namespace epic::runtime;

namespace {
// The records' field names (EPRecords.def): the kernels read the same fields by index.
namespace dispatch = epic::ep::records::dispatch;
namespace combine = epic::ep::records::combine;
namespace grouped_gemm = epic::ep::records::grouped_gemm;
namespace layout = epic::ep::records::layout;
namespace engram = epic::ep::records::engram;
namespace swiglu = epic::ep::records::swiglu;
namespace ll_dispatch = epic::ep::records::ll_dispatch;
namespace ll_combine = epic::ep::records::ll_combine;
// putHandle fills the fields the dispatch and combine records share.
static_assert(std::string_view(dispatch::topk_idx) == combine::topk_idx &&
              std::string_view(dispatch::recv_src_metadata) == combine::recv_src_metadata &&
              std::string_view(dispatch::psum_num_recv_tokens_per_rank) ==
                  combine::psum_num_recv_tokens_per_rank &&
              std::string_view(dispatch::fwd_src_metadata) == combine::fwd_src_metadata &&
              std::string_view(dispatch::fwd_counts) == combine::fwd_counts);

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
/// with 16-byte vectors (`vectorized`). Returns its record field.
ParamValue check(const DeviceTensor &t, const Expect &e, bool vectorized = false) {
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
    fail(std::string(e.name) + " has " + std::to_string(t.shape[0]) +
         " rows but the buffer can receive " + std::to_string(e.minRows) +
         " (receive buffers are sized for the worst case)");
  if (vectorized && t.data % 16)
    fail(std::string(e.name) + " must be 16-byte aligned (rows move as 16-byte vectors)");
  if (t.data % 4)
    fail(std::string(e.name) + " must be 4-byte aligned");
  return ParamValue(t, vectorized ? 16 : 4);
}

void forbid(const DeviceTensor &t, const char *name, const std::string &why) {
  if (t.given())
    fail(std::string(name) + " was given but " + why);
}

/// window_outputs: field `field` (set, if its tensor is given) must lie in the
/// rank's window, where peers reach it.
void inWindow(ParamRecord &r, const char *field, const DeviceTensor &t) {
  auto at = r.find(field);
  if (at == r.end() || !t.given())
    return;
  at->second.inWindow = true;
  at->second.bytes = t.bytes();
}

/// `holder` (the tensor that fixes the token count) holds `tokens` tokens.
void checkTokens(const EPSpec &s, int64_t tokens, const std::string &holder) {
  if (tokens > s.maxTokensPerRank)
    fail(holder + " has " + std::to_string(tokens) +
         " tokens, more than num_max_tokens_per_rank (" + std::to_string(s.maxTokensPerRank) +
         ") the buffer was sized for");
}

/// The handle's tensors, shaped by `handleOutputs`; `routing` names its
/// topk_idx (an uncached dispatch's is the caller's topk_idx argument).
void checkHandle(const EPSpec &s, const Handle &h, int64_t tokens, const char *routing);

/// Checks the handle and puts the fields every kernel set reads.
void putHandle(ParamRecord &r, const EPSpec &s, const Handle &h, int64_t tokens,
               const char *routing = "handle.topk_idx") {
  checkHandle(s, h, tokens, routing);
  r[dispatch::topk_idx] = ParamValue(h.topkIdx, 8);
  r[dispatch::recv_src_metadata] = ParamValue(h.recvSrcMetadata, 4);
  r[dispatch::psum_num_recv_tokens_per_rank] = ParamValue(h.psumNumRecvTokensPerRank, 4);
  if (s.hybridNodes()) {
    r[dispatch::fwd_src_metadata] = ParamValue(h.fwdSrcMetadata, 4);
    r[dispatch::fwd_counts] = ParamValue(h.fwdCounts, 4);
  }
}

/// The handle's tensors of a dispatch of `tokens` tokens: what the uncached
/// dispatch writes and the combine and cached dispatches read.
std::vector<TensorSpec> handleOutputs(const EPSpec &s, int64_t tokens) {
  const int64_t R = s.ranks, L = s.experts / s.ranks, K = s.topk, N = s.hybridNodes();
  // Hybrid: rows are grouped per forwarder index (M groups), and the
  // forwarder keeps its items' metadata and counts.
  std::vector<TensorSpec> specs = {{"dst_buffer_slot_idx", "i32", {tokens, K}},
                                   {"recv_src_metadata", "i32", {R * s.maxTokensPerRank, K + 2}},
                                   {"psum_num_recv_tokens_per_rank", "i32", {N ? R / N : R}},
                                   {"num_recv_tokens_per_expert", "i32", {L}},
                                   {"psum_num_recv_tokens_per_expert", "i32", {L}}};
  if (N) {
    specs.push_back({"fwd_src_metadata", "i32", {N * s.maxTokensPerRank, K + 2}});
    specs.push_back({"fwd_counts", "i32", {N}});
  }
  return specs;
}

void checkHandle(const EPSpec &s, const Handle &h, int64_t tokens, const char *routing) {
  check(h.topkIdx, {routing, "i64", {tokens, s.topk}});
  const DeviceTensor *tensors[] = {&h.dstBufferSlotIdx,
                                   &h.recvSrcMetadata,
                                   &h.psumNumRecvTokensPerRank,
                                   &h.numRecvTokensPerExpert,
                                   &h.psumNumRecvTokensPerExpert,
                                   &h.fwdSrcMetadata,
                                   &h.fwdCounts};
  std::vector<TensorSpec> specs = handleOutputs(s, tokens);
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string name = "handle." + specs[i].name;
    check(*tensors[i], {name.c_str(), specs[i].dtype, specs[i].shape});
  }
  if (!s.hybridNodes()) {
    forbid(h.fwdSrcMetadata, "handle.fwd_src_metadata", "only hybrid mode has forwarders");
    forbid(h.fwdCounts, "handle.fwd_counts", "only hybrid mode has forwarders");
  }
  if (s.expanded)
    forbid(h.recvRowOfSlot, "handle.recv_row_of_slot",
           "expanded rows are found through recv_src_metadata");
  else if (h.recvRowOfSlot.given())
    check(h.recvRowOfSlot, {"handle.recv_row_of_slot", "i32", {s.ranks * s.maxTokensPerRank}});
}

} // namespace

std::string DeviceTensor::describe() const { return dtype + shapeText(shape); }

int64_t DeviceTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t DeviceTensor::bytes() const { return elements() * dtypeBytes(dtype); }

std::vector<TensorSpec> epic::runtime::dispatchOutputs(const EPSpec &s, const DispatchVariant &v,
                                                       int64_t tokens) {
  s.validate();
  const int64_t rows = receiveRows(s), L = s.experts / s.ranks;
  std::vector<TensorSpec> out = {{"recv_x", s.dtype, {rows, s.hidden}}};
  if (s.isFP8())
    out.push_back({"recv_x_scale_packs", "f32", {rows, s.scalePacks}});
  if (!s.expanded)
    out.push_back({"recv_topk_idx", "i64", {rows, s.topk}});
  if (v.cached)
    return out;
  if (v.weights)
    out.push_back({"recv_topk_weights", "f32",
                   s.expanded ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, s.topk}});
  out.push_back({"host_counts", "i32", {1 + L}});
  for (TensorSpec &t : handleOutputs(s, tokens))
    out.push_back(std::move(t));
  return out;
}

std::vector<TensorSpec> epic::runtime::combineOutputs(const EPSpec &s, const CombineVariant &v,
                                                      int64_t tokens) {
  s.validate();
  std::vector<TensorSpec> out = {{"combined_x", "bf16", {tokens, s.hidden}}};
  if (v.weights)
    out.push_back({"combined_topk_weights", "f32", {tokens, s.topk}});
  return out;
}

int64_t epic::runtime::receiveRows(const EPSpec &s) {
  return epic::ep::limits::worstCaseRows(s.ranks, s.experts, s.topk, s.expertAlignment,
                                         s.maxTokensPerRank, s.expanded);
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
  ParamRecord r;
  r[dispatch::x] = check(c.x, {"x", s.dtype, {T, H}}, true);
  if (v.topkIdxBits != 64)
    fail("the typed API takes topk_idx as int64 (DeepEP's topk_idx_t)");
  putHandle(r, s, c.handle, T, v.cached ? "handle.topk_idx" : "topk_idx");
  if (s.isFP8()) {
    r[dispatch::scale_packs] = check(c.scalePacks, {"x_scale_packs", "f32", {T, S}});
  } else {
    forbid(c.scalePacks, "x_scale_packs", "x is " + s.dtype + ", not FP8");
  }
  if (v.cached)
    forbid(c.topkWeights, "topk_weights", "a cached dispatch sends no weights");
  else if (v.weights)
    r[dispatch::topk_weights] = check(c.topkWeights, {"topk_weights", "f32", {T, K}});
  else
    forbid(c.topkWeights, "topk_weights", "the dispatch was asked for without weights");
  if (v.cached)
    forbid(c.topkIdxCopy, "handle topk_idx copy", "a cached dispatch writes no handle");
  else if (c.topkIdxCopy.given()) // the send kernel writes it (DeepEP's do_handle_copy)
    r[dispatch::topk_idx_copy] =
        check(c.topkIdxCopy, {"handle.topk_idx (the copy)", "i64", {T, K}});

  const int64_t rows = receiveRows(s);
  r[dispatch::recv_x] = check(c.recvX, {"recv_x", s.dtype, {-1, H}, rows}, true);
  if (s.isFP8())
    r[dispatch::recv_scale_packs] =
        check(c.recvScalePacks, {"recv_x_scale_packs", "f32", {-1, S}, rows});
  else
    forbid(c.recvScalePacks, "recv_x_scale_packs", "x is not FP8");
  if (!s.expanded)
    r[dispatch::recv_topk_idx] = check(c.recvTopkIdx, {"recv_topk_idx", "i64", {-1, K}, rows});
  else
    forbid(c.recvTopkIdx, "recv_topk_idx", "the expanded layout receives no top-k ids");
  if (v.weights && !v.cached) {
    if (s.expanded)
      r[dispatch::recv_topk_weights] =
          check(c.recvTopkWeights, {"recv_topk_weights", "f32", {-1}, rows});
    else
      r[dispatch::recv_topk_weights] =
          check(c.recvTopkWeights, {"recv_topk_weights", "f32", {-1, K}, rows});
  } else {
    forbid(c.recvTopkWeights, "recv_topk_weights", "no weights are dispatched");
  }
  // A cached dispatch knows its counts from the handle and writes none.
  if (!v.cached || c.hostCounts.given())
    r[dispatch::host_counts] = check(c.hostCounts, {"host_counts", "i32", {1 + L}});
  r[dispatch::num_recv_tokens_per_expert] = ParamValue(c.handle.numRecvTokensPerExpert, 4);
  r[dispatch::psum_num_recv_tokens_per_expert] = ParamValue(c.handle.psumNumRecvTokensPerExpert, 4);
  r[dispatch::num_tokens] = uint64_t(T);
  r[dispatch::dst_buffer_slot_idx] = ParamValue(c.handle.dstBufferSlotIdx, 4);
  r[dispatch::max_tokens_per_rank] = uint64_t(s.maxTokensPerRank);
  if (v.windowOutputs) { // what the senders write, and the counts they read, at this rank
    inWindow(r, dispatch::recv_x, c.recvX);
    inWindow(r, dispatch::recv_scale_packs, c.recvScalePacks);
    inWindow(r, dispatch::recv_topk_idx, c.recvTopkIdx);
    inWindow(r, dispatch::recv_topk_weights, c.recvTopkWeights);
    inWindow(r, dispatch::recv_src_metadata, c.handle.recvSrcMetadata);
    inWindow(r, dispatch::psum_num_recv_tokens_per_rank, c.handle.psumNumRecvTokensPerRank);
    inWindow(r, dispatch::num_recv_tokens_per_expert, c.handle.numRecvTokensPerExpert);
    inWindow(r, dispatch::psum_num_recv_tokens_per_expert, c.handle.psumNumRecvTokensPerExpert);
  }
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
  ParamRecord r;
  putHandle(r, s, c.handle, T);
  const int64_t rows = receiveRows(s);
  r[combine::x] = check(c.x, {"x", "bf16", {-1, H}}, true);
  if (c.x.shape[0] > rows)
    fail("x has " + std::to_string(c.x.shape[0]) + " rows, more than a dispatch can receive (" +
         std::to_string(rows) + ")");
  if (v.weights) {
    if (s.expanded)
      r[combine::topk_weights] = check(c.topkWeights, {"topk_weights", "f32", {c.x.shape[0]}});
    else
      r[combine::topk_weights] = check(c.topkWeights, {"topk_weights", "f32", {c.x.shape[0], K}});
    r[combine::combined_topk_weights] =
        check(c.combinedTopkWeights, {"combined_topk_weights", "f32", {T, K}});
  } else {
    forbid(c.topkWeights, "topk_weights", "the combine was asked for without weights");
    forbid(c.combinedTopkWeights, "combined_topk_weights", "no weights are combined");
  }
  if (v.biases >= 1)
    r[combine::bias0] = check(c.bias0, {"bias_0", "bf16", {T, H}}, true);
  else
    forbid(c.bias0, "bias_0", "the combine was asked for without biases");
  if (v.biases == 2)
    r[combine::bias1] = check(c.bias1, {"bias_1", "bf16", {T, H}}, true);
  else
    forbid(c.bias1, "bias_1", "the combine was asked for with fewer than two biases");
  r[combine::combined_x] = check(c.combinedX, {"combined_x", "bf16", {T, H}}, true);
  r[combine::num_tokens] = uint64_t(T);
  r[combine::max_tokens_per_rank] = uint64_t(s.maxTokensPerRank);
  r[combine::dst_buffer_slot_idx] = ParamValue(c.handle.dstBufferSlotIdx, 4);
  r[combine::recv_row_of_slot] = ParamValue(c.handle.recvRowOfSlot, 4);
  if (v.windowOutputs) { // what the origins read at this rank
    inWindow(r, combine::x, c.x);
    inWindow(r, combine::topk_weights, c.topkWeights);
    inWindow(r, combine::recv_src_metadata, c.handle.recvSrcMetadata);
    inWindow(r, combine::psum_num_recv_tokens_per_rank, c.handle.psumNumRecvTokensPerRank);
    inWindow(r, combine::recv_row_of_slot, c.handle.recvRowOfSlot);
  }
  return r;
}

ParamRecord epic::runtime::groupedGemmRecord(const EPSpec &s, const GroupedGemmCall &c) {
  s.validate();
  if (!s.expanded)
    fail("grouped_gemm needs an expanded dispatch (one row per (token, local expert) pair)");
  const bool fp8 = s.dtype == "f8E4M3FN";
  if (s.dtype != "bf16" && s.dtype != "f16" && !fp8)
    fail("grouped_gemm multiplies bf16, f16 or f8E4M3FN rows; the buffer dispatches " + s.dtype);
  const int64_t L = s.experts / s.ranks, block = 128;
  ParamRecord r;
  // K: the rows' width, the hidden size for the dispatch's rows, an expert's intermediate
  // size for its down GEMM's.
  r[grouped_gemm::x] = check(c.x, {"x", s.dtype, {-1, -1}}, true);
  const int64_t K = c.x.shape[1];
  if (K < 1 || K % (fp8 ? block : 64))
    fail("x has " + std::to_string(K) + " columns: the grouped GEMM steps through K in blocks of " +
         (fp8 ? "128 (the FP8 scale blocks)" : std::string("64")) +
         ", K must be a positive multiple");
  if (c.x.shape[0] > receiveRows(s))
    fail("x has " + std::to_string(c.x.shape[0]) + " rows, more than a dispatch can receive (" +
         std::to_string(receiveRows(s)) + ")");
  const GemmWeightsLayout at = gemmWeightsLayout(fp8);
  if (c.weights.shape.size() != 3 || c.weights.shape[0] != L || c.weights.shape[at.k] != K)
    fail("weights must have shape " + s.dtype + "[" + std::to_string(L) + ", " +
         (fp8 ? "N, " + std::to_string(K) : std::to_string(K) + ", N") + "] (K = x's " +
         std::to_string(K) + " columns), got " + c.weights.describe());
  const int64_t N = c.weights.shape[at.n];
  r[grouped_gemm::weights] = check(
      c.weights,
      {"weights", s.dtype, fp8 ? std::vector<int64_t>{L, N, K} : std::vector<int64_t>{L, K, N}},
      true);
  if (fp8) {
    if (N % block) // (K's multiple of 128 is checked with x)
      fail("the FP8 grouped GEMM scales blocks of 128 channels: N (" + std::to_string(N) +
           ") must be a multiple of 128");
    if (c.xScales.given() && c.xScales.shape.size() == 2 && c.xScales.shape[1] != K / block)
      fail("x_scales must have shape f32[" + std::to_string(c.x.shape[0]) + ", " +
           std::to_string(K / block) + "] (one f32 scale per 128 channels), got " +
           c.xScales.describe() +
           (K == s.hidden && s.scalePacks != K / block
                ? ": the dispatch's " + std::to_string(s.scalePacks) +
                      " scale packs a row (UE8M0-packed scales are not multiplied yet)"
                : ""));
    r[grouped_gemm::x_scales] = check(c.xScales, {"x_scales", "f32", {c.x.shape[0], K / block}});
    r[grouped_gemm::weight_scales] =
        check(c.weightScales, {"weight_scales", "f32", {L, N / block, K / block}});
  } else {
    forbid(c.xScales, "x_scales", "block scales are for FP8 rows; x is " + s.dtype);
    forbid(c.weightScales, "weight_scales", "block scales are for FP8 rows; x is " + s.dtype);
  }
  if (c.out.dtype != "bf16" && c.out.dtype != "f16" && c.out.dtype != "f32")
    fail("out must be bf16, f16 or f32, got " + c.out.dtype);
  r[grouped_gemm::out] = check(c.out, {"out", c.out.dtype, {c.x.shape[0], N}}, true);
  r[grouped_gemm::psum_num_recv_tokens_per_expert] =
      check(c.psumNumRecvTokensPerExpert, {"handle.psum_num_recv_tokens_per_expert", "i32", {L}});
  r[grouped_gemm::num_rows] = uint64_t(c.x.shape[0]);
  return r;
}

ParamRecord epic::runtime::swigluRecord(const EPSpec &s, const SwigluCall &c) {
  s.validate();
  if (!s.expanded)
    fail("swiglu needs an expanded dispatch's rows (one per (token, local expert) pair)");
  const int64_t L = s.experts / s.ranks, block = 128;
  const std::string &in = c.gateUp.dtype, &out = c.out.dtype;
  if (c.gateUp.given() && in != "bf16" && in != "f16" && in != "f32")
    fail("gate_up must be bf16, f16 or f32 (the gate/up GEMM's output), got " + in);
  ParamRecord r;
  r[swiglu::gate_up] = check(c.gateUp, {"gate_up", in, {-1, -1}}, true);
  const int64_t rows = c.gateUp.shape[0], width = c.gateUp.shape[1];
  if (width < 1 || width % (2 * block))
    fail("gate_up has " + std::to_string(width) +
         " columns: the gate then the up columns of 128-channel blocks, a positive multiple of "
         "256");
  if (rows > receiveRows(s))
    fail("gate_up has " + std::to_string(rows) + " rows, more than a dispatch can receive (" +
         std::to_string(receiveRows(s)) + ")");
  if (out != "bf16" && out != "f16" && out != "f32" && out != "f8E4M3FN")
    fail("out must be bf16, f16, f32 or f8E4M3FN, got " + out);
  const int64_t inter = width / 2;
  r[swiglu::out] = check(c.out, {"out", out, {rows, inter}}, true);
  if (out == "f8E4M3FN")
    r[swiglu::scales] = check(c.scales, {"scales", "f32", {rows, inter / block}});
  else
    forbid(c.scales, "scales", "block scales come with FP8 results only; out is " + out);
  r[swiglu::psum_num_recv_tokens_per_expert] =
      check(c.psumNumRecvTokensPerExpert, {"handle.psum_num_recv_tokens_per_expert", "i32", {L}});
  r[swiglu::num_rows] = uint64_t(rows);
  // Optional: a null field is weight 1 (the kernel reads the record, one kernel for both).
  if (c.weights.given())
    r[swiglu::weights] = check(c.weights, {"weights", "f32", {rows}});
  return r;
}

ParamRecord epic::runtime::layoutRecord(const EPSpec &s, const LayoutCall &c) {
  s.validate();
  const int64_t T = c.topkIdx.shape.empty() ? 0 : c.topkIdx.shape[0];
  const std::string &idx = c.topkIdx.dtype;
  if (idx != "i32" && idx != "i64")
    fail("topk_idx must be an i32 or i64 tensor, got " + c.topkIdx.describe());
  ParamRecord r;
  r[layout::topk_idx] = check(c.topkIdx, {"topk_idx", idx, {-1, s.topk}});
  if (T > s.maxTokensPerRank)
    fail("topk_idx has " + std::to_string(T) + " tokens, more than num_max_tokens_per_rank (" +
         std::to_string(s.maxTokensPerRank) + ")");
  r[layout::num_tokens] = uint64_t(T);
  r[layout::num_tokens_per_rank] =
      check(c.numTokensPerRank, {"num_tokens_per_rank", "i32", {s.ranks}});
  r[layout::num_tokens_per_expert] =
      check(c.numTokensPerExpert, {"num_tokens_per_expert", "i32", {s.experts}});
  r[layout::is_token_in_rank] = check(c.isTokenInRank, {"is_token_in_rank", "i1", {T, s.ranks}});
  return r;
}

namespace {
/// Low-latency mode's common checks: the cap, one NVLink domain, a parity,
/// integer top-k ids of K columns; returns (T, L, R x cap).
std::tuple<int64_t, int64_t, int64_t> lowLatencyShape(const EPSpec &s, int parity,
                                                      const DeviceTensor &ids) {
  s.validate();
  if (s.ranksPerNode() != s.ranks)
    fail("low-latency mode sends through NVLink: every rank must be in one NVLink domain "
         "(scaleup_ranks " +
         std::to_string(s.ranksPerNode()) + " of " + std::to_string(s.ranks) + ")");
  if (s.hidden % 128)
    fail("low-latency mode needs hidden to be a multiple of 128, got " + std::to_string(s.hidden));
  if (parity != 0 && parity != 1)
    fail("the low-latency region's parity must be 0 or 1, got " + std::to_string(parity));
  if (ids.dtype != "i32" && ids.dtype != "i64")
    fail("topk_idx must be an i32 or i64 tensor, got " + ids.describe());
  if (ids.shape.size() != 2)
    fail("topk_idx must be [tokens, top-k], got " + ids.describe());
  const int64_t T = ids.shape[0];
  if (T > s.maxTokensPerRank)
    fail("topk_idx has " + std::to_string(T) +
         " tokens, more than num_max_dispatch_tokens_per_rank (" +
         std::to_string(s.maxTokensPerRank) + ")");
  return {T, s.experts / s.ranks, int64_t(s.ranks) * s.maxTokensPerRank};
}
} // namespace

ParamRecord epic::runtime::lowLatencyDispatchRecord(const EPSpec &s, const DispatchVariant &v,
                                                    int parity, const LowLatencyDispatchCall &c) {
  auto [T, L, rows] = lowLatencyShape(s, parity, c.topkIdx);
  const bool fp8 = s.dtype == "f8E4M3FN";
  if (!fp8 && s.dtype != "bf16")
    fail("the received rows must be bf16 or f8E4M3FN, got " + s.dtype);
  if (v.useUe8m0 && !v.roundScale)
    fail("use_ue8m0 needs round_scale (UE8M0 scales are powers of two)");
  if (!fp8 && (v.roundScale || v.useUe8m0))
    fail("round_scale and use_ue8m0 need use_fp8");
  const int64_t groups = s.hidden / 128;
  ParamRecord r;
  r[ll_dispatch::x] = check(c.x, {"x", "bf16", {T, s.hidden}}, /*vectorized=*/true);
  r[ll_dispatch::topk_idx] = check(c.topkIdx, {"topk_idx", c.topkIdx.dtype, {T, s.topk}});
  r[ll_dispatch::num_tokens] = uint64_t(T);
  r[ll_dispatch::max_tokens_per_rank] = uint64_t(s.maxTokensPerRank);
  r[ll_dispatch::parity] = uint64_t(parity);
  r[ll_dispatch::recv_x] =
      check(c.recvX, {"recv_x", s.dtype, {L, rows, s.hidden}}, /*vectorized=*/true);
  if (fp8)
    r[ll_dispatch::recv_scales] =
        v.useUe8m0 ? check(c.recvScales, {"recv_x_scales", "i32", {L, (groups + 3) / 4, rows}})
                   : check(c.recvScales, {"recv_x_scales", "f32", {L, groups, rows}});
  else
    forbid(c.recvScales, "recv_x_scales", "bf16 rows have no scales");
  r[ll_dispatch::recv_count] = check(c.recvCount, {"recv_count", "i32", {L}});
  r[ll_dispatch::recv_src_info] = check(c.srcInfo, {"src_info", "i32", {L, rows}});
  r[ll_dispatch::recv_layout_range] = check(c.layoutRange, {"layout_range", "i64", {L, s.ranks}});
  r[ll_dispatch::recv_route] = check(c.route, {"route", "i32", {L, rows}});
  if (c.stats.given())
    r[ll_dispatch::cumulative_recv_stats] =
        check(c.stats, {"cumulative_local_expert_recv_stats", "i32", {L}});
  else
    r[ll_dispatch::cumulative_recv_stats] = uint64_t(0);
  return r;
}

ParamRecord epic::runtime::lowLatencyCombineRecord(const EPSpec &s, int parity,
                                                   const LowLatencyCombineCall &c) {
  auto [T, L, rows] = lowLatencyShape(s, parity, c.topkIdx);
  ParamRecord r;
  r[ll_combine::x] = check(c.x, {"x", "bf16", {L, rows, s.hidden}}, /*vectorized=*/true);
  r[ll_combine::layout_range] = check(c.layoutRange, {"layout_range", "i64", {L, s.ranks}});
  r[ll_combine::route] = check(c.route, {"route", "i32", {L, rows}});
  r[ll_combine::topk_idx] = check(c.topkIdx, {"topk_idx", c.topkIdx.dtype, {T, s.topk}});
  r[ll_combine::topk_weights] = check(c.topkWeights, {"topk_weights", "f32", {T, s.topk}});
  r[ll_combine::num_tokens] = uint64_t(T);
  r[ll_combine::max_tokens_per_rank] = uint64_t(s.maxTokensPerRank);
  r[ll_combine::parity] = uint64_t(parity);
  r[ll_combine::combined_x] = check(c.out, {"out", "bf16", {T, s.hidden}}, /*vectorized=*/true);
  return r;
}

ParamRecord epic::runtime::engramRecord(const EPSpec &s, int64_t entriesPerRank,
                                        int64_t tableOffset, uint64_t ownTable,
                                        const EngramCall &c) {
  s.validate();
  if (c.indices.shape.size() != 2)
    fail("indices must be [tokens, entries per token], got " + c.indices.describe());
  const int64_t T = c.indices.shape[0], M = c.indices.shape[1];
  if (entriesPerRank < 0 || int64_t(s.ranks) * entriesPerRank > (int64_t(1) << 31))
    fail("entries per rank (" + std::to_string(entriesPerRank) + ") x " + std::to_string(s.ranks) +
         " ranks must be ids an i32 holds");
  if (T * M > (int64_t(1) << 31) - 1)
    fail("indices has " + std::to_string(T * M) + " ids, more than the kernel's 32-bit rows");
  ParamRecord r;
  r[engram::indices] = check(c.indices, {"indices", "i32", {T, M}});
  r[engram::num_rows] = uint64_t(T * M);
  r[engram::entries_per_rank] = uint64_t(entriesPerRank);
  r[engram::table_offset] = uint64_t(tableOffset);
  r[engram::own_table] = ownTable;
  r[engram::out] = check(c.out, {"out", s.dtype, {T, M * s.hidden}}, /*vectorized=*/true);
  return r;
}

ParamRecord epic::runtime::dispatchGemmRecord(const EPSpec &s, const DispatchVariant &v,
                                              const DispatchGemmCall &c) {
  ParamRecord r = dispatchRecord(s, v, c.dispatch);
  const int64_t H = s.hidden, L = s.experts / s.ranks;
  if (c.experts.shape.size() != 3 || c.experts.shape[0] != L || c.experts.shape[1] != H)
    fail("experts must have shape " + s.dtype + "[" + std::to_string(L) + ", " + std::to_string(H) +
         ", N], got " + c.experts.describe());
  const int64_t N = c.experts.shape[2];
  r[dispatch::experts] = check(c.experts, {"experts", s.dtype, {L, H, N}}, true);
  if (c.gemmOut.dtype != "bf16" && c.gemmOut.dtype != "f16" && c.gemmOut.dtype != "f32")
    fail("gemm_out must be bf16, f16 or f32, got " + c.gemmOut.dtype);
  r[dispatch::gemm_out] =
      check(c.gemmOut, {"gemm_out", c.gemmOut.dtype, {c.dispatch.recvX.shape[0], N}}, true);
  return r;
}

ParamRecord epic::runtime::gemmCombineRecord(const EPSpec &s, int biases,
                                             const GemmCombineCall &c) {
  ParamRecord r = combineRecord(s, CombineVariant{false, biases}, c.combine);
  if (c.weights.shape.size() == 3 && c.weights.shape[2] != s.hidden)
    fail("weights must be [" + std::to_string(s.experts / s.ranks) + ", " +
         std::to_string(s.hidden) + ", " + std::to_string(s.hidden) +
         "]: the combine sends hidden-wide rows, got " + c.weights.describe());
  // The GEMM's lhs is the caller's x (the dispatch's rows); its output is the combine's x.
  if (c.lhs.shape.size() == 2 && c.lhs.shape[1] != s.hidden)
    fail("x must have " + std::to_string(s.hidden) +
         " columns (the dispatch's rows: the fused "
         "GEMM + combine multiplies hidden-wide rows), got " +
         c.lhs.describe());
  GroupedGemmCall gemm{c.lhs, c.weights, c.combine.x, c.combine.handle.psumNumRecvTokensPerExpert};
  ParamRecord g = groupedGemmRecord(s, gemm);
  for (const char *field :
       {combine::weights, combine::psum_num_recv_tokens_per_expert, combine::num_rows})
    r[field] = g.at(field);
  r[combine::lhs] = g.at(grouped_gemm::x);
  return r;
}

ParamRecord epic::runtime::moeLayerRecord(const EPSpec &s, const DispatchVariant &v,
                                          const MoeLayerCall &c) {
  if (s.dtype != "f8E4M3FN" || !s.expanded)
    fail("the MoE layer runs FP8 rows of the expanded layout; the buffer dispatches " + s.dtype +
         (s.expanded ? " rows" : " rows, plain"));
  if (!v.weights)
    fail("the MoE layer needs topk_weights: its SwiGLU weights each row by its routing weight");
  ParamRecord r = dispatchRecord(s, v, c.dispatch);
  const Handle &h = c.dispatch.handle;
  const DeviceTensor &rows = c.dispatch.recvX;
  const int64_t H = s.hidden, block = 128;
  if (c.downWeights.shape.size() != 3 || c.downWeights.shape[1] != H ||
      c.downWeights.shape[2] % block || c.downWeights.shape[2] < block)
    fail("down_weights must have shape f8E4M3FN[L, " + std::to_string(H) +
         ", I] with I a positive multiple of 128, got " + c.downWeights.describe());
  const int64_t inter = c.downWeights.shape[2];
  if (c.gateUpWeights.shape.size() == 3 && c.gateUpWeights.shape[1] != 2 * inter)
    fail("gate_up_weights must have 2 I = " + std::to_string(2 * inter) +
         " rows per expert (the gate rows, then the up rows; I from down_weights), got " +
         c.gateUpWeights.describe());
  // Each step's own record, checked as its op checks it, under its name.
  auto add = [&](int part, const ParamRecord &step) {
    for (const auto &[field, value] : step)
      r[epic::ep::records::moeLayerField(part, field.c_str())] = value;
  };
  using namespace epic::ep::records;
  add(kLayerGateUp,
      groupedGemmRecord(s, GroupedGemmCall{rows, c.gateUpWeights, c.gateUp,
                                           h.psumNumRecvTokensPerExpert, c.dispatch.recvScalePacks,
                                           c.gateUpScales}));
  add(kLayerSwiglu, swigluRecord(s, SwigluCall{c.gateUp, c.act, h.psumNumRecvTokensPerExpert,
                                               c.actScales, c.dispatch.recvTopkWeights}));
  add(kLayerDown, groupedGemmRecord(s, GroupedGemmCall{c.act, c.downWeights, c.down,
                                                       h.psumNumRecvTokensPerExpert, c.actScales,
                                                       c.downScales}));
  add(kLayerCombine, combineRecord(s, CombineVariant{false, 0},
                                   CombineCall{c.down, {}, {}, {}, c.combinedX, {}, h}));
  return r;
}

void epic::runtime::checkTopkIndices(const EPSpec &s, const int64_t *idx, int64_t tokens,
                                     const std::string &name) {
  // The message is built only for a bad id: this runs over every id of a call (a string per
  // id cost ~1 us per token at top-8).
  auto at = [&](int64_t t, int j) {
    return name + "[" + std::to_string(t) + "][" + std::to_string(j) + "]";
  };
  for (int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < s.topk; ++j) {
      int64_t e = idx[t * s.topk + j];
      if (e < -1 || e >= s.experts)
        fail(at(t, j) + " = " + std::to_string(e) + " is out of range: expert ids are in [0, " +
             std::to_string(s.experts) + "), -1 masks a slot");
      // A token reaches an expert once: a repeated id would be received and summed twice.
      for (int i = 0; i < j && e >= 0; ++i)
        if (idx[t * s.topk + i] == e)
          fail(at(t, j) + " = " + std::to_string(e) + " repeats slot " + std::to_string(i) +
               " of the token: each expert at most once per token (-1 masks a slot)");
    }
}

AddressBindings::AddressBindings(const std::vector<ParamRecord> &records,
                                 const std::vector<std::string> &fields, int64_t stride,
                                 std::vector<std::string> names)
    : slotNames(std::move(names)), slots(int(slotNames.size())), servedRanks(int(records.size())) {
  for (int r = 0; r < servedRanks; ++r)
    for (const auto &[field, value] : records[r]) {
      if (value.slot < 0 || !value.value)
        continue; // a count, or a tensor the signature does not have
      auto at = std::find(fields.begin(), fields.end(), field);
      if (at == fields.end())
        fail("rank " + std::to_string(r) + ": unknown parameter \"" + field + "\"");
      slots = std::max(slots, value.slot + 1);
      bindings.push_back({r, value.slot,
                          size_t(r) * size_t(stride) / 8 + size_t(at - fields.begin()),
                          std::max(1, value.alignment), value.empty, value.inWindow, value.bytes});
    }
}

std::string AddressBindings::name(int rank, int slot) const {
  std::string n =
      slot < int(slotNames.size()) ? slotNames[slot] : "tensor #" + std::to_string(slot);
  return servedRanks > 1 ? n + "[" + std::to_string(rank) + "]" : n;
}

void AddressBindings::checkAddress(const Binding &b, uint64_t address,
                                   const std::vector<WindowRange> &windows) const {
  if (!address && !b.empty)
    fail(name(b.rank, b.slot) + " is required here but was not given (a null pointer)");
  if (address % b.alignment)
    fail(name(b.rank, b.slot) + " must be " + std::to_string(b.alignment) +
         "-byte aligned, it is at " + std::to_string(address));
  if (b.inWindow && address)
    requireInWindow(name(b.rank, b.slot), address, b.bytes,
                    size_t(b.rank) < windows.size() ? windows[b.rank] : WindowRange{});
}

void epic::runtime::requireInWindow(const std::string &tensor, uint64_t address, int64_t bytes,
                                    const WindowRange &window) {
  if (address < window.begin || address + uint64_t(bytes) > window.end)
    fail(tensor + " must lie in the buffer's window, past the kernels' region (addresses " +
         std::to_string(window.begin) + " to " + std::to_string(window.end) +
         "): with window_outputs peers reach it there; it is " + std::to_string(bytes) +
         " bytes at " + std::to_string(address));
}

void AddressBindings::bind(const uint64_t *addresses, size_t count, std::vector<uint64_t> &table,
                           const std::vector<WindowRange> &windows) const {
  if (count != size_t(servedRanks) * slots)
    fail("expected " + std::to_string(servedRanks) + " x " + std::to_string(slots) +
         " tensor addresses (ranks x slots), got " + std::to_string(count));
  // Every address first: a refused call changes nothing.
  for (const Binding &b : bindings)
    checkAddress(b, addresses[size_t(b.rank) * slots + b.slot], windows);
  for (const Binding &b : bindings) {
    uint64_t address = addresses[size_t(b.rank) * slots + b.slot];
    table[b.word] = address ? address : 16; // an empty tensor: any aligned address
  }
}
