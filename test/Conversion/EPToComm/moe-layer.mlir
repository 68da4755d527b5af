// convert-ep-to-comm of ep.moe_layer (what ep-fuse-moe-layer makes of the FP8 layer's five
// ops): one cooperative kernel at the FP8 GEMM's shape (384 threads), every block of a rank
// running the steps' own code in turn, each step reading its part of the layer's record (the
// table moved to the part's first field), the rank's blocks meeting at a barrier in the
// window between steps (each thread's shared-memory writes fenced for the async proxy, an add
// that returns the count, a bounded wait for the next multiple of the rank's blocks, then a
// proxy fence: the next GEMM's TMA reads what generic stores wrote). The GEMM steps split the registers and give them back (setmaxnreg); the last block
// out sets the barrier's counters back to zero.
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s
// RUN: epic-opt %s --convert-ep-to-comm="one-pass-dispatch=true one-pass-combine=true" \
// RUN:   | FileCheck %s --check-prefix=ONE-PASS
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=JSON < %t.json
// RUN: FileCheck %s --check-prefix=SMEM < %t.ptx

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 128>

// The record: the dispatch's 17 fields, the gate/up GEMM's 7, the SwiGLU's 6, the down
// GEMM's 7, the combine's 13 (400 bytes, 448 aligned), then four descriptors: 960 bytes.
// CHECK-LABEL: gpu.func @layer_layer(
// CHECK-SAME:      workgroup(%{{.*}} : memref<1xi32, #gpu.address_space<workgroup>>) kernel
// CHECK-SAME:      comm.param_table = #comm.param_table<arg = 2, stride = 960, ranks = 8>
// CHECK-SAME:      known_block_size = array<i32: 384, 1, 1>
// The dispatch's send (its entry barrier meets the peers), then the rank barrier: the
// counter 405504 follows the window.
// CHECK:         comm.wait_flag %{{.*}} ge %{{.*}} scope sys
// CHECK:         nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT:    gpu.barrier
// CHECK:         %[[OLD:.*]] = comm.atomic_rmw add release scope gpu %{{.*}}, %{{.*}} : i32
// CHECK:         %[[NEXT:.*]] = arith.addi %{{.*}}, %c1
// CHECK:         %[[TARGET:.*]] = arith.muli %[[NEXT]]
// CHECK:         comm.wait_flag %{{.*}} ge %[[TARGET]] rank %{{.*}} scope gpu
// CHECK:         gpu.barrier
// CHECK-NEXT:    nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// The copy, then a barrier, then the gate/up GEMM on its part of the record (17 x 8 bytes in).
// CHECK:         comm.atomic_rmw add release scope gpu
// CHECK:         nvvm.fence.proxy
// CHECK:         %[[GU:.*]] = llvm.getelementptr %arg2[%c136_i64]
// CHECK-NEXT:    comm.rank_params %[[GU]] stride 960
// CHECK:         nvvm.setmaxregister  increase 224
// CHECK:         nvvm.setmaxregister  decrease 168
// The consumers, their registers back in the pool, arrive at named barrier 1 (all 384
// threads); the producer warpgroup takes its own back only after it: its warps that
// issue no load would otherwise take them before the consumers' increase, which then
// waits for registers that never come.
// CHECK:         %[[ALL:.*]] = arith.constant 384 : index
// CHECK:         %[[THREADS:.*]] = arith.index_cast %[[ALL]] : index to i32
// CHECK:         %[[ONE:.*]] = arith.constant 1 : index
// CHECK:         %[[ID:.*]] = arith.index_cast %[[ONE]] : index to i32
// CHECK:         nvvm.barrier.arrive id = %[[ID]] number_of_threads = %[[THREADS]]
// CHECK:         nvvm.setmaxregister  decrease 56
// CHECK:         nvvm.barrier id = %{{.*}} number_of_threads = %{{.*}}
// CHECK-NEXT:    nvvm.setmaxregister  increase 168
// CHECK:         comm.atomic_rmw add release scope gpu
// CHECK:         nvvm.fence.proxy
// The SwiGLU (24 fields in), a barrier, the down GEMM (30 fields in).
// CHECK:         llvm.getelementptr %arg2[%c192_i64]
// CHECK:         comm.atomic_rmw add release scope gpu
// CHECK:         nvvm.fence.proxy
// CHECK:         llvm.getelementptr %arg2[%c240_i64]
// CHECK:         nvvm.setmaxregister  increase 224
// CHECK:         nvvm.setmaxregister  increase 168
// CHECK:         comm.atomic_rmw add release scope gpu
// CHECK:         nvvm.fence.proxy
// The combine's send and, after a barrier, its reduce (37 fields in).
// CHECK:         llvm.getelementptr %arg2[%c296_i64]
// CHECK:         comm.atomic_rmw add release scope gpu
// CHECK:         nvvm.fence.proxy
// CHECK:         llvm.getelementptr %arg2[%c296_i64
// The last block of the rank out resets the counter and the exit count.
// CHECK:         comm.atomic_rmw add acq_rel scope sys
// CHECK:         arith.constant 405504 : i32
// CHECK:         comm.store relaxed scope gpu %{{.*}}, %{{.*}} : i32
// CHECK:         arith.constant 405568 : i32
// CHECK:         comm.store relaxed scope gpu %{{.*}}, %{{.*}} : i32
// CHECK-NEXT:  }
// CHECK-NEXT:  }
// CHECK-NEXT:  gpu.return
// CHECK-NOT:   gpu.func

