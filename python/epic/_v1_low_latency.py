"""DeepEP V1's low-latency mode on epic's kernels (``Buffer(low_latency_mode=True)``).

Decode's dispatch and combine without a count exchange or a host synchronization, as
``ep.low_latency_dispatch`` / ``ep.low_latency_combine`` compiled by epic (one kernel each; with
``return_recv_hook`` the send kernel, and the receive kernel when the hook is called). Each
(local expert, source rank) owns ``num_max_dispatch_tokens_per_rank`` fixed slots in the
receiver's window; FP8 casting is fused into the send. Semantics: :mod:`epic.reference`'s
``low_latency_dispatch`` / ``low_latency_combine`` (bitwise), documented in
``docs/semantics.md``.

What differs from DeepEP V1: the rows of an expert are in a fixed order (source rank, then
token), not the order of arrival; the handle is DeepEP's 5-tuple with epic's routing
attached (``handle.route``); ``get_next_low_latency_combine_buffer`` returns a buffer kept
per call parity outside the window (the combine reads its input where it lies, so zero-copy
needs no registered memory); LogFMT, the wait-time statistics and rank masking are refused by
name. One NVLink domain (no GIN): all ranks of the group on one node.

A signature checked once is replayed without the checks (one rank per process), its outputs
taken from the buffer's output pool (epic._plans: a set is reused only when nothing outside the
pool holds its tensors, the results built from them or a view of either).
"""

from __future__ import annotations

from . import _tensors as T
from ._plans import OpPlan
from .buffer import _C, _capturing, _check_bool, _check_int
from .handle import EventHandle, EventOverlap


def _same(result):
    """What a caller holding one of a pooled set's results holds: the result itself."""
    return result


