"""DeepEP V2's module, on epic: ``import epic.deep_ep as deep_ep`` is the only change code
written for DeepEP makes.

The names are DeepEP's (``ElasticBuffer``, ``EPHandle``, ``EventOverlap``, ``EventHandle``,
``topk_idx_t``, ``get_physical_domain_size``, ``get_logical_domain_size``), with DeepEP's
signatures (epic's ElasticBuffer is DeepEP V2's). Importing the module applies DeepEP's
environment where it means something for epic (``epic._deepep_env.VARIABLES`` lists every
variable and what epic does with it) and warns once about those that do not apply.
``EP_NUM_TOPK_IDX_BITS`` sets ``topk_idx_t``, and this module's ``ElasticBuffer.dispatch``
returns ``recv_topk_idx`` in it, as DeepEP does (epic's own returns int64).

DeepEP V1's ``Buffer`` (normal and low-latency mode) and ``Config`` are
epic's adapters over ElasticBuffer (``epic._v1``).
"""

from __future__ import annotations

from . import __version__ as _epic_version
from . import _deepep_env
from ._topology import get_logical_domain_size, get_physical_domain_size
from ._v1 import Buffer, Config
from .buffer import ElasticBuffer as _EpicElasticBuffer
from .buffer import EventHandle, EventOverlap, _record
from .handle import EPHandle

_deepep_env.apply()

# DeepEP's package version this module mirrors, and epic's.
__version__ = f"2.1.0+epic{_epic_version}"

__all__ = ["ElasticBuffer", "EPHandle", "EventOverlap", "EventHandle", "topk_idx_t",  # noqa: F822
           "get_physical_domain_size", "get_logical_domain_size", "Buffer", "Config"]


class ElasticBuffer(_EpicElasticBuffer):
    """DeepEP V2's ElasticBuffer (epic's), returning ``recv_topk_idx`` as ``topk_idx_t``."""

    def dispatch(self, *args, **kwargs):
        out = super().dispatch(*args, **kwargs)
        if _deepep_env.topk_idx_bits() == 64:
            return out
        recv_x, recv_topk_idx, recv_topk_weights, handle, event = out
        if recv_topk_idx is None:
            return out
        dtype = _deepep_env.topk_idx_dtype()
        if event.event is None:  # the rows are the current stream's
            return recv_x, _cast(recv_topk_idx, dtype), recv_topk_weights, handle, event
        # Async: the rows are the communication stream's until the event; cast there and
        # give the caller an event after the cast.
        import torch

        comm = self.get_comm_stream()
        with torch.cuda.stream(comm):
            recv_topk_idx = _cast(recv_topk_idx, dtype)
        return (recv_x, recv_topk_idx, recv_topk_weights, handle,
                EventOverlap(EventHandle(_record(comm)), extra=(event, recv_topk_idx)))


def _cast(ids, dtype):
    if isinstance(ids, list):  # a virtual world: one tensor per rank
        return [_cast(t, dtype) for t in ids]
    return ids.to(dtype)


def __getattr__(name):
    if name == "topk_idx_t":
        return _deepep_env.topk_idx_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"topk_idx_t"})
