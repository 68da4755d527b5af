//===-- Passes.td - epic conversion passes ------------------*- tablegen -*-===//

#ifndef EPIC_CONVERSION_PASSES_TD
#define EPIC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

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
      Copies, waits and barriers call `__epic_virtual_*`. Inside a kernel
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
    an `!llvm.struct<(i32, i32, i32, i32, i32)>` holding (ranks, rank,
    stride, kind, world rank). Function signatures, calls and `gpu.launch_func`
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

#endif // EPIC_CONVERSION_PASSES_TD
