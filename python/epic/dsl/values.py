"""The interpreter's values: blocks are numpy arrays (:class:`Block`, with Triton's
``.to(dtype)``), and :class:`Values` executes the ``epic.language`` builtins that only compute
on values (``el.arange``, ``el.where``, ``el.cast``, ``el.sum``, ...). They need no program
instance, so they also run outside a kernel (on numpy values, for tests and experiments).

A leaf module (numpy only): :mod:`epic.dsl.dispatch` falls back to it outside a kernel, and the
interpreter's program instances (:class:`epic.dsl.interpreter.Context`) extend it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["Block", "Values", "block", "cast", "reduce"]

_FP8_MAX = {np.dtype(ml_dtypes.float8_e4m3fn): 448.0, np.dtype(ml_dtypes.float8_e5m2): 57344.0}


class Block(np.ndarray):
    """A 1-D block value: a numpy array with Triton's ``.to(dtype)``."""

    def to(self, dtype):
        return cast(self, dtype)


def block(values):
    return np.asarray(values).view(Block)


def cast(x, dtype):
    dtype = np.dtype(dtype)
    values = np.asarray(x)
    if dtype in _FP8_MAX:  # saturate, as cvt.rn.satfinite does
        values = np.clip(values.astype(np.float32), -_FP8_MAX[dtype], _FP8_MAX[dtype])
    out = values.astype(dtype)
    return block(out) if out.ndim else out[()]


def reduce(op, x, axis):
    values = np.asarray(x)
    result = op(values, axis=axis)
    return block(result) if np.ndim(result) else result[()]


class Values:
    """What executes the value builtins on numpy arrays (one method per builtin)."""

    def arange(self, start, end):
        n = end - start
        if n <= 0 or n & (n - 1):
            raise ValueError(f"el.arange: the block size must be a power of two, got {n}")
        return block(np.arange(start, end, dtype=np.int32))

    def zeros(self, shape, dtype):
        return block(np.zeros(shape, dtype=dtype))

    def full(self, shape, value, dtype):
        return block(np.full(shape, value, dtype=dtype))

    def where(self, condition, x, y):
        return block(np.where(condition, x, y))

    def cast(self, x, dtype):
        return cast(x, dtype)

    def exp(self, x):
        values = np.asarray(x)
        if values.dtype != np.float32:
            raise TypeError(f"el.exp: takes float32 values, got {values.dtype}: cast them first")
        out = np.exp(values)
        return block(out) if out.ndim else out[()]

    def sum(self, x, axis):
        return reduce(np.sum, x, axis)

    def max(self, x, axis):
        return reduce(np.max, x, axis)

    def min(self, x, axis):
        return reduce(np.min, x, axis)

    def cumsum(self, x, axis):
        return block(np.cumsum(x, axis=axis).astype(np.asarray(x).dtype))
