// convert-comm-to-nvvm, backend=virtual: R ranks on one GPU. Ranks and window
// pointers are inlined arithmetic on the block index and the descriptors;
// copies, waits and barriers call the virtual shim; no NCCL anywhere.
// RUN: epic-opt %s --split-input-file --allow-unregistered-dialect --convert-comm-to-nvvm=backend=virtual --reconcile-unrealized-casts --cse | FileCheck %s
// CHECK-NOT: __epic_nccl

// The R ranks are N nodes of M GPUs (lsa_size), numbered node-major.
// CHECK-LABEL: gpu.module @teams
gpu.module @teams {
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[WIN:.*]]: !llvm.ptr, %[[OFF:.*]]: i64, %[[R:.*]]: i32)
  gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %r: i32) kernel {
    // R and M are fields 0 and 5 of EpicVirtualComm (VirtualWorld.def); the world rank is
    // w = blockIdx.x / (gridDim.x / R).
    // CHECK: %[[RF:.*]] = llvm.getelementptr %[[DC]][0, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(i32, i32, i32, i32, i32, i32, ptr, ptr, ptr, ptr, i32, i32, i32, i32)>
    // CHECK: %[[NR:.*]] = llvm.load %[[RF]] : !llvm.ptr -> i32
    // CHECK: %[[MF:.*]] = llvm.getelementptr %[[DC]][0, 5] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(i32, i32, i32, i32, i32, i32, ptr, ptr, ptr, ptr, i32, i32, i32, i32)>
    // CHECK: %[[M:.*]] = llvm.load %[[MF]] : !llvm.ptr -> i32
    // CHECK: %[[GRID:.*]] = nvvm.read.ptx.sreg.nctaid.x : i32
    // CHECK: %[[BLOCK:.*]] = nvvm.read.ptx.sreg.ctaid.x : i32
    // CHECK: %[[PER:.*]] = llvm.udiv %[[GRID]], %[[NR]] : i32
    // CHECK: %[[ME:.*]] = llvm.udiv %[[BLOCK]], %[[PER]] : i32
    // The LSA team is the own node, {M, w % M, 1} (kind 1), then w, M and R.
    // CHECK: %[[LR:.*]] = llvm.urem %[[ME]], %[[M]] : i32
    // CHECK: %[[ONE:.*]] = llvm.mlir.constant(1 : i32) : i32
    // CHECK: %[[T0:.*]] = llvm.insertvalue %[[M]], %{{.*}}[0]
    // CHECK: %[[T1:.*]] = llvm.insertvalue %[[LR]], %[[T0]][1]
    // CHECK: %[[T2:.*]] = llvm.insertvalue %[[ONE]], %[[T1]][2]
    // CHECK: %[[T3:.*]] = llvm.insertvalue %[[ONE]], %[[T2]][3]
    // CHECK: %[[T4:.*]] = llvm.insertvalue %[[ME]], %[[T3]][4]
    // CHECK: %[[T5:.*]] = llvm.insertvalue %[[M]], %[[T4]][5]
    // CHECK: %[[LSA:.*]] = llvm.insertvalue %[[NR]], %[[T5]][6]
    %lsa = comm.team lsa %dc
    // A peer's world rank, w + (peer - rank) * stride, must be in the own node: the shim traps
    // naming both ranks otherwise (given M and R).
    // CHECK: %[[W:.*]] = llvm.extractvalue %[[LSA]][4]
    // CHECK: %[[TR:.*]] = llvm.extractvalue %[[LSA]][1]
    // CHECK: %[[TS:.*]] = llvm.extractvalue %[[LSA]][2]
    // CHECK: %[[D:.*]] = llvm.sub %[[R]], %[[TR]] : i32
    // CHECK: %[[DS:.*]] = llvm.mul %[[D]], %[[TS]] : i32
    // CHECK: %[[PEER:.*]] = llvm.add %[[W]], %[[DS]] : i32
    // CHECK: %[[CM:.*]] = llvm.extractvalue %[[LSA]][5]
    // CHECK: %[[CR:.*]] = llvm.extractvalue %[[LSA]][6]
    // CHECK: llvm.call @__epic_virtual_check_lsa_peer(%[[W]], %[[PEER]], %[[CM]], %[[CR]]) : (i32, i32, i32, i32) -> ()
    // Its slice: base + world_peer * stride + offset.
    // CHECK: %[[BASEF:.*]] = llvm.getelementptr %[[WIN]][0, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(ptr, i64, i32, i32)>
    // CHECK: %[[BASE:.*]] = llvm.load %[[BASEF]] : !llvm.ptr -> !llvm.ptr
    // CHECK: %[[STRIDEF:.*]] = llvm.getelementptr %[[WIN]][0, 1]
    // CHECK: %[[STRIDE:.*]] = llvm.load %[[STRIDEF]] : !llvm.ptr -> i64
    // CHECK: %[[PEER64:.*]] = llvm.sext %[[PEER]] : i32 to i64
    // CHECK: %[[SKIP:.*]] = llvm.mul %[[PEER64]], %[[STRIDE]] : i64
    // CHECK: %[[BYTES:.*]] = llvm.add %[[SKIP]], %[[OFF]] : i64
    // CHECK: %[[PTR:.*]] = llvm.getelementptr %[[BASE]][%[[BYTES]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
    // CHECK: llvm.addrspacecast %[[PTR]] : !llvm.ptr to !llvm.ptr<1>
    %p = comm.peer_ptr %win[%off], %lsa, %r : !llvm.ptr<1>
    // The own slice: the rank comes from the window's own R; nothing to check.
    // CHECK: %[[NRF:.*]] = llvm.getelementptr %[[WIN]][0, 2]
    // CHECK: llvm.load %[[NRF]] : !llvm.ptr -> i32
    // CHECK-NOT: llvm.call
    %q = comm.local_ptr %win[%off] : !llvm.ptr
    // The rail is GPU w % M of every node: {R / M, w / M, M} (kind 2).
    // CHECK: %[[NR2:.*]] = llvm.load %[[RF]] : !llvm.ptr -> i32
    // CHECK: %[[M2:.*]] = llvm.load %[[MF]] : !llvm.ptr -> i32
    // CHECK: %[[PER2:.*]] = llvm.udiv %[[GRID]], %[[NR2]] : i32
    // CHECK: %[[ME2:.*]] = llvm.udiv %[[BLOCK]], %[[PER2]] : i32
    // CHECK: %[[N:.*]] = llvm.udiv %[[NR2]], %[[M2]] : i32
    // CHECK: %[[NODE:.*]] = llvm.udiv %[[ME2]], %[[M2]] : i32
    // CHECK: %[[TWO:.*]] = llvm.mlir.constant(2 : i32) : i32
    // CHECK: %[[U0:.*]] = llvm.insertvalue %[[N]], %{{.*}}[0]
    // CHECK: %[[U1:.*]] = llvm.insertvalue %[[NODE]], %[[U0]][1]
    // CHECK: %[[U2:.*]] = llvm.insertvalue %[[M2]], %[[U1]][2]
    // CHECK: %[[U3:.*]] = llvm.insertvalue %[[TWO]], %[[U2]][3]
    // CHECK: %[[U4:.*]] = llvm.insertvalue %[[ME2]], %[[U3]][4]
    // CHECK: %[[U5:.*]] = llvm.insertvalue %[[M2]], %[[U4]][5]
    // CHECK: %[[RAIL:.*]] = llvm.insertvalue %[[NR2]], %[[U5]][6]
    // CHECK: %[[RAILSIZE:.*]] = llvm.extractvalue %[[RAIL]][0]
    %rail = comm.team rail %dc
    %n = comm.team_size %rail
    // CHECK: "test.use"(%{{.*}}, %{{.*}}, %[[RAILSIZE]])
    "test.use"(%p, %q, %n) : (!llvm.ptr<1>, !llvm.ptr, i32) -> ()
    gpu.return
  }

  // The world is {R, w, 1} (kind 0); its peer pointers are checked too.
  // CHECK: gpu.func @world(%[[DC:.*]]: !llvm.ptr, %[[WIN:.*]]: !llvm.ptr, %[[OFF:.*]]: i64, %[[R:.*]]: i32)
  gpu.func @world(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %r: i32) kernel {
    // CHECK: %[[NR:.*]] = llvm.load %{{.*}} : !llvm.ptr -> i32
    // CHECK: %[[M:.*]] = llvm.load %{{.*}} : !llvm.ptr -> i32
    // CHECK: %[[PER:.*]] = llvm.udiv %{{.*}}, %[[NR]] : i32
    // CHECK: %[[ME:.*]] = llvm.udiv %{{.*}}, %[[PER]] : i32
    // CHECK-DAG: %[[ZERO:.*]] = llvm.mlir.constant(0 : i32) : i32
    // CHECK-DAG: %[[ONE:.*]] = llvm.mlir.constant(1 : i32) : i32
    // CHECK: %[[T0:.*]] = llvm.insertvalue %[[NR]], %{{.*}}[0]
    // CHECK: %[[T1:.*]] = llvm.insertvalue %[[ME]], %[[T0]][1]
    // CHECK: %[[T2:.*]] = llvm.insertvalue %[[ONE]], %[[T1]][2]
    // CHECK: %[[T3:.*]] = llvm.insertvalue %[[ZERO]], %[[T2]][3]
    %world = comm.team world %dc
    // CHECK: llvm.call @__epic_virtual_check_lsa_peer(
    %p = comm.peer_ptr %win[%off], %world, %r : !llvm.ptr<1>
    "test.use"(%p) : (!llvm.ptr<1>) -> ()
    gpu.return
  }

  // A kernel that must not call checks without a call: its report goes to the runtime's
  // mapped slots.
  // CHECK: gpu.func @no_calls(
  gpu.func @no_calls(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %r: i32) kernel
      attributes {comm.inline_waits} {
    %world = comm.team world %dc
    // CHECK: llvm.call @__epic_virtual_check_lsa_peer_inline(
    %p = comm.peer_ptr %win[%off], %world, %r : !llvm.ptr<1>
    "test.use"(%p) : (!llvm.ptr<1>) -> ()
    gpu.return
  }
}

