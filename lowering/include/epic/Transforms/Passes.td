//===-- Passes.td - epic transformation passes --------------*- tablegen -*-===//

#ifndef EPIC_TRANSFORMS_PASSES_TD
#define EPIC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

// The cost model's options, the same on both fusion passes
// (epic/runtime/FusionCostModel.h; the chips' numbers are FusionCosts.def's, a number left
// 0 keeps the chip's).
defvar FusionCostOptions = [
  Option<"mode", "mode", "std::string", /*default=*/"\"auto\"",
         "auto: fuse where the cost model predicts a win; always; never (a "
         "function's ep.fusion attribute overrides it)">,
  Option<"chip", "chip", "std::string", /*default=*/"\"sm_90a\"",
         "the GPU whose numbers the cost model uses (FusionCosts.def)">,
  Option<"ranksPerDevice", "ranks-per-device", "int", /*default=*/"1",
         "ranks that share one GPU: 1 on NCCL, 0 for all of them (the virtual "
         "world; the compiler sets it from its backend)">,
  Option<"copyGBps", "copy-gbps", "double", /*default=*/"0",
         "bytes a copy moves per second, in GB/s">,
  Option<"weightGBps", "weight-gbps", "double", /*default=*/"0",
         "HBM read bandwidth of the GEMM's weights, in GB/s">,
  Option<"linkGBps", "link-gbps", "double", /*default=*/"0",
         "bytes one GPU stores into its NVLink peers per second, in GB/s">,
  Option<"gemmTflops", "gemm-tflops", "double", /*default=*/"0",
         "the grouped GEMM's dense rate, in TFLOPS">,
  Option<"launchUs", "launch-us", "double", /*default=*/"0",
         "one more kernel boundary, in microseconds">,
  Option<"waitUs", "wait-us", "double", /*default=*/"0",
         "one cross-block flag round trip, in microseconds">,
  Option<"slowdown", "slowdown", "double", /*default=*/"0",
         "the fused kernel's GEMM time over the grouped GEMM's alone">
];

def EPFuseDispatchGemm : Pass<"ep-fuse-dispatch-gemm", "::mlir::func::FuncOp"> {
  let summary = "fuse an expanded dispatch with the expert GEMM on its rows";
  let description = [{
    Rewrites `ep.dispatch` (expanded layout, BF16/F16, not cached) followed by
    an `ep.grouped_gemm` of its `recv_x` on its handle into one
    `ep.dispatch_gemm`, whose schedule lets every GEMM tile wait only for the
    rows it reads instead of the whole dispatch.

    **Schedule** (what `convert-ep-to-comm` generates for `ep.dispatch_gemm`): the
    dispatch's send kernel as before (records into the peers' windows, count
    exchange, prefix sums), then **one cooperative kernel with two roles**
    rather than two kernels on two streams (one launch, nothing for the
    runtime to coordinate, and the roles share the tile counters in the
    window): every block first *copies* its share of the received rows — it
    places each (token, local expert) pair at its row of the expert's range
    and then adds 1 (release) to the counter of that row's 128-row tile,
    `tile_done[e][row / 128]` — then runs the persistent grouped GEMM, and
    before the TMA loads of a tile, thread 0 waits (bounded acquire,
    `comm.wait_flag`) until the counter of every row tile of the tile's
    expert reaches the rows it covers, `min(128, count_e - 128 m)`. Waiting
    for the whole expert keeps the blocks on the row tiles that share a
    weight column tile in step, so each weight tile comes from memory once
    and from L2 for the others (waiting per row tile let the first row tiles
    race ahead: L2 hits fell from 49% to 34% and the GEMM ran 1.45x slower on
    the H200). A block done with its rows starts the experts whose rows are
    placed while others still copy. The copy runs on the GEMM's blocks (8
    warps per SM, not 32), so each lane keeps up to 16 chunks of a row in
    flight (the GEMM's register budget pays for them). (Giving the copy to a
    fixed share of the blocks was measured slower: the copy is latency-bound,
    and a quarter or an eighth of the blocks took longer than the GEMM.) The
    expert's last tile (a second counter counts them) resets its counters, so
    they are zero again after every call. Every wait in the kernel is the
    call-free kind (a call would serialize its wgmma: `comm.wait_flag`).

    **Cost model** (`mode=auto`, the default): the pass predicts both
    schedules' time on one GPU at the configuration's token cap — the copy's
    bytes at copy bandwidth, the GEMM's FLOPs or weight bytes (whichever is
    slower), a kernel boundary, and the fused kernel's GEMM slowed by the
    chip's measured factor (it loses L2 reuse) — and fuses only when the
    fused schedule is predicted faster. A remark on the dispatch says which
    way and the two predictions. `mode=always` / `never`, or the function's
    `ep.fusion` attribute, decides without the model.

    Fusion is refused, with a remark that says why, when the rows feed
    something else than one `ep.grouped_gemm` on the same handle, when the
    dispatch is cached or FP8, or when the expert weights are not available
    where the fused op must go.

    ```mlir
    // before
    %rx, %rw, %h = ep.dispatch %x topk(%idx : ...) weights(%w : ...) config #cfg : ...
    %y = ep.grouped_gemm %rx, %W layout(%h : !ep.handle<#cfg>) : ...
    // after
    %rx, %rw, %y, %h = ep.dispatch_gemm %x topk(%idx : ...) weights(%w : ...)
        experts(%W : ...) config #cfg : ...
    ```
  }];
  let options = FusionCostOptions;
  let dependentDialects = ["::epic::ep::EPDialect"];
}

