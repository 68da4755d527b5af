// convert-comm-to-nvvm, backend=virtual: R ranks on one GPU. Ranks and window
// pointers are inlined arithmetic on the block index and the descriptors;
// copies, waits and barriers call the virtual shim; no NCCL anywhere.
// RUN: epic-opt %s --split-input-file --allow-unregistered-dialect --convert-comm-to-nvvm=backend=virtual --reconcile-unrealized-casts --cse | FileCheck %s
// CHECK-NOT: __epic_nccl

// CHECK-LABEL: gpu.module @teams
gpu.module @teams {
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[WIN:.*]]: !llvm.ptr, %[[OFF:.*]]: i64, %[[R:.*]]: i32)
  gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %r: i32) kernel {
    // R is the first field of EpicVirtualComm; rank = blockIdx.x / (gridDim.x / R).
    // CHECK: %[[RF:.*]] = llvm.getelementptr %[[DC]][0, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(i32, i32, i32, i32, i32, i32, ptr, ptr, ptr)>
    // CHECK: %[[NR:.*]] = llvm.load %[[RF]] : !llvm.ptr -> i32
    // CHECK: %[[GRID:.*]] = nvvm.read.ptx.sreg.nctaid.x : i32
    // CHECK: %[[BLOCK:.*]] = nvvm.read.ptx.sreg.ctaid.x : i32
    // CHECK: %[[PER:.*]] = llvm.udiv %[[GRID]], %[[NR]] : i32
    // CHECK: %[[ME:.*]] = llvm.udiv %[[BLOCK]], %[[PER]] : i32
    // LSA = world = all R ranks, stride 1.
    // CHECK: %[[ONE:.*]] = llvm.mlir.constant(1 : i32) : i32
    // CHECK: %[[T0:.*]] = llvm.insertvalue %[[NR]], %{{.*}}[0]
    // CHECK: %[[T1:.*]] = llvm.insertvalue %[[ME]], %[[T0]][1]
    // CHECK: %[[T2:.*]] = llvm.insertvalue %[[ONE]], %[[T1]][2]
    %lsa = comm.team lsa %dc
    // A peer's slice: base + world_peer * stride + offset.
    // CHECK: %[[BASEF:.*]] = llvm.getelementptr %[[WIN]][0, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(ptr, i64, i32, i32)>
    // CHECK: %[[BASE:.*]] = llvm.load %[[BASEF]] : !llvm.ptr -> !llvm.ptr
    // CHECK: %[[STRIDEF:.*]] = llvm.getelementptr %[[WIN]][0, 1]
    // CHECK: %[[STRIDE:.*]] = llvm.load %[[STRIDEF]] : !llvm.ptr -> i64
    // CHECK: %[[PEER64:.*]] = llvm.sext %{{.*}} : i32 to i64
    // CHECK: %[[SKIP:.*]] = llvm.mul %[[PEER64]], %[[STRIDE]] : i64
    // CHECK: %[[BYTES:.*]] = llvm.add %[[SKIP]], %[[OFF]] : i64
    // CHECK: %[[PTR:.*]] = llvm.getelementptr %[[BASE]][%[[BYTES]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
    // CHECK: llvm.addrspacecast %[[PTR]] : !llvm.ptr to !llvm.ptr<1>
    %p = comm.peer_ptr %win[%off], %lsa, %r : !llvm.ptr<1>
    // The own slice: the rank comes from the window's own R.
    // CHECK: %[[NRF:.*]] = llvm.getelementptr %[[WIN]][0, 2]
    // CHECK: llvm.load %[[NRF]] : !llvm.ptr -> i32
    %q = comm.local_ptr %win[%off] : !llvm.ptr
    %rail = comm.team rail %dc
    // A rail is one rank on one GPU.
    // CHECK: %[[RAILSIZE:.*]] = llvm.extractvalue %{{.*}}[0]
    %n = comm.team_size %rail
    "test.use"(%p, %q, %n) : (!llvm.ptr<1>, !llvm.ptr, i32) -> ()
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
// CHECK-DAG: llvm.func @__epic_virtual_wait_signal_block(!llvm.ptr, i32, i32, i64, i64) -> i64
// CHECK-DAG: llvm.func @__epic_virtual_barrier_block(!llvm.ptr, i32, i32, i64)
// CHECK-DAG: llvm.func @__epic_virtual_signal_thread(
// CHECK-DAG: llvm.func @__epic_virtual_flush_warp(!llvm.ptr, i32)
gpu.module @calls {
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
    // CHECK: llvm.call @__epic_virtual_wait_signal_block(
    %s = comm.wait_signal %sig reaches %n via %dc coop block timeout_ms 1000
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
