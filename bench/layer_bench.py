"""DeepSeek V3's MoE layer in FP8 (epic.moe.moe_layer_fp8: FP8 dispatch, gate/up grouped GEMM,
ep.swiglu with the FP8 re-quant, down grouped GEMM, routing weights, combine) as five ops and
as one persistent kernel (ep.moe_layer), per call wall time eager and replayed from a CUDA
graph, and the kernels' time step by step. One GPU, a virtual EP world (every rank's work on
the one GPU); --ranks 1 --experts 32 is one rank of EP8's share of the layer on a whole GPU.

    python bench/layer_bench.py                 # V3: EP8, 256 experts, top-8, hidden 7168,
                                                # I 2048; 128 and 1024 tokens per rank
    python bench/layer_bench.py --compile-only  # fill the kernel cache (tools/device/prepare.sh)

METHOD: the floors are the bytes every kernel must move at the copy bandwidth (each rank's FP8
expert weights once, the tokens' rows, the intermediate rows) and the FLOPs at the dense FP8
rate; the wall times are medians of --iterations calls after L2 flushes (CUDA events, the
host's work included eagerly, one graph launch replayed); the dispatch does not sync with the
host (worst-case-sized rows), the same in both. Writes bench/results/layer-<gpu>-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import ep_bench  # noqa: E402
import epic  # noqa: E402
from epic import _C  # noqa: E402
from epic.moe import layer_kernels  # noqa: E402

BLOCK = 128  # DeepSeek's scale block (channels, and weight blocks of 128 x 128)
FP8_DENSE_TFLOPS = {"H200": 1979.0, "H100": 1979.0}  # dense e4m3, SXM
DECODE_TOKENS = 256  # tokens per rank of a decode-sized layer (the persistent kernel's sizes)


def spec_of(args, tokens):
    spec = dict(num_ranks=args.ranks, num_experts=args.experts, num_topk=args.topk,
                hidden=args.hidden, dtype="f8E4M3FN", num_scale_packs=args.hidden // BLOCK,
                expert_alignment=BLOCK, do_expand=True, num_max_tokens_per_rank=tokens)
    if args.gpu_timeout_secs != 100:  # the buffer's spec (a bound other than the default)
        spec["timeout_ms"] = args.gpu_timeout_secs * 1000
    return spec


def compile_only(args):
    runtime = _C.Runtime("virtual", "", "")
    spec, H, inter = spec_of(args, max(args.tokens)), args.hidden, args.intermediate
    for variant, kind in layer_kernels(H, inter):
        runtime.kernels(spec, variant, kind)
    # The persistent kernel is specialized on the token cap (its rows are sized by it).
    for tokens in args.tokens:
        for variant, kind in layer_kernels(H, inter, persistent=True):
            runtime.kernels(spec_of(args, tokens), variant, kind)
    print(f"layer_bench: the layer's 5 kernel sets and {len(args.tokens)} persistent kernels "
          f"in {runtime.cache_dir}")


def measure(torch, args, T, bandwidth):
    from epic.moe import moe_layer_fp8

    R, E, K, H, inter = args.ranks, args.experts, args.topk, args.hidden, args.intermediate
    L = E // R
    g = torch.Generator(device="cuda").manual_seed(5)
    xs, sfs, idxs, ws = ep_bench.make_inputs(torch, R, T, H, E, K, True, seed=7)
    x = list(zip(xs, sfs))
    w13 = [ep_bench.quantize_blocks(torch, torch.randn((L, 2 * inter, H), generator=g,
                                                       device="cuda") / H ** 0.5, BLOCK)
           for _ in range(R)]
    w2 = [ep_bench.quantize_blocks(torch, torch.randn((L, H, inter), generator=g, device="cuda")
                                   / inter ** 0.5, BLOCK) for _ in range(R)]
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=T, hidden=H,
                                num_topk=K, explicitly_destroy=True,
                                num_gpu_timeout_secs=args.gpu_timeout_secs)
    try:
        def layer_of(persistent):
            return lambda: moe_layer_fp8(buffer, x, idxs, ws, w13, w2, num_experts=E,
                                         do_cpu_sync=False, persistent=persistent)

        # Both ways: the five ops (the baseline) and the persistent kernel (ep.moe_layer), each
        # eager and captured; timed in turns (walls) so a clock drift weighs on both alike.
        layers, graphs, results = {}, {}, {}
        for name, persistent in (("unfused", False), ("persistent", True)):
            layers[name] = layer_of(persistent)
            eager = [y.clone() for y in layers[name]()]  # plans made, kernels loaded
            torch.cuda.synchronize()
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name]):
                captured = layers[name]()
            graphs[name].replay()
            torch.cuda.synchronize()
            results[name] = (eager, captured)

        def bitwise(a, b):
            return all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(a, b))

        same = all(bitwise(*results[name]) for name in results)
        persistent_same = bitwise(results["unfused"][0], results["persistent"][0])
        timer = ep_bench.Timer(torch, args.iterations)
        eager_s, graph_s, p_eager_s, p_graph_s = timer.walls(
            [layers["unfused"], graphs["unfused"].replay, layers["persistent"],
             graphs["persistent"].replay])
        kernel_s, per_kernel = timer.every_kernel(layers["unfused"])
        p_kernel_s, p_per_kernel = timer.every_kernel(layers["persistent"])
        # Every rank's rows: the expert rows the GEMMs multiply (the handle's).
        recv, _, _, handles, _ = buffer.dispatch(x, idxs, ws, num_experts=E, do_expand=True,
                                                 expert_alignment=BLOCK)
        rows = sum(end - start for h in handles for start, end in ep_bench.expert_rows(h, L, BLOCK))
        del recv
        weight_bytes = R * L * (2 * inter * H + H * inter) * (1 + 4 / BLOCK ** 2)
        row_bytes = rows * (H + 2 * 2 * inter + 2 * inter + inter + 2 * H)  # in, gate/up, act, out
        token_bytes = R * T * (K * H * 2 + H * 2)  # dispatch in (FP8 ~ H), combine (bf16)
        flops = 2.0 * rows * H * 3 * inter
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in FP8_DENSE_TFLOPS.items() if k in name), None)
        return dict(tokens=T, rows=rows, bitwise_graph_equals_eager=bool(same),
                    eager_wall_s=eager_s, graph_wall_s=graph_s, kernels_s=kernel_s,
                    per_kernel_s=per_kernel,
                    persistent=dict(eager_wall_s=p_eager_s, graph_wall_s=p_graph_s,
                                    kernels_s=p_kernel_s, per_kernel_s=p_per_kernel,
                                    bitwise_equals_unfused=bool(persistent_same)),
                    persistent_x_unfused_graph=graph_s / p_graph_s,
                    persistent_x_unfused_eager=eager_s / p_eager_s, weight_bytes=weight_bytes,
                    bytes=weight_bytes + row_bytes + token_bytes, flops=flops,
                    byte_floor_s=(weight_bytes + row_bytes + token_bytes) / bandwidth,
                    flop_floor_s=flops / (peak * 1e12) if peak else None)
    finally:
        buffer.destroy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")],
                        default=[128, 1024], help="tokens per rank, comma-separated")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--gpu-timeout-secs", type=int, default=100,
                        help="the kernels' wait bound (a stall is reported after it)")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    if args.compile_only or _C.cuda_device_count() == 0:
        compile_only(args)
        return 0
    import torch

    bandwidth = ep_bench.copy_roofline(torch)
    torch.cuda.empty_cache()
    sizes, skipped = [], []
    for T in args.tokens:
        try:
            s = measure(torch, args, T, bandwidth)
        except torch.OutOfMemoryError as error:  # a prefill size larger than this GPU
            skipped.append(ep_bench.out_of_memory(torch, "layer_bench", T, error))
            continue
        finally:
            torch.cuda.empty_cache()
        sizes.append(s)
        floor = max(s["byte_floor_s"], s["flop_floor_s"] or 0)
        print(f"{T} tokens per rank ({s['rows']} expert rows over {args.ranks} virtual ranks): "
              f"eager {s['eager_wall_s'] * 1e3:.3f} ms, CUDA graph {s['graph_wall_s'] * 1e3:.3f} "
              f"ms, kernels {s['kernels_s'] * 1e3:.3f} ms; floor {floor * 1e3:.3f} ms (bytes "
              f"{s['bytes'] / 1e9:.2f} GB at {bandwidth / 1e12:.2f} TB/s: "
              f"{s['byte_floor_s'] * 1e3:.3f} ms; FLOPs: "
              f"{(s['flop_floor_s'] or 0) * 1e3:.3f} ms); graph bitwise eager: "
              f"{s['bitwise_graph_equals_eager']}")
        for kname, t in sorted(s["per_kernel_s"].items(), key=lambda kv: -kv[1]):
            print(f"    {t * 1e6:9.1f} us  {kname[:90]}")
        p = s["persistent"]
        print(f"  persistent kernel (ep.moe_layer): eager {p['eager_wall_s'] * 1e3:.3f} ms, CUDA "
              f"graph {p['graph_wall_s'] * 1e3:.3f} ms, kernels {p['kernels_s'] * 1e3:.3f} ms: "
              f"{s['persistent_x_unfused_graph']:.3f}x the five ops (graph wall), "
              f"{s['persistent_x_unfused_eager']:.3f}x eager; bitwise the five ops': "
              f"{p['bitwise_equals_unfused']}")
    # The rows the persistent kernel is for: the decode layer (the smallest size of at most
    # DECODE_TOKENS, ep-fuse-moe-layer's max-tokens) and the smallest persistent / five-ops
    # ratio over every size (graph-captured walls).
    decode = [s for s in sizes if s["tokens"] <= DECODE_TOKENS]
    summary = dict(
        decode_fused_x_unfused=decode[0]["persistent_x_unfused_graph"] if decode else None,
        decode_tokens=decode[0]["tokens"] if decode else None,
        min_persistent_x_unfused=min((s["persistent_x_unfused_graph"] for s in sizes),
                                     default=None))
    report = dict(date=datetime.date.today().isoformat(), args=vars(args),
                  gpu=torch.cuda.get_device_name(), copy_bandwidth=bandwidth, sizes=sizes,
                  skipped=skipped, summary=summary,
                  note="the FP8 layer (epic.moe.moe_layer_fp8) as five ops and as one "
                       "persistent kernel (ep.moe_layer), both graph-captured")
    print(f"layer_bench: summary {summary}")
    ep_bench.write_report(report, args.out, "layer-")
    if skipped:
        print("layer_bench: skipped (out of memory): "
              + ", ".join(str(s["tokens"]) for s in skipped))
    ok = all(s["bitwise_graph_equals_eager"] and s["persistent"]["bitwise_equals_unfused"]
             for s in sizes)
    return 0 if ok and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
