// FP8 dispatch in the expanded layout (the input of a grouped GEMM): one row
// per (token, local expert), each expert's block padded to 16 rows and the
// padding zeroed; random "expert outputs" are combined back with the weights;
// then a cached dispatch resends the same tokens along the same handle.
//
//   build/bin/epic-run examples/run/fp8_expanded.mlir --check

#cfg = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, expert_alignment = 16, layout = expanded,
                  max_tokens_per_rank = 96>

func.func @main() {
  %t = run.tokens per_rank [96, 80, 96, 1, 64, 96, 0, 33]
  %x = run.random normal seed 11 rows %t : tensor<?x512xf8E4M3FN>
  %sf = run.random uniform scale 0.01 seed 12 rows %t : tensor<?x4xf32>
  %idx = run.routing experts 64 masked 0.05 seed 13 rows %t : tensor<?x6xi64>
  %w = run.random uniform seed 14 rows %t : tensor<?x6xf32>

  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) scales(%sf : tensor<?x4xf32>)
      weights(%w : tensor<?x6xf32>) zero_padding config #cfg
      : tensor<?x512xf8E4M3FN> -> tensor<?x512xf8E4M3FN>, tensor<?x4xf32>, tensor<?xf32>,
        !ep.handle<#cfg>
  run.print %h : !ep.handle<#cfg>
  run.print %rx rows 1 : tensor<?x512xf8E4M3FN>

  // Expert outputs: one BF16 row per received (token, expert) row.
  %c0 = arith.constant 0 : index
  %rows = tensor.dim %rx, %c0 : tensor<?x512xf8E4M3FN>
  %y = run.random normal seed 15 rows %rows : tensor<?x512xbf16>
  %out, %ow = ep.combine %y, %h weights(%rw : tensor<?xf32>)
      : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>, tensor<?x6xf32>
  run.print %out rows 1 : tensor<?x512xbf16>

  // Same routing, no count exchange: the rows land where they did before
  // (the printed checksums equal the first dispatch's).
  %rx2, %rsf2, %h2 = ep.dispatch %x scales(%sf : tensor<?x4xf32>) cached(%h : !ep.handle<#cfg>)
      zero_padding config #cfg
      : tensor<?x512xf8E4M3FN> -> tensor<?x512xf8E4M3FN>, tensor<?x4xf32>, !ep.handle<#cfg>
  run.print %rx2 rows 1 : tensor<?x512xf8E4M3FN>
  return
}
