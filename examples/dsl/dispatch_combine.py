"""A complete dispatch + combine scheme written in the DSL (plain layout, direct mode).

    python examples/dsl/dispatch_combine.py [--ranks 4] [--tokens 24] [--hidden 64]

On the GPU if there is one (a virtual world of --ranks on one GPU, the kernels compiled by
epic and launched by the runtime), else (or with EPIC_INTERPRET=1) in the CPU interpreter.

Dispatch: each program takes tokens of its rank; for every rank that owns one of a token's
experts it takes a slot there with a remote atomic, writes the row, the routing metadata
(source id, source rank x K + master slot) and the weights straight into that rank's window.
A copy kernel moves each rank's received rows out of its window and resets the counter.
Combine: each received row goes back into its source's window at [master slot][token]; the
source sums the master slots' rows in increasing slot order in fp32 and rounds once (DeepEP's
order, so the result is bitwise reproducible). Checked against epic.reference, the executable
semantics of ep.dispatch / ep.combine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402

import epic  # noqa: E402
import epic.language as el  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic.dsl.target import Target  # noqa: E402


# 256 threads per program: four 16-byte loads each move 8192 bf16, a V3 row (7168) at once.
NUM_WARPS = 8


def row_block(H, num_warps=NUM_WARPS):
    """BH, the part of a row that copy_row moves per load: 8 bf16 (16 bytes) per thread, less
    for a short row (a quarter of it, rounded up to a power of two)."""
    return min(8 * 32 * num_warps, 1 << ((H + 3) // 4 - 1).bit_length())


@epic.jit
def copy_row(dst, src, H: el.constexpr, BH: el.constexpr):
    """Copies the H elements at src to dst in BH-wide parts, four at a time: all four loaded,
    then stored. A store waits for its load, so one part at a time would leave one 16-byte load
    per thread in flight and the copy latency bound; four keep four in flight (the built-in
    kernels do the same). Masks cover a row that ends inside the four."""
    for h in range(0, H, 4 * BH):
        cols, parts = (), ()
        for u in el.static_range(4):
            cols += (h + u * BH + el.arange(0, BH),)
            parts += (el.load(src + cols[u], mask=cols[u] < H),)
        for u in el.static_range(4):
            el.store(dst + cols[u], parts[u], mask=cols[u] < H)


class Layout:
    """Byte offsets of one rank's window: counter, received rows, metadata, local ids, weights,
    then the combine's [K][Tmax] contributions."""

    def __init__(self, R, K, H, tmax):
        self.R, self.K, self.H, self.tmax = R, K, H, tmax
        rows = R * tmax
        at = 16  # the received-row counter (int32) at byte 0
        self.rows = at
        at += rows * H * 2
        self.meta = at
        at += rows * (K + 2) * 4
        self.local = at
        at += rows * K * 8
        self.weights = at
        at += rows * K * 4
        self.combine = at
        at += K * tmax * H * 2
        self.bytes = at


