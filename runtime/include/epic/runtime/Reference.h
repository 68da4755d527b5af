//===- Reference.h - DeepEP's dispatch/combine semantics on the host -*- C++ -*-===//
//
// Host tensors, the element conversions the tools need (bf16, f16, FP8) and
// checkers that compare what the kernels produced with DeepEP V2's semantics
// (executable in python/epic/reference.py): dispatch rows, routing, weights, counts and
// prefix sums independent of the arrival order the kernels choose; combine
// bitwise against an fp32 sum in DeepEP's order. No CUDA: unit-tested on CPU.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_REFERENCE_H
#define EPIC_RUNTIME_REFERENCE_H

#include "epic/runtime/KernelRequest.h"

#include <cstdint>
#include <string>
#include <vector>

namespace epic::runtime {

/// Bytes of one element of `dtype` (bf16, f16, f32, f8E4M3FN, f8E5M2, i32,
/// i64); throws std::invalid_argument for anything else.
int dtypeBytes(const std::string &dtype);

/// A row-major tensor in host memory.
struct HostTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  HostTensor() = default;
  HostTensor(std::string dtype, std::vector<int64_t> shape);
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t rowElements() const;
  size_t rowBytes() const { return size_t(rowElements()) * dtypeBytes(dtype); }
  const uint8_t *row(int64_t i) const { return data.data() + size_t(i) * rowBytes(); }
  uint8_t *row(int64_t i) { return data.data() + size_t(i) * rowBytes(); }
  /// Element `i` (flat index) as a double (integers exactly up to 2^53).
  double at(int64_t i) const;
  template <typename T> const T *as() const { return reinterpret_cast<const T *>(data.data()); }
  template <typename T> T *as() { return reinterpret_cast<T *>(data.data()); }
};

/// Rounds to nearest even; FP8 saturates to the largest finite value.
uint16_t floatToBf16(float value);
float bf16ToFloat(uint16_t bits);
uint16_t floatToF16(float value);
float f16ToFloat(uint16_t bits);
uint8_t floatToF8E4M3FN(float value);
float f8E4M3FNToFloat(uint8_t bits);
uint8_t floatToF8E5M2(float value);
float f8E5M2ToFloat(uint8_t bits);
/// `value` stored as one element of `dtype` at `out`.
void storeElement(const std::string &dtype, double value, uint8_t *out);

/// How the world's ranks sit in nodes (DeepEP V2's semantics): `gpusPerNode`
/// (M) ranks per NVLink domain, numbered node-major (node(r) = r / M, lsa(r) = r % M); 0 is
/// one node. `hybrid`: DeepEP's hybrid mode, where a token crosses the network once per
/// destination node, to the rail peer node(d)·M + lsa(src) (its forwarder), which forwards it
/// over NVLink. Direct mode's results do not depend on the topology. Hybrid changes:
/// - dispatch: rows grouped by forwarder index lsa(src) (M prefix sums), then by source id;
///   metadata column 1 is `item·K + master`, item = node(src)·Tmax + the token's slot at the
///   forwarder (atomics choose it: one item per token and forwarder, the same at every receiver
///   of its node, no two tokens alike);
/// - combine: per rank, then per node at the forwarder (fp32 from +0 in increasing rank-master
///   slot, rounded to bf16), then at the origin (biases, then node partials in increasing
///   node-master slot, the highest slot whose expert is in that node, rounded once).
/// python/epic/reference.py is the executable form (dispatch/combine's gpus_per_node, hybrid;
/// check_hybrid_metadata; expected_network_bytes).
struct NodeLayout {
  int gpusPerNode = 0;
  bool hybrid = false;

  /// M of a world of `ranks` ranks (`ranks` when gpusPerNode is 0).
  int lsaSize(int ranks) const { return gpusPerNode ? gpusPerNode : ranks; }
  /// Throws std::invalid_argument naming the field: gpusPerNode must divide `ranks`; hybrid
  /// needs 2..32 nodes of at most 64 GPUs (DeepEP's hybrid bounds).
  void validate(int ranks) const;
};

/// What one rank's dispatch took and produced, read back to the host.
/// `recv*` tensors hold the received rows only (plain: the received tokens;
/// expanded: every expert block with its padding); `meta` holds one row of
/// K + 2 int32 per received token.
struct DispatchRecord {
  // Inputs of this rank (as the source).
  HostTensor x, scalePacks, topkIdx, topkWeights;
  // Outputs of this rank (as the destination).
  HostTensor recvX, recvScalePacks, recvTopkIdx, recvTopkWeights;
  std::vector<int32_t> meta;              ///< [received tokens, K + 2]
  std::vector<int32_t> psumRank;          ///< [R]
  std::vector<int32_t> numRecvPerExpert;  ///< [L], unaligned
  std::vector<int32_t> psumRecvPerExpert; ///< [L]
  std::vector<int32_t> hostCounts;        ///< [1 + L]: tokens, aligned counts
};

/// Checks a dispatch of every rank of the world (`ranks[d]` is rank d) with
/// the routing in each rank's `topkIdx`. `weights`: topk weights were
/// dispatched; `zeroPadding`: padding rows must be zero. Returns the
/// problems found (empty: correct), at most `limit`, each naming the rank,
/// the row and the field. `psumRank` has one entry per source rank (direct)
/// or per forwarder index (hybrid, see NodeLayout).
std::vector<std::string> checkDispatch(const EPSpec &spec, bool weights, bool zeroPadding,
                                       const std::vector<DispatchRecord> &ranks,
                                       const NodeLayout &topology = {}, size_t limit = 8);

/// What one rank's combine took and produced.
struct CombineRecord {
  HostTensor x;           ///< bf16 rows, aligned with this rank's dispatch output
  HostTensor topkWeights; ///< optional, like the dispatch's recv_topk_weights
  std::vector<HostTensor> biases;
  HostTensor combinedX, combinedTopkWeights;
};

