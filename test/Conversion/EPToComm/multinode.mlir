// convert-ep-to-comm across nodes (direct mode; scaleup_ranks = 2 of 4 ranks: two nodes).
// Ranks are world ranks; ranks of the node are reached through peer pointers (world team),
// the others by GIN: records staged in the warp's ring in the window and put, counts by
// put_value + signal, done flags by signals; a hierarchical entry barrier. Hybrid mode:
// hybrid.mlir.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm=one-pass-dispatch=true \
// RUN:   | FileCheck %s

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 64, scaleup_ranks = 2>

// CHECK-LABEL: gpu.func @dispatch_send(
// CHECK-SAME: %[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window
// CHECK: %[[WORLD:.*]] = comm.team world %[[DC]]
// CHECK: %[[ME:.*]] = comm.team_rank %[[WORLD]]
// This rank's node: me / 2.
// CHECK: %[[NODE:.*]] = arith.divui %[[ME]], %c2_i32 : i32
// The entry barrier. Block 0 meets its node as on one node (its own epoch cell, block 0's
// arrival counter), then the other node's rank of the same LSA rank: the signature tagged
// with the epoch, put with signal 0 ...
// CHECK: %[[PASSED:.*]] = comm.local_ptr %[[WIN]][%c67072_i64]
// CHECK: scf.if
// CHECK: %[[EPOCH_CELL:.*]] = comm.local_ptr %[[WIN]][%c8192_i64]
// CHECK: comm.red add release scope sys %{{.*}}, %{{.*}} : i64
// CHECK: comm.wait_flag %{{.*}} ge %{{.*}} rank %[[ME]] scope sys : !llvm.ptr<1>, i64
// CHECK: gpu.barrier
// CHECK: %[[TAGGED:.*]] = arith.ori
// CHECK: arith.cmpi ne, %{{.*}}, %[[NODE]] : i32
// CHECK: comm.put_value %[[TAGGED]] to %[[WIN]][%{{.*}}] of %[[WORLD]] peer %{{.*}} via %[[DC]] signal(%[[ENTRY:.*]]) context(%{{.*}}) coop thread : i64
// ... and waits until signal 0 counts every other node once per epoch (raised by every rail
// peer: no single peer to name).
// CHECK: comm.wait_signal %[[ENTRY]] reaches %{{.*}} via %[[DC]] context(%{{.*}}) coop thread
// CHECK: gpu.barrier
// Signatures: the node's as on one node, a rail peer's once its cell shows this epoch.
// CHECK: comm.agree
// CHECK: comm.wait_flag %{{.*}} ge %{{.*}} rank %[[ME]] peer %{{.*}} scope sys : !llvm.ptr<1>, i64
// CHECK: comm.agree %[[TAGGED]]
// CHECK: gpu.barrier
// CHECK: llvm.store %{{.*}}, %[[EPOCH_CELL]]
// CHECK: comm.store release scope gpu %{{.*}}, %[[PASSED]] : i64
// The rank's other blocks wait for block 0.
// CHECK: } else {
// CHECK: comm.wait_flag %[[PASSED]] ne %{{.*}} rank %[[ME]] scope gpu : !llvm.ptr<1>, i64
// One warp per token, its n-th token in staging slot n mod 2: a slot used before (n >= 2)
// is flushed first, where the token goes to another node.
// CHECK: scf.for %[[TOKEN:.*]] = %[[WARP:.*]] to %{{.*}} step %[[WARPS:.*]] : i32
// CHECK: %[[REMOTE:.*]] = arith.xori %{{.*}}, %{{.*}} : i32
// CHECK: %[[STAGED:.*]] = arith.cmpi ne, %[[REMOTE]], %c0_i32
// CHECK: %[[SINCE:.*]] = arith.subi %[[TOKEN]], %[[WARP]] : i32
// CHECK: %[[N:.*]] = arith.divui %[[SINCE]], %[[WARPS]] : i32
// CHECK: %[[REUSE:.*]] = arith.cmpi uge, %[[N]], %c2_i32
// CHECK: %[[FLUSH:.*]] = arith.andi %[[STAGED]], %[[REUSE]] : i1
// CHECK: scf.if %[[FLUSH]] {
// CHECK: comm.flush via %[[DC]] context(%{{.*}}) coop warp
// The ring follows the data region: 77824 + 64 x 4 x 1072, 1072-byte slots.
// CHECK: arith.remui %[[N]], %c2_i32
// CHECK: %[[SLOT:.*]] = arith.muli %{{.*}}, %c1072_i64 : i64
// CHECK: %[[STAGING:.*]] = arith.addi %c352256_i64, %[[SLOT]] : i64
// A master lane's record: in the peer's window when it is in the node, else the staging slot.
// CHECK: scf.if %{{.*}} -> (!llvm.ptr<1>) {
// CHECK: arith.cmpi eq, %{{.*}}, %[[NODE]] : i32
// CHECK: scf.if %{{.*}} -> (!llvm.ptr<1>) {
// CHECK: comm.peer_ptr %[[WIN]][%{{.*}}], %[[WORLD]], %{{.*}} : !llvm.ptr<1>
// CHECK: } else {
// CHECK: comm.local_ptr %[[WIN]][%[[STAGING]]]
// The staged record, once written, goes to each master of another node.
// CHECK: scf.while (%{{.*}} = %[[REMOTE]])
// CHECK: comm.put %c1072_i64{{.*}} bytes from %[[WIN]][%[[STAGING]]] to %[[WIN]][%{{.*}}] of %[[WORLD]] peer %{{.*}} via %[[DC]] context(%{{.*}}) coop warp
// After its last token every warp's puts have read their sources.
// CHECK: comm.flush via %[[DC]] context(%{{.*}}) coop warp
// CHECK: comm.atomic_rmw add acq_rel scope sys
// The last block takes back the entry release.
// CHECK: comm.store relaxed scope gpu %{{.*}}, %{{.*}} : i64
// Expert counts: a store in the node, a put_value (non-zero only) to another.
// CHECK: comm.store relaxed scope sys
// CHECK: } else {
// CHECK: comm.put_value %{{.*}} to %[[WIN]][%{{.*}}] of %[[WORLD]] peer %{{.*}} via %[[DC]] context(%{{.*}}) coop thread : i32
// They have left before any count signal is posted.
// CHECK: gpu.barrier
// CHECK-NEXT: arith.constant 0 : i32
// CHECK-NEXT: comm.flush via %[[DC]] context(%{{.*}}) coop block
// Token counts: a release store, or a put_value raising signal 8 + me.
// CHECK: %[[COUNT_SIGNAL:.*]] = arith.addi %c8_i32{{.*}}, %[[ME]] : i32
// CHECK: comm.store release scope sys
// CHECK: } else {
// CHECK: comm.put_value %{{.*}} signal(%[[COUNT_SIGNAL]]) context(%{{.*}}) coop thread : i32
// Every source's count: a flag in the node, else signal 8 + src (waited for, reset).
// CHECK: comm.wait_flag %{{.*}} ne %{{.*}} rank %[[ME]] peer %{{.*}} scope sys
// CHECK: } else {
// CHECK: %[[FROM:.*]] = arith.addi %c8_i32{{.*}}, %[[SRC:.*]] : i32
// CHECK: comm.wait_signal %[[FROM]] reaches %c1_i64 peer %[[SRC]] via %[[DC]] context(%{{.*}}) coop thread
// CHECK: comm.reset_signal %[[FROM]] via %[[DC]]
// CHECK: comm.load relaxed scope sys
// CHECK: gpu.return
// The copy: a record serves every destination, so the master slot is the highest slot whose
// expert this rank owns.
// CHECK-LABEL: gpu.func @dispatch_copy(
// CHECK: nvvm.vote.sync ballot
// CHECK: llvm.intr.ctlz
// CHECK: gpu.return
// Staging per warp (two 1072-byte slots) and 8 + 2 x 4 GIN signals.
// CHECK: func.func @dispatch(
// CHECK-SAME: epic.gin_signals = 16 : i64
// CHECK-SAME: epic.kernels = ["dispatch_send", "dispatch_copy"]
// CHECK-SAME: epic.window_bytes = 352256 : i64, epic.window_bytes_per_warp = 2144 : i64
func.func @dispatch(%x: tensor<?x512xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h : tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}