@epic.jit
def dispatch_send(x_ptr, idx_ptr, w_ptr, num_tokens, win, H: el.constexpr, K: el.constexpr,
                  BK: el.constexpr, BH: el.constexpr, L: el.constexpr, TMAX: el.constexpr,
                  ROWS: el.constexpr, META: el.constexpr, LOCAL: el.constexpr,
                  WEIGHTS: el.constexpr):
    me = el.rank()
    k = el.arange(0, BK)
    in_topk = k < K
    for t in range(el.program_id(0), num_tokens, el.num_programs(0)):
        experts = el.load(idx_ptr + t * K + k, mask=in_topk, other=-1)
        weights = el.load(w_ptr + t * K + k, mask=in_topk, other=0.0)
        for d in range(el.num_ranks()):
            owned = (experts >= 0) & (experts // L == d)
            if el.sum(owned.to(el.int32)) > 0:
                master = el.max(el.where(owned, k, -1))
                peer = el.peer_ptr(win, d)
                slot = el.atomic_add(peer.to(el.int32), 1, scope="sys")
                rows = (peer + ROWS).to(el.bfloat16) + slot * H
                copy_row(rows, x_ptr + t * H, H, BH)
                meta = (peer + META).to(el.int32) + slot * (K + 2)
                el.store(meta, me * TMAX + t)
                el.store(meta + 1, me * K + master)
                el.store(meta + 2 + k, el.full((BK,), -1, el.int32), mask=in_topk)
                local = el.where(owned, experts - d * L, -1)
                el.store((peer + LOCAL).to(el.int64) + slot * K + k, local, mask=in_topk)
                el.store((peer + WEIGHTS).to(el.float32) + slot * K + k, weights, mask=in_topk)


@epic.jit
def dispatch_copy(win, recv_x, recv_meta, recv_idx, recv_w, count_out, H: el.constexpr,
                  K: el.constexpr, BK: el.constexpr, BM: el.constexpr, BH: el.constexpr,
                  ROWS: el.constexpr, META: el.constexpr, LOCAL: el.constexpr,
                  WEIGHTS: el.constexpr):
    count = el.load(win.to(el.int32), sem="acquire")
    k = el.arange(0, BK)
    in_topk = k < K
    for i in range(el.program_id(0), count, el.num_programs(0)):
        copy_row(recv_x + i * H, (win + ROWS).to(el.bfloat16) + i * H, H, BH)
        m = el.arange(0, BM)  # the K + 2 metadata words
        el.store(recv_meta + i * (K + 2) + m,
                 el.load((win + META).to(el.int32) + i * (K + 2) + m, mask=m < K + 2),
                 mask=m < K + 2)
        el.store(recv_idx + i * K + k,
                 el.load((win + LOCAL).to(el.int64) + i * K + k, mask=in_topk), mask=in_topk)
        el.store(recv_w + i * K + k,
                 el.load((win + WEIGHTS).to(el.float32) + i * K + k, mask=in_topk), mask=in_topk)
    el.barrier()  # every program has read the counter: rank by rank, reset it
    if el.program_id(0) == 0:
        el.store(count_out, count)
        el.store(win.to(el.int32), 0)


@epic.jit
def combine_send(y_ptr, meta_ptr, count_ptr, win, H: el.constexpr, K: el.constexpr,
                 BH: el.constexpr, TMAX: el.constexpr, COMBINE: el.constexpr):
    count = el.load(count_ptr)  # the dispatch's received count: no host round trip
    for i in range(el.program_id(0), count, el.num_programs(0)):
        gid = el.load(meta_ptr + i * (K + 2))
        back = el.load(meta_ptr + i * (K + 2) + 1)
        src, t, master = gid // TMAX, gid % TMAX, back % K
        dst = (el.peer_ptr(win, src) + COMBINE).to(el.bfloat16) + (master * TMAX + t) * H
        copy_row(dst, y_ptr + i * H, H, BH)


@epic.jit
def combine_reduce(idx_ptr, out_ptr, num_tokens, win, H: el.constexpr, K: el.constexpr,
                   BH: el.constexpr, L: el.constexpr, TMAX: el.constexpr, COMBINE: el.constexpr):
    rows = (win + COMBINE).to(el.bfloat16)
    for t in range(el.program_id(0), num_tokens, el.num_programs(0)):
        owners = ()  # the rank of each slot's expert (-1: none)
        for j in el.static_range(K):
            expert = el.load(idx_ptr + t * K + j)
            owners += (el.where(expert >= 0, expert // L, -1),)
        masters = ()  # slot j is summed iff no later slot went to its rank: its master slot
        for j in el.static_range(K):
            master = owners[j] >= 0
            for i in el.static_range(j + 1, K):
                master = master & (owners[i] != owners[j])
            masters += (master,)
        for h in range(0, H, BH):
            offsets = h + el.arange(0, BH)
            # All K slots' loads go out before the first add, so they are in flight together.
            # A slot that is not a master loads nothing and adds +0.0: no bit of a sum that
            # starts at +0.0 changes, so this is still the slot-order sum, rounded once.
            parts = ()
            for j in el.static_range(K):
                parts += (el.load(rows + (j * TMAX + t) * H + offsets,
                                  mask=(offsets < H) & masters[j], other=0.0),)
            acc = el.zeros((BH,), el.float32)
            for j in el.static_range(K):
                acc += parts[j].to(el.float32)
            el.store(out_ptr + t * H + offsets, acc.to(el.bfloat16), mask=offsets < H)


def run(R=4, tokens=24, E=None, K=4, H=64, programs=2, seed=0, target=None):
    """Dispatch then combine in the DSL on `target` (default: the GPU if there is one, else the
    CPU interpreter); returns (dispatch ok, combine ok)."""
    E = E or 4 * R
    L, BK, BH = E // R, 1 << (K - 1).bit_length(), row_block(H)
    rng = np.random.default_rng(seed)
    counts = [tokens - (3 * r) % tokens for r in range(R)]  # uneven, all in [1, tokens]
    xs = [rng.standard_normal((t, H)).astype(ref.bfloat16) for t in counts]
    idxs = []
    for t in counts:
        idx = np.array([rng.permutation(E)[:K] for _ in range(t)], np.int64).reshape(t, K)
        idx[rng.random(idx.shape) < 0.15] = -1
        idxs.append(idx)
    ws = [rng.standard_normal((t, K)).astype(np.float32) for t in counts]

    layout = Layout(R, K, H, tokens)
    target = target or Target.choose(R, layout.bytes)
    win = target.window
    launch = dict(**target.launch, num_warps=NUM_WARPS)
    common = dict(H=H, K=K, BK=BK, BH=BH)
    offsets = dict(ROWS=layout.rows, META=layout.meta, LOCAL=layout.local, WEIGHTS=layout.weights)
    dispatch_send[(programs,)]([target.tensor(x) for x in xs], [target.tensor(i) for i in idxs],
                               [target.tensor(w) for w in ws], counts, win, **common, L=L,
                               TMAX=tokens, **offsets, **launch)
    rows = R * tokens
    recv_x = [target.zeros((rows, H), ref.bfloat16) for _ in range(R)]
    recv_meta = [target.zeros((rows, K + 2), np.int32) for _ in range(R)]
    recv_idx = [target.zeros((rows, K), np.int64) for _ in range(R)]
    recv_w = [target.zeros((rows, K), np.float32) for _ in range(R)]
    received = [target.zeros(1, np.int32) for _ in range(R)]
    dispatch_copy[(programs,)](win, recv_x, recv_meta, recv_idx, recv_w, received, **common,
                               BM=1 << (K + 1).bit_length(), **offsets, **launch)
    target.synchronize()

    expected = ref.dispatch(xs, idxs, ws, num_experts=E, num_max_tokens_per_rank=tokens)
    got, dispatch_ok = [], True
    for r in range(R):
        n = int(target.numpy(received[r])[0])
        g = dataclasses.replace(expected[r], recv_x=target.numpy(recv_x[r])[:n],
                                recv_topk_idx=target.numpy(recv_idx[r])[:n],
                                recv_topk_weights=target.numpy(recv_w[r])[:n],
                                recv_src_metadata=target.numpy(recv_meta[r])[:n])
        dispatch_ok &= n == expected[r].num_recv_tokens
        if n == expected[r].num_recv_tokens:
            s = ref.sort_by_source(g)
            for field in ("recv_x", "recv_topk_idx", "recv_src_metadata"):
                dispatch_ok &= getattr(s, field).tobytes() == getattr(expected[r], field).tobytes()
        got.append(g)
    if not dispatch_ok:
        return False, False

    ys = [np.ascontiguousarray(rng.standard_normal((g.num_recv_tokens, H)).astype(ref.bfloat16))
          for g in got]
    metas = [np.ascontiguousarray(g.recv_src_metadata) for g in got]
    combine_send[(programs,)]([target.tensor(y) for y in ys], [target.tensor(m) for m in metas],
                              received, win, H=H, K=K, BH=BH,
                              TMAX=tokens, COMBINE=layout.combine, **launch)
    outs = [target.zeros((t, H), ref.bfloat16) for t in counts]
    combine_reduce[(programs,)]([target.tensor(i) for i in idxs], outs, counts, win, H=H, K=K,
                                BH=BH, L=L, TMAX=tokens, COMBINE=layout.combine, **launch)
    target.synchronize()
    want = ref.combine(ys, got)
    combine_ok = all(target.numpy(outs[r]).tobytes() == want[r].combined_x.tobytes()
                     for r in range(R))
    return dispatch_ok, combine_ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    target = Target.choose(args.ranks, Layout(args.ranks, 4, args.hidden, args.tokens).bytes)
    print(f"running on the {target.name}")
    d, c = run(args.ranks, args.tokens, H=args.hidden, target=target)
    print(f"DSL dispatch vs epic.reference: {'ok' if d else 'MISMATCH'}")
    print(f"DSL combine vs epic.reference (bitwise): {'ok' if c else 'MISMATCH'}")
    return 0 if d and c else 1


if __name__ == "__main__":
    sys.exit(main())
