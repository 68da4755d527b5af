//===- Calls.h - typed dispatch/combine arguments, validated ----*- C++ -*-===//
//
// What a caller of ElasticBuffer::dispatch / combine passes: device tensors
// (pointer, dtype, shape) in DeepEP's names. Everything is checked against
// the buffer's configuration on the host, before any kernel is asked for,
// and every error names the argument. The checked call becomes the kernels'
// parameter record (the field names convert-ep-to-comm's `epic.param_fields` lists),
// whose tensor fields remember which of the call's tensors they hold, so a
// plan (KernelHost::Plan) can bind the next call's addresses without
// checking shapes again. The shapes of every output and handle tensor are
// stated here too (outputs()), so callers allocate what the checks expect.
// No CUDA here: the checks are unit-tested on machines without a GPU.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_CALLS_H
#define EPIC_RUNTIME_CALLS_H

#include "epic/runtime/KernelRequest.h"

#include <cstdint>
#include <algorithm>
#include <map>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

namespace epic::runtime {

/// A tensor in GPU memory (or host memory mapped into it). `data == 0` means
/// "not given" for optional arguments.
struct DeviceTensor {
  uint64_t data = 0;
  std::string dtype;          ///< bf16, f16, f32, f8E4M3FN, f8E5M2, i64, i32
  std::vector<int64_t> shape; ///< row-major, contiguous
  /// Which of its call's tensors this is, in the caller's numbering (the
  /// order a plan's addresses come in); -1: not bound by plans.
  int slot = -1;
  bool given() const { return data != 0; }
  int64_t elements() const;
  int64_t bytes() const;        ///< elements x the dtype's size
  std::string describe() const; ///< e.g. "bf16[128, 7168]"
};

/// One field of a parameter record: an integer (a count, the token cap) or
/// the address of one of the call's tensors, with the alignment the checks
/// required of it (a plan asks the same of the addresses it binds later).
struct ParamValue {
  uint64_t value = 0;
  int slot = -1;      ///< the tensor's DeviceTensor::slot; -1 for integers
  int alignment = 1;  ///< bytes the address must be a multiple of
  bool empty = false; ///< the tensor has no elements (any address will do)
  /// window_outputs: a peer reaches the tensor through the window, so its
  /// `bytes` must lie in the rank's window (past the kernels' own region).
  bool inWindow = false;
  int64_t bytes = 0;
  ParamValue() = default;
  ParamValue(uint64_t v) : value(v) {}
  ParamValue(const DeviceTensor &t, int alignment = 1)
      : value(t.data), slot(t.slot), alignment(alignment), empty(t.given() && !t.elements()) {}
};

/// The kernels' parameters of one rank: field name -> pointer or integer.
using ParamRecord = std::map<std::string, ParamValue>;

/// A tensor the caller allocates for a call: its name (the call's field),
/// element type and shape.
struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

/// What a dispatch leaves behind for the combine and for cached dispatches
/// (DeepEP's handle). The uncached dispatch writes it; the others read it.
struct Handle {
  DeviceTensor topkIdx;                    ///< i64 [T, K]: the routing
  DeviceTensor dstBufferSlotIdx;           ///< i32 [T, K]
  DeviceTensor recvSrcMetadata;            ///< i32 [R * Tmax, K + 2]
  DeviceTensor psumNumRecvTokensPerRank;   ///< i32 [R] (hybrid: [M], per forwarder index)
  DeviceTensor numRecvTokensPerExpert;     ///< i32 [L]
  DeviceTensor psumNumRecvTokensPerExpert; ///< i32 [L]
  /// Hybrid mode only (this rank as a forwarder; not given in direct mode):
  /// i32 [N * Tmax, K + 2], per item (source node x Tmax + slot): the source
  /// id, the node master slot, then per top-k slot (slot at its destination)
  /// x M + the destination's LSA rank, or -1; and i32 [N], items per node.
  DeviceTensor fwdSrcMetadata;
  DeviceTensor fwdCounts;
  /// Optional, plain layout only: i32 [R * Tmax], the row this rank returned
  /// each received slot at (a deterministic buffer sorts its rows after the
  /// dispatch); not given: row = slot. Not written by the kernels.
  DeviceTensor recvRowOfSlot;
};

struct DispatchCall {
  DeviceTensor x; ///< [T, H] of the buffer's dtype, T <= Tmax
  /// i64 [T, K]: where the send kernel copies the routing it reads, for the
  /// handle (DeepEP's do_handle_copy); not given: the handle keeps
  /// handle.topk_idx, the caller's tensor.
  DeviceTensor topkIdxCopy;
  DeviceTensor scalePacks;      ///< f32 [T, S], FP8 only
  DeviceTensor topkWeights;     ///< f32 [T, K], with DispatchVariant::weights
  DeviceTensor recvX;           ///< [rows >= receiveRows(spec), H]
  DeviceTensor recvScalePacks;  ///< f32 [rows, S], FP8 only
  DeviceTensor recvTopkIdx;     ///< i64 [rows, K], plain layout only
  DeviceTensor recvTopkWeights; ///< f32 [rows, K] (plain) or [rows] (expanded)
  DeviceTensor hostCounts;      ///< i32 [1 + L]: received tokens, then per expert (aligned)
  Handle handle;                ///< topk_idx is the routing input of an uncached dispatch
};

struct CombineCall {
  DeviceTensor x;                   ///< bf16 [rows, H]: the received rows, processed
  DeviceTensor topkWeights;         ///< f32 like recv_topk_weights, with CombineVariant::weights
  DeviceTensor bias0, bias1;        ///< bf16 [T, H], CombineVariant::biases of them
  DeviceTensor combinedX;           ///< bf16 [T, H]
  DeviceTensor combinedTopkWeights; ///< f32 [T, K], with CombineVariant::weights
  Handle handle;                    ///< of the dispatch that received `x`
};

/// ep.grouped_gemm on an expanded dispatch's rows: out[i] = x[i] @ weights[e]
/// for every expert e's rows i (the handle's per-expert prefix sums).
struct GroupedGemmCall {
  /// [rows, K] of the dispatch's dtype (bf16 / f16 / f8E4M3FN), 16-byte aligned; K: the
  /// hidden size (the dispatch's rows) or an expert's intermediate size (its down GEMM)
  DeviceTensor x;
  DeviceTensor weights; ///< [L, K, N], same dtype, N contiguous; FP8: [L, N, K], K contiguous
  DeviceTensor out;     ///< [rows, N], bf16 / f16 / f32
  DeviceTensor psumNumRecvTokensPerExpert; ///< i32 [L], the handle's
  DeviceTensor xScales;      ///< FP8 only: f32 [rows, K / 128] (e.g. the dispatch's scale packs)
  DeviceTensor weightScales; ///< FP8 only: f32 [L, N / 128, K / 128]
};

/// ep.swiglu on an expanded dispatch's gate/up rows: out[i] = silu(gate) * up for every
/// expert's rows i (the handle's prefix sums), FP8 results with their block scales.
struct SwigluCall {
  DeviceTensor gateUp; ///< [rows, 2 I] bf16 / f16 / f32 (gate columns, then up), I % 128 == 0
  DeviceTensor out;    ///< [rows, I] bf16 / f16 / f32 / f8E4M3FN
  DeviceTensor psumNumRecvTokensPerExpert; ///< i32 [L], the handle's
  DeviceTensor scales;                     ///< FP8 results only: f32 [rows, I / 128]
  DeviceTensor weights; ///< optional f32 [rows]: each row's y times its weight (routing weights)
};

/// ep.dispatch_layout (DeepEP's get_dispatch_layout) of one rank's routing.
struct LayoutCall {
  DeviceTensor topkIdx;            ///< [T, K] integer expert ids, -1 = none
  DeviceTensor numTokensPerRank;   ///< i32 [R]
  DeviceTensor numTokensPerExpert; ///< i32 [E]
  DeviceTensor isTokenInRank;      ///< i1 [T, R], a byte each
};

/// ep.engram_fetch of one rank: rows of the ranks' tables by global entry id.
struct EngramCall {
  DeviceTensor indices; ///< i32 [T, M]: owner rank x entries per rank + local entry
  DeviceTensor out;     ///< [T, M x hidden] of the tables' dtype, 16-byte aligned
};

/// DeepEP V1's low_latency_dispatch of one rank (ep.low_latency_dispatch):
/// the rank's bf16 tokens into per-local-expert receive tensors, the cap
/// being spec.maxTokensPerRank (R x cap rows per expert).
struct LowLatencyDispatchCall {
  DeviceTensor x;           ///< bf16 [T, hidden], T <= cap
  DeviceTensor topkIdx;     ///< i32 or i64 [T, K], -1 = none
  DeviceTensor recvX;       ///< [L, R x cap, hidden] of spec.dtype (bf16 or f8E4M3FN)
  DeviceTensor recvScales;  ///< FP8: f32 [L, G, R x cap] or, UE8M0, i32 [L, ceil(G / 4), R x cap]
  DeviceTensor recvCount;   ///< i32 [L]
  DeviceTensor srcInfo;     ///< i32 [L, R x cap]
  DeviceTensor layoutRange; ///< i64 [L, R]
  DeviceTensor route;       ///< i32 [L, R x cap]
  DeviceTensor stats;       ///< optional i32 [L], incremented by the counts
};

/// DeepEP V1's low_latency_combine of one rank (ep.low_latency_combine).
struct LowLatencyCombineCall {
  DeviceTensor x;           ///< bf16 [L, R x cap, hidden]
  DeviceTensor layoutRange; ///< i64 [L, R] (the dispatch's)
  DeviceTensor route;       ///< i32 [L, R x cap] (the dispatch's)
  DeviceTensor topkIdx;     ///< i32 or i64 [T, K] (the rank's own, as dispatched)
  DeviceTensor topkWeights; ///< f32 [T, K]
  DeviceTensor out;         ///< bf16 [T, hidden]
};

/// An expanded dispatch fused with the expert GEMM on its rows.
struct DispatchGemmCall {
  DispatchCall dispatch;
  DeviceTensor experts; ///< [L, H, N] of the dispatch's dtype
  DeviceTensor gemmOut; ///< [rows of recv_x, N], bf16 / f16 / f32
};

/// The expert GEMM fused with the combine of its output.
struct GemmCombineCall {
  CombineCall combine;  ///< combine.x is the GEMM's output ([rows, H] bf16, written)
  DeviceTensor lhs;     ///< the dispatch's expanded rows [rows, H]
  DeviceTensor weights; ///< [L, H, H]
};

/// The whole FP8 MoE layer (ep.moe_layer, one persistent kernel): the
/// dispatch's call (FP8 rows with their scale packs and routing weights; its
/// outputs and handle are the kernel's scratch), the experts' weights, the
/// intermediate rows, and the combined tokens.
struct MoeLayerCall {
  DispatchCall dispatch;
  DeviceTensor gateUpWeights; ///< f8E4M3FN [L, 2 I, H], K contiguous
  DeviceTensor gateUpScales;  ///< f32 [L, 2 I / 128, H / 128]
  DeviceTensor downWeights;   ///< f8E4M3FN [L, H, I]
  DeviceTensor downScales;    ///< f32 [L, H / 128, I / 128]
  DeviceTensor gateUp;        ///< bf16 [rows of recv_x, 2 I], written
  DeviceTensor act;           ///< f8E4M3FN [rows, I], written
  DeviceTensor actScales;     ///< f32 [rows, I / 128], written
  DeviceTensor down;          ///< bf16 [rows, H], written
  DeviceTensor combinedX;     ///< bf16 [T, H]
};

/// Where a served rank's window-resident tensors may lie: [begin, end) of
/// its window, past the region its kernels use.
struct WindowRange {
  uint64_t begin = 0, end = 0;
};

/// Throws std::invalid_argument naming `tensor` unless its `bytes` at
/// `address` lie in `window` (a window-resident tensor: window_outputs).
void requireInWindow(const std::string &tensor, uint64_t address, int64_t bytes,
                     const WindowRange &window);

/// Where a plan's later calls put their tensors' addresses: for every
/// served rank's tensor fields (the records' ParamValues with a slot), the
/// word of the parameter table it goes to and the alignment the checks
/// required. Host-only: a call of a cached signature is checked here, by
/// address alone, and refused naming the tensor before anything is written.
class AddressBindings {
public:
  AddressBindings() = default;
  /// `records[r]` laid out at `r * stride` bytes, fields in `fields` order.
  AddressBindings(const std::vector<ParamRecord> &records, const std::vector<std::string> &fields,
                  int64_t stride, std::vector<std::string> slotNames);
  int slotsPerRank() const { return slots; }
  int ranks() const { return servedRanks; }
  /// `addresses`: ranks() x slotsPerRank(), rank-major (0 where the signature
  /// has no tensor, or an empty one). Checks every bound address (given,
  /// aligned, inside `windows[rank]` where the op's tensors lie in the
  /// window), then writes them into `table`; throws std::invalid_argument
  /// naming the slot (with its rank where there are several) otherwise.
  void bind(const uint64_t *addresses, size_t count, std::vector<uint64_t> &table,
            const std::vector<WindowRange> &windows) const;
  /// The name of slot `slot` of rank `rank`, as errors write it.
  std::string name(int rank, int slot) const;

private:
  struct Binding {
    int rank, slot;
    size_t word;
    int alignment;
    bool empty, inWindow;
    int64_t bytes;
  };
  void checkAddress(const Binding &b, uint64_t address,
                    const std::vector<WindowRange> &windows) const;
  std::vector<Binding> bindings;
  std::vector<std::string> slotNames;
  int slots = 0, servedRanks = 0;
};

/// Rows a receive buffer needs: R * Tmax (plain), or every (token, local
/// expert) pair plus each expert's alignment padding (expanded).
int64_t receiveRows(const EPSpec &spec);

/// What an uncached dispatch of `tokens` tokens writes (outputs, then the
/// handle's tensors), shaped for the worst case: recv_x, recv_x_scale_packs
/// (FP8), recv_topk_idx (plain), recv_topk_weights (weights), host_counts,
/// dst_buffer_slot_idx, recv_src_metadata, psum_num_recv_tokens_per_rank,
/// num_recv_tokens_per_expert, psum_num_recv_tokens_per_expert; a cached
/// dispatch writes the first three only.
std::vector<TensorSpec> dispatchOutputs(const EPSpec &spec, const DispatchVariant &variant,
                                        int64_t tokens);
/// What a combine of `tokens` tokens writes: combined_x, combined_topk_weights.
std::vector<TensorSpec> combineOutputs(const EPSpec &spec, const CombineVariant &variant,
                                       int64_t tokens);

/// Validates `call` for `spec` (throws std::invalid_argument naming the
/// argument) and returns the parameter record of the dispatch kernels.
ParamRecord dispatchRecord(const EPSpec &spec, const DispatchVariant &variant,
                           const DispatchCall &call);
ParamRecord combineRecord(const EPSpec &spec, const CombineVariant &variant,
                          const CombineCall &call);
/// The grouped GEMM's record (x, weights, out, the prefix sums, num_rows); its
/// "tensor_maps" field is the runtime's (KernelHost::prepare encodes them).
ParamRecord groupedGemmRecord(const EPSpec &spec, const GroupedGemmCall &call);
/// The SwiGLU's record (the gate/up rows, the results and their scales, the prefix sums).
ParamRecord swigluRecord(const EPSpec &spec, const SwigluCall &call);
/// The dispatch layout's record (the routing, its token count, the outputs).
ParamRecord layoutRecord(const EPSpec &spec, const LayoutCall &call);
/// The Engram fetch's record: the ids, their count, the tables' entries per
/// rank and window offset (the host segment), the rank's own table (its
/// address in this process), the output.
ParamRecord engramRecord(const EPSpec &spec, int64_t entriesPerRank, int64_t tableOffset,
                         uint64_t ownTable, const EngramCall &call);
/// Low-latency mode's records; `parity` picks the window region (0 or 1).
ParamRecord lowLatencyDispatchRecord(const EPSpec &spec, const DispatchVariant &variant, int parity,
                                     const LowLatencyDispatchCall &call);
ParamRecord lowLatencyCombineRecord(const EPSpec &spec, int parity,
                                    const LowLatencyCombineCall &call);
/// The fused entry's record: the dispatch's, then "experts" and "gemm_out".
ParamRecord dispatchGemmRecord(const EPSpec &spec, const DispatchVariant &variant,
                               const DispatchGemmCall &call);
/// The fused entry's record: the combine's, then the GEMM's inputs.
ParamRecord gemmCombineRecord(const EPSpec &spec, int biases, const GemmCombineCall &call);
/// ep.moe_layer's record: the dispatch's, then each later step's record
/// under its name ("gate_up.x", ..., EPRecords.h).
ParamRecord moeLayerRecord(const EPSpec &spec, const DispatchVariant &variant,
                           const MoeLayerCall &call);

/// Each rank's record, `build(calls[r])`; a bad argument of rank r is named
/// with its rank where there are several ("rank 3: x must ...").
template <typename Call, typename Build>
std::vector<ParamRecord> recordsOf(const std::vector<Call> &calls, Build build) {
  std::vector<ParamRecord> records;
  for (size_t r = 0; r < calls.size(); ++r) {
    try {
      records.push_back(build(calls[r]));
    } catch (const std::invalid_argument &e) {
      if (calls.size() == 1)
        throw;
      throw std::invalid_argument("rank " + std::to_string(r) + ": " + e.what());
    }
  }
  return records;
}

/// One kernel serves every rank of a launch: what `get` reads off rank r's
/// call (a GEMM's weight shape and output dtype) must be rank 0's. Throws
/// naming `what` and the rank.
template <typename Call, typename Get>
void checkRanksAgree(const std::vector<Call> &calls, const std::string &what, Get get) {
  for (size_t r = 1; r < calls.size(); ++r)
    if (get(calls[r]) != get(calls[0]))
      throw std::invalid_argument("rank " + std::to_string(r) + ": " + what +
                                  " differ from rank 0's (one kernel serves every rank)");
}

/// What must agree across ranks for one GEMM kernel (checkRanksAgree).
inline std::pair<std::vector<int64_t>, std::string> gemmOperands(const GroupedGemmCall &c) {
  return {c.weights.shape, c.out.dtype};
}
inline std::pair<std::vector<int64_t>, std::string> fusedGemmOperands(const DispatchGemmCall &c) {
  return {c.experts.shape, c.gemmOut.dtype};
}
/// What must agree across ranks for one MoE layer kernel: the experts'
/// intermediate size (called after the records: down_weights is 3-D).
inline int64_t moeLayerOperands(const MoeLayerCall &c) { return c.downWeights.shape.at(2); }
/// What must agree across ranks for one SwiGLU kernel: the widths and dtypes.
/// (Called after the records: both tensors are 2-D.)
inline std::pair<int64_t, std::string> swigluOperands(const SwigluCall &c) {
  return {c.gateUp.shape.at(1), c.gateUp.dtype + " -> " + c.out.dtype};
}
/// What must agree across ranks for one dispatch layout kernel: the id width.
inline std::string layoutOperands(const LayoutCall &c) { return c.topkIdx.dtype; }
inline std::string lowLatencyOperands(const LowLatencyDispatchCall &c) { return c.topkIdx.dtype; }
inline std::string lowLatencyCombineOperands(const LowLatencyCombineCall &c) {
  return c.topkIdx.dtype;
}

/// Checks routing read back from the GPU: every entry in [-1, experts).
/// `tokens` rows of spec.topk entries; throws naming `name`[t][j].
void checkTopkIndices(const EPSpec &spec, const int64_t *topkIdx, int64_t tokens,
                      const std::string &name = "topk_idx");

} // namespace epic::runtime

#endif // EPIC_RUNTIME_CALLS_H
