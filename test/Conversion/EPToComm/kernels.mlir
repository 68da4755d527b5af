// convert-ep-to-comm: one entry function per ep op becomes kernels of comm + upstream
// ops in @ep_kernels and a launch function of the same name.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = f8E4M3FN,
                  scale_packs = 16, expert_alignment = 128, max_tokens_per_rank = 512>

// CHECK-LABEL: gpu.module @ep_kernels
// --- the data stage of dispatch ---
// CHECK: gpu.func @dispatch_send(%[[DC:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[TABLE:.*]]: !llvm.ptr) workgroup(%[[LAST:.*]] : memref<1xi32, #gpu.address_space<workgroup>>) kernel
// The parameter table (argument 2) holds a 192-byte record per rank and
// travels by value; the block size is known to the kernel (ptxas budgets its
// registers for it).
// CHECK-SAME: comm.param_table = #comm.param_table<arg = 2, stride = 192, ranks = 8>
// CHECK-SAME: known_block_size = array<i32: 1024, 1, 1>
// Per-rank parameters, the LSA team and this rank.
// CHECK: %[[PARAMS:.*]] = comm.rank_params %[[TABLE]] stride 192 via %[[DC]]
// CHECK: %[[LSA:.*]] = comm.team lsa %[[DC]]
// CHECK: %[[ME:.*]] = comm.team_rank %[[LSA]]
// Warps are numbered across the rank's blocks first (warp * blocks + block):
// a decode-sized call's tokens go to as many SMs as there are tokens.
// CHECK: %[[BLOCK:.*]] = arith.index_cast %block_id_x : index to i32
// CHECK: %[[BLOCKS:.*]] = arith.index_cast %grid_dim_x : index to i32
// CHECK: %[[WARP:.*]] = arith.divui %{{.*}}, %c32_i32
// CHECK: %[[BYWARP:.*]] = arith.muli %[[WARP]], %[[BLOCKS]] : i32
// CHECK: arith.addi %[[BYWARP]], %[[BLOCK]] : i32
// The handle's copy of the routing (field 16, byte 128), written only when
// given (do_handle_copy).
// CHECK: %[[COPYAT:.*]] = llvm.getelementptr %[[PARAMS]][%c128_i64]
// CHECK: %[[COPY:.*]] = llvm.load %[[COPYAT]] {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK: llvm.ptrtoint %[[COPY]] : !llvm.ptr<1> to i64
// Remote buffers are free: the entry barrier. Block b counts its arrival at
// block b of every rank (release) and waits, bounded, for all of them.
// CHECK: gpu.barrier
// CHECK: comm.red add release scope sys %{{.*}}, %{{.*}} : i64, !llvm.ptr<1>
// CHECK: comm.wait_flag %{{.*}} ge %{{.*}} rank %[[ME]] scope sys : !llvm.ptr<1>, i64
// CHECK: gpu.barrier
// One warp per token. Everything its records hold is read first and at once
// (its row: 4 16-byte chunks per lane, its scale pack, its weight), in
// flight while the ids are grouped by destination rank (master = highest
// slot) and the slots are taken.
// CHECK: scf.for
// CHECK-COUNT-4: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> i32
// CHECK: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK: arith.divsi %{{.*}}, %c8_i32
// CHECK: nvvm.match.sync any
// CHECK: llvm.intr.ctlz
// CHECK: nvvm.vote.sync ballot
// Lanes < K copy their id as given (i32 here), widened to the copy's i64.
// CHECK: arith.extsi %{{.*}} : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 8 : i64} : i64, !llvm.ptr<1>
// Per-(rank, expert) counts, then every master lane's slot at its destination
// by a local atomic (all at once), and its record there.
// CHECK: comm.red add relaxed scope gpu
// CHECK: comm.atomic_rmw add relaxed scope gpu
// CHECK: %[[REC:.*]] = comm.peer_ptr %[[WIN]][%{{.*}}], %[[LSA]], %{{.*}} : !llvm.ptr<1>
// The records go straight into the peers' windows, only stores: the row held
// in registers, then the scale pack, ids, weights, token and master slot.
// CHECK: scf.while
// CHECK: gpu.shuffle idx
// CHECK-NOT: llvm.load
// CHECK-COUNT-4: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-NOT: llvm.load
// --- the count stage, in the rank's last block ---
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK: memref.store %{{.*}}, %[[LAST]]
// CHECK: gpu.barrier
// Expert counts (relaxed), then token counts as -c-1 with release.
// CHECK: comm.store relaxed scope sys
// CHECK: comm.store release scope sys
// Every source's count: a bounded acquire wait (the default 100 s), then reset.
// CHECK: comm.wait_flag %{{.*}} ne %{{.*}} scope sys : !llvm.ptr<1>, i32
// Warp 0's prefix sums (per source rank, then per local expert of the counts
// aligned to 128 rows): shuffle scans, not a serial loop.
// CHECK: gpu.shuffle up
// CHECK: arith.constant 127 : i32
// CHECK: gpu.shuffle up
// --- the copy epilogue ---
// CHECK: gpu.func @dispatch_copy(
// The source rank of a row: a ballot over the prefix sums.
// CHECK: nvvm.vote.sync ballot
// CHECK: llvm.intr.ctpop
// CHECK: comm.local_ptr %{{.*}}[%{{.*}}] : !llvm.ptr<1>
// Global ids -> local ids of this rank, or -1.
// CHECK: arith.remsi %{{.*}}, %c8_i32
// Scale pack p of output row r is element r x 16 + p: an i32 index (EPLimits.def
// keeps it below 2^31), its byte offset computed in 64 bits.
// CHECK: %[[PACK:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> i32
// CHECK: %[[ROWP:.*]] = arith.muli %{{.*}}, %c16_i32{{.*}} : i32
// CHECK: %[[ELEM:.*]] = arith.addi %[[ROWP]], %{{.*}} : i32
// CHECK: %[[WIDE:.*]] = arith.extsi %[[ELEM]] : i32 to i64
// CHECK: %[[BYTES:.*]] = arith.muli %[[WIDE]], %c4_i64{{.*}} : i64
// CHECK: %[[AT:.*]] = llvm.getelementptr %{{.*}}[%[[BYTES]]]
// CHECK: llvm.store %[[PACK]], %[[AT]] {alignment = 4 : i64} : i32, !llvm.ptr<1>
// --- the launch function replaces the entry function ---
// CHECK: func.func @dispatch(%{{.*}}: !comm.dev_comm, %{{.*}}: !comm.window, %{{.*}}: !llvm.ptr, %[[GRID:.*]]: index)
// CHECK-SAME: epic.cooperative = 1
// CHECK-SAME: epic.entry = "dispatch"
// CHECK-SAME: epic.kernels = ["dispatch_send", "dispatch_copy"]
// CHECK-SAME: epic.max_blocks_per_rank = 1024
// CHECK-SAME: epic.param_fields = ["x", "scale_packs", "topk_idx", "topk_weights", "recv_x", "recv_scale_packs", "recv_topk_idx", "recv_topk_weights", "recv_src_metadata", "psum_num_recv_tokens_per_rank", "num_recv_tokens_per_expert", "psum_num_recv_tokens_per_expert", "host_counts", "num_tokens", "dst_buffer_slot_idx", "max_tokens_per_rank", "topk_idx_copy"]
// CHECK-SAME: epic.param_stride = 192
// CHECK-SAME: epic.threads = 1024
// A static Tmax: the window is a constant.
// CHECK-SAME: epic.window_bytes = {{[0-9]+}}
// CHECK-NOT: window_bytes_per_token
// CHECK: gpu.launch_func @ep_kernels::@dispatch_send blocks in (%[[GRID]], %{{.*}}, %{{.*}}) threads in (%c1024, %{{.*}}, %{{.*}})
// CHECK: gpu.launch_func @ep_kernels::@dispatch_copy blocks in (%[[GRID]],
// CHECK-NOT: ep.dispatch
func.func @dispatch(%x: tensor<?x2048xf8E4M3FN>, %sf: tensor<?x16xf32>, %idx: tensor<?x6xi32>,
                    %w: tensor<?x6xf32>)
    -> (tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi32>, tensor<?x6xf32>, !ep.handle<#cfg>) {
  %rx, %rsf, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi32>) scales(%sf : tensor<?x16xf32>)
      weights(%w : tensor<?x6xf32>) config #cfg
      : tensor<?x2048xf8E4M3FN> -> tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi32>,
        tensor<?x6xf32>, !ep.handle<#cfg>
  return %rx, %rsf, %ri, %rw, %h : tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi32>,
      tensor<?x6xf32>, !ep.handle<#cfg>
}

