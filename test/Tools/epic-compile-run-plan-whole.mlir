// A whole program: @main calls a layer function (layout, dispatch, expert GEMM,
// combine); the callee's ops become steps on the caller's values, and the
// fusion passes run first (the dispatch feeding the GEMM becomes one step).
// RUN: epic-compile %s --run-plan -o - | FileCheck %s
// The runtime reads the plan and asks for every step's kernels (no GPU needed):
// RUN: rm -rf %t.cache && epic-run %s --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=KERNELS
// RUN: epic-run %S/../../examples/run/expert_gemm.mlir --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=UNFUSED
// RUN: epic-run %S/../../examples/mlir/moe_layer.mlir --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=LAYER
// A GEMM whose output is combined: one gemm_combine step, GEMM then combine fields.
// RUN: epic-compile %S/../../examples/run/gemm_combine.mlir --run-plan -o - \
// RUN:   | FileCheck %s --check-prefix=GC-PLAN
// RUN: epic-run %S/../../examples/run/gemm_combine.mlir --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=GC
// An expert MLP's two GEMMs (the down GEMM's rows are the intermediate size, K = 512, not the
// hidden size: not fused with the combine) and an FP8 GEMM with its block scales as steps:
// RUN: epic-compile %S/../../examples/run/expert_mlp.mlir --run-plan -o - \
// RUN:   | FileCheck %s --check-prefix=MLP-PLAN
// RUN: epic-run %S/../../examples/run/expert_mlp.mlir --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=MLP
// RUN: epic-compile %S/../../examples/run/fp8_expert_gemm.mlir --run-plan -o - \
// RUN:   | FileCheck %s --check-prefix=FP8-PLAN
// RUN: epic-run %S/../../examples/run/fp8_expert_gemm.mlir --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=FP8
// RUN: epic-compile %S/../../examples/run/fp8_moe_layer.mlir --run-plan -o - \
// RUN:   | FileCheck %s --check-prefix=LAYER8-PLAN
// RUN: epic-run %S/../../examples/run/fp8_moe_layer.mlir --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=LAYER8

