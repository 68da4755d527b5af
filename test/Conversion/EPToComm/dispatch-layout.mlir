// ep.dispatch_layout (DeepEP's get_dispatch_layout): a kernel that zeroes the
// rank's counts, then one that gives a thread to each token.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 128>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @layout_zero(%{{.*}}: !comm.dev_comm, %{{.*}}: !comm.window, %{{.*}}: !llvm.ptr) kernel
// CHECK-SAME: comm.param_table = #comm.param_table<arg = 2, stride = 64, ranks = 8>
// The 8 per-rank and 64 per-expert counts (fields 2 and 3) are cleared.
// CHECK: scf.for %{{.*}} = %{{.*}} to %c8_i32 step
// CHECK: llvm.store %c0_i32
// CHECK: scf.for %{{.*}} = %{{.*}} to %c64_i32 step
// CHECK: llvm.store %c0_i32
// CHECK: gpu.func @layout_count(
// A thread per token (num_tokens, field 1)...
// CHECK: %[[T:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> i32
// CHECK: scf.for %[[TOKEN:.*]] = %{{.*}} to %[[T]] step
// ... whose row of is_token_in_rank starts all false ...
// CHECK: scf.for %{{.*}} = %c0_i32 to %c8_i32{{.*}} step
// CHECK: llvm.store %c0_i8
// ... then reads its 6 int64 expert ids; -1 (or any id past 64) counts nowhere.
// CHECK: scf.for %{{.*}} = %c0_i32{{.*}} to %c6_i32 step
// CHECK: llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK: arith.trunci
// CHECK: arith.cmpi ult, %{{.*}}, %c64_i32
// CHECK: comm.red add relaxed scope gpu
// A token counts once per rank: the first of its experts on a rank sets the flag and counts it.
// CHECK: arith.divui %{{.*}}, %c8_i32
// CHECK: llvm.load %{{.*}} {alignment = 1 : i64} : !llvm.ptr<1> -> i8
// CHECK: llvm.store %c1_i8
// CHECK: comm.red add relaxed scope gpu
// The launch: both kernels in order, not cooperative, no window.
// CHECK-LABEL: func.func @layout(%{{.*}}: !comm.dev_comm, %{{.*}}: !comm.window, %{{.*}}: !llvm.ptr, %{{.*}}: index)
// CHECK-SAME: epic.cooperative = 0
// CHECK-SAME: epic.entry = "dispatch_layout"
// CHECK-SAME: epic.kernels = ["layout_zero", "layout_count"]
// CHECK-SAME: epic.param_fields = ["topk_idx", "num_tokens", "num_tokens_per_rank", "num_tokens_per_expert", "is_token_in_rank"]
// CHECK-SAME: epic.window_bytes = 0
// CHECK: gpu.launch_func @ep_kernels::@layout_zero
// CHECK: gpu.launch_func @ep_kernels::@layout_count
func.func @layout(%idx: tensor<?x6xi64>) -> (tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>) {
  %r, %e, %in = ep.dispatch_layout %idx config #cfg
      : tensor<?x6xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
  return %r, %e, %in : tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
}

// -----

// i32 expert ids: read as they are.
#cfg = #ep.config<ranks = 2, experts = 4, topk = 2, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 16>
// CHECK-LABEL: gpu.func @layout32_count(
// CHECK: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> i32
// CHECK-NOT: arith.trunci
// CHECK: arith.cmpi ult, %{{.*}}, %c4_i32
func.func @layout32(%idx: tensor<?x2xi32>) -> (tensor<2xi32>, tensor<4xi32>, tensor<?x2xi1>) {
  %r, %e, %in = ep.dispatch_layout %idx config #cfg
      : tensor<?x2xi32> -> tensor<2xi32>, tensor<4xi32>, tensor<?x2xi1>
  return %r, %e, %in : tensor<2xi32>, tensor<4xi32>, tensor<?x2xi1>
}
