// convert-ep-to-comm of ops whose tensors lie in the symmetric window (window_outputs): the
// one-pass kernels on any backend, without the launch's table of every rank's record. Each
// kernel that touches a peer's tensors publishes its own record in its window (offset 67328,
// EPWindow.h kPublishedRecord) with the window's address after it (+1024), meets every rank at
// an entry barrier, reaches a peer's tensor by its NVLink pointer at the field's offset from
// the peer's window, and meets every rank again before it ends.
// RUN: epic-opt %s --convert-ep-to-comm | FileCheck %s
// The nccl backend takes them (comm.peer_params would be refused there), without spills.
// RUN: epic-compile %s --backend=nccl -o %t
// RUN: FileCheck %s --check-prefix=JSON < %t.json

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK-NOT: comm.peer_params
// CHECK: gpu.func @dispatch_count(
// CHECK: gpu.func @dispatch_scatter(
// Publish: the record's words, then the window's own address.
// CHECK: arith.constant 67328 : i64
// CHECK: comm.local_ptr
// CHECK: %[[BASE:.*]] = comm.local_ptr %{{.*}}[%{{.*}}]
// CHECK-NEXT: llvm.ptrtoint %[[BASE]]
// CHECK-NEXT: arith.constant 68352 : i64
// The entry barrier.
// CHECK: comm.red add release scope sys
// CHECK: comm.wait_flag
// A peer's field: its published record, the field rebased on its window.
// CHECK: %[[REC:.*]] = comm.peer_ptr %{{.*}}[%c67328_i64], %{{.*}}, %[[PEER:.*]] : !llvm.ptr<1>
// CHECK: %[[WBASE:.*]] = llvm.load %{{.*}} : !llvm.ptr<1> -> i64
// CHECK: %[[RAW:.*]] = llvm.load %{{.*}} : !llvm.ptr<1> -> !llvm.ptr<1>
// CHECK: %[[ADDR:.*]] = llvm.ptrtoint %[[RAW]]
// CHECK: %[[OFF:.*]] = arith.subi %[[ADDR]], %[[WBASE]]
// CHECK: comm.peer_ptr %{{.*}}[%[[OFF]]], %{{.*}}, %[[PEER]]
// The barrier before the end.
// CHECK: comm.red add release scope sys
// CHECK: comm.wait_flag
// CHECK: gpu.return
// A cached dispatch in the window: the scatter alone, with both barriers.
// CHECK: gpu.func @cached_scatter(
// CHECK: comm.wait_flag
// CHECK: comm.peer_ptr %{{.*}}[%c67328_i64]
// CHECK: comm.wait_flag
// CHECK: gpu.return
// The combine: one gather; a null recv_row_of_slot is tested before it is rebased.
// CHECK: gpu.func @combine_gather(
// CHECK: comm.wait_flag
// CHECK: llvm.ptrtoint
// CHECK: arith.cmpi ne
// CHECK: comm.wait_flag
// CHECK: gpu.return
// CHECK: func.func @dispatch(
// CHECK-SAME: epic.cooperative = 1
// CHECK-SAME: epic.kernels = ["dispatch_count", "dispatch_scatter"]
// CHECK: func.func @cached(
// CHECK-SAME: epic.cooperative = 1
// CHECK-SAME: epic.kernels = ["cached_scatter"]
// CHECK: func.func @combine(
// CHECK-SAME: epic.cooperative = 1
// CHECK-SAME: epic.kernels = ["combine_gather"]

// JSON-COUNT-4: "spill_store_bytes": 0
// JSON-NOT: "spill_store_bytes"

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 64>

func.func @dispatch(%x: tensor<?x512xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x4xf32>)
    -> (tensor<?x512xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#cfg>) {
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      window_outputs config #cfg
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, tensor<?x4xf32>,
        !ep.handle<#cfg>
  return %rx, %ri, %rw, %h : tensor<?x512xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#cfg>
}

func.func @cached(%x: tensor<?x512xbf16>, %h: !ep.handle<#cfg>)
    -> (tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) {
  %rx, %ri, %h2 = ep.dispatch %x cached(%h : !ep.handle<#cfg>) window_outputs config #cfg
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h2 : tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}

func.func @combine(%y: tensor<?x512xbf16>, %h: !ep.handle<#cfg>, %w: tensor<?x4xf32>)
    -> (tensor<?x512xbf16>, tensor<?x4xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>) window_outputs
      : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>, tensor<?x4xf32>
  return %out, %ow : tensor<?x512xbf16>, tensor<?x4xf32>
}
