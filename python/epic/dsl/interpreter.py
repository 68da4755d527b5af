"""Runs ``@epic.jit`` kernels on the CPU with numpy (``EPIC_INTERPRET=1``).

Every (rank, program instance) pair of a launch is a thread, so a program may wait for a signal
another rank's program sends, as on the GPU. Memory is numpy: a kernel argument array becomes a
pointer to its bytes; symmetric windows (:class:`SymmetricMemory`) hold one byte array per rank,
which ``el.peer_ptr`` reaches. Every wait and barrier is bounded: on expiry the launch fails with
the rank, the program and what it waited for. A kernel's call of another ``@epic.jit`` function
runs it in place, with the calling program's context (:func:`call`). All memory accesses are
sequentially consistent here (one lock for atomics, the GIL for the rest), which every correct
GPU schedule refines. Before it runs, a kernel's source goes through the compiler's check
(:mod:`epic.dsl.checks`): what the compiler refuses is not run here either, and fails alike.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from . import dispatch
from .errors import CallError, KernelError
from .values import Values, block

__all__ = ["SymmetricMemory", "Pointer", "launch", "call", "KernelError"]


class _Aborted(KernelError):
    """A program stopped because another one failed (not the cause)."""


class SymmetricMemory:
    """A symmetric window: `num_bytes` per rank, every rank's copy reachable by its peers."""

    def __init__(self, num_ranks: int, num_bytes: int):
        self.num_ranks, self.num_bytes = num_ranks, num_bytes
        self.ranks = [np.zeros(num_bytes, dtype=np.uint8) for _ in range(num_ranks)]

    def view(self, rank, dtype, count, offset_bytes=0):
        """Rank `rank`'s window as `count` elements of `dtype` from `offset_bytes` (for checks)."""
        size = np.dtype(dtype).itemsize
        return self.ranks[rank][offset_bytes:offset_bytes + count * size].view(dtype)


class Pointer:
    """A typed pointer (or a block of them) into a byte array; arithmetic is in elements."""

    def __init__(self, memory, offset, dtype, symmetric=None, rank=None):
        self.memory = memory  # 1-D uint8
        self.offset = offset  # bytes: int or int64 array
        self.dtype = np.dtype(dtype)
        self.symmetric, self.rank = symmetric, rank

    def _moved(self, offset):
        return Pointer(self.memory, offset, self.dtype, self.symmetric, self.rank)

    def __add__(self, elements):
        e = np.asarray(elements, dtype=np.int64)
        return self._moved(self.offset + e * self.dtype.itemsize if e.ndim else
                           self.offset + int(e) * self.dtype.itemsize)

    __radd__ = __add__

    def __sub__(self, elements):
        return self + (-np.asarray(elements, dtype=np.int64))

    def to(self, dtype):
        """The same address seen as `dtype` (Triton's pointer cast)."""
        return Pointer(self.memory, self.offset, dtype, self.symmetric, self.rank)

    def _indices(self, where):
        offsets = np.asarray(self.offset, dtype=np.int64)
        if np.any(offsets % self.dtype.itemsize):
            raise KernelError(f"{where}: address not aligned to {self.dtype.itemsize} bytes")
        if np.any(offsets < 0) or np.any(offsets + self.dtype.itemsize > self.memory.size):
            bad = offsets[(offsets < 0) | (offsets + self.dtype.itemsize > self.memory.size)]
            raise KernelError(f"{where}: out of bounds: byte offset {int(bad.flat[0])} of a "
                              f"{self.memory.size}-byte buffer")
        return offsets // self.dtype.itemsize

    def typed(self):
        size = self.memory.size // self.dtype.itemsize * self.dtype.itemsize
        return self.memory[:size].view(self.dtype)


def pointer_to(array):
    """A kernel argument: a numpy array (contiguous: its memory is shared, not copied) becomes a
    pointer to its first element."""
    if not isinstance(array, np.ndarray) or not array.flags["C_CONTIGUOUS"]:
        raise TypeError("kernel arguments in the interpreter are contiguous numpy arrays, got "
                        f"{type(array).__name__}")
    return Pointer(array.reshape(-1).view(np.uint8), 0, array.dtype)


_atomic = threading.RLock()


class _Launch:
    """What the threads of one launch share."""

    def __init__(self, num_ranks, grid, timeout_s):
        self.num_ranks, self.grid = num_ranks, grid
        self.programs = int(np.prod(grid))
        self.barrier = threading.Barrier(num_ranks * self.programs)
        self.failed = threading.Event()
        self.timeout_s = timeout_s
        self.codes = set()  # the kernel's and its called functions' code: where errors point


