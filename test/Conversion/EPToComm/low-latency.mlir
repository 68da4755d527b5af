// DeepEP V1's low-latency mode (LowLatencyKernels.cpp): each op becomes its
// two phases as kernels, then both in one (cooperative: its receive waits for
// every rank's send); the window is the low-latency layout (two
// regions: 77824 + 2 x 1536 control bytes, then per token of the cap 2 x
// (8 experts x (16 + 512) + 4 x 512) bytes). Dispatch send: the slot of a
// (token, k) among earlier entries by ballots, the FP8 cast fused (scale by a
// division, power of two with round_scale, cvt satfinite), the count per
// expert by relaxed reductions, stored by the rank's last block, then one
// release flag per rank holding the rank's next epoch. Receive: every source's flag
// waited for (bounded) until it reaches this call's epoch, its counts read, then the
// rows; nothing reset. Combine: rows sent back, the combine epoch raised at every rank;
// the weighted sum multiplies each row by its weight before adding it.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2>

// CHECK-LABEL: gpu.module @ep_kernels
// The dispatch's blocks are 512 threads at most (128 registers a thread for the FP8 cast).
// CHECK: gpu.func @lld_send(
// CHECK-SAME: comm.param_table = #comm.param_table<arg = 2, stride = 128, ranks = 2>
// CHECK-SAME: known_block_size = array<i32: 512, 1, 1>
// Four ballots per 32 routing entries: one per top-k slot.
// CHECK: scf.for
// CHECK-COUNT-4: nvvm.vote.sync  ballot
// CHECK: comm.red add relaxed scope gpu
// round_scale: the scale's exponent rounded up (the mantissa tested), no division by amax.
// CHECK: arith.divf %{{.*}}, %cst{{.*}} : f32
// CHECK: arith.andi %{{.*}}, %c8388607_i32
// CHECK: nvvm.convert.f32x2.to.f8x2 {{.*}} {rnd = #nvvm.fp_rnd_mode<rn>, sat = #nvvm.sat_mode<satfinite>}
// The last block stores each expert's count at its rank (relaxed) and clears its own, then
// after a barrier raises its flag at every rank to its next epoch (release) and keeps it.
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK: %[[COUNT:.*]] = comm.load relaxed scope gpu
// CHECK: comm.peer_ptr
// CHECK: comm.store relaxed scope sys %[[COUNT]]
// CHECK: %[[EPOCH:.*]] = comm.load relaxed scope gpu
// CHECK: %[[NEXT:.*]] = arith.addi %[[EPOCH]], %c1_i32
// CHECK: gpu.barrier
// CHECK: comm.store release scope sys %[[NEXT]]
// CHECK: comm.store relaxed scope gpu %[[NEXT]]
// The receive waits for every source's flag to reach this call's epoch, scans the counts of
// the 4 x 2 (expert, source) pairs into shared memory (9 words: the starts and the total;
// 16-byte aligned, as LLVM may store a lane's consecutive sums as one vector),
// writes the layout ranges (begin << 32 | count), then shares the rows evenly over the grid's
// warps: a row's pair by a binary search over the starts (3 steps for 8 pairs). Nothing is
// reset (no last-block step).
// CHECK: gpu.func @lld_recv(
// CHECK-SAME: workgroup(%{{.*}} : memref<1xi32, #gpu.address_space<workgroup>>, %[[STARTS:[^ ]*]] : memref<9xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: %[[CALL:.*]] = comm.load relaxed scope gpu
// CHECK: comm.wait_flag %{{.*}} ge %[[CALL]] rank %{{.*}} peer %{{.*}} scope sys
// CHECK: gpu.barrier
// CHECK: comm.load relaxed scope sys
// CHECK: memref.store %{{.*}}, %[[STARTS]]
// CHECK: gpu.barrier
// CHECK: arith.shli %{{.*}}, %c32_i64
// CHECK: scf.for
// CHECK-COUNT-3: memref.load %[[STARTS]]
// CHECK-NOT: comm.atomic_rmw
// Both phases in one kernel: the epoch read first, the receive waits for it + 1.
// CHECK: gpu.func @lld_fused(
// CHECK: %[[OLD:.*]] = comm.load relaxed scope gpu
// CHECK: %[[THIS:.*]] = arith.addi %[[OLD]], %c1_i32
// CHECK: nvvm.convert.f32x2.to.f8x2
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK: comm.wait_flag %{{.*}} ge %[[THIS]] rank
// CHECK: func.func @lld(
// CHECK-SAME: epic.cooperative = 1 : i64, epic.entry = "low_latency_dispatch", epic.kernels = ["lld_send", "lld_recv", "lld_fused"]
// CHECK-SAME: epic.param_fields = ["x", "topk_idx", "num_tokens", "max_tokens_per_rank", "parity", "recv_x", "recv_scales", "recv_count", "recv_src_info", "recv_layout_range", "recv_route", "cumulative_recv_stats"]
// CHECK-SAME: epic.window_bytes = 80896 : i64, epic.window_bytes_per_token = 12544 : i64
func.func @lld(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) -> tensor<4x?x256xf8E4M3FN> {
  %a, %b, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i round_scale config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xf8E4M3FN>, scales tensor<4x?x2xf32>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return %a : tensor<4x?x256xf8E4M3FN>
}

