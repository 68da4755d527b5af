"""The meaning of the DSL's values and of the primitives on them: typed values in, builder
calls out (Triton's ``semantic``). This part: values (:class:`Val`), constants, arithmetic,
comparisons, casts (FP8 included), pointer arithmetic, blocks and program ids;
:mod:`epic.dsl.semantic` adds memory, atomics, reductions and communication on top. The AST
visitor (:mod:`epic.dsl.codegen`) walks the kernel and calls these; ``epic.language``'s
builtins reach them through the visitor (:class:`CallSite`).

Execution model (one ``gpu.func`` per kernel):

* a program instance is a thread block of ``T = 32 x num_warps`` threads; ``el.program_id``
  is its block index on its rank (the virtual backend numbers blocks per rank);
* a scalar is one value every thread holds alike;
* a block of ``B`` elements (``el.arange(0, B)``) is spread over the threads: thread ``t`` holds
  elements ``[t V, t V + V)`` in a ``vector<V x type>``, ``V = max(1, B / T)``; when ``B < T``
  the threads past ``B`` hold nothing and every memory access of theirs is masked off;
* a pointer is an ``!llvm.ptr<1>`` (a tensor argument) or a byte offset into the kernel's
  symmetric window (``!comm.window``, ``el.peer_ptr`` reaching a peer's copy); a block of
  pointers must be ``scalar + contiguous block`` (16-byte vector accesses per thread);
* FP8 e4m3 values live in ``i8`` (LLVM has no FP8 type); casts use the hardware's
  ``cvt.rn.satfinite.e4m3x2.f32`` / ``cvt.rn.f16x2.e4m3x2`` (``nvvm.convert.*``).

Every method that can fail takes ``node``: the AST node of the source the error names (the
visitor's ``error``/``constant`` turn it into the kernel's file and line, through inlined
calls too); the semantic layer itself never looks at the AST.
"""

from __future__ import annotations

import ast
import functools

import numpy as np

from .checks import CompileError

_MLIR_TYPES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "f8E4M3FN",
    "int32": "i32", "int64": "i64", "uint8": "i8", "bool": "i1",
}
_FLOAT = {"f32", "f16", "bf16", "f8E4M3FN"}


def mlir_type(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _MLIR_TYPES:
        raise CompileError(f"element type {name} is not supported by the compiler")
    return _MLIR_TYPES[name]


class Val:
    """A DSL value: an IR value with its element type, block size (None: scalar) and, for
    pointers, what they point at."""

    def __init__(self, handle, dtype, block=None, pointer=None, window=False, peer=None,
                 offsets=None):
        self.handle, self.dtype, self.block = handle, dtype, block
        self.pointer = pointer  # element type pointed at, for pointers
        self.window = window    # a byte offset into the window (handle: i64 bytes)
        self.peer = peer        # window pointers into a peer's copy: the peer rank (i32)
        self.offsets = offsets  # pointer blocks: the element offsets (a contiguous block)
        self.contiguous_base = None  # blocks `s + arange`: s (a scalar i32 Val)
        # A power of two known to divide the value (integers), or the address's known byte
        # alignment (pointers): what lets block accesses be 16-byte vectors (Triton's
        # divisibility analysis, reduced to what the kernels' address arithmetic needs).
        self.divisor = 1


_MAX_DIVISOR = 1 << 16


def lowbit(n) -> int:
    """The largest power of two dividing the integer n (0: any, capped)."""
    n = int(n)
    return _MAX_DIVISOR if n == 0 else min(_MAX_DIVISOR, n & -n)


def divisor_of(v) -> int:
    if isinstance(v, Val):
        return v.divisor
    if isinstance(v, (bool, np.bool_)):
        return 1
    if isinstance(v, (int, np.integer)):
        return lowbit(v)
    return 1


def with_divisor(v, divisor):
    v.divisor = max(1, min(_MAX_DIVISOR, int(divisor)))
    return v


def _fold(op, a, b):
    """Constants (constexprs, literals) fold in Python."""
    import operator

    table = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
             ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
             ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Pow: operator.pow,
             ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
             ast.Eq: operator.eq, ast.NotEq: operator.ne}
    return table[type(op)](a, b)


