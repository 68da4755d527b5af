"""epic.reference for DeepEP V2's other primitives: all-gather in sessions (AGRS), the
reduce-scatter epic adds to it, Engram's remote table fetch and pipeline send/recv (PP), with
the buffer-size formulas DeepEP gives for each.

Like the rest of epic.reference, one process holds the whole world: a per-rank quantity is a
list with one array per rank. Only *what* ends up where is modelled, bit for bit.
"""

from __future__ import annotations

import numpy as np

from ._reference_checks import (_check_array, _check_int, _check_per_rank, _is_list, _to_bf16,
                                align)

__all__ = [
    "all_gather",
    "reduce_scatter",
    "engram_fetch",
    "pp_transfer",
    "agrs_num_max_session_bytes",
    "agrs_buffer_size_hint",
    "engram_storage_size_hint",
    "pp_buffer_size_hint",
]

_MiB2 = 2 << 20


def _same_arrays(name, arrays):
    """Every rank's array of one dtype and shape (rank 0's)."""
    first = _check_array(f"{name}[0]", arrays[0])
    for r, a in enumerate(arrays):
        _check_array(f"{name}[{r}]", a)
        if a.dtype != first.dtype or a.shape != first.shape:
            raise ValueError(f"{name}[{r}]: expected {first.dtype} of shape {first.shape} (rank "
                             f"0's), got {a.dtype} of shape {a.shape}")
    return first


def all_gather(tensors):
    """Every rank's ``[R, *shape]``: row r is rank r's tensor (DeepEP's ``all_gather``).
    ``tensors``: one array per rank, all of one dtype and shape."""
    if not _is_list(tensors) or not tensors:
        raise TypeError("tensors: expected a non-empty list with one array per rank")
    _same_arrays("tensors", tensors)
    gathered = np.stack(tensors)
    return [gathered.copy() for _ in tensors]


def reduce_scatter(tensors):
    """Rank r's block r of the sum over ranks: each rank's ``[R * n, *rest]`` (bfloat16 or
    float32) cut into R blocks of n rows; block r of every rank summed in float32 in increasing
    rank order from +0.0 and rounded once to the input dtype. The order is fixed, so the result
    is bitwise reproducible (what all-gather + reduce-scatter give data and tensor parallelism).
    """
    if not _is_list(tensors) or not tensors:
        raise TypeError("tensors: expected a non-empty list with one array per rank")
    first = _same_arrays("tensors", tensors)
    R = len(tensors)
    if first.dtype not in (np.dtype(np.float32), np.dtype("bfloat16")):
        raise TypeError(f"tensors[0]: expected bfloat16 or float32, got {first.dtype}")
    if first.ndim < 1 or first.shape[0] % R:
        raise ValueError(f"tensors[0]: the first dimension ({first.shape[0] if first.ndim else 0})"
                         f" must be a multiple of the {R} ranks")
    n = first.shape[0] // R
    out = []
    for r in range(R):
        acc = np.zeros((n,) + first.shape[1:], np.float32)
        for src in range(R):
            acc += tensors[src][r * n:(r + 1) * n].astype(np.float32)
        out.append(acc if first.dtype == np.float32 else _to_bf16(acc))
    return out


