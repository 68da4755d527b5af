// Kernels of the GPU smoke test of the comm lowering (test/gpu/comm_smoke.cu
// runs them on an H200, once compiled for the virtual backend with 8 ranks on
// one GPU, one node or 2 nodes of 4, and once for the nccl backend with one
// rank). Written per rank: in
// the virtual backend gpu.block_id x / gpu.grid_dim x are the block index and
// count within the rank.
// RUN: epic-compile %s --backend=virtual -o %t.v && FileCheck %s < %t.v.json
// RUN: epic-compile %s --backend=nccl -o %t.n && FileCheck %s < %t.n.json
// CHECK-DAG: "name": "lsa_ring"
// CHECK-DAG: "name": "put_signal"
// CHECK-DAG: "name": "barrier_rounds"
// CHECK-DAG: "name": "wait_forever"
// CHECK-DAG: "name": "wait_forever_inline"
// CHECK-DAG: "name": "wait_phase_forever_inline"
// CHECK-DAG: "name": "nodes"
// CHECK-DAG: "name": "lsa_violation"
// CHECK-DAG: "name": "lsa_violation_inline"
// CHECK-DAG: "name": "dropped_put"

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

    // A bounded mbarrier wait that nothing completes (a TMA pipeline whose
    // producer never arrives): thread 0 sets up one barrier expecting one
    // arrival, every thread waits for its first phase (parity 0); the
    // report (call-free, as in the GEMMs) names the barrier and the parity.
    gpu.func @wait_phase_forever_inline() kernel attributes {comm.inline_waits} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %first = arith.constant false
      %tid = gpu.thread_id x
      %leader = arith.cmpi eq, %tid, %c0 : index
      %bars = nvgpu.mbarrier.create -> !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>>
      nvgpu.mbarrier.init %bars[%c0], %c1, predicate = %leader : !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>>
      gpu.barrier
      %bar = nvgpu.mbarrier.get %bars[%c0] : !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>> -> i32
      comm.wait_phase %bar parity %first timeout_ms 200
      gpu.return
    }

    // The virtual world of N nodes of M GPUs (comm_smoke virtual-2x4). Block 0,
    // thread 0 of every rank writes its teams to its slice (words 0-7: world
    // rank and size, LSA rank and size, rail rank and size, the next and the
    // previous rail member's world rank) and its world rank into the next LSA
    // rank's slice (word 8) over an NVLink pointer. Block 0 puts `bytes` bytes
    // from its slice at 4096 to the next rail member's at 4096 + `bytes` with
    // signal 1, thread 0 put_values its world rank (i64) to that rank's word
    // 16 (byte 64) with signal 2, and both wait for the previous rail member's
    // signals. Then `rounds` times, for each team (LSA, rail, world), block b
    // counts its arrival in `board` ([3][R][blocks] i32, plain device memory,
    // not a window: any rank may read it), meets its team at barrier b, checks
    // that every member of its team arrived as often (errors counted at byte
    // 256 + 4 b of its slice), and meets it again.
    gpu.func @nodes(%dc: !comm.dev_comm, %win: !comm.window, %bytes: i64, %rounds: i32,
                    %board: !llvm.ptr<1>) kernel {
      %world = comm.team world %dc
      %lsa = comm.team lsa %dc
      %rail = comm.team rail %dc
      %w = comm.team_rank %world
      %r = comm.team_size %world
      %l = comm.team_rank %lsa
      %m = comm.team_size %lsa
      %k = comm.team_rank %rail
      %n = comm.team_size %rail
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c0_i32 = arith.constant 0 : i32
      %c1_i32 = arith.constant 1 : i32
      %c2_i32 = arith.constant 2 : i32
      %c3_i32 = arith.constant 3 : i32
      %c0_i64 = arith.constant 0 : i64
      %c1_i64 = arith.constant 1 : i64
      %c4_i64 = arith.constant 4 : i64
      %c32_i64 = arith.constant 32 : i64
      %c64_i64 = arith.constant 64 : i64
      %c256_i64 = arith.constant 256 : i64
      %c4096_i64 = arith.constant 4096 : i64
      %block = gpu.block_id x
      %blocks = gpu.grid_dim x
      %tid = gpu.thread_id x
      %is_t0 = arith.cmpi eq, %tid, %c0 : index
      %is_b0 = arith.cmpi eq, %block, %c0 : index
      %first = arith.andi %is_t0, %is_b0 : i1
      %k1 = arith.addi %k, %c1_i32 : i32
      %k_next = arith.remui %k1, %n : i32
      %kn = arith.addi %k, %n : i32
      %kn1 = arith.subi %kn, %c1_i32 : i32
      %k_prev = arith.remui %kn1, %n : i32
      %next_world = comm.team_to_world %rail, %k_next
      %prev_world = comm.team_to_world %rail, %k_prev
      %l1 = arith.addi %l, %c1_i32 : i32
      %l_next = arith.remui %l1, %m : i32
      scf.if %first {
        %teams = comm.local_ptr %win[%c0_i64] : !llvm.ptr<1>
        %words = llvm.mlir.undef : vector<8xi32>
        %v0 = llvm.insertelement %w, %words[%c0_i32 : i32] : vector<8xi32>
        %v1 = llvm.insertelement %r, %v0[%c1_i32 : i32] : vector<8xi32>
        %v2 = llvm.insertelement %l, %v1[%c2_i32 : i32] : vector<8xi32>
        %v3 = llvm.insertelement %m, %v2[%c3_i32 : i32] : vector<8xi32>
        %c4_i32 = arith.constant 4 : i32
        %c5_i32 = arith.constant 5 : i32
        %c6_i32 = arith.constant 6 : i32
        %c7_i32 = arith.constant 7 : i32
        %v4 = llvm.insertelement %k, %v3[%c4_i32 : i32] : vector<8xi32>
        %v5 = llvm.insertelement %n, %v4[%c5_i32 : i32] : vector<8xi32>
        %v6 = llvm.insertelement %next_world, %v5[%c6_i32 : i32] : vector<8xi32>
        %v7 = llvm.insertelement %prev_world, %v6[%c7_i32 : i32] : vector<8xi32>
        llvm.store %v7, %teams {alignment = 16 : i64} : vector<8xi32>, !llvm.ptr<1>
        %next_lsa = comm.peer_ptr %win[%c32_i64], %lsa, %l_next : !llvm.ptr<1>
        llvm.store %w, %next_lsa : i32, !llvm.ptr<1>
      }
      scf.if %is_b0 {
        %dst = arith.addi %c4096_i64, %bytes : i64
        comm.put %bytes bytes from %win[%c4096_i64] to %win[%dst] of %rail peer %k_next via %dc
            signal(%c1_i32) coop block
        %s1 = comm.wait_signal %c1_i32 reaches %c1_i64 peer %prev_world via %dc coop block
            timeout_ms 10000
      }
      scf.if %first {
        %value = arith.extui %w : i32 to i64
        comm.put_value %value to %win[%c64_i64] of %rail peer %k_next via %dc signal(%c2_i32)
            coop thread : i64
        %s2 = comm.wait_signal %c2_i32 reaches %c1_i64 peer %prev_world via %dc coop thread
            timeout_ms 10000
      }
      %b32 = arith.index_cast %block : index to i32
      %b64 = arith.index_cast %block : index to i64
      %blocks64 = arith.index_cast %blocks : index to i64
      %r64 = arith.extui %r : i32 to i64
      %w64 = arith.extui %w : i32 to i64
      %err_slot = arith.muli %b64, %c4_i64 : i64
      %err_off = arith.addi %c256_i64, %err_slot : i64
      %errors = comm.local_ptr %win[%err_off] : !llvm.ptr<1>
      %plane_0 = arith.muli %c0_i64, %r64 : i64
      %plane_1 = arith.muli %c1_i64, %r64 : i64
      %c2_i64 = arith.constant 2 : i64
      %plane_2 = arith.muli %c2_i64, %r64 : i64
      %mine_plane_0 = arith.addi %plane_0, %w64 : i64
      %mine_plane_1 = arith.addi %plane_1, %w64 : i64
      %mine_plane_2 = arith.addi %plane_2, %w64 : i64
      %mine_row_0 = arith.muli %mine_plane_0, %blocks64 : i64
      %mine_row_1 = arith.muli %mine_plane_1, %blocks64 : i64
      %mine_row_2 = arith.muli %mine_plane_2, %blocks64 : i64
      %n_rounds = arith.index_cast %rounds : i32 to index
      scf.for %i = %c0 to %n_rounds step %c1 {
        %i32 = arith.index_cast %i : index to i32
        %want = arith.addi %i32, %c1_i32 : i32
        // The LSA team: board[0][world rank][block].
        scf.if %is_t0 {
          %at_0 = arith.addi %mine_row_0, %b64 : i64
          %mine_0 = llvm.getelementptr %board[%at_0] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
          comm.red add release scope sys %c1_i32, %mine_0 : i32, !llvm.ptr<1>
        }
        comm.barrier %lsa via %dc index %b32 coop block timeout_ms 10000
        scf.if %is_t0 {
          %members_0 = arith.index_cast %m : i32 to index
          scf.for %j = %c0 to %members_0 step %c1 {
            %j32 = arith.index_cast %j : index to i32
            %wj = comm.team_to_world %lsa, %j32
            %wj64 = arith.extui %wj : i32 to i64
            %row = arith.addi %plane_0, %wj64 : i64
            %row_b = arith.muli %row, %blocks64 : i64
            %at = arith.addi %row_b, %b64 : i64
            %theirs = llvm.getelementptr %board[%at] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
            %seen = comm.load acquire scope sys %theirs : !llvm.ptr<1> -> i32
            %bad = arith.cmpi ne, %seen, %want : i32
            scf.if %bad {
              comm.red add relaxed scope gpu %c1_i32, %errors : i32, !llvm.ptr<1>
            }
          }
        }
        comm.barrier %lsa via %dc index %b32 coop block timeout_ms 10000
        // The rail: board[1][world rank][block].
        scf.if %is_t0 {
          %at_1 = arith.addi %mine_row_1, %b64 : i64
          %mine_1 = llvm.getelementptr %board[%at_1] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
          comm.red add release scope sys %c1_i32, %mine_1 : i32, !llvm.ptr<1>
        }
        comm.barrier %rail via %dc index %b32 coop block timeout_ms 10000
        scf.if %is_t0 {
          %members_1 = arith.index_cast %n : i32 to index
          scf.for %j = %c0 to %members_1 step %c1 {
            %j32 = arith.index_cast %j : index to i32
            %wj = comm.team_to_world %rail, %j32
            %wj64 = arith.extui %wj : i32 to i64
            %row = arith.addi %plane_1, %wj64 : i64
            %row_b = arith.muli %row, %blocks64 : i64
            %at = arith.addi %row_b, %b64 : i64
            %theirs = llvm.getelementptr %board[%at] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
            %seen = comm.load acquire scope sys %theirs : !llvm.ptr<1> -> i32
            %bad = arith.cmpi ne, %seen, %want : i32
            scf.if %bad {
              comm.red add relaxed scope gpu %c1_i32, %errors : i32, !llvm.ptr<1>
            }
          }
        }
        comm.barrier %rail via %dc index %b32 coop block timeout_ms 10000
        // The world: board[2][world rank][block].
        scf.if %is_t0 {
          %at_2 = arith.addi %mine_row_2, %b64 : i64
          %mine_2 = llvm.getelementptr %board[%at_2] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
          comm.red add release scope sys %c1_i32, %mine_2 : i32, !llvm.ptr<1>
        }
        comm.barrier %world via %dc index %b32 coop block timeout_ms 10000
        scf.if %is_t0 {
          %members_2 = arith.index_cast %r : i32 to index
          scf.for %j = %c0 to %members_2 step %c1 {
            %j32 = arith.index_cast %j : index to i32
            %wj = comm.team_to_world %world, %j32
            %wj64 = arith.extui %wj : i32 to i64
            %row = arith.addi %plane_2, %wj64 : i64
            %row_b = arith.muli %row, %blocks64 : i64
            %at = arith.addi %row_b, %b64 : i64
            %theirs = llvm.getelementptr %board[%at] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
            %seen = comm.load acquire scope sys %theirs : !llvm.ptr<1> -> i32
            %bad = arith.cmpi ne, %seen, %want : i32
            scf.if %bad {
              comm.red add relaxed scope gpu %c1_i32, %errors : i32, !llvm.ptr<1>
            }
          }
        }
        comm.barrier %world via %dc index %b32 coop block timeout_ms 10000
      }
      gpu.return
    }

    // Rank `from` (block 0, thread 0) takes an NVLink (LSA) pointer to world
    // rank `to`: in a world of several nodes, with `to` in another node, it
    // must trap naming both (comm_smoke virtual-lsa-violation).
    gpu.func @lsa_violation(%dc: !comm.dev_comm, %win: !comm.window, %from: i32, %to: i32)
        kernel {
      %world = comm.team world %dc
      %w = comm.team_rank %world
      %c0 = arith.constant 0 : index
      %c1_i32 = arith.constant 1 : i32
      %c0_i64 = arith.constant 0 : i64
      %tid = gpu.thread_id x
      %block = gpu.block_id x
      %is_t0 = arith.cmpi eq, %tid, %c0 : index
      %is_b0 = arith.cmpi eq, %block, %c0 : index
      %is_from = arith.cmpi eq, %w, %from : i32
      %first = arith.andi %is_t0, %is_b0 : i1
      %go = arith.andi %first, %is_from : i1
      scf.if %go {
        %p = comm.peer_ptr %win[%c0_i64], %world, %to : !llvm.ptr<1>
        llvm.store %c1_i32, %p : i32, !llvm.ptr<1>
      }
      gpu.return
    }

    // The same in a kernel that must not call: the report goes to the mapped
    // slots (comm_smoke virtual-lsa-violation-report).
    gpu.func @lsa_violation_inline(%dc: !comm.dev_comm, %win: !comm.window, %from: i32,
                                   %to: i32) kernel attributes {comm.inline_waits} {
      %world = comm.team world %dc
      %w = comm.team_rank %world
      %c0 = arith.constant 0 : index
      %c1_i32 = arith.constant 1 : i32
      %c0_i64 = arith.constant 0 : i64
      %tid = gpu.thread_id x
      %block = gpu.block_id x
      %is_t0 = arith.cmpi eq, %tid, %c0 : index
      %is_b0 = arith.cmpi eq, %block, %c0 : index
      %is_from = arith.cmpi eq, %w, %from : i32
      %first = arith.andi %is_t0, %is_b0 : i1
      %go = arith.andi %first, %is_from : i1
      scf.if %go {
        %p = comm.peer_ptr %win[%c0_i64], %world, %to : !llvm.ptr<1>
        llvm.store %c1_i32, %p : i32, !llvm.ptr<1>
      }
      gpu.return
    }

    // Block 0 of every rank puts 256 bytes to the next rail member with
    // signal 3 and waits, 500 ms at most, for the previous one's: with one
    // rank's network dropped (drop_network_from), its rail successor must time
    // out naming it (comm_smoke virtual-drop).
    gpu.func @dropped_put(%dc: !comm.dev_comm, %win: !comm.window) kernel {
      %rail = comm.team rail %dc
      %k = comm.team_rank %rail
      %n = comm.team_size %rail
      %c0 = arith.constant 0 : index
      %c1_i32 = arith.constant 1 : i32
      %c3_i32 = arith.constant 3 : i32
      %c0_i64 = arith.constant 0 : i64
      %c1_i64 = arith.constant 1 : i64
      %c256_i64 = arith.constant 256 : i64
      %c4096_i64 = arith.constant 4096 : i64
      %k1 = arith.addi %k, %c1_i32 : i32
      %k_next = arith.remui %k1, %n : i32
      %kn = arith.addi %k, %n : i32
      %kn1 = arith.subi %kn, %c1_i32 : i32
      %k_prev = arith.remui %kn1, %n : i32
      %prev_world = comm.team_to_world %rail, %k_prev
      %block = gpu.block_id x
      %is_b0 = arith.cmpi eq, %block, %c0 : index
      scf.if %is_b0 {
        comm.put %c256_i64 bytes from %win[%c0_i64] to %win[%c4096_i64] of %rail peer %k_next
            via %dc signal(%c3_i32) coop block
        %s = comm.wait_signal %c3_i32 reaches %c1_i64 peer %prev_world via %dc coop block
            timeout_ms 500
      }
      gpu.return
    }
  }
}
