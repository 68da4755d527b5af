"""A DeepSeek V3 MoE layer's forward in FP8 through one ``ElasticBuffer``, as epic's ops run it
step by step (the reference path the fused kernels are measured against):

    FP8 dispatch (expanded rows, 128-row expert alignment)
      -> gate/up grouped GEMM (e4m3 x e4m3, block scales, bf16 out, N = 2I)
      -> SwiGLU times each row's routing weight, FP8 re-quant (ElasticBuffer.swiglu, the
         compiler's ep.swiglu)
      -> down grouped GEMM (K = I, N = hidden)
      -> combine (bf16, summed at the token's origin)

    y = moe_layer_fp8(buffer, (x_fp8, x_scales), topk_idx, topk_weights,
                      (w13, w13_scales), (w2, w2_scales), num_experts=256)

``x_fp8`` float8_e4m3fn ``[T, hidden]`` with ``x_scales`` float32 ``[T, hidden / 128]`` (DeepEP's
FP8 dispatch input); ``w13`` e4m3 ``[E / R, 2I, hidden]`` (gate rows, then up rows) and ``w2``
e4m3 ``[E / R, hidden, I]``, each with float32 scales per 128 x 128 block; in a virtual world
every argument but ``num_experts`` is a list with one entry per rank. The combine sums
unweighted (DeepEP's contract), so the routing weights multiply each row's activations in the
SwiGLU (in float32, before the FP8 cast): the down GEMM is linear, so its rows come out
weighted.
"""

from __future__ import annotations

from . import _tensors as T
from .activations import SCALE_BLOCK

__all__ = ["expert_mlp_fp8", "layer_kernels", "moe_layer_fp8"]


def layer_kernels(hidden, intermediate, persistent=False):
    """The kernels ``moe_layer_fp8`` launches, as ``[(variant, kind)]`` for
    ``Runtime.kernels(spec, variant, kind)`` (to fill a kernel cache ahead of time): the five
    ops', or with ``persistent`` the one kernel's."""
    dispatch = dict(weights=True, cached=False, zero_padding=False)
    if persistent:
        return [(dict(dispatch, n=intermediate), "moe_layer")]
    return [(dispatch, "dispatch"),
            (dict(n=2 * intermediate, out_dtype="bf16"), "grouped_gemm"),
            (dict(n=intermediate, in_dtype="bf16", out_dtype="f8E4M3FN"), "swiglu"),
            (dict(n=hidden, out_dtype="bf16", k=intermediate), "grouped_gemm"),
            (dict(weights=False, biases=0), "combine")]


def expert_mlp_fp8(buffer, recv_x, w13, w2, handle, weights=None):
    """The experts' MLP on an FP8 expanded dispatch's rows: ``recv_x`` the dispatch's
    ``(recv_x, recv_x_scales)``, ``w13`` / ``w2`` as in the module's docstring, ``handle`` the
    dispatch's; ``weights`` (float32 ``[rows]``, the dispatch's ``recv_topk_weights``)
    multiply each row's activations (so its output). Returns the down GEMM's bf16 rows
    ``[rows, hidden]``; padding rows are not zeroed (the combine never reads them)."""
    _mlp_weights(buffer, w13, w2)
    # Every step reads the experts' rows only (the handle's): the padding rows are not zeroed.
    gate_up = buffer.grouped_gemm(recv_x, w13, handle, out_dtype="bf16", zero_padding=False)
    rows = buffer.swiglu(gate_up, handle, out_dtype="float8_e4m3fn", weights=weights,
                         zero_padding=False)
    return buffer.grouped_gemm(rows, w2, handle, out_dtype="bf16", zero_padding=False)


