//===-- EPOps.td - ep dialect operations --------------------*- tablegen -*-===//

#ifndef EPIC_DIALECT_EP_IR_EPOPS_TD
#define EPIC_DIALECT_EP_IR_EPOPS_TD

include "epic/Dialect/EP/IR/EPTypes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Row data and routing tables are ranked tensors; the token dimension is
// usually dynamic because it is only known at run time.
def EP_RowTensor : 2DTensorOf<[BF16, F16, F32, F8E4M3FN, F8E5M2]>;
def EP_ScalePackTensor : 2DTensorOf<[F32, I32]>;
def EP_TopkIdxTensor : 2DTensorOf<[I8, I16, I32, I64]>;
def EP_WeightTensor : TensorRankOf<[F32], [1, 2]>;
def EP_BF16RowTensor : 2DTensorOf<[BF16]>;

// What the lowering and the runtime's launch metadata need to know of an op
// that becomes kernels: one interface instead of a list of op classes in
// every place that asks.
def EP_KernelOpInterface : OpInterface<"KernelOpInterface"> {
  let cppNamespace = "::epic::ep";
  let description = [{
    An ep op that `convert-ep-to-comm` lowers to kernels and one launch
    function. The launch metadata names its kind (`epic.entry`, the op's
    mnemonic: `dispatch_layout`, `dispatch`, `combine`, `grouped_gemm`,
    `swiglu`, `dispatch_gemm`, `gemm_combine`) and the configuration its kernels are
    specialized on.
  }];
  let methods = [
    InterfaceMethod<"The kind of launch the runtime reads (the op's mnemonic).",
      "::llvm::StringRef", "getEntryKind", (ins), [{}],
      [{ return $_op->getName().stripDialect(); }]>,
    InterfaceMethod<"The configuration the op's kernels are specialized on.",
      "::epic::ep::ConfigAttr", "getConfig">,
  ];
}

class EP_Op<string mnemonic, list<Trait> traits = []>
    : Op<EP_Dialect, mnemonic, !listconcat(traits, [EP_HostOp])>;

//===----------------------------------------------------------------------===//
// ep.dispatch_layout
//===----------------------------------------------------------------------===//

