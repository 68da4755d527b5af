"""The objects DeepEP's calls hand back besides tensors: the dispatch handle and events."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["EPHandle", "EventHandle", "EventOverlap", "HANDLE_SLOTS"]

# The handle's tensors in the order the runtime's dispatch and combine calls bind them (the
# last nine slots of epic._C.slots("combine")); fwd_* only in hybrid mode (the rank's state as a
# forwarder), recv_row_of_slot only where a deterministic buffer sorted plain rows.
HANDLE_SLOTS = ("topk_idx", "dst_buffer_slot_idx", "recv_src_metadata",
                "psum_num_recv_tokens_per_rank", "num_recv_tokens_per_expert",
                "psum_num_recv_tokens_per_expert", "fwd_src_metadata", "fwd_counts",
                "recv_row_of_slot")


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
    queued kernels still use until then.
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
    # window_outputs: the buffer's window epoch its tensors belong to (-1: not in the window).
    _window_epoch: int = -1
    # What a call's checks of this handle depend on (not its addresses): part of the
    # signature of the combines and cached dispatches that use it.
    _key: tuple = ()

    def _bindings(self):
        """(slot name, tensor) of the handle's tensors the kernels address."""
        return [(name, self._full[name]) for name in HANDLE_SLOTS if name in self._full]
