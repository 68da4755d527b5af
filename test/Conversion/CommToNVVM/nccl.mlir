// convert-comm-to-nvvm, backend=nccl: teams, pointers, network operations and
// barriers become calls of the NCCL device shim; flag operations are inlined.
// RUN: epic-opt %s --split-input-file --allow-unregistered-dialect --convert-comm-to-nvvm=backend=nccl --cse | FileCheck %s

// CHECK-LABEL: gpu.module @teams
// CHECK-DAG: llvm.func @__epic_nccl_team_nranks(!llvm.ptr, i32) -> i32
// CHECK-DAG: llvm.func @__epic_nccl_team_rank(!llvm.ptr, i32) -> i32
// CHECK-DAG: llvm.func @__epic_nccl_team_stride(!llvm.ptr, i32) -> i32
// CHECK-DAG: llvm.func @__epic_nccl_world_rank(!llvm.ptr) -> i32
gpu.module @teams {
  // The device communicator and windows become pointers.
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[WIN:.*]]: !llvm.ptr, %[[OFF:.*]]: i64, %[[R:.*]]: i32) kernel
  gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %r: i32) kernel {
    // CHECK: %[[KIND:.*]] = llvm.mlir.constant(1 : i32) : i32
    // CHECK: %[[N:.*]] = llvm.call @__epic_nccl_team_nranks(%[[DC]], %[[KIND]])
    // CHECK: %[[ME:.*]] = llvm.call @__epic_nccl_team_rank(%[[DC]], %[[KIND]])
    // CHECK: %[[STRIDE:.*]] = llvm.call @__epic_nccl_team_stride(%[[DC]], %[[KIND]])
    // CHECK: %[[WORLD:.*]] = llvm.call @__epic_nccl_world_rank(%[[DC]])
    // CHECK: %[[T0:.*]] = llvm.insertvalue %[[N]], %{{.*}}[0]
    // CHECK: %[[T1:.*]] = llvm.insertvalue %[[ME]], %[[T0]][1]
    // CHECK: %[[T2:.*]] = llvm.insertvalue %[[STRIDE]], %[[T1]][2]
    // CHECK: %[[T3:.*]] = llvm.insertvalue %[[KIND]], %[[T2]][3]
    // CHECK: %[[T4:.*]] = llvm.insertvalue %[[WORLD]], %[[T3]][4]
    // The virtual world's M and R: none here.
    // CHECK: %[[T5:.*]] = llvm.insertvalue %[[ZERO:.*]], %[[T4]][5]
    // CHECK: %[[TEAM:.*]] = llvm.insertvalue %[[ZERO]], %[[T5]][6]
    %lsa = comm.team lsa %dc
    // World rank of LSA member %r: world + (r - rank) * stride.
    // CHECK: %[[W:.*]] = llvm.extractvalue %[[TEAM]][4]
    // CHECK: %[[RK:.*]] = llvm.extractvalue %[[TEAM]][1]
    // CHECK: %[[S:.*]] = llvm.extractvalue %[[TEAM]][2]
    // CHECK: %[[D:.*]] = llvm.sub %[[R]], %[[RK]]
    // CHECK: %[[M:.*]] = llvm.mul %[[D]], %[[S]]
    // CHECK: %[[PEER:.*]] = llvm.add %[[W]], %[[M]]
    %peer = comm.team_to_world %lsa, %r
    %world = comm.team world %dc
    // Pointers: the team crosses the ABI as (ranks, rank, stride).
    // CHECK: %[[NULL:.*]] = llvm.mlir.zero : !llvm.ptr
    // CHECK: %[[P:.*]] = llvm.call @__epic_nccl_peer_ptr(%[[NULL]], %[[WIN]], %[[OFF]], %{{.*}}, %{{.*}}, %{{.*}}, %[[PEER]]) : (!llvm.ptr, !llvm.ptr, i64, i32, i32, i32, i32) -> !llvm.ptr
    // CHECK: llvm.addrspacecast %[[P]] : !llvm.ptr to !llvm.ptr<1>
    %p = comm.peer_ptr %win[%off], %world, %peer : !llvm.ptr<1>
    // CHECK: llvm.call @__epic_nccl_local_ptr(%[[NULL]], %[[WIN]], %[[OFF]])
    %q = comm.local_ptr %win[%off] : !llvm.ptr
    // (team_rank reuses the extraction above after --cse)
    // CHECK: %[[SIZE:.*]] = llvm.extractvalue %[[TEAM]][0]
    // CHECK: "test.use"(%[[RK]], %[[SIZE]], %{{.*}}, %{{.*}})
    %me = comm.team_rank %lsa
    %n = comm.team_size %lsa
    "test.use"(%me, %n, %p, %q) : (i32, i32, !llvm.ptr<1>, !llvm.ptr) -> ()
    gpu.return
  }
}

