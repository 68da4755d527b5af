// ep-fuse-moe-layer: DeepSeek V3's FP8 layer written as five ops on one handle
// (dispatch, gate/up GEMM, weighted SwiGLU, down GEMM, combine) becomes one
// ep.moe_layer where the token cap is at most max-tokens; every refusal is a
// remark on the dispatch that says why. By default (max-tokens=0, the measured
// rule: the persistent kernel is not yet faster) mode=auto fuses no layer.
// RUN: epic-opt %s --split-input-file --ep-fuse-moe-layer="max-tokens=256" --verify-diagnostics | FileCheck %s
// RUN: epic-opt %s --split-input-file --ep-fuse-moe-layer 2>&1 | FileCheck %s --check-prefix=AUTO
// RUN: epic-opt %s --split-input-file --ep-fuse-moe-layer="max-tokens=64" 2>&1 | FileCheck %s --check-prefix=CAP

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 128>

// AUTO: remark: ep-fuse-moe-layer: not fused: mode=auto fuses no layer (max-tokens=0): the persistent kernel measured slower than the five ops at every size
// AUTO-NOT: ep.moe_layer
// AUTO-LABEL: func.func @always
// AUTO: ep.moe_layer

// CHECK-LABEL: func.func @layer
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x256xf8E4M3FN>, %[[IDX:[^:]*]]: tensor<?x4xi64>, %[[SF:[^:]*]]: tensor<?x2xf32>, %[[W:[^:]*]]: tensor<?x4xf32>, %[[W13:[^:]*]]: tensor<8x256x256xf8E4M3FN>, %[[S13:[^:]*]]: tensor<8x2x2xf32>, %[[W2:[^:]*]]: tensor<8x256x128xf8E4M3FN>, %[[S2:[^:]*]]: tensor<8x2x1xf32>)
// CHECK-NEXT: %[[OUT:.*]] = ep.moe_layer %[[X]] topk(%[[IDX]] : tensor<?x4xi64>) scales(%[[SF]] : tensor<?x2xf32>) weights(%[[W]] : tensor<?x4xf32>) gate_up(%[[W13]], %[[S13]] : {{.*}}) down(%[[W2]], %[[S2]] : {{.*}}) config #{{.*}} : tensor<?x256xf8E4M3FN> -> tensor<?x256xbf16>
// CHECK-NEXT: return %[[OUT]]
// CAP: remark: ep-fuse-moe-layer: not fused: the token cap is 128 per rank, above 64: the GEMMs compute for most of the layer, one kernel would save nothing
func.func @layer(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                 %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                 %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>) -> tensor<?x256xbf16> {
  // expected-remark@+1 {{ep-fuse-moe-layer: fused: the token cap is 128 per rank, at most 256: a decode-sized layer, whose launches and step tails one kernel removes}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) weights(%rw : tensor<?xf32>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out : tensor<?x256xbf16>
}

// -----

// A prefill-sized cap: the steps stay separate.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 4096>

// CHECK-LABEL: func.func @prefill
// CHECK-NOT: ep.moe_layer
// CHECK: ep.combine
func.func @prefill(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                   %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                   %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>) -> tensor<?x256xbf16> {
  // expected-remark@+1 {{ep-fuse-moe-layer: not fused: the token cap is 4096 per rank, above 256: the GEMMs compute for most of the layer, one kernel would save nothing}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) weights(%rw : tensor<?xf32>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out : tensor<?x256xbf16>
}

// -----

// The gate/up rows are also returned: they must exist, so the chain stays five ops.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 128>

// CHECK-LABEL: func.func @escapes
// CHECK-NOT: ep.moe_layer
func.func @escapes(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                   %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                   %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>)
    -> (tensor<?x256xbf16>, tensor<?x256xbf16>) {
  // expected-remark@+1 {{ep-fuse-moe-layer: not fused: the gate/up GEMM's result feeds something else than one ep.swiglu on the handle}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) weights(%rw : tensor<?xf32>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out, %gu : tensor<?x256xbf16>, tensor<?x256xbf16>
}

// -----

// The SwiGLU without the routing weights: the combine would sum unweighted rows.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 128>

func.func @unweighted(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                      %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                      %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>)
    -> (tensor<?x256xbf16>, tensor<?xf32>) {
  // expected-remark@+1 {{ep-fuse-moe-layer: not fused: the ep.swiglu does not weight its rows by the dispatch's recv_topk_weights}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out, %rw : tensor<?x256xbf16>, tensor<?xf32>
}

// -----

// mode decided by the function's ep.fusion attribute.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 128>

// CHECK-LABEL: func.func @never
// CHECK-NOT: ep.moe_layer
func.func @never(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                 %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                 %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>) -> tensor<?x256xbf16>
    attributes {ep.fusion = "never"} {
  // expected-remark@+1 {{ep-fuse-moe-layer: not fused: ep.fusion is "never"}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) weights(%rw : tensor<?xf32>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out : tensor<?x256xbf16>
}

// -----

// The handle is returned: another op could still read the dispatch's layout.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 128>

// CHECK-LABEL: func.func @handle_escapes
// CHECK-NOT: ep.moe_layer
func.func @handle_escapes(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                          %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>,
                          %s13: tensor<8x2x2xf32>, %w2: tensor<8x256x128xf8E4M3FN>,
                          %s2: tensor<8x2x1xf32>) -> (tensor<?x256xbf16>, !ep.handle<#cfg>) {
  // expected-remark@+1 {{ep-fuse-moe-layer: not fused: the handle is also read by 'func.return'}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) weights(%rw : tensor<?xf32>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out, %h : tensor<?x256xbf16>, !ep.handle<#cfg>
}

// -----

// ep.fusion = "always" fuses at any token cap, also where mode=auto fuses nothing.
#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN,
                  scale_packs = 2, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 4096>

// CHECK-LABEL: func.func @always
// CHECK: ep.moe_layer
// CHECK-NOT: ep.combine
func.func @always(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>,
                  %w: tensor<?x4xf32>, %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>,
                  %w2: tensor<8x256x128xf8E4M3FN>, %s2: tensor<8x2x1xf32>) -> tensor<?x256xbf16>
    attributes {ep.fusion = "always"} {
  // expected-remark@+1 {{ep-fuse-moe-layer: fused: ep.fusion is "always"}}
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?xf32>, !ep.handle<#cfg>
  %gu = ep.grouped_gemm %rx, %w13 layout(%h : !ep.handle<#cfg>) scales(%rsf, %s13 : tensor<?x2xf32>, tensor<8x2x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<8x256x256xf8E4M3FN> -> tensor<?x256xbf16>
  %a, %as = ep.swiglu %gu layout(%h : !ep.handle<#cfg>) weights(%rw : tensor<?xf32>)
      : tensor<?x256xbf16> -> tensor<?x128xf8E4M3FN>, tensor<?x1xf32>
  %y = ep.grouped_gemm %a, %w2 layout(%h : !ep.handle<#cfg>) scales(%as, %s2 : tensor<?x1xf32>, tensor<8x2x1xf32>)
      : tensor<?x128xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  return %out : tensor<?x256xbf16>
}
