"""What an ``@epic.jit`` function's source may hold: the one static check of its AST that the
compiler (:mod:`epic.dsl.codegen`) and the interpreter (:mod:`epic.dsl.interpreter`) both make
before they translate or run a kernel, so both refuse the same programs with the same
:class:`SourceError` (``file:line: message``).

The rules are the compiler's, read off the source:

* only the statements and expressions the compiler translates (assignments to names, ``for``
  over ``range``/``el.static_range``, ``while``, ``if``, calls, arithmetic, comparisons, tuples,
  constants): anything else (``try``, ``with``, ``lambda``, comprehensions, ``global``,
  f-strings, ``assert``, ``raise``, ``yield``, ``break``, ...) is "X is not supported in kernels";
  and of those: assignments to names (or tuples of names), ``for`` with one name over 1 to 3
  positional bounds, no ``else`` on loops, one comparison at a time (no ``is``/``in``), no ``~``,
  unary ``+``, ``@`` or ``**`` arguments;
* a kernel returns nothing; a function a kernel calls returns once, at the end of its body;
* ``el.static_range`` takes constants: a bound that is certainly a run-time value (a kernel's
  non-constexpr argument, what ``el.load``, ``el.program_id``, ... give, a ``range`` loop's
  variable, arithmetic on those) is refused, through the calls of ``@epic.jit`` functions too.
  What the check cannot decide the compiler still refuses when it meets it.

Per backend (:func:`check_backend`, made before a kernel is compiled for it): what the backend's
device communicator cannot serve is refused where the kernel, or a function it calls, calls it:
on ``nccl``, ``el.put`` and ``el.flush`` (GIN; see ``_UNAVAILABLE``).

A kernel is checked with every ``@epic.jit`` function it names (:func:`check_kernel`), once;
a function without source (defined interactively) has nothing to check (the compiler refuses it
for that: :func:`parse`).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import threading
import weakref

import numpy as np

from . import dispatch
from .errors import CompileError, SourceError

__all__ = ["CompileError", "SourceError", "check_kernel", "check_called", "check_backend",
           "unavailable_error", "parse", "called"]


UNSUPPORTED = "{} is not supported in kernels"
KERNEL_RETURN = ("a kernel returns nothing (it stores its results); a return ends the body of an "
                 "@epic.jit function that a kernel calls")
CALLEE_RETURN = ("{}: a return inside a loop or a branch (or before the end) of an @epic.jit "
                 "function called from a kernel is not supported: return once, at the end of "
                 "its body")
STATIC_RANGE = "el.static_range takes constants"
ASSIGN_TARGET = "only names (and tuples of names) can be assigned"
LOOP = "a kernel loops over range(...) or el.static_range(...)"
LOOP_BOUNDS = "range(...) and el.static_range(...) take 1 to 3 bounds, as positional arguments"
LOOP_TARGET = "a for loop's variable is one name"
CALLED_AT = "{}\n  in {}, called at {}"  # an error in a called function, then the call site
# A wait's bound: the comm dialect's (at most 2^31 ms, which the lowering turns into 64-bit
# nanoseconds); the interpreter and the compiler refuse other values alike.
MAX_TIMEOUT_MS = 2**31


def timeout_error(what, timeout_ms):
    """The message refusing `timeout_ms` of el.`what`, or None when it is a valid bound."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or \
            not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
        return (f"el.{what}: timeout_ms must be an int in [1, {MAX_TIMEOUT_MS}] (ms), got "
                f"{timeout_ms!r}")
    return None

# What the compiler translates (codegen.Generator's visit_* methods), and the parts of them that
# are not visited on their own.
_STATEMENTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.Pass, ast.For, ast.While, ast.If,
               ast.Return)
_EXPRESSIONS = (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.Subscript, ast.UnaryOp,
                ast.BinOp, ast.BoolOp, ast.Compare, ast.Call)
_PARTS = (ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context, ast.keyword)


def parse(fn):
    """A kernel's (or a called function's) AST, source file and line offset (the file's line of
    node.lineno is first_line + node.lineno); CompileError without its source."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise CompileError(f"{fn.__name__}: its source is not available (kernels are compiled "
                           "from their source file: define them in a module)") from None
    return ast.parse(source), inspect.getsourcefile(fn) or "<kernel>", \
        inspect.getsourcelines(fn)[1] - 1


def called(fn, tree):
    """The @epic.jit functions `fn`'s source (`tree`) names, in the order it names them."""
    glob, found = fn.__globals__, []
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Name):
            value = glob.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            value = getattr(glob.get(node.value.id), node.attr, None)
        if dispatch.is_jit_function(value) and value.fn is not fn and value not in found:
            found.append(value)
    return found


