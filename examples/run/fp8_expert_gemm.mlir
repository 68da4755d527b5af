// The FP8 expert GEMM as a program step: an FP8 dispatch (e4m3 rows, one f32
// scale per 128 channels) feeds ep.grouped_gemm with the rows' scales and the
// experts' e4m3 weights [L, N, hidden] with their 128 x 128 block scales; the
// BF16 results go back through the combine. --check compares the GEMM with a
// float64 product of the dequantized operands.
//
//   build/bin/epic-run examples/run/fp8_expert_gemm.mlir --check

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 64>

func.func @main() {
  %t = run.tokens per_rank [64, 5, 0, 37]
  %x = run.random normal seed 41 rows %t : tensor<?x512xf8E4M3FN>
  %sf = run.random uniform scale 0.5 seed 42 rows %t : tensor<?x4xf32>
  %idx = run.routing experts 16 masked 0.1 seed 43 rows %t : tensor<?x4xi64>
  %rx, %rsf, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x4xf32>)
      config #cfg : tensor<?x512xf8E4M3FN> -> tensor<?x512xf8E4M3FN>, tensor<?x4xf32>,
      !ep.handle<#cfg>

  %c4 = arith.constant 4 : index
  %w = run.random normal seed 44 rows %c4 : tensor<?x512x512xf8E4M3FN>
  %weights = tensor.cast %w : tensor<?x512x512xf8E4M3FN> to tensor<4x512x512xf8E4M3FN>
  %ws = run.random uniform scale 0.5 seed 45 rows %c4 : tensor<?x4x4xf32>
  %w_scales = tensor.cast %ws : tensor<?x4x4xf32> to tensor<4x4x4xf32>
  %y = ep.grouped_gemm %rx, %weights layout(%h : !ep.handle<#cfg>)
      scales(%rsf, %w_scales : tensor<?x4xf32>, tensor<4x4x4xf32>)
      : tensor<?x512xf8E4M3FN>, tensor<4x512x512xf8E4M3FN> -> tensor<?x512xbf16>
  run.print %y rows 1 : tensor<?x512xbf16>
  %out = ep.combine %y, %h : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>
  run.print %out rows 1 : tensor<?x512xbf16>
  return
}
