// convert-ep-to-comm of an FP8 ep.grouped_gemm (e4m3 rows and [L, N, hidden] weights with
// DeepSeek's block scales): 64 x 128 tiles, K in steps of 128 channels (one scale block)
// through a ring of 4 stages of 24 KiB (one 64 x 128 lhs box, one 128 x 128 weight box,
// K contiguous), four k32 wgmma per step into zeroed partial sums, then the promotion: the
// partial sums times the row's and the weight block's scales, added to the totals in registers.
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 256>

// CHECK-LABEL: gpu.func @gemm_gemm(
// CHECK:         %[[RECORD:.*]] = comm.rank_params
// CHECK:         %[[LHS:.*]] = builtin.unrealized_conversion_cast %{{.*}} : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<64x128xf8E4M3FN, 3>, swizzle = swizzle_128b
// CHECK:         %[[RHS:.*]] = builtin.unrealized_conversion_cast %{{.*}} : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<128x128xf8E4M3FN, 3>, swizzle = swizzle_128b
// CHECK:         %[[BARS:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 4>
// CHECK:         scf.for %[[TILE:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args
// Prologue: the 4 stages, each one expect_tx of 24576 bytes and two boxes.
// CHECK-COUNT-4:   nvgpu.mbarrier.arrive.expect_tx %[[BARS]][%{{.*}}], %c24576
// The totals start at zero, as the struct convert-nvgpu-to-nvvm lowers an accumulator to.
// CHECK:           %[[ZERO:.*]] = nvgpu.warpgroup.mma.init.accumulator -> <fragmented = vector<64x128xf32>>
// CHECK:           %[[ZS:.*]] = builtin.unrealized_conversion_cast %[[ZERO]] : !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>> to !llvm.struct<(struct<(f32,
// Step 0's scales before the loop (the row's two, then the weight block's); each step
// carries the next step's.
// CHECK:           %[[X0:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK:           %[[X8:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK:           %[[W:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK:           %[[TOTAL:.*]]:4 = scf.for %[[K:.*]] = %{{.*}} iter_args(%[[T:.*]] = %[[ZS]], %[[SX0:.*]] = %[[X0]], %[[SX8:.*]] = %[[X8]], %[[SW:.*]] = %[[W]])
// The next step's scales are loaded before the stage wait, and nothing uses them in this
// step (a use there made every step wait for global memory).
// CHECK-COUNT-3:     llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NOT:         llvm.fmul
// CHECK:             nvgpu.mbarrier.try_wait.parity %[[BARS]]
// CHECK:             %[[P0:.*]] = nvgpu.warpgroup.mma.init.accumulator
// Four k32 steps, K-major B (no transposeB), each 32 bytes further into the swizzled rows.
// CHECK:             %[[DA:.*]] = nvgpu.warpgroup.generate.descriptor %{{.*}}, %[[LHS]] : memref<64x32xf8E4M3FN, #gpu.address_space<workgroup>>
// CHECK:             %[[DB:.*]] = nvgpu.warpgroup.generate.descriptor %{{.*}}, %[[RHS]] : memref<32x128xf8E4M3FN, #gpu.address_space<workgroup>>
// CHECK:             %[[P1:.*]] = nvgpu.warpgroup.mma %[[DA]], %[[DB]], %[[P0]] : <tensor = memref<64x32xf8E4M3FN, 3>>, <tensor = memref<32x128xf8E4M3FN, 3>>
// CHECK-COUNT-3:     nvgpu.warpgroup.mma %{{.*}}, %{{.*}}, %{{.*}} : <tensor = memref<64x32xf8E4M3FN, 3>>
// CHECK-NEXT:        nvvm.wgmma.wait.group.sync.aligned 0
// The stage is refilled with step k + 4 once every warp is done with it, before the
// promotion (the TMA runs during it).
// CHECK-NEXT:        gpu.barrier
// CHECK:             scf.if
// CHECK:               nvgpu.mbarrier.arrive.expect_tx %[[BARS]]
// The promotion: this step's scales (carried), the row's times the weight block's.
// CHECK:             %[[S0:.*]] = llvm.fmul %[[SX0]], %[[SW]] : f32
// CHECK:             %[[S8:.*]] = llvm.fmul %[[SX8]], %[[SW]] : f32
// CHECK:             %[[PS:.*]] = builtin.unrealized_conversion_cast %{{.*}} : !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>> to !llvm.struct
// Elements 0, 1 are the thread's first row, 2, 3 the row 8 below, and so on.
// CHECK:             %[[E0:.*]] = llvm.extractvalue %[[PS]][0, 0]
// CHECK:             %[[T0:.*]] = llvm.extractvalue %[[T]][0, 0]
// CHECK:             llvm.intr.fma(%[[E0]], %[[S0]], %[[T0]])
// CHECK:             llvm.intr.fma(%{{.*}}, %[[S0]], %{{.*}})
// CHECK:             llvm.intr.fma(%{{.*}}, %[[S8]], %{{.*}})
// CHECK:             llvm.intr.fma(%{{.*}}, %[[S8]], %{{.*}})
// CHECK-COUNT-60:    llvm.intr.fma
// CHECK-NOT:         llvm.intr.fma
// CHECK:             scf.yield
// CHECK:           %[[ACC:.*]] = builtin.unrealized_conversion_cast %[[TOTAL]]#0 : !llvm.struct<{{.*}}> to !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>>
// CHECK:           nvgpu.warpgroup.mma.store %[[ACC]], %{{.*}} : <fragmented = vector<64x128xf32>> to memref<64x128xf32, #gpu.address_space<workgroup>>
// 64 rows x 16 chunks of 8 columns over 128 threads.
// CHECK-COUNT-8:   arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK-NOT:       arith.truncf
// CHECK-LABEL: func.func @gemm(
// CHECK-SAME:      epic.dynamic_shared_bytes = 99328
// CHECK-SAME:      epic.param_fields = ["x", "weights", "out", "psum_num_recv_tokens_per_expert", "num_rows", "x_scales", "weight_scales"]
// The weights' map is [L * N, hidden]: 8 experts x 256 rows.
// CHECK-SAME:      epic.tensor_maps = [{box_cols = 128 : i64, box_rows = 64 : i64, cols = 512 : i64, elem_bytes = 1 : i64, field = "x", offset = 64 : i64, rows = "num_rows", swizzle = 128 : i64}, {box_cols = 128 : i64, box_rows = 128 : i64, cols = 512 : i64, elem_bytes = 1 : i64, field = "weights", offset = 192 : i64, rows = 2048 : i64, swizzle = 128 : i64}]
func.func @gemm(%x: tensor<?x512xf8E4M3FN>, %w: tensor<8x256x512xf8E4M3FN>, %h: !ep.handle<#cfg>,
                %sx: tensor<?x4xf32>, %sw: tensor<8x2x4xf32>) -> tensor<?x256xbf16> {
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      scales(%sx, %sw : tensor<?x4xf32>, tensor<8x2x4xf32>)
      : tensor<?x512xf8E4M3FN>, tensor<8x256x512xf8E4M3FN> -> tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}
