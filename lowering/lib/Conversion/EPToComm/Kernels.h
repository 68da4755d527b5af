//===- Kernels.h - convert-ep-to-comm: the kernels ------------------------*- C++ -*-===//
//
// The kernels convert-ep-to-comm builds, each into an empty kernel (createKernel):
// dispatch (DispatchKernels.cpp), combine (CombineKernels.cpp), the dispatch
// layout (LayoutKernels.cpp) and the fused GEMM kernels (FusedKernels.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LOWERING_CONVERSION_EPTOCOMM_KERNELS_H
#define EPIC_LOWERING_CONVERSION_EPTOCOMM_KERNELS_H

#include "KernelBuilder.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

// Dispatch.
/// What the kernels that walk a rank's own tokens read from its record.
struct TokenInputs {
  Value numTokens, x, topkIdx, scalePacks;
  /// The slot of every (token, master slot): written by an uncached send,
  /// replayed by a cached dispatch (which has no count exchange).
  Value dstSlots;
  TokenInputs(KernelBuilder &k, const DispatchShape &shape)
      : numTokens(k.intParam(kDispatchNumTokens)), x(k.pointerParam(kX)),
        topkIdx(k.pointerParam(kTopkIdx)),
        scalePacks(shape.scalePacks ? k.pointerParam(kScalePacks) : Value()),
        dstSlots(k.pointerParam(kDstSlots)) {}
};

/// Rows [start_e + count_e, start_e + align(count_e)) of each local expert
/// of this rank's outputs: zero (data, scale packs, weight).
void zeroPaddingRows(KernelBuilder &k, const EPLayout &L, const DispatchShape &shape, Value recvX,
                     Value recvPacks, Value recvWeights, Value expertCounts, Value psumPerExpert);
void buildDispatchSend(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape);
void buildDispatchCopy(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape);
/// The one-pass dispatch (OnePass.cpp): every row straight to its place.
void buildDispatchScatter(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape);
/// The fused copy's 16-byte chunks in flight per lane (DispatchShape::rowUnroll).
int64_t fusedRowUnroll(int64_t rowBytes);

/// Hybrid mode (Hybrid.cpp): the send kernel's last block ends phase 1
/// (forward counts, or done flags when cached, with the rail peers); the
/// forward kernel sends what the rail peers put here to the node's ranks.
void endForwardSends(KernelBuilder &k, const DispatchShape &shape);
void buildDispatchForward(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape);
/// The count exchange that ends an uncached dispatch's sending, over `peers`
/// (this rank is peer `self`).
void exchangeDispatchCounts(KernelBuilder &k, const DispatchShape &shape, const PeerGroup &peers,
                            Value self);

// Combine.
/// What the kernels that finish a rank's combine read from its record: its
/// tokens and routing, where the combined rows (and weights) go, the biases.
struct CombineOutputs {
  Value numTokens, topkIdx, out, outWeights;
  SmallVector<Value> biases;
  CombineOutputs(KernelBuilder &k, const CombineShape &shape)
      : numTokens(k.intParam(kCNumTokens)), topkIdx(k.pointerParam(kCTopkIdx)),
        out(k.pointerParam(kCCombinedX)),
        outWeights(shape.weights ? k.pointerParam(kCCombinedWeights) : Value()) {
    for (unsigned i = 0; i < shape.biases; ++i)
      biases.push_back(k.pointerParam(kCBias0 + i));
  }
};
void buildCombineSend(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape);
void buildCombineReduce(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape);
/// The one-pass combine (OnePass.cpp): each origin reads its contributions
/// from the ranks' rows directly.
void buildCombineGather(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape);
/// Hybrid mode: each forwarder sums its node's partial rows of every token it
/// forwarded and sends the sum to the token's origin (Hybrid.cpp).
void buildCombineForward(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape);
/// The expanded combine's send of one received token by the calling warp
/// (shared with the fused GEMM + combine).
void sendExpandedToken(KernelBuilder &k, const EPLayout &L, const CombineShape &shape, Value x,
                       Value weights, Value meta, Value record, const RowPart &share = {});
/// Where a received row goes back to: its metadata row, the source rank and
/// the record's offset in the source's window.
struct CombineTarget {
  Value meta, src, offset;
};
CombineTarget combineTarget(KernelBuilder &k, const EPLayout &L, Value metadata, Value row);
/// The same with the record as a pointer into the source's window (same node).
std::pair<Value, Value> combineDestination(KernelBuilder &k, const EPLayout &L, Value metadata,
                                           Value row);