def _ir_type(dtype):
    """The IR type that holds values of `dtype` (FP8 in i8: LLVM has no FP8 type)."""
    return "i8" if dtype == "f8E4M3FN" else dtype


def _np_of(mlir):
    import ml_dtypes

    return {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
            "f8E4M3FN": ml_dtypes.float8_e4m3fn, "i32": np.int32, "i64": np.int64,
            "i8": np.uint8, "i1": np.bool_}[mlir]


def _bits(mlir):
    return {"f32": 32, "f16": 16, "bf16": 16, "f8E4M3FN": 8, "i32": 32, "i64": 64, "i8": 8,
            "i1": 1}[mlir]


def _llvm_elem(mlir):
    return {"f8E4M3FN": "i8", "i1": "i8"}.get(mlir, mlir)


def _align(lanes, mlir):
    size = max(1, _bits(mlir) // 8) * lanes
    return min(16, size & -size)


class CallSite:
    """The semantic layer as one call of an ``epic.language`` builtin sees it: the builtin's
    ``_semantic``. Its attributes are the semantic layer's primitives with the call's AST node
    bound first, so errors name the call's line."""

    def __init__(self, semantic, node):
        self._semantic, self._node = semantic, node

    def __getattr__(self, name):
        return functools.partial(getattr(self._semantic, name), self._node)


class CoreSemantic:
    """Builds one kernel's IR through ``epic._ir``'s builder (see the module docstring)."""

    def __init__(self, builder, threads, backend, kernel_name, error, constant):
        self.b, self.threads, self.backend = builder, threads, backend
        self.kernel_name = kernel_name  # what backend refusals name (checks.unavailable_error)
        # The visitor's: `error(message, node)` -> a CompileError at the node's line (None: the
        # statement being generated); `constant(node, compute, *args)` folds constants.
        self.error, self.constant = error, constant
        self.blocks = []  # where ops go: the innermost region's block last
        self.scratch = 0  # workgroup buffers made so far (one per cross-warp reduction)
        # The kernel's, set by the visitor once the kernel function exists: its gpu.func, the
        # device communicator, the window (None: none), the world team, the thread id (i32).
        self.kernel_func = self.dev_comm = self.window = self.world = self.tid = None

    # --- where ops go, and the IR's types
    def enter(self, block):
        self.blocks.append(block)
        self.b.set_insertion_point_to_end(block)

    def leave(self):
        self.blocks.pop()
        self.b.set_insertion_point_to_end(self.blocks[-1])

    def op(self, name, operands=(), results=(), attributes=None, regions=0):
        return self.b.create(name, [o.handle if isinstance(o, Val) else o for o in operands],
                             list(results), attributes or {}, regions)

    def const(self, value, dtype):
        if dtype == "f8E4M3FN":  # FP8 lives in i8 (LLVM has no FP8 type): its bit pattern
            bits = int(np.array(value, dtype=np.float32).astype(_np_of(dtype)).view(np.uint8))
            return Val(self.op("arith.constant", results=["i8"],
                               attributes={"value": f"{bits - 256 if bits > 127 else bits} : i8"})
                       .result(0), dtype)
        if dtype in _FLOAT and not np.isfinite(value):  # MLIR spells these as bit patterns
            bits = np.array(value, dtype=_np_of(dtype)).view(f"u{np.dtype(_np_of(dtype)).itemsize}")
            text = f"{hex(int(bits))} : {dtype}"
        elif dtype in _FLOAT:
            text = f"{float(value)!r} : {dtype}"
        else:
            text = f"{int(value)} : {dtype}"
        out = Val(self.op("arith.constant", results=[dtype], attributes={"value": text}).result(0),
                  dtype)
        if dtype not in _FLOAT and dtype != "i1":
            with_divisor(out, lowbit(value))
        return out

    def vtype(self, v):
        t = _ir_type(v.dtype)
        return f"vector<{self.lanes(v.block)}x{t}>" if v.block else t

    def lanes(self, block):
        return max(1, block // self.threads)

    def index_cast(self, v, to):
        return with_divisor(Val(self.op("arith.index_cast", [v], [to]).result(0), to), v.divisor)

    def broadcast(self, v, block):
        if v.block:
            return v
        out = Val(self.op("vector.broadcast", [v],
                          [f"vector<{self.lanes(block)}x{_ir_type(v.dtype)}>"]).result(0),
                  v.dtype, block)
        return out

    def lift(self, value, like):
        """A Python constant as a value of `like`'s element type."""
        if isinstance(value, Val):
            return value
        if isinstance(value, (bool, int, float, np.number)):
            dtype = like.dtype if like is not None else ("f32" if isinstance(value, float)
                                                         else "i32")
            if isinstance(value, float) and dtype not in _FLOAT:
                dtype = "f32"
            return self.const(value, dtype)
        raise self.error(f"cannot use a {type(value).__name__} here")

    # --- values
    def window_base(self):
        """Byte 0 of the window (windows start on pages: the runtime rounds every rank's window
        to 4096 bytes, NCCL registers whole pages)."""
        return with_divisor(Val(self.const(0, "i64").handle, "i8", pointer="i8", window=True),
                            4096)

    def like(self, v, handle):
        out = Val(handle, v.dtype, v.block, v.pointer, v.window, v.peer, v.offsets)
        return out

    def truth(self, v, node):
        if not isinstance(v, Val):
            return self.const(int(bool(v)), "i1")
        if v.dtype == "i1":
            return v
        return self.compare(ast.NotEq(), v, self.lift(0, v), node)

    # --- arithmetic and comparisons (Triton's promotion)
    def unify(self, a, b, node):
        if not isinstance(a, Val) and not isinstance(b, Val):
            return a, b
        a, b = self.lift(a, b if isinstance(b, Val) else None), self.lift(b, a)
        if a.dtype != b.dtype:  # Triton's promotion: the wider integer, the float, the wider float
            target = self.promoted(a.dtype, b.dtype)
            if target is None:
                raise self.error(f"mixed element types {a.dtype} and {b.dtype}: cast one with "
                                 ".to(...)", node)
            a, b = self.convert(a, _np_of(target), node), self.convert(b, _np_of(target), node)
        block = a.block or b.block
        if a.block and b.block and a.block != b.block:
            raise self.error(f"blocks of {a.block} and {b.block} elements", node)
        if block:
            a, b = self.broadcast(a, block), self.broadcast(b, block)
        return a, b

    @staticmethod
    def promoted(x, y):
        """The common element type of a binary operation, or None (i1 and bool stay apart)."""
        if "i1" in (x, y):
            return None
        fx, fy = x in _FLOAT, y in _FLOAT
        if fx and fy:
            return x if _bits(x) > _bits(y) else y if _bits(y) > _bits(x) else "f32"
        if fx or fy:
            return x if fx else y
        return x if _bits(x) >= _bits(y) else y

    def binary(self, op, a, b, node):
        if isinstance(a, Val) and a.pointer:
            return self.offset_pointer(a, b, op, node)
        if not isinstance(a, Val) and not isinstance(b, Val):
            return self.constant(node, _fold, op, a, b)
        # `s + arange` stays contiguous through adding or subtracting scalars.
        a_base = a.contiguous_base if isinstance(a, Val) and a.block else None
        b_base = b.contiguous_base if isinstance(b, Val) and b.block else None
        a_scalar = not (isinstance(a, Val) and a.block)
        b_scalar = not (isinstance(b, Val) and b.block)
        base = None
        if isinstance(op, (ast.Add, ast.Sub)) and a_base is not None and b_scalar:
            base = self.binary(op, a_base, b, node)
        elif isinstance(op, ast.Add) and b_base is not None and a_scalar:
            base = self.binary(op, a, b_base, node)
        x, y = self.unify(a, b, node)
        if x.dtype == "f8E4M3FN":
            raise self.error("arithmetic on FP8 values: cast them to f32 first", node)
        floating = x.dtype in _FLOAT
        names = {ast.Add: ("addf", "addi"), ast.Sub: ("subf", "subi"), ast.Mult: ("mulf", "muli"),
                 ast.Div: ("divf", None), ast.FloorDiv: (None, "divsi"), ast.Mod: (None, "remsi"),
                 ast.BitAnd: (None, "andi"), ast.BitOr: (None, "ori"), ast.BitXor: (None, "xori"),
                 ast.LShift: (None, "shli"), ast.RShift: (None, "shrsi")}
        pair = names.get(type(op))
        name = pair and pair[0 if floating else 1]
        if not name:
            raise self.error(f"{type(op).__name__} is not supported on {x.dtype}", node)
        if name in ("divsi", "remsi") and not isinstance(b, Val) and b == 0:
            self.constant(node, _fold, op, 1, 0)  # undefined on the GPU: Python's error
        out = Val(self.op(f"arith.{name}", [x, y], [self.vtype(x)]).result(0), x.dtype, x.block)
        out.contiguous_base = base
        if not floating:
            da, db = divisor_of(a), divisor_of(b)
            if isinstance(op, (ast.Add, ast.Sub)):
                with_divisor(out, min(da, db))
            elif isinstance(op, ast.Mult):
                with_divisor(out, da * db)
            elif isinstance(op, ast.LShift) and isinstance(b, int) and 0 <= b < 31:
                with_divisor(out, da << b)
        return out

    def compare(self, op, a, b, node):
        if not isinstance(a, Val) and not isinstance(b, Val):
            return self.constant(node, _fold, op, a, b)
        a, b = self.unify(a, b, node)
        if a.dtype == "f8E4M3FN":
            raise self.error("comparisons of FP8 values: cast them to f32 first", node)
        floating = a.dtype in _FLOAT
        # arith's CmpFPredicate / CmpIPredicate values (olt, slt, ...).
        predicates = {ast.Lt: (4, 2), ast.LtE: (5, 3), ast.Gt: (2, 4), ast.GtE: (3, 5),
                      ast.Eq: (1, 0), ast.NotEq: (6, 1)}
        predicate = predicates[type(op)][0 if floating else 1]
        name = "arith.cmpf" if floating else "arith.cmpi"
        attr = f"{predicate} : i64"
        result = f"vector<{self.lanes(a.block)}xi1>" if a.block else "i1"
        return Val(self.op(name, [a, b], [result], {"predicate": attr}).result(0), "i1", a.block)

    # --- pointers
    def offset_pointer(self, p, offset, op, node):
        if not isinstance(op, ast.Add):
            raise self.error("pointers move by adding element offsets", node)
        if p.offsets is not None:
            raise self.error("a block of pointers cannot move again", node)
        if isinstance(offset, Val) and offset.block:
            if offset.contiguous_base is None:
                raise self.error("pointer blocks must be scalar + el.arange(...) (gathers are "
                                 "not supported by the compiler yet)", node)
            moved = self.offset_pointer(p, offset.contiguous_base, op, node)
            return with_divisor(Val(moved.handle, moved.dtype, offset.block, p.pointer, p.window,
                                    p.peer, offsets=offset), moved.divisor)
        offset = self.lift(offset, None)
        size = np.dtype(_np_of(p.pointer)).itemsize
        alignment = min(p.divisor, divisor_of(offset) * size)
        if p.window:  # byte offsets into the window
            scaled = self.binary(ast.Mult(), self.widen(offset), self.const(size, "i64"), node)
            return with_divisor(Val(self.op("arith.addi", [p, scaled], ["i64"]).result(0), "i64",
                                    pointer=p.pointer, window=True, peer=p.peer), alignment)
        gep = self.op("llvm.getelementptr", [p, self.widen(offset)], ["!llvm.ptr<1>"],
                      {"rawConstantIndices": "array<i32: -2147483648>",
                       "elem_type": _llvm_elem(p.pointer), "noWrapFlags": "0 : i32"})
        return with_divisor(Val(gep.result(0), "ptr", pointer=p.pointer), alignment)

    def widen(self, v):
        if v.dtype == "i64":
            return v
        return with_divisor(Val(self.op("arith.extsi", [v], ["i64"]).result(0), "i64"), v.divisor)

    def address(self, p, node):
        """The scalar !llvm.ptr<1> of a pointer (the first element of this thread's part)."""
        base = p
        if p.offsets is not None:  # + this thread's first lane of the block
            lane0 = self.binary(ast.Mult(), self.tid, self.const(self.lanes(p.block), "i32"), node)
            base = self.offset_pointer(Val(p.handle, p.dtype, None, p.pointer, p.window, p.peer),
                                       lane0, ast.Add(), node)
        if base.window:
            if base.peer is not None:
                return self.op("comm.peer_ptr", [self.window, base, self.world, base.peer],
                               ["!llvm.ptr<1>"]).result(0)
            return self.op("comm.local_ptr", [self.window, base], ["!llvm.ptr<1>"]).result(0)
        return base.handle

    def active(self, block):
        """Threads that hold elements of a block of `block` (all but the tail when B < T)."""
        if block >= self.threads:
            return None
        return self.compare(ast.Lt(), self.tid, self.const(block, "i32"), None)

    # --- programs, blocks and ranks (builtins)
    def program_id(self, node, axis=0):
        dims = "xyz"[axis]
        return self.index_cast(Val(self.op("gpu.block_id", results=["index"],
                                           attributes={"dimension": f"#gpu<dim {dims}>"}).result(0),
                                   "index"), "i32")

    def num_programs(self, node, axis=0):
        dims = "xyz"[axis]
        return self.index_cast(Val(self.op("gpu.grid_dim", results=["index"],
                                           attributes={"dimension": f"#gpu<dim {dims}>"}).result(0),
                                   "index"), "i32")

    def arange(self, node, start, end):
        n = end - start
        if not isinstance(n, int) or n <= 0 or n & (n - 1):
            raise self.error("el.arange needs constant bounds and a power-of-two size", node)
        lanes = self.lanes(n)
        first = self.binary(ast.Mult(), self.tid, self.const(lanes, "i32"), node)
        if start:
            first = self.binary(ast.Add(), first, self.const(start, "i32"), node)
        steps = self.op("arith.constant", results=[f"vector<{lanes}xi32>"],
                        attributes={"value": f"dense<[{', '.join(map(str, range(lanes)))}]> : "
                                             f"vector<{lanes}xi32>"}).result(0)
        out = Val(self.op("arith.addi", [self.broadcast(first, n), steps],
                          [f"vector<{lanes}xi32>"]).result(0), "i32", n)
        out.contiguous_base = self.const(start, "i32")
        return out

    def rank(self, node):
        return Val(self.op("comm.team_rank", [self.world], ["i32"]).result(0), "i32")

    def num_ranks(self, node):
        return Val(self.op("comm.team_size", [self.world], ["i32"]).result(0), "i32")

    # --- casts (FP8 through the hardware's conversions)
    def convert(self, v, dtype, node):
        target = mlir_type(dtype)
        if v.dtype == target:
            return v
        if target == "f8E4M3FN":
            return self.to_fp8(self.convert(v, np.float32, node) if v.dtype != "f32" else v)
        if v.dtype == "f8E4M3FN":
            return self.convert(self.from_fp8(v), dtype, node)
        src, dst = v.dtype, target
        if src in _FLOAT and dst in _FLOAT:
            wider = _bits(dst) > _bits(src)
            name = "arith.extf" if wider else "arith.truncf"
        elif src in _FLOAT:
            name = "arith.fptosi"
        elif dst in _FLOAT:
            name = "arith.uitofp" if src == "i1" else "arith.sitofp"
        elif src == "i1":  # true is 1
            name = "arith.extui"
        else:
            name = "arith.extsi" if _bits(dst) > _bits(src) else "arith.trunci"
        out_type = f"vector<{self.lanes(v.block)}x{dst}>" if v.block else dst
        out = Val(self.op(name, [v], [out_type]).result(0), dst, v.block)
        if name in ("arith.extsi", "arith.trunci"):  # a multiple of d stays one
            with_divisor(out, min(v.divisor, 1 << (_bits(dst) - 1)))
        return out

    def lanes_of(self, v):
        """The elements this thread holds, as scalars."""
        if not v.block:
            return [v.handle]
        return [self.op("vector.extract", [v], [_ir_type(v.dtype)],
                        {"static_position": f"array<i64: {i}>"}).result(0)
                for i in range(self.lanes(v.block))]

    def assemble(self, elements, dtype, block):
        """A value of `block` (or a scalar) from this thread's elements."""
        if not block:
            return Val(elements[0], dtype)
        t = _ir_type(dtype)
        out = self.op("arith.constant", results=[f"vector<{len(elements)}x{t}>"],
                      attributes={"value": f"dense<0{'.0' if t in _FLOAT else ''}> : "
                                           f"vector<{len(elements)}x{t}>"}).result(0)
        for i, e in enumerate(elements):
            out = self.op("vector.insert", [e, out], [f"vector<{len(elements)}x{t}>"],
                          {"static_position": f"array<i64: {i}>"}).result(0)
        return Val(out, dtype, block)

    def to_fp8(self, v):
        """f32 -> FP8 e4m3, round to nearest, saturating (cvt.rn.satfinite.e4m3x2.f32)."""
        xs = self.lanes_of(v)
        zero = self.const(0.0, "f32").handle
        out = []
        for i in range(0, len(xs), 2):
            hi = xs[i + 1] if i + 1 < len(xs) else zero
            pair = self.op("nvvm.convert.f32x2.to.f8x2", [hi, xs[i]], ["vector<2xi8>"],
                           {"rnd": "#nvvm.fp_rnd_mode<rn>", "sat": "#nvvm.sat_mode<satfinite>",
                            "dstTy": "f8E4M3FN"}).result(0)
            for j in range(min(2, len(xs) - i)):  # element 0 is the low byte: xs[i]
                out.append(self.op("vector.extract", [pair], ["i8"],
                                   {"static_position": f"array<i64: {j}>"}).result(0))
        return self.assemble(out, "f8E4M3FN", v.block)

    def from_fp8(self, v):
        """FP8 e4m3 -> f32 (exact: through f16x2, cvt.rn.f16x2.e4m3x2)."""
        xs = self.lanes_of(v)
        zero = self.const(0.0, "f8E4M3FN").handle
        out = []
        for i in range(0, len(xs), 2):
            pair = self.assemble([xs[i], xs[i + 1] if i + 1 < len(xs) else zero], "i8", 2).handle
            half = self.op("nvvm.convert.f8x2.to.f16x2", [pair], ["vector<2xf16>"],
                           {"srcType": "f8E4M3FN"}).result(0)
            wide = self.op("arith.extf", [half], ["vector<2xf32>"]).result(0)
            for j in range(min(2, len(xs) - i)):
                out.append(self.op("vector.extract", [wide], ["f32"],
                                   {"static_position": f"array<i64: {j}>"}).result(0))
        return self.assemble(out, "f32", v.block)

    # --- value builtins
    def cast(self, node, v, dtype):
        return self.convert(self.lift(v, Val(None, mlir_type(dtype))), dtype, node)

    def where(self, node, condition, a, b):
        a, b = self.unify(a, b, node)
        block = condition.block or a.block
        if block:
            condition = self.broadcast(condition, block)
            a, b = self.broadcast(a, block), self.broadcast(b, block)
        return Val(self.op("arith.select", [condition, a, b], [self.vtype(a)]).result(0),
                   a.dtype, a.block)

    def full(self, node, shape, value, dtype):
        block = shape[0] if isinstance(shape, tuple) else shape
        return self.broadcast(self.const(value, mlir_type(dtype)), block)

    def zeros(self, node, shape, dtype):
        return self.full(node, shape, 0, dtype)

    # --- shared memory and guarded regions
    def workgroup_buffer(self, count, dtype):
        """A fresh `count`-element shared-memory buffer (a workgroup memref.global)."""
        name = f"epic_scratch{self.scratch}"
        self.scratch += 1
        mtype = f"memref<{count}x{_ir_type(dtype)}, #gpu.address_space<workgroup>>"
        self.b.set_insertion_point_before(self.kernel_func)
        self.op("memref.global", attributes={"sym_name": f'"{name}"',
                                             "sym_visibility": '"private"', "type": mtype})
        self.b.set_insertion_point_to_end(self.blocks[-1])
        return Val(self.op("memref.get_global", results=[mtype],
                           attributes={"name": f"@{name}"}).result(0), "memref")

    def when(self, condition, body):
        branch = self.op("scf.if", [condition], [], regions=2)
        self.enter(branch.add_block(0))
        body()
        self.op("scf.yield")
        self.leave()
        self.enter(branch.add_block(1))
        self.op("scf.yield")
        self.leave()