// -----

// Without round_scale: 448 / amax, a division, and no exponent arithmetic.
#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2>
// CHECK-LABEL: gpu.func @plain_send(
// CHECK: %[[AMAX:.*]] = arith.maxnumf %{{.*}}, %cst{{.*}} : f32
// CHECK: arith.divf %[[AMAX]], %cst{{.*}} : f32
// CHECK: %[[INV:.*]] = arith.divf %cst{{.*}}, %[[AMAX]] : f32
// CHECK-NEXT: vector.broadcast %[[INV]]
// CHECK-LABEL: func.func @plain(
func.func @plain(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) -> tensor<4x?x256xf8E4M3FN> {
  %a, %b, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xf8E4M3FN>, scales tensor<4x?x2xf32>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return %a : tensor<4x?x256xf8E4M3FN>
}

// -----

#llc = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = bf16>
// The combine keeps the pass's block size (its copies want the warps).
// Its rows shared evenly over the warps: each local expert's rows scanned into shared memory
// (5 words), a row's expert by a binary search (2 steps for 4 experts), its source from the
// route.
// CHECK-LABEL: gpu.func @llc_send(
// CHECK-SAME: workgroup(%{{[^ ]*}} : memref<1xi32, #gpu.address_space<workgroup>>, %[[STARTS:[^ ]*]] : memref<5xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: known_block_size = array<i32: 1024, 1, 1>
// CHECK: memref.store %{{.*}}, %[[STARTS]]
// CHECK: gpu.barrier
// CHECK: scf.for
// CHECK-COUNT-2: memref.load %[[STARTS]]
// CHECK: comm.peer_ptr
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK: %[[NEXT:.*]] = arith.addi %{{.*}}, %c1_i32
// CHECK: comm.store release scope sys %[[NEXT]]
// The weighted sum: a warp loads its token's weights before it waits for the ranks' epochs
// (no block barrier: the warp's own), then sums.
// CHECK: gpu.func @llc_reduce(
// CHECK: %[[CALL:.*]] = comm.load relaxed scope gpu
// CHECK-NOT: gpu.barrier
// CHECK: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NOT: gpu.barrier
// CHECK: comm.wait_flag %{{.*}} ge %[[CALL]] rank %{{.*}} peer %{{.*}} scope sys
// CHECK-NOT: gpu.barrier
// CHECK: nvvm.bar.warp.sync
// CHECK-NOT: gpu.barrier
// CHECK: nvvm.vote.sync  ballot
// CHECK: %[[W:.*]] = vector.broadcast %{{.*}} : f32 to vector<8xf32>
// CHECK-NEXT: arith.extf
// CHECK-NEXT: %[[TERM:.*]] = arith.mulf %{{.*}}, %[[W]] : vector<8xf32>
// CHECK-NEXT: arith.addf %{{.*}}, %[[TERM]] : vector<8xf32>
// CHECK-NOT: comm.atomic_rmw
// CHECK: gpu.func @llc_fused(
// CHECK: %[[OLD:.*]] = comm.load relaxed scope gpu
// CHECK: %[[THIS:.*]] = arith.addi %[[OLD]], %c1_i32
// CHECK: comm.store release scope sys
// CHECK: comm.wait_flag %{{.*}} ge %[[THIS]] rank
// CHECK: func.func @llc(
// CHECK-SAME: epic.entry = "low_latency_combine", epic.kernels = ["llc_send", "llc_reduce", "llc_fused"]
// CHECK-SAME: epic.param_fields = ["x", "layout_range", "route", "topk_idx", "topk_weights", "num_tokens", "max_tokens_per_rank", "parity", "combined_x"]
func.func @llc(%x: tensor<4x?x256xbf16>, %r: tensor<4x2xi64>, %route: tensor<4x?xi32>,
               %i: tensor<?x4xi64>, %w: tensor<?x4xf32>) -> tensor<?x256xbf16> {
  %y = ep.low_latency_combine %x, %r, %route, %i, %w config #llc
      : tensor<4x?x256xbf16>, tensor<4x2xi64>, tensor<4x?xi32>, tensor<?x4xi64>,
        tensor<?x4xf32> -> tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}