// -----

// One shim function per cooperation level; optional operands become constants.
// CHECK-LABEL: gpu.module @network
gpu.module @network {
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[WIN:.*]]: !llvm.ptr, %[[A:.*]]: i64, %[[N:.*]]: i64, %[[P:.*]]: i32, %[[SIG:.*]]: i32, %[[CTX:.*]]: i32)
    // CHECK: %[[C0:.*]] = llvm.mlir.constant(0 : i32) : i32
  gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i64, %p: i32,
              %sig: i32, %ctx: i32) kernel {
    %world = comm.team world %dc
    // CHECK-DAG: %[[C0L:.*]] = llvm.mlir.constant(0 : i64) : i64
    // CHECK-DAG: %[[TN:.*]] = llvm.extractvalue %{{.*}}[0]
    // CHECK-DAG: %[[TR:.*]] = llvm.extractvalue %{{.*}}[1]
    // CHECK-DAG: %[[TS:.*]] = llvm.extractvalue %{{.*}}[2]
    // No signal (mode 0), no counter (mode 0), context 0.
    // CHECK: llvm.call @__epic_nccl_put_thread(%[[DC]], %[[C0]], %[[TN]], %[[TR]], %[[TS]], %[[P]], %[[WIN]], %[[A]], %[[WIN]], %[[A]], %[[N]], %[[C0]], %[[C0]], %[[C0L]], %[[C0]], %[[C0]])
    comm.put %n bytes from %win[%a] to %win[%a] of %world peer %p via %dc coop thread
    // signal(%sig): mode 1, increment.
    // CHECK: %[[C1:.*]] = llvm.mlir.constant(1 : i32) : i32
    // CHECK: llvm.call @__epic_nccl_put_warp(%[[DC]], %[[C0]], %[[TN]], %[[TR]], %[[TS]], %[[P]], %[[WIN]], %[[A]], %[[WIN]], %[[A]], %[[N]], %[[C1]], %[[SIG]], %[[C0L]], %[[C0]], %[[C0]])
    comm.put %n bytes from %win[%a] to %win[%a] of %world peer %p via %dc signal(%sig) coop warp
    // add(%n): mode 2 with the value; counter(%sig): mode 1; context(%ctx).
    // CHECK: %[[C2:.*]] = llvm.mlir.constant(2 : i32) : i32
    // CHECK: llvm.call @__epic_nccl_put_block(%[[DC]], %[[CTX]], %[[TN]], %[[TR]], %[[TS]], %[[P]], %[[WIN]], %[[A]], %[[WIN]], %[[A]], %[[N]], %[[C2]], %[[SIG]], %[[N]], %[[C1]], %[[SIG]])
    comm.put %n bytes from %win[%a] to %win[%a] of %world peer %p via %dc
        signal(%sig) add(%n) counter(%sig) context(%ctx) coop block
    // An i32 value travels sign-extended, with its size.
    // CHECK: %[[V:.*]] = llvm.sext %[[P]] : i32 to i64
    // CHECK: %[[C4:.*]] = llvm.mlir.constant(4 : i32) : i32
    // CHECK: llvm.call @__epic_nccl_put_value_warp(%[[DC]], %[[C0]], %[[TN]], %[[TR]], %[[TS]], %[[P]], %[[WIN]], %[[A]], %[[V]], %[[C4]], %[[C1]], %[[SIG]], %[[C0L]])
    comm.put_value %p to %win[%a] of %world peer %p via %dc signal(%sig) coop warp : i32
    // A signal-only operation increments (mode 1) by default.
    // CHECK: llvm.call @__epic_nccl_signal_thread(%[[DC]], %[[C0]], %[[TN]], %[[TR]], %[[TS]], %[[P]], %[[SIG]], %[[C1]], %[[C0L]])
    comm.signal %sig of %world peer %p via %dc coop thread
    // The bound is passed in nanoseconds.
    // CHECK: %[[NS:.*]] = llvm.mlir.constant(5000000000 : i64) : i64
    // The rank waited for only names it in the timeout report (-1: none given).
    // CHECK: %[[NONE:.*]] = llvm.mlir.constant(-1 : i32) : i32
    // CHECK: llvm.call @__epic_nccl_wait_signal_block(%[[DC]], %[[C0]], %[[SIG]], %[[N]], %[[NS]], %[[NONE]]) : (!llvm.ptr, i32, i32, i64, i64, i32) -> i64
    %s = comm.wait_signal %sig reaches %n via %dc coop block timeout_ms 5000
    // CHECK: llvm.call @__epic_nccl_wait_signal_thread(%[[DC]], %[[C0]], %[[SIG]], %[[N]], %{{.*}}, %[[P]]) : (!llvm.ptr, i32, i32, i64, i64, i32) -> i64
    %t = comm.wait_signal %sig reaches %n peer %p via %dc coop thread
    // CHECK: llvm.call @__epic_nccl_read_signal(%[[DC]], %[[CTX]], %[[SIG]])
    %v = comm.read_signal %sig via %dc context(%ctx)
    // CHECK: llvm.call @__epic_nccl_reset_signal(%[[DC]], %[[C0]], %[[SIG]])
    comm.reset_signal %sig via %dc
    // CHECK: llvm.call @__epic_nccl_flush_warp(%[[DC]], %[[C0]])
    comm.flush via %dc coop warp
    gpu.return
  }
}

