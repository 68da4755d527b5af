"""Dispatch/combine through the epic API on one GPU, against the roofline and plain PyTorch.

    python bench/ep_bench.py                  # DeepEP's V3 configuration, virtual EP8 (an H200)
    python bench/ep_bench.py --smoke          # tiny sizes; without a GPU: compile-only (CI)

What runs (every number from the same process):

* the device copy bandwidth (a large device-to-device copy, read + write bytes): the roofline;
* epic's dispatch (FP8 with float32 scale packs, and BF16; plain and expanded layouts; cached)
  and combine (BF16) on a virtual world of R ranks, and the same semantics in plain PyTorch
  (bench/torch_baseline.py): `TorchEP`, vectorized (one nonzero for the routing layout, one
  index_select for the rows, one gather-and-sum per combine stage), the reference of every
  speed-up ratio, and `NaiveTorchEP`, a loop with host syncs, reported as "naive". epic's
  dispatch is checked equal to TorchEP's (rows matched by source) and its combine within
  bf16 rounding of it (bitwise equal to the naive one's) before anything is timed;
* kernel times from the profiler (CUPTI: epic's kernels by name, every kernel of the
  vectorized baseline) and wall times from CUDA events, each iteration after a 256 MiB L2
  flush; medians. DeepEP's logical bandwidth (§8.1) and the bytes each epic kernel really
  moves, against the copy roofline;
* an SM sweep (SMs of the whole GPU: all virtual ranks share it; each rank gets sms // R whole
  SMs, so with R = 8 a sweep point is a multiple of 8: 4 SMs cannot be split over 8 ranks and
  132 runs as 128; DeepEP's analytic choice, 24 per rank, would need 192 and is reported as not
  fitting), the cold compile time of the kernels (where the compiler is) and their warm (disk
  cache) load time.

Writes bench/results/<gpu>-<date>.json (its `summary`: per configuration, epic's speed-up over
the vectorized baseline and its fraction of the dispatch's copy floor), a plot (.png, if
matplotlib is there) and prints a compact table last. METHOD: bytes first (byte_model), then
measure, then the ratio.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)  # torch_baseline, also when this file is imported from elsewhere

import epic  # noqa: E402
from epic import _C  # noqa: E402
from torch_baseline import NaiveTorchEP, TorchEP  # noqa: E402

KERNELS = {
    # The virtual world dispatches in one pass: slots and counts, then every row to its place.
    "dispatch": ("ep_dispatch_count", "ep_dispatch_scatter"),
    # ... and combines in one pass: each origin token gathers its contributions where they lie.
    "combine": ("ep_combine_gather",),
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
    # The dispatch's floor: each source row read once, each received row written once.
    cached_floor = tokens * row + n_recv * row if not cfg["expand"] else tokens * row + pairs * row
    # The scatter also reads the routing and replayed slots, and writes the plain layout's ids
    # (expanded: reads the destination's metadata row instead).
    scatter = cached_floor + tokens * K * (8 + 4) + (
        n_recv * 4 * (K + 2) if cfg["expand"] else n_recv * 8 * K)
    # One pass, uncached: the count kernel reads the routing and writes each master slot's slot
    # (expanded: also each pair's row in its expert block, read again by the scatter); the
    # scatter is the cached one plus the weights and each destination's metadata row.
    count = tokens * K * (8 + 4) + (pairs * 4 if cfg["expand"] else 0)
    weights_moved = tokens * K * 4 + (pairs * 4 if cfg["expand"] else n_recv * 4 * K)
    fresh_scatter = (cached_floor + tokens * K * (8 + 4) + weights_moved + n_recv * 4 * (K + 2)
                     + (pairs * 4 if cfg["expand"] else n_recv * 8 * K))
    # The combine's floor: each contribution read once (plain: a row per received token;
    # expanded: per pair), each combined row written once. The one-pass gather also reads the
    # routing and the slots (expanded: each pair's row in the destination's metadata).
    contributions = (pairs if cfg["expand"] else n_recv) * 2 * H
    combine_floor = contributions + tokens * 2 * H
    gather = combine_floor + tokens * K * (8 + 4) + (pairs * 4 if cfg["expand"] else 0)
    return dict(logical_dispatch=logical_dispatch, logical_combine=logical_combine,
                ep_combine_gather=gather, combine_floor=combine_floor,
                ep_dispatch_count=count, dispatch_ep_dispatch_scatter=fresh_scatter,
                ep_dispatch_send=send, ep_dispatch_copy=copy, ep_combine_send=combine_send,
                ep_combine_reduce=reduce, cached_dispatch_floor=cached_floor,
                dispatch_floor=cached_floor,
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
        return self.walls([fn])[0]

    def walls(self, fns):
        """Median wall time of each of `fns`, measured in turns (every iteration times each fn
        once, in order), so that a drift of the GPU's clocks or of the host over the run
        weighs on all of them alike: the way to compare variants of one call."""
        t = self.t
        times = [[] for _ in fns]
        for _ in range(self.iterations):
            for fn, mine in zip(fns, times):
                self.flush()
                start, stop = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                mine.append(start.elapsed_time(stop) / 1e3)
        # host-bound baselines vary between runs: the last fn's spread
        self.last_spread = (min(times[-1]), max(times[-1]))
        return [statistics.median(mine) for mine in times]

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

    def every_kernel(self, fn, attempts=2):
        """(median GPU time per call of every kernel, copy and memset `fn` launches, {name:
        median per call}): CUPTI's device time, as bench/latency.py's kernel_times, for a
        baseline of many small kernels (host gaps between them are not counted). The L2 flush
        before each call is profiled too: its kernel marks where each call begins and is left
        out, so `fn` must not launch a kernel of that name. Where the profile has lost records,
        the wall time instead (`self.source` says which)."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        def device_events(prof):
            return sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                          key=lambda e: e.time_range.start)

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self.flush_buffer.fill_(1)
            self.t.cuda.synchronize()
        flush = {e.name for e in device_events(prof)}
        for _ in range(attempts):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(self.iterations):
                    self.flush()
                    fn()
                self.t.cuda.synchronize()
            events = device_events(prof)
            starts = [e.time_range.start for e in events if e.name in flush]
            if len(starts) == self.iterations:
                break
        else:  # lost records (see kernels()), or fn launched the flush's kernel itself
            print(f"note: {len(starts)} L2 flushes profiled in {self.iterations} calls; timing "
                  "the baseline by wall clock", file=sys.stderr)
            self.source = "wall"
            return self.wall(fn), {}
        self.source = "cupti"
        per_call, per_name = [0.0] * self.iterations, {}
        for e in events:
            call = bisect.bisect_right(starts, e.time_range.start) - 1
            if e.name in flush or call < 0:
                continue
            per_call[call] += e.device_time_total / 1e6
            per_name.setdefault(e.name, [0.0] * self.iterations)[call] += \
                e.device_time_total / 1e6
        return (statistics.median(per_call),
                {name: statistics.median(v) for name, v in per_name.items()})


def out_of_memory(torch, bench, tokens, error):
    """The record of a size that did not fit this GPU (torch.OutOfMemoryError `error`), printed
    by name: the bench goes on with its other sizes and fails at the end."""
    first = str(error).splitlines()[0]
    print(f"{bench}: {tokens} tokens per rank do not fit {torch.cuda.get_device_name()} "
          f"({first}); skipped")
    return dict(tokens=tokens, why=first)


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


def quantize_blocks(torch, t, rows_block, block=128):
    """DeepSeek's FP8 cast of `t` [..., rows, cols]: one f32 scale (amax / 448, amax at least
    1e-4) per `rows_block` x `block` block of the last two dimensions (1 x 128 for tokens,
    128 x 128 for expert weights). Returns (e4m3 data, scales [..., rows / rows_block,
    cols / block])."""
    *lead, rows, cols = t.shape
    blocks = t.reshape(*lead, rows // rows_block, rows_block, cols // block, block)
    scales = (blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-4) / 448.0).float()
    data = (blocks / scales[..., None, :, None]).reshape(t.shape).to(torch.float8_e4m3fn)
    return data, scales.contiguous()


def dequantize_blocks(data, scales, rows_block, block=128):
    """The float32 values of quantize_blocks' output."""
    *lead, rows, cols = data.shape
    blocks = data.float().reshape(*lead, rows // rows_block, rows_block, cols // block, block)
    return (blocks * scales[..., None, :, None]).reshape(data.shape)


def expert_rows(handle, L, alignment):
    """[(start, end)] of each local expert's rows in an expanded dispatch's layout: from the
    end of the previous expert's rows rounded up to `alignment`, to the expert's prefix sum."""
    psum = handle.psum_num_recv_tokens_per_expert.tolist()
    rows, previous = [], 0
    for e in range(L):
        rows.append(((previous + alignment - 1) // alignment * alignment, psum[e]))
        previous = psum[e]
    return rows


def make_inputs(torch, R, T, H, E, K, fp8, seed, ragged=True):
    """Every rank's tokens (FP8: with scale packs), top-K routing and weights; `ragged`:
    rank r sends T - r tokens (DeepEP's test), else T."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs, sfs, idxs, ws = [], [], [], []
    for r in range(R):
        tokens = max(1, T - r) if ragged else T
        x = torch.randn((tokens, H), generator=g, device="cuda")
        if fp8:
            data, scales = quantize_blocks(torch, x, 1)
            xs.append(data)
            sfs.append(scales)
        else:
            xs.append(x.to(torch.bfloat16))
        scores = torch.rand((tokens, E), generator=g, device="cuda")
        idxs.append(scores.topk(K, dim=1, sorted=False).indices.to(torch.int64))
        ws.append(torch.rand((tokens, K), generator=g, device="cuda"))
    return xs, (sfs if fp8 else None), idxs, ws


def one_allocation(torch, parts):
    """A copy of the ranks' tensors, back to back in one allocation as one device holding
    every rank would keep them: the vectorized baseline reads them as one tensor without a
    copy (epic gets one allocation per rank, as each rank has its own)."""
    return None if parts is None else list(torch.cat(parts).split([p.shape[0] for p in parts]))


def config_name(cfg):
    """A configuration's key in the report's summary, e.g. t4096-fp8-expanded-a128."""
    layout = f"expanded-a{cfg['alignment']}" if cfg["expand"] else "plain"
    return f"t{cfg['tokens']}-{'fp8' if cfg['fp8'] else 'bf16'}-{layout}"


def check_dispatch(torch, ep, mine, out, handles, tokens, fp8):
    """epic's dispatch (`out`: recv_x, recv_topk_idx, recv_topk_weights) against the vectorized
    baseline's `mine`, bit for bit. epic places rows in arrival order, so its rows are matched
    by source id (recv_src_metadata), as epic.reference.sort_by_source does: plain rows sorted
    by source; expanded rows each in its expert's block, paired through the handle's slot
    columns. Returns what differs (empty: equal) and per destination the (epic rows, baseline
    rows) that hold the same (token, expert), to feed both combines the same values."""
    recv, recv_idx, recv_w = out
    dev = mine.x[0].device
    first = torch.tensor([0] + tokens[:-1], device=dev).cumsum(0)  # each rank's token 0
    pair_rows = ep.pair_rows(mine) if ep.expand else None
    bad, maps = [], []
    for d, h in enumerate(handles):
        meta = h.recv_src_metadata.long()
        tmax = h.num_max_tokens_per_rank
        g = first[meta[:, 0] // tmax] + meta[:, 0] % tmax  # global token of each epic row
        if h.num_recv_tokens != mine.num_recv[d] or \
                not torch.equal(g.sort().values, mine.received[d]):
            bad.append(f"rank {d}: the received tokens")
            maps.append(None)
            continue
        if not ep.expand:
            epic_rows = meta[:, 0].argsort()
            base_rows = torch.arange(len(epic_rows), device=dev)
            pairs = [("recv_topk_idx", recv_idx[d], mine.topk_idx[d])]
        else:
            slots = meta[:, 2:]
            base = torch.where(pair_rows[0][g] == d, pair_rows[1][g], -1)
            ends = torch.tensor(mine.expert_rows[d], device=dev).cumsum(0)
            epic_rows, base_rows = slots[slots >= 0], base[slots >= 0]
            if list(h.num_recv_tokens_per_expert_list) != mine.expert_rows[d] or \
                    not torch.equal(slots >= 0, base >= 0) or \
                    not torch.equal(torch.searchsorted(ends, epic_rows, right=True),
                                    torch.searchsorted(ends, base_rows, right=True)):
                bad.append(f"rank {d}: the expanded layout (blocks, counts or slots)")
                maps.append(None)
                continue
            pairs = []
        pairs += [("recv_x", recv[d][0] if fp8 else recv[d], mine.x[d]),
                  ("recv_topk_weights", recv_w[d], mine.weights[d])]
        if fp8:
            pairs.append(("scale packs", recv[d][1], mine.sf[d]))
        for name, theirs, ours in pairs:
            if not torch.equal(theirs[epic_rows].contiguous().view(torch.uint8),
                               ours[base_rows].contiguous().view(torch.uint8)):
                bad.append(f"rank {d}: {name}")
        maps.append((epic_rows, base_rows))
    return bad, maps


def torch_layout(torch, ys, maps, mine):
    """epic's combine inputs `ys` (rows in epic's order) in the baseline's layout, through
    check_dispatch's row maps, as views of one allocation (the baseline reads them without a
    copy); padding rows 0 (neither combine reads them)."""
    rows = [sum(c) for c in mine.expert_rows] if mine.expert_rows else mine.num_recv
    flat = torch.zeros((sum(rows), ys[0].shape[1]), dtype=ys[0].dtype, device=ys[0].device)
    out = list(flat.split(rows))
    for y, ours, (epic_rows, base_rows) in zip(ys, out, maps):
        ours[base_rows] = y[epic_rows]
    return out


def combine_difference(torch, combined, want):
    """(Ranks whose combined rows differ from `want` by more than bf16 rounding, that is
    |a - b| > 1e-2 + 1e-2 |b|, with the largest difference; whether all are bitwise equal)."""
    far = []
    for s, (a, b) in enumerate(zip(combined, want)):
        a, b = a.float(), b.float()
        if not bool(((a - b).abs() <= 1e-2 + 1e-2 * b.abs()).all()):
            far.append((s, float((a - b).abs().max())))
    bitwise = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                  for a, b in zip(combined, want))
    return far, bitwise


def run_config(torch, timer, args, cfg, sms_list, roofline):
    R, T, H, E, K = args.ranks, cfg["tokens"], args.hidden, args.experts, args.topk
    fp8, expand, alignment = cfg["fp8"], cfg["expand"], cfg["alignment"]
    xs, sfs, idxs, ws = make_inputs(torch, R, T, H, E, K, fp8, seed=cfg["tokens"])
    tokens = [x.shape[0] for x in xs]
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=T, hidden=H,
                                num_topk=K, use_fp8_dispatch=fp8, explicitly_destroy=True,
                                num_sms=max(sms_list) // R)
    x_in = [(x, sf) for x, sf in zip(xs, sfs)] if fp8 else xs
    kwargs = dict(num_experts=E, expert_alignment=alignment, do_expand=expand)

    # Correctness first, failing loudly: epic's dispatch equal to the vectorized baseline's
    # (rows matched by source), its combine within bf16 rounding of it (on the same values).
    recv, recv_idx, recv_w, handles, _ = buffer.dispatch(x_in, idxs, ws, **kwargs)
    ep = TorchEP(torch, R, E, K, alignment, expand)
    inputs = [one_allocation(torch, v) for v in (xs, sfs, idxs, ws)]
    mine = ep.dispatch(*inputs)
    bad, maps = check_dispatch(torch, ep, mine, (recv, recv_idx, recv_w), handles, tokens, fp8)
    if bad:
        raise RuntimeError(f"{config_name(cfg)}: epic's dispatch differs from plain PyTorch's: "
                           + "; ".join(bad))
    ys = [torch.randn((h.num_expanded_tokens if expand else h.num_recv_tokens, H),
                      device="cuda").to(torch.bfloat16) for h in handles]
    ys_torch = torch_layout(torch, ys, maps, mine)
    combined, _, _ = buffer.combine(ys, handles)
    far, _ = combine_difference(torch, combined, ep.combine(ys_torch, mine))
    if far:
        raise RuntimeError(f"{config_name(cfg)}: epic's combine differs from plain PyTorch's "
                           f"(rank, largest difference): {far}")
    # The naive loop adds in DeepEP's master-slot order with its own code: bitwise epic's.
    naive = NaiveTorchEP(torch, R, E, K, alignment, expand)
    naive_ref = naive.dispatch(xs, sfs, idxs, ws)
    _, equal_to_naive = combine_difference(torch, combined,
                                           naive.combine(ys_torch, naive_ref, idxs))

    stats = dict(tokens=sum(tokens),
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
        # The uncached and the cached dispatch both end in ep_dispatch_scatter: the uncached
        # one's fractions are keyed dispatch_<kernel>.
        timed = [(("dispatch_" if name == "ep_dispatch_scatter" else "") + name, seconds)
                 for name, seconds in k_d.items()] + list(k_c.items()) + list(k_cached.items())
        for name, seconds in timed:
            if seconds:
                row[f"{name}_roofline_fraction"] = model[name] / seconds / roofline
        row["cached_dispatch_floor_fraction"] = model["cached_dispatch_floor"] / t_cached / roofline
        rows.append(row)

    # The vectorized baseline, timed as epic is (GPU time, here of every kernel it launches)
    # and by wall clock (its nonzero syncs included); the naive loop by wall clock only.
    torch_d, kernels_d = timer.every_kernel(lambda: ep.dispatch(*inputs))
    sources = [timer.source]
    torch_c, kernels_c = timer.every_kernel(lambda: ep.combine(ys_torch, mine))
    sources.append(timer.source)
    wall_d = timer.wall(lambda: ep.dispatch(*inputs))
    wall_c = timer.wall(lambda: ep.combine(ys_torch, mine))
    naive_d = timer.wall(lambda: naive.dispatch(xs, sfs, idxs, ws))
    spread_d = timer.last_spread
    naive_c = timer.wall(lambda: naive.combine(ys_torch, naive_ref, idxs))
    spread_c = timer.last_spread
    buffer.destroy()
    return dict(config=cfg, name=config_name(cfg), stats=stats, bytes=model, sweep=rows,
                equal_to_torch=True,
                equal_to_naive_torch=equal_to_naive,
                torch_dispatch_kernel_s=torch_d, torch_combine_kernel_s=torch_c,
                torch_dispatch_wall_s=wall_d, torch_combine_wall_s=wall_c,
                torch_dispatch_kernels=kernels_d, torch_combine_kernels=kernels_c,
                torch_kernel_time_sources=sources,
                naive_torch_dispatch_wall_s=naive_d, naive_torch_combine_wall_s=naive_c,
                naive_torch_dispatch_wall_min_max_s=spread_d,
                naive_torch_combine_wall_min_max_s=spread_c)


def summarize(res, roofline):
    """One configuration's entry in the report's summary: epic's speed-up over the vectorized
    baseline (kernel times; epic at its fastest sweep point) and each dispatch's fraction of the
    copy floor (each source row read once and each received row written once, at the copy
    roofline)."""
    best = {op: min(res["sweep"], key=lambda row: row[f"{op}_kernel_s"])
            for op in ("dispatch", "combine", "cached_dispatch")}
    floor = res["bytes"]["dispatch_floor"] / roofline
    combine_floor = res["bytes"]["combine_floor"] / roofline
    return dict(
        dispatch_x_torch=res["torch_dispatch_kernel_s"] / best["dispatch"]["dispatch_kernel_s"],
        combine_x_torch=res["torch_combine_kernel_s"] / best["combine"]["combine_kernel_s"],
        dispatch_floor_fraction=floor / best["dispatch"]["dispatch_kernel_s"],
        cached_floor_fraction=floor / best["cached_dispatch"]["cached_dispatch_kernel_s"],
        combine_floor_fraction=combine_floor / best["combine"]["combine_kernel_s"],
        # What a caller waits for per call (host work included), at the same sweep points.
        dispatch_wall_ms=best["dispatch"]["dispatch_wall_s"] * 1e3,
        combine_wall_ms=best["combine"]["combine_wall_s"] * 1e3,
        sms={op: row["sms"] for op, row in best.items()})


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


def table(results, roofline, summary):
    """Per configuration and SM count: epic's kernel times, its speed-up over the vectorized
    baseline's kernel time and over the naive loop's wall time; then the summary."""
    lines = [f"copy roofline: {roofline / 1e9:.0f} GB/s (read + write)",
             "config                    SMs  dispatch ms (GB/s/rank)  combine ms (GB/s/rank)  "
             "cached ms   x torch d/c    x naive d/c  naive eq"]
    for res in results:
        for row in res["sweep"]:
            d, c = row["dispatch_kernel_s"], row["combine_kernel_s"]
            lines.append(
                f"{res['name']:25s} {row['sms']:4d}  {d * 1e3:7.3f} "
                f"({row['dispatch_logical_gbs_per_rank']:6.1f})        "
                f"{c * 1e3:7.3f} ({row['combine_logical_gbs_per_rank']:6.1f})"
                f"       {row['cached_dispatch_kernel_s'] * 1e3:7.3f}  "
                f"{res['torch_dispatch_kernel_s'] / d:5.1f}x/"
                f"{res['torch_combine_kernel_s'] / c:4.1f}x"
                f"  {res['naive_torch_dispatch_wall_s'] / d:5.1f}x/"
                f"{res['naive_torch_combine_wall_s'] / c:5.1f}x"
                f"  {'ok' if res['equal_to_naive_torch'] else 'NO'}")
    lines.append("summary (epic at its fastest SM count): config, x torch dispatch / combine "
                 "(kernel times), fraction of the floor: dispatch / cached / combine, wall ms "
                 "dispatch / combine")
    for name, entry in summary.items():
        lines.append(f"{name:25s} {entry['dispatch_x_torch']:5.2f}x / "
                     f"{entry['combine_x_torch']:5.2f}x   "
                     f"{entry['dispatch_floor_fraction']:.2f} / "
                     f"{entry['cached_floor_fraction']:.2f} / "
                     f"{entry['combine_floor_fraction']:.2f}   "
                     f"{entry['dispatch_wall_ms']:.3f} / {entry['combine_wall_ms']:.3f}")
    return "\n".join(lines)


def plot(results, roofline, ranks, path):
    """Logical GB/s per rank against SMs, for dispatch and combine: one line per
    configuration, its vectorized PyTorch baseline (kernel time: dotted, same colour), the naive
    loop (wall time: dash-dot, same colour) and the copy roofline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for op, ax in zip(("dispatch", "combine"), axes):
        for res in results:
            xs = [row["sms"] for row in res["sweep"]]
            ys = [row[f"{op}_logical_gbs_per_rank"] for row in res["sweep"]]
            line, = ax.plot(xs, ys, marker="o", label=res["name"])
            logical = res["bytes"][f"logical_{op}"] / ranks / 1e9
            ax.axhline(logical / res[f"torch_{op}_kernel_s"], color=line.get_color(),
                       linestyle=":", linewidth=1)
            ax.axhline(logical / res[f"naive_torch_{op}_wall_s"], color=line.get_color(),
                       linestyle="-.", linewidth=0.7)
        ax.axhline(roofline / 1e9 / ranks, color="k", linestyle="--",
                   label=f"copy roofline / {ranks} ranks")
        ax.plot([], [], color="gray", linestyle=":", label="PyTorch, vectorized (same colour)")
        ax.plot([], [], color="gray", linestyle="-.", label="PyTorch, naive loop (same colour)")
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
    parser.add_argument("--skip", nargs="*", default=[],
                        help="configuration names to leave out (e.g. t8192-bf16-expanded-a128, "
                             "whose worst-case outputs for 8 ranks do not fit one GPU's memory "
                             "next to the baseline's)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--compile-only", action="store_true",
                        help="compile every kernel set the run needs into the cache, then stop")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.hidden, args.experts, args.sms, args.iterations = (
            [64], 512, 32, [8, 16], 2)
    configs = []
    for tokens in args.tokens:
        configs += [dict(tokens=tokens, fp8=fp8, expand=expand, alignment=128 if expand else 1)
                    for fp8 in (True, False) for expand in (False, True)]
    configs = [cfg for cfg in configs if config_name(cfg) not in args.skip]
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
        report["summary"] = {res["name"]: summarize(res, roofline) for res in report["results"]}
        name = report["gpu"].split()[-1].lower() + ("-smoke" if args.smoke else "")
        os.makedirs(args.out, exist_ok=True)
        png = os.path.join(args.out, f"{name}-{report['date']}.png")
        report["plot"] = png if plot(report["results"], roofline, args.ranks, png) else None
        print(table(report["results"], roofline, report["summary"]))
        if "analytic_note" in report:
            print(report["analytic_note"])
        print(f"compile: {report['compile']}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}-{report['date']}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")
    # A difference from the vectorized baseline raised before timing; the naive loop's combine
    # must be epic's bit for bit.
    return 0 if all(r["equal_to_naive_torch"] for r in report.get("results", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
