// comm-param-tables-by-value: after the GPU-to-NVVM lowering, a kernel's
// parameter table becomes a by-value kernel parameter of one record per rank
// a launch serves (nccl: 1, virtual: ranks), 64-byte aligned and grid-constant.
// RUN: epic-opt %s --split-input-file --verify-diagnostics --comm-param-tables-by-value=backend=virtual | FileCheck %s --check-prefix=VIRTUAL
// RUN: epic-opt %s --split-input-file --comm-param-tables-by-value=backend=nccl | FileCheck %s --check-prefix=NCCL

// VIRTUAL-LABEL: llvm.func @k(
// VIRTUAL-SAME: %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr {llvm.align = 64 : i64, llvm.byval = !llvm.array<1024 x i8>, nvvm.grid_constant})
// VIRTUAL-NOT: comm.param_table
// NCCL-LABEL: llvm.func @k(
// NCCL-SAME: %{{.*}}: !llvm.ptr {llvm.align = 64 : i64, llvm.byval = !llvm.array<128 x i8>, nvvm.grid_constant})
gpu.module @m {
  llvm.func @k(%dc: !llvm.ptr, %win: !llvm.ptr, %table: !llvm.ptr)
      attributes {nvvm.kernel, comm.param_table = #comm.param_table<arg = 2, stride = 128, ranks = 8>} {
    llvm.return
  }
}

// -----

// Kernels without a table are left alone.
// VIRTUAL-LABEL: llvm.func @plain(
// VIRTUAL-SAME: %{{.*}}: !llvm.ptr)
// VIRTUAL-NOT: byval
gpu.module @m {
  llvm.func @plain(%p: !llvm.ptr) attributes {nvvm.kernel} {
    llvm.return
  }
}

// -----

// 128 virtual ranks of 448-byte records do not fit CUDA's parameter space;
// the same kernel for nccl (one record) does.
// NCCL-LABEL: llvm.func @fused(
// NCCL-SAME: llvm.byval = !llvm.array<448 x i8>
gpu.module @m {
  // expected-error@+1 {{the parameter table of kernel 'fused' would be 128 records x 448 bytes = 57344 bytes, more than the 32640 bytes CUDA allows for it}}
  llvm.func @fused(%dc: !llvm.ptr, %win: !llvm.ptr, %table: !llvm.ptr)
      attributes {nvvm.kernel, comm.param_table = #comm.param_table<arg = 2, stride = 448, ranks = 128>} {
    llvm.return
  }
}