// -----

// CHECK-LABEL: gpu.module @barrier
gpu.module @barrier {
  gpu.func @k(%dc: !comm.dev_comm, %idx: i32) kernel {
    %rail = comm.team rail %dc
    // The team's kind (2 = rail) selects the barrier inside the shim; the
    // default bound is 100 s.
    // CHECK: %[[KIND:.*]] = llvm.mlir.constant(2 : i32) : i32
    // CHECK: %[[TEAM:.*]] = llvm.insertvalue %{{.*}}, %{{.*}}[6]
    // CHECK: %[[K:.*]] = llvm.extractvalue %[[TEAM]][3]
    // CHECK: %[[NS:.*]] = llvm.mlir.constant(100000000000 : i64) : i64
    // CHECK: llvm.call @__epic_nccl_barrier_block(%{{.*}}, %[[K]], %{{.*}}, %[[NS]])
    comm.barrier %rail via %dc index %idx coop block
    gpu.return
  }
}

// -----

// Flag operations are the same in both backends: atomic loads/stores with a
// sync scope, fences, and exact PTX for red/atom.
// CHECK-LABEL: gpu.module @flags
gpu.module @flags {
  // CHECK: gpu.func @k(%[[P:.*]]: !llvm.ptr, %[[G:.*]]: !llvm.ptr<1>, %[[V:.*]]: i32, %[[W:.*]]: i64)
  gpu.func @k(%p: !llvm.ptr, %g: !llvm.ptr<1>, %v: i32, %w: i64) kernel {
    // CHECK: llvm.load %[[P]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
    %a = comm.load acquire scope sys %p : !llvm.ptr -> i32
    // CHECK: llvm.load %[[G]] atomic syncscope("device") monotonic {alignment = 8 : i64} : !llvm.ptr<1> -> i64
    %b = comm.load relaxed scope gpu %g : !llvm.ptr<1> -> i64
    // CHECK: llvm.store %[[V]], %[[P]] atomic syncscope("block") release {alignment = 4 : i64} : i32, !llvm.ptr
    comm.store release scope cta %v, %p : i32, !llvm.ptr
    // CHECK: llvm.fence syncscope("cluster") acq_rel
    comm.fence acq_rel scope cluster
    // CHECK: llvm.fence seq_cst
    comm.fence sc scope sys
    // CHECK: %[[GEN:.*]] = llvm.addrspacecast %[[G]] : !llvm.ptr<1> to !llvm.ptr
    // CHECK: llvm.inline_asm has_side_effects "red.release.sys.add.u32 [$0], $1;", "l,r,~{memory}" %[[GEN]], %[[V]]
    comm.red add release scope sys %v, %g : i32, !llvm.ptr<1>
    // CHECK: llvm.inline_asm has_side_effects "red.relaxed.gpu.max.s64 [$0], $1;", "l,l,~{memory}" %[[P]], %[[W]]
    comm.red max relaxed scope gpu %w, %p : i64, !llvm.ptr
    // CHECK: llvm.inline_asm has_side_effects "red.relaxed.cta.or.b32 [$0], $1;"
    comm.red or relaxed scope cta %v, %p : i32, !llvm.ptr
    // CHECK: llvm.inline_asm has_side_effects "atom.acq_rel.gpu.add.u32 $0, [$1], $2;", "=r,l,r,~{memory}" %[[P]], %[[V]] : (!llvm.ptr, i32) -> i32
    %o = comm.atomic_rmw add acq_rel scope gpu %v, %p : i32, !llvm.ptr
    // sc: a leading fence.sc, then acq_rel.
    // CHECK: llvm.inline_asm has_side_effects "fence.sc.sys; atom.acq_rel.sys.exch.b64 $0, [$1], $2;", "=l,l,l,~{memory}"
    %x = comm.atomic_rmw exch sc scope sys %w, %p : i64, !llvm.ptr
    // CHECK: llvm.inline_asm has_side_effects "atom.acquire.sys.cas.b32 $0, [$1], $2, $3;", "=r,l,r,r,~{memory}" %[[P]], %[[V]], %[[V]] : (!llvm.ptr, i32, i32) -> i32
    %c = comm.atomic_cas acquire scope sys %p, %v, %v : !llvm.ptr, i32
    // CHECK: llvm.inline_asm has_side_effects "atom.relaxed.gpu.cas.b64 $0, [$1], $2, $3;", "=l,l,l,l,~{memory}"
    %c2 = comm.atomic_cas relaxed scope gpu %p, %w, %w : !llvm.ptr, i64
    // pred 2 = ge, scope 3 = sys, 250 ms.
    // CHECK: %[[PRED:.*]] = llvm.mlir.constant(2 : i32) : i32
    // CHECK: %[[SCOPE:.*]] = llvm.mlir.constant(3 : i32) : i32
    // CHECK: %[[NS:.*]] = llvm.mlir.constant(250000000 : i64) : i64
    // Rank and peer of the report: -1 when not given.
    // CHECK: %[[NONE:.*]] = llvm.mlir.constant(-1 : i32) : i32
    // CHECK: llvm.call @__epic_nccl_wait_flag_i32(%[[GEN]], %[[PRED]], %[[V]], %[[SCOPE]], %[[NS]], %[[NONE]], %[[NONE]]) : (!llvm.ptr, i32, i32, i32, i64, i32, i32) -> i32
    %s = comm.wait_flag %g ge %v scope sys timeout_ms 250 : !llvm.ptr<1>, i32
    // pred 0 = eq, scope 2 = gpu (the constant 2 above), default 100 s.
    // CHECK: %[[EQ:.*]] = llvm.mlir.constant(0 : i32) : i32
    // CHECK: %[[DEF:.*]] = llvm.mlir.constant(100000000000 : i64) : i64
    // CHECK: llvm.call @__epic_nccl_wait_flag_i64(%[[P]], %[[EQ]], %[[W]], %[[PRED]], %[[DEF]], %[[V]], %[[NONE]])
    %t = comm.wait_flag %p eq %w rank %v scope gpu : !llvm.ptr, i64
    gpu.return
  }
}

