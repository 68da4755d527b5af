// convert-ep-to-comm with one-pass-combine (one address space; epic-to-ptx sets it for the
// virtual backend): a combine is one kernel that reads every contribution where it lies, in
// each destination's x (through its parameter record), with no window traffic and no waits.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm=one-pass-combine=true | FileCheck %s
// Without the option: the staged send + reduce.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s --check-prefix=STAGED

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 64>

// Plain: slot j's row at d_j is d_j's prefix sum before this rank (field 3) plus the
// dispatch's slot (dst_buffer_slot_idx, field 11), through d_j's recv_row_of_slot (field 12)
// where d_j gave one (a deterministic buffer's sorted rows); the bias first, then the rows of
// the master slots in increasing order, fp32, one rounding; the weights from d_j's topk_weights (field 1).
// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @plain_gather(
// CHECK-NOT: comm.wait_flag
// CHECK-NOT: comm.store
// CHECK: llvm.getelementptr %{{.*}}[%c88_i64{{.*}}]
// CHECK: comm.peer_params
// CHECK: llvm.getelementptr %{{.*}}[%c24_i64{{.*}}]
// CHECK: comm.peer_params
// CHECK: llvm.getelementptr %{{.*}}[%c96_i64{{.*}}]
// CHECK: llvm.ptrtoint
// CHECK: comm.peer_params
// CHECK: llvm.getelementptr %{{.*}}[%c0_i64{{.*}}]
// CHECK: scf.while
// CHECK: arith.extf
// CHECK: arith.truncf
// CHECK: comm.peer_params
// CHECK: llvm.getelementptr %{{.*}}[%c8_i64{{.*}}]
// CHECK: llvm.load %{{.*}} : !llvm.ptr<1> -> f32
// CHECK-NOT: comm.wait_flag
// CHECK: gpu.return
// CHECK: func.func @plain(
// CHECK-SAME: epic.cooperative = 0
// CHECK-SAME: epic.kernels = ["plain_gather"]
// STAGED: epic.kernels = ["plain_send", "plain_reduce"]
func.func @plain(%y: tensor<?x512xbf16>, %h: !ep.handle<#cfg>, %w: tensor<?x4xf32>,
                 %b: tensor<?x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x4xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>) bias(%b : tensor<?x512xbf16>)
      : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>, tensor<?x4xf32>
  return %out, %ow : tensor<?x512xbf16>, tensor<?x4xf32>
}

// -----

#exp = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  expert_alignment = 64, layout = expanded, max_tokens_per_rank = 128>

// Expanded: slot j's row at d_j is column 2 + j of d_j's recv_src_metadata (field 2) at the
// token's row; each rank's rows of the token are summed and rounded to bf16 first (as its staged
// send does), then added in increasing master slot: two nested loops, two roundings.
// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @expanded_gather(
// CHECK: nvvm.match.sync any
// CHECK: llvm.getelementptr %{{.*}}[%c16_i64{{.*}}]
// CHECK: scf.while
// CHECK: scf.while
// CHECK: arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK: arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK: gpu.return
// CHECK: func.func @expanded(
// CHECK-SAME: epic.kernels = ["expanded_gather"]
// STAGED: epic.kernels = ["expanded_send", "expanded_reduce"]
func.func @expanded(%y: tensor<?x512xbf16>, %h: !ep.handle<#exp>) -> tensor<?x512xbf16> {
  %out = ep.combine %y, %h : tensor<?x512xbf16>, !ep.handle<#exp> -> tensor<?x512xbf16>
  return %out : tensor<?x512xbf16>
}
