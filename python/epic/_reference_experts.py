"""epic.reference's expert side: the grouped GEMM on an expanded dispatch's rows, DeepSeek's
per-token FP8 casts, and the synthetic expert outputs DeepEP's tests combine."""

from __future__ import annotations

import math

import numpy as np

from ._reference_checks import (
    _check_array, _check_dtype, _check_handle, _check_handles, _check_int, _check_number,
    _describe, _source_ids, _to_bf16, bfloat16, float8_e4m3fn, FP8_E4M3_MAX, _FP8_AMAX_FLOOR,
    _FP8_DTYPES)
from ._reference_combine import _accumulate
from ._reference_dispatch import _owner_mask


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


def per_token_cast_to_fp8(x, group=128, use_ue8m0=False, round_scale=None):
    """Quantise ``[T, H]`` rows to E4M3 with one scale per ``group`` channels.

    ``scale = amax / 448`` per (token, group), ``amax`` clamped below at 1e-4;
    data = ``x * (448 / amax)`` rounded to ``float8_e4m3fn`` (nearest-even,
    clipped to +-448 so rounding can never overflow to NaN). A ragged last
    group is treated as zero-padded.

    With ``round_scale`` (default: ``use_ue8m0``) the scale is rounded up to a
    power of two (``2^ceil(log2(scale))``, exactly: from the float's bits) and
    the data is ``x / scale``. With ``use_ue8m0`` (which needs the rounding)
    the scales are returned as UE8M0 exponent bytes, four consecutive groups
    packed little-endian per int32 (``[T, ceil(G/4)]``).

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
    if round_scale is None:
        round_scale = use_ue8m0
    if use_ue8m0 and not round_scale:
        raise ValueError("use_ue8m0 needs round_scale (a UE8M0 scale is a power of two)")
    if round_scale:
        # 2^ceil(log2(scale)) from the bits: the biased exponent, one more
        # unless the mantissa is zero (np.log2 may round a value just above a
        # power of two down onto it). Scales are normal floats (amax >= 1e-4).
        bits = scale.astype(np.float32).view(np.uint32)
        exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
        scale = (exponent.astype(np.uint32) << 23).view(np.float32)
    inv = (np.float32(FP8_E4M3_MAX) / amax) if not round_scale else (np.float32(1.0) / scale)
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


def swiglu_fp8(gate_up):
    """The activation between an expert's GEMMs with DeepSeek's FP8 re-quantization
    (:func:`epic.activations.swiglu_fp8`): ``gate_up`` ``[rows, 2I]`` (gate columns, then up),
    ``y = silu(gate) * up`` in float64 rounded to float32, then :func:`per_token_cast_to_fp8`
    of ``y`` (a float32 scale per 128 channels). Returns ``(data [rows, I] float8_e4m3fn,
    scales [rows, I / 128] float32)``."""
    _check_array("gate_up", gate_up)
    if gate_up.ndim != 2 or gate_up.shape[1] % 256:
        raise ValueError(f"gate_up: expected [rows, 2 * I] with I a multiple of 128, got "
                         f"{_describe(gate_up)}")
    half = gate_up.shape[1] // 2
    gate = gate_up[:, :half].astype(np.float64)
    up = gate_up[:, half:].astype(np.float64)
    y = (gate / (1.0 + np.exp(-gate)) * up).astype(np.float32)
    return per_token_cast_to_fp8(y)


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
