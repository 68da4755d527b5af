"""epic.moe without a GPU: the FP8 layer's own checks (the two GEMMs' weights agree, routing
weights are given) come before any step runs; the GPU test runs the layer
(test/gpu/test_grouped_gemm.py::test_fp8_moe_layer_matches_torch)."""

import ml_dtypes
import numpy as np
import pytest

import epic
from epic import moe

pytest.importorskip("epic._C", reason="the runtime extension is built by ./install.sh")

R, E, K, H, INTER = 2, 8, 2, 256, 128
L = E // R
F8 = ml_dtypes.float8_e4m3fn


@pytest.fixture
def buf():
    return epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=16, hidden=H,
                              num_topk=K)


def pair(n, k):
    return (np.zeros((L, n, k), F8), np.ones((L, n // 128, k // 128), np.float32))


def test_the_mlp_weights_must_agree(buf):
    rows = [(np.zeros((128, H), F8), np.ones((128, H // 128), np.float32))] * R
    good13, good2 = [pair(2 * INTER, H)] * R, [pair(H, INTER)] * R
    with pytest.raises(ValueError, match=r"w13\[0\] \[4, 256, 256\] and w2\[0\] \[4, 256, 256\]"
                                         r": expected \[L, 2I, hidden\] and \[L, hidden, I\]"):
        moe.expert_mlp_fp8(buf, rows, [pair(2 * INTER, H)] * R, [pair(H, 2 * INTER)] * R, None)
    with pytest.raises(TypeError, match=r"w2\[1\]: an \(e4m3 weights, float32 block scales\) "
                                        r"pair, got ndarray"):
        moe.expert_mlp_fp8(buf, rows, good13, [good2[0], good2[1][0]], None)
    bf16 = (good13[0][0].astype(ml_dtypes.bfloat16), good13[0][1])
    with pytest.raises(TypeError, match=r"w13\[0\]: float8_e4m3fn weights, got bf16\[4, 256, "
                                        r"256\] on cpu"):
        moe.expert_mlp_fp8(buf, rows, [bf16] * R, good2, None)
    with pytest.raises(ValueError, match=r"w13\[0\]: expected \[local experts, N, K\], got "
                                         r"shape \[256, 256\]"):
        moe.expert_mlp_fp8(buf, rows, [(good13[0][0][0], good13[0][1])] * R, good2, None)
    # Agreeing weights reach the first GEMM, which wants the dispatch's handle.
    with pytest.raises(ValueError, match="handle: required"):
        moe.expert_mlp_fp8(buf, rows, good13, good2, None)


def test_the_layer_needs_routing_weights(buf):
    with pytest.raises(ValueError, match="topk_weights: the layer weights each expert's rows"):
        moe.moe_layer_fp8(buf, None, None, None, None, None, num_experts=E)


def layer_inputs(tokens=8, w13=None, w2=None):
    """Every rank's FP8 tokens (data, scale packs), routing, weights and MLP weights."""
    x = [(np.zeros((tokens, H), F8), np.ones((tokens, H // 128), np.float32))] * R
    idx = [np.tile(np.arange(K, dtype=np.int64), (tokens, 1))] * R
    w = [np.full((tokens, K), 0.5, np.float32)] * R
    return x, idx, w, w13 or [pair(2 * INTER, H)] * R, w2 or [pair(H, INTER)] * R


def test_the_persistent_layer_is_checked_before_it_runs(buf):
    """moe_layer_fp8(persistent=True) (ep.moe_layer): the same checks as the five ops, every
    step's record checked by the runtime (without a GPU: checked, nothing launched)."""
    x, idx, w, w13, w2 = layer_inputs()
    # All good: every record checked, then the one refusal numpy inputs get (nothing ran).
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor, it is on the CPU"):
        moe.moe_layer_fp8(buf, x, idx, w, w13, w2, num_experts=E, persistent=True)
    with pytest.raises(ValueError, match=r"w13\[0\] \[4, 256, 256\] and w2\[0\] \[4, 256, 256\]"):
        moe.moe_layer_fp8(buf, x, idx, w, w13, [pair(H, 2 * INTER)] * R, num_experts=E,
                          persistent=True)
    with pytest.raises(TypeError, match=r"persistent: True or False, got 1"):
        moe.moe_layer_fp8(buf, x, idx, w, w13, w2, num_experts=E, persistent=1)
    # The down GEMM's scales are the runtime's to check: named with their step and rank.
    bad = [(w2[0][0], np.ones((L, 1, 1), np.float32))] * R
    with pytest.raises(ValueError, match=r"weight_scales must have shape f32\[4, 2, 1\]"):
        moe.moe_layer_fp8(buf, x, idx, w, w13, bad, num_experts=E, persistent=True)


def test_the_five_ops_unless_persistent(monkeypatch):
    """moe_layer_fp8 runs the five ops by default and the persistent kernel (the dispatch
    path's layer hook) with persistent=True."""
    from epic import _dispatch

    class Taken(Exception):
        pass

    def layer(*args, **kwargs):
        raise Taken("persistent" if kwargs.get("layer") is not None else "five ops")

    monkeypatch.setattr(_dispatch, "dispatch", layer)
    x, idx, w, w13, w2 = layer_inputs()
    b = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=16, hidden=H, num_topk=K)
    for persistent, path in ((False, "five ops"), (True, "persistent")):
        with pytest.raises(Taken, match=path):
            moe.moe_layer_fp8(b, x, idx, w, w13, w2, num_experts=E, persistent=persistent)
    with pytest.raises(Taken, match="five ops"):
        moe.moe_layer_fp8(b, x, idx, w, w13, w2, num_experts=E)
