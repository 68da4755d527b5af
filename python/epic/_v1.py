"""DeepEP V1's ``Buffer`` (normal mode) on epic's kernels: the call shapes inference engines
use (vLLM's ``deepep_high_throughput``, SGLang's normal dispatcher), over an ElasticBuffer.

V1's normal dispatch is V2's plain layout: rows grouped by source rank, ``recv_topk_idx`` local
expert ids (``-1`` elsewhere), counts per local expert rounded to ``expert_alignment``. The
layout tensors V1 takes (``num_tokens_per_rank``, ``is_token_in_rank``, ...) are checked for
shape and otherwise not needed: epic's dispatch counts in its own kernel. V1 has no token cap;
epic's kernels need one every rank agrees on, so the buffer uses the largest that its window
holds for the call's rows (the same on every rank: same bytes, same configuration). ``Config``'s
chunk sizes are kept for the caller and not needed; its ``num_sms`` is the call's SM count.
Low-latency mode (``Buffer(low_latency_mode=True)``): :mod:`epic._v1_low_latency`.
"""

from __future__ import annotations

from ._v1_low_latency import LowLatencyMethods
from .buffer import ElasticBuffer, _check_bool, _check_int, _staging_blocks

_MIB2 = 2 << 20


class Config:
    """DeepEP V1's ``Config(num_sms, num_max_nvl_chunked_send_tokens,
    num_max_nvl_chunked_recv_tokens, num_max_rdma_chunked_send_tokens,
    num_max_rdma_chunked_recv_tokens)``."""

    def __init__(self, num_sms: int, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256,
                 num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256):
        for name, value in (("num_sms", num_sms),
                            ("num_max_nvl_chunked_send_tokens", num_max_nvl_chunked_send_tokens),
                            ("num_max_nvl_chunked_recv_tokens", num_max_nvl_chunked_recv_tokens),
                            ("num_max_rdma_chunked_send_tokens", num_max_rdma_chunked_send_tokens),
                            ("num_max_rdma_chunked_recv_tokens",
                             num_max_rdma_chunked_recv_tokens)):
            _check_int(name, value, 1)
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens


