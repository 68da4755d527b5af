"""The interpreter and the compiler refuse the same kernels alike: what a kernel's source may hold
is one check (epic.dsl.checks) both make before they run or translate it, so a program the
compiler refuses does not run on the CPU either, with the same error (type, message, line)."""

import inspect

import numpy as np
import pytest

import epic
import epic.language as el
from epic.dsl.checks import SourceError
from epic.dsl.codegen import CompileError
from epic.dsl.interpreter import KernelError

from dsl_kernels import line_of

pytest.importorskip("epic._ir", reason="the DSL compiler is built where LLVM/MLIR are")

G = 1


@epic.jit
def tries(x_ptr, n):
    try:  # the line the error names
        el.store(x_ptr, n)
    except ValueError:
        pass


@epic.jit
def uses_with(x_ptr, n):
    with n:  # the line the error names
        el.store(x_ptr, n)


@epic.jit
def uses_lambda(x_ptr, n):
    f = lambda v: v + 1  # the line the error names  # noqa: E731
    el.store(x_ptr, f(n))


@epic.jit
def list_comprehension(x_ptr, n):
    values = [n * i for i in range(2)]  # the line the error names
    el.store(x_ptr, values[0])


@epic.jit
def dict_comprehension(x_ptr, n):
    values = {i: n for i in range(2)}  # the line the error names
    el.store(x_ptr, values[0])


@epic.jit
def set_comprehension(x_ptr, n):
    values = {n * i for i in range(2)}  # the line the error names
    el.store(x_ptr, len(values))


@epic.jit
def generator_expression(x_ptr, n):
    el.store(x_ptr, sum(n * i for i in range(2)))  # the line the error names


@epic.jit
def declares_global(x_ptr, n):
    global G  # the line the error names
    G = n
    el.store(x_ptr, G)


def _declares_nonlocal():
    m = 1

    @epic.jit
    def declares_nonlocal(x_ptr, n):
        nonlocal m  # the line the error names
        m = n
        el.store(x_ptr, m)

    return declares_nonlocal


declares_nonlocal = _declares_nonlocal()


@epic.jit
def formats(x_ptr, n):
    text = f"{n}"  # the line the error names
    el.store(x_ptr, len(text))


@epic.jit
def asserts(x_ptr, n):
    assert n > 0  # the line the error names
    el.store(x_ptr, n)


@epic.jit
def raises(x_ptr, n):
    if n > 100:
        raise ValueError("too many")  # the line the error names
    el.store(x_ptr, n)


@epic.jit
def static_range_of_an_argument(x_ptr, n):
    for i in el.static_range(n):  # the line the error names
        el.store(x_ptr + i, i)


@epic.jit
def static_range_of_a_load(x_ptr, n):
    count = el.load(x_ptr) + 1
    for i in el.static_range(0, count):  # the line the error names
        el.store(x_ptr + i, i)


@epic.jit
def static_range_of_a_loop_variable(x_ptr, n):
    for i in range(n):
        for j in el.static_range(i):  # the line the error names
            el.store(x_ptr + j, j)


@epic.jit
def static_range_of_a_reassigned_number(x_ptr, n):
    m = 2
    while m < n:  # a run-time loop: m is a value after it
        m = m + 1
    for i in el.static_range(m):  # the line the error names
        el.store(x_ptr + i, i)


@epic.jit
def unrolls(x_ptr, count):
    for i in el.static_range(count):  # the line the error names
        el.store(x_ptr + i, i)


@epic.jit
def static_range_in_a_called_function(x_ptr, n):
    unrolls(x_ptr, n * 2)  # the call site


@epic.jit
def returns_in_a_loop(x_ptr, n):
    for i in range(n):
        el.store(x_ptr + i, i)
        return  # the line the error names


@epic.jit
def returns_early(x_ptr, n):
    if n > 2:
        return  # the line the error names
    el.store(x_ptr, n)


