// Round-trip of every comm op and type, printed and re-parsed (also through
// the generic form).
// RUN: epic-opt %s | epic-opt | FileCheck %s
// RUN: epic-opt %s --mlir-print-op-generic | epic-opt | FileCheck %s

// CHECK-LABEL: func.func @teams_and_pointers
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[OFF:.*]]: i64, %[[PEER:.*]]: i32)
func.func @teams_and_pointers(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %peer: i32)
    -> (i32, i32, i32, !llvm.ptr, !llvm.ptr<1>) {
  // CHECK: %[[WORLD:.*]] = comm.team world %[[DC]]
  %world = comm.team world %dc
  // CHECK: %[[LSA:.*]] = comm.team lsa %[[DC]]
  %lsa = comm.team lsa %dc
  // CHECK: %[[RAIL:.*]] = comm.team rail %[[DC]]
  %rail = comm.team rail %dc
  // CHECK: comm.team_rank %[[LSA]]
  %me = comm.team_rank %lsa
  // CHECK: comm.team_size %[[WORLD]]
  %n = comm.team_size %world
  // CHECK: comm.team_to_world %[[RAIL]], %[[PEER]]
  %w = comm.team_to_world %rail, %peer
  // CHECK: comm.local_ptr %[[WIN]][%[[OFF]]] : !llvm.ptr
  %p = comm.local_ptr %win[%off] : !llvm.ptr
  // CHECK: comm.peer_ptr %[[WIN]][%[[OFF]]], %[[LSA]], %[[PEER]] : !llvm.ptr<1>
  %q = comm.peer_ptr %win[%off], %lsa, %peer : !llvm.ptr<1>
  // CHECK: comm.rank_params %{{.*}} stride 64 via %[[DC]] : !llvm.ptr<1>
  %params = comm.rank_params %q stride 64 via %dc : !llvm.ptr<1>
  // CHECK: comm.peer_params %{{.*}} stride 64 peer %{{.*}} via %[[DC]] : !llvm.ptr<1>
  %theirs = comm.peer_params %q stride 64 peer %peer via %dc : !llvm.ptr<1>
  return %me, %n, %w, %p, %q : i32, i32, i32, !llvm.ptr, !llvm.ptr<1>
}

