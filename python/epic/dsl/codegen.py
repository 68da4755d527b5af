"""The DSL's code generator: an @epic.jit kernel's Python AST -> comm + upstream MLIR.

Triton's split: this module is the AST visitor (:class:`Generator`: the kernel's signature
and ABI, names and scopes, control flow, constant expressions, calls); what each value and
primitive means, and the IR it becomes, is :mod:`epic.dsl.semantic` (through :mod:`epic._ir`,
the C++ builder, as Triton's visitor uses its ``ir.cc``). A call of an ``epic.language``
builtin runs the builtin with the semantic layer as its ``_semantic`` (the interpreter runs the
same builtin without one), so the language's signatures are written once.

* ``for`` over ``range`` becomes ``scf.for`` (variables reassigned in the body are carried),
  ``while`` ``scf.while``, ``if`` on a scalar ``scf.if``, ``el.static_range`` is unrolled here;
  tuples are compile-time containers (built with ``+``, indexed by constants), so an unrolled
  loop can issue all its loads before it uses them;
* a call of another ``@epic.jit`` function is inlined where it is made (Triton's calls between
  jit functions): its AST is generated in a fresh scope whose parameters are bound to the
  caller's values (scalars, blocks, pointers, tuples; constants stay constants, and a parameter
  annotated ``el.constexpr`` must get one), and a ``return`` at the end of its body gives its
  value (or a tuple of values). A ``return`` anywhere else and recursion are refused; errors in
  the callee name its line, then the call sites.

What the compiler does not handle yet raises :class:`CompileError` pointing at the kernel's
source line. What a kernel's source may hold is checked first, by the check the interpreter
makes too (:mod:`epic.dsl.checks`), so both refuse the same programs alike; an error evaluating
a constant expression (``BLOCK // 0``) is a :class:`~epic.dsl.checks.SourceError` as well, as
the interpreter reports it.
"""

from __future__ import annotations

import ast

import numpy as np

from . import checks
from .dispatch import BUILTIN, is_jit_function
from .errors import CallError, CompileError, SourceError
from .semantic import CallSite, Semantic, Val
from .semantic_core import _bits, divisor_of, mlir_type, with_divisor

__all__ = ["CompileError", "SourceError", "generate"]

