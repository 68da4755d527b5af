"""Executable numpy specification of DeepEP V2 dispatch/combine semantics (and, from
``_reference_collectives``, of its all-gather, Engram and PP primitives, with reduce-scatter).

The whole expert-parallel world of ``R`` ranks is simulated in one process:
every per-rank quantity is passed as a Python list with one array per rank
(``xs[r]`` is rank ``r``'s ``[T_r, H]`` input, ...). Nothing here models
communication or timing; only *what* ends up where, bit for bit.

Conventions (DeepEP V2 direct mode, ``allow_multiple_reduction=True``):

* ``E`` experts are split evenly: expert ``e`` lives on rank ``e // (E/R)``
  with local id ``e % (E/R)``.
* ``topk_idx[t, j] == -1`` means "no expert"; such slots are ignored
  everywhere. A token is sent once per destination rank that owns at least
  one of its experts.
* The *master slot* of a (token, destination rank) pair is the highest top-k
  position whose expert lives on that rank. Combine adds rank contributions
  in increasing master-slot order, which makes the result bitwise
  reproducible.
* Received rows are in the canonical order: grouped by source rank
  ascending, then source token ascending. A real kernel may permute rows
  inside a group; :func:`sort_by_source` maps such output back to this order.

Topology (``gpus_per_node``, ``hybrid``; issue 21): the ``R = N * M`` ranks
are N nodes of M (``gpus_per_node``) ranks, numbered node-major:
``node(r) = r // M``, ``lsa(r) = r % M``. Direct mode (the default) does not
depend on the topology. Hybrid mode (DeepEP's ``allow_hybrid_mode`` with more
than one node) sends a token once per destination node, over the network, to
its *forwarder* there, the rail peer ``F = node(d) * M + lsa(src)`` (the
source itself for its own node), which forwards it over NVLink to each rank of
its node that owns one of the token's experts. What changes:

* dispatch: rows are grouped by forwarder index ``lsa(src)`` (all sources of
  that local index, from every node), then by source global id; the prefix
  sum per scale-up peer has M entries; ``recv_src_metadata[:, 1]`` depends on
  the forwarder's atomics, so the reference writes -1 there and
  :func:`check_hybrid_metadata` checks a kernel's;
* combine reduces in three stages (per rank, per node at the forwarder, at the
  origin), each in float32 rounded once to bfloat16;
* :func:`expected_network_bytes` gives the bytes that cross nodes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ._reference_checks import (  # noqa: F401 - the world limits are part of this API
    MAX_EXPERT_ALIGNMENT, MAX_HYBRID_GPUS_PER_NODE, MAX_HYBRID_NODES, MAX_TOPK, align,
    _MAX_ELEMENT_INDEX, _MAX_RANKS, _check_array, _check_bf16, _check_bool, _check_dtype,
    _check_experts, _check_float32, _check_handle, _check_handles, _check_int, _check_number,
    _check_per_rank, _check_topk_idx, _check_topology, _describe, _expanded_row_owners,
    _handle_topology, _is_list, _source_ids, _to_bf16, bfloat16)
from . import _reference_collectives
from ._reference_collectives import *  # noqa: F401,F403 - re-exported through __all__

__all__ = [
    "MAX_TOPK",
    "MAX_EXPERT_ALIGNMENT",
    "MAX_HYBRID_NODES",
    "MAX_HYBRID_GPUS_PER_NODE",
    "FP8_E4M3_MAX",
    "bfloat16",
    "float8_e4m3fn",
    "DispatchResult",
    "CombineResult",
    "align",
    "dispatch_layout",
    "dispatch",
    "combine",
    "grouped_gemm",
    "sort_by_source",
    "check_hybrid_metadata",
    "expected_network_bytes",
    "per_token_cast_to_fp8",
    "per_token_cast_back",
    "generate_pre_combine_data",
] + _reference_collectives.__all__  # DeepEP V2's other primitives

float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
_HIDDEN_MULTIPLE = 8  # combine reduces 8 channels a step
_MAX_SOURCE_IDS = 2**31 - 1  # R * Tmax: recv_src_metadata's src_rank * Tmax + token is int32
FP8_E4M3_MAX = 448.0
_FP8_AMAX_FLOOR = 1e-4
# Scale packs travel only with FP8 data (the runtime's rule too).
_FP8_DTYPES = (float8_e4m3fn, np.dtype(ml_dtypes.float8_e5m2))


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


def _accumulate(acc, ids, values):
    """float32 ``acc[ids] += values`` for unique row ids, one rounding per add.

    Every sum is a fold that starts from +0.0 (a kernel's ``float acc = 0``),
    so a lone -0.0 contribution comes back as +0.0, and adding a bias of +0.0
    changes no bit (which lets the compiler drop such biases).
    """
    acc[ids] += values


def _rank_contribution(y, rows, owned, expand):
    """float32 row(s) one destination rank sends back for a batch of tokens.

    Plain: ``rows`` is ``[n]`` and the rank's single row goes back as is.
    Expanded: ``rows`` is ``[n, K]``; the rank sums its rows in increasing
    slot order in float32 and rounds to bfloat16 once (stage 1).
    """
    if not expand:
        return y[rows].astype(np.float32)
    acc = np.zeros((rows.shape[0], y.shape[1]), dtype=np.float32)
    for j in range(rows.shape[1]):
        ids = np.nonzero(owned[:, j])[0]
        _accumulate(acc, ids, y[rows[ids, j]].astype(np.float32))
    return _to_bf16(acc).astype(np.float32)


def combine(ys, handles, topk_weights=None, bias=None, expand=None, *, gpus_per_node=None,
            hybrid=None, allow_multiple_reduction=True):
    """Send expert outputs back and sum them at the token's origin.

    ``allow_multiple_reduction=True`` (partial sums on the way back). The sum
    is *unweighted*: top-k weights are transported, never applied. For source
    token ``t`` of rank ``s``:

    * Stage 1, per rank. Plain layout: each destination rank ``d``
      contributes its single row. Expanded layout: ``d`` first sums its rows
      for ``t`` (one per local expert) in increasing top-k slot order in
      float32 and rounds to bfloat16 once.
    * Direct mode, at the origin: float32, starting from +0.0, adding
      ``bias0`` and ``bias1``, then the rank contributions in increasing order
      of each rank's master slot (its highest slot), rounded to bfloat16
      (nearest-even) once.
    * Hybrid mode, stage 2, per node at the forwarder: float32 from +0.0 over
      the contributions of the node's ranks in increasing master slot,
      rounded to bfloat16 once (also for the origin's own node, and for a node
      of one contributing rank, where it changes no bit).
    * Hybrid mode, stage 3, at the origin: float32 from +0.0, ``bias0`` and
      ``bias1``, then the node partials in increasing *node master* slot (the
      highest slot whose expert is in that node), rounded once.

    Where every node holds at most one of a token's ranks, hybrid and direct
    give the same bits. Tokens routed nowhere get the bias sum, or zeros
    without bias.

    Args:
        ys: per rank, bfloat16 rows aligned with that rank's dispatch output:
            ``[N_recv, H]`` (plain) or ``[N_exp, H]`` (expanded).
        handles: per rank, the :class:`DispatchResult` of the dispatch (or
            any object with the same routing attributes, e.g. a kernel's
            output, in any row order consistent with its metadata).
        topk_weights: ``None`` or per rank float32 ``[N_recv, K]`` (plain) /
            ``[N_exp]`` (expanded), sent back to the origin.
        bias: ``None`` or per rank one of ``None``, a ``[T, H]`` bfloat16
            array, or a tuple of one or two of them.
        expand: layout of ``ys``; ``None`` takes it from the handles, and a
            value that disagrees with them is an error.
        gpus_per_node, hybrid: the topology, as for :func:`dispatch`; ``None``
            takes it from the handles (one node, direct, for handles without
            these fields), and a value that disagrees with them is an error.
        allow_multiple_reduction: must be True. False (every top-k row summed
            once at the origin) is refused: epic's buffers do not implement it,
            and hybrid mode without it is out of scope.

    Returns:
        A list of :class:`CombineResult`, one per source rank.
        ``combined_topk_weights[t, j]`` is the weight for slot ``j`` sent back
        by the rank owning ``topk_idx[t, j]``, 0 where ``topk_idx[t, j] == -1``.
    """
    handles = _check_handles(handles)
    num_ranks = len(handles)
    h0 = handles[0]
    if expand is None:
        expand = h0.expand
    elif bool(expand) != h0.expand:
        raise ValueError(
            f"expand: {bool(expand)} does not match the handles "
            f"(dispatched with expand={h0.expand})"
        )
    gpus_per_node, hybrid = _combine_topology(h0, gpus_per_node, hybrid)
    if not _check_bool("allow_multiple_reduction", allow_multiple_reduction):
        raise ValueError(
            "allow_multiple_reduction: False is not supported"
            + (": hybrid combine reduces per node at the forwarder (needs True)" if hybrid
               else " (epic's buffers refuse it too)")
        )

    num_topk = h0.topk_idx.shape[1]
    num_local = h0.num_experts // num_ranks
    tmax = h0.num_max_tokens_per_rank

    ys = _check_per_rank("ys", ys, num_ranks)
    hidden = h0.recv_x.shape[1]  # the rows' hidden size that dispatch moved (handles agree)
    for d, (y, h) in enumerate(zip(ys, handles)):
        n_rows = h.recv_x.shape[0] if expand else h.recv_src_metadata.shape[0]
        _check_bf16(
            f"ys[{d}]", y, (n_rows, hidden),
            f"[{n_rows}, {hidden}] (the rows dispatch moved to rank {d})"
        )

    if topk_weights is not None:
        topk_weights = _check_per_rank("topk_weights", topk_weights, num_ranks)
        for d, (w, h) in enumerate(zip(topk_weights, handles)):
            if expand:
                n = h.recv_x.shape[0]
                _check_float32(f"topk_weights[{d}]", w, (n,), f"[{n}]")
            else:
                n = h.recv_src_metadata.shape[0]
                _check_float32(f"topk_weights[{d}]", w, (n, num_topk), f"[{n}, {num_topk}]")

    biases = [()] * num_ranks
    if bias is not None:
        bias = _check_per_rank("bias", bias, num_ranks)
        for s, b in enumerate(bias):
            terms = () if b is None else tuple(b) if isinstance(b, (tuple, list)) else (b,)
            if len(terms) > 2:
                raise ValueError(f"bias[{s}]: expected at most two bias arrays, got {len(terms)}")
            t_rows = handles[s].topk_idx.shape[0]
            for i, term in enumerate(terms):
                _check_bf16(f"bias[{s}][{i}]", term, (t_rows, hidden), f"[{t_rows}, {hidden}]")
            biases[s] = terms

    # Row lookup by source global id, so any row order consistent with the
    # metadata works (kernels permute rows). A sorted search, not an R * Tmax
    # table: Tmax may be up to 2**31 / R. A sentinel past every id ends each list.
    lookups = []
    for ids in _source_ids(handles):
        order = np.argsort(ids, kind="stable")
        lookups.append((np.append(ids[order], np.iinfo(np.int64).max), np.append(order, -1)))

    out = []
    for s, h_src in enumerate(handles):
        idx = np.asarray(h_src.topk_idx, dtype=np.int64)
        n_tok = idx.shape[0]
        acc = np.zeros((n_tok, hidden), dtype=np.float32)
        for term in biases[s]:
            acc += term.astype(np.float32)

        weights = None if topk_weights is None else np.zeros((n_tok, num_topk), dtype=np.float32)
        routes = []  # per destination rank: (tokens, their rows there, owned slots, master slot)
        for d, h_dst in enumerate(handles):
            owned = _owner_mask(idx, d, num_local)
            tok = np.nonzero(owned.any(axis=1))[0]
            if not tok.size:
                continue
            sorted_ids, order = lookups[d]
            pos = np.searchsorted(sorted_ids, s * tmax + tok)
            rows = np.where(sorted_ids[pos] == s * tmax + tok, order[pos], -1)
            if (rows < 0).any():
                t = int(tok[np.argmax(rows < 0)])
                raise ValueError(
                    f"handles[{d}]: token {t} of rank {s} is routed to rank {d} "
                    "but was not received"
                )
            owned = owned[tok]
            master = num_topk - 1 - np.argmax(owned[:, ::-1], axis=1)
            if expand:
                rows = h_dst.recv_src_metadata[rows, 2:].astype(np.int64)  # [n, K] expanded rows
                if (((rows < 0) | (rows >= ys[d].shape[0])) & owned).any():
                    raise ValueError(
                        f"handles[{d}]: recv_src_metadata lacks a valid expanded row "
                        "for a local slot"
                    )
            routes.append((d, tok, rows, owned, master))
            if weights is not None:
                t_idx, j_idx = np.nonzero(owned)
                w = topk_weights[d]
                got = w[rows[t_idx, j_idx]] if expand else w[rows[t_idx], j_idx]
                weights[tok[t_idx], j_idx] = got

        if hybrid:
            _hybrid_reduce(acc, routes, ys, expand, gpus_per_node, num_topk)
            out.append(CombineResult(combined_x=_to_bf16(acc), combined_topk_weights=weights))
            continue
        # Final stage at the origin: ranks in increasing master slot, one
        # rounding at the end. A slot is the master of at most one rank.
        for j in range(num_topk):
            for d, tok, rows, owned, master in routes:
                sel = np.nonzero(master == j)[0]
                if sel.size:
                    values = _rank_contribution(ys[d], rows[sel], owned[sel], expand)
                    _accumulate(acc, tok[sel], values)
        out.append(CombineResult(combined_x=_to_bf16(acc), combined_topk_weights=weights))
    return out


def _combine_topology(h0, gpus_per_node, hybrid):
    """combine's ``(M, hybrid)``: the handles' unless given; a given value must agree with a
    handle that has the field."""
    m, h = _handle_topology(h0)
    if gpus_per_node is not None:
        gpus_per_node = _check_int("gpus_per_node", gpus_per_node)
        if getattr(h0, "gpus_per_node", None) is not None and gpus_per_node != m:
            raise ValueError(f"gpus_per_node: {gpus_per_node} does not match the handles "
                             f"(dispatched with gpus_per_node={m})")
        m = gpus_per_node
    if hybrid is not None:
        hybrid = _check_bool("hybrid", hybrid)
        if hasattr(h0, "hybrid") and hybrid != h:
            raise ValueError(f"hybrid: {hybrid} does not match the handles "
                             f"(dispatched with hybrid={h})")
        h = hybrid
    m, _, h = _check_topology(h0.num_ranks, m, h)
    return m, h


def _hybrid_reduce(acc, routes, ys, expand, gpus_per_node, num_topk):
    """Hybrid stages 2 and 3 into ``acc`` (the origin's float32 rows, biases already added):
    per node, the ranks' stage-1 rows in increasing master slot, rounded to bfloat16 once;
    then the node partials in increasing node-master slot."""
    nodes = {}  # node -> [(tok, stage-1 rows, master)]
    for d, tok, rows, owned, master in routes:
        values = _rank_contribution(ys[d], rows, owned, expand)
        nodes.setdefault(d // gpus_per_node, []).append((tok, values, master))
    partials = []  # per node: (tokens, partial rows, node master slot)
    for members in nodes.values():
        tok = np.unique(np.concatenate([t for t, _, _ in members]))
        part = np.zeros((tok.size, acc.shape[1]), dtype=np.float32)
        node_master = np.full(tok.size, -1, dtype=np.int64)
        for j in range(num_topk):  # a slot is the master of at most one rank
            for t, values, master in members:
                sel = np.nonzero(master == j)[0]
                if sel.size:
                    at = np.searchsorted(tok, t[sel])
                    _accumulate(part, at, values[sel])
                    node_master[at] = np.maximum(node_master[at], j)
        partials.append((tok, _to_bf16(part).astype(np.float32), node_master))
    for j in range(num_topk):  # a slot is the node master of at most one node
        for tok, part, node_master in partials:
            sel = np.nonzero(node_master == j)[0]
            if sel.size:
                _accumulate(acc, tok[sel], part[sel])


# --------------------------------------------------------------------------
# Hybrid mode: metadata column 1 and the bytes between nodes
# --------------------------------------------------------------------------


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


def grouped_gemm(result, weights, out_dtype=bfloat16, fill=0.0):
    """``ep.grouped_gemm``: every local expert's rows of an expanded dispatch result times that
    expert's weights.

    Args:
        result: the :class:`DispatchResult` of an expanded dispatch (its ``recv_x`` are the rows).
        weights: ``[E/R, H, N]`` array (bf16 or f16), ``weights[e]`` expert ``e``'s matrix.
        out_dtype: the result's element type (bf16, f16 or float32).
        fill: the value of rows outside every expert's range (the op leaves them unspecified;
            tests compare only the experts' rows).

    Returns ``[rows, N]``: rows ``[start_e, start_e + count_e)`` are ``lhs @ weights[e]`` with the
    products summed in float32 (exactly, here in float64, then rounded to float32) and rounded
    once to ``out_dtype``. The GPU's sum order differs: compare with a tolerance, not bitwise.
    """
    _check_handle("result", result)
    if not result.expand:
        raise ValueError("result: grouped_gemm needs an expanded dispatch result "
                         "(one row per (token, local expert) pair)")
    lhs = result.recv_x
    _check_array("weights", weights)
    L, H = result.num_local_experts, lhs.shape[1]
    for name, dtype in (("result.recv_x", lhs.dtype), ("weights", weights.dtype)):
        if dtype.kind not in "iuf" and dtype not in (bfloat16, *_FP8_DTYPES):
            raise TypeError(f"{name}: expected a numeric array, got {dtype}")
    if weights.ndim != 3 or weights.shape[:2] != (L, H):
        raise ValueError(f"grouped_gemm: weights must be [{L}, {H}, N], got "
                         f"{list(weights.shape)}")
    out_dtype = _check_dtype("out_dtype", out_dtype,
                             (bfloat16, np.dtype(np.float16), np.dtype(np.float32)))
    fill = _check_number("fill", fill)
    out = np.full((lhs.shape[0], weights.shape[2]), fill, np.float32)
    starts = result.expert_starts()
    counts = result.num_unaligned_recv_tokens_per_expert
    for e in range(L):
        lo, hi = int(starts[e]), int(starts[e]) + int(counts[e])
        if hi > lo:
            out[lo:hi] = (lhs[lo:hi].astype(np.float64) @ weights[e].astype(np.float64))
    return out.astype(out_dtype)


# --------------------------------------------------------------------------
# FP8 helpers (the caller's convention; dispatch never interprets scales)
# --------------------------------------------------------------------------


def _groups(hidden, group):
    """``(group, number of groups)`` for ``hidden`` channels. A group wider than the row is
    one group either way, so it is narrowed to the row: the zero padding of a ragged group
    never changes its amax, and a huge ``group`` allocates nothing."""
    group = min(_check_int("group", group), max(hidden, 1))
    return group, math.ceil(hidden / group)


def per_token_cast_to_fp8(x, group=128, use_ue8m0=False):
    """Quantise ``[T, H]`` rows to E4M3 with one scale per ``group`` channels.

    ``scale = amax / 448`` per (token, group), ``amax`` clamped below at 1e-4;
    data = ``x * (448 / amax)`` rounded to ``float8_e4m3fn`` (nearest-even,
    clipped to +-448 so rounding can never overflow to NaN). A ragged last
    group is treated as zero-padded.

    With ``use_ue8m0`` the scale is rounded up to a power of two and returned
    as UE8M0 exponent bytes, four consecutive groups packed little-endian per
    int32 (``[T, ceil(G/4)]``).

    Args:
        x: ``[T, H]`` float32 or bfloat16.

    Returns:
        ``(data [T, H] float8_e4m3fn, scales [T, ceil(H/group)] float32)``,
        or int32 packs with ``use_ue8m0``.
    """
    _check_array("x", x)
    if x.dtype not in (np.dtype(np.float32), bfloat16):
        raise TypeError(
            f"x: expected float32 or bfloat16 array of shape [T, H], got {_describe(x)}"
        )
    if x.ndim != 2:
        raise ValueError(
            f"x: expected float32 or bfloat16 array of shape [T, H], got {_describe(x)}"
        )
    num_tokens, hidden = x.shape
    group, num_groups = _groups(hidden, group)

    xf = np.zeros((num_tokens, num_groups * group), dtype=np.float32)
    xf[:, :hidden] = x.astype(np.float32)
    xg = xf.reshape(num_tokens, num_groups, group)
    amax = np.maximum(np.abs(xg).max(axis=2, initial=0.0), np.float32(_FP8_AMAX_FLOOR))
    scale = amax / np.float32(FP8_E4M3_MAX)
    if use_ue8m0:
        scale = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)
    inv = (np.float32(FP8_E4M3_MAX) / amax) if not use_ue8m0 else (np.float32(1.0) / scale)
    q = np.clip(xg * inv[:, :, None], -FP8_E4M3_MAX, FP8_E4M3_MAX)
    data = q.reshape(num_tokens, num_groups * group)[:, :hidden].astype(float8_e4m3fn)
    if not use_ue8m0:
        return data, scale.astype(np.float32)

    # Biased exponent of a power of two is its float32 exponent field.
    exponents = (scale.view(np.uint32) >> 23).astype(np.uint8)
    num_packs = math.ceil(num_groups / 4)
    padded = np.zeros((num_tokens, num_packs * 4), dtype=np.uint8)
    padded[:, :num_groups] = exponents
    return data, padded.view("<i4").reshape(num_tokens, num_packs)


def per_token_cast_back(data, scales, group=128, out_dtype=bfloat16):
    """Dequantise :func:`per_token_cast_to_fp8` output.

    ``scales`` is either float32 ``[T, ceil(H/group)]`` or int32 UE8M0 packs
    ``[T, ceil(ceil(H/group)/4)]`` (exponent byte ``b`` decodes to the float
    whose bits are ``b << 23``). Returns ``[T, H]`` in ``out_dtype``.
    """
    _check_array("data", data)
    if data.dtype != float8_e4m3fn or data.ndim != 2:
        raise TypeError(
            f"data: expected float8_e4m3fn array of shape [T, H], got {_describe(data)}"
        )
    _check_array("scales", scales)
    out_dtype = _check_dtype("out_dtype", out_dtype)
    num_tokens, hidden = data.shape
    group, num_groups = _groups(hidden, group)
    if scales.dtype == np.float32:
        expected = (num_tokens, num_groups)
    elif scales.dtype == np.int32:
        expected = (num_tokens, math.ceil(num_groups / 4))
    else:
        raise TypeError(f"scales: expected float32 or int32 array, got {_describe(scales)}")
    if scales.shape != expected:
        raise ValueError(
            f"scales: expected shape [{expected[0]}, {expected[1]}], got {_describe(scales)}"
        )
    if scales.dtype == np.int32:
        # uint8, not int8: exponent bytes >= 128 are large scales, not negatives.
        b = np.ascontiguousarray(scales, dtype="<i4").view(np.uint8).reshape(
            num_tokens, 4 * expected[1])
        scales = (b.astype(np.uint32) << 23).view(np.float32)[:, :num_groups]
    x = data.astype(np.float32) * np.repeat(scales, group, axis=1)[:, :hidden]
    return x.astype(out_dtype)


# --------------------------------------------------------------------------
# Synthetic combine inputs
# --------------------------------------------------------------------------


def generate_pre_combine_data(handles, seed=0):
    """Deterministic bfloat16 expert outputs for combine tests.

    Each (source token, top-k slot) gets the row
    ``y[h] = bf16(sin((((gid*K + j) * 131071) % M + 1) / M * (h + 1) + sin(seed)))``
    with ``gid`` the source global id and ``M = R * Tmax * K`` (evaluated in
    float64). Plain handles get, per received token, the rank's pre-reduced
    row: float32 sum of its local slots in increasing slot order, rounded to
    bfloat16 once. Expanded handles get one row per (token, slot) at the row
    recorded in ``recv_src_metadata``; padding rows are zero.

    Since the plain pre-reduction equals combine's expanded stage 1, combining
    either layout gives bitwise-identical results.

    Returns:
        Per rank, a bfloat16 array aligned with ``recv_x``.
    """
    handles = _check_handles(handles)
    seed = _check_number("seed", seed)
    if not math.isfinite(seed):
        raise ValueError(f"seed: expected a finite number, got {seed}")
    source_ids = _source_ids(handles)
    h0 = handles[0]
    num_topk = h0.topk_idx.shape[1]
    num_local = h0.num_experts // h0.num_ranks
    modulus = h0.num_ranks * h0.num_max_tokens_per_rank * num_topk
    channel = np.arange(h0.recv_x.shape[1], dtype=np.float64) + 1

    def rows_for(gid, slot):
        phase = ((gid * num_topk + slot) * 131071) % modulus + 1
        return _to_bf16(
            np.sin(phase[:, None] / modulus * channel + math.sin(seed)).astype(np.float32))

    # All ranks' routing stacked, to look up a source token's row by global id.
    all_idx = np.concatenate([np.asarray(h.topk_idx, dtype=np.int64) for h in handles])
    offsets = np.cumsum([0] + [h.topk_idx.shape[0] for h in handles])

    ys = []
    for d, h in enumerate(handles):
        meta = h.recv_src_metadata.astype(np.int64)
        gid = source_ids[d]
        src_idx = all_idx[offsets[gid // h.num_max_tokens_per_rank]
                          + gid % h.num_max_tokens_per_rank]
        if h.expand:
            y = np.zeros((h.recv_x.shape[0], channel.size), dtype=bfloat16)
            rows, slots = np.nonzero(meta[:, 2:] >= 0)
            y[meta[rows, 2 + slots]] = rows_for(gid[rows], slots)
        else:
            acc = np.zeros((len(gid), channel.size), dtype=np.float32)
            owned = _owner_mask(src_idx, d, num_local)
            for j in range(num_topk):
                ids = np.nonzero(owned[:, j])[0]
                _accumulate(acc, ids, rows_for(gid[ids], np.full(ids.size, j)).astype(np.float32))
            y = _to_bf16(acc)
        ys.append(y)
    return ys
