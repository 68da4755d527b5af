// RUN: epic-opt %s --split-input-file --ep-expand | FileCheck %s

// The window's control region has the same offsets for every configuration
// (EPWindow.h), so that one buffer serves calls of any expert count, top-k,
// hidden size or token cap: a call never reads counters that another
// configuration left at its own offsets. Two very different configurations
// here; both must address the barrier epochs at 8192, the token counts at
// 16384, the send's done counter at 41984 and the data region at 53248, and
// with a run-time token cap their window starts with the same 53248 bytes.

#few = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 256, dtype = bf16>

// CHECK-LABEL: gpu.func @few_send(
// CHECK-DAG: arith.constant 8192 : i64
// CHECK-DAG: arith.constant 16384 : i32
// CHECK-DAG: arith.constant 41984 : i32
// CHECK-DAG: arith.constant 53248 : i64
// CHECK: func.func @few(
// CHECK-SAME: epic.window_bytes = 53248
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
// CHECK-DAG: arith.constant 53248 : i64
// CHECK: func.func @many(
// CHECK-SAME: epic.window_bytes = 53248
// CHECK-SAME: epic.window_bytes_per_token = 114944
func.func @many(%x: tensor<?x7168xbf16>, %idx: tensor<?x8xi64>)
    -> (tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#many>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #many
      : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#many>
  return %rx, %ri, %h : tensor<?x7168xbf16>, tensor<?x8xi64>, !ep.handle<#many>
}
