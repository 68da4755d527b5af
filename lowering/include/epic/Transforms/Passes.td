//===-- Passes.td - epic transformation passes --------------*- tablegen -*-===//

#ifndef EPIC_TRANSFORMS_PASSES_TD
#define EPIC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def EPExpand : Pass<"ep-expand", "::mlir::ModuleOp"> {
  let summary = "expand ep ops into communication kernels and their launches";
  let description = [{
    Rewrites every function that holds one `ep.dispatch`, `ep.combine` or
    `ep.grouped_gemm`
    (and nothing else but its `return`: the entry form the runtime generates
    per configuration) into

    * kernels in the module's `gpu.module @ep_kernels` (one cubin), built
      from `comm` ops and upstream dialects,
      specialized on the op's `#ep.config` (ranks, experts, top-k, hidden,
      data and index types, scale packs, alignment) — everything but token
      counts and pointers is a compile-time constant; and
    * a host function of the same name that launches them in order:
      `(%comm: !comm.dev_comm, %window: !comm.window, %params: !llvm.ptr<1>,
      %grid: index)`.

    Kernels take the device communicator, the symmetric window and a table of
    per-rank parameter records (`comm.rank_params`): each record is 8-byte
    fields named by the launch function's `epic.param_fields`; the window's
    layout (`epic.window_bytes`) is fixed by the configuration. The same
    kernels serve both backends of `convert-comm-to-nvvm`. `epic.cooperative
    = 1` asks the runtime for a cooperative launch: the blocks of one launch
    wait for each other, so all of them must be resident at once. Every
    device-side wait is bounded: 100 s, or the entry function's
    `epic.timeout_ms` (DeepEP's `num_gpu_timeout_secs`, in milliseconds),
    which the launch function repeats; on expiry the wait names the rank and
    peer and traps.

    **Entry barriers** (every send kernel starts with one, so remote buffers
    are free): block b of each rank meets block b of every other rank through
    monotonic arrival counters in the window (`comm.red` release, bounded
    `comm.wait_flag` acquire), at most `epic.max_blocks_per_rank` blocks.

    **Dispatch** (`<name>_send`, `<name>_copy`), direct mode, DeepEP V2's
    protocol: an entry barrier; then one warp per token:
    lanes read the K expert ids, `nvvm.match.sync` groups them by
    destination rank, the highest lane of each group (the master slot) takes
    a slot in the destination's receive region `[source rank][Tmax][record]`
    with a local atomic (so nothing waits for counts before sending), and
    the warp writes the record — hidden row in 16-byte vectors, scale packs,
    expert ids, weights, source token and master slot — straight into the
    peer's window over its LSA pointer. The last block of the rank to finish
    (an acq_rel arrival counter) publishes the per-expert and per-rank counts
    to every peer (release), waits for every peer's counts (bounded acquire
    waits), resets the counters, and writes the prefix sums and
    expert-aligned counts into the handle and the host-visible counts. The
    copy kernel then moves each received record into its row of the plain
    layout, translating expert ids to local ids or -1 and writing
    `recv_src_metadata` (`src_rank * Tmax + token`, `src_rank * K + master
    slot`, -1 ...).

    **Combine** (`<name>_send`, `<name>_reduce`): an entry barrier, then one
    warp per received row writes the bf16 row (and its K weights) into the
    source rank's region `[master slot][Tmax][record]`; the last block
    signals every peer and waits for every peer's signal. The reduce kernel
    sums, per token and 8 channels per lane, in fp32 from +0.0: the biases,
    then the rows of the master slots in increasing slot order, and rounds to
    bf16 once — bitwise DeepEP's order. It walks the set bits of the masters'
    ballot (absent slots cost nothing) and loads four 16-byte chunks of a lane
    per row before adding them, so each lane keeps four loads in flight.
    `combined_topk_weights[t, j]` comes from the record of the rank that owns
    slot `j`.

    **Expanded layout**: the copy kernel gives each (token, local expert)
    pair a row `start_e + cursor_e++` (a local atomic per expert, so rows of
    an expert come in arrival order), writes it to `recv_src_metadata[:, 2 +
    slot]`, and with `zero_padding` zeroes rows `[start_e + count_e, start_e +
    align(count_e))`. Its combine first sums the rank's rows of a token in
    fp32 in increasing slot order (one rounding, the same row walk as the
    reduce) and sends that one row.

    **Block size**: the data kernels run `threads-per-block` threads (1024 by
    default: 32 warps, DeepEP's warps per SM, so one block per SM keeps
    enough 16-byte accesses in flight to reach the memory bandwidth), known to
    every kernel (`known_block_size`, hence `.reqntid` for ptxas, which
    budgets 64 registers per thread).

    **Cached dispatch** replays the handle: the send kernel takes each master
    slot's receive slot from `dst_buffer_slot_idx` (which every non-cached
    dispatch writes) instead of an atomic, skips the count exchange (the
    last block only exchanges done flags), and the copy kernel puts every
    record at the row the handle's prefix sums (plain) or
    `recv_src_metadata` (expanded) give: bitwise the same rows. With
    `one-pass-cached-dispatch` (a backend with one address space: the
    virtual world, which `epic-to-ptx` sets it for) a cached dispatch is one
    kernel, `<name>_scatter`, and no window traffic: one warp per token reads
    each destination's parameter record (`comm.peer_params`), finds the
    token's row there (the destination's prefix sum before this rank plus
    the replayed slot; expanded: that row of its `recv_src_metadata`), reads
    the token's row once and stores it to every target row, then the scale
    packs and (plain) the local top-k ids. No entry barrier and no done
    flags: the launch serves every rank, so its end orders every write.

    **Grouped GEMM** (`<name>_gemm`, sm_90a): one persistent kernel of one
    warpgroup per block, two blocks per SM (`epic.ctas_per_sm`); block b of a
    rank takes tiles b, b + B, ... of (local expert, 128-column tile of N,
    128-row tile of its rows), row tiles fastest so that the blocks at work
    share each weight tile through L2 (the weights are most of the bytes), the
    experts' row ranges read from the handle's per-expert prefix sums. K
    advances in steps of 64 through a ring of 3 shared-memory stages filled by
    TMA (`nvgpu.tma.async.load`, 128-byte swizzle, an `nvgpu.mbarrier`
    transaction per stage) and consumed by `nvgpu.warpgroup.mma` (wgmma
    m64n128k16, two per k16 step, B N-contiguous) with one wgmma group in
    flight; the epilogue goes through shared memory and stores only the tile's
    expert rows. The launch function asks for 99 KiB of dynamic shared
    memory and two TMA descriptors (`epic.tensor_maps`: tensor field, rows,
    columns, box, swizzle) that the runtime encodes per call into the
    parameter memory (record field `tensor_maps`). Not cooperative.

    Not generated yet: hybrid (RDMA + NVLink) mode and GIN puts for peers
    outside the LSA team, Hopper bulk copies (`cp.async.bulk`) staged in
    shared memory instead of 16-byte vector copies, and `num_sms`-specific
    warp roles (the kernels are grid-agnostic: any block count per rank).

    ```mlir
    // before
    func.func @dispatch(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>)
        -> (tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#cfg>) {
      %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #cfg : ...
      return %rx, %ri, %h : ...
    }
    // after
    gpu.module @ep_kernels { gpu.func @dispatch_send(...) kernel {...}
                             gpu.func @dispatch_copy(...) kernel {...} }
    func.func @dispatch(%comm: !comm.dev_comm, %window: !comm.window,
                        %params: !llvm.ptr<1>, %grid: index)
        attributes {epic.param_fields = ["x", ...], epic.window_bytes = ...} {
      gpu.launch_func @ep_kernels::@dispatch_send blocks in (%grid, ...) ...
      gpu.launch_func @ep_kernels::@dispatch_copy blocks in (%grid, ...) ...
      return
    }
    ```
  }];
  let options = [
    Option<"threadsPerBlock", "threads-per-block", "unsigned", /*default=*/"1024",
           "threads of every kernel block (a multiple of 32)">,
    Option<"onePassCachedDispatch", "one-pass-cached-dispatch", "bool", /*default=*/"false",
           "a cached dispatch writes every row straight into its destination's "
           "outputs (needs every rank's tensors in one address space: the virtual "
           "backend)">
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect",
                           "::mlir::arith::ArithDialect", "::mlir::LLVM::LLVMDialect",
                           "::mlir::NVVM::NVVMDialect", "::mlir::memref::MemRefDialect",
                           "::mlir::vector::VectorDialect",
                           "::mlir::nvgpu::NVGPUDialect",
                           "::epic::comm::CommDialect"];
}

def EPFuseDispatchGemm : Pass<"ep-fuse-dispatch-gemm", "::mlir::func::FuncOp"> {
  let summary = "fuse an expanded dispatch with the expert GEMM on its rows";
  let description = [{
    Rewrites `ep.dispatch` (expanded layout, BF16/F16, not cached) followed by
    an `ep.grouped_gemm` of its `recv_x` on its handle into one
    `ep.dispatch_gemm`, whose schedule lets every GEMM tile wait only for the
    rows it reads instead of the whole dispatch.

    **Schedule** (what `ep-expand` generates for `ep.dispatch_gemm`): the
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

    **Schedule** (what `ep-expand` generates): one cooperative kernel, then
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
  let dependentDialects = ["::epic::ep::EPDialect"];
}

#endif // EPIC_TRANSFORMS_PASSES_TD
