"""What the Python examples share: DeepEP's V3 configuration, deterministic
inputs, the toy expert, and exact torch <-> numpy conversions."""

from __future__ import annotations

import numpy as np

from epic import reference as ref
from epic._tensors import numpy_to_torch, torch_to_numpy

HIDDEN, EXPERTS, TOPK, ALIGNMENT, GROUP = 7168, 256, 8, 128, 128


def v3_spec(ranks, tokens):
    """The kernel configuration of the examples (as epic._C.Runtime.kernels takes it)."""
    return dict(num_ranks=ranks, num_experts=EXPERTS, num_topk=TOPK, hidden=HIDDEN,
                dtype="f8E4M3FN", num_scale_packs=HIDDEN // GROUP, expert_alignment=ALIGNMENT,
                do_expand=True, num_max_tokens_per_rank=tokens)


V3_VARIANTS = (("dispatch", dict(weights=True, cached=False, zero_padding=False)),
               ("combine", dict(weights=True, biases=0)))


def make_inputs(ranks, tokens, seed=0):
    """Every rank's FP8 tokens, scales, routing and weights (the same in every process)."""
    rng = np.random.default_rng(seed)
    counts = [tokens - (r * 7) % 32 for r in range(ranks)]  # uneven, every one <= tokens
    xs, sfs, idxs, ws = [], [], [], []
    for t in counts:
        data, scales = ref.per_token_cast_to_fp8(
            rng.standard_normal((t, HIDDEN)).astype(np.float32))
        idx = np.array([rng.permutation(EXPERTS)[:TOPK] for _ in range(t)], dtype=np.int64)
        idx = idx.reshape(t, TOPK)
        idx[rng.random(idx.shape) < 0.05] = -1
        xs.append(data), sfs.append(scales), idxs.append(idx)
        ws.append(rng.random((t, TOPK)).astype(np.float32))
    return counts, xs, sfs, idxs, ws


def toy_expert_torch(torch, data, sf, aligned_counts, num_local_experts):
    """Dequantize and scale each row by (local expert + 1) / 32, in BF16."""
    deq = data.float() * sf.repeat_interleave(GROUP, dim=1)
    counts = torch.tensor(aligned_counts, device=data.device)
    scale = torch.repeat_interleave(
        torch.arange(1, num_local_experts + 1, device=data.device, dtype=torch.float32) / 32.0,
        counts)
    return (deq * scale[:, None]).to(torch.bfloat16)


def toy_expert_combined(torch, expected, num_local_experts, rank):
    """The reference combine of the toy expert's outputs on every rank's reference FP8
    expanded dispatch (`expected`), weights sent back: what rank `rank` must get."""
    from epic import reference as ref

    ys = [torch_to_numpy(toy_expert_torch(torch, numpy_to_torch(e.recv_x, "cpu"),
                                          numpy_to_torch(e.recv_scale_packs, "cpu"),
                                          e.num_recv_tokens_per_expert_list, num_local_experts))
          for e in expected]
    return ref.combine(ys, expected, topk_weights=[e.recv_topk_weights for e in expected])[rank]


def to_torch(torch, a, device="cuda"):
    return numpy_to_torch(a, device)


def to_numpy(torch, t):
    return torch_to_numpy(t)


def add_compile_only_arguments(parser):
    """--compile-only / --world-size: fill the kernel cache where the compiler is, for a GPU
    machine that has none (the torchrun scripts share them)."""
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the kernels of --world-size ranks into the cache and stop")
    parser.add_argument("--world-size", type=int, default=1)


def init_distributed(experts=EXPERTS):
    """torch.distributed on NCCL, one GPU per process (torchrun's LOCAL_RANK): (rank, world).
    The experts must split evenly over the ranks."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if experts % world:
        raise SystemExit(f"{experts} experts do not split over {world} ranks")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    return rank, world