@epic.jit
def generates(x_ptr, n):
    el.store(x_ptr, n)
    yield n  # the line the error names


@epic.jit
def breaks(x_ptr, n):
    for i in range(n):
        el.store(x_ptr + i, i)
        break  # the line the error names


@epic.jit
def continues(x_ptr, n):
    for i in range(n):
        continue  # the line the error names


@epic.jit
def for_else(x_ptr, n):
    for i in range(n):  # the line the error names
        el.store(x_ptr + i, i)
    else:
        el.store(x_ptr, n)


@epic.jit
def while_else(x_ptr, n):
    while n > 0:  # the line the error names
        n = n - 1
    else:
        el.store(x_ptr, n)


@epic.jit
def chains_comparisons(x_ptr, n):
    if 0 < n < 8:  # the line the error names
        el.store(x_ptr, n)


@epic.jit
def compares_identity(x_ptr, n):
    if n is not None:  # the line the error names
        el.store(x_ptr, n)


@epic.jit
def conditional_expression(x_ptr, n):
    el.store(x_ptr, 1 if n > 0 else 2)  # the line the error names


@epic.jit
def walrus(x_ptr, n):
    if (m := n + 1) > 0:  # the line the error names
        el.store(x_ptr, m)


@epic.jit
def stores_through_a_subscript(x_ptr, n):
    values = (n, n)
    values[0] = 1  # the line the error names
    el.store(x_ptr, values[0])


@epic.jit
def adds_to_a_subscript(x_ptr, n):
    values = (n, n)
    values[0] += 1  # the line the error names
    el.store(x_ptr, values[0])


@epic.jit
def loops_over_pairs(x_ptr, n):
    for i, j in range(n):  # the line the error names
        el.store(x_ptr + i, j)


@epic.jit
def loops_without_bounds(x_ptr, n):
    for i in range():  # the line the error names
        el.store(x_ptr + i, i)


@epic.jit
def slices(x_ptr, n):
    values = (n, n, n)
    el.store(x_ptr, values[0:2][0])  # the line the error names


@epic.jit
def inverts(x_ptr, n):
    el.store(x_ptr, ~n)  # the line the error names


@epic.jit
def nested_function(x_ptr, n):
    def helper(v):  # the line the error names
        return v
    el.store(x_ptr, helper(n))


@epic.jit
def deletes(x_ptr, n):
    m = n
    del m  # the line the error names
    el.store(x_ptr, n)


@epic.jit
def returns_in_a_branch(x, n):
    if n > 0:
        return x  # the line the error names
    return x + 1


@epic.jit
def calls_returns_in_a_branch(x_ptr, n):
    el.store(x_ptr, returns_in_a_branch(el.load(x_ptr), n))


@epic.jit
def with_a_try(x):
    try:  # the line the error names
        return x
    finally:
        pass


@epic.jit
def calls_a_function_with_a_try(x_ptr, n):
    if n > 100:  # even where no call is made: every function it calls is checked
        el.store(x_ptr, with_a_try(n))
    el.store(x_ptr, n)


def _message(kernel, message, marker="the line the error names"):
    return f"{inspect.getsourcefile(kernel.fn)}:{line_of(kernel, marker)}: {message}"


_UNROLLS = _message(unrolls, "el.static_range takes constants") + \
    f"\n  in unrolls, called at " \
    f"{_message(static_range_in_a_called_function, '', 'the call site')[:-2]}"

