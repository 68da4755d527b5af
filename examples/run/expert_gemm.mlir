// The expert GEMM as its own op: a routed dispatch keeps the handle, a
// cached dispatch sends new tokens along it, and ep.grouped_gemm multiplies
// each local expert's rows by its [256, 128] weights. Nothing here fuses (a
// cached dispatch replays its routing), so the GEMM runs its own kernel and
// is checked on its own against a float64 product.
//
//   build/bin/epic-run examples/run/expert_gemm.mlir --check

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  expert_alignment = 32, layout = expanded, max_tokens_per_rank = 64>

func.func @main() {
  %t = run.tokens per_rank [64, 7, 0, 40]
  %x = run.random normal seed 21 rows %t : tensor<?x256xbf16>
  %idx = run.routing experts 16 masked 0.1 seed 22 rows %t : tensor<?x4xi64>
  %w = run.random uniform seed 23 rows %t : tensor<?x4xf32>
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      config #cfg : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?xf32>, !ep.handle<#cfg>
  run.print %h : !ep.handle<#cfg>

  // New activations along the same routing, then the experts.
  %x2 = run.random normal seed 24 rows %t : tensor<?x256xbf16>
  %rx2, %h2 = ep.dispatch %x2 cached(%h : !ep.handle<#cfg>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, !ep.handle<#cfg>
  %c4 = arith.constant 4 : index
  %weights = run.random normal scale 0.06 seed 25 rows %c4 : tensor<?x256x128xbf16>
  %experts = tensor.cast %weights : tensor<?x256x128xbf16> to tensor<4x256x128xbf16>
  %y = ep.grouped_gemm %rx2, %experts layout(%h2 : !ep.handle<#cfg>)
      : tensor<?x256xbf16>, tensor<4x256x128xbf16> -> tensor<?x128xbf16>
  run.print %y rows 1 : tensor<?x128xbf16>
  return
}
