"""The DSL's errors, in a leaf module: the compiler, the interpreter, the source checks and
``@epic.jit`` all raise and catch them, and none of them needs to import another for that.
(Each is also importable from where it was defined before: ``epic.dsl.interpreter``,
``epic.dsl.checks``, ``epic.dsl.codegen``, ``epic.dsl.jit``.)"""

from __future__ import annotations

__all__ = ["CallError", "CompileError", "KernelError", "SourceError"]


class KernelError(RuntimeError):
    """A kernel failed in the interpreter (names the rank and program instance)."""


class CompileError(Exception):
    """A kernel the compiler cannot translate, with the source line."""


class SourceError(CompileError, KernelError):
    """An error in a kernel's source found without running it (``file:line: message``): what the
    static check refuses, and what the compiler finds evaluating constant expressions. Raised
    alike by the compiler (a :class:`CompileError`) and the interpreter (a
    :class:`~epic.dsl.interpreter.KernelError`)."""


class CallError(Exception):
    """A call of an @epic.jit function from a kernel that breaks the rules of
    :meth:`~epic.dsl.jit.JITFunction.bind_call`; the compiler and the interpreter report it at
    the call."""
