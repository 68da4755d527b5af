// Entry functions of the GPU check of convert-ep-to-comm (test/gpu/ep_virtual.py runs
// them on one H200 as 8 virtual ranks and compares with epic.reference):
// BF16 dispatch with weights and combines with weights and two or one biases;
// FP8 dispatch with float32 scale packs and a combine with weights (no bias).
// tools/device/prepare.sh also compiles it for 1, 2 and 4 ranks (8 experts
// per rank) by rewriting "ranks = 8, experts = 64".
// RUN: epic-compile %s --backend=virtual -o %t && FileCheck %s < %t.json
// CHECK-DAG: "name": "dispatch_exp_scatter"
// CHECK-DAG: "name": "dispatch_bf16_cached_scatter"
// CHECK-DAG: "name": "dispatch_bf16_count"
// CHECK-DAG: "name": "combine_fp8_gather"
// CHECK-DAG: "name": "combine_bf16_b1_gather"
// CHECK-DAG: "name": "dispatch_exp1_cached_scatter"

#bf16 = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = bf16,
                   max_tokens_per_rank = 512>
#fp8 = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = f8E4M3FN,
                  scale_packs = 16, max_tokens_per_rank = 512>

func.func @dispatch_bf16(%x: tensor<?x2048xbf16>, %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#bf16>) {
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) weights(%w : tensor<?x6xf32>)
      config #bf16
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#bf16>
  return %rx, %ri, %rw, %h : tensor<?x2048xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#bf16>
}

func.func @combine_bf16(%y: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>, %w: tensor<?x6xf32>,
                        %b0: tensor<?x2048xbf16>, %b1: tensor<?x2048xbf16>)
    -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x6xf32>)
      bias(%b0, %b1 : tensor<?x2048xbf16>, tensor<?x2048xbf16>)
      : tensor<?x2048xbf16>, !ep.handle<#bf16> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}

func.func @combine_bf16_b1(%y: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>, %w: tensor<?x6xf32>,
                           %b0: tensor<?x2048xbf16>) -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x6xf32>) bias(%b0 : tensor<?x2048xbf16>)
      : tensor<?x2048xbf16>, !ep.handle<#bf16> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}

func.func @dispatch_fp8(%x: tensor<?x2048xf8E4M3FN>, %sf: tensor<?x16xf32>,
                        %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#fp8>) {
  %rx, %rsf, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) scales(%sf : tensor<?x16xf32>)
      weights(%w : tensor<?x6xf32>) config #fp8
      : tensor<?x2048xf8E4M3FN> -> tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi64>,
        tensor<?x6xf32>, !ep.handle<#fp8>
  return %rx, %rsf, %ri, %rw, %h : tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi64>,
      tensor<?x6xf32>, !ep.handle<#fp8>
}

func.func @combine_fp8(%y: tensor<?x2048xbf16>, %h: !ep.handle<#fp8>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x6xf32>)
      : tensor<?x2048xbf16>, !ep.handle<#fp8> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}

// The expanded (grouped-GEMM) layout with 128-row expert alignment and zero
// padding, its combine, and cached dispatches of both layouts.
#exp = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 512>

func.func @dispatch_exp(%x: tensor<?x2048xbf16>, %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp>) {
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) weights(%w : tensor<?x6xf32>)
      zero_padding config #exp
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp>
  return %rx, %rw, %h : tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp>
}

func.func @combine_exp(%y: tensor<?x2048xbf16>, %h: !ep.handle<#exp>, %w: tensor<?xf32>)
    -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?xf32>)
      : tensor<?x2048xbf16>, !ep.handle<#exp> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}

func.func @dispatch_exp_cached(%x: tensor<?x2048xbf16>, %h: !ep.handle<#exp>)
    -> (tensor<?x2048xbf16>, !ep.handle<#exp>) {
  %rx, %h2 = ep.dispatch %x cached(%h : !ep.handle<#exp>) zero_padding config #exp
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, !ep.handle<#exp>
  return %rx, %h2 : tensor<?x2048xbf16>, !ep.handle<#exp>
}

func.func @dispatch_bf16_cached(%x: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>)
    -> (tensor<?x2048xbf16>, tensor<?x6xi64>, !ep.handle<#bf16>) {
  %rx, %ri, %h2 = ep.dispatch %x cached(%h : !ep.handle<#bf16>) config #bf16
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x6xi64>, !ep.handle<#bf16>
  return %rx, %ri, %h2 : tensor<?x2048xbf16>, tensor<?x6xi64>, !ep.handle<#bf16>
}

// The expanded layout with expert alignment 1 (no padding rows at all).
#exp1 = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = bf16,
                   layout = expanded, max_tokens_per_rank = 512>

func.func @dispatch_exp1(%x: tensor<?x2048xbf16>, %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp1>) {
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) weights(%w : tensor<?x6xf32>)
      config #exp1
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp1>
  return %rx, %rw, %h : tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp1>
}

func.func @combine_exp1(%y: tensor<?x2048xbf16>, %h: !ep.handle<#exp1>, %w: tensor<?xf32>)
    -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?xf32>)
      : tensor<?x2048xbf16>, !ep.handle<#exp1> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}

func.func @dispatch_exp1_cached(%x: tensor<?x2048xbf16>, %h: !ep.handle<#exp1>)
    -> (tensor<?x2048xbf16>, !ep.handle<#exp1>) {
  %rx, %h2 = ep.dispatch %x cached(%h : !ep.handle<#exp1>) config #exp1
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, !ep.handle<#exp1>
  return %rx, %h2 : tensor<?x2048xbf16>, !ep.handle<#exp1>
}
