"""Where @epic.jit kernels run, behind one interface, so that a scheme written once runs in the
CPU interpreter (CI, debugging) and on the GPU (a virtual world on one GPU) unchanged.

    target = Target.choose(ranks=4, window_bytes=layout.bytes)   # GPU if there is one
    xs = [target.tensor(x) for x in host_arrays]                  # per-rank lists
    kernel[(programs,)](xs, ..., target.window, **constexprs, **target.launch)
    target.synchronize(); host = target.numpy(xs[0])

In the interpreter the window is a :class:`SymmetricMemory` and kernels get ``world=``; on the
GPU it is an :class:`epic.ElasticBuffer` over an :class:`epic.VirtualWorld` (the buffer's
symmetric window, zeroed at creation) and kernels get ``buffer=``.

The GPU machine may have no compiler (epic._ir needs LLVM/MLIR): there, kernels come from the
DSL and kernel caches. ``EPIC_INTERPRET=1 EPIC_DSL_PRECOMPILE=1`` runs a script in the
interpreter and compiles every launch's specialization for the GPU on the way; tensors here are
256-byte aligned like CUDA's so that the specializations match.
"""

from __future__ import annotations

import numpy as np

from .jit import SymmetricMemory, interpreting

__all__ = ["Target"]

_MIB = 1 << 20


class Target:
    def __init__(self, ranks: int, window_bytes: int, gpu: bool, num_sms: int = 0):
        from epic.buffer import ElasticBuffer, VirtualWorld

        self.ranks, self.gpu = ranks, gpu
        self.world = VirtualWorld(ranks)
        if gpu:
            num_bytes = max(2 * _MIB, -(-window_bytes // (2 * _MIB)) * 2 * _MIB)
            self.window = ElasticBuffer(self.world, num_bytes=num_bytes, num_sms=num_sms)
            self.launch = {"buffer": self.window}
        else:
            self.window = SymmetricMemory(ranks, window_bytes)
            self.launch = {"world": self.world}

    @classmethod
    def choose(cls, ranks: int, window_bytes: int, num_sms: int = 0) -> "Target":
        """The GPU unless EPIC_INTERPRET=1 or there is none (then the interpreter, and
        EPIC_INTERPRET is set so launches interpret)."""
        import os

        gpu = not interpreting() and _cuda_available()
        if not gpu:
            os.environ["EPIC_INTERPRET"] = "1"
        return cls(ranks, window_bytes, gpu, num_sms)

    @property
    def name(self) -> str:
        return f"GPU (virtual world of {self.ranks})" if self.gpu else \
            f"CPU interpreter ({self.ranks} ranks)"

    def tensor(self, array: np.ndarray):
        """`array` where kernels read it: itself, or a CUDA tensor with the same bits."""
        array = np.ascontiguousarray(array)
        if not self.gpu:  # a 256-byte aligned copy, as CUDA allocates (the same specialization)
            storage = np.zeros(array.nbytes + 256, np.uint8)
            start = -storage.ctypes.data % 256
            aligned = storage[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
            aligned[...] = array
            return aligned
        from epic._tensors import numpy_to_torch

        return numpy_to_torch(array)

    def zeros(self, shape, dtype):
        return self.tensor(np.zeros(shape, dtype))

    def numpy(self, tensor) -> np.ndarray:
        if isinstance(tensor, np.ndarray):
            return tensor
        from epic._tensors import torch_to_numpy

        return torch_to_numpy(tensor)

    def window_view(self, rank: int, dtype, count: int, offset_bytes: int = 0) -> np.ndarray:
        """A copy of `count` elements of `dtype` at `offset_bytes` of `rank`'s window."""
        if not self.gpu:
            return self.window.view(rank, dtype, count, offset_bytes).copy()
        self.synchronize()
        size = np.dtype(dtype).itemsize
        raw = self.window.window_tensor(rank)[offset_bytes:offset_bytes + count * size]
        return raw.cpu().numpy().view(dtype)

    def fill_window(self, rank: int, dtype, count: int, offset_bytes: int, value):
        """Sets `count` elements of `dtype` at `offset_bytes` of `rank`'s window to `value`."""
        if not self.gpu:
            self.window.view(rank, dtype, count, offset_bytes)[:] = value
            return
        from epic._tensors import numpy_to_torch

        size = np.dtype(dtype).itemsize
        raw = self.window.window_tensor(rank)[offset_bytes:offset_bytes + count * size]
        raw.copy_(numpy_to_torch(np.full(count, value, dtype).view(np.uint8)))

    def synchronize(self):
        if self.gpu:
            import torch

            torch.cuda.synchronize()

    def destroy(self):
        if self.gpu:
            self.window.destroy()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
