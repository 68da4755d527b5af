// ep-fuse-gemm-combine: an ep.grouped_gemm whose bf16, hidden-wide output is
// combined on the same handle becomes one ep.gemm_combine; refusals are
// remarks that say why.
// RUN: epic-opt %s --split-input-file --ep-fuse-gemm-combine --verify-diagnostics | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>

// CHECK-LABEL: func.func @fused
// CHECK-SAME: (%[[RX:.*]]: tensor<?x1024xbf16>, %[[W:.*]]: tensor<8x1024x1024xbf16>, %[[H:.*]]: !ep.handle<{{.*}}>, %[[B:.*]]: tensor<?x1024xbf16>)
// CHECK:      %[[Y:.*]], %[[OUT:.*]] = ep.gemm_combine %[[RX]], %[[W]] layout(%[[H]] : {{.*}}) bias(%[[B]] : tensor<?x1024xbf16>) : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x1024xbf16>
// CHECK-NOT:  ep.grouped_gemm
// CHECK-NOT:  ep.combine
// CHECK:      return %[[OUT]], %[[Y]]
func.func @fused(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>, %h: !ep.handle<#cfg>,
                 %b: tensor<?x1024xbf16>) -> (tensor<?x1024xbf16>, tensor<?x1024xbf16>) {
  // expected-remark@+1 {{ep-fuse-gemm-combine: fused: predicted 6.2 us fused vs 12.4 us in two steps: the send (5.2 us) and a kernel boundary (3.0 us) hide under the GEMM (4.2 us, x1.22 in the fused kernel) (sm_90a)}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h bias(%b : tensor<?x1024xbf16>)
      : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out, %y : tensor<?x1024xbf16>, tensor<?x1024xbf16>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @weights(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>, %h: !ep.handle<#cfg>,
                   %tw: tensor<?xf32>) -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the combine sends weights back; the fused epilogue sends rows only}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  %out, %ow = ep.combine %y, %h weights(%tw : tensor<?xf32>)
      : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>, tensor<?x4xf32>
  return %out : tensor<?x1024xbf16>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @not_combined(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x512xbf16>,
                        %h: !ep.handle<#cfg>) -> tensor<?x512xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the output feeds 'func.return', not an ep.combine}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @other_handle(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>,
                        %h: !ep.handle<#cfg>, %h2: !ep.handle<#cfg>) -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the combine reverses another dispatch (another handle)}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h2 : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @f32_output(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>,
                      %h: !ep.handle<#cfg>) -> tensor<?x1024xf32> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the output feeds 'func.return', not an ep.combine}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xf32>
  return %y : tensor<?x1024xf32>
}

// -----

// Two nodes of four ranks: the fused epilogue stores into NVLink peers only.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256,
                  scaleup_ranks = 4>
// CHECK-LABEL: func.func @multi_node
// CHECK: ep.grouped_gemm
// CHECK: ep.combine
func.func @multi_node(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>,
                      %h: !ep.handle<#cfg>) -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the configuration spans 2 nodes; the fused epilogue stores into NVLink peers only}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}

// -----

// A combine reading its input in the window: the fused kernel writes its own y.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
func.func @window(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>, %h: !ep.handle<#cfg>)
    -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the combine reads its input in the window (window_outputs), which the fused kernel does not write}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h window_outputs : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}

// -----

// FP8 rows: the fused kernel multiplies BF16 or F16 rows only.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = f8E4M3FN,
                  scale_packs = 8, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 256>
func.func @fp8(%rx: tensor<?x1024xf8E4M3FN>, %w: tensor<8x1024x1024xf8E4M3FN>,
               %h: !ep.handle<#cfg>, %sx: tensor<?x8xf32>, %sw: tensor<8x8x8xf32>)
    -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: FP8 rows: the fused kernel multiplies BF16 or F16 rows}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      scales(%sx, %sw : tensor<?x8xf32>, tensor<8x8x8xf32>)
      : tensor<?x1024xf8E4M3FN>, tensor<8x1024x1024xf8E4M3FN> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}

// -----

// An expert's down GEMM (rows of the intermediate size, 2048 wide): the fused kernel
// multiplies hidden-wide rows only (fusing it failed the op's verifier before).
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
// CHECK-LABEL: func.func @down_gemm
// CHECK:      ep.grouped_gemm
// CHECK:      ep.combine
func.func @down_gemm(%rx: tensor<?x2048xbf16>, %w: tensor<8x2048x1024xbf16>,
                     %h: !ep.handle<#cfg>) -> tensor<?x1024xbf16> {
  // expected-remark@+1 {{ep-fuse-gemm-combine: not fused: the rows are 2048 wide (an expert's down GEMM); the fused kernel multiplies rows of the hidden size (1024)}}
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x2048xbf16>, tensor<8x2048x1024xbf16> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}
