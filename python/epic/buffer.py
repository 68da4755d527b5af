"""DeepEP V2's ``ElasticBuffer`` on epic's runtime.

The same constructor, methods, arguments, defaults and return tuples as
``deep_ep.ElasticBuffer`` (``../shared/reference/deepep-v2-semantics.md``
§1.2-§1.7), so a DeepEP user switches by changing the import. Two worlds:

* a ``torch.distributed`` process group (NCCL backend): one rank per process,
  tensors as in DeepEP;
* ``epic.VirtualWorld(R)``: R ranks on one GPU in one process, for
  development, tests and benchmarks. Every per-rank tensor is passed as a list
  with one entry per rank, and results come back as lists.

Every argument is checked here, before anything reaches a GPU, and a bad one
raises ``ValueError`` or ``TypeError`` naming it (the checks also run on
machines without a GPU). The C++ runtime (``epic._C``) checks again and
launches the kernels the compiler made for the configuration at hand.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import os
from typing import Any

from . import _tensors as T

__all__ = ["VirtualWorld", "ElasticBuffer", "EPHandle", "EventHandle", "EventOverlap", "topk_idx_t"]

_MIB = 1 << 20
_MAX_RANKS, _MAX_EXPERTS, _MAX_LOCAL_EXPERTS, _MAX_TOPK = 1024, 2048, 256, 32
_ROW_DTYPES = ("bf16", "f16", "f32", "f8E4M3FN", "f8E5M2")


@contextlib.contextmanager
def _device_wait_reports():
    """A CUDA error torch raises at a sync point gets the timeout reports of call-free device
    waits appended (the fused GEMM kernels' waits write them to mapped memory instead of
    printing them; the runtime's own errors include them already)."""
    try:
        yield
    except RuntimeError as error:
        try:
            reports = _C().take_device_wait_reports()
        except Exception:  # no extension, or it cannot answer: keep the original error
            reports = ""
        if reports:  # the same exception (torch's AcceleratorError stays one), longer message
            error.args = (f"{error}{reports}",) + error.args[1:]
        raise


def _C():
    """The extension, imported on first use (the package imports without it)."""
    try:
        return importlib.import_module("epic._C")
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "epic._C (the runtime extension) is not built: run ./install.sh, or build the "
            f"target epic_python_extension ({e})"
        ) from e


def __getattr__(name):
    if name == "topk_idx_t":  # DeepEP exports the torch dtype of top-k indices
        import torch

        return torch.int64
    raise AttributeError(name)


class VirtualWorld:
    """``num_ranks`` ranks of an EP world on one GPU, in this process.

    Pass it where DeepEP takes a process group. Per-rank tensors then go in
    and come out as lists with one entry per rank.
    """

    def __init__(self, num_ranks: int, device: int | None = None):
        if isinstance(num_ranks, bool) or not isinstance(num_ranks, int):
            raise TypeError(f"num_ranks: expected an int, got {type(num_ranks).__name__}")
        if not 1 <= num_ranks <= _MAX_RANKS:
            raise ValueError(f"num_ranks: must be in [1, {_MAX_RANKS}], got {num_ranks}")
        self.num_ranks = num_ranks
        self.device = device

    def size(self) -> int:
        return self.num_ranks

    def __repr__(self):
        return f"VirtualWorld({self.num_ranks})"


class EventHandle:
    """A CUDA event recorded on the current stream (DeepEP's ``EventHandle``)."""

    def __init__(self, event=None):
        import torch

        if event is None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream())
        self.event = event

    def current_stream_wait(self):
        import torch

        torch.cuda.current_stream().wait_event(self.event)


class EventOverlap:
    """The event an async dispatch/combine returns (DeepEP's ``EventOverlap``).

    ``current_stream_wait()`` makes the current stream wait for the
    communication; ``with event:`` does the same on exit. Holds what the
    queued kernels still use (their parameter records) until then.
    """

    def __init__(self, event: EventHandle | None = None, extra=None):
        self.event = event
        self._extra = extra
        self._hooks = []

    def current_stream_wait(self, release_handle: bool = False):
        if self.event is not None:
            self.event.current_stream_wait()
        for hook in self._hooks:
            hook()
        self._hooks.clear()
        if release_handle:
            self.event, self._extra = None, None

    def register_hook_after_wait(self, hook):
        self._hooks.append(hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()
        return False


@dataclasses.dataclass(eq=False)
class EPHandle:
    """What a dispatch leaves for the combine and for cached dispatches.

    The fields are DeepEP's (§1.6). In a virtual world each rank gets its own
    handle; they share the dispatch they came from.
    """

    do_expand: bool
    num_experts: int
    expert_alignment: int
    num_max_tokens_per_rank: int
    num_sms: int
    topk_idx: Any
    num_recv_tokens: int
    num_expanded_tokens: int
    num_recv_tokens_per_expert_list: list
    psum_num_recv_tokens_per_scaleup_rank: Any
    psum_num_recv_tokens_per_expert: Any
    num_unaligned_recv_tokens_per_expert: Any
    recv_src_metadata: Any
    dst_buffer_slot_idx: Any
    # epic's own: the buffer, the rank, the full-size handle tensors the
    # kernels address and the dtype the dispatch moved.
    _buffer: Any = dataclasses.field(default=None, repr=False)
    _rank: int = 0
    _full: dict = dataclasses.field(default_factory=dict, repr=False)
    _dtype: str = ""
    _num_scale_packs: int = 0
    _hidden: int = 0
    _row_order: Any = None  # deterministic buffers: received row -> row the kernels wrote


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name, value, low, high=None):
    if not _is_int(value):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


