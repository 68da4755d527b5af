"""epic.reference's combine: every rank's contributions summed at their source in float32, in
increasing master-slot order (direct mode), or in three stages (hybrid mode); see
epic.reference for the conventions."""

from __future__ import annotations

import numpy as np

from ._reference_checks import (
    _check_bf16, _check_bool, _check_float32, _check_handles, _check_int, _check_per_rank,
    _check_topology, _handle_topology, _source_ids, _to_bf16)
from ._reference_dispatch import CombineResult, _owner_mask


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