// -----

// A kernel whose waits must not call (comm.inline_waits; so is any kernel with
// nvgpu.warpgroup.mma): the call-free waits, whose timeout report goes to the
// runtime's mapped slots instead of printf.
// CHECK-LABEL: gpu.module @inline_waits
gpu.module @inline_waits {
  gpu.func @k(%p: !llvm.ptr, %v: i32) kernel attributes {comm.inline_waits} {
    // CHECK: llvm.call @__epic_nccl_wait_flag_i32_inline(
    %s = comm.wait_flag %p ge %v scope gpu : !llvm.ptr, i32
    // An mbarrier phase: the parity widened to i32, the bound in ns, the rank.
    // CHECK: %[[P32:.*]] = llvm.zext %{{.*}} : i1 to i32
    // CHECK: %[[NS:.*]] = llvm.mlir.constant(30000000 : i64) : i64
    // CHECK: llvm.call @__epic_nccl_wait_phase_inline(%{{.*}}, %[[P32]], %[[NS]], %{{.*}}) : (i32, i32, i64, i32) -> ()
    %parity = arith.constant true
    comm.wait_phase %v parity %parity rank %v timeout_ms 30
    gpu.return
  }
  // CHECK: gpu.func @mma(
  gpu.func @mma(%p: !llvm.ptr, %v: i32, %a: !nvgpu.warpgroup.descriptor<tensor = memref<64x16xbf16, 3>>,
                %b: !nvgpu.warpgroup.descriptor<tensor = memref<16x128xbf16, 3>>,
                %acc: !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>>) kernel {
    // CHECK: llvm.call @__epic_nccl_wait_flag_i32_inline(
    %s = comm.wait_flag %p ge %v scope gpu : !llvm.ptr, i32
    %d = nvgpu.warpgroup.mma %a, %b, %acc {transposeB}
        : !nvgpu.warpgroup.descriptor<tensor = memref<64x16xbf16, 3>>,
          !nvgpu.warpgroup.descriptor<tensor = memref<16x128xbf16, 3>>,
          !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>>
          -> !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>>
    gpu.return
  }
  // Any other kernel keeps the waits that printf their report.
  // CHECK: gpu.func @plain(
  // CHECK: llvm.call @__epic_nccl_wait_flag_i32(
  // CHECK: llvm.call @__epic_nccl_wait_phase(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (i32, i32, i64, i32) -> ()
  gpu.func @plain(%p: !llvm.ptr, %v: i32, %parity: i1) kernel {
    %s = comm.wait_flag %p ge %v scope gpu : !llvm.ptr, i32
    comm.wait_phase %v parity %parity
    gpu.return
  }
}