// CHECK-LABEL: func.func @layer(
// CHECK-SAME:      epic.cooperative = 1
// CHECK-SAME:      epic.entry = "moe_layer", epic.kernels = ["layer_layer"]
// CHECK-SAME:      "topk_idx_copy", "gate_up.x", "gate_up.weights"
// CHECK-SAME:      "combine.x", "combine.topk_weights"
// CHECK-SAME:      epic.param_stride = 960
// CHECK-SAME:      field = "gate_up.x", offset = 448 : i64, rows = "gate_up.num_rows"
// CHECK-SAME:      field = "gate_up.weights", offset = 576 : i64, rows = 2048 : i64
// CHECK-SAME:      field = "down.x", offset = 704 : i64, rows = "down.num_rows"
// CHECK-SAME:      field = "down.weights", offset = 832 : i64, rows = 2048 : i64
// CHECK-SAME:      epic.threads = 384
// CHECK-SAME:      epic.window_bytes = 405760 : i64, epic.window_scratch_at = 405504 : i64
func.func @layer(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                 %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                 %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>) -> tensor<?x256xbf16> {
  %out = ep.moe_layer %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>)
      gate_up(%w13, %s13 : tensor<8x256x256xf8E4M3FN>, tensor<8x2x2xf32>)
      down(%w2, %s2 : tensor<8x256x128xf8E4M3FN>, tensor<8x2x1xf32>)
      config #cfg : tensor<?x256xf8E4M3FN> -> tensor<?x256xbf16>
  return %out : tensor<?x256xbf16>
}

// In one address space (the virtual world) the dispatch places rows straight in their
// destinations' tensors and the combine reads contributions where they lie, as the unfused
// ops do there; the steps that reach other ranks' tensors are preceded by a meeting of every
// rank's blocks (block b of each rank meets block b of the others, then the rank's blocks).
// ONE-PASS-LABEL: gpu.func @layer_layer(
// The count-only send (its entry barrier), then every rank's blocks meet, then the scatter
// through the destinations' records, and every rank's blocks meet again.
// ONE-PASS:         comm.agree
// ONE-PASS:         comm.red add release scope sys
// ONE-PASS:         comm.agree
// ONE-PASS:         comm.atomic_rmw add release scope gpu
// ONE-PASS:         comm.peer_params %arg2 stride 960
// ONE-PASS:         comm.red add release scope sys
// ONE-PASS:         comm.agree
// ONE-PASS:         comm.atomic_rmw add release scope gpu
// ONE-PASS:         llvm.getelementptr %arg2[%c136_i64]
// ONE-PASS:         comm.atomic_rmw add release scope gpu
// ONE-PASS-NEXT:    arith.constant 1 : i32
// ONE-PASS:         llvm.getelementptr %arg2[%c192_i64]
// ONE-PASS:         llvm.getelementptr %arg2[%c240_i64]
// The down GEMM, every rank's blocks meet, then the gather reads the ranks' combine parts.
// ONE-PASS:         comm.red add release scope sys
// ONE-PASS:         comm.agree
// ONE-PASS:         comm.atomic_rmw add release scope gpu
// ONE-PASS:         %[[COMBINE:.*]] = llvm.getelementptr %arg2[%c296_i64]
// ONE-PASS:         comm.peer_params %[[COMBINE]] stride 960
// ONE-PASS:         comm.atomic_rmw add acq_rel scope sys
// ONE-PASS:         gpu.return

// The GEMM steps' rings start in dynamic shared memory, which CUDA places after the static
// variables (the four mbarrier groups and the flag); a base declared as a one-byte static
// variable would put the first stage over them (extern-dynamic-shared-memory).
// SMEM: .extern .shared .align 16 .b8 __dynamic_shmem__0[];
// SMEM-NOT: .shared .align 16 .b8 __dynamic_shmem__0;

// The compiled entry's metadata: one cooperative launch of one kernel.
// JSON: "cooperative": 1,
// JSON-NEXT: "dynamic_shared_bytes": 197632,
// JSON-NEXT: "entry": "moe_layer",
// JSON-NEXT: "kernels": [
// JSON-NEXT: "layer_layer"
// JSON-NEXT: ],
