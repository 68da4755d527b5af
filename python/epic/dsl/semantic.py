"""The meaning of each ``epic.language`` primitive as builder calls (Triton's ``semantic``):
:class:`Semantic` is :class:`~epic.dsl.semantic_core.CoreSemantic` (values, arithmetic, casts,
blocks, program ids) plus memory, atomics, reductions and communication. Each primitive is a
method named as the builtin (``load``, ``put``, ...) taking the call's AST node (where its errors
point) and then the builtin's arguments: typed values (:class:`Val`) or Python constants.

* reductions: in the thread (``vector.reduction``), across the warp (``gpu.shuffle xor``), across
  warps (shared memory, in warp order); ``el.cumsum`` the same way with ``gpu.shuffle up``;
  atomics (``comm.atomic_rmw``/``comm.atomic_cas``) and waits run on thread 0 and their value
  reaches the block through shared memory;
* communication: ``el.rank``/``num_ranks`` are the world team's ``comm.team_rank``/``team_size``,
  ``el.signal`` a release ``comm.red``, ``el.wait`` a bounded ``comm.wait_flag`` by thread 0
  then a block barrier, ``el.put`` a ``comm.put`` of the block then a release signal (GIN on
  the nccl backend, which has no GIN resources: refused there, with ``el.flush``, see
  checks.check_backend), ``el.barrier`` a bounded ``comm.barrier`` of the world team.

What the compiler does not handle yet raises :class:`~epic.dsl.checks.CompileError` at the
call's line (gathers and blocks of atomics are next).
"""

from __future__ import annotations

import ast

import numpy as np

from . import checks
from .semantic_core import (_FLOAT, CallSite, CoreSemantic, Val, _align, _bits, _ir_type,
                            _np_of, mlir_type, with_divisor)

__all__ = ["CallSite", "Semantic", "Val", "mlir_type"]

# The comm dialect's enums (dialect/include/epic/Dialect/Comm/IR/CommBase.td).
_ORDERING = {"relaxed": 0, "acquire": 1, "release": 2, "acq_rel": 3, "sc": 4}
_SCOPE = {"cta": 0, "block": 0, "cluster": 1, "gpu": 2, "sys": 3}
_RELEASING = ("release", "acq_rel", "sc")


