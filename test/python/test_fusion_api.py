"""dispatch_gemm / gemm_combine's ``fusion=`` without a GPU: the mode is checked, ``auto`` asks
the same cost model the compiler's fusion passes ask (the numbers of
test/Transforms/ep-fuse-cost-model.mlir's remarks), and every call records its decision."""

import ml_dtypes
import numpy as np
import pytest

import epic
from epic import _fusion

_C = pytest.importorskip("epic._C", reason="the runtime extension is built by ./install.sh")

R, E, K, H, TMAX = 4, 32, 4, 256, 64


def v3(n, tokens=1024, ranks_per_device=1):
    return dict(ranks=8, experts=256, topk=8, hidden=7168, n=n, element_bytes=2, tokens=tokens,
                ranks_per_device=ranks_per_device)


def test_the_python_prediction_is_the_passes_prediction():
    """The remarks of ep-fuse-cost-model.mlir for the same shapes, digit for digit."""
    prefill = _C.predict_fusion("dispatch_gemm", v3(2048), "sm_90a")
    assert (round(prefill["fused_us"], 1), round(prefill["steps_us"], 1)) == (606.9, 515.9)
    assert not prefill["fuse"]
    assert prefill["why"] == (
        "predicted 606.9 us fused vs 515.9 us in two steps: the fused kernel's GEMM runs x1.32 "
        "slower (459.0 -> 605.9 us), more than the copy (53.9 us) and the kernel boundary "
        "(3.0 us) it hides (sm_90a)")
    small = _C.predict_fusion("dispatch_gemm", v3(256), "sm_90a")
    assert (round(small["fused_us"], 1), round(small["steps_us"], 1)) == (76.7, 114.2)
    assert small["fuse"]
    virtual = _C.predict_fusion("dispatch_gemm", v3(2048, ranks_per_device=0), "sm_90a")
    assert (round(virtual["fused_us"], 1), round(virtual["steps_us"], 1)) == (4848.1, 4106.0)
    # The combine's send: a GPU of one rank sends 7/8 of its rows over NVLink.
    combine = _C.predict_fusion("gemm_combine", v3(7168), "sm_90a")
    assert combine["fused_us"] > 0 and "send" in combine["why"]


def test_predict_fusion_refuses_what_it_cannot_price():
    assert _C.predict_fusion("dispatch_gemm", v3(2048), "sm_100a") is None  # no row
    with pytest.raises(ValueError, match="pair must be 'dispatch_gemm' or 'gemm_combine', got "
                                         "'combine'"):
        _C.predict_fusion("combine", v3(2048), "sm_90a")
    shape = v3(2048)
    del shape["hidden"]
    with pytest.raises(ValueError, match="shape needs 'hidden'"):
        _C.predict_fusion("dispatch_gemm", shape, "sm_90a")
    with pytest.raises(ValueError, match=r"shape\['tokens'\] must be >= 0, got -1"):
        _C.predict_fusion("dispatch_gemm", dict(v3(2048), tokens=-1), "sm_90a")
    with pytest.raises(ValueError, match="ranks, experts and topk must be >= 1"):
        _C.predict_fusion("dispatch_gemm", dict(v3(2048), ranks=0), "sm_90a")


@pytest.fixture
def buf():
    return epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=TMAX, hidden=H,
                              num_topk=K, explicitly_destroy=True)


def host_inputs(n):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((TMAX, H)).astype(ml_dtypes.bfloat16) for _ in range(R)]
    idxs = [np.stack([rng.permutation(E)[:K] for _ in range(TMAX)]).astype(np.int64)
            for _ in range(R)]
    ws = [np.zeros((E // R, H, n), ml_dtypes.bfloat16)] * R
    return xs, idxs, ws


@pytest.mark.parametrize("mode", ["sometimes", "", None, 1, "AUTO"])
def test_a_fusion_mode_outside_the_three_is_refused_by_name(buf, mode):
    xs, idxs, ws = host_inputs(128)
    with pytest.raises(ValueError, match=r"fusion: 'auto', 'always' or 'never', got "):
        buf.dispatch_gemm(xs, idxs, ws, num_experts=E, fusion=mode)
    with pytest.raises(ValueError, match=r"fusion: 'auto', 'always' or 'never', got "):
        buf.gemm_combine(xs, ws, None, fusion=mode)
    assert buf.last_fusion is None  # refused before any decision


def test_host_inputs_are_checked_as_the_fused_op_and_the_decision_kept(buf):
    xs, idxs, ws = host_inputs(128)
    with pytest.raises(ValueError, match=r"rank 0: experts must be bf16, got f32"):
        buf.dispatch_gemm(xs, idxs, [w.astype(np.float32) for w in ws], num_experts=E)
    assert buf.last_fusion["pair"] == "dispatch_gemm" and buf.last_fusion["fused"]
    assert "host inputs" in buf.last_fusion["why"]
    # "never" is the two steps: the grouped GEMM needs CUDA tensors, and says so.
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.dispatch_gemm(xs, idxs, ws, num_experts=E, fusion="never")
    assert buf.last_fusion == dict(pair="dispatch_gemm", mode="never", fused=False,
                                   why='fusion="never"', fused_us=None, steps_us=None)


class GpuTensor:
    """What decide() reads of a CUDA tensor (is_cuda, shape): the auto decision is host code."""

    def __init__(self, *shape):
        self.shape, self.is_cuda = shape, True


def test_auto_asks_the_model_with_the_calls_shape(buf, monkeypatch):
    monkeypatch.setattr(_fusion, "chip", lambda device: "sm_90a")
    shape = dict(tokens=1024, hidden=7168, n=2048, topk=8, experts=256, element_bytes=2)
    # A virtual world: every rank on this GPU (ranks_per_device 0), the buffer's 4 ranks.
    want = _C.predict_fusion("dispatch_gemm", dict(shape, ranks=R, ranks_per_device=0), "sm_90a")
    fuse = _fusion.decide(buf, "dispatch_gemm", "auto", lambda: shape,
                          _fusion.on_gpu([GpuTensor(1024, 7168)]))
    assert fuse == want["fuse"] is False
    assert buf.last_fusion == dict(pair="dispatch_gemm", mode="auto", fused=False, why=want["why"],
                                   fused_us=want["fused_us"], steps_us=want["steps_us"])
    small = dict(shape, n=128)
    assert _fusion.decide(buf, "dispatch_gemm", "auto", lambda: small, True)
    assert buf.last_fusion["fused_us"] < buf.last_fusion["steps_us"]
    # Odd inputs are not priced: the two steps run, and their checks name the input.
    assert not _fusion.decide(buf, "gemm_combine", "auto", lambda: None, True)
    assert buf.last_fusion["why"] == "inputs the two steps' checks name"
    # A GPU without numbers: the two steps.
    monkeypatch.setattr(_fusion, "chip", lambda device: "sm_100a")
    assert not _fusion.decide(buf, "dispatch_gemm", "auto", lambda: shape, True)
    assert "no numbers for this GPU" in buf.last_fusion["why"]


def test_on_gpu_needs_every_input_on_the_gpu():
    assert _fusion.on_gpu([GpuTensor(1), GpuTensor(2)])
    assert not _fusion.on_gpu([GpuTensor(1), np.zeros(2)])
