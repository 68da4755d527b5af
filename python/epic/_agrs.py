"""ElasticBuffer's AGRS sessions: DeepEP V2's all-gather by copy engines, and a reduce-scatter.

An all-gather takes no SM: the runtime (``runtime/lib/Agrs.cpp``) copies every rank's tensors
into every peer's window with the copy engines, on the buffer's communication stream after the
caller's work, and then writes the all-gather's number into each peer's arrival flag (a stream
memory operation, fenced after the data). The wait handle makes the current stream wait for
every source's number. The gathered tensors are views of the window, valid until the session
ends; ending a session tells every peer this rank is done with them, and the next session's
copies into a peer wait for that.

Reduce-scatter (epic's addition; on DeepEP's roadmap) moves block r of every rank's input into
rank r's window the same way; the wait handle then sums the R blocks in float32 in increasing
rank order from +0.0 and rounds once (bitwise ``epic.reference.reduce_scatter``).

The functions take the ElasticBuffer ``b``; its methods of the same names call them.
"""

from __future__ import annotations

import contextlib
import math

from . import _tensors as T
from ._reference_checks import align
from ._reference_collectives import agrs_num_max_session_bytes

MAX_ALL_GATHERS_PER_SESSION = 32  # DeepEP's bound
_MIB2 = 2 << 20
_REDUCIBLE = ("bfloat16", "float16", "float32")


def _check_shape(name, shape):
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TypeError(f"{name}: expected a shape (a tuple of non-negative ints), got {shape!r}")
    return tuple(shape)


def _is_shape(x):
    return isinstance(x, (tuple, list)) and all(isinstance(d, int) for d in x)


def num_max_session_bytes(num_ranks, shapes, dtype):
    """DeepEP's get_agrs_num_max_session_bytes: the bytes of a session that all-gathers one
    tensor of each shape: sum of align(ranks x elements x itemsize, 32)."""
    itemsize = getattr(dtype, "itemsize", None)  # a torch.dtype (or a numpy dtype)
    if not isinstance(itemsize, int) or isinstance(dtype, type):
        raise TypeError(f"dtype: expected a torch.dtype, got {dtype!r}")
    if _is_shape(shapes):
        shapes = [shapes]
    if not isinstance(shapes, (tuple, list)) or not shapes:
        raise TypeError("shapes: expected a shape or a non-empty sequence of shapes")
    return agrs_num_max_session_bytes(
        num_ranks, [_check_shape(f"shapes[{i}]", s) for i, s in enumerate(shapes)], itemsize)


def buffer_size_hint(num_max_session_bytes, data_offset):
    """Bytes an ElasticBuffer needs for sessions of ``num_max_session_bytes``: DeepEP's
    align(bytes, 2 MiB), after epic's window control region (``data_offset`` bytes)."""
    if not isinstance(num_max_session_bytes, int) or num_max_session_bytes < 1:
        raise ValueError(f"num_max_session_bytes: must be a positive int, got "
                         f"{num_max_session_bytes!r}")
    return align(data_offset + num_max_session_bytes, _MIB2)


# --- sessions ---------------------------------------------------------------------------------

def refuse_in_session(b, what):
    """dispatch and combine use the window's data region, where a session's tensors lie."""
    if b._agrs_open:
        raise RuntimeError(f"{what}: an AGRS session is open on this buffer and its tensors lie "
                           "where dispatch and combine work in the window: destroy the session "
                           "first")


