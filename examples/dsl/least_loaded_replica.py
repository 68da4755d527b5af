"""A dispatch the built-in ops do not offer: each token goes to the least-loaded replica of its
expert.

    python examples/dsl/least_loaded_replica.py [--ranks 4] [--tokens 32]

On the GPU if there is one (a virtual world on one GPU), else (or with EPIC_INTERPRET=1) in the
CPU interpreter.

Hot experts are replicated: expert e lives on REPLICAS ranks, (e // L + i * R / REPLICAS) mod R.
For every (token, expert) pair the sender reads the replicas' load counters (acquire loads of
peer windows), picks the least loaded (ties to the first), takes a slot there with a remote
atomic and writes the row, the source and the expert into that rank's window. Routing is skewed
(most tokens pick experts of rank 0): a fixed primary replica would pile them up; here the
replicas share them. Checked: every (token, expert) pair arrives exactly once, on one of the
expert's replicas, with its row bitwise; and the busiest rank receives fewer rows than it would
with fixed primaries.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402

import epic  # noqa: E402
import epic.language as el  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic.dsl.target import Target  # noqa: E402

REPLICAS = 2


class Layout:
    """Per rank: the load counter (int32), then rows, and per row (source rank, token, expert)."""

    def __init__(self, capacity, H):
        self.load = 0
        self.rows = 16
        self.info = self.rows + capacity * H * 2
        self.bytes = self.info + capacity * 3 * 4


@epic.jit
def replica_dispatch(x_ptr, idx_ptr, num_tokens, win, H: el.constexpr, K: el.constexpr,
                     L: el.constexpr, BH: el.constexpr, ROWS: el.constexpr, INFO: el.constexpr,
                     CAPACITY: el.constexpr):
    me, R = el.rank(), el.num_ranks()
    for t in range(el.program_id(0), num_tokens, el.num_programs(0)):
        for j in el.static_range(K):
            e = el.load(idx_ptr + t * K + j)
            if e >= 0:
                # The least-loaded replica (acquire loads of the replicas' counters).
                best, best_load = -1, 0
                for i in el.static_range(REPLICAS):
                    rank = (e // L + i * (R // REPLICAS)) % R
                    load = el.load(el.peer_ptr(win, rank).to(el.int32), sem="acquire",
                                   scope="sys")
                    if best < 0 or load < best_load:
                        best, best_load = rank, load
                peer = el.peer_ptr(win, best)
                slot = el.atomic_add(peer.to(el.int32), 1, scope="sys")
                if slot >= CAPACITY:
                    el.store(peer.to(el.int32), -(1 << 30))  # overflow: the check reports it
                else:
                    rows = (peer + ROWS).to(el.bfloat16) + slot * H
                    for h in range(0, H, BH):
                        offsets = h + el.arange(0, BH)
                        el.store(rows + offsets, el.load(x_ptr + t * H + offsets))
                    info = (peer + INFO).to(el.int32) + slot * 3
                    el.store(info, me)
                    el.store(info + 1, t)
                    el.store(info + 2, e, sem="release")


def run(R=4, tokens=32, K=2, H=64, L=4, programs=2, seed=0, target=None):
    if R % REPLICAS:
        raise ValueError(f"{R} ranks do not hold {REPLICAS} replicas evenly")
    E = L * R
    rng = np.random.default_rng(seed)
    counts = [tokens - (r % 3) for r in range(R)]
    xs = [rng.standard_normal((t, H)).astype(ref.bfloat16) for t in counts]
    # Skewed routing: rank 0's experts are hot.
    weights = np.where(np.arange(E) < L, 8.0, 1.0)
    idxs = [np.array([rng.choice(E, K, replace=False, p=weights / weights.sum()) for _ in range(t)],
                     np.int64).reshape(t, K) for t in counts]
    capacity = sum(counts) * K
    layout = Layout(capacity, H)
    target = target or Target.choose(R, layout.bytes)
    replica_dispatch[(programs,)]([target.tensor(x) for x in xs], [target.tensor(i) for i in idxs],
                                  counts, target.window, H=H, K=K, L=L, BH=min(H & -H, 1024),
                                  ROWS=layout.rows, INFO=layout.info, CAPACITY=capacity,
                                  **target.launch)
    arrived = {}
    ok = True
    loads = []
    for d in range(R):
        n = int(target.window_view(d, np.int32, 1)[0])
        ok &= 0 <= n <= capacity
        if not 0 <= n <= capacity:
            continue
        loads.append(n)
        info = target.window_view(d, np.int32, n * 3, layout.info).reshape(n, 3)
        rows = target.window_view(d, ref.bfloat16, n * H, layout.rows).reshape(n, H)
        for i, (s, t, e) in enumerate(info):
            replicas = {(e // L + k * (R // REPLICAS)) % R for k in range(REPLICAS)}
            ok &= d in replicas and (s, t, e) not in arrived
            arrived[(int(s), int(t), int(e))] = d
            ok &= rows[i].tobytes() == xs[s][t].tobytes()
    wanted = {(s, t, int(e)) for s in range(R) for t in range(counts[s]) for e in idxs[s][t]}
    ok &= set(arrived) == wanted
    primary = np.bincount([e // L for s in range(R) for e in idxs[s].reshape(-1)], minlength=R)
    balanced = bool(loads) and max(loads) < primary.max()
    return ok, balanced, loads, primary.tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    target = Target.choose(args.ranks, Layout(sum(args.tokens - (r % 3) for r in range(args.ranks))
                                              * 2, 64).bytes)
    print(f"running on the {target.name}")
    ok, balanced, loads, primary = run(args.ranks, args.tokens, target=target)
    print(f"DSL least-loaded replica dispatch: every (token, expert) once on a replica: "
          f"{'ok' if ok else 'MISMATCH'}")
    print(f"  rows per rank {loads}, with fixed primary replicas {primary}: "
          f"{'better balanced' if balanced else 'NOT better balanced'}")
    return 0 if ok and balanced else 1


if __name__ == "__main__":
    sys.exit(main())