// ep.dispatch_layout (LayoutKernels.cpp): the counts zeroed, then a thread
// per token.
void buildLayoutZero(gpu::GPUFuncOp func, const EPLayout &L);
void buildLayoutCount(gpu::GPUFuncOp func, const EPLayout &L);
/// ep.engram_fetch: a warp per fetched row (EngramKernels.cpp).
void buildEngramFetch(gpu::GPUFuncOp func, const EPLayout &L);

/// ep.swiglu: silu(gate) * up of each expert row's `inter` channels, in f32,
/// stored as `outType`; FP8 results with their scales per 128 channels.
struct SwigluShape {
  Type inType, outType;
  int64_t inter;
};
void buildSwiglu(gpu::GPUFuncOp func, const EPLayout &L, const SwigluShape &shape);

/// 8 f32 channels (vector<8xf32>, one lane's) cast to FP8: with the 15 other
/// lanes of its 128-channel group (lanes 0-15 or 16-31, all 32 converged),
/// amax (at least 1e-4), the scale `amax / 448` (or its power of two above,
/// `round`) and the 8 E4M3 bytes of `x / scale` rounded to nearest,
/// saturated. Returns (bytes as i64, scale).
std::pair<Value, Value> castF32ToFp8(KernelBuilder &k, Value x, bool round);
/// DeepEP V1's low-latency mode (LowLatencyKernels.cpp): the dispatch's send
/// (FP8 cast fused, `roundScale`: power-of-two scales) and receive (`ue8m0`:
/// scales as exponent bytes), the combine's send and weighted reduce.
void buildLowLatencySend(gpu::GPUFuncOp func, const EPLayout &L, bool fp8, bool roundScale);
void buildLowLatencyRecv(gpu::GPUFuncOp func, const EPLayout &L, bool fp8, bool ue8m0);
void buildLowLatencyCombineSend(gpu::GPUFuncOp func, const EPLayout &L);
void buildLowLatencyCombineReduce(gpu::GPUFuncOp func, const EPLayout &L);
/// Both phases in one kernel each (a call without a receive hook).
void buildLowLatencyDispatch(gpu::GPUFuncOp func, const EPLayout &L, bool fp8, bool roundScale,
                             bool ue8m0);
void buildLowLatencyCombine(gpu::GPUFuncOp func, const EPLayout &L);
/// The shared i32 words (createKernel's `sharedWords`) of the kernels that
/// hold a receive (prefix sums over every (local expert, source) pair) and of
/// those that hold a combine send (over the local experts).
int64_t lowLatencyRecvSharedWords(const EPLayout &L);
int64_t lowLatencyCombineSendSharedWords(const EPLayout &L);

/// Copies the body of `from` (a kernel with convert-ep-to-comm's signature)
/// before `b`'s insertion point, its arguments and shared attributions
/// mapped to `to`'s (the parameter table to `table` where given: `from`
/// reads its record at that part of `to`'s), its block index and count
/// replaced by `block`/`blocks`.
void inlineKernelBody(OpBuilder &b, gpu::GPUFuncOp from, gpu::GPUFuncOp to, Value block,
                      Value blocks, Value table = {});

// Fused with the grouped GEMM.
void buildCopyGemmKernel(OpBuilder &builder, Location loc, StringRef name, const EPLayout &L,
                         DispatchShape shape, const epic::detail::GroupedGemmShape &gemm);
void buildGemmSendKernel(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape,
                         epic::detail::GroupedGemmShape gemm, GemmCombineScratch scratch);

/// ep.moe_layer (FusedKernels.cpp): what each step of the layer is
/// specialized on and reads. Every step's layout carries the step's own
/// record (its fields from the part's first, EPRecords.h); the GEMMs'
/// shapes their descriptors' offsets relative to it.
struct MoeLayerParts {
  EPLayout dispatchLayout, swigluLayout, combineLayout;
  DispatchShape dispatch;
  epic::detail::GroupedGemmShape gateUp, down;
  SwigluShape swiglu;
  CombineShape combine;
  /// Window offsets of the rank barrier's counter and the blocks' exit count.
  int64_t barrier, exits;
};
/// `<name>`: one cooperative kernel, every block of a rank running the
/// layer's steps in turn (dispatch send, placement, gate/up GEMM, SwiGLU,
/// down GEMM, combine send, reduce) with the rank's blocks meeting between
/// steps.
void buildMoeLayerKernel(OpBuilder &builder, Location loc, StringRef name,
                         const MoeLayerParts &parts);

} // namespace epic::expand

#endif // EPIC_LOWERING_CONVERSION_EPTOCOMM_KERNELS_H