class Buffer(LowLatencyMethods):
    """DeepEP V1's ``Buffer``: normal mode, and low-latency mode (LowLatencyMethods)."""

    num_sms = 20  # DeepEP V1's class-wide default (set_num_sms)

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False):
        _check_int("num_nvl_bytes", num_nvl_bytes, 0)
        _check_int("num_rdma_bytes", num_rdma_bytes, 0)
        _check_int("num_qps_per_rank", num_qps_per_rank, 1)
        for name, flag in (("low_latency_mode", low_latency_mode),
                           ("allow_nvlink_for_low_latency_mode",
                            allow_nvlink_for_low_latency_mode),
                           ("allow_mnnvl", allow_mnnvl),
                           ("explicitly_destroy", explicitly_destroy)):
            _check_bool(name, flag)
        total = num_nvl_bytes + num_rdma_bytes
        if total == 0:
            raise ValueError("num_nvl_bytes + num_rdma_bytes: the buffer needs bytes")
        self.group = group
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        # Normal-mode calls overwrite low-latency mode's counters (DeepEP's
        # clean_low_latency_buffer): the next low-latency call zeroes them first.
        self._ll_dirty = False
        self._buffer = ElasticBuffer(group, num_bytes=(total + _MIB2 - 1) // _MIB2 * _MIB2,
                                     explicitly_destroy=explicitly_destroy)
        self.rank, self.group_size = self._buffer.rank_idx, self._buffer.num_ranks
        self._caps = {}

    @staticmethod
    def set_num_sms(new_num_sms: int):
        _check_int("new_num_sms", new_num_sms, 1)
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        _check_int("num_ranks", num_ranks, 1)
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        _check_int("num_ranks", num_ranks, 1)
        return Config(Buffer.num_sms)

    def destroy(self):
        self._buffer.destroy()
        # The low-latency replays hold the runtime's plans: a later call takes the checked
        # path, which names the destroyed buffer.
        self.__dict__.pop("_ll", None)

    @staticmethod
    def is_sm90_compiled() -> bool:
        """epic's kernels are compiled for sm_90a (TMA, wgmma) on every build."""
        return True

    @staticmethod
    def capture():
        """An event on the current stream (DeepEP's ``EventOverlap``)."""
        from .handle import EventHandle, EventOverlap

        return EventOverlap(EventHandle())

    def get_local_buffer_tensor(self, dtype, size=None, offset: int = 0,
                                use_rdma_buffer: bool = False):
        """This process's window as a tensor of `dtype` from element `offset` (a view: no
        copy), `size` elements (a ``torch.Size``) if given. epic has one window for NVLink and
        RDMA traffic, so ``use_rdma_buffer`` selects the same memory. In a virtual world: rank
        0's window (``_buffer.window_tensor(r)`` has the others)."""
        _check_int("offset", offset, 0)
        _check_bool("use_rdma_buffer", use_rdma_buffer)
        b = self._buffer
        window = b.window_tensor(0 if b.virtual else None)
        whole = window[:window.shape[0] // dtype.itemsize * dtype.itemsize].view(dtype)
        if offset > whole.numel():
            raise ValueError(f"offset: {offset} elements is past the window's {whole.numel()}")
        tensor = whole[offset:]
        if size is None:
            return tensor
        count = 1
        for d in size:
            count *= int(d)
        if count > tensor.numel():
            raise ValueError(f"size: {tuple(size)} needs {count} elements, the window holds "
                             f"{tensor.numel()} from offset {offset}")
        return tensor[:count].view(size)

    def get_comm_stream(self):
        return self._buffer.get_comm_stream()

    def _cap(self, hidden, topk, fp8):
        """The largest token cap whose window fits this buffer's bytes, for rows of `hidden`
        elements and `topk` experts (the same on every rank)."""
        key = (hidden, topk, fp8)
        if key not in self._caps:
            b = self._buffer
            # get_buffer_size_hint's model on the buffer's own layout: no collective per probe
            # (the hint of a process group all-gathers host names to find its nodes).
            ranks_on_device = b.num_ranks if b.virtual else 1
            staging = _staging_blocks(b.num_rdma_ranks, None, ranks_on_device)

            def fits(tokens):
                return ElasticBuffer._size_hint(
                    b.num_rdma_ranks, b.num_nvlink_ranks, tokens, hidden, topk, fp8,
                    b.allow_hybrid_mode, True, staging) <= b.num_bytes

            if not fits(1):
                raise ValueError(f"num_nvl_bytes + num_rdma_bytes ({self._buffer.num_bytes}): "
                                 f"too small for one token of hidden {hidden}, top-{topk}")
            low, high = 1, 1 << 20
            while low < high:  # the largest cap that fits
                mid = (low + high + 1) // 2
                low, high = (mid, high) if fits(mid) else (low, mid - 1)
            self._caps[key] = low
        return self._caps[key]

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None,
                            async_finish=False, allocate_on_comm_stream=False):
        """``(num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert,
        is_token_in_rank, event)``."""
        b = self._buffer
        tokens = max(_rows(t) for t in (topk_idx if isinstance(topk_idx, list) else [topk_idx]))
        b.num_max_tokens_per_rank = max(b.num_max_tokens_per_rank or 0, tokens, 1)
        return b.get_dispatch_layout(topk_idx, num_experts, previous_event, async_finish,
                                     allocate_on_comm_stream)

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Config | None = None, previous_event=None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False):
        """``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
        handle, event)``; with a ``handle``, a cached dispatch (the handle's routing). With
        ``num_worst_tokens`` the outputs have worst-case rows and no host synchronization (the
        count list is then empty, as in DeepEP)."""
        _check_int("num_worst_tokens", num_worst_tokens, 0)
        self._ll_dirty = True
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config: expected a Config, got {type(config).__name__}")
        num_sms = (config or self.get_dispatch_config(self.group_size)).num_sms
        first = _first(x)
        data = first[0] if isinstance(first, tuple) else first
        if handle is not None:
            recv_x, recv_idx, recv_w, handle, event = self._buffer.dispatch(
                x, handle=handle, num_sms=num_sms, previous_event=previous_event,
                async_with_compute_stream=async_finish,
                allocate_on_comm_stream=allocate_on_comm_stream)
            return recv_x, recv_idx, recv_w, _counts(handle), handle, event
        if topk_idx is None or num_tokens_per_expert is None:
            raise ValueError("topk_idx and num_tokens_per_expert: required unless a handle is "
                             "given (get_dispatch_layout makes the layout)")
        idx = _first(topk_idx)
        experts = _rows(_first(num_tokens_per_expert))
        for name, tensor, shape in (("num_tokens_per_rank", _first(num_tokens_per_rank),
                                     (self.group_size,)),
                                    ("is_token_in_rank", _first(is_token_in_rank),
                                     (_rows(idx), self.group_size))):
            if tensor is not None and tuple(tensor.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape} (the layout of topk_idx), got "
                                 f"{tuple(tensor.shape)}")
        cap = self._cap(data.shape[1], idx.shape[1], isinstance(first, tuple))
        recv_x, recv_idx, recv_w, handle, event = self._buffer.dispatch(
            x, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=experts,
            num_max_tokens_per_rank=cap, expert_alignment=expert_alignment, num_sms=num_sms,
            previous_event=previous_event, async_with_compute_stream=async_finish,
            allocate_on_comm_stream=allocate_on_comm_stream, do_cpu_sync=not num_worst_tokens)
        counts = [] if num_worst_tokens else _counts(handle)
        return recv_x, recv_idx, recv_w, counts, handle, event

    def combine(self, x, handle, topk_weights=None, bias=None, config: Config | None = None,
                previous_event=None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False):
        """``(combined_x, combined_topk_weights, event)``."""
        self._ll_dirty = True
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config: expected a Config, got {type(config).__name__}")
        num_sms = (config or self.get_combine_config(self.group_size)).num_sms
        return self._buffer.combine(x, handle, topk_weights=topk_weights, bias=bias,
                                    num_sms=num_sms, previous_event=previous_event,
                                    async_with_compute_stream=async_finish,
                                    allocate_on_comm_stream=allocate_on_comm_stream)


def _rows(t):
    return int(t.shape[0])


def _counts(handle):
    """The received count per local expert: a list, or one per rank (a virtual world)."""
    if isinstance(handle, list):
        return [h.num_recv_tokens_per_expert_list for h in handle]
    return handle.num_recv_tokens_per_expert_list


def _first(v):
    """A virtual world passes one value per rank: rank 0's describes the call."""
    return v[0] if isinstance(v, list) else v
