"""epic.activations.swiglu_fp8 in the DSL's interpreter against epic.reference.swiglu_fp8 (the
float64 definition), its argument checks, and its kernel compiled for sm_90a (PTX's ex2 and
the e4m3 conversion)."""

import ml_dtypes
import numpy as np
import pytest

import epic
from epic import reference as ref
from epic.activations import swiglu_fp8

FP8_ULP = 2.0 ** -3  # e4m3: 3 mantissa bits


def check_against_reference(gate_up, out, scales):
    want_data, want_scales = ref.swiglu_fp8(gate_up)
    np.testing.assert_allclose(scales, want_scales, rtol=1e-6)
    got = out.astype(np.float32).reshape(len(out), -1, 128) * scales[:, :, None]
    want = want_data.astype(np.float32).reshape(got.shape) * want_scales[:, :, None]
    # The same rounding but where float32 math lands a value on the other side of an e4m3
    # rounding boundary: then one ulp of the scaled value apart.
    np.testing.assert_allclose(got, want, rtol=FP8_ULP, atol=float(scales.max()) * 2.0 ** -9)
    return np.mean(out.view(np.uint8) == want_data.view(np.uint8))


def test_swiglu_fp8_matches_the_reference(monkeypatch):
    monkeypatch.setenv("EPIC_INTERPRET", "1")
    rng = np.random.default_rng(3)
    gate_up = (rng.standard_normal((7, 512)) * 3).astype(ml_dtypes.bfloat16)
    gate_up[2] = 0  # a padding row stays zero, with the floor's scale
    out, scales = swiglu_fp8(gate_up, programs=3)
    assert out.dtype == ml_dtypes.float8_e4m3fn and out.shape == (7, 256)
    assert scales.dtype == np.float32 and scales.shape == (7, 2)
    assert not out[2].astype(np.float32).any() and np.all(scales[2] == np.float32(1e-4) / 448)
    assert check_against_reference(gate_up, out, scales) > 0.99  # nearly every byte equal


def test_swiglu_fp8_per_rank_in_a_virtual_world(monkeypatch):
    monkeypatch.setenv("EPIC_INTERPRET", "1")
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((rows, 256)).astype(np.float32) for rows in (5, 0, 3)]
    outs, scales = swiglu_fp8(xs, world=epic.VirtualWorld(3))
    assert [o.shape for o in outs] == [(5, 128), (0, 128), (3, 128)]
    for x, o, s in zip(xs, outs, scales):
        if len(x):
            check_against_reference(x, o, s)


def test_swiglu_fp8_checks_its_arguments():
    with pytest.raises(ValueError, match=r"gate_up: expected \[rows, 2 \* I\] with I a multiple "
                                         r"of 128, got shape \[4, 200\]"):
        swiglu_fp8(np.zeros((4, 200), np.float32))
    with pytest.raises(TypeError, match=r"gate_up\[1\]: bf16, f16 or float32 values, got int32"):
        swiglu_fp8([np.zeros((4, 256), np.float32), np.zeros((4, 256), np.int32)])
    with pytest.raises(ValueError, match=r"gate_up\[1\]: 512 columns, rank 0 has 256"):
        swiglu_fp8([np.zeros((4, 256), np.float32), np.zeros((4, 512), np.float32)])
    with pytest.raises(ValueError, match=r"scales\[0\]: expected shape \[4, 1\], got \[4, 2\]"):
        swiglu_fp8(np.zeros((4, 256), np.float32), scales=np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"empty list"):
        swiglu_fp8([])
    with pytest.raises(ValueError, match=r"gate_up: expected \[rows, 2 \* I\]"):
        ref.swiglu_fp8(np.zeros((4, 200), np.float32))


def test_el_exp_runs_outside_a_kernel_on_float32_only():
    import epic.language as el

    np.testing.assert_allclose(el.exp(np.array([0.0, 1.0], np.float32)), [1.0, np.e], rtol=1e-6)
    with pytest.raises(TypeError, match="el.exp: takes float32 values, got float64"):
        el.exp(np.array([1.0]))


def test_the_kernel_compiles_for_sm90a():
    pytest.importorskip("epic._ir", reason="the DSL compiler is built where LLVM/MLIR are")
    from epic.activations import _swiglu_fp8

    x = np.zeros((4, 512), ml_dtypes.bfloat16)
    k = _swiglu_fp8.compile(x, np.zeros((4, 256), ml_dtypes.float8_e4m3fn),
                            np.zeros((4, 2), np.float32), 4, INTER=256)
    ptx = k.asm["ptx"]
    assert "ex2.approx.ftz.f32" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx
