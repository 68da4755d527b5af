"""Dispatch/combine through the epic API on one GPU, against the roofline and plain PyTorch.

    python bench/ep_bench.py                  # DeepEP's V3 configuration, virtual EP8 (an H200)
    python bench/ep_bench.py --smoke          # tiny sizes; without a GPU: compile-only (CI)

What runs (every number from the same process):

* the device copy bandwidth (a large device-to-device copy, read + write bytes): the roofline;
* epic's dispatch (FP8 with float32 scale packs, and BF16; plain and expanded layouts; cached)
  and combine (BF16) on a virtual world of R ranks, and the same semantics written in plain
  PyTorch (index_select / index_add in DeepEP's order), checked equal before anything is timed;
* kernel times from the profiler (CUPTI, by kernel name) and wall times from CUDA events, each
  iteration after a 256 MiB L2 flush; medians. DeepEP's logical bandwidth (§8.1) and the bytes
  each epic kernel really moves, against the copy roofline;
* an SM sweep (SMs of the whole GPU: all virtual ranks share it; each rank gets sms // R whole
  SMs, so with R = 8 a sweep point is a multiple of 8: 4 SMs cannot be split over 8 ranks and
  132 runs as 128; DeepEP's analytic choice, 24 per rank, would need 192 and is reported as not
  fitting), the cold compile time of the kernels (where the compiler is) and their warm (disk
  cache) load time.

Writes bench/results/<gpu>-<date>.json, a plot (.png, if matplotlib is there) and prints a
compact table last. METHOD: bytes first (byte_model), then measure, then the ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import epic  # noqa: E402
from epic import _C  # noqa: E402

KERNELS = {
    "dispatch": ("ep_dispatch_send", "ep_dispatch_copy"),
    "combine": ("ep_combine_send", "ep_combine_reduce"),
    # The virtual world's cached dispatch: one kernel, rows straight to their place.
    "cached_dispatch": ("ep_dispatch_scatter",),
}


# --- bytes ---------------------------------------------------------------------------------------


def byte_model(cfg, stats):
    """Bytes per operation, all ranks together.

    `stats`: received tokens (N_recv) and expanded rows (N_exp, padding included) summed over
    ranks, and the (token, local expert) pairs. DeepEP's logical bytes count every received
    token's row, packs, ids and weights once; epic's kernel bytes count what each kernel reads
    and writes in global memory (the window is global memory too).
    """
    H, K, P, e = cfg["hidden"], cfg["topk"], cfg["packs"], cfg["elem"]
    n_recv, n_exp, pairs = stats["recv_tokens"], stats["expanded_rows"], stats["pairs"]
    tokens = stats["tokens"]
    row = H * e + 4 * P  # data + scale packs
    logical_dispatch = n_recv * (row + 8 * K + 4 * K)
    logical_combine = n_recv * (2 * H + 4 * K)
    record = row + 8 * K + 8  # ids, weights, token id and master slot travel in the record
    send = n_recv * (row + 8 * K) + n_recv * record  # read each sent row, write its record
    if cfg["expand"]:
        copy = n_recv * record + pairs * (row + 4)  # read each record, write each expert row
        combine_send = pairs * 2 * H + n_recv * (2 * H + 4 * K)  # read expert rows, write records
    else:
        copy = n_recv * record + n_recv * (row + 8 * K + 4 * K)
        combine_send = n_recv * 2 * H + n_recv * (2 * H + 4 * K)
    reduce = n_recv * (2 * H + 4 * K) + tokens * (2 * H + 4 * K)  # read contributions, write out
    cached_floor = tokens * row + n_recv * row if not cfg["expand"] else tokens * row + pairs * row
    # The scatter also reads the routing and replayed slots, and writes the plain layout's ids
    # (expanded: reads the destination's metadata row instead).
    scatter = cached_floor + tokens * K * (8 + 4) + (
        n_recv * 4 * (K + 2) if cfg["expand"] else n_recv * 8 * K)
    return dict(logical_dispatch=logical_dispatch, logical_combine=logical_combine,
                ep_dispatch_send=send, ep_dispatch_copy=copy, ep_combine_send=combine_send,
                ep_combine_reduce=reduce, cached_dispatch_floor=cached_floor,
                ep_dispatch_scatter=scatter,
                expanded_rows=n_exp)


def reference_byte_model(args):
    """The byte model on routing statistics from epic.reference (numpy, no GPU): what the
    smoke mode checks without a GPU."""
    import numpy as np

    from epic import reference as ref

    rng = np.random.default_rng(0)
    tokens = [max(1, args.tokens[0] - r) for r in range(args.ranks)]
    idxs = [np.array([rng.permutation(args.experts)[:args.topk] for _ in range(t)], np.int64)
            for t in tokens]
    xs = [np.zeros((t, args.hidden), ref.bfloat16) for t in tokens]
    out = ref.dispatch(xs, idxs, num_experts=args.experts, expert_alignment=128, expand=True)
    stats = dict(tokens=sum(tokens), recv_tokens=sum(o.num_recv_tokens for o in out),
                 expanded_rows=sum(o.num_expanded_tokens for o in out),
                 pairs=int(sum((i >= 0).sum() for i in idxs)))
    model = byte_model(dict(hidden=args.hidden, topk=args.topk, packs=args.hidden // 128,
                            elem=1, expand=True), stats)
    return dict(stats=stats, bytes=model)


# --- the plain-PyTorch implementation ------------------------------------------------------------


class TorchEP:
    """DeepEP's semantics written with plain PyTorch ops: what an ML engineer would write without
    a communication library, on one GPU holding every rank's tensors. Rows come out in canonical
    order (by source rank, then token)."""

    def __init__(self, torch, R, E, K, alignment, expand):
        self.t, self.R, self.E, self.K, self.L = torch, R, E, K, E // R
        self.alignment, self.expand = alignment, expand

    def dispatch(self, xs, sfs, idxs, ws):
        t, R, L = self.t, self.R, self.L
        # Rows move as bytes (index ops on FP8 tensors are not implemented everywhere).
        xs = [x.view(t.uint8) if x.element_size() == 1 else x for x in xs]
        out = []
        for d in range(R):
            parts_x, parts_sf, parts_w, parts_local, plan = [], [], [], [], []
            for s in range(R):
                owner = (idxs[s] >= 0) & (idxs[s] // L == d)
                tokens = owner.any(dim=1).nonzero().squeeze(1)
                local = t.where(owner[tokens], idxs[s][tokens] - d * L, -1)
                parts_x.append(xs[s].index_select(0, tokens))
                if sfs is not None:
                    parts_sf.append(sfs[s].index_select(0, tokens))
                parts_w.append(ws[s].index_select(0, tokens))
                parts_local.append(local)
                plan.append((s, tokens, owner[tokens]))
            x = t.cat(parts_x)
            sf = t.cat(parts_sf) if sfs is not None else None
            w, local = t.cat(parts_w), t.cat(parts_local)
            result = dict(x=x, sf=sf, w=w, local=local, plan=plan)
            if self.expand:
                counts = t.stack([(local == e).sum() for e in range(L)])
                aligned = (counts + self.alignment - 1) // self.alignment * self.alignment
                starts = t.cumsum(aligned, 0) - aligned
                rows = int(aligned.sum())
                ex = t.zeros((rows, x.shape[1]), dtype=x.dtype, device=x.device)
                esf = None if sf is None else t.zeros((rows, sf.shape[1]), dtype=sf.dtype,
                                                      device=x.device)
                ew = t.zeros(rows, dtype=w.dtype, device=x.device)
                slot_row = t.full(local.shape, -1, dtype=t.int64, device=x.device)
                for e in range(L):
                    tok, slot = (local == e).nonzero(as_tuple=True)  # tokens ascending
                    at = starts[e] + t.arange(tok.numel(), device=x.device)
                    ex[at] = x[tok]
                    if esf is not None:
                        esf[at] = sf[tok]
                    ew[at] = w[tok, slot]
                    slot_row[tok, slot] = at
                result.update(ex=ex, esf=esf, ew=ew, slot_row=slot_row, aligned=aligned)
            out.append(result)
        return out

    def combine(self, ys, handles, idxs):
        """Each source's tokens: fp32 sum from +0.0 of every destination's contribution in
        increasing master-slot order (expanded: the destination first sums its rows in slot
        order and rounds to bf16), rounded once."""
        t, R, K = self.t, self.R, self.K
        outs = []
        for s in range(R):
            T, H = idxs[s].shape[0], ys[0].shape[1]
            acc = t.zeros((T, H), dtype=t.float32, device=idxs[s].device)
            contributions = []  # (master slot, token ids, rows) per destination
            for d in range(R):
                h = handles[d]
                offset = sum(p[1].numel() for p in h["plan"][:s])
                _, tokens, owner = h["plan"][s]
                if not tokens.numel():
                    continue
                rows = offset + t.arange(tokens.numel(), device=acc.device)
                master = (K - 1) - owner.flip(1).int().argmax(dim=1)
                if self.expand:
                    part = t.zeros((tokens.numel(), H), dtype=t.float32, device=acc.device)
                    for j in range(K):  # the destination's own sum, slot order
                        has = owner[:, j]
                        part[has] += ys[d][h["slot_row"][rows[has], j]].float()
                    value = part.to(t.bfloat16).float()
                else:
                    value = ys[d][rows].float()
                contributions.append((master, tokens, value))
            for j in range(K):  # every token gets its contributions in master-slot order
                for master, tokens, value in contributions:
                    pick = master == j
                    acc.index_add_(0, tokens[pick], value[pick])
            outs.append(acc.to(t.bfloat16))
        return outs


# --- timing --------------------------------------------------------------------------------------


class Timer:
    """Medians of `iterations` runs. Over several processes (bench/ep_multi_gpu.py) every rank
    must run the same calls in the same order: `sync()` runs before every iteration (a barrier)
    and `agree(ok)` turns a rank's own verdict into one decision for all ranks (True only if
    every rank's is), so that no rank retries a measurement alone."""

    def __init__(self, torch, iterations, agree=None, sync=None):
        self.t, self.iterations = torch, iterations
        self.agree = agree or (lambda ok: ok)
        self.sync = sync or (lambda: None)
        self.flush_buffer = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def flush(self):
        """Before each timed call: the L2 flush, then the ranks' barrier."""
        self.flush_buffer.fill_(1)
        self.sync()

    def wall(self, fn):
        """Median wall time (CUDA events around the call, CPU sync included) after L2 flushes."""
        t = self.t
        times = []
        for _ in range(self.iterations):
            self.flush()
            start, stop = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        self.last_spread = (min(times), max(times))  # host-bound baselines vary between runs
        return statistics.median(times)

    def kernels(self, fn, names, buffer=None, attempts=2):
        """Median GPU time of each named kernel (CUPTI through the profiler). CUPTI's
        buffers sometimes lose a kernel's records (seen on the H200 for whole runs of one
        kernel): the measurement is repeated, then, with `buffer`, taken from the runtime's
        CUDA events around each kernel instead (`self.source` says which)."""
        from torch.profiler import ProfilerActivity, profile

        for _ in range(attempts):
            try:
                prof = profile(activities=[ProfilerActivity.CUDA], acc_events=True)
            except TypeError:  # an older torch
                prof = profile(activities=[ProfilerActivity.CUDA])
            with prof:
                for _ in range(self.iterations):
                    self.flush()
                    fn()
                self.t.cuda.synchronize()
            found = {name: [] for name in names}
            for event in prof.events():
                if event.name in found:
                    found[event.name].append(event.device_time_total / 1e6)
            # One decision for all ranks: a rank whose profiler lost records must not repeat
            # the calls (collectives) while the others go on to the next measurement.
            if self.agree(all(len(v) >= self.iterations // 2 for v in found.values())):
                self.source = "cupti"
                return {name: statistics.median(v) for name, v in found.items()}
        lost = {n: len(v) for n, v in found.items()}
        if buffer is None:
            raise RuntimeError(f"the profiler lost the kernels of {names} {attempts} times: "
                               f"{lost} records")
        print(f"note: the profiler lost kernel records ({lost}); timing {names} with the "
              f"runtime's CUDA events", file=sys.stderr)
        buffer.time_kernels(True)
        buffer.kernel_times()
        found = {name: [] for name in names}
        try:
            for _ in range(self.iterations):
                self.flush()
                fn()
                for name, seconds in buffer.kernel_times():
                    if name in found:
                        found[name].append(seconds)
        finally:
            buffer.time_kernels(False)
        if not all(found.values()):
            raise RuntimeError(f"kernels {names} were not launched: {found}")
        self.source = "cuda_events"
        return {name: statistics.median(v) for name, v in found.items()}


def write_report(report, out_dir, prefix=""):
    """bench/results/<prefix><gpu>-<date>.json (the other benches' reports too)."""
    os.makedirs(out_dir, exist_ok=True)
    name = report["gpu"].split()[-1].lower()
    path = os.path.join(out_dir, f"{prefix}{name}-{report['date']}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")
    return path


def copy_roofline(torch):
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(10):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return 2 * src.numel() / statistics.median(times)


# --- one configuration ---------------------------------------------------------------------------


def make_inputs(torch, R, T, H, E, K, fp8, seed, ragged=True):
    """Every rank's tokens (FP8: with scale packs), top-K routing and weights; `ragged`:
    rank r sends T - r tokens (DeepEP's test), else T."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs, sfs, idxs, ws = [], [], [], []
    for r in range(R):
        tokens = max(1, T - r) if ragged else T
        x = torch.randn((tokens, H), generator=g, device="cuda")
        if fp8:
            groups = x.view(tokens, H // 128, 128)
            amax = groups.abs().amax(-1).clamp(min=1e-4)
            sfs.append((amax / 448.0).float().contiguous())
            xs.append((groups / sfs[-1][..., None]).view(tokens, H).to(torch.float8_e4m3fn))
        else:
            xs.append(x.to(torch.bfloat16))
        scores = torch.rand((tokens, E), generator=g, device="cuda")
        idxs.append(scores.topk(K, dim=1, sorted=False).indices.to(torch.int64))
        ws.append(torch.rand((tokens, K), generator=g, device="cuda"))
    return xs, (sfs if fp8 else None), idxs, ws


def run_config(torch, timer, args, cfg, sms_list, roofline):
    R, T, H, E, K = args.ranks, cfg["tokens"], args.hidden, args.experts, args.topk
    fp8, expand, alignment = cfg["fp8"], cfg["expand"], cfg["alignment"]
    xs, sfs, idxs, ws = make_inputs(torch, R, T, H, E, K, fp8, seed=cfg["tokens"])
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=T, hidden=H,
                                num_topk=K, use_fp8_dispatch=fp8, explicitly_destroy=True,
                                num_sms=max(sms_list) // R)
    x_in = [(x, sf) for x, sf in zip(xs, sfs)] if fp8 else xs
    kwargs = dict(num_experts=E, expert_alignment=alignment, do_expand=expand)

    # Correctness first: epic against the plain-PyTorch implementation. Rows are matched
    # through the handle (epic places them in arrival order, the baseline canonically).
    recv, recv_idx, recv_w, handles, _ = buffer.dispatch(x_in, idxs, ws, **kwargs)
    baseline = TorchEP(torch, R, E, K, alignment, expand)
    ref = baseline.dispatch(xs, sfs, idxs, ws)
    ys = [torch.randn((h.num_expanded_tokens if expand else h.num_recv_tokens, H),
                      device="cuda").to(torch.bfloat16) for h in handles]
    same, ys_ref = True, []
    for r in range(R):
        data = (recv[r][0] if fp8 else recv[r]).view(torch.uint8)
        meta = handles[r].recv_src_metadata
        order = torch.argsort(meta[:, 0].long())  # canonical index -> epic's row
        if expand:
            mine, theirs = meta[order][:, 2:].long(), ref[r]["slot_row"]
            used = mine >= 0
            same &= torch.equal(used, theirs >= 0)
            same &= torch.equal(data[mine[used]], ref[r]["ex"][theirs[used]].view(torch.uint8))
            y = torch.zeros((ref[r]["ex"].shape[0], H), dtype=torch.bfloat16, device="cuda")
            y[theirs[used]] = ys[r][mine[used]]
            ys_ref.append(y)
        else:
            same &= torch.equal(data[order], ref[r]["x"].view(torch.uint8))
            same &= torch.equal(recv_idx[r][order], ref[r]["local"])
            ys_ref.append(ys[r][order])
    combined, _, _ = buffer.combine(ys, handles)
    want = baseline.combine(ys_ref, ref, idxs)
    same &= all(torch.equal(combined[r].view(torch.int16), want[r].view(torch.int16))
                for r in range(R))

    stats = dict(tokens=sum(x.shape[0] for x in xs),
                 recv_tokens=sum(h.num_recv_tokens for h in handles),
                 expanded_rows=sum(h.num_expanded_tokens for h in handles),
                 pairs=int(sum(int((i >= 0).sum()) for i in idxs)))
    elem = 1 if fp8 else 2
    model = byte_model(dict(hidden=H, topk=K, packs=H // 128 if fp8 else 0, elem=elem,
                            expand=expand), stats)

    rows = []
    for sms in sms_list:
        per_rank = max(1, sms // R)

        def dispatch():
            return buffer.dispatch(x_in, idxs, ws, num_sms=per_rank, **kwargs)

        def combine():
            buffer.combine(ys, handles, num_sms=per_rank)

        def cached():
            buffer.dispatch(x_in, handle=handles, num_sms=per_rank, do_expand=expand)

        k_d = timer.kernels(dispatch, KERNELS["dispatch"], buffer)
        sources = [timer.source]
        k_c = timer.kernels(combine, KERNELS["combine"], buffer)
        sources.append(timer.source)
        k_cached = timer.kernels(cached, KERNELS["cached_dispatch"], buffer)
        sources.append(timer.source)
        w_d, w_c = timer.wall(dispatch), timer.wall(combine)
        t_d, t_c, t_cached = sum(k_d.values()), sum(k_c.values()), sum(k_cached.values())
        row = dict(sms=per_rank * R, sms_per_rank=per_rank,
                   dispatch_kernel_s=t_d, dispatch_wall_s=w_d, combine_kernel_s=t_c,
                   combine_wall_s=w_c, cached_dispatch_kernel_s=t_cached, kernels=dict(**k_d),
                   combine_kernels=dict(**k_c), cached_kernels=dict(**k_cached),
                   kernel_time_sources=sources,
                   dispatch_logical_gbs_per_rank=model["logical_dispatch"] / R / t_d / 1e9,
                   combine_logical_gbs_per_rank=model["logical_combine"] / R / t_c / 1e9)
        for name, seconds in list(k_d.items()) + list(k_c.items()) + list(k_cached.items()):
            if seconds:
                row[f"{name}_roofline_fraction"] = model[name] / seconds / roofline
        row["cached_dispatch_floor_fraction"] = model["cached_dispatch_floor"] / t_cached / roofline
        rows.append(row)

    # The plain-PyTorch implementation, timed the same way (wall; it is many small kernels).
    t_torch_d = timer.wall(lambda: baseline.dispatch(xs, sfs, idxs, ws))
    spread_d = timer.last_spread
    t_torch_c = timer.wall(lambda: baseline.combine(ys_ref, ref, idxs))
    spread_c = timer.last_spread
    buffer.destroy()
    return dict(config=cfg, stats=stats, bytes=model, equal_to_pytorch=bool(same),
                sweep=rows, pytorch_dispatch_wall_s=t_torch_d, pytorch_combine_wall_s=t_torch_c,
                pytorch_dispatch_wall_min_max_s=spread_d, pytorch_combine_wall_min_max_s=spread_c)


def kernel_sets(args, configs):
    """Every (spec, variant, kind) the run launches: to fill a cache ahead of time."""
    for cfg in configs:
        spec = dict(num_ranks=args.ranks, num_experts=args.experts, num_topk=args.topk,
                    hidden=args.hidden, dtype="f8E4M3FN" if cfg["fp8"] else "bf16",
                    num_scale_packs=args.hidden // 128 if cfg["fp8"] else 0,
                    expert_alignment=cfg["alignment"], do_expand=cfg["expand"],
                    num_max_tokens_per_rank=cfg["tokens"])
        yield spec, dict(weights=True, cached=False, zero_padding=False), "dispatch"
        yield spec, dict(weights=False, cached=True, zero_padding=False), "dispatch"
        yield spec, dict(weights=False, biases=0), "combine"


def compile_times(args, spec_tokens, fp8, expand, alignment):
    """Cold compile (a fresh cache) and warm load of one dispatch + combine set."""
    spec = dict(num_ranks=args.ranks, num_experts=args.experts, num_topk=args.topk,
                hidden=args.hidden, dtype="f8E4M3FN" if fp8 else "bf16",
                num_scale_packs=args.hidden // 128 if fp8 else 0, expert_alignment=alignment,
                do_expand=expand, num_max_tokens_per_rank=spec_tokens)
    variants = (("dispatch", dict(weights=True, cached=False, zero_padding=False)),
                ("combine", dict(weights=False, biases=0)))
    result = {}
    with tempfile.TemporaryDirectory() as fresh:
        try:
            cold = _C.Runtime("virtual", fresh, "")
            result["cold_compile_s"] = sum(cold.kernels(spec, v, k)["seconds"] for k, v in variants)
            warm = _C.Runtime("virtual", fresh, "")
            result["warm_load_s"] = sum(warm.kernels(spec, v, k)["seconds"] for k, v in variants)
        except RuntimeError as e:  # no compiler here: the cache must have them
            result["cold_compile_s"] = None
            result["cold_compile_note"] = str(e).splitlines()[0][:200]
            cached = _C.Runtime("virtual", "", "")
            result["warm_load_s"] = sum(cached.kernels(spec, v, k)["seconds"] for k, v in variants)
    return result


# --- report --------------------------------------------------------------------------------------


def table(results, roofline):
    lines = [f"copy roofline: {roofline / 1e9:.0f} GB/s (read + write)",
             "config                     SMs  dispatch ms (GB/s/rank)  combine ms (GB/s/rank)  "
             "cached ms  vs torch d/c   eq"]
    for res in results:
        c = res["config"]
        name = (f"T={c['tokens']} {'fp8' if c['fp8'] else 'bf16'} "
                f"{'exp' if c['expand'] else 'plain'} A={c['alignment']}")
        for row in res["sweep"]:
            speed_d = res["pytorch_dispatch_wall_s"] / row["dispatch_kernel_s"]
            speed_c = res["pytorch_combine_wall_s"] / row["combine_kernel_s"]
            lines.append(
                f"{name:26s} {row['sms']:4d}  {row['dispatch_kernel_s'] * 1e3:7.3f} "
                f"({row['dispatch_logical_gbs_per_rank']:6.1f})        "
                f"{row['combine_kernel_s'] * 1e3:7.3f} ({row['combine_logical_gbs_per_rank']:6.1f})"
                f"       {row['cached_dispatch_kernel_s'] * 1e3:7.3f}   "
                f"{speed_d:5.1f}x/{speed_c:5.1f}x  {'ok' if res['equal_to_pytorch'] else 'NO'}")
    return "\n".join(lines)


def plot(results, roofline, ranks, path):
    """Logical GB/s per rank against SMs, for dispatch and combine: one line per
    configuration, its plain-PyTorch baseline (dotted, same colour) and the copy roofline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for op, ax in zip(("dispatch", "combine"), axes):
        for res in results:
            c = res["config"]
            xs = [row["sms"] for row in res["sweep"]]
            ys = [row[f"{op}_logical_gbs_per_rank"] for row in res["sweep"]]
            label = (f"T={c['tokens']} {'fp8' if c['fp8'] else 'bf16'} "
                     f"{'exp' if c['expand'] else 'plain'}")
            line, = ax.plot(xs, ys, marker="o", label=label)
            torch_gbs = res["bytes"][f"logical_{op}"] / ranks / res[f"pytorch_{op}_wall_s"] / 1e9
            ax.axhline(torch_gbs, color=line.get_color(), linestyle=":", linewidth=1)
        ax.axhline(roofline / 1e9 / ranks, color="k", linestyle="--",
                   label=f"copy roofline / {ranks} ranks")
        ax.plot([], [], color="gray", linestyle=":", label="PyTorch (same colour)")
        ax.set_xlabel("SMs (all virtual ranks)")
        ax.set_ylabel("logical GB/s per rank")
        ax.set_title(op)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--sms", type=int, nargs="+", default=[8, 16, 24, 32, 64, 128])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI: compile-only)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--compile-only", action="store_true",
                        help="compile every kernel set the run needs into the cache, then stop")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.hidden, args.experts, args.sms, args.iterations = (
            [64], 512, 32, [8, 16], 2)
    configs = []
    for tokens in args.tokens:
        configs += [dict(tokens=tokens, fp8=True, expand=False, alignment=1),
                    dict(tokens=tokens, fp8=True, expand=True, alignment=128),
                    dict(tokens=tokens, fp8=False, expand=False, alignment=1)]
    if args.compile_only:
        runtime = _C.Runtime("virtual", "", "")
        sets = [runtime.kernels(spec, variant, kind)["key"]
                for spec, variant, kind in kernel_sets(args, configs)]
        print(f"ep_bench: {len(sets)} kernel sets in {runtime.cache_dir}")
        return 0
    report = dict(date=datetime.date.today().isoformat(), args=vars(args),
                  compile=compile_times(args, max(args.tokens), True, True, 128))
    gpus = _C.cuda_device_count()
    if gpus == 0:
        report["gpu"] = None
        report["note"] = "no GPU here: compile-only (kernels compiled and their times recorded)"
        report["byte_model"] = reference_byte_model(args)
        print(json.dumps(report["compile"]), json.dumps(report["byte_model"]))
        name = "cpu-smoke" if args.smoke else "cpu"
    else:
        import torch

        report["gpu"] = torch.cuda.get_device_name()
        device_sms = torch.cuda.get_device_properties(0).multi_processor_count
        analytic = epic.ElasticBuffer(epic.VirtualWorld(args.ranks), num_bytes=2 << 20) \
            .get_theoretical_num_sms(args.experts, args.topk)
        report["analytic_sms_per_rank"] = analytic
        if analytic * args.ranks <= device_sms:  # every virtual rank's blocks resident at once
            args.sms = sorted(set(args.sms) | {analytic * args.ranks})
        else:
            report["analytic_note"] = (f"DeepEP's choice, {analytic} SMs per rank, needs "
                                       f"{analytic * args.ranks} SMs for {args.ranks} virtual "
                                       f"ranks; this GPU has {device_sms}")
        timer = Timer(torch, args.iterations)
        roofline = copy_roofline(torch)
        report["copy_roofline_bytes_per_s"] = roofline
        report["results"] = [run_config(torch, timer, args, cfg, args.sms, roofline)
                             for cfg in configs]
        name = report["gpu"].split()[-1].lower() + ("-smoke" if args.smoke else "")
        os.makedirs(args.out, exist_ok=True)
        png = os.path.join(args.out, f"{name}-{report['date']}.png")
        report["plot"] = png if plot(report["results"], roofline, args.ranks, png) else None
        print(table(report["results"], roofline))
        if "analytic_note" in report:
            print(report["analytic_note"])
        print(f"compile: {report['compile']}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}-{report['date']}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")
    return 0 if all(r["equal_to_pytorch"] for r in report.get("results", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
