"""The DSL's dispatch + combine (examples/dsl/dispatch_combine.py) against epic's built-in
ep.dispatch / ep.combine, same inputs, same process, one GPU (a virtual EP world).

    python bench/dsl_bench.py                 # V3-like: EP8, 4096 tokens/rank, hidden 7168, top-8
    python bench/dsl_bench.py --compile-only  # fill the kernel caches (tools/device/prepare.sh)

Both sides move BF16 rows with top-k weights (plain layout) and combine without weights. Before
timing, the results are compared: the DSL's received counts and rows (as sets per source token)
against the built-in's, and both combines of the same expert outputs (each received row sent
back as its own output) bitwise. Kernel times come from the profiler (CUPTI, by kernel name)
after L2 flushes, medians; the DSL kernels are launched from prepared launches (no host work per
call), the built-ins through the API (one host sync in dispatch, as DeepEP's). Writes
bench/results/dsl-<gpu>-<date>.json and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "dsl"))

import numpy as np  # noqa: E402

import dispatch_combine as dc  # noqa: E402
import ep_bench  # noqa: E402
import epic  # noqa: E402
from epic import _C  # noqa: E402

DSL_KERNELS = {"dispatch": ("dispatch_send", "dispatch_copy"),
               "combine": ("combine_send", "combine_reduce")}


class Shapes:
    """The DSL kernels' specialization for a configuration: grid, constexprs, window layout."""

    def __init__(self, args):
        R, T, H, K = args.ranks, args.tokens, args.hidden, args.topk
        self.counts = [max(1, T - r) for r in range(R)]  # ep_bench.make_inputs' token counts
        self.layout = dc.Layout(R, K, H, T)
        self.common = dict(H=H, K=K, BK=1 << (K - 1).bit_length(), BH=dc.row_block(H))
        self.offsets = dict(ROWS=self.layout.rows, META=self.layout.meta,
                            LOCAL=self.layout.local, WEIGHTS=self.layout.weights)
        self.L, self.T, self.rows = args.experts // R, T, R * T
        self.BM = 1 << (K + 1).bit_length()


def dsl_launches(prepare, shapes, window, xs, idxs, ws, recv, received, ys, outs, grid):
    """The four kernels of the DSL scheme through `prepare` (kernel, grid, args, kwargs)."""
    s = shapes
    recv_x, recv_meta, recv_idx, recv_w = recv
    return dict(
        dispatch=[
            prepare(dc.dispatch_send, grid, (xs, idxs, ws, s.counts, window),
                    dict(**s.common, L=s.L, TMAX=s.T, **s.offsets)),
            prepare(dc.dispatch_copy, grid, (window, recv_x, recv_meta, recv_idx, recv_w, received),
                    dict(**s.common, BM=s.BM, **s.offsets)),
        ],
        combine=[
            prepare(dc.combine_send, grid, (ys, recv_meta, received, window),
                    dict(H=s.common["H"], K=s.common["K"], BH=s.common["BH"], TMAX=s.T,
                         COMBINE=s.layout.combine)),
            prepare(dc.combine_reduce, grid, (idxs, outs, s.counts, window),
                    dict(H=s.common["H"], K=s.common["K"], BH=s.common["BH"], L=s.L, TMAX=s.T,
                         COMBINE=s.layout.combine)),
        ])


