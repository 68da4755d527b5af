//===-- Passes.td - epic conversion passes ------------------*- tablegen -*-===//

#ifndef EPIC_CONVERSION_PASSES_TD
#define EPIC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertEPToComm : Pass<"convert-ep-to-comm", "::mlir::ModuleOp"> {
  let summary = "lower ep ops to communication kernels and their launches";
  let description = [{
    A dialect conversion: one pattern per ep op that has kernels (the ops
    of `ep::KernelOpInterface`: dispatch, combine, grouped_gemm and the fused
    dispatch_gemm and gemm_combine). Each rewrites the function that holds
    it (the op and its `return`: the entry form the runtime generates per
    configuration) into

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
    `one-pass-dispatch` (a backend with one address space: the
    virtual world, which `epic-to-ptx` sets it for) a cached dispatch is one
    kernel, `<name>_scatter`, and no window traffic: one warp per token reads
    each destination's parameter record (`comm.peer_params`), finds the
    token's row there (the destination's prefix sum before this rank plus
    the replayed slot; expanded: that row of its `recv_src_metadata`), reads
    the token's row once and stores it to every target row, then the scale
    packs and (plain) the local top-k ids. No entry barrier and no done
    flags: the launch serves every rank, so its end orders every write.
    With the same option an uncached dispatch is two kernels and no record
    traffic either: `<name>_count` (the entry barrier, then one warp per
    token takes its slot at each destination and, expanded, its slot in each
    local expert's block of the destination, without moving a row; the count
    exchange, which leaves each destination's per-(source, expert) first rows
    in its window) and `<name>_scatter`, which places every row, scale pack,
    id, weight and metadata row straight at its final place: each source row
    is read once, each received row written once.

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

    **Across nodes** (`scaleup_ranks` < `ranks`): direct mode reaches the
    ranks of other nodes by GIN puts from a per-warp staging ring, counts
    and done flags by signals. Hybrid mode (`mode = hybrid`) sends a token
    once per destination node, to its forwarder there (the rail peer), which
    sends it on over NVLink: dispatch is `<name>_send` (to the forwarders),
    `<name>_forward` (to the node's ranks) and `<name>_copy`; combine is
    `<name>_send` (partial rows to the node's forwarders), `<name>_forward`
    (each node's sum back to the origin) and `<name>_reduce` (per node
    master slot). The forwarder's state is the handle's `fwd_src_metadata`
    and `fwd_counts`.

    Not generated yet: Hopper bulk copies (`cp.async.bulk`) staged in
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
    Option<"onePassDispatch", "one-pass-dispatch", "bool", /*default=*/"false",
           "a dispatch (cached or not) writes every row straight into its "
           "destination's outputs (needs every rank's tensors in one address space: "
           "the virtual backend)">,
    Option<"onePassCombine", "one-pass-combine", "bool", /*default=*/"false",
           "a combine reads every contribution straight from its rank's rows, one "
           "kernel (one address space: the virtual backend). It finds a plain row by "
           "its dispatch slot, through the handle's recv_row_of_slot where a "
           "deterministic buffer sorted the rows">
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect",
                           "::mlir::arith::ArithDialect", "::mlir::LLVM::LLVMDialect",
                           "::mlir::NVVM::NVVMDialect", "::mlir::memref::MemRefDialect",
                           "::mlir::vector::VectorDialect",
                           "::mlir::nvgpu::NVGPUDialect",
                           "::epic::comm::CommDialect"];
}

def ConvertCommToNVVM : Pass<"convert-comm-to-nvvm", "::mlir::ModuleOp"> {
  let summary = "lower the comm dialect to NVVM/LLVM and device-shim calls";
  let description = [{
    Lowers every `comm` op, for one of two backends:

    * `backend=nccl` (default): the real one. Teams, window pointers, network
      operations (put, put_value, signal, wait_signal, read/reset_signal,
      flush) and barriers become calls to the project's device shim over the
      NCCL device API (`__epic_nccl_*`, declared from
      `runtime/include/epic/device/ShimABI.def`), one function per
      cooperation level. The shim is LLVM bitcode that `epic-to-ptx` links
      before NVPTX, so the calls inline away.
    * `backend=virtual`: R ranks on one GPU, no NCCL. Teams and window
      pointers are inlined: a rank is a contiguous group of
      `gridDim.x / R` blocks (`rank = blockIdx.x / (gridDim.x / R)`), a
      peer's pointer is `base + peer * stride + offset` read from the
      `EpicVirtualWindow` descriptor, and signal reads are acquire loads.
      The R ranks form nodes of `lsa_size` (M) GPUs, node-major: the LSA
      team is the own node, the rail the ranks of the same GPU index, and a
      `comm.peer_ptr` to a rank of another node traps, naming both ranks
      (`__epic_virtual_check_lsa_peer`, a compare and a branch in a world of
      one node). Copies, waits and barriers call `__epic_virtual_*`. Inside a kernel
      that takes a `!comm.dev_comm`, `gpu.block_id x` and `gpu.grid_dim x`
      are rewritten to the block index and block count *within the rank*, so
      kernels are written per rank and run unchanged on both backends.

    In both, the flag operations are inlined: `comm.load`/`comm.store` become
    atomic `llvm.load`/`llvm.store` with the ordering and a sync scope
    (`ld.acquire.sys`, `st.release.gpu`, ...), `comm.fence` an `llvm.fence`,
    `comm.red`/`comm.atomic_rmw` exact PTX (`red.release.sys.global.add.u32`,
    `atom.acq_rel.gpu.add.u32`, ...), and `comm.wait_flag` a call to the
    bounded wait of the shim. Every wait's `timeout_ms` becomes nanoseconds
    of `%globaltimer`.

    Types: `!comm.dev_comm` and `!comm.window` become `!llvm.ptr` (pointers
    to `ncclDevComm`/`ncclWindow` or to the virtual descriptors), `!comm.team`
    an `!llvm.struct<(i32, i32, i32, i32, i32, i32, i32)>` holding (ranks,
    rank, stride, kind, world rank, and the virtual world's M and R; 0 for
    nccl). Function signatures, calls and `gpu.launch_func`
    operands are converted too.

    ```mlir
    // before
    comm.put %n bytes from %win[%a] to %win[%b] of %world peer %p via %dc
        signal(%sig) coop warp
    // after (backend=nccl)
    llvm.call @__epic_nccl_put_warp(%dc, %ctx0, %tn, %tr, %ts, %p, %win, %b,
        %win, %a, %n, %c1, %sig, %c0, %c0_i32, %c0_i32) : (...) -> ()
    ```
  }];
  let options = [
    Option<"backend", "backend", "::epic::CommBackend",
           /*default=*/"::epic::CommBackend::nccl",
           "the communication backend to lower to",
           [{::llvm::cl::values(
             clEnumValN(::epic::CommBackend::nccl, "nccl",
                        "NCCL device API through the epic device shim"),
             clEnumValN(::epic::CommBackend::virtual_, "virtual",
                        "R virtual ranks on one GPU"))}]>
  ];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect",
                           "::mlir::NVVM::NVVMDialect"];
}

