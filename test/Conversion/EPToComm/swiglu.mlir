// convert-ep-to-comm of ep.swiglu: one kernel, nothing waits (no cooperative launch, no
// window bytes). Expert by expert (the handle's prefix sums, each start aligned), half a warp
// per (row, 128-channel block): a lane loads 8 gate and 8 up channels, silu(g) * u in f32
// with e^-g through ex2.approx, then either the FP8 cast (a 16-lane amax, the scale
// amax / 448 stored by the group's first lane) or one rounding to the result's type.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 64>

// CHECK-LABEL: gpu.func @act_swiglu(
// CHECK-SAME:    comm.param_table = #comm.param_table<arg = 2, stride = 64, ranks = 4>
// The record's fields: gate_up (0), out (8), scales (16), the prefix sums (24), weights (40).
// CHECK:         %[[GU:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK:         %[[OUT:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK:         %[[SCALES:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK:         %[[PSUM:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK:         %[[WEIGHTS:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK:         %[[WEIGHTED:.*]] = arith.cmpi ne
// Lanes 0-15 and 16-31 are two halves; a lane's 8 channels start at sub x 8.
// CHECK:         %[[HALF:.*]] = arith.divui %{{.*}}, %c16_i32
// CHECK:         %[[SUB:.*]] = arith.remui %{{.*}}, %c16_i32
// The 4 local experts, carrying the pairs of items before expert e; expert e's rows
// [align(psum[e - 1], 128), psum[e]).
// CHECK:         scf.for %[[E:.*]] = %{{.*}} to %c4_i32 step %c1_i32 iter_args(%[[BEFORE:.*]] = %c0_i32) -> (i32)
// CHECK:           llvm.getelementptr %[[PSUM]]
// CHECK:           arith.divui %{{.*}}, %c128_i32
// Two items a warp (I / 128 = 2 blocks a row); global pair g is warp g mod the warps':
// this warp's first pair of expert e is (warp + warps - before mod warps) mod warps.
// CHECK:           %[[PAIRS:.*]] = arith.divui %{{.*}}, %c2_i32
// CHECK:           %[[SHIFT:.*]] = arith.remui %[[BEFORE]], %[[WARPS:.*]] : i32
// CHECK:           %[[FIRST:.*]] = arith.remui %{{.*}}, %[[WARPS]] : i32
// CHECK:           scf.for %[[PAIR:.*]] = %[[FIRST]] to %[[PAIRS]] step %[[WARPS]]
// CHECK:             %[[ITEM:.*]] = arith.addi %{{.*}}, %[[HALF]] : i32
// Rows of 2 I = 512 bf16 channels are 1024 bytes; up is 256 channels after gate.
// CHECK:             arith.muli %{{.*}}, %c1024_i64
// CHECK:             %[[GATE:.*]] = llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK:             %[[G:.*]] = arith.extf %[[GATE]] : vector<8xbf16> to vector<8xf32>
// CHECK:             arith.addi %{{.*}}, %c256_i32
// CHECK:             %[[UP:.*]] = llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK:             %[[U:.*]] = arith.extf %[[UP]] : vector<8xbf16> to vector<8xf32>
// CHECK:             arith.negf %[[G]]
// CHECK-COUNT-8:     llvm.inline_asm "ex2.approx.ftz.f32 $0, $1;"
// CHECK:             %[[DEN:.*]] = arith.addf
// CHECK:             %[[SILU:.*]] = arith.divf %[[G]], %[[DEN]] : vector<8xf32>
// CHECK:             %[[YU:.*]] = arith.mulf %[[SILU]], %[[U]] : vector<8xf32>
// The row's weight: loaded where the record has weights (field 5 not null), else 1.
// CHECK:             %[[WT:.*]] = scf.if %[[WEIGHTED]] -> (f32)
// CHECK:               llvm.getelementptr %[[WEIGHTS]]
// CHECK:             } else {
// CHECK-NEXT:          %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK:             %[[WB:.*]] = vector.broadcast %[[WT]] : f32 to vector<8xf32>
// CHECK:             %[[Y:.*]] = arith.mulf %[[YU]], %[[WB]] : vector<8xf32>
// FP8 rows of I = 256 bytes; the cast: amax over the 16 lanes, then e4m3 pairs.
// CHECK:             arith.muli %{{.*}}, %c256_i64
// CHECK:             arith.maxnumf %[[Y]],
// CHECK-COUNT-4:     gpu.shuffle  xor
// CHECK:             %[[SCALE:.*]] = arith.divf %{{.*}}, %cst{{.*}} : f32
// CHECK-COUNT-4:     nvvm.convert.f32x2.to.f8x2
// CHECK:             scf.if
// CHECK:               llvm.store %{{.*}}, %{{.*}} {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK:               arith.cmpi eq, %[[SUB]], %c0_i32
// CHECK:                 llvm.getelementptr %[[SCALES]]
// CHECK:                 llvm.store %[[SCALE]], %{{.*}} {alignment = 4 : i64} : f32, !llvm.ptr<1>
// The launch: one kernel, not cooperative, no window.
// CHECK-LABEL: func.func @act(
// CHECK-SAME:    epic.cooperative = 0 : i64, epic.entry = "swiglu", epic.kernels = ["act_swiglu"]
// CHECK-SAME:    epic.param_fields = ["gate_up", "out", "scales", "psum_num_recv_tokens_per_expert", "num_rows", "weights"]
// CHECK-SAME:    epic.window_bytes = 0 : i64
func.func @act(%gu: tensor<?x512xbf16>, %h: !ep.handle<#cfg>)
    -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>) {
  %a, %s = ep.swiglu %gu layout(%h : !ep.handle<#cfg>)
      : tensor<?x512xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
  return %a, %s : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
}

// -----

// F32 gate/up rows and a BF16 result: 32-byte loads, one rounding, a 16-byte store, no scales.
#cfg = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 256, dtype = bf16,
                  expert_alignment = 64, layout = expanded>

// CHECK-LABEL: gpu.func @act_bf16_swiglu(
// CHECK:         llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
// CHECK:         llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
// CHECK-NOT:     arith.extf
// CHECK:         arith.divf
// CHECK-NEXT:    arith.mulf
// CHECK:         %[[Y:.*]] = arith.mulf %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK-NOT:     gpu.shuffle
// CHECK:         %[[R:.*]] = arith.truncf %[[Y]] : vector<8xf32> to vector<8xbf16>
// CHECK:         scf.if
// CHECK-NEXT:      llvm.store %[[R]], %{{.*}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
func.func @act_bf16(%gu: tensor<?x768xf32>, %h: !ep.handle<#cfg>) -> tensor<?x384xbf16> {
  %a = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) : tensor<?x768xf32> -> tensor<?x384xbf16>
  return %a : tensor<?x384xbf16>
}
