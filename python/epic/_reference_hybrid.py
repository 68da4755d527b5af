"""epic.reference's checks of hybrid mode: the forwarders' metadata column a kernel writes, and
the bytes that cross nodes in each mode."""

from __future__ import annotations

import numpy as np

from ._reference_checks import (
    _MAX_RANKS, _check_array, _check_experts, _check_handles, _check_int, _check_per_rank,
    _check_topk_idx, _check_topology, _describe, _handle_topology, _is_list)
from ._reference_dispatch import _owner_mask


def _first(mask):
    return int(np.argmax(mask))


def check_hybrid_metadata(results, handles, gpus_per_node=None):
    """Check what a hybrid dispatch kernel wrote where the reference cannot: the forwarder
    groups of its rows and ``recv_src_metadata[:, 1]``.

    Column 1 of a hybrid row at receiver ``d`` is ``item * K + master`` (DeepEP:
    ``slot_in_forwarder_region * K + master_slot``) where

    * ``master`` is the highest top-k slot whose expert lives on ``d`` (as in direct mode);
    * ``item = node(src) * Tmax + i`` is the token's entry at its forwarder
      ``F = node(d) * M + lsa(src)``: ``i`` in ``[0, Tmax)`` is the slot F's atomics gave it among
      the tokens of ``src`` (so ``item`` decodes to the source node and, with the row's forwarder
      group ``lsa(src)``, to the source rank);
    * one forwarder gives each token one item, the same at every receiver of its node (combine
      gathers the node's contributions of a token by that item), and no two tokens the same one.

    Raises ValueError naming the receiver, the row and the rule at the first violation; also
    when a row lies outside its forwarder group (rows ``[psum[g-1], psum[g])`` hold sources with
    ``lsa(src) == g``), when the prefix sums differ from the reference's, or when the rows are
    not the reference's tokens. The other columns are the reference's: compare them bitwise
    after :func:`sort_by_source`, column 1 left out.

    Args:
        results: per rank, the kernel's dispatch output in its own row order (anything with
            ``recv_src_metadata`` and ``psum_num_recv_tokens_per_scaleup_rank``, e.g. a
            :class:`DispatchResult` with the kernel's arrays swapped in).
        handles: the reference's :func:`dispatch` results of the same inputs with
            ``hybrid=True``.
        gpus_per_node: ``M``; ``None`` takes it from the handles (a value must agree).
    """
    handles = _check_handles(handles)
    h0 = handles[0]
    m, hybrid = _handle_topology(h0)
    if gpus_per_node is not None and _check_int("gpus_per_node", gpus_per_node) != m:
        raise ValueError(f"gpus_per_node: {gpus_per_node} does not match the handles "
                         f"(dispatched with gpus_per_node={m})")
    if not hybrid:
        raise ValueError("handles: not a hybrid dispatch (reference.dispatch(..., hybrid=True)); "
                         "direct mode's column 1 is src_rank * K + master slot: compare it bitwise")
    num_ranks, num_topk, tmax = h0.num_ranks, h0.topk_idx.shape[1], h0.num_max_tokens_per_rank
    num_local = h0.num_experts // num_ranks
    results = _check_per_rank("results", results, num_ranks)
    all_idx = np.concatenate([np.asarray(h.topk_idx, dtype=np.int64) for h in handles])
    offsets = np.cumsum([0] + [h.topk_idx.shape[0] for h in handles])

    entries = []  # per receiver: (forwarder, source id, item, receiver, row)
    for d, (res, want) in enumerate(zip(results, handles)):
        name = f"results[{d}]"
        if not all(hasattr(res, f) for f in ("recv_src_metadata",
                                             "psum_num_recv_tokens_per_scaleup_rank")):
            raise TypeError(f"{name}: expected a dispatch result with recv_src_metadata and "
                            f"psum_num_recv_tokens_per_scaleup_rank, got {type(res).__name__}")
        meta = _check_array(f"{name}.recv_src_metadata", res.recv_src_metadata)
        shape = want.recv_src_metadata.shape
        if not np.issubdtype(meta.dtype, np.integer) or meta.shape != shape:
            raise ValueError(f"{name}.recv_src_metadata: expected int array of shape "
                             f"[{shape[0]}, {shape[1]}] (the reference's), got {_describe(meta)}")
        psum = np.asarray(res.psum_num_recv_tokens_per_scaleup_rank)
        want_psum = want.psum_num_recv_tokens_per_scaleup_rank
        if psum.shape != want_psum.shape or (psum != want_psum).any():
            raise ValueError(f"{name}.psum_num_recv_tokens_per_scaleup_rank: {psum.tolist()}, "
                             f"expected {want_psum.tolist()} (rows per forwarder index)")
        ids = meta[:, 0].astype(np.int64)
        if not np.array_equal(np.sort(ids), np.sort(want.recv_src_metadata[:, 0])):
            raise ValueError(f"{name}.recv_src_metadata[:, 0]: the source ids are not the "
                             "reference's")
        src, tok = np.divmod(ids, tmax)
        group = np.searchsorted(psum, np.arange(ids.size), side="right")

        def fail(mask, rule):
            p = _first(mask)
            raise ValueError(f"{name}.recv_src_metadata[{p}] (token {tok[p]} of rank {src[p]}): "
                             + rule(p))

        bad = src % m != group
        if bad.any():
            fail(bad, lambda p: f"forwarder index lsa({src[p]}) = {src[p] % m}, but the row is "
                                f"in forwarder group {group[p]}")
        col1 = meta[:, 1].astype(np.int64)
        if (col1 < 0).any():
            fail(col1 < 0, lambda p: f"column 1 is {col1[p]}, expected item x K + master slot "
                                     "(the reference writes -1 there; a kernel may not)")
        item, slot = np.divmod(col1, num_topk)
        owned = _owner_mask(all_idx[offsets[src] + tok], d, num_local)
        master = num_topk - 1 - np.argmax(owned[:, ::-1], axis=1)
        bad = slot != master
        if bad.any():
            fail(bad, lambda p: f"column 1 = {col1[p]} decodes to slot {slot[p]}, expected "
                                f"{master[p]}, the highest slot whose expert is on rank {d}")
        bad = item // tmax != src // m
        if bad.any():
            fail(bad, lambda p: f"column 1 = {col1[p]} decodes to item {item[p]} of node "
                                f"{item[p] // tmax}, expected node(src) = {src[p] // m} "
                                f"(item = node(src) x Tmax + slot at the forwarder)")
        forwarder = d // m * m + group
        entries.append(np.stack([forwarder, ids, item, np.full(ids.size, d), np.arange(ids.size)]))

    f, ids, item, recv, row = np.concatenate(entries, axis=1) if entries else np.zeros((5, 0))
    f, ids, item, recv, row = (a.astype(np.int64) for a in (f, ids, item, recv, row))

    def where(i):
        return f"results[{recv[i]}].recv_src_metadata[{row[i]}]"

    # One item per (forwarder, token): sorted by token, a neighbour with another item breaks it.
    order = np.lexsort((item, ids, f))
    a, b = order[:-1], order[1:]
    bad = (f[a] == f[b]) & (ids[a] == ids[b]) & (item[a] != item[b])
    if bad.any():
        i, j = a[_first(bad)], b[_first(bad)]
        s, t = divmod(int(ids[i]), tmax)
        raise ValueError(f"{where(i)} and {where(j)}: token {t} of rank {s} has items {item[i]} "
                         f"and {item[j]} at forwarder {f[i]}; a forwarder gives a token one item, "
                         "the same at every receiver of its node")
    order = np.lexsort((ids, item, f))
    a, b = order[:-1], order[1:]
    bad = (f[a] == f[b]) & (item[a] == item[b]) & (ids[a] != ids[b])
    if bad.any():
        i, j = a[_first(bad)], b[_first(bad)]
        (s1, t1), (s2, t2) = divmod(int(ids[i]), tmax), divmod(int(ids[j]), tmax)
        raise ValueError(f"{where(i)} and {where(j)}: token {t1} of rank {s1} and token {t2} of "
                         f"rank {s2} share item {item[i]} at forwarder {f[i]}")