// -----

// Kernels that take a device communicator are written per rank: block ids
// and the grid size along x are those within the calling block's rank.
// CHECK-LABEL: gpu.module @block_ids
gpu.module @block_ids {
  // CHECK: gpu.func @per_rank(%[[DC:.*]]: !llvm.ptr)
  gpu.func @per_rank(%dc: !comm.dev_comm) kernel {
    // CHECK: %[[R:.*]] = llvm.load %[[DC]] : !llvm.ptr -> i32
    // CHECK: %[[GRID:.*]] = nvvm.read.ptx.sreg.nctaid.x : i32
    // CHECK: %[[PER:.*]] = llvm.udiv %[[GRID]], %[[R]] : i32
    // CHECK: %[[BLOCK:.*]] = nvvm.read.ptx.sreg.ctaid.x : i32
    // CHECK: %[[IN:.*]] = llvm.urem %[[BLOCK]], %[[PER]] : i32
    // CHECK: %[[BID:.*]] = arith.index_castui %[[IN]] : i32 to index
    // CHECK: %[[NB:.*]] = arith.index_castui %[[PER]] : i32 to index
    // CHECK-NOT: gpu.block_id x
    // CHECK: %[[Y:.*]] = gpu.block_id y
    // CHECK: "test.use"(%[[BID]], %[[NB]], %[[Y]])
    %b = gpu.block_id x
    %n = gpu.grid_dim x
    %y = gpu.block_id y
    "test.use"(%b, %n, %y) : (index, index, index) -> ()
    gpu.return
  }
  // Without a communicator nothing changes.
  // CHECK: gpu.func @plain()
  // CHECK: gpu.block_id x
  gpu.func @plain() kernel {
    %b = gpu.block_id x
    "test.use"(%b) : (index) -> ()
    gpu.return
  }
}

