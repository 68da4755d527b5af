//===-- CommOps.td - comm dialect operations ----------------*- tablegen -*-===//

#ifndef EPIC_DIALECT_COMM_IR_COMMOPS_TD
#define EPIC_DIALECT_COMM_IR_COMMOPS_TD

include "epic/Dialect/Comm/IR/CommAttrs.td"
include "epic/Dialect/Comm/IR/CommTypes.td"
include "mlir/Dialect/LLVMIR/LLVMTypes.td"

def Comm_FlagValue : AnyTypeOf<[I32, I64]>;


//===----------------------------------------------------------------------===//
// Ranks, teams and pointers
//===----------------------------------------------------------------------===//

// A wait's bound in milliseconds: positive and at most 2^31 (~24.9 days),
// which the lowering turns into nanoseconds of a 64-bit clock without
// overflow (the same bound as the runtime's GPU timeout).
def Comm_TimeoutMs : DefaultValuedAttr<ConfinedAttr<I64Attr,
    [IntPositive, IntMaxValue<2147483648>]>, "100000">;

def Comm_TeamOp : Comm_Op<"team", [Pure]> {
  let summary = "a team of the device communicator";
  let description = [{
    `world` is every rank; `lsa` the ranks whose memory this GPU can load and
    store directly (NVLink peers, NCCL's LSA team); `rail` the ranks with the
    same LSA rank on every node (the network team of a hierarchical scheme).
    With N nodes of M GPUs and ranks numbered node-major (world rank
    w = node * M + GPU), as NCCL's teams and the virtual backend's world are,
    (size, rank, stride) is {R, w, 1} for `world`, {M, w % M, 1} for `lsa`
    and {N, w / M, M} for `rail`.

    ```mlir
    %lsa = comm.team lsa %dc
    ```
  }];
  let arguments = (ins Comm_TeamKind:$kind, Comm_DevCommType:$comm);
  let results = (outs Comm_TeamType:$team);
  let assemblyFormat = "$kind $comm attr-dict";
}

def Comm_TeamRankOp : Comm_Op<"team_rank", [Pure]> {
  let summary = "this rank's index in a team";
  let description = [{
    ```mlir
    %me = comm.team_rank %lsa
    ```
  }];
  let arguments = (ins Comm_TeamType:$team);
  let results = (outs I32:$rank);
  let assemblyFormat = "$team attr-dict";
}

def Comm_TeamSizeOp : Comm_Op<"team_size", [Pure]> {
  let summary = "the number of ranks in a team";
  let description = [{
    ```mlir
    %n = comm.team_size %world
    ```
  }];
  let arguments = (ins Comm_TeamType:$team);
  let results = (outs I32:$size);
  let assemblyFormat = "$team attr-dict";
}

def Comm_TeamToWorldOp : Comm_Op<"team_to_world", [Pure]> {
  let summary = "world rank of a team member";
  let description = [{
    Translates a rank of `team` into the world numbering. For the world team
    it is the identity (folded).

    ```mlir
    %w = comm.team_to_world %rail, %r
    ```
  }];
  let arguments = (ins Comm_TeamType:$team, I32:$rank);
  let results = (outs I32:$world_rank);
  let assemblyFormat = "$team `,` $rank attr-dict";
  let hasFolder = 1;
}

def Comm_LocalPtrOp : Comm_Op<"local_ptr", [Pure]> {
  let summary = "address of a byte offset in this rank's copy of a window";
  let description = [{
    ```mlir
    %p = comm.local_ptr %win[%off] : !llvm.ptr
    ```
  }];
  let arguments = (ins Comm_WindowType:$window, I64:$offset);
  let results = (outs LLVM_AnyPointer:$ptr);
  let assemblyFormat = [{
    $window `[` $offset `]` attr-dict `:` qualified(type($ptr))
  }];
}

def Comm_PeerPtrOp : Comm_Op<"peer_ptr", [Pure]> {
  let summary = "address of a byte offset in a peer's copy of a window";
  let description = [{
    NCCL's LSA pointer: plain address arithmetic, no communication. Loads,
    stores, atomics and bulk copies through it reach the peer's memory over
    NVLink. `peer` is a rank of `team`, and must be a member of the LSA team
    (the result is undefined otherwise; use `comm.put` for other peers; the
    virtual backend traps, naming both ranks, when its world has several nodes
    and `peer` is in another than this rank's). When
    `peer` is this rank (`comm.team_rank` of the same team) the op is a
    `comm.local_ptr` (canonicalization).

    ```mlir
    %q = comm.peer_ptr %win[%off], %lsa, %peer : !llvm.ptr
    ```
  }];
  let arguments = (ins Comm_WindowType:$window, I64:$offset,
                       Comm_TeamType:$team, I32:$peer);
  let results = (outs LLVM_AnyPointer:$ptr);
  let assemblyFormat = [{
    $window `[` $offset `]` `,` $team `,` $peer attr-dict `:` qualified(type($ptr))
  }];
  let hasCanonicalizer = 1;
}

def Comm_RankParamsOp : Comm_Op<"rank_params", [Pure,
    AllTypesMatch<["base", "ptr"]>]> {
  let summary = "this rank's record in a table of per-rank kernel parameters";
  let description = [{
    Kernels take what differs between ranks (tensor pointers, token counts)
    through a table of fixed-size records, one per rank the launch serves:
    the nccl backend serves one rank per process, so the table holds one
    record and this is `base`; the virtual backend serves all R ranks in one
    launch, so this is `base + rank * stride`. Kernels stay identical for
    both backends.

    ```mlir
    %mine = comm.rank_params %params stride 64 via %dc : !llvm.ptr<1>
    %x = llvm.load %mine : !llvm.ptr<1> -> !llvm.ptr<1>
    ```
  }];
  let arguments = (ins LLVM_AnyPointer:$base,
                       ConfinedAttr<I64Attr, [IntPositive]>:$stride,
                       Comm_DevCommType:$comm);
  let results = (outs LLVM_AnyPointer:$ptr);
  let assemblyFormat = [{
    $base `stride` $stride `via` $comm attr-dict `:` qualified(type($base))
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$base, "int64_t":$stride, "::mlir::Value":$comm), [{
      build($_builder, $_state, base.getType(), base, $_builder.getI64IntegerAttr(stride), comm);
    }]>
  ];
}

def Comm_PeerParamsOp : Comm_Op<"peer_params", [Pure,
    AllTypesMatch<["base", "ptr"]>]> {
  let summary = "another rank's record in a table of per-rank kernel parameters";
  let description = [{
    The record of world rank `peer` in the table of `comm.rank_params`:
    `base + peer * stride`. Only a backend that serves every rank in one
    launch has the other ranks' records (and the tensors they point to) in
    its address space: the virtual backend. A kernel that reads a peer's
    record writes straight into that rank's tensors (convert-ep-to-comm's one-pass
    cached dispatch); `convert-comm-to-nvvm` refuses the op for the nccl
    backend, whose processes see only their own record.

    ```mlir
    // %table: the kernel's parameter table (what comm.rank_params takes).
    %theirs = comm.peer_params %table stride 128 peer %dst via %dc : !llvm.ptr<1>
    %recv_x = llvm.load %theirs : !llvm.ptr<1> -> !llvm.ptr<1>
    ```
  }];
  let arguments = (ins LLVM_AnyPointer:$base,
                       ConfinedAttr<I64Attr, [IntPositive]>:$stride,
                       I32:$peer,
                       Comm_DevCommType:$comm);
  let results = (outs LLVM_AnyPointer:$ptr);
  let assemblyFormat = [{
    $base `stride` $stride `peer` $peer `via` $comm attr-dict `:` qualified(type($base))
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$base, "int64_t":$stride, "::mlir::Value":$peer,
                   "::mlir::Value":$comm), [{
      build($_builder, $_state, base.getType(), base, $_builder.getI64IntegerAttr(stride), peer,
            comm);
    }]>
  ];
}

//===----------------------------------------------------------------------===//
// One-sided network operations (NCCL GIN)
//===----------------------------------------------------------------------===//

def Comm_PutOp : Comm_Op<"put", [AttrSizedOperandSegments,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "one-sided copy from a local window region into a peer's";
  let description = [{
    Copies `bytes` bytes from `src_window[src_offset]` on this rank to
    `dst_window[dst_offset]` on rank `peer` of `team` (NCCL's `ncclGin::put`).
    The copy is asynchronous: it is issued once for the cooperating group
    (`coop`), after the group has synchronized, so data the group wrote
    before is sent.

    * `signal(%id)`: once the data (and that of earlier puts on the same
      context to the same peer) has landed, increment signal `%id` on the
      peer; with `add(%v)`, add `%v` instead.
    * `counter(%id)`: increment local counter `%id` once the source has been
      read (the source may then be reused).
    * `context(%ctx)`: the network context (queue pair set) to use; signals
      belong to a context, so the receiver waits through the same one.

    `comm.flush` waits until every put of a context has read its source;
    remote completion is only known through signals or barriers.

    A put of 0 bytes without a signal or counter does nothing and is erased;
    with only a signal it is a `comm.signal` (canonicalization).

    ```mlir
    comm.put %n bytes from %win[%src] to %win[%dst] of %world peer %p via %dc
        signal(%sig) coop warp
    ```
  }];
  let arguments = (ins
    I64:$bytes,
    Comm_WindowType:$src_window, I64:$src_offset,
    Comm_WindowType:$dst_window, I64:$dst_offset,
    Comm_TeamType:$team, I32:$peer, Comm_DevCommType:$comm,
    Optional<I32>:$signal, Optional<I64>:$signal_add,
    Optional<I32>:$counter, Optional<I32>:$context_index,
    Comm_Coop:$coop);
  let assemblyFormat = [{
    $bytes `bytes` `from` $src_window `[` $src_offset `]`
    `to` $dst_window `[` $dst_offset `]` `of` $team `peer` $peer `via` $comm
    (`signal` `(` $signal^ `)`)? (`add` `(` $signal_add^ `)`)?
    (`counter` `(` $counter^ `)`)? (`context` `(` $context_index^ `)`)?
    `coop` $coop attr-dict
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

def Comm_PutValueOp : Comm_Op<"put_value", [AttrSizedOperandSegments,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "one-sided store of an inline value into a peer's window";
  let description = [{
    Writes `value` (at most 8 bytes) to `window[offset]` on rank `peer` of
    `team` without a source buffer (NCCL's `ncclGin::putValue`), with the
    same optional remote signal as `comm.put`.

    ```mlir
    comm.put_value %count to %win[%slot] of %world peer %p via %dc coop thread : i64
    ```
  }];
  let arguments = (ins
    Comm_FlagValue:$value,
    Comm_WindowType:$window, I64:$offset,
    Comm_TeamType:$team, I32:$peer, Comm_DevCommType:$comm,
    Optional<I32>:$signal, Optional<I64>:$signal_add,
    Optional<I32>:$context_index,
    Comm_Coop:$coop);
  let assemblyFormat = [{
    $value `to` $window `[` $offset `]` `of` $team `peer` $peer `via` $comm
    (`signal` `(` $signal^ `)`)? (`add` `(` $signal_add^ `)`)?
    (`context` `(` $context_index^ `)`)? `coop` $coop attr-dict `:` type($value)
  }];
  let hasVerifier = 1;
}

def Comm_SignalOp : Comm_Op<"signal", [AttrSizedOperandSegments,
    MemoryEffects<[MemWrite<Comm_SignalMemory>]>]> {
  let summary = "increment or add to a signal on a peer";
  let description = [{
    A signal-only network operation (NCCL's `ncclGin::signal`): increments
    signal `signal` on rank `peer` of `team` by one, or by `add(%v)`. Ordered
    after the earlier puts of the same context to that peer.

    ```mlir
    comm.signal %sig of %world peer %p via %dc add(%v) coop thread
    ```
  }];
  let arguments = (ins I32:$signal, Comm_TeamType:$team, I32:$peer,
                       Comm_DevCommType:$comm, Optional<I64>:$signal_add,
                       Optional<I32>:$context_index, Comm_Coop:$coop);
  let assemblyFormat = [{
    $signal `of` $team `peer` $peer `via` $comm (`add` `(` $signal_add^ `)`)?
    (`context` `(` $context_index^ `)`)? `coop` $coop attr-dict
  }];
}

def Comm_WaitSignalOp : Comm_Op<"wait_signal", [AttrSizedOperandSegments,
    MemoryEffects<[MemRead<Comm_SignalMemory>, MemWrite<Comm_WindowMemory>]>]> {
  let summary = "wait, with a bound, until a local signal reaches a value";
  let description = [{
    Spins until local signal `signal` reaches at least `expected` (a rolling
    64-bit comparison, as NCCL's `waitSignal`), then synchronizes the
    cooperating group and returns the value seen. It is an acquire at system
    scope: the data of the puts that raised the signal is visible after it.
    It is modeled as writing window memory so no window access moves above it.

    The wait is bounded: after `timeout_ms` milliseconds (default 100 s, as
    DeepEP) the lowered code prints the rank, the signal, the expected and the
    seen value, and traps. `peer`, the world rank the signal is expected from
    (if one rank raises it), only serves this report: "rank 5 waited for
    signal 9 from rank 1 (expected >= 1, seen 0)".

    ```mlir
    %seen = comm.wait_signal %sig reaches %n peer %src via %dc coop block timeout_ms 5000
    ```
  }];
  let arguments = (ins I32:$signal, I64:$expected, Optional<I32>:$peer,
                       Comm_DevCommType:$comm, Optional<I32>:$context_index,
                       Comm_Coop:$coop, Comm_TimeoutMs:$timeout_ms);
  let results = (outs I64:$seen);
  let assemblyFormat = [{
    $signal `reaches` $expected (`peer` $peer^)? `via` $comm
    (`context` `(` $context_index^ `)`)? `coop` $coop (`timeout_ms` $timeout_ms^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Comm_ReadSignalOp : Comm_Op<"read_signal", [
    MemoryEffects<[MemRead<Comm_SignalMemory>]>]> {
  let summary = "read the value of a local signal";
  let description = [{
    ```mlir
    %v = comm.read_signal %sig via %dc
    ```
  }];
  let arguments = (ins I32:$signal, Comm_DevCommType:$comm,
                       Optional<I32>:$context_index);
  let results = (outs I64:$value);
  let assemblyFormat = [{
    $signal `via` $comm (`context` `(` $context_index^ `)`)? attr-dict
  }];
}

def Comm_ResetSignalOp : Comm_Op<"reset_signal", [
    MemoryEffects<[MemWrite<Comm_SignalMemory>]>]> {
  let summary = "set a local signal back to zero";
  let description = [{
    Only safe when no update of the signal is in flight (after a barrier or a
    complete wait).

    ```mlir
    comm.reset_signal %sig via %dc
    ```
  }];
  let arguments = (ins I32:$signal, Comm_DevCommType:$comm,
                       Optional<I32>:$context_index);
  let assemblyFormat = [{
    $signal `via` $comm (`context` `(` $context_index^ `)`)? attr-dict
  }];
}

def Comm_FlushOp : Comm_Op<"flush", [
    MemoryEffects<[MemRead<Comm_WindowMemory>, MemWrite<Comm_WindowMemory>]>]> {
  let summary = "wait until every put of a context has read its source";
  let description = [{
    Local completion only (NCCL's `ncclGin::flush`): afterwards the source
    regions of earlier puts may be overwritten. Remote delivery is not implied.

    ```mlir
    comm.flush via %dc coop warp
    ```
  }];
  let arguments = (ins Comm_DevCommType:$comm, Optional<I32>:$context_index,
                       Comm_Coop:$coop);
  let assemblyFormat = [{
    `via` $comm (`context` `(` $context_index^ `)`)? `coop` $coop attr-dict
  }];
}

//===----------------------------------------------------------------------===//
// Synchronization
//===----------------------------------------------------------------------===//

def Comm_BarrierOp : Comm_Op<"barrier", [
    MemoryEffects<[MemRead, MemWrite, MemRead<Comm_WindowMemory>,
                   MemWrite<Comm_WindowMemory>, MemRead<Comm_SignalMemory>,
                   MemWrite<Comm_SignalMemory>]>]> {
  let summary = "barrier over a team, with release/acquire semantics";
  let description = [{
    Every rank of `team` arrives (releasing its earlier writes at system
    scope) and waits until all have arrived (acquiring theirs). LSA teams use
    NCCL's LSA barrier, network teams its GIN barrier. `index` selects one of
    the communicator's barrier slots: groups that run barriers concurrently
    need different slots. Bounded like every wait (`timeout_ms`). In the
    virtual backend each team kind has slots of its own, each node's LSA team
    and each rail too.

    ```mlir
    comm.barrier %lsa via %dc index %c0 coop block
    ```
  }];
  let arguments = (ins Comm_TeamType:$team, Comm_DevCommType:$comm, I32:$index,
                       Comm_Coop:$coop,
                       Comm_TimeoutMs:$timeout_ms);
  let assemblyFormat = [{
    $team `via` $comm `index` $index `coop` $coop (`timeout_ms` $timeout_ms^)?
    attr-dict
  }];
}

def Comm_FenceOp : Comm_Op<"fence", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "memory fence with an ordering and a scope";
  let description = [{
    Orders this thread's memory accesses for observers within `scope`
    (`cta`, `cluster`, `gpu` or `sys`, the latter covering peers over NVLink,
    the NIC and the host). A fence directly followed by an identical one is
    redundant (canonicalization).

    ```mlir
    comm.fence acq_rel scope sys
    ```
  }];
  let arguments = (ins Comm_Ordering:$ordering, Comm_Scope:$scope);
  let assemblyFormat = "$ordering `scope` $scope attr-dict";
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

def Comm_LoadOp : Comm_Op<"load", [
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "scoped relaxed or acquire load of a flag";
  let description = [{
    `ld.relaxed` or `ld.acquire` at `scope` (e.g. a peer's counter over
    NVLink with `sys`). An acquire load is modeled as also writing memory so
    that no later access moves above it.

    ```mlir
    %v = comm.load acquire scope sys %p : !llvm.ptr -> i32
    ```
  }];
  let arguments = (ins Comm_Ordering:$ordering, Comm_Scope:$scope,
                       LLVM_AnyPointer:$ptr);
  let results = (outs Comm_FlagValue:$value);
  let assemblyFormat = [{
    $ordering `scope` $scope $ptr attr-dict `:` qualified(type($ptr)) `->` type($value)
  }];
  let hasVerifier = 1;
}

def Comm_StoreOp : Comm_Op<"store", [
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "scoped relaxed or release store of a flag";
  let description = [{
    `st.relaxed` or `st.release` at `scope`. A release store is modeled as
    also reading memory so that no earlier access moves below it.

    ```mlir
    comm.store release scope sys %v, %p : i32, !llvm.ptr
    ```
  }];
  let arguments = (ins Comm_Ordering:$ordering, Comm_Scope:$scope,
                       Comm_FlagValue:$value, LLVM_AnyPointer:$ptr);
  let assemblyFormat = [{
    $ordering `scope` $scope $value `,` $ptr attr-dict `:` type($value) `,` qualified(type($ptr))
  }];
  let hasVerifier = 1;
}

def Comm_RedOp : Comm_Op<"red", [
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "scoped atomic reduction without a result";
  let description = [{
    `red.<ordering>.<scope>.<kind>`: atomically combines `value` into
    `*ptr` (e.g. a counter on a peer over NVLink). Ordering is `relaxed` or
    `release`; `exch` is not a reduction (use `comm.atomic_rmw`).

    ```mlir
    comm.red add release scope sys %one, %p : i32, !llvm.ptr
    ```
  }];
  let arguments = (ins Comm_AtomicKind:$kind, Comm_Ordering:$ordering,
                       Comm_Scope:$scope, Comm_FlagValue:$value,
                       LLVM_AnyPointer:$ptr);
  let assemblyFormat = [{
    $kind $ordering `scope` $scope $value `,` $ptr attr-dict `:` type($value) `,` qualified(type($ptr))
  }];
  let hasVerifier = 1;
}

def Comm_AtomicRMWOp : Comm_Op<"atomic_rmw", [
    AllTypesMatch<["value", "old"]>,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "scoped atomic read-modify-write returning the old value";
  let description = [{
    ```mlir
    %old = comm.atomic_rmw add acq_rel scope gpu %n, %p : i32, !llvm.ptr
    ```
  }];
  let arguments = (ins Comm_AtomicKind:$kind, Comm_Ordering:$ordering,
                       Comm_Scope:$scope, Comm_FlagValue:$value,
                       LLVM_AnyPointer:$ptr);
  let results = (outs Comm_FlagValue:$old);
  let assemblyFormat = [{
    $kind $ordering `scope` $scope $value `,` $ptr attr-dict `:` type($value) `,` qualified(type($ptr))
  }];
}

def Comm_AtomicCASOp : Comm_Op<"atomic_cas", [
    AllTypesMatch<["compare", "value", "old"]>,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "scoped atomic compare-and-swap returning the old value";
  let description = [{
    Atomically reads `*ptr` and, where it equals `compare`, writes `value`
    (PTX `atom.<ordering>.<scope>.cas.b32|b64`); returns the value read, so
    the swap happened iff `old == compare`. Claims of a slot shared by peers
    (a receive slot, a lock, a "first writer wins" flag) are built on it.

    ```mlir
    %old = comm.atomic_cas acq_rel scope sys %p, %expected, %desired : !llvm.ptr, i32
    ```
  }];
  let arguments = (ins Comm_Ordering:$ordering, Comm_Scope:$scope,
                       LLVM_AnyPointer:$ptr, Comm_FlagValue:$compare,
                       Comm_FlagValue:$value);
  let results = (outs Comm_FlagValue:$old);
  let assemblyFormat = [{
    $ordering `scope` $scope $ptr `,` $compare `,` $value attr-dict `:` qualified(type($ptr)) `,` type($value)
  }];
}

def Comm_WaitFlagOp : Comm_Op<"wait_flag", [
    AllTypesMatch<["value", "seen"]>, AttrSizedOperandSegments,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "wait, with a bound, until a flag in memory satisfies a comparison";
  let description = [{
    Spins with acquire loads at `scope` on `*ptr` until `*ptr <pred> value`
    (signed comparison) holds and returns the value seen. Used for NVLink
    counters written by peers with `comm.store`/`comm.red`. Bounded: after
    `timeout_ms` the lowered code prints the waiting rank and the peer it
    waited for (when given by `rank`/`peer`, which only serve this report),
    the block and thread, the address, the expected and the seen value, and
    traps. In a kernel that must not call functions — one with
    `nvgpu.warpgroup.mma` (ptxas serializes wgmma around any call, the
    printf of the report included) or marked `comm.inline_waits` — the report
    is written without a call into the runtime's mapped report slots
    (`epic/device/WaitReport.h`) instead, and the runtime names it in the
    error of the failed launch.

    ```mlir
    %seen = comm.wait_flag %p ge %n rank %me peer %src scope sys timeout_ms 1000
        : !llvm.ptr, i32
    ```
  }];
  let arguments = (ins LLVM_AnyPointer:$ptr, Comm_Predicate:$predicate,
                       Comm_FlagValue:$value, Optional<I32>:$rank, Optional<I32>:$peer,
                       Comm_Scope:$scope,
                       Comm_TimeoutMs:$timeout_ms);
  let results = (outs Comm_FlagValue:$seen);
  let assemblyFormat = [{
    $ptr $predicate $value (`rank` $rank^)? (`peer` $peer^)? `scope` $scope
    (`timeout_ms` $timeout_ms^)? attr-dict `:` qualified(type($ptr)) `,` type($value)
  }];
}

def Comm_WaitPhaseOp : Comm_Op<"wait_phase", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "wait, with a bound, until an mbarrier completes a phase";
  let description = [{
    Waits until the mbarrier at shared-memory address `barrier` (an i32, as
    `nvgpu.mbarrier.get` gives it) has completed its phase of parity
    `parity`, with the acquire semantics of `mbarrier.try_wait.parity` at
    CTA scope: the wait of a TMA pipeline's stages. `nvgpu.mbarrier.try_wait`
    waits forever; a producer and consumers that disagree on a pipeline's
    steps, a role held outside the pipeline, or a load that never lands,
    would hang the kernel silently. Bounded like `comm.wait_flag`: after
    `timeout_ms` the lowered code reports the rank (when given), block and
    thread, the barrier's address and the parity (not the barrier's state: a
    load of its address does not return it), and traps; in a kernel that
    must not call (wgmma) through the runtime's mapped report slots.

    ```mlir
    %bar = nvgpu.mbarrier.get %full[%stage] : !barriers -> i32
    comm.wait_phase %bar parity %p rank %me timeout_ms 1000
    ```
  }];
  let arguments = (ins I32:$barrier, I1:$parity, Optional<I32>:$rank,
                       Comm_TimeoutMs:$timeout_ms);
  let assemblyFormat = [{
    $barrier `parity` $parity (`rank` $rank^)? (`timeout_ms` $timeout_ms^)? attr-dict
  }];
}

def Comm_AgreeOp : Comm_Op<"agree", [MemoryEffects<[MemWrite]>]> {
  let summary = "trap, naming both ranks, unless a value equals a peer's";
  let description = [{
    Checks that `value` (this rank's) equals `theirs` (what peer `peer` sent,
    e.g. through the window before an entry barrier) and otherwise reports
    rank, peer, block, thread and both values, and traps: ranks that must
    make the same call (the same op, configuration, variant, grid) learn at
    once that they did not, instead of waiting for each other until a
    timeout. Reported like `comm.wait_flag`'s timeouts (a printf, or the
    runtime's mapped report slots in kernels that must not call).

    ```mlir
    comm.agree %mine, %theirs rank %me peer %src : i64
    ```
  }];
  let arguments = (ins I64:$value, I64:$theirs, I32:$rank, I32:$peer);
  let assemblyFormat = [{
    $value `,` $theirs `rank` $rank `peer` $peer attr-dict `:` type($value)
  }];
}

#endif // EPIC_DIALECT_COMM_IR_COMMOPS_TD
