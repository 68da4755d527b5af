"""DeepEP V2's ``ElasticBuffer`` on epic's runtime.

The same constructor, methods, arguments, defaults and return tuples as
``deep_ep.ElasticBuffer``, so a DeepEP user switches by changing the import. Two worlds:

* a ``torch.distributed`` process group (NCCL backend): one rank per process,
  tensors as in DeepEP;
* ``epic.VirtualWorld(R)``: R ranks on one GPU in one process, for
  development, tests and benchmarks. Every per-rank tensor is passed as a list
  with one entry per rank, and results come back as lists.

This layer adapts arguments (per-rank lists, FP8 tuples, torch dtypes, streams); the rules
they must follow live in the C++ runtime (``epic._C``), which checks every call of a new
signature and names each bad argument before anything runs, also on machines without a GPU.
Later calls of the signature reuse the checked plan (``epic._plans``): a call is a few
microseconds of host work and can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from . import _limits as LIM
from . import _nccl, _topology
from . import _deepep_env
from ._agrs import AgrsMethods
from ._engram import EngramMethods
from ._pp import PpMethods
from . import _tensors as T
from ._plans import OpPlan, PlanCache
from .handle import EPHandle, EventHandle, EventOverlap

# topk_idx_t (torch.int64) comes from the module __getattr__ below, so that importing this module
# does not import torch; ruff cannot see it.
__all__ = [  # noqa: F822
    "VirtualWorld", "ElasticBuffer", "EPHandle", "EventHandle", "EventOverlap", "topk_idx_t",
]

_MIB = 1 << 20
_MAX_RANKS, _MAX_TOPK = LIM.MAX_RANKS, LIM.MAX_TOPK
_MAX_BUFFER_BYTES = 1 << 40  # more than any GPU's memory: a typo, not a buffer
_MAX_REPLAYS = 64  # option sets of decode calls whose checked call a buffer replays
_GEMM_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16",
                "float32": "f32", "f32": "f32"}


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
    and come out as lists with one entry per rank. ``num_nodes`` and ``gpus_per_node``
    make it a world of several nodes (NVLink domains) of ``gpus_per_node`` ranks each,
    numbered node-major: ``VirtualWorld(num_nodes=2, gpus_per_node=4)`` is 8 ranks on 2 nodes.

    In one address space the kernels read and write other ranks' tensors in place (one pass).
    ``staged=True`` runs the kernels a world of processes runs instead, which stage every row
    in the window: a test of the NCCL path's dispatch, combine and persistent layer on one GPU,
    with as many ranks as fit (slower than one pass).
    """

    def __init__(self, num_ranks: int | None = None, device: int | None = None, *,
                 num_nodes: int = 1, gpus_per_node: int | None = None, staged: bool = False):
        if type(staged) is not bool:
            raise TypeError(f"staged: True or False, got {staged!r}")
        for name, value in (("num_ranks", num_ranks), ("gpus_per_node", gpus_per_node)):
            if value is not None and not _is_int(value):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        _check_int("num_nodes", num_nodes, 1, _MAX_RANKS)
        if num_ranks is None and gpus_per_node is None:
            raise TypeError("VirtualWorld: give num_ranks, or num_nodes and gpus_per_node")
        if gpus_per_node is not None:
            _check_int("gpus_per_node", gpus_per_node, 1, _MAX_RANKS)
            total = num_nodes * gpus_per_node
            if num_ranks is not None and num_ranks != total:
                raise ValueError(f"num_ranks: {num_ranks} != num_nodes ({num_nodes}) x "
                                 f"gpus_per_node ({gpus_per_node}) = {total}")
            num_ranks = total
        if not 1 <= num_ranks <= _MAX_RANKS:
            raise ValueError(f"num_ranks: must be in [1, {_MAX_RANKS}], got {num_ranks}")
        if num_ranks % num_nodes:
            raise ValueError(f"num_nodes: {num_nodes} does not divide num_ranks ({num_ranks}); "
                             "every node holds as many ranks")
        if device is not None and (not _is_int(device) or device < 0):
            raise ValueError(f"device: a CUDA device index >= 0 or None, got {device!r}")
        self.num_ranks = num_ranks
        self.num_nodes = num_nodes
        self.gpus_per_node = num_ranks // num_nodes
        self.device = device
        self.staged = staged

    def size(self) -> int:
        return self.num_ranks

    def __repr__(self):
        staged = ", staged=True" if self.staged else ""
        if self.num_nodes == 1:
            return f"VirtualWorld({self.num_ranks}{staged})"
        return (f"VirtualWorld(num_nodes={self.num_nodes}, gpus_per_node={self.gpus_per_node}"
                f"{staged})")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name, value, low, high=None):
    if not _is_int(value):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def _check_event(name, value):
    if value is not None and not isinstance(value, EventHandle):
        raise TypeError(f"{name}: expected an EventHandle (ElasticBuffer.capture()) or None, got "
                        f"{type(value).__name__}")


def _device_sms(device_index=None):
    """SMs of a CUDA device (the current one by default); 132, an H100/H200's, where there is
    none (sizing only: no kernel runs there)."""
    try:
        import torch
    except ImportError:
        return 132
    if not torch.cuda.is_available():
        return 132
    index = torch.cuda.current_device() if device_index is None else device_index
    return torch.cuda.get_device_properties(index).multi_processor_count


