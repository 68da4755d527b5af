"""ElasticBuffer.dispatch (and dispatch_gemm): the arguments adapted, the plan of their
signature launched, the outputs and handles handed out (see epic.buffer and epic._plans)."""

from __future__ import annotations

import contextlib

from . import _agrs
from . import _tensors as T
from ._plans import signatures, zero_on_launch_stream
from .buffer import (_C, _capturing, _check_bool, _check_event, _check_int, _device_wait_reports,
                     _refuse_in_capture)
from .handle import HANDLE_SLOTS, EPHandle

__all__ = ["dispatch"]


def _inputs(b, xs, handles, idxs, weights):
    """Per rank: (data, scale packs) of x, and the (slot, tensor) pairs a launch binds."""
    data, packs = [], []
    for r, xr in enumerate(xs):
        if isinstance(xr, tuple):
            if len(xr) != 2:
                raise ValueError(f"{b._name('x', r)}: an FP8 input is a (data, scale_packs) tuple")
            xr, sf = xr
            if not T.is_tensor(sf) or T.dtype_name(sf) not in ("f32", "i32"):
                raise TypeError(f"{b._name('x', r)}: scale packs are 4-byte values (float32 or "
                                f"int32), got {T.describe(sf)}")
        else:
            sf = None
        dtype = b._dtype(xr, "x", r)
        if dtype.startswith("f8") and sf is None:
            raise ValueError(f"{b._name('x', r)}: FP8 data travels with its scale packs: pass "
                             "(data, scale_packs)")
        data.append(xr)
        packs.append(sf)
    pairs = []
    for r in range(len(xs)):
        if handles is None:
            pairs.append(_input_pairs(data[r], packs[r], weights[r], idxs[r]))
        else:
            pairs.append([("x", data[r]), ("x_scale_packs", packs[r]),
                          ("topk_weights", weights[r])] + handles[r]._bindings())
    return data, packs, pairs


def _input_pairs(data, packs, weights, idx):
    """An uncached dispatch's (slot, tensor) pairs of a rank, in the order its signature has."""
    return [("x", data), ("x_scale_packs", packs), ("topk_weights", weights), ("topk_idx", idx)]


