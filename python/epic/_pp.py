"""ElasticBuffer's PP channels: DeepEP V2's pipeline send/recv between ring neighbours.

Each rank's window holds ``num_max_inflight_tensors`` slots for tensors from its previous ring
neighbour and as many from its next. ``pp_send`` waits until the receiver has freed the slot it
will use, copies the tensor into it with the copy engines and raises the receiver's arrival
count; ``pp_recv`` waits for that count, copies the slot out and raises the sender's release
count (``runtime/lib/Pp.cpp``). Both are ordered on the current stream and take no SM.

A virtual world runs every rank's calls on one stream, in the order they are made, so a receive
must come after its send and a send may not wait for a receive made later: such calls are
refused by name instead of hanging.
"""

from __future__ import annotations

from ._agrs import check_device_tensor
from ._reference_checks import align

_MIB2 = 2 << 20


def _check_count(name, value, low):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: must be >= {low}, got {value}")
    return value


def buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors):
    from .buffer import _C

    _check_count("num_max_tensor_bytes", num_max_tensor_bytes, 1)
    _check_count("num_max_inflight_tensors", num_max_inflight_tensors, 1)
    C = _C()
    return align(C.Buffer.AGRS_DATA_OFFSET +
                 C.Buffer.pp_region_bytes(num_max_tensor_bytes, num_max_inflight_tensors), _MIB2)


def _per_rank(b, what, t, peer, peer_name):
    """[(served rank, world rank, tensor, peer)] of the ranks that call."""
    if not b.virtual:
        return [(0, b.rank_idx, t, peer)]
    if not isinstance(t, (list, tuple)) or len(t) != b.num_ranks:
        raise TypeError(f"{what}: a virtual world takes a list with one tensor (or None) per rank "
                        f"({b.num_ranks})")
    if not isinstance(peer, (list, tuple)) or len(peer) != b.num_ranks:
        raise TypeError(f"{peer_name}: a virtual world takes a list with one rank index per rank "
                        f"({b.num_ranks})")
    return [(r, r, x, p) for r, (x, p) in enumerate(zip(t, peer)) if x is not None]


def _direction(b, me, peer):
    """0: to the next rank (from the previous one), 1: the other way."""
    R = b.num_ranks
    return 0 if peer == (me + 1) % R else 1


def _refuse_in_session(b, what):
    if b._agrs_open:
        raise RuntimeError(f"{what}: an AGRS session is open on this buffer and its tensors lie "
                           "where the PP slots are: use another buffer for PP, or destroy the "
                           "session first")


def _calls(b, what, t, peer, peer_name, num_sms):
    """The checked calls [(served rank, world rank, tensor, peer)], the C++ buffer and the
    current stream; None when no rank calls."""
    _refuse_in_session(b, what)
    _check_count("num_sms", num_sms, 0)  # copy engines move the data: no SM to choose
    calls = _per_rank(b, "t", t, peer, peer_name)
    for _, me, x, p in calls:
        check_device_tensor(f"t[{me}]" if b.virtual else "t", x)
        _check_count(f"{peer_name}[{me}]" if b.virtual else peer_name, p, 0)
    if not calls:
        return None
    import torch

    return calls, b._runtime(), torch.cuda.current_stream().cuda_stream


def send(b, t, dst_rank_idx, num_sms):
    checked = _calls(b, "pp_send", t, dst_rank_idx, "dst_rank_idx", num_sms)
    if checked is None:
        return
    calls, state, stream = checked
    for served, me, x, dst in calls:
        if b.virtual and dst < b.num_ranks:
            d = _direction(b, me, dst)
            sent, received = state.pp_counts(served)[d], state.pp_counts(dst)[2 + d]
            inflight = state.pp_counts(served)[4]
            if inflight and sent >= inflight and received < sent - inflight + 1:
                raise RuntimeError(
                    f"pp_send: rank {me}'s {inflight} slot(s) at rank {dst} are full (it has "
                    f"received {received} of {sent}); in a virtual world every rank's calls run "
                    "in order on one stream, so receive there first")
        state.pp_send(served, x.data_ptr(), x.numel() * x.element_size(), dst, stream)


def recv(b, t, src_rank_idx, num_sms):
    checked = _calls(b, "pp_recv", t, src_rank_idx, "src_rank_idx", num_sms)
    if checked is None:
        return
    calls, state, stream = checked
    for served, me, x, src in calls:
        if b.virtual and src < b.num_ranks:
            region = 0 if src == (me - 1) % b.num_ranks else 1
            received, sent = state.pp_counts(served)[2 + region], state.pp_counts(src)[region]
            if state.pp_counts(served)[4] and sent <= received:
                raise RuntimeError(
                    f"pp_recv: rank {src} has sent rank {me} {sent} tensor(s), all received; in "
                    "a virtual world every rank's calls run in order on one stream, so send "
                    "first")
        state.pp_recv(served, x.data_ptr(), x.numel() * x.element_size(), src, stream)


class PpMethods:
    """DeepEP V2's PP methods of ElasticBuffer (experimental there too)."""

    @staticmethod
    def get_pp_buffer_size_hint(num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> int:
        """``num_bytes`` of a buffer for PP: ``num_max_inflight_tensors`` slots of
        align(``num_max_tensor_bytes``, 32) from each ring neighbour, after epic's window control
        region, 2 MiB aligned."""
        return buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors)

    def pp_set_config(self, num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> None:
        """Tensors of at most ``num_max_tensor_bytes``, at most ``num_max_inflight_tensors`` sent
        to a neighbour and not yet received. Includes a barrier: make every earlier send
        received first."""
        _check_count("num_max_tensor_bytes", num_max_tensor_bytes, 1)
        _check_count("num_max_inflight_tensors", num_max_inflight_tensors, 1)
        state = self._runtime()
        self.barrier(use_comm_stream=False)
        state.pp_set_config(num_max_tensor_bytes, num_max_inflight_tensors)

    def pp_send(self, t, dst_rank_idx, num_sms: int = 0) -> None:
        """Sends ``t`` (contiguous, at most ``num_max_tensor_bytes``) to the previous or next
        rank of the ring, ordered on the current stream; copy engines, no SM (``num_sms`` is
        accepted for DeepEP's signature). Virtual world: lists per rank (None: no send)."""
        send(self, t, dst_rank_idx, num_sms)

    def pp_recv(self, t, src_rank_idx, num_sms: int = 0) -> None:
        """Receives the next tensor from the previous or next rank of the ring into ``t`` (the
        size that was sent), ordered on the current stream."""
        recv(self, t, src_rank_idx, num_sms)