// KERNELS: kernels of ep.dispatch_layout at {{.*}}: compiled
// KERNELS-NEXT: kernels of ep.dispatch_gemm at {{.*}}: compiled
// KERNELS-NEXT: kernels of ep.combine at {{.*}}: compiled
// UNFUSED: kernels of ep.dispatch at {{.*}}: compiled
// UNFUSED-NEXT: kernels of ep.dispatch at {{.*}}: compiled
// UNFUSED-NEXT: kernels of ep.grouped_gemm at {{.*}}: compiled
// LAYER: kernels of ep.dispatch_layout at {{.*}}moe_layer.mlir:{{[0-9]+}}:{{[0-9]+}}: compiled
// LAYER-NEXT: kernels of ep.dispatch_gemm at
// LAYER-NEXT: kernels of ep.combine at
// GC: kernels of ep.dispatch at
// GC-NEXT: kernels of ep.dispatch at
// GC-NEXT: kernels of ep.gemm_combine at {{.*}}gemm_combine.mlir:{{[0-9]+}}:{{[0-9]+}}: compiled
// GC-NOT: kernels of
// GC-PLAN: "op": "gemm_combine",
// GC-PLAN-NOT: "op": "combine"
// GC-PLAN-NOT: "op": "grouped_gemm"
// MLP-PLAN: "k": 256,
// MLP-PLAN-NEXT: "loc": "{{.*}}expert_mlp.mlir:25:13",
// MLP-PLAN-NEXT: "n": 768,
// MLP-PLAN-NEXT: "op": "grouped_gemm",
// MLP-PLAN: "weight_scales": -1,
// MLP-PLAN-NEXT: "weights": {{[0-9]+}},
// MLP-PLAN-NEXT: "x": {{[0-9]+}},
// MLP-PLAN-NEXT: "x_scales": -1
// The SwiGLU halves the gate/up GEMM's 768 columns; the down GEMM multiplies its rows.
// MLP-PLAN: "gate_up": [[GU:[0-9]+]],
// MLP-PLAN: "in_dtype": "bf16",
// MLP-PLAN-NEXT: "loc": "{{.*}}expert_mlp.mlir:29:10",
// MLP-PLAN-NEXT: "n": 384,
// MLP-PLAN-NEXT: "op": "swiglu",
// MLP-PLAN-NEXT: "out_dtype": "bf16",
// MLP-PLAN-NEXT: "result": [[ACT:[0-9]+]],
// MLP-PLAN-NEXT: "scales": -1,
// MLP-PLAN: "weights": -1
// MLP-PLAN: "k": 384,
// MLP-PLAN-NEXT: "loc": "{{.*}}expert_mlp.mlir:33:8",
// MLP-PLAN-NEXT: "n": 256,
// MLP-PLAN-NEXT: "op": "grouped_gemm",
// MLP-PLAN: "x": [[ACT]],
// MLP-PLAN: "op": "combine",
// MLP-PLAN-NOT: "op": "gemm_combine"
// MLP: kernels of ep.dispatch at
// MLP-NEXT: kernels of ep.grouped_gemm at {{.*}}expert_mlp.mlir:25:{{[0-9]+}}: compiled
// MLP-NEXT: kernels of ep.swiglu at {{.*}}expert_mlp.mlir:29:{{[0-9]+}}: compiled
// MLP-NEXT: kernels of ep.grouped_gemm at {{.*}}expert_mlp.mlir:33:{{[0-9]+}}: compiled
// MLP-NEXT: kernels of ep.combine at
// FP8-PLAN: "op": "dispatch",
// FP8-PLAN: "recv_scale_packs": [[RSF:[0-9]+]],
// FP8-PLAN: "k": 512,
// FP8-PLAN-NEXT: "loc": "{{.*}}fp8_expert_gemm.mlir:{{[0-9]+}}:{{[0-9]+}}",
// FP8-PLAN-NEXT: "n": 512,
// FP8-PLAN-NEXT: "op": "grouped_gemm",
// FP8-PLAN: "weight_scales": [[WS:[0-9]+]],
// FP8-PLAN-NEXT: "weights": {{[0-9]+}},
// FP8-PLAN-NEXT: "x": {{[0-9]+}},
// FP8-PLAN-NEXT: "x_scales": [[RSF]]
// FP8: kernels of ep.dispatch at
// FP8-NEXT: kernels of ep.grouped_gemm at {{.*}}fp8_expert_gemm.mlir:{{[0-9]+}}:{{[0-9]+}}: compiled
// FP8-NEXT: kernels of ep.combine at
// The whole FP8 layer: the gate/up GEMM's BF16 rows feed the SwiGLU, whose FP8 rows and
// scales are the down GEMM's operands.
// LAYER8-PLAN: "recv_topk_weights": [[RW8:[0-9]+]],
// LAYER8-PLAN: "k": 512,
// LAYER8-PLAN: "op": "grouped_gemm",
// LAYER8-PLAN-NEXT: "out_dtype": "bf16",
// LAYER8-PLAN-NEXT: "result": [[GU8:[0-9]+]],
// LAYER8-PLAN: "gate_up": [[GU8]],
// LAYER8-PLAN: "op": "swiglu",
// LAYER8-PLAN-NEXT: "out_dtype": "f8E4M3FN",
// LAYER8-PLAN-NEXT: "result": [[A8:[0-9]+]],
// LAYER8-PLAN-NEXT: "scales": [[S8:[0-9]+]],
// LAYER8-PLAN: "weights": [[RW8]]
// LAYER8-PLAN: "k": 256,
// LAYER8-PLAN: "op": "grouped_gemm",
// LAYER8-PLAN: "x": [[A8]],
// LAYER8-PLAN-NEXT: "x_scales": [[S8]]
// LAYER8-PLAN: "op": "combine",
// LAYER8: kernels of ep.dispatch at
// LAYER8-NEXT: kernels of ep.grouped_gemm at {{.*}}fp8_moe_layer.mlir:{{[0-9]+}}:{{[0-9]+}}:
// LAYER8-NEXT: kernels of ep.swiglu at {{.*}}fp8_moe_layer.mlir:{{[0-9]+}}:{{[0-9]+}}: compiled
// LAYER8-NEXT: kernels of ep.grouped_gemm at {{.*}}fp8_moe_layer.mlir:{{[0-9]+}}:{{[0-9]+}}: compiled
// LAYER8-NEXT: kernels of ep.combine at

