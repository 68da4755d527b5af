// ep-fuse-dispatch-gemm: an expanded dispatch whose rows feed an
// ep.grouped_gemm on its handle becomes one ep.dispatch_gemm; every refusal
// says why in a remark.
// RUN: epic-opt %s --split-input-file --ep-fuse-dispatch-gemm --verify-diagnostics | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>

// CHECK-LABEL: func.func @fused
// CHECK-SAME: (%[[X:.*]]: tensor<?x1024xbf16>, %[[IDX:.*]]: tensor<?x4xi64>, %[[W:.*]]: tensor<?x4xf32>, %[[E:.*]]: tensor<8x1024x512xbf16>)
// CHECK:      %[[RX:.*]], %[[RW:.*]], %[[Y:.*]], %[[H:.*]] = ep.dispatch_gemm %[[X]] topk(%[[IDX]] : tensor<?x4xi64>) weights(%[[W]] : tensor<?x4xf32>) experts(%[[E]] : tensor<8x1024x512xbf16>) config #{{.*}} : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x512xbf16>, !ep.handle
// CHECK-NOT:  ep.dispatch %
// CHECK-NOT:  ep.grouped_gemm
// CHECK:      return %[[Y]], %[[RW]], %[[H]]
func.func @fused(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x4xf32>,
                 %experts: tensor<8x1024x512xbf16>)
    -> (tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#cfg>) {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: fused: predicted 3.8 us fused vs 6.1 us in two steps: the copy (1.0 us) and a kernel boundary (3.0 us) hide under the GEMM (2.1 us, x1.32 in the fused kernel) (sm_90a)}}
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      config #cfg : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, !ep.handle<#cfg>
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  return %y, %rw, %h : tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#cfg>
}

// -----

// The weights are made after the dispatch: the fused op goes where the GEMM is.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
// CHECK-LABEL: func.func @weights_after
// CHECK:       %[[E:.*]] = tensor.empty() : tensor<8x1024x512xbf16>
// CHECK-NEXT:  ep.dispatch_gemm %{{.*}} topk(%{{.*}}) experts(%[[E]] : tensor<8x1024x512xbf16>)
func.func @weights_after(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>) -> tensor<?x512xf32> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: fused: predicted 3.8 us fused vs 6.1 us in two steps: the copy (1.0 us) and a kernel boundary (3.0 us) hide under the GEMM (2.1 us, x1.32 in the fused kernel) (sm_90a)}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %experts = tensor.empty() : tensor<8x1024x512xbf16>
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xf32>
  return %y : tensor<?x512xf32>
}

// -----

// A non-GEMM consumer: no fusion.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
// CHECK-LABEL: func.func @not_a_gemm
// CHECK: ep.dispatch
func.func @not_a_gemm(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>) -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: not fused: the rows feed 'ep.combine', not an ep.grouped_gemm}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %y = ep.combine %rx, %h : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Two GEMMs on the same rows: one schedule cannot feed both.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @two_gemms(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>,
                     %e1: tensor<8x1024x512xbf16>, %e2: tensor<8x1024x256xbf16>)
    -> (tensor<?x512xbf16>, tensor<?x256xbf16>) {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: not fused: 2 ep.grouped_gemm ops read the rows; one schedule can feed one of them}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %y1 = ep.grouped_gemm %rx, %e1 layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  %y2 = ep.grouped_gemm %rx, %e2 layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x256xbf16> -> tensor<?x256xbf16>
  return %y1, %y2 : tensor<?x512xbf16>, tensor<?x256xbf16>
}

// -----

// The weights come after a use of the dispatch's handle: moving the dispatch
// down would break that use, moving it up is impossible.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @used_before_the_weights(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>,
                                   %y0: tensor<?x1024xbf16>) -> tensor<?x512xbf16> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: not fused: 'ep.combine' uses the dispatch before the expert weights of the ep.grouped_gemm are defined}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %c = ep.combine %y0, %h : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  %experts = tensor.empty() : tensor<8x1024x512xbf16>
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}

// -----

// Two nodes of four ranks: the fused kernel stores into NVLink peers only.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256,
                  scaleup_ranks = 4>
// CHECK-LABEL: func.func @multi_node
// CHECK: ep.dispatch
// CHECK: ep.grouped_gemm
func.func @multi_node(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>,
                      %e: tensor<8x1024x512xbf16>) -> tensor<?x512xbf16> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: not fused: the configuration spans 2 nodes; the fused kernel stores into NVLink peers only}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %y = ep.grouped_gemm %rx, %e layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}

// -----

// Rows in the window: the fused kernel writes its own rows.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @window(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>, %e: tensor<8x1024x512xbf16>)
    -> tensor<?x512xbf16> {
  // expected-remark@+1 {{ep-fuse-dispatch-gemm: not fused: its outputs lie in the window (window_outputs), which the fused kernel does not write}}
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) window_outputs config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %y = ep.grouped_gemm %rx, %e layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}
