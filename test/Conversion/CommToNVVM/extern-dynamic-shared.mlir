// extern-dynamic-shared-memory: the GPU-to-NVVM lowering's base of dynamic
// shared memory (an internal zero-sized array in address space 3) becomes
// external, so NVPTX declares it `.extern .shared ... []` and ptxas places it
// after the static shared variables instead of among them.
// RUN: epic-opt %s --split-input-file --verify-diagnostics --extern-dynamic-shared-memory | FileCheck %s

// CHECK-LABEL: gpu.module @gemm
// CHECK: llvm.mlir.global external @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
// A static shared variable (an mbarrier group) keeps its linkage.
// CHECK: llvm.mlir.global internal @__mbarrier() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<6 x i64>
// A zero-sized global of another address space is not shared memory.
// CHECK: llvm.mlir.global internal @empty_global() {addr_space = 1 : i32} : !llvm.array<0 x i8>
gpu.module @gemm {
  llvm.mlir.global internal @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
  llvm.mlir.global internal @__mbarrier() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<6 x i64>
  llvm.mlir.global internal @empty_global() {addr_space = 1 : i32} : !llvm.array<0 x i8>
  llvm.func @k() attributes {nvvm.kernel} {
    llvm.return
  }
}

// -----

// A zero-sized shared global with an initializer cannot be dynamic shared memory.
gpu.module @initialized {
  // expected-error @+1 {{extern-dynamic-shared-memory: the zero-sized shared global 'init_shmem' has an initializer}}
  llvm.mlir.global internal @init_shmem() {addr_space = 3 : i32} : !llvm.array<0 x i8> {
    %0 = llvm.mlir.undef : !llvm.array<0 x i8>
    llvm.return %0 : !llvm.array<0 x i8>
  }
}
