"""The stress test's pure logic (no torch, no GPU): the configurations, the random schedule
every rank derives from one shared seed, the agreement of ranks on it, the watchdog that turns
a hang into an error naming the op, and the permutation between a kernel's arrival order and
the reference's canonical order. test/python/test_stress_plan.py tests it on the CPU;
test/gpu/stress.py runs it.

Why a shared seed: a multi-rank op is collective, so every rank must take the same decision at
the same point (which op, which configuration, which buffer, destroy or not). Nothing here reads
per-rank state; per-rank data comes from generators seeded by (seed, step, rank), which every
process can rebuild for every rank, so each one computes the reference of the whole world.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import sys
import threading
import time

import numpy as np

TMAX = 64  # the buffers' token cap; a configuration may ask for half of it per call
KMAX, HMAX = 8, 2048  # the buffers are sized for the largest top-k and hidden of the list
NUM_CONFIGS = 16
PATTERNS = ("uniform", "masked", "empty ranks", "one rank", "all empty")
MAX_DELAY_CYCLES = 2_000_000  # ~1 ms at 2 GHz: far below the GPU timeout (a delay, not a hang)
GPU_TIMEOUT_S = 20  # the buffers' num_gpu_timeout_secs: a missing peer traps after 20 s


@dataclasses.dataclass(frozen=True)
class Config:
    """One call configuration. `gemm`: bf16 expanded rows the expert GEMM ops can take
    (hidden a multiple of 128, square experts [L, hidden, hidden] so the output combines)."""

    experts: int
    topk: int
    hidden: int
    fp8: bool
    alignment: int
    expand: bool
    zero_padding: bool
    weights: bool
    biases: int
    tmax: int

    @property
    def gemm(self):
        return not self.fp8 and self.expand and self.hidden % 128 == 0 and \
            self.alignment in (64, 128) and self.hidden <= 1024

    def spec(self, ranks):
        """The runtime's kernel spec (timeout included: the buffers run with GPU_TIMEOUT_S)."""
        return dict(num_ranks=ranks, num_experts=self.experts, num_topk=self.topk,
                    hidden=self.hidden, dtype="f8E4M3FN" if self.fp8 else "bf16",
                    num_scale_packs=self.hidden // 128 if self.fp8 else 0,
                    expert_alignment=self.alignment, do_expand=self.expand,
                    num_max_tokens_per_rank=self.tmax, timeout_ms=GPU_TIMEOUT_S * 1000)


