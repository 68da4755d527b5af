"""epic.language (``import epic.language as el``): the language of ``@epic.jit`` kernels.

Triton-style: a kernel runs as a grid of program instances on every rank of an EP world; values
are scalars or 1-D blocks (``el.arange(0, BLOCK)`` with ``BLOCK: el.constexpr``); memory is
reached through pointers with masked loads and stores; communication maps one to one onto the
``comm`` dialect: ``el.rank()`` / ``el.num_ranks()`` (``comm.team_rank`` / ``team_size`` of the
world team), ``el.peer_ptr`` (``comm.peer_ptr``), ``el.put`` (``comm.put`` over a window, its
signal a word of the destination's window), ``el.signal`` (``comm.red add release``),
``el.wait`` (``comm.wait_flag``, bounded), ``el.flush``, ``el.barrier`` (``comm.barrier``),
``el.fence``, acquire loads and release stores (``comm.load`` / ``comm.store``), scoped atomics
(``comm.atomic_rmw``). Signals here are words in symmetric windows (NVLink/LSA style); NCCL's GIN
signal slots will be a separate kind when the network path needs them. ``el.put`` and
``el.flush`` are GIN operations on the NCCL backend, whose device communicator has no GIN
resources: a kernel that calls them is refused when compiled for it
(:func:`epic.dsl.checks.check_backend`).

These functions are what a kernel calls; each builtin is written once, here, and runs on one of
two executors (:mod:`epic.dsl.dispatch`): compiled, the code generator calls it with its semantic
layer (``_semantic``, :mod:`epic.dsl.semantic`), which emits the IR; under ``EPIC_INTERPRET=1``
the interpreter's program instance executes it on the CPU with numpy
(:mod:`epic.dsl.interpreter`: every (rank, program instance) pair is a thread, so waits between
ranks work). This module imports neither executor.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from epic.dsl.dispatch import builtin as _builtin
from epic.dsl.dispatch import executor as _executor

__all__ = [
    "constexpr", "static_range",
    "float32", "bfloat16", "float16", "float8e4nv", "int32", "int64", "uint8",
    "program_id", "num_programs", "arange", "zeros", "full", "load", "store", "where", "cast",
    "exp", "sum", "max", "min", "cumsum", "atomic_add", "atomic_cas",
    "rank", "num_ranks", "peer_ptr", "put", "signal", "wait", "flush", "barrier", "fence",
]


class constexpr:
    """Annotation of a kernel argument whose value specializes the kernel \
(``BLOCK: el.constexpr``)."""

    __epic_constexpr__ = True  # (dispatch.CONSTEXPR: what the checks and @epic.jit look for)


def static_range(*args):
    """A loop unrolled at compile time (its bounds are constants)."""
    return range(*args)


# Element types: numpy dtypes (ml_dtypes for bf16 and FP8 e4m3).
float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8e4nv = np.dtype(ml_dtypes.float8_e4m3fn)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)


# --- programs and blocks ----------------------------------------------------------------------


@_builtin
def program_id(axis: int = 0, _semantic=None) -> int:
    """This program instance's index along `axis` of the grid (on its rank)."""
    return _executor(_semantic).program_id(axis)


@_builtin
def num_programs(axis: int = 0, _semantic=None) -> int:
    return _executor(_semantic).num_programs(axis)


@_builtin
def arange(start: int, end: int, _semantic=None):
    """The block ``[start, end)``; its size must be a power of two."""
    return _executor(_semantic).arange(start, end)


@_builtin
def zeros(shape, dtype, _semantic=None):
    return _executor(_semantic).zeros(shape, dtype)


@_builtin
def full(shape, value, dtype, _semantic=None):
    return _executor(_semantic).full(shape, value, dtype)


@_builtin
def where(condition, x, y, _semantic=None):
    return _executor(_semantic).where(condition, x, y)


@_builtin
def cast(x, dtype, _semantic=None):
    """`x` as `dtype` (FP8 saturates to its largest finite value, like the hardware)."""
    return _executor(_semantic).cast(x, dtype)


