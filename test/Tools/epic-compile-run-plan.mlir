// An epic-run program becomes a run plan: numbered values, one step per op,
// the full configuration of every ep op.
// RUN: split-file %s %t
// RUN: epic-compile %t/one-node.mlir --run-plan -o - | FileCheck %s
// RUN: epic-compile %t/two-nodes.mlir --run-plan -o - | FileCheck %s --check-prefix=NODES

//--- one-node.mlir

#cfg = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 64, dtype = f8E4M3FN,
                  scale_packs = 1, expert_alignment = 4, layout = expanded,
                  max_tokens_per_rank = 16>

// CHECK: "epic_run_plan": 1,
// CHECK-NOT: gpus_per_node
// CHECK: "ranks": 2,
func.func @main() {
  // CHECK: "op": "tokens",
  // CHECK-NEXT: "per_rank": [
  // CHECK-NEXT: 16,
  // CHECK-NEXT: 3
  // CHECK: "result": 0
  %t = run.tokens per_rank [16, 3]
  // CHECK: "dtype": "f8E4M3FN",
  // CHECK: "op": "random",
  // CHECK: "result": 1,
  // CHECK-NEXT: "rows": 0,
  %x = run.random normal seed 1 rows %t : tensor<?x64xf8E4M3FN>
  %sf = run.random uniform seed 2 rows %t : tensor<?x1xf32>
  // CHECK: "masked": 0.25,
  // CHECK-NEXT: "op": "routing",
  %i = run.routing experts 8 masked 0.25 seed 3 rows %t : tensor<?x2xi64>
  // CHECK: "cached": false,
  // CHECK: "op": "dispatch",
  // CHECK: "spec": {
  // CHECK-NEXT: "dtype": "f8E4M3FN",
  // CHECK-NEXT: "expanded": true,
  // CHECK-NEXT: "expert_alignment": 4,
  // CHECK: "scale_packs": 1,
  // CHECK: "zero_padding": true
  %rx, %rsf, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) scales(%sf : tensor<?x1xf32>)
      zero_padding config #cfg
      : tensor<?x64xf8E4M3FN> -> tensor<?x64xf8E4M3FN>, tensor<?x1xf32>, !ep.handle<#cfg>
  // CHECK: "op": "dim",
  // CHECK-NEXT: "result": 8,
  // CHECK-NEXT: "source": 4
  %c0 = arith.constant 0 : index
  %rows = tensor.dim %rx, %c0 : tensor<?x64xf8E4M3FN>
  %y = run.random normal seed 4 rows %rows : tensor<?x64xbf16>
  // CHECK: "biases": [],
  // CHECK: "op": "combine",
  %out = ep.combine %y, %h : tensor<?x64xbf16>, !ep.handle<#cfg> -> tensor<?x64xbf16>
  // CHECK: "op": "dispatch",
  %rx2, %rsf2, %h2 = ep.dispatch %x scales(%sf : tensor<?x1xf32>) cached(%h : !ep.handle<#cfg>)
      config #cfg
      : tensor<?x64xf8E4M3FN> -> tensor<?x64xf8E4M3FN>, tensor<?x1xf32>, !ep.handle<#cfg>
  // CHECK: "op": "print",
  // CHECK-NEXT: "rows": 4,
  // CHECK-NEXT: "value": 10,
  // CHECK-NEXT: "what": "ep.combine
  run.print %out : tensor<?x64xbf16>
  return
}
// CHECK: "values": 14

//--- two-nodes.mlir
// Two nodes of 4 ranks: the plan names the ranks per node, the op's spec its mode.
#cfg = #ep.config<ranks = 8, experts = 16, topk = 2, hidden = 64, dtype = bf16,
                  max_tokens_per_rank = 16, scaleup_ranks = 4, mode = hybrid>
// NODES: "epic_run_plan": 1,
// NODES-NEXT: "gpus_per_node": 4,
// NODES-NEXT: "ranks": 8,
func.func @main() {
  %t = run.tokens per_rank [1, 2, 3, 4, 5, 6, 7, 8]
  %x = run.random normal seed 1 rows %t : tensor<?x64xbf16>
  %i = run.routing experts 16 seed 1 rows %t : tensor<?x2xi64>
  // NODES: "op": "dispatch",
  // NODES: "hybrid": true,
  // NODES: "scaleup_ranks": 4,
  %rx, %ri, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #cfg
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#cfg>
  return
}