def dispatch(b, x, topk_idx, topk_weights, cumulative_local_expert_recv_stats, num_experts,
             num_max_tokens_per_rank, expert_alignment, num_sms, num_qps, previous_event,
             previous_event_before_epilogue, async_with_compute_stream, allocate_on_comm_stream,
             handle, do_handle_copy, do_cpu_sync, do_expand, do_zero_padding,
             use_tma_aligned_col_major_sf, gemm, window_outputs=False, layer=None):
    _agrs.refuse_in_session(b, "dispatch")
    # The decode call (no handle, no CPU sync, the current stream): a replay of options
    # already checked, when its tensors have the signatures of that check.
    # Flags must be real bools (1 == True would share a key): anything else is checked.
    replay_key = None
    if handle is None and do_cpu_sync is False and gemm is None and layer is None and \
            cumulative_local_expert_recv_stats is None and previous_event is None and \
            previous_event_before_epilogue is None and async_with_compute_stream is False and \
            allocate_on_comm_stream is False and type(do_handle_copy) is bool and \
            type(do_expand) is bool and type(do_zero_padding) is bool and \
            type(use_tma_aligned_col_major_sf) is bool and type(window_outputs) is bool:
        replay_key = ("dispatch", num_experts, num_max_tokens_per_rank,
                      b.num_max_tokens_per_rank, expert_alignment, num_sms,
                      num_qps, do_handle_copy, do_expand, do_zero_padding,
                      use_tma_aligned_col_major_sf, window_outputs, type(num_experts),
                      type(num_max_tokens_per_rank), type(expert_alignment), type(num_sms),
                      type(num_qps))
        replay = b._replays.get(replay_key)
        if replay is not None:
            result = replay(b, x, topk_idx, topk_weights)
            if result is not None:
                return result

    for name, flag in (("do_handle_copy", do_handle_copy), ("do_expand", do_expand),
                       ("do_zero_padding", do_zero_padding),
                       ("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
                       ("async_with_compute_stream", async_with_compute_stream),
                       ("allocate_on_comm_stream", allocate_on_comm_stream),
                       ("window_outputs", window_outputs)):
        _check_bool(name, flag)
    if do_cpu_sync is not None:
        _check_bool("do_cpu_sync", do_cpu_sync)
    _check_event("previous_event", previous_event)
    _check_event("previous_event_before_epilogue", previous_event_before_epilogue)
    R = b.num_ranks
    cached = handle is not None
    xs = b._per_rank("x", x)
    handles = b._handles("handle", handle) if cached else None
    if window_outputs:
        _window_outputs_allowed(b, cached)
    for r, hd in enumerate(handles or ()):
        b._window_handle_current(hd, "handle", r)
    if cached:
        if topk_idx is not None:
            raise ValueError("topk_idx: must be None with a cached handle (the handle's routing "
                             "is reused)")
        if cumulative_local_expert_recv_stats is not None:
            raise ValueError("cumulative_local_expert_recv_stats: not allowed in a cached "
                             "dispatch")
        h0 = handles[0]
        for name, value, expected in (
                ("num_experts", num_experts, h0.num_experts),
                ("num_max_tokens_per_rank", num_max_tokens_per_rank, h0.num_max_tokens_per_rank),
                ("expert_alignment", expert_alignment, h0.expert_alignment)):
            if value is not None and value != expected:
                raise ValueError(f"{name}: {value} differs from the handle's {expected}")
        if do_expand != h0.do_expand:
            raise ValueError(f"do_expand: {do_expand} differs from the handle's {h0.do_expand}")
        num_experts, tmax, alignment = h0.num_experts, h0.num_max_tokens_per_rank, \
            h0.expert_alignment
        idxs = [h.topk_idx for h in handles]
    else:
        if topk_idx is None:
            raise ValueError("topk_idx: required unless a cached handle is given")
        if num_experts is None:
            raise ValueError("num_experts: required (the global number of experts)")
        tmax = b.num_max_tokens_per_rank if num_max_tokens_per_rank is None \
            else num_max_tokens_per_rank
        alignment = 1 if expert_alignment is None else expert_alignment
        idxs = b._per_rank("topk_idx", topk_idx)
    _check_int("num_experts", num_experts, 1)
    _check_int("num_max_tokens_per_rank", tmax, 1)
    _check_int("expert_alignment", alignment, 1)
    _check_int("num_sms", num_sms, 0)
    _check_int("num_qps", num_qps, 0, b.num_allocated_qps)
    if do_cpu_sync is None:
        do_cpu_sync = not cached
    if b.deterministic and not cached and not do_cpu_sync:
        raise ValueError("do_cpu_sync: a deterministic buffer sorts the received rows, which "
                         "needs their counts on the host; pass do_cpu_sync=True")
    weights = b._per_rank("topk_weights", topk_weights, optional=True)
    if (weights[0] is None) != all(w is None for w in weights):
        raise ValueError("topk_weights: give them for every rank or for none")
    stats = b._per_rank("cumulative_local_expert_recv_stats", cumulative_local_expert_recv_stats,
                        optional=True)
    data, packs, pairs = _inputs(b, xs, handles, idxs, weights)
    if use_tma_aligned_col_major_sf and packs[0] is None:
        raise ValueError("use_tma_aligned_col_major_sf: needs FP8 input with scale packs")

    # The configuration, read off rank 0's tensors (the runtime checks every rank against it).
    for r, idx in enumerate(idxs):
        if not T.is_tensor(idx):
            raise TypeError(f"{b._name('topk_idx', r)}: expected a tensor, got "
                            f"{type(idx).__name__}")
    _two_d(b._name("x", 0), data[0], "[tokens, hidden]")
    if data[0].shape[1] == 0:
        raise ValueError(f"{b._name('x', 0)}: rows of 0 elements ([tokens, hidden] with hidden "
                         f">= 1), got {T.describe(data[0])}")
    _two_d(b._name("topk_idx", 0), idxs[0], "[tokens, top-k]")
    K, (dtype, hidden) = idxs[0].shape[1], (T.dtype_name(data[0]), data[0].shape[1])
    num_packs = packs[0].shape[1] if packs[0] is not None and len(packs[0].shape) == 2 else 0
    L = num_experts // R
    spec = b._spec(R, num_experts, K, hidden, dtype, num_packs, alignment, do_expand, tmax)
    variant = dict(weights=weights[0] is not None, cached=cached, zero_padding=do_zero_padding,
                   window_outputs=window_outputs)
    if window_outputs and not T.is_cuda(data[0]):
        raise ValueError("window_outputs: needs CUDA tensors (the outputs lie in the window on "
                         "the GPU)")
    kind = "dispatch"
    if gemm is not None:
        kind = "dispatch_gemm"
        experts, out_dtype = gemm
        for r, (pair, w) in enumerate(zip(pairs, experts)):
            pair.append(("experts", w))
    if layer is not None:  # the whole FP8 layer (epic.moe.moe_layer_fp8): one kernel
        kind = "moe_layer"
        for pair, (w13, s13), (w2, s2) in zip(pairs, *layer):
            pair.extend([("gate_up_weights", w13), ("gate_up_scales", s13),
                         ("down_weights", w2), ("down_scales", s2)])
        inter = variant["n"] = layer[1][0][0].shape[2]  # I: down_weights [L, hidden, I]
    copy_routing = do_handle_copy and not cached
    tokens = [t.shape[0] for t in data]

    if T.is_torch(data[0]) and (do_cpu_sync or b.deterministic):
        _refuse_in_capture("dispatch(do_cpu_sync=True) reads the received counts back to the host",
                           "pass do_cpu_sync=False (worst-case shapes) when capturing")
    if not cached and (do_cpu_sync or not all(T.is_cuda(i) for i in idxs)):
        for r, idx in enumerate(idxs):  # the values: only where they can be read cheaply
            _check_topk_values(b, spec, b._name("topk_idx", r), idx)
    for r, s in enumerate(stats):  # epic adds to them with torch, after the kernels
        if s is not None:
            name = b._name("cumulative_local_expert_recv_stats", r)
            b._dtype(s, "cumulative_local_expert_recv_stats", r, ("i32",))
            if tuple(s.shape) != (L,):
                raise ValueError(f"{name}: must be [{L}], got {T.describe(s)}")

    # numpy inputs (no GPU here) are checked on every call and never launched: no plan key.
    key = (kind, cached, num_experts, tmax, alignment, do_expand, do_zero_padding, num_sms,
           copy_routing, do_cpu_sync, gemm[1] if gemm is not None else None, window_outputs,
           signatures(pairs),
           tuple(h._key for h in handles) if cached else None) if T.is_torch(data[0]) else None

    def make_outputs():
        """Every rank's outputs (and, uncached, its handle's tensors) for a call."""
        per_rank = []
        for r in range(len(data)):
            specs = _C().outputs("dispatch", spec, variant, tokens[r])
            out = (b._window_allocate(specs, r if b.virtual else b.rank_idx, packs[r])
                   if window_outputs else b._allocate(specs, packs[r], data[r]))
            extra = []
            if copy_routing:
                extra.append(("topk_idx_copy", "i64", (tokens[r], K)))
            if gemm is not None:
                extra.append(("gemm_out", gemm[1], (out["recv_x"].shape[0], gemm[0][r].shape[2])))
            if layer is not None:  # the layer's intermediate rows, then its result
                rows = out["recv_x"].shape[0]
                extra += [("gate_up", "bf16", (rows, 2 * inter)),
                          ("act", "f8E4M3FN", (rows, inter)),
                          ("act_scales", "f32", (rows, inter // 128)),
                          ("down", "bf16", (rows, hidden)),
                          ("combined_x", "bf16", (tokens[r], hidden))]
            out.update(b._allocate(extra, like=data[r]))
            per_rank.append(out)
        return per_rank

    plan = b._plans.get(key) or b._plan(key, kind, spec, variant, pairs, num_sms, make_outputs)
    stream, streams = b._stream(previous_event, allocate_on_comm_stream,
                                async_with_compute_stream, previous_event_before_epilogue)
    call = _Call(handles, spec, tmax, alignment, copy_routing, do_cpu_sync,
                 use_tma_aligned_col_major_sf, gemm is not None, window_outputs, layer is not None)
    result = _launch(b, plan, call, pairs, idxs, stream, streams, stats,
                     async_with_compute_stream)
    if replay_key is not None and key is not None and all(T.is_cuda(i) for i in idxs):
        b._remember(replay_key, _Replay(key, call, packs[0] is not None, signatures(pairs)))
    return result


def _window_outputs_allowed(b, cached):
    """window_outputs: an uncached dispatch whose rows stay where they land."""
    why = ("a cached dispatch reads its handle's tensors, which a dispatch with window_outputs "
           "would overwrite: pass window_outputs to the uncached dispatch only" if cached else
           "a deterministic buffer sorts the received rows after the dispatch, so they do not "
           "stay where the senders wrote them" if b.deterministic else None)
    if why:
        raise ValueError(f"window_outputs: {why}")


class _Call:
    """What a dispatch's launch and results depend on besides its tensors (fixed for a
    plan's signature and options)."""

    __slots__ = ("handles", "spec", "tmax", "alignment", "copy_routing", "do_cpu_sync", "tma_sf",
                 "gemm", "window", "layer")

    def __init__(self, handles, spec, tmax, alignment, copy_routing, do_cpu_sync, tma_sf, gemm,
                 window=False, layer=False):
        self.handles, self.spec, self.tmax, self.alignment = handles, spec, tmax, alignment
        self.copy_routing, self.do_cpu_sync = copy_routing, do_cpu_sync
        self.tma_sf, self.gemm, self.window, self.layer = tma_sf, gemm, window, layer


class _Replay:
    """A decode dispatch whose options were checked: a later call whose tensors have the
    signatures of that check is the plan's call (the plan's key holds the options and those
    signatures, so everything the checks read is equal); only its tensors are bound. A call
    that differs in anything returns None and takes the checked path, which names what is
    wrong."""

    __slots__ = ("key", "call", "fp8", "signatures")

    def __init__(self, key, call, fp8, sigs):
        self.key, self.call, self.fp8, self.signatures = key, call, fp8, sigs

    def __call__(self, b, x, topk_idx, topk_weights):
        ranks = b._replay_ranks(x, topk_idx, topk_weights)
        if ranks is None:
            return None
        x, idxs, ws = ranks
        pairs = []
        for xr, idx, w in zip(x, idxs, ws):
            packs = None
            if self.fp8:
                if type(xr) is not tuple or len(xr) != 2:
                    return None
                xr, packs = xr
            pairs.append(_input_pairs(xr, packs, w, idx))
        if signatures(pairs) != self.signatures:
            return None
        plan = b._plans.get(self.key)
        if plan is None:  # dropped from the buffer's plans: the checked path makes it again
            return None
        return _launch(b, plan, self.call, pairs, idxs, b._current_stream(), None,
                       [None] * len(pairs), False)


def _launch(b, plan, c, pairs, idxs, stream, streams, stats, async_with_compute_stream):
    """A checked dispatch: outputs taken from the plan's pool, the kernels launched, the
    results (and handles) handed out."""
    out = plan.take(_capturing())
    if c.window:  # this dispatch's outputs take the window's memory from the last one's
        b._window_claim(out.per_rank)
    if c.gemm:  # padding rows are zero (and rows of other experts in a reused set)
        zero_on_launch_stream([o["gemm_out"] for o in out.per_rank], streams)
    plan.launch(out, pairs, stream)  # the runtime's errors carry the wait reports already

    # Exact sizes: a cached dispatch knows them from its handle; otherwise they are read back
    # (CPU sync) or the outputs keep the worst case.
    counts = None
    if c.handles is not None:
        counts = [[h.num_recv_tokens] + list(h.num_recv_tokens_per_expert_list)
                  for h in c.handles]
    elif c.do_cpu_sync:
        import torch

        with torch.cuda.stream(streams[1]) if streams else contextlib.nullcontext():
            with _device_wait_reports():  # after the kernels that write them
                counts = torch.stack([o["host_counts"] for o in out.per_rank]).cpu().tolist()
    # Worst-case results with the handle's own routing copy are the same objects every call.
    same_every_call = counts is None and not b.deterministic and c.copy_routing
    if out.results is not None:
        results = out.results
    else:
        if not out.sealed and not same_every_call:
            out.seal()  # before the results (which the caller holds, not the pool) exist
        results = _results(b, out, c.handles, idxs, counts, c.spec, c.tmax, c.alignment,
                           plan.sms, c.copy_routing, c.tma_sf)
        if not out.sealed:  # the handles (r[3]) hold the handle's tensors
            out.seal(*((results, _handle_of) if same_every_call else ()))
    if c.window:
        for r in results:
            r[3]._window_epoch = b._window_epoch
    for r, s in enumerate(stats):
        if s is not None:
            s.add_(out.per_rank[r]["num_recv_tokens_per_expert"])
    event = b._finish(streams, async_with_compute_stream, out)
    return (
        b._ranks_out([r[0] for r in results]),
        b._ranks_out([r[1] for r in results]),
        b._ranks_out([r[2] for r in results]),
        b._ranks_out([r[3] for r in results]),
        event,
    ) + ((b._ranks_out([r[4] for r in results]),) if c.gemm else ()) + (
        (b._ranks_out([o["combined_x"] for o in out.per_rank]),) if c.layer else ())


def _results(b, out, handles, idxs, counts, spec, tmax, alignment, num_sms, copy_routing,
             tma_sf):
    """Per rank: (recv_x, recv_topk_idx, recv_topk_weights, handle, gemm_out)."""
    from ._layouts import sort_received, tma_col_major

    R, expand = b.num_ranks, spec["do_expand"]
    L = spec["num_experts"] // R
    results = []
    for r, o in enumerate(out.per_rank):
        rows = o["recv_x"].shape[0]
        if counts is not None and counts[r][1:]:
            n, expanded_rows = counts[r][0], sum(counts[r][1:])
        elif counts is not None:  # a cached dispatch of a handle made without CPU sync
            n, expanded_rows = rows, rows
        else:
            n, expanded_rows = R * tmax, rows
        out_rows = expanded_rows if expand else n
        full = None if handles else _handle_tensors(o, idxs[r], copy_routing)
        rows_of = {name: _first(o[name], out_rows) for name in
                   ("recv_x", "recv_x_scale_packs", "recv_topk_idx", "recv_topk_weights",
                    "gemm_out") if name in o}
        if "recv_topk_idx" in rows_of:
            rows_of["recv_topk_idx"] = _first(o["recv_topk_idx"], n)
        order = handles[r]._row_order if handles else None
        shown_meta = _first(full["recv_src_metadata"], n) if full else None
        cached_order = None
        if b.deterministic and not handles:
            groups = (tmax, spec["num_scaleup_ranks"]) if spec.get("hybrid") else None
            order, cached_order, shown_meta = sort_received(full, n, out_rows, expand, L,
                                                            counts[r][1:], groups)
        if order is not None:  # the rows in canonical (source) order
            rows_of = {name: t.index_select(0, order) for name, t in rows_of.items()}
        recv_x = rows_of["recv_x"]
        if "recv_x_scale_packs" in rows_of:
            sf = rows_of["recv_x_scale_packs"]
            recv_x = (recv_x, tma_col_major(sf) if tma_sf else sf)
        if handles:
            hd = handles[r]
        else:
            hd = EPHandle(
                do_expand=expand, num_experts=spec["num_experts"], expert_alignment=alignment,
                num_max_tokens_per_rank=tmax,
                num_sms=num_sms,
                topk_idx=full["topk_idx"], num_recv_tokens=n,
                num_expanded_tokens=expanded_rows if expand else n,
                num_recv_tokens_per_expert_list=list(counts[r][1:]) if counts else [],
                psum_num_recv_tokens_per_scaleup_rank=full["psum_num_recv_tokens_per_rank"],
                psum_num_recv_tokens_per_expert=full["psum_num_recv_tokens_per_expert"],
                num_unaligned_recv_tokens_per_expert=full["num_recv_tokens_per_expert"],
                recv_src_metadata=shown_meta, dst_buffer_slot_idx=full["dst_buffer_slot_idx"],
                _buffer=b, _rank=r if b.virtual else b.rank_idx, _full=full,
                _dtype=spec["dtype"], _num_scale_packs=spec["num_scale_packs"],
                _hidden=spec["hidden"], _row_order=cached_order)
            hd._key = (hd._rank, expand, hd.num_experts, alignment, tmax,
                       tuple(full["topk_idx"].shape), hd._dtype, hd._num_scale_packs, hd._hidden,
                       cached_order is not None)
        results.append((recv_x, rows_of.get("recv_topk_idx"), rows_of.get("recv_topk_weights"),
                        hd, rows_of.get("gemm_out")))
    return results


def _handle_of(result):
    return result[3]


def _two_d(name, t, what):
    """The configuration is read off rank 0's tensors: they must have their two dimensions."""
    if len(t.shape) != 2:
        raise ValueError(f"{name}: expected a 2-D tensor {what}, got {T.describe(t)}")


def _first(t, rows):
    """The first `rows` rows of `t`: `t` itself when that is all of them (a pooled tensor is
    handed out as it is, not as a view that would keep the pool from reusing it)."""
    return t if rows == t.shape[0] else t[:rows]


def _handle_tensors(o, idx, copy_routing):
    """The handle's tensors of a rank's outputs `o` (its routing: the copy, or the caller's)."""
    full = {name: o[name] for name in HANDLE_SLOTS if name in o}
    full["topk_idx"] = o["topk_idx_copy"] if copy_routing else idx
    return full


def _check_topk_values(b, spec, name, idx):
    """Every expert id in [-1, num_experts) (reads the values: a sync for GPU tensors)."""
    if T.dtype_name(idx) != "i64" or len(idx.shape) != 2:
        return  # the runtime's checks name what is wrong with it
    values = T.torch_to_numpy(idx) if T.is_torch(idx) else idx
    import numpy as np

    _C().check_topk_indices(spec, np.ascontiguousarray(values), name)
