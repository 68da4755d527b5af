"""Dispatch/combine on real GPUs (one process per GPU, NVLink), against NCCL's all-to-all.

    torchrun --nproc-per-node N bench/ep_multi_gpu.py            # on N GPUs of one host
    python bench/ep_multi_gpu.py --compile-only --world-size N   # here: the kernels, into the cache

DeepEP's V3 configuration (hidden 7168, top-8 of 256 experts, FP8 dispatch with 56 float32
scale packs, BF16 combine), 4096 and 8192 tokens per rank, for num_sms in {the analytic choice,
24, 64}. In the same run: the NVLink bandwidth through `all_to_all_single` of a large buffer
(bytes leaving each rank / time) and through a point-to-point exchange of two ranks, and a
dispatch/combine built from `all_to_all_single` (what a Megatron-style dispatcher does),
checked equal to epic's before anything is timed. Per rank: DeepEP's logical bandwidth (local
traffic included), kernel time from the profiler and wall time from events, after L2 flushes.
Rank 0 prints the table and writes bench/results/<gpu>x<N>-<date>.json.

The ranks stay in step: a barrier before every timed call, and one decision for all ranks on
whether a measurement is repeated (ep_bench.Timer's `agree`). A difference from the all-to-all
fails the run (exit 1, naming the rank, the size and what differed). SM counts the buffer cannot
run (the analytic 132 on a buffer of fewer blocks) are clipped to the buffer's blocks, said so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)

import epic  # noqa: E402
from common import add_compile_only_arguments, init_distributed  # noqa: E402
from ep_bench import KERNELS, Timer  # noqa: E402

HIDDEN, EXPERTS, TOPK, PACKS = 7168, 256, 8, 7168 // 128


def spec(world, tokens, expand=False):
    return dict(num_ranks=world, num_experts=EXPERTS, num_topk=TOPK, hidden=HIDDEN,
                dtype="f8E4M3FN", num_scale_packs=PACKS, expert_alignment=1, do_expand=expand,
                num_max_tokens_per_rank=tokens)


def fit_sms(requested, analytic, most):
    """The SM counts to time: `requested` (0 = `analytic`), each at most `most` (the buffer's
    blocks per rank), deduplicated; and a note per clipped count."""
    fitted, notes = set(), []
    for s in requested:
        want = s or analytic
        if want > most:
            notes.append(f"{want} SMs{' (analytic)' if not s else ''} exceed the buffer's {most} "
                         f"blocks per rank: timed with {most}")
        fitted.add(min(want, most))
    return sorted(fitted), notes


def equality_failures(everyone):
    """Lines naming every (rank, tokens) whose epic results differ from the all-to-all's, from
    every rank's report (the same on every rank: the exit code is one decision)."""
    lines = []
    for report in everyone:
        seen = set()
        for row in report["rows"]:
            if "baseline" in row or row["equal_to_all_to_all"] or row["tokens"] in seen:
                continue
            seen.add(row["tokens"])
            lines.append(f"rank {report['rank']}, {row['tokens']} tokens: "
                         f"{', '.join(row['differs'])} differ from all_to_all_single's")
    return lines


def all_ranks(torch, dist):
    """`agree(ok)`: True on every rank only if `ok` is True on every rank (an all-reduce)."""
    def agree(ok):
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())
    return agree


def compile_only(args):
    from epic import _C

    runtime = _C.Runtime("nccl", "", "")
    for tokens in args.tokens:
        s = spec(args.world_size, max(args.tokens))
        runtime.kernels(s, dict(weights=True, cached=False, zero_padding=False), "dispatch")
        runtime.kernels(s, dict(weights=False, biases=0), "combine")
    print(f"ep_multi_gpu: kernels for {args.world_size} ranks in {runtime.cache_dir}")
    return 0


