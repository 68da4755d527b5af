"""What the Python API needs to know about a tensor, for torch and numpy.

torch tensors are the first-class citizens (they are what a training or
inference stack holds); numpy arrays are accepted so that every argument check
can run, and be tested, on a machine without a GPU. Tensors reach the C++
runtime as DLPack capsules; the element type travels by name because DLPack
producers disagree on FP8 (epic passes FP8 and numpy's extension dtypes as
byte views).
"""

from __future__ import annotations

import sys

__all__ = ["is_tensor", "is_torch", "dtype_name", "describe", "to_runtime", "is_cuda",
           "torch_dtype", "torch_to_numpy", "numpy_to_torch", "RUNTIME_DTYPES"]

# dtype name (the runtime's, see runtime/include/epic/runtime/Calls.h) by
# torch dtype name / numpy dtype name.
_TORCH_NAMES = {
    "torch.bfloat16": "bf16",
    "torch.float16": "f16",
    "torch.float32": "f32",
    "torch.float8_e4m3fn": "f8E4M3FN",
    "torch.float8_e5m2": "f8E5M2",
    "torch.int32": "i32",
    "torch.int64": "i64",
    "torch.bool": "i1",
}
_NUMPY_NAMES = {
    "bfloat16": "bf16",
    "float16": "f16",
    "float32": "f32",
    "float8_e4m3fn": "f8E4M3FN",
    "float8_e5m2": "f8E5M2",
    "int32": "i32",
    "int64": "i64",
    "bool": "i1",
}
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f8E4M3FN": 1, "f8E5M2": 1, "i32": 4, "i64": 8,
          "i1": 1}
RUNTIME_DTYPES = tuple(_BYTES)


def is_torch(t) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(t, torch.Tensor)


def is_tensor(t) -> bool:
    return is_torch(t) or (hasattr(t, "__dlpack__") and hasattr(t, "shape") and hasattr(t, "dtype"))


def dtype_name(t) -> str | None:
    """The runtime's name of `t`'s element type, or None if it has none."""
    if is_torch(t):
        return _TORCH_NAMES.get(str(t.dtype))
    return _NUMPY_NAMES.get(getattr(t.dtype, "name", ""))


def describe(t) -> str:
    if not is_tensor(t):
        return type(t).__name__
    name = dtype_name(t) or str(t.dtype)
    where = "cuda" if is_cuda(t) else "cpu"
    return f"{name}[{', '.join(str(d) for d in t.shape)}] on {where}"


def numpy_dtype(name: str):
    """The numpy dtype of a runtime dtype name (bf16 and FP8 from ml_dtypes)."""
    import ml_dtypes
    import numpy as np

    return {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32,
            "f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2,
            "i32": np.int32, "i64": np.int64, "i1": np.bool_}[name]


def torch_dtype(name: str):
    """The torch dtype of a runtime dtype name."""
    import torch

    return getattr(torch, _TORCH_DTYPE_ATTRS[name])


_TORCH_DTYPE_ATTRS = {runtime: torch_name.split(".")[1] for torch_name, runtime in
                      _TORCH_NAMES.items()}


def is_cuda(t) -> bool:
    return bool(getattr(t, "is_cuda", False))


def is_contiguous(t) -> bool:
    if is_torch(t):
        return t.is_contiguous()
    flags = getattr(t, "flags", None)
    return bool(flags["C_CONTIGUOUS"]) if flags is not None else True


def to_runtime(t, dtype: str | None = None):
    """(DLPack capsule, dtype name) for the C++ runtime; None stays None.

    `dtype` overrides the name (4-byte scale packs of any type travel as f32:
    the kernels move their bytes).
    """
    if t is None:
        return None
    name = dtype or dtype_name(t)
    if is_torch(t):
        import torch

        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[_BYTES[name]]
        view = t.view(width) if t.dtype.is_floating_point else t
        return (view.__dlpack__(), name)
    import numpy as np

    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[_BYTES[name]]
    return (t.view(width).__dlpack__(), name)


def torch_to_numpy(t):
    """The exact bits of a torch tensor as a numpy array of the same dtype
    (bf16 and FP8 as ml_dtypes types); None stays None."""
    if t is None:
        return None
    import ml_dtypes
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).cpu().numpy().view(ml_dtypes.float8_e4m3fn)
    return t.cpu().numpy()


def numpy_to_torch(a, device="cuda"):
    """The inverse of torch_to_numpy, on `device`."""
    import ml_dtypes
    import numpy as np
    import torch

    if a.dtype == np.dtype(ml_dtypes.float8_e4m3fn):
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn).to(device)
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)