def _staging_blocks(num_nodes, num_sms, ranks_on_device):
    """The blocks per rank the size model stages for: only a world of several nodes stages
    (0 otherwise, without asking the GPU)."""
    return _blocks_per_rank(num_sms, _device_sms(), ranks_on_device) if num_nodes > 1 else 0


def _blocks_per_rank(num_sms, device_sms, ranks_on_device):
    """The most blocks per rank a buffer's calls launch: the request, else the whole GPU; a
    virtual world's ranks share the GPU (every rank's blocks are resident at once)."""
    sms = num_sms or device_sms
    return max(1, min(sms, device_sms // ranks_on_device)) if ranks_on_device > 1 else sms


def _capturing():
    import torch

    return torch.cuda.is_current_stream_capturing()


def _refuse_in_capture(what, instead):
    if _capturing():
        raise RuntimeError(f"{what} cannot be captured in a CUDA graph: {instead}")


class ElasticBuffer(AgrsMethods, EngramMethods, PpMethods):
    """DeepEP V2's ElasticBuffer: dispatch and combine of MoE tokens (and DeepEP's AGRS
    sessions: all-gather by copy engines, with a reduce-scatter, ``epic._agrs``; PP send/recv
    between ring neighbours, ``epic._pp``).

    ``group`` is a ``torch.distributed`` process group (NCCL backend) or an
    :class:`epic.VirtualWorld`. The other arguments are DeepEP's; see
    ``get_buffer_size_hint`` for ``num_bytes``. epic-specific keywords:
    ``num_sms`` (the most SMs, i.e. blocks per rank, any call may use; default
    the analytic choice, capped so a virtual world fits on the GPU),
    ``cache_dir`` (the kernel cache, default ``$EPIC_CACHE_DIR`` or
    ``~/.cache/epic``) and ``output_pool_bytes`` (the most bytes of outputs kept for reuse
    by later calls, default 1 GiB; 0 allocates every call's outputs anew).

    Calls made with ``async_with_compute_stream=False``, no ``previous_event`` and
    ``allocate_on_comm_stream=False`` (the common case) run on the current stream; the
    others follow DeepEP's stream protocol on the buffer's communication stream. Outputs come
    from a pool (see ``epic._plans``): a call's tensors are reused only once nothing references
    them any more.
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
        output_pool_bytes: int = 1 << 30,
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
        _check_int("num_max_tokens_per_rank", num_max_tokens_per_rank, 0,
                   LIM.MAX_MAX_TOKENS_PER_RANK)
        _check_int("hidden", hidden, 0, LIM.MAX_HIDDEN)
        _check_int("num_topk", num_topk, 0, _MAX_TOPK)
        _check_int("sl_idx", sl_idx, 0, 15)  # an InfiniBand service level
        for name, flag in (("use_fp8_dispatch", use_fp8_dispatch), ("deterministic", deterministic),
                           ("allow_hybrid_mode", allow_hybrid_mode),
                           ("allow_multiple_reduction", allow_multiple_reduction),
                           ("prefer_overlap_with_compute", prefer_overlap_with_compute),
                           ("explicitly_destroy", explicitly_destroy)):
            _check_bool(name, flag)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir: expected a path (str) or None, got "
                            f"{type(cache_dir).__name__}")
        _check_int("num_cpu_bytes", num_cpu_bytes, 0)
        _check_int("num_allocated_qps", num_allocated_qps, 0)
        _check_int("num_sms", num_sms, 0)
        _check_int("output_pool_bytes", output_pool_bytes, 0)
        for name, secs in (("num_gpu_timeout_secs", num_gpu_timeout_secs),
                           ("num_cpu_timeout_secs", num_cpu_timeout_secs)):
            # The kernels' wait bound is at most 2^31 ms (EPLimits.def).
            if isinstance(secs, bool) or not isinstance(secs, (int, float)) or \
                    not 0 < secs <= LIM.MAX_TIMEOUT_MS / 1000:
                raise ValueError(f"{name}: must be a positive number of seconds up to "
                                 f"{LIM.MAX_TIMEOUT_MS // 1000}, got {secs!r}")
        if num_cpu_bytes % (2 << 20):
            raise ValueError(f"num_cpu_bytes: must be a multiple of 2 MiB (2097152), got "
                             f"{num_cpu_bytes} (get_engram_storage_size_hint rounds it)")
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
        # Physical: nodes (NVLink domains) x GPUs per node. Logical: the same in hybrid mode,
        # else one domain of every rank (direct mode: every rank is every rank's peer).
        self._qps_requested = num_allocated_qps
        self._set_layout(*_topology.physical_layout(group))
        if num_bytes is None:
            if not num_max_tokens_per_rank or not hidden:
                raise ValueError(
                    "num_bytes: give it, or give num_max_tokens_per_rank and hidden so that "
                    "get_buffer_size_hint can size the buffer"
                )
            num_bytes = self._size_hint(
                self.num_rdma_ranks, self.num_nvlink_ranks, num_max_tokens_per_rank, hidden,
                num_topk, use_fp8_dispatch, allow_hybrid_mode, allow_multiple_reduction,
                _staging_blocks(self.num_rdma_ranks, num_sms,
                                self.num_ranks if self.virtual else 1),
            )
        _check_int("num_bytes", num_bytes, 1, _MAX_BUFFER_BYTES)
        if num_bytes % (2 * _MIB):
            raise ValueError(f"num_bytes: must be a multiple of 2 MiB, got {num_bytes}")
        self.num_bytes = num_bytes
        self.num_cpu_bytes = num_cpu_bytes
        self._requested_sms = num_sms
        self._cache_dir = os.fspath(cache_dir) if cache_dir is not None else ""
        self._state = None  # the C++ buffer, made on first use in a virtual world
        self._comm_stream = None
        self._device_index = None
        # dispatch_gemm / gemm_combine: the last call's fusion decision (epic._fusion.decide).
        self.last_fusion = None
        self._plans = PlanCache(output_pool_bytes)  # signature -> OpPlan, and output pools
        # window_outputs: tensors carved from the top of each served rank's window, from the
        # end down (the kernels use it from the start); reset by every such dispatch, whose
        # number (the epoch) a handle keeps, so that a stale one is refused by name.
        self._window_top, self._window_epoch, self._window_views = {}, 0, {}
        self._window_bounds = {}  # served rank -> (first, end) address of its window
        self._replays = {}  # decode-call options -> the replay of their checked call
        self._destroyed = False
        if not self.virtual:
            self._create()

    def _set_layout(self, num_nodes, gpus_per_node):
        """DeepEP's domain attributes from the physical layout (node-major ranks)."""
        self.num_rdma_ranks, self.num_nvlink_ranks = num_nodes, gpus_per_node
        self.num_scaleout_ranks, self.num_scaleup_ranks = _topology.logical_layout(
            num_nodes, gpus_per_node, self.allow_hybrid_mode)
        self.hybrid = self.num_scaleout_ranks > 1
        if self.hybrid:
            _topology.check_hybrid(num_nodes, gpus_per_node)
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        # DeepEP's default GIN contexts: 129 in hybrid mode (65 on NICs with fast RDMA atomics,
        # which needs ibstat; epic does not probe the NIC), 17 in direct mode.
        self.num_allocated_qps = self._qps_requested or (129 if self.hybrid else 17)

    # --- the C++ state ---------------------------------------------------------------------

    def _create(self):
        C = _C()
        if C.cuda_device_count() == 0:
            raise RuntimeError(
                "epic.ElasticBuffer: no CUDA device here; the arguments were checked, nothing ran "
                "(examples/quickstart.py shows what works without a GPU)"
            )
        import torch

        _refuse_in_capture("creating an ElasticBuffer (device memory, NCCL registration)",
                           "create the buffer and call it once before capturing")
        if self.virtual and self.group.device is not None:
            torch.cuda.set_device(self.group.device)
        self._device_index = torch.cuda.current_device()
        runtime = self._kernel_runtime = C.Runtime(
            "virtual" if self.virtual else "nccl", self._cache_dir, "",
            staged=self.virtual and self.group.staged)
        # The most blocks per rank any call may use: the request, else the whole GPU. A call
        # without num_sms takes the analytic count of its own experts and top-k (_call_sms).
        sms = _blocks_per_rank(self._requested_sms, _device_sms(self._device_index),
                               self.num_ranks if self.virtual else 1)
        if self.virtual:
            # The virtual world has the group's nodes: NVLink pointers to another node trap.
            state = C.Buffer.virtual_world(runtime, self.num_ranks, self.num_bytes, sms,
                                           gpus_per_node=self.num_nvlink_ranks,
                                           num_cpu_bytes=self.num_cpu_bytes)
        else:
            comm_ptr, self.nccl_comm_reason = _nccl.pytorch_comm(self.group, C)
            unique_id = b"" if comm_ptr else _nccl.broadcast_unique_id(self.group, self.rank_idx, C)
            # Collective: a split of PyTorch's communicator (epic's own, so its barriers never
            # enter PyTorch's order and it outlives the process group) or a new one; the ranks
            # then all-gather and compare num_bytes, blocks, NCCL version and SM count.
            state = C.Buffer.nccl(runtime, self.num_ranks, self.rank_idx, unique_id, comm_ptr,
                                  self.num_bytes, sms, self.num_cpu_timeout_secs,
                                  num_cpu_bytes=self.num_cpu_bytes)
            self.nccl_comm_source = "pytorch-split" if comm_ptr else "new"
            # NCCL's LSA team is the NVLink domain (it can span hosts: multi-node NVLink); the
            # ranks agreed on its size in the runtime.
            lsa = state.device_api["lsa_size"]
            if lsa != self.num_nvlink_ranks:
                self._set_layout(self.num_ranks // lsa, lsa)
        # AGRS and PP stream waits on peers' flags are reported after the GPU timeout.
        state.set_stream_wait_timeout(float(self.num_gpu_timeout_secs))
        if _deepep_env.buffer_debug():  # DeepEP's EP_BUFFER_DEBUG
            print(f"epic ElasticBuffer: {self.num_ranks} rank(s) "
                  f"({'virtual' if self.virtual else 'NCCL rank ' + str(self.rank_idx)}), "
                  f"{self.num_nvlink_ranks} per NVLink domain, num_bytes {self.num_bytes} "
                  f"(window {state.window_bytes}), num_cpu_bytes {self.num_cpu_bytes}, "
                  f"{sms} blocks per rank at most, kernel cache {runtime.cache_dir}",
                  file=sys.stderr)
        self._state = state
        self._comm_stream = torch.cuda.Stream(priority=-1)
        if not self.virtual:
            torch.cuda.synchronize()
            import torch.distributed as dist

            dist.barrier(group=self.group)

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
                             allow_multiple_reduction: bool = True,
                             num_sms: int | None = None) -> int:
        """Bytes the buffer needs (2 MiB aligned): DeepEP's formula, or more where epic's
        kernels need a larger window (small worlds: their combine stages K records per token,
        DeepEP's min(R, K); across nodes: every warp's staging of the records it puts, for
        ``num_sms`` blocks per rank, by default the buffer's: the whole current GPU)."""
        _check_int("num_max_tokens_per_rank", num_max_tokens_per_rank, 1)
        _check_int("hidden", hidden, 1)
        _check_int("num_topk", num_topk, 0, _MAX_TOPK)
        _check_bool("allow_hybrid_mode", allow_hybrid_mode)
        if num_sms is not None:
            _check_int("num_sms", num_sms, 1, LIM.MAX_NUM_SMS)
        layout = _topology.physical_layout(group)
        ranks_on_device = layout[0] * layout[1] if isinstance(group, VirtualWorld) else 1
        return ElasticBuffer._size_hint(*layout, num_max_tokens_per_rank, hidden, num_topk,
                                        use_fp8_dispatch, allow_hybrid_mode,
                                        allow_multiple_reduction,
                                        _staging_blocks(layout[0], num_sms, ranks_on_device))

    @staticmethod
    def _size_hint(nodes, per_node, tokens, hidden, topk, fp8, hybrid, multiple_reduction,
                   blocks_per_rank):
        return _C().buffer_size_hint(nodes, per_node, hybrid, tokens, hidden, topk, fp8,
                                     multiple_reduction, blocks_per_rank)

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, num_scaleout_topk: int = 0,
                                rdma_gbs: float = 0, nvlink_gbs: float = 0,
                                sm_read_gbs: float = 200, sm_write_gbs: float = 50) -> int:
        """DeepEP's analytic SM count; NVLink at 0.9 x 900 GB/s unless given; across nodes the
        network at 50 GB/s (one 400 Gb/s NIC per GPU) unless given."""
        if not rdma_gbs and self.num_rdma_ranks > 1:
            rdma_gbs = 50
        return _C().theoretical_num_sms(
            self.num_rdma_ranks, self.num_nvlink_ranks, self.allow_hybrid_mode, num_experts,
            num_topk, rdma_gbs, nvlink_gbs or 0.9 * 900, 132, self.prefer_overlap_with_compute,
            sm_read_gbs, sm_write_gbs,
        )

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        return _C().theoretical_num_qps(self.num_rdma_ranks, self.num_nvlink_ranks,
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

    def combine_input_buffer(self, handle):
        """epic: where to write the expert outputs of a dispatch made with
        ``window_outputs=True``: a bf16 ``[rows, hidden]`` tensor per rank (one row per row the
        dispatch received) in the buffer's window, which :meth:`combine` then reads in place
        (no copy into the window: each rank gathers its tokens' rows straight from their
        ranks). Like the dispatch's outputs it is valid until the next dispatch with
        ``window_outputs`` on this buffer."""
        handles = self._handles("handle", handle)
        out = []
        for r, hd in enumerate(handles):
            self._window_handle_current(hd, "handle", r)
            if getattr(hd, "_window_epoch", -1) < 0:
                raise ValueError(f"{self._name('handle', r)}: not of a dispatch with "
                                 "window_outputs=True (its rows are not in the window)")
            rows = hd.num_expanded_tokens if hd.do_expand else hd.num_recv_tokens
            out.append(self._window_allocate([("x", "bf16", (rows, hd._hidden))], hd._rank,
                                             below=self._window_top[hd._rank])["x"])
        return self._ranks_out(out)

    def _window_claim(self, per_rank):
        """A dispatch with window_outputs launches with the output set `per_rank` (the
        window's top, where every such set lies): the last one's tensors end, a later
        allocation (combine_input_buffer) goes below these."""
        self._window_epoch += 1
        self._window_top = {}
        for r, outputs in enumerate(per_rank):
            rank = r if self.virtual else self.rank_idx
            window = self._window_views[rank]
            base, size = window.data_ptr(), window.shape[0]
            self._window_top[rank] = min(t.data_ptr() - base for t in outputs.values()
                                         if 0 <= t.data_ptr() - base < size)

    def _window_allocate(self, specs, rank, like_packs=None, below=None):
        """Tensors for `specs` ([(name, runtime dtype, shape)]) in served rank `rank`'s
        window, from `below` (default: the window's end) down, 256-byte aligned."""
        window = self._window_views.get(rank)
        if window is None:
            window = self._window_views[rank] = self.window_tensor(rank if self.virtual else None)
        top = window.shape[0] if below is None else below
        planned = []
        for name, dtype, shape in specs:
            torch_dtype = (like_packs.dtype if name.endswith("scale_packs") and
                           like_packs is not None else T.torch_dtype(dtype))
            count = 1
            for n in shape:
                count *= n
            nbytes = count * torch_dtype.itemsize
            top = (top - nbytes) // 256 * 256
            planned.append((name, torch_dtype, shape, top, nbytes))
        if top < 0:  # the kernels' own region (below) is checked by the runtime at launch
            needed = window.shape[0] - top
            raise ValueError(f"window_outputs: {', '.join(p[0] for p in planned)} need "
                             f"{needed} bytes at the top of the window, which holds "
                             f"{window.shape[0]} (with the kernels' region below them): create "
                             "the buffer with a larger num_bytes")
        return {name: window[start:start + nbytes].view(torch_dtype).view(shape)
                for name, torch_dtype, shape, start, nbytes in planned}

    def _in_window(self, t, rank):
        """Whether tensor `t` lies in served rank `rank`'s window (every combine asks: the
        window's bounds are kept, not asked of the runtime each time)."""
        if not T.is_torch(t) or not t.is_cuda:
            return False
        bounds = self._window_bounds.get(rank)
        if bounds is None:
            state = self._runtime()
            base = state.window_address(rank if self.virtual else 0)
            bounds = self._window_bounds[rank] = (base, base + state.window_bytes)
        return bounds[0] <= t.data_ptr() and \
            t.data_ptr() + t.numel() * t.element_size() <= bounds[1]

    def _window_handle_current(self, hd, name, rank):
        """A handle whose tensors lie in the window must be of the last such dispatch."""
        epoch = getattr(hd, "_window_epoch", -1)
        if epoch >= 0 and epoch != self._window_epoch:
            raise ValueError(f"{self._name(name, rank)}: its tensors lie in the window "
                             "(window_outputs) and a later dispatch with window_outputs "
                             "reused that memory: use handles of the last such dispatch")

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
            _refuse_in_capture("barrier(with_cpu_sync=True)", "pass with_cpu_sync=False")
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
            self._plans.clear()  # the plans and their pooled outputs
            self._replays.clear()
            self._window_views.clear()
            self._window_bounds.clear()
            self._state.destroy()
        self._state, self._destroyed = None, True

    # --- argument adaptation ---------------------------------------------------------------

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

    def _replay_ranks(self, a, b, optional):
        """A replayed call's two per-rank arguments and an optional one as lists of one entry
        per rank served, or None where they are not (the checked path says what is wrong)."""
        if not self.virtual:
            return [a], [b], [optional]
        R = self.num_ranks
        c = [None] * R if optional is None else optional
        if type(a) is not list or type(b) is not list or type(c) is not list or \
                len(a) != R or len(b) != R or len(c) != R:
            return None
        return a, b, c

    def _ranks_out(self, values):
        return values if self.virtual else values[0]

    def _name(self, name, r):
        return f"{name}[{r}]" if self.virtual else name

    def _dtype(self, t, name, r=0, allowed=None):
        """The runtime's name of tensor `t`'s element type, or TypeError naming it (argument
        `name` of rank `r`, formatted only for the error)."""
        dtype = T.dtype_name(t) if T.is_tensor(t) else None
        if dtype is None or (allowed and dtype not in allowed):
            if not T.is_tensor(t):
                raise TypeError(f"{self._name(name, r)}: expected a tensor, got "
                                f"{type(t).__name__}")
            raise TypeError(f"{self._name(name, r)}: dtype must be "
                            f"{' or '.join(allowed or T.RUNTIME_DTYPES)}, got {T.describe(t)}")
        return dtype

    def _handles(self, name, handle):
        handles = self._per_rank(name, handle)
        for r, h in enumerate(handles):
            label = self._name(name, r)
            if not isinstance(h, EPHandle):
                raise TypeError(
                    f"{label}: expected an EPHandle from dispatch, got {type(h).__name__}")
            if h._buffer is not self:
                raise ValueError(f"{label}: comes from another ElasticBuffer")
            if h._rank != (r if self.virtual else self.rank_idx):
                raise ValueError(f"{label}: is rank {h._rank}'s handle, passed for rank {r}")
        return handles

    def _spec(self, ranks, experts, topk, hidden, dtype, packs, alignment, expand, tmax):
        spec = dict(num_ranks=ranks, num_experts=experts, num_topk=topk, hidden=hidden,
                    dtype=dtype, num_scale_packs=packs, expert_alignment=alignment,
                    do_expand=bool(expand), num_max_tokens_per_rank=tmax)
        if self.num_rdma_ranks > 1:  # one node: the defaults, so kernel keys stay as they were
            spec["num_scaleup_ranks"] = self.num_nvlink_ranks
            spec["hybrid"] = self.hybrid
        if self.num_gpu_timeout_secs != 100:  # DeepEP's default is the compiler's
            spec["timeout_ms"] = int(self.num_gpu_timeout_secs * 1000)
        return spec

    # --- plans: the call machinery ---------------------------------------------------------

    def _plan(self, key, kind, spec, variant, pairs, num_sms, make_outputs):
        """The plan of signature `key` (None: not cacheable), checked with the call's inputs
        (`pairs`: per rank, (slot name, tensor) pairs) and a first set of outputs: the C++
        runtime checks them all, naming each bad one, also on a machine without a GPU (then
        says nothing ran). The first outputs become the plan's first pooled set."""
        C = _C()
        outputs = make_outputs()
        runtime_calls = [{name: T.to_runtime(t, "f32" if name.endswith("scale_packs") else None)
                          for name, t in list(p) + list(o.items()) if t is not None}
                         for p, o in zip(pairs, outputs)]
        if C.cuda_device_count() == 0:  # check what can be checked, then say why nothing ran
            C.check(kind, spec, variant, runtime_calls)
        state = self._runtime()
        # The stream only decides whether loading kernels is refused (while capturing).
        stream = self._current_stream()
        sms = num_sms or self._call_sms(spec, state.blocks_per_rank)
        if _deepep_env.dump_ptx() or _deepep_env.dump_sass():  # DeepEP's EP_JIT_DUMP_*
            _deepep_env.note_kernels(self._kernel_runtime, kind, spec, variant)
        plan = OpPlan(state.plan(kind, spec, variant, runtime_calls, sms, stream), C.slots(kind),
                      make_outputs, outputs, sms=sms)
        if key is not None:
            self._plans.add(key, plan)
        return plan

    def _remember(self, key, replay):
        """Keeps `replay` for calls with options `key` (a bounded number of option sets: the
        oldest is forgotten first) and returns it."""
        if key not in self._replays and len(self._replays) >= _MAX_REPLAYS:
            self._replays.pop(next(iter(self._replays)))
        self._replays[key] = replay
        return replay

    def _current_stream(self):
        """The raw handle of the current CUDA stream of this buffer's device."""
        import torch

        return torch._C._cuda_getCurrentRawStream(self._device_index)

    def _call_sms(self, spec, most):
        """Blocks per rank of a call without num_sms: DeepEP's analytic count for the call's
        experts and top-k, at most `most` (the buffer's). A configuration the model cannot
        take gets `most`: the runtime's checks then name what is wrong with it."""
        try:
            analytic = self.get_theoretical_num_sms(spec["num_experts"], spec["num_topk"])
        except ValueError:
            return most
        return max(1, min(most, analytic))

    def _stream(self, previous_event, allocate_on_comm_stream, async_with_compute_stream,
                previous_event_before_epilogue=None):
        """(launch stream handle, (compute, comm) torch streams or None): the current stream
        for a plain synchronous call; else DeepEP's protocol on the communication stream."""
        import torch

        if not async_with_compute_stream and previous_event is None and \
                previous_event_before_epilogue is None and not allocate_on_comm_stream:
            return self._current_stream(), None
        compute = torch.cuda.current_stream()
        comm = self._comm_stream
        if previous_event is not None:  # an EventHandle: the calls check it (_check_event)
            comm.wait_event(previous_event.event)
        else:
            comm.wait_stream(compute)
        if previous_event_before_epilogue is not None:
            comm.wait_event(previous_event_before_epilogue.event)
        return comm.cuda_stream, (compute, comm)

    def _finish(self, streams, async_with_compute_stream, outputs):
        """DeepEP's stream epilogue: an event, or the compute stream waits. `outputs`: the
        call's output set (its tensors are recorded on both streams in async mode)."""
        if streams is None:
            return EventOverlap(None)
        compute, comm = streams
        if not async_with_compute_stream:
            compute.wait_stream(comm)
            return EventOverlap(None)
        if _deepep_env.avoid_record_stream():  # DeepEP's EP_AVOID_RECORD_STREAM
            return EventOverlap(EventHandle(_record(comm)), extra=outputs)
        for tensors in outputs.per_rank:
            for t in tensors.values():
                t.record_stream(comm)
                t.record_stream(compute)
        return EventOverlap(EventHandle(_record(comm)))

    def _allocate(self, specs, like_packs=None, like=None):
        """New tensors for `specs` ([(name, runtime dtype, shape)]) on this buffer's GPU;
        scale packs take the input's 4-byte dtype (float32 or int32). `like`: an input of
        the call; numpy inputs (a machine without a GPU) get numpy arrays, for the checks."""
        if like is not None and not T.is_torch(like):
            import numpy as np

            return {name: np.zeros(shape, T.numpy_dtype(dtype)) for name, dtype, shape in specs}
        self._runtime()  # a virtual world's GPU state (and device) exists from here
        import torch

        out = {}
        for name, dtype, shape in specs:
            torch_dtype = (like_packs.dtype
                           if name.endswith("scale_packs") and like_packs is not None
                           else T.torch_dtype(dtype))
            out[name] = torch.empty(shape, dtype=torch_dtype, device=f"cuda:{self._device_index}")
        return out

    # --- dispatch --------------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """DeepEP's layout step (``ep.dispatch_layout`` on the GPU): from each rank's
        ``topk_idx`` ``[tokens, top-k]`` (-1 = no expert), the tokens it sends to each rank
        (once per rank however many of its experts live there) and to each expert, and
        whether token t goes to rank r. Returns ``(num_tokens_per_rank, None,
        num_tokens_per_expert, is_token_in_rank, event)``: int32 ``[R]``, no RDMA ranks on one
        node, int32 ``[E]``, bool ``[tokens, R]``.
        """
        return _layout.get_dispatch_layout(self, topk_idx, num_experts, previous_event,
                                           async_finish, allocate_on_comm_stream)

    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                 num_experts=None, num_max_tokens_per_rank=None, expert_alignment=None,
                 num_sms: int = 0, num_qps: int = 0, previous_event=None,
                 previous_event_before_epilogue=None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False, handle=None, do_handle_copy: bool = True,
                 do_cpu_sync=None, do_expand: bool = False, do_zero_padding: bool = False,
                 use_tma_aligned_col_major_sf: bool = False, window_outputs: bool = False,
                 _gemm=None):
        """Sends every token to the ranks that own its top-k experts.

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)``;
        ``recv_x`` is a ``(data, scale_packs)`` tuple for FP8 input.

        epic: with ``window_outputs=True`` (an uncached dispatch on one NVLink domain) the
        outputs and the handle's tensors lie in the buffer's window, so each sender writes
        every row straight to its final row at the destination (no copy out of the window,
        on either backend). They stay valid until the next dispatch with ``window_outputs``
        on this buffer, which reuses that memory (a stale handle is refused by name); write
        the expert outputs into :meth:`combine_input_buffer` to have :meth:`combine` read them
        in place too.
        """
        return _dispatch.dispatch(self, x, topk_idx, topk_weights,
                                  cumulative_local_expert_recv_stats, num_experts,
                                  num_max_tokens_per_rank, expert_alignment, num_sms, num_qps,
                                  previous_event, previous_event_before_epilogue,
                                  async_with_compute_stream, allocate_on_comm_stream, handle,
                                  do_handle_copy, do_cpu_sync, do_expand, do_zero_padding,
                                  use_tma_aligned_col_major_sf, _gemm, window_outputs)

    def dispatch_gemm(self, x, topk_idx, experts, topk_weights=None, num_experts=None,
                      expert_alignment=None, out_dtype=None, num_sms: int = 0,
                      do_zero_padding: bool = False, do_cpu_sync: bool = True,
                      fusion: str = "auto"):
        """epic: an expanded dispatch and the expert GEMM on its rows, fused where that pays:
        the compiler's ``ep-fuse-dispatch-gemm`` schedule, where each GEMM tile starts as soon
        as its rows are in place instead of after the whole dispatch.

        ``experts``: every rank's local expert weights ``[E / R, hidden, N]`` (the dispatch's
        dtype, bf16 or f16; N a multiple of 128, hidden of 64). Returns ``(recv_x,
        recv_topk_weights, gemm_out, handle, event)``, the same as ``dispatch(...,
        do_expand=True)`` followed by :meth:`grouped_gemm` (``gemm_out`` rows follow
        ``recv_x``'s; padding rows are zero). ``fusion``: ``"auto"`` runs the fused kernel only
        where the fusion cost model predicts it beats those two calls (``last_fusion`` tells
        which way this call went and why), ``"always"`` / ``"never"`` decide without it; the
        results are bitwise the same either way.
        """
        _fusion.check_mode(fusion)
        ws = self._per_rank("experts", experts)
        xs = self._per_rank("x", x)
        for r, xr in enumerate(xs):
            if isinstance(xr, tuple):
                raise TypeError(f"{self._name('x', r)}: the fused dispatch + GEMM takes bf16 or "
                                "f16 rows, not FP8 with scale packs")
        out_name = _gemm_dtype(out_dtype, self._dtype(xs[0], "x"))
        idxs = self._per_rank("topk_idx", topk_idx)

        def shape():  # only "auto" asks; odd inputs leave it to the two steps' checks
            if num_experts is None or any(len(getattr(t, "shape", ())) != d for t, d in
                                          ((xs[0], 2), (idxs[0], 2), (ws[0], 3))):
                return None
            return dict(tokens=max(xr.shape[0] for xr in xs), hidden=xs[0].shape[1],
                        n=ws[0].shape[2], topk=idxs[0].shape[1], experts=num_experts,
                        element_bytes=2)

        fuse = _fusion.decide(self, "dispatch_gemm", fusion, shape, _fusion.on_gpu(xs + ws))
        if not fuse:
            recv_x, _, recv_w, handle, event = self.dispatch(
                x, topk_idx, topk_weights, num_experts=num_experts,
                expert_alignment=expert_alignment, num_sms=num_sms, do_cpu_sync=do_cpu_sync,
                do_expand=True, do_zero_padding=do_zero_padding)
            gemm_out = self.grouped_gemm(recv_x, experts, handle, out_dtype=out_name,
                                         num_sms=num_sms)
            return recv_x, recv_w, gemm_out, handle, event
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
        """Sends expert outputs back and sums them at their source.

        Returns ``(combined_x, combined_topk_weights, event)``.
        """
        return _combine.combine(self, x, handle, topk_weights, bias, num_sms, num_qps,
                                previous_event, previous_event_before_epilogue,
                                async_with_compute_stream, allocate_on_comm_stream, _gemm)

    def gemm_combine(self, x, weights, handle, bias=None, num_sms: int = 0,
                     previous_event=None, async_with_compute_stream: bool = False,
                     allocate_on_comm_stream: bool = False, fusion: str = "auto"):
        """epic: the expert GEMM and the combine of its output, fused where that pays: the
        compiler's ``ep-fuse-gemm-combine`` schedule, where each token is sent back to its
        source as soon as the GEMM tiles holding its rows are written, overlapping the send of
        early tiles with the computation of later ones.

        ``x`` is an expanded dispatch's ``recv_x`` (bf16 or f16), ``weights`` every rank's
        local expert matrices ``[E / R, hidden, hidden]`` (same dtype: the combine sends
        hidden-wide rows), ``handle`` the dispatch's. Returns ``(y, combined_x, event)``: ``y``
        is :meth:`grouped_gemm`'s bf16 output (padding rows zero) and ``combined_x`` bitwise
        what :meth:`combine` of ``y`` with the same biases returns. Combine weights are not
        taken (DeepEP applies them in the expert's epilogue, which is this GEMM's).
        ``fusion``: as :meth:`dispatch_gemm`'s (``"auto"``: the two calls unless the cost
        model predicts the fused kernel is faster; ``last_fusion`` says which and why).
        """
        _fusion.check_mode(fusion)
        xs, ws = self._per_rank("x", x), self._per_rank("weights", weights)

        def shape():  # only "auto" asks; odd inputs leave it to the two steps' checks
            hs = self._handles("handle", handle) if handle is not None else None
            if not hs or any(len(getattr(t, "shape", ())) != d for t, d in
                             ((xs[0], 2), (ws[0], 3))):
                return None
            return dict(tokens=max(h.topk_idx.shape[0] for h in hs), hidden=xs[0].shape[1],
                        n=ws[0].shape[2], topk=hs[0].topk_idx.shape[1],
                        experts=hs[0].num_experts, element_bytes=2)

        if _fusion.decide(self, "gemm_combine", fusion, shape, _fusion.on_gpu(xs + ws)):
            return _combine.gemm_combine(self, x, weights, handle, bias, num_sms,
                                         previous_event, async_with_compute_stream,
                                         allocate_on_comm_stream)
        _check_event("previous_event", previous_event)
        if previous_event is not None:  # the GEMM reads x: after the event, as the fused kernel
            previous_event.current_stream_wait()
        y = self.grouped_gemm(x, weights, handle, out_dtype="bf16", num_sms=num_sms)
        combined, _, event = self.combine(y, handle, bias=bias, num_sms=num_sms,
                                          async_with_compute_stream=async_with_compute_stream,
                                          allocate_on_comm_stream=allocate_on_comm_stream)
        return y, combined, event

    # --- the expert GEMM -------------------------------------------------------------------

    def grouped_gemm(self, x, weights, handle, out_dtype=None, num_sms: int = 0,
                     zero_padding: bool = True):
        """epic: the MoE expert GEMM on an expanded dispatch's rows (``ep.grouped_gemm``).

        ``x`` is the dispatch's ``recv_x`` (bf16 or f16, ``[rows, hidden]``) or rows of its
        layout with another width K (an expert's intermediate rows, for its down GEMM),
        ``weights`` the local experts' matrices ``[E / R, K, N]`` (same dtype, N contiguous),
        ``handle`` the dispatch's (``do_expand=True``). Each expert's rows are multiplied by its
        matrix with fp32 accumulation and rounded once to ``out_dtype`` (default: ``x``'s; bf16, f16
        or float32); padding rows are zero. On Hopper: TMA loads and wgmma, a persistent kernel
        over (expert, 128-row, 128-column) tiles; K must be a multiple of 64 and N of
        128. Runs on the current stream. Returns the output (a list in a virtual world).

        FP8: after an FP8 dispatch with one float32 scale per 128 channels, ``x`` is the
        dispatch's ``(recv_x, recv_x_scales)`` (or ``epic.activations.swiglu_fp8``'s output)
        and ``weights`` is ``(w, w_scales)``: ``w``
        float8_e4m3fn ``[E / R, N, K]`` (K contiguous), ``w_scales`` float32
        ``[E / R, N / 128, K / 128]`` (one per 128 x 128 block); each block's products are
        summed in fp32, scaled by the row's and the block's scales and added in fp32; the output
        is bf16 unless ``out_dtype`` says otherwise. K and N: multiples of 128.

        ``zero_padding=False``: the padding rows are left as they are (the output is pooled:
        another call's rows) instead of zeroed first, for callers that read the experts' rows
        only (the next expert step, the combine): a memset of every row less, which after a
        dispatch without CPU sync (worst-case-sized rows) is most of the output.
        """
        return _combine.grouped_gemm(self, x, weights, handle, out_dtype, num_sms, zero_padding)

    def swiglu(self, gate_up, handle, out_dtype=None, weights=None, num_sms: int = 0,
               zero_padding: bool = True):
        """epic: the activation between an expert MLP's two GEMMs (``ep.swiglu``).

        ``gate_up`` is the gate/up GEMM's output on an expanded dispatch's rows
        (``[rows, 2 I]``, gate columns then up, bf16 / f16 / float32, I a multiple of 128),
        ``handle`` the dispatch's. Every expert row gets ``y = silu(gate) * up`` in float32.
        ``out_dtype`` float8_e4m3fn (the default after an FP8 dispatch) returns ``(out,
        scales)``: ``out = y / scale`` in e4m3 with one float32 ``scale = max(amax |y|, 1e-4) /
        448`` per row and 128 channels, the rows the FP8 ``grouped_gemm`` takes as ``x``;
        bf16, f16 or float32 (the default otherwise: gate_up's) returns ``y`` rounded once.
        ``weights`` (float32 ``[rows]``, e.g. the dispatch's ``recv_topk_weights``) multiplies
        each row's ``y`` first: a MoE layer's routing weights, applied before the (linear) down
        GEMM instead of to its output. Padding rows are zero (``zero_padding=False``: left as
        they are, as ``grouped_gemm``'s). One kernel, nothing waits; runs on the current
        stream. Returns a list in a virtual world.
        """
        return _combine.swiglu(self, gate_up, handle, out_dtype, weights, num_sms, zero_padding)

    def __del__(self):
        if not getattr(self, "explicitly_destroy", True):
            try:
                self.destroy()
            except Exception:  # interpreter shutdown: CUDA may be gone
                pass


def _gemm_dtype(out_dtype, default):
    """The runtime's name of a GEMM output dtype (torch dtype or name), `default` for None."""
    if out_dtype is None:
        return default
    name = _GEMM_DTYPES.get(str(out_dtype).replace("torch.", ""))
    if name is None:
        raise TypeError(f"out_dtype: bf16, f16 or float32, got {out_dtype!r}")
    return name


def _record(stream):
    import torch

    event = torch.cuda.Event()
    event.record(stream)
    return event


# The calls' implementations use this module's helpers: imported once they exist.
from . import _combine, _dispatch, _fusion, _layout  # noqa: E402