_NETWORK_MODES = ("direct", "hybrid")


def expected_network_bytes(topk_idx_per_rank, num_experts, gpus_per_node, mode, record_bytes):
    """Bytes a dispatch must send between nodes, per (source rank, destination rank).

    Direct mode sends ``record_bytes`` per (token, destination rank of another node that owns
    at least one of its experts), straight to that rank. Hybrid mode sends ``record_bytes`` per
    (token, other node with at least one of its experts), to the rail peer
    ``D * M + lsa(src)`` of that node ``D``. Same-node traffic goes over NVLink and counts
    nothing, so the matrix is zero on every pair of one node (hybrid: nonzero only on rail
    pairs). With ``allow_multiple_reduction``, combine sends one row per such pair back, so its
    matrix is the transpose, with the combine record's size.

    Args:
        topk_idx_per_rank: per rank, ``[T_r, K]`` int global expert ids, ``-1`` = none.
        num_experts: ``E``, divisible by the number of ranks.
        gpus_per_node: ``M``, dividing the number of ranks (``None``: one node, no traffic).
        mode: ``"direct"`` or ``"hybrid"`` (hybrid needs at least two nodes).
        record_bytes: bytes of one token's record on the wire (>= 1).

    Returns:
        ``[R, R]`` int64: ``[src, dst]`` bytes sent from ``src`` to ``dst``.
    """
    if not _is_list(topk_idx_per_rank) or not topk_idx_per_rank:
        raise TypeError("topk_idx_per_rank: expected a non-empty list with one [T, K] array "
                        f"per rank, got {type(topk_idx_per_rank).__name__}")
    num_ranks = len(topk_idx_per_rank)
    if num_ranks > _MAX_RANKS:
        raise ValueError(f"topk_idx_per_rank: expected at most {_MAX_RANKS} ranks, got {num_ranks}")
    num_experts, num_ranks = _check_experts(num_experts, num_ranks)
    if not isinstance(mode, str) or mode not in _NETWORK_MODES:
        raise ValueError(f"mode: expected 'direct' or 'hybrid', got {mode!r}")
    m, n, hybrid = _check_topology(num_ranks, gpus_per_node, mode == "hybrid")
    record_bytes = _check_int("record_bytes", record_bytes)
    num_local = num_experts // num_ranks
    out = np.zeros((num_ranks, num_ranks), dtype=np.int64)
    num_topk = None
    for s, a in enumerate(topk_idx_per_rank):
        idx = _check_topk_idx(f"topk_idx_per_rank[{s}]", a, num_experts, num_topk)
        num_topk = idx.shape[1]
        hit = np.zeros((idx.shape[0], num_ranks), dtype=bool)  # token -> destination rank
        rows, slots = np.nonzero(idx >= 0)
        hit[rows, idx[rows, slots] // num_local] = True
        home = s // m
        if hybrid:
            per_node = hit.reshape(-1, n, m).any(axis=2).sum(axis=0)
            per_node[home] = 0
            out[s, np.arange(n) * m + s % m] = per_node * record_bytes
        else:
            per_rank = hit.sum(axis=0)
            per_rank[home * m:(home + 1) * m] = 0
            out[s] = per_rank * record_bytes
    return out


# --------------------------------------------------------------------------
# The expert GEMM on the expanded layout (ep.grouped_gemm)
# --------------------------------------------------------------------------