def engram_fetch(tables, indices, sf=None):
    """Engram's fetch: every rank's ``(data [T, M * H], sf [T, M * P] or None)`` for its
    ``indices [T, M]`` (int32 global entry ids ``owner * N_e + local``) into the world's table
    (rank r's ``tables[r]`` is ``[N_e, H]``). ``sf``: the globally replicated ``[R * N_e, P]``
    table of 4-byte scale packs, required iff the tables are FP8."""
    if not _is_list(tables) or not tables:
        raise TypeError("tables: expected a non-empty list with one [N_e, H] array per rank")
    first = _same_arrays("tables", tables)
    if first.ndim != 2:
        raise ValueError(f"tables[0]: expected [N_e, H], got shape {first.shape}")
    R, entries = len(tables), first.shape[0]
    _check_per_rank("indices", indices, R)
    fp8 = first.dtype.itemsize == 1
    if fp8 != (sf is not None):
        raise ValueError("sf: required with FP8 tables (and only then)")
    world = np.concatenate(tables)
    if sf is not None:
        _check_array("sf", sf)
        if sf.ndim != 2 or sf.shape[0] != R * entries or sf.itemsize != 4:
            raise ValueError(f"sf: expected a [{R * entries}, P] table of 4-byte packs, got "
                             f"{sf.dtype} of shape {sf.shape}")
    out = []
    for r, idx in enumerate(indices):
        _check_array(f"indices[{r}]", idx)
        if idx.dtype != np.int32 or idx.ndim != 2:
            raise TypeError(f"indices[{r}]: expected int32 [T, M], got {idx.dtype} of shape "
                            f"{idx.shape}")
        bad = (idx < 0) | (idx >= R * entries)
        if bad.any():
            t, m = map(int, np.argwhere(bad)[0])
            raise ValueError(f"indices[{r}][{t}, {m}] = {int(idx[t, m])} is not an entry of the "
                             f"world's table [0, {R * entries})")
        T, M = idx.shape
        data = world[idx.reshape(-1)].reshape(T, M * first.shape[1])
        packs = None if sf is None else sf[idx.reshape(-1)].reshape(T, M * sf.shape[1])
        out.append((data, packs))
    return out


def pp_transfer(sends, num_ranks):
    """Pipeline send/recv between ring neighbours: ``sends`` is a list of ``(src, dst,
    array)`` in issue order; returns what each ``(dst, src)`` pair receives, in order. A
    destination that is not ``src ± 1 mod R`` is refused (DeepEP's PP talks to its ring
    neighbours only)."""
    _check_int("num_ranks", num_ranks, 2)
    received = {}
    for i, (src, dst, array) in enumerate(sends):
        _check_int(f"sends[{i}].src", src, 0, num_ranks - 1)
        _check_int(f"sends[{i}].dst", dst, 0, num_ranks - 1)
        if dst not in ((src + 1) % num_ranks, (src - 1) % num_ranks):
            raise ValueError(f"sends[{i}]: rank {src} sends to {dst}, which is not a ring "
                             f"neighbour ({(src - 1) % num_ranks} or {(src + 1) % num_ranks})")
        received.setdefault((dst, src), []).append(_check_array(f"sends[{i}].array",
                                                                array).copy())
    return received


# --- buffer sizes (DeepEP V2's formulas) ---------------------------------------------------------


def agrs_num_max_session_bytes(num_ranks, shapes, itemsize):
    """Bytes an AGRS session needs for all-gathers of ``shapes``: each gathered tensor
    (``R x prod(shape) x itemsize``) 32-byte aligned."""
    _check_int("num_ranks", num_ranks, 1)
    _check_int("itemsize", itemsize, 1)
    total = 0
    for shape in shapes:
        total += align(num_ranks * int(np.prod(shape, dtype=np.int64)) * itemsize, 32)
    return total


def agrs_buffer_size_hint(num_bytes):
    """A session buffer of ``num_bytes``, 2 MiB aligned."""
    _check_int("num_bytes", num_bytes, 0)
    return align(num_bytes, _MiB2)


def engram_storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, itemsize=2):
    """``(gpu_bytes, cpu_bytes)``: an entry is ``hidden x itemsize`` 32-byte aligned; the GPU
    side holds one fetch of Tmax entries, the host side the rank's table."""
    for name, value in (("num_entries", num_entries), ("hidden", hidden),
                        ("num_max_tokens_per_rank", num_max_tokens_per_rank),
                        ("itemsize", itemsize)):
        _check_int(name, value, 1)
    entry = align(hidden * itemsize, 32)
    return align(entry * num_max_tokens_per_rank, _MiB2), align(entry * num_entries, _MiB2)


def pp_buffer_size_hint(max_bytes, max_inflight):
    """Four regions (receive from / send to each ring neighbour) of ``max_inflight`` slots of
    ``max_bytes`` (32-byte aligned), 2 MiB aligned."""
    _check_int("max_bytes", max_bytes, 1)
    _check_int("max_inflight", max_inflight, 1)
    return align(align(max_bytes, 32) * max_inflight * 4, _MiB2)
