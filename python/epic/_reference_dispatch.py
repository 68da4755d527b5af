"""epic.reference's dispatch: the result types, DeepEP's layout step, the dispatch itself and the
canonical row order (see epic.reference for the conventions)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ._reference_checks import (
    MAX_EXPERT_ALIGNMENT, align, _MAX_ELEMENT_INDEX, _MAX_RANKS, _check_array, _check_experts,
    _check_float32, _check_handle, _check_int, _check_per_rank, _check_topk_idx,
    _check_topology, _describe, _expanded_row_owners, _handle_topology, _is_list,
    _HIDDEN_MULTIPLE, _MAX_SOURCE_IDS, _FP8_DTYPES)


# --------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------


@dataclass
class DispatchResult:
    """What one destination rank holds after :func:`dispatch`.

    It doubles as that rank's handle (DeepEP's ``EPHandle``): :func:`combine`
    reads the routing metadata from it, and ``topk_idx`` is the rank's *own*
    routing as a source, used for the final reduction on the way back.

    Attributes:
        rank, num_ranks, num_experts, num_max_tokens_per_rank,
        expert_alignment, expand: context of the dispatch.
        topk_idx: ``[T, K]`` int64, this rank's source routing (a copy).
        recv_x: ``[N_recv, H]`` (plain) or ``[N_exp, H]`` (expanded), same
            dtype as the input.
        recv_scale_packs: ``[N_recv | N_exp, P]`` opaque 4-byte packs, same
            dtype and bits as sent; ``None`` if none were sent.
        recv_topk_idx: ``[N_recv, K]`` int64 local expert id, or ``-1`` where
            the slot's expert is not on this rank; ``None`` when expanded.
        recv_topk_weights: plain ``[N_recv, K]`` float32, all K source weights
            verbatim; expanded ``[N_exp]`` float32, the weight of each
            (token, expert) row (0 in padding); ``None`` if none were sent.
        recv_src_metadata: ``[N_recv, K + 2]`` int32. Column 0: source global
            id ``src_rank * Tmax + src_token``; column 1: direct
            ``src_rank * K + master_slot``, hybrid -1 (a kernel's value depends
            on atomics: :func:`check_hybrid_metadata`); columns ``2 + j``:
            expanded row of top-k slot ``j`` if expanded and the slot's expert
            is local, else -1.
        num_recv_tokens_per_expert_list: per local expert, the received count
            rounded up to ``expert_alignment`` (Python ints; grouped-GEMM sizes).
        psum_num_recv_tokens_per_scaleup_rank: int32 inclusive prefix sum of
            rows per scale-up peer: direct ``[R]``, per source rank; hybrid
            ``[M]``, per forwarder index ``lsa(src)``.
        psum_num_recv_tokens_per_expert: ``[E/R]`` int32. Plain: inclusive
            prefix sum of the aligned counts. Expanded: ``start_e + count_e``
            with ``start_e`` the exclusive prefix sum of aligned counts.
        num_unaligned_recv_tokens_per_expert: ``[E/R]`` int32 real counts.
        gpus_per_node: ``M``, ranks per node (``num_ranks``: one node).
        hybrid: dispatched in hybrid mode.
    """

    rank: int
    num_ranks: int
    num_experts: int
    num_max_tokens_per_rank: int
    expert_alignment: int
    expand: bool
    topk_idx: np.ndarray
    recv_x: np.ndarray
    recv_scale_packs: np.ndarray | None
    recv_topk_idx: np.ndarray | None
    recv_topk_weights: np.ndarray | None
    recv_src_metadata: np.ndarray
    num_recv_tokens_per_expert_list: list[int]
    psum_num_recv_tokens_per_scaleup_rank: np.ndarray
    psum_num_recv_tokens_per_expert: np.ndarray
    num_unaligned_recv_tokens_per_expert: np.ndarray
    gpus_per_node: int | None = None  # None: one node (num_ranks)
    hybrid: bool = False

    @property
    def num_topk(self) -> int:
        return self.topk_idx.shape[1]

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.num_ranks

    @property
    def num_recv_tokens(self) -> int:
        """Distinct source tokens received (``N_recv``)."""
        return self.recv_src_metadata.shape[0]

    @property
    def num_expanded_tokens(self) -> int:
        """Rows of the expanded layout (``N_exp``), padding included."""
        return sum(self.num_recv_tokens_per_expert_list)

    def expert_starts(self) -> np.ndarray:
        """``[E/R]`` int64 first expanded row of each local expert."""
        aligned = np.asarray(self.num_recv_tokens_per_expert_list, dtype=np.int64)
        return np.concatenate([[0], np.cumsum(aligned)[:-1]]).astype(np.int64)


@dataclass
class CombineResult:
    """What one source rank gets back from :func:`combine`.

    Attributes:
        combined_x: ``[T, H]`` bfloat16.
        combined_topk_weights: ``[T, K]`` float32 or ``None``.
    """

    combined_x: np.ndarray
    combined_topk_weights: np.ndarray | None


# --------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------


def _owner_mask(idx, rank, num_local_experts):
    """``[T, K]`` bool: slot's expert lives on ``rank`` (-1 never does)."""
    lo = rank * num_local_experts
    return (idx >= lo) & (idx < lo + num_local_experts)


