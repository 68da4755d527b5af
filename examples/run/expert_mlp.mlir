// An expert MLP's two GEMMs as program steps: the up GEMM multiplies the
// received rows (hidden 256) by [256, 512] weights, the down GEMM multiplies
// those 512-wide rows (K = the intermediate size, not the hidden size) by
// [512, 256] weights, and the combine brings the results back. (A SwiGLU
// between them is a Python kernel today, epic.activations.swiglu_fp8, not an
// op.) Each step is checked against a float64 product; the first GEMM stays a
// step of its own because its rows are also printed.
//
//   build/bin/epic-run examples/run/expert_mlp.mlir --check

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  expert_alignment = 64, layout = expanded, max_tokens_per_rank = 64>

func.func @main() {
  %t = run.tokens per_rank [64, 9, 0, 48]
  %x = run.random normal seed 31 rows %t : tensor<?x256xbf16>
  %idx = run.routing experts 16 masked 0.1 seed 32 rows %t : tensor<?x4xi64>
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, !ep.handle<#cfg>
  run.print %rx rows 1 : tensor<?x256xbf16>

  %c4 = arith.constant 4 : index
  %up_weights = run.random normal scale 0.06 seed 33 rows %c4 : tensor<?x256x512xbf16>
  %up = tensor.cast %up_weights : tensor<?x256x512xbf16> to tensor<4x256x512xbf16>
  %hidden = ep.grouped_gemm %rx, %up layout(%h : !ep.handle<#cfg>)
      : tensor<?x256xbf16>, tensor<4x256x512xbf16> -> tensor<?x512xbf16>
  run.print %hidden rows 1 : tensor<?x512xbf16>

  %down_weights = run.random normal scale 0.04 seed 34 rows %c4 : tensor<?x512x256xbf16>
  %down = tensor.cast %down_weights : tensor<?x512x256xbf16> to tensor<4x512x256xbf16>
  %y = ep.grouped_gemm %hidden, %down layout(%h : !ep.handle<#cfg>)
      : tensor<?x512xbf16>, tensor<4x512x256xbf16> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  run.print %out rows 1 : tensor<?x256xbf16>
  return
}
