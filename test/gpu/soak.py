"""Soak: random configurations and data through epic.ElasticBuffer on virtual worlds; every
dispatch, cached dispatch and combine compared exactly with epic.reference.

    python3 test/gpu/soak.py --compile-only        # where the compiler is: every kernel set
    python3 test/gpu/soak.py [--iterations 1000]   # on the GPU (tools/device/run.sh soak)

Configurations (a fixed list drawn from seed 0, so that the kernels compiled here are the ones
the GPU run asks for): 1 to 12 virtual ranks (odd counts included), top-k 1 to 9, hidden from
256 to 8192 in multiples of 8 (of 128 for FP8), BF16 and FP8 with scale packs, plain and
expanded, alignments 1 to 128, zero padding, with and without weights. Each iteration draws a
configuration and a routing pattern: uniform, masked slots (-1), ranks with no tokens, or every
token routed to one rank's experts. One buffer per rank count serves every configuration of
that count, reused across iterations.
Prints the configurations tried and every failure; exits 1 if any.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)  # test_elastic_buffer's comparisons

from epic import reference as ref  # noqa: E402
from epic._reference_checks import _expanded_row_owners  # noqa: E402

TMAX = 64
RANKS = (1, 2, 3, 5, 6, 7, 8, 12)
NUM_CONFIGS = 24
PATTERNS = ("uniform", "masked", "empty ranks", "one rank")


def configurations():
    """The soak's configurations: (ranks, experts, topk, hidden, fp8, alignment, expand,
    zero_padding, weights)."""
    rng = random.Random(0)
    out = []
    for i in range(NUM_CONFIGS):
        ranks = RANKS[i % len(RANKS)]
        experts = ranks * rng.choice([1, 2, 4, 8])
        topk = rng.randint(1, min(9, experts))
        fp8 = rng.random() < 0.5
        hidden = 128 * rng.randint(2, 64) if fp8 else 8 * rng.randint(32, 1024)
        expand = rng.random() < 0.5
        alignment = rng.choice([1, 4, 128]) if expand else 1
        out.append((ranks, experts, topk, hidden, fp8, alignment, expand,
                    expand and rng.random() < 0.5, rng.random() < 0.5))
    return out


def spec_of(config):
    ranks, experts, topk, hidden, fp8, alignment, expand, _, _ = config
    return dict(num_ranks=ranks, num_experts=experts, num_topk=topk, hidden=hidden,
                dtype="f8E4M3FN" if fp8 else "bf16", num_scale_packs=hidden // 128 if fp8 else 0,
                expert_alignment=alignment, do_expand=expand, num_max_tokens_per_rank=TMAX)


def compile_only():
    """Every kernel set the GPU run launches, into the kernel cache (EPIC_CACHE_DIR)."""
    from epic import _C

    runtime = _C.Runtime("virtual", "", "")
    start, count = time.time(), 0
    for config in configurations():
        spec, zero_padding, weights = spec_of(config), config[7], config[8]
        runtime.kernels(spec, dict(weights=weights, cached=False, zero_padding=zero_padding),
                        "dispatch")
        runtime.kernels(spec, dict(weights=False, cached=True, zero_padding=zero_padding),
                        "dispatch")
        runtime.kernels(spec, dict(weights=weights, biases=0), "combine")
        count += 3
    print(f"soak: {count} kernel sets in {runtime.cache_dir} ({time.time() - start:.1f} s)")
    return 0


def routing(rng, pattern, ranks, experts, topk):
    """Every rank's token counts and top-k ids for a routing pattern."""
    tokens = [int(rng.integers(0, TMAX + 1)) for _ in range(ranks)]
    if pattern == "empty ranks":
        for r in rng.choice(ranks, size=max(1, ranks // 2), replace=False):
            tokens[r] = 0
    local = experts // ranks
    target = int(rng.integers(0, ranks))
    idxs = []
    for t in tokens:
        if pattern == "one rank":  # the first min(K, L) slots on one rank's experts, the rest -1
            idx = np.full((t, topk), -1, np.int64)
            for row in range(t):
                picks = rng.permutation(local)[:min(topk, local)] + target * local
                idx[row, :len(picks)] = picks
        else:
            idx = np.array([rng.permutation(experts)[:topk] for _ in range(t)],
                           np.int64).reshape(t, topk)
            if pattern == "masked":
                idx[rng.random(idx.shape) < 0.3] = -1
        idxs.append(idx)
    return tokens, idxs


def rows(rng, tokens, hidden, fp8):
    """Every rank's rows: BF16, or FP8 with one float32 scale per 128 channels."""
    if not fp8:
        return [rng.standard_normal((t, hidden)).astype(ref.bfloat16) for t in tokens], None
    casts = [ref.per_token_cast_to_fp8(rng.standard_normal((t, hidden)).astype(np.float32))
             for t in tokens]
    return [c[0] for c in casts], [c[1] for c in casts]


def checked(what, check, *args):
    """Run a comparison; its AssertionError names `what` (the call and the rank)."""
    try:
        check(*args)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def without_padding(result, zero_padding):
    """`result` with its expanded padding rows zeroed, as the reference has them: without
    zero padding the kernel leaves them unspecified (they hold the buffer's previous call)."""
    if not result.expand or zero_padding:
        return result
    pad = _expanded_row_owners(result) < 0
    fields = {}
    for name in ("recv_x", "recv_scale_packs", "recv_topk_weights"):
        a = getattr(result, name)
        if a is not None and len(a) == len(pad):
            a = a.copy()
            a[pad] = 0
            fields[name] = a
    return dataclasses.replace(result, **fields)


def one_iteration(torch, buffers, config, pattern, seed, buffer_per_config=False):
    """One dispatch, cached dispatch and combine of `config`; raises AssertionError naming the
    first difference from the reference."""
    import epic
    # The comparisons of the Python API's GPU tests (torch is there on the GPU machine).
    from test_elastic_buffer import as_result, check_dispatch, same_bits, to_numpy, to_torch
    ranks, experts, topk, hidden, fp8, alignment, expand, zero_padding, weights = config
    rng = np.random.default_rng(seed)
    # One buffer per rank count, reused by every configuration of that count (the window's
    # control region is at the same offsets for all of them). With --buffer-per-config, one
    # per (rank count, expert count) instead: to tell a layout problem from a kernel problem.
    key = (ranks, experts) if buffer_per_config else ranks
    if key not in buffers:
        size = epic.ElasticBuffer.get_buffer_size_hint(epic.VirtualWorld(ranks), TMAX, 8192, 9)
        buffers[key] = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_bytes=size,
                                          explicitly_destroy=True)
    buffer = buffers[key]
    tokens, idxs = routing(rng, pattern, ranks, experts, topk)
    xs, sfs = rows(rng, tokens, hidden, fp8)
    ws = [rng.standard_normal((t, topk)).astype(np.float32) for t in tokens] if weights else None
    kwargs = dict(num_experts=experts, num_max_tokens_per_rank=TMAX, expert_alignment=alignment,
                  do_expand=expand, do_zero_padding=zero_padding)
    x_in = [(to_torch(x), to_torch(s)) for x, s in zip(xs, sfs)] if fp8 else \
        [to_torch(x) for x in xs]
    recv, recv_idx, recv_w, handles, _ = buffer.dispatch(
        x_in, [to_torch(i) for i in idxs], [to_torch(w) for w in ws] if weights else None,
        **kwargs)
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=experts, num_max_tokens_per_rank=TMAX,
                            expert_alignment=alignment, expand=expand,
                            zero_padding=zero_padding)
    got = []
    for r in range(ranks):
        data, sf = recv[r] if fp8 else (recv[r], None)
        got.append(as_result(expected[r], data, sf, recv_idx[r], recv_w[r], handles[r]))
        checked(f"dispatch, rank {r}", check_dispatch, expected[r],
                without_padding(got[r], zero_padding), handles[r])

    # Cached: new rows, the same routing.
    new_xs, new_sfs = rows(rng, tokens, hidden, fp8)
    new_in = [(to_torch(x), to_torch(s)) for x, s in zip(new_xs, new_sfs)] if fp8 else \
        [to_torch(x) for x in new_xs]
    again = buffer.dispatch(new_in, handle=handles, do_expand=expand,
                            do_zero_padding=zero_padding)
    expected_again = ref.dispatch(new_xs, idxs, None, new_sfs, num_experts=experts,
                                  num_max_tokens_per_rank=TMAX, expert_alignment=alignment,
                                  expand=expand, zero_padding=zero_padding)
    for r in range(ranks):
        data, sf = again[0][r] if fp8 else (again[0][r], None)
        result = as_result(expected_again[r], data, sf, again[1][r], None, handles[r])
        checked(f"cached dispatch, rank {r}", check_dispatch, expected_again[r],
                without_padding(result, zero_padding), handles[r])

    # Combine: bf16 rows of what each rank received, weights back if the dispatch had them.
    ys = [rng.standard_normal((g.recv_x.shape[0], hidden)).astype(ref.bfloat16) for g in got]
    want = ref.combine(ys, got, topk_weights=[g.recv_topk_weights for g in got] if weights
                       else None)
    out, out_w, _ = buffer.combine([to_torch(y) for y in ys], handles,
                                   topk_weights=recv_w if weights else None)
    for r in range(ranks):
        assert same_bits(to_numpy(out[r]), want[r].combined_x), f"combine, rank {r}: combined_x"
        if weights:
            assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights), \
                f"combine, rank {r}: combined_topk_weights"
    torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--configs", type=int, nargs="*",
                        help="only these configurations (indices into the list)")
    parser.add_argument("--buffer-per-config", action="store_true",
                        help="one buffer per rank count and expert count (default: per rank count)")
    parser.add_argument("--fresh", action="store_true",
                        help="a new buffer for every iteration (no state from earlier calls)")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only()
    import torch

    configs = configurations()
    if args.configs:
        configs = [configs[i] for i in args.configs]
    buffers, failures, tried = {}, [], set()
    rng = random.Random(args.seed)
    start = time.time()
    for i in range(args.iterations):
        config, pattern = rng.choice(configs), rng.choice(PATTERNS)
        tried.add(config)
        try:
            if args.fresh:
                for buffer in buffers.values():
                    buffer.destroy()
                buffers.clear()
            one_iteration(torch, buffers, config, pattern, seed=args.seed * 100003 + i,
                          buffer_per_config=args.buffer_per_config)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next
            failures.append((i, config, pattern, f"{type(e).__name__}: {e}"))
            print(f"soak: FAILED iteration {i} {config} {pattern}: {type(e).__name__}: {e}",
                  flush=True)
    for buffer in buffers.values():
        buffer.destroy()
    print(f"soak: {args.iterations} iterations, {len(tried)} configurations "
          f"(ranks {sorted({c[0] for c in tried})}), {len(failures)} failures, "
          f"{time.time() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