def set_config(b, num_max_session_bytes, num_max_all_gathers_per_session):
    for name, value in (("num_max_session_bytes", num_max_session_bytes),
                        ("num_max_all_gathers_per_session", num_max_all_gathers_per_session)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    state = b._runtime()
    # DeepEP's call includes a barrier: the work queued before it is done on every rank.
    b.barrier(use_comm_stream=False)
    state.agrs_set_config(num_max_session_bytes, num_max_all_gathers_per_session)


def create_session(b):
    # The session's first copies (on the communication stream) wait for the peers' release of
    # the last one; they also follow the caller's work (each all_gather orders them).
    b._runtime().agrs_create()
    b._agrs_open = True


def destroy_session(b):
    state = b._runtime()
    import torch

    # After the caller's reads of the session's tensors (the current stream), and after this
    # rank's own copies (the communication stream).
    torch.cuda.current_stream().wait_stream(b._comm_stream)
    state.agrs_destroy(torch.cuda.current_stream().cuda_stream)
    b._agrs_open = False


@contextlib.contextmanager
def new_session(b, enabled=True):
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__}")
    if not enabled:
        yield
        return
    create_session(b)
    try:
        yield
    finally:
        destroy_session(b)


def _torch_dtype(dtype):
    import torch

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype, got {type(dtype).__name__}")
    return dtype


def _served_windows(b):
    """Every served rank's window in one uint8 tensor: served rank s's at s x window_stride (a
    virtual world's windows are consecutive; NCCL serves one)."""
    whole = b._window_views.get("served")
    if whole is None:
        import torch

        state = b._runtime()
        served = b.num_ranks if b.virtual else 1

        class _Windows:  # the CUDA array interface: torch wraps the memory without copying
            __cuda_array_interface__ = {"shape": (served * state.window_stride,), "typestr": "|u1",
                                        "data": (state.window_address(0), False), "version": 3,
                                        "strides": None}

        whole = b._window_views["served"] = torch.as_tensor(_Windows(), device="cuda")
    return whole


def _view(b, served, offset, nbytes, dtype, shape):
    """`nbytes` at `offset` of the `served`-th served rank's window as a `dtype` tensor."""
    start = served * b._state.window_stride + offset
    return _served_windows(b)[start:start + nbytes].view(dtype).view(shape)


def _require_session(b, what):
    if not b._agrs_open:
        raise RuntimeError(f"{what}: no AGRS session is open (create_agrs_session, or the "
                           "agrs_new_session context manager)")


def get_inplace_tensor(b, shapes, dtype):
    dtype = _torch_dtype(dtype)
    batched = not _is_shape(shapes)
    if batched and (not isinstance(shapes, (tuple, list)) or not shapes):
        raise TypeError("shapes: expected a shape or a non-empty sequence of shapes")
    shape_list = [_check_shape(f"shapes[{i}]", s) for i, s in enumerate(shapes)] if batched \
        else [_check_shape("shapes", shapes)]
    nbytes = [math.prod(s) * dtype.itemsize for s in shape_list]
    for i, n in enumerate(nbytes):
        if n == 0:
            raise ValueError(f"shapes{f'[{i}]' if batched else ''}: {shape_list[i]} has no "
                             "elements")
    state = b._runtime()
    blocks = state.agrs_reserve_inplace(nbytes)
    per_rank = []
    for served in range(b.num_ranks if b.virtual else 1):
        rank = served if b.virtual else b.rank_idx
        views = tuple(_view(b, served, offset + rank * slot, slot, dtype, shape)
                      for (offset, slot), shape in zip(blocks, shape_list))
        per_rank.append(views if batched else views[0])
    return per_rank if b.virtual else per_rank[0]


def check_device_tensor(name, x):
    """A contiguous CUDA tensor with elements (what the copy engines read or write)."""
    if not T.is_torch(x):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_cuda:
        raise ValueError(f"{name}: must be a CUDA tensor")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if x.numel() == 0:
        raise ValueError(f"{name}: has no elements")


