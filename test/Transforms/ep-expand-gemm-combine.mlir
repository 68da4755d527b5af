// ep-expand of ep.gemm_combine (what ep-fuse-gemm-combine makes): one
// cooperative kernel that starts with the combine's entry barrier, maps rows
// to tokens and meets the rank's other blocks, runs the grouped GEMM, and
// after each tile counts the row tile's column tiles (acq_rel); the block that
// completes a row tile counts each row against its token, and the warp that
// completes a token queues it; every warp sends one queued token to its source
// after each tile (the combine's send: rows summed in slot order, one
// rounding), and all warps drain the queue after their last tile; then the
// done flags and the unchanged reduce.
// RUN: epic-opt %s --ep-expand | FileCheck %s
// RUN: epic-compile %s --backend=nccl -o %t
// RUN: FileCheck %s --check-prefix=JSON < %t.json

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>

// CHECK-LABEL: gpu.func @moe_out_gemm_send(
// The combine's entry barrier: arrivals at every peer, a bounded wait.
// CHECK:         comm.red add release scope sys
// CHECK:         comm.wait_flag %{{.*}} ge %{{.*}} rank %{{.*}} scope sys
// The rank's blocks meet after the row -> token map is written.
// CHECK:         comm.red add release scope gpu
// CHECK:         comm.wait_flag %{{.*}} ge %{{.*}} rank %{{.*}} scope gpu
// CHECK:         nvgpu.warpgroup.mma %{{.*}} {transposeB} :
// CHECK:         nvvm.wgmma.wait.group.sync.aligned 0
// CHECK:         nvgpu.warpgroup.mma.store
// CHECK-COUNT-16: arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// After the tile: its column tile is counted; the last one completes the rows.
// CHECK:         %[[COLUMNS:.*]] = comm.atomic_rmw add acq_rel scope gpu %{{.*}}, %{{.*}} : i32
// CHECK:         %[[BEFORE:.*]] = memref.load
// CHECK:         %[[SEVEN:.*]] = arith.constant 7 : i32
// CHECK:         %[[LAST:.*]] = arith.cmpi eq, %[[BEFORE]], %[[SEVEN]] : i32
// CHECK:         scf.if %[[LAST]] {
// Each row's token loses one pending row; at zero lane 0 queues the token:
// a slot at the tail, the entry (token + 1) stored with release.
// CHECK:           comm.atomic_rmw add acq_rel scope gpu %c-1_i32{{.*}}
// CHECK:           gpu.shuffle  idx
// CHECK:           scf.if
// CHECK:             %[[SLOT:.*]] = comm.atomic_rmw add relaxed scope gpu %c1_i32{{.*}}
// CHECK:             %[[ENTRY:.*]] = comm.local_ptr
// CHECK:             comm.store release scope gpu %{{.*}}, %[[ENTRY]]
// Then each warp claims the head if the queue is not empty, and sends it.
// CHECK:         %[[HEAD:.*]] = comm.load relaxed scope gpu
// CHECK:         %[[TAIL:.*]] = comm.load relaxed scope gpu
// CHECK:         arith.cmpi slt, %[[HEAD]], %[[TAIL]] : i32
// CHECK:           comm.atomic_cas relaxed scope gpu %{{.*}}, %[[HEAD]], %{{.*}}
// CHECK:         scf.if
// CHECK:           comm.wait_flag %{{.*}} ge %{{.*}} rank %{{.*}} scope gpu
// CHECK:           comm.fence acq_rel scope gpu
// CHECK:           comm.peer_ptr
// CHECK:           arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// Out of tiles: claim entries until every received token is taken.
// CHECK:         scf.while
// CHECK:           comm.atomic_rmw add relaxed scope gpu
// CHECK:           scf.condition
// CHECK:           comm.wait_flag %{{.*}} ge %{{.*}} rank %{{.*}} scope gpu
// CHECK:           comm.peer_ptr
// The rank's last block: done flags, like the combine's send kernel.
// CHECK:         comm.store release scope sys
// CHECK:         comm.wait_flag %{{.*}} eq %{{.*}} rank %{{.*}} peer %{{.*}} scope sys
// CHECK-LABEL: gpu.func @moe_out_reduce(
// CHECK-LABEL: func.func @moe_out(
// CHECK-SAME:      epic.cooperative = 1
// CHECK-SAME:      epic.entry = "gemm_combine"
// CHECK-SAME:      epic.kernels = ["moe_out_gemm_send", "moe_out_reduce"]
// CHECK-SAME:      "lhs", "weights", "psum_num_recv_tokens_per_expert", "tensor_maps", "num_rows"]

// JSON: "ctas_per_sm": 2
// JSON: "name": "moe_out_gemm_send"
// JSON: "spill_store_bytes": 0
// JSON: "name": "moe_out_reduce"
// JSON: "spill_store_bytes": 0
func.func @moe_out(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>, %h: !ep.handle<#cfg>,
                   %b: tensor<?x1024xbf16>) -> (tensor<?x1024xbf16>, tensor<?x1024xbf16>) {
  %y, %out = ep.gemm_combine %rx, %w layout(%h : !ep.handle<#cfg>) bias(%b : tensor<?x1024xbf16>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x1024xbf16>
  return %y, %out : tensor<?x1024xbf16>, tensor<?x1024xbf16>
}
