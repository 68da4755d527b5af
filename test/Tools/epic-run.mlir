// epic-run without a GPU: the plan and the kernels are made (into the cache
// given), nothing runs; then the same again comes from the cache.
// RUN: rm -rf %t && mkdir -p %t
// RUN: epic-run %s --compile-only --cache-dir=%t/cache | FileCheck %s --check-prefix=COLD
// RUN: env EPIC_COMPILE=/nonexistent epic-run %s --compile-only --cache-dir=%t/cache \
// RUN:   | FileCheck %s --check-prefix=WARM
// RUN: epic-run %s --compile-only --print-plan --cache-dir=%t/cache | FileCheck %s --check-prefix=PLAN
// RUN: not epic-run %s --blocks-per-rank=0 2>&1 | FileCheck %s --check-prefix=USAGE
// RUN: not epic-run %s --backend=gloo 2>&1 | FileCheck %s --check-prefix=BACKEND
// RUN: not env EPIC_COMPILE=/nonexistent epic-run %s --compile-only --cache-dir=%t/empty 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NOCOMPILER

// COLD: kernels of ep.dispatch at {{.*}}epic-run.mlir:[[@LINE+15]]:{{[0-9]+}}: compiled in
// COLD: kernels of ep.combine at {{.*}}: compiled in
// COLD: epic-run: plan and kernels are in {{.*}}cache
// WARM: kernels of ep.dispatch at {{.*}}: loaded in
// WARM: kernels of ep.combine at {{.*}}: loaded in
// PLAN: "epic_run_plan": 1
// USAGE: epic-run: --blocks-per-rank must be a positive integer, got "0"
// BACKEND: epic-run: --backend must be virtual or nccl, got "gloo"
// NOCOMPILER: epic-run: the run plan of {{.*}}epic-run.mlir is not in the kernel cache {{.*}}empty and the compiler is not available here

#cfg = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 16>
func.func @main() {
  %t = run.tokens per_rank [16, 5]
  %x = run.random normal seed 1 rows %t : tensor<?x64xbf16>
  %i = run.routing experts 8 seed 2 rows %t : tensor<?x2xi64>
  %rx, %ri, %h = ep.dispatch %x topk(%i : tensor<?x2xi64>) config #cfg
      : tensor<?x64xbf16> -> tensor<?x64xbf16>, tensor<?x2xi64>, !ep.handle<#cfg>
  %y = ep.combine %rx, %h : tensor<?x64xbf16>, !ep.handle<#cfg> -> tensor<?x64xbf16>
  run.print %y : tensor<?x64xbf16>
  return
}
