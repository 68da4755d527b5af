// What epic-compile --run-plan refuses, with the program's source locations.
// RUN: split-file %s %t
// RUN: not epic-compile %t/no-main.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=NOMAIN
// RUN: not epic-compile %t/arguments.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=ARGS
// RUN: not epic-compile %t/unsupported.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=OP
// RUN: not epic-compile %t/worlds.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=WORLD
// RUN: not epic-compile %t/nodes.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=NODES
// RUN: not epic-compile %t/tokens.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=TOKENS
// RUN: not epic-compile %t/recursion.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=RECURSION
// RUN: not epic-compile %t/external.mlir --run-plan -o - 2>&1 | FileCheck %s --check-prefix=EXTERNAL

// NOMAIN: an epic-run program needs a func.func @main
// ARGS: arguments.mlir:1:1: error: epic-run: @main takes no arguments and returns nothing
// OP: unsupported.mlir:3:8: error: epic-run: 'arith.addi' is not supported in a run program
// WORLD: worlds.mlir:9:18: error: epic-run: every ep op of a program runs on one EP world; this one has 4 ranks, an earlier one 2
// NODES: nodes.mlir:9:18: error: epic-run: every ep op of a program runs on one EP world; this one has 2 ranks per node (scaleup_ranks), an earlier one 4
// TOKENS: tokens.mlir:3:8: error: epic-run: per_rank has 3 entries but the program's ep ops run on 2 ranks
// RECURSION: recursion.mlir:2:3: error: epic-run: @f calls itself (recursion has no plan)
// EXTERNAL: external.mlir:3:3: error: epic-run: @g is not a function with a body in this module

//--- no-main.mlir
func.func @other() {
  return
}
//--- arguments.mlir
func.func @main(%t: index) {
  return
}
//--- unsupported.mlir
func.func @main() {
  %t = run.tokens per_rank [1]
  %u = arith.addi %t, %t : index
  return
}
//--- worlds.mlir
#a = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 16>
#b = #ep.config<ranks = 4, experts = 8, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 16>
func.func @main() {
  %t = run.tokens per_rank [1, 1]
  %x = run.random normal seed 1 rows %t : tensor<?x64xbf16>
  %i = run.routing experts 8 seed 1 rows %t : tensor<?x2xi64>
  %rx, %ri, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #a
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#a>
  %sx, %si, %g = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #b
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#b>
  return
}
//--- nodes.mlir
#a = #ep.config<ranks = 8, experts = 16, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 16, scaleup_ranks = 4>
#b = #ep.config<ranks = 8, experts = 16, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 16, scaleup_ranks = 2>
func.func @main() {
  %t = run.tokens per_rank [1, 1, 1, 1, 1, 1, 1, 1]
  %x = run.random normal seed 1 rows %t : tensor<?x64xbf16>
  %i = run.routing experts 16 seed 1 rows %t : tensor<?x2xi64>
  %rx, %ri, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #a
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#a>
  %sx, %si, %g = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #b
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#b>
  return
}
//--- tokens.mlir
#a = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 16>
func.func @main() {
  %t = run.tokens per_rank [1, 1, 1]
  %x = run.random normal seed 1 rows %t : tensor<?x64xbf16>
  %i = run.routing experts 8 seed 1 rows %t : tensor<?x2xi64>
  %rx, %ri, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #a
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#a>
  return
}
//--- recursion.mlir
func.func @f() {
  func.call @f() : () -> ()
  return
}
func.func @main() {
  func.call @f() : () -> ()
  return
}
//--- external.mlir
func.func private @g()
func.func @main() {
  func.call @g() : () -> ()
  return
}
