// Round-trip of every ep op, attribute and type: printed, re-parsed and
// printed again (also through the generic form), with the same result.
// RUN: epic-opt %s | epic-opt | FileCheck %s
// RUN: epic-opt %s --mlir-print-op-generic | epic-opt | FileCheck %s

// Configurations are printed once, as aliases, with default parameters elided.
// CHECK-DAG: #[[$BF16:.*]] = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048, dtype = bf16, max_tokens_per_rank = 512>
// CHECK-DAG: #[[$FP8:.*]] = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN, scale_packs = 56, num_sms = 24, max_tokens_per_rank = 4096>
// CHECK-DAG: #[[$EXP:.*]] = #ep.config<ranks = 4, experts = 32, topk = 6, hidden = 1024, dtype = bf16, expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>
// CHECK-DAG: #[[$ONE:.*]] = #ep.config<ranks = 1, experts = 1, topk = 1, hidden = 8, dtype = bf16, max_tokens_per_rank = 1>
// Without max_tokens_per_rank the cap is a run-time value (printed without it).
// CHECK-DAG: #[[$RUNTIME_CAP:.*]] = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048, dtype = bf16>
// Two nodes of four ranks (node = rank / 4), hybrid; scaleup_ranks = ranks (one node) and
// mode = direct are the defaults, elided.
// CHECK-DAG: #[[$HYBRID:.*]] = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048, dtype = bf16, max_tokens_per_rank = 512, scaleup_ranks = 4, mode = hybrid>
// CHECK-DAG: #[[$DIRECT:.*]] = #ep.config<ranks = 16, experts = 64, topk = 4, hidden = 2048, dtype = bf16, max_tokens_per_rank = 512, scaleup_ranks = 8>

#bf16 = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048, dtype = bf16,
                   max_tokens_per_rank = 512>
// Parameters may come in any order; defaults (scale_packs = 0,
// expert_alignment = 1, layout = plain, num_sms = 0) may be written out.
#fp8_layer = #ep.config<dtype = f8E4M3FN, hidden = 7168, ranks = 8, experts = 256, topk = 8,
                        scale_packs = 56, expert_alignment = 128, layout = expanded,
                        max_tokens_per_rank = 128>
#fp8 = #ep.config<dtype = f8E4M3FN, hidden = 7168, ranks = 8, experts = 256,
                  topk = 8, scale_packs = 56, expert_alignment = 1,
                  layout = plain, num_sms = 24, max_tokens_per_rank = 4096>
#exp = #ep.config<ranks = 4, experts = 32, topk = 6, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 256>
#one = #ep.config<ranks = 1, experts = 1, topk = 1, hidden = 8, dtype = bf16,
                  max_tokens_per_rank = 1>
#hybrid = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048, dtype = bf16,
                     max_tokens_per_rank = 512, scaleup_ranks = 4, mode = hybrid>
#direct = #ep.config<ranks = 16, experts = 64, topk = 4, hidden = 2048, dtype = bf16,
                     max_tokens_per_rank = 512, scaleup_ranks = 8, mode = direct>
#runtime_cap = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048, dtype = bf16,
                          max_tokens_per_rank = 0>

// CHECK-LABEL: func.func @layout
// CHECK-SAME: (%[[IDX:.*]]: tensor<?x4xi64>)
func.func @layout(%idx: tensor<?x4xi64>)
    -> (tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>) {
  // CHECK: ep.dispatch_layout %[[IDX]] config #[[$BF16]] : tensor<?x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
  %r, %e, %in = ep.dispatch_layout %idx config #bf16
      : tensor<?x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
  return %r, %e, %in : tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
}

// CHECK-LABEL: func.func @pp_send_recv
func.func @pp_send_recv(%x: tensor<?x96xbf16>) -> (tensor<?x96xbf16>, tensor<?x96xbf16>) {
  // CHECK: ep.pp_send_recv %{{.*}} ranks 4 to next : tensor<?x96xbf16> -> tensor<?x96xbf16>
  %y = ep.pp_send_recv %x ranks 4 to next : tensor<?x96xbf16> -> tensor<?x96xbf16>
  // CHECK: ep.pp_send_recv %{{.*}} ranks 4 to prev
  %z = ep.pp_send_recv %y ranks 4 to prev : tensor<?x96xbf16> -> tensor<?x96xbf16>
  return %y, %z : tensor<?x96xbf16>, tensor<?x96xbf16>
}

