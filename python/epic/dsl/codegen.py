"""The DSL's code generator: an @epic.jit kernel's Python AST -> comm + upstream MLIR.

Built through :mod:`epic._ir` (the C++ builder, as Triton's AST visitor uses its ``ir.cc``).
Execution model of the generated kernel (one ``gpu.func`` per kernel):

* a program instance is a thread block of ``T = 32 x num_warps`` threads; ``el.program_id``
  is its block index on its rank (the virtual backend numbers blocks per rank);
* a scalar is one value every thread holds alike;
* a block of ``B`` elements (``el.arange(0, B)``) is spread over the threads: thread ``t`` holds
  elements ``[t V, t V + V)`` in a ``vector<V x type>``, ``V = max(1, B / T)``; when ``B < T``
  the threads past ``B`` hold nothing and every memory access of theirs is masked off;
* a pointer is an ``!llvm.ptr<1>`` (a tensor argument) or a byte offset into the kernel's
  symmetric window (``!comm.window``, ``el.peer_ptr`` reaching a peer's copy); a block of
  pointers must be ``scalar + contiguous block`` (16-byte vector accesses per thread);
* ``for`` over ``range`` becomes ``scf.for`` (variables reassigned in the body are carried),
  ``while`` ``scf.while``, ``if`` on a scalar ``scf.if``, ``el.static_range`` is unrolled here;
  tuples are compile-time containers (built with ``+``, indexed by constants), so an unrolled
  loop can issue all its loads before it uses them;
* a call of another ``@epic.jit`` function is inlined where it is made (Triton's calls between
  jit functions): its AST is generated in a fresh scope whose parameters are bound to the
  caller's values (scalars, blocks, pointers, tuples; constants stay constants, and a parameter
  annotated ``el.constexpr`` must get one), and a ``return`` at the end of its body gives its
  value (or a tuple of values). A ``return`` anywhere else and recursion are refused; errors in
  the callee name its line, then the call sites;
* communication: ``el.rank``/``num_ranks`` are the world team's ``comm.team_rank``/``team_size``,
  ``el.signal`` a release ``comm.red``, ``el.wait`` a bounded ``comm.wait_flag`` by thread 0
  then a block barrier, ``el.put`` a ``comm.put`` of the block then a release signal (GIN on
  the nccl backend, which has no GIN resources: refused there, with ``el.flush``, see
  checks.check_backend), ``el.barrier`` a bounded ``comm.barrier`` of the world team.

* reductions: in the thread (``vector.reduction``), across the warp (``gpu.shuffle xor``), across
  warps (shared memory, in warp order); ``el.cumsum`` the same way with ``gpu.shuffle up``;
  atomics (``comm.atomic_rmw``/``comm.atomic_cas``) and waits run on thread 0 and their value
  reaches the block through shared memory;
* FP8 e4m3 values live in ``i8`` (LLVM has no FP8 type); casts use the hardware's
  ``cvt.rn.satfinite.e4m3x2.f32`` / ``cvt.rn.f16x2.e4m3x2`` (``nvvm.convert.*``).

What the compiler does not handle yet raises :class:`CompileError` pointing at the kernel's
source line (gathers and blocks of atomics are next). What a kernel's source may hold is checked
first, by the check the interpreter makes too (:mod:`epic.dsl.checks`), so both refuse the same
programs alike; an error evaluating a constant expression (``BLOCK // 0``) is a
:class:`~epic.dsl.checks.SourceError` as well, as the interpreter reports it.
"""

from __future__ import annotations

import ast

import numpy as np

from . import checks
from .checks import CompileError, SourceError
from .jit import CallError, JITFunction

__all__ = ["CompileError", "SourceError", "generate"]

_MLIR_TYPES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "f8E4M3FN",
    "int32": "i32", "int64": "i64", "uint8": "i8", "bool": "i1",
}
_FLOAT = {"f32", "f16", "bf16", "f8E4M3FN"}
_RECORD_BYTES = 128  # a rank's record in the kernel's by-value parameter table (comm.param_table)
# The comm dialect's enums (dialect/include/epic/Dialect/Comm/IR/CommBase.td).
_ORDERING = {"relaxed": 0, "acquire": 1, "release": 2, "acq_rel": 3, "sc": 4}
_SCOPE = {"cta": 0, "block": 0, "cluster": 1, "gpu": 2, "sys": 3}
_RELEASING = ("release", "acq_rel", "sc")


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


class _Stale:
    """What a name holds after a run-time loop or branch reassigned the tuple it held: tuples
    are compile-time values, never carried, so reading it is an error (not the old tuple)."""

    def __init__(self, why):
        self.why = why


