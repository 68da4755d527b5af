"""Direct vs hybrid mode on a virtual world of 2 nodes x 4 GPUs: bytes between nodes and time.

    python bench/multinode_bench.py                 # H200: runs, writes JSON + plot
    python bench/multinode_bench.py --compile-only  # here: the kernels, into the kernel cache

Both modes run the same routing (BF16, hidden 7168, top-8 of 64 experts, plain layout, with
weights) through ``epic.ElasticBuffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=4),
allow_hybrid_mode=...)`` at 128 and 2048 tokens per rank. Per mode and size:

* the bytes each op puts between nodes (the virtual world's GIN traffic counters: put bytes,
  put_value bytes, signal operations), checked equal to
  ``epic.reference.expected_network_bytes`` (records) for the puts;
* the GPU time of a dispatch and of a combine (CUDA events, median of 20 after 3 warm-ups), the
  wall time of the call (host clock, synchronized) and each kernel's time (the runtime's
  kernel timing, median of 5 calls).

One GPU serves all 8 ranks, and the "network" is a copy on the same GPU: the times measure the
work of the whole world on one device (hybrid moves each remote token twice: to the forwarder,
then over NVLink, and runs one more kernel per op), not a NIC. The bytes between nodes are what
a NIC would carry. Writes bench/results/multinode-<gpu>-<date>.json and a plot.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402

import epic  # noqa: E402
from epic import reference as ref  # noqa: E402

NODES, GPUS, HIDDEN, TOPK, EXPERTS = 2, 4, 7168, 8, 64
TOKENS = (128, 2048)
MODES = ("direct", "hybrid")


def spec(tokens, mode):
    """The configuration ElasticBuffer asks its kernels for (test/gpu/prepare_buffer_kernels)."""
    return dict(num_ranks=NODES * GPUS, num_experts=EXPERTS, num_topk=TOPK, hidden=HIDDEN,
                dtype="bf16", num_scale_packs=0, expert_alignment=1, do_expand=False,
                num_max_tokens_per_rank=tokens, num_scaleup_ranks=GPUS,
                hybrid=mode == "hybrid")


DISPATCH = dict(weights=True, cached=False, zero_padding=False)
COMBINE = dict(weights=True, biases=0)


def compile_only():
    from epic import _C

    runtime = _C.Runtime("virtual", "", "")
    for tokens in TOKENS:
        for mode in MODES:
            runtime.kernels(spec(tokens, mode), DISPATCH, "dispatch")
            runtime.kernels(spec(tokens, mode), COMBINE, "combine")
    print(f"multinode_bench: {2 * len(TOKENS) * len(MODES)} kernel sets in {runtime.cache_dir}")
    return 0


def routing(tokens, seed):
    """Every rank's top-k ids: distinct random experts per token."""
    rng = np.random.default_rng(seed)
    return [np.stack([rng.permutation(EXPERTS)[:TOPK] for _ in range(tokens)]).astype(np.int64)
            for _ in range(NODES * GPUS)]


def gpu_ms(fn, iters=20, warmup=3):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times, walls = [], []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        times.append(start.elapsed_time(end))
    return statistics.median(times), statistics.median(walls)


def between_nodes(traffic):
    """Per kind, what crossed nodes: (put bytes, put_value bytes, signals)."""
    t = np.asarray(traffic, dtype=np.int64)
    node = np.arange(t.shape[0]) // GPUS
    across = node[:, None] != node[None, :]
    inside = t[~across].sum(axis=0)
    assert not inside.any(), f"GIN traffic inside a node: {inside.tolist()}"
    return [int(v) for v in t[across].sum(axis=0)], t[:, :, 0]


