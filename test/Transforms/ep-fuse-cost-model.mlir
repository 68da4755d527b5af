// The fusion passes' cost model: each decision is a remark with both
// predictions (microseconds on one GPU at the configuration's token cap).
// RUN: epic-opt %s --split-input-file --ep-fuse-dispatch-gemm --ep-fuse-gemm-combine --verify-diagnostics | FileCheck %s
// The virtual world (every rank on one GPU): the same decisions, 8x the work.
// RUN: epic-opt %s --split-input-file --ep-fuse-dispatch-gemm=ranks-per-device=0 --ep-fuse-gemm-combine=ranks-per-device=0 2>&1 | FileCheck %s --check-prefix=VIRTUAL
// A chip whose fused GEMM would lose nothing (slowdown 1): both pairs fuse.
// RUN: epic-opt %s --split-input-file --ep-fuse-dispatch-gemm=slowdown=1 --ep-fuse-gemm-combine=slowdown=1 2>&1 | FileCheck %s --check-prefix=NOLOSS
// mode=never fuses nothing, whatever the model says.
// RUN: epic-opt %s --split-input-file --ep-fuse-dispatch-gemm=mode=never 2>&1 | FileCheck %s --check-prefix=NEVER
// A chip without numbers is an error unless they are given.
// RUN: not epic-opt %s --split-input-file --ep-fuse-dispatch-gemm=chip=sm_100a 2>&1 | FileCheck %s --check-prefix=NOCHIP
// RUN: epic-opt %s --split-input-file --ep-fuse-dispatch-gemm="chip=sm_100a copy-gbps=4000 weight-gbps=7000 link-gbps=800 gemm-tflops=1000 slowdown=1.1" 2>&1 | FileCheck %s --check-prefix=GIVEN

// DeepSeek-V3's prefill (1024 tokens per rank, EP8, N 2048): the GEMM takes
// 459 us, 1.32x that in the fused kernel costs more than the 54 us copy.
#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                 expert_alignment = 128, layout = expanded, max_tokens_per_rank = 1024>
// CHECK-LABEL: func.func @v3_prefill
// CHECK: ep.dispatch %
// CHECK: ep.grouped_gemm
// VIRTUAL: remark: ep-fuse-dispatch-gemm: not fused: predicted 4848.1 us fused vs 4106.0 us in two steps: the fused kernel's GEMM runs x1.32 slower (3672.0 -> 4847.1 us), more than the copy (431.0 us)
// NOLOSS: remark: ep-fuse-dispatch-gemm: fused: predicted 460.0 us fused vs 515.9 us in two steps
// NEVER: remark: ep-fuse-dispatch-gemm: not fused: option mode is "never"
// NEVER-LABEL: func.func @v3_prefill
// NEVER-NOT: ep.dispatch_gemm
// NOCHIP: error: ep-fuse-dispatch-gemm: the cost model has no numbers for chip 'sm_100a' (FusionCosts.def): give copy-gbps, weight-gbps, link-gbps, gemm-tflops and slowdown, or mode=always / mode=never
// GIVEN: remark: ep-fuse-dispatch-gemm: fused: predicted 264.6 us fused vs 269.9 us in two steps: the copy (29.4 us) and a kernel boundary (0.0 us) hide under the GEMM (240.5 us, x1.10 in the fused kernel) (sm_100a)
func.func @v3_prefill(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>,
                      %experts: tensor<32x7168x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: not fused: predicted 606.9 us fused vs 515.9 us in two steps: the fused kernel's GEMM runs x1.32 slower (459.0 -> 605.9 us), more than the copy (53.9 us) and the kernel boundary (3.0 us) it hides (sm_90a)}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #v3
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, !ep.handle<#v3>
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the output feeds 'func.return', not an ep.combine}}
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Small experts (N 256): the copy is as long as the GEMM, and hides under it.
#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                 expert_alignment = 128, layout = expanded, max_tokens_per_rank = 1024>
// CHECK-LABEL: func.func @small_experts
// CHECK: ep.dispatch_gemm
// CHECK-NOT: ep.grouped_gemm
func.func @small_experts(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>,
                         %experts: tensor<32x7168x256xbf16>) -> tensor<?x256xbf16> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: fused: predicted 76.7 us fused vs 114.2 us in two steps: the copy (53.9 us) and a kernel boundary (3.0 us) hide under the GEMM (57.4 us, x1.32 in the fused kernel) (sm_90a)}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #v3
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, !ep.handle<#v3>
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x256xbf16> -> tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}

// -----

// The layer's second GEMM and the combine at decode size (128 tokens): the
// GEMM reads every weight (weight-bound), the send is small.
#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                 expert_alignment = 128, layout = expanded, max_tokens_per_rank = 128>
// CHECK-LABEL: func.func @v3_decode_combine
// CHECK: ep.grouped_gemm
// CHECK: ep.combine
// VIRTUAL: remark: ep-fuse-gemm-combine: not fused: predicted 8024.5 us fused vs 6633.5 us in two steps: the fused kernel's GEMM runs x1.22 slower (6576.7 -> 8023.5 us), more than the send (53.9 us)
// NOLOSS: remark: ep-fuse-gemm-combine: fused: predicted 823.1 us fused vs 861.6 us in two steps
func.func @v3_decode_combine(%rx: tensor<?x7168xbf16>, %w: tensor<32x7168x7168xbf16>,
                             %h: !ep.handle<#v3>) -> tensor<?x7168xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: predicted 1003.9 us fused vs 861.6 us in two steps: the fused kernel's GEMM runs x1.22 slower (822.1 -> 1002.9 us), more than the send (36.5 us) and the kernel boundary (3.0 us) it hides (sm_90a)}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x7168xbf16> -> tensor<?x7168xbf16>
  %out = ep.combine %y, %h : tensor<?x7168xbf16>, !ep.handle<#v3> -> tensor<?x7168xbf16>
  return %out : tensor<?x7168xbf16>
}

// -----

// ep.fusion on the function decides without the model.
#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                 expert_alignment = 128, layout = expanded, max_tokens_per_rank = 1024>
// CHECK-LABEL: func.func @told_to_fuse
// CHECK: ep.dispatch_gemm
// NEVER-LABEL: func.func @told_to_fuse
// NEVER: ep.dispatch_gemm
func.func @told_to_fuse(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>,
                        %experts: tensor<32x7168x2048xbf16>) -> tensor<?x2048xbf16>
    attributes {ep.fusion = "always"} {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: fused: ep.fusion is "always"}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #v3
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, !ep.handle<#v3>
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#v3>)
      : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