// CHECK-LABEL: func.func @engram_fetch
// CHECK-SAME: (%[[IDS:.*]]: tensor<?x24xi32>)
func.func @engram_fetch(%ids: tensor<?x24xi32>) -> tensor<?x49152xbf16> {
  // CHECK: ep.engram_fetch %[[IDS]] config #[[$BF16]] : tensor<?x24xi32> -> tensor<?x49152xbf16>
  %rows = ep.engram_fetch %ids config #bf16 : tensor<?x24xi32> -> tensor<?x49152xbf16>
  return %rows : tensor<?x49152xbf16>
}

// CHECK-LABEL: func.func @dispatch_bf16_minimal
// CHECK-SAME: (%[[X:.*]]: tensor<?x2048xbf16>, %[[IDX:.*]]: tensor<?x4xi32>)
func.func @dispatch_bf16_minimal(%x: tensor<?x2048xbf16>, %idx: tensor<?x4xi32>)
    -> !ep.handle<#bf16> {
  // CHECK: ep.dispatch %[[X]] topk(%[[IDX]] : tensor<?x4xi32>) config #[[$BF16]] : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi32>, !ep.handle<#[[$BF16]]>
  %rx, %ridx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi32>) config #bf16
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi32>, !ep.handle<#bf16>
  return %h : !ep.handle<#bf16>
}

// Static token counts are allowed as long as they fit the configuration.
// CHECK-LABEL: func.func @dispatch_static_tokens
func.func @dispatch_static_tokens(%x: tensor<512x2048xbf16>, %idx: tensor<512x4xi64>,
                                  %w: tensor<512x4xf32>) {
  // CHECK: ep.dispatch %{{.*}} topk(%{{.*}} : tensor<512x4xi64>) weights(%{{.*}} : tensor<512x4xf32>) config #[[$BF16]] : tensor<512x2048xbf16> -> tensor<4096x2048xbf16>, tensor<4096x4xi64>, tensor<4096x4xf32>, !ep.handle<#[[$BF16]]>
  %rx, %ridx, %rw, %h = ep.dispatch %x topk(%idx : tensor<512x4xi64>)
      weights(%w : tensor<512x4xf32>) config #bf16
      : tensor<512x2048xbf16> -> tensor<4096x2048xbf16>, tensor<4096x4xi64>,
        tensor<4096x4xf32>, !ep.handle<#bf16>
  return
}

// With a run-time cap any token count is accepted (the runtime bounds it).
// CHECK-LABEL: func.func @multi_node
// CHECK: config #[[$HYBRID]]
// CHECK: config #[[$DIRECT]]
func.func @multi_node(%x: tensor<100x2048xbf16>, %idx: tensor<100x4xi64>) {
  %rx, %ridx, %h = ep.dispatch %x topk(%idx : tensor<100x4xi64>) config #hybrid
      : tensor<100x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi64>, !ep.handle<#hybrid>
  %rx2, %ridx2, %h2 = ep.dispatch %x topk(%idx : tensor<100x4xi64>) config #direct
      : tensor<100x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi64>, !ep.handle<#direct>
  return
}

// CHECK-LABEL: func.func @dispatch_runtime_cap
func.func @dispatch_runtime_cap(%x: tensor<100000x2048xbf16>, %idx: tensor<100000x4xi64>) {
  // CHECK: ep.dispatch %{{.*}} topk(%{{.*}} : tensor<100000x4xi64>) config #[[$RUNTIME_CAP]] : tensor<100000x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi64>, !ep.handle<#[[$RUNTIME_CAP]]>
  %rx, %ridx, %h = ep.dispatch %x topk(%idx : tensor<100000x4xi64>) config #runtime_cap
      : tensor<100000x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi64>, !ep.handle<#runtime_cap>
  return
}

