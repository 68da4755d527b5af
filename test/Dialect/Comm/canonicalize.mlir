// RUN: epic-opt %s --split-input-file --canonicalize | FileCheck %s

// CHECK-LABEL: func.func @team_to_world
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[R:.*]]: i32)
func.func @team_to_world(%dc: !comm.dev_comm, %r: i32) -> (i32, i32) {
  %world = comm.team world %dc
  %rail = comm.team rail %dc
  // World ranks are already world ranks.
  %a = comm.team_to_world %world, %r
  // CHECK: %[[RAIL:.*]] = comm.team rail %[[DC]]
  // CHECK: %[[B:.*]] = comm.team_to_world %[[RAIL]], %[[R]]
  %b = comm.team_to_world %rail, %r
  // CHECK: return %[[R]], %[[B]]
  return %a, %b : i32, i32
}

// -----

// CHECK-LABEL: func.func @peer_ptr_of_self
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[OFF:.*]]: i64)
func.func @peer_ptr_of_self(%dc: !comm.dev_comm, %win: !comm.window, %off: i64)
    -> (!llvm.ptr, !llvm.ptr) {
  %lsa = comm.team lsa %dc
  %world = comm.team world %dc
  %me = comm.team_rank %lsa
  %me_world = comm.team_rank %world
  // CHECK: %[[SELF:.*]] = comm.local_ptr %[[WIN]][%[[OFF]]] : !llvm.ptr
  %p = comm.peer_ptr %win[%off], %lsa, %me : !llvm.ptr
  // My world rank is not my LSA rank in general: kept.
  // CHECK: %[[OTHER:.*]] = comm.peer_ptr %[[WIN]][%[[OFF]]], %{{.*}}, %{{.*}} : !llvm.ptr
  %q = comm.peer_ptr %win[%off], %lsa, %me_world : !llvm.ptr
  // CHECK: return %[[SELF]], %[[OTHER]]
  return %p, %q : !llvm.ptr, !llvm.ptr
}

// -----

// CHECK-LABEL: func.func @empty_puts
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[A:.*]]: i64, %[[N:.*]]: i64, %[[PEER:.*]]: i32, %[[SIG:.*]]: i32)
func.func @empty_puts(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i64,
                      %peer: i32, %sig: i32) {
  %world = comm.team world %dc
  %zero = arith.constant 0 : i64
  // Nothing to move and nothing to signal: gone.
  comm.put %zero bytes from %win[%a] to %win[%a] of %world peer %peer via %dc coop warp
  // Only the signal is left.
  // CHECK: comm.signal %[[SIG]] of %{{.*}} peer %[[PEER]] via %[[DC]] coop warp
  comm.put %zero bytes from %win[%a] to %win[%a] of %world peer %peer via %dc signal(%sig) coop warp
  // CHECK-NEXT: comm.signal %[[SIG]] of %{{.*}} peer %[[PEER]] via %[[DC]] add(%[[N]]) coop thread
  comm.put %zero bytes from %win[%a] to %win[%a] of %world peer %peer via %dc signal(%sig) add(%n) coop thread
  // A local counter still counts the put: kept.
  // CHECK-NEXT: comm.put %{{.*}} bytes {{.*}} counter(%[[SIG]]) coop thread
  comm.put %zero bytes from %win[%a] to %win[%a] of %world peer %peer via %dc counter(%sig) coop thread
  // CHECK-NEXT: comm.put %[[N]] bytes
  comm.put %n bytes from %win[%a] to %win[%a] of %world peer %peer via %dc coop thread
  // CHECK-NEXT: return
  return
}

// -----

// CHECK-LABEL: func.func @fences
func.func @fences() {
  // CHECK-NEXT: comm.fence acq_rel scope sys
  // CHECK-NEXT: comm.fence acq_rel scope gpu
  // CHECK-NEXT: comm.fence release scope gpu
  // CHECK-NEXT: return
  comm.fence acq_rel scope sys
  comm.fence acq_rel scope sys
  comm.fence acq_rel scope sys
  comm.fence acq_rel scope gpu
  comm.fence release scope gpu
  return
}

// -----

// Memory effects decide what dies when unused: address arithmetic and plain
// reads go; an acquire load and a signal wait stay (they order later accesses).
// CHECK-LABEL: func.func @dead_code
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[OFF:.*]]: i64, %[[P:.*]]: !llvm.ptr, %[[SIG:.*]]: i32, %[[N:.*]]: i64)
func.func @dead_code(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %p: !llvm.ptr,
                     %sig: i32, %n: i64) {
  // CHECK-NOT: comm.team
  // CHECK-NOT: comm.local_ptr
  // CHECK-NOT: comm.read_signal
  // CHECK-NOT: comm.load relaxed
  %world = comm.team world %dc
  %size = comm.team_size %world
  %q = comm.local_ptr %win[%off] : !llvm.ptr
  %s = comm.read_signal %sig via %dc
  %v = comm.load relaxed scope gpu %p : !llvm.ptr -> i32
  // CHECK: comm.load acquire scope sys %[[P]]
  %w = comm.load acquire scope sys %p : !llvm.ptr -> i32
  // CHECK: comm.wait_signal %[[SIG]] reaches %[[N]]
  %seen = comm.wait_signal %sig reaches %n via %dc coop block
  // CHECK-NEXT: return
  return
}