_checked = weakref.WeakKeyDictionary()  # function -> the roles it passed in ("kernel", "called")
_lock = threading.Lock()


def _passed(fn, role):
    with _lock:
        return role in _checked.get(fn, ())


def _pass(fn, role):
    with _lock:
        _checked.setdefault(fn, set()).add(role)


def check_kernel(fn):
    """Refuses (SourceError) the kernel `fn` if the compiler would refuse what its source holds:
    its statements and expressions, then every @epic.jit function it names (as functions a kernel
    calls), then its el.static_range bounds (through its calls)."""
    if _passed(fn, "kernel"):
        return
    try:
        parsed = parse(fn)
    except (CompileError, SyntaxError):
        return  # nothing to check (the compiler says it needs the source)
    _check_syntax(fn, parsed, kernel=True)
    pending, seen = called(fn, parsed[0]), []
    while pending:  # what it calls, directly or not
        function = pending.pop(0)
        if function in seen:
            continue
        seen.append(function)
        check_called(function.fn)
        try:
            pending += called(function.fn, parse(function.fn)[0])
        except (CompileError, SyntaxError):
            pass
    _Constness(fn, parsed).kernel()
    _pass(fn, "kernel")


def check_called(fn):
    """Refuses (SourceError) the @epic.jit function `fn`, called from a kernel, if the compiler
    would refuse what its source holds (as check_kernel, a return only at the end)."""
    if _passed(fn, "called"):
        return
    try:
        parsed = parse(fn)
    except (CompileError, SyntaxError):
        return
    _check_syntax(fn, parsed, kernel=False)
    _pass(fn, "called")


# What a backend's device communicator cannot serve, by the epic.language function that needs
# it, with what to write instead. The runtime's NCCL device communicator (NcclBuffer.cpp) has LSA
# barriers and no GIN contexts or signals: an NCCL buffer is one node, every peer reached over
# NVLink, and asking NCCL 2.28 for GIN changes the shared communicator (GIN registration of every
# later window). el.put lowers to a GIN put (comm.put) and el.flush to a GIN flush, which would
# use GIN state that is not there.
_NO_GIN = "the runtime's NCCL device communicator has no GIN contexts or signals"
_UNAVAILABLE = {
    "nccl": {
        "put": (f"a GIN put, and {_NO_GIN}", "copy over NVLink instead: "
                "el.store(el.peer_ptr(dst, peer) + offsets, el.load(src + offsets)), then "
                "el.signal(el.peer_ptr(flag, peer)) (a release: the data is visible before the "
                "flag)"),
        "flush": (f"a GIN flush, and {_NO_GIN}", "NVLink stores need no flush: el.signal (a "
                  "release) or el.fence orders them"),
    },
}


def unavailable_error(backend, name, kernel):
    """The message refusing el.`name` in `kernel` on `backend`, or None where it is served."""
    if name not in _UNAVAILABLE.get(backend, {}):
        return None
    why, instead = _UNAVAILABLE[backend][name]
    return (f"el.{name} in kernel {kernel} cannot run on the {backend} backend: "
            f"it is {why}; {instead}")


def check_backend(fn, backend):
    """Refuses (SourceError) the kernel `fn` for `backend` where it, or an @epic.jit function it
    calls, calls what the backend cannot serve (_UNAVAILABLE): at the first such call in source
    order, named like the compiler's errors (the line, then the call sites). Checks the kernel
    (check_kernel) first, so every path refuses a program with the same first error. Calls the
    check cannot resolve (a function held in a local name) the compiler refuses when it meets
    them (codegen's el_put / el_flush)."""
    check_kernel(fn)
    if backend in _UNAVAILABLE:
        _check_calls(fn, fn.__name__, backend, (fn,))