// CHECK-LABEL: func.func @dispatch_fp8
// CHECK-SAME: (%[[X:.*]]: tensor<?x7168xf8E4M3FN>, %[[SF:.*]]: tensor<?x56xf32>, %[[IDX:.*]]: tensor<?x8xi64>, %[[W:.*]]: tensor<?x8xf32>)
func.func @dispatch_fp8(%x: tensor<?x7168xf8E4M3FN>, %sf: tensor<?x56xf32>,
                        %idx: tensor<?x8xi64>, %w: tensor<?x8xf32>) {
  // CHECK: ep.dispatch %[[X]] topk(%[[IDX]] : tensor<?x8xi64>) scales(%[[SF]] : tensor<?x56xf32>) weights(%[[W]] : tensor<?x8xf32>) config #[[$FP8]] : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#[[$FP8]]>
  %rx, %rsf, %ridx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>)
      scales(%sf : tensor<?x56xf32>) weights(%w : tensor<?x8xf32>) config #fp8
      : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>,
        tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#fp8>
  return
}

// UE8M0 scale packs travel as opaque i32 words.
// CHECK-LABEL: func.func @dispatch_fp8_ue8m0
func.func @dispatch_fp8_ue8m0(%x: tensor<?x7168xf8E4M3FN>, %sf: tensor<?x56xi32>,
                              %idx: tensor<?x8xi64>) {
  // CHECK: scales(%{{.*}} : tensor<?x56xi32>) config #[[$FP8]] : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xi32>, tensor<?x8xi64>, !ep.handle<#[[$FP8]]>
  %rx, %rsf, %ridx, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>)
      scales(%sf : tensor<?x56xi32>) config #fp8
      : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xi32>,
        tensor<?x8xi64>, !ep.handle<#fp8>
  return
}

// Expanded, with the padding rows zeroed.
// CHECK-LABEL: func.func @dispatch_expanded_zero_padding
func.func @dispatch_expanded_zero_padding(%x: tensor<?x1024xbf16>, %idx: tensor<?x6xi64>) {
  // CHECK: ep.dispatch %{{.*}} topk(%{{.*}} : tensor<?x6xi64>) zero_padding config #[[$EXP]]
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) zero_padding config #exp
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#exp>
  return
}

// Outputs in the window, for dispatch and combine: the attribute round-trips.
// CHECK-LABEL: func.func @window_outputs
func.func @window_outputs(%x: tensor<?x1024xbf16>, %idx: tensor<?x6xi64>) {
  // CHECK: ep.dispatch %{{.*}} topk(%{{.*}} : tensor<?x6xi64>) zero_padding window_outputs config #[[$EXP]]
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) zero_padding window_outputs config #exp
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#exp>
  // CHECK: ep.combine %{{.*}}, %{{.*}} window_outputs :
  %y = ep.combine %rx, %h window_outputs : tensor<?x1024xbf16>, !ep.handle<#exp> -> tensor<?x1024xbf16>
  return
}

// The expanded layout has no recv_topk_idx and one weight per row.
// CHECK-LABEL: func.func @dispatch_expanded
func.func @dispatch_expanded(%x: tensor<?x1024xbf16>, %idx: tensor<?x6xi64>,
                             %w: tensor<?x6xf32>) {
  // CHECK: ep.dispatch %{{.*}} topk(%{{.*}} : tensor<?x6xi64>) weights(%{{.*}} : tensor<?x6xf32>) config #[[$EXP]] : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, !ep.handle<#[[$EXP]]>
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>)
      weights(%w : tensor<?x6xf32>) config #exp
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, !ep.handle<#exp>
  return
}