class ElasticBuffer:
    """DeepEP V2's ElasticBuffer: dispatch and combine of MoE tokens.

    ``group`` is a ``torch.distributed`` process group (NCCL backend) or an
    :class:`epic.VirtualWorld`. The other arguments are DeepEP's; see
    ``get_buffer_size_hint`` for ``num_bytes``. epic-specific keywords:
    ``num_sms`` (the most SMs, i.e. blocks per rank, any call may use; default
    the analytic choice, capped so a virtual world fits on the GPU) and
    ``cache_dir`` (the kernel cache, default ``$EPIC_CACHE_DIR`` or
    ``~/.cache/epic``).
    """

    def __init__(
        self,
        group,
        num_bytes: int | None = None,
        num_cpu_bytes: int = 0,
        num_max_tokens_per_rank: int = 0,
        hidden: int = 0,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        deterministic: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
        prefer_overlap_with_compute: bool = True,
        sl_idx: int = 3,
        num_allocated_qps: int = 0,
        num_cpu_timeout_secs: int = 300,
        num_gpu_timeout_secs: int = 100,
        explicitly_destroy: bool = False,
        *,
        num_sms: int = 0,
        cache_dir: str | None = None,
    ):
        self.group = group
        self.virtual = isinstance(group, VirtualWorld)
        if self.virtual:
            self.num_ranks, self.rank_idx = group.num_ranks, 0
        else:
            try:
                self.num_ranks, self.rank_idx = group.size(), group.rank()
            except AttributeError:
                raise TypeError(
                    "group: expected a torch.distributed ProcessGroup or an epic.VirtualWorld, "
                    f"got {type(group).__name__}"
                ) from None
        _check_int("num_max_tokens_per_rank", num_max_tokens_per_rank, 0)
        _check_int("hidden", hidden, 0)
        _check_int("num_topk", num_topk, 0, _MAX_TOPK)
        _check_int("num_cpu_bytes", num_cpu_bytes, 0)
        _check_int("num_allocated_qps", num_allocated_qps, 0)
        _check_int("num_sms", num_sms, 0)
        if not isinstance(num_gpu_timeout_secs, (int, float)) or not 0 < num_gpu_timeout_secs <= 2e6:
            raise ValueError("num_gpu_timeout_secs: must be a positive number of seconds, got "
                             f"{num_gpu_timeout_secs!r}")
        if num_cpu_bytes:
            raise ValueError(
                "num_cpu_bytes: host-memory (Engram) storage is not supported by epic; pass 0"
            )
        if not allow_multiple_reduction:
            raise ValueError(
                "allow_multiple_reduction: epic's combine reduces an expanded rank's rows "
                "once before sending them (DeepEP's default); False is not supported"
            )
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.allow_hybrid_mode = allow_hybrid_mode
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        self.explicitly_destroy = explicitly_destroy
        self.num_gpu_timeout_secs = num_gpu_timeout_secs
        self.num_cpu_timeout_secs = num_cpu_timeout_secs
        self.sl_idx = sl_idx
        # One NVLink domain (direct mode): scale-up is the whole world.
        self.num_scaleout_ranks, self.num_scaleup_ranks = 1, self.num_ranks
        self.scaleout_rank_idx, self.scaleup_rank_idx = 0, self.rank_idx
        self.num_rdma_ranks, self.num_nvlink_ranks = 1, self.num_ranks
        self.num_allocated_qps = num_allocated_qps or 17
        if num_bytes is None:
            if not num_max_tokens_per_rank or not hidden:
                raise ValueError(
                    "num_bytes: give it, or give num_max_tokens_per_rank and hidden so that "
                    "get_buffer_size_hint can size the buffer"
                )
            num_bytes = self.get_buffer_size_hint(
                group, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch,
                allow_hybrid_mode, allow_multiple_reduction,
            )
        _check_int("num_bytes", num_bytes, 1)
        if num_bytes % (2 * _MIB):
            raise ValueError(f"num_bytes: must be a multiple of 2 MiB, got {num_bytes}")
        self.num_bytes = num_bytes
        self._requested_sms = num_sms
        self._cache_dir = cache_dir or ""
        self._state = None  # the C++ buffer, made on first use in a virtual world
        self._comm_stream = None
        self._in_flight = collections.deque(maxlen=16)  # prepared launches still queued
        self._destroyed = False
        if not self.virtual:
            self._create()

    # --- the C++ state ---------------------------------------------------------------------

    def _device_sms(self) -> int:
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    def _create(self):
        C = _C()
        if C.cuda_device_count() == 0:
            raise RuntimeError(
                "epic.ElasticBuffer: no CUDA device here; the arguments were checked, nothing ran "
                "(examples/quickstart.py shows what works without a GPU)"
            )
        import torch

        if self.virtual and self.group.device is not None:
            torch.cuda.set_device(self.group.device)
        runtime = C.Runtime("virtual" if self.virtual else "nccl", self._cache_dir, "")
        sms = self._requested_sms or self.get_theoretical_num_sms(256, 8)
        if self.virtual:  # every virtual rank's blocks are resident at once
            sms = max(1, min(sms, self._device_sms() // self.num_ranks))
        if self.virtual:
            state = C.Buffer.virtual_world(runtime, self.num_ranks, self.num_bytes, sms)
        else:
            comm_ptr = self._pytorch_comm()
            unique_id = b"" if comm_ptr else self._broadcast_unique_id(C)
            state = C.Buffer.nccl(runtime, self.num_ranks, self.rank_idx, unique_id, comm_ptr,
                                  self.num_bytes, sms)
            self.nccl_comm_source = "pytorch" if comm_ptr else "new"
        self._state = state
        self._comm_stream = torch.cuda.Stream(priority=-1)
        if not self.virtual:
            torch.cuda.synchronize()
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def _pytorch_comm(self) -> int:
        """PyTorch's NCCL communicator of the group, if every rank can reuse it
        (DeepEP does the same; EPIC_REUSE_NCCL_COMM=0 makes a new one)."""
        import torch
        import torch.distributed as dist

        ptr = 0
        if os.environ.get("EPIC_REUSE_NCCL_COMM", "1") != "0":
            dist.barrier(group=self.group)  # PyTorch creates its communicator lazily
            try:
                backend = self.group._get_backend(torch.device("cuda", torch.cuda.current_device()))
                ptr = int(backend._comm_ptr())
            except (AttributeError, RuntimeError, TypeError):
                ptr = 0
        everyone = torch.tensor([1 if ptr else 0], device="cuda")
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN, group=self.group)
        return ptr if int(everyone.item()) else 0

    def _broadcast_unique_id(self, C) -> bytes:
        import torch.distributed as dist

        box = [C.nccl_unique_id() if self.rank_idx == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def _runtime(self):
        if self._destroyed:
            raise RuntimeError("this ElasticBuffer was destroyed")
        if self._state is None:
            self._create()
        return self._state

    # --- models ----------------------------------------------------------------------------

    @staticmethod
    def get_buffer_size_hint(group, num_max_tokens_per_rank: int, hidden: int, num_topk: int = 0,
                             use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
                             allow_multiple_reduction: bool = True) -> int:
        """Bytes the buffer needs (2 MiB aligned): DeepEP's formula (§3.3), or
        more where epic's kernels need a larger window (small worlds: their
        combine stages K records per token, DeepEP's min(R, K))."""
        ranks = group.num_ranks if isinstance(group, VirtualWorld) else group.size()
        _check_int("num_max_tokens_per_rank", num_max_tokens_per_rank, 1)
        _check_int("hidden", hidden, 1)
        _check_int("num_topk", num_topk, 0, _MAX_TOPK)
        return _C().buffer_size_hint(1, ranks, allow_hybrid_mode, num_max_tokens_per_rank,
                                     hidden, num_topk, use_fp8_dispatch,
                                     allow_multiple_reduction)

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, num_scaleout_topk: int = 0,
                                rdma_gbs: float = 0, nvlink_gbs: float = 0,
                                sm_read_gbs: float = 200, sm_write_gbs: float = 50) -> int:
        """DeepEP's analytic SM count (§3.1); NVLink at 0.9 x 900 GB/s unless given."""
        return _C().theoretical_num_sms(
            self.num_scaleout_ranks, self.num_scaleup_ranks, self.allow_hybrid_mode, num_experts,
            num_topk, rdma_gbs, nvlink_gbs or 0.9 * 900, 132, self.prefer_overlap_with_compute,
            sm_read_gbs, sm_write_gbs,
        )

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        return _C().theoretical_num_qps(self.num_scaleout_ranks, self.num_scaleup_ranks,
                                        self.allow_hybrid_mode, num_sms, self.num_allocated_qps)

    def get_physical_domain_size(self):
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self):
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    @staticmethod
    def capture() -> EventHandle:
        return EventHandle()

    def get_comm_stream(self):
        self._runtime()
        return self._comm_stream

    def window_tensor(self, rank: int | None = None):
        """epic: a rank's symmetric window as a CUDA ``uint8`` tensor that aliases it (no copy):
        the bytes @epic.jit kernels address from window offset 0. Any rank of a virtual world;
        this process's own rank with torch.distributed. Valid until :meth:`destroy`."""
        if self.virtual:
            _check_int("rank", 0 if rank is None else rank, 0, self.num_ranks - 1)
        state = self._runtime()
        import torch

        if self.virtual:
            served = 0 if rank is None else rank
        else:
            if rank not in (None, self.rank_idx):
                raise ValueError(f"rank: a process reads its own window ({self.rank_idx}), "
                                 f"got {rank}")
            served = 0

        class _Window:  # the CUDA array interface: torch wraps the memory without copying
            __cuda_array_interface__ = {"shape": (state.window_bytes,), "typestr": "|u1",
                                        "data": (state.window_address(served), False),
                                        "version": 3, "strides": None}

        return torch.as_tensor(_Window(), device="cuda")

    def time_kernels(self, on: bool = True):
        """epic: per-kernel timing without a profiler. While on, every kernel this buffer
        launches (outside CUDA-graph capture) is bracketed by CUDA events; :meth:`kernel_times`
        returns them. Costs a few microseconds per launch, so it is off by default."""
        self._runtime().set_kernel_timing(bool(on))

    def kernel_times(self):
        """epic: ``[(kernel name, seconds)]`` of the kernels timed since the last call, in
        launch order (waits for them to finish)."""
        return self._runtime().take_kernel_times()

    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False,
                sequential: bool = True):
        import torch

        state = self._runtime()
        stream = self._comm_stream if use_comm_stream else torch.cuda.current_stream()
        if with_cpu_sync:
            with _device_wait_reports():
                torch.cuda.synchronize()
        if use_comm_stream:
            stream.wait_stream(torch.cuda.current_stream())
        state.barrier(stream.cuda_stream)
        if use_comm_stream:
            torch.cuda.current_stream().wait_stream(stream)
        if with_cpu_sync:
            with _device_wait_reports():
                torch.cuda.synchronize()

    def destroy(self):
        if self._destroyed:
            return
        if self._state is not None:
            import torch

            with _device_wait_reports():
                torch.cuda.synchronize()
            self._in_flight.clear()
            self._state.destroy()
        self._state, self._destroyed = None, True

    # --- argument handling -----------------------------------------------------------------

    def _per_rank(self, name, value, *, optional=False):
        """`value` as a list with one entry per rank this process serves."""
        if value is None and optional:
            return [None] * self.num_ranks if self.virtual else [None]
        if not self.virtual:
            return [value]
        if not isinstance(value, list):  # tuples are (data, scale_packs) or bias pairs
            raise TypeError(
                f"{name}: in a virtual world of {self.num_ranks} ranks pass a list with one entry "
                f"per rank, got {type(value).__name__}"
            )
        if len(value) != self.num_ranks:
            raise ValueError(
                f"{name}: expected one entry per rank ({self.num_ranks}), got {len(value)}"
            )
        return list(value)

    def _ranks_out(self, values):
        return values if self.virtual else values[0]

    @staticmethod
    def _tensor(name, t, dtypes, ndim):
        if not T.is_tensor(t):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        dtype = T.dtype_name(t)
        if dtype not in dtypes:
            raise TypeError(f"{name}: dtype must be {' or '.join(dtypes)}, got {T.describe(t)}")
        if len(t.shape) != ndim:
            raise ValueError(f"{name}: expected a {ndim}-D tensor, got {T.describe(t)}")
        if not T.is_contiguous(t):
            raise ValueError(f"{name}: must be contiguous, call .contiguous() first")
        return dtype

    def _check_device(self, named):
        """Last check: every tensor on this process's CUDA device."""
        for name, t in named:
            if t is not None and not T.is_cuda(t):
                raise ValueError(f"{name}: must be a CUDA tensor, got {T.describe(t)}")

    def _check_handle(self, handles):
        for r, h in enumerate(handles):
            name = f"handle[{r}]" if self.virtual else "handle"
            if not isinstance(h, EPHandle):
                raise TypeError(f"{name}: expected an EPHandle from dispatch, got {type(h).__name__}")
            if h._buffer is not self:
                raise ValueError(f"{name}: comes from another ElasticBuffer")
            if h._rank != (r if self.virtual else self.rank_idx):
                raise ValueError(f"{name}: is rank {h._rank}'s handle, passed for rank {r}")

    def _spec(self, ranks, experts, topk, hidden, dtype, packs, alignment, expand, tmax):
        spec = dict(num_ranks=ranks, num_experts=experts, num_topk=topk, hidden=hidden,
                    dtype=dtype, num_scale_packs=packs, expert_alignment=alignment,
                    do_expand=bool(expand), num_max_tokens_per_rank=tmax)
        if self.num_gpu_timeout_secs != 100:  # DeepEP's default is the compiler's
            spec["timeout_ms"] = int(self.num_gpu_timeout_secs * 1000)
        return spec

    def _streams(self, previous_event, allocate_on_comm_stream):
        import torch

        compute = torch.cuda.current_stream()
        comm = self._comm_stream
        if previous_event is not None:
            if not isinstance(previous_event, EventHandle):
                raise TypeError("previous_event: expected an EventHandle (ElasticBuffer.capture())")
            comm.wait_event(previous_event.event)
        else:
            comm.wait_stream(compute)
        return compute, comm, (comm if allocate_on_comm_stream else compute)

    def _finish(self, compute, comm, prepared, async_with_compute_stream, tensors):
        """DeepEP's stream epilogue: an event, or the compute stream waits."""
        self._in_flight.append(prepared)
        if not async_with_compute_stream:
            compute.wait_stream(comm)
            return EventOverlap(None)
        for t in tensors:
            if t is not None and T.is_torch(t):
                t.record_stream(comm)
                t.record_stream(compute)
        return EventOverlap(EventHandle(_record(comm)), extra=prepared)

    # --- dispatch --------------------------------------------------------------------------

    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                 num_experts=None, num_max_tokens_per_rank=None, expert_alignment=None,
                 num_sms: int = 0, num_qps: int = 0, previous_event=None,
                 previous_event_before_epilogue=None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False, handle=None, do_handle_copy: bool = True,
                 do_cpu_sync=None, do_expand: bool = False, do_zero_padding: bool = False,
                 use_tma_aligned_col_major_sf: bool = False, _gemm=None):
        """Sends every token to the ranks that own its top-k experts (§1.4).

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)``;
        ``recv_x`` is a ``(data, scale_packs)`` tuple for FP8 input.
        """
        # _gemm: (per-rank expert weights, output dtype name), from dispatch_gemm.
        R = self.num_ranks
        cached = handle is not None
        xs = self._per_rank("x", x)
        handles = self._per_rank("handle", handle) if cached else None
        if cached:
            self._check_handle(handles)
            if topk_idx is not None:
                raise ValueError("topk_idx: must be None with a cached handle (the handle's "
                                 "routing is reused)")
            if cumulative_local_expert_recv_stats is not None:
                raise ValueError("cumulative_local_expert_recv_stats: not allowed in a cached "
                                 "dispatch")
            h0 = handles[0]
            for name, value, expected in (
                ("num_experts", num_experts, h0.num_experts),
                ("num_max_tokens_per_rank", num_max_tokens_per_rank, h0.num_max_tokens_per_rank),
                ("expert_alignment", expert_alignment, h0.expert_alignment),
            ):
                if value is not None and value != expected:
                    raise ValueError(f"{name}: {value} differs from the handle's {expected}")
            if do_expand != h0.do_expand:
                raise ValueError(f"do_expand: {do_expand} differs from the handle's {h0.do_expand}")
            num_experts, tmax, alignment = h0.num_experts, h0.num_max_tokens_per_rank, h0.expert_alignment
            idxs = [h.topk_idx for h in handles]
        else:
            if topk_idx is None:
                raise ValueError("topk_idx: required unless a cached handle is given")
            if num_experts is None:
                raise ValueError("num_experts: required (the global number of experts)")
            tmax = self.num_max_tokens_per_rank if num_max_tokens_per_rank is None else num_max_tokens_per_rank
            alignment = 1 if expert_alignment is None else expert_alignment
            idxs = self._per_rank("topk_idx", topk_idx)
        _check_int("num_experts", num_experts, 1, _MAX_EXPERTS)
        if num_experts % R:
            raise ValueError(f"num_experts: {num_experts} is not divisible by the {R} ranks")
        if num_experts // R > _MAX_LOCAL_EXPERTS:
            raise ValueError(f"num_experts: {num_experts // R} experts per rank, at most "
                             f"{_MAX_LOCAL_EXPERTS} are supported")
        _check_int("num_max_tokens_per_rank", tmax, 1)
        _check_int("expert_alignment", alignment, 1)
        _check_int("num_sms", num_sms, 0)
        _check_int("num_qps", num_qps, 0, self.num_allocated_qps)
        if do_zero_padding and not do_expand:
            raise ValueError("do_zero_padding: requires do_expand=True")
        if do_cpu_sync is None:
            do_cpu_sync = not cached
        if self.deterministic and not cached and not do_cpu_sync:
            raise ValueError("do_cpu_sync: a deterministic buffer sorts the received rows, which "
                             "needs their counts on the host; pass do_cpu_sync=True")
        L = num_experts // R
        weights = self._per_rank("topk_weights", topk_weights, optional=True)
        if cached and any(w is not None for w in weights):
            raise ValueError("topk_weights: a cached dispatch sends no weights")
        stats = self._per_rank("cumulative_local_expert_recv_stats",
                               cumulative_local_expert_recv_stats, optional=True)

        data, packs = [], []
        dtype = hidden = num_packs = num_topk = None
        for r in range(len(xs)):
            sfx = f"[{r}]" if self.virtual else ""
            xr = xs[r]
            if isinstance(xr, tuple):
                if len(xr) != 2:
                    raise ValueError(f"x{sfx}: an FP8 input is a (data, scale_packs) tuple")
                xr, sf = xr
            else:
                sf = None
            d = self._tensor(f"x{sfx}", xr, _ROW_DTYPES, 2)
            if dtype is not None and d != dtype:
                raise TypeError(f"x{sfx}: dtype {d} differs from rank 0's {dtype}")
            dtype = d
            tokens, h = xr.shape
            if hidden is not None and h != hidden:
                raise ValueError(f"x{sfx}: hidden size {h} differs from rank 0's {hidden}")
            hidden = h
            if tokens > tmax:
                raise ValueError(f"x{sfx}: {tokens} tokens, more than num_max_tokens_per_rank "
                                 f"({tmax})")
            fp8 = dtype.startswith("f8")
            if fp8 and sf is None:
                raise ValueError(f"x{sfx}: FP8 data needs its scale packs: pass (data, scale_packs)")
            if not fp8 and sf is not None:
                raise ValueError(f"x{sfx}: scale packs come with FP8 data only, x is {dtype}")
            if sf is not None:
                if not T.is_tensor(sf) or T.dtype_name(sf) not in ("f32", "i32"):
                    raise TypeError(f"x{sfx}: scale packs must be 4-byte (float32 or int32), got "
                                    f"{T.describe(sf)}")
                if len(sf.shape) != 2 or sf.shape[0] != tokens:
                    raise ValueError(f"x{sfx}: scale packs must be [{tokens}, P], got "
                                     f"{T.describe(sf)}")
                if num_packs is not None and sf.shape[1] != num_packs:
                    raise ValueError(f"x{sfx}: {sf.shape[1]} scale packs, rank 0 has {num_packs}")
                num_packs = sf.shape[1]
                if not T.is_contiguous(sf):
                    sf = sf.contiguous()
            idx = idxs[r]
            iname = f"topk_idx{sfx}"
            if T.is_tensor(idx) and T.dtype_name(idx) != "i64":
                raise TypeError(f"{iname}: must be int64 (epic.topk_idx_t), got {T.describe(idx)}")
            self._tensor(iname, idx, ("i64",), 2)
            if idx.shape[0] != tokens:
                raise ValueError(f"{iname}: {idx.shape[0]} rows for {tokens} tokens in x{sfx}")
            k = idx.shape[1]
            if not 1 <= k <= _MAX_TOPK or k > num_experts:
                raise ValueError(f"{iname}: top-k {k} must be in [1, min(32, num_experts)]")
            if num_topk is not None and k != num_topk:
                raise ValueError(f"{iname}: top-k {k} differs from rank 0's {num_topk}")
            num_topk = k
            if weights[r] is not None:
                self._tensor(f"topk_weights{sfx}", weights[r], ("f32",), 2)
                if tuple(weights[r].shape) != (tokens, k):
                    raise ValueError(f"topk_weights{sfx}: must be [{tokens}, {k}], got "
                                     f"{T.describe(weights[r])}")
            if stats[r] is not None:
                self._tensor(f"cumulative_local_expert_recv_stats{sfx}", stats[r], ("i32",), 1)
                if stats[r].shape[0] != L:
                    raise ValueError(f"cumulative_local_expert_recv_stats{sfx}: must be [{L}], got "
                                     f"{T.describe(stats[r])}")
            data.append(xr)
            packs.append(sf)
        if (weights[0] is None) != all(w is None for w in weights):
            raise ValueError("topk_weights: give them for every rank or for none")
        esize = {"bf16": 2, "f16": 2, "f32": 4}.get(dtype, 1)
        if hidden * esize % 16:
            raise ValueError(f"x: a row of {hidden} x {esize} bytes is not a multiple of 16 bytes")
        if use_tma_aligned_col_major_sf and num_packs is None:
            raise ValueError("use_tma_aligned_col_major_sf: needs FP8 input with scale packs")
        if not cached:
            for r, idx in enumerate(idxs):  # values: only where they can be read cheaply
                if not T.is_cuda(idx) or do_cpu_sync:
                    _check_topk_values(f"topk_idx[{r}]" if self.virtual else "topk_idx", idx,
                                       num_experts)
        self._check_device(
            [(f"x[{r}]", t) for r, t in enumerate(data)]
            + [(f"x[{r}] scale packs", t) for r, t in enumerate(packs)]
            + [(f"topk_idx[{r}]", t) for r, t in enumerate(idxs)]
            + [(f"topk_weights[{r}]", t) for r, t in enumerate(weights)]
            + [(f"cumulative_local_expert_recv_stats[{r}]", t) for r, t in enumerate(stats)]
        )
        if num_sms and num_sms > self._runtime().blocks_per_rank:
            raise ValueError(f"num_sms: {num_sms} is more than this buffer was created for "
                             f"({self._runtime().blocks_per_rank}); pass num_sms= to the "
                             "constructor")

        import torch

        state = self._runtime()
        spec = self._spec(R, num_experts, num_topk, hidden, dtype, num_packs or 0, alignment,
                          do_expand, tmax)
        variant = dict(weights=weights[0] is not None, cached=cached, zero_padding=do_zero_padding)
        if _gemm is not None:
            variant.update(n=int(_gemm[0][0].shape[2]), out_dtype=_gemm[1])
        rows = _C().receive_rows(spec)
        compute, comm, alloc = self._streams(previous_event, allocate_on_comm_stream)
        device = data[0].device
        K = num_topk
        outputs, calls = [], []
        with torch.cuda.stream(alloc):
            for r in range(len(data)):
                tokens = data[r].shape[0]
                o = dict(recv_x=torch.empty((rows, hidden), dtype=data[r].dtype, device=device),
                         host_counts=torch.empty((1 + L,), dtype=torch.int32, device=device))
                if num_packs:
                    o["recv_x_scale_packs"] = torch.empty((rows, num_packs), dtype=packs[r].dtype,
                                                          device=device)
                if not do_expand:
                    o["recv_topk_idx"] = torch.empty((rows, K), dtype=torch.int64, device=device)
                if variant["weights"]:
                    shape = (rows,) if do_expand else (rows, K)
                    o["recv_topk_weights"] = torch.empty(shape, dtype=torch.float32, device=device)
                if _gemm is not None:  # padding rows of the GEMM's output stay zero
                    o["gemm_out"] = torch.zeros((rows, variant["n"]), device=device, dtype={
                        "bf16": torch.bfloat16, "f16": torch.float16,
                        "f32": torch.float32}[variant["out_dtype"]])
                if cached:
                    full = handles[r]._full
                else:
                    idx = idxs[r].clone() if do_handle_copy else idxs[r]
                    full = dict(
                        topk_idx=idx,
                        dst_buffer_slot_idx=torch.empty((tokens, K), dtype=torch.int32, device=device),
                        recv_src_metadata=torch.empty((R * tmax, K + 2), dtype=torch.int32,
                                                      device=device),
                        psum_num_recv_tokens_per_rank=torch.empty((R,), dtype=torch.int32,
                                                                  device=device),
                        num_recv_tokens_per_expert=torch.empty((L,), dtype=torch.int32, device=device),
                        psum_num_recv_tokens_per_expert=torch.empty((L,), dtype=torch.int32,
                                                                    device=device),
                    )
                o["_full"] = full
                outputs.append(o)
                call = {name: T.to_runtime(t) for name, t in o.items() if name != "_full"}
                if "recv_x_scale_packs" in o:
                    call["recv_x_scale_packs"] = T.to_runtime(o["recv_x_scale_packs"], "f32")
                call.update({name: T.to_runtime(t) for name, t in full.items()})
                call["x"] = T.to_runtime(data[r])
                call["x_scale_packs"] = T.to_runtime(packs[r], "f32") if packs[r] is not None else None
                call["topk_weights"] = T.to_runtime(weights[r])
                if _gemm is not None:
                    call["experts"] = T.to_runtime(_gemm[0][r])
                calls.append(call)
        if _gemm is not None:
            prepared = state.prepare_dispatch_gemm(spec, variant, calls, num_sms)
        else:
            prepared = state.prepare_dispatch(spec, variant, calls, num_sms)
        if previous_event_before_epilogue is not None:
            comm.wait_event(previous_event_before_epilogue.event)
        state.launch(prepared, comm.cuda_stream)

        # Exact sizes: a cached dispatch knows them from its handle; otherwise
        # they are read back (CPU sync) or the outputs keep the worst case.
        counts = None
        if cached:
            counts = [[h.num_recv_tokens] + list(h.num_recv_tokens_per_expert_list) for h in handles]
        elif do_cpu_sync:
            with torch.cuda.stream(comm):  # after the kernels that write them
                with _device_wait_reports():
                    counts = torch.stack([o["host_counts"] for o in outputs]).cpu().tolist()
        results, new_handles = [], []
        with torch.cuda.stream(comm):
            for r, o in enumerate(outputs):
                if counts is not None and counts[r][1:]:
                    n, expanded_rows = counts[r][0], sum(counts[r][1:])
                elif counts is not None:  # a cached dispatch of a handle made without CPU sync
                    n, expanded_rows = rows, rows
                else:
                    n = R * tmax
                    expanded_rows = rows
                out_rows = expanded_rows if do_expand else n
                full = o["_full"]
                rows_of = {name: o[name][:out_rows] for name in
                           ("recv_x", "recv_x_scale_packs", "recv_topk_idx", "recv_topk_weights",
                            "gemm_out") if name in o}
                if "recv_topk_idx" in rows_of:
                    rows_of["recv_topk_idx"] = o["recv_topk_idx"][:n]
                order = handles[r]._row_order if cached else None
                shown_meta = full["recv_src_metadata"][:n]
                if self.deterministic and not cached:
                    order, cached_order, shown_meta = _sort_received(full, n, out_rows, do_expand,
                                                                     L, counts[r][1:])
                if order is not None:  # the rows in canonical (source) order
                    rows_of = {name: t.index_select(0, order) for name, t in rows_of.items()}
                recv_x = rows_of["recv_x"]
                if num_packs:
                    sf = rows_of["recv_x_scale_packs"]
                    if use_tma_aligned_col_major_sf:
                        sf = _tma_col_major(sf)
                    recv_x = (recv_x, sf)
                recv_idx = rows_of.get("recv_topk_idx")
                recv_w = rows_of.get("recv_topk_weights")
                if cached:
                    hd = handles[r]
                else:
                    hd = EPHandle(
                        do_expand=bool(do_expand), num_experts=num_experts,
                        expert_alignment=alignment, num_max_tokens_per_rank=tmax,
                        num_sms=num_sms or state.blocks_per_rank, topk_idx=full["topk_idx"],
                        num_recv_tokens=n, num_expanded_tokens=expanded_rows if do_expand else n,
                        num_recv_tokens_per_expert_list=list(counts[r][1:]) if counts else [],
                        psum_num_recv_tokens_per_scaleup_rank=full["psum_num_recv_tokens_per_rank"],
                        psum_num_recv_tokens_per_expert=full["psum_num_recv_tokens_per_expert"],
                        num_unaligned_recv_tokens_per_expert=full["num_recv_tokens_per_expert"],
                        recv_src_metadata=shown_meta,
                        dst_buffer_slot_idx=full["dst_buffer_slot_idx"],
                        _buffer=self, _rank=r if self.virtual else self.rank_idx, _full=full,
                        _dtype=dtype, _num_scale_packs=num_packs or 0, _hidden=hidden,
                        _row_order=cached_order if self.deterministic else None,
                    )
                if stats[r] is not None:
                    stats[r].add_(full["num_recv_tokens_per_expert"])
                results.append((recv_x, recv_idx, recv_w, rows_of.get("gemm_out")))
                new_handles.append(hd)
        keep = [t for o in outputs for t in o.values() if T.is_torch(t)]
        event = self._finish(compute, comm, prepared, async_with_compute_stream, keep)
        return (
            self._ranks_out([r[0] for r in results]),
            self._ranks_out([r[1] for r in results]),
            self._ranks_out([r[2] for r in results]),
            self._ranks_out(new_handles),
            event,
        ) + ((self._ranks_out([r[3] for r in results]),) if _gemm is not None else ())

    def dispatch_gemm(self, x, topk_idx, experts, topk_weights=None, num_experts=None,
                      expert_alignment=None, out_dtype=None, num_sms: int = 0,
                      do_zero_padding: bool = False, do_cpu_sync: bool = True):
        """epic: an expanded dispatch fused with the expert GEMM on its rows: the compiler's
        ``ep-fuse-dispatch-gemm`` schedule, where each GEMM tile starts as soon as its rows are
        in place instead of after the whole dispatch.

        ``experts``: every rank's local expert weights ``[E / R, hidden, N]`` (the dispatch's
        dtype, bf16 or f16; N a multiple of 128, hidden of 64). Returns ``(recv_x,
        recv_topk_weights, gemm_out, handle, event)``, the same as ``dispatch(...,
        do_expand=True)`` followed by :meth:`grouped_gemm` (``gemm_out`` rows follow
        ``recv_x``'s; padding rows are zero).
        """
        ws = self._per_rank("experts", experts)
        xs = self._per_rank("x", x)
        out_name = None
        for r, (xr, wr) in enumerate(zip(xs, ws)):
            sfx = f"[{r}]" if self.virtual else ""
            if isinstance(xr, tuple):
                raise TypeError(f"x{sfx}: the fused dispatch + GEMM takes bf16 or f16 rows, not "
                                "FP8 with scale packs")
            dtype = self._tensor(f"x{sfx}", xr, ("bf16", "f16"), 2)
            self._tensor(f"experts{sfx}", wr, (dtype,), 3)
            if tuple(wr.shape) != tuple(ws[0].shape):
                raise ValueError(f"experts{sfx}: every rank's experts have the same shape")
            out_name = dtype if out_dtype is None else {
                "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16",
                "float32": "f32", "f32": "f32"}.get(str(out_dtype).replace("torch.", ""))
            if out_name is None:
                raise TypeError(f"out_dtype: bf16, f16 or float32, got {out_dtype!r}")
        recv_x, _, recv_w, handle, event, gemm_out = self.dispatch(
            x, topk_idx, topk_weights, num_experts=num_experts,
            expert_alignment=expert_alignment, num_sms=num_sms, do_cpu_sync=do_cpu_sync,
            do_expand=True, do_zero_padding=do_zero_padding, _gemm=(ws, out_name))
        return recv_x, recv_w, gemm_out, handle, event

    # --- combine ---------------------------------------------------------------------------

    def combine(self, x, handle, topk_weights=None, bias=None, num_sms: int = 0, num_qps: int = 0,
                previous_event=None, previous_event_before_epilogue=None,
                async_with_compute_stream: bool = False, allocate_on_comm_stream: bool = False,
                _gemm=None):
        """Sends expert outputs back and sums them at their source (§1.5).

        Returns ``(combined_x, combined_topk_weights, event)``.
        """
        # _gemm: (per-rank GEMM inputs, per-rank expert weights), from gemm_combine; x is then
        # the GEMM's output, written by the fused kernel.
        if handle is None:
            raise ValueError("handle: required (the EPHandle of the dispatch being reversed)")
        handles = self._per_rank("handle", handle)
        self._check_handle(handles)
        xs = self._per_rank("x", x)
        weights = self._per_rank("topk_weights", topk_weights, optional=True)
        biases = self._per_rank("bias", bias, optional=True)
        _check_int("num_sms", num_sms, 0)
        _check_int("num_qps", num_qps, 0, self.num_allocated_qps)
        h0 = handles[0]
        K = h0.topk_idx.shape[1]
        terms = []
        for r, (xr, hd) in enumerate(zip(xs, handles)):
            sfx = f"[{r}]" if self.virtual else ""
            self._tensor(f"x{sfx}", xr, ("bf16",), 2)
            rows = hd.num_expanded_tokens if hd.do_expand else hd.num_recv_tokens
            if tuple(xr.shape) != (rows, hd._hidden):
                raise ValueError(f"x{sfx}: expected bf16[{rows}, {hd._hidden}] (one row per row "
                                 f"the dispatch received), got {T.describe(xr)}")
            if weights[r] is not None:
                shape = (rows,) if hd.do_expand else (rows, K)
                self._tensor(f"topk_weights{sfx}", weights[r], ("f32",), len(shape))
                if tuple(weights[r].shape) != shape:
                    raise ValueError(f"topk_weights{sfx}: must be {list(shape)}, got "
                                     f"{T.describe(weights[r])}")
            b = biases[r]
            b = () if b is None else tuple(b) if isinstance(b, (tuple, list)) else (b,)
            if len(b) > 2:
                raise ValueError(f"bias{sfx}: at most two bias tensors, got {len(b)}")
            tokens = hd.topk_idx.shape[0]
            for i, t in enumerate(b):
                self._tensor(f"bias{sfx}[{i}]", t, ("bf16",), 2)
                if tuple(t.shape) != (tokens, hd._hidden):
                    raise ValueError(f"bias{sfx}[{i}]: must be bf16[{tokens}, {hd._hidden}], got "
                                     f"{T.describe(t)}")
            terms.append(b)
        if (weights[0] is None) != all(w is None for w in weights):
            raise ValueError("topk_weights: give them for every rank or for none")
        if len({len(b) for b in terms}) > 1:
            raise ValueError("bias: every rank passes the same number of bias tensors")
        self._check_device([(f"x[{r}]", t) for r, t in enumerate(xs)]
                           + [(f"topk_weights[{r}]", t) for r, t in enumerate(weights)]
                           + [(f"bias[{r}]", t) for r, b in enumerate(terms) for t in b])

        import torch

        state = self._runtime()
        spec = self._spec(self.num_ranks, h0.num_experts, K, h0._hidden, h0._dtype,
                          h0._num_scale_packs, h0.expert_alignment, h0.do_expand,
                          h0.num_max_tokens_per_rank)
        variant = dict(weights=weights[0] is not None, biases=len(terms[0]))
        compute, comm, alloc = self._streams(previous_event, allocate_on_comm_stream)
        outs, calls = [], []
        with torch.cuda.stream(alloc):
            for r, hd in enumerate(handles):
                tokens = hd.topk_idx.shape[0]
                device = xs[r].device
                o = dict(combined_x=torch.empty((tokens, hd._hidden), dtype=torch.bfloat16,
                                                device=device))
                if variant["weights"]:
                    o["combined_topk_weights"] = torch.empty((tokens, K), dtype=torch.float32,
                                                             device=device)
                outs.append(o)
                call = {name: T.to_runtime(t) for name, t in o.items()}
                call.update({name: T.to_runtime(t) for name, t in hd._full.items()})
                call["x"] = T.to_runtime(xs[r])
                call["topk_weights"] = T.to_runtime(weights[r])
                for i, t in enumerate(terms[r]):
                    call[f"bias_{i}"] = T.to_runtime(t)
                calls.append(call)
        if _gemm is not None:
            for r, call in enumerate(calls):
                call["lhs"] = T.to_runtime(_gemm[0][r])
                call["weights"] = T.to_runtime(_gemm[1][r])
            prepared = state.prepare_gemm_combine(spec, variant["biases"], calls, num_sms)
        else:
            prepared = state.prepare_combine(spec, variant, calls, num_sms)
        if previous_event_before_epilogue is not None:
            comm.wait_event(previous_event_before_epilogue.event)
        state.launch(prepared, comm.cuda_stream)
        keep = [t for o in outs for t in o.values()]
        event = self._finish(compute, comm, prepared, async_with_compute_stream, keep)
        return (self._ranks_out([o["combined_x"] for o in outs]),
                self._ranks_out([o.get("combined_topk_weights") for o in outs]), event)

    def _expert_gemm_inputs(self, op, x, weights, handle, square=False):
        """Checks an expert GEMM's per-rank inputs: rows of an expanded dispatch and the local
        experts' matrices ``[E / R, hidden, N]`` (N = hidden when ``square``: the combine
        sends hidden-wide rows). Returns (handles, xs, ws); raises naming the argument."""
        if handle is None:
            raise ValueError("handle: required (the EPHandle of the expanded dispatch)")
        handles = self._per_rank("handle", handle)
        self._check_handle(handles)
        xs = self._per_rank("x", x)
        ws = self._per_rank("weights", weights)
        if not handles[0].do_expand:
            raise ValueError(f"handle: {op} needs an expanded dispatch (do_expand=True): "
                             "one row per (token, local expert) pair, grouped by expert")
        L = handles[0].num_experts // self.num_ranks
        for r, (xr, wr, hd) in enumerate(zip(xs, ws, handles)):
            sfx = f"[{r}]" if self.virtual else ""
            self._tensor(f"x{sfx}", xr, ("bf16", "f16"), 2)
            if T.dtype_name(xr) != hd._dtype:
                raise TypeError(f"x{sfx}: the dispatch moved {hd._dtype} rows, got "
                                f"{T.describe(xr)}")
            if tuple(xr.shape) != (hd.num_expanded_tokens, hd._hidden):
                raise ValueError(f"x{sfx}: expected {hd._dtype}[{hd.num_expanded_tokens}, "
                                 f"{hd._hidden}] (the dispatch's recv_x), got {T.describe(xr)}")
            self._tensor(f"weights{sfx}", wr, (hd._dtype,), 3)
            if square and tuple(wr.shape) != (L, hd._hidden, hd._hidden):
                raise ValueError(f"weights{sfx}: expected {hd._dtype}[{L}, {hd._hidden}, "
                                 f"{hd._hidden}] (the combine sends hidden-wide rows), got "
                                 f"{T.describe(wr)}")
            if tuple(wr.shape[:2]) != (L, hd._hidden):
                raise ValueError(f"weights{sfx}: expected {hd._dtype}[{L}, {hd._hidden}, N], got "
                                 f"{T.describe(wr)}")
            if tuple(wr.shape) != tuple(ws[0].shape):
                raise ValueError(f"weights{sfx}: every rank's weights have the same shape")
        return handles, xs, ws

    def gemm_combine(self, x, weights, handle, bias=None, num_sms: int = 0,
                     previous_event=None, async_with_compute_stream: bool = False,
                     allocate_on_comm_stream: bool = False):
        """epic: the expert GEMM fused with the combine of its output: the compiler's
        ``ep-fuse-gemm-combine`` schedule, where each token is sent back to its source as soon
        as the GEMM tiles holding its rows are written, overlapping the send of early tiles with
        the computation of later ones.

        ``x`` is an expanded dispatch's ``recv_x`` (bf16 or f16), ``weights`` every rank's
        local expert matrices ``[E / R, hidden, hidden]`` (same dtype: the combine sends
        hidden-wide rows), ``handle`` the dispatch's. Returns ``(y, combined_x, event)``: ``y``
        is :meth:`grouped_gemm`'s bf16 output (padding rows zero) and ``combined_x`` bitwise
        what :meth:`combine` of ``y`` with the same biases returns. Combine weights are not
        taken (DeepEP applies them in the expert's epilogue, which is this GEMM's).
        """
        handles, xs, ws = self._expert_gemm_inputs("gemm_combine", x, weights, handle,
                                                   square=True)
        self._check_device([(f"x[{r}]", t) for r, t in enumerate(xs)]
                           + [(f"weights[{r}]", t) for r, t in enumerate(ws)])

        import torch

        ys = [torch.zeros((xr.shape[0], xr.shape[1]), dtype=torch.bfloat16, device=xr.device)
              for xr in xs]
        combined, _, event = self.combine(
            self._ranks_out(ys), handle, bias=bias, num_sms=num_sms,
            previous_event=previous_event, async_with_compute_stream=async_with_compute_stream,
            allocate_on_comm_stream=allocate_on_comm_stream, _gemm=(xs, ws))
        return self._ranks_out(ys), combined, event

    # --- the expert GEMM -------------------------------------------------------------------

    def grouped_gemm(self, x, weights, handle, out_dtype=None, num_sms: int = 0):
        """epic: the MoE expert GEMM on an expanded dispatch's rows (``ep.grouped_gemm``).

        ``x`` is the dispatch's ``recv_x`` (bf16 or f16, ``[rows, hidden]``), ``weights`` the
        local experts' matrices ``[E / R, hidden, N]`` (same dtype, N contiguous), ``handle``
        the dispatch's (``do_expand=True``). Each expert's rows are multiplied by its matrix
        with fp32 accumulation and rounded once to ``out_dtype`` (default: ``x``'s; bf16, f16
        or float32); padding rows are zero. On Hopper: TMA loads and wgmma, a persistent kernel
        over (expert, 64-row, 128-column) tiles; ``hidden`` must be a multiple of 64 and N of
        128. Runs on the current stream. Returns the output (a list in a virtual world).
        """
        _check_int("num_sms", num_sms, 0)
        handles, xs, ws = self._expert_gemm_inputs("grouped_gemm", x, weights, handle)
        h0 = handles[0]
        out_name = T.dtype_name(xs[0]) if out_dtype is None else {
            "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16",
            "float32": "f32", "f32": "f32"}.get(str(out_dtype).replace("torch.", ""))
        if out_name is None:
            raise TypeError(f"out_dtype: bf16, f16 or float32, got {out_dtype!r}")
        self._check_device([(f"x[{r}]", t) for r, t in enumerate(xs)]
                           + [(f"weights[{r}]", t) for r, t in enumerate(ws)])

        import torch

        state = self._runtime()
        spec = self._spec(self.num_ranks, h0.num_experts, h0.topk_idx.shape[1], h0._hidden,
                          h0._dtype, 0, h0.expert_alignment, True, h0.num_max_tokens_per_rank)
        torch_type = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
        outs, calls = [], []
        for r, hd in enumerate(handles):
            out = torch.zeros((xs[r].shape[0], ws[r].shape[2]), dtype=torch_type[out_name],
                              device=xs[r].device)
            outs.append(out)
            calls.append(dict(x=T.to_runtime(xs[r]), weights=T.to_runtime(ws[r]),
                              out=T.to_runtime(out),
                              psum_num_recv_tokens_per_expert=T.to_runtime(
                                  hd._full["psum_num_recv_tokens_per_expert"])))
        prepared = state.prepare_grouped_gemm(spec, calls, num_sms)
        state.launch(prepared, torch.cuda.current_stream().cuda_stream)
        self._in_flight.append(prepared)
        return self._ranks_out(outs)

    def __del__(self):
        if not getattr(self, "explicitly_destroy", True):
            try:
                self.destroy()
            except Exception:  # interpreter shutdown: CUDA may be gone
                pass


