// Kernels of the GPU smoke test of the comm lowering (test/gpu/comm_smoke.cu
// runs them on an H200, once compiled for the virtual backend with 8 ranks on
// one GPU and once for the nccl backend with one rank). Written per rank: in
// the virtual backend gpu.block_id x / gpu.grid_dim x are the block index and
// count within the rank.
// RUN: epic-compile %s --backend=virtual -o %t.v && FileCheck %s < %t.v.json
// RUN: epic-compile %s --backend=nccl -o %t.n && FileCheck %s < %t.n.json
// CHECK-DAG: "name": "lsa_ring"
// CHECK-DAG: "name": "put_signal"
// CHECK-DAG: "name": "barrier_rounds"
// CHECK-DAG: "name": "wait_forever"
// CHECK-DAG: "name": "wait_forever_inline"

module attributes {gpu.container_module} {
  gpu.module @kernels {
    // Each rank copies `vectors` 16-byte vectors from the start of its window
    // slice into the next rank's slice right after them, over LSA pointers;
    // then every block counts its arrival on the next rank's flag (release),
    // thread 0 waits until all blocks of the previous rank arrived here
    // (acquire, bounded), and the ranks meet at an LSA barrier.
    gpu.func @lsa_ring(%dc: !comm.dev_comm, %win: !comm.window, %flags: !comm.window,
                       %vectors: i32) kernel {
      %lsa = comm.team lsa %dc
      %me = comm.team_rank %lsa
      %size = comm.team_size %lsa
      %c0_i32 = arith.constant 0 : i32
      %c1_i32 = arith.constant 1 : i32
      %c0 = arith.constant 0 : index
      %c0_i64 = arith.constant 0 : i64
      %c16_i64 = arith.constant 16 : i64
      %next0 = arith.addi %me, %c1_i32 : i32
      %next = arith.remui %next0, %size : i32
      %block = gpu.block_id x
      %blocks = gpu.grid_dim x
      %tid = gpu.thread_id x
      %threads = gpu.block_dim x
      %first0 = arith.muli %block, %threads : index
      %first = arith.addi %first0, %tid : index
      %step = arith.muli %blocks, %threads : index
      %n = arith.index_cast %vectors : i32 to index
      %n64 = arith.extui %vectors : i32 to i64
      %dst_base = arith.muli %n64, %c16_i64 : i64
      scf.for %i = %first to %n step %step {
        %i64 = arith.index_cast %i : index to i64
        %off = arith.muli %i64, %c16_i64 : i64
        %dst_off = arith.addi %dst_base, %off : i64
        %src = comm.local_ptr %win[%off] : !llvm.ptr<1>
        %dst = comm.peer_ptr %win[%dst_off], %lsa, %next : !llvm.ptr<1>
        %v = llvm.load %src {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
        llvm.store %v, %dst {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
      }
      gpu.barrier
      %is_first = arith.cmpi eq, %tid, %c0 : index
      scf.if %is_first {
        %flag_next = comm.peer_ptr %flags[%c0_i64], %lsa, %next : !llvm.ptr<1>
        comm.red add release scope sys %c1_i32, %flag_next : i32, !llvm.ptr<1>
        %flag = comm.local_ptr %flags[%c0_i64] : !llvm.ptr<1>
        %blocks32 = arith.index_cast %blocks : index to i32
        %seen = comm.wait_flag %flag ge %blocks32 scope sys timeout_ms 10000 : !llvm.ptr<1>, i32
      }
      gpu.barrier
      %index = arith.index_cast %block : index to i32
      comm.barrier %lsa via %dc index %index coop block
      gpu.return
    }

    // Block 0 of each rank puts `bytes` bytes from the start of its slice to
    // the next rank's slice at offset `bytes`, with signal 0; then waits for
    // the signal that the previous rank's put raised here.
    gpu.func @put_signal(%dc: !comm.dev_comm, %win: !comm.window, %bytes: i64) kernel {
      %world = comm.team world %dc
      %me = comm.team_rank %world
      %size = comm.team_size %world
      %c1_i32 = arith.constant 1 : i32
      %c0_i32 = arith.constant 0 : i32
      %c0_i64 = arith.constant 0 : i64
      %c1_i64 = arith.constant 1 : i64
      %c0 = arith.constant 0 : index
      %next0 = arith.addi %me, %c1_i32 : i32
      %next = arith.remui %next0, %size : i32
      %block = gpu.block_id x
      %is_first = arith.cmpi eq, %block, %c0 : index
      scf.if %is_first {
        comm.put %bytes bytes from %win[%c0_i64] to %win[%bytes] of %world peer %next via %dc
            signal(%c0_i32) coop block
        %seen = comm.wait_signal %c0_i32 reaches %c1_i64 via %dc coop block timeout_ms 10000
        comm.flush via %dc coop block
      }
      gpu.return
    }

    // `rounds` times: block b of every rank adds 1 to counter b in rank 0's
    // slice, all ranks meet at barrier b, thread 0 checks that the counter is
    // ranks * (round + 1) (an error count goes to the own slice at byte
    // 4096 + 4 b otherwise), and the ranks meet again before the next round.
    gpu.func @barrier_rounds(%dc: !comm.dev_comm, %win: !comm.window, %rounds: i32) kernel {
      %world = comm.team world %dc
      %size = comm.team_size %world
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c0_i32 = arith.constant 0 : i32
      %c1_i32 = arith.constant 1 : i32
      %c4_i64 = arith.constant 4 : i64
      %c4096_i64 = arith.constant 4096 : i64
      %block = gpu.block_id x
      %tid = gpu.thread_id x
      %b32 = arith.index_cast %block : index to i32
      %b64 = arith.index_cast %block : index to i64
      %slot = arith.muli %b64, %c4_i64 : i64
      %err_off = arith.addi %c4096_i64, %slot : i64
      %counter = comm.peer_ptr %win[%slot], %world, %c0_i32 : !llvm.ptr<1>
      %errors = comm.local_ptr %win[%err_off] : !llvm.ptr<1>
      %is_first = arith.cmpi eq, %tid, %c0 : index
      %n = arith.index_cast %rounds : i32 to index
      scf.for %r = %c0 to %n step %c1 {
        scf.if %is_first {
          %old = comm.atomic_rmw add relaxed scope sys %c1_i32, %counter : i32, !llvm.ptr<1>
        }
        comm.barrier %world via %dc index %b32 coop block
        scf.if %is_first {
          %seen = comm.load acquire scope sys %counter : !llvm.ptr<1> -> i32
          %r32 = arith.index_cast %r : index to i32
          %r1 = arith.addi %r32, %c1_i32 : i32
          %want = arith.muli %size, %r1 : i32
          %bad = arith.cmpi ne, %seen, %want : i32
          scf.if %bad {
            comm.red add relaxed scope gpu %c1_i32, %errors : i32, !llvm.ptr<1>
          }
        }
        comm.barrier %world via %dc index %b32 coop block
      }
      gpu.return
    }

    // Waits for a flag nobody sets: must end, after `timeout_ms`, with the
    // bounded-wait report and a trap, not hang.
    gpu.func @wait_forever(%win: !comm.window) kernel {
      %c0_i64 = arith.constant 0 : i64
      %c1_i32 = arith.constant 1 : i32
      %flag = comm.local_ptr %win[%c0_i64] : !llvm.ptr<1>
      %seen = comm.wait_flag %flag eq %c1_i32 scope sys timeout_ms 200 : !llvm.ptr<1>, i32
      gpu.return
    }

    // The same in a kernel whose waits must not call (as in a wgmma
    // pipeline): the report goes to the mapped slots the host set up.
    gpu.func @wait_forever_inline(%win: !comm.window) kernel attributes {comm.inline_waits} {
      %c0_i64 = arith.constant 0 : i64
      %c1_i32 = arith.constant 1 : i32
      %flag = comm.local_ptr %win[%c0_i64] : !llvm.ptr<1>
      %seen = comm.wait_flag %flag eq %c1_i32 scope sys timeout_ms 200 : !llvm.ptr<1>, i32
      gpu.return
    }
  }
}