def _inputs(b, what, t):
    """[served rank][tensor] CUDA tensors, and whether the caller passed a batch."""
    if b.virtual:
        if not isinstance(t, (list, tuple)) or len(t) != b.num_ranks:
            raise TypeError(f"{what}: a virtual world takes a list with one entry per rank "
                            f"({b.num_ranks}), each a tensor or a sequence of tensors")
        batched = isinstance(t[0], (list, tuple))
        per_rank = [list(x) if isinstance(x, (list, tuple)) else [x] for x in t]
    else:
        batched = isinstance(t, (list, tuple))
        per_rank = [list(t) if batched else [t]]
    count = len(per_rank[0])
    if count == 0:
        raise ValueError(f"{what}: no tensors")
    for r, tensors in enumerate(per_rank):
        where = f"{what}[{r}]" if b.virtual else what
        if len(tensors) != count:
            raise ValueError(f"{where}: {len(tensors)} tensors, rank 0 gives {count}")
        for i, x in enumerate(tensors):
            name = f"{where}[{i}]" if batched else where
            check_device_tensor(name, x)
            first = per_rank[0][i]
            if x.dtype != first.dtype or x.shape != first.shape:
                raise ValueError(f"{name}: {x.dtype} {tuple(x.shape)}, but rank 0's is "
                                 f"{first.dtype} {tuple(first.shape)} (every rank's slot has "
                                 "one size)")
    return per_rank, batched


def _issue(b, per_rank, scatter):
    import torch

    state = b._runtime()
    stream = torch.cuda.current_stream()
    for served, tensors in enumerate(per_rank):  # read on the communication stream: kept for it
        for x in tensors:
            if not b._in_window(x, served):
                x.record_stream(b._comm_stream)
    addresses = [[x.data_ptr() for x in tensors] for tensors in per_rank]
    nbytes = [x.numel() * x.element_size() for x in per_rank[0]]
    blocks, sequence = state.agrs_all_gather(addresses, nbytes, stream.cuda_stream,
                                             b._comm_stream.cuda_stream, scatter)
    return blocks, sequence


def _waiter(b, sequence, then=None):
    state = b._state
    done = []

    def wait():
        import torch

        if not done:
            state.agrs_wait(sequence, torch.cuda.current_stream().cuda_stream)
            done.append(then() if then else None)
        return done[0]

    return wait


def all_gather(b, t):
    per_rank, batched = _inputs(b, "t", t)
    _require_session(b, "all_gather")
    blocks, sequence = _issue(b, per_rank, scatter=False)
    R = b.num_ranks
    gathered = []  # [tensor][served rank]
    for i, (offset, slot) in enumerate(blocks):
        x = per_rank[0][i]
        gathered.append([_view(b, served, offset, R * slot, x.dtype, (R, *x.shape))
                         for served in range(len(per_rank))])
    handle = _waiter(b, sequence)
    out = [g if b.virtual else g[0] for g in gathered]
    return (*out, handle) if batched else (out[0], handle)


