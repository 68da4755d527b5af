// convert-ep-to-comm of ep.gemm_combine (what ep-fuse-gemm-combine makes): one
// cooperative kernel that starts with the combine's entry barrier, maps rows
// to tokens and meets the rank's other blocks; then the rank's blocks but the
// last run the grouped GEMM, thread 0 counting each stored tile in its
// 128-row tile's slot (release), and never wait for a send. Every warp (the
// last block's at once, the others after their last tile) claims chunks of 32
// rows in expert order, one row per lane: a lane waits until its row's tile
// has every column tile, takes the row off its token's count (acq_rel), and
// the warp sends each token whose count that ended (the combine's send: rows
// summed in slot order, one rounding). The rank's last warp resets the
// counters and exchanges the done flags; the reduce is unchanged.
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s
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
// The tiles: blocks below the last stride over them; the last takes none.
// CHECK:         %[[TILE_BLOCKS:.*]] = arith.subi %{{.*}}, %c1{{.*}} : index
// CHECK:         %[[IS_TILE_BLOCK:.*]] = arith.cmpi ult, %[[BLOCK:.*]], %[[TILE_BLOCKS]] : index
// CHECK:         %[[FIRST:.*]] = arith.select %[[IS_TILE_BLOCK]], %[[BLOCK]], %[[TILES:.*]] : index
// CHECK:         scf.for %{{.*}} = %[[FIRST]] to %[[TILES]] step %[[TILE_BLOCKS]]
// CHECK:           nvgpu.warpgroup.mma %{{.*}} {transposeB} :
// CHECK:           nvvm.wgmma.wait.group.sync.aligned 0
// CHECK:           nvgpu.warpgroup.mma.store
// CHECK-COUNT-16:  arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK:           gpu.barrier
// After the tile's stores: thread 0 counts it, nothing waits.
// CHECK-NOT:       comm.wait_flag
// CHECK:           comm.red add release scope gpu %c1_i32{{.*}}, %{{.*}} : i32, !llvm.ptr<1>
// CHECK-NOT:       comm.wait_flag
// CHECK:           nvvm.fence.proxy
// Then every warp claims the rank's next chunk of rows until none is left.
// CHECK:         scf.while
// CHECK:           comm.atomic_rmw add relaxed scope gpu %c1_i32{{.*}}
// CHECK:           scf.condition
// The chunk's expert (a scan), then a lane's row: all 8 column tiles of its
// row tile, then its token's count.
// CHECK:           scf.for
// CHECK:           comm.wait_flag %{{.*}} ge %c8_i32{{.*}} rank %{{.*}} scope gpu
// CHECK:           comm.atomic_rmw add acq_rel scope gpu %c-1_i32{{.*}}
// The tokens whose last row that was, one by one with the whole warp (a warp
// barrier hands what the completing lane acquired to the others).
// CHECK:           nvvm.vote.sync  ballot
// CHECK:           scf.while
// CHECK:             nvvm.bar.warp.sync
// CHECK-NEXT:        comm.fence acq_rel scope gpu
// CHECK:             comm.peer_ptr
// CHECK:             arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// The rank's last warp (count acq_rel, system scope) ends the send: it zeroes
// the warp count, the rank barrier and the claims, then every row tile's
// column count (the next call starts from zero), then the done flags.
// CHECK:         nvvm.bar.warp.sync
// CHECK:         comm.atomic_rmw add acq_rel scope sys %c1_i32
// CHECK:         nvvm.bar.warp.sync
// CHECK-COUNT-3:   comm.store relaxed scope gpu %c0_i32
// CHECK:           scf.for %{{.*}} = %{{.*}} to %c128_i32{{.*}} step %c32_i32
// CHECK:             llvm.store %c0_i32
// CHECK:         comm.store release scope sys
// CHECK:         comm.wait_flag %{{.*}} eq %{{.*}} rank %{{.*}} peer %{{.*}} scope sys
// CHECK:         gpu.return
// CHECK-LABEL: gpu.func @moe_out_reduce(
// CHECK-LABEL: func.func @moe_out(
// CHECK-SAME:      epic.cooperative = 1
// CHECK-SAME:      epic.entry = "gemm_combine"
// CHECK-SAME:      epic.kernels = ["moe_out_gemm_send", "moe_out_reduce"]
// CHECK-SAME:      "max_tokens_per_rank", "dst_buffer_slot_idx", "recv_row_of_slot", "lhs", "weights", "psum_num_recv_tokens_per_expert", "num_rows"]
// CHECK-SAME:      epic.param_stride = 448
// CHECK-SAME:      field = "lhs", offset = 192 : i64, rows = "num_rows"
// CHECK-SAME:      field = "weights", offset = 320 : i64

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
