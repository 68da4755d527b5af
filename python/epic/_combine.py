"""ElasticBuffer.combine, gemm_combine and grouped_gemm: the arguments adapted, the plan of
their signature launched, the outputs handed out (see epic.buffer and epic._plans)."""

from __future__ import annotations

import weakref

from . import _agrs
from . import _tensors as T
from ._plans import signature, signatures, zero_on_launch_stream
from .buffer import _C, _capturing, _check_bool, _check_event, _check_int, _gemm_dtype
from .handle import EventOverlap

__all__ = ["combine", "gemm_combine", "grouped_gemm"]


def _expert_inputs(b, op, x, weights, handle):
    """An expert GEMM's per-rank inputs: the rows of an expanded dispatch, the local experts'
    matrices and the dispatch's handles (adapted; the runtime checks their shapes)."""
    if handle is None:
        raise ValueError("handle: required (the EPHandle of the expanded dispatch)")
    handles = b._handles("handle", handle)
    xs = b._per_rank("x", x)
    ws = b._per_rank("weights", weights)
    if not handles[0].do_expand:
        raise ValueError(f"handle: {op} needs an expanded dispatch (do_expand=True): one row per "
                         "(token, local expert) pair, grouped by expert")
    for r, (xr, wr, hd) in enumerate(zip(xs, ws, handles)):
        b._dtype(xr, "x", r)
        b._dtype(wr, "weights", r)
        _rows_of_the_dispatch(b, r, xr, hd, hd.num_expanded_tokens, "the dispatch's recv_x",
                              any_width=(op == "grouped_gemm"))
    return handles, xs, ws


def _reads_in_place(b, xs, handles):
    """Whether the combine reads x where it lies: every rank's x in its window (from
    ElasticBuffer.combine_input_buffer), of a dispatch with window_outputs."""
    ranks = [r if b.virtual else b.rank_idx for r in range(len(xs))]
    inside = [b._in_window(xr, rank) for xr, rank in zip(xs, ranks)]
    if not any(inside):
        return False
    for r, (ok, hd) in enumerate(zip(inside, handles)):
        if not ok:
            raise ValueError(f"{b._name('x', r)}: outside the window while other ranks' x lie "
                             "in it: every rank's x in the window (combine_input_buffer), or "
                             "none")
        if getattr(hd, "_window_epoch", -1) < 0:
            raise ValueError(f"{b._name('handle', r)}: x lies in the window but the handle is "
                             "not of a dispatch with window_outputs=True, whose handle tensors "
                             "peers read there")
    return True


def _rows_of_the_dispatch(b, r, x, hd, rows, what, any_width=False):
    """`x` has the rows the handle's dispatch received (the handle knows how many), hidden-wide
    unless `any_width` (the grouped GEMM also multiplies an expert's intermediate rows)."""
    width = x.shape[1] if any_width and len(x.shape) == 2 else hd._hidden
    if tuple(x.shape) != (rows, width):
        raise ValueError(f"{b._name('x', r)}: expected {T.dtype_name(x)}[{rows}, "
                         f"{'K' if any_width else hd._hidden}] ({what}), got {T.describe(x)}")


def _key(op, num_sms, extra, pairs, handles):
    """A plan's signature (None for numpy inputs: checked on every call, never launched)."""
    if not T.is_torch(pairs[0][0][1]):
        return None
    return (op, num_sms, extra, signatures(pairs), tuple(h._key for h in handles))


def _spec(b, h, topk, dtype=None, expand=None):
    return b._spec(b.num_ranks, h.num_experts, topk, h._hidden, dtype or h._dtype,
                   h._num_scale_packs, h.expert_alignment,
                   h.do_expand if expand is None else expand, h.num_max_tokens_per_rank)


def _run(b, key, kind, spec, variant, pairs, num_sms, make_outputs, streams_args, zero=(),
         zero_inputs=()):
    """Launches the plan of `key` with a set of outputs: (the outputs per rank, event args).
    `zero_inputs`: tensors the kernels write only in part, zeroed on the launch stream."""
    plan = b._plans.get(key) or b._plan(key, kind, spec, variant, pairs, num_sms, make_outputs)
    stream, streams = b._stream(*streams_args)
    zero_on_launch_stream(zero_inputs, streams)
    return _launch(plan, pairs, stream, zero, streams), streams


def _launch(plan, pairs, stream, zero=(), streams=None):
    """A checked call: a set of outputs taken from the plan's pool, the kernels launched."""
    out = plan.take(_capturing())
    # outputs whose rows the kernels write only in part
    zero_on_launch_stream([o[name] for o in out.per_rank for name in zero], streams)
    plan.launch(out, pairs, stream)  # the runtime's errors carry the wait reports already
    if not out.sealed:
        out.seal()
    return out