// CHECK-LABEL: func.func @network
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[A:.*]]: i64, %[[B:.*]]: i64, %[[N:.*]]: i64, %[[PEER:.*]]: i32, %[[SIG:.*]]: i32, %[[CTX:.*]]: i32)
func.func @network(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %b: i64, %n: i64,
                   %peer: i32, %sig: i32, %ctx: i32) -> (i64, i64) {
  %world = comm.team world %dc
  // CHECK: comm.put %[[N]] bytes from %[[WIN]][%[[A]]] to %[[WIN]][%[[B]]] of %{{.*}} peer %[[PEER]] via %[[DC]] coop thread
  comm.put %n bytes from %win[%a] to %win[%b] of %world peer %peer via %dc coop thread
  // CHECK: comm.put %[[N]] bytes from %[[WIN]][%[[A]]] to %[[WIN]][%[[B]]] of %{{.*}} peer %[[PEER]] via %[[DC]] signal(%[[SIG]]) coop warp
  comm.put %n bytes from %win[%a] to %win[%b] of %world peer %peer via %dc signal(%sig) coop warp
  // CHECK: comm.put {{.*}} signal(%[[SIG]]) add(%[[N]]) counter(%[[SIG]]) context(%[[CTX]]) coop block
  comm.put %n bytes from %win[%a] to %win[%b] of %world peer %peer via %dc
      signal(%sig) add(%n) counter(%sig) context(%ctx) coop block
  // CHECK: comm.put_value %[[N]] to %[[WIN]][%[[B]]] of %{{.*}} peer %[[PEER]] via %[[DC]] coop thread : i64
  comm.put_value %n to %win[%b] of %world peer %peer via %dc coop thread : i64
  // CHECK: comm.put_value %[[SIG]] to %[[WIN]][%[[B]]] of %{{.*}} peer %[[PEER]] via %[[DC]] signal(%[[SIG]]) context(%[[CTX]]) coop warp : i32
  comm.put_value %sig to %win[%b] of %world peer %peer via %dc signal(%sig) context(%ctx) coop warp : i32
  // CHECK: comm.signal %[[SIG]] of %{{.*}} peer %[[PEER]] via %[[DC]] coop thread
  comm.signal %sig of %world peer %peer via %dc coop thread
  // CHECK: comm.signal %[[SIG]] of %{{.*}} peer %[[PEER]] via %[[DC]] add(%[[N]]) context(%[[CTX]]) coop warp
  comm.signal %sig of %world peer %peer via %dc add(%n) context(%ctx) coop warp
  // The default bound (100 s) is not printed.
  // CHECK: comm.wait_signal %[[SIG]] reaches %[[N]] via %[[DC]] coop block
  // CHECK-NOT: timeout_ms
  %s0 = comm.wait_signal %sig reaches %n via %dc coop block
  // CHECK: comm.wait_signal %[[SIG]] reaches %[[N]] via %[[DC]] context(%[[CTX]]) coop thread timeout_ms 5000
  %s1 = comm.wait_signal %sig reaches %n via %dc context(%ctx) coop thread timeout_ms 5000
  // The rank the signal is waited from, for the timeout report.
  // CHECK: comm.wait_signal %[[SIG]] reaches %[[N]] peer %[[PEER]] via %[[DC]] context(%[[CTX]]) coop warp timeout_ms 100
  %s2 = comm.wait_signal %sig reaches %n peer %peer via %dc context(%ctx) coop warp timeout_ms 100
  // CHECK: comm.wait_signal %[[SIG]] reaches %[[N]] peer %[[PEER]] via %[[DC]] coop block
  %s3 = comm.wait_signal %sig reaches %n peer %peer via %dc coop block
  // CHECK: comm.read_signal %[[SIG]] via %[[DC]] context(%[[CTX]])
  %v = comm.read_signal %sig via %dc context(%ctx)
  // CHECK: comm.reset_signal %[[SIG]] via %[[DC]]
  comm.reset_signal %sig via %dc
  // CHECK: comm.flush via %[[DC]] coop warp
  comm.flush via %dc coop warp
  // CHECK: comm.flush via %[[DC]] context(%[[CTX]]) coop block
  comm.flush via %dc context(%ctx) coop block
  return %s0, %v : i64, i64
}