def dispatch_layout(topk_idx, num_experts, num_ranks):
    """Per-rank and per-expert token counts for one rank's routing.

    Args:
        topk_idx: ``[T, K]`` int array of global expert ids, ``-1`` = none.
        num_experts: total number of experts ``E`` (divisible by ``num_ranks``).
        num_ranks: world size ``R``.

    Returns:
        ``(num_tokens_per_rank [R] int32, num_tokens_per_expert [E] int32,
        is_token_in_rank [T, R] bool)``. A token counts once per destination
        rank no matter how many of that rank's experts it selected.
    """
    num_experts, num_ranks = _check_experts(num_experts, num_ranks)
    idx = _check_topk_idx("topk_idx", topk_idx, num_experts)
    num_local = num_experts // num_ranks

    valid = idx >= 0
    dest_rank = np.where(valid, idx // num_local, 0)
    is_token_in_rank = np.zeros((idx.shape[0], num_ranks), dtype=bool)
    rows, slots = np.nonzero(valid)
    is_token_in_rank[rows, dest_rank[rows, slots]] = True

    num_tokens_per_rank = is_token_in_rank.sum(axis=0).astype(np.int32)
    num_tokens_per_expert = np.bincount(idx[valid], minlength=num_experts).astype(np.int32)
    return num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank


# --------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------


def dispatch(
    xs,
    topk_idxs,
    topk_weights=None,
    scale_packs=None,
    *,
    num_experts,
    num_max_tokens_per_rank=None,
    expert_alignment=1,
    expand=False,
    zero_padding=False,
    gpus_per_node=None,
    hybrid=False,
):
    """Send every token to each rank that owns one of its experts.

    Args:
        xs: per rank, ``[T_r, H]`` array of any dtype (bf16, fp8, ...); rows
            are moved as opaque bytes, so the output dtype equals the input's.
        topk_idxs: per rank, ``[T_r, K]`` int global expert ids, ``-1`` = none.
            No expert may appear twice in a row.
        topk_weights: ``None`` or per rank ``[T_r, K]`` float32, transported
            verbatim.
        scale_packs: ``None`` or per rank ``[T_r, P]`` array of 4-byte
            elements (float32 scales, int32 packed UE8M0 exponents, ...),
            never interpreted, transported bit-exactly. Only with FP8 ``xs``
            (float8_e4m3fn or float8_e5m2).
        num_experts: ``E``, divisible by the number of ranks.
        num_max_tokens_per_rank: ``Tmax``, part of the source global id
            ``src_rank * Tmax + src_token`` (an int32). Defaults to ``max(1, max T_r)``.
        expert_alignment: ``A`` in ``[1, MAX_EXPERT_ALIGNMENT]``; per-local-expert
            counts are rounded up to a multiple of it.
        expand: produce the expanded layout (one row per (token, local
            expert), grouped by local expert) instead of one row per token.
        zero_padding: zero the alignment padding rows; requires ``expand``.
            This reference always zero-fills padding, but without
            ``zero_padding`` a kernel may leave it uninitialised, so tests
            must not look at padding rows in that case.
        gpus_per_node: ``M``, ranks per node; must divide the number of ranks.
            ``None``: one node.
        hybrid: hybrid mode (needs at least two nodes, at most
            ``MAX_HYBRID_NODES`` of at most ``MAX_HYBRID_GPUS_PER_NODE`` ranks,
            and ``N * Tmax * K`` within the int32 element index, which bounds
            the kernels' metadata column 1). The received rows, their data and
            the per-expert counts are direct mode's; only their order, the
            prefix sum per scale-up peer and metadata column 1 differ (see
            the module docstring).

    Returns:
        A list of :class:`DispatchResult`, one per destination rank, rows in
        canonical order (direct: source rank ascending, then source token
        ascending; hybrid: forwarder index ``lsa(src)`` ascending, then source
        global id; in expanded mode the same order inside each expert's block).
    """
    if not _is_list(xs):
        raise TypeError(
            f"xs: expected a list with one [T, H] array per rank, got {type(xs).__name__}"
        )
    if not xs:
        raise ValueError("xs: expected at least one rank")
    if len(xs) > _MAX_RANKS:
        raise ValueError(f"xs: expected at most {_MAX_RANKS} ranks, got {len(xs)}")
    xs = list(xs)
    num_ranks = len(xs)
    num_experts, num_ranks = _check_experts(num_experts, num_ranks)
    num_local = num_experts // num_ranks
    gpus_per_node, num_nodes, hybrid = _check_topology(num_ranks, gpus_per_node, hybrid)
    alignment = _check_int("expert_alignment", expert_alignment, 1, MAX_EXPERT_ALIGNMENT)
    if zero_padding and not expand:
        raise ValueError("zero_padding: requires expand=True")

    topk_idxs = _check_per_rank("topk_idxs", topk_idxs, num_ranks)
    idxs = []
    num_topk = None
    for r, a in enumerate(topk_idxs):
        idxs.append(_check_topk_idx(f"topk_idxs[{r}]", a, num_experts, num_topk))
        num_topk = idxs[-1].shape[1]
    num_tokens = [a.shape[0] for a in idxs]

    x_dtype, hidden = None, None
    for r, x in enumerate(xs):
        _check_array(f"xs[{r}]", x)
        if (x.ndim != 2 or x.shape[0] != num_tokens[r]
                or (hidden is not None and x.shape[1] != hidden)):
            want = f"[{num_tokens[r]}, {'H' if hidden is None else hidden}]"
            raise ValueError(
                f"xs[{r}]: expected array of shape {want} (T from topk_idxs[{r}]), "
                f"got {_describe(x)}"
            )
        if x_dtype is not None and x.dtype != x_dtype:
            raise TypeError(f"xs[{r}]: dtype {x.dtype} differs from xs[0].dtype {x_dtype}")
        if hidden is None and (x.shape[1] < _HIDDEN_MULTIPLE or x.shape[1] % _HIDDEN_MULTIPLE):
            raise ValueError(
                f"xs[{r}]: hidden size must be a positive multiple of {_HIDDEN_MULTIPLE}, "
                f"got {_describe(x)}"
            )
        x_dtype, hidden = x.dtype, x.shape[1]

    if topk_weights is not None:
        topk_weights = _check_per_rank("topk_weights", topk_weights, num_ranks)
        for r, w in enumerate(topk_weights):
            _check_float32(f"topk_weights[{r}]", w, idxs[r].shape, f"[{num_tokens[r]}, {num_topk}]")

    sf_dtype, num_packs = None, None
    if scale_packs is not None:
        if x_dtype not in _FP8_DTYPES:
            raise TypeError(
                "scale_packs: only for FP8 data (float8_e4m3fn or float8_e5m2), "
                f"but xs are {x_dtype}"
            )
        scale_packs = _check_per_rank("scale_packs", scale_packs, num_ranks)
        for r, sf in enumerate(scale_packs):
            _check_array(f"scale_packs[{r}]", sf)
            if sf.dtype.itemsize != 4:
                raise TypeError(f"scale_packs[{r}]: expected 4-byte elements, got {_describe(sf)}")
            ragged = num_packs is not None and sf.ndim == 2 and sf.shape[1] != num_packs
            if sf.ndim != 2 or sf.shape[0] != num_tokens[r] or ragged:
                want = f"[{num_tokens[r]}, {'P' if num_packs is None else num_packs}]"
                raise ValueError(
                    f"scale_packs[{r}]: expected array of shape {want}, got {_describe(sf)}"
                )
            if sf_dtype is not None and sf.dtype != sf_dtype:
                raise TypeError(
                    f"scale_packs[{r}]: dtype {sf.dtype} differs from "
                    f"scale_packs[0].dtype {sf_dtype}"
                )
            sf_dtype, num_packs = sf.dtype, sf.shape[1]

    if num_max_tokens_per_rank is None:
        tmax = max([1, *num_tokens])
    else:
        tmax = _check_int("num_max_tokens_per_rank", num_max_tokens_per_rank)
        if tmax < max(num_tokens):
            raise ValueError(
                f"num_max_tokens_per_rank: {tmax} is smaller than the largest token count "
                f"{max(num_tokens)}"
            )
    if num_ranks * tmax > _MAX_SOURCE_IDS:
        raise ValueError(
            f"num_max_tokens_per_rank: {num_ranks} ranks x {tmax} tokens overflow "
            "the int32 source ids"
        )
    if hybrid and num_nodes * tmax * num_topk > _MAX_ELEMENT_INDEX:
        raise ValueError(
            f"num_max_tokens_per_rank: hybrid metadata column 1 is item x K + slot with "
            f"item < N x Tmax, and {num_nodes} nodes x {tmax} tokens x top-{num_topk} exceeds "
            f"{_MAX_ELEMENT_INDEX}"
        )
    # Canonical source order: direct by rank; hybrid by forwarder index lsa(src), then rank
    # (with the token inside each source ascending, that is by source global id).
    sources = sorted(range(num_ranks), key=lambda s: (s % gpus_per_node, s) if hybrid else s)

    results = []
    for dst in range(num_ranks):
        # Gather, in canonical order, every (source rank, token) routed here.
        parts = []  # (src, token ids, owner mask rows)
        for src in sources:
            owned = _owner_mask(idxs[src], dst, num_local)
            tokens = np.nonzero(owned.any(axis=1))[0]
            parts.append((src, tokens, owned[tokens]))

        src_rank = np.concatenate([np.full(len(t), s, np.int64) for s, t, _ in parts])
        src_token = np.concatenate([t for _, t, _ in parts]).astype(np.int64)
        owned = np.concatenate([o for _, _, o in parts]).reshape(-1, num_topk)
        n_recv = len(src_token)

        global_idx = np.concatenate([idxs[s][t] for s, t, _ in parts]).reshape(-1, num_topk)
        local_idx = np.where(owned, global_idx - dst * num_local, -1)
        # Highest owned slot: argmax on the reversed mask finds the last True.
        master = num_topk - 1 - np.argmax(owned[:, ::-1], axis=1)

        meta = np.full((n_recv, num_topk + 2), -1, dtype=np.int32)
        meta[:, 0] = src_rank * tmax + src_token
        # Hybrid: the forwarder's slot, decided by its atomics (check_hybrid_metadata).
        meta[:, 1] = -1 if hybrid else src_rank * num_topk + master

        x_rows = np.concatenate([xs[s][t] for s, t, _ in parts]).reshape(n_recv, hidden)
        sf_rows = None
        if scale_packs is not None:
            sf_rows = np.concatenate([scale_packs[s][t] for s, t, _ in parts]).reshape(
                n_recv, num_packs)
        w_rows = None
        if topk_weights is not None:
            w_rows = np.concatenate([topk_weights[s][t] for s, t, _ in parts]).reshape(
                n_recv, num_topk)

        counts = np.array([(local_idx == e).sum() for e in range(num_local)], dtype=np.int64)
        aligned = align(counts, alignment)
        per_peer = np.zeros(gpus_per_node if hybrid else num_ranks, dtype=np.int64)
        for s, t, _ in parts:
            per_peer[s % gpus_per_node if hybrid else s] += len(t)
        psum_rank = np.cumsum(per_peer).astype(np.int32)

        if not expand:
            psum_expert = np.cumsum(aligned).astype(np.int32)
            recv_x, recv_sf, recv_w, recv_idx = x_rows, sf_rows, w_rows, local_idx
        else:
            starts = np.concatenate([[0], np.cumsum(aligned)[:-1]]).astype(np.int64)
            psum_expert = (starts + counts).astype(np.int32)
            n_exp = int(aligned.sum())
            # Padding is zero-filled (the only defined content, see docstring).
            recv_x = np.zeros((n_exp, hidden), dtype=x_dtype)
            recv_sf = None if sf_rows is None else np.zeros((n_exp, num_packs), dtype=sf_dtype)
            recv_w = None if w_rows is None else np.zeros(n_exp, dtype=np.float32)
            for e in range(num_local):
                tok, slot = np.nonzero(local_idx == e)  # row-major: tokens ascending
                rows = starts[e] + np.arange(len(tok))
                meta[tok, 2 + slot] = rows
                recv_x[rows] = x_rows[tok]
                if recv_sf is not None:
                    recv_sf[rows] = sf_rows[tok]
                if recv_w is not None:
                    recv_w[rows] = w_rows[tok, slot]
            recv_idx = None

        results.append(
            DispatchResult(
                rank=dst,
                num_ranks=num_ranks,
                num_experts=num_experts,
                num_max_tokens_per_rank=tmax,
                expert_alignment=alignment,
                expand=bool(expand),
                topk_idx=idxs[dst].copy(),
                recv_x=recv_x,
                recv_scale_packs=recv_sf,
                recv_topk_idx=recv_idx,
                recv_topk_weights=recv_w,
                recv_src_metadata=meta,
                num_recv_tokens_per_expert_list=[int(c) for c in aligned],
                psum_num_recv_tokens_per_scaleup_rank=psum_rank,
                psum_num_recv_tokens_per_expert=psum_expert,
                num_unaligned_recv_tokens_per_expert=counts.astype(np.int32),
                gpus_per_node=gpus_per_node,
                hybrid=hybrid,
            )
        )
    return results


def sort_by_source(result):
    """Return a copy of ``result`` in canonical (deterministic) row order.

    A kernel allocates receive slots with atomics, so rows inside a source
    rank group (plain) or inside an expert block (expanded) come in arrival
    order. This sorts plain rows by ``recv_src_metadata[:, 0]`` (hybrid: by
    forwarder index ``lsa(src)``, then that); in expanded mode it also sorts
    each expert block's valid rows the same way, keeps padding rows after
    them, and rewrites ``recv_src_metadata[:, 2:]``. Applied to
    :func:`dispatch` output it is the identity.
    """
    _check_handle("result", result)
    if not dataclasses.is_dataclass(result) or isinstance(result, type):  # copied with replace()
        raise TypeError(f"result: expected a DispatchResult, got {type(result).__name__}")
    gpus_per_node, hybrid = _handle_topology(result)
    _check_topology(result.num_ranks, gpus_per_node, hybrid, "result.")
    tmax = result.num_max_tokens_per_rank

    def canonical(ids):
        """Permutation putting source ids in canonical order."""
        ids = ids.astype(np.int64)
        if not hybrid:
            return np.argsort(ids, kind="stable")
        return np.lexsort((ids, ids // tmax % gpus_per_node))

    meta = result.recv_src_metadata
    order = canonical(meta[:, 0])
    meta = meta[order]

    def take(a, perm):
        return None if a is None else a[perm]

    if not result.expand:
        return dataclasses.replace(
            result,
            recv_x=result.recv_x[order],
            recv_scale_packs=take(result.recv_scale_packs, order),
            recv_topk_idx=take(result.recv_topk_idx, order),
            recv_topk_weights=take(result.recv_topk_weights, order),
            recv_src_metadata=meta,
        )

    owner = _expanded_row_owners(result)
    src_id = np.where(owner >= 0, result.recv_src_metadata[np.maximum(owner, 0), 0], -1)
    starts = result.expert_starts()
    ends = starts + np.asarray(result.num_recv_tokens_per_expert_list, dtype=np.int64)
    perm = []  # new row -> old row
    for lo, hi in zip(starts, ends):
        block = np.arange(lo, hi)
        valid = block[owner[block] >= 0]
        valid = valid[canonical(src_id[valid])]
        perm.extend(valid)
        perm.extend(block[owner[block] < 0])
    # Rows past the last block (worst-case-sized kernel output) stay put.
    perm.extend(range(int(ends[-1]), result.recv_x.shape[0]))
    perm = np.asarray(perm, dtype=np.int64)
    new_of_old = np.empty_like(perm)
    new_of_old[perm] = np.arange(len(perm))

    slots = meta[:, 2:]
    meta[:, 2:] = np.where(slots >= 0, new_of_old[np.maximum(slots, 0)], -1)
    return dataclasses.replace(
        result,
        recv_x=result.recv_x[perm],
        recv_scale_packs=take(result.recv_scale_packs, perm),
        recv_topk_weights=take(result.recv_topk_weights, perm),
        recv_src_metadata=meta,
    )


# --------------------------------------------------------------------------
# Combine
# --------------------------------------------------------------------------
