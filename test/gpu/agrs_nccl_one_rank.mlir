// AGRS and PP ops on a real NCCL communicator of one rank (tools/device/run.sh):
//   epic-run test/gpu/agrs_nccl_one_rank.mlir --backend=nccl --check
// The copy engines write through the window's NVLink (LSA) mapping of the rank itself.
// Here (no GPU) the plan is made; there is no kernel to compile:
// RUN: rm -rf %t
// RUN: epic-run %s --backend=nccl --compile-only --cache-dir=%t | FileCheck %s
// CHECK-NOT: kernels of
// CHECK: epic-run: plan and kernels are in

func.func @main() {
  %rows = arith.constant 40 : index
  %x = run.random normal seed 51 rows %rows : tensor<?x128xbf16>
  %g = ep.all_gather %x ranks 1 : tensor<?x128xbf16> -> tensor<1x?x128xbf16>
  %y = ep.reduce_scatter %x ranks 1 : tensor<?x128xbf16> -> tensor<?x128xbf16>
  %z = ep.pp_send_recv %y ranks 1 to next : tensor<?x128xbf16> -> tensor<?x128xbf16>
  return
}