// Cached dispatch replays the handle's routing: no topk(...).
// CHECK-LABEL: func.func @dispatch_cached
// CHECK-SAME: (%[[G:.*]]: tensor<?x2048xbf16>, %[[H:.*]]: !ep.handle<#[[$BF16]]>)
func.func @dispatch_cached(%g: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>) {
  // CHECK: ep.dispatch %[[G]] cached(%[[H]] : !ep.handle<#[[$BF16]]>) config #[[$BF16]] : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi64>, !ep.handle<#[[$BF16]]>
  %rx, %ridx, %h2 = ep.dispatch %g cached(%h : !ep.handle<#bf16>) config #bf16
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x4xi64>, !ep.handle<#bf16>
  return
}

// CHECK-LABEL: func.func @combine_plain
// CHECK-SAME: (%[[Y:.*]]: tensor<?x2048xbf16>, %[[H:.*]]: !ep.handle<#[[$BF16]]>)
func.func @combine_plain(%y: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>) -> tensor<?x2048xbf16> {
  // CHECK: %[[OUT:.*]] = ep.combine %[[Y]], %[[H]] : tensor<?x2048xbf16>, !ep.handle<#[[$BF16]]> -> tensor<?x2048xbf16>
  %out = ep.combine %y, %h : tensor<?x2048xbf16>, !ep.handle<#bf16> -> tensor<?x2048xbf16>
  // CHECK: return %[[OUT]]
  return %out : tensor<?x2048xbf16>
}

// CHECK-LABEL: func.func @combine_weights_two_biases
func.func @combine_weights_two_biases(%y: tensor<?x7168xbf16>, %h: !ep.handle<#fp8>,
                                      %w: tensor<?x8xf32>, %b0: tensor<?x7168xbf16>,
                                      %b1: tensor<?x7168xbf16>) {
  // CHECK: ep.combine %{{.*}}, %{{.*}} weights(%{{.*}} : tensor<?x8xf32>) bias(%{{.*}}, %{{.*}} : tensor<?x7168xbf16>, tensor<?x7168xbf16>) : tensor<?x7168xbf16>, !ep.handle<#[[$FP8]]> -> tensor<?x7168xbf16>, tensor<?x8xf32>
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x8xf32>)
      bias(%b0, %b1 : tensor<?x7168xbf16>, tensor<?x7168xbf16>)
      : tensor<?x7168xbf16>, !ep.handle<#fp8> -> tensor<?x7168xbf16>, tensor<?x8xf32>
  return
}

// CHECK-LABEL: func.func @combine_expanded
func.func @combine_expanded(%y: tensor<?x1024xbf16>, %h: !ep.handle<#exp>,
                            %w: tensor<?xf32>, %b: tensor<256x1024xbf16>) {
  // CHECK: ep.combine %{{.*}}, %{{.*}} weights(%{{.*}} : tensor<?xf32>) bias(%{{.*}} : tensor<256x1024xbf16>) : tensor<?x1024xbf16>, !ep.handle<#[[$EXP]]> -> tensor<256x1024xbf16>, tensor<256x6xf32>
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?xf32>) bias(%b : tensor<256x1024xbf16>)
      : tensor<?x1024xbf16>, !ep.handle<#exp> -> tensor<256x1024xbf16>, tensor<256x6xf32>
  return
}

// The smallest legal world: one rank, one expert, top-1.
// CHECK-LABEL: func.func @single_rank
func.func @single_rank(%x: tensor<1x8xbf16>, %idx: tensor<1x1xi8>) {
  // CHECK: ep.dispatch %{{.*}} topk(%{{.*}} : tensor<1x1xi8>) config #[[$ONE]]
  %rx, %ridx, %h = ep.dispatch %x topk(%idx : tensor<1x1xi8>) config #one
      : tensor<1x8xbf16> -> tensor<?x8xbf16>, tensor<?x1xi8>, !ep.handle<#one>
  // CHECK: ep.combine
  %y = ep.combine %rx, %h : tensor<?x8xbf16>, !ep.handle<#one> -> tensor<1x8xbf16>
  return
}