def reduce_scatter(b, t):
    import torch

    per_rank, batched = _inputs(b, "t", t)
    if batched:
        raise TypeError("reduce_scatter: takes one tensor per rank")
    _require_session(b, "reduce_scatter")
    R = b.num_ranks
    x = per_rank[0][0]
    name = "t[0]" if b.virtual else "t"
    if str(x.dtype).removeprefix("torch.") not in _REDUCIBLE:
        raise ValueError(f"{name}: reduce_scatter sums bfloat16, float16 or float32, got "
                         f"{x.dtype}")
    if x.dim() == 0 or x.shape[0] % R:
        raise ValueError(f"{name}: the first dimension ({tuple(x.shape)}) must be a multiple of "
                         f"the {R} ranks (rank r gets block r of the sum)")
    out_shape = (x.shape[0] // R, *x.shape[1:])
    blocks, sequence = _issue(b, per_rank, scatter=True)
    (offset, slot), = blocks
    served = len(per_rank)
    elements = slot // x.element_size()
    out = torch.empty((served, elements), dtype=x.dtype, device=x.device)
    # [served rank, source, element]: the blocks where they landed, one strided view (a virtual
    # world's windows are consecutive slices of one allocation).
    item = x.element_size()
    blocks_view = _served_windows(b).view(x.dtype).as_strided(
        (served, R, elements), (b._state.window_stride // item, slot // item, 1), offset // item)

    def reduce():
        # Every served rank's R slots, summed in float32 in rank order from +0.0, rounded once.
        acc = torch.zeros((served, elements), dtype=torch.float32, device=x.device)
        for source in range(R):
            acc.add_(blocks_view[:, source])
        out.copy_(acc)
        return None

    handle = _waiter(b, sequence, then=reduce)
    views = [out[s].view(out_shape) for s in range(served)]
    return (views if b.virtual else views[0]), handle


def _group_size(group):
    size = getattr(group, "num_ranks", None)
    if size is None:
        try:
            size = group.size()
        except AttributeError:
            raise TypeError("group: expected a torch.distributed ProcessGroup or an "
                            f"epic.VirtualWorld, got {type(group).__name__}") from None
    return size


class AgrsMethods:
    """DeepEP V2's AGRS methods of ElasticBuffer (experimental there too)."""

    _agrs_open = False

    @staticmethod
    def get_agrs_num_max_session_bytes(group, shapes, dtype) -> int:
        """Bytes of a session that all-gathers one tensor of each of ``shapes`` (DeepEP's
        formula: the sum of align(ranks x elements x itemsize, 32))."""
        return num_max_session_bytes(_group_size(group), shapes, dtype)

    @staticmethod
    def get_agrs_buffer_size_hint(group, num_max_session_bytes: int) -> int:
        """``num_bytes`` of a buffer whose sessions hold ``num_max_session_bytes``: DeepEP's
        align(bytes, 2 MiB) plus epic's window control region (the flags live there)."""
        _group_size(group)
        from .buffer import _C

        return buffer_size_hint(num_max_session_bytes, _C().Buffer.AGRS_DATA_OFFSET)

    def agrs_set_config(self, num_max_session_bytes: int,
                        num_max_all_gathers_per_session: int) -> None:
        """A session holds at most ``num_max_session_bytes`` of gathered tensors and
        ``num_max_all_gathers_per_session`` (1..32) all-gathers. Includes a barrier."""
        set_config(self, num_max_session_bytes, num_max_all_gathers_per_session)

    def create_agrs_session(self) -> None:
        """Opens a session (pair it with :meth:`destroy_agrs_session`)."""
        create_session(self)

    def destroy_agrs_session(self) -> None:
        """Ends the session after the current stream's work: its gathered tensors are not
        valid any more, and the peers may reuse the memory."""
        destroy_session(self)

    def agrs_new_session(self, enabled: bool = True):
        """Context manager around :meth:`create_agrs_session` / :meth:`destroy_agrs_session`
        (a no-op when ``enabled`` is False)."""
        return new_session(self, enabled)

    def agrs_get_inplace_tensor(self, shapes, dtype):
        """This rank's slot of the next all-gather as tensor(s) to write into (one shape, or a
        sequence of shapes for a batched all-gather): all_gather of exactly these copies nothing
        locally. Virtual world: a list with one entry per rank."""
        return get_inplace_tensor(self, shapes, dtype)

    def all_gather(self, t):
        """All-gather within the open session by copy engines (no SM). ``t``: a tensor or a
        sequence of tensors (virtual world: a list per rank of either). Returns
        ``(gathered, handle)`` or ``(*gathered, handle)``: ``gathered`` is ``[num_ranks,
        *t.shape]`` in the buffer's window, valid after ``handle()`` (which makes the current
        stream wait for every rank's data) until the session ends."""
        return all_gather(self, t)

    def reduce_scatter(self, t):
        """epic: reduce-scatter within the open session: ``t`` is ``[num_ranks * n, ...]``
        (bfloat16, float16 or float32); rank r gets ``[n, ...]``, block r of the sum over ranks
        in float32 in increasing rank order, rounded once (bitwise reproducible). The blocks
        move by copy engines; ``handle()`` waits for them and sums. Returns ``(out, handle)``,
        ``out`` valid after ``handle()``."""
        return reduce_scatter(self, t)
