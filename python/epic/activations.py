"""The activation between an expert's two GEMMs, with DeepSeek's FP8 re-quantization, as an
``@epic.jit`` kernel (so it runs on the GPU through an ElasticBuffer, and on the CPU in the
DSL's interpreter).

    out, scales = swiglu_fp8(gate_up, buffer=buffer)      # GPU
    out, scales = swiglu_fp8(gate_up_numpy)                # CPU interpreter (EPIC_INTERPRET=1)

``gate_up`` is the gate/up GEMM's output ``[rows, 2 * I]`` (gate columns first, then up; bf16,
f16 or f32, ``I`` a multiple of 128). Per row ``y = silu(gate) * up`` in float32 (``silu(g) = g
/ (1 + e^-g)``), then per 128 channels ``scale = max(amax(|y|), 1e-4) / 448`` and ``out = y /
scale`` rounded to float8_e4m3fn: ``out [rows, I]`` and ``scales [rows, I / 128]`` float32, the
layout the FP8 grouped GEMM reads as its rows' block scales. Rows that are all zero (the
alignment padding of an expanded dispatch) stay zero. A virtual world takes and returns one
entry per rank.

On the GPU ``e^x`` is PTX's ``ex2.approx`` (a few ulp of float32); FP8 rounding then hides it
except where a value sits on a rounding boundary. ``epic.reference.swiglu_fp8`` is the
float64 definition the tests compare with.
"""

from __future__ import annotations

import numpy as np

import epic.language as el
from epic import _tensors as T
from epic._reference_checks import _FP8_AMAX_FLOOR, FP8_E4M3_MAX
from epic.dsl.jit import jit

__all__ = ["swiglu_fp8", "SCALE_BLOCK"]

SCALE_BLOCK = 128  # channels per FP8 scale


@jit
def _swiglu_fp8(gate_up, out, scales, rows, INTER: el.constexpr):
    """One (row, 128-channel block) per step of each program's loop."""
    cols = el.arange(0, 128)
    blocks = INTER // 128
    for item in range(el.program_id(0), rows * blocks, el.num_programs(0)):
        row = item // blocks
        column = (item % blocks) * 128 + cols
        gate = el.load(gate_up + (row * (2 * INTER) + column)).to(el.float32)
        up = el.load(gate_up + (row * (2 * INTER) + INTER + column)).to(el.float32)
        y = gate / (1.0 + el.exp(0.0 - gate)) * up
        amax = el.max(el.where(y < 0.0, 0.0 - y, y))
        scale = el.where(amax > _FP8_AMAX_FLOOR, amax, _FP8_AMAX_FLOOR) / FP8_E4M3_MAX
        el.store(out + (row * INTER + column), (y / scale).to(el.float8e4nv))
        el.store(scales + item, scale)


def swiglu_fp8(gate_up, *, out=None, scales=None, buffer=None, world=None, programs=None):
    """SwiGLU then the FP8 cast per 128 channels (see the module's docstring). `out` and
    `scales`: where to write (allocated like `gate_up` when None); `buffer`: the ElasticBuffer
    whose world and GPU run the kernel; without one the interpreter runs it (`world`: an
    epic.VirtualWorld, by default one rank per entry of `gate_up`); `programs`: blocks per rank
    (by default every block the buffer may run per rank, its `num_sms` share of the GPU; each
    block loops over (row, 128-channel) items). Returns (out, scales)."""
    per_rank = isinstance(gate_up, list)
    xs = gate_up if per_rank else [gate_up]
    if not xs:
        raise ValueError("gate_up: an empty list (one entry per rank)")
    if per_rank:
        outs = list(out) if out is not None else [None] * len(xs)
        scs = list(scales) if scales is not None else [None] * len(xs)
    else:
        outs, scs = [out], [scales]
    if len(outs) != len(xs) or len(scs) != len(xs):
        raise ValueError(f"out and scales: one entry per rank of gate_up ({len(xs)})")
    rows, width = [], None
    for r, x in enumerate(xs):
        name = f"gate_up[{r}]" if per_rank else "gate_up"
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 2 or shape[1] % (2 * SCALE_BLOCK):
            raise ValueError(f"{name}: expected [rows, 2 * I] with I a multiple of "
                             f"{SCALE_BLOCK}, got shape {list(shape)}")
        if T.dtype_name(x) not in ("bf16", "f16", "f32"):
            raise TypeError(f"{name}: bf16, f16 or float32 values, got "
                            f"{str(x.dtype).replace('torch.', '')}")
        if width is not None and shape[1] != width:
            raise ValueError(f"{name}: {shape[1]} columns, rank 0 has {width} (one kernel "
                             "serves every rank)")
        width = shape[1]
        rows.append(shape[0])
        inter = width // 2
        outs[r] = _allocate(x, (shape[0], inter), "fp8") if outs[r] is None else outs[r]
        scs[r] = _allocate(x, (shape[0], inter // SCALE_BLOCK), "f32") if scs[r] is None else scs[r]
        for what, t, want in ((f"out[{r}]", outs[r], (shape[0], inter)),
                              (f"scales[{r}]", scs[r], (shape[0], inter // SCALE_BLOCK))):
            if tuple(t.shape) != want:
                raise ValueError(f"{what}: expected shape {list(want)}, got {list(t.shape)}")
    if programs is None:
        # A virtual world shares one GPU: a rank gets its share of the SMs, not the whole GPU.
        programs = buffer._runtime().blocks_per_rank if buffer is not None else 16
    launch = {"buffer": buffer} if buffer is not None else {
        "world": world if world is not None else _virtual_world(len(xs))}
    args = (xs, outs, scs, rows) if per_rank else (xs[0], outs[0], scs[0], rows[0])
    _swiglu_fp8[(programs,)](*args, INTER=width // 2, **launch)
    return (outs, scs) if per_rank else (outs[0], scs[0])


def _allocate(like, shape, kind):
    """An output on `like`'s side: a torch tensor on its device, or a numpy array."""
    name = "f8E4M3FN" if kind == "fp8" else "f32"
    if T.is_torch(like):
        import torch

        return torch.empty(shape, dtype=T.torch_dtype(name), device=like.device)
    return np.zeros(shape, T.numpy_dtype(name))


def _virtual_world(ranks):
    from epic.buffer import VirtualWorld

    return VirtualWorld(ranks)
