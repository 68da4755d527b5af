"""ElasticBuffer.get_dispatch_layout: DeepEP's layout step, the kernels of ep.dispatch_layout.

A token counts once per rank that owns one of its experts (num_tokens_per_rank), once per
expert (num_tokens_per_expert), and is_token_in_rank[t, r] says whether it goes to rank r;
-1 entries count nowhere. Nothing crosses ranks.
"""

from __future__ import annotations

from . import _tensors as T
# Modules, not names: importing any of epic's call modules first imports buffer,
# which imports them all, while this one's siblings are still half-initialized.
from . import _combine, _dispatch
from ._plans import signatures
from .buffer import _check_bool, _check_event, _check_int

__all__ = ["get_dispatch_layout"]

# The configuration's hidden size: the layout reads no rows, so any valid one names the same
# kernels (the cache keeps one set).
_NO_ROWS_HIDDEN = 128


def get_dispatch_layout(b, topk_idx, num_experts, previous_event, async_finish,
                        allocate_on_comm_stream):
    for name, flag in (("async_finish", async_finish),
                       ("allocate_on_comm_stream", allocate_on_comm_stream)):
        _check_bool(name, flag)
    _check_event("previous_event", previous_event)
    _check_int("num_experts", num_experts, 1)
    if num_experts % b.num_ranks:
        raise ValueError(f"num_experts: {num_experts} experts do not split over "
                         f"{b.num_ranks} ranks")
    idxs = b._per_rank("topk_idx", topk_idx)
    for r, idx in enumerate(idxs):
        if not T.is_tensor(idx):
            raise TypeError(f"{b._name('topk_idx', r)}: expected a tensor, got "
                            f"{type(idx).__name__}")
        _dispatch._two_d(b._name("topk_idx", r), idx, "[tokens, top-k]")
    dtype = T.dtype_name(idxs[0])
    if dtype not in ("i32", "i64"):
        raise TypeError(f"{b._name('topk_idx', 0)}: expected int64 or int32 expert ids, got "
                        f"{T.describe(idxs[0])}")
    K, R, E = idxs[0].shape[1], b.num_ranks, num_experts
    spec = b._spec(R, E, K, _NO_ROWS_HIDDEN, "bf16", 0, 1, False, b.num_max_tokens_per_rank)
    pairs = [[("topk_idx", idx)] for idx in idxs]
    key = ("dispatch_layout", E, signatures(pairs)) if T.is_torch(idxs[0]) else None

    def make_outputs():
        return [b._allocate([("num_tokens_per_rank", "i32", (R,)),
                             ("num_tokens_per_expert", "i32", (E,)),
                             ("is_token_in_rank", "i1", (idx.shape[0], R))], like=idx)
                for idx in idxs]

    variant = dict(topk_idx_bits=int(dtype[1:]))
    out, streams = _combine._run(b, key, "dispatch_layout", spec, variant, pairs, 0, make_outputs,
                                 (previous_event, allocate_on_comm_stream, async_finish))
    event = b._finish(streams, async_finish, out)
    per_rank = b._ranks_out([o["num_tokens_per_rank"] for o in out.per_rank])
    per_expert = b._ranks_out([o["num_tokens_per_expert"] for o in out.per_rank])
    in_rank = b._ranks_out([o["is_token_in_rank"] for o in out.per_rank])
    # One node: no RDMA ranks (DeepEP returns None there too).
    return per_rank, None, per_expert, in_rank, event
