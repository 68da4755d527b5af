// Round trip of every run op (the host side of epic-run programs).
// RUN: epic-opt %s | FileCheck %s
// RUN: epic-opt %s | epic-opt | FileCheck %s

// CHECK-LABEL: func.func @main
func.func @main() {
  // CHECK: %[[T:.*]] = run.tokens per_rank [64, 37, 0, 50]
  %t = run.tokens per_rank [64, 37, 0, 50]
  // CHECK: %[[X:.*]] = run.random normal seed 1 rows %[[T]] : tensor<?x256xbf16>
  %x = run.random normal seed 1 rows %t : tensor<?x256xbf16>
  // CHECK: run.random uniform scale 2.500000e-01 seed 3 rows %[[T]] : tensor<?x4xf32>
  %w = run.random uniform scale 0.25 seed 3 rows %t : tensor<?x4xf32>
  // CHECK: run.random normal seed 4 rows %[[T]] : tensor<?x128xf8E4M3FN>
  %f8 = run.random normal scale 1.0 seed 4 rows %t : tensor<?x128xf8E4M3FN>
  // CHECK: %[[I:.*]] = run.routing experts 16 masked 1.000000e-01 seed 2 rows %[[T]] : tensor<?x4xi64>
  %idx = run.routing experts 16 masked 0.1 seed 2 rows %t : tensor<?x4xi64>
  // CHECK: run.routing experts 16 seed 5 rows %[[T]] : tensor<?x4xi64>
  %all = run.routing experts 16 seed 5 rows %t : tensor<?x4xi64>
  // CHECK: run.print %[[X]] rows 2 : tensor<?x256xbf16>
  run.print %x rows 2 : tensor<?x256xbf16>
  // CHECK: run.print %[[I]] : tensor<?x4xi64>
  run.print %idx : tensor<?x4xi64>
  // CHECK: run.print %[[T]] : index
  run.print %t : index
  return
}