REFUSED = [  # (kernel, what the error says after its file:line, or the whole message)
    (tries, "Try is not supported in kernels"),
    (uses_with, "With is not supported in kernels"),
    (uses_lambda, "Lambda is not supported in kernels"),
    (list_comprehension, "ListComp is not supported in kernels"),
    (dict_comprehension, "DictComp is not supported in kernels"),
    (set_comprehension, "SetComp is not supported in kernels"),
    (generator_expression, "GeneratorExp is not supported in kernels"),
    (declares_global, "Global is not supported in kernels"),
    (declares_nonlocal, "Nonlocal is not supported in kernels"),
    (formats, "JoinedStr is not supported in kernels"),
    (asserts, "Assert is not supported in kernels"),
    (raises, "Raise is not supported in kernels"),
    (static_range_of_an_argument, "el.static_range takes constants"),
    (static_range_of_a_load, "el.static_range takes constants"),
    (static_range_of_a_loop_variable, "el.static_range takes constants"),
    (static_range_of_a_reassigned_number, "el.static_range takes constants"),
    (static_range_in_a_called_function, _UNROLLS),
    (returns_in_a_loop, "a kernel returns nothing (it stores its results); a return ends the "
                        "body of an @epic.jit function that a kernel calls"),
    (returns_early, "a kernel returns nothing (it stores its results); a return ends the body "
                    "of an @epic.jit function that a kernel calls"),
    (generates, "Yield is not supported in kernels"),
    (breaks, "Break is not supported in kernels"),
    (continues, "Continue is not supported in kernels"),
    (for_else, "for ... else is not supported in kernels"),
    (while_else, "while ... else is not supported in kernels"),
    (chains_comparisons, "chained comparisons are not supported"),
    (compares_identity, "IsNot is not supported in kernels"),
    (conditional_expression, "IfExp is not supported in kernels"),
    (walrus, "NamedExpr is not supported in kernels"),
    (stores_through_a_subscript, "only names (and tuples of names) can be assigned"),
    (adds_to_a_subscript, "only names (and tuples of names) can be assigned"),
    (loops_over_pairs, "a for loop's variable is one name"),
    (loops_without_bounds, "range(...) and el.static_range(...) take 1 to 3 bounds, as "
                           "positional arguments"),
    (slices, "Slice is not supported in kernels"),
    (inverts, "Invert is not supported"),
    (nested_function, "FunctionDef is not supported in kernels"),
    (deletes, "Delete is not supported in kernels"),
    (calls_returns_in_a_branch, None),  # the message names the called function's line
    (calls_a_function_with_a_try, None),
]


def _interpret(kernel, x, monkeypatch):
    monkeypatch.setenv("EPIC_INTERPRET", "1")
    with pytest.raises(Exception) as info:
        kernel[(1,)](x, 3, world=epic.VirtualWorld(1))
    return info.value


def _compile(kernel, x, monkeypatch, tmp_path):
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    with pytest.raises(Exception) as info:
        kernel.compile(x, 3)
    return info.value


@pytest.mark.parametrize("kernel, message", REFUSED, ids=[k.__name__ for k, _ in REFUSED])
def test_the_interpreter_refuses_what_the_compiler_refuses(kernel, message, monkeypatch,
                                                           tmp_path):
    x = np.zeros(8, np.int32)
    interpreted = _interpret(kernel, x, monkeypatch)
    compiled = _compile(kernel, x, monkeypatch, tmp_path)
    assert type(interpreted) is type(compiled) is SourceError
    assert isinstance(compiled, CompileError) and isinstance(interpreted, KernelError)
    assert str(interpreted) == str(compiled)
    if message is None:  # an error in a called function: its line
        callee = {calls_returns_in_a_branch: returns_in_a_branch,
                  calls_a_function_with_a_try: with_a_try}[kernel]
        assert str(compiled).startswith(_message(callee, ""))
    elif "\n" in message:
        assert str(compiled) == message
    else:
        assert str(compiled) == _message(kernel, message)
    assert not x.any()  # refused before it ran


