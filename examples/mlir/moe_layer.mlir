// A Mixture-of-Experts layer's token traffic and expert GEMM in the ep dialect:
// DeepEP's layout step, dispatch in the expanded (grouped-GEMM) layout, the
// experts' GEMM on the received rows, and the combine that brings the rows
// back, weighted, onto the shared expert's output.
//
// Run it end to end on a GPU (a virtual world of 8 ranks), every ep op checked
// against DeepEP's semantics:
//   build/bin/epic-run examples/mlir/moe_layer.mlir --check
// epic-run translates @main and the functions it calls into a plan of steps;
// the fusion passes apply first, so the dispatch and the expert GEMM run as
// one ep.dispatch_gemm (each GEMM tile starts when its rows have landed).
//
// Or look at the IR:
//   build/bin/epic-opt examples/mlir/moe_layer.mlir --ep-fuse-dispatch-gemm

#cfg = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 512, dtype = bf16,
                  expert_alignment = 64, layout = expanded, max_tokens_per_rank = 96>

func.func @moe_layer(%x: tensor<?x512xbf16>, %topk_idx: tensor<?x6xi64>,
                     %topk_weights: tensor<?x6xf32>, %experts: tensor<8x512x512xbf16>,
                     %shared_expert_out: tensor<?x512xbf16>)
    -> (tensor<?x512xbf16>, tensor<?x6xf32>, tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>) {
  // Where the tokens go (DeepEP's get_dispatch_layout).
  %per_rank, %per_expert, %in_rank = ep.dispatch_layout %topk_idx config #cfg
      : tensor<?x6xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>

  // Send every token once to each rank that owns one of its experts; rows
  // come back grouped by local expert, each expert's block padded to 64 rows.
  %recv_x, %recv_weights, %handle = ep.dispatch %x topk(%topk_idx : tensor<?x6xi64>)
      weights(%topk_weights : tensor<?x6xf32>) config #cfg
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#cfg>

  // The 8 local experts: each one's rows times its [512, 512] weights.
  %expert_out = ep.grouped_gemm %recv_x, %experts layout(%handle : !ep.handle<#cfg>)
      : tensor<?x512xbf16>, tensor<8x512x512xbf16> -> tensor<?x512xbf16>

  // Back to each token's rank, weighted by its top-k weights and summed onto
  // the shared expert's output.
  %out, %out_weights = ep.combine %expert_out, %handle weights(%recv_weights : tensor<?xf32>)
      bias(%shared_expert_out : tensor<?x512xbf16>)
      : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>, tensor<?x6xf32>
  return %out, %out_weights, %per_rank, %per_expert, %in_rank
      : tensor<?x512xbf16>, tensor<?x6xf32>, tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
}

// The layer on 8 ranks with uneven token counts (one rank sends nothing).
func.func @main() {
  %t = run.tokens per_rank [96, 64, 0, 17, 96, 80, 33, 96]
  %x = run.random normal seed 1 rows %t : tensor<?x512xbf16>
  %idx = run.routing experts 64 masked 0.05 seed 2 rows %t : tensor<?x6xi64>
  %w = run.random uniform seed 3 rows %t : tensor<?x6xf32>
  %shared = run.random normal seed 4 rows %t : tensor<?x512xbf16>
  %local_experts = arith.constant 8 : index
  %weights = run.random normal scale 0.04 seed 5 rows %local_experts : tensor<?x512x512xbf16>
  %experts = tensor.cast %weights : tensor<?x512x512xbf16> to tensor<8x512x512xbf16>

  %out, %out_w, %per_rank, %per_expert, %in_rank = func.call @moe_layer(%x, %idx, %w, %experts,
      %shared) : (tensor<?x512xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, tensor<8x512x512xbf16>,
                  tensor<?x512xbf16>)
      -> (tensor<?x512xbf16>, tensor<?x6xf32>, tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>)
  run.print %per_rank : tensor<8xi32>
  run.print %out rows 2 : tensor<?x512xbf16>
  return
}