def CommParamTablesByValue : Pass<"comm-param-tables-by-value", "::mlir::ModuleOp"> {
  let summary = "pass each kernel's table of per-rank parameter records by value";
  let description = [{
    Runs after the GPU-to-NVVM lowering, on the `llvm.func` kernels that carry
    `comm.param_table` (`#comm.param_table<arg, stride, ranks>`): the table
    argument gets `llvm.byval = !llvm.array<N x i8>` with N = records x stride
    (one record for `backend=nccl`, `ranks` for `backend=virtual`), 64-byte
    alignment and `nvvm.grid_constant`, and the attribute goes. The runtime
    then launches the kernel with the table's bytes as a kernel parameter: no
    upload, no allocation, nothing but the launch to capture in a CUDA graph.
    NVPTX turns the record loads into `ld.param` and a taken address (a TMA
    descriptor inside a record) into `cvta.param`.

    Fails, naming the kernel, where N exceeds the 32,640 bytes CUDA leaves
    for it (32,764 bytes of kernel parameters, the two pointers before the
    table and its alignment): a virtual world too large for the entry.

    ```mlir
    // before
    llvm.func @k(%dc: !llvm.ptr, %win: !llvm.ptr, %table: !llvm.ptr)
        attributes {comm.param_table = #comm.param_table<arg = 2, stride = 128, ranks = 8>, ...}
    // after (backend=virtual)
    llvm.func @k(%dc: !llvm.ptr, %win: !llvm.ptr,
                 %table: !llvm.ptr {llvm.align = 64 : i64,
                                    llvm.byval = !llvm.array<1024 x i8>, nvvm.grid_constant})
    ```
  }];
  let options = [
    Option<"backend", "backend", "::epic::CommBackend",
           /*default=*/"::epic::CommBackend::nccl",
           "the communication backend to lower to",
           [{::llvm::cl::values(
             clEnumValN(::epic::CommBackend::nccl, "nccl",
                        "NCCL device API through the epic device shim"),
             clEnumValN(::epic::CommBackend::virtual_, "virtual",
                        "R virtual ranks on one GPU"))}]>
  ];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect", "::mlir::NVVM::NVVMDialect"];
}

def ExternDynamicSharedMemory
    : Pass<"extern-dynamic-shared-memory", "::mlir::ModuleOp"> {
  let summary = "place a kernel's dynamic shared memory after its static shared variables";
  let description = [{
    Runs after the GPU-to-NVVM lowering, which gives `gpu.dynamic_shared_memory`
    its base as an internal zero-sized `llvm.mlir.global` in address space 3.
    NVPTX treats an internal shared global used by one kernel as that kernel's
    own variable ("demoted"): it is printed as a one-byte `.shared .b8`, and
    ptxas lays it out among the static shared variables, before the ones
    declared after it. What a kernel then keeps "in dynamic shared memory"
    starts at that byte and runs over the static variables: the grouped GEMMs'
    first ring stage over their mbarriers and the kernel's shared flag, whose
    bytes every stage-0 TMA load overwrote.

    Every zero-sized array global in address space 3 gets external linkage, so
    it is printed `.extern .shared .align A .b8 name[]` and placed where CUDA
    puts dynamic shared memory: after every static shared variable. A
    zero-sized shared global with an initializer is refused (it cannot be
    external).

    ```mlir
    // before
    llvm.mlir.global internal @__dynamic_shmem__0()
        {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
    // after
    llvm.mlir.global external @__dynamic_shmem__0()
        {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
    ```
  }];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
}

#endif // EPIC_CONVERSION_PASSES_TD