class _Replay:
    """A combine whose options were checked (see epic._dispatch._Replay): a later call with
    handle objects a checked call passed and tensors of the signatures of that call is the
    plan's call; anything else returns None and takes the checked path (which adds its
    handles here if its plan is this one). Handles are known by weak reference: the pool
    sees no reference of the replay's to them or their tensors."""

    __slots__ = ("key", "known", "signatures")
    MAX_KNOWN = 4  # the dispatch pool's sets in flight, and some

    def __init__(self, key, pairs):
        self.key, self.known = key, {}
        self.signatures = tuple((signature(p[0][1]), signature(p[1][1])) for p in pairs)

    def add(self, handles):
        if len(self.known) >= self.MAX_KNOWN:
            self.known.pop(next(iter(self.known)))
        self.known[id(handles[0])] = [weakref.ref(h) for h in handles]

    def __call__(self, b, x, handle, topk_weights):
        ranks = b._replay_ranks(x, handle, topk_weights)
        if ranks is None:
            return None
        x, handles, ws = ranks
        refs = self.known.get(id(handles[0]))
        if refs is None:
            return None
        for h, ref in zip(handles, refs):
            if ref() is not h:
                return None
        if tuple((signature(xr), signature(w)) for xr, w in zip(x, ws)) != self.signatures:
            return None
        plan = b._plans.get(self.key)
        if plan is None:  # dropped from the buffer's plans: the checked path makes it again
            return None
        pairs = [[("x", xr), ("topk_weights", w)] + h._bindings()
                 for xr, w, h in zip(x, ws, handles)]
        out = _launch(plan, pairs, b._current_stream())
        return (b._ranks_out([o["combined_x"] for o in out.per_rank]),
                b._ranks_out([o.get("combined_topk_weights") for o in out.per_rank]),
                EventOverlap(None))


def combine(b, x, handle, topk_weights, bias, num_sms, num_qps, previous_event,
            previous_event_before_epilogue, async_with_compute_stream, allocate_on_comm_stream,
            gemm):
    _agrs.refuse_in_session(b, "combine")
    # The decode call (no bias, the current stream): a replay of a checked call, when it
    # passes the same handles and tensors of the same signatures.
    replay_key = None
    if bias is None and gemm is None and previous_event is None and \
            previous_event_before_epilogue is None and async_with_compute_stream is False and \
            allocate_on_comm_stream is False:
        replay_key = ("combine", num_sms, num_qps, type(num_sms), type(num_qps))
        replay = b._replays.get(replay_key)
        if replay is not None:
            result = replay(b, x, handle, topk_weights)
            if result is not None:
                return result

    if handle is None:
        raise ValueError("handle: required (the EPHandle of the dispatch being reversed)")
    for name, flag in (("async_with_compute_stream", async_with_compute_stream),
                       ("allocate_on_comm_stream", allocate_on_comm_stream)):
        _check_bool(name, flag)
    _check_event("previous_event", previous_event)
    _check_event("previous_event_before_epilogue", previous_event_before_epilogue)
    handles = b._handles("handle", handle)
    xs = b._per_rank("x", x)
    weights = b._per_rank("topk_weights", topk_weights, optional=True)
    biases = b._per_rank("bias", bias, optional=True)
    _check_int("num_sms", num_sms, 0)
    _check_int("num_qps", num_qps, 0, b.num_allocated_qps)
    if (weights[0] is None) != all(w is None for w in weights):
        raise ValueError("topk_weights: give them for every rank or for none")
    terms = []
    for r, bs in enumerate(biases):
        bs = () if bs is None else tuple(bs) if isinstance(bs, (tuple, list)) else (bs,)
        if len(bs) > 2:
            raise ValueError(f"{b._name('bias', r)}: at most two bias tensors, got {len(bs)}")
        terms.append(bs)
    if len({len(t) for t in terms}) > 1:
        raise ValueError("bias: every rank passes the same number of bias tensors")
    for r, (xr, hd) in enumerate(zip(xs, handles)):
        b._dtype(xr, "x", r)
        rows = hd.num_expanded_tokens if hd.do_expand else hd.num_recv_tokens
        _rows_of_the_dispatch(b, r, xr, hd, rows, "one row per row the dispatch received")
        b._window_handle_current(hd, "handle", r)
    h0 = handles[0]
    K = h0.topk_idx.shape[1]
    spec = _spec(b, h0, K)
    window = gemm is None and _reads_in_place(b, xs, handles)
    variant = dict(weights=weights[0] is not None, biases=len(terms[0]), window_outputs=window)
    kind, extra = "combine", None
    pairs = []
    for r, hd in enumerate(handles):
        p = [("x", xs[r]), ("topk_weights", weights[r])]
        p += [(f"bias_{i}", t) for i, t in enumerate(terms[r])]
        p += hd._bindings()
        pairs.append(p)
    if gemm is not None:
        kind, extra = "gemm_combine", "gemm"
        for p, lhs, w in zip(pairs, *gemm):
            p += [("lhs", lhs), ("weights", w)]
    key = _key(kind, num_sms, (extra, variant["weights"], variant["biases"], window), pairs,
               handles)

    def make_outputs():
        return [b._allocate(_C().outputs("combine", spec, variant, hd.topk_idx.shape[0]),
                            like=xs[r]) for r, hd in enumerate(handles)]

    out, streams = _run(b, key, kind, spec, variant, pairs, num_sms, make_outputs,
                        (previous_event, allocate_on_comm_stream, async_with_compute_stream,
                         previous_event_before_epilogue),
                        zero_inputs=xs if gemm is not None else ())
    if replay_key is not None and key is not None:
        replay = b._replays.get(replay_key)
        if replay is None or replay.key != key:
            replay = b._remember(replay_key, _Replay(key, pairs))
        replay.add(handles)
    event = b._finish(streams, async_with_compute_stream, out)
    return (b._ranks_out([o["combined_x"] for o in out.per_rank]),
            b._ranks_out([o.get("combined_topk_weights") for o in out.per_rank]), event)


