// epic-run on the NCCL backend (a real communicator and symmetric window of
// one rank): dispatch with weights, combine with one bias, checked.
//   epic-run test/gpu/run_nccl_one_rank.mlir --backend=nccl --check
// Here (no GPU) the plan and the NCCL-backend kernels are made:
// RUN: rm -rf %t
// RUN: epic-run %s --backend=nccl --compile-only --cache-dir=%t | FileCheck %s
// CHECK: kernels of ep.dispatch at {{.*}}: compiled
// CHECK: kernels of ep.combine at {{.*}}: compiled
#cfg = #ep.config<ranks = 1, experts = 8, topk = 4, hidden = 1024, dtype = bf16,
                  max_tokens_per_rank = 200>
func.func @main() {
  %t = run.tokens per_rank [173]
  %x = run.random normal seed 21 rows %t : tensor<?x1024xbf16>
  %idx = run.routing experts 8 masked 0.2 seed 22 rows %t : tensor<?x4xi64>
  %w = run.random uniform seed 23 rows %t : tensor<?x4xf32>
  %b = run.random normal seed 24 rows %t : tensor<?x1024xbf16>
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#cfg>
  %y, %yw = ep.combine %rx, %h weights(%rw : tensor<?x4xf32>) bias(%b : tensor<?x1024xbf16>)
      : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>, tensor<?x4xf32>
  run.print %h : !ep.handle<#cfg>
  run.print %y rows 1 : tensor<?x1024xbf16>
  return
}