class Generator(ast.NodeVisitor):
    def __init__(self, ir, fn, arg_kinds, constexprs, num_warps, name, abi="direct", ranks=1,
                 backend="virtual"):
        self.abi, self.backend = abi, backend  # the IR is the same; what it may call is not
        self.ranks = ranks  # the world a runtime-ABI kernel's parameter table serves
        self.ir, self.fn = ir, fn
        self.context = ir.Context()
        self.module = ir.Module(self.context)
        self.module.set_attr("gpu.container_module", "unit")
        self.b = ir.Builder(self.context)
        self.arg_kinds, self.constexprs = arg_kinds, constexprs
        self.threads = 32 * num_warps
        self.name = name
        self.scope = {}
        self.tree, self.file, self.first_line = checks.parse(fn)
        self.line = 0
        self.calls = [fn]  # the kernel, then the @epic.jit functions being inlined (innermost last)
        self.blocks = []  # where ops go: the innermost region's block last

    def enter(self, block):
        self.blocks.append(block)
        self.b.set_insertion_point_to_end(block)

    def leave(self):
        self.blocks.pop()
        self.b.set_insertion_point_to_end(self.blocks[-1])

    # --- errors and locations
    def error(self, message, node=None):
        line = self.first_line + (node.lineno if node is not None else self.line)
        return CompileError(f"{self.file}:{line}: {message}")

    def visit(self, node):
        if hasattr(node, "lineno"):
            self.line = node.lineno
            self.b.set_location(self.file, self.first_line + node.lineno, node.col_offset + 1)
        return super().visit(node)

    def generic_visit(self, node):  # (checks.check_kernel refused it before)
        raise self.error(checks.UNSUPPORTED.format(type(node).__name__), node)

    def constant(self, node, compute, *args):
        """`compute(*args)` on constants (constexprs, literals) in Python; what Python raises
        doing so (``BLOCK // 0``) is the kernel's error at its line, as in the interpreter."""
        try:
            return compute(*args)
        except (ArithmeticError, TypeError, ValueError) as e:
            raise SourceError(f"{self.file}:{self.first_line + node.lineno}: "
                              f"{type(e).__name__}: {e}") from None

    # --- IR helpers
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

    # --- kernel
    def generate(self):
        func = self.tree.body[0]
        if not isinstance(func, ast.FunctionDef):
            raise self.error("a kernel is a function")
        b = self.b
        b.set_insertion_point_to_end(self.module.body)
        kernels = self.op("gpu.module", attributes={"sym_name": '"dsl_kernels"'}, regions=1)
        body = kernels.add_block(0)
        b.set_insertion_point_to_end(body)
        kinds = list(self.arg_kinds)
        if self.abi == "runtime":  # the runtime's: device communicator, window, parameter table
            params = ["!comm.dev_comm", "!comm.window", "!llvm.ptr"]
            fields = [n for n, k in kinds if k[0] != "window"]
            if len(fields) > _RECORD_BYTES // 8:
                raise self.error(f"a kernel launched by the runtime takes at most "
                                 f"{_RECORD_BYTES // 8} arguments besides its window")
        else:  # every argument a kernel parameter (for inspection and direct launches)
            params = ["!comm.dev_comm"] + [
                "!comm.window" if k[0] == "window" else "!llvm.ptr<1>" if k[0] == "pointer"
                else k[1] for _, k in kinds]
        signature = f"({', '.join(params)}) -> ()"
        self.scratch = 0  # workgroup buffers made so far (one per cross-warp reduction)
        attributes = {"sym_name": f'"{self.name}"', "function_type": signature,
                      "gpu.kernel": "unit"}
        if self.abi == "runtime":  # the table travels by value, a record per rank served
            attributes["comm.param_table"] = (f"#comm.param_table<arg = 2, stride = {_RECORD_BYTES}, "
                                              f"ranks = {self.ranks}>")
        gfunc = self.op("gpu.func", attributes=attributes, regions=1)
        self.kernel_func = gfunc
        entry = gfunc.add_block(0, params)
        self.enter(entry)
        self.dev_comm = entry.arg(0)
        self.window = entry.arg(1) if self.abi == "runtime" else None
        if self.abi == "runtime":
            record = self.op("comm.rank_params", [entry.arg(2), self.dev_comm], ["!llvm.ptr"],
                             {"stride": f"{_RECORD_BYTES} : i64"}).result(0)
            field = 0
            for name, kind in kinds:
                if kind[0] == "window":
                    self.scope[name] = self.window_base()
                    continue
                slot = self.op("llvm.getelementptr", [record], ["!llvm.ptr"],
                               {"rawConstantIndices": f"array<i32: {field}>", "elem_type": "i64",
                                "noWrapFlags": "0 : i32"}).result(0)
                field += 1
                loaded = "!llvm.ptr<1>" if kind[0] == "pointer" else \
                    ("i32" if kind[1] == "i1" else kind[1])
                value = self.op("llvm.load", [slot], [loaded], {"alignment": "8 : i64"}).result(0)
                if kind[0] == "pointer":
                    self.scope[name] = with_divisor(Val(value, "ptr", pointer=kind[1]),
                                                    self.argument_alignment(kind))
                elif kind[1] == "i1":
                    self.scope[name] = self.truth(Val(value, "i32"), None)
                else:
                    self.scope[name] = with_divisor(Val(value, kind[1]),
                                                    self.argument_alignment(kind))
        else:
            for i, (name, kind) in enumerate(kinds, start=1):
                if kind[0] == "window":
                    if self.window is not None:
                        raise self.error("a kernel takes at most one symmetric window")
                    self.window = entry.arg(i)
                    self.scope[name] = self.window_base()
                elif kind[0] == "pointer":
                    self.scope[name] = with_divisor(Val(entry.arg(i), "ptr", pointer=kind[1]),
                                                    self.argument_alignment(kind))
                else:
                    self.scope[name] = with_divisor(Val(entry.arg(i), kind[1]),
                                                    self.argument_alignment(kind))
        for name, value in self.constexprs.items():
            self.scope[name] = value  # Python constants, folded where used
        self.world = Val(self.op("comm.team", [self.dev_comm],
                                 results=["!comm.team"], attributes={"kind": "0 : i32"})
                         .result(0), "team")
        self.tid = self.index_cast(Val(self.op("gpu.thread_id", results=["index"],
                                               attributes={"dimension": "#gpu<dim x>"}).result(0),
                                       "index"), "i32")
        for statement in func.body:
            self.visit(statement)
        self.op("gpu.return")
        if self.abi == "runtime":
            self.launch_function(kinds)
        self.module.verify()
        return str(self.module)

    def window_base(self):
        """Byte 0 of the window (windows start on pages: the runtime rounds every rank's window
        to 4096 bytes, NCCL registers whole pages)."""
        return with_divisor(Val(self.const(0, "i64").handle, "i8", pointer="i8", window=True),
                            4096)

    def argument_alignment(self, kind):
        """What a tensor argument's address or an integer's value is known to be a multiple of
        (the specialization: tensors 16-byte aligned, integers multiples of 16)."""
        if kind[0] == "pointer":
            return 16 if len(kind) > 2 and kind[2] else max(1, _bits(kind[1]) // 8)
        return 16 if len(kind) > 2 and kind[2] and kind[1] in ("i32", "i64") else 1

    def launch_function(self, kinds):
        """What the runtime reads (compileModule's metadata "entries"): kernel, threads, the
        parameter fields in record order; like ep-expand's launch functions."""
        self.b.set_insertion_point_to_end(self.module.body)
        params = ["!comm.dev_comm", "!comm.window", "!llvm.ptr", "index"]
        fields = ", ".join(f'"{n}"' for n, k in kinds if k[0] != "window")
        launch = self.op("func.func", attributes={
            "sym_name": f'"{self.name}_launch"', "function_type": f"({', '.join(params)}) -> ()",
            "epic.entry": '"dsl"', "epic.kernels": f'["{self.name}"]',
            "epic.threads": f"{self.threads} : i64", "epic.param_fields": f"[{fields}]",
            "epic.param_stride": f"{_RECORD_BYTES} : i64", "epic.window_bytes": "0 : i64",
            "epic.max_blocks_per_rank": "1024 : i64",
            # Blocks may wait for each other (barriers, signals): all resident at once.
            "epic.cooperative": "1 : i64"}, regions=1)
        body = launch.add_block(0, params)
        self.b.set_insertion_point_to_end(body)
        one = self.op("arith.constant", results=["index"], attributes={"value": "1 : index"})
        threads = self.op("arith.constant", results=["index"],
                          attributes={"value": f"{self.threads} : index"})
        self.op("gpu.launch_func", [body.arg(3), one.result(0), one.result(0), threads.result(0),
                                    one.result(0), one.result(0), body.arg(0), body.arg(1),
                                    body.arg(2)], [],
                {"kernel": f"@dsl_kernels::@{self.name}",
                 "operandSegmentSizes": "array<i32: 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 3, 0>"})
        self.op("func.return")

    # --- statements
    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.visit(node.value)

    def visit_Assign(self, node):
        value = self.visit(node.value)
        for target in node.targets:
            self.assign(target, value)

    def assign(self, target, value):
        if isinstance(target, ast.Name):
            self.scope[target.id] = value
        elif isinstance(target, ast.Tuple) and isinstance(value, tuple):
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        else:
            raise self.error(checks.ASSIGN_TARGET, target)

    def visit_AugAssign(self, node):
        current = self.visit(ast.Name(id=node.target.id, ctx=ast.Load()))
        self.scope[node.target.id] = self.binary(node.op, current, self.visit(node.value), node)

    def visit_Pass(self, node):
        pass

    def assigned_names(self, statements):
        """Names the statements assign (loop targets excluded: they are the loops' own)."""
        targets = {n.target.id for statement in statements for n in ast.walk(statement)
                   if isinstance(n, ast.For) and isinstance(n.target, ast.Name)}
        names = []
        for statement in statements:
            for n in ast.walk(statement):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and \
                        n.id not in names and n.id not in targets:
                    names.append(n.id)
        return names

    def lift_reassigned(self, names):
        """Python constants that a loop or a branch reassigns become values (i32, f32, i1), so
        they can be carried; the region must keep their type."""
        for n in names:
            v = self.scope.get(n)
            if isinstance(v, (bool, np.bool_)):
                self.scope[n] = self.const(int(v), "i1")
            elif isinstance(v, (int, np.integer)):
                self.scope[n] = self.const(int(v), "i32")
            elif isinstance(v, (float, np.floating)):
                self.scope[n] = self.const(float(v), "f32")

    def stale_tuples(self, statements, where):
        """The names `statements` reassign that hold tuples, marked stale (see _Stale)."""
        return {n: _Stale(f"{n} is a tuple reassigned in {where}: tuples are compile-time values, "
                          "not carried through run-time loops and branches")
                for n in self.assigned_names(statements) if isinstance(self.scope.get(n), tuple)}

    def visit_For(self, node):
        call = node.iter
        fname = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
        bounds = [self.visit(a) for a in call.args]
        if fname == "static_range":
            if not all(isinstance(v, int) for v in bounds):
                raise self.error(checks.STATIC_RANGE, node)
            for i in self.constant(node, range, *bounds):
                self.scope[node.target.id] = i
                for statement in node.body:
                    self.visit(statement)
            return
        if len(bounds) == 1:
            bounds = [0] + bounds
        if len(bounds) == 2:
            bounds.append(1)
        lb, ub, step = (self.index_cast(self.lift(v, None), "index") for v in bounds)
        self.lift_reassigned(self.assigned_names(node.body))
        carried = [n for n in self.assigned_names(node.body)
                   if n in self.scope and isinstance(self.scope[n], Val)]
        inits = [self.scope[n] for n in carried]
        loop = self.op("scf.for", [lb, ub, step] + inits, [self.vtype(v) for v in inits],
                       regions=1)
        body = loop.add_block(0, ["index"] + [self.vtype(v) for v in inits])
        self.scope.update(self.stale_tuples(node.body, "a loop"))  # in the body and after it
        outer = dict(self.scope)
        self.enter(body)
        induction = with_divisor(Val(body.arg(0), "index"),
                                 min(divisor_of(bounds[0]), divisor_of(bounds[2])))
        self.scope[node.target.id] = self.index_cast(induction, "i32")
        for i, n in enumerate(carried):
            self.scope[n] = self.like(inits[i], body.arg(i + 1))
        self.loop_body(node, carried, inits, loop, outer)

    def loop_body(self, node, carried, inits, loop, outer):
        """The body of a loop whose entry block is current: yields the carried names (their
        types may not change), then the loop's results replace them outside."""
        for statement in node.body:
            self.visit(statement)
        for i, n in enumerate(carried):
            self.scope[n] = self.lift(self.scope[n], inits[i])
            if self.vtype(self.scope[n]) != self.vtype(inits[i]):
                raise self.error(f"{n} changes type in the loop ({self.vtype(inits[i])} before, "
                                 f"{self.vtype(self.scope[n])} after)", node)
        self.op("scf.yield", [self.scope[n] for n in carried])
        self.leave()
        self.scope = outer
        for i, n in enumerate(carried):
            self.scope[n] = self.like(inits[i], loop.result(i))

    def like(self, v, handle):
        out = Val(handle, v.dtype, v.block, v.pointer, v.window, v.peer, v.offsets)
        return out

    def visit_While(self, node):
        """`while` on a scalar condition -> scf.while; variables the body reassigns are carried
        (the condition is evaluated in the `before` region on the carried values)."""
        self.lift_reassigned(self.assigned_names(node.body))
        carried = [n for n in self.assigned_names(node.body)
                   if n in self.scope and isinstance(self.scope[n], Val)]
        inits = [self.scope[n] for n in carried]
        types = [self.vtype(v) for v in inits]
        loop = self.op("scf.while", inits, types, regions=2)
        self.scope.update(self.stale_tuples(node.body, "a loop"))
        outer = dict(self.scope)
        self.enter(loop.add_block(0, types))
        for i, n in enumerate(carried):
            self.scope[n] = self.like(inits[i], self.blocks[-1].arg(i))
        condition = self.visit(node.test)
        if isinstance(condition, (bool, int, np.bool_)):
            if condition:
                raise self.error("while True never ends: kernels have no break, loop on a "
                                 "condition the body changes", node)
            condition = self.const(False, "i1")
        if condition.block:
            raise self.error("while needs a scalar condition", node)
        if condition.dtype != "i1":
            condition = self.compare(ast.NotEq(), condition, self.lift(0, condition), node)
        self.op("scf.condition", [condition] + [self.scope[n] for n in carried])
        self.leave()
        self.scope = dict(outer)
        self.enter(loop.add_block(1, types))
        for i, n in enumerate(carried):
            self.scope[n] = self.like(inits[i], self.blocks[-1].arg(i))
        self.loop_body(node, carried, inits, loop, outer)

    def visit_If(self, node):
        condition = self.visit(node.test)
        if isinstance(condition, (bool, int, np.bool_)):
            for statement in node.body if condition else node.orelse:
                self.visit(statement)
            return
        if condition.block:
            raise self.error("if needs a scalar condition (use el.where for blocks)", node)
        if condition.dtype != "i1":
            condition = self.compare(ast.NotEq(), condition, self.lift(0, condition), node)
        # Python constants the branches reassign become values of the type the branches give
        # them: a first pass over the branches (then erased) learns those types.
        constants = {n: self.scope[n] for n in self.assigned_names(node.body + node.orelse)
                     if n in self.scope and isinstance(self.scope[n], (int, float, bool, np.number))}
        if constants:
            learned = {}
            probe = self.op("scf.if", [condition], [], regions=2)
            saved = dict(self.scope)
            for region, statements in ((0, node.body), (1, node.orelse)):
                self.enter(probe.add_block(region))
                self.scope = dict(saved)
                for statement in statements:
                    self.visit(statement)
                for n in constants:
                    if isinstance(self.scope.get(n), Val):
                        learned.setdefault(n, self.scope[n].dtype)
                self.op("scf.yield")
                self.leave()
            probe.erase()
            self.scope = saved
            for n, value in constants.items():
                if n in learned:
                    self.scope[n] = self.const(value, learned[n])
        self.lift_reassigned(self.assigned_names(node.body + node.orelse))
        changed = [n for n in self.assigned_names(node.body + node.orelse)
                   if n in self.scope and isinstance(self.scope[n], Val)]
        stale = self.stale_tuples(node.body + node.orelse, "a branch")  # after it
        before = dict(self.scope)
        results = [self.vtype(self.scope[n]) for n in changed]
        branch = self.op("scf.if", [condition], results, regions=2)
        outcome = []
        for region, statements in ((0, node.body), (1, node.orelse)):
            self.enter(branch.add_block(region))
            self.scope = dict(before)
            for statement in statements:
                self.visit(statement)
            for n in changed:
                self.scope[n] = self.lift(self.scope[n], before[n])
                if self.vtype(self.scope[n]) != self.vtype(before[n]):
                    raise self.error(f"{n} changes type in a branch ({self.vtype(before[n])} "
                                     f"before, {self.vtype(self.scope[n])} after)", node)
            self.op("scf.yield", [self.scope[n] for n in changed])
            self.leave()
            outcome.append(self.scope)
        self.scope = before
        self.scope.update(stale)
        for i, n in enumerate(changed):
            self.scope[n] = self.like(before[n], branch.result(i))

    # --- expressions
    def visit_Constant(self, node):
        return node.value

    def visit_Name(self, node):
        if node.id in self.scope:
            if isinstance(self.scope[node.id], _Stale):
                raise self.error(self.scope[node.id].why, node)
            return self.scope[node.id]
        glob = self.fn.__globals__
        if node.id in glob:
            return glob[node.id]
        import builtins

        if hasattr(builtins, node.id):
            return getattr(builtins, node.id)
        raise self.error(f"unknown name {node.id}", node)

    def visit_Attribute(self, node):
        base = self.visit(node.value)
        if isinstance(base, Val):
            if node.attr == "to":
                return ("method-to", base)
            raise self.error(f"values have no attribute {node.attr}", node)
        try:
            return getattr(base, node.attr)
        except AttributeError:
            raise self.error(f"unknown attribute {node.attr}", node) from None

    def visit_Tuple(self, node):
        return tuple(self.visit(e) for e in node.elts)

    def visit_Subscript(self, node):
        """`values[i]`: an element of a tuple the kernel built at compile time (``values +=
        (x,)``, e.g. in an ``el.static_range``), at a constant index."""
        values, index = self.visit(node.value), self.visit(node.slice)
        if not isinstance(values, tuple):
            raise self.error("only tuples can be indexed (blocks have no element access)", node)
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise self.error("a tuple index must be a constant (a constexpr or an "
                             "el.static_range variable)", node)
        if not -len(values) <= index < len(values):
            raise self.error(f"tuple index {index} out of range ({len(values)} elements)", node)
        return values[index]

    def visit_UnaryOp(self, node):
        v = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            if not isinstance(v, Val):
                return self.constant(node, lambda x: -x, v)
            return self.binary(ast.Sub(), self.lift(0, v), v, node)
        if isinstance(node.op, ast.Not) and not isinstance(v, Val):
            return not v
        raise self.error(f"{type(node.op).__name__} is not supported", node)

    def visit_BinOp(self, node):
        return self.binary(node.op, self.visit(node.left), self.visit(node.right), node)

    def visit_BoolOp(self, node):
        """`and` / `or` of scalars (both sides are evaluated: kernels have no side effects in
        conditions)."""
        values = [self.visit(v) for v in node.values]
        if not any(isinstance(v, Val) for v in values):
            return all(values) if isinstance(node.op, ast.And) else any(values)
        result = None
        for v in values:
            if isinstance(v, Val) and v.block:
                raise self.error("and/or take scalars (use & and | on blocks)", node)
            v = self.truth(v, node)
            result = v if result is None else self.binary(
                ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr(), result, v, node)
        return result

    def truth(self, v, node):
        if not isinstance(v, Val):
            return self.const(int(bool(v)), "i1")
        if v.dtype == "i1":
            return v
        return self.compare(ast.NotEq(), v, self.lift(0, v), node)

    def visit_Compare(self, node):
        return self.compare(node.ops[0], self.visit(node.left), self.visit(node.comparators[0]),
                            node)

    def unify(self, a, b, node):
        if not isinstance(a, Val) and not isinstance(b, Val):
            return a, b
        a, b = self.lift(a, b if isinstance(b, Val) else None), self.lift(b, a)
        if a.dtype != b.dtype:  # Triton's promotion: the wider integer, the float, the wider float
            target = self.promoted(a.dtype, b.dtype)
            if target is None:
                raise self.error(f"mixed element types {a.dtype} and {b.dtype}: cast one with "
                                 ".to(...)", node)
            a, b = self.cast(a, _np_of(target), node), self.cast(b, _np_of(target), node)
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

    def visit_Call(self, node):
        fn = self.visit(node.func)
        args = [self.visit(a) for a in node.args]
        kwargs = {k.arg: self.visit(k.value) for k in node.keywords}
        if isinstance(fn, tuple) and fn[0] == "method-to":
            value = fn[1]
            if value.pointer:  # the same address seen as another element type
                if value.offsets is not None:
                    raise self.error("cast the pointer before adding a block of offsets", node)
                return with_divisor(Val(value.handle, value.dtype, None, mlir_type(args[0]),
                                        value.window, value.peer), value.divisor)
            return self.cast(value, args[0], node)
        if fn in (range,):
            raise self.error("range(...) belongs in a for loop", node)
        if isinstance(fn, JITFunction):
            return self.inline(node, fn, args, kwargs)
        module = getattr(fn, "__module__", "")
        if module != "epic.language":
            if fn in (min, max) and not any(isinstance(a, Val) for a in args):
                return self.constant(node, fn, *args)
            raise self.error(f"calls to {getattr(fn, '__name__', fn)} are not supported in "
                             "kernels", node)
        handler = getattr(self, f"el_{fn.__name__}", None)
        if handler is None:
            raise self.error(f"el.{fn.__name__} is not supported by the compiler yet", node)
        return handler(node, *args, **kwargs)

    # --- calls of @epic.jit functions
    def inline(self, node, callee, args, kwargs):
        """The body of the @epic.jit function `callee`, generated here in a fresh scope whose
        parameters are bound to the call's values; what its final `return` gives (None
        without one)."""
        name = callee.fn.__name__
        try:
            bound = callee.bind_call(args, kwargs, self.calls, lambda v: not _holds_values(v))
        except CallError as e:
            raise self.error(str(e), node) from None
        checks.check_called(callee.fn)  # (a return only at the very end of its body)
        tree, file, first_line = checks.parse(callee.fn)
        body = tree.body[0].body
        caller = (self.fn, self.scope, self.file, self.first_line, self.line)
        call_site = f"{self.file}:{self.first_line + node.lineno}"
        self.fn, self.scope, self.file, self.first_line = callee.fn, dict(bound.arguments), \
            file, first_line
        self.calls.append(callee.fn)
        try:
            for statement in body[:-1] if isinstance(body[-1], ast.Return) else body:
                self.visit(statement)
            result = None
            if isinstance(body[-1], ast.Return) and body[-1].value is not None:
                result = self.visit(body[-1].value)
        except CompileError as e:
            raise type(e)(checks.CALLED_AT.format(e, name, call_site)) from None
        finally:
            self.calls.pop()
            self.fn, self.scope, self.file, self.first_line, self.line = caller
            self.b.set_location(self.file, self.first_line + node.lineno, node.col_offset + 1)
        return result

    def visit_Return(self, node):  # (checks.check_kernel refused it before)
        raise self.error(checks.KERNEL_RETURN, node)

    # --- the language
    def el_program_id(self, node, axis=0):
        dims = "xyz"[axis]
        return self.index_cast(Val(self.op("gpu.block_id", results=["index"],
                                           attributes={"dimension": f"#gpu<dim {dims}>"}).result(0),
                                   "index"), "i32")

    def el_num_programs(self, node, axis=0):
        dims = "xyz"[axis]
        return self.index_cast(Val(self.op("gpu.grid_dim", results=["index"],
                                           attributes={"dimension": f"#gpu<dim {dims}>"}).result(0),
                                   "index"), "i32")

    def el_arange(self, node, start, end):
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

    def el_rank(self, node):
        return Val(self.op("comm.team_rank", [self.world], ["i32"]).result(0), "i32")

    def el_num_ranks(self, node):
        return Val(self.op("comm.team_size", [self.world], ["i32"]).result(0), "i32")

    def el_peer_ptr(self, node, p, peer):
        if not (isinstance(p, Val) and p.window) or p.offsets is not None:
            raise self.error("el.peer_ptr takes a scalar pointer into the window", node)
        peer = self.lift(peer, None)
        if peer.dtype != "i32":  # ranks are i32 in the comm dialect
            peer = self.cast(peer, np.int32, node)
        return with_divisor(Val(p.handle, p.dtype, None, p.pointer, True, peer), p.divisor)

    def el_load(self, node, p, mask=None, other=0, sem="relaxed", scope="gpu"):
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

    def el_store(self, node, p, value, mask=None, sem="relaxed", scope="gpu"):
        if not (isinstance(p, Val) and p.pointer):
            raise self.error("el.store takes a pointer", node)
        element = p.pointer
        value = self.lift(value, Val(None, element))
        if value.dtype != element:  # stores convert to the pointer's element type
            value = self.cast(value, _np_of(element), node)
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

    def cast(self, v, dtype, node):
        target = mlir_type(dtype)
        if v.dtype == target:
            return v
        if target == "f8E4M3FN":
            return self.to_fp8(self.cast(v, np.float32, node) if v.dtype != "f32" else v)
        if v.dtype == "f8E4M3FN":
            return self.cast(self.from_fp8(v), dtype, node)
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

    def el_cast(self, node, v, dtype):
        return self.cast(self.lift(v, Val(None, mlir_type(dtype))), dtype, node)

    def el_where(self, node, condition, a, b):
        a, b = self.unify(a, b, node)
        block = condition.block or a.block
        if block:
            condition = self.broadcast(condition, block)
            a, b = self.broadcast(a, block), self.broadcast(b, block)
        return Val(self.op("arith.select", [condition, a, b], [self.vtype(a)]).result(0),
                   a.dtype, a.block)

    def el_full(self, node, shape, value, dtype):
        block = shape[0] if isinstance(shape, tuple) else shape
        return self.broadcast(self.const(value, mlir_type(dtype)), block)

    def el_zeros(self, node, shape, dtype):
        return self.el_full(node, shape, 0, dtype)

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
            x = self.el_where(node, active, x, self.const(identity, x.dtype))
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

    def el_atomic_add(self, node, p, value, mask=None, sem="relaxed", scope="gpu"):
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

    def el_atomic_cas(self, node, p, compare, value, sem="relaxed", scope="gpu"):
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

    def el_sum(self, node, x, axis=0):
        return self.reduce(node, x, "sum")

    def el_max(self, node, x, axis=0):
        return self.reduce(node, x, "max")

    def el_min(self, node, x, axis=0):
        return self.reduce(node, x, "min")

    def el_cumsum(self, node, x, axis=0):
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
            x = self.el_where(node, active, x, self.const(0, x.dtype))
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

    def el_fence(self, node, scope="sys"):
        self.op("comm.fence", [], [], {"ordering": f"{_ORDERING['acq_rel']} : i32",
                                       "scope": f"{_SCOPE[scope]} : i32"})

    def el_barrier(self, node, timeout_ms=10000):
        if (message := checks.timeout_error("barrier", timeout_ms)) is not None:
            raise self.error(message, node)
        block = self.el_program_id(node)
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

    def el_put(self, node, dst, src, count, signal=None, signal_value=1):
        """The block copies `count` elements of its window to a peer's (comm.put, LSA or GIN),
        then, with `signal`, adds `signal_value` to that word on the peer (release)."""
        self.served(node, "put")
        for name, p in (("dst", dst), ("src", src)):
            if not (isinstance(p, Val) and p.window and p.offsets is None):
                raise self.error(f"el.put: {name} must be a scalar pointer into the window", node)
        if dst.peer is None or src.peer is not None:
            raise self.error("el.put copies from this rank's window to a peer's (el.peer_ptr)", node)
        size = np.dtype(_np_of(src.pointer)).itemsize
        nbytes = self.binary(ast.Mult(), self.widen(self.lift(count, None)),
                             self.const(size, "i64"), node)
        self.op("comm.put", [nbytes, self.window, src, self.window, dst, self.world, dst.peer,
                             self.dev_comm], [],
                {"coop": "2 : i32",
                 "operandSegmentSizes": "array<i32: 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0>"})
        self.el_flush(node)  # the data is out before the signal says so
        if signal is not None:
            self.el_signal(node, signal, signal_value)

    def el_flush(self, node):
        self.served(node, "flush")
        self.op("comm.flush", [self.dev_comm], [], {"coop": "2 : i32"})

    def served(self, node, name):
        """Refuses el.`name` where the backend cannot serve it (checks.check_backend refused
        the calls it resolves; this, the rest, e.g. through a local name)."""
        if (message := checks.unavailable_error(self.backend, name,
                                                self.calls[0].__name__)) is not None:
            raise self.error(message, node)

    def el_signal(self, node, p, value=1):
        if not (isinstance(p, Val) and p.window and p.offsets is None):
            raise self.error("el.signal takes a scalar pointer into the window", node)
        amount = self.lift(value, Val(None, p.pointer))
        self.thread0(node, lambda: self.op(
            "comm.red", [amount, self.address(p, node)], [],
            {"kind": "0 : i32", "ordering": f"{_ORDERING['release']} : i32",
             "scope": f"{_SCOPE['sys']} : i32"}), release=True)

    def el_wait(self, node, p, value, timeout_ms=10000):
        """Thread 0 waits (bounded); the value it saw reaches the whole block."""
        if (message := checks.timeout_error("wait", timeout_ms)) is not None:
            raise self.error(message, node)
        if not (isinstance(p, Val) and p.window and p.offsets is None):
            raise self.error("el.wait takes a scalar pointer into the window", node)
        expected = self.lift(value, Val(None, p.pointer))
        rank = self.el_rank(node)
        return self.on_thread0(node, p.pointer, lambda: self.op(
            "comm.wait_flag", [self.address(p, node), expected, rank], [p.pointer],
            {"predicate": "2 : i32", "scope": f"{_SCOPE['sys']} : i32",
             "timeout_ms": f"{int(timeout_ms)} : i64",
             "operandSegmentSizes": "array<i32: 1, 1, 1, 0>"}).result(0))

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


def _holds_values(v):
    """Whether v is (or a tuple of it holds) a run-time value."""
    return isinstance(v, Val) or (isinstance(v, tuple) and any(_holds_values(e) for e in v))


def generate(ir, fn, arg_kinds, constexprs, num_warps=4, name=None, abi="direct", ranks=1,
             backend="virtual"):
    """The kernel's IR (text): `arg_kinds` = [(name, ("pointer", elem) | ("scalar", type) |
    ("window",))] of the non-constexpr arguments; `constexprs` their values. `abi`: "direct"
    (every argument a kernel parameter) or "runtime" (the runtime's (device communicator,
    window, by-value table of per-rank parameter records) and a launch function with its
    metadata); `ranks`: the world the runtime ABI's table serves (a record per rank on the
    virtual backend); `backend`: what it is compiled for (checks.check_backend). The kernel's
    source is checked first (checks.check_backend)."""
    checks.check_backend(fn, backend)
    return Generator(ir, fn, arg_kinds, constexprs, num_warps, name or fn.__name__,
                     abi, ranks, backend).generate()
