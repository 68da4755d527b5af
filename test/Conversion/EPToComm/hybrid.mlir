// convert-ep-to-comm in hybrid mode (scaleup_ranks = 2 of 4 ranks: two nodes). A token crosses
// the network once per destination node, to its forwarder there (the rail peer: the same LSA
// rank), which sends it on over NVLink; the combine goes back the same way, summed per node at
// the forwarder. The forwarder's state is the handle's (fwd_src_metadata, fwd_counts).
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 64, scaleup_ranks = 2, mode = hybrid>

// Phase 1: one warp per token, one record per destination node. The destination of slot j is
// the forwarder of its expert's node: node(rank) x 2 + lsa(me).
// CHECK-LABEL: gpu.func @dispatch_send(
// CHECK-SAME: %[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window
// CHECK: %[[WORLD:.*]] = comm.team world %[[DC]]
// CHECK: %[[ME:.*]] = comm.team_rank %[[WORLD]]
// CHECK: comm.wait_signal
// CHECK: scf.for %[[TOKEN:.*]] = %{{.*}} to %{{.*}} step %{{.*}} : i32
// CHECK: %[[RANK:.*]] = arith.divsi %{{.*}}, %c4_i32{{.*}} : i32
// CHECK: %[[DNODE:.*]] = arith.divui %[[RANK]], %c2_i32{{.*}} : i32
// CHECK: %[[LSA:.*]] = arith.remui %[[ME]], %c2_i32{{.*}} : i32
// CHECK: arith.muli %[[DNODE]], %c2_i32{{.*}} : i32
// CHECK: nvvm.match.sync any
// The record goes into the forwarder's forward region [my node][slot], after the receive
// region of 4 x 64 records: (4 + node) x 64 + slot records of 1072 bytes past 77824. A
// forwarder in another node gets the staged record by a put.
// CHECK: %[[FWD:.*]] = arith.addi %c4_i64, %{{.*}} : i64
// CHECK: arith.muli %{{.*}}, %c1072_i64{{.*}} : i64
// CHECK: comm.put %c1072_i64{{.*}} bytes from %[[WIN]][%{{.*}}] to %[[WIN]][%{{.*}}] of %[[WORLD]] peer %{{.*}} via %[[DC]] context(%{{.*}}) coop warp
// CHECK: comm.flush via %[[DC]] context(%{{.*}}) coop warp
// The last block: to each forwarder (a rail peer, or itself) its count, with signal 8 + me;
// no per-expert counts (the forwarders count those) ...
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK-NOT: comm.red
// CHECK: comm.put_value %{{.*}} signal(%{{.*}}) context(%{{.*}}) coop thread : i32
// ... and each rail peer's count, into the handle's fwd_counts (record field 18).
// CHECK: %[[FWD_COUNTS_FIELD:.*]] = llvm.getelementptr %{{.*}}[%c144_i64]
// CHECK: comm.wait_signal %{{.*}} reaches %c1_i64 peer %{{.*}} via %[[DC]]
// CHECK: comm.reset_signal
// CHECK: gpu.return

// Phase 2: one warp per item of the forward region (the rail peers' counts in node order);
// only NVLink: no put, put_value or signal.
// CHECK-LABEL: gpu.func @dispatch_forward(
// CHECK-NOT: comm.put
// CHECK-NOT: comm.signal
// CHECK: gpu.shuffle  up
// CHECK: scf.for %[[Q:.*]] = %{{.*}} to %{{.*}} step %{{.*}} : i32
// CHECK: nvvm.vote.sync  ballot
// CHECK: llvm.intr.ctpop
// A master lane takes its slot at its destination, and counts per (node peer, local expert).
// CHECK: comm.atomic_rmw add relaxed scope gpu
// CHECK: comm.red add relaxed scope gpu
// The receivers' metadata goes into the record, between two warp syncs, before the copy.
// CHECK: nvvm.bar.warp.sync
// CHECK: nvvm.bar.warp.sync
// CHECK: comm.peer_ptr %{{.*}}, %{{.*}}, %{{.*}} : !llvm.ptr<1>
// The node's count exchange, as on one node, over NVLink.
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK: comm.store release scope sys
// CHECK: comm.wait_flag %{{.*}} ne %{{.*}} rank %{{.*}} peer %{{.*}} scope sys
// CHECK-NOT: comm.put
// CHECK-NOT: comm.wait_signal
// CHECK: gpu.return

// The copy: rows grouped by forwarder index (2 prefix sums), each group's records [N x Tmax]
// apart; column 1 is item x K + master.
// CHECK-LABEL: gpu.func @dispatch_copy(
// CHECK: %c2_i32
// CHECK: gpu.return
// CHECK: func.func @dispatch(
// CHECK-SAME: epic.gin_signals = 16 : i64
// CHECK-SAME: epic.kernels = ["dispatch_send", "dispatch_forward", "dispatch_copy"]
// CHECK-SAME: "fwd_src_metadata", "fwd_counts"
// The data region: the larger of (4 + 2) x 64 dispatch records and 4 x (2 + 1) x 64 combine
// records (1040 bytes): 77824 + 798720.
// CHECK-SAME: epic.window_bytes = 876544 : i64, epic.window_bytes_per_warp = 2144 : i64
func.func @dispatch(%x: tensor<?x512xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h : tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}

// -----

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 64, scaleup_ranks = 2, mode = hybrid>

// Stage 1: every received row into its forwarder's [master slot][item] record, in this node
// (column 0's source gives lsa(src); column 1 is item x K + master): NVLink only, then the
// node's done flags.
// CHECK-LABEL: gpu.func @combine_send(
// CHECK-NOT: comm.put
// CHECK: scf.for
// CHECK: arith.divui %{{.*}}, %c4_i32{{.*}} : i32
// CHECK: arith.remui %{{.*}}, %c4_i32{{.*}} : i32
// CHECK: comm.peer_ptr
// CHECK-NOT: comm.signal
// CHECK: comm.wait_flag %{{.*}} eq
// CHECK-NOT: comm.wait_signal
// CHECK: gpu.return

// Stage 2: per item, the node's partial rows summed and put back to the origin (a local store
// for its own node's items), then done signals with the rail peers.
// CHECK-LABEL: gpu.func @combine_forward(
// CHECK: scf.for
// CHECK: scf.while
// CHECK: arith.extf
// CHECK: comm.put %{{.*}} bytes from
// CHECK: comm.flush via %{{.*}} coop warp
// CHECK: comm.signal
// CHECK: comm.wait_signal
// CHECK: gpu.return

// Stage 3 at the origin: biases, then one record per node at its node master slot.
// CHECK-LABEL: gpu.func @combine_reduce(
// CHECK: arith.divui %{{.*}}, %c2_i32{{.*}} : i32
// CHECK: nvvm.match.sync any
// CHECK: gpu.return
// CHECK: func.func @combine(
// CHECK-SAME: epic.kernels = ["combine_send", "combine_forward", "combine_reduce"]
func.func @combine(%y: tensor<?x512xbf16>, %h: !ep.handle<#cfg>, %w: tensor<?x4xf32>)
    -> (tensor<?x512xbf16>, tensor<?x4xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>)
      : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>, tensor<?x4xf32>
  return %out, %ow : tensor<?x512xbf16>, tensor<?x4xf32>
}
