// A Mixture-of-Experts layer's communication, in the ep dialect: DeepEP's V3
// configuration (8 ranks, 256 experts, top-8, hidden 7168) with FP8 dispatch,
// the expanded (grouped-GEMM) layout and BF16 combine.
//
// Try it:
//   build/bin/epic-opt examples/mlir/moe_layer.mlir --canonicalize
//
// The expert computation between dispatch and combine is a stand-in
// (dequantize and scale); a grouped GEMM op takes its place later.

#dispatch = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168,
                       dtype = f8E4M3FN, scale_packs = 56, expert_alignment = 128,
                       layout = expanded, max_tokens_per_rank = 4096>

func.func @moe_layer(%x: tensor<?x7168xf8E4M3FN>, %scales: tensor<?x56xf32>,
                     %topk_idx: tensor<?x8xi64>, %topk_weights: tensor<?x8xf32>,
                     %shared_expert_out: tensor<?x7168xbf16>)
    -> (tensor<?x7168xbf16>, tensor<?x8xf32>) {
  // Where the tokens go (the count stage of dispatch, exposed for inspection).
  %per_rank, %per_expert, %in_rank = ep.dispatch_layout %topk_idx config #dispatch
      : tensor<?x8xi64> -> tensor<8xi32>, tensor<256xi32>, tensor<?x8xi1>

  // Send every token once to each rank that owns one of its experts; rows
  // come back grouped by local expert and padded to 128 rows per expert.
  %recv_x, %recv_scales, %recv_weights, %handle = ep.dispatch %x
      topk(%topk_idx : tensor<?x8xi64>) scales(%scales : tensor<?x56xf32>)
      weights(%topk_weights : tensor<?x8xf32>) config #dispatch
      : tensor<?x7168xf8E4M3FN>
      -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?xf32>, !ep.handle<#dispatch>

  // Stand-in expert: dequantize to bf16 and double.
  %rows = arith.extf %recv_x : tensor<?x7168xf8E4M3FN> to tensor<?x7168xbf16>
  %expert_out = arith.addf %rows, %rows : tensor<?x7168xbf16>

  // Send the expert rows back and sum them at each token's source rank, with
  // the shared expert's output as a bias; a zero bias is dropped by
  // --canonicalize since it changes no bit.
  %zero_bias = arith.constant dense<0.0> : tensor<4096x7168xbf16>
  %out, %out_weights = ep.combine %expert_out, %handle
      weights(%recv_weights : tensor<?xf32>)
      bias(%shared_expert_out, %zero_bias : tensor<?x7168xbf16>, tensor<4096x7168xbf16>)
      : tensor<?x7168xbf16>, !ep.handle<#dispatch> -> tensor<?x7168xbf16>, tensor<?x8xf32>
  return %out, %out_weights : tensor<?x7168xbf16>, tensor<?x8xf32>
}
