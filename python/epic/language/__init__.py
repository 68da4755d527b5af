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

These functions are what a kernel calls. Under ``EPIC_INTERPRET=1`` they execute on the CPU with
numpy (``epic.dsl.interpreter``): every (rank, program instance) pair is a thread, so waits
between ranks work. The compiler front end reads the same calls from the kernel's AST.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from epic.dsl import interpreter as _interp

__all__ = [
    "constexpr", "static_range",
    "float32", "bfloat16", "float16", "float8e4nv", "int32", "int64", "uint8",
    "program_id", "num_programs", "arange", "zeros", "full", "load", "store", "where", "cast",
    "sum", "max", "min", "cumsum", "atomic_add", "atomic_cas",
    "rank", "num_ranks", "peer_ptr", "put", "signal", "wait", "flush", "barrier", "fence",
]


class constexpr:
    """Annotation of a kernel argument whose value specializes the kernel (``BLOCK: el.constexpr``)."""


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


def _ctx():
    return _interp.current()


# --- programs and blocks ----------------------------------------------------------------------


def program_id(axis: int = 0) -> int:
    """This program instance's index along `axis` of the grid (on its rank)."""
    return _ctx().program_id(axis)


def num_programs(axis: int = 0) -> int:
    return _ctx().num_programs(axis)


def arange(start: int, end: int):
    """The block ``[start, end)``; its size must be a power of two."""
    n = end - start
    if n <= 0 or n & (n - 1):
        raise ValueError(f"el.arange: the block size must be a power of two, got {n}")
    return _interp.block(np.arange(start, end, dtype=np.int32))


def zeros(shape, dtype):
    return _interp.block(np.zeros(shape, dtype=dtype))


def full(shape, value, dtype):
    return _interp.block(np.full(shape, value, dtype=dtype))


def where(condition, x, y):
    return _interp.block(np.where(condition, x, y))


def cast(x, dtype):
    """`x` as `dtype` (FP8 saturates to its largest finite value, like the hardware)."""
    return _interp.cast(x, dtype)


def sum(x, axis=0):  # noqa: A001 - the language's name
    return _interp.reduce(np.sum, x, axis)


def max(x, axis=0):  # noqa: A001
    return _interp.reduce(np.max, x, axis)


def min(x, axis=0):  # noqa: A001
    return _interp.reduce(np.min, x, axis)


def cumsum(x, axis=0):
    return _interp.block(np.cumsum(x, axis=axis).astype(np.asarray(x).dtype))


# --- memory -------------------------------------------------------------------------------------


def load(pointer, mask=None, other=0, sem: str = "relaxed", scope: str = "gpu"):
    """Values at `pointer` (a pointer or a block of them); masked-out lanes give `other` and
    touch no memory. ``sem="acquire"`` (scalar pointers) orders later accesses after it; it
    is one observation per program instance: thread 0 loads, every thread gets that value."""
    return _ctx().load(pointer, mask, other, sem, scope)


def store(pointer, value, mask=None, sem: str = "relaxed", scope: str = "gpu"):
    """Stores `value` at `pointer` where `mask` holds; ``sem="release"`` orders earlier accesses
    before it."""
    _ctx().store(pointer, value, mask, sem, scope)


def atomic_add(pointer, value, mask=None, sem: str = "relaxed", scope: str = "gpu"):
    """Adds `value` at `pointer` atomically; returns the old value(s)."""
    return _ctx().atomic_add(pointer, value, mask, sem, scope)


def atomic_cas(pointer, compare, value, sem: str = "relaxed", scope: str = "gpu"):
    """Stores `value` where the old value equals `compare`; returns the old value."""
    return _ctx().atomic_cas(pointer, compare, value, sem, scope)


# --- communication (the comm dialect) ------------------------------------------------------------


def rank() -> int:
    """This rank in the EP world."""
    return _ctx().rank


def num_ranks() -> int:
    return _ctx().num_ranks


def peer_ptr(pointer, peer):
    """The same place in `peer`'s copy of a symmetric window (NVLink load/store: NCCL's LSA)."""
    return _ctx().peer_ptr(pointer, peer)


def put(dst, src, count, signal=None, signal_value: int = 1):
    """One-sided copy of `count` elements from local `src` to `dst` (a peer's window), then, if
    given, adds `signal_value` to `signal` once the data is visible (NCCL's GIN put: refused
    on the nccl backend, where el.store through el.peer_ptr then el.signal does the same)."""
    _ctx().put(dst, src, count, signal, signal_value)


def signal(pointer, value: int = 1):
    """Adds `value` to a signal word (release)."""
    _ctx().signal(pointer, value)


def wait(pointer, value: int, timeout_ms: int = 10_000):
    """Waits until the signal word at `pointer` reaches `value`; after `timeout_ms` the kernel
    fails naming the rank, the program and the word (never hangs silently)."""
    return _ctx().wait(pointer, value, timeout_ms)


def flush():
    """Waits until this program's puts are complete at their destinations (a GIN flush:
    refused on the nccl backend, like el.put)."""
    _ctx().flush()


def barrier(timeout_ms: int = 10_000):
    """Every program instance of every rank of the launch meets here; after `timeout_ms` the
    kernel fails naming the rank and the program (on every backend)."""
    _ctx().barrier(timeout_ms)


def fence(scope: str = "sys"):
    """Orders this program's memory accesses before and after it."""
    _ctx().fence(scope)