def _dispatch_outputs(torch, device, R, L, rows, hidden, groups, fp8, ue8m0):
    """One rank's new dispatch outputs. Base tensors only: the results' views (the scales
    transposed, the handle's two rows of ``info``) hold them, as does any view a caller makes
    of those (what the output pool watches)."""
    outputs = {"recv_x": torch.empty((L, rows, hidden),
                                     dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16,
                                     device=device),
               "recv_count": torch.empty((L,), dtype=torch.int32, device=device),
               "info": torch.empty((2, L, rows), dtype=torch.int32, device=device),
               "layout_range": torch.empty((L, R), dtype=torch.int64, device=device)}
    if fp8:
        outputs["recv_x_scales"] = torch.empty(
            (L, (groups + 3) // 4 if ue8m0 else groups, rows),
            dtype=torch.int32 if ue8m0 else torch.float32, device=device)
    return outputs


def _dispatch_slots(o):
    """The plan's output slots of one rank's outputs (``src_info`` and ``route`` are the two
    rows of ``info``)."""
    return {"recv_x": o["recv_x"], "recv_x_scales": o.get("recv_x_scales"),
            "recv_count": o["recv_count"], "src_info": o["info"][0], "route": o["info"][1],
            "layout_range": o["layout_range"]}


def _dispatch_recv(o):
    """``recv_x``, or ``(recv_x, scales)`` with the scales viewed ``[L, R x cap, G]``."""
    scales = o.get("recv_x_scales")
    return o["recv_x"] if scales is None else (o["recv_x"], scales.transpose(1, 2))


class LowLatencyHandle(tuple):
    """DeepEP's ``(src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden,
    num_experts)``; ``route`` ([L, R x cap] int32 per rank: where the combine sends each row
    back) and ``parity`` are epic's."""

    def __new__(cls, src_info, layout_range, cap, hidden, num_experts, route, topk):
        h = super().__new__(cls, (src_info, layout_range, cap, hidden, num_experts))
        h.route, h.topk = route, topk
        return h


class _LowLatencyPlan:
    """A C++ plan of one call signature (its slot order), launched with new addresses."""

    __slots__ = ("plan", "names", "slots")

    def __init__(self, plan, slot_names):
        self.plan, self.names = plan, list(slot_names)
        self.slots = {name: i for i, name in enumerate(self.names)}

    def bind(self, addresses, tensors, rank=0):
        """Writes the addresses of `tensors` ({slot name: tensor or None}) into rank `rank`'s
        slots of `addresses`."""
        base = rank * len(self.slots)
        for name, t in tensors.items():
            if t is not None:
                addresses[base + self.slots[name]] = t.data_ptr()

    def addresses(self, per_rank):
        out = [0] * (len(self.slots) * len(per_rank))
        for r, tensors in enumerate(per_rank):
            self.bind(out, tensors, r)
        return out


class LowLatencyMethods:
    """DeepEP V1's low-latency calls of :class:`epic._v1.Buffer` (which holds ``_buffer``, an
    ElasticBuffer of the group)."""

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int,
                                       num_ranks: int, num_experts: int) -> int:
        """Bytes of window the low-latency calls of this shape need (any top-k up to the
        kernels' limit, bf16 or FP8 rows: DeepEP's signature has neither)."""
        from ._reference_checks import MAX_TOPK

        _check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        _check_int("hidden", hidden, 128)
        _check_int("num_ranks", num_ranks, 1)
        _check_int("num_experts", num_experts, 1)
        if num_experts % num_ranks:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by num_ranks "
                             f"({num_ranks})")
        ll = _C().low_latency_layout(num_experts, num_ranks, min(num_experts, MAX_TOPK), hidden)
        return ll["base_bytes"] + num_max_dispatch_tokens_per_rank * ll["bytes_per_token"]

    def _ll_state(self):
        if not hasattr(self, "_ll"):
            self._ll = {"parity": 0, "plans": {}, "clean": set(), "combine_buffers": {},
                        "fast": {}}
        return self._ll

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int,
                                 num_experts: int) -> None:
        """Zeroes low-latency mode's counters in every served rank's window, on the current
        stream (DeepEP: needed after normal-mode calls used the buffer; epic also does it by
        itself before the first low-latency call after them)."""
        _check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        _check_int("hidden", hidden, 128)
        _check_int("num_experts", num_experts, 1)
        b = self._buffer
        ll = _C().low_latency_layout(num_experts, b.num_ranks, 1, hidden)
        for r in range(b.num_ranks if b.virtual else 1):
            window = b.window_tensor(r if b.virtual else None)
            window.narrow(0, ll["control_at"], ll["control_bytes"]).zero_()
        # The flags compare with epochs: another layout's control block, which may overlap
        # this one, is cleaned again before its next call.
        self._ll_state()["clean"] = {(num_experts, hidden)}

    def _ll_prepare(self, num_experts, hidden):
        """Before a low-latency call: its counters zero (after normal-mode use, or first)."""
        state = self._ll_state()
        if getattr(self, "_ll_dirty", False):
            state["clean"].clear()
            self._ll_dirty = False
        if (num_experts, hidden) not in state["clean"]:
            if _capturing():
                raise RuntimeError("low-latency calls: the buffer's counters must be cleaned "
                                   "before a CUDA graph captures them (call "
                                   "clean_low_latency_buffer, or make one call, first)")
            self.clean_low_latency_buffer(1, hidden, num_experts)

    def _ll_plan(self, key, kind, spec, variant, tensors, num_sms):
        """The plan of `key`, made (and checked, naming every bad argument) the first time."""
        state = self._ll_state()
        plan = state["plans"].get(key)
        if plan is not None:
            return plan
        C = _C()
        calls = [{name: T.to_runtime(t) for name, t in rank.items() if t is not None}
                 for rank in tensors]
        if C.cuda_device_count() == 0:
            C.check(kind, spec, variant, calls)
        runtime = self._buffer._runtime()
        stream = self._buffer._current_stream()
        blocks = min(num_sms or runtime.blocks_per_rank, runtime.blocks_per_rank)
        plan = _LowLatencyPlan(runtime.plan(kind, spec, variant, calls, blocks, stream),
                               C.slots(kind))
        state["plans"][key] = plan
        return plan

    def _ll_parity(self):
        """The window region of the next call (calls alternate; _ll_launch moves on)."""
        return self._ll_state()["parity"]

    def _ll_launch(self, plan, tensors, async_finish, return_recv_hook, outputs):
        """Send phase now; the receive now or in the returned hook. (event, hook)."""
        import torch

        addresses = plan.addresses(tensors)
        if not async_finish:
            return EventOverlap(None), self._ll_launch_phases(plan, addresses, return_recv_hook)
        compute, comm = torch.cuda.current_stream(), self._buffer.get_comm_stream()
        comm.wait_stream(compute)
        hook = self._ll_launch_phases(plan, addresses, return_recv_hook, comm.cuda_stream)
        for t in outputs:
            t.record_stream(comm)
        event = torch.cuda.Event()
        event.record(comm)
        return EventOverlap(EventHandle(event)), hook

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """``(recv_x or (recv_x, recv_x_scales), recv_count, handle, event, hook)`` (DeepEP
        V1's shapes: ``[L, R x cap, hidden]`` rows, scales ``[L, R x cap, G]`` float32 or
        UE8M0 ``[L, R x cap, G / 4]`` int32, column-major per expert)."""
        import torch

        if type(x) is torch.Tensor and not async_finish and dispatch_wait_recv_cost_stats is None:
            # The hot path: a signature checked before, replayed (one rank per process).
            fast = self._ll_state()["fast"].get(self._ll_dispatch_key(
                x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                cumulative_local_expert_recv_stats, use_fp8, round_scale, use_ue8m0))
            if fast is not None and not self._ll_dirty:
                return fast(x, topk_idx, cumulative_local_expert_recv_stats, return_recv_hook)
        self._ll_check_mode("low_latency_dispatch")
        cap = _check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        _check_int("num_experts", num_experts, 1)
        for name, flag in (("use_fp8", use_fp8), ("round_scale", round_scale),
                           ("use_ue8m0", use_ue8m0), ("async_finish", async_finish),
                           ("return_recv_hook", return_recv_hook)):
            _check_bool(name, flag)
        if dispatch_wait_recv_cost_stats is not None:
            raise ValueError("dispatch_wait_recv_cost_stats: epic's kernels do not measure "
                             "wait times; pass None")
        if use_ue8m0 and not round_scale:
            raise ValueError("use_ue8m0 needs round_scale=True (UE8M0 scales are powers of two)")
        if (round_scale or use_ue8m0) and not use_fp8:
            raise ValueError("round_scale and use_ue8m0 need use_fp8=True")
        b = self._buffer
        R = b.num_ranks
        if num_experts % R:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by the {R} ranks")
        xs, idxs = self._buffer._per_rank("x", x), self._buffer._per_rank("topk_idx", topk_idx)
        stats = self._buffer._per_rank("cumulative_local_expert_recv_stats",
                                   cumulative_local_expert_recv_stats, optional=True)
        first = xs[0]
        if first.dim() != 2 or first.dtype != torch.bfloat16:
            raise TypeError(f"x: expected a bfloat16 [tokens, hidden] tensor, got "
                            f"{T.describe(first)}")
        if idxs[0].dim() != 2:
            raise TypeError(f"topk_idx: expected [tokens, top-k], got {T.describe(idxs[0])}")
        hidden, topk, L = int(first.shape[1]), int(idxs[0].shape[1]), num_experts // R
        self._ll_prepare(num_experts, hidden)
        fp8 = use_fp8
        groups = hidden // 128
        parity = self._ll_parity()
        spec = dict(num_ranks=R, num_experts=num_experts, num_topk=topk, hidden=hidden,
                    dtype="f8E4M3FN" if fp8 else "bf16", num_scale_packs=groups if fp8 else 0,
                    expert_alignment=1, do_expand=False, num_max_tokens_per_rank=cap)
        if b.num_gpu_timeout_secs != 100:
            spec["timeout_ms"] = int(b.num_gpu_timeout_secs * 1000)
        variant = dict(round_scale=round_scale, use_ue8m0=use_ue8m0, parity=parity,
                       topk_idx_bits=64 if idxs[0].dtype == torch.int64 else 32)
        device = first.device
        rows = R * cap
        shape = (L, rows, hidden, groups, fp8, use_ue8m0)
        outputs = [_dispatch_outputs(torch, device, R, *shape) for _ in xs]
        tensors = [{"x": xs[r], "topk_idx": idxs[r], "cumulative_local_expert_recv_stats": stats[r],
                    **_dispatch_slots(o)} for r, o in enumerate(outputs)]
        key = ("dispatch", parity, cap, num_experts, fp8, round_scale, use_ue8m0,
               stats[0] is not None,
               tuple((tuple(t["x"].shape), t["x"].stride(), t["topk_idx"].dtype,
                      tuple(t["topk_idx"].shape)) for t in tensors))
        plan = self._ll_plan(key, "low_latency_dispatch", spec, variant, tensors, 0)
        if not b.virtual:
            self._ll_remember_dispatch(
                self._ll_dispatch_key(first, idxs[0], cap, num_experts, stats[0], use_fp8,
                                      round_scale, use_ue8m0),
                plan, shape, (cap, num_experts, topk), device)
        event, hook = self._ll_launch(plan, tensors, async_finish, return_recv_hook,
                                      [t for o in outputs for t in o.values()])
        out = b._ranks_out
        handle = LowLatencyHandle(out([o["info"][0] for o in outputs]),
                                  out([o["layout_range"] for o in outputs]), cap, hidden,
                                  num_experts, out([o["info"][1] for o in outputs]), topk)
        return (out([_dispatch_recv(o) for o in outputs]),
                out([o["recv_count"] for o in outputs]), handle, event, hook)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False,
                            return_recv_hook: bool = False, out=None,
                            combine_wait_recv_cost_stats=None):
        """``(combined_x, event, hook)``: per token the weighted sum of its experts' rows
        (``x``: ``[L, R x cap, hidden]`` bfloat16, as the dispatch laid them out)."""
        import torch

        if type(x) is torch.Tensor and not async_finish and not use_logfmt and \
                combine_wait_recv_cost_stats is None and type(handle) is LowLatencyHandle:
            fast = self._ll_state()["fast"].get(self._ll_combine_key(x, topk_idx, topk_weights,
                                                                     handle, out))
            if fast is not None and not self._ll_dirty:
                return fast(x, topk_idx, topk_weights, handle, out, return_recv_hook)
        self._ll_check_mode("low_latency_combine")
        for name, flag in (("use_logfmt", use_logfmt), ("zero_copy", zero_copy),
                           ("async_finish", async_finish), ("return_recv_hook", return_recv_hook)):
            _check_bool(name, flag)
        if use_logfmt:
            raise ValueError("use_logfmt: epic's low-latency combine sends bf16 rows (no LogFMT "
                             "encoding); pass use_logfmt=False")
        if combine_wait_recv_cost_stats is not None:
            raise ValueError("combine_wait_recv_cost_stats: epic's kernels do not measure wait "
                             "times; pass None")
        if not isinstance(handle, LowLatencyHandle):
            raise TypeError(f"handle: expected the handle low_latency_dispatch returned, got "
                            f"{type(handle).__name__}")
        src_info, layout_range, cap, hidden, num_experts = handle
        b = self._buffer
        R = b.num_ranks
        xs = self._buffer._per_rank("x", x)
        idxs = self._buffer._per_rank("topk_idx", topk_idx)
        ws = self._buffer._per_rank("topk_weights", topk_weights)
        outs = self._buffer._per_rank("out", out, optional=True)
        ranges, routes = self._buffer._per_rank("handle", layout_range), \
            self._buffer._per_rank("handle", handle.route)
        topk = int(idxs[0].shape[1]) if idxs[0].dim() == 2 else 0
        if topk != handle.topk:
            raise ValueError(f"topk_idx: {T.describe(idxs[0])} has top-{topk} but the dispatch "
                             f"of this handle had top-{handle.topk}")
        self._ll_prepare(num_experts, hidden)
        parity = self._ll_parity()
        spec = dict(num_ranks=R, num_experts=num_experts, num_topk=topk, hidden=hidden,
                    dtype="bf16", num_scale_packs=0, expert_alignment=1, do_expand=False,
                    num_max_tokens_per_rank=cap)
        if b.num_gpu_timeout_secs != 100:
            spec["timeout_ms"] = int(b.num_gpu_timeout_secs * 1000)
        variant = dict(parity=parity, topk_idx_bits=64 if idxs[0].dtype == torch.int64 else 32)
        tensors, results = [], []
        for r in range(len(xs)):
            result = outs[r]
            if result is None:
                result = torch.empty((int(idxs[r].shape[0]), hidden), dtype=torch.bfloat16,
                                     device=xs[r].device)
            tensors.append({"x": xs[r], "layout_range": ranges[r], "route": routes[r],
                            "topk_idx": idxs[r], "topk_weights": ws[r], "out": result})
            results.append(result)
        key = ("combine", parity, cap, num_experts, hidden,
               tuple((t["x"].dtype, tuple(t["x"].shape), t["x"].stride(), t["topk_idx"].dtype,
                      tuple(t["topk_idx"].shape), t["topk_weights"].dtype,
                      tuple(t["topk_weights"].shape), t["out"].dtype, tuple(t["out"].shape))
                     for t in tensors))
        plan = self._ll_plan(key, "low_latency_combine", spec, variant, tensors, 0)
        if not b.virtual:
            self._ll_remember_combine(self._ll_combine_key(xs[0], idxs[0], ws[0], handle, outs[0]),
                                      plan, hidden, int(idxs[0].shape[0]), xs[0].device)
        event, hook = self._ll_launch(plan, tensors, async_finish, return_recv_hook, results)
        return b._ranks_out(results), event, hook

    # --- the hot path: signatures checked once, replayed -----------------------------------

    def _ll_dispatch_key(self, x, idx, cap, experts, stats, fp8, round_scale, ue8m0):
        return ("dispatch", self._ll_state()["parity"], cap, experts, fp8, round_scale, ue8m0,
                x.shape, x.dtype, x.stride(), x.get_device(), idx.shape, idx.dtype, idx.stride(),
                None if stats is None else (stats.shape, stats.dtype, stats.get_device()))

    def _ll_combine_key(self, x, idx, w, handle, out):
        return ("combine", self._ll_state()["parity"], handle[2], handle[3], handle[4],
                handle.topk, x.shape, x.dtype, x.stride(), x.get_device(), idx.shape, idx.dtype,
                idx.stride(), w.shape, w.dtype, w.stride(),
                None if out is None else (out.shape, out.dtype, out.stride()))

    def _ll_launch_phases(self, plan, addresses, return_recv_hook, stream=None):
        """Launches a call on `stream` (default: the current one) and moves the parity on:
        both phases in one kernel, or (a receive hook) the send kernel, returning the hook
        that launches the receive kernel on the stream current when it is called."""
        current = self._buffer._current_stream
        self._ll_state()["parity"] ^= 1  # the next call uses the other region
        if not return_recv_hook:
            plan.plan.launch(addresses, current() if stream is None else stream, 2, 1)
            return None
        plan.plan.launch(addresses, current() if stream is None else stream, 0, 1)
        # The call's addresses as they are now: a pooled set's list is rewritten by its next
        # call, which may come before this hook (once the caller dropped the results).
        addresses = list(addresses)

        def hook():
            """Launches the receive phase on the current stream."""
            if self._buffer._destroyed:
                raise RuntimeError("low-latency receive hook: its Buffer was destroyed")
            plan.plan.launch(addresses, current(), 1, 1)

        return hook

    def _ll_pool(self, key, plan, make_outputs):
        """The output pool of a replayed signature: sets reused once nothing outside the pool
        holds their tensors or results (epic._plans.OutputSet's check), counted against the
        buffer's output pool budget; new tensors while a graph is being captured."""
        pool = OpPlan(plan.plan, plan.names, make_outputs)
        self._buffer._plans.add(("low_latency",) + key, pool)
        return pool

    def _ll_remember_dispatch(self, key, plan, shape, handle_fields, device):
        """A replay of a checked dispatch signature: pooled outputs (their results built once),
        the inputs' addresses, the launch."""
        import torch

        cap, experts, topk = handle_fields
        R, hidden = self._buffer.num_ranks, shape[2]
        pool = self._ll_pool(key, plan, lambda: [_dispatch_outputs(torch, device, R, *shape)])
        x_at, idx_at, stats_at = (plan.slots[n] for n in
                                  ("x", "topk_idx", "cumulative_local_expert_recv_stats"))

        def replay(x, idx, stats, return_recv_hook):
            out = pool.take(_capturing())
            if out.results is None:  # a new set: its views' addresses, its results
                o = out.per_rank[0]
                plan.bind(out.addresses, _dispatch_slots(o))
                results = [_dispatch_recv(o), o["recv_count"],
                           LowLatencyHandle(o["info"][0], o["layout_range"], cap, hidden,
                                            experts, o["info"][1], topk)]
                del o
                out.seal(results, _same)
                del results
            addresses = out.addresses
            addresses[x_at], addresses[idx_at] = x.data_ptr(), idx.data_ptr()
            addresses[stats_at] = 0 if stats is None else stats.data_ptr()
            hook = self._ll_launch_phases(plan, addresses, return_recv_hook)
            recv, count, handle = out.results
            return recv, count, handle, EventOverlap(None), hook

        self._ll_state()["fast"][key] = replay

    def _ll_remember_combine(self, key, plan, hidden, tokens, device):
        """A replay of a checked combine signature: a pooled `out` unless the caller gives one."""
        import torch

        def make_outputs():
            return [{"out": torch.empty((tokens, hidden), dtype=torch.bfloat16, device=device)}]

        pool = self._ll_pool(key, plan, make_outputs)
        at = [plan.slots[n] for n in ("x", "layout_range", "route", "topk_idx", "topk_weights")]
        out_at = plan.slots["out"]

        def replay(x, idx, w, handle, out, return_recv_hook):
            if out is None:
                s = pool.take(_capturing())
                if s.results is None:
                    s.seal([s.per_rank[0]["out"]], _same)
                addresses, out = s.addresses, s.results[0]
            else:
                addresses = [0] * len(plan.slots)
                addresses[out_at] = out.data_ptr()
            for slot, value in zip(at, (x, handle[1], handle.route, idx, w)):
                addresses[slot] = value.data_ptr()
            hook = self._ll_launch_phases(plan, addresses, return_recv_hook)
            return out, EventOverlap(None), hook

        self._ll_state()["fast"][key] = replay

    def get_next_low_latency_combine_buffer(self, handle):
        """A bf16 ``[L, R x cap, hidden]`` tensor (per rank) to write the expert outputs into
        and pass to :meth:`low_latency_combine` (``zero_copy=True``): the same memory for every
        call of the next combine's parity (DeepEP's contract: at most two in flight)."""
        import torch

        if not isinstance(handle, LowLatencyHandle):
            raise TypeError(f"handle: expected the handle low_latency_dispatch returned, got "
                            f"{type(handle).__name__}")
        _, _, cap, hidden, num_experts = handle
        b = self._buffer
        state = self._ll_state()
        key = (state["parity"], cap, hidden, num_experts)
        buffers = state["combine_buffers"].get(key)
        if buffers is None:
            L = num_experts // b.num_ranks
            device = f"cuda:{b._device_index}"
            buffers = [torch.empty((L, b.num_ranks * cap, hidden), dtype=torch.bfloat16,
                                   device=device)
                       for _ in range(b.num_ranks if b.virtual else 1)]
            state["combine_buffers"][key] = buffers
        return b._ranks_out(buffers)

    def _ll_check_mode(self, call):
        if not self.low_latency_mode:
            raise ValueError(f"{call}: this Buffer was made with low_latency_mode=False (DeepEP "
                             "V1 needs low_latency_mode=True and num_rdma_bytes from "
                             "get_low_latency_rdma_size_hint)")

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False):
        raise NotImplementedError("low_latency_update_mask_buffer: epic has no rank masking "
                                  "(DeepEP's fault-tolerant low-latency mode)")

    def low_latency_query_mask_buffer(self, mask_status):
        raise NotImplementedError("low_latency_query_mask_buffer: epic has no rank masking "
                                  "(DeepEP's fault-tolerant low-latency mode)")

    def low_latency_clean_mask_buffer(self):
        raise NotImplementedError("low_latency_clean_mask_buffer: epic has no rank masking "
                                  "(DeepEP's fault-tolerant low-latency mode)")