def _check_calls(fn, kernel, backend, chain):
    try:
        tree, file, first_line = parse(fn)
    except (CompileError, SyntaxError):
        return  # nothing to check (the compiler says it needs the source)
    func = tree.body[0]
    local = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)} | \
        {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    calls = sorted((n for n in ast.walk(func) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        target = _global_value(fn, node.func, local)
        if getattr(target, "__module__", "") == "epic.language":
            message = unavailable_error(backend, getattr(target, "__name__", ""), kernel)
            if message is not None:
                raise _error(file, first_line, node, message)
        elif dispatch.is_jit_function(target) and target.fn not in chain:  # recursion: refused
            try:
                _check_calls(target.fn, kernel, backend, chain + (target.fn,))
            except SourceError as e:
                raise SourceError(CALLED_AT.format(e, target.fn.__name__,
                                                   f"{file}:{first_line + node.lineno}")) from None


def _global_value(fn, node, local):
    """What a called name (`f`, `module.f`) is among `fn`'s globals; None for names the function
    binds itself (`local`) and for other expressions."""
    glob = fn.__globals__
    if isinstance(node, ast.Name):
        return None if node.id in local else glob.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id not in local:
        return getattr(glob.get(node.value.id), node.attr, None)
    return None


def _error(file, first_line, node, message):
    return SourceError(f"{file}:{first_line + node.lineno}: {message}")


def _check_syntax(fn, parsed, kernel):
    tree, file, first_line = parsed
    func = tree.body[0]
    if not isinstance(func, ast.FunctionDef):
        raise _error(file, first_line, func, "a kernel is a function")
    found = _Syntax(func, kernel).statements(func.body)
    if found:
        raise _error(file, first_line, *found)


class _Syntax:
    """The first construct (in source order) the compiler does not translate: (node, message)."""

    def __init__(self, func, kernel):
        self.func, self.kernel = func, kernel

    def statements(self, statements):
        for statement in statements:
            found = self.node(statement)
            if found:
                return found
        return None

    def node(self, node):
        found = self.refusal(node)
        if found:
            return found
        for child in ast.iter_child_nodes(node):
            found = self.node(child)
            if found:
                return found
        return None

    def refusal(self, node):
        if not isinstance(node, _STATEMENTS + _EXPRESSIONS + _PARTS):
            return node, UNSUPPORTED.format(type(node).__name__)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bad = _bad_target(target)
                if bad is not None:
                    return bad, ASSIGN_TARGET
        elif isinstance(node, ast.AugAssign) and not isinstance(node.target, ast.Name):
            return node.target, ASSIGN_TARGET
        elif isinstance(node, ast.For):
            call = node.iter
            if not (isinstance(call, ast.Call) and _loop_kind(call.func)):
                return node, LOOP
            if node.orelse:
                return node, "for ... else is not supported in kernels"
            if not isinstance(node.target, ast.Name):
                return node.target, LOOP_TARGET
            if call.keywords or not 1 <= len(call.args) <= 3:
                return node, LOOP_BOUNDS
        elif isinstance(node, ast.While) and node.orelse:
            return node, "while ... else is not supported in kernels"
        elif isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                return node, "chained comparisons are not supported"
            if isinstance(node.ops[0], (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                return node, UNSUPPORTED.format(type(node.ops[0]).__name__)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.UAdd)):
            return node, f"{type(node.op).__name__} is not supported"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return node, UNSUPPORTED.format("MatMult")
        elif isinstance(node, ast.Call) and any(k.arg is None for k in node.keywords):
            return node, "calls with ** arguments are not supported in kernels"
        elif isinstance(node, ast.Return):
            if self.kernel:
                return node, KERNEL_RETURN
            if node is not self.func.body[-1]:
                return node, CALLEE_RETURN.format(self.func.name)
        return None


def _bad_target(target):
    """The part of an assignment's target that is not a name (or a tuple of them), or None."""
    if isinstance(target, ast.Name):
        return None
    if isinstance(target, ast.Tuple):
        for element in target.elts:
            bad = _bad_target(element)
            if bad is not None:
                return bad
        return None
    return target


def _loop_kind(func):
    """"range" or "static_range" for the loops the compiler translates (by the name called)."""
    name = func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else None
    return name if name in ("range", "static_range") else None


# --- el.static_range bounds: what is certainly a run-time value -------------------------------
#
# An abstract run of the compiler's scopes: a name holds RUNTIME (certainly a run-time value),
# NUMBER (a Python number), CONST (another constant, or one of unknown kind), an _Object (a
# global the source names: a module, a function), a tuple of those (the compiler's compile-time
# tuples), or None (cannot tell). Only RUNTIME bounds are refused, so the check never refuses
# what the compiler translates.

RUNTIME, NUMBER, CONST = "runtime", "number", "const"
_TO = "method-to"  # a run-time value's .to
_RUNTIME_EL = {"program_id", "num_programs", "arange", "rank", "num_ranks", "load", "atomic_add",
               "atomic_cas", "wait", "where", "full", "zeros", "cast", "peer_ptr"}
_REDUCTIONS = {"sum", "max", "min", "cumsum"}  # a constant's is itself
_MAX_PASSES = 8  # of an unrolled loop's body, to a fixed point


class _Object:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Object) and other.value is self.value

    def __hash__(self):
        return id(self.value)


def _of(value):
    """The state of a Python value the source reaches (a global, a constant, a default)."""
    if isinstance(value, (bool, int, float, np.number)):
        return NUMBER
    if value is None or isinstance(value, (str, bytes)):
        return CONST
    if isinstance(value, tuple):
        return tuple(_of(v) for v in value)
    return _Object(value)


def _join(a, b):
    if a == b:
        return a
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_join(x, y) for x, y in zip(a, b))
    if {a, b} <= {NUMBER, CONST}:
        return CONST
    return None


def _join_scopes(a, b):
    return {n: _join(a[n], b[n]) if n in b else None for n in a} | \
        {n: None for n in b if n not in a}


def _lifted(state):
    """A name's state once a run-time loop or branch reassigns it: numbers and values are
    carried (values), tuples go stale, other constants keep their value outside."""
    if state in (NUMBER, RUNTIME):
        return RUNTIME
    return state if isinstance(state, _Object) else None


def _assigned(statements):
    """The names the statements assign, loop variables excepted (codegen's assigned_names)."""
    loops = {n.target.id for s in statements for n in ast.walk(s)
             if isinstance(n, ast.For) and isinstance(n.target, ast.Name)}
    return {n.id for s in statements for n in ast.walk(s)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in loops}


class _Constness:
    def __init__(self, fn, parsed, chain=()):
        self.fn = fn
        self.tree, self.file, self.first_line = parsed
        self.func = self.tree.body[0]
        self.chain = chain + (fn,)  # the kernel, then the functions being called

    def kernel(self):
        scope = {name: CONST if dispatch.is_constexpr(p.annotation) else
                 None if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) else RUNTIME
                 for name, p in inspect.signature(self.fn).parameters.items()}
        self.block(self.func.body, scope)

    def called(self, scope):
        """The state of what the function returns, its parameters' states `scope`."""
        body = self.func.body
        last = body[-1]
        scope = self.block(body[:-1] if isinstance(last, ast.Return) else body, scope)
        if isinstance(last, ast.Return) and last.value is not None:
            return self.value(last.value, scope)
        return CONST

    def block(self, statements, scope):
        for statement in statements:
            scope = self.statement(statement, scope)
        return scope

    def statement(self, node, scope):
        scope = dict(scope)
        if isinstance(node, ast.Expr):
            self.value(node.value, scope)
        elif isinstance(node, ast.Assign):
            value = self.value(node.value, scope)
            for target in node.targets:
                self.assign(target, value, scope)
        elif isinstance(node, ast.AugAssign):
            value = self.value(node.value, scope)
            scope[node.target.id] = self.arithmetic(node.op, scope.get(node.target.id), value)
        elif isinstance(node, ast.If):
            test = self.value(node.test, scope)
            branches = [node.body, node.orelse]
            results = []
            if test != RUNTIME:  # a constant: the compiler translates one of the branches
                results.append(_join_scopes(*(self.block(b, scope) for b in branches)))
            if test not in (NUMBER, CONST) and not isinstance(test, _Object):
                results.append(self.run_time(node.body + node.orelse, scope, branches))
            scope = results[0] if len(results) == 1 else _join_scopes(*results)
        elif isinstance(node, ast.While):
            scope = self.run_time(node.body, scope, [node.body], node.test)
        elif isinstance(node, ast.For):
            bounds = [self.value(a, scope) for a in node.iter.args]
            if _loop_kind(node.iter.func) == "range":
                scope = self.run_time(node.body, scope, [node.body], loop=node.target.id)
            else:
                if any(b == RUNTIME or isinstance(b, tuple) for b in bounds):
                    raise _error(self.file, self.first_line, node, STATIC_RANGE)
                scope = self.unrolled(node, scope)
        return scope

    def run_time(self, statements, scope, bodies, test=None, loop=None):
        """A run-time loop or branch: what the bodies reassign is lifted (see _lifted) before
        and after; names first assigned in them are gone after."""
        inside = dict(scope)
        for name in _assigned(statements):
            if name in inside:
                inside[name] = _lifted(inside[name])
        if test is not None:
            self.value(test, inside)
        for body in bodies:
            self.block(body, inside if loop is None else {**inside, loop: RUNTIME})
        return inside

    def unrolled(self, node, scope):
        """An el.static_range loop: its body any number of times (its variable a number)."""
        entry = dict(scope)
        for _ in range(_MAX_PASSES):
            out = self.block(node.body, {**entry, node.target.id: NUMBER})
            joined = _join_scopes(scope, out)
            if joined == entry:
                break
            entry = joined
        else:
            entry = {n: None for n in entry}
        return entry

    def assign(self, target, value, scope):
        if isinstance(target, ast.Name):
            scope[target.id] = value
        elif isinstance(value, tuple) and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self.assign(t, v, scope)
        else:
            for t in target.elts:
                self.assign(t, None, scope)

    def arithmetic(self, op, a, b):
        if RUNTIME in (a, b):
            return RUNTIME
        if isinstance(a, tuple) and isinstance(b, tuple) and isinstance(op, ast.Add):
            return a + b
        if a == NUMBER and b == NUMBER:
            return NUMBER
        if all(v in (NUMBER, CONST) or isinstance(v, _Object) for v in (a, b)):
            return CONST
        return None

    def value(self, node, scope):
        if isinstance(node, ast.Constant):
            return _of(node.value)
        if isinstance(node, ast.Name):
            if node.id in scope:
                return scope[node.id]
            import builtins

            if node.id in self.fn.__globals__:
                return _of(self.fn.__globals__[node.id])
            return _of(getattr(builtins, node.id)) if hasattr(builtins, node.id) else None
        if isinstance(node, ast.Attribute):
            base = self.value(node.value, scope)
            if base == RUNTIME:
                return _TO if node.attr == "to" else None
            if isinstance(base, _Object) and hasattr(base.value, node.attr):
                return _of(getattr(base.value, node.attr))
            return None
        if isinstance(node, ast.Tuple):
            return tuple(self.value(e, scope) for e in node.elts)
        if isinstance(node, ast.Subscript):
            values, index = self.value(node.value, scope), self.value(node.slice, scope)
            if not isinstance(values, tuple) or not values or index == RUNTIME:
                return None
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                i = node.slice.value
                return values[i] if -len(values) <= i < len(values) else None
            element = values[0]
            for v in values[1:]:
                element = _join(element, v)
            return element
        if isinstance(node, ast.UnaryOp):
            return self.arithmetic(node.op, self.value(node.operand, scope), NUMBER)
        if isinstance(node, ast.BinOp):
            return self.arithmetic(node.op, self.value(node.left, scope),
                                   self.value(node.right, scope))
        if isinstance(node, (ast.BoolOp, ast.Compare)):
            values = [self.value(v, scope) for v in
                      (node.values if isinstance(node, ast.BoolOp)
                       else [node.left] + node.comparators)]
            if RUNTIME in values:
                return RUNTIME
            return NUMBER if all(v is not None for v in values) else None  # a bool
        if isinstance(node, ast.Call):
            return self.call(node, scope)
        return None

    def call(self, node, scope):
        fn = self.value(node.func, scope)
        args = [self.value(a, scope) for a in node.args]
        kwargs = {k.arg: self.value(k.value, scope) for k in node.keywords}
        if fn == _TO:
            return RUNTIME
        if not isinstance(fn, _Object):
            return None
        fn = fn.value
        if dispatch.is_jit_function(fn):
            return self.inline(node, fn, args, kwargs)
        if getattr(fn, "__module__", "") == "epic.language":
            if fn.__name__ in _RUNTIME_EL:
                return RUNTIME
            if fn.__name__ in _REDUCTIONS:
                return args[0] if args else kwargs.get("x")
            return CONST
        return None

    def inline(self, node, callee, args, kwargs):
        """What the call of `callee` gives, its body checked with its arguments' states."""
        if callee.fn in self.chain:
            return None  # recursion: refused where the call is made
        check_called(callee.fn)  # (one the source does not name: reached through a tuple)
        try:
            bound = callee.signature.bind(*args, **kwargs)
            parsed = parse(callee.fn)
        except (TypeError, CompileError, SyntaxError):
            return None  # refused where the call is made, or nothing to check
        scope = {}
        for name, p in callee.signature.parameters.items():
            if name in bound.arguments:
                scope[name] = bound.arguments[name] if p.kind not in (p.VAR_POSITIONAL,
                                                                      p.VAR_KEYWORD) else None
            elif p.default is not p.empty:
                scope[name] = _of(p.default)
        try:
            return _Constness(callee.fn, parsed, self.chain).called(scope)
        except SourceError as e:
            raise SourceError(CALLED_AT.format(
                e, callee.fn.__name__, f"{self.file}:{self.first_line + node.lineno}")) from None