@epic.jit
def divides_by_zero(x_ptr, n, BLOCK: el.constexpr):
    el.store(x_ptr, n + BLOCK // 0)  # the line the error names


@epic.jit
def modulo_zero(x_ptr, n, BLOCK: el.constexpr):
    el.store(x_ptr, BLOCK % (BLOCK - BLOCK) + n)  # the line the error names


@epic.jit
def divides_a_value_by_zero(x_ptr, n, BLOCK: el.constexpr):
    el.store(x_ptr, n // (BLOCK - 4))  # the line the error names (integer division: UB on a GPU)


@epic.jit
def halves(v, BLOCK: el.constexpr):
    return v + 1.0 / (BLOCK - 4)  # the line the error names


@epic.jit
def calls_halves(x_ptr, n, BLOCK: el.constexpr):
    el.store(x_ptr, halves(n, BLOCK))


def _python_says(compute):
    try:
        compute()
    except ZeroDivisionError as e:
        return str(e)


@pytest.mark.parametrize("kernel, error", [
    (divides_by_zero, "ZeroDivisionError: integer division or modulo by zero"),
    (modulo_zero, f"ZeroDivisionError: {_python_says(lambda: 1 % 0)}"),
    (divides_a_value_by_zero, "ZeroDivisionError: integer division or modulo by zero"),
    (halves, "ZeroDivisionError: float division by zero"),
], ids=["floordiv", "mod", "a-value", "in-a-called-function"])
def test_a_constant_division_by_zero_names_the_line_on_both_paths(kernel, error, monkeypatch,
                                                                   tmp_path):
    where = _message(kernel, error)
    launched = calls_halves if kernel is halves else kernel
    x = np.zeros(8, np.int32)
    monkeypatch.setenv("EPIC_INTERPRET", "1")
    with pytest.raises(KernelError) as interpreted:
        launched[(1,)](x, 3, BLOCK=4, world=epic.VirtualWorld(1))
    assert str(interpreted.value) == f"rank 0, program 0: {where}"
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    with pytest.raises(KernelError) as compiled:  # the interpreter's type, and a CompileError
        launched.compile(x, 3, BLOCK=4)
    assert isinstance(compiled.value, CompileError)
    assert str(compiled.value).split("\n")[0] == where


@epic.jit
def unrolls_what_is_constant(x_ptr, n, BLOCK: el.constexpr):
    total = 0
    for i in el.static_range(1, BLOCK // 2 + 1):
        total += i
    m = 0
    if n > 0:  # a run-time branch: m is a value after it
        m = BLOCK
    for j in el.static_range(unroll_count(BLOCK)):  # what a called function gives
        el.store(x_ptr + j, total + n)
    el.store(x_ptr + 7, m)


@epic.jit
def unroll_count(B: el.constexpr):
    return B - 2


def test_static_ranges_of_constants_run_and_compile(monkeypatch, tmp_path):
    x = np.zeros(8, np.int32)
    monkeypatch.setenv("EPIC_INTERPRET", "1")
    unrolls_what_is_constant[(1,)](x, 3, BLOCK=4, world=epic.VirtualWorld(1))
    assert list(x) == [6, 6, 0, 0, 0, 0, 0, 4]
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    assert "gpu.func" in unrolls_what_is_constant.compile(x, 3, BLOCK=4).asm["ir"]


@epic.jit
def waits_forever(x_ptr, n):
    el.wait(x_ptr, n, timeout_ms=9300000000000)  # the line the error names


@epic.jit
def barrier_of_no_time(x_ptr, n):
    el.barrier(timeout_ms=0)  # the line the error names


@pytest.mark.parametrize("kernel, what", [(waits_forever, "wait"),
                                          (barrier_of_no_time, "barrier")])
def test_a_wait_bound_outside_the_comm_dialects_is_refused_alike(kernel, what, monkeypatch,
                                                                 tmp_path):
    """el.wait / el.barrier timeouts: [1, 2^31] ms (what comm's waits take) in both paths."""
    message = f"el.{what}: timeout_ms must be an int in [1, 2147483648] (ms), got"
    x = np.zeros(8, np.int32)
    assert message in str(_interpret(kernel, x, monkeypatch))
    assert message in str(_compile(kernel, x, monkeypatch, tmp_path))
