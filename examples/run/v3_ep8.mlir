// DeepEP's V3 configuration (hidden 7168, 256 experts, top-8, FP8 with one
// float32 scale per 128 channels, expert alignment 128, expanded layout) on
// a virtual EP8 world, 512 tokens per rank: dispatch, BF16 expert outputs,
// combine. The kernels are the ones the Python API and the benchmarks use.
//
//   build/bin/epic-run examples/run/v3_ep8.mlir --check

#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN,
                 scale_packs = 56, expert_alignment = 128, layout = expanded,
                 max_tokens_per_rank = 512>

func.func @main() {
  %t = run.tokens per_rank [512, 512, 512, 512, 512, 512, 512, 512]
  %x = run.random normal seed 1 rows %t : tensor<?x7168xf8E4M3FN>
  %sf = run.random uniform scale 0.02 seed 2 rows %t : tensor<?x56xf32>
  %idx = run.routing experts 256 seed 3 rows %t : tensor<?x8xi64>
  %w = run.random uniform seed 4 rows %t : tensor<?x8xf32>
  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) scales(%sf : tensor<?x56xf32>)
      weights(%w : tensor<?x8xf32>) config #v3
      : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?xf32>,
        !ep.handle<#v3>
  run.print %h : !ep.handle<#v3>
  %c0 = arith.constant 0 : index
  %rows = tensor.dim %rx, %c0 : tensor<?x7168xf8E4M3FN>
  %y = run.random normal seed 5 rows %rows : tensor<?x7168xbf16>
  %out, %ow = ep.combine %y, %h weights(%rw : tensor<?xf32>)
      : tensor<?x7168xbf16>, !ep.handle<#v3> -> tensor<?x7168xbf16>, tensor<?x8xf32>
  run.print %out rows 1 : tensor<?x7168xbf16>
  return
}
