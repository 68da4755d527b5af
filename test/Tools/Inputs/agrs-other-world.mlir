// An AGRS op whose ranks differ from the program's world (epic-compile-run-plan-agrs.mlir).
func.func @main() {
  %rows = arith.constant 8 : index
  %x = run.random normal seed 1 rows %rows : tensor<?x16xbf16>
  %g = ep.all_gather %x ranks 4 : tensor<?x16xbf16> -> tensor<4x?x16xbf16>
  %h = ep.all_gather %x ranks 2 : tensor<?x16xbf16> -> tensor<2x?x16xbf16>
  return
}