_RECORD_BYTES = 128  # a rank's record in the kernel's by-value parameter table (comm.param_table)


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
        # What each primitive means; its errors name the kernel's line through ours.
        self.sem = Semantic(self.b, self.threads, backend, fn.__name__, self.error,
                            self.constant)
        self.scope = {}
        self.tree, self.file, self.first_line = checks.parse(fn)
        self.line = 0
        self.calls = [fn]  # the kernel, then the @epic.jit functions being inlined (innermost last)

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

    # --- the kernel: its signature (the ABI), arguments and launch function
    def generate(self):
        func = self.tree.body[0]
        if not isinstance(func, ast.FunctionDef):
            raise self.error("a kernel is a function")
        b, sem = self.b, self.sem
        b.set_insertion_point_to_end(self.module.body)
        kernels = sem.op("gpu.module", attributes={"sym_name": '"dsl_kernels"'}, regions=1)
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
        attributes = {"sym_name": f'"{self.name}"', "function_type": signature,
                      "gpu.kernel": "unit"}
        if self.abi == "runtime":  # the table travels by value, a record per rank served
            attributes["comm.param_table"] = (f"#comm.param_table<arg = 2, "
                                              f"stride = {_RECORD_BYTES}, "
                                              f"ranks = {self.ranks}>")
        gfunc = sem.op("gpu.func", attributes=attributes, regions=1)
        sem.kernel_func = gfunc
        entry = gfunc.add_block(0, params)
        sem.enter(entry)
        sem.dev_comm = entry.arg(0)
        sem.window = entry.arg(1) if self.abi == "runtime" else None
        if self.abi == "runtime":
            record = sem.op("comm.rank_params", [entry.arg(2), sem.dev_comm], ["!llvm.ptr"],
                            {"stride": f"{_RECORD_BYTES} : i64"}).result(0)
            field = 0
            for name, kind in kinds:
                if kind[0] == "window":
                    self.scope[name] = sem.window_base()
                    continue
                slot = sem.op("llvm.getelementptr", [record], ["!llvm.ptr"],
                              {"rawConstantIndices": f"array<i32: {field}>", "elem_type": "i64",
                               "noWrapFlags": "0 : i32"}).result(0)
                field += 1
                loaded = "!llvm.ptr<1>" if kind[0] == "pointer" else \
                    ("i32" if kind[1] == "i1" else kind[1])
                value = sem.op("llvm.load", [slot], [loaded], {"alignment": "8 : i64"}).result(0)
                if kind[0] == "pointer":
                    self.scope[name] = with_divisor(Val(value, "ptr", pointer=kind[1]),
                                                    self.argument_alignment(kind))
                elif kind[1] == "i1":
                    self.scope[name] = sem.truth(Val(value, "i32"), None)
                else:
                    self.scope[name] = with_divisor(Val(value, kind[1]),
                                                    self.argument_alignment(kind))
        else:
            for i, (name, kind) in enumerate(kinds, start=1):
                if kind[0] == "window":
                    if sem.window is not None:
                        raise self.error("a kernel takes at most one symmetric window")
                    sem.window = entry.arg(i)
                    self.scope[name] = sem.window_base()
                elif kind[0] == "pointer":
                    self.scope[name] = with_divisor(Val(entry.arg(i), "ptr", pointer=kind[1]),
                                                    self.argument_alignment(kind))
                else:
                    self.scope[name] = with_divisor(Val(entry.arg(i), kind[1]),
                                                    self.argument_alignment(kind))
        for name, value in self.constexprs.items():
            self.scope[name] = value  # Python constants, folded where used
        sem.world = Val(sem.op("comm.team", [sem.dev_comm], results=["!comm.team"],
                               attributes={"kind": "0 : i32"}).result(0), "team")
        sem.tid = sem.index_cast(Val(sem.op("gpu.thread_id", results=["index"],
                                            attributes={"dimension": "#gpu<dim x>"}).result(0),
                                     "index"), "i32")
        for statement in func.body:
            self.visit(statement)
        sem.op("gpu.return")
        if self.abi == "runtime":
            self.launch_function(kinds)
        self.module.verify()
        return str(self.module)

    def argument_alignment(self, kind):
        """What a tensor argument's address or an integer's value is known to be a multiple of
        (the specialization: tensors 16-byte aligned, integers multiples of 16)."""
        if kind[0] == "pointer":
            return 16 if len(kind) > 2 and kind[2] else max(1, _bits(kind[1]) // 8)
        return 16 if len(kind) > 2 and kind[2] and kind[1] in ("i32", "i64") else 1

    def launch_function(self, kinds):
        """What the runtime reads (compileModule's metadata "entries"): kernel, threads, the
        parameter fields in record order; like convert-ep-to-comm's launch functions."""
        op = self.sem.op
        self.b.set_insertion_point_to_end(self.module.body)
        params = ["!comm.dev_comm", "!comm.window", "!llvm.ptr", "index"]
        launch = op("func.func", attributes={
            "sym_name": f'"{self.name}_launch"', "function_type": f"({', '.join(params)}) -> ()"},
            regions=1)
        # Checked against the runtime's LaunchMetadata.def by the binding (and the compiler).
        launch.set_launch_metadata({
            "entry": "dsl", "kernels": [self.name], "threads": self.threads,
            "param_fields": [n for n, k in kinds if k[0] != "window"],
            "param_stride": _RECORD_BYTES, "window_bytes": 0, "max_blocks_per_rank": 1024,
            # Blocks may wait for each other (barriers, signals): all resident at once.
            "cooperative": True})
        body = launch.add_block(0, params)
        self.b.set_insertion_point_to_end(body)
        one = op("arith.constant", results=["index"], attributes={"value": "1 : index"})
        threads = op("arith.constant", results=["index"],
                     attributes={"value": f"{self.threads} : index"})
        op("gpu.launch_func", [body.arg(3), one.result(0), one.result(0), threads.result(0),
                               one.result(0), one.result(0), body.arg(0), body.arg(1),
                               body.arg(2)], [],
           {"kernel": f"@dsl_kernels::@{self.name}",
            "operandSegmentSizes": "array<i32: 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 3, 0>"})
        op("func.return")

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
        self.scope[node.target.id] = self.sem.binary(node.op, current, self.visit(node.value), node)

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
                self.scope[n] = self.sem.const(int(v), "i1")
            elif isinstance(v, (int, np.integer)):
                self.scope[n] = self.sem.const(int(v), "i32")
            elif isinstance(v, (float, np.floating)):
                self.scope[n] = self.sem.const(float(v), "f32")

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
        lb, ub, step = (self.sem.index_cast(self.sem.lift(v, None), "index") for v in bounds)
        self.lift_reassigned(self.assigned_names(node.body))
        carried = [n for n in self.assigned_names(node.body)
                   if n in self.scope and isinstance(self.scope[n], Val)]
        inits = [self.scope[n] for n in carried]
        loop = self.sem.op("scf.for", [lb, ub, step] + inits,
                           [self.sem.vtype(v) for v in inits], regions=1)
        body = loop.add_block(0, ["index"] + [self.sem.vtype(v) for v in inits])
        self.scope.update(self.stale_tuples(node.body, "a loop"))  # in the body and after it
        outer = dict(self.scope)
        self.sem.enter(body)
        induction = with_divisor(Val(body.arg(0), "index"),
                                 min(divisor_of(bounds[0]), divisor_of(bounds[2])))
        self.scope[node.target.id] = self.sem.index_cast(induction, "i32")
        for i, n in enumerate(carried):
            self.scope[n] = self.sem.like(inits[i], body.arg(i + 1))
        self.loop_body(node, carried, inits, loop, outer)

    def loop_body(self, node, carried, inits, loop, outer):
        """The body of a loop whose entry block is current: yields the carried names (their
        types may not change), then the loop's results replace them outside."""
        for statement in node.body:
            self.visit(statement)
        for i, n in enumerate(carried):
            self.scope[n] = self.sem.lift(self.scope[n], inits[i])
            if self.sem.vtype(self.scope[n]) != self.sem.vtype(inits[i]):
                raise self.error(f"{n} changes type in the loop ({self.sem.vtype(inits[i])} "
                                 f"before, {self.sem.vtype(self.scope[n])} after)", node)
        self.sem.op("scf.yield", [self.scope[n] for n in carried])
        self.sem.leave()
        self.scope = outer
        for i, n in enumerate(carried):
            self.scope[n] = self.sem.like(inits[i], loop.result(i))

    def visit_While(self, node):
        """`while` on a scalar condition -> scf.while; variables the body reassigns are carried
        (the condition is evaluated in the `before` region on the carried values)."""
        self.lift_reassigned(self.assigned_names(node.body))
        carried = [n for n in self.assigned_names(node.body)
                   if n in self.scope and isinstance(self.scope[n], Val)]
        inits = [self.scope[n] for n in carried]
        types = [self.sem.vtype(v) for v in inits]
        loop = self.sem.op("scf.while", inits, types, regions=2)
        self.scope.update(self.stale_tuples(node.body, "a loop"))
        outer = dict(self.scope)
        self.sem.enter(loop.add_block(0, types))
        for i, n in enumerate(carried):
            self.scope[n] = self.sem.like(inits[i], self.sem.blocks[-1].arg(i))
        condition = self.visit(node.test)
        if isinstance(condition, (bool, int, np.bool_)):
            if condition:
                raise self.error("while True never ends: kernels have no break, loop on a "
                                 "condition the body changes", node)
            condition = self.sem.const(False, "i1")
        if condition.block:
            raise self.error("while needs a scalar condition", node)
        if condition.dtype != "i1":
            condition = self.sem.compare(ast.NotEq(), condition, self.sem.lift(0, condition), node)
        self.sem.op("scf.condition", [condition] + [self.scope[n] for n in carried])
        self.sem.leave()
        self.scope = dict(outer)
        self.sem.enter(loop.add_block(1, types))
        for i, n in enumerate(carried):
            self.scope[n] = self.sem.like(inits[i], self.sem.blocks[-1].arg(i))
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
            condition = self.sem.compare(ast.NotEq(), condition, self.sem.lift(0, condition), node)
        # Python constants the branches reassign become values of the type the branches give
        # them: a first pass over the branches (then erased) learns those types.
        constants = {n: self.scope[n] for n in self.assigned_names(node.body + node.orelse)
                     if n in self.scope
                     and isinstance(self.scope[n], (int, float, bool, np.number))}
        if constants:
            learned = {}
            probe = self.sem.op("scf.if", [condition], [], regions=2)
            saved = dict(self.scope)
            for region, statements in ((0, node.body), (1, node.orelse)):
                self.sem.enter(probe.add_block(region))
                self.scope = dict(saved)
                for statement in statements:
                    self.visit(statement)
                for n in constants:
                    if isinstance(self.scope.get(n), Val):
                        learned.setdefault(n, self.scope[n].dtype)
                self.sem.op("scf.yield")
                self.sem.leave()
            probe.erase()
            self.scope = saved
            for n, value in constants.items():
                if n in learned:
                    self.scope[n] = self.sem.const(value, learned[n])
        self.lift_reassigned(self.assigned_names(node.body + node.orelse))
        changed = [n for n in self.assigned_names(node.body + node.orelse)
                   if n in self.scope and isinstance(self.scope[n], Val)]
        stale = self.stale_tuples(node.body + node.orelse, "a branch")  # after it
        before = dict(self.scope)
        results = [self.sem.vtype(self.scope[n]) for n in changed]
        branch = self.sem.op("scf.if", [condition], results, regions=2)
        outcome = []
        for region, statements in ((0, node.body), (1, node.orelse)):
            self.sem.enter(branch.add_block(region))
            self.scope = dict(before)
            for statement in statements:
                self.visit(statement)
            for n in changed:
                self.scope[n] = self.sem.lift(self.scope[n], before[n])
                if self.sem.vtype(self.scope[n]) != self.sem.vtype(before[n]):
                    raise self.error(f"{n} changes type in a branch ({self.sem.vtype(before[n])} "
                                     f"before, {self.sem.vtype(self.scope[n])} after)", node)
            self.sem.op("scf.yield", [self.scope[n] for n in changed])
            self.sem.leave()
            outcome.append(self.scope)
        self.scope = before
        self.scope.update(stale)
        for i, n in enumerate(changed):
            self.scope[n] = self.sem.like(before[n], branch.result(i))

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
            return self.sem.binary(ast.Sub(), self.sem.lift(0, v), v, node)
        if isinstance(node.op, ast.Not) and not isinstance(v, Val):
            return not v
        raise self.error(f"{type(node.op).__name__} is not supported", node)

    def visit_BinOp(self, node):
        return self.sem.binary(node.op, self.visit(node.left), self.visit(node.right), node)

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
            v = self.sem.truth(v, node)
            result = v if result is None else self.sem.binary(
                ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr(), result, v, node)
        return result

    def visit_Compare(self, node):
        return self.sem.compare(node.ops[0], self.visit(node.left),
                                self.visit(node.comparators[0]), node)

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
            return self.sem.convert(value, args[0], node)
        if fn in (range,):
            raise self.error("range(...) belongs in a for loop", node)
        if is_jit_function(fn):
            return self.inline(node, fn, args, kwargs)
        module = getattr(fn, "__module__", "")
        if module != "epic.language":
            if fn in (min, max) and not any(isinstance(a, Val) for a in args):
                return self.constant(node, fn, *args)
            raise self.error(f"calls to {getattr(fn, '__name__', fn)} are not supported in "
                             "kernels", node)
        if not getattr(fn, BUILTIN, False):  # (el.static_range outside a for, el.constexpr)
            raise self.error(f"el.{fn.__name__} is not supported by the compiler yet", node)
        # The builtin binds the arguments (its signature is the language's) and calls our
        # semantic layer, its errors pointing at this call.
        return fn(*args, _semantic=CallSite(self.sem, node), **kwargs)

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
