// AGRS and PP ops in a program: an all-gather (one tensor, then a batch of
// two), a reduce-scatter and a ring send/recv on 4 virtual ranks. No kernel runs: the runtime's copy engines
// move every rank's rows into every peer's window (docs/semantics.md, "AGRS
// sessions"); --check compares each result with the reference bit for bit (the
// reduce-scatter's sum, f32 in rank order, is done by the runtime on the host
// from the blocks the copy engines moved; Python's reduce_scatter sums on the GPU).
//
//   build/bin/epic-run examples/run/agrs.mlir --check

func.func @main() {
  %rows = arith.constant 24 : index
  %x = run.random normal seed 41 rows %rows : tensor<?x96xbf16>
  %g = ep.all_gather %x ranks 4 : tensor<?x96xbf16> -> tensor<4x?x96xbf16>
  run.print %g rows 1 : tensor<4x?x96xbf16>

  %a = run.random uniform seed 42 rows %rows : tensor<?x32xf32>
  %b:2 = ep.all_gather %x, %a ranks 4
      : tensor<?x96xbf16>, tensor<?x32xf32> -> tensor<4x?x96xbf16>, tensor<4x?x32xf32>

  // Rank r gets rows [6r, 6r + 6) of the sum over ranks.
  %y = ep.reduce_scatter %x ranks 4 : tensor<?x96xbf16> -> tensor<?x96xbf16>
  run.print %y rows 1 : tensor<?x96xbf16>

  // PP: every rank sends its block to its next ring neighbour (the copy
  // engines, through the receiver's slots): rank r gets rank r - 1's.
  %z = ep.pp_send_recv %y ranks 4 to next : tensor<?x96xbf16> -> tensor<?x96xbf16>
  %w = ep.pp_send_recv %z ranks 4 to prev : tensor<?x96xbf16> -> tensor<?x96xbf16>
  run.print %w rows 1 : tensor<?x96xbf16>
  return
}