def compile_only(args):
    """What the GPU run launches, compiled here (numpy stand-ins carry the same dtypes, the same
    256-byte alignment and the same integers, hence the same specializations)."""
    import ml_dtypes

    from epic.dsl.jit import SymmetricMemory
    from epic.dsl.target import Target

    s = Shapes(args)
    R, H, K = args.ranks, args.hidden, args.topk
    stand_in = Target(R, 16, gpu=False)  # aligned numpy arrays; the window's size is no key
    per_rank = lambda shape, dtype: [stand_in.zeros(shape, dtype) for _ in range(R)]  # noqa: E731
    bf16 = ml_dtypes.bfloat16
    recv = (per_rank((s.rows, H), bf16), per_rank((s.rows, K + 2), np.int32),
            per_rank((s.rows, K), np.int64), per_rank((s.rows, K), np.float32))

    def compile_(kernel, grid, a, kw):
        return kernel.compile(*a, num_warps=dc.NUM_WARPS, backend="virtual", abi="runtime", **kw)

    compiled = dsl_launches(compile_, s, SymmetricMemory(R, 16), per_rank((1, H), bf16),
                            per_rank((1, K), np.int64), per_rank((1, K), np.float32), recv,
                            per_rank(1, np.int32), per_rank((1, H), bf16),
                            per_rank((1, H), bf16), (args.sms // R,))
    runtime = _C.Runtime("virtual", "", "")
    config = dict(tokens=args.tokens, fp8=False, expand=False, alignment=1)
    sets = [runtime.kernels(spec, variant, kind)["key"]
            for spec, variant, kind in ep_bench.kernel_sets(args, [config])]
    print(f"dsl_bench: {sum(len(v) for v in compiled.values())} DSL kernels, {len(sets)} "
          f"built-in kernel sets in {runtime.cache_dir}")


def run(args):
    import torch

    from epic._tensors import torch_to_numpy
    from epic.dsl.target import Target

    R, T, H, E, K = args.ranks, args.tokens, args.hidden, args.experts, args.topk
    per_rank_blocks = args.sms // R
    s = Shapes(args)
    timer = ep_bench.Timer(torch, args.iterations)
    xs, _, idxs, ws = ep_bench.make_inputs(torch, R, T, H, E, K, False, seed=T)

    # The built-in ops.
    builtin = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=T, hidden=H,
                                 num_topk=K, explicitly_destroy=True, num_sms=per_rank_blocks)
    b_recv, _, _, handles, _ = builtin.dispatch(xs, idxs, ws, num_experts=E)
    b_combined, _, _ = builtin.combine(b_recv, handles)

    # The DSL scheme on its own buffer (its window layout is its own).
    target = Target(R, s.layout.bytes, gpu=True, num_sms=per_rank_blocks)
    zeros = lambda shape, dtype: [torch.zeros(shape, dtype=dtype, device="cuda")  # noqa: E731
                                  for _ in range(R)]
    recv = (zeros((s.rows, H), torch.bfloat16), zeros((s.rows, K + 2), torch.int32),
            zeros((s.rows, K), torch.int64), zeros((s.rows, K), torch.float32))
    received = zeros(1, torch.int32)
    outs = zeros((T, H), torch.bfloat16)
    outs = [o[:c] for o, c in zip(outs, s.counts)]

    def prepare(kernel, grid, a, kw):
        return kernel.prepare[grid](*a, buffer=target.window, num_warps=dc.NUM_WARPS, **kw)

    launches = dsl_launches(prepare, s, target.window, xs, idxs, ws, recv, received, recv[0],
                            outs, (per_rank_blocks,))

    def dsl_dispatch():
        for launch in launches["dispatch"]:
            launch()

    def dsl_combine():
        for launch in launches["combine"]:
            launch()

    # Equal first: counts, rows (as multisets per rank), combine bitwise.
    dsl_dispatch()
    dsl_combine()  # the expert outputs are the received rows themselves
    torch.cuda.synchronize()
    same = True
    for r in range(R):
        n = int(received[r].item())
        same &= n == handles[r].num_recv_tokens
        mine = torch_to_numpy(recv[0][r][:n]).view(np.int16)
        theirs = torch_to_numpy(b_recv[r]).view(np.int16)
        same &= np.array_equal(np.sort(mine, axis=0), np.sort(theirs, axis=0))
        same &= torch.equal(outs[r].view(torch.int16), b_combined[r].view(torch.int16))

    def builtin_dispatch():
        builtin.dispatch(xs, idxs, ws, num_experts=E)

    def builtin_combine():
        builtin.combine(b_recv, handles)

    result = dict(equal=bool(same), sms=per_rank_blocks * R,
                  recv_tokens=sum(h.num_recv_tokens for h in handles))
    for name, fn, kernels, buffer in (  # buffer: whose kernels, for the CUDA-event fallback
            ("dsl_dispatch", dsl_dispatch, DSL_KERNELS["dispatch"], target.window),
            ("dsl_combine", dsl_combine, DSL_KERNELS["combine"], target.window),
            ("builtin_dispatch", builtin_dispatch, ep_bench.KERNELS["dispatch"], builtin),
            ("builtin_combine", builtin_combine, ep_bench.KERNELS["combine"], builtin)):
        times = timer.kernels(fn, kernels, buffer)
        result[f"{name}_kernels"] = times
        result[f"{name}_kernel_s"] = sum(times.values())
        result[f"{name}_wall_s"] = timer.wall(fn)
    pairs = sum(int((i >= 0).sum()) for i in idxs)
    # DeepEP's logical bytes: every (token, destination rank) row once (the built-in counts).
    logical = result["recv_tokens"] * H * 2
    for op in ("dispatch", "combine"):
        for side in ("dsl", "builtin"):
            result[f"{side}_{op}_logical_gbs_per_rank"] = \
                logical / R / result[f"{side}_{op}_kernel_s"] / 1e9
        result[f"dsl_over_builtin_{op}"] = \
            result[f"dsl_{op}_kernel_s"] / result[f"builtin_{op}_kernel_s"]
    result["pairs"] = pairs
    target.destroy()
    builtin.destroy()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--sms", type=int, default=128, help="SMs of the whole GPU (all ranks)")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    if args.sms % args.ranks:
        parser.error(f"--sms {args.sms} is not a multiple of --ranks {args.ranks}")
    if args.compile_only or _C.cuda_device_count() == 0:
        compile_only(args)
        return 0
    import torch

    report = dict(date=datetime.date.today().isoformat(), args=vars(args),
                  gpu=torch.cuda.get_device_name(), result=run(args))
    r = report["result"]
    print(f"{'':18} {'dispatch ms':>12} {'GB/s/rank':>10} {'combine ms':>11} {'GB/s/rank':>10}")
    for side in ("builtin", "dsl"):
        print(f"{side:18} {r[f'{side}_dispatch_kernel_s'] * 1e3:12.3f} "
              f"{r[f'{side}_dispatch_logical_gbs_per_rank']:10.1f} "
              f"{r[f'{side}_combine_kernel_s'] * 1e3:11.3f} "
              f"{r[f'{side}_combine_logical_gbs_per_rank']:10.1f}")
    print(f"DSL / built-in time: dispatch {r['dsl_over_builtin_dispatch']:.2f}x, combine "
          f"{r['dsl_over_builtin_combine']:.2f}x; results equal: {r['equal']}")
    ep_bench.write_report(report, args.out, "dsl-")
    return 0 if r["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