// -----

// Copies, waits and barriers are loops: they call the virtual shim.
// CHECK-LABEL: gpu.module @calls
// CHECK-DAG: llvm.func @__epic_virtual_put_warp(!llvm.ptr, i32, i32, i32, i32, i32, !llvm.ptr, i64, !llvm.ptr, i64, i64, i32, i32, i64, i32, i32)
// CHECK-DAG: llvm.func @__epic_virtual_wait_signal_block(!llvm.ptr, i32, i32, i64, i64, i32) -> i64
// CHECK-DAG: llvm.func @__epic_virtual_wait_signal_warp(!llvm.ptr, i32, i32, i64, i64, i32) -> i64
// CHECK-DAG: llvm.func @__epic_virtual_barrier_block(!llvm.ptr, i32, i32, i64)
// CHECK-DAG: llvm.func @__epic_virtual_signal_thread(
// CHECK-DAG: llvm.func @__epic_virtual_flush_warp(!llvm.ptr, i32)
gpu.module @calls {
  // CHECK: gpu.func @k(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %[[P:.*]]: i32, %{{.*}}: i32)
  gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window, %n: i64, %p: i32, %sig: i32) kernel {
    %world = comm.team world %dc
    %c0 = arith.constant 0 : i64
    %i0 = arith.constant 0 : i32
    // CHECK: llvm.call @__epic_virtual_put_warp(
    comm.put %n bytes from %win[%c0] to %win[%c0] of %world peer %p via %dc signal(%sig) coop warp
    // CHECK: llvm.call @__epic_virtual_signal_thread(
    comm.signal %sig of %world peer %p via %dc coop thread
    // CHECK: llvm.call @__epic_virtual_flush_warp(
    comm.flush via %dc coop warp
    // Without a peer the report names none (-1); with one, that rank.
    // CHECK: %[[NONE:.*]] = llvm.mlir.constant(-1 : i32) : i32
    // CHECK: llvm.call @__epic_virtual_wait_signal_block(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[NONE]])
    %s = comm.wait_signal %sig reaches %n via %dc coop block timeout_ms 1000
    // CHECK: llvm.call @__epic_virtual_wait_signal_warp(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[P]])
    %t = comm.wait_signal %sig reaches %n peer %p via %dc coop warp
    // CHECK: %[[KIND:.*]] = llvm.extractvalue %{{.*}}[3]
    // CHECK: llvm.call @__epic_virtual_barrier_block(%{{.*}}, %[[KIND]], %{{.*}}, %{{.*}})
    comm.barrier %world via %dc index %i0 coop block
    gpu.return
  }
}

