// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

// The window's control region has the same offsets for every configuration
// (EPWindow.h), so that one buffer serves calls of any expert count, top-k,
// hidden size or token cap: a call never reads counters that another
// configuration left at its own offsets. Two very different configurations
// here; both must address the barrier epochs at 8192, the token counts at
// 16384, the send's done counter at 41984 and the data region at 77824, and
// with a run-time token cap their window starts with the same 77824 bytes.

#few = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 256, dtype = bf16>

// CHECK-LABEL: gpu.func @few_send(
// CHECK-DAG: arith.constant 8192 : i64
// CHECK-DAG: arith.constant 16384 : i32
// CHECK-DAG: arith.constant 41984 : i32
// CHECK-DAG: arith.constant 77824 : i64
// CHECK: func.func @few(
// CHECK-SAME: epic.window_bytes = 77824
// CHECK-SAME: epic.window_bytes_per_token = 2112
func.func @few(%x: tensor<?x256xbf16>, %idx: tensor<?x1xi64>)
    -> (tensor<?x256xbf16>, tensor<?x1xi64>, !ep.handle<#few>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x1xi64>) config #few
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x1xi64>, !ep.handle<#few>
  return %rx, %ri, %h : tensor<?x256xbf16>, tensor<?x1xi64>, !ep.handle<#few>
}

// -----

#many = #ep.config<ranks = 4, experts = 256, topk = 8, hidden = 7168, dtype = bf16>

// CHECK-LABEL: gpu.func @many_send(
// CHECK-DAG: arith.constant 8192 : i64
// CHECK-DAG: arith.constant 16384 : i32
// CHECK-DAG: arith.constant 41984 : i32
// CHECK-DAG: arith.constant 77824 : i64
// CHECK: func.func @many(
// CHECK-SAME: epic.window_bytes = 77824
// CHECK-SAME: epic.window_bytes_per_token = 114944
func.func @many(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>)
    -> (tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#many>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #many
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#many>
  return %rx, %ri, %h : tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#many>
}

// -----

// The entry barrier carries the op's signature (convert-ep-to-comm's hash of the
// configuration and variant, xor the grid and the token cap): block 0's lanes
// store it into every peer's cell for this rank (at 50688 + parity x 8192: EPWindow.h)
// before their arrival, then compare every rank's cell after the barrier.
// CHECK-LABEL: gpu.func @signed_send(
// CHECK: %[[SIG:.*]] = arith.xori
// CHECK: comm.store relaxed scope sys %[[SIG]], %{{.*}} : i64
// CHECK: comm.red add release scope sys
// CHECK: comm.wait_flag
// CHECK: %[[THEIRS:.*]] = comm.load relaxed scope sys %{{.*}} : !llvm.ptr<1> -> i64
// CHECK: comm.agree %[[SIG]], %[[THEIRS]] rank
#signed = #ep.config<ranks = 2, experts = 2, topk = 1, hidden = 256, dtype = bf16>
func.func @signed(%x: tensor<?x256xbf16>, %idx: tensor<?x1xi64>)
    -> (tensor<?x256xbf16>, tensor<?x1xi64>, !ep.handle<#signed>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x1xi64>) config #signed
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x1xi64>, !ep.handle<#signed>
  return %rx, %ri, %h : tensor<?x256xbf16>, tensor<?x1xi64>, !ep.handle<#signed>
}
