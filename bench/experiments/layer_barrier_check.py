"""The persistent layer kernel (ep.moe_layer) on a virtual EP8 world at V3's shape, step by
step, with a 5 s bound on the kernels' waits: the five ops once, then the persistent kernel
eagerly and replayed from a CUDA graph, then each way back to back (no host sync between
calls), each call's result compared bitwise with the five ops'. It prints each step's
outcome, so a stall (a block that never reaches a barrier) is named in seconds, not after
the default 100 s. The first version of the kernel stalled
this way in a graph replay at 128 tokens (bench/NOTES.md, 2026-12-07).

    python3 bench/experiments/layer_barrier_check.py --compile-only   # here: fills the cache
    python3 bench/experiments/layer_barrier_check.py [--persistent-only] [--tokens T]

``--staged``: the same on ``VirtualWorld(8, staged=True)``, whose kernels stage the dispatch's
and the combine's rows in the window as a world of processes does (the persistent kernel's
NCCL variant); the reference is then the one-pass world's five ops, so every call is also
checked bitwise against the other variant.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))

R, E, K, H, INTER = 8, 256, 8, 7168, 2048  # V3 on a virtual EP8 world
TIMEOUT_S = 5


def spec(tokens):
    return dict(num_ranks=R, num_experts=E, num_topk=K, hidden=H, dtype="f8E4M3FN",
                num_scale_packs=H // 128, expert_alignment=128, do_expand=True,
                num_max_tokens_per_rank=tokens, timeout_ms=TIMEOUT_S * 1000)


def compile_only(tokens, staged):
    from epic import _C

    if staged:  # the reference: the one-pass world's five ops
        compile_only(tokens, False)
    from epic.moe import layer_kernels

    runtime = _C.Runtime("virtual", "", "", staged=staged)
    s = spec(tokens)
    for variant, kind in layer_kernels(H, INTER) + layer_kernels(H, INTER, persistent=True):
        runtime.kernels(s, variant, kind)
    print(f"layer_barrier_check: 6 {'staged ' if staged else ''}kernel sets in "
          f"{runtime.cache_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--persistent-only", action="store_true",
                        help="no five-ops call first (compare the calls with the first)")
    parser.add_argument("--calls", type=int, default=20,
                        help="calls of each back-to-back phase")
    parser.add_argument("--staged", action="store_true",
                        help="the kernels that stage rows in the window (as across processes), "
                             "checked against the one-pass world's five ops")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args.tokens, args.staged)
    import ep_bench
    import torch

    import epic
    from epic.buffer import _device_wait_reports
    from epic.moe import moe_layer_fp8

    T, L = args.tokens, E // R
    g = torch.Generator(device="cuda").manual_seed(5)
    xs, sfs, idxs, ws = ep_bench.make_inputs(torch, R, T, H, E, K, True, seed=7)
    x = list(zip(xs, sfs))
    def weights(n, k):
        return [ep_bench.quantize_blocks(torch, torch.randn((L, n, k), generator=g, device="cuda")
                                         / k ** 0.5, 128) for _ in range(R)]

    def step(what, fn):
        start = time.time()
        try:
            with _device_wait_reports():  # a stalled block's report, if a wait timed out
                out = fn()
                torch.cuda.synchronize()
        except Exception as error:  # the wait reports name the stalled block
            print(f"FAIL {what} after {time.time() - start:.2f} s: {str(error)[:4000]}",
                  flush=True)
            sys.exit(1)
        print(f"ok   {what} ({time.time() - start:.2f} s)", flush=True)
        return out

    w13, w2 = weights(2 * INTER, H), weights(H, INTER)

    def make_buffer(staged):
        return epic.ElasticBuffer(epic.VirtualWorld(R, staged=staged), num_max_tokens_per_rank=T,
                                  hidden=H, num_topk=K, explicitly_destroy=True,
                                  num_gpu_timeout_secs=TIMEOUT_S)

    mismatches = 0

    def same(a, b):
        nonlocal mismatches
        equal = all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(a, b))
        mismatches += not equal
        return equal

    want = None
    if args.staged:
        buffer = make_buffer(False)
        want = [y.clone() for y in step("one-pass five ops (the reference)", lambda: moe_layer_fp8(
            buffer, x, idxs, ws, w13, w2, num_experts=E, do_cpu_sync=False))]
        buffer.destroy()
    buffer = make_buffer(args.staged)
    print(f"layer_barrier_check: {buffer.group!r}, {T} tokens per rank", flush=True)

    def layer(persistent):
        return moe_layer_fp8(buffer, x, idxs, ws, w13, w2, num_experts=E, do_cpu_sync=False,
                             persistent=persistent)

    five = [y.clone() for y in step("five ops", lambda: layer(False))] \
        if not args.persistent_only else None
    if want is None:
        want = five
    elif five is not None:
        print(f"     bitwise the reference: {same(five, want)}")
    for i in range(4):
        got = step(f"persistent, eager {i}", lambda: layer(True))
        if want is None:
            want = [y.clone() for y in got]
        print(f"     bitwise the reference: {same(got, want)}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(True)
    for i in range(4):
        step(f"persistent, graph replay {i}", graph.replay)
        print(f"     bitwise the reference: {same(captured, want)}")
    # Back to back, no host synchronization between calls (as a profiled run or a serving
    # loop issues them): the first EP8 bench stalled in such a run (bench/NOTES.md), with
    # an L2 flush kernel between calls. Each variant: args.calls calls, then one sync.
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def back_to_back(fn, between=None):
        def run():
            out = None
            for _ in range(args.calls):
                if between:
                    between()
                out = fn()
            return out
        return run

    variants = [("five ops", lambda: layer(False), None),
                ("persistent eager", lambda: layer(True), None),
                ("persistent eager, L2 flush between", lambda: layer(True), lambda: flush.fill_(1)),
                ("persistent graph replays", lambda: (graph.replay(), captured)[1], None)]
    for what, fn, between in variants:
        got = step(f"{what}, {args.calls} calls back to back", back_to_back(fn, between))
        print(f"     bitwise the reference: {same(got, want)}")
    buffer.destroy()
    if mismatches:
        print(f"layer_barrier_check: FAILED: {mismatches} results differ from the reference")
        return 1
    print("layer_barrier_check: done, every result bitwise the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
