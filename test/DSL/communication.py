# The DSL's communication maps 1:1 onto the comm dialect: peer pointers, put + flush + release
# signal, bounded waits and atomics by thread 0 (their value reaches the block through shared
# memory), the world barrier. On the nccl backend (no GIN resources in the runtime's device
# communicator) el.put is refused, and el.barrier's wait is bounded.
# RUN: %python -m epic.dsl %s ring --arg win=window --arg out='*i32' --arg N=64 \
# RUN:     | epic-opt | FileCheck %s
# RUN: %python -m epic.dsl %s claim --arg win=window --arg owner='*i32' | FileCheck %s --check-prefix=CAS
# RUN: %python -m epic.dsl %s poll --arg win=window --arg out='*i32' | FileCheck %s --check-prefix=ACQ
# RUN: not %python -m epic.dsl %s ring --arg win=window --arg out='*i32' --arg N=64 \
# RUN:     --backend nccl 2>&1 | FileCheck %s --check-prefix=NOGIN
# RUN: %python -m epic.dsl %s meet --arg out='*i32' --backend nccl --emit ptx \
# RUN:     | FileCheck %s --check-prefix=BOUND

import epic
import epic.language as el


@epic.jit
def ring(win, out, N: el.constexpr):
    me, R = el.rank(), el.num_ranks()
    data = (win + 8).to(el.int32)
    offsets = el.arange(0, N)
    el.store(data + N + offsets, me * 100 + offsets)
    nxt = (me + 1) % R
    # NOGIN: error: {{.*}}communication.py:[[@LINE+1]]: el.put in kernel ring cannot run on the nccl backend: it is a GIN put, and the runtime's NCCL device communicator has no GIN contexts or signals; copy over NVLink instead: el.store(el.peer_ptr(dst, peer) + offsets, el.load(src + offsets)), then el.signal(el.peer_ptr(flag, peer))
    el.put(el.peer_ptr(data, nxt), data + N, N, signal=el.peer_ptr(win.to(el.int64), nxt))
    el.wait(win.to(el.int64), 1)
    el.store(out + offsets, el.load(data + offsets))
    el.barrier()


@epic.jit
def meet(out):
    el.barrier(timeout_ms=500)
    el.store(out, el.rank())


@epic.jit
def claim(win, owner):
    old = el.atomic_cas(el.peer_ptr(win.to(el.int32), 0), 0, el.rank() + 1, sem="acq_rel",
                        scope="sys")
    el.store(owner, old)


@epic.jit
def poll(win, out):
    seen = el.load(el.peer_ptr(win.to(el.int32), 0), sem="acquire", scope="sys")
    if seen > 0:
        el.store(out, seen)

# CHECK-LABEL: gpu.func @ring(
# CHECK-SAME:      %[[DEV:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[OUT:.*]]: !llvm.ptr<1>) kernel
# CHECK:         %[[WORLD:.*]] = comm.team world %[[DEV]]
# CHECK:         %[[ME:.*]] = comm.team_rank %[[WORLD]]
# CHECK:         %[[R:.*]] = comm.team_size %[[WORLD]]
# CHECK:         comm.local_ptr %[[WIN]]
# CHECK:         %[[NEXT:.*]] = arith.remsi %{{.*}}, %[[R]] : i32
# CHECK:         comm.put %{{.*}} bytes from %[[WIN]][%{{.*}}] to %[[WIN]][%{{.*}}] of %[[WORLD]] peer %[[NEXT]] via %[[DEV]] coop block
# CHECK-NEXT:    comm.flush via %[[DEV]] coop block
# The whole block's writes happen before thread 0's release: a block barrier first.
# CHECK:         gpu.barrier
# CHECK-NEXT:    arith.constant 0 : i32
# CHECK-NEXT:    %[[T0:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : i32
# CHECK-NEXT:    scf.if %[[T0]]
# CHECK:           %[[SIG:.*]] = comm.peer_ptr %[[WIN]][%{{.*}}], %[[WORLD]], %[[NEXT]]
# CHECK:           comm.red add release scope sys %{{.*}}, %[[SIG]] : i64
# CHECK:         gpu.barrier
# CHECK:         scf.if
# CHECK:           %[[FLAG:.*]] = comm.local_ptr %[[WIN]]
# CHECK:           %[[SEEN:.*]] = comm.wait_flag %[[FLAG]] ge %{{.*}} rank %{{.*}} scope sys timeout_ms 10000 : !llvm.ptr<1>, i64
# CHECK:           memref.store %[[SEEN]]
# CHECK:         gpu.barrier
# CHECK:         comm.barrier %[[WORLD]] via %[[DEV]] index %{{.*}} coop block timeout_ms 10000

# CAS-LABEL: gpu.func @claim(
# CAS:         scf.if
# CAS:           %[[P:.*]] = comm.peer_ptr
# CAS:           %[[OLD:.*]] = comm.atomic_cas acq_rel scope sys %[[P]], %{{.*}}, %{{.*}} : !llvm.ptr<1>, i32
# CAS:           memref.store %[[OLD]]
# CAS:         gpu.barrier
# CAS:         %[[SEEN:.*]] = memref.load
# CAS:         llvm.store %[[SEEN]], %{{.*}} {alignment = 4 : i64} : i32, !llvm.ptr<1>

# The NCCL shim's LSA barrier arrives with release stores into the peers' inboxes, then polls its
# own against the clock; a timeout reports (a call) and traps (NCCL's own wait never ends).
# BOUND-LABEL: .entry meet(
# BOUND:         st.release.sys.b32
# BOUND:         ld.acquire.sys.b32
# BOUND:         %globaltimer
# BOUND:         call.uni
# BOUND:         trap

# An acquire load is one observation per program instance: thread 0 loads, the block shares it
# (threads that each loaded a changing counter could take different branches).
# ACQ-LABEL: gpu.func @poll(
# ACQ:         scf.if
# ACQ:           %[[V:.*]] = comm.load acquire scope sys %{{.*}} : !llvm.ptr<1> -> i32
# ACQ-NEXT:      memref.store %[[V]]
# ACQ:         gpu.barrier
# ACQ-NEXT:    %[[SEEN:.*]] = memref.load
# ACQ-NEXT:    gpu.barrier
# ACQ:         arith.cmpi sgt, %[[SEEN]]