def EPFuseMoeLayer : Pass<"ep-fuse-moe-layer", "::mlir::func::FuncOp"> {
  let summary = "make a decode-sized FP8 MoE layer one persistent kernel";
  let description = [{
    Rewrites DeepSeek V3's FP8 layer written as five ops on one handle into
    one `ep.moe_layer`:

    ```mlir
    // before
    %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : ...) scales(%sf : ...)
        weights(%w : ...) config #cfg : ...
    %gu = ep.grouped_gemm %rx, %w13 layout(%h : ...) scales(%rsf, %s13 : ...) : ... -> ...xbf16>
    %a, %as = ep.swiglu %gu layout(%h : ...) weights(%rw : ...) : ... -> ...xf8E4M3FN>, ...
    %y = ep.grouped_gemm %a, %w2 layout(%h : ...) scales(%as, %s2 : ...) : ... -> ...xbf16>
    %out = ep.combine %y, %h : ...
    // after
    %out = ep.moe_layer %x topk(%idx : ...) scales(%sf : ...) weights(%w : ...)
        gate_up(%w13, %s13 : ...) down(%w2, %s2 : ...) config #cfg : ...
    ```

    `convert-ep-to-comm` lowers `ep.moe_layer` to one cooperative kernel
    whose blocks run the five steps in turn, meeting at a rank barrier between
    steps: no launch and no host step inside the layer. At decode sizes the
    steps other than the GEMMs are short and the launches between them
    (and their tails, where most SMs idle) are what one kernel removes; at
    prefill sizes the GEMMs compute for milliseconds and a barrier instead
    of a launch changes nothing. `mode=auto` (the default) fuses where the
    configuration's token cap is at most `max-tokens` per rank, and
    `max-tokens` is 0 by default: measured on an H100, the kernel is 3-11%
    slower than the five ops at every size timed (its barriers between
    steps cost what the launches did; the steps do not overlap yet), so the
    rule fuses nothing until that changes. `always` and `never` (or the
    function's `ep.fusion` attribute) decide without it. A remark on the
    dispatch says which way and why, and names what keeps a chain from
    fusing: an intermediate value read outside the
    chain, a cached, window or zero-padding dispatch, BF16 rows, a combine
    with weights or biases, a SwiGLU without routing weights, a run-time
    token cap or several nodes.
  }];
  let options = [
    Option<"mode", "mode", "std::string", /*default=*/"\"auto\"",
           "auto: fuse where the token cap is at most max-tokens; always; never (a "
           "function's ep.fusion attribute overrides it)">,
    Option<"maxTokens", "max-tokens", "int64_t", /*default=*/"0",
           "the largest token cap per rank mode=auto fuses (0, the default: none, "
           "as measured)">
  ];
  let dependentDialects = ["::epic::ep::EPDialect"];
}

def EPFuseGemmCombine : Pass<"ep-fuse-gemm-combine", "::mlir::func::FuncOp"> {
  let summary = "fuse the expert GEMM with the combine of its output";
  let description = [{
    Rewrites an `ep.grouped_gemm` (BF16 output, N = hidden) followed by an
    `ep.combine` of its output on the same handle (no combine weights) into
    one `ep.gemm_combine`: each token is sent back as soon as the GEMM has
    stored its rows, overlapping the send of early tokens with the
    computation of later tiles.

    **Schedule** (what `convert-ep-to-comm` generates): one cooperative kernel, then
    the combine's reduce kernel. The kernel starts with the combine's entry
    barrier (remote windows are free), maps every expanded row to its
    received token and counts each token's local rows, and meets the rank's
    other blocks. All of the rank's blocks but the last then run the
    persistent grouped GEMM: after a tile's stores thread 0 adds 1 (release)
    to its 128-row tile's column counter, and no tile ever waits for a send.
    Sending is done by every warp that has no tile to compute: the last
    block's warps from the start, the others' after their last tile. A warp
    claims the rank's next chunk of 32 rows (chunks in expert order, the
    order the tiles finish in), a lane per row; a lane waits (bounded) until
    its row tile's counter holds every column tile, then subtracts 1
    (acq_rel) from its token's count, and the warp sends each token whose
    count that ended. A send sums the token's rows in increasing slot order
    in fp32 from +0.0, rounds to bf16 once and writes the row into the
    source rank's window: the combine's send stage with the same arithmetic,
    so the combined result is bitwise the unfused one. The rank's last warp
    resets the counters and exchanges done flags with every peer; the reduce
    kernel sums as before.

    Why no tile block sends while it has tiles: the GEMM is fast only while
    a rank's blocks run in step, streaming each weight tile (shared by an
    expert's row tiles) and each lhs tile (shared by its column tiles)
    through L2 once. Sends made by the tile blocks between tiles (the first
    schedule) or by an extra warp in every block (whose registers pushed the
    GEMM's into local memory) put the blocks out of step: on the H200 the
    kernel read 85-98 GB from DRAM where the GEMM alone reads 40, and ran
    1.7-2.2x slower. The send block costs one block of the rank's tiles;
    the tile blocks that finish early drain what it could not send.

    **Cost model**: as for `ep-fuse-dispatch-gemm`, with the combine's send
    (NVLink bandwidth for rows bound to other GPUs, copy bandwidth for the
    GPU's own ranks) in place of the copy.

    Fusion is refused, with a remark saying why, when the GEMM's output is not
    bf16 or not hidden-wide, when the combine takes weights or another
    handle, or when the output feeds something else than one ep.combine.

    ```mlir
    // before
    %y = ep.grouped_gemm %rx, %w layout(%h : ...) : ...
    %out = ep.combine %y, %h : ...
    // after
    %y, %out = ep.gemm_combine %rx, %w layout(%h : ...) : ...
    ```
  }];
  let options = FusionCostOptions;
  let dependentDialects = ["::epic::ep::EPDialect"];
}

#endif // EPIC_TRANSFORMS_PASSES_TD