def _record(stream):
    import torch

    event = torch.cuda.Event()
    event.record(stream)
    return event


def _check_topk_values(name, idx, num_experts):
    """Every entry in [-1, num_experts): reads the values (a sync on a GPU)."""
    if T.is_torch(idx):
        bad = (idx < -1) | (idx >= num_experts)
        if not bool(bad.any()):
            return
        where = bad.nonzero()[0].tolist()
        value = int(idx[where[0], where[1]])
    else:
        import numpy as np

        bad = (idx < -1) | (idx >= num_experts)
        if not bad.any():
            return
        where = [int(v) for v in np.argwhere(bad)[0]]
        value = int(idx[where[0], where[1]])
    raise ValueError(f"{name}[{where[0]}][{where[1]}] = {value} is out of range: expert ids are in "
                     f"[0, {num_experts}), -1 masks a slot")


def _sort_received(full, n, rows, expand, num_local, aligned_counts):
    """Puts a rank's received rows in canonical order (by source rank, then
    token; expanded: inside each expert block, padding last) and rewrites the
    handle's metadata so that the kernels find every row where it now is.

    Returns (order of the returned rows: new -> old, the order to apply to a
    cached dispatch's rows, the metadata to show in the handle). Plain: the
    metadata rows move with the data rows (combine pairs them by index); a
    cached dispatch still writes rows in the first dispatch's slot order, so
    its rows are reordered too. Expanded: the metadata rows stay in slot order
    (a cached dispatch reads them by slot) and their row indices are remapped,
    so a cached dispatch writes straight into the sorted rows.
    """
    import torch

    meta = full["recv_src_metadata"]
    gid = meta[:n, 0].long()
    tokens = torch.argsort(gid)
    if not expand:
        meta[:n] = meta[:n].index_select(0, tokens)
        return tokens, tokens, meta[:n]
    device = meta.device
    slots = meta[:n, 2:].long()
    owner = torch.full((rows,), -1, dtype=torch.long, device=device)
    used = slots >= 0
    owner[slots[used]] = gid[:, None].expand_as(slots)[used]
    expert = torch.repeat_interleave(torch.arange(num_local, device=device),
                                     torch.tensor(aligned_counts, device=device), output_size=rows)
    position = torch.arange(rows, device=device)
    span = int(gid.max().item()) + 1 + rows if n else rows + 1
    key = expert * span + torch.where(owner >= 0, owner, span - rows + position)
    order = torch.argsort(key)
    new_of_old = torch.empty_like(order)
    new_of_old[order] = torch.arange(rows, device=device)
    meta[:n, 2:] = torch.where(slots >= 0, new_of_old[slots.clamp(min=0)], slots).to(meta.dtype)
    return order, None, meta[:n].index_select(0, tokens)


def _tma_col_major(sf):
    """Scale packs column-major with the token dimension padded to 4 (16 bytes)."""
    import torch

    rows, packs = sf.shape
    padded = (rows + 3) // 4 * 4
    storage = torch.empty((packs, padded), dtype=sf.dtype, device=sf.device)
    storage[:, :rows].copy_(sf.t())
    return storage.as_strided((rows, packs), (1, padded))

