// convert-ep-to-comm of an FP8 ep.grouped_gemm (e4m3 rows and [L, N, hidden] weights with
// DeepSeek's block scales): the warp-specialized kernel. 128 x 128 tiles, K in steps of 128
// channels (one scale block) through a ring of 6 stages of 32 KiB (the 128 x 128 lhs box, the
// 128 x 128 weight box, K contiguous) with a `full` and an `empty` barrier per stage; a
// producer warpgroup issues the loads, two consumer warpgroups (64 rows each, the weight tile
// shared) run four k32 wgmma per step into zeroed partial sums, free the stage, then promote:
// the partial sums times the row's and the weight block's scales, added to the totals.
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 256>

// CHECK-LABEL: gpu.func @gemm_gemm(
// CHECK-SAME:      known_block_size = array<i32: 384, 1, 1>
// CHECK:         %[[RECORD:.*]] = comm.rank_params
// CHECK:         %[[LHS:.*]] = builtin.unrealized_conversion_cast %{{.*}} : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<128x128xf8E4M3FN, 3>, swizzle = swizzle_128b
// CHECK:         %[[RHS:.*]] = builtin.unrealized_conversion_cast %{{.*}} : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<128x128xf8E4M3FN, 3>, swizzle = swizzle_128b
// `full`: one arrival (the producer's expect_tx) per stage; `empty`: the 256 consumer threads.
// CHECK:         %[[FULL:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 6>
// CHECK-COUNT-6: nvgpu.mbarrier.init %[[FULL]][%{{.*}}], %c1
// CHECK:         %[[EMPTY:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 6>
// CHECK-COUNT-6: nvgpu.mbarrier.init %[[EMPTY]][%{{.*}}], %c256
// The initialization is made visible to the async proxy (the TMA's complete_tx),
// then to the block: the only block-wide barrier.
// CHECK-NEXT:    nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK:         gpu.barrier
// CHECK-NOT:     gpu.barrier
// The consumers (threads 0-255) take the producer's registers.
// CHECK:         scf.if
// CHECK-NEXT:      nvvm.setmaxregister  increase 224
// The wgmma descriptors of stage 0's first k32 slice, made once: a step adds its offset.
// CHECK:           nvgpu.warpgroup.generate.descriptor %{{.*}}, %[[LHS]] : memref<64x32xf8E4M3FN, #gpu.address_space<workgroup>>
// CHECK:           nvgpu.warpgroup.generate.descriptor %{{.*}}, %[[RHS]] : memref<32x128xf8E4M3FN, #gpu.address_space<workgroup>>
// The totals start at zero: the thread's 64 floats of the fragment, as NVVM's wgmma takes them.
// CHECK:           %[[ZS:.*]] = llvm.mlir.zero : !llvm.struct<(f32,
// The tile loop carries the ring position (stage, lap parity).
// CHECK:           scf.for %{{.*}} = %block_id_x to %{{.*}} step %grid_dim_x iter_args(%[[STAGE0:.*]] = %{{.*}}, %[[LAP0:.*]] = %false) -> (index, i1)
// Step 0's scales before the loop (the row's two, then the weight block's); each step
// carries the next step's.
// CHECK:             %[[X0:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK:             %[[X8:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK:             %[[W:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK:             %[[TOTAL:.*]]:6 = scf.for %[[K:.*]] = %{{.*}} iter_args(%[[T:.*]] = %[[ZS]], %[[STAGE:.*]] = %[[STAGE0]], %[[LAP:.*]] = %[[LAP0]], %[[SX0:.*]] = %[[X0]], %[[SX8:.*]] = %[[X8]], %[[SW:.*]] = %[[W]])
// The next step's scales are loaded before the stage wait, and nothing uses them in this
// step (a use there made every step wait for global memory).
// CHECK-COUNT-3:       llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NOT:           llvm.fmul
// CHECK:               %[[BAR:.*]] = nvgpu.mbarrier.get %[[FULL]][%[[STAGE]]] : {{.*}} -> i32
// CHECK:               comm.wait_phase %[[BAR]] parity %[[LAP]] rank %{{.*}}{{$}}
// A warpgroup none of whose rows is the expert's only frees the stage.
// CHECK:               scf.if %{{.*}} -> (!llvm.struct
// CHECK:                 nvvm.wgmma.fence.aligned
// CHECK-NEXT:            %[[UNDEF:.*]] = llvm.mlir.undef
// Four k32 slices of the warpgroup's 64 rows issued back to back, K-major B (col): the
// descriptors plus the stage's offset and 32 bytes (2 sixteen-byte units) a slice; the
// first one's scale-d is zero (fresh partial sums), the others accumulate.
// CHECK:                 %[[P1:.*]] = nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %[[UNDEF]], <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// CHECK:                 arith.constant 2 : i64
// CHECK:                 %[[P2:.*]] = nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %[[P1]], <m = 64, n = 128, k = 32>, D[<f32>, <one>]
// CHECK:                 %[[P3:.*]] = nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %[[P2]]
// CHECK:                 %[[P4:.*]] = nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %[[P3]]
// CHECK-NEXT:            nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT:            nvvm.wgmma.wait.group.sync.aligned 0
// The stage is freed before the promotion (the producer refills it during it).
// CHECK-NEXT:            nvgpu.mbarrier.arrive %[[EMPTY]][%[[STAGE]]]
// CHECK-NEXT:            %[[S0:.*]] = llvm.fmul %[[SX0]], %[[SW]] : f32
// CHECK-NEXT:            %[[S8:.*]] = llvm.fmul %[[SX8]], %[[SW]] : f32
// Elements 0, 1 are the thread's first row, 2, 3 the row 8 below, and so on.
// CHECK:                 %[[E0:.*]] = llvm.extractvalue %[[P4]][0]
// CHECK:                 %[[T0:.*]] = llvm.extractvalue %[[T]][0]
// CHECK:                 llvm.intr.fma(%[[E0]], %[[S0]], %[[T0]])
// CHECK:                 llvm.intr.fma(%{{.*}}, %[[S0]], %{{.*}})
// CHECK:                 llvm.intr.fma(%{{.*}}, %[[S8]], %{{.*}})
// CHECK:                 llvm.intr.fma(%{{.*}}, %[[S8]], %{{.*}})
// CHECK-COUNT-60:        llvm.intr.fma
// CHECK-NOT:             llvm.intr.fma
// CHECK:                 scf.yield
// CHECK-NEXT:          } else {
// CHECK-NEXT:            nvgpu.mbarrier.arrive %[[EMPTY]][%[[STAGE]]]
// CHECK-NEXT:            scf.yield %[[T]]
// Epilogue straight from the registers: per row of the fragment (when it is the expert's),
// 16 column pairs.
// CHECK:             scf.if
// CHECK:               scf.if
// CHECK-COUNT-16:        llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xbf16>, !llvm.ptr<1>
// CHECK:               scf.if
// CHECK-COUNT-16:        llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xbf16>, !llvm.ptr<1>
// CHECK-NOT:           llvm.store
// The producer warpgroup keeps 56 registers; its thread 0 walks the same tiles.
// CHECK:         } else {
// CHECK-NEXT:      nvvm.setmaxregister  decrease 56
// CHECK:           scf.for %{{.*}} = %block_id_x to %{{.*}} step %grid_dim_x iter_args({{.*}}) -> (index, i1)
// CHECK:             scf.for %{{.*}} iter_args(%[[PSTAGE:.*]] = %{{.*}}, %[[PLAP:.*]] = %{{.*}}) -> (index, i1)
// The stage's previous lap must have been freed (the opposite parity: a fresh ring is free).
// CHECK:               %[[FREE:.*]] = arith.xori %[[PLAP]], %true
// CHECK:               %[[SLOT:.*]] = nvgpu.mbarrier.get %[[EMPTY]][%[[PSTAGE]]] : {{.*}} -> i32
// CHECK:               comm.wait_phase %[[SLOT]] parity %[[FREE]] rank %{{.*}}{{$}}
// CHECK:               nvgpu.mbarrier.arrive.expect_tx %[[FULL]][%[[PSTAGE]]], %c32768
// CHECK:               nvgpu.tma.async.load %[[LHS]][%{{.*}}, %{{.*}}], %[[FULL]][%{{.*}}] to %{{.*}} : {{.*}} -> memref<128x128xf8E4M3FN, #gpu.address_space<workgroup>>
// CHECK:               nvgpu.tma.async.load %[[RHS]][%{{.*}}, %{{.*}}], %[[FULL]][%{{.*}}] to %{{.*}} : {{.*}} -> memref<128x128xf8E4M3FN, #gpu.address_space<workgroup>>
// CHECK-LABEL: func.func @gemm(
// CHECK-SAME:      epic.dynamic_shared_bytes = 197632
// CHECK-SAME:      epic.param_fields = ["x", "weights", "out", "psum_num_recv_tokens_per_expert", "num_rows", "x_scales", "weight_scales"]
// The weights' map is [L * N, hidden]: 8 experts x 256 rows.
// CHECK-SAME:      epic.tensor_maps = [{box_cols = 128 : i64, box_rows = 128 : i64, cols = 512 : i64, elem_bytes = 1 : i64, field = "x", offset = 64 : i64, rows = "num_rows", swizzle = 128 : i64}, {box_cols = 128 : i64, box_rows = 128 : i64, cols = 512 : i64, elem_bytes = 1 : i64, field = "weights", offset = 192 : i64, rows = 2048 : i64, swizzle = 128 : i64}]
// CHECK-SAME:      epic.threads = 384
func.func @gemm(%x: tensor<?x512xf8E4M3FN>, %w: tensor<8x256x512xf8E4M3FN>, %h: !ep.handle<#cfg>,
                %sx: tensor<?x4xf32>, %sw: tensor<8x2x4xf32>) -> tensor<?x256xbf16> {
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      scales(%sx, %sw : tensor<?x4xf32>, tensor<8x2x4xf32>)
      : tensor<?x512xf8E4M3FN>, tensor<8x256x512xf8E4M3FN> -> tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}