#cfg = #ep.config<ranks = 2, experts = 4, topk = 2, hidden = 128, dtype = bf16,
                  expert_alignment = 16, layout = expanded, max_tokens_per_rank = 32>

func.func @layer(%x: tensor<?x128xbf16>, %idx: tensor<?x2xi64>, %w: tensor<2x128x128xbf16>)
    -> (tensor<?x128xbf16>, tensor<2xi32>) {
  %per_rank, %per_expert, %in_rank = ep.dispatch_layout %idx config #cfg
      : tensor<?x2xi64> -> tensor<2xi32>, tensor<4xi32>, tensor<?x2xi1>
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x2xi64>) config #cfg
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, !ep.handle<#cfg>
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x128xbf16>, tensor<2x128x128xbf16> -> tensor<?x128xbf16>
  %out = ep.combine %y, %h : tensor<?x128xbf16>, !ep.handle<#cfg> -> tensor<?x128xbf16>
  return %out, %per_rank : tensor<?x128xbf16>, tensor<2xi32>
}

// CHECK: "ranks": 2,
// CHECK: "op": "random",
// CHECK: "op": "routing",
// Expert weights: a 3-D random tensor, rows = experts per rank.
// CHECK: "cols": 16384,
// CHECK: "op": "random",
// CHECK: "result": [[W3:[0-9]+]],
// CHECK-NEXT: "row_shape": [
// CHECK-NEXT: 128,
// CHECK-NEXT: 128
// The layout step reads the caller's routing (value 2).
// CHECK: "is_token_in_rank": [[IN:[0-9]+]],
// CHECK: "op": "dispatch_layout",
// CHECK: "topk_idx": 2
// The dispatch and the GEMM, fused; the cast is the same value.
// CHECK: "experts": [[W3]],
// CHECK: "n": 128,
// CHECK: "op": "dispatch_gemm",
// CHECK: "out_dtype": "bf16",
// CHECK: "result": [[Y:[0-9]+]],
// CHECK: "x": 1
// CHECK: "op": "combine",
// CHECK: "x": [[Y]]
// What @layer returned is what the call defines: the layout's per-rank counts.
// CHECK: "op": "print",
// CHECK: "value": {{[0-9]+}},
// CHECK-NEXT: "what": "func.call result #1
func.func @main() {
  %t = run.tokens per_rank [32, 5]
  %x = run.random normal seed 1 rows %t : tensor<?x128xbf16>
  %idx = run.routing experts 4 seed 2 rows %t : tensor<?x2xi64>
  %c2 = arith.constant 2 : index
  %w = run.random normal scale 0.1 seed 3 rows %c2 : tensor<?x128x128xbf16>
  %experts = tensor.cast %w : tensor<?x128x128xbf16> to tensor<2x128x128xbf16>
  %out, %per_rank = func.call @layer(%x, %idx, %experts)
      : (tensor<?x128xbf16>, tensor<?x2xi64>, tensor<2x128x128xbf16>)
      -> (tensor<?x128xbf16>, tensor<2xi32>)
  run.print %per_rank : tensor<2xi32>
  return
}