// CHECK-LABEL: func.func @synchronization
// CHECK-SAME: (%[[DC:.*]]: !comm.dev_comm, %[[P:.*]]: !llvm.ptr, %[[G:.*]]: !llvm.ptr<1>, %[[V:.*]]: i32, %[[W:.*]]: i64)
func.func @synchronization(%dc: !comm.dev_comm, %p: !llvm.ptr, %g: !llvm.ptr<1>, %v: i32, %w: i64) {
  %lsa = comm.team lsa %dc
  %c0 = arith.constant 0 : i32
  // CHECK: comm.barrier %{{.*}} via %[[DC]] index %{{.*}} coop block
  comm.barrier %lsa via %dc index %c0 coop block
  // CHECK: comm.barrier %{{.*}} via %[[DC]] index %{{.*}} coop warp timeout_ms 10
  comm.barrier %lsa via %dc index %c0 coop warp timeout_ms 10
  // CHECK: comm.fence acq_rel scope sys
  comm.fence acq_rel scope sys
  // CHECK: comm.fence release scope gpu
  comm.fence release scope gpu
  // CHECK: comm.fence sc scope cta
  comm.fence sc scope cta
  // CHECK: comm.load acquire scope sys %[[P]] : !llvm.ptr -> i32
  %a = comm.load acquire scope sys %p : !llvm.ptr -> i32
  // CHECK: comm.load relaxed scope gpu %[[G]] : !llvm.ptr<1> -> i64
  %b = comm.load relaxed scope gpu %g : !llvm.ptr<1> -> i64
  // CHECK: comm.store release scope sys %[[V]], %[[P]] : i32, !llvm.ptr
  comm.store release scope sys %v, %p : i32, !llvm.ptr
  // CHECK: comm.store relaxed scope cluster %[[W]], %[[G]] : i64, !llvm.ptr<1>
  comm.store relaxed scope cluster %w, %g : i64, !llvm.ptr<1>
  // CHECK: comm.red add release scope sys %[[V]], %[[P]] : i32, !llvm.ptr
  comm.red add release scope sys %v, %p : i32, !llvm.ptr
  // CHECK: comm.red max relaxed scope gpu %[[W]], %[[G]] : i64, !llvm.ptr<1>
  comm.red max relaxed scope gpu %w, %g : i64, !llvm.ptr<1>
  // CHECK: comm.red or relaxed scope gpu %[[V]], %[[P]]
  comm.red or relaxed scope gpu %v, %p : i32, !llvm.ptr
  // CHECK: comm.atomic_rmw add acq_rel scope gpu %[[V]], %[[P]] : i32, !llvm.ptr
  %old = comm.atomic_rmw add acq_rel scope gpu %v, %p : i32, !llvm.ptr
  // CHECK: comm.atomic_rmw exch relaxed scope sys %[[W]], %[[G]] : i64, !llvm.ptr<1>
  %old2 = comm.atomic_rmw exch relaxed scope sys %w, %g : i64, !llvm.ptr<1>
  // CHECK: comm.atomic_cas acq_rel scope sys %[[P]], %[[V]], %[[V]] : !llvm.ptr, i32
  %old3 = comm.atomic_cas acq_rel scope sys %p, %v, %v : !llvm.ptr, i32
  // CHECK: comm.wait_flag %[[P]] ge %[[V]] scope sys : !llvm.ptr, i32
  %seen = comm.wait_flag %p ge %v scope sys : !llvm.ptr, i32
  // CHECK: comm.wait_flag %[[G]] eq %[[W]] scope gpu timeout_ms 250 : !llvm.ptr<1>, i64
  %seen2 = comm.wait_flag %g eq %w scope gpu timeout_ms 250 : !llvm.ptr<1>, i64
  // The waiting rank and the peer waited for name the wait in its timeout report.
  // CHECK: comm.wait_flag %[[P]] ne %[[V]] rank %[[V]] peer %[[V]] scope sys : !llvm.ptr, i32
  %seen3 = comm.wait_flag %p ne %v rank %v peer %v scope sys : !llvm.ptr, i32
  // An mbarrier's phase (its shared address as an i32, the parity as an i1).
  // CHECK: %[[PARITY:.*]] = arith.constant true
  // CHECK: comm.wait_phase %[[V]] parity %[[PARITY]]{{$}}
  // CHECK: comm.wait_phase %[[V]] parity %[[PARITY]] rank %[[V]] timeout_ms 40
  %parity = arith.constant true
  comm.wait_phase %v parity %parity
  comm.wait_phase %v parity %parity rank %v timeout_ms 40
  // Ranks that must agree: this rank's value, a peer's, both ranks for the report.
  // CHECK: comm.agree %[[W]], %[[W]] rank %[[V]] peer %[[V]] : i64
  comm.agree %w, %w rank %v peer %v : i64
  return
}

// The comm types can be kernel arguments.
// CHECK-LABEL: gpu.module @kernels
gpu.module @kernels {
  // CHECK: gpu.func @notify(%{{.*}}: !comm.dev_comm, %{{.*}}: !comm.window) kernel
  gpu.func @notify(%dc: !comm.dev_comm, %win: !comm.window) kernel {
    %lsa = comm.team lsa %dc
    %c0 = arith.constant 0 : i32
    comm.barrier %lsa via %dc index %c0 coop block
    gpu.return
  }
}
