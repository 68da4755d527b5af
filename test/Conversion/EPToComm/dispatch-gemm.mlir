// convert-ep-to-comm of ep.dispatch_gemm (what ep-fuse-dispatch-gemm makes): the
// dispatch's send kernel, then one cooperative kernel whose blocks first copy
// their share of the rows into the expanded layout and count them per 128-row
// tile (fence, warp sync, one release add per row), then run the grouped GEMM,
// each tile's loads preceded by bounded acquire waits for the counts of every
// row tile of its expert (so the tiles sharing a weight tile start together)
// and a proxy fence (TMA reads what generic stores wrote).
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=JSON < %t.json

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>

// CHECK-LABEL: gpu.func @moe_send(
// The dispatch's 16 fields and the GEMM's 2 (192 bytes), then two descriptors.
// CHECK:         comm.rank_params %{{.*}} stride 448

// CHECK-LABEL: gpu.func @moe_copy_gemm(
// CHECK-SAME:      %[[COMM:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %{{.*}}: !llvm.ptr) kernel
// CHECK-SAME:      comm.param_table = #comm.param_table<arg = 2, stride = 448, ranks = 8>
// CHECK:         %[[BLOCK:.*]] = gpu.block_id x
// CHECK:         %[[BLOCKS:.*]] = gpu.grid_dim x
// First the copy: a row is placed, then counted in its tile (the counters
// follow the dispatch's window, at 4370432).
// CHECK:         comm.atomic_rmw add relaxed scope gpu
// CHECK:         comm.fence acq_rel scope gpu
// CHECK:         nvvm.bar.warp.sync
// CHECK:         scf.if
// CHECK:           arith.constant 4370432 : i32
// CHECK:           %[[DONE:.*]] = comm.local_ptr %[[WIN]][%{{.*}}] : !llvm.ptr<1>
// CHECK:           comm.red add release scope gpu %{{.*}}, %[[DONE]] : i32, !llvm.ptr<1>
// Then the GEMM: every row of the tile's expert must be in place before its
// TMA loads (one wait per row tile of the expert: %[[MTILES]]).
// CHECK:         nvgpu.mbarrier.create
// CHECK:         scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args
// CHECK:           arith.remui %{{[0-9]+}}, %[[MTILES:[0-9]+]] : index
// CHECK:           scf.if %{{.*}} {
// CHECK:             scf.for %[[M:.*]] = %{{.*}} to %[[MTILES]] step
// CHECK:               %[[NEED:.*]] = arith.index_cast %{{.*}} : index to i32
// CHECK:               arith.addi %{{.*}}, %[[M]] : index
// CHECK:               arith.constant 4370432 : index
// CHECK:               %[[TILE:.*]] = comm.local_ptr %[[WIN]][%{{.*}}] : !llvm.ptr<1>
// CHECK-NEXT:          comm.wait_flag %[[TILE]] ge %[[NEED]] rank %{{.*}} scope gpu : !llvm.ptr<1>, i32
// CHECK-NEXT:        }
// CHECK-NEXT:        nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK:           gpu.barrier
// CHECK:           nvgpu.mbarrier.arrive.expect_tx
// CHECK:           nvgpu.tma.async.load
// CHECK:           nvgpu.warpgroup.mma
// After the tile: the expert's last tile (row tiles x 4 column tiles, counted
// at 4370944) resets every row tile's counter of the expert.
// CHECK:           arith.constant 4370944 : index
// CHECK:           %[[BEFORE:.*]] = comm.atomic_rmw add relaxed scope gpu
// CHECK:           %[[TILES:.*]] = arith.muli %[[MTILES]], %c4
// CHECK:           %[[LAST:.*]] = arith.subi %{{.*}}, %c1_i32
// CHECK:           arith.cmpi eq, %[[BEFORE]], %[[LAST]] : i32
// CHECK:           scf.for %{{.*}} = %{{.*}} to %[[MTILES]] step
// CHECK-LABEL: func.func @moe(
// CHECK-SAME:      epic.cooperative = 1
// CHECK-SAME:      epic.entry = "dispatch_gemm"
// CHECK-SAME:      epic.kernels = ["moe_send", "moe_copy_gemm"]
// CHECK-SAME:      "psum_num_recv_tokens_per_expert", "host_counts", "num_tokens", "dst_buffer_slot_idx", "max_tokens_per_rank", "topk_idx_copy", "experts", "gemm_out"]
// CHECK-SAME:      epic.param_stride = 448
// CHECK-SAME:      field = "recv_x", offset = 192 : i64, rows = 9216
// CHECK-SAME:      field = "experts", offset = 320 : i64, rows = 8192
// CHECK-SAME:      epic.threads = 128
// The tile counters are scratch that must be zero when the kernels start:
// from window_scratch_at to window_bytes (the runtime zeroes it where another
// configuration's data may have been written).
// CHECK-SAME:      epic.window_bytes = 4371456
// CHECK-SAME:      epic.window_scratch_at = 4370432

// Two one-warpgroup blocks per SM (the runtime launches ctas_per_sm x num_sms).
// JSON: "ctas_per_sm": 2
// JSON: "name": "moe_send"
// At most one register saved around the cold timeout-trap calls (40
// registers of 255 used: not pressure).
// JSON: "spill_store_bytes": {{[04]}},
// JSON: "name": "moe_copy_gemm"
// JSON: "spill_store_bytes": 0
func.func @moe(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x4xf32>,
               %experts: tensor<8x1024x512xbf16>)
    -> (tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x512xbf16>, !ep.handle<#cfg>) {
  %rx, %rw, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      experts(%experts : tensor<8x1024x512xbf16>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x512xbf16>, !ep.handle<#cfg>
  return %rx, %rw, %y, %h : tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x512xbf16>, !ep.handle<#cfg>
}