class Semantic(CoreSemantic):
    """Every primitive of ``epic.language`` (see the module docstring)."""

    # --- memory
    def peer_ptr(self, node, p, peer):
        if not (isinstance(p, Val) and p.window) or p.offsets is not None:
            raise self.error("el.peer_ptr takes a scalar pointer into the window", node)
        peer = self.lift(peer, None)
        if peer.dtype != "i32":  # ranks are i32 in the comm dialect
            peer = self.convert(peer, np.int32, node)
        return with_divisor(Val(p.handle, p.dtype, None, p.pointer, True, peer), p.divisor)

    def load(self, node, p, mask=None, other=0, sem="relaxed", scope="gpu"):
        if not (isinstance(p, Val) and p.pointer):
            raise self.error("el.load takes a pointer", node)
        element = p.pointer
        if sem != "relaxed" or p.offsets is None:
            if p.offsets is not None:
                raise self.error("acquire loads take a scalar pointer", node)
            if sem == "relaxed":
                return Val(self.op("llvm.load", [self.address(p, node)], [_ir_type(element)],
                                   {"alignment": f"{_align(1, element)} : i64"}).result(0), element)
            # Once per program instance (thread 0), the value broadcast: every thread must act
            # on the same observation of a flag or counter that other agents are changing.
            attrs = {"ordering": f"{_ORDERING[sem]} : i32", "scope": f"{_SCOPE[scope]} : i32"}
            return self.on_thread0(node, element, lambda: self.op(
                "comm.load", [self.address(p, node)], [element], attrs).result(0))
        lanes, ptr = self.lanes(p.block), self.address(p, node)
        vtype = f"vector<{lanes}x{_ir_type(element)}>"
        live = self.combine_masks(mask, p.block, node)
        aligned = self.block_alignment(p)

        def whole():
            return self.op("llvm.load", [ptr], [vtype], {"alignment": f"{aligned} : i64"}).result(0)

        if live is None:
            return Val(whole(), element, p.block)
        passthru = self.broadcast(self.lift(other, Val(None, element)), p.block)

        def masked():
            return self.op("llvm.intr.masked.load", [ptr, live, passthru], [vtype],
                           {"alignment": f"{_align(1, element)} : i32"}).result(0)

        return Val(self.unless_all_live(live, lanes, whole, masked, vtype), element, p.block)

    def block_alignment(self, p):
        """The alignment of this thread's part of a pointer block: its `lanes` contiguous
        elements start at the moved pointer + tid x lanes elements."""
        lanes, size = self.lanes(p.block), max(1, _bits(p.pointer) // 8)
        return max(size, min(p.divisor, lanes * size))

    def unless_all_live(self, live, lanes, whole, masked, vtype=None):
        """`whole()` (a plain, vectorizable access) where all of this thread's lanes are live,
        `masked()` (LLVM scalarizes masked accesses on NVPTX) only at a block's ragged edge."""
        if lanes == 1:
            return masked()
        every = self.op("vector.reduction", [live], ["i1"],
                        {"kind": "#vector.kind<and>"}).result(0)
        branch = self.op("scf.if", [every], [vtype] if vtype else [], regions=2)
        for region, body in ((0, whole), (1, masked)):
            self.enter(branch.add_block(region))
            result = body()
            self.op("scf.yield", [result] if vtype else [])
            self.leave()
        return branch.result(0) if vtype else None

    def combine_masks(self, mask, block, node):
        active = self.active(block)
        if active is not None:
            active = self.broadcast(active, block)
        if mask is None:
            return active
        if not isinstance(mask, Val) or not mask.block:
            raise self.error("masks are blocks of comparisons", node)
        if active is None:
            return mask
        return self.binary(ast.BitAnd(), mask, active, node)

    def store(self, node, p, value, mask=None, sem="relaxed", scope="gpu"):
        if not (isinstance(p, Val) and p.pointer):
            raise self.error("el.store takes a pointer", node)
        element = p.pointer
        value = self.lift(value, Val(None, element))
        if value.dtype != element:  # stores convert to the pointer's element type
            value = self.convert(value, _np_of(element), node)
        if p.offsets is None:
            if value.block:
                raise self.error("a block stored through a scalar pointer", node)
            if sem == "relaxed":  # every thread stores the same value: one store in effect
                self.op("llvm.store", [value, self.address(p, node)], [],
                        {"alignment": f"{_align(1, element)} : i64"})
                return None
            if element not in ("i32", "i64"):
                raise self.error(f"release stores of {element}: i32 and i64 are supported", node)
            attrs = {"ordering": f"{_ORDERING[sem]} : i32", "scope": f"{_SCOPE[scope]} : i32"}
            # One release store for the block, after everything its threads wrote.
            self.thread0(node, lambda: self.op("comm.store", [value, self.address(p, node)], [],
                                               attrs), release=sem in _RELEASING)
            return None
        value = self.broadcast(value, p.block)
        ptr = self.address(p, node)
        live = self.combine_masks(mask, p.block, node)
        aligned = self.block_alignment(p)

        def whole():
            self.op("llvm.store", [value, ptr], [], {"alignment": f"{aligned} : i64"})

        def masked():
            self.op("llvm.intr.masked.store", [value, ptr, live], [],
                    {"alignment": f"{_align(1, element)} : i32"})

        if live is None:
            whole()
        else:
            self.unless_all_live(live, self.lanes(p.block), whole, masked)
        return None

    # --- reductions: in the thread, across the warp (shuffles), across warps (shared memory)
    _REDUCE = {"sum": ("add", "addf", "addi"), "max": ("maximumf", "maximumf", "maxsi"),
               "min": ("minimumf", "minimumf", "minsi")}

    def reduce(self, node, x, what):
        if not isinstance(x, Val) or not x.block:
            return x  # a scalar is its own reduction
        floating = x.dtype in _FLOAT
        vector_kind, fop, iop = self._REDUCE[what]
        combine_op = f"arith.{fop if floating else iop}"
        if what != "sum" and not floating:
            vector_kind = "maxsi" if what == "max" else "minsi"
        identity = {"sum": 0, "max": float("-inf") if floating else -(1 << 31),
                    "min": float("inf") if floating else (1 << 31) - 1}[what]
        if x.dtype not in ("f32", "i32"):
            raise self.error(f"el.{what} of {x.dtype} blocks: cast to f32 or i32 first", node)
        active = self.active(x.block)
        if active is not None:  # threads past the block contribute the identity
            x = self.where(node, active, x, self.const(identity, x.dtype))
        attrs = {"kind": f"#vector.kind<{vector_kind}>"}
        value = Val(self.op("vector.reduction", [x], [x.dtype], attrs).result(0), x.dtype)

        def combine(a, b):
            return Val(self.op(combine_op, [a, b], [x.dtype]).result(0), x.dtype)

        width = self.const(32, "i32")
        for offset in (16, 8, 4, 2, 1):
            other = self.op("gpu.shuffle", [value, self.const(offset, "i32"), width],
                            [x.dtype, "i1"], {"mode": "#gpu<shuffle_mode xor>"}).result(0)
            value = combine(value, Val(other, x.dtype))
        warps = self.threads // 32
        if warps == 1:
            return value
        buffer = self.workgroup_buffer(warps, x.dtype)
        warp = self.index_cast(self.binary(ast.FloorDiv(), self.tid, 32, node), "index")
        lane = self.binary(ast.Mod(), self.tid, 32, node)
        self.when(self.compare(ast.Eq(), lane, 0, node),
                  lambda: self.op("memref.store", [value, buffer, warp]))
        self.op("gpu.barrier")
        total = None
        for w in range(warps):  # every thread adds the warps' partials in warp order
            index = Val(self.op("arith.constant", results=["index"],
                                attributes={"value": f"{w} : index"}).result(0), "index")
            part = Val(self.op("memref.load", [buffer, index], [x.dtype]).result(0), x.dtype)
            total = part if total is None else combine(total, part)
        self.op("gpu.barrier")  # the buffer may be reused
        return total

    # --- atomics: one per program instance, on thread 0
    def atomic_add(self, node, p, value, mask=None, sem="relaxed", scope="gpu"):
        """One atomic per program instance (thread 0), its old value broadcast to the block."""
        if not (isinstance(p, Val) and p.pointer) or p.offsets is not None or mask is not None:
            raise self.error("el.atomic_add takes a scalar pointer (blocks of atomics are not "
                             "supported by the compiler yet)", node)
        if p.pointer not in ("i32", "i64"):
            raise self.error(f"el.atomic_add on {p.pointer}: i32 and i64 are supported", node)
        amount = self.lift(value, Val(None, p.pointer))
        return self.on_thread0(node, p.pointer, lambda: self.op(
            "comm.atomic_rmw", [amount, self.address(p, node)], [p.pointer],
            {"kind": "0 : i32", "ordering": f"{_ORDERING[sem]} : i32",
             "scope": f"{_SCOPE[scope]} : i32"}).result(0), sem)

    def atomic_cas(self, node, p, compare, value, sem="relaxed", scope="gpu"):
        """One compare-and-swap per program instance (thread 0, comm.atomic_cas), the old value
        broadcast to the block: the swap happened iff it equals `compare`."""
        if not (isinstance(p, Val) and p.pointer) or p.offsets is not None:
            raise self.error("el.atomic_cas takes a scalar pointer", node)
        if p.pointer not in ("i32", "i64"):
            raise self.error(f"el.atomic_cas on {p.pointer}: i32 and i64 are supported", node)
        like = Val(None, p.pointer)
        expected, desired = self.lift(compare, like), self.lift(value, like)
        for name, v in (("compare", expected), ("value", desired)):
            if v.block or v.dtype != p.pointer:
                raise self.error(f"el.atomic_cas: {name} must be a {p.pointer} scalar, got "
                                 f"{self.vtype(v)}", node)
        return self.on_thread0(node, p.pointer, lambda: self.op(
            "comm.atomic_cas", [self.address(p, node), expected, desired], [p.pointer],
            {"ordering": f"{_ORDERING[sem]} : i32", "scope": f"{_SCOPE[scope]} : i32"}).result(0),
            sem)

    def on_thread0(self, node, dtype, compute, sem="relaxed"):
        """`compute()` on thread 0 only; the value it returns reaches the whole block (through
        shared memory, between two block barriers). A releasing `sem` waits for the block first
        (see thread0)."""
        if sem in _RELEASING:
            self.op("gpu.barrier")
        buffer = self.workgroup_buffer(1, dtype)
        zero = Val(self.op("arith.constant", results=["index"],
                           attributes={"value": "0 : index"}).result(0), "index")
        self.when(self.compare(ast.Eq(), self.tid, 0, node),
                  lambda: self.op("memref.store", [compute(), buffer, zero]))
        self.op("gpu.barrier")
        value = Val(self.op("memref.load", [buffer, zero], [dtype]).result(0), dtype)
        self.op("gpu.barrier")  # read by all before a next use writes it again
        return value

    def exp(self, node, x):
        """2^(x log2 e): PTX's ex2.approx.ftz (flushes subnormal results to 0; within 2 ulp)."""
        if not isinstance(x, Val):
            return float(np.exp(np.float32(x)))
        if x.dtype != "f32":
            raise self.error(f"el.exp of {x.dtype} values: cast them to f32 first", node)
        scaled = self.binary(ast.Mult(), x, self.const(1.4426950408889634, "f32"), node)
        # Lane by lane, as PTX (the NVVM lowering sends exp2 to libdevice, which is not linked).
        attrs = {"ptxCode": '"ex2.approx.ftz.f32 $0, $1;"',
                 "operandSegmentSizes": "array<i32: 1, 0, 0>"}
        return self.assemble([self.op("nvvm.inline_ptx", [lane], ["f32"], attrs).result(0)
                              for lane in self.lanes_of(scaled)], "f32", x.block)

    def sum(self, node, x, axis=0):
        return self.reduce(node, x, "sum")

    def max(self, node, x, axis=0):
        return self.reduce(node, x, "max")

    def min(self, node, x, axis=0):
        return self.reduce(node, x, "min")

    def cumsum(self, node, x, axis=0):
        """Inclusive prefix sum of a block: along this thread's elements, then the threads'
        totals across the warp (gpu.shuffle up), then the warps' totals through shared memory.
        Integer sums are exact; float sums associate per thread, warp and block (not strictly
        left to right)."""
        if not isinstance(x, Val) or not x.block:
            return x
        if x.dtype not in ("f32", "i32"):
            raise self.error(f"el.cumsum of {x.dtype} blocks: cast to f32 or i32 first", node)
        active = self.active(x.block)
        if active is not None:  # threads past the block add nothing
            x = self.where(node, active, x, self.const(0, x.dtype))
        add = "arith.addf" if x.dtype in _FLOAT else "arith.addi"

        def plus(a, b):
            return self.op(add, [a, b], [x.dtype]).result(0)

        running = []
        for element in self.lanes_of(x):
            running.append(element if not running else plus(running[-1], element))
        total, zero = running[-1], self.const(0, x.dtype).handle
        width = self.const(32, "i32")

        def shuffle_up(value, offset):
            shuffle = self.op("gpu.shuffle", [value, self.const(offset, "i32"), width],
                              [x.dtype, "i1"], {"mode": "#gpu<shuffle_mode up>"})
            # Lanes below `offset` get no value (valid = false): they add nothing.
            return self.op("arith.select", [shuffle.result(1), shuffle.result(0), zero],
                           [x.dtype]).result(0)

        inclusive = total  # of the threads' totals across the warp
        for offset in (1, 2, 4, 8, 16):
            inclusive = plus(inclusive, shuffle_up(inclusive, offset))
        before = shuffle_up(inclusive, 1)  # the totals of the warp's earlier threads
        warps = self.threads // 32
        if warps > 1:
            buffer = self.workgroup_buffer(warps, x.dtype)
            warp = self.binary(ast.FloorDiv(), self.tid, 32, node)
            lane = self.binary(ast.Mod(), self.tid, 32, node)
            self.when(self.compare(ast.Eq(), lane, 31, node), lambda: self.op(
                "memref.store", [inclusive, buffer, self.index_cast(warp, "index")]))
            self.op("gpu.barrier")
            earlier = zero
            for w in range(warps - 1):  # the totals of earlier warps, in warp order
                index = Val(self.op("arith.constant", results=["index"],
                                    attributes={"value": f"{w} : index"}).result(0), "index")
                part = self.op("memref.load", [buffer, index], [x.dtype]).result(0)
                counts = self.compare(ast.Lt(), self.const(w, "i32"), warp, node)
                earlier = plus(earlier, self.op("arith.select", [counts, part, zero],
                                                [x.dtype]).result(0))
            self.op("gpu.barrier")  # the buffer may be reused
            before = plus(earlier, before)
        return self.assemble([plus(before, r) for r in running], x.dtype, x.block)

    # --- communication
    def fence(self, node, scope="sys"):
        self.op("comm.fence", [], [], {"ordering": f"{_ORDERING['acq_rel']} : i32",
                                       "scope": f"{_SCOPE[scope]} : i32"})

    def barrier(self, node, timeout_ms=10000):
        if (message := checks.timeout_error("barrier", timeout_ms)) is not None:
            raise self.error(message, node)
        block = self.program_id(node)
        self.op("comm.barrier", [self.world, self.dev_comm, block], [],
                {"coop": "2 : i32", "timeout_ms": f"{int(timeout_ms)} : i64"})

    def thread0(self, node, body, release=False):
        """`body()` on thread 0 only, then a block barrier (what it did, the block sees). With
        `release`, a block barrier first: then thread 0's release covers what every thread of
        the block wrote before (barrier, then one release: PTX causality is transitive)."""
        if release:
            self.op("gpu.barrier")
        self.when(self.compare(ast.Eq(), self.tid, self.const(0, "i32"), node), body)
        self.op("gpu.barrier")

    def put(self, node, dst, src, count, signal=None, signal_value=1):
        """The block copies `count` elements of its window to a peer's (comm.put, LSA or GIN),
        then, with `signal`, adds `signal_value` to that word on the peer (release)."""
        self.served(node, "put")
        for name, p in (("dst", dst), ("src", src)):
            if not (isinstance(p, Val) and p.window and p.offsets is None):
                raise self.error(f"el.put: {name} must be a scalar pointer into the window", node)
        if dst.peer is None or src.peer is not None:
            raise self.error("el.put copies from this rank's window to a peer's (el.peer_ptr)",
                             node)
        size = np.dtype(_np_of(src.pointer)).itemsize
        nbytes = self.binary(ast.Mult(), self.widen(self.lift(count, None)),
                             self.const(size, "i64"), node)
        self.op("comm.put", [nbytes, self.window, src, self.window, dst, self.world, dst.peer,
                             self.dev_comm], [],
                {"coop": "2 : i32",
                 "operandSegmentSizes": "array<i32: 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0>"})
        self.flush(node)  # the data is out before the signal says so
        if signal is not None:
            self.signal(node, signal, signal_value)

    def flush(self, node):
        self.served(node, "flush")
        self.op("comm.flush", [self.dev_comm], [], {"coop": "2 : i32"})

    def served(self, node, name):
        """Refuses el.`name` where the backend cannot serve it (checks.check_backend refused
        the calls it resolves; this, the rest, e.g. through a local name)."""
        if (message := checks.unavailable_error(self.backend, name,
                                                self.kernel_name)) is not None:
            raise self.error(message, node)

    def signal(self, node, p, value=1):
        if not (isinstance(p, Val) and p.window and p.offsets is None):
            raise self.error("el.signal takes a scalar pointer into the window", node)
        amount = self.lift(value, Val(None, p.pointer))
        self.thread0(node, lambda: self.op(
            "comm.red", [amount, self.address(p, node)], [],
            {"kind": "0 : i32", "ordering": f"{_ORDERING['release']} : i32",
             "scope": f"{_SCOPE['sys']} : i32"}), release=True)

    def wait(self, node, p, value, timeout_ms=10000):
        """Thread 0 waits (bounded); the value it saw reaches the whole block."""
        if (message := checks.timeout_error("wait", timeout_ms)) is not None:
            raise self.error(message, node)
        if not (isinstance(p, Val) and p.window and p.offsets is None):
            raise self.error("el.wait takes a scalar pointer into the window", node)
        expected = self.lift(value, Val(None, p.pointer))
        rank = self.rank(node)
        return self.on_thread0(node, p.pointer, lambda: self.op(
            "comm.wait_flag", [self.address(p, node), expected, rank], [p.pointer],
            {"predicate": "2 : i32", "scope": f"{_SCOPE['sys']} : i32",
             "timeout_ms": f"{int(timeout_ms)} : i64",
             "operandSegmentSizes": "array<i32: 1, 1, 1, 0>"}).result(0))
