// convert-ep-to-comm of ep.grouped_gemm: one persistent kernel of one warpgroup (two
// blocks per SM). The launch function asks for 97 KiB of dynamic shared memory
// (3 stages of 32 KiB + alignment slack) and two TMA descriptors the runtime encodes per
// call; the kernel loads stages with TMA (mbarrier transactions), multiplies
// with wgmma (NVGPU's warpgroup.mma, B transposed: N is contiguous) and
// stores only the rows of each tile's expert.
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>

// CHECK-LABEL: gpu.func @gemm_gemm(
// CHECK-SAME:      %[[COMM:.*]]: !comm.dev_comm, %{{.*}}: !comm.window, %[[TABLE:.*]]: !llvm.ptr) kernel
// A record of 7 fields (64 bytes with padding) and two 128-byte descriptors.
// CHECK-SAME:      comm.param_table = #comm.param_table<arg = 2, stride = 320, ranks = 8>
// CHECK:         %[[RECORD:.*]] = comm.rank_params %[[TABLE]] stride 320 via %[[COMM]]
// The descriptors lie in the record (by value, in the kernel's parameter
// space) from byte 64, 128 bytes apart.
// CHECK:         %[[C64:.*]] = arith.constant 64 : index
// CHECK:         %[[AT64:.*]] = arith.index_cast %[[C64]] : index to i64
// CHECK:         %[[MAPS:.*]] = llvm.getelementptr %[[RECORD]][%[[AT64]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK:         %[[LHS:.*]] = builtin.unrealized_conversion_cast %[[MAPS]] : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<64x64xbf16, 3>, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
// CHECK:         %[[RHSPTR:.*]] = llvm.getelementptr %[[MAPS]]
// CHECK:         %[[RHS:.*]] = builtin.unrealized_conversion_cast %[[RHSPTR]]
// CHECK:         %[[SMEM:.*]] = gpu.dynamic_shared_memory
// CHECK:         %[[BARS:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 3>
// CHECK-COUNT-3: nvgpu.mbarrier.init %[[BARS]]
// Visible to the async proxy (the TMA's complete_tx) before the block's barrier.
// CHECK-NEXT:    nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK:         nvgpu.tma.prefetch.descriptor %[[LHS]]
// CHECK:         nvgpu.tma.prefetch.descriptor %[[RHS]]
// Tiles of this rank: the experts' row counts from the handle's prefix sums.
// CHECK:         %[[TOTAL:.*]]:2 = scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args
// CHECK:         scf.for %[[TILE:.*]] = %{{.*}} to %[[TOTAL]]#0 step %{{.*}} iter_args
// Prologue: 3 stages, each an expect_tx of 32768 bytes and four TMA boxes
// (the 128-row lhs tile as two).
// CHECK:           nvgpu.mbarrier.arrive.expect_tx %[[BARS]][%{{.*}}], %c32768
// CHECK:           nvgpu.tma.async.load %[[LHS]]
// CHECK:           nvgpu.tma.async.load %[[LHS]]
// CHECK:           nvgpu.tma.async.load %[[RHS]]
// CHECK:           nvgpu.tma.async.load %[[RHS]]
// CHECK:           %[[INIT:.*]] = nvgpu.warpgroup.mma.init.accumulator -> <fragmented = vector<128x128xf32>>
// CHECK:           %[[ACC:.*]] = scf.for %{{.*}} iter_args(%[[C:.*]] = %[[INIT]])
// The stage's wait is bounded (it reports the rank and traps instead of hanging).
// CHECK:             %[[BAR:.*]] = nvgpu.mbarrier.get %[[BARS]][%{{.*}}] : {{.*}} -> i32
// CHECK:             comm.wait_phase %[[BAR]] parity %{{.*}} rank %{{.*}}{{$}}
// CHECK:             %[[DA:.*]] = nvgpu.warpgroup.generate.descriptor %{{.*}}, %[[LHS]] : memref<128x64xbf16, #gpu.address_space<workgroup>>
// CHECK:             %[[DB:.*]] = nvgpu.warpgroup.generate.descriptor %{{.*}}, %[[RHS]] : memref<64x128xbf16, #gpu.address_space<workgroup>>
// One wgmma group stays in flight (waitGroup 1, the default, is not printed).
// CHECK:             %[[D:.*]] = nvgpu.warpgroup.mma %[[DA]], %[[DB]], %[[C]] {transposeB} :
// CHECK:             gpu.barrier
// The previous step's stage is refilled with the step 3 ahead, if there is one.
// CHECK:             scf.if
// CHECK:               nvgpu.tma.async.load %[[LHS]]
// CHECK:             scf.yield %[[D]]
// The last group completes before the accumulators are stored.
// CHECK:           nvvm.wgmma.wait.group.sync.aligned 0
// CHECK:           nvgpu.warpgroup.mma.store %[[ACC]], %{{.*}} : <fragmented = vector<128x128xf32>> to memref<128x128xf32, #gpu.address_space<workgroup>>
// Only the expert's rows are stored, 8 columns per thread and step.
// CHECK-COUNT-16:  arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK:           nvvm.fence.proxy
// CHECK-LABEL: func.func @gemm(
// CHECK-SAME:      epic.cooperative = 0
// CHECK-SAME:      epic.ctas_per_sm = 2
// CHECK-SAME:      epic.dynamic_shared_bytes = 99328
// CHECK-SAME:      epic.entry = "grouped_gemm"
// CHECK-SAME:      epic.param_fields = ["x", "weights", "out", "psum_num_recv_tokens_per_expert", "num_rows", "x_scales", "weight_scales"]
// CHECK-SAME:      epic.param_stride = 320
// CHECK-SAME:      epic.tensor_maps = [{box_cols = 64 : i64, box_rows = 64 : i64, cols = 1024 : i64, elem_bytes = 2 : i64, field = "x", offset = 64 : i64, rows = "num_rows", swizzle = 128 : i64}, {box_cols = 64 : i64, box_rows = 64 : i64, cols = 512 : i64, elem_bytes = 2 : i64, field = "weights", offset = 192 : i64, rows = 8192 : i64, swizzle = 128 : i64}]
// CHECK-SAME:      epic.threads = 128
func.func @gemm(%x: tensor<?x1024xbf16>, %w: tensor<8x1024x512xbf16>, %h: !ep.handle<#cfg>)
    -> tensor<?x512xbf16> {
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}