def EP_DispatchLayoutOp : EP_Op<"dispatch_layout", [EP_KernelOpInterface, Pure]> {
  let summary = "count the tokens each rank and each expert receives from this rank";
  let description = [{
    Computes, from this rank's routing table `topk_idx` (`[T, K]`, global
    expert ids, `-1` = no expert), the layout that a dispatch will have:

    * `num_tokens_per_rank[r]`: tokens that select at least one expert on rank
      `r` (a token counts **once** per destination rank, however many of its
      experts live there);
    * `num_tokens_per_expert[e]`: tokens that select expert `e`;
    * `is_token_in_rank[t, r]`: whether token `t` goes to rank `r`.

    Expert `e` lives on rank `e / (E / R)`. Entries equal to `-1` are ignored.

    ```mlir
    %per_rank, %per_expert, %in_rank = ep.dispatch_layout %topk_idx config #cfg
        : tensor<?x8xi64> -> tensor<8xi32>, tensor<256xi32>, tensor<?x8xi1>
    ```
  }];
  let arguments = (ins EP_ConfigAttr:$config, EP_TopkIdxTensor:$topk_idx);
  let results = (outs 1DTensorOf<[I32]>:$num_tokens_per_rank,
                      1DTensorOf<[I32]>:$num_tokens_per_expert,
                      2DTensorOf<[I1]>:$is_token_in_rank);
  let assemblyFormat = [{
    $topk_idx `config` $config attr-dict `:` type($topk_idx) `->` type(results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.dispatch
//===----------------------------------------------------------------------===//

def EP_DispatchOp : EP_Op<"dispatch", [EP_KernelOpInterface, AttrSizedOperandSegments,
                                        AttrSizedResultSegments]> {
  let summary = "send every token to the ranks that own its top-k experts";
  let description = [{
    DeepEP V2's dispatch, direct mode. Every rank calls it collectively with
    its own `T <= max_tokens_per_rank` tokens.

    **Routing.** Token `t` is sent **once** to every rank that owns at least
    one of its valid experts (`topk_idx[t, j] >= 0`; `-1` entries are ignored
    everywhere). A token whose row is all `-1` is sent nowhere. Every sent
    token carries its hidden row, its scale packs, all K top-k ids and
    weights and its source global id `src_rank * max_tokens_per_rank + t`.

    **Plain layout** (`layout = plain`): `recv_x` has one row per received
    token, grouped by source rank in increasing rank order (the order inside
    a group is the order of slot allocation, so tests compare after sorting by
    source id). `recv_topk_idx[i, j]` is the **local** expert id of slot `j`
    (`e % (E/R)`) if that expert lives on this rank, else `-1`;
    `recv_topk_weights` are all K source weights, copied verbatim.

    **Expanded layout** (`layout = expanded`): one row per (received token,
    local expert) pair, grouped by local expert in increasing id; expert `e`
    occupies rows `[start_e, start_e + count_e)` with
    `start_e = sum_{j<e} align(count_j, expert_alignment)`; the rows up to the
    next start are padding. `recv_topk_weights` is 1-D (one weight per row)
    and there is no `recv_topk_idx` result.

    **FP8.** The kernels move bytes: with `dtype = f8E4M3FN` (or `f8E5M2`)
    each row travels with its `scale_packs` opaque 4-byte packs (`f32` scales
    or `i32` words of 4 UE8M0 exponents), which are returned unchanged in
    `recv_scale_packs`.

    **Cached dispatch.** With `cached(%handle)` and no `topk(...)`, the op
    reuses the routing, slots and counts of the dispatch that produced the
    handle: there is no count exchange and the rows land in exactly the same
    places (bitwise-equal `recv_x`). This is the backward of combine. It
    takes no `weights(...)`: the handle's routing has none.

    **Zero padding.** With `zero_padding` (expanded layout only), the rows
    between an expert's last received row and the next expert's start are
    zeroed (data, scale packs, weight); otherwise their contents are
    unspecified.

    **Window-resident outputs.** With `window_outputs` the results and the
    handle's tensors lie in the buffer's symmetric window (the caller places
    them there), so each sender stores every row straight to its final row
    at the destination, through the destination's NVLink (LSA) pointer, on
    any backend: a count kernel, then one pass over the data, no copy
    epilogue. Every rank must be in one NVLink domain.

    The handle records everything `ep.combine` and a cached dispatch need.
    The number of received rows is data dependent; result token dimensions
    are normally dynamic and never exceed the configuration's worst case.

    Operands and results appear in this order; optional ones only when given:

    ```mlir
    #cfg = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168,
                      dtype = f8E4M3FN, scale_packs = 56,
                      max_tokens_per_rank = 4096>
    %recv_x, %recv_sf, %recv_idx, %recv_w, %handle = ep.dispatch %x
        topk(%topk_idx : tensor<?x8xi64>)
        scales(%sf : tensor<?x56xf32>)
        weights(%w : tensor<?x8xf32>)
        config #cfg
        : tensor<?x7168xf8E4M3FN>
        -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>,
           tensor<?x8xf32>, !ep.handle<#cfg>

    // Cached (e.g. the backward of combine): same routing, no count exchange.
    %g_x, %g_h = ep.dispatch %grad cached(%handle : !ep.handle<#cfg2>) config #cfg2
        : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, !ep.handle<#cfg2>
    ```
  }];
  let arguments = (ins
    EP_ConfigAttr:$config,
    EP_RowTensor:$x,
    Optional<EP_TopkIdxTensor>:$topk_idx,
    Optional<EP_ScalePackTensor>:$scale_packs,
    Optional<2DTensorOf<[F32]>>:$topk_weights,
    Optional<EP_HandleType>:$cached_handle,
    UnitAttr:$zero_padding,
    UnitAttr:$window_outputs);
  let results = (outs
    EP_RowTensor:$recv_x,
    Optional<EP_ScalePackTensor>:$recv_scale_packs,
    Optional<EP_TopkIdxTensor>:$recv_topk_idx,
    Optional<EP_WeightTensor>:$recv_topk_weights,
    EP_HandleType:$handle);
  let assemblyFormat = [{
    $x
    (`topk` `(` $topk_idx^ `:` type($topk_idx) `)`)?
    (`scales` `(` $scale_packs^ `:` type($scale_packs) `)`)?
    (`weights` `(` $topk_weights^ `:` type($topk_weights) `)`)?
    (`cached` `(` $cached_handle^ `:` qualified(type($cached_handle)) `)`)?
    (`zero_padding` $zero_padding^)?
    (`window_outputs` $window_outputs^)?
    `config` $config attr-dict `:` type($x) `->`
    custom<DispatchResultTypes>(type($recv_x), type($recv_scale_packs),
        type($recv_topk_idx), type($recv_topk_weights), type($handle),
        ref(type($scale_packs)), ref(type($topk_weights)), ref($config))
  }];
  let builders = [
    // Infers every result type from the operands and the configuration; the
    // received-token dimension is dynamic.
    OpBuilder<(ins "ConfigAttr":$config, "::mlir::Value":$x,
                   "::mlir::Value":$topkIdx, "::mlir::Value":$scalePacks,
                   "::mlir::Value":$topkWeights, "::mlir::Value":$cachedHandle,
                   CArg<"bool", "false">:$zeroPadding)>
  ];
  let extraClassDeclaration = [{
    bool isCached() { return static_cast<bool>(getCachedHandle()); }
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.combine
//===----------------------------------------------------------------------===//

def EP_CombineOp : EP_Op<"combine", [EP_KernelOpInterface, AttrSizedOperandSegments]> {
  let summary = "send expert outputs back to their source ranks and sum them";
  let description = [{
    DeepEP V2's combine, direct mode, the reverse of the `ep.dispatch` that
    produced `handle`. `x` holds this rank's expert outputs in BF16, one row
    per row of the dispatch's `recv_x` (plain: already reduced over this
    rank's local experts; expanded: one row per (token, local expert), which
    this rank first sums in fp32 in increasing top-k slot order and rounds to
    bf16 once).

    For each source token `t` the result is an **unweighted** sum (top-k
    weights are not applied):

    ```
    combined_x[t] = bf16(bias0[t] + bias1[t] + sum_r partial_r[t])
    ```

    accumulated in fp32 from +0.0: first the biases, then the partial of
    every destination rank `r` in increasing order of that rank's master
    top-k slot (the **highest** slot whose expert lives on `r`), rounded to
    bf16 once (round to nearest even). The result is therefore bitwise
    reproducible (`epic.reference.combine` is the executable definition). A
    token that selected no expert gets the bias sum, or zeros. Because the
    sum starts from +0.0, a bias that is a splat of +0.0 changes no bit and
    is dropped by canonicalization.

    If `weights(...)` is given (plain: `[rows, K]`, expanded: `[rows]`, f32),
    the weights travel back too: `combined_topk_weights[t, j]` is the weight
    for slot `j` sent by the rank that owns `topk_idx[t, j]`, and 0 where
    `topk_idx[t, j] == -1`. With the dispatch's `recv_topk_weights` it
    reproduces the original weights exactly (the backward of dispatch).

    Up to two BF16 biases of shape `[T, H]` are added once to the final sum.

    With `window_outputs`, `x`, the weights and the handle's tensors lie in
    the symmetric window: each origin token reads its contributions where
    they lie (one gather kernel, no send into the window, the same order of
    the sum, bitwise the same results); one NVLink domain.

    ```mlir
    %y, %y_w = ep.combine %x, %handle weights(%w : tensor<?x8xf32>)
        bias(%b0, %b1 : tensor<?x7168xbf16>, tensor<?x7168xbf16>)
        : tensor<?x7168xbf16>, !ep.handle<#cfg>
        -> tensor<?x7168xbf16>, tensor<?x8xf32>
    ```
  }];
  let arguments = (ins
    EP_BF16RowTensor:$x,
    EP_HandleType:$handle,
    Optional<EP_WeightTensor>:$topk_weights,
    Variadic<EP_BF16RowTensor>:$biases,
    UnitAttr:$window_outputs);
  let results = (outs
    EP_BF16RowTensor:$combined_x,
    Optional<2DTensorOf<[F32]>>:$combined_topk_weights);
  let assemblyFormat = [{
    $x `,` $handle
    (`weights` `(` $topk_weights^ `:` type($topk_weights) `)`)?
    (`bias` `(` $biases^ `:` type($biases) `)`)?
    (`window_outputs` $window_outputs^)?
    attr-dict `:` type($x) `,` qualified(type($handle)) `->`
    custom<CombineResultTypes>(type($combined_x), type($combined_topk_weights),
        ref(type($topk_weights)))
  }];
  let extraClassDeclaration = [{
    ConfigAttr getConfig() {
      return ::mlir::cast<HandleType>(getHandle().getType()).getConfig();
    }
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// ep.grouped_gemm
//===----------------------------------------------------------------------===//

def EP_GroupedGemmOp : EP_Op<"grouped_gemm", [EP_KernelOpInterface, Pure,
                                               AttrSizedOperandSegments]> {
  let summary = "the MoE expert GEMM on a dispatch's expanded layout";
  let description = [{
    Multiplies every local expert's rows of an expanded-layout dispatch
    result by that expert's weight matrix. `handle` is the dispatch's: it
    says where each expert's rows are. With `L = experts / ranks` local
    experts, expert `e` owns rows `[start_e, start_e + count_e)` of `lhs`
    (`start_e` the exclusive prefix sum of the counts rounded up to
    `expert_alignment`, `count_e` the rows it received), and

    ```
    result[i, n] = round(sum_k lhs[i, k] * rhs[e, k, n])   for start_e <= i < start_e + count_e
    ```

    with the products summed in fp32 and rounded once to the result's element
    type. Rows outside every expert's range (alignment padding, and the rows
    past the last expert in a worst-case-sized `lhs`) are not written: their
    contents are unspecified, as in the dispatch without `zero_padding`; the
    combine never reads them.

    `lhs` holds the dispatched rows (`[rows, hidden]`, BF16 or F16) or rows
    of the same layout with another width K (an expert's intermediate rows,
    the input of its down GEMM), `rhs` the experts' weights (`[L, K, N]`, the
    same element type, N contiguous: the layout of `torch.stack([w_e for e in
    experts])` with `w_e : [K, N]`), `result` is `[rows, N]` in BF16, F16 or F32.

    FP8 (E4M3) rows come with `scales`, DeepSeek's block scales: `lhs_scales`
    `[rows, K / 128]` f32, one per row and 128 channels (an FP8 dispatch's
    scale packs with `scale_packs = hidden / 128`, or what
    `epic.activations.swiglu_fp8` writes), and `rhs_scales` `[L, N / 128,
    K / 128]` f32, one per 128 x 128 weight block; the weights are then
    `[L, N, K]` (K contiguous, the layout FP8 tensor cores read), and

    ```
    result[i, n] = round(sum_b (sum_{k in block b} lhs[i, k] * rhs[e, n, k])
                              * lhs_scales[i, b] * rhs_scales[e, n / 128, b])
    ```

    each block's products summed in fp32, then scaled and added in fp32.

    On Hopper `convert-ep-to-comm` lowers it to a persistent kernel: TMA loads of
    64 x 64 boxes into a multi-stage shared-memory ring (mbarrier
    transactions), `wgmma` through the NVGPU dialect, a tile scheduler over
    (expert, 128-column tile, 128-row tile). The compiler can fuse it with
    the dispatch before it and the combine after it (`ep-fuse-dispatch-gemm`,
    `ep-fuse-gemm-combine`).

    ```mlir
    #cfg = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168,
                      dtype = bf16, layout = expanded, expert_alignment = 128,
                      max_tokens_per_rank = 4096>
    %y = ep.grouped_gemm %recv_x, %w layout(%handle : !ep.handle<#cfg>)
        : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
    // FP8 (#fp8: the same with dtype = f8E4M3FN, scale_packs = 56)
    %z = ep.grouped_gemm %rows, %w8 layout(%h8 : !ep.handle<#fp8>)
        scales(%row_scales, %w_scales : tensor<?x56xf32>, tensor<32x16x56xf32>)
        : tensor<?x7168xf8E4M3FN>, tensor<32x2048x7168xf8E4M3FN> -> tensor<?x2048xbf16>
    ```
  }];
  let arguments = (ins
    2DTensorOf<[BF16, F16, F8E4M3FN]>:$lhs,
    3DTensorOf<[BF16, F16, F8E4M3FN]>:$rhs,
    EP_HandleType:$handle,
    Optional<2DTensorOf<[F32]>>:$lhs_scales,
    Optional<3DTensorOf<[F32]>>:$rhs_scales);
  let results = (outs 2DTensorOf<[BF16, F16, F32]>:$result);
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$lhs, "::mlir::Value":$rhs,
                   "::mlir::Value":$handle), [{
      build($_builder, $_state, result, lhs, rhs, handle, ::mlir::Value(), ::mlir::Value());
    }]>
  ];
  let assemblyFormat = [{
    $lhs `,` $rhs `layout` `(` $handle `:` qualified(type($handle)) `)`
    (`scales` `(` $lhs_scales^ `,` $rhs_scales `:` type($lhs_scales) `,` type($rhs_scales) `)`)?
    attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let extraClassDeclaration = [{
    ConfigAttr getConfig() {
      return ::mlir::cast<HandleType>(getHandle().getType()).getConfig();
    }
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.swiglu
//===----------------------------------------------------------------------===//

def EP_SwigluOp : EP_Op<"swiglu", [EP_KernelOpInterface, Pure]> {
  let summary = "an expert MLP's activation between its GEMMs, FP8 re-quantization fused";
  let description = [{
    The SwiGLU of the gate/up GEMM's rows on a dispatch's expanded layout:
    `gate_up` is `[rows, 2 I]` (gate columns first, then up; BF16, F16 or
    F32, `I` a multiple of 128), and for every row `i` of an expert (the
    handle's rows, as for `ep.grouped_gemm`) and channel `c < I`, in f32:

    ```
    y[i, c] = silu(gate_up[i, c]) * gate_up[i, I + c]     silu(g) = g / (1 + e^-g)
    ```

    With `weights` (f32 `[rows]`, e.g. an expanded dispatch's received top-k
    weights, one per row) every row's `y` is first multiplied by its weight:
    the routing weights of a MoE layer, applied before the down GEMM (which
    is linear) instead of to its output.

    A BF16, F16 or F32 `result` is `y` rounded once. An F8E4M3FN `result`
    comes with `scales` `[rows, I / 128]` f32, DeepSeek's block scales (the
    layout the FP8 `ep.grouped_gemm` reads for its rows):

    ```
    scales[i, b] = max(amax_{c in block b} |y[i, c]|, 1e-4) / 448
    result[i, c] = e4m3(y[i, c] / scales[i, c / 128])   (nearest, saturated)
    ```

    Rows outside every expert's range are not written, as for
    `ep.grouped_gemm`: the down GEMM never reads them. On the GPU `e^-g` is
    PTX's `ex2.approx` (a few ulp of f32).

    ```mlir
    %h8, %hs = ep.swiglu %gate_up layout(%h : !ep.handle<#fp8>)
        : tensor<?x4096xbf16> -> tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>
    %hb = ep.swiglu %gate_up layout(%h : !ep.handle<#fp8>)
        weights(%recv_weights : tensor<?xf32>) : tensor<?x4096xbf16> -> tensor<?x2048xbf16>
    ```
  }];
  let arguments = (ins 2DTensorOf<[BF16, F16, F32]>:$gate_up, EP_HandleType:$handle,
                       Optional<1DTensorOf<[F32]>>:$weights);
  let results = (outs 2DTensorOf<[BF16, F16, F32, F8E4M3FN]>:$result,
                      Optional<2DTensorOf<[F32]>>:$scales);
  let assemblyFormat = [{
    $gate_up `layout` `(` $handle `:` qualified(type($handle)) `)`
    (`weights` `(` $weights^ `:` type($weights) `)`)? attr-dict
    `:` type($gate_up) `->` type($result) (`,` type($scales)^)?
  }];
  let extraClassDeclaration = [{
    ConfigAttr getConfig() {
      return ::mlir::cast<HandleType>(getHandle().getType()).getConfig();
    }
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.dispatch_gemm
//===----------------------------------------------------------------------===//

def EP_DispatchGemmOp : EP_Op<"dispatch_gemm", [EP_KernelOpInterface]> {
  let summary = "an expanded dispatch fused with the expert GEMM on its rows";
  let description = [{
    What `ep-fuse-dispatch-gemm` makes of an `ep.dispatch` (expanded layout,
    BF16/F16, not cached) whose rows feed an `ep.grouped_gemm` on its handle:
    the same results as the two ops one after the other (`recv_x`,
    `recv_topk_weights`, the handle, and `result` = the GEMM's output), but
    one schedule. `convert-ep-to-comm` lowers it to the dispatch's send kernel, then
    one cooperative kernel in which every block first places its share of
    the received rows in their experts' ranges, counting each in its 128-row
    tile (release), then runs GEMM tiles, each waiting (bounded acquire) for
    the rows of its own expert only (all its row tiles, so the tiles sharing a
    weight tile stream it together). Experts whose rows are placed start while
    others are still being copied; an expert never waits for another.

    ```mlir
    %rx, %rw, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x8xi64>)
        weights(%w : tensor<?x8xf32>) experts(%W : tensor<32x7168x2048xbf16>)
        config #cfg : tensor<?x7168xbf16>
        -> tensor<?x7168xbf16>, tensor<?xf32>, tensor<?x2048xbf16>, !ep.handle<#cfg>
    ```
  }];
  let arguments = (ins
    EP_ConfigAttr:$config,
    2DTensorOf<[BF16, F16]>:$x,
    EP_TopkIdxTensor:$topk_idx,
    Optional<2DTensorOf<[F32]>>:$topk_weights,
    3DTensorOf<[BF16, F16]>:$experts,
    UnitAttr:$zero_padding);
  let results = (outs
    2DTensorOf<[BF16, F16]>:$recv_x,
    Optional<1DTensorOf<[F32]>>:$recv_topk_weights,
    2DTensorOf<[BF16, F16, F32]>:$result,
    EP_HandleType:$handle);
  let assemblyFormat = [{
    $x `topk` `(` $topk_idx `:` type($topk_idx) `)`
    (`weights` `(` $topk_weights^ `:` type($topk_weights) `)`)?
    `experts` `(` $experts `:` type($experts) `)`
    (`zero_padding` $zero_padding^)?
    `config` $config attr-dict `:` type($x) `->`
    custom<DispatchGemmResultTypes>(type($recv_x), type($recv_topk_weights), type($result),
        type($handle), ref(type($topk_weights)))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.moe_layer
//===----------------------------------------------------------------------===//

def EP_MoeLayerOp : EP_Op<"moe_layer", [EP_KernelOpInterface]> {
  let summary = "a whole FP8 MoE layer (dispatch, expert MLP, combine) in one kernel";
  let description = [{
    What `ep-fuse-moe-layer` makes of DeepSeek V3's FP8 layer written as
    five ops on one handle: an FP8 `ep.dispatch` (expanded, scale packs of
    128 channels, routing weights), the gate/up `ep.grouped_gemm` on its rows
    and scales, `ep.swiglu` weighted by the rows' routing weights with FP8
    results, the down `ep.grouped_gemm`, and the `ep.combine` of its rows,
    where nothing but the chain reads the intermediate values. The result is
    the combine's, bitwise the five ops' (the same arithmetic in the same
    order).

    `convert-ep-to-comm` lowers it to one cooperative kernel, persistent over
    the steps: every block of a rank sends and places its share of the
    tokens, computes gate/up tiles, SwiGLU rows, down tiles, then sends and
    reduces combined tokens, the rank's blocks meeting at a barrier in the
    window between steps. No host step and no launch between them: a
    decode-sized layer is one launch in a CUDA graph.

    `gate_up_weights` are `[L, 2 I, hidden]` (gate rows, then up rows; K
    contiguous), `down_weights` `[L, hidden, I]`, each with f32 scales per
    128 x 128 block (`[L, 2 I / 128, hidden / 128]`, `[L, hidden / 128, I /
    128]`). The configuration's token cap must be static: the kernel's
    intermediate rows are sized by it.

    ```mlir
    %out = ep.moe_layer %x topk(%idx : tensor<?x8xi64>) scales(%sf : tensor<?x56xf32>)
        weights(%w : tensor<?x8xf32>)
        gate_up(%w13, %s13 : tensor<32x4096x7168xf8E4M3FN>, tensor<32x32x56xf32>)
        down(%w2, %s2 : tensor<32x7168x2048xf8E4M3FN>, tensor<32x56x16xf32>)
        config #cfg : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xbf16>
    ```
  }];
  let arguments = (ins
    EP_ConfigAttr:$config,
    2DTensorOf<[F8E4M3FN]>:$x,
    EP_TopkIdxTensor:$topk_idx,
    2DTensorOf<[F32]>:$scales,
    2DTensorOf<[F32]>:$topk_weights,
    3DTensorOf<[F8E4M3FN]>:$gate_up_weights,
    3DTensorOf<[F32]>:$gate_up_scales,
    3DTensorOf<[F8E4M3FN]>:$down_weights,
    3DTensorOf<[F32]>:$down_scales);
  let results = (outs EP_BF16RowTensor:$combined_x);
  let assemblyFormat = [{
    $x `topk` `(` $topk_idx `:` type($topk_idx) `)`
    `scales` `(` $scales `:` type($scales) `)`
    `weights` `(` $topk_weights `:` type($topk_weights) `)`
    `gate_up` `(` $gate_up_weights `,` $gate_up_scales `:` type($gate_up_weights) `,`
        type($gate_up_scales) `)`
    `down` `(` $down_weights `,` $down_scales `:` type($down_weights) `,` type($down_scales) `)`
    `config` $config attr-dict `:` type($x) `->` type($combined_x)
  }];
  let extraClassDeclaration = [{
    /// I, each expert's intermediate size (the down GEMM's K).
    int64_t getIntermediateSize() {
      return ::mlir::cast<::mlir::ShapedType>(getDownWeights().getType()).getDimSize(2);
    }
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.gemm_combine
//===----------------------------------------------------------------------===//

def EP_GemmCombineOp : EP_Op<"gemm_combine", [EP_KernelOpInterface]> {
  let summary = "the expert GEMM fused with the combine of its output rows";
  let description = [{
    What `ep-fuse-gemm-combine` makes of an `ep.grouped_gemm` (BF16 output,
    N = hidden) whose output is combined on the same handle: `result` is the
    GEMM's output, `combined_x` the combine's, bitwise as if the two ops ran
    one after the other. `convert-ep-to-comm` lowers it to one cooperative kernel in
    which all of a rank's blocks but one run the persistent GEMM and count
    each stored tile in its 128-row tile's counter, while the last block's
    warps (and every other warp once its block is out of tiles) claim the
    rows in chunks, in expert order: a row is counted against its token once
    every column tile of its row tile is stored, and the warp that counts a
    token's last row sums its rows in increasing slot order in fp32, rounds
    once and writes the row into the source rank's window (the combine's
    send stage, same arithmetic): early tokens travel while later tiles are
    computed. The combine's reduce kernel follows unchanged, with up to two
    biases.

    ```mlir
    %y, %out = ep.gemm_combine %recv_x, %w layout(%h : !ep.handle<#cfg>)
        : tensor<?x7168xbf16>, tensor<32x7168x7168xbf16>
        -> tensor<?x7168xbf16>, tensor<?x7168xbf16>
    ```
  }];
  let arguments = (ins
    2DTensorOf<[BF16, F16]>:$lhs,
    3DTensorOf<[BF16, F16]>:$rhs,
    EP_HandleType:$handle,
    Variadic<EP_BF16RowTensor>:$biases);
  let results = (outs EP_BF16RowTensor:$result, EP_BF16RowTensor:$combined_x);
  let assemblyFormat = [{
    $lhs `,` $rhs `layout` `(` $handle `:` qualified(type($handle)) `)`
    (`bias` `(` $biases^ `:` type($biases) `)`)?
    attr-dict `:` type($lhs) `,` type($rhs) `->` type($result) `,` type($combined_x)
  }];
  let extraClassDeclaration = [{
    ConfigAttr getConfig() {
      return ::mlir::cast<HandleType>(getHandle().getType()).getConfig();
    }
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.all_gather, ep.reduce_scatter (AGRS sessions)
//===----------------------------------------------------------------------===//

def EP_RanksAttr : ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<1024>]>;

def EP_AllGatherOp : EP_Op<"all_gather"> {
  let summary = "every rank's tensors, stacked in rank order, on every rank";
  let description = [{
    DeepEP V2's all-gather (AGRS). Every one of the `ranks` ranks of one
    NVLink domain calls it collectively with tensors of the same shapes and
    element types; result `i` is `[ranks, *shape_i]` whose row `r` is rank
    `r`'s input `i`, bit for bit. Several inputs make one batched all-gather.

    The runtime moves the bytes with the copy engines, no kernel: each rank's
    inputs are copied into every peer's window, and stream memory operations
    write and wait for per-source arrival flags (docs/semantics.md, "AGRS
    sessions"). The results live in the window for the AGRS session.

    ```mlir
    %g = ep.all_gather %x ranks 8 : tensor<32x64xbf16> -> tensor<8x32x64xbf16>
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs, EP_RanksAttr:$ranks);
  let results = (outs Variadic<AnyRankedTensor>:$gathered);
  let assemblyFormat = [{
    $inputs `ranks` $ranks attr-dict `:` type($inputs) `->` type($gathered)
  }];
  let hasVerifier = 1;
}

def EP_ReduceScatterOp : EP_Op<"reduce_scatter"> {
  let summary = "block r of the sum over ranks, on rank r, in a fixed order";
  let description = [{
    Every one of the `ranks` ranks of one NVLink domain calls it collectively
    with an input of the same shape `[ranks * n, ...]`; rank `r`'s result is
    `[n, ...]`, block `r` (rows `[r * n, (r + 1) * n)`) of the sum of every
    rank's input. The sum is accumulated in f32 in increasing rank order from
    +0.0 and rounded once to the element type, so the result is bitwise
    reproducible (epic's addition to DeepEP's AGRS, which lists it as future
    work).

    The blocks move like an all-gather's (copy engines, arrival flags): block
    `r` of each rank's input lands in rank `r`'s window, which then sums them.

    ```mlir
    %y = ep.reduce_scatter %x ranks 8 : tensor<64x96xbf16> -> tensor<8x96xbf16>
    ```
  }];
  let arguments = (ins TensorOf<[BF16, F16, F32]>:$input, EP_RanksAttr:$ranks);
  let results = (outs TensorOf<[BF16, F16, F32]>:$result);
  let assemblyFormat = [{
    $input `ranks` $ranks attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.pp_send_recv (PP channels)
//===----------------------------------------------------------------------===//

def EP_PpSendRecvOp : EP_Op<"pp_send_recv"> {
  let summary = "send to a ring neighbour, receive from the other one";
  let description = [{
    DeepEP V2's pipeline send/recv (PP) as one collective step: every one of
    the `ranks` ranks of one NVLink domain sends `x` to its ring neighbour
    `to` (`next`: rank `(r + 1) mod ranks`, `prev`: `(r - 1) mod ranks`) and
    receives the tensor its other neighbour sent, bit for bit: with `to next`
    rank `r`'s result is rank `(r - 1) mod ranks`'s `x`. Every rank's `x` has
    the same shape and element type.

    The runtime moves the bytes with the copy engines, no kernel, through the
    receiver's PP slots with the arrival and release flags of
    docs/semantics.md ("PP channels"): the send waits for a free slot, the
    receive for the arrival.

    ```mlir
    %y = ep.pp_send_recv %x ranks 4 to next : tensor<?x96xbf16> -> tensor<?x96xbf16>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$x, EP_RanksAttr:$ranks, EP_RingDirection:$to);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $x `ranks` $ranks `to` $to attr-dict `:` type($x) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.engram_fetch (Engram: rows of tables held in host memory)
//===----------------------------------------------------------------------===//

def EP_EngramFetchOp : EP_Op<"engram_fetch", [EP_KernelOpInterface]> {
  let summary = "fetch rows of the ranks' host-memory tables by global entry id";
  let description = [{
    DeepEP V2's Engram fetch. Every rank holds a table of `N_e` entries of
    `hidden` elements of `dtype` in the host segment of its window (written
    by the buffer's `engram_write`, `num_cpu_bytes` of pinned host memory
    after the window; an entry takes `align(hidden x bytes(dtype), 32)`
    bytes). `indices` (`[T, M]`, i32) are global entry ids
    `owner_rank x N_e + local_entry`; the result is `[T, M x hidden]`: row
    `t` holds the `M` entries `indices[t, :]` side by side.

    Only the rows move: an FP8 table's scale factors are a replicated table
    the caller gathers itself. Of the configuration, `ranks`, `hidden`,
    `dtype`, `scaleup_ranks` and `num_sms` matter; the kernel reads the
    owners' segments through NVLink, so every rank must be in one NVLink
    domain (`scaleup_ranks` = `ranks`). An id outside `[0, ranks x N_e)`
    fetches a row of zeros (the runtime refuses such ids where it checks).
    `N_e` and the segment's offset are run-time values of the kernel.

    ```mlir
    %rows = ep.engram_fetch %indices config #cfg
        : tensor<?x24xi32> -> tensor<?x3072xbf16>
    ```
  }];
  let arguments = (ins EP_ConfigAttr:$config, 2DTensorOf<[I32]>:$indices);
  let results = (outs EP_RowTensor:$rows);
  let assemblyFormat = [{
    $indices `config` $config attr-dict `:` type($indices) `->` type($rows)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ep.low_latency_dispatch / ep.low_latency_combine (DeepEP V1's low-latency mode)
//===----------------------------------------------------------------------===//

def EP_LowLatencyDispatchOp : EP_Op<"low_latency_dispatch", [EP_KernelOpInterface]> {
  let summary = "decode dispatch into fixed per-expert receive slots, FP8 cast fused";
  let description = [{
    DeepEP V1's `low_latency_dispatch`: no count exchange, no host
    synchronization, one launch of two kernels (a send and a receive phase;
    the runtime may launch the receive later, DeepEP's `return_recv_hook`).
    Every rank sends each of its `T` bf16 tokens `x` ([T, hidden], T <= the
    run-time cap `Tmax`) to the `topk_idx` ([T, K], -1 = none) experts'
    ranks, cast to FP8 E4M3 on the way when the configuration's dtype is
    `f8E4M3FN` (one scale per 128 channels: `amax / 448`, amax at least
    1e-4; `round_scale`: rounded up to a power of two; `ue8m0`: returned as
    exponent bytes, four to an i32). Each (local expert, source rank) has
    `Tmax` fixed slots in the receiver's window; a source fills its slots
    in token order and then posts the count, so the receiver needs no
    exchange. Results, per local expert `l`:

    - `recv_x` [L, R x Tmax, hidden]: rows `[0, recv_count[l])` valid, from
      source rank 0 first, each source's tokens in order;
    - `recv_scales` (FP8 only) [L, R x Tmax, G] f32 or [L, R x Tmax, G/4]
      i32, column-major per expert (stride 1 along the rows: TMA's layout);
    - `recv_count` [L], `src_info` [L, R x Tmax] (the source token),
      `layout_range` [L, R] (`begin << 32 | count` per source rank), and
      `route` [L, R x Tmax] (`source x Tmax x K + token x K + slot`: where
      `ep.low_latency_combine` sends the row back).

    One NVLink domain (every rank reached by LSA pointers).

    ```mlir
    %x8, %sf, %n, %src, %range, %route = ep.low_latency_dispatch %x, %idx
        round_scale config #cfg
        : tensor<?x7168xbf16>, tensor<?x8xi64>
        -> tensor<32x?x7168xf8E4M3FN>, scales tensor<32x?x56xf32>,
           tensor<32xi32>, tensor<32x?xi32>, tensor<32x8xi64>, tensor<32x?xi32>
    ```
  }];
  let arguments = (ins EP_ConfigAttr:$config, EP_BF16RowTensor:$x, EP_TopkIdxTensor:$topk_idx,
                       UnitAttr:$round_scale, UnitAttr:$use_ue8m0);
  let results = (outs
    TensorRankOf<[BF16, F8E4M3FN], [3]>:$recv_x,
    Optional<TensorRankOf<[F32, I32], [3]>>:$recv_scales,
    TensorRankOf<[I32], [1]>:$recv_count,
    2DTensorOf<[I32]>:$src_info,
    2DTensorOf<[I64]>:$layout_range,
    2DTensorOf<[I32]>:$route);
  let assemblyFormat = [{
    $x `,` $topk_idx (`round_scale` $round_scale^)? (`ue8m0` $use_ue8m0^)?
    `config` $config attr-dict `:` type($x) `,` type($topk_idx) `->` type($recv_x) `,`
    (`scales` type($recv_scales)^ `,`)? type($recv_count) `,` type($src_info) `,`
    type($layout_range) `,` type($route)
  }];
  let hasVerifier = 1;
}

def EP_LowLatencyCombineOp : EP_Op<"low_latency_combine", [EP_KernelOpInterface]> {
  let summary = "send expert outputs back to their tokens' ranks, weighted sum there";
  let description = [{
    DeepEP V1's `low_latency_combine`: `x` [L, R x Tmax, hidden] bf16 holds
    each local expert's output rows where `ep.low_latency_dispatch` put its
    inputs (`layout_range`, `route` are that dispatch's). Every row goes back
    to its source rank's window, to the slot of its (token, top-k slot); the
    source then computes, per token `t` of its `T`, `sum over k with
    topk_idx[t, k] >= 0 of topk_weights[t, k] x row(t, k)` in f32 in k order
    from +0.0, rounded once to bf16 ([T, hidden]; zeros for a token with no
    expert). Two kernels (send, then the weighted sum; the runtime may
    launch the sum later, DeepEP's `return_recv_hook`). One NVLink domain.

    ```mlir
    %y = ep.low_latency_combine %out, %range, %route, %idx, %w config #cfg
        : tensor<32x?x7168xbf16>, tensor<32x8xi64>, tensor<32x?xi32>,
          tensor<?x8xi64>, tensor<?x8xf32> -> tensor<?x7168xbf16>
    ```
  }];
  let arguments = (ins EP_ConfigAttr:$config, TensorRankOf<[BF16], [3]>:$x,
                       2DTensorOf<[I64]>:$layout_range, 2DTensorOf<[I32]>:$route,
                       EP_TopkIdxTensor:$topk_idx, 2DTensorOf<[F32]>:$topk_weights);
  let results = (outs EP_BF16RowTensor:$combined_x);
  let assemblyFormat = [{
    $x `,` $layout_range `,` $route `,` $topk_idx `,` $topk_weights `config` $config
    attr-dict `:` type($x) `,` type($layout_range) `,` type($route) `,` type($topk_idx) `,`
    type($topk_weights) `->` type($combined_x)
  }];
  let hasVerifier = 1;
}

#endif // EPIC_DIALECT_EP_IR_EPOPS_TD
