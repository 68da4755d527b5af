"""ElasticBuffer's Engram: DeepEP V2's remote table fetch.

Every rank keeps a table of ``N_e`` entries of ``hidden`` elements in the host segment of its
window: ``num_cpu_bytes`` of pinned host memory mapped right after the window's device part
(``runtime/lib/HostSegment.cpp``), an entry every ``align(hidden x itemsize, 32)`` bytes.
``engram_write`` copies the rank's table there; ``engram_fetch`` runs the kernel of
``ep.engram_fetch``: a warp per fetched row reads the owner's entry (through NVLink from the
owner's segment, or the own one) and writes it to the output. An FP8 table's scale factors are
a replicated ``[R x N_e, P]`` table of 4-byte packs, gathered on the GPU with the rows' ids.

Across nodes a fetch needs NCCL's GIN get, and an NCCL world of more than one rank needs NCCL to
map its peers' host memory: both are refused by name (``ElasticBuffer(num_cpu_bytes=...)`` on
such a world, ``ep.engram_fetch``'s verifier).
"""

from __future__ import annotations

from . import _tensors as T
from ._agrs import check_device_tensor
from ._plans import signatures
from ._reference_checks import align
from ._reference_collectives import engram_storage_size_hint

_MIB2 = 2 << 20
_ROW_DTYPES = ("bf16", "f16", "f32", "f8E4M3FN", "f8E5M2")


def storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, dtype):
    """DeepEP's ``(gpu_bytes, cpu_bytes)``: one fetch of ``num_max_tokens_per_rank`` entries on
    the GPU side, the rank's table on the host side, each rounded up to 2 MiB. ``dtype``: a
    torch dtype (anything with an ``itemsize``)."""
    for name, value in (("num_entries", num_entries), ("hidden", hidden),
                        ("num_max_tokens_per_rank", num_max_tokens_per_rank)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    itemsize = getattr(dtype, "itemsize", None)
    if not isinstance(itemsize, int) or itemsize < 1:
        raise TypeError(f"dtype: expected a torch.dtype, got {dtype!r}")
    return engram_storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, itemsize)


def _segment(b, served, nbytes):
    """The first ``nbytes`` of served rank ``served``'s host segment as a uint8 CUDA tensor."""
    import torch

    state = b._runtime()
    address = state.window_address(served) + state.window_bytes

    class _Segment:  # the CUDA array interface: torch wraps the memory without copying
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address, False), "version": 3, "strides": None}

    return torch.as_tensor(_Segment(), device="cuda")


def _check_table(name, table):
    check_device_tensor(name, table)
    if table.dim() != 2:
        raise ValueError(f"{name}: expected [num_entries, hidden], got shape {tuple(table.shape)}")
    dtype = T.dtype_name(table)
    if dtype not in _ROW_DTYPES:
        raise TypeError(f"{name}: expected bf16, f16, f32 or FP8 entries, got {T.describe(table)}")
    if table.shape[1] % 8:
        raise ValueError(f"{name}: hidden: {table.shape[1]} is not a multiple of 8 (the "
                         f"configurations' rule; the kernel moves 16-byte chunks)")
    return dtype


