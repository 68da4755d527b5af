// An epic-run program: 4 ranks (a virtual world on one GPU) dispatch random
// BF16 tokens with their top-k weights, send the received rows straight back
// and combine them with two biases. Every rank runs @main.
//
//   build/bin/epic-run examples/run/dispatch_combine.mlir --check
//
// prints the counts and rows of every rank and checks each ep op against
// DeepEP's semantics (rows, routing, weights, counts; combine bitwise).

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64>

func.func @main() {
  // Uneven token counts; rank 2 sends nothing.
  %t = run.tokens per_rank [64, 37, 0, 50]
  %x = run.random normal seed 1 rows %t : tensor<?x256xbf16>
  %idx = run.routing experts 16 masked 0.1 seed 2 rows %t : tensor<?x4xi64>
  %w = run.random uniform seed 3 rows %t : tensor<?x4xf32>
  %b0 = run.random normal scale 0.5 seed 4 rows %t : tensor<?x256xbf16>
  %b1 = run.random normal scale 0.5 seed 5 rows %t : tensor<?x256xbf16>

  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#cfg>
  run.print %h : !ep.handle<#cfg>
  run.print %rx rows 2 : tensor<?x256xbf16>
  run.print %ri rows 2 : tensor<?x4xi64>

  // The "experts" are the identity: combine sums one copy per owning rank.
  %y, %yw = ep.combine %rx, %h weights(%rw : tensor<?x4xf32>)
      bias(%b0, %b1 : tensor<?x256xbf16>, tensor<?x256xbf16>)
      : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>, tensor<?x4xf32>
  run.print %y rows 2 : tensor<?x256xbf16>
  run.print %yw rows 2 : tensor<?x4xf32>
  return
}