class Context(Values):
    """One (rank, program instance): what executes the epic.language builtins it calls (one
    method each, by the builtin's name, as the compiler's semantic layer has)."""

    def __init__(self, launch, rank, program, kernel=None):
        # (not `rank` / `num_ranks`: those are the builtins' methods)
        self.launch, self.rank_index, self.world_size = launch, rank, launch.num_ranks
        self.program = program
        self.calls = [kernel]  # the kernel, then the @epic.jit functions it is in (innermost last)

    def location(self):
        return f"rank {self.rank_index}, program {self.program}"

    # --- programs
    def program_id(self, axis):
        g = self.launch.grid
        if not 0 <= axis < len(g):
            raise KernelError(f"{self.location()}: program_id({axis}) of a {len(g)}-D grid")
        index = self.program
        for a in range(axis):
            index //= g[a]
        return index % g[axis]

    def num_programs(self, axis):
        return self.launch.grid[axis]

    def rank(self):
        return self.rank_index

    def num_ranks(self):
        return self.world_size

    # --- memory
    def load(self, pointer, mask, other, sem, scope):
        _check_sem(sem, ("relaxed", "acquire"), "load")
        if not isinstance(pointer, Pointer):
            raise KernelError(
                f"{self.location()}: el.load of a {type(pointer).__name__}, not a pointer")
        if mask is None:
            values = pointer.typed()[pointer._indices(f"{self.location()}: el.load")]
            return block(values.copy()) if np.ndim(values) else values[()]
        m = np.broadcast_to(np.asarray(mask, dtype=bool), np.shape(pointer.offset))
        out = np.full(m.shape, other, dtype=pointer.dtype)
        if m.any():
            masked = pointer._moved(np.asarray(pointer.offset)[m])
            out[m] = pointer.typed()[masked._indices(f"{self.location()}: el.load")]
        return block(out) if out.ndim else out[()]

    def store(self, pointer, value, mask, sem, scope):
        _check_sem(sem, ("relaxed", "release"), "store")
        if not isinstance(pointer, Pointer):
            raise KernelError(
                f"{self.location()}: el.store to a {type(pointer).__name__}, not a pointer")
        offsets = np.asarray(pointer.offset)
        values = np.broadcast_to(np.asarray(value).astype(pointer.dtype), offsets.shape)
        if mask is not None:
            m = np.broadcast_to(np.asarray(mask, dtype=bool), offsets.shape)
            pointer, values = pointer._moved(offsets[m]), values[m]
        pointer.typed()[pointer._indices(f"{self.location()}: el.store")] = values

    def atomic_add(self, pointer, value, mask, sem, scope):
        with _atomic:
            old = self.load(pointer, mask, 0, "relaxed", scope)
            offsets = np.asarray(pointer.offset)
            if offsets.ndim == 0:
                if mask is None or bool(mask):
                    self.store(pointer, old + value, None, "relaxed", scope)
                return old
            # Lanes that hit the same word add in lane order.
            values = np.broadcast_to(np.asarray(value).astype(pointer.dtype), offsets.shape)
            live = np.ones(offsets.shape, bool) if mask is None else np.asarray(mask, bool)
            olds = np.zeros(offsets.shape, pointer.dtype)
            for i in np.nonzero(live)[0]:
                p = pointer._moved(int(offsets[i]))
                olds[i] = self.load(p, None, 0, "relaxed", scope)
                self.store(p, olds[i] + values[i], None, "relaxed", scope)
            return block(olds)

    def atomic_cas(self, pointer, compare, value, sem, scope):
        with _atomic:
            old = self.load(pointer, None, 0, "relaxed", scope)
            if np.ndim(old):
                raise KernelError(f"{self.location()}: el.atomic_cas takes one address")
            if old == compare:
                self.store(pointer, value, None, "relaxed", scope)
            return old

    # --- communication
    def peer_ptr(self, pointer, peer):
        if not isinstance(pointer, Pointer) or pointer.symmetric is None:
            raise KernelError(f"{self.location()}: el.peer_ptr needs a pointer into a symmetric "
                              "window (epic.dsl.jit.SymmetricMemory)")
        peer = int(peer)
        if not 0 <= peer < self.world_size:
            raise KernelError(f"{self.location()}: el.peer_ptr to rank {peer} of a world of "
                              f"{self.world_size}")
        memory = pointer.symmetric.ranks[peer]
        return Pointer(memory, pointer.offset, pointer.dtype, pointer.symmetric, peer)

    def put(self, dst, src, count, signal, signal_value):
        count = int(count)
        values = self.load(src + np.arange(count), None, 0, "relaxed", "sys")
        self.store(dst + np.arange(count), values, None, "relaxed", "sys")
        if signal is not None:
            self.signal(signal, signal_value)

    def signal(self, pointer, value):
        self.atomic_add(pointer, value, None, "release", "sys")

    def wait(self, pointer, value, timeout_ms):
        from . import checks

        if (message := checks.timeout_error("wait", timeout_ms)) is not None:
            raise KernelError(f"{self.location()}: {message}")
        deadline = time.monotonic() + timeout_ms / 1e3
        while True:
            current = self.load(pointer, None, 0, "acquire", "sys")
            if current >= value:
                return current
            if self.launch.failed.is_set():
                raise _Aborted(f"{self.location()}: stopped (another program failed)")
            if time.monotonic() > deadline:
                raise KernelError(f"{self.location()}: el.wait timed out after {timeout_ms} "
                                  f"ms: the word at byte {pointer.offset} of rank "
                                  f"{pointer.rank}'s window is {current}, waited for {value}")
            time.sleep(0)

    def flush(self):
        pass  # puts complete when they return here

    def fence(self, scope):
        pass  # sequentially consistent here

    def barrier(self, timeout_ms):
        from . import checks

        if (message := checks.timeout_error("barrier", timeout_ms)) is not None:
            raise KernelError(f"{self.location()}: {message}")
        try:
            self.launch.barrier.wait(timeout=min(timeout_ms / 1e3, self.launch.timeout_s))
        except threading.BrokenBarrierError:
            if self.launch.failed.is_set():
                raise _Aborted(f"{self.location()}: stopped at el.barrier (another program "
                               "failed)") from None
            raise KernelError(f"{self.location()}: el.barrier timed out after {timeout_ms} ms: not "
                              "every program of every rank arrived") from None


