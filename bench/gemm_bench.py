"""ep.grouped_gemm (TMA + wgmma, persistent) against torch's cuBLAS matmuls per expert, on the
rows of a real expanded dispatch, and dispatch -> GEMM in two steps against the fused
schedule (ep-fuse-dispatch-gemm); same process, one GPU (a virtual EP world).

    python bench/gemm_bench.py                 # V3: EP8, 256 experts, top-8, hidden 7168, N 2048
    python bench/gemm_bench.py --compile-only  # fill the kernel cache (tools/device/prepare.sh)

METHOD: the floor is the FLOPs (2 x rows x hidden x N over every rank's expert rows) at the
GPU's dense BF16 rate; both sides are timed as kernel time from the profiler (CUPTI), medians of
--iterations after L2 flushes: epic's one launch for all ranks, and the sum of every kernel
torch runs for the per-expert `torch.mm(x[rows_e], w[e], out=...)` loop (so its launch gaps do
not count against it). Results are compared first (fp32 outputs, rtol 1e-3). Writes
bench/results/gemm-<gpu>-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import ep_bench  # noqa: E402
import epic  # noqa: E402
from epic import _C  # noqa: E402

KERNEL = "ep_grouped_gemm_gemm"
ALIGNMENT = 128


def spec_of(args):
    return dict(num_ranks=args.ranks, num_experts=args.experts, num_topk=args.topk,
                hidden=args.hidden, dtype="bf16", num_scale_packs=0, expert_alignment=ALIGNMENT,
                do_expand=True, num_max_tokens_per_rank=args.tokens)


def compile_only(args):
    runtime = _C.Runtime("virtual", "", "")
    spec = spec_of(args)
    keys = [runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False),
                            "dispatch")["key"]]
    for out in ("bf16", "f32"):
        keys.append(runtime.kernels(spec, dict(n=args.n, out_dtype=out), "grouped_gemm")["key"])
    keys.append(runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False,
                                           n=args.n, out_dtype="bf16"), "dispatch_gemm")["key"])
    # dispatch -> GEMM -> combine: a square expert GEMM (the combine sends hidden-wide rows).
    keys.append(runtime.kernels(spec, dict(n=args.hidden, out_dtype="bf16"), "grouped_gemm")["key"])
    keys.append(runtime.kernels(spec, dict(weights=False, biases=0), "combine")["key"])
    keys.append(runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False,
                                           n=args.hidden, out_dtype="bf16"),
                                "dispatch_gemm")["key"])
    keys.append(runtime.kernels(spec, dict(biases=0), "gemm_combine")["key"])
    print(f"gemm_bench: {len(keys)} kernel sets in {runtime.cache_dir}")


def all_kernels_time(torch, timer, fn):
    """Median over iterations of the summed device time of every kernel `fn` runs."""
    from torch.profiler import ProfilerActivity, profile

    totals = []
    for _ in range(timer.iterations):
        timer.flush()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_time_total > 0
                   and "fill" not in e.name.lower()]
        totals.append(sum(e.device_time_total for e in kernels) / 1e6)
    return statistics.median(totals)


def run(args):
    import torch

    R, T, H, E, K, N = args.ranks, args.tokens, args.hidden, args.experts, args.topk, args.n
    L = E // R
    timer = ep_bench.Timer(torch, args.iterations)
    xs, _, idxs, ws = ep_bench.make_inputs(torch, R, T, H, E, K, False, seed=7)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=T, hidden=H,
                                num_topk=K, explicitly_destroy=True)
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, ws, num_experts=E, do_expand=True,
                                             expert_alignment=ALIGNMENT)
    g = torch.Generator(device="cuda").manual_seed(11)
    weights = [(torch.randn((L, H, N), generator=g, device="cuda") / H ** 0.5)
               .to(torch.bfloat16) for _ in range(R)]
    ranges = []
    for h in handles:
        psum, previous, rows = h.psum_num_recv_tokens_per_expert.tolist(), 0, []
        for e in range(L):
            start = (previous + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            rows.append((start, psum[e]))
            previous = psum[e]
        ranges.append(rows)
    outs_torch = [torch.zeros((x.shape[0], N), dtype=torch.bfloat16, device="cuda")
                  for x in recv]

    def torch_gemm():
        for r in range(R):
            for e, (start, end) in enumerate(ranges[r]):
                if end > start:
                    torch.mm(recv[r][start:end], weights[r][e], out=outs_torch[r][start:end])

    def epic_gemm():
        return buffer.grouped_gemm(recv, weights, handles)

    # Equal first (fp32 output against fp32 math on the same bf16 inputs).
    got = buffer.grouped_gemm(recv, weights, handles, out_dtype=torch.float32)
    torch.cuda.synchronize()
    worst, equal = 0.0, True
    for r in range(R):
        for e, (start, end) in enumerate(ranges[r]):
            if end > start:
                want = recv[r][start:end].float() @ weights[r][e].float()
                error = ((got[r][start:end] - want).abs().max() / want.abs().max()).item()
                worst = max(worst, error)
                equal &= error < 1e-3
    rows = sum(end - start for rr in ranges for start, end in rr)
    flops = 2.0 * rows * H * N

    # Dispatch then GEMM: two steps, and fused (ep-fuse-dispatch-gemm). The same rows in the
    # same places are not guaranteed (arrival order), the same multiset per expert is: the
    # fused output is checked against the grouped GEMM of its own rows (bitwise).
    def two_steps():
        rx, _, _, hs, _ = buffer.dispatch(xs, idxs, ws, num_experts=E, do_expand=True,
                                          expert_alignment=ALIGNMENT)
        return buffer.grouped_gemm(rx, weights, hs)

    def fused():
        return buffer.dispatch_gemm(xs, idxs, weights, topk_weights=ws, num_experts=E,
                                    expert_alignment=ALIGNMENT)

    # dispatch -> GEMM -> combine with a square expert GEMM (N = hidden: the combine sends
    # hidden-wide rows): the three steps one after another, against each fusion (the compiler
    # fuses one pair per GEMM). Combined results must be bitwise equal across the three.
    square = [(torch.randn((L, H, H), generator=g, device="cuda") / H ** 0.5)
              .to(torch.bfloat16) for _ in range(R)]

    def three_steps():
        rx, _, _, hs, _ = buffer.dispatch(xs, idxs, ws, num_experts=E, do_expand=True,
                                          expert_alignment=ALIGNMENT)
        return buffer.combine(buffer.grouped_gemm(rx, square, hs), hs)[0]

    def fused_dispatch_gemm():
        _, _, y, hs, _ = buffer.dispatch_gemm(xs, idxs, square, topk_weights=ws, num_experts=E,
                                              expert_alignment=ALIGNMENT)
        return buffer.combine(y, hs)[0]

    def fused_gemm_combine():
        rx, _, _, hs, _ = buffer.dispatch(xs, idxs, ws, num_experts=E, do_expand=True,
                                          expert_alignment=ALIGNMENT)
        return buffer.gemm_combine(rx, square, hs)[1]

    if args.once:  # for an external profiler: every epic variant once, nothing timed
        for fn in (epic_gemm, two_steps, fused, three_steps, fused_dispatch_gemm,
                   fused_gemm_combine):
            fn()
        torch.cuda.synchronize()
        return None
    t_epic = timer.kernels(epic_gemm, (KERNEL,), buffer)[KERNEL]
    t_torch = all_kernels_time(torch, timer, torch_gemm)
    w_epic, w_torch = timer.wall(epic_gemm), timer.wall(torch_gemm)
    frx, _, fout, fhandles, _ = fused()
    again = buffer.grouped_gemm(frx, weights, fhandles)
    torch.cuda.synchronize()
    fused_equal = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                      for a, b in zip(fout, again))
    two_names = ("ep_dispatch_count", "ep_dispatch_scatter", KERNEL)  # one pass (virtual)
    fused_names = ("ep_dispatch_gemm_send", "ep_dispatch_gemm_copy_gemm")
    per_kernel = dict(two_steps=timer.kernels(two_steps, two_names, buffer),
                      fused=timer.kernels(fused, fused_names, buffer))
    t_two, t_fused = sum(per_kernel["two_steps"].values()), sum(per_kernel["fused"].values())
    w_two, w_fused = timer.wall(two_steps), timer.wall(fused)

    outs = [three_steps(), fused_dispatch_gemm(), fused_gemm_combine()]
    torch.cuda.synchronize()
    layer_equal = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                      for other in outs[1:] for a, b in zip(outs[0], other))
    three_names = ("ep_dispatch_count", "ep_dispatch_scatter", KERNEL, "ep_combine_gather")
    per_kernel.update(
        layer_three_steps=timer.kernels(three_steps, three_names, buffer),
        layer_fused_dispatch_gemm=timer.kernels(fused_dispatch_gemm,
                                                fused_names + three_names[3:], buffer),
        layer_fused_gemm_combine=timer.kernels(fused_gemm_combine, three_names[:2] + (
            "ep_gemm_combine_gemm_send", "ep_gemm_combine_reduce"), buffer))
    t_three, t_front, t_back = (sum(per_kernel[k].values()) for k in (
        "layer_three_steps", "layer_fused_dispatch_gemm", "layer_fused_gemm_combine"))
    w_three, w_front, w_back = (timer.wall(three_steps), timer.wall(fused_dispatch_gemm),
                                timer.wall(fused_gemm_combine))
    buffer.destroy()
    return dict(rows=rows, flops=flops, equal=bool(equal), max_relative_error=worst,
                fused_equal=bool(fused_equal), two_steps_kernel_s=t_two, fused_kernel_s=t_fused,
                two_steps_wall_s=w_two, fused_wall_s=w_fused, fused_speedup=t_two / t_fused,
                epic_kernel_s=t_epic, cublas_kernels_s=t_torch, epic_wall_s=w_epic,
                torch_wall_s=w_torch, layer_equal=bool(layer_equal),
                three_steps_kernel_s=t_three, fused_dispatch_gemm_layer_kernel_s=t_front,
                fused_gemm_combine_layer_kernel_s=t_back, three_steps_wall_s=w_three,
                fused_dispatch_gemm_layer_wall_s=w_front, fused_gemm_combine_layer_wall_s=w_back,
                layer_speedup_dispatch_gemm=t_three / t_front,
                layer_speedup_gemm_combine=t_three / t_back, epic_tflops=flops / t_epic / 1e12,
                cublas_tflops=flops / t_torch / 1e12, epic_over_cublas=t_torch / t_epic,
                kernel_s=per_kernel)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--n", type=int, default=2048, help="columns of every expert's matrix")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--once", action="store_true",
                        help="run epic's GEMM, two steps, the fused kernels and the layer's three "
                             "variants once, untimed "
                             "(for tools/device/profile.sh: CUPTI allows one subscriber)")
    args = parser.parse_args()
    if args.compile_only or _C.cuda_device_count() == 0:
        compile_only(args)
        return 0
    import torch

    result = run(args)
    if result is None:
        print("gemm_bench: ran each variant once")
        return 0
    report = dict(date=datetime.date.today().isoformat(), args=vars(args),
                  gpu=torch.cuda.get_device_name(), result=result)
    print(f"grouped GEMM, {result['rows']} rows x {args.hidden} x {args.n} over {args.ranks} "
          f"virtual ranks ({result['flops'] / 1e12:.2f} TFLOP):")
    print(f"  epic   {result['epic_kernel_s'] * 1e3:8.3f} ms  {result['epic_tflops']:7.1f} TFLOPS "
          f"(wall {result['epic_wall_s'] * 1e3:.3f} ms)")
    print(f"  cuBLAS {result['cublas_kernels_s'] * 1e3:8.3f} ms  {result['cublas_tflops']:7.1f} "
          f"TFLOPS (wall {result['torch_wall_s'] * 1e3:.3f} ms, per-expert torch.mm)")
    print(f"  epic / cuBLAS throughput: {result['epic_over_cublas']:.2f}; results equal: "
          f"{result['equal']} (max relative error {result['max_relative_error']:.2e})")
    print(f"dispatch -> GEMM: two steps {result['two_steps_kernel_s'] * 1e3:.3f} ms, fused "
          f"{result['fused_kernel_s'] * 1e3:.3f} ms (kernels; wall "
          f"{result['two_steps_wall_s'] * 1e3:.3f} / {result['fused_wall_s'] * 1e3:.3f} ms): "
          f"{result['fused_speedup']:.2f}x; fused output bitwise the GEMM of its rows: "
          f"{result['fused_equal']}")
    print(f"dispatch -> GEMM (N = hidden) -> combine: three steps "
          f"{result['three_steps_kernel_s'] * 1e3:.3f} ms; fused dispatch+GEMM "
          f"{result['fused_dispatch_gemm_layer_kernel_s'] * 1e3:.3f} ms "
          f"({result['layer_speedup_dispatch_gemm']:.2f}x); fused GEMM+combine "
          f"{result['fused_gemm_combine_layer_kernel_s'] * 1e3:.3f} ms "
          f"({result['layer_speedup_gemm_combine']:.2f}x) (kernels; wall "
          f"{result['three_steps_wall_s'] * 1e3:.3f} / "
          f"{result['fused_dispatch_gemm_layer_wall_s'] * 1e3:.3f} / "
          f"{result['fused_gemm_combine_layer_wall_s'] * 1e3:.3f} ms); combined outputs bitwise "
          f"equal: {result['layer_equal']}")
    for step, kernels in result["kernel_s"].items():
        print(f"  {step}: " + ", ".join(f"{name} {t * 1e3:.3f} ms" for name, t in kernels.items()))
    ep_bench.write_report(report, args.out, "gemm-")
    return 0 if result["equal"] and result["fused_equal"] and result["layer_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
