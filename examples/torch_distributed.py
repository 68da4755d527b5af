"""The quickstart on real ranks: one process per GPU, NCCL underneath.

    torchrun --nproc-per-node N examples/torch_distributed.py [--tokens 256]
    python examples/torch_distributed.py --compile-only --world-size N   # no GPU needed

Every process builds an ``epic.ElasticBuffer`` on the default process group
(a new NCCL communicator, its unique id broadcast through torch.distributed),
dispatches its FP8 tokens with DeepEP's V3 configuration, runs the toy expert
on what it received, combines, and checks its own result bitwise against
epic.reference. The inputs of every rank are generated (deterministically) in
every process, so each can compute the reference alone; the toy expert is a
function of each row, so the reference does not depend on arrival order.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)


import epic  # noqa: E402
from common import (ALIGNMENT, EXPERTS, HIDDEN, TOPK, V3_VARIANTS,  # noqa: E402
                    add_compile_only_arguments, init_distributed, make_inputs, to_numpy,
                    to_torch, toy_expert_torch, v3_spec)
from epic import reference as ref  # noqa: E402


def compile_only(args):
    from epic import _C

    runtime = _C.Runtime("nccl", args.cache_dir or "", "")
    for kind, variant in V3_VARIANTS:
        k = runtime.kernels(v3_spec(args.world_size, args.tokens), variant, kind)
        print(f"{kind} kernels for {args.world_size} NCCL rank(s): {k['source']} "
              f"in {k['seconds']:.3f} s ({k['key']})")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank (at most)")
    add_compile_only_arguments(parser)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args)

    import torch
    import torch.distributed as dist

    rank, world = init_distributed(EXPERTS)

    counts, xs, sfs, idxs, ws = make_inputs(world, args.tokens)
    buffer = epic.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=args.tokens,
                                hidden=HIDDEN, num_topk=TOPK, use_fp8_dispatch=True,
                                explicitly_destroy=True, cache_dir=args.cache_dir)
    (data, sf), _, recv_w, handle, _ = buffer.dispatch(
        (to_torch(torch, xs[rank]), to_torch(torch, sfs[rank])), to_torch(torch, idxs[rank]),
        to_torch(torch, ws[rank]), num_experts=EXPERTS, expert_alignment=ALIGNMENT,
        do_expand=True)
    L = EXPERTS // world
    y = toy_expert_torch(torch, data, sf, handle.num_recv_tokens_per_expert_list, L)
    combined, combined_w, _ = buffer.combine(y, handle, topk_weights=recv_w)
    buffer.barrier()

    # The reference, from every rank's inputs: canonical rows, the same expert.
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=EXPERTS,
                            num_max_tokens_per_rank=args.tokens, expert_alignment=ALIGNMENT,
                            expand=True)
    ys = []
    for e in expected:
        t = toy_expert_torch(torch, to_torch(torch, e.recv_x, "cpu"),
                             to_torch(torch, e.recv_scale_packs, "cpu"),
                             e.num_recv_tokens_per_expert_list, L)
        ys.append(to_numpy(torch, t))
    want = ref.combine(ys, expected, topk_weights=[e.recv_topk_weights for e in expected])[rank]
    ok = (to_numpy(torch, combined).tobytes() == want.combined_x.tobytes()
          and to_numpy(torch, combined_w).tobytes() == want.combined_topk_weights.tobytes()
          and handle.num_recv_tokens == expected[rank].num_recv_tokens)
    oks = [None] * world
    dist.all_gather_object(oks, ok)
    if rank == 0:
        api = buffer._state.device_api
        print(f"epic torch.distributed: {world} rank(s), {api['text'] if api else '?'}, "
              f"communicator: {buffer.nccl_comm_source}")
        print(f"  rank 0 sent {counts[0]} tokens, received {handle.num_recv_tokens} "
              f"({handle.num_expanded_tokens} expanded rows)")
        failed = [r for r, o in enumerate(oks) if not o]
        print(f"  combine vs epic.reference on every rank (bitwise): "
              f"{'ok' if all(oks) else 'MISMATCH on ranks ' + str(failed)}")
    buffer.destroy()
    dist.destroy_process_group()
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
