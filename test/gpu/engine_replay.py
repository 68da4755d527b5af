"""The inference engines' DeepEP V2 call sequences, replayed on ``epic.deep_ep`` with the
engines' own argument names and values (vLLM's and SGLang's ``deepep_v2`` backends), on real
NCCL ranks, each result checked against epic.reference:

    torchrun --nproc-per-node N test/gpu/engine_replay.py
    python test/gpu/engine_replay.py --virtual                        # a virtual world of 2
    python test/gpu/engine_replay.py --compile-only --world-size N   # here, fills the cache

vLLM: the buffer with the engine's timeouts (1800 s) and options, ``get_theoretical_num_sms``;
decode (``do_expand=False, do_cpu_sync=False``) and prefill (``do_expand=True,
do_cpu_sync=True``) dispatches with the handle fields vLLM reads, ``combine(x, handle,
topk_weights=None, async_with_compute_stream=False, allocate_on_comm_stream=False)``,
``destroy()``. SGLang: its buffer (``sl_idx=0, prefer_overlap_with_compute=False``), an FP8
expanded dispatch with ``expert_alignment=128``, ``num_sms``, ``num_qps``,
``use_tma_aligned_col_major_sf=True``, the ``psum_num_recv_tokens_per_expert`` it reads, and
``combine(x, handle=..., topk_weights=..., num_sms=..., num_qps=...)``. DeepEP V1's normal mode
(vLLM's ``deepep_high_throughput``, SGLang's normal dispatcher): ``Buffer(group, num_nvl_bytes,
num_rdma_bytes, low_latency_mode=False, ...)``, ``get_dispatch_layout`` (5-tuple), ``dispatch``
with the layout tensors and ``Config`` (6-tuple), ``combine``. DeepEP V1's low-latency mode
(vLLM's ``deepep_low_latency``, SGLang's low-latency dispatcher): ``Buffer(low_latency_mode=True,
num_rdma_bytes=get_low_latency_rdma_size_hint(...))``, ``low_latency_dispatch`` (FP8, with the
receive hook; async), ``low_latency_combine`` (into ``out``; zero-copy through
``get_next_low_latency_combine_buffer``, async). Rank 0 prints one line per check with every
rank's verdict.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import numpy as np  # noqa: E402

from common import (GROUP, add_compile_only_arguments, init_distributed, make_inputs,  # noqa: E402
                    toy_expert_combined, toy_expert_torch)

HIDDEN, EXPERTS, TOPK, TOKENS = 7168, 256, 8, 128
VIRTUAL_RANKS = 2
VLLM_TIMEOUT_MS = 1800 * 1000


def kernel_sets(world):
    """(spec, variant, kind) of every call below: compiled ahead (the GPU machine has no
    compiler)."""
    def spec(dtype, expand, alignment, **extra):
        return dict(num_ranks=world, num_experts=EXPERTS, num_topk=TOPK, hidden=HIDDEN,
                    dtype=dtype, num_scale_packs=HIDDEN // GROUP if dtype != "bf16" else 0,
                    expert_alignment=alignment, do_expand=expand,
                    num_max_tokens_per_rank=TOKENS, **extra)

    dispatch = dict(weights=True, cached=False, zero_padding=False, window_outputs=False)
    for expand in (False, True):  # vLLM decode, prefill
        s = spec("bf16", expand, 1, timeout_ms=VLLM_TIMEOUT_MS)
        yield s, dispatch, "dispatch"
        yield s, dict(weights=False, biases=0, window_outputs=False), "combine"
    s = spec("f8E4M3FN", True, 128)  # SGLang
    yield s, dispatch, "dispatch"
    yield s, dict(weights=True, biases=0, window_outputs=False), "combine"
    # DeepEP V1's normal mode: the layout, a plain BF16 dispatch with weights, their combine.
    yield dict(spec("bf16", False, 1), hidden=128), dict(topk_idx_bits=64), "dispatch_layout"
    yield spec("bf16", False, 1), dispatch, "dispatch"
    yield spec("bf16", False, 1), dict(weights=True, biases=0, window_outputs=False), "combine"
    # DeepEP V1's low-latency mode: FP8 dispatch (vLLM's and SGLang's), its combine; the ids as
    # deep_ep.topk_idx_t (64 bits, or 32 with EP_NUM_TOPK_IDX_BITS=32).
    for bits in (64, 32):
        yield dict(spec("f8E4M3FN", False, 1)), dict(round_scale=False, use_ue8m0=False,
                                                     parity=0, topk_idx_bits=bits), \
            "low_latency_dispatch"
        yield spec("bf16", False, 1), dict(parity=0, topk_idx_bits=bits), "low_latency_combine"


def compile_only(args):
    from epic import _C

    count = 0
    for backend in ("nccl", "virtual"):
        runtime = _C.Runtime(backend, "", "")
        ranks = args.world_size if backend == "nccl" else VIRTUAL_RANKS
        for spec, variant, kind in kernel_sets(ranks):
            runtime.kernels(spec, variant, kind)
            count += 1
    print(f"engine_replay: {count} kernel sets for {args.world_size} NCCL ranks and a virtual "
          f"world of {VIRTUAL_RANKS} in {runtime.cache_dir}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_compile_only_arguments(parser)
    parser.add_argument("--virtual", action="store_true",
                        help=f"a virtual world of {VIRTUAL_RANKS} ranks on one GPU, no torchrun: "
                             "the same calls with one value per rank")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args)

    import torch

    import epic
    import epic.deep_ep as deep_ep
    from epic import reference as ref
    from epic._tensors import numpy_to_torch, torch_to_numpy

    V = args.virtual
    if V:
        rank, world = 0, VIRTUAL_RANKS
        group = epic.VirtualWorld(world)
    else:
        import torch.distributed as dist

        rank, world = init_distributed(EXPERTS)
        group = dist.group.WORLD
    served = list(range(world)) if V else [rank]
    to_torch, to_numpy = numpy_to_torch, torch_to_numpy

    def arg(values, convert=to_torch):
        """A call's argument: this rank's value, or every rank's (a virtual world)."""
        return [convert(v) for v in values] if V else convert(values[rank])

    def each(out):
        """A call's result per served rank."""
        return out if V else [out]

    def fp8(p):
        return to_torch(p[0]), to_torch(p[1])

    L = EXPERTS // world
    results = {}
    counts, xs8, sfs, idxs, ws = make_inputs(world, TOKENS, seed=3)
    xs16 = [ref.per_token_cast_back(x, sf) for x, sf in zip(xs8, sfs)]

    def rows_ok(expected, r, recv_x, handle, recv_topk_idx=None, recv_w=None, worst=False,
                tmax=TOKENS):
        """One rank's received rows (and ids, weights) against the reference, by source. The
        source ids are src_rank x tmax + token: `tmax` is the call's cap, the reference's is
        TOKENS."""
        e = expected[r]
        n = e.recv_x.shape[0]
        rows = to_numpy(recv_x)
        ok = rows.shape[0] >= n if worst else rows.shape == e.recv_x.shape
        meta = to_numpy(handle.recv_src_metadata)[:n].copy()
        meta[:, 0] = meta[:, 0] // tmax * TOKENS + meta[:, 0] % tmax
        got = dataclasses.replace(e, recv_x=rows[:n], recv_src_metadata=meta)
        fields = ["recv_x", "recv_src_metadata"]
        if recv_topk_idx is not None:  # topk_idx_t wide, compared as the reference's int64
            got = dataclasses.replace(got, recv_topk_idx=to_numpy(recv_topk_idx)[:n].astype(
                np.int64))
            fields.append("recv_topk_idx")
        if recv_w is not None:
            got = dataclasses.replace(got, recv_topk_weights=to_numpy(recv_w)[:n])
            fields.append("recv_topk_weights")
        s = ref.sort_by_source(got)
        return ok and all(getattr(s, f).tobytes() == getattr(e, f).tobytes() for f in fields)

    # --- vLLM deepep_v2 ---------------------------------------------------------------------
    buffer = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=TOKENS, hidden=HIDDEN,
                                   num_topk=TOPK, use_fp8_dispatch=False, allow_hybrid_mode=True,
                                   prefer_overlap_with_compute=True,
                                   allow_multiple_reduction=True, num_cpu_timeout_secs=1800,
                                   num_gpu_timeout_secs=1800, explicitly_destroy=True)
    sms = buffer.get_theoretical_num_sms(EXPERTS, TOPK)
    results["vLLM: get_theoretical_num_sms"] = isinstance(sms, int) and sms > 0
    for name, expand, cpu_sync in (("decode", False, False), ("prefill", True, True)):
        expected = ref.dispatch(xs16, idxs, ws, num_experts=EXPERTS,
                                num_max_tokens_per_rank=TOKENS, expand=expand)
        recv_x, recv_topk_idx, recv_topk_weights, handle, event = buffer.dispatch(
            x=arg(xs16), topk_idx=arg(idxs), topk_weights=arg(ws), num_experts=EXPERTS,
            num_max_tokens_per_rank=TOKENS, do_expand=expand, do_cpu_sync=cpu_sync,
            async_with_compute_stream=False)
        ok = True
        for r, rx, ri, h in zip(served, each(recv_x), each(recv_topk_idx), each(handle)):
            e = expected[r]
            if cpu_sync:  # what vLLM's prefill reads off the handle
                ok &= h.num_recv_tokens_per_expert_list == e.num_recv_tokens_per_expert_list
                ok &= to_numpy(h.psum_num_recv_tokens_per_scaleup_rank).tobytes() == \
                    e.psum_num_recv_tokens_per_scaleup_rank.tobytes()
            ok &= rows_ok(expected, r, rx, h, None if expand else ri, worst=not cpu_sync)
            if not expand:
                ok &= ri.dtype == deep_ep.topk_idx_t
        results[f"vLLM {name}: dispatch (do_expand={expand}, do_cpu_sync={cpu_sync})"] = ok
        y = [(rx.float() * 2).to(torch.bfloat16) for rx in each(recv_x)]
        combined, _, _ = buffer.combine(y if V else y[0], handle, topk_weights=None,
                                        async_with_compute_stream=False,
                                        allocate_on_comm_stream=False)
        ys = [(x.recv_x.astype(np.float32) * 2).astype(ref.bfloat16) for x in expected]
        want = ref.combine(ys, expected)
        results[f"vLLM {name}: combine(topk_weights=None) (bitwise)"] = all(
            to_numpy(c).tobytes() == want[r].combined_x.tobytes()
            for r, c in zip(served, each(combined)))
    # DeepEP's async protocol on the same buffer (what EP_AVOID_RECORD_STREAM and a narrow
    # topk_idx_t change): the event covers the rows and the ids.
    sync = buffer.dispatch(x=arg(xs16), topk_idx=arg(idxs), topk_weights=arg(ws),
                           num_experts=EXPERTS)
    recv_x, recv_topk_idx, _, handle, event = buffer.dispatch(
        x=arg(xs16), topk_idx=arg(idxs), topk_weights=arg(ws), num_experts=EXPERTS,
        async_with_compute_stream=True, allocate_on_comm_stream=True)
    event.current_stream_wait()

    def by_source(h):  # rows arrive in slot order: compare them by source token
        return torch.argsort(h.recv_src_metadata[:, 0])

    ok = True
    for rx, ri, h, sx, si, sh in zip(each(recv_x), each(recv_topk_idx), each(handle),
                                     each(sync[0]), each(sync[1]), each(sync[3])):
        a, b = by_source(h), by_source(sh)
        ok &= torch.equal(rx[a], sx[b]) and torch.equal(ri[a], si[b])
        ok &= ri.dtype == deep_ep.topk_idx_t
    results["DeepEP async dispatch: same rows and ids as the synchronous one"] = ok
    buffer.destroy()

    # --- SGLang deepep_v2 -------------------------------------------------------------------
    buffer = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=TOKENS, hidden=HIDDEN,
                                   num_topk=TOPK, use_fp8_dispatch=True, allow_hybrid_mode=True,
                                   sl_idx=0, prefer_overlap_with_compute=False)
    sms = buffer.get_theoretical_num_sms(EXPERTS, TOPK)
    expected = ref.dispatch(xs8, idxs, ws, sfs, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS,
                            expert_alignment=128, expand=True)
    (data, sf), _, recv_w, handle, _ = _unzip_fp8(V, buffer.dispatch(
        arg(list(zip(xs8, sfs)), fp8), arg(idxs), arg(ws),
        num_experts=EXPERTS, expert_alignment=128, num_sms=sms, num_qps=0,
        use_tma_aligned_col_major_sf=True, do_cpu_sync=True, do_expand=True))
    # Without zero padding the alignment rows hold anything: the counts and offsets are
    # compared here, the rows through the combine below (which reads every real row).
    ok = True
    for r, h, f in zip(served, each(handle), each(sf)):
        e = expected[r]
        ok &= h.num_recv_tokens_per_expert_list == e.num_recv_tokens_per_expert_list
        ok &= to_numpy(h.psum_num_recv_tokens_per_expert).tobytes() == \
            e.psum_num_recv_tokens_per_expert.tobytes()
        ok &= f.stride(0) == 1 and tuple(f.shape) == e.recv_scale_packs.shape  # TMA col-major
    results["SGLang: FP8 expanded dispatch (alignment 128, col-major sf, psum per expert)"] = ok
    y = [toy_expert_torch(torch, d, f.contiguous(), h.num_recv_tokens_per_expert_list, L)
         for d, f, h in zip(each(data), each(sf), each(handle))]
    combined, combined_w, _ = buffer.combine(y if V else y[0], handle=handle, topk_weights=recv_w,
                                             num_sms=sms, num_qps=0)
    ok = True
    for r, c, cw in zip(served, each(combined), each(combined_w)):
        want = toy_expert_combined(torch, expected, L, r)
        ok &= to_numpy(c).tobytes() == want.combined_x.tobytes()
        ok &= to_numpy(cw).tobytes() == want.combined_topk_weights.tobytes()
    results["SGLang: combine with weights (bitwise)"] = ok
    buffer.destroy()

    # --- DeepEP V1 normal mode (vLLM deepep_high_throughput, SGLang's normal dispatcher) ---
    buffer = deep_ep.Buffer(group, num_nvl_bytes=256 << 20, num_rdma_bytes=0,
                            low_latency_mode=False, num_qps_per_rank=1, explicitly_destroy=True)
    expected = ref.dispatch(xs16, idxs, ws, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS)
    per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(
        arg(idxs), EXPERTS, previous_event=None, async_finish=False,
        allocate_on_comm_stream=False)
    ok = per_rdma is None
    for r, pr, pe, ir in zip(served, each(per_rank), each(per_expert), each(in_rank)):
        layout = ref.dispatch_layout(idxs[r], EXPERTS, world)
        ok &= to_numpy(pr).tobytes() == layout[0].tobytes()
        ok &= to_numpy(pe).tobytes() == layout[1].tobytes()
        ok &= to_numpy(ir).tobytes() == layout[2].tobytes()
    results["V1: get_dispatch_layout (5-tuple, counts)"] = ok
    config = deep_ep.Buffer.get_dispatch_config(world)
    recv_x, recv_topk_idx, recv_w, counts_list, handle, event = buffer.dispatch(
        arg(xs16), handle=None, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=arg(idxs),
        topk_weights=arg(ws), expert_alignment=1, config=config, previous_event=None,
        async_finish=False, allocate_on_comm_stream=False)
    ok = True
    for r, rx, ri, rw, cl, h in zip(served, each(recv_x), each(recv_topk_idx), each(recv_w),
                                    each(counts_list) if V else [counts_list], each(handle)):
        # V1 has no token cap: the buffer takes the largest its bytes hold.
        ok &= rows_ok(expected, r, rx, h, ri, rw, tmax=buffer._cap(HIDDEN, TOPK, False))
        ok &= cl == expected[r].num_recv_tokens_per_expert_list
    results["V1: dispatch (6-tuple: rows, ids, weights, counts)"] = ok
    y = [(rx.float() * 2).to(torch.bfloat16) for rx in each(recv_x)]
    combined, combined_w, event = buffer.combine(
        y if V else y[0], handle, topk_weights=recv_w,
        config=deep_ep.Buffer.get_combine_config(world), previous_event=None,
        async_finish=False, allocate_on_comm_stream=False)
    ys = [(x.recv_x.astype(np.float32) * 2).astype(ref.bfloat16) for x in expected]
    want = ref.combine(ys, expected, topk_weights=[x.recv_topk_weights for x in expected])
    results["V1: combine with weights (bitwise)"] = all(
        to_numpy(c).tobytes() == want[r].combined_x.tobytes()
        and to_numpy(cw).tobytes() == want[r].combined_topk_weights.tobytes()
        for r, c, cw in zip(served, each(combined), each(combined_w)))
    buffer.destroy()

    # --- DeepEP V1 low-latency mode (vLLM deepep_low_latency, SGLang's LL dispatcher) ------
    rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank=TOKENS, hidden=HIDDEN, num_ranks=world,
        num_experts=EXPERTS)
    buffer = deep_ep.Buffer(group, num_nvl_bytes=0, num_rdma_bytes=rdma, low_latency_mode=True,
                            num_qps_per_rank=EXPERTS // world,
                            allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                            explicitly_destroy=True)
    ids_t = [i.astype(np.int32 if deep_ep.topk_idx_t == torch.int32 else np.int64) for i in idxs]
    want = ref.low_latency_dispatch(xs16, idxs, EXPERTS, TOKENS, use_fp8=True)
    rng = np.random.default_rng(4)
    ys = []
    for w in want:
        y = np.zeros((L, world * TOKENS, HIDDEN), ref.bfloat16)
        for local, n in enumerate(w.recv_count):
            y[local, :int(n)] = rng.standard_normal((int(n), HIDDEN)).astype(ref.bfloat16)
        ys.append(y)
    want_combined = ref.low_latency_combine(ys, want, idxs, ws)

    def ll_dispatch_ok(recv, count, handle):
        return all(ll_received_ok(want[r], data_sf, c, src_info=src, layout_range=rng_)
                   for r, data_sf, c, src, rng_ in zip(served, each(recv), each(count),
                                                        each(handle[0]), each(handle[1])))

    # vLLM: dispatch with the receive hook, the expert output into `out`; three layers (the
    # second and third replay the signatures the first checked: epic's hot path).
    ok_dispatch = ok_combine = True
    for _ in range(3):
        recv, count, handle, _, hook = buffer.low_latency_dispatch(
            arg(xs16), arg(ids_t), TOKENS, num_experts=EXPERTS, use_fp8=True, round_scale=False,
            use_ue8m0=False, async_finish=False, return_recv_hook=True)
        hook()
        ok_dispatch &= ll_dispatch_ok(recv, count, handle)
        out = arg([np.zeros((x.shape[0], HIDDEN), ref.bfloat16) for x in xs16])
        combined, _, hook = buffer.low_latency_combine(
            arg(ys), arg(ids_t), arg(ws), handle, async_finish=False, zero_copy=False,
            return_recv_hook=False, out=out)
        ok_combine &= all(to_numpy(c).tobytes() == want_combined[r].tobytes() and c is o
                          for r, c, o in zip(served, each(combined), each(out)))
    results["V1 low-latency (vLLM): FP8 dispatch + recv hook vs reference (3 layers)"] = \
        ok_dispatch
    results["V1 low-latency (vLLM): combine into out (bitwise, 3 layers)"] = ok_combine
    # SGLang: async_finish without a hook, events waited on; then the zero-copy combine.
    recv, count, handle, event, hook = buffer.low_latency_dispatch(
        arg(xs16), arg(ids_t), TOKENS, EXPERTS, use_fp8=True, async_finish=True,
        return_recv_hook=False, round_scale=False, use_ue8m0=False)
    event.current_stream_wait()
    results["V1 low-latency (SGLang): async FP8 dispatch vs reference"] = \
        hook is None and ll_dispatch_ok(recv, count, handle)
    staged = buffer.get_next_low_latency_combine_buffer(handle)
    for s_, y in zip(each(staged), ys if V else [ys[rank]]):
        s_.copy_(to_torch(y))
    combined, event, hook = buffer.low_latency_combine(
        x=staged, topk_idx=arg(ids_t), topk_weights=arg(ws), handle=handle, zero_copy=True,
        async_finish=True, return_recv_hook=False)
    event.current_stream_wait()
    results["V1 low-latency (SGLang): async zero-copy combine (bitwise)"] = all(
        to_numpy(c).tobytes() == want_combined[r].tobytes()
        for r, c in zip(served, each(combined)))
    buffer.destroy()
    if not V:  # epic's replay path (one rank per process) pools its outputs
        results["V1 low-latency: replay pool, graph, refused after destroy"] = \
            check_ll_output_pool(torch, deep_ep, group, rdma, to_torch(xs16[rank]),
                                 to_torch(ids_t[rank]), to_torch(ws[rank]), to_torch(ys[rank]),
                                 want[rank], want_combined[rank])

    if V:
        verdicts = [results]
    else:
        verdicts = [None] * world
        dist.all_gather_object(verdicts, results)
        dist.destroy_process_group()
    if rank == 0:
        where = f"a virtual world of {world} ranks" if V else f"{world} NCCL rank(s)"
        for name in results:
            marks = "".join("." if v[name] else "F" for v in verdicts)
            print(f"  {name:<78} {'ok' if all(v[name] for v in verdicts) else 'FAILED'} [{marks}]")
        passed = all(all(v.values()) for v in verdicts)
        print(f"engine replay on {where}: {'passed' if passed else 'FAILED'}")
        return 0 if passed else 1
    return 0


