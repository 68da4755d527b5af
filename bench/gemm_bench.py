"""ep.grouped_gemm (TMA + wgmma, persistent) against torch's cuBLAS matmuls per expert, on the
rows of a real expanded dispatch, and both fusible pairs (dispatch -> GEMM, GEMM (N = hidden)
-> combine) in their three modes: two steps (fusion="never"), the fused kernel ("always") and
the default ("auto", the cost model's choice); decode to prefill sizes, same process, one GPU
(a virtual EP world).

    python bench/gemm_bench.py                 # V3: EP8, 256 experts, top-8, hidden 7168, N 2048,
                                               # 128, 1024 and 4096 tokens per rank
    python bench/gemm_bench.py --compile-only  # fill the kernel cache (tools/device/prepare.sh)

The report's `summary`: fused over unfused as fusion="auto" runs it (decode, prefill, the
minimum over sizes and pairs), the fused kernels forced for comparison, and each pair's
prediction next to its measurement (`pairs.<pair>.prediction`).

METHOD: the floor is the FLOPs (2 x rows x hidden x N over every rank's expert rows) at the
GPU's dense BF16 rate; both sides are timed as kernel time from the profiler (CUPTI), medians of
--iterations after L2 flushes: epic's one launch for all ranks, and the sum of every kernel
torch runs for the per-expert `torch.mm(x[rows_e], w[e], out=...)` loop (so its launch gaps do
not count against it). Results are compared first (fp32 outputs, rtol 1e-3). A pair's time is
every kernel its call launches (memsets included) and its wall time. Writes
bench/results/gemm-<gpu>-<date>.json and .png.
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


SCALE_BLOCK = 128  # FP8: channels per scale (DeepSeek's block scales)


def spec_of(args, tokens, fp8=False):
    return dict(num_ranks=args.ranks, num_experts=args.experts, num_topk=args.topk,
                hidden=args.hidden, dtype="f8E4M3FN" if fp8 else "bf16",
                num_scale_packs=args.hidden // SCALE_BLOCK if fp8 else 0,
                expert_alignment=ALIGNMENT, do_expand=True, num_max_tokens_per_rank=tokens)


def compile_only(args):
    keys = []
    for tokens in args.tokens:
        keys += compile_size(args, tokens)
    print(f"gemm_bench: {len(keys)} kernel sets in {_C.Runtime('virtual', '', '').cache_dir}")


def compile_size(args, tokens):
    """The kernel sets of one size (the token cap is part of the configuration)."""
    runtime = _C.Runtime("virtual", "", "")
    spec = spec_of(args, tokens)
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
    # The FP8 expert GEMM behind an FP8 dispatch of the same routing.
    fp8 = spec_of(args, tokens, fp8=True)
    keys.append(runtime.kernels(fp8, dict(weights=True, cached=False, zero_padding=False),
                                "dispatch")["key"])
    for out in ("bf16", "f32"):
        keys.append(runtime.kernels(fp8, dict(n=args.n, out_dtype=out), "grouped_gemm")["key"])
    # The SwiGLU between an expert's GEMMs on those rows: the compiled op and the DSL kernel
    # (which specializes on whether the row count is a multiple of 16: both).
    keys.append(runtime.kernels(fp8, dict(n=args.intermediate, in_dtype="bf16",
                                          out_dtype="f8E4M3FN"), "swiglu")["key"])
    import numpy as np

    from epic import _tensors as T
    from epic.activations import _swiglu_fp8

    inter = args.intermediate
    for rows in (256, 200):
        _swiglu_fp8.compile([np.zeros((rows, 2 * inter), T.numpy_dtype("bf16"))] * args.ranks,
                            [np.zeros((rows, inter), T.numpy_dtype("f8E4M3FN"))] * args.ranks,
                            [np.zeros((rows, inter // SCALE_BLOCK), np.float32)] * args.ranks,
                            [rows] * args.ranks, INTER=inter, backend="virtual", abi="runtime",
                            ranks=args.ranks)
    return keys


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


def run_size(args, T, measure):
    """`measure(args, T, buffers)` at `T` tokens per rank; the buffers it made are destroyed
    however it ends (a size that runs out of memory must not keep the next one from its
    memory)."""
    buffers = []
    try:
        return measure(args, T, buffers)
    finally:
        for buffer in buffers:
            buffer.destroy()


def setup(torch, args, T, fp8, buffers):
    """A size's timer, every rank's tokens (FP8: (data, scales) pairs), routing and weights
    (seed 7: the BF16 and FP8 measurements route alike), and its buffer (in `buffers`)."""
    R, H, E, K = args.ranks, args.hidden, args.experts, args.topk
    xs, sfs, idxs, ws = ep_bench.make_inputs(torch, R, T, H, E, K, fp8, seed=7)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=T, hidden=H,
                                num_topk=K, explicitly_destroy=True)
    buffers.append(buffer)
    return (ep_bench.Timer(torch, args.iterations), list(zip(xs, sfs)) if fp8 else xs, idxs,
            ws, buffer)


def measure_fp8(args, T, buffers):
    """The FP8 grouped GEMM on the BF16 measurement's routing, in a buffer of its own (both
    sizes' receive pools at once do not fit an H100 at 4096 tokens): the tokens cast to FP8
    (an f32 scale per 128 channels) and dispatched, weights [L, N, hidden] with 128 x 128 block
    scales; checked against the product of the dequantized operands, then timed like the BF16
    kernel."""
    import torch

    R, H, E, N = args.ranks, args.hidden, args.experts, args.n
    L = E // R
    timer, xs, idxs, ws, buffer = setup(torch, args, T, True, buffers)
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, ws, num_experts=E, do_expand=True,
                                             expert_alignment=ALIGNMENT)
    g = torch.Generator(device="cuda").manual_seed(13)
    weights = [ep_bench.quantize_blocks(torch, torch.randn((L, N, H), generator=g, device="cuda")
                               / H ** 0.5, SCALE_BLOCK) for _ in range(R)]

    def fp8_gemm():
        return buffer.grouped_gemm(recv, weights, handles)

    got = buffer.grouped_gemm(recv, weights, handles, out_dtype=torch.float32)
    torch.cuda.synchronize()
    worst = 0.0
    for r in range(R):
        x = ep_bench.dequantize_blocks(*recv[r], 1)
        w = ep_bench.dequantize_blocks(*weights[r], SCALE_BLOCK)
        for e, (start, end) in enumerate(ep_bench.expert_rows(handles[r], L, ALIGNMENT)):
            if end > start:
                want = x[start:end] @ w[e].T
                error = ((got[r][start:end] - want).abs().max() / want.abs().max()).item()
                worst = max(worst, error)
        del x, w
    del got
    kernel_s = timer.kernels(fp8_gemm, (KERNEL,), buffer)[KERNEL]
    swiglu = None if args.no_swiglu else measure_swiglu(torch, args, timer, buffer, recv,
                                                        handles)
    return dict(kernel_s=kernel_s, wall_s=timer.wall(fp8_gemm), max_relative_error=worst,
                equal=bool(worst < 1e-2), swiglu=swiglu)


def measure_swiglu(torch, args, timer, buffer, recv, handles):
    """The SwiGLU + FP8 re-quant between an expert's GEMMs at V3's intermediate size, on the
    FP8 dispatch's rows (gate/up rows [rows, 2I] bf16): the compiled ep.swiglu
    (ElasticBuffer.swiglu), the DSL kernel (epic.activations.swiglu_fp8, the same math) and
    torch (silu, block amax, cast) over every rank's rows in one call. Checked first against
    torch; kernel time excludes the outputs' memsets. The floor: the expert rows' bytes (2I
    bf16 read, I e4m3 and I / 128 f32 written) over the copy bandwidth."""
    from epic.activations import swiglu_fp8

    R, L, inter = args.ranks, args.experts // args.ranks, args.intermediate
    g = torch.Generator(device="cuda").manual_seed(17)
    gate_up = [torch.randn((x.shape[0], 2 * inter), generator=g, device="cuda",
                           dtype=torch.bfloat16) for x, _ in recv]
    every_row = torch.cat(gate_up)
    expert_rows = [ep_bench.expert_rows(h, L, ALIGNMENT) for h in handles]
    rows = sum(end - start for rr in expert_rows for start, end in rr)

    def torch_swiglu():
        gate, up = every_row.float().chunk(2, dim=1)
        blocks = (torch.nn.functional.silu(gate) * up).unflatten(1, (-1, SCALE_BLOCK))
        scale = blocks.abs().amax(dim=2, keepdim=True).clamp(min=1e-4) / 448
        return (blocks / scale).to(torch.float8_e4m3fn).flatten(1), scale.squeeze(2)

    def epic_op():
        return buffer.swiglu(gate_up, handles)

    def dsl():
        return swiglu_fp8(gate_up, buffer=buffer)

    got, ok = epic_op(), True
    torch.cuda.synchronize()
    for r in range(R):
        for start, end in expert_rows[r]:
            if end > start:
                gate, up = gate_up[r][start:end].float().chunk(2, dim=1)
                y = torch.nn.functional.silu(gate) * up
                scale = y.unflatten(1, (-1, SCALE_BLOCK)).abs().amax(dim=2).clamp(min=1e-4) / 448
                ok &= bool(torch.allclose(got[r][1][start:end], scale, rtol=1e-5, atol=0))
                q = ep_bench.dequantize_blocks(got[r][0][start:end], got[r][1][start:end], 1)
                ok &= bool(((q - y).abs() <= y.abs() * 2.0 ** -4 * 1.001
                            + scale.repeat_interleave(SCALE_BLOCK, 1) * 2.0 ** -9).all())
    del got
    times = {name: all_kernels_time(torch, timer, fn)
             for name, fn in (("op", epic_op), ("dsl", dsl), ("torch", torch_swiglu))}
    walls = dict(zip(("op", "dsl", "torch"), timer.walls([epic_op, dsl, torch_swiglu])))
    nbytes = rows * (2 * inter * 2 + inter + inter // SCALE_BLOCK * 4)
    return dict(rows=rows, bytes=nbytes, equal=ok, kernel_s=times, wall_s=walls,
                floor_s=nbytes / args.copy_bandwidth if args.copy_bandwidth else None,
                op_x_torch=times["torch"] / times["op"], op_x_dsl=times["dsl"] / times["op"])


def measure_size(args, T, buffers):
    import torch

    R, H, E, N = args.ranks, args.hidden, args.experts, args.n
    L = E // R
    timer, xs, idxs, ws, buffer = setup(torch, args, T, False, buffers)
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, ws, num_experts=E, do_expand=True,
                                             expert_alignment=ALIGNMENT)
    g = torch.Generator(device="cuda").manual_seed(11)
    weights = [(torch.randn((L, H, N), generator=g, device="cuda") / H ** 0.5)
               .to(torch.bfloat16) for _ in range(R)]
    ranges = [ep_bench.expert_rows(h, L, ALIGNMENT) for h in handles]
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
    del got
    rows = sum(end - start for rr in ranges for start, end in rr)
    flops = 2.0 * rows * H * N

    # The two fusible pairs, each in its three modes: the two steps, the fused kernel
    # (fusion="always") and the default, fusion="auto" (the cost model's choice). The fused
    # results are bitwise the steps' (checked below). A pair's time is every kernel its call
    # launches (CUPTI, memsets included), and its wall time.
    # One square weight set shared by the ranks: 8 of them would be 26 GB at V3's hidden size
    # (more than an H100 leaves beside a 4096-token buffer); both modes read the same matrices,
    # so the comparison stays even.
    square = [(torch.randn((L, H, H), generator=g, device="cuda", dtype=torch.bfloat16)
               / H ** 0.5)] * R

    def dispatch_gemm(mode):
        return lambda: buffer.dispatch_gemm(xs, idxs, weights, topk_weights=ws, num_experts=E,
                                            expert_alignment=ALIGNMENT, fusion=mode)

    def gemm_combine(mode):
        return lambda: buffer.gemm_combine(recv, square, handles, fusion=mode)

    if args.once:  # for an external profiler: every variant once, nothing timed
        for fn in [epic_gemm] + [call(mode) for call in (dispatch_gemm, gemm_combine)
                                 for mode in ("never", "always")]:
            fn()
        torch.cuda.synchronize()
        return None
    t_epic = timer.kernels(epic_gemm, (KERNEL,), buffer)[KERNEL]
    t_torch = all_kernels_time(torch, timer, torch_gemm)
    w_epic, w_torch = timer.wall(epic_gemm), timer.wall(torch_gemm)
    def same(a, b):
        return all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a, b))

    pairs, checks = {}, {}
    for pair, call in (() if args.gemm_only else
                       (("dispatch_gemm", dispatch_gemm), ("gemm_combine", gemm_combine))):
        row, ok, unfused = {}, True, None
        for mode in ("never", "always", "auto"):
            out = call(mode)()
            decision = dict(buffer.last_fusion)
            # Bitwise the two steps (checked, then dropped: the prefill sizes fill the GPU).
            if pair == "dispatch_gemm":  # the same rows per expert, not in the same places
                ok &= same(out[2], buffer.grouped_gemm(out[0], weights, out[3]))
            elif mode == "never":
                unfused = out
            else:
                ok &= same(out[0], unfused[0]) and same(out[1], unfused[1])
            del out
            torch.cuda.synchronize()
            kernel_s, per_name = timer.every_kernel(call(mode))
            row[mode] = dict(kernel_s=kernel_s, fused=decision["fused"], kernels_s=per_name)
            if mode == "auto":
                row["prediction"] = dict(fused_us=decision["fused_us"],
                                         steps_us=decision["steps_us"], why=decision["why"])
        del unfused
        # Wall times in turns (never, always, auto each iteration): `auto` often runs the very
        # calls `never` does, and timing the modes one after the other showed up to 9% apart
        # for the same kernels (clock drift), which is noise, not the choice.
        modes = ("never", "always", "auto")
        for mode, wall_s in zip(modes, timer.walls([call(mode) for mode in modes])):
            row[mode]["wall_s"] = wall_s
        checks[pair] = bool(ok)
        for mode in ("always", "auto"):
            row[f"{mode}_x_never_kernel"] = row["never"]["kernel_s"] / row[mode]["kernel_s"]
            row[f"{mode}_x_never_wall"] = row["never"]["wall_s"] / row[mode]["wall_s"]
        pairs[pair] = row
    return dict(tokens=T, rows=rows, flops=flops, equal=bool(equal), max_relative_error=worst,
                fused_equal=bool(all(checks.values())), epic_kernel_s=t_epic,
                cublas_kernels_s=t_torch, epic_wall_s=w_epic, torch_wall_s=w_torch,
                epic_tflops=flops / t_epic / 1e12, cublas_tflops=flops / t_torch / 1e12,
                epic_over_cublas=t_torch / t_epic, pairs=pairs)


def summary(sizes):
    """The issue's top-level numbers: fused over unfused as the default (fusion="auto") runs,
    at decode (the smallest size) and prefill (the largest) and its minimum over every size and
    pair (wall time); the fused kernels forced on for comparison."""
    auto = [(s["tokens"], p, row["auto_x_never_wall"]) for s in sizes
            for p, row in s["pairs"].items()]
    always = [(s["tokens"], p, row["always_x_never_wall"]) for s in sizes
              for p, row in s["pairs"].items()]
    small, large = min(s["tokens"] for s in sizes), max(s["tokens"] for s in sizes)
    with_fp8 = [s for s in sizes if "fp8" in s]
    largest = max(with_fp8, key=lambda s: s["tokens"]) if with_fp8 else None
    return dict(
        fp8_x_bf16_gemm=largest["fp8"]["x_bf16"] if largest else None,
        fp8_x_bf16_gemm_min=min(s["fp8"]["x_bf16"] for s in with_fp8) if with_fp8 else None,
        fp8_note="FP8 grouped GEMM (e4m3, block scales) over the BF16 one on the same rows, "
                 "kernel time; fp8_x_bf16_gemm at the largest size",
        decode_fused_x_unfused=min((r for t, _, r in auto if t == small), default=None),
        prefill_fused_x_unfused=min((r for t, _, r in auto if t == large), default=None),
        min_fused_x_unfused=min((r for _, _, r in auto), default=None),
        min_always_fused_x_unfused=min((r for _, _, r in always), default=None),
        decode_tokens=small, prefill_tokens=large,
        # Where auto ran the two steps its ratio is the same calls timed twice (in turns):
        # the spread of those ratios around 1 is the measurement's noise.
        auto_ran=[dict(tokens=s["tokens"], pair=p, fused=row["auto"]["fused"])
                  for s in sizes for p, row in s["pairs"].items()],
        note="fused = what dispatch_gemm / gemm_combine run by default (fusion='auto'), over "
             "the two steps (fusion='never'), wall time of the pair; the persistent layer "
             "kernel (ep.moe_layer) against the five ops is bench/layer_bench.py's")


def plot(report, path):
    """Fused over unfused per size: each pair forced fused and as fusion="auto" runs it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    tokens = [s["tokens"] for s in sizes]
    if not all(s["pairs"] for s in sizes):
        print("gemm_bench: no pairs measured (--gemm-only), no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for pair, style in (("dispatch_gemm", "o"), ("gemm_combine", "s")):
        for mode, line in (("always", "--"), ("auto", "-")):
            ax.plot(tokens, [s["pairs"][pair][f"{mode}_x_never_wall"] for s in sizes],
                    line, marker=style, label=f"{pair}, fusion={mode}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per rank (virtual EP%d)" % report["args"]["ranks"])
    ax.set_ylabel("two steps / fused (wall), > 1: fused faster")
    ax.set_title(f"{report['gpu']}: fusion that pays")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def tokens_list(text):
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"comma-separated token counts >= 1, got {text!r}")
    return values