@_builtin
def exp(x, _semantic=None):
    """e to the power of float32 `x` (on the GPU: ``ex2.approx`` of ``x * log2(e)``, within a
    few ulp of the exact value for normal results; the interpreter uses numpy's)."""
    return _executor(_semantic).exp(x)


@_builtin
def sum(x, axis=0, _semantic=None):  # noqa: A001 - the language's name
    return _executor(_semantic).sum(x, axis)


@_builtin
def max(x, axis=0, _semantic=None):  # noqa: A001
    return _executor(_semantic).max(x, axis)


@_builtin
def min(x, axis=0, _semantic=None):  # noqa: A001
    return _executor(_semantic).min(x, axis)


@_builtin
def cumsum(x, axis=0, _semantic=None):
    return _executor(_semantic).cumsum(x, axis)


# --- memory -------------------------------------------------------------------------------------


@_builtin
def load(pointer, mask=None, other=0, sem: str = "relaxed", scope: str = "gpu", _semantic=None):
    """Values at `pointer` (a pointer or a block of them); masked-out lanes give `other` and
    touch no memory. ``sem="acquire"`` (scalar pointers) orders later accesses after it; it
    is one observation per program instance: thread 0 loads, every thread gets that value."""
    return _executor(_semantic).load(pointer, mask, other, sem, scope)


@_builtin
def store(pointer, value, mask=None, sem: str = "relaxed", scope: str = "gpu", _semantic=None):
    """Stores `value` at `pointer` where `mask` holds; ``sem="release"`` orders earlier accesses
    before it."""
    _executor(_semantic).store(pointer, value, mask, sem, scope)


@_builtin
def atomic_add(pointer, value, mask=None, sem: str = "relaxed", scope: str = "gpu",
               _semantic=None):
    """Adds `value` at `pointer` atomically; returns the old value(s)."""
    return _executor(_semantic).atomic_add(pointer, value, mask, sem, scope)


@_builtin
def atomic_cas(pointer, compare, value, sem: str = "relaxed", scope: str = "gpu",
               _semantic=None):
    """Stores `value` where the old value equals `compare`; returns the old value."""
    return _executor(_semantic).atomic_cas(pointer, compare, value, sem, scope)


# --- communication (the comm dialect) ------------------------------------------------------------


@_builtin
def rank(_semantic=None) -> int:
    """This rank in the EP world."""
    return _executor(_semantic).rank()


@_builtin
def num_ranks(_semantic=None) -> int:
    return _executor(_semantic).num_ranks()


@_builtin
def peer_ptr(pointer, peer, _semantic=None):
    """The same place in `peer`'s copy of a symmetric window (NVLink load/store: NCCL's LSA)."""
    return _executor(_semantic).peer_ptr(pointer, peer)


@_builtin
def put(dst, src, count, signal=None, signal_value: int = 1, _semantic=None):
    """One-sided copy of `count` elements from local `src` to `dst` (a peer's window), then, if
    given, adds `signal_value` to `signal` once the data is visible (NCCL's GIN put: refused
    on the nccl backend, where el.store through el.peer_ptr then el.signal does the same)."""
    _executor(_semantic).put(dst, src, count, signal, signal_value)


@_builtin
def signal(pointer, value: int = 1, _semantic=None):
    """Adds `value` to a signal word (release)."""
    _executor(_semantic).signal(pointer, value)


@_builtin
def wait(pointer, value: int, timeout_ms: int = 10_000, _semantic=None):
    """Waits until the signal word at `pointer` reaches `value`; after `timeout_ms` the kernel
    fails naming the rank, the program and the word (never hangs silently)."""
    return _executor(_semantic).wait(pointer, value, timeout_ms)


@_builtin
def flush(_semantic=None):
    """Waits until this program's puts are complete at their destinations (a GIN flush:
    refused on the nccl backend, like el.put)."""
    _executor(_semantic).flush()


@_builtin
def barrier(timeout_ms: int = 10_000, _semantic=None):
    """Every program instance of every rank of the launch meets here; after `timeout_ms` the
    kernel fails naming the rank and the program (on every backend)."""
    _executor(_semantic).barrier(timeout_ms)


@_builtin
def fence(scope: str = "sys", _semantic=None):
    """Orders this program's memory accesses before and after it."""
    _executor(_semantic).fence(scope)
