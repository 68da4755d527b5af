"""Where a call of an ``epic.language`` builtin runs: the compiler's semantic layer, which the
code generator passes to each builtin it calls (``_semantic=``, as Triton's code generator
does), or else the interpreter's program instance running on this thread.

Outside a kernel, the builtins that only compute on values (``el.cumsum``, ``el.cast``, ...)
run on numpy (:mod:`epic.dsl.values`); the others say they run inside a kernel.

It imports only :mod:`epic.dsl.values` (numpy), so the language, the interpreter and the
compiler all depend on it and not on each other: the builtins are written once, in
``epic.language``, and each executor implements every one of them by name (``load``, ``put``,
...).
"""

from __future__ import annotations

import threading

from .values import Values

__all__ = ["BUILTIN", "builtin", "executor", "interpreted_program", "set_interpreted_program",
           "is_jit_function", "is_constexpr"]

# The attribute that marks a builtin: a function both executors implement.
BUILTIN = "__epic_builtin__"
# The attributes that mark an @epic.jit function (epic.dsl.jit.JITFunction) and the el.constexpr
# annotation: what the checks and the compiler recognize without importing epic.dsl.jit or the
# language (both import them).
JIT_FUNCTION = "__epic_jit_function__"
CONSTEXPR = "__epic_constexpr__"

_local = threading.local()


def builtin(fn):
    setattr(fn, BUILTIN, True)
    return fn


def is_jit_function(value):
    return getattr(type(value), JIT_FUNCTION, False) is True


def is_constexpr(annotation):
    """Whether a parameter's annotation is el.constexpr (or names it: string annotations)."""
    return getattr(annotation, CONSTEXPR, False) is True or \
        annotation in ("el.constexpr", "constexpr")


def executor(semantic):
    """What runs a builtin's call: `semantic` when the compiler gave one, else this thread's
    interpreted program instance, else (outside a kernel) numpy for the value builtins."""
    if semantic is not None:
        return semantic
    program = getattr(_local, "program", None)
    return program if program is not None else _OUTSIDE


def interpreted_program():
    """The interpreter's program instance running on this thread, or None."""
    return getattr(_local, "program", None)


def set_interpreted_program(program):
    _local.program = program


class _Outside(Values):
    """Executes the value builtins outside a kernel; the rest need a program instance."""

    def __getattr__(self, name):  # (only what Values lacks)
        raise RuntimeError("epic.language functions run inside an @epic.jit kernel "
                           "(launched as kernel[grid](...))")


_OUTSIDE = _Outside()
