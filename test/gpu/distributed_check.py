"""The Python API on real ranks (one process per GPU, NCCL): DeepEP-style correctness checks.

    torchrun --nproc-per-node N test/gpu/distributed_check.py [--slow-rank 1]
    python test/gpu/distributed_check.py --compile-only --world-size N   # here, fills the cache

Every process generates every rank's inputs (deterministically), so each checks its own
results against epic.reference alone: plain BF16 with weights and two biases, FP8 expanded
(alignment 128, zero padding) with a cached dispatch, async events with previous_event, and
no CPU sync; uneven token counts and masked top-k throughout. Expert outputs are a function of
each row (doubling, or the examples' toy expert), so the combine reference does not depend on
the order rows arrived in. `--slow-rank r` makes rank r sleep before every dispatch. Rank 0
prints one line per check with every rank's verdict.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import numpy as np  # noqa: E402

import epic  # noqa: E402
from common import (GROUP, add_compile_only_arguments, init_distributed, make_inputs,  # noqa: E402
                    toy_expert_combined, toy_expert_torch)
from epic import reference as ref  # noqa: E402
from epic._tensors import numpy_to_torch, torch_to_numpy  # noqa: E402

HIDDEN, EXPERTS, TOPK, TOKENS = 7168, 256, 8, 128
# Check 6's FP8 expert MLP layer: 16 experts per rank (V3 has 32; half keeps a rank's weights
# small), DeepSeek V3's intermediate size.
LAYER_EXPERTS_PER_RANK, LAYER_INTERMEDIATE = 16, 2048


def configs(world):
    """(name, dtype, expand, alignment) of the checks; their kernels are compiled ahead."""
    return [("plain-bf16", "bf16", False, 1), ("expanded-fp8", "f8E4M3FN", True, 128)]


def compile_only(args):
    from epic import _C
    from epic.moe import layer_kernels

    runtime = _C.Runtime("nccl", "", "")
    count = 0
    for _, dtype, expand, alignment in configs(args.world_size):
        spec = dict(num_ranks=args.world_size, num_experts=EXPERTS, num_topk=TOPK, hidden=HIDDEN,
                    dtype=dtype, num_scale_packs=HIDDEN // GROUP if dtype != "bf16" else 0,
                    expert_alignment=alignment, do_expand=expand, num_max_tokens_per_rank=TOKENS)
        if dtype == "bf16":  # the missing-rank check: a 5 s bound
            runtime.kernels(dict(spec, timeout_ms=5000),
                            dict(weights=False, cached=False, zero_padding=False), "dispatch")
            count += 1
        for weights, cached, zero in ((True, False, expand), (False, False, False),
                                      (False, True, expand), (False, True, False)):
            runtime.kernels(spec, dict(weights=weights, cached=cached, zero_padding=zero),
                            "dispatch")
            count += 1
        for weights, biases in ((True, 2), (True, 0), (False, 0)):
            runtime.kernels(spec, dict(weights=weights, biases=biases), "combine")
            count += 1
        if not expand:  # 5.: outputs in the window, the combine reading x in place
            runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False,
                                       window_outputs=True), "dispatch")
            runtime.kernels(spec, dict(weights=True, biases=2, window_outputs=True), "combine")
            count += 2
    # 6.: the layer's five ops and its persistent kernel.
    spec = dict(num_ranks=args.world_size, num_experts=LAYER_EXPERTS_PER_RANK * args.world_size,
                num_topk=TOPK, hidden=HIDDEN, dtype="f8E4M3FN", num_scale_packs=HIDDEN // GROUP,
                expert_alignment=128, do_expand=True, num_max_tokens_per_rank=TOKENS)
    for persistent in (False, True):
        for variant, kind in layer_kernels(HIDDEN, LAYER_INTERMEDIATE, persistent):
            runtime.kernels(spec, variant, kind)
            count += 1
    print(f"distributed_check: {count} kernel sets for {args.world_size} NCCL ranks in "
          f"{runtime.cache_dir}")
    return 0


def persistent_layer_matches(buffer, rank, world):
    """Check 6: this rank's layer output from the persistent kernel is bitwise the five ops'."""
    import torch

    sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
    from ep_bench import quantize_blocks

    from epic.moe import moe_layer_fp8

    experts, L = LAYER_EXPERTS_PER_RANK * world, LAYER_EXPERTS_PER_RANK
    rng = np.random.default_rng(31 + rank)
    t = TOKENS - 5 * rank % 16
    idx = np.stack([rng.permutation(experts)[:TOPK] for _ in range(t)]).astype(np.int64)
    idx[rng.random(idx.shape) < 0.05] = -1
    g = torch.Generator(device="cuda").manual_seed(31 + rank)
    x = quantize_blocks(torch, torch.randn((t, HIDDEN), generator=g, device="cuda"), 1)
    w = torch.rand((t, TOPK), generator=g, device="cuda").softmax(dim=1)
    w13 = quantize_blocks(torch, torch.randn((L, 2 * LAYER_INTERMEDIATE, HIDDEN), generator=g,
                                             device="cuda") / HIDDEN ** 0.5, 128)
    w2 = quantize_blocks(torch, torch.randn((L, HIDDEN, LAYER_INTERMEDIATE), generator=g,
                                            device="cuda") / LAYER_INTERMEDIATE ** 0.5, 128)
    idx = torch.from_numpy(idx).cuda()

    def layer(persistent):
        return moe_layer_fp8(buffer, x, idx, w, w13, w2, num_experts=experts,
                             do_cpu_sync=False, persistent=persistent)

    want = layer(False).clone()
    ok = all(torch.equal(layer(True).view(torch.int16), want.view(torch.int16))
             for _ in range(3))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(True)
    for _ in range(2):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        ok &= torch.equal(captured.view(torch.int16), want.view(torch.int16))
    return ok


def missing_rank(args, rank, world):
    """Every rank but `args.missing_rank` dispatches; their kernels wait for it, time out after
    5 s, print which rank waited for what, and trap; the process reports the CUDA error."""
    import torch

    buffer = epic.ElasticBuffer(torch.distributed.group.WORLD, num_max_tokens_per_rank=TOKENS,
                                hidden=HIDDEN, num_topk=TOPK, num_gpu_timeout_secs=5)
    counts, xs8, sfs, idxs, ws = make_inputs(world, TOKENS, seed=7)
    xs16 = [ref.per_token_cast_back(x, sf) for x, sf in zip(xs8, sfs)]
    if rank == args.missing_rank:
        print(f"rank {rank}: not dispatching", flush=True)
        time.sleep(20)
        return 0
    try:
        buffer.dispatch(numpy_to_torch(xs16[rank]), numpy_to_torch(idxs[rank]),
                        num_experts=EXPERTS)
        torch.cuda.synchronize()
    except Exception as e:  # the trap surfaces as a CUDA error
        print(f"rank {rank}: dispatch failed as expected: {type(e).__name__}: {e}", flush=True)
        os._exit(3)  # CUDA is unusable after a trap: leave without cleanup
    print(f"rank {rank}: dispatch completed without rank {args.missing_rank}: WRONG", flush=True)
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_compile_only_arguments(parser)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--missing-rank", type=int, default=-1,
                        help="this rank never dispatches: the others must fail with the bounded "
                             "wait's diagnostic (a 5 s GPU timeout), not hang")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args)

    import torch
    import torch.distributed as dist

    rank, world = init_distributed(EXPERTS)
    to_torch, to_numpy = numpy_to_torch, torch_to_numpy
    if args.missing_rank >= 0:
        return missing_rank(args, rank, world)
    # num_bytes: room for check 5's outputs in the window besides the kernels' region.
    buffer = epic.ElasticBuffer(dist.group.WORLD, num_bytes=256 << 20,
                                num_max_tokens_per_rank=TOKENS, hidden=HIDDEN, num_topk=TOPK,
                                use_fp8_dispatch=True, explicitly_destroy=True)
    L = EXPERTS // world
    results = {}

    def slow():
        if rank == args.slow_rank:
            time.sleep(2.0)

    # Inputs of every rank: FP8 data + scales (and its BF16 image for the BF16 checks).
    counts, xs8, sfs, idxs, ws = make_inputs(world, TOKENS, seed=7)
    xs16 = [ref.per_token_cast_back(x, sf) for x, sf in zip(xs8, sfs)]
    rng = np.random.default_rng(11)
    biases = [(rng.standard_normal((t, HIDDEN)).astype(ref.bfloat16),
               rng.standard_normal((t, HIDDEN)).astype(ref.bfloat16)) for t in counts]

    # 1. Plain BF16, weights there and back, two biases; experts double their rows.
    expected = ref.dispatch(xs16, idxs, ws, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS)
    slow()
    recv, recv_idx, recv_w, handle, _ = buffer.dispatch(
        to_torch(xs16[rank]), to_torch(idxs[rank]), to_torch(ws[rank]), num_experts=EXPERTS)
    got = dataclasses.replace(expected[rank], recv_x=to_numpy(recv),
                              recv_topk_idx=to_numpy(recv_idx),
                              recv_topk_weights=to_numpy(recv_w),
                              recv_src_metadata=to_numpy(handle.recv_src_metadata))
    s = ref.sort_by_source(got)
    ok = all(getattr(s, f).tobytes() == getattr(expected[rank], f).tobytes()
             for f in ("recv_x", "recv_topk_idx", "recv_src_metadata"))
    ok &= handle.num_recv_tokens_per_expert_list == expected[rank].num_recv_tokens_per_expert_list
    results["plain BF16 dispatch (rows, ids, metadata, counts)"] = ok
    y = (recv.float() * 2).to(torch.bfloat16)
    out, out_w, _ = buffer.combine(y, handle, topk_weights=recv_w,
                                   bias=tuple(to_torch(b) for b in biases[rank]))
    ys = [(e.recv_x.astype(np.float32) * 2).astype(ref.bfloat16) for e in expected]
    want = ref.combine(ys, expected, topk_weights=[e.recv_topk_weights for e in expected],
                       bias=biases)[rank]
    results["plain BF16 combine + 2 biases, weights back (bitwise)"] = (
        to_numpy(out).tobytes() == want.combined_x.tobytes()
        and to_numpy(out_w).tobytes() == want.combined_topk_weights.tobytes())

    # 2. FP8 expanded, alignment 128, zero padding; cached dispatch lands rows identically.
    expected = ref.dispatch(xs8, idxs, ws, sfs, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS,
                            expert_alignment=128, expand=True, zero_padding=True)
    x_in = (to_torch(xs8[rank]), to_torch(sfs[rank]))
    slow()
    (data, sf), _, recv_w, handle, _ = buffer.dispatch(
        x_in, to_torch(idxs[rank]), to_torch(ws[rank]), num_experts=EXPERTS, expert_alignment=128,
        do_expand=True, do_zero_padding=True)
    got = dataclasses.replace(expected[rank], recv_x=to_numpy(data), recv_scale_packs=to_numpy(sf),
                              recv_topk_weights=to_numpy(recv_w),
                              recv_src_metadata=to_numpy(handle.recv_src_metadata))
    s = ref.sort_by_source(got)
    results["FP8 expanded dispatch (rows, packs, weights, zero padding)"] = all(
        getattr(s, f).tobytes() == getattr(expected[rank], f).tobytes()
        for f in ("recv_x", "recv_scale_packs", "recv_topk_weights", "recv_src_metadata"))
    (again, again_sf), _, _, _, _ = buffer.dispatch(x_in, handle=handle, do_expand=True,
                                                    do_zero_padding=True)
    results["cached FP8 expanded dispatch equals the first"] = (
        torch.equal(again.view(torch.uint8), data.view(torch.uint8)) and torch.equal(again_sf, sf))
    y = toy_expert_torch(torch, data, sf, handle.num_recv_tokens_per_expert_list, L)
    out, out_w, _ = buffer.combine(y, handle, topk_weights=recv_w)
    want = toy_expert_combined(torch, expected, L, rank)
    results["FP8 expanded combine, weights back (bitwise)"] = (
        to_numpy(out).tobytes() == want.combined_x.tobytes()
        and to_numpy(out_w).tobytes() == want.combined_topk_weights.tobytes())

    # 3. Async with previous_event, and without CPU sync: same results as above.
    slow()
    previous = epic.ElasticBuffer.capture()
    recv, _, _, handle, event = buffer.dispatch(
        to_torch(xs16[rank]), to_torch(idxs[rank]), num_experts=EXPERTS, previous_event=previous,
        async_with_compute_stream=True, allocate_on_comm_stream=True)
    event.current_stream_wait()
    out_async, _, event = buffer.combine((recv.float() * 2).to(torch.bfloat16), handle,
                                         async_with_compute_stream=True)
    event.current_stream_wait()
    recv, _, _, handle, _ = buffer.dispatch(to_torch(xs16[rank]), to_torch(idxs[rank]),
                                            num_experts=EXPERTS, do_cpu_sync=False)
    out_nosync, _, _ = buffer.combine((recv.float() * 2).to(torch.bfloat16), handle)
    ys = [(e.recv_x.astype(np.float32) * 2).astype(ref.bfloat16)
          for e in ref.dispatch(xs16, idxs, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS)]
    plain = ref.dispatch(xs16, idxs, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS)
    want = ref.combine(ys, plain)[rank].combined_x.tobytes()
    results["async events + previous_event (bitwise)"] = to_numpy(out_async).tobytes() == want
    results["no CPU sync, worst-case shapes (bitwise)"] = to_numpy(out_nosync).tobytes() == want

    # 4. A CUDA graph of dispatch (no CPU sync) + an expert + combine, captured once and
    #    replayed with new data written into the same inputs: what eager calls give.
    x_s, idx_s = to_torch(xs16[rank]), to_torch(idxs[rank])

    def step():
        recv, _, _, h, _ = buffer.dispatch(x_s, idx_s, num_experts=EXPERTS, do_cpu_sync=False)
        return buffer.combine((recv.float() * 2).to(torch.bfloat16), h)[0]

    step()  # warm-up: the plans are made and the kernels loaded outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = step()
    replays_ok = True
    for seed in (21, 22):
        _, new8, new_sf, new_idxs, _ = make_inputs(world, TOKENS, seed=seed)  # same counts
        new16 = [ref.per_token_cast_back(x, sf) for x, sf in zip(new8, new_sf)]
        x_s.copy_(to_torch(new16[rank])), idx_s.copy_(to_torch(new_idxs[rank]))
        slow()
        graph.replay()
        eager = step()
        ys = [(e.recv_x.astype(np.float32) * 2).astype(ref.bfloat16)
              for e in ref.dispatch(new16, new_idxs, num_experts=EXPERTS,
                                    num_max_tokens_per_rank=TOKENS)]
        want = ref.combine(ys, ref.dispatch(new16, new_idxs, num_experts=EXPERTS,
                                            num_max_tokens_per_rank=TOKENS))[rank]
        replays_ok &= to_numpy(graph_out).tobytes() == want.combined_x.tobytes()
        replays_ok &= torch.equal(graph_out.view(torch.int16), eager.view(torch.int16))
    results["CUDA graph replays of dispatch + combine (bitwise)"] = replays_ok

    # 5. Outputs in the window: senders store rows straight into the destination's window
    # (no copy epilogue), the combine reads the expert outputs where they lie; bitwise the copy
    # path's results (plain BF16, weights there and back, two biases).
    expected = ref.dispatch(xs16, idxs, ws, num_experts=EXPERTS, num_max_tokens_per_rank=TOKENS)
    slow()
    recv, recv_idx, recv_w, handle, _ = buffer.dispatch(
        to_torch(xs16[rank]), to_torch(idxs[rank]), to_torch(ws[rank]), num_experts=EXPERTS,
        window_outputs=True)
    got = dataclasses.replace(expected[rank], recv_x=to_numpy(recv),
                              recv_topk_idx=to_numpy(recv_idx),
                              recv_topk_weights=to_numpy(recv_w),
                              recv_src_metadata=to_numpy(handle.recv_src_metadata))
    s = ref.sort_by_source(got)
    results["window outputs: plain BF16 dispatch in place (rows, ids, metadata)"] = (
        buffer._in_window(recv, rank) and all(
            getattr(s, f).tobytes() == getattr(expected[rank], f).tobytes()
            for f in ("recv_x", "recv_topk_idx", "recv_src_metadata")))
    y_copy = (recv.float() * 2).to(torch.bfloat16)
    bias = tuple(to_torch(b) for b in biases[rank])
    copied, copied_w, _ = buffer.combine(y_copy, handle, topk_weights=recv_w, bias=bias)
    y_window = buffer.combine_input_buffer(handle)
    y_window.copy_(y_copy)
    out, out_w, _ = buffer.combine(y_window, handle, topk_weights=recv_w, bias=bias)
    ys = [(e.recv_x.astype(np.float32) * 2).astype(ref.bfloat16) for e in expected]
    want = ref.combine(ys, expected, topk_weights=[e.recv_topk_weights for e in expected],
                       bias=biases)[rank]
    results["window outputs: combine read in place = copy path (bitwise)"] = (
        torch.equal(out.view(torch.int16), copied.view(torch.int16))
        and torch.equal(out_w, copied_w)
        and to_numpy(out).tobytes() == want.combined_x.tobytes()
        and to_numpy(out_w).tobytes() == want.combined_topk_weights.tobytes())

    # 6. The FP8 expert MLP layer as one persistent kernel (ep.moe_layer, which across
    # processes stages its dispatch and combine in the window) against the five ops, bitwise,
    # eager and replayed from a CUDA graph; the same buffer, another expert count.
    results["persistent FP8 layer = the five ops (eager, graph; bitwise)"] = \
        persistent_layer_matches(buffer, rank, world)

    buffer.barrier()
    verdicts = [None] * world
    dist.all_gather_object(verdicts, results)
    if rank == 0:
        api = buffer._state.device_api
        print(f"distributed_check: {world} rank(s), {api['text'] if api else '?'}, communicator "
              f"{buffer.nccl_comm_source}, slow rank {args.slow_rank}")
        for name in results:
            marks = "".join("." if v[name] else "F" for v in verdicts)
            print(f"  {name:62s} {'ok' if 'F' not in marks else 'FAILED'} [{marks}]")
    passed = all(all(v.values()) for v in verdicts)
    buffer.destroy()
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