def run(tokens, mode, seed=7):
    import torch

    from epic import _C

    R = NODES * GPUS
    buffer = epic.ElasticBuffer(epic.VirtualWorld(num_nodes=NODES, gpus_per_node=GPUS),
                                num_max_tokens_per_rank=tokens, hidden=HIDDEN, num_topk=TOPK,
                                allow_hybrid_mode=mode == "hybrid", explicitly_destroy=True)
    try:
        idxs = routing(tokens, seed)
        xs = [torch.randn((tokens, HIDDEN), dtype=torch.bfloat16, device="cuda") for _ in range(R)]
        ids = [torch.from_numpy(i).cuda() for i in idxs]
        ws = [torch.rand((tokens, TOPK), device="cuda") for _ in range(R)]
        out = buffer.dispatch(xs, ids, ws, num_experts=EXPERTS)
        recv_x, _, recv_w, handles, _ = out
        torch.cuda.synchronize()
        record = _C.record_bytes(spec(tokens, mode))
        dispatch_net, dispatch_pairs = between_nodes(buffer._state.take_traffic())
        want = ref.expected_network_bytes(idxs, EXPERTS, GPUS, mode, record["dispatch"])
        assert np.array_equal(dispatch_pairs, want), "dispatch puts differ from the reference's"
        ys = [x.clone() for x in recv_x]
        buffer.combine(ys, handles, topk_weights=recv_w)
        torch.cuda.synchronize()
        combine_net, combine_pairs = between_nodes(buffer._state.take_traffic())
        want = ref.expected_network_bytes(idxs, EXPERTS, GPUS, mode, record["combine"]).T
        assert np.array_equal(combine_pairs, want), "combine puts differ from the reference's"
        d_ms, d_wall = gpu_ms(lambda: buffer.dispatch(xs, ids, ws, num_experts=EXPERTS))
        c_ms, c_wall = gpu_ms(lambda: buffer.combine(ys, handles, topk_weights=recv_w))
        # Where the time goes: each kernel's GPU time (CUDA events), median of 5 calls.
        buffer._state.set_kernel_timing(True)
        per_kernel = {}
        for _ in range(5):
            buffer.dispatch(xs, ids, ws, num_experts=EXPERTS)
            buffer.combine(ys, handles, topk_weights=recv_w)
            for name, seconds in buffer._state.take_kernel_times():
                per_kernel.setdefault(name, []).append(seconds * 1e3)
        buffer._state.set_kernel_timing(False)
        kernels_ms = {name: statistics.median(v) for name, v in per_kernel.items()}
        buffer._state.take_traffic()
        return dict(tokens=tokens, mode=mode, dispatch_bytes_between_nodes=dispatch_net,
                    combine_bytes_between_nodes=combine_net, dispatch_gpu_ms=d_ms,
                    dispatch_wall_ms=d_wall, combine_gpu_ms=c_ms, combine_wall_ms=c_wall,
                    kernels_ms=kernels_ms, dispatch_record_bytes=record["dispatch"],
                    combine_record_bytes=record["combine"])
    finally:
        buffer.destroy()


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.35
    for i, mode in enumerate(MODES):
        sel = [r for r in rows if r["mode"] == mode]
        x = np.arange(len(sel)) + i * width
        a.bar(x, [r["dispatch_bytes_between_nodes"][0] / 2**20 for r in sel], width, label=mode)
        b.bar(x, [r["dispatch_gpu_ms"] + r["combine_gpu_ms"] for r in sel], width, label=mode)
    for ax, title in ((a, "dispatch: MiB put between nodes"),
                      (b, "dispatch + combine GPU ms (whole virtual world, one GPU)")):
        ax.set_xticks(np.arange(len(TOKENS)) + width / 2)
        ax.set_xticklabels([f"{t} tokens/rank" for t in TOKENS])
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    if args.compile_only:
        return compile_only()
    import torch

    rows = []
    for tokens in TOKENS:
        for mode in MODES:
            row = run(tokens, mode)
            rows.append(row)
            print(f"{mode:>6} {tokens:>5} tokens/rank: dispatch {row['dispatch_gpu_ms']:.3f} ms "
                  f"({row['dispatch_wall_ms']:.3f} wall), combine {row['combine_gpu_ms']:.3f} ms "
                  f"({row['combine_wall_ms']:.3f} wall); between nodes: dispatch "
                  f"{row['dispatch_bytes_between_nodes']}, combine "
                  f"{row['combine_bytes_between_nodes']} (put bytes, put_value bytes, signals)",
                  flush=True)
            print("       kernels (ms): " + ", ".join(f"{name} {ms:.3f}" for name, ms in
                                                     row["kernels_ms"].items()), flush=True)
    summary = {}
    for tokens in TOKENS:
        d, h = (next(r for r in rows if r["tokens"] == tokens and r["mode"] == m) for m in MODES)
        summary[f"{tokens}_tokens"] = dict(
            dispatch_bytes_hybrid_over_direct=h["dispatch_bytes_between_nodes"][0]
            / d["dispatch_bytes_between_nodes"][0],
            combine_bytes_hybrid_over_direct=h["combine_bytes_between_nodes"][0]
            / d["combine_bytes_between_nodes"][0],
            dispatch_time_hybrid_over_direct=h["dispatch_gpu_ms"] / d["dispatch_gpu_ms"],
            combine_time_hybrid_over_direct=h["combine_gpu_ms"] / d["combine_gpu_ms"])
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    stem = f"multinode-{gpu}-{datetime.date.today().isoformat()}"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(dict(world=f"{NODES}x{GPUS} virtual", hidden=HIDDEN, topk=TOPK,
                       experts=EXPERTS, rows=rows, summary=summary), f, indent=1)
    plot(rows, os.path.join(args.out, stem + ".png"))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
