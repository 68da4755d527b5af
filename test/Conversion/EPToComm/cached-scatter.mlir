// convert-ep-to-comm with one-pass-dispatch (what epic-to-ptx sets for the
// virtual backend): a cached dispatch is one kernel that writes every row into
// its destination's outputs, read through the destination's parameter record.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm=one-pass-dispatch=true | FileCheck %s
// Without the option (the nccl backend) the cached dispatch keeps send + copy.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s --check-prefix=STAGED

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, max_tokens_per_rank = 128>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @plain_scatter(%[[DC:.*]]: !comm.dev_comm, %{{.*}}: !comm.window, %[[TABLE:.*]]: !llvm.ptr) kernel
// CHECK: comm.rank_params %[[TABLE]] stride 192 via %[[DC]]
// CHECK: %[[LSA:.*]] = comm.team lsa %[[DC]]
// CHECK: %[[ME:.*]] = comm.team_rank %[[LSA]]
// No entry barrier: nothing waits.
// CHECK-NOT: comm.wait_flag
// Lane j: its destination's record, the prefix sum before this rank ...
// CHECK: %[[WORLD:.*]] = comm.team_to_world %[[LSA]], %{{.*}}
// CHECK: %[[THEIRS:.*]] = comm.peer_params %[[TABLE]] stride 192 peer %[[WORLD]] via %[[DC]]
// CHECK: %[[PSUM_AT:.*]] = llvm.getelementptr %[[THEIRS]][%c72_i64]
// CHECK: %[[PSUM:.*]] = llvm.load %[[PSUM_AT]] {{.*}} -> !llvm.ptr<1>
// CHECK: arith.subi %[[ME]], %c1_i32
// ... then its recv_x (field 4)
// CHECK: comm.peer_params %[[TABLE]] stride 192 peer
// CHECK: llvm.getelementptr %{{.*}}[%c32_i64]
// The row is loaded once, then stored to every destination of the token.
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: scf.while
// CHECK: llvm.inttoptr %{{.*}} : i64 to !llvm.ptr<1>
// CHECK-NOT: comm.peer_ptr
// CHECK: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// Per destination: scale packs (field 5) and the local top-k ids (field 6, i64).
// CHECK: scf.while
// CHECK: llvm.getelementptr %{{.*}}[%c40_i64]
// CHECK: llvm.getelementptr %{{.*}}[%c48_i64]
// CHECK: llvm.store %{{.*}} {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NOT: comm.
// CHECK: gpu.return
// CHECK: func.func @plain(
// CHECK-SAME: epic.cooperative = 0
// CHECK-SAME: epic.kernels = ["plain_scatter"]
// STAGED: epic.kernels = ["plain_send", "plain_copy"]
func.func @plain(%x: tensor<?x512xf8E4M3FN>, %sf: tensor<?x4xf32>, %h: !ep.handle<#cfg>)
    -> (tensor<?x512xf8E4M3FN>, tensor<?x4xf32>, tensor<?x4xi64>, !ep.handle<#cfg>) {
  %rx, %rsf, %ri, %h2 = ep.dispatch %x scales(%sf : tensor<?x4xf32>) cached(%h : !ep.handle<#cfg>)
      config #cfg : tensor<?x512xf8E4M3FN>
      -> tensor<?x512xf8E4M3FN>, tensor<?x4xf32>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %rsf, %ri, %h2
      : tensor<?x512xf8E4M3FN>, tensor<?x4xf32>, tensor<?x4xi64>, !ep.handle<#cfg>
}

// -----

// Expanded: slot j's row is column 2 + j of the destination's
// recv_src_metadata (field 8) at the token's row; the rank zeroes its own
// padding rows.
#exp = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  expert_alignment = 64, layout = expanded, max_tokens_per_rank = 128>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @expanded_scatter(
// CHECK-NOT: comm.wait_flag
// CHECK: comm.peer_params
// CHECK: comm.peer_params %{{.*}} stride 192 peer
// CHECK: %[[META_AT:.*]] = llvm.getelementptr %{{.*}}[%c64_i64]
// CHECK: %[[META:.*]] = llvm.load %[[META_AT]] {{.*}} -> !llvm.ptr<1>
// CHECK: %[[COLUMN:.*]] = arith.addi %{{.*}}, %c2_i32{{.*}} : i32
// CHECK: %[[ROW_START:.*]] = arith.muli %{{.*}}, %c6_i32 : i32
// CHECK: arith.addi %[[ROW_START]], %[[COLUMN]] : i32
// CHECK: %[[TARGETS:.*]] = nvvm.vote.sync ballot
// CHECK: scf.while (%{{.*}} = %[[TARGETS]])
// CHECK: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// Zero padding: rows [end_e, start_e + align(count_e)) of this rank's recv_x.
// CHECK: arith.constant dense<0> : vector<4xi32>
// CHECK: gpu.return
// CHECK: func.func @expanded(
// CHECK-SAME: epic.kernels = ["expanded_scatter"]
// STAGED: epic.kernels = ["expanded_send", "expanded_copy"]
func.func @expanded(%x: tensor<?x512xbf16>, %h: !ep.handle<#exp>)
    -> (tensor<?x512xbf16>, !ep.handle<#exp>) {
  %rx, %h2 = ep.dispatch %x cached(%h : !ep.handle<#exp>) zero_padding config #exp
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, !ep.handle<#exp>
  return %rx, %h2 : tensor<?x512xbf16>, !ep.handle<#exp>
}

// -----

// An uncached dispatch in one pass: a count kernel (entry barrier, slots taken, counts
// exchanged; no row moves, nothing staged in the window but, expanded, each slot's row in its
// expert block) and the scatter, which writes every row, id, weight and the destinations'
// metadata rows (field 8).
#cfg = #ep.config<ranks = 2, experts = 4, topk = 2, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 16>
// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @uncached_count(
// CHECK: comm.atomic_rmw add relaxed scope gpu
// CHECK-NOT: vector<4xi32>
// CHECK: comm.store release scope sys
// CHECK: gpu.return
// CHECK: gpu.func @uncached_scatter(
// CHECK: comm.peer_params
// CHECK: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// The weights (field 3) go to the destination's recv_topk_weights (field 7).
// CHECK: llvm.getelementptr %{{.*}}[%c56_i64]
// CHECK: llvm.store %{{.*}} : f32, !llvm.ptr<1>
// Then each destination's metadata row: source id, master slot, then -1 per slot (plain).
// CHECK: llvm.getelementptr %{{.*}}[%c64_i64]
// CHECK: arith.muli %{{.*}}, %c4_i32{{.*}} : i32
// CHECK: gpu.return
// CHECK: func.func @uncached(
// CHECK-SAME: epic.kernels = ["uncached_count", "uncached_scatter"]
// STAGED: epic.kernels = ["uncached_send", "uncached_copy"]
func.func @uncached(%x: tensor<?x256xbf16>, %idx: tensor<?x2xi64>, %w: tensor<?x2xf32>)
    -> (tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, !ep.handle<#cfg>) {
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x2xi64>) weights(%w : tensor<?x2xf32>)
      config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, !ep.handle<#cfg>
  return %rx, %ri, %rw, %h : tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, !ep.handle<#cfg>
}

// -----

// Expanded, in one pass: slot j's row is the destination's expert start (its prefix sums,
// fields 11 and 10), this rank's first row in the block (the cell the count exchange left in
// the destination's window: expertIn[me][e]) and the slot's row there (the window's data region
// of this rank, [token][K], written by the count kernel).
#exp = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  expert_alignment = 64, layout = expanded, max_tokens_per_rank = 128>
// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @expanded_fresh_count(
// The slot's row among this rank's rows of the expert, kept in the data region.
// CHECK: %[[ROW:.*]] = comm.atomic_rmw add relaxed scope gpu
// CHECK: llvm.store %[[ROW]]
// CHECK: gpu.return
// CHECK: gpu.func @expanded_fresh_scatter(
// CHECK: llvm.getelementptr %{{.*}}[%c88_i64{{.*}}]
// CHECK: llvm.getelementptr %{{.*}}[%c80_i64{{.*}}]
// CHECK: comm.peer_ptr
// CHECK: %[[TARGETS:.*]] = nvvm.vote.sync ballot
// CHECK: scf.while (%{{.*}} = %[[TARGETS]])
// CHECK: gpu.return
// CHECK: func.func @expanded_fresh(
// CHECK-SAME: epic.kernels = ["expanded_fresh_count", "expanded_fresh_scatter"]
// STAGED: epic.kernels = ["expanded_fresh_send", "expanded_fresh_copy"]
func.func @expanded_fresh(%x: tensor<?x512xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x512xbf16>, !ep.handle<#exp>) {
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) zero_padding config #exp
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, !ep.handle<#exp>
  return %rx, %h : tensor<?x512xbf16>, !ep.handle<#exp>
}