// -----

// All ranks share one launch: rank r's record is base + r * stride.
// CHECK-LABEL: gpu.module @params
gpu.module @params {
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[TABLE:.*]]: !llvm.ptr<1>)
  gpu.func @k(%dc: !comm.dev_comm, %table: !llvm.ptr<1>) kernel {
    // CHECK: %[[PER:.*]] = llvm.udiv %{{.*}}, %{{.*}} : i32
    // CHECK: %[[ME:.*]] = llvm.udiv %{{.*}}, %[[PER]] : i32
    // CHECK: %[[ME64:.*]] = llvm.sext %[[ME]] : i32 to i64
    // CHECK: %[[STRIDE:.*]] = llvm.mlir.constant(48 : i64) : i64
    // CHECK: %[[BYTES:.*]] = llvm.mul %[[ME64]], %[[STRIDE]] : i64
    // CHECK: %[[MINE:.*]] = llvm.getelementptr %[[TABLE]][%[[BYTES]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
    // CHECK: llvm.load %[[MINE]] : !llvm.ptr<1> -> i32
    %mine = comm.rank_params %table stride 48 via %dc : !llvm.ptr<1>
    %v = llvm.load %mine : !llvm.ptr<1> -> i32
    "test.use"(%v) : (i32) -> ()
    gpu.return
  }
}

// -----

// A peer's parameter record: the same table, at the peer's index.
// CHECK-LABEL: gpu.module @peer_params
gpu.module @peer_params {
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[TABLE:.*]]: !llvm.ptr<1>, %[[PEER:.*]]: i32)
  gpu.func @k(%dc: !comm.dev_comm, %table: !llvm.ptr<1>, %peer: i32) kernel {
    // CHECK-DAG: %[[STRIDE:.*]] = llvm.mlir.constant(128 : i64) : i64
    // CHECK-DAG: %[[PEER64:.*]] = llvm.sext %[[PEER]] : i32 to i64
    // CHECK: %[[BYTES:.*]] = llvm.mul %[[PEER64]], %[[STRIDE]] : i64
    // CHECK: %[[THEIRS:.*]] = llvm.getelementptr %[[TABLE]][%[[BYTES]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
    // CHECK: llvm.load %[[THEIRS]] : !llvm.ptr<1> -> i32
    %theirs = comm.peer_params %table stride 128 peer %peer via %dc : !llvm.ptr<1>
    %v = llvm.load %theirs : !llvm.ptr<1> -> i32
    "test.use"(%v) : (i32) -> ()
    gpu.return
  }
}