class EngramMethods:
    """The Engram methods of ElasticBuffer (DeepEP V2's names and arguments)."""

    @staticmethod
    def get_engram_storage_size_hint(num_entries: int, hidden: int, num_max_tokens_per_rank: int,
                                     dtype=None):
        """``(gpu_bytes, cpu_bytes)`` for ``num_bytes`` and ``num_cpu_bytes``; ``dtype``:
        the table's (default bfloat16)."""
        if dtype is None:
            import torch

            dtype = torch.bfloat16
        return storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, dtype)

    def engram_write(self, storage, sf=None):
        """Barrier, this rank's table ``storage [N_e, hidden]`` into its host segment, barrier.
        ``sf``: FP8 tables' globally replicated ``[R x N_e, P]`` scale packs (4 bytes each),
        required with FP8 entries and refused otherwise. A virtual world takes a list with one
        table (and one ``sf``) per rank."""
        import torch

        state = self._runtime()
        if not state.host_segment_bytes:
            raise ValueError("engram_write: this buffer has no host segment for the table "
                             "(create it with num_cpu_bytes, see get_engram_storage_size_hint)")
        tables = self._per_rank("storage", storage)
        sfs = self._per_rank("sf", sf, optional=True)
        R = self.num_ranks
        first = None
        for r, table in enumerate(tables):
            dtype = _check_table(self._name("storage", r), table)
            if first is None:
                first = (table.shape, dtype)
            elif (table.shape, dtype) != first:
                raise ValueError(f"{self._name('storage', r)}: every rank's table must be "
                                 f"{T.describe(tables[0])} like rank 0's, got {T.describe(table)}")
        (entries, hidden), dtype = first
        fp8 = dtype.startswith("f8")
        for r, packs in enumerate(sfs):
            name = self._name("sf", r)
            if fp8 != (packs is not None):
                raise ValueError(f"{name}: required with FP8 tables, and only with them")
            if packs is not None:
                check_device_tensor(name, packs)
                if packs.dim() != 2 or packs.shape[0] != R * entries or packs.element_size() != 4:
                    raise ValueError(f"{name}: expected the replicated [{R * entries}, P] table "
                                     f"of 4-byte scale packs, got {T.describe(packs)}")
        entry = align(hidden * tables[0].element_size(), 32)
        if entries * entry > state.host_segment_bytes:
            raise ValueError(f"storage: {entries} entries of {entry} bytes need "
                             f"{entries * entry} bytes, the host segment has "
                             f"{state.host_segment_bytes} (num_cpu_bytes)")
        if R * entries >= 2 ** 31:
            raise ValueError(f"storage: {R} ranks x {entries} entries are more global ids than "
                             f"int32 indices hold")
        self.barrier(use_comm_stream=False)
        row = hidden * tables[0].element_size()
        for r, table in enumerate(tables):
            segment = _segment(self, r, entries * entry).view(entries, entry)
            segment[:, :row].copy_(table.view(torch.uint8).view(entries, row))
        self.barrier(use_comm_stream=False)
        self._engram = dict(entries=entries, hidden=hidden, dtype=dtype, sf=sfs)

    def engram_fetch(self, indices, num_qps: int = 0, use_tma_aligned_col_major_sf: bool = False):
        """Fetches rows of the world's table (``indices [T, M]`` int32 global entry ids
        ``owner x N_e + local``) on the current stream; returns a callable that returns
        ``(data [T, M x hidden], sf [T, M x P] or None)``. ``num_qps``: blocks per rank (0: the
        buffer's). Ids are range-checked (one host synchronization) except while the stream
        is being captured, where an id outside the table fetches zeros."""
        import torch

        from .buffer import _capturing, _check_bool, _check_int

        _check_int("num_qps", num_qps, 0)
        _check_bool("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
        table = getattr(self, "_engram", None)
        if table is None:
            raise ValueError("engram_fetch: no table was written (call engram_write first)")
        idxs = self._per_rank("indices", indices)
        R, entries, hidden, dtype = self.num_ranks, table["entries"], table["hidden"], \
            table["dtype"]
        for r, idx in enumerate(idxs):
            name = self._name("indices", r)
            check_device_tensor(name, idx)
            if idx.dim() != 2 or idx.dtype != torch.int32:
                raise TypeError(f"{name}: expected int32 [tokens, entries per token], got "
                                f"{T.describe(idx)}")
            if not _capturing():
                bad = (idx < 0) | (idx >= R * entries)
                if bool(bad.any()):
                    t, m = (int(v) for v in bad.nonzero()[0])
                    raise ValueError(f"{name}[{t}, {m}] = {int(idx[t, m])} is not an entry of "
                                     f"the world's table [0, {R * entries})")
        from . import _combine

        fp8 = dtype.startswith("f8")
        # The fetch has no token cap (its request drops it): any valid one names the kernels.
        spec = self._spec(R, R, 1, hidden, dtype, 1 if fp8 else 0, 1, False, 1)
        pairs = [[("indices", idx)] for idx in idxs]
        key = ("engram_fetch", hidden, dtype, entries, signatures(pairs))

        def make_outputs():
            return [self._allocate([("out", dtype, (idx.shape[0], idx.shape[1] * hidden))],
                                   like=idx) for idx in idxs]

        blocks = num_qps or self._runtime().blocks_per_rank
        out, _ = _combine._run(self, key, "engram_fetch", spec, dict(entries_per_rank=entries),
                               pairs, blocks, make_outputs, (None, False, False))
        data = [o["out"] for o in out.per_rank]
        sf = [None if packs is None else _gather_sf(packs, idx, use_tma_aligned_col_major_sf)
              for packs, idx in zip(table["sf"], idxs)]

        def wait():
            # The kernel and the gathers are ordered on the current stream already.
            return self._ranks_out(data), self._ranks_out(sf)

        return wait


def _gather_sf(packs, idx, col_major):
    """``packs[idx]`` as ``[T, M x P]``: row-major, or column-major with the token dimension
    padded to 4 (16-byte TMA alignment), DeepEP's ``use_tma_aligned_col_major_sf``."""
    import torch

    tokens, m = idx.shape
    rows = packs.index_select(0, idx.reshape(-1).long()).view(tokens, m * packs.shape[1])
    if not col_major:
        return rows
    storage = torch.empty((m * packs.shape[1], align(max(tokens, 1), 4)), dtype=packs.dtype,
                          device=packs.device)
    out = storage[:, :tokens].t()
    out.copy_(rows)
    return out