// -----

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 1024, dtype = bf16,
                  max_tokens_per_rank = 128>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @combine_send(
// CHECK: comm.red add release scope sys %{{.*}}, %{{.*}} : i64
// Back to the source rank, into [master slot][token].
// CHECK: arith.divui %{{.*}}, %c128_i32
// CHECK: arith.remui %{{.*}}, %c128_i32
// CHECK: arith.remui %{{.*}}, %c4_i32
// CHECK: comm.peer_ptr
// CHECK: vector<4xi32>
// Done flags to every peer (release), then wait for everyone's.
// CHECK: comm.store release scope sys
// CHECK: comm.wait_flag %{{.*}} eq
// CHECK: gpu.func @combine_reduce(
// fp32 from +0.0, the bias first, then the master slots' rows in increasing
// slot order (lowest set bit of the masters' ballot first, absent slots cost
// nothing); each row's four 16-byte chunks of a lane are loaded before they
// are added.
// CHECK: %[[MASTERS:.*]] = nvvm.vote.sync ballot
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: arith.extf %{{.*}} : vector<8xbf16> to vector<8xf32>
// CHECK: arith.addf
// CHECK: scf.while (%{{.*}} = %[[MASTERS]], %{{.*}}) : (i32, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK: llvm.intr.cttz
// CHECK: comm.local_ptr
// CHECK: llvm.load %{{.*}} -> vector<8xbf16>
// CHECK-NOT: arith.addf
// CHECK: llvm.load %{{.*}} -> vector<8xbf16>
// CHECK-NOT: arith.addf
// CHECK: llvm.load %{{.*}} -> vector<8xbf16>
// CHECK-NOT: arith.addf
// CHECK: llvm.load %{{.*}} -> vector<8xbf16>
// CHECK: arith.addf
// CHECK: scf.yield
// One rounding to bf16.
// CHECK: arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK-LABEL: func.func @combine(
// CHECK-SAME: epic.entry = "combine"
// CHECK-SAME: epic.kernels = ["combine_send", "combine_reduce"]
func.func @combine(%y: tensor<?x1024xbf16>, %h: !ep.handle<#cfg>, %b: tensor<?x1024xbf16>)
    -> tensor<?x1024xbf16> {
  %out = ep.combine %y, %h bias(%b : tensor<?x1024xbf16>)
      : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}

// -----

// Functions without ep ops are left alone.
// CHECK-LABEL: func.func @untouched
// CHECK-NOT: gpu.module
func.func @untouched(%a: i32) -> i32 {
  return %a : i32
}

// -----

// Expanded layout: rows come from a per-expert cursor (start_e + cursor_e++),
// go to recv_src_metadata[:, 2 + slot], and zero_padding zeroes the rest of
// each expert's aligned block.
#exp = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  expert_alignment = 64, layout = expanded, max_tokens_per_rank = 128>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @dispatch_exp_send(
// The expanded prefix sums are start_e + count_e: the end of the real rows.
// CHECK: arith.constant 63 : i32
// CHECK: gpu.func @dispatch_exp_copy(
// CHECK: arith.subi
// CHECK: %[[CURSOR:.*]] = comm.atomic_rmw add relaxed scope gpu
// CHECK-NEXT: arith.addi %{{.*}}, %[[CURSOR]] : i32
// One output row per local slot, lowest slot first.
// CHECK: scf.while
// CHECK: llvm.intr.cttz
// CHECK: gpu.shuffle idx
// Zero padding: a warp per expert zeroes rows [end, start + aligned count).
// CHECK: arith.constant dense<0> : vector<4xi32>
func.func @dispatch_exp(%x: tensor<?x512xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x4xf32>)
    -> (tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#exp>) {
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      zero_padding config #exp
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#exp>
  return %rx, %rw, %h : tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#exp>
}

// The expanded combine sums the rank's rows of a token (metadata columns 2..)
// in fp32 from +0.0 and sends one bf16 row.
// Lane j holds slot j's expanded row; the rows present, lowest slot first.
// CHECK: gpu.func @combine_exp_send(
// CHECK: arith.cmpi sge
// CHECK: %[[PRESENT:.*]] = nvvm.vote.sync ballot
// CHECK: arith.constant dense<0.000000e+00> : vector<8xf32>
// CHECK: scf.while (%{{.*}} = %[[PRESENT]],
// CHECK: llvm.intr.cttz
// CHECK: gpu.shuffle idx
// CHECK: llvm.load %{{.*}} -> vector<8xbf16>
// CHECK: arith.truncf %{{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK: comm.store release scope sys
// CHECK: func.func @dispatch_exp(
// CHECK-SAME: epic.entry = "dispatch"
// CHECK: func.func @combine_exp(
// CHECK-SAME: epic.entry = "combine"
func.func @combine_exp(%y: tensor<?x512xbf16>, %h: !ep.handle<#exp>) -> tensor<?x512xbf16> {
  %out = ep.combine %y, %h : tensor<?x512xbf16>, !ep.handle<#exp> -> tensor<?x512xbf16>
  return %out : tensor<?x512xbf16>
}

// -----

// Cached dispatch: slots from the handle's dst_buffer_slot_idx instead of
// atomics, no count exchange (only done flags), rows where the handle says.
#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = bf16,
                  max_tokens_per_rank = 128>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @cached_send(
// CHECK: comm.wait_flag %{{.*}} ge
// CHECK-NOT: comm.atomic_rmw add relaxed
// CHECK: comm.peer_ptr
// CHECK-NOT: comm.atomic_rmw add relaxed
// CHECK: scf.while
// Done flags instead of counts: release to every peer, acquire from every peer.
// CHECK: comm.atomic_rmw add acq_rel scope sys
// CHECK: comm.store release scope sys
// CHECK: comm.wait_flag %{{.*}} eq %{{.*}} rank %{{.*}} peer %{{.*}} scope sys
// CHECK-NOT: comm.wait_flag %{{.*}} ne
// CHECK: gpu.func @cached_copy(
// CHECK: func.func @cached(
// CHECK-SAME: epic.kernels = ["cached_send", "cached_copy"]
func.func @cached(%x: tensor<?x512xbf16>, %h: !ep.handle<#cfg>)
    -> (tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) {
  %rx, %ri, %h2 = ep.dispatch %x cached(%h : !ep.handle<#cfg>) config #cfg
      : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h2 : tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}

// -----

// Tmax left out of the configuration: a run-time value, the record's
// max_tokens_per_rank (dispatch: field 15, byte 120; combine: field 10, byte
// 80), read once per kernel and used where the constant was; the window is
// window_bytes (the counters) + Tmax x window_bytes_per_token (the larger of
// R dispatch records of 2096 bytes and K combine records of 2064).
#rt = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 1024, dtype = bf16>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @rt_dispatch_send(
// CHECK: %[[PARAMS:.*]] = comm.rank_params
// CHECK: %[[AT:.*]] = llvm.getelementptr %[[PARAMS]][%c120_i64]
// CHECK: %[[TMAX:.*]] = llvm.load %[[AT]] {alignment = 8 : i64} : !llvm.ptr -> i32
// The op's signature, checked at the entry barrier, includes the cap.
// CHECK: %[[CAP:.*]] = arith.extsi %[[TMAX]] : i32 to i64
// CHECK: arith.muli %[[CAP]], %{{.*}} : i64
// The record's index in the destination: [me][slot] with Tmax slots per source.
// CHECK: %[[WIDE:.*]] = arith.extsi %[[TMAX]] : i32 to i64
// CHECK: arith.muli %{{.*}}, %[[WIDE]] : i64
// CHECK: comm.peer_ptr
// CHECK: gpu.func @rt_dispatch_copy(
// CHECK: %[[TMAX2:.*]] = llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> i32
// Source ids are src * Tmax + token.
// CHECK: arith.muli %{{.*}}, %[[TMAX2]] : i32
// CHECK: gpu.func @rt_combine_send(
// CHECK: %[[PARAMS3:.*]] = comm.rank_params
// CHECK: %[[AT3:.*]] = llvm.getelementptr %[[PARAMS3]][%c80_i64]
// CHECK: %[[TMAX3:.*]] = llvm.load %[[AT3]] {alignment = 8 : i64} : !llvm.ptr -> i32
// CHECK: arith.divui %{{.*}}, %[[TMAX3]] : i32
// CHECK: arith.remui %{{.*}}, %[[TMAX3]] : i32
// CHECK: func.func @rt_dispatch(
// CHECK-SAME: epic.window_bytes = 77824
// CHECK-SAME: epic.window_bytes_per_token = 8384
// CHECK: func.func @rt_combine(
// CHECK-SAME: epic.window_bytes = 77824
// CHECK-SAME: epic.window_bytes_per_token = 8384
func.func @rt_dispatch(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x1024xbf16>, tensor<?x4xi64>, !ep.handle<#rt>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #rt
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x4xi64>, !ep.handle<#rt>
  return %rx, %ri, %h : tensor<?x1024xbf16>, tensor<?x4xi64>, !ep.handle<#rt>
}
func.func @rt_combine(%y: tensor<?x1024xbf16>, %h: !ep.handle<#rt>) -> tensor<?x1024xbf16> {
  %out = ep.combine %y, %h : tensor<?x1024xbf16>, !ep.handle<#rt> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}

// -----

// Decode sizes: when warps outnumber rows, a row of several chunk groups
// (hidden 4096 bf16: 512 16-byte chunks, four groups of 32 lanes x 4) is split
// among up to four warps, the largest power of two <= warps / rows (a run-time
// value); warp `part` of a row takes groups part, part + parts, ... and part 0
// alone does the row's other work. Rows of one group (the tests above) are not
// split.
#big = #ep.config<ranks = 2, experts = 8, topk = 2, hidden = 4096, dtype = bf16,
                  max_tokens_per_rank = 64>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @split_dispatch_copy(
// CHECK: %[[Q4:[0-9]+]] = arith.select %{{.*}}, %{{.*}}, %c4_i32{{[_0-9]*}} : i32
// CHECK: "llvm.intr.ctlz"(%[[Q4]])
// CHECK: %[[PARTS:[0-9]+]] = arith.shli %c1_i32{{[_0-9]*}}, %[[LOG:[0-9]+]] : i32
// CHECK: %[[ITEMS:[0-9]+]] = arith.shli %{{.*}}, %[[LOG]] : i32
// CHECK: scf.for %[[ITEM:[a-z0-9]+]] = %{{.*}} to %[[ITEMS]]
// CHECK: arith.shrui %[[ITEM]], %[[LOG]] : i32
// CHECK: %[[PART:[0-9]+]] = arith.andi %[[ITEM]]
// The row's copy starts at group `part` and strides over `parts` groups.
// CHECK: %[[STEP:[0-9]+]] = arith.muli %c128_i32{{[_0-9]*}}, %[[PARTS]] : i32
// CHECK: scf.for %{{.*}} = %{{.*}} to %c512_i32{{[_0-9]*}} step %[[STEP]]
// CHECK: arith.cmpi eq, %[[PART]], %c0_i32
// CHECK: gpu.func @split_combine_send(
// CHECK: llvm.intr.ctlz
// CHECK: arith.shli
// CHECK: gpu.func @split_combine_reduce(
// CHECK: llvm.intr.ctlz
// CHECK: arith.shli
func.func @split_dispatch(%x: tensor<?x4096xbf16>, %idx: tensor<?x2xi64>)
    -> (tensor<?x4096xbf16>, tensor<?x2xi64>, !ep.handle<#big>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x2xi64>) config #big
      : tensor<?x4096xbf16> -> tensor<?x4096xbf16>, tensor<?x2xi64>, !ep.handle<#big>
  return %rx, %ri, %h : tensor<?x4096xbf16>, tensor<?x2xi64>, !ep.handle<#big>
}
func.func @split_combine(%y: tensor<?x4096xbf16>, %h: !ep.handle<#big>) -> tensor<?x4096xbf16> {
  %out = ep.combine %y, %h : tensor<?x4096xbf16>, !ep.handle<#big> -> tensor<?x4096xbf16>
  return %out : tensor<?x4096xbf16>
}