// -----

// Host functions and launches that carry comm values are converted too.
// CHECK-LABEL: func.func @host
// CHECK-SAME: (%[[DC:.*]]: !llvm.ptr, %[[WIN:.*]]: !llvm.ptr)
// CHECK: gpu.launch_func @kernels::@k blocks in ({{.*}}) threads in ({{.*}}) args(%[[DC]] : !llvm.ptr, %[[WIN]] : !llvm.ptr)
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window) kernel {
      gpu.return
    }
  }
  func.func @host(%dc: !comm.dev_comm, %win: !comm.window) {
    %c1 = arith.constant 1 : index
    gpu.launch_func @kernels::@k blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%dc : !comm.dev_comm, %win : !comm.window)
    return
  }
}

// -----

// One rank per process: a rank's parameter record is the table itself.
// CHECK-LABEL: gpu.module @params
gpu.module @params {
  // CHECK: gpu.func @k(%[[DC:.*]]: !llvm.ptr, %[[TABLE:.*]]: !llvm.ptr<1>)
  gpu.func @k(%dc: !comm.dev_comm, %table: !llvm.ptr<1>) kernel {
    // CHECK-NEXT: llvm.load %[[TABLE]] : !llvm.ptr<1> -> i32
    %mine = comm.rank_params %table stride 48 via %dc : !llvm.ptr<1>
    %v = llvm.load %mine : !llvm.ptr<1> -> i32
    "test.use"(%v) : (i32) -> ()
    gpu.return
  }
}

// -----

// comm.agree: a call of the shim that traps, reporting both values, when
// they differ; the call-free form (a report slot) in kernels that must not
// call.
// CHECK-LABEL: gpu.module @agree
gpu.module @agree {
  // CHECK: gpu.func @k(%[[MINE:.*]]: i64, %[[THEIRS:.*]]: i64, %[[ME:.*]]: i32, %[[PEER:.*]]: i32)
  gpu.func @k(%mine: i64, %theirs: i64, %me: i32, %peer: i32) kernel {
    // CHECK: llvm.call @__epic_nccl_agree_i64(%[[MINE]], %[[THEIRS]], %[[ME]], %[[PEER]]) : (i64, i64, i32, i32) -> ()
    comm.agree %mine, %theirs rank %me peer %peer : i64
    gpu.return
  }
  // CHECK: gpu.func @inline(
  gpu.func @inline(%mine: i64, %theirs: i64, %me: i32, %peer: i32) kernel
      attributes {comm.inline_waits} {
    // CHECK: llvm.call @__epic_nccl_agree_i64_inline(
    comm.agree %mine, %theirs rank %me peer %peer : i64
    gpu.return
  }
}