def ll_received_ok(want, recv, count, scale=1, src_info=None, layout_range=None):
    """One rank's FP8 low-latency dispatch against the reference's `want`, bitwise: counts,
    every expert's valid rows and scales (times `scale`: inputs scaled by a power of two), and
    when given, the sources and layout ranges."""
    from epic._tensors import torch_to_numpy as to_numpy

    data, sf = recv
    ok = to_numpy(count).tobytes() == want.recv_count.tobytes()
    if layout_range is not None:
        ok &= to_numpy(layout_range).tobytes() == want.layout_range.tobytes()
    for local, n in enumerate(want.recv_count.tolist()):
        ok &= to_numpy(data[local, :n].contiguous()).tobytes() == want.recv_x[local, :n].tobytes()
        ok &= to_numpy(sf[local, :n].contiguous()).tobytes() == \
            (want.recv_scales[local, :n] * np.float32(scale)).tobytes()
        if src_info is not None:
            ok &= to_numpy(src_info[local, :n]).tobytes() == want.src_info[local, :n].tobytes()
    return bool(ok)


def check_ll_output_pool(torch, deep_ep, group, rdma, x, idx, w, y, want, want_combined):
    """On a fresh buffer: calls alternate two window regions (parities), each signature's
    replay has its own pool. A set a caller still holds (here through a view of a view of the
    scales) is never written again; a released one is handed out again; every result is
    bitwise. Inputs doubled give the same FP8 rows with doubled scales, and a doubled combine
    (scaling by 2 is exact), so each call's expected values are known."""
    from epic import reference as ref
    from epic._tensors import torch_to_numpy as to_numpy

    E, cap = want.recv_count.shape[0], TOKENS  # one rank: every expert is local
    buffer = deep_ep.Buffer(group, num_rdma_bytes=rdma, low_latency_mode=True,
                            num_qps_per_rank=E, explicitly_destroy=True)
    x2, y2 = x * 2, y * 2

    def dispatch(xi, scale):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(xi, idx, cap, E, use_fp8=True)
        torch.cuda.synchronize()
        return ll_received_ok(want, recv, count, scale), recv, handle

    ok = dispatch(x, 1)[0] and dispatch(x, 1)[0]  # both parities' checked calls (not pooled)
    ptrs = []
    for i in range(7):  # replays: parity 0 at even i, 1 at odd i
        good, recv, handle = dispatch(x if i == 0 else x2, 1 if i == 0 else 2)
        ok &= good
        ptrs.append(recv[0].data_ptr())
        if i == 0:
            held = recv[1].transpose(1, 2)[:, :1]  # the caller keeps a view of a view
            held_want = to_numpy(held.contiguous()).copy()
        del recv
    ok &= np.array_equal(to_numpy(held.contiguous()), held_want)  # never written again
    ok &= ptrs[2] != ptrs[0] and ptrs[4] == ptrs[2] and ptrs[3] == ptrs[1] == ptrs[5]
    del held
    good, recv, handle = dispatch(x2, 2)  # parity 1: set of call 1 again
    ok &= good and recv[0].data_ptr() == ptrs[1]
    good, recv, handle = dispatch(x2, 2)  # parity 0: the first set is free again
    ok &= good and recv[0].data_ptr() == ptrs[0]
    # The combine's `out`: held results keep their values.
    twice = (want_combined.astype(np.float32) * 2).astype(ref.bfloat16)
    outs = [buffer.low_latency_combine(yi, idx, w, handle)[0] for yi in (y, y2, y2, y2)]
    torch.cuda.synchronize()
    ok &= to_numpy(outs[0]).tobytes() == want_combined.tobytes()
    ok &= all(to_numpy(o).tobytes() == twice.tobytes() for o in outs[1:])
    ok &= len({o.data_ptr() for o in outs}) == 4  # all held: four sets
    del outs, recv, handle
    ok &= check_ll_graph(torch, buffer, x, idx, w, y, want, want_combined, twice)
    buffer.destroy()
    try:  # a replayed signature after destroy(): refused by name, nothing launched
        buffer.low_latency_dispatch(x, idx, cap, E, use_fp8=True)
        ok = False
    except RuntimeError as e:
        ok &= "destroyed" in str(e)
    return bool(ok)