def moe_layer_fp8(buffer, x, topk_idx, topk_weights, w13, w2, num_experts, num_sms=0,
                  do_cpu_sync=None, persistent=False):
    """The whole layer (module docstring). Returns the combined bf16 ``[T, hidden]`` (a list
    in a virtual world). ``do_cpu_sync=False``: the dispatch returns worst-case-sized rows
    instead of waiting for the host to learn their count, so the layer can be captured in a
    CUDA graph (every later step works on the handle's rows only).

    ``persistent=True``: run the layer as one persistent kernel (``ep.moe_layer``: the five
    steps in one launch, the rank's blocks meeting between them; the same arithmetic, so
    bitwise the same result) instead of five ops, in a virtual world or across processes
    (where the kernel stages the dispatch and the combine in the window: the kernel
    ``VirtualWorld(R, staged=True)`` runs on one GPU). Not the default: measured on an H100
    it is 3-11% slower than the five ops (its barriers cost what the launches did; its
    steps do not overlap yet)."""
    if topk_weights is None:
        raise ValueError("topk_weights: the layer weights each expert's rows by them; pass "
                         "the router's float32 [T, top-k] weights")
    if type(persistent) is not bool:
        raise TypeError(f"persistent: True or False, got {persistent!r}")
    if persistent:
        from . import _dispatch

        result = _dispatch.dispatch(
            buffer, x, topk_idx, topk_weights, cumulative_local_expert_recv_stats=None,
            num_experts=num_experts, num_max_tokens_per_rank=None, expert_alignment=SCALE_BLOCK,
            num_sms=num_sms, num_qps=0, previous_event=None, previous_event_before_epilogue=None,
            async_with_compute_stream=False, allocate_on_comm_stream=False, handle=None,
            do_handle_copy=False, do_cpu_sync=do_cpu_sync, do_expand=True, do_zero_padding=False,
            use_tma_aligned_col_major_sf=False, gemm=None, layer=_mlp_weights(buffer, w13, w2))
        return result[-1]
    recv, _, recv_weights, handle, _ = buffer.dispatch(
        x, topk_idx, topk_weights, num_experts=num_experts, do_expand=True,
        expert_alignment=SCALE_BLOCK, num_sms=num_sms, do_cpu_sync=do_cpu_sync)
    # The routing weights scale each row's activations inside the SwiGLU (the down GEMM is
    # linear): no pass over the down GEMM's (worst-case-sized) rows.
    down = expert_mlp_fp8(buffer, recv, w13, w2, handle, weights=recv_weights)
    combined, _, _ = buffer.combine(down, handle, num_sms=num_sms)
    return combined


def _mlp_weights(buffer, w13, w2):
    """Every rank's (w13, w2), checked to agree (_check_mlp_weights)."""
    w13s, w2s = buffer._per_rank("w13", w13), buffer._per_rank("w2", w2)
    for r, (a, b) in enumerate(zip(w13s, w2s)):
        _check_mlp_weights(buffer._name("w13", r), a, buffer._name("w2", r), b)
    return w13s, w2s


def _check_mlp_weights(name13, w13, name2, w2):
    """The two GEMMs' weights agree: w13 [L, 2I, hidden] and w2 [L, hidden, I] (each an
    (e4m3 weights, scales) pair; the GEMMs check the rest)."""
    shapes = []
    for name, w in ((name13, w13), (name2, w2)):
        if not (isinstance(w, tuple) and len(w) == 2):
            raise TypeError(f"{name}: an (e4m3 weights, float32 block scales) pair, got "
                            f"{type(w).__name__}")
        if T.dtype_name(w[0]) != "f8E4M3FN":
            raise TypeError(f"{name}: float8_e4m3fn weights, got {T.describe(w[0])}")
        shape = tuple(w[0].shape)
        if len(shape) != 3:
            raise ValueError(f"{name}: expected [local experts, N, K], got shape {list(shape)}")
        shapes.append(shape)
    (l13, n13, k13), (l2, n2, k2) = shapes
    if l13 != l2 or n13 != 2 * k2 or n2 != k13:
        raise ValueError(f"{name13} {list(shapes[0])} and {name2} {list(shapes[1])}: expected "
                         "[L, 2I, hidden] and [L, hidden, I] (gate and up rows, then the down "
                         "projection)")
