"""DeepEP V1's low-latency mode, specified in numpy (exported by :mod:`epic.reference`).

Decoding's dispatch and combine without a count exchange: every (local expert, source rank)
owns ``cap`` (``num_max_dispatch_tokens_per_rank``) fixed receive slots, so the received
rows of a local expert live in a ``[R x cap, hidden]`` block of which the first
``recv_count`` rows are valid. Conventions (epic's; DeepEP V1 leaves the order open):

* a local expert's rows come from source rank 0 first, then 1, ...; each source's in the
  order of its flattened routing table (token ascending, then top-k slot), so a token that
  names the same expert twice arrives twice;
* ``src_info`` is the source token, ``layout_range[l, s]`` is ``begin << 32 | count`` of
  source ``s``'s rows;
* FP8: each row cast with :func:`per_token_cast_to_fp8` (per 128 channels, ``round_scale``
  and ``use_ue8m0`` as DeepEP's);
* the combine returns, per token, ``sum over k with topk_idx[t, k] >= 0 of
  topk_weights[t, k] x y(t, k)``: float32 products added in k order from +0.0, rounded
  once to bfloat16 (zeros for a token with no expert).
"""

from __future__ import annotations

import numpy as np

from ._reference_checks import _check_experts, _check_int, bfloat16
from ._reference_experts import per_token_cast_to_fp8

__all__ = ["low_latency_dispatch", "low_latency_combine", "LowLatencyResult"]


class LowLatencyResult:
    """One rank's received data (``recv_x`` rows past ``recv_count[l]`` are zero here)."""

    def __init__(self, recv_x, recv_scales, recv_count, src_info, layout_range, sources):
        self.recv_x, self.recv_scales, self.recv_count = recv_x, recv_scales, recv_count
        self.src_info, self.layout_range = src_info, layout_range
        # [L][row] -> (source rank, token, top-k slot): where combine sends the row back.
        self.sources = sources


def _routing(topk_idxs, num_experts):
    """(R, L, every rank's routing as an int64 array). An expert may appear twice in a row
    (it then gets two rows), unlike in V2's dispatch (_check_topk_idx)."""
    num_experts, R = _check_experts(num_experts, len(topk_idxs))
    idxs = []
    for r, idx in enumerate(topk_idxs):
        idx = np.asarray(idx)
        if idx.ndim != 2 or idx.dtype.kind not in "iu":
            raise TypeError(f"topk_idxs[{r}]: expected an integer [T, K] array, got "
                            f"{idx.dtype}{list(idx.shape)}")
        if ((idx < -1) | (idx >= num_experts)).any():
            raise ValueError(f"topk_idxs[{r}]: expert ids must be in [-1, {num_experts})")
        idxs.append(idx.astype(np.int64))
    return R, num_experts // R, idxs


def low_latency_dispatch(xs, topk_idxs, num_experts, num_max_dispatch_tokens_per_rank,
                         use_fp8=True, round_scale=False, use_ue8m0=False):
    """Every rank's received rows, per rank a :class:`LowLatencyResult`.

    Args:
        xs: per rank ``[T_r, hidden]`` bfloat16 (``T_r <= cap``).
        topk_idxs: per rank ``[T_r, K]`` integer expert ids, -1 = none.
        use_fp8, round_scale, use_ue8m0: DeepEP's casts (``recv_scales`` float32
            ``[L, R x cap, G]``, or int32 UE8M0 packs ``[L, R x cap, ceil(G / 4)]``; None for
            bfloat16).
    """
    R, L, idxs = _routing(topk_idxs, num_experts)
    cap = _check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
    if use_ue8m0 and not round_scale:
        raise ValueError("use_ue8m0 needs round_scale")
    if not use_fp8 and (round_scale or use_ue8m0):
        raise ValueError("round_scale and use_ue8m0 need use_fp8")
    hidden = np.asarray(xs[0]).shape[1]
    for r, x in enumerate(xs):
        if np.asarray(x).shape[0] > cap:
            raise ValueError(f"xs[{r}] has {np.asarray(x).shape[0]} tokens, more than the cap "
                             f"{cap}")
    casts = []
    for x in xs:
        x = np.asarray(x)
        casts.append(per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, round_scale=round_scale)
                     if use_fp8 else (x.astype(bfloat16), None))
    results = []
    for d in range(R):
        data_type = casts[0][0].dtype
        recv_x = np.zeros((L, R * cap, hidden), data_type)
        scales = None
        if use_fp8:
            width = casts[0][1].shape[1]
            scales = np.zeros((L, R * cap, width), casts[0][1].dtype)
        count = np.zeros(L, np.int32)
        src_info = np.zeros((L, R * cap), np.int32)
        layout_range = np.zeros((L, R), np.int64)
        sources = [[] for _ in range(L)]
        for local in range(L):
            expert = d * L + local
            for s in range(R):
                begin = int(count[local])
                for p in np.nonzero(idxs[s].reshape(-1) == expert)[0]:
                    t, k = divmod(int(p), idxs[s].shape[1])
                    row = int(count[local])
                    recv_x[local, row] = casts[s][0][t]
                    if scales is not None:
                        scales[local, row] = casts[s][1][t]
                    src_info[local, row] = t
                    sources[local].append((s, t, k))
                    count[local] += 1
                layout_range[local, s] = (begin << 32) | (int(count[local]) - begin)
        results.append(LowLatencyResult(recv_x, scales, count, src_info, layout_range, sources))
    return results


def low_latency_combine(expert_outputs, dispatched, topk_idxs, topk_weights):
    """Every rank's combined ``[T_r, hidden]`` bfloat16 rows.

    Args:
        expert_outputs: per rank ``[L, R x cap, hidden]`` (rows as the dispatch placed them).
        dispatched: :func:`low_latency_dispatch`'s results (where each row came from).
        topk_idxs, topk_weights: per rank ``[T_r, K]`` (as dispatched) and float32 weights.
    """
    R = len(dispatched)
    if len(expert_outputs) != R or len(topk_idxs) != R or len(topk_weights) != R:
        raise ValueError("expert_outputs, dispatched, topk_idxs and topk_weights need one "
                         "entry per rank")
    hidden = np.asarray(expert_outputs[0]).shape[2]
    # rows[s][(t, k)] = that row's expert output, as float32
    rows = [dict() for _ in range(R)]
    for d in range(R):
        y = np.asarray(expert_outputs[d]).astype(np.float32)
        for local, placed in enumerate(dispatched[d].sources):
            for row, (s, t, k) in enumerate(placed):
                rows[s][(t, k)] = y[local, row]
    out = []
    for s in range(R):
        idx = np.asarray(topk_idxs[s])
        w = np.asarray(topk_weights[s], np.float32)
        acc = np.zeros((idx.shape[0], hidden), np.float32)
        for t in range(idx.shape[0]):
            for k in range(idx.shape[1]):
                if idx[t, k] >= 0:
                    acc[t] = acc[t] + rows[s][(t, k)] * w[t, k]
        out.append(acc.astype(bfloat16))
    return out