def gemm_combine(b, x, weights, handle, bias, num_sms, previous_event,
                 async_with_compute_stream, allocate_on_comm_stream):
    _agrs.refuse_in_session(b, "gemm_combine")
    handles, xs, ws = _expert_inputs(b, "gemm_combine", x, weights, handle)
    # y: the GEMM's output, which the fused kernel writes and the combine sends; padding rows
    # are zero (a new tensor per call: it is returned, and the combine's plan binds it). The
    # combine zeroes it on the stream its kernels run on (zero_on_launch_stream).
    ys = [b._allocate([("y", "bf16", tuple(xr.shape))], like=xr)["y"] for xr in xs]
    combined, _, event = combine(b, b._ranks_out(ys), handle, None, bias, num_sms, 0,
                                 previous_event, None, async_with_compute_stream,
                                 allocate_on_comm_stream, (xs, ws))
    return b._ranks_out(ys), combined, event


FP8_GEMM_DTYPE = "f8E4M3FN"


def _split_scaled(b, name, values, what):
    """FP8 operands of the grouped GEMM, per rank a (data, float32 block scales) pair: the
    data and the scales as two lists (the runtime checks their shapes)."""
    data, scales = [], []
    for r, v in enumerate(values):
        if not (isinstance(v, tuple) and len(v) == 2):
            raise TypeError(f"{b._name(name, r)}: FP8 {what} come with their block scales: pass "
                            f"({name}_fp8, {name}_scales), got {type(v).__name__}")
        b._dtype(v[0], name, r, allowed=(FP8_GEMM_DTYPE,))
        b._dtype(v[1], f"{name} scales", r, allowed=("f32",))
        data.append(v[0])
        scales.append(v[1])
    return data, scales


def grouped_gemm(b, x, weights, handle, out_dtype, num_sms, zero_padding=True):
    _check_int("num_sms", num_sms, 0)
    _check_bool("zero_padding", zero_padding)
    # The handle says whether the rows are FP8 (_expert_inputs checks the handles).
    first = handle[0] if isinstance(handle, list) and handle else handle
    fp8 = getattr(first, "_dtype", None) == FP8_GEMM_DTYPE
    scale_pairs = None
    if fp8:  # DeepSeek's block scales travel with the data: (data, scales) per rank
        xs, x_scales = _split_scaled(b, "x", b._per_rank("x", x), "rows")
        ws, w_scales = _split_scaled(b, "weights", b._per_rank("weights", weights), "weights")
        x, weights = b._ranks_out(xs), b._ranks_out(ws)
        scale_pairs = [[("x_scales", sx), ("weight_scales", sw)]
                       for sx, sw in zip(x_scales, w_scales)]
    handles, xs, ws = _expert_inputs(b, "grouped_gemm", x, weights, handle)
    h0 = handles[0]
    out_name = _gemm_dtype(out_dtype, "bf16" if fp8 else T.dtype_name(xs[0]))
    spec = _spec(b, h0, h0.topk_idx.shape[1], expand=True)
    pairs = [[("x", xs[r]), ("weights", ws[r]),
              ("psum_num_recv_tokens_per_expert", hd._full["psum_num_recv_tokens_per_expert"])]
             + (scale_pairs[r] if fp8 else [])
             for r, hd in enumerate(handles)]
    key = _key("grouped_gemm", num_sms, out_name, pairs, handles)
    n_dim = 1 if fp8 else 2  # FP8 weights are [L, N, hidden] (K contiguous)

    def make_outputs():
        return [b._allocate([("out", out_name, (xs[r].shape[0], ws[r].shape[n_dim]))],
                            like=xs[r])
                for r in range(len(xs))]

    # Padding rows are zero: every call zeroes the output (rows of other experts in a reused set)
    # unless the caller reads the experts' rows only (zero_padding=False).
    out, _ = _run(b, key, "grouped_gemm", spec, {}, pairs, num_sms, make_outputs,
                  (None, False, False), zero=("out",) if zero_padding else ())
    return b._ranks_out([o["out"] for o in out.per_rank])