def check_ll_graph(torch, buffer, x, idx, w, y, want, want_combined, twice):
    """The replayed (pooled) path captured in a CUDA graph, as an engine's decode step: a
    dispatch and a combine on static inputs; each replay with new values in them gives that
    call's results, bitwise (doubled inputs: doubled scales and combine)."""
    from epic._tensors import torch_to_numpy as to_numpy

    E, cap = want.recv_count.shape[0], TOKENS
    static_x, static_y = x.clone(), y.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(static_x, idx, cap, E,
                                                                use_fp8=True)
        out, _, _ = buffer.low_latency_combine(static_y, idx, w, handle)
    ok = True
    for scale, xi, yi, combined in ((2, x * 2, y * 2, twice), (1, x, y, want_combined)):
        static_x.copy_(xi)
        static_y.copy_(yi)
        graph.replay()
        torch.cuda.synchronize()
        ok &= ll_received_ok(want, recv, count, scale)
        ok &= to_numpy(out).tobytes() == combined.tobytes()
    return ok


def _unzip_fp8(virtual, out):
    """An FP8 dispatch's results with recv_x as (data, sf): per rank lists of each in a virtual
    world (which returns one (data, sf) tuple per rank)."""
    recv_x, *rest = out
    if virtual:
        recv_x = ([d for d, _ in recv_x], [f for _, f in recv_x])
    return (recv_x, *rest)


if __name__ == "__main__":
    sys.exit(main())
