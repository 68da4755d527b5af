"""Launches DeepEP V1's low-latency pair on a one-rank NCCL world `--calls` times (the V3
shape, 128 tokens, FP8): a workload for Nsight Compute on its kernels. ``--sweep`` instead
prints each kernel's GPU time (CUPTI) at 1 to 128 tokens, one kernel per op and the phases
apart (a receive hook): what a call costs with almost no rows is the kernels' fixed latency.

    ncu --kernel-name regex:low_latency --launch-skip 20 --launch-count 2 \\
        python3 bench/ll_kernels_profile.py
    python3 bench/ll_kernels_profile.py --sweep
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import latency  # noqa: E402  (bench/ is the script's directory)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--blocks", default="0",
                        help="--sweep: comma-separated blocks per rank to launch (0: the "
                             "buffer's choice)")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    from epic import deep_ep

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    T, H, E = args.tokens, latency.HIDDEN, latency.EXPERTS

    def make_buffer():
        return deep_ep.Buffer(
            dist.group.WORLD, low_latency_mode=True, num_qps_per_rank=E,
            num_rdma_bytes=deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, 1, E),
            explicitly_destroy=True)

    if args.sweep:
        for blocks in (int(b) for b in args.blocks.split(",")):
            buf = make_buffer()
            if blocks:  # the plans of this buffer launch `blocks` blocks per rank
                plan = buf._ll_plan
                buf._ll_plan = lambda key, kind, spec, variant, tensors, sms, b=blocks: plan(
                    key, kind, spec, variant, tensors, b)
            print(f"blocks per rank: {blocks or 'the buffer default'}")
            sweep(torch, buf, T, H, E)
            buf.destroy()
        dist.destroy_process_group()
        return 0
    buf = make_buffer()
    _, _, idxs, ws = latency.inputs(torch, 1, T)
    x = torch.randn((T, H), device="cuda").to(torch.bfloat16)
    y = torch.randn((E, T, H), device="cuda").to(torch.bfloat16)
    for _ in range(args.calls):
        _, _, handle, _, _ = buf.low_latency_dispatch(x, idxs[0], T, E, use_fp8=True)
        buf.low_latency_combine(y, idxs[0], ws[0], handle)
    torch.cuda.synchronize()
    buf.destroy()
    dist.destroy_process_group()
    print(f"ll_kernels_profile: {args.calls} pairs")
    return 0


def sweep(torch, buf, cap, H, E):
    for T in (1, 8, 32, cap):
        _, _, idxs, ws = latency.inputs(torch, 1, T)
        x = torch.randn((T, H), device="cuda").to(torch.bfloat16)
        y = torch.randn((E, cap, H), device="cuda").to(torch.bfloat16)
        row = {}
        for hook in (False, True):
            def pair():
                _, _, h, _, recv = buf.low_latency_dispatch(x, idxs[0], cap, E, use_fp8=True,
                                                            return_recv_hook=hook)
                if hook:
                    recv()
                _, _, done = buf.low_latency_combine(y, idxs[0], ws[0], h, return_recv_hook=hook)
                if hook:
                    done()
            pair()
            row.update(latency.kernel_times(torch, pair)[1])
        print(f"T={T:4d}: " + ", ".join(f"{k.replace('ep_low_latency_', '')} {v:.1f}"
                                         for k, v in sorted(row.items())) + " us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