def configurations(ranks):
    """A fixed list drawn from seed 0 (the kernels compiled ahead are the ones the run asks
    for). Expert counts vary (1 to 8 local experts), so one buffer sees several layouts; a
    third of the list are GEMM-capable configurations."""
    rng = random.Random(0)
    out = []
    for i in range(NUM_CONFIGS):
        experts = ranks * rng.choice([1, 2, 4, 8])
        topk = rng.randint(1, min(KMAX, experts))
        gemm = i % 3 == 0
        fp8 = not gemm and rng.random() < 0.5
        if gemm:
            hidden = rng.choice([256, 512, 1024])
        else:
            hidden = 128 * rng.randint(2, HMAX // 128) if fp8 else 8 * rng.randint(32, HMAX // 8)
        expand = gemm or rng.random() < 0.5
        alignment = rng.choice([64, 128]) if gemm else (rng.choice([1, 4, 128]) if expand else 1)
        zero_padding, weights, biases = expand and rng.random() < 0.5, rng.random() < 0.5, \
            rng.randint(0, 2)
        tmax = rng.choice([TMAX, TMAX // 2])
        # The fused dispatch + GEMM takes the buffer's token cap (TMAX), not a per-call one.
        out.append(Config(experts, topk, hidden, fp8, alignment, expand, zero_padding, weights,
                          biases, TMAX if gemm else tmax))
    return out


def kernel_sets(config, ranks):
    """(spec, variant, kind) of every kernel set a step of `config` may launch."""
    spec, c = config.spec(ranks), config
    yield spec, dict(weights=c.weights, cached=False, zero_padding=c.zero_padding), "dispatch"
    yield spec, dict(weights=False, cached=True, zero_padding=c.zero_padding), "dispatch"
    yield spec, dict(weights=c.weights, biases=c.biases), "combine"
    if c.gemm:
        yield spec, dict(n=c.hidden, out_dtype="bf16"), "grouped_gemm"
        yield spec, dict(weights=c.weights, cached=False, zero_padding=c.zero_padding,
                         n=c.hidden, out_dtype="bf16"), "dispatch_gemm"
        yield spec, dict(biases=c.biases), "gemm_combine"


# --- the schedule ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    """A self-contained sequence of ops on one configuration (a dispatch first: the others need
    its handle). `ops`: the calls in order; `buffer`: "main" or "second"; `recreate`: that buffer
    is destroyed and made again before the step; `stream`: "current" (the plain call) or "comm"
    (DeepEP's async protocol on the buffer's communication stream); `delays`: GPU cycles each
    rank sleeps on the comm stream before the step (index = rank); `empty`: ranks sending no
    token; `target`: the rank every token goes to ("one rank")."""

    index: int
    config: int
    pattern: str
    ops: tuple
    buffer: str
    recreate: bool
    stream: str
    delays: tuple
    empty: tuple
    target: int


STEP_KINDS = {  # op sequences; the GEMM ones need Config.gemm
    "round trip": ("dispatch", "combine"),
    "cached": ("dispatch", "cached dispatch", "combine"),
    "cached twice": ("dispatch", "cached dispatch", "cached dispatch", "combine"),
    "dispatch only": ("dispatch",),
    "grouped gemm": ("dispatch", "grouped_gemm", "combine"),
    "fused dispatch": ("dispatch_gemm", "grouped_gemm", "combine"),
    "fused combine": ("dispatch", "grouped_gemm", "gemm_combine"),
    "both fused": ("dispatch_gemm", "grouped_gemm", "gemm_combine"),
}
GEMM_KINDS = ("grouped gemm", "fused dispatch", "fused combine", "both fused")


def schedule(seed, num_ops, configs, ranks):
    """The steps of a run: at least `num_ops` ops. A function of (seed, num_ops, configs, ranks)
    only: every rank computes the same list."""
    rng = random.Random(f"epic-stress/{seed}")
    steps, count = [], 0
    while count < num_ops:
        i = len(steps)
        c = rng.randrange(len(configs))
        kinds = [k for k in STEP_KINDS if configs[c].gemm or k not in GEMM_KINDS]
        # GEMM-capable configurations run a GEMM step most of the time (they are few).
        kind = rng.choice(GEMM_KINDS) if configs[c].gemm and rng.random() < 0.7 else \
            rng.choice(kinds)
        pattern = rng.choice(PATTERNS)
        empty = tuple(sorted(rng.sample(range(ranks), max(1, ranks // 2)))) \
            if pattern == "empty ranks" else tuple(range(ranks)) if pattern == "all empty" else ()
        delays = tuple(rng.randrange(MAX_DELAY_CYCLES) if rng.random() < 0.5 else 0
                       for _ in range(ranks))
        steps.append(Step(i, c, pattern, STEP_KINDS[kind],
                          "second" if rng.random() < 0.25 else "main",
                          rng.random() < 0.02, rng.choice(("current", "comm")), delays, empty,
                          rng.randrange(ranks)))
        count += len(STEP_KINDS[kind])
    return steps


def digest(steps, configs):
    """A short hash of a schedule: the ranks compare theirs before the first op."""
    return hashlib.sha256(repr((configs, steps)).encode()).hexdigest()[:16]


def disagreement(digests):
    """None if every rank's digest is the same, else a message naming the ranks that differ."""
    if len(set(digests)) <= 1:
        return None
    return "ranks took different schedules: " + ", ".join(
        f"rank {r} {d}" for r, d in enumerate(digests))


def rank_rng(seed, step, rank, what):
    """Rank `rank`'s data of a step (any process can rebuild it for any rank)."""
    return np.random.default_rng([seed, step, rank, what])


def routing(rng, step, config, ranks, rank):
    """Rank `rank`'s token count and top-k ids under the step's pattern."""
    tokens = 0 if rank in step.empty else int(rng.integers(0, config.tmax + 1))
    E, K = config.experts, config.topk
    local = E // ranks
    if step.pattern == "one rank":  # the first min(K, L) slots on one rank's experts
        idx = np.full((tokens, K), -1, np.int64)
        for row in range(tokens):
            picks = rng.permutation(local)[:min(K, local)] + step.target * local
            idx[row, :len(picks)] = picks
        return tokens, idx
    idx = np.array([rng.permutation(E)[:K] for _ in range(tokens)], np.int64).reshape(tokens, K)
    if step.pattern == "masked":
        idx[rng.random(idx.shape) < 0.3] = -1
    return tokens, idx


def op_counts(steps):
    counts = {}
    for s in steps:
        for op in s.ops:
            counts[op] = counts.get(op, 0) + 1
    return counts


# --- comparisons -------------------------------------------------------------------------------


def arrival_order(result):
    """`perm` with canonical row i = arrival row perm[i] for a kernel's DispatchResult in arrival
    order: epic.reference.sort_by_source applied to the row numbers (its own permutation, not a
    copy of it). Rows made in canonical order go to the kernel as `rows[perm]`'s inverse."""
    from epic import reference as ref

    n = result.recv_x.shape[0]
    numbered = dataclasses.replace(result, recv_x=np.arange(n, dtype=np.int64)[:, None],
                                   recv_scale_packs=None, recv_topk_idx=None,
                                   recv_topk_weights=None)
    return ref.sort_by_source(numbered).recv_x[:, 0]


def to_arrival(canonical_rows, perm):
    """Rows in canonical order, placed where the kernel's arrival order has them."""
    out = np.empty_like(canonical_rows)
    out[perm] = canonical_rows
    return out


# --- the watchdog ------------------------------------------------------------------------------


class Watchdog:
    """Bounds every op: `arm(what)` before it, `disarm()` after its results are on the host. An
    op still armed after `seconds` is reported (`what`, and every thread's stack) and the process
    exits with `code` through `exit` (os._exit: a hung CUDA call cannot be unwound)."""

    def __init__(self, seconds, exit=os._exit, code=3, out=sys.stderr, poll=0.5):
        self.seconds, self._exit, self.code, self.out, self.poll = seconds, exit, code, out, poll
        self._what, self._since = None, 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.fired = None
        self._thread = threading.Thread(target=self._watch, daemon=True, name="stress-watchdog")
        self._thread.start()

    def arm(self, what):
        with self._lock:
            self._what, self._since = what, time.monotonic()

    def disarm(self):
        with self._lock:
            self._what = None

    def stop(self):
        self._stop.set()
        self._thread.join()

    def _watch(self):
        while not self._stop.wait(self.poll):
            with self._lock:
                what, since = self._what, self._since
            if what is not None and time.monotonic() - since > self.seconds:
                self.fired = what
                print(f"stress: HANG: {what} did not finish in {self.seconds} s", file=self.out,
                      flush=True)
                try:
                    import faulthandler

                    faulthandler.dump_traceback(file=self.out, all_threads=True)
                except (ValueError, AttributeError, OSError):  # no file descriptor (tests)
                    pass
                self._exit(self.code)
                return
