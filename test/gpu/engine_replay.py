"""The inference engines' DeepEP V2 call sequences, replayed on ``epic.deep_ep`` with the
engines' own argument names and values (vLLM's and SGLang's ``deepep_v2`` backends), on real
NCCL ranks, each result checked against epic.reference:

    torchrun --nproc-per-node N test/gpu/engine_replay.py
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
with the layout tensors and ``Config`` (6-tuple), ``combine``. Rank 0 prints one line per check
with every rank's verdict.
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


def compile_only(args):
    from epic import _C

    runtime = _C.Runtime("nccl", "", "")
    count = 0
    for spec, variant, kind in kernel_sets(args.world_size):
        runtime.kernels(spec, variant, kind)
        count += 1
    print(f"engine_replay: {count} kernel sets for {args.world_size} NCCL ranks in "
          f"{runtime.cache_dir}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_compile_only_arguments(parser)
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args)

    import torch
    import torch.distributed as dist

    import epic.deep_ep as deep_ep
    from epic import reference as ref
    from epic._tensors import numpy_to_torch, torch_to_numpy

    rank, world = init_distributed(EXPERTS)
    group = dist.group.WORLD
    to_torch, to_numpy = numpy_to_torch, torch_to_numpy
    L = EXPERTS // world
    results = {}
    counts, xs8, sfs, idxs, ws = make_inputs(world, TOKENS, seed=3)
    xs16 = [ref.per_token_cast_back(x, sf) for x, sf in zip(xs8, sfs)]

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
            x=to_torch(xs16[rank]), topk_idx=to_torch(idxs[rank]),
            topk_weights=to_torch(ws[rank]), num_experts=EXPERTS,
            num_max_tokens_per_rank=TOKENS, do_expand=expand, do_cpu_sync=cpu_sync,
            async_with_compute_stream=False)
        e = expected[rank]
        if cpu_sync:  # what vLLM's prefill reads off the handle
            rows = to_numpy(recv_x)
            ok = handle.num_recv_tokens_per_expert_list == e.num_recv_tokens_per_expert_list
            ok &= to_numpy(handle.psum_num_recv_tokens_per_scaleup_rank).tobytes() == \
                e.psum_num_recv_tokens_per_scaleup_rank.tobytes()
            ok &= rows.shape == e.recv_x.shape
        else:  # decode: worst-case shapes, the real rows first
            rows = to_numpy(recv_x)[:e.recv_x.shape[0]]
            ok = recv_x.shape[0] >= e.recv_x.shape[0]
        got = dataclasses.replace(e, recv_x=rows, recv_src_metadata=to_numpy(
            handle.recv_src_metadata)[:e.recv_src_metadata.shape[0]])
        if not expand:
            # topk_idx_t wide (EP_NUM_TOPK_IDX_BITS), compared as the reference's int64.
            got = dataclasses.replace(got, recv_topk_idx=to_numpy(recv_topk_idx)[
                :e.recv_topk_idx.shape[0]].astype(np.int64))
        s = ref.sort_by_source(got)
        ok &= all(getattr(s, f).tobytes() == getattr(e, f).tobytes()
                  for f in ("recv_x", "recv_src_metadata"))
        if not expand:
            ok &= s.recv_topk_idx.tobytes() == e.recv_topk_idx.tobytes()
            ok &= recv_topk_idx.dtype == deep_ep.topk_idx_t
        results[f"vLLM {name}: dispatch (do_expand={expand}, do_cpu_sync={cpu_sync})"] = ok
        y = (recv_x.float() * 2).to(torch.bfloat16)
        combined, _, _ = buffer.combine(y, handle, topk_weights=None,
                                        async_with_compute_stream=False,
                                        allocate_on_comm_stream=False)
        ys = [(x.recv_x.astype(np.float32) * 2).astype(ref.bfloat16) for x in expected]
        want = ref.combine(ys, expected)[rank]
        results[f"vLLM {name}: combine(topk_weights=None) (bitwise)"] = (
            to_numpy(combined).tobytes() == want.combined_x.tobytes())
    # DeepEP's async protocol on the same buffer (what EP_AVOID_RECORD_STREAM and a narrow
    # topk_idx_t change): the event covers the rows and the ids.
    sync = buffer.dispatch(x=to_torch(xs16[rank]), topk_idx=to_torch(idxs[rank]),
                           topk_weights=to_torch(ws[rank]), num_experts=EXPERTS)
    recv_x, recv_topk_idx, _, handle, event = buffer.dispatch(
        x=to_torch(xs16[rank]), topk_idx=to_torch(idxs[rank]), topk_weights=to_torch(ws[rank]),
        num_experts=EXPERTS, async_with_compute_stream=True, allocate_on_comm_stream=True)
    event.current_stream_wait()

    def by_source(h):  # rows arrive in slot order: compare them by source token
        return torch.argsort(h.recv_src_metadata[:, 0])

    a, b = by_source(handle), by_source(sync[3])
    results["DeepEP async dispatch: same rows and ids as the synchronous one"] = (
        torch.equal(recv_x[a], sync[0][b]) and torch.equal(recv_topk_idx[a], sync[1][b])
        and recv_topk_idx.dtype == deep_ep.topk_idx_t)
    buffer.destroy()

    # --- SGLang deepep_v2 -------------------------------------------------------------------
    buffer = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=TOKENS, hidden=HIDDEN,
                                   num_topk=TOPK, use_fp8_dispatch=True, allow_hybrid_mode=True,
                                   sl_idx=0, prefer_overlap_with_compute=False)
    sms = buffer.get_theoretical_num_sms(EXPERTS, TOPK)
    expected = ref.dispatch(xs8, idxs, ws, sfs, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS,
                            expert_alignment=128, expand=True)
    (data, sf), _, recv_w, handle, _ = buffer.dispatch(
        (to_torch(xs8[rank]), to_torch(sfs[rank])), to_torch(idxs[rank]), to_torch(ws[rank]),
        num_experts=EXPERTS, expert_alignment=128, num_sms=sms, num_qps=0,
        use_tma_aligned_col_major_sf=True, do_cpu_sync=True, do_expand=True)
    e = expected[rank]
    # Without zero padding the alignment rows hold anything: the counts and offsets are
    # compared here, the rows through the combine below (which reads every real row).
    ok = handle.num_recv_tokens_per_expert_list == e.num_recv_tokens_per_expert_list
    ok &= to_numpy(handle.psum_num_recv_tokens_per_expert).tobytes() == \
        e.psum_num_recv_tokens_per_expert.tobytes()
    ok &= sf.stride(0) == 1 and tuple(sf.shape) == e.recv_scale_packs.shape  # TMA col-major
    results["SGLang: FP8 expanded dispatch (alignment 128, col-major sf, psum per expert)"] = ok
    y = toy_expert_torch(torch, data, sf.contiguous(), handle.num_recv_tokens_per_expert_list, L)
    combined, combined_w, _ = buffer.combine(y, handle=handle, topk_weights=recv_w, num_sms=sms,
                                             num_qps=0)
    want = toy_expert_combined(torch, expected, L, rank)
    results["SGLang: combine with weights (bitwise)"] = (
        to_numpy(combined).tobytes() == want.combined_x.tobytes()
        and to_numpy(combined_w).tobytes() == want.combined_topk_weights.tobytes())
    buffer.destroy()

    # --- DeepEP V1 normal mode (vLLM deepep_high_throughput, SGLang's normal dispatcher) ---
    buffer = deep_ep.Buffer(group, num_nvl_bytes=256 << 20, num_rdma_bytes=0,
                            low_latency_mode=False, num_qps_per_rank=1, explicitly_destroy=True)
    expected = ref.dispatch(xs16, idxs, ws, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS)
    layout = ref.dispatch_layout(idxs[rank], EXPERTS, world)
    per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(
        to_torch(idxs[rank]), EXPERTS, previous_event=None, async_finish=False,
        allocate_on_comm_stream=False)
    results["V1: get_dispatch_layout (5-tuple, counts)"] = (
        per_rdma is None and to_numpy(per_rank).tobytes() == layout[0].tobytes()
        and to_numpy(per_expert).tobytes() == layout[1].tobytes()
        and to_numpy(in_rank).tobytes() == layout[2].tobytes())
    config = deep_ep.Buffer.get_dispatch_config(world)
    recv_x, recv_topk_idx, recv_w, counts_list, handle, event = buffer.dispatch(
        to_torch(xs16[rank]), handle=None, num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=to_torch(idxs[rank]),
        topk_weights=to_torch(ws[rank]), expert_alignment=1, config=config, previous_event=None,
        async_finish=False, allocate_on_comm_stream=False)
    e = expected[rank]
    got = dataclasses.replace(e, recv_x=to_numpy(recv_x),
                              recv_topk_idx=to_numpy(recv_topk_idx).astype(np.int64),
                              recv_topk_weights=to_numpy(recv_w),
                              recv_src_metadata=to_numpy(handle.recv_src_metadata))
    s = ref.sort_by_source(got)
    results["V1: dispatch (6-tuple: rows, ids, weights, counts)"] = all(
        getattr(s, f).tobytes() == getattr(e, f).tobytes()
        for f in ("recv_x", "recv_topk_idx", "recv_topk_weights", "recv_src_metadata")) and \
        counts_list == e.num_recv_tokens_per_expert_list
    y = (recv_x.float() * 2).to(torch.bfloat16)
    combined, combined_w, event = buffer.combine(
        y, handle, topk_weights=recv_w, config=deep_ep.Buffer.get_combine_config(world),
        previous_event=None, async_finish=False, allocate_on_comm_stream=False)
    ys = [(x.recv_x.astype(np.float32) * 2).astype(ref.bfloat16) for x in expected]
    want = ref.combine(ys, expected, topk_weights=[x.recv_topk_weights for x in expected])[rank]
    results["V1: combine with weights (bitwise)"] = (
        to_numpy(combined).tobytes() == want.combined_x.tobytes()
        and to_numpy(combined_w).tobytes() == want.combined_topk_weights.tobytes())
    buffer.destroy()

    verdicts = [None] * world
    dist.all_gather_object(verdicts, results)
    dist.destroy_process_group()
    if rank == 0:
        for name in results:
            marks = "".join("." if v[name] else "F" for v in verdicts)
            print(f"  {name:<78} {'ok' if all(v[name] for v in verdicts) else 'FAILED'} [{marks}]")
        passed = all(all(v.values()) for v in verdicts)
        print(f"engine replay on {world} NCCL rank(s): {'passed' if passed else 'FAILED'}")
        return 0 if passed else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
