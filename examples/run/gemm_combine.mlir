// The expert GEMM fused with the combine of its output (ep-fuse-gemm-combine):
// a cached dispatch sends new activations along a routing (so the dispatch
// does not fuse with the GEMM), each local expert's rows are multiplied by
// its [256, 256] weights, and the rows go back to their tokens' ranks and
// are summed onto a shared expert's output. epic-run runs the fusion passes
// first: the GEMM and the combine become one ep.gemm_combine step, whose two
// results are checked — the GEMM's against a float64 product, the combine's
// against the reference combine of those rows.
//
//   build/bin/epic-run examples/run/gemm_combine.mlir --check

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  expert_alignment = 32, layout = expanded, max_tokens_per_rank = 64>

func.func @main() {
  %t = run.tokens per_rank [64, 9, 0, 41]
  %x = run.random normal seed 31 rows %t : tensor<?x256xbf16>
  %idx = run.routing experts 16 masked 0.1 seed 32 rows %t : tensor<?x4xi64>
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, !ep.handle<#cfg>

  %x2 = run.random normal seed 33 rows %t : tensor<?x256xbf16>
  %rx2, %h2 = ep.dispatch %x2 cached(%h : !ep.handle<#cfg>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, !ep.handle<#cfg>
  %c4 = arith.constant 4 : index
  %weights = run.random normal scale 0.06 seed 34 rows %c4 : tensor<?x256x256xbf16>
  %experts = tensor.cast %weights : tensor<?x256x256xbf16> to tensor<4x256x256xbf16>
  %y = ep.grouped_gemm %rx2, %experts layout(%h2 : !ep.handle<#cfg>)
      : tensor<?x256xbf16>, tensor<4x256x256xbf16> -> tensor<?x256xbf16>

  %shared = run.random normal seed 35 rows %t : tensor<?x256xbf16>
  %out = ep.combine %y, %h2 bias(%shared : tensor<?x256xbf16>)
      : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>
  run.print %out rows 1 : tensor<?x256xbf16>
  return
}
