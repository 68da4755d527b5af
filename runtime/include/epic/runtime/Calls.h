//===- Calls.h - typed dispatch/combine arguments, validated ----*- C++ -*-===//
//
// What a caller of ElasticBuffer::dispatch / combine passes: device tensors
// (pointer, dtype, shape) in DeepEP's names. Everything is checked against
// the buffer's configuration on the host, before any kernel is asked for,
// and every error names the argument. The checked call becomes the kernels'
// parameter record (the field names ep-expand's `epic.param_fields` lists).
// No CUDA here: the checks are unit-tested on machines without a GPU.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_CALLS_H
#define EPIC_RUNTIME_CALLS_H

#include "epic/runtime/EntryIR.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace epic::runtime {

/// The kernels' parameters of one rank: field name -> pointer or integer.
using ParamRecord = std::map<std::string, uint64_t>;

/// A tensor in GPU memory (or host memory mapped into it). `data == 0` means
/// "not given" for optional arguments.
struct DeviceTensor {
  uint64_t data = 0;
  std::string dtype;          ///< bf16, f16, f32, f8E4M3FN, f8E5M2, i64, i32
  std::vector<int64_t> shape; ///< row-major, contiguous
  bool given() const { return data != 0; }
  std::string describe() const; ///< e.g. "bf16[128, 7168]"
};

/// What a dispatch leaves behind for the combine and for cached dispatches
/// (DeepEP's handle). The uncached dispatch writes it; the others read it.
struct Handle {
  DeviceTensor topkIdx;                      ///< i64 [T, K]: the routing
  DeviceTensor dstBufferSlotIdx;             ///< i32 [T, K]
  DeviceTensor recvSrcMetadata;              ///< i32 [R * Tmax, K + 2]
  DeviceTensor psumNumRecvTokensPerRank;     ///< i32 [R]
  DeviceTensor numRecvTokensPerExpert;       ///< i32 [L]
  DeviceTensor psumNumRecvTokensPerExpert;   ///< i32 [L]
};

struct DispatchCall {
  DeviceTensor x;           ///< [T, H] of the buffer's dtype, T <= Tmax
  DeviceTensor scalePacks;  ///< f32 [T, S], FP8 only
  DeviceTensor topkWeights; ///< f32 [T, K], with DispatchVariant::weights
  DeviceTensor recvX;       ///< [rows >= receiveRows(spec), H]
  DeviceTensor recvScalePacks;  ///< f32 [rows, S], FP8 only
  DeviceTensor recvTopkIdx;     ///< i64 [rows, K], plain layout only
  DeviceTensor recvTopkWeights; ///< f32 [rows, K] (plain) or [rows] (expanded)
  DeviceTensor hostCounts;      ///< i32 [1 + L]: received tokens, then per expert (aligned)
  Handle handle;            ///< topk_idx is the routing input of an uncached dispatch
};

struct CombineCall {
  DeviceTensor x;           ///< bf16 [rows, H]: the received rows, processed
  DeviceTensor topkWeights; ///< f32 like recv_topk_weights, with CombineVariant::weights
  DeviceTensor bias0, bias1;    ///< bf16 [T, H], CombineVariant::biases of them
  DeviceTensor combinedX;       ///< bf16 [T, H]
  DeviceTensor combinedTopkWeights; ///< f32 [T, K], with CombineVariant::weights
  Handle handle;            ///< of the dispatch that received `x`
};

/// ep.grouped_gemm on an expanded dispatch's rows: out[i] = x[i] @ weights[e]
/// for every expert e's rows i (the handle's per-expert prefix sums).
struct GroupedGemmCall {
  DeviceTensor x;       ///< [rows, H] of the dispatch's dtype (bf16 / f16), 16-byte aligned
  DeviceTensor weights; ///< [L, H, N], same dtype, N contiguous
  DeviceTensor out;     ///< [rows, N], bf16 / f16 / f32
  DeviceTensor psumNumRecvTokensPerExpert; ///< i32 [L], the handle's
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

/// Rows a receive buffer needs: R * Tmax (plain), or every (token, local
/// expert) pair plus each expert's alignment padding (expanded).
int64_t receiveRows(const EPSpec &spec);

/// Validates `call` for `spec` (throws std::invalid_argument naming the
/// argument) and returns the parameter record of the dispatch kernels.
ParamRecord dispatchRecord(const EPSpec &spec, const DispatchVariant &variant,
                           const DispatchCall &call);
ParamRecord combineRecord(const EPSpec &spec, const CombineVariant &variant,
                          const CombineCall &call);
/// The grouped GEMM's record (x, weights, out, the prefix sums, num_rows); its
/// "tensor_maps" field is the runtime's (KernelHost::prepare encodes them).
ParamRecord groupedGemmRecord(const EPSpec &spec, const GroupedGemmCall &call);
/// The fused entry's record: the dispatch's, then "experts" and "gemm_out".
ParamRecord dispatchGemmRecord(const EPSpec &spec, const DispatchVariant &variant,
                               const DispatchGemmCall &call);
/// The fused entry's record: the combine's, then the GEMM's inputs.
ParamRecord gemmCombineRecord(const EPSpec &spec, int biases, const GemmCombineCall &call);

/// Checks routing read back from the GPU: every entry in [-1, experts).
/// `tokens` rows of spec.topk entries; throws naming topk_idx[t][j].
void checkTopkIndices(const EPSpec &spec, const int64_t *topkIdx, int64_t tokens);

} // namespace epic::runtime

#endif // EPIC_RUNTIME_CALLS_H