/// Checks a combine of every rank against the fp32 reference (bitwise),
/// given the dispatch (`handles`, their metadata and routing) it reverses;
/// hybrid: the three-stage order of NodeLayout.
std::vector<std::string> checkCombine(const EPSpec &spec,
                                      const std::vector<DispatchRecord> &handles,
                                      const std::vector<CombineRecord> &ranks,
                                      const NodeLayout &topology = {}, size_t limit = 8);

/// Bytes a dispatch must send between nodes, `[src * R + dst]`, for each rank's
/// routing `topkIdx[r]` ([T, K] i32/i64, -1 = none): direct, `recordBytes` per
/// (token, destination rank of another node owning one of its experts); hybrid,
/// `recordBytes` per (token, other node with one of its experts), to the rail peer
/// D·M + lsa(src). Zero on pairs of one node. Combine's is the transpose (with the
/// combine record). Throws std::invalid_argument naming a bad argument.
std::vector<int64_t> expectedNetworkBytes(const std::vector<HostTensor> &topkIdx, int experts,
                                          const NodeLayout &topology, int64_t recordBytes);

/// What one rank's ep.dispatch_layout took and produced.
struct LayoutRecord {
  HostTensor topkIdx;             ///< [T, K] i64
  std::vector<int32_t> perRank;   ///< [R]
  std::vector<int32_t> perExpert; ///< [E]
  HostTensor inRank;              ///< [T, R] i1 (a byte each)
};

/// Checks every rank's dispatch layout exactly: a token counts once per rank
/// that owns one of its experts, and once per expert; -1 counts nowhere.
std::vector<std::string>
checkDispatchLayout(const EPSpec &spec, const std::vector<LayoutRecord> &ranks, size_t limit = 8);

/// What one rank's ep.grouped_gemm took and produced: rows of an expanded
/// dispatch's layout [rows, K], the rank's expert weights and the output
/// [rows, N]. BF16/F16 weights are [L, K, N]; FP8 weights are [L, N, K] with
/// the block scales (rows: f32 [rows, K / 128]; weights: f32 [L, N / 128,
/// K / 128]; empty tensors otherwise).
struct GemmRecord {
  HostTensor x, weights, out;
  HostTensor xScales, weightScales;
};

/// Checks every rank's grouped GEMM against a float64 product (FP8: of the
/// dequantized operands): each expert's rows (from its dispatch, `handles`)
/// within |got - want| <= 0.01 + 0.016 |want| (fp32 sums in the kernel's order,
/// one rounding to bf16), FP8 plus 0.002 x the sum of the products' magnitudes
/// (Hopper's FP8 wgmma accumulates narrower than fp32), padding rows zero.
std::vector<std::string> checkGroupedGemm(const EPSpec &spec,
                                          const std::vector<DispatchRecord> &handles,
                                          const std::vector<GemmRecord> &ranks, size_t limit = 8);

/// What one rank's ep.swiglu took and produced: gate/up rows [rows, 2 I] of an
/// expanded dispatch's layout, the result [rows, I] and, for an f8E4M3FN
/// result, its f32 scales [rows, I / 128] (empty otherwise); the rows' f32
/// weights [rows] if the op had them (empty otherwise: weight 1).
struct SwigluRecord {
  HostTensor gateUp, out, scales, weights;
};

/// Checks every rank's SwiGLU against y = silu(gate) * up in float64: a BF16,
/// F16 or F32 result within its rounding of y; an FP8 result's scales within
/// 1e-5 of max(amax |y|, 1e-4) / 448 per 128 channels and its values the
/// nearest e4m3 of y / scale (or as near, at a rounding boundary). Padding rows
/// must stay unwritten (zero).
std::vector<std::string> checkSwiglu(const EPSpec &spec, const std::vector<DispatchRecord> &handles,
                                     const std::vector<SwigluRecord> &ranks, size_t limit = 8);

/// The received rows of a dispatch in canonical order: sorted by source
/// (rank, token), hybrid by forwarder index lsa(src) first; expanded: each
/// expert block sorted the same way, padding left out. Indices into the
/// record's recv tensors.
std::vector<int64_t> canonicalRows(const EPSpec &spec, const DispatchRecord &record,
                                   const NodeLayout &topology = {});

/// AGRS (ReferenceCollectives.cpp; python/epic/_reference_collectives.py is
/// the executable form). inputs[r] is rank r's tensor; every rank's must have
/// one dtype and shape.
///
/// All-gather: every rank gets [R, *shape], row r = inputs[r], bit for bit.
/// Checks `gathered[r]` (rank r's result) against that.
std::vector<std::string> checkAllGather(const std::vector<HostTensor> &inputs,
                                        const std::vector<HostTensor> &gathered, size_t limit = 8);
/// Reduce-scatter: inputs [R * n, ...] (bf16, f16 or f32); rank r gets
/// [n, ...], block r of the sum over ranks accumulated in f32 in increasing
/// rank order from +0.0, rounded once to the dtype.
std::vector<HostTensor> referenceReduceScatter(const std::vector<HostTensor> &inputs);
/// parts[0] + parts[1] + ... elementwise, in f32 from +0.0 in that order,
/// rounded once to their dtype (one rank's reduce-scatter result from the
/// blocks every rank contributed).
HostTensor sumInRankOrder(const std::vector<HostTensor> &parts);
std::vector<std::string> checkReduceScatter(const std::vector<HostTensor> &inputs,
                                            const std::vector<HostTensor> &results,
                                            size_t limit = 8);

} // namespace epic::runtime

#endif // EPIC_RUNTIME_REFERENCE_H
