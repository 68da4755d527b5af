// AGRS and PP ops in run plans: steps the runtime executes with copy engines (no kernels).
// RUN: epic-compile %s --run-plan -o - | FileCheck %s
// RUN: rm -rf %t.cache && epic-run %s --compile-only --cache-dir=%t.cache \
// RUN:   | FileCheck %s --check-prefix=KERNELS
// RUN: not epic-compile %S/Inputs/agrs-other-world.mlir --run-plan -o /dev/null 2>&1 \
// RUN:   | FileCheck %s --check-prefix=WORLD

// CHECK: "ranks": 4,
// CHECK: "op": "random",
// CHECK-NEXT: "result": [[X:[0-9]+]],
// The batch: two inputs, two gathered results.
// CHECK: "gathered": [
// CHECK-NEXT: [[G0:[0-9]+]],
// CHECK-NEXT: [[G1:[0-9]+]]
// CHECK-NEXT: ],
// CHECK-NEXT: "inputs": [
// CHECK-NEXT: [[X]],
// CHECK-NEXT: [[A:[0-9]+]]
// CHECK-NEXT: ],
// CHECK: "op": "all_gather"
// CHECK: "input": [[X]],
// CHECK: "op": "reduce_scatter",
// CHECK: "result": [[Y:[0-9]+]]
// CHECK: "op": "print",
// CHECK: "value": [[Y]]
// PP: every rank sends y to its previous neighbour.
// CHECK: "input": [[Y]],
// CHECK: "op": "pp_send_recv",
// CHECK: "result": [[Z:[0-9]+]],
// CHECK-NEXT: "to": "prev"

// No kernel to compile: the plan only.
// KERNELS-NOT: kernels of
// KERNELS: epic-run: plan and kernels are in

// WORLD: error: epic-run: AGRS and PP ops run on the program's world of one NVLink domain; this one has 2 ranks, the world 4 ranks in nodes of 4

func.func @main() {
  %rows = arith.constant 8 : index
  %x = run.random normal seed 1 rows %rows : tensor<?x16xbf16>
  %a = run.random uniform seed 2 rows %rows : tensor<?x4xf32>
  %g:2 = ep.all_gather %x, %a ranks 4
      : tensor<?x16xbf16>, tensor<?x4xf32> -> tensor<4x?x16xbf16>, tensor<4x?x4xf32>
  %y = ep.reduce_scatter %x ranks 4 : tensor<?x16xbf16> -> tensor<?x16xbf16>
  run.print %y : tensor<?x16xbf16>
  %z = ep.pp_send_recv %y ranks 4 to prev : tensor<?x16xbf16> -> tensor<?x16xbf16>
  return
}
