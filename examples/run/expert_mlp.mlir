// An expert MLP in BF16 as program steps: the gate/up GEMM multiplies the
// received rows (hidden 256) by [256, 768] weights (gate columns, then up),
// ep.swiglu makes silu(gate) * up of them (I = 384 channels), the down GEMM
// multiplies those rows (K = the intermediate size, not the hidden size) by
// [384, 256] weights, and the combine brings the results back. Each GEMM is
// checked against a float64 product, the SwiGLU against a float64 activation;
// the first GEMM stays a step of its own because its rows are also printed.
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
  %up_weights = run.random normal scale 0.06 seed 33 rows %c4 : tensor<?x256x768xbf16>
  %up = tensor.cast %up_weights : tensor<?x256x768xbf16> to tensor<4x256x768xbf16>
  %hidden = ep.grouped_gemm %rx, %up layout(%h : !ep.handle<#cfg>)
      : tensor<?x256xbf16>, tensor<4x256x768xbf16> -> tensor<?x768xbf16>
  run.print %hidden rows 1 : tensor<?x768xbf16>

  %act = ep.swiglu %hidden layout(%h : !ep.handle<#cfg>) : tensor<?x768xbf16> -> tensor<?x384xbf16>

  %down_weights = run.random normal scale 0.05 seed 34 rows %c4 : tensor<?x384x256xbf16>
  %down = tensor.cast %down_weights : tensor<?x384x256xbf16> to tensor<4x384x256xbf16>
  %y = ep.grouped_gemm %act, %down layout(%h : !ep.handle<#cfg>)
      : tensor<?x384xbf16>, tensor<4x384x256xbf16> -> tensor<?x256xbf16>
  %out = ep.combine %y, %h : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  run.print %out rows 1 : tensor<?x256xbf16>
  return
}
