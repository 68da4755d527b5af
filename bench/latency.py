"""Per-call latency of dispatch and combine at decode sizes, eager and replayed from CUDA graphs.

    python bench/latency.py                 # H200: NCCL one rank (torchrun, spawned) + virtual EP8
    python bench/latency.py --compile-only  # here: every kernel it runs, into the kernel cache

DeepEP's V3 shape (hidden 7168, top-8 of 256 experts, FP8 with 56 scale packs, plain layout),
called as inference engines call it: ``dispatch(x, topk_idx, topk_weights, num_experts=256,
num_max_tokens_per_rank=T, do_expand=False, do_cpu_sync=False)``, then ``combine(y, handle)``;
and the cached dispatch ``dispatch(x, handle=handle)``. At 1, 32, 128 and 512 tokens per rank,
on a one-rank NCCL world (a torchrun child process) and on a virtual world of 8 ranks:

* eager: the median wall time of >= 200 synchronized calls (the call, then
  torch.cuda.synchronize(), on a host clock), the mean of back-to-back calls without sync, and
  the host time of the call alone (returned, not synchronized); each the better of two rounds;
* graph: the same op(s) captured once in a torch.cuda.CUDAGraph, replayed (median synchronized
  replay, mean of back-to-back replays);
* the kernels' GPU time (CUDA events around each kernel, the runtime's time_kernels);
* the same dispatch + combine written in vectorized plain PyTorch (index_select / index_add over
  every rank's tokens at once, no Python loop over ranks), in the same process;
* the floors: a kernel launch (an empty torch op, synchronized) and the bytes the kernels move
  over the copy bandwidth.

DeepEP V1's low-latency pair at 128 tokens per rank (``epic.deep_ep.Buffer(low_latency_mode=
True)``: ``low_latency_dispatch`` with FP8, ``low_latency_combine``) on both worlds, the same
measurements (``--low-latency``: only these).

Also: the distinct dispatch kernel sets used for caps 128, 256, 512, 1000 and 4096 with
everything else equal (the cap is a run-time value of the kernels). Writes
bench/results/latency-<gpu>-<date>.json (with the `summary` the issue names) and a plot.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import ep_bench  # noqa: E402  (bench/ is the script's directory)
import epic  # noqa: E402

HIDDEN, EXPERTS, TOPK, PACKS = 7168, 256, 8, 7168 // 128
TOKENS = (1, 32, 128, 512)
CAPS = (128, 256, 512, 1000, 4096)


def spec(ranks, cap):
    return dict(num_ranks=ranks, num_experts=EXPERTS, num_topk=TOPK, hidden=HIDDEN,
                dtype="f8E4M3FN", num_scale_packs=PACKS, expert_alignment=1, do_expand=False,
                num_max_tokens_per_rank=cap)


def compile_only():
    """The kernels of both worlds (one set per op: the token cap is a run-time value)."""
    from epic import _C

    for backend, ranks in (("nccl", 1), ("virtual", 8)):
        runtime = _C.Runtime(backend, "", "")
        s = spec(ranks, max(CAPS))
        runtime.kernels(s, dict(weights=True, cached=False, zero_padding=False), "dispatch")
        runtime.kernels(s, dict(weights=False, cached=True, zero_padding=False), "dispatch")
        runtime.kernels(s, dict(weights=False, biases=0), "combine")
        ll = dict(s, dtype="f8E4M3FN", num_scale_packs=PACKS, num_max_tokens_per_rank=128)
        runtime.kernels(ll, dict(round_scale=False, use_ue8m0=False, parity=0,
                                 topk_idx_bits=64), "low_latency_dispatch")
        runtime.kernels(dict(ll, dtype="bf16", num_scale_packs=0), dict(parity=0, topk_idx_bits=64),
                        "low_latency_combine")
    print(f"latency: kernels in {runtime.cache_dir}")
    return 0


# --- inputs and the PyTorch baseline -----------------------------------------------------------


def inputs(torch, R, T, seed=0):
    """Every rank's T FP8 tokens with scale packs, top-8 routing and weights."""
    return ep_bench.make_inputs(torch, R, T, HIDDEN, EXPERTS, TOPK, True, seed, ragged=False)