// -----

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 64, scaleup_ranks = 2>

// A warp per received row (no shares: a record for another node is staged whole). The record
// goes into the staging slot for another node, else into the source's window; then, for
// another node, it is put: the row and the K weights (1024 + 16 bytes).
// CHECK-LABEL: gpu.func @combine_send(
// CHECK-SAME: %[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window
// CHECK: %[[WORLD:.*]] = comm.team world %[[DC]]
// CHECK: %[[NODE:.*]] = arith.divui %{{.*}}, %c2_i32 : i32
// CHECK: scf.for %[[ROW:.*]] = %{{.*}} to %{{.*}} step %{{.*}} : i32
// CHECK: %[[SRC:.*]] = arith.divui
// CHECK: %[[OFFSET:.*]] = arith.addi %c77824_i64{{.*}}, %{{.*}} : i64
// CHECK: %[[OTHER:.*]] = arith.cmpi ne, %{{.*}}, %[[NODE]] : i32
// CHECK: scf.if %{{.*}} {
// CHECK: comm.flush via %[[DC]] context(%{{.*}}) coop warp
// CHECK: %[[STAGING:.*]] = arith.addi %c352256_i64, %{{.*}} : i64
// CHECK: %[[RECORD:.*]] = scf.if %[[OTHER]] -> (!llvm.ptr<1>) {
// CHECK: comm.local_ptr %[[WIN]][%[[STAGING]]]
// CHECK: } else {
// CHECK: comm.peer_ptr %[[WIN]][%[[OFFSET]]], %[[WORLD]], %[[SRC]] : !llvm.ptr<1>
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: scf.if %[[OTHER]] {
// CHECK-NEXT: %[[BYTES:.*]] = arith.constant 1040 : i64
// CHECK-NEXT: arith.constant 0 : i32
// CHECK-NEXT: comm.put %[[BYTES]] bytes from %[[WIN]][%[[STAGING]]] to %[[WIN]][%[[OFFSET]]] of %[[WORLD]] peer %[[SRC]] via %[[DC]] context(%{{.*}}) coop warp
// CHECK: comm.flush via %[[DC]] context(%{{.*}}) coop warp
// Done: a release store in the node, signal 8 + 4 + me to another node ...
// CHECK: comm.store release scope sys
// CHECK: } else {
// CHECK: comm.signal %{{.*}} of %[[WORLD]] peer %{{.*}} via %[[DC]] context(%{{.*}}) coop thread
// ... and every peer's: a flag in the node, else signal 12 + src, waited for and reset.
// CHECK: comm.wait_flag %{{.*}} eq
// CHECK: } else {
// CHECK: %[[DONE:.*]] = arith.addi %c12_i32{{.*}}, %[[PEER:.*]] : i32
// CHECK: comm.wait_signal %[[DONE]] reaches %c1_i64 peer %[[PEER]] via
// CHECK: comm.reset_signal %[[DONE]]
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @combine_reduce(
// CHECK-NOT: comm.put
// CHECK: gpu.return
// CHECK: func.func @combine(
// CHECK-SAME: epic.gin_signals = 16 : i64
// CHECK-SAME: epic.window_bytes_per_warp = 2144 : i64
func.func @combine(%y: tensor<?x512xbf16>, %h: !ep.handle<#cfg>, %w: tensor<?x4xf32>)
    -> (tensor<?x512xbf16>, tensor<?x4xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>)
      : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>, tensor<?x4xf32>
  return %out, %ow : tensor<?x512xbf16>, tensor<?x4xf32>
}

// -----

// A run-time token cap: the staging ring starts after the data region of that cap
// (77824 + Tmax x 4288). A cached dispatch across nodes is send + copy even where the
// one-pass scatter is asked for (it writes other ranks' tensors: one address space).
#dyn = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  scaleup_ranks = 2>

// CHECK-LABEL: gpu.func @cached_send(
// CHECK-NOT: comm.peer_params
// CHECK: %[[DATA:.*]] = arith.muli %{{.*}}, %c4288_i64 : i64
// CHECK: %[[BASE:.*]] = arith.addi %c77824_i64, %[[DATA]] : i64
// CHECK: %[[SLOT:.*]] = arith.muli %{{.*}}, %c1072_i64 : i64
// CHECK: arith.addi %[[BASE]], %[[SLOT]] : i64
// CHECK: comm.put
// CHECK-LABEL: gpu.func @cached_copy(
// CHECK: func.func @cached(
// CHECK-SAME: epic.kernels = ["cached_send", "cached_copy"]
// CHECK-SAME: epic.window_bytes = 77824 : i64, epic.window_bytes_per_token = 4288 : i64, epic.window_bytes_per_warp = 2144 : i64
func.func @cached(%x: tensor<?x512xbf16>, %h: !ep.handle<#dyn>)
    -> (tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#dyn>) {
  %rx, %ri, %h2 = ep.dispatch %x cached(%h : !ep.handle<#dyn>) config #dyn
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#dyn>
  return %rx, %ri, %h2 : tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#dyn>
}