_SWIGLU_IN = ("bf16", "f16", "f32")
_SWIGLU_OUT = {name: FP8_GEMM_DTYPE for name in ("float8_e4m3fn", FP8_GEMM_DTYPE, "fp8")}


def swiglu(b, gate_up, handle, out_dtype, weights, num_sms, zero_padding=True):
    _check_int("num_sms", num_sms, 0)
    _check_bool("zero_padding", zero_padding)
    if handle is None:
        raise ValueError("handle: required (the EPHandle of the expanded dispatch)")
    handles = b._handles("handle", handle)
    if not handles[0].do_expand:
        raise ValueError("handle: swiglu needs an expanded dispatch (do_expand=True): one row "
                         "per (token, local expert) pair, grouped by expert")
    xs = b._per_rank("gate_up", gate_up)
    for r, (xr, hd) in enumerate(zip(xs, handles)):
        b._dtype(xr, "gate_up", r, allowed=_SWIGLU_IN)
        rows = hd.num_expanded_tokens
        if len(xr.shape) != 2 or xr.shape[0] != rows or xr.shape[1] % (2 * 128) or not xr.shape[1]:
            raise ValueError(f"{b._name('gate_up', r)}: expected [{rows}, 2 I] (the gate/up "
                             "GEMM's output on the dispatch's rows, gate columns then up, I a "
                             f"multiple of 128), got {T.describe(xr)}")
    h0 = handles[0]
    # By default the down GEMM's rows: FP8 after an FP8 dispatch, else gate_up's dtype.
    if out_dtype is None:
        out_name = FP8_GEMM_DTYPE if h0._dtype == FP8_GEMM_DTYPE else T.dtype_name(xs[0])
    else:
        out_name = _SWIGLU_OUT.get(str(out_dtype).replace("torch.", ""))
        if out_name is None:
            try:
                out_name = _gemm_dtype(out_dtype, None)
            except TypeError:
                raise TypeError("out_dtype: float8_e4m3fn, bf16, f16 or float32, got "
                                f"{out_dtype!r}") from None
    fp8 = out_name == FP8_GEMM_DTYPE
    inter = xs[0].shape[1] // 2
    spec = _spec(b, h0, h0.topk_idx.shape[1], expand=True)
    variant = {"n": inter, "in_dtype": T.dtype_name(xs[0]), "out_dtype": out_name}
    pairs = [[("gate_up", xs[r]),
              ("psum_num_recv_tokens_per_expert", hd._full["psum_num_recv_tokens_per_expert"])]
             for r, hd in enumerate(handles)]
    if weights is not None:  # one weight per row (the runtime checks the shape)
        for r, w in enumerate(b._per_rank("weights", weights)):
            b._dtype(w, "weights", r, allowed=("f32",))
            pairs[r].append(("weights", w))
    key = _key("swiglu", num_sms, out_name, pairs, handles)

    def make_outputs():
        return [b._allocate([("out", out_name, (xr.shape[0], inter))]
                            + ([("scales", "f32", (xr.shape[0], inter // 128))] if fp8 else []),
                            like=xr)
                for xr in xs]

    # Padding rows are zero, as the grouped GEMM's: every call zeroes the outputs (unless
    # zero_padding=False).
    zero = (("out", "scales") if fp8 else ("out",)) if zero_padding else ()
    out, _ = _run(b, key, "swiglu", spec, variant, pairs, num_sms, make_outputs,
                  (None, False, False), zero=zero)
    if fp8:
        return b._ranks_out([(o["out"], o["scales"]) for o in out.per_rank])
    return b._ranks_out([o["out"] for o in out.per_rank])