// CHECK-LABEL: func.func @grouped_gemm
// CHECK-SAME: (%[[X:.*]]: tensor<?x1024xbf16>, %[[W:.*]]: tensor<8x1024x512xbf16>, %[[H:.*]]: !ep.handle<#[[$EXP]]>)
func.func @grouped_gemm(%x: tensor<?x1024xbf16>, %w: tensor<8x1024x512xbf16>,
                        %h: !ep.handle<#exp>) -> (tensor<?x512xbf16>, tensor<?x512xf32>) {
  // CHECK: ep.grouped_gemm %[[X]], %[[W]] layout(%[[H]] : !ep.handle<#[[$EXP]]>) : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#exp>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xbf16>
  // CHECK: ep.grouped_gemm {{.*}} -> tensor<?x512xf32>
  %z = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#exp>)
      : tensor<?x1024xbf16>, tensor<8x1024x512xbf16> -> tensor<?x512xf32>
  return %y, %z : tensor<?x512xbf16>, tensor<?x512xf32>
}

// CHECK-LABEL: func.func @swiglu
// CHECK-SAME: (%[[GU:.*]]: tensor<?x512xbf16>, %[[H:.*]]: !ep.handle<#[[$EXP]]>, %[[W:.*]]: tensor<?xf32>)
func.func @swiglu(%gu: tensor<?x512xbf16>, %h: !ep.handle<#exp>, %w: tensor<?xf32>)
    -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x256xbf16>) {
  // CHECK: %{{.*}}, %{{.*}} = ep.swiglu %[[GU]] layout(%[[H]] : !ep.handle<#[[$EXP]]>) : tensor<?x512xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
  %q, %s = ep.swiglu %gu layout(%h : !ep.handle<#exp>)
      : tensor<?x512xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
  // CHECK: ep.swiglu %[[GU]] layout(%[[H]] : !ep.handle<#[[$EXP]]>) : tensor<?x512xbf16> -> tensor<?x256xbf16>
  %y = ep.swiglu %gu layout(%h : !ep.handle<#exp>) : tensor<?x512xbf16> -> tensor<?x256xbf16>
  // CHECK: ep.swiglu %[[GU]] layout(%[[H]] : !ep.handle<#[[$EXP]]>) weights(%[[W]] : tensor<?xf32>) : tensor<?x512xbf16> -> tensor<?x256xbf16>
  %z = ep.swiglu %gu layout(%h : !ep.handle<#exp>) weights(%w : tensor<?xf32>)
      : tensor<?x512xbf16> -> tensor<?x256xbf16>
  return %q, %s, %y : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x256xbf16>
}

// An expert's down GEMM: rows of the intermediate width (512), not the hidden size (1024).
// CHECK-LABEL: func.func @grouped_gemm_down
func.func @grouped_gemm_down(%y: tensor<?x512xbf16>, %w: tensor<8x512x1024xbf16>,
                             %h: !ep.handle<#exp>) -> tensor<?x1024xbf16> {
  // CHECK: ep.grouped_gemm {{.*}} : tensor<?x512xbf16>, tensor<8x512x1024xbf16> -> tensor<?x1024xbf16>
  %z = ep.grouped_gemm %y, %w layout(%h : !ep.handle<#exp>)
      : tensor<?x512xbf16>, tensor<8x512x1024xbf16> -> tensor<?x1024xbf16>
  return %z : tensor<?x1024xbf16>
}

// FP8 rows and [L, N, hidden] weights with their block scales (f32 per 128 channels).
#fp8exp = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 1024, dtype = f8E4M3FN,
                     scale_packs = 8, layout = expanded, expert_alignment = 128>
// CHECK-LABEL: func.func @grouped_gemm_fp8
// CHECK-SAME: (%[[X:.*]]: tensor<?x1024xf8E4M3FN>, %[[W:.*]]: tensor<8x512x1024xf8E4M3FN>, %[[H:.*]]: !ep.handle<{{.*}}>, %[[SX:.*]]: tensor<?x8xf32>, %[[SW:.*]]: tensor<8x4x8xf32>)
func.func @grouped_gemm_fp8(%x: tensor<?x1024xf8E4M3FN>, %w: tensor<8x512x1024xf8E4M3FN>,
                            %h: !ep.handle<#fp8exp>, %sx: tensor<?x8xf32>,
                            %sw: tensor<8x4x8xf32>) -> tensor<?x512xbf16> {
  // CHECK: ep.grouped_gemm %[[X]], %[[W]] layout(%[[H]] : {{.*}}) scales(%[[SX]], %[[SW]] : tensor<?x8xf32>, tensor<8x4x8xf32>) : tensor<?x1024xf8E4M3FN>, tensor<8x512x1024xf8E4M3FN> -> tensor<?x512xbf16>
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#fp8exp>)
      scales(%sx, %sw : tensor<?x8xf32>, tensor<8x4x8xf32>)
      : tensor<?x1024xf8E4M3FN>, tensor<8x512x1024xf8E4M3FN> -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}

// CHECK-LABEL: func.func @dispatch_gemm
func.func @dispatch_gemm(%x: tensor<?x1024xbf16>, %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>,
                         %e: tensor<8x1024x512xbf16>) {
  // CHECK: ep.dispatch_gemm %{{.*}} topk(%{{.*}} : tensor<?x6xi64>) weights(%{{.*}} : tensor<?x6xf32>) experts(%{{.*}} : tensor<8x1024x512xbf16>) zero_padding config #[[$EXP]] : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x512xbf16>, !ep.handle<#[[$EXP]]>
  %rx, %rw, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x6xi64>) weights(%w : tensor<?x6xf32>)
      experts(%e : tensor<8x1024x512xbf16>) zero_padding config #exp
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x512xbf16>, !ep.handle<#exp>
  // CHECK: ep.dispatch_gemm %{{.*}} topk(%{{.*}} : tensor<?x6xi64>) experts(%{{.*}} : tensor<8x1024x512xbf16>) config #[[$EXP]] : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x512xf32>, !ep.handle<#[[$EXP]]>
  %rx2, %y2, %h2 = ep.dispatch_gemm %x topk(%idx : tensor<?x6xi64>)
      experts(%e : tensor<8x1024x512xbf16>) config #exp
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x512xf32>, !ep.handle<#exp>
  return
}

// AGRS: an all-gather (one input, and a batch of two), a reduce-scatter (static and dynamic rows).
// CHECK-LABEL: func @agrs
// CHECK: ep.all_gather %{{.*}} ranks 8 : tensor<32x64xbf16> -> tensor<8x32x64xbf16>
// CHECK: ep.all_gather %{{.*}}, %{{.*}} ranks 4 : tensor<7xf32>, tensor<2x3xf8E4M3FN> -> tensor<4x7xf32>, tensor<4x2x3xf8E4M3FN>
// CHECK: ep.reduce_scatter %{{.*}} ranks 8 : tensor<64x96xbf16> -> tensor<8x96xbf16>
// CHECK: ep.reduce_scatter %{{.*}} ranks 2 : tensor<?x5xf32> -> tensor<?x5xf32>
func.func @agrs(%x: tensor<32x64xbf16>, %a: tensor<7xf32>, %b: tensor<2x3xf8E4M3FN>,
                %g: tensor<64x96xbf16>, %d: tensor<?x5xf32>) {
  %0 = ep.all_gather %x ranks 8 : tensor<32x64xbf16> -> tensor<8x32x64xbf16>
  %1:2 = ep.all_gather %a, %b ranks 4
      : tensor<7xf32>, tensor<2x3xf8E4M3FN> -> tensor<4x7xf32>, tensor<4x2x3xf8E4M3FN>
  %2 = ep.reduce_scatter %g ranks 8 : tensor<64x96xbf16> -> tensor<8x96xbf16>
  %3 = ep.reduce_scatter %d ranks 2 : tensor<?x5xf32> -> tensor<?x5xf32>
  return
}

// DeepEP V1's low-latency mode: the dispatch (FP8 with round_scale and UE8M0
// scales; bf16 without scales) and its combine.
#ll8 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN,
                  scale_packs = 56>
#ll16 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16>

// CHECK-LABEL: func.func @low_latency_dispatch_fp8
func.func @low_latency_dispatch_fp8(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>)
    -> tensor<32x?x14xi32> {
  // CHECK: ep.low_latency_dispatch %{{.*}}, %{{.*}} round_scale ue8m0 config #{{.*}} : tensor<?x7168xbf16>, tensor<?x8xi64> -> tensor<32x?x7168xf8E4M3FN>, scales tensor<32x?x14xi32>, tensor<32xi32>, tensor<32x?xi32>, tensor<32x8xi64>, tensor<32x?xi32>
  %rx, %sf, %n, %src, %range, %route = ep.low_latency_dispatch %x, %idx round_scale ue8m0
      config #ll8 : tensor<?x7168xbf16>, tensor<?x8xi64>
      -> tensor<32x?x7168xf8E4M3FN>, scales tensor<32x?x14xi32>, tensor<32xi32>,
         tensor<32x?xi32>, tensor<32x8xi64>, tensor<32x?xi32>
  return %sf : tensor<32x?x14xi32>
}

// CHECK-LABEL: func.func @low_latency_bf16_and_combine
func.func @low_latency_bf16_and_combine(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi32>,
                                        %w: tensor<?x8xf32>) -> tensor<?x7168xbf16> {
  // CHECK: ep.low_latency_dispatch %{{.*}}, %{{.*}} config #{{.*}} : tensor<?x7168xbf16>, tensor<?x8xi32> -> tensor<32x?x7168xbf16>, tensor<32xi32>, tensor<32x?xi32>, tensor<32x8xi64>, tensor<32x?xi32>
  %rx, %n, %src, %range, %route = ep.low_latency_dispatch %x, %idx config #ll16
      : tensor<?x7168xbf16>, tensor<?x8xi32>
      -> tensor<32x?x7168xbf16>, tensor<32xi32>, tensor<32x?xi32>, tensor<32x8xi64>,
         tensor<32x?xi32>
  // CHECK: ep.low_latency_combine %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} config #{{.*}} : tensor<32x?x7168xbf16>, tensor<32x8xi64>, tensor<32x?xi32>, tensor<?x8xi32>, tensor<?x8xf32> -> tensor<?x7168xbf16>
  %y = ep.low_latency_combine %rx, %range, %route, %idx, %w config #ll16
      : tensor<32x?x7168xbf16>, tensor<32x8xi64>, tensor<32x?xi32>, tensor<?x8xi32>,
        tensor<?x8xf32> -> tensor<?x7168xbf16>
  return %y : tensor<?x7168xbf16>
}

// The whole FP8 layer in one op (what ep-fuse-moe-layer makes of its five ops).
// CHECK-LABEL: func.func @moe_layer
// CHECK: ep.moe_layer %{{.*}} topk(%{{.*}} : tensor<?x8xi64>) scales(%{{.*}} : tensor<?x56xf32>) weights(%{{.*}} : tensor<?x8xf32>) gate_up(%{{.*}}, %{{.*}} : tensor<32x4096x7168xf8E4M3FN>, tensor<32x32x56xf32>) down(%{{.*}}, %{{.*}} : tensor<32x7168x2048xf8E4M3FN>, tensor<32x56x16xf32>) config #{{.*}} : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xbf16>
func.func @moe_layer(%x: tensor<?x7168xf8E4M3FN>, %idx: tensor<?x8xi64>, %sf: tensor<?x56xf32>,
                     %w: tensor<?x8xf32>, %w13: tensor<32x4096x7168xf8E4M3FN>,
                     %s13: tensor<32x32x56xf32>, %w2: tensor<32x7168x2048xf8E4M3FN>,
                     %s2: tensor<32x56x16xf32>) -> tensor<?x7168xbf16> {
  %out = ep.moe_layer %x topk(%idx : tensor<?x8xi64>) scales(%sf : tensor<?x56xf32>)
      weights(%w : tensor<?x8xf32>)
      gate_up(%w13, %s13 : tensor<32x4096x7168xf8E4M3FN>, tensor<32x32x56xf32>)
      down(%w2, %s2 : tensor<32x7168x2048xf8E4M3FN>, tensor<32x56x16xf32>)
      config #fp8_layer : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xbf16>
  return %out : tensor<?x7168xbf16>
}
