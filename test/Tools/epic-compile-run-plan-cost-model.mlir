// epic-run programs follow the fusion cost model: a dispatch feeding the expert
// GEMM at DeepSeek-V3's prefill shape (N 2048) stays two steps (the fused
// kernel's GEMM would lose more than the copy it hides); with small experts
// (N 256) it becomes one dispatch_gemm step; a function's ep.fusion overrides.
// (The remarks with the predictions: epic-opt --ep-fuse-dispatch-gemm.)
// RUN: epic-compile %s --run-plan -o - | FileCheck %s

// CHECK: "op": "dispatch",
// CHECK: "op": "grouped_gemm",
// CHECK: "op": "dispatch_gemm",
// CHECK-NOT: "op": "grouped_gemm",
// CHECK: "op": "dispatch_gemm",
// CHECK-NOT: "op": "grouped_gemm",

#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                 expert_alignment = 128, layout = expanded, max_tokens_per_rank = 1024>

func.func @experts_2048(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>,
                        %w: tensor<32x7168x2048xbf16>) -> tensor<?x2048xbf16> {
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #v3
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, !ep.handle<#v3>
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

func.func @experts_256(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>,
                       %w: tensor<32x7168x256xbf16>) -> tensor<?x256xbf16> {
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #v3
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, !ep.handle<#v3>
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x256xbf16> -> tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}

func.func @told_to_fuse(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>,
                        %w: tensor<32x7168x2048xbf16>) -> tensor<?x2048xbf16>
    attributes {ep.fusion = "always"} {
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #v3
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, !ep.handle<#v3>
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

func.func @main() {
  %t = run.tokens per_rank [1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024]
  %x = run.random normal seed 1 rows %t : tensor<?x7168xbf16>
  %idx = run.routing experts 256 seed 2 rows %t : tensor<?x8xi64>
  %local = arith.constant 32 : index
  %wa = run.random normal scale 0.01 seed 3 rows %local : tensor<?x7168x2048xbf16>
  %a = tensor.cast %wa : tensor<?x7168x2048xbf16> to tensor<32x7168x2048xbf16>
  %wb = run.random normal scale 0.01 seed 4 rows %local : tensor<?x7168x256xbf16>
  %b = tensor.cast %wb : tensor<?x7168x256xbf16> to tensor<32x7168x256xbf16>
  %y1 = func.call @experts_2048(%x, %idx, %a)
      : (tensor<?x7168xbf16>, tensor<?x8xi64>, tensor<32x7168x2048xbf16>) -> tensor<?x2048xbf16>
  %y2 = func.call @experts_256(%x, %idx, %b)
      : (tensor<?x7168xbf16>, tensor<?x8xi64>, tensor<32x7168x256xbf16>) -> tensor<?x256xbf16>
  %y3 = func.call @told_to_fuse(%x, %idx, %a)
      : (tensor<?x7168xbf16>, tensor<?x8xi64>, tensor<32x7168x2048xbf16>) -> tensor<?x2048xbf16>
  run.print %y1 : tensor<?x2048xbf16>
  run.print %y2 : tensor<?x256xbf16>
  run.print %y3 : tensor<?x2048xbf16>
  return
}