class AllToAllEP:
    """Dispatch/combine with torch.distributed.all_to_all_single: each rank sends every token once
    to each rank owning one of its experts (rows, scales, ids, weights), rows arrive grouped by
    source rank in token order; combine sends the processed rows back and sums them per token in
    the order of the destinations' master slots."""

    def __init__(self, torch, dist, world, rank):
        self.t, self.dist, self.world, self.rank = torch, dist, world, rank
        self.L = EXPERTS // world

    def dispatch(self, x, sf, idx, w):
        t, L, R = self.t, self.L, self.world
        owner = (idx >= 0) & (idx // L == t.arange(R, device=idx.device)[:, None, None])  # [R,T,K]
        sends = owner.any(dim=2)  # [R, T]
        tokens = [sends[d].nonzero().squeeze(1) for d in range(R)]
        counts = t.tensor([len(tok) for tok in tokens], device=idx.device)
        recv_counts = t.empty_like(counts)
        self.dist.all_to_all_single(recv_counts, counts)
        order = t.cat(tokens)
        send_sizes, recv_sizes = counts.tolist(), recv_counts.tolist()

        def exchange(rows):
            out = t.empty((sum(recv_sizes),) + tuple(rows.shape[1:]), dtype=rows.dtype,
                          device=rows.device)
            self.dist.all_to_all_single(out, rows[order].contiguous(), recv_sizes, send_sizes)
            return out

        gid = (self.rank * idx.shape[0] + t.arange(idx.shape[0], device=idx.device)).int()
        handle = dict(order=order, send=send_sizes, recv=recv_sizes)
        return (exchange(x.view(t.uint8)), exchange(sf), exchange(idx), exchange(w),
                exchange(gid), handle)

    def combine(self, y, handle):
        t = self.t
        back = t.empty((sum(handle["send"]), y.shape[1]), dtype=y.dtype, device=y.device)
        self.dist.all_to_all_single(back, y, handle["send"], handle["recv"])
        out = t.zeros((handle["tokens"], y.shape[1]), dtype=t.float32, device=y.device)
        out.index_add_(0, handle["order"], back.float())
        return out.to(t.bfloat16)


def nvlink_bandwidth(torch, dist, world, rank, nbytes=1 << 30):
    """Bytes leaving a rank per second: all-to-all of `nbytes`, and a 2-rank exchange."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_to_all_single(dst, src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    a2a = nbytes * (world - 1) / world / statistics.median(times)
    p2p = None
    if world >= 2 and rank < 2:
        group = dist.new_group([0, 1])
        times = []
        for _ in range(5):
            dist.barrier(group=group)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            ops = [dist.P2POp(dist.isend, src, 1 - rank, group),
                   dist.P2POp(dist.irecv, dst, 1 - rank, group)]
            for op in dist.batch_isend_irecv(ops):
                op.wait()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        p2p = nbytes / statistics.median(times)
    elif world >= 2:
        dist.new_group([0, 1])  # every rank takes part in creating the group
    return a2a, p2p


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--sms", type=int, nargs="+", default=[0, 24, 64],
                        help="SMs per rank; 0 = DeepEP's analytic choice")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    add_compile_only_arguments(parser)
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args)

    import torch
    import torch.distributed as dist

    rank, world = init_distributed(EXPERTS)
    tmax = max(args.tokens)
    # The buffer's default: as many blocks per rank as the GPU has SMs. Every call's num_sms
    # must fit in the blocks the buffer says it has (a larger count would be refused).
    buffer = epic.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=tmax, hidden=HIDDEN,
                                num_topk=TOPK, use_fp8_dispatch=True, explicitly_destroy=True)
    analytic = buffer.get_theoretical_num_sms(EXPERTS, TOPK)
    sms_list, notes = fit_sms(args.sms, analytic, buffer._runtime().blocks_per_rank)
    if rank == 0:
        for note in notes:
            print(f"note: {note}")
    timer = Timer(torch, args.iterations, agree=all_ranks(torch, dist), sync=dist.barrier)
    a2a_bw, p2p_bw = nvlink_bandwidth(torch, dist, world, rank)
    baseline = AllToAllEP(torch, dist, world, rank)
    rows = []
    for tokens in args.tokens:
        g = torch.Generator(device="cuda").manual_seed(1000 * rank + tokens)
        x = torch.randn((tokens, HIDDEN), generator=g, device="cuda")
        groups = x.view(tokens, PACKS, 128)
        sf = (groups.abs().amax(-1).clamp(min=1e-4) / 448.0).contiguous()
        x8 = (groups / sf[..., None]).view(tokens, HIDDEN).to(torch.float8_e4m3fn)
        idx = torch.rand((tokens, EXPERTS), generator=g, device="cuda").topk(TOPK, dim=1).indices
        w = torch.rand((tokens, TOPK), generator=g, device="cuda")

        # Equal results first: received rows as sets (by source id), and the combine.
        (data, rsf), _, _, handle, _ = buffer.dispatch((x8, sf), idx, w, num_experts=EXPERTS)
        b_x, b_sf, b_idx, b_w, b_gid, b_handle = baseline.dispatch(x8, sf, idx, w)
        b_handle["tokens"] = tokens
        src = handle.recv_src_metadata[:, 0].long()
        src_rank, src_tok = src // tmax, src % tmax
        mine = torch.argsort(src_rank * tokens + src_tok)
        b_src = b_gid.long()  # rank * tokens + token: the same order key
        theirs = torch.argsort(b_src)
        differs = []
        if not torch.equal(data.view(torch.uint8)[mine], b_x[theirs]):
            differs.append("received rows")
        if not torch.equal(rsf[mine], b_sf[theirs]):
            differs.append("received scale packs")
        y = (data.float() * rsf.repeat_interleave(128, dim=1)).to(torch.bfloat16)
        combined, _, _ = buffer.combine(y, handle)
        b_y = (b_x.view(torch.float8_e4m3fn).float() * b_sf.repeat_interleave(128, dim=1)) \
            .to(torch.bfloat16)
        # The all-to-all sums in index_add's order, epic in DeepEP's: equal up to bf16 rounding.
        if not torch.allclose(combined.float(), baseline.combine(b_y, b_handle).float(),
                              rtol=1e-2, atol=1e-2):
            differs.append("combined tokens")

        n_recv = handle.num_recv_tokens
        logical_d = n_recv * (HIDDEN + 4 * PACKS + 8 * TOPK + 4 * TOPK)
        logical_c = n_recv * (2 * HIDDEN + 4 * TOPK)
        for sms in sms_list:
            def ep_dispatch():
                return buffer.dispatch((x8, sf), idx, w, num_experts=EXPERTS, num_sms=sms)

            def ep_combine():
                buffer.combine(y, handle, num_sms=sms)

            k_d = sum(timer.kernels(ep_dispatch, KERNELS["dispatch"], buffer).values())
            k_c = sum(timer.kernels(ep_combine, KERNELS["combine"], buffer).values())
            rows.append(dict(tokens=tokens, sms=sms, analytic=sms == analytic, recv_tokens=n_recv,
                             dispatch_kernel_s=k_d, combine_kernel_s=k_c,
                             dispatch_wall_s=timer.wall(ep_dispatch),
                             combine_wall_s=timer.wall(ep_combine),
                             dispatch_gbs=logical_d / k_d / 1e9, combine_gbs=logical_c / k_c / 1e9,
                             equal_to_all_to_all=not differs,
                             **({"differs": differs} if differs else {})))
        b_d = timer.wall(lambda: baseline.dispatch(x8, sf, idx, w))
        b_c = timer.wall(lambda: baseline.combine(b_y, b_handle))
        rows.append(dict(tokens=tokens, baseline="all_to_all_single", dispatch_wall_s=b_d,
                         combine_wall_s=b_c, dispatch_gbs=logical_d / b_d / 1e9,
                         combine_gbs=logical_c / b_c / 1e9))
    everyone = [None] * world
    dist.all_gather_object(everyone, dict(rank=rank, rows=rows, a2a=a2a_bw, p2p=p2p_bw))
    if rank == 0:
        gpu = torch.cuda.get_device_name().split()[-1].lower()
        report = dict(date=datetime.date.today().isoformat(), gpus=world, gpu=gpu,
                      analytic_sms=analytic, ranks=everyone,
                      deepep="not built: the GPU machine has no network to fetch it")
        print(f"NVLink: all_to_all_single {a2a_bw / 1e9:.0f} GB/s per rank, p2p "
              f"{(p2p_bw or 0) / 1e9:.0f} GB/s; analytic SMs {analytic}")
        for row in rows:
            what = row.get("baseline") or f"epic sms={row['sms']}"
            print(f"  T={row['tokens']:5d} {what:22s} dispatch {row['dispatch_gbs']:7.1f} GB/s "
                  f"({row['dispatch_gbs'] * 1e9 / a2a_bw:.0%} of a2a)  combine "
                  f"{row['combine_gbs']:7.1f} GB/s ({row['combine_gbs'] * 1e9 / a2a_bw:.0%})"
                  + ("" if "baseline" in row else
                     f"  {'eq' if row['equal_to_all_to_all'] else 'NOT EQUAL'}"))
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"{gpu}x{world}-{report['date']}.json")
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {path}")
    failures = equality_failures(everyone)
    if rank == 0:
        for line in failures:
            print(f"ep_multi_gpu: FAILED: {line}")
    buffer.destroy()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