class TorchPair:
    """Dispatch + combine of every rank's tokens at once in plain PyTorch: what a skilled
    engineer writes without a communication library on one GPU (no loop over ranks). The
    (token, destination) pairs of all ranks come from one mask; dispatch gathers their rows
    (FP8 bytes and scale packs), combine adds the destinations' bf16 rows back per token in fp32
    with one index_add."""

    def __init__(self, torch, xs, sfs, idxs, ranks):
        self.t, self.R = torch, ranks
        self.x = torch.cat([x.view(torch.uint8) for x in xs])
        self.sf, self.idx = torch.cat(sfs), torch.cat(idxs)

    def dispatch(self):
        t, L = self.t, EXPERTS // self.R
        dst = t.where(self.idx >= 0, self.idx // L, -1)                      # [N, K]
        hit = t.zeros((dst.shape[0], self.R), dtype=t.bool, device=dst.device)
        hit.scatter_(1, dst.clamp(min=0), dst >= 0)                          # token -> ranks
        pair_dst, pair_token = hit.t().nonzero(as_tuple=True)                # by destination
        return self.x.index_select(0, pair_token), self.sf.index_select(0, pair_token), \
            pair_token, pair_dst

    def combine(self, y, pair_token):
        t = self.t
        out = t.zeros((self.x.shape[0], HIDDEN), dtype=t.float32, device=y.device)
        out.index_add_(0, pair_token, y.float())
        return out.to(t.bfloat16)

    def pair(self):
        _, _, token, _ = self.dispatch()
        rows = self.t.ones((token.shape[0], HIDDEN), dtype=self.t.bfloat16, device=token.device)
        return self.combine(rows, token)


class TorchLowLatencyPair:
    """DeepEP V1's low-latency pair in plain vectorized PyTorch, every rank's tokens at once:
    the FP8 cast per 128 channels, each routing entry's row placed in its expert's rows
    (ordered by source rank, then token: a stable sort by expert), then per token the weighted
    sum of its experts' rows in fp32 (one index_add). No host synchronization (graph
    capturable): entries without an expert (-1) go to a spare expert's rows, weight 0. What a
    skilled engineer writes without a communication library on one GPU."""

    def __init__(self, torch, xs, idxs, ws, y, cap):
        t = self.t = torch
        self.x, self.idx, self.w = t.cat(xs), t.cat(idxs), t.cat(ws)
        self.y, self.cap, self.R = y, cap, len(xs)  # y: [experts, R x cap, hidden] bf16

    def dispatch(self):
        t, N, rows = self.t, self.x.shape[0], self.R * self.cap
        groups = self.x.view(N, PACKS, 128).float()
        scale = groups.abs().amax(-1).clamp(min=1e-4) / 448.0              # [N, G]
        q = (groups / scale.unsqueeze(-1)).view(N, HIDDEN).to(t.float8_e4m3fn)
        e = self.idx.reshape(-1).long()
        e = t.where(e >= 0, e, EXPERTS)                                     # EXPERTS: none
        order = t.argsort(e, stable=True)                                   # by expert
        counts = t.zeros(EXPERTS + 1, dtype=t.long, device=e.device).scatter_add_(
            0, e, t.ones_like(e))
        sorted_e = e[order]
        start = t.cumsum(counts, 0) - counts
        pos = (t.arange(order.shape[0], device=e.device) - start[sorted_e]).clamp(max=rows - 1)
        token = order // TOPK
        recv = t.empty((EXPERTS + 1, rows, HIDDEN), dtype=t.float8_e4m3fn, device=e.device)
        recv_sf = t.empty((EXPERTS + 1, PACKS, rows), dtype=t.float32, device=e.device)
        recv[sorted_e, pos] = q[token]
        recv_sf[sorted_e, :, pos] = scale[token]
        return recv[:EXPERTS], recv_sf[:EXPERTS], counts[:EXPERTS], (order, sorted_e, pos, token)

    def combine(self, route):
        t = self.t
        order, sorted_e, pos, token = route
        w = self.w.reshape(-1)[order]
        w = t.where(sorted_e < EXPERTS, w, 0.0)
        rows = self.y[sorted_e.clamp(max=EXPERTS - 1), pos].float() * w.unsqueeze(-1)
        out = t.zeros((self.x.shape[0], HIDDEN), dtype=t.float32, device=rows.device)
        out.index_add_(0, token, rows)
        return out.to(t.bfloat16)

    def pair(self):
        return self.combine(self.dispatch()[3])


# --- timing --------------------------------------------------------------------------------------


def wall(torch, fn, iterations, rounds=2):
    """(median synchronized wall s, mean back-to-back s, median host s of the call alone),
    each the best of `rounds` rounds of `iterations` calls: a burst of interference on the
    host (seen as a 128-token call slower than a 512-token one) spoils a round, not all."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(rounds):
        synced, host = [], []
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            synced.append(t2 - t0)
            host.append(t1 - t0)
        t0 = time.perf_counter()
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
        round_ = (statistics.median(synced), (time.perf_counter() - t0) / iterations,
                  statistics.median(host))
        best = round_ if best is None else tuple(map(min, best, round_))
    return best


def graph(torch, fn, iterations):
    """fn captured once (after the eager warm-up made its plans), then replayed."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    synced, _, _ = wall(torch, g.replay, iterations)
    t0 = time.perf_counter()
    for _ in range(iterations):
        g.replay()
    torch.cuda.synchronize()
    return synced, (time.perf_counter() - t0) / iterations


def kernel_times(torch, fn, iterations=50, every_kernel=False):
    """(GPU time per call of the op's kernels and copies, {name: median us}) from the profiler
    (CUPTI's device timestamps: events around a kernel would also count the host's launch
    time whenever the GPU waits for it, which at these sizes it does). `every_kernel`: all
    kernels (a PyTorch baseline's), not only epic's."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
    per_kernel = {}
    for event in prof.events():
        if event.device_time_total > 0 and (every_kernel or event.name.startswith("ep_")
                                            or "Memcpy" in event.name):
            per_kernel.setdefault(event.name, []).append(event.device_time_total)
    total = sum(sum(v) for v in per_kernel.values()) / iterations
    return total * 1e-6, {name: statistics.median(v) for name, v in per_kernel.items()}


def timings(torch, fn, iterations, every_kernel=False):
    """Every measurement of one call (us): eager, graph replay, kernels."""
    synced, back_to_back, host = wall(torch, fn, iterations)
    g_synced, g_back_to_back = graph(torch, fn, iterations)
    kernel, per_kernel = kernel_times(torch, fn, every_kernel=every_kernel)
    return dict(wall_us=synced * 1e6, back_to_back_us=back_to_back * 1e6, host_us=host * 1e6,
                kernel_us=kernel * 1e6, graph_wall_us=g_synced * 1e6,
                graph_back_to_back_us=g_back_to_back * 1e6, kernels_us=per_kernel)


def launch_only(buffer, kind, stream, iterations=200):
    """Host time of the runtime's launch of the last call of a plan of `kind` (the C++ call:
    address checks, table, cuLaunchKernelEx per kernel, copies), back to back, no sync."""
    import torch

    plans = [p for key, p in buffer._plans.items() if key and key[0] == kind]
    plan = plans[-1]
    out = next(s for s in plan.sets)
    for _ in range(5):
        plan.plan.launch(out.addresses, stream)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iterations):
        plan.plan.launch(out.addresses, stream)
    host = (time.perf_counter() - t0) / iterations
    torch.cuda.synchronize()
    return host


def measure_world(torch, buffer, R, iterations):
    """Every op and size on `buffer` (R ranks: lists in a virtual world)."""
    out = {}
    one = (lambda v: v) if buffer.virtual else (lambda v: v[0])
    for T in TOKENS:
        xs, sfs, idxs, ws = inputs(torch, R, T)
        x = one([(a, b) for a, b in zip(xs, sfs)])
        idx, w = one(idxs), one(ws)

        def dispatch():
            return buffer.dispatch(x, idx, w, num_experts=EXPERTS, num_max_tokens_per_rank=T,
                                   do_expand=False, do_cpu_sync=False)

        _, _, _, handle, _ = dispatch()
        rows = R * T  # worst case: do_cpu_sync=False
        y = one([torch.randn((rows, HIDDEN), device="cuda").to(torch.bfloat16)
                 for _ in range(R)])

        def combine():
            return buffer.combine(y, handle)

        def cached():
            return buffer.dispatch(x, handle=handle)

        def pair():
            _, _, _, h, _ = dispatch()
            return buffer.combine(y, h)

        row = {name: timings(torch, fn, iterations)
               for name, fn in (("dispatch", dispatch), ("combine", combine),
                                ("cached_dispatch", cached), ("pair", pair))}
        stream = torch.cuda.current_stream().cuda_stream
        for kind, op in (("dispatch", "dispatch"), ("combine", "combine")):
            row[op]["launch_only_us"] = launch_only(buffer, kind, stream) * 1e6
        baseline = TorchPair(torch, xs, sfs, idxs, R)
        synced, back_to_back, host = wall(torch, baseline.pair, iterations)
        row["torch_pair"] = dict(wall_us=synced * 1e6, back_to_back_us=back_to_back * 1e6,
                                 host_us=host * 1e6)
        # The floor of the bytes: a token row (+ packs) leaves and lands once per destination
        # rank in the dispatch, a bf16 row comes back per destination in the combine.
        pairs = sum(int(((i // (EXPERTS // R)).unsqueeze(2) == torch.arange(R, device="cuda"))
                        .any(1).sum()) for i in idxs)
        row["bytes"] = dict(dispatch=2 * pairs * (HIDDEN + 4 * PACKS), combine=4 * pairs * HIDDEN)
        out[str(T)] = row
        print(f"  T={T:4d}: " + ", ".join(f"{k} {v['wall_us']:.0f}/{v.get('graph_wall_us', 0):.0f}"
                                          for k, v in row.items() if "wall_us" in v), flush=True)
    return out


def measure_low_latency(torch, group, R, iterations, T=128, profile=False):
    """DeepEP V1's low-latency pair at `T` tokens per rank (``epic.deep_ep.Buffer`` with
    ``low_latency_mode=True``, the V3 shape, FP8 dispatch): eager, graph, kernels, bytes."""
    from epic import deep_ep

    nbytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, HIDDEN, R, EXPERTS)
    buf = deep_ep.Buffer(group, num_rdma_bytes=nbytes, low_latency_mode=True,
                         num_qps_per_rank=EXPERTS // R, explicitly_destroy=True)
    virtual = isinstance(group, epic.VirtualWorld)
    one = (lambda v: v) if virtual else (lambda v: v[0])
    _, _, idxs, ws = inputs(torch, R, T)  # the routing and weights; the rows are bf16 here
    xs = [torch.randn((T, HIDDEN), device="cuda").to(torch.bfloat16) for _ in range(R)]
    x, idx, w = one(xs), one(idxs), one(ws)
    L = EXPERTS // R
    y = one([torch.randn((L, R * T, HIDDEN), device="cuda").to(torch.bfloat16)
             for _ in range(R)])

    def dispatch():
        return buf.low_latency_dispatch(x, idx, T, EXPERTS, use_fp8=True)

    _, _, handle, _, _ = dispatch()

    def combine():
        return buf.low_latency_combine(y, idx, w, handle)

    def pair():
        _, _, h, _, _ = dispatch()
        return buf.low_latency_combine(y, idx, w, h)

    row = {name: timings(torch, fn, iterations)
           for name, fn in (("dispatch", dispatch), ("combine", combine), ("pair", pair))}
    baseline = TorchLowLatencyPair(torch, xs, idxs, ws, torch.cat(y if virtual else [y]), T)
    row["torch_pair"] = timings(torch, baseline.pair, iterations, every_kernel=True)
    # The same work: the baseline's result against epic's (fp32 sums in another order).
    epic_out = torch.cat(pair()[0] if virtual else [pair()[0]]).float()
    row["torch_pair"]["max_abs_diff_vs_epic"] = float((baseline.pair().float() - epic_out)
                                                      .abs().max())
    row["torch_pair"]["max_abs_result"] = float(epic_out.abs().max())
    if profile:
        row["profile"] = profile_calls(torch, pair)
    # Bytes through memory: each (token, expert) pair's FP8 row + f32 scales is written into
    # the window, read and written out by the receiver; its bf16 expert output is read, written
    # into the origin's window and read by the weighted sum; plus the inputs and outputs.
    pairs = sum(int((i >= 0).sum()) for i in idxs)
    row["bytes"] = dict(dispatch=3 * pairs * (HIDDEN + 4 * PACKS) + R * T * 2 * HIDDEN,
                        combine=3 * pairs * 2 * HIDDEN + R * T * 2 * HIDDEN)
    buf.destroy()
    print("  low-latency T=%d: " % T + ", ".join(
        f"{k} {v['wall_us']:.0f}/{v['graph_wall_us']:.0f}/{v['graph_back_to_back_us']:.0f}"
        for k, v in row.items() if "wall_us" in v) + " us (eager/graph/graph back to back)",
        flush=True)
    return row


def kernel_sets_for_caps(torch, buffer, R):
    """Distinct dispatch kernel sets (the plans' kernel keys) for the caps, all else equal."""
    keys = set()
    one = (lambda v: v) if buffer.virtual else (lambda v: v[0])
    xs, sfs, idxs, ws = inputs(torch, R, 64, seed=1)
    for cap in CAPS:
        before = set(buffer._plans.keys())
        buffer.dispatch(one([(a, b) for a, b in zip(xs, sfs)]), one(idxs), one(ws),
                        num_experts=EXPERTS, num_max_tokens_per_rank=cap, do_cpu_sync=False)
        keys |= {buffer._plans.get(k).plan.key for k in set(buffer._plans.keys()) - before}
    torch.cuda.synchronize()
    return len(keys)


def floors(torch, iterations):
    """A synchronized launch of an empty-ish kernel, and the copy bandwidth (read + write)."""
    a = torch.empty(1, device="cuda")
    launch, _, _ = wall(torch, lambda: a.add_(0), iterations)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy, _, _ = wall(torch, lambda: dst.copy_(src), 20)
    return dict(launch_sync_us=launch * 1e6, copy_bytes_per_s=2 * src.numel() / copy)


# --- the two worlds ----------------------------------------------------------------------------


def nccl_child(args):
    """torchrun --nproc-per-node 1: the one-rank NCCL world; writes its part as JSON."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    part = dict(world="nccl", ranks=1)
    if not args.low_latency:
        buffer = epic.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=max(CAPS),
                                    hidden=HIDDEN, num_topk=TOPK, use_fp8_dispatch=True,
                                    explicitly_destroy=True)
        part.update(blocks_per_rank=buffer._runtime().blocks_per_rank,
                    sizes=measure_world(torch, buffer, 1, args.iterations))
        if args.profile:
            part["profile"] = profile_pair(torch, buffer)
        buffer.destroy()
    part["low_latency"] = measure_low_latency(torch, dist.group.WORLD, 1, args.iterations,
                                              profile=args.profile)
    dist.destroy_process_group()
    with open(args.child_out, "w") as f:
        json.dump(part, f)
    return 0


def profile_pair(torch, buffer):
    """Where an eager 128-token dispatch + combine spends host time (cProfile, top entries)."""
    xs, sfs, idxs, ws = inputs(torch, 1, 128)
    y = torch.randn((128, HIDDEN), device="cuda").to(torch.bfloat16)

    def pair():
        _, _, _, h, _ = buffer.dispatch((xs[0], sfs[0]), idxs[0], ws[0], num_experts=EXPERTS,
                                        num_max_tokens_per_rank=128, do_cpu_sync=False)
        buffer.combine(y, h)

    return profile_calls(torch, pair)


def profile_calls(torch, pair, calls=200):
    """cProfile of `calls` calls of `pair`, each after a synchronization: top entries by own
    time."""
    import cProfile
    import io
    import pstats

    pair()
    profiler = cProfile.Profile()
    for _ in range(calls):  # synchronized between pairs: no launch waits for a full queue
        torch.cuda.synchronize()
        profiler.enable()
        pair()
        profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return dict(calls=calls, top_by_own_time=text.getvalue())


def plot(report, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, world in zip(axes, ("nccl1", "virtual8")):
        sizes = report["worlds"][world]["sizes"]
        tokens = [int(t) for t in sizes]
        for label, op, field in (("epic eager pair", "pair", "wall_us"),
                                 ("epic graph pair", "pair", "graph_wall_us"),
                                 ("epic eager dispatch", "dispatch", "wall_us"),
                                 ("epic eager combine", "combine", "wall_us"),
                                 ("PyTorch pair", "torch_pair", "wall_us")):
            ax.plot(tokens, [sizes[str(t)][op][field] for t in tokens], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per rank")
        ax.set_title(f"{world}: V3 FP8 plain, do_cpu_sync=False")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("wall time per call, synchronized (us)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def plot_low_latency(report, path):
    """The low-latency pair at 128 tokens per rank: epic and the PyTorch baseline, per world,
    kernels / eager / graph (synchronized and back to back), with the floors."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fields = (("kernels", "kernel_us"), ("eager", "wall_us"), ("graph", "graph_wall_us"),
              ("graph back to back", "graph_back_to_back_us"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, world in zip(axes, ("nccl1", "virtual8")):
        row = report["worlds"][world]["low_latency"]
        xs = range(len(fields))
        for shift, (label, op) in ((-0.2, ("epic", "pair")), (0.2, ("PyTorch", "torch_pair"))):
            ax.bar([x + shift for x in xs], [row[op][f] for _, f in fields], width=0.4,
                   label=label)
        floor = sum(row["bytes"].values()) / report["floors"]["copy_bytes_per_s"] * 1e6
        ax.axhline(floor, color="gray", linestyle="--", label=f"bytes floor {floor:.0f} us")
        ax.axhline(report["floors"]["launch_sync_us"], color="black", linestyle=":",
                   label="launch + sync floor")
        if world == "nccl1":  # the targets: eager <= 40 us, graph replay <= 25 us
            ax.plot([0.6, 1.4], [40, 40], color="red", linestyle="--", label="targets")
            ax.plot([1.6, 3.4], [25, 25], color="red", linestyle="--")
        ax.set_xticks(list(xs), [name for name, _ in fields], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{world}: low-latency pair, 128 tokens, V3 FP8")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("us per dispatch + combine")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="add a cProfile of the eager 128-token pair (NCCL world)")
    parser.add_argument("--low-latency", action="store_true",
                        help="only DeepEP V1's low-latency pair (both worlds)")
    parser.add_argument("--child-out", help=argparse.SUPPRESS)  # the torchrun child's JSON
    args = parser.parse_args()
    if args.compile_only:
        return compile_only()
    if args.child_out:
        return nccl_child(args)
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        child = os.path.join(tmp, "nccl.json")
        print("one-rank NCCL world (torchrun):", flush=True)
        subprocess.run(["torchrun", "--nproc-per-node", "1", os.path.abspath(__file__),
                        "--child-out", child, "--iterations", str(args.iterations)]
                       + (["--profile"] if args.profile else [])
                       + (["--low-latency"] if args.low_latency else []), check=True)
        with open(child) as f:
            nccl = json.load(f)
    print("virtual world of 8 ranks:", flush=True)
    virtual = dict(world="virtual", ranks=8)
    if not args.low_latency:
        buffer = epic.ElasticBuffer(epic.VirtualWorld(8), num_max_tokens_per_rank=max(CAPS),
                                    hidden=HIDDEN, num_topk=TOPK, use_fp8_dispatch=True,
                                    explicitly_destroy=True)
        virtual.update(blocks_per_rank=buffer._runtime().blocks_per_rank,
                       sizes=measure_world(torch, buffer, 8, args.iterations))
        virtual["kernel_sets_for_5_caps"] = kernel_sets_for_caps(torch, buffer, 8)
        buffer.destroy()
    virtual["low_latency"] = measure_low_latency(torch, epic.VirtualWorld(8), 8, args.iterations)
    report = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                  args=vars(args), floors=floors(torch, args.iterations),
                  worlds=dict(nccl1=nccl, virtual8=virtual))
    nl, vl = nccl["low_latency"], virtual["low_latency"]
    report["summary"] = dict(
        nccl1_t128_low_latency_pair_us=nl["pair"]["wall_us"],
        nccl1_t128_low_latency_graph_pair_us=nl["pair"]["graph_wall_us"],
        nccl1_t128_low_latency_graph_back_to_back_pair_us=nl["pair"]["graph_back_to_back_us"],
        nccl1_t128_low_latency_kernels_us=nl["pair"]["kernel_us"],
        nccl1_t128_low_latency_torch_pair_us=nl["torch_pair"]["wall_us"],
        nccl1_t128_low_latency_torch_graph_pair_us=nl["torch_pair"]["graph_wall_us"],
        nccl1_t128_low_latency_torch_kernels_us=nl["torch_pair"]["kernel_us"],
        virtual8_t128_low_latency_pair_us=vl["pair"]["wall_us"],
        virtual8_t128_low_latency_graph_pair_us=vl["pair"]["graph_wall_us"])
    if not args.low_latency:
        n, v = nccl["sizes"]["128"], virtual["sizes"]["128"]
        report["summary"].update(
            nccl1_t128_dispatch_us=n["dispatch"]["wall_us"],
            nccl1_t128_combine_us=n["combine"]["wall_us"],
            nccl1_t128_graph_pair_us=n["pair"]["graph_wall_us"],
            virtual8_t128_pair_us=v["pair"]["wall_us"],
            virtual8_t128_graph_pair_us=v["pair"]["graph_wall_us"],
            kernel_sets_for_5_caps=virtual["kernel_sets_for_5_caps"])
    os.makedirs(args.out, exist_ok=True)
    mode = "-low-latency" if args.low_latency else ""
    png = os.path.join(args.out,
                       f"latency-{report['gpu'].split()[-1].lower()}-{report['date']}{mode}.png")
    drawn = plot_low_latency(report, png) if args.low_latency else plot(report, png)
    report["plot"] = os.path.basename(png) if drawn else None
    ep_bench.write_report(report, args.out, prefix="latency-")
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