def report_size(args, result):
    print(f"{result['tokens']} tokens per rank: grouped GEMM, {result['rows']} rows x "
          f"{args.hidden} x {args.n} over {args.ranks} virtual ranks "
          f"({result['flops'] / 1e12:.2f} TFLOP):")
    print(f"  epic   {result['epic_kernel_s'] * 1e3:8.3f} ms  {result['epic_tflops']:7.1f} TFLOPS "
          f"(wall {result['epic_wall_s'] * 1e3:.3f} ms)")
    print(f"  cuBLAS {result['cublas_kernels_s'] * 1e3:8.3f} ms  {result['cublas_tflops']:7.1f} "
          f"TFLOPS (wall {result['torch_wall_s'] * 1e3:.3f} ms, per-expert torch.mm)")
    f8 = result.get("fp8")
    if f8:
        print(f"  epic FP8 {f8['kernel_s'] * 1e3:6.3f} ms  {f8['tflops']:7.1f} TFLOPS (wall "
              f"{f8['wall_s'] * 1e3:.3f} ms), {f8['x_bf16']:.2f}x BF16; equal to the "
              f"dequantized product: {f8['equal']} (max relative error "
              f"{f8['max_relative_error']:.2e})")
    sw = (f8 or {}).get("swiglu")
    if sw:
        k, w = sw["kernel_s"], sw["wall_s"]
        floor = f", floor {sw['floor_s'] * 1e6:.1f} us" if sw["floor_s"] else ""
        print(f"  SwiGLU + FP8 ({sw['rows']} rows x {args.intermediate}, "
              f"{sw['bytes'] / 1e9:.2f} GB{floor}): ep.swiglu {k['op'] * 1e6:.1f} us "
              f"({sw['bytes'] / k['op'] / 1e9:.0f} GB/s, wall {w['op'] * 1e6:.1f}), DSL "
              f"{k['dsl'] * 1e6:.1f} us (wall {w['dsl'] * 1e6:.1f}), torch {k['torch'] * 1e6:.1f}"
              f" us (wall {w['torch'] * 1e6:.1f}); op / torch {sw['op_x_torch']:.2f}x; "
              f"equal: {sw['equal']}")
    print(f"  epic / cuBLAS throughput: {result['epic_over_cublas']:.2f}; results equal: "
          f"{result['equal']} (max relative error {result['max_relative_error']:.2e}); fused "
          f"results bitwise the two steps': {result['fused_equal']}")
    for pair, row in result["pairs"].items():
        modes = ", ".join(f"{mode} {row[mode]['kernel_s'] * 1e3:.3f} / "
                          f"{row[mode]['wall_s'] * 1e3:.3f} ms" for mode in
                          ("never", "always", "auto"))
        p = row["prediction"]
        model = (f"model {p['fused_us'] / 1e3:.3f} fused vs {p['steps_us'] / 1e3:.3f} ms"
                 if p["fused_us"] is not None else f"model: {p['why']}")
        way = "fused" if row["auto"]["fused"] else "two steps"
        print(f"  {pair} (kernels / wall): {modes}; auto {way} ({model}); fused/never "
              f"{row['always_x_never_wall']:.2f}x, auto/never {row['auto_x_never_wall']:.2f}x "
              "(wall)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tokens", type=tokens_list, default=[128, 1024, 4096],
                        help="tokens per rank, comma-separated (decode to prefill sizes)")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--n", type=int, default=2048, help="columns of every expert's matrix")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--no-fp8", action="store_true", help="skip the FP8 grouped GEMM")
    parser.add_argument("--intermediate", type=int, default=2048,
                        help="the expert MLP's intermediate size I (the SwiGLU's width)")
    parser.add_argument("--no-swiglu", action="store_true", help="skip the SwiGLU measurement")
    parser.add_argument("--gemm-only", action="store_true",
                        help="the grouped GEMMs (BF16, FP8, cuBLAS) only, not the fusible pairs")
    parser.add_argument("--once", action="store_true",
                        help="run epic's GEMM and each pair unfused and fused once, untimed "
                             "(for tools/device/profile.sh: CUPTI allows one subscriber)")
    args = parser.parse_args()
    if args.compile_only or _C.cuda_device_count() == 0:
        compile_only(args)
        return 0
    import torch

    # The SwiGLU's floor (read + write bytes at the copy bandwidth).
    args.copy_bandwidth = None if args.no_swiglu or args.no_fp8 else ep_bench.copy_roofline(torch)
    torch.cuda.empty_cache()
    sizes, skipped = [], []
    for tokens in args.tokens:
        try:
            result = run_size(args, tokens, measure_size)
        except torch.OutOfMemoryError as error:  # a prefill size larger than this GPU
            skipped.append(ep_bench.out_of_memory(torch, "gemm_bench", tokens, error))
            result = False
        torch.cuda.empty_cache()
        if result is False:
            continue
        if result is not None and not args.no_fp8:  # the FP8 GEMM, in a buffer of its own
            fp8 = run_size(args, tokens, measure_fp8)
            torch.cuda.empty_cache()
            fp8.update(tflops=result["flops"] / fp8["kernel_s"] / 1e12,
                       x_bf16=result["epic_kernel_s"] / fp8["kernel_s"])
            result["fp8"] = fp8
        if result is None:
            print(f"gemm_bench: ran each variant once at {tokens} tokens per rank")
            continue
        report_size(args, result)
        sizes.append(result)
    if not sizes:
        return 0
    report = dict(date=datetime.date.today().isoformat(), args=vars(args),
                  gpu=torch.cuda.get_device_name(), summary=summary(sizes), sizes=sizes,
                  skipped=skipped)
    print("summary: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in report["summary"].items()
                                  if k not in ("note", "auto_ran")))
    path = ep_bench.write_report(report, args.out, "gemm-")
    try:
        plot(report, path[:-len(".json")] + ".png")
    except ImportError:
        print("gemm_bench: no matplotlib, no plot")
    if skipped:
        print("gemm_bench: skipped (out of memory): "
              + ", ".join(str(s["tokens"]) for s in skipped))
    return 0 if all(s["equal"] and s["fused_equal"] and s.get("fp8", {}).get("equal", True)
                    and ((s.get("fp8") or {}).get("swiglu") or {}).get("equal", True)
                    for s in sizes) and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