def call(context, function, args, kwargs, where):
    """A kernel's call of the @epic.jit function `function` (at `where`, file:line): runs it
    with the calling program's context, under the compiler's rules (JITFunction.bind_call,
    checks.check_called)."""
    from . import checks

    try:
        bound = function.bind_call(args, kwargs, context.calls, _constant)
    except CallError as e:
        raise KernelError(f"{context.location()}: {where}: {e}") from None
    checks.check_called(function.fn)
    context.launch.codes.add(function.fn.__code__)
    context.calls.append(function.fn)
    try:
        return function.fn(*bound.args, **bound.kwargs)
    finally:
        context.calls.pop()


def _constant(v):
    return isinstance(v, (int, float, bool, str, type(None))) or \
        (isinstance(v, tuple) and all(_constant(e) for e in v))


def _check_sem(sem, allowed, what):
    if sem not in allowed:
        raise KernelError(f"el.{what}: sem must be one of {allowed}, got {sem!r}")


def launch(fn, grid, per_rank_args, num_ranks, timeout_s=60.0):
    """Runs `fn` for every (rank, program) of `grid`; `per_rank_args[r]` are rank r's
    arguments. Raises the first failure, naming where it happened (the rank, the program and,
    for an error Python raised, the kernel's line). Its source is checked first
    (checks.check_kernel: SourceError)."""
    from . import checks

    checks.check_kernel(fn)
    shared = _Launch(num_ranks, grid, timeout_s)
    shared.codes.add(fn.__code__)
    errors = []

    def body(rank, program):
        dispatch.set_interpreted_program(Context(shared, rank, program, fn))
        try:
            fn(*per_rank_args[rank])
        except BaseException as e:  # noqa: BLE001 - reported with its place
            errors.append((rank, program, e, _kernel_line(e, shared.codes)))
            shared.failed.set()
            shared.barrier.abort()
        finally:
            dispatch.set_interpreted_program(None)

    threads = [threading.Thread(target=body, args=(r, p), daemon=True)
               for r in range(num_ranks) for p in range(shared.programs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if any(t.is_alive() for t in threads):
        shared.failed.set()
        shared.barrier.abort()
        raise KernelError(f"the launch did not finish within {timeout_s} s")
    if errors:
        # The original failure, not the aborts it caused elsewhere.
        errors.sort(key=lambda e: isinstance(e[2], _Aborted))
        rank, program, error, line = errors[0]
        if isinstance(error, KernelError):
            raise error
        raise KernelError(f"rank {rank}, program {program}: {line + ': ' if line else ''}"
                          f"{type(error).__name__}: {error}") from error


def _kernel_line(error, codes):
    """file:line of the innermost frame of `error`'s traceback in a kernel or a function it
    called (`codes`), or None."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            line = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return line
