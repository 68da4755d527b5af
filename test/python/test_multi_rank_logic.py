"""The multi-rank tests' pure logic without a GPU: the stress test's schedule is one for all
ranks, its comparisons' row permutation is right, its watchdog turns a hang into an exit naming
the op; bench/ep_multi_gpu.py takes one retry decision for all ranks, fails on a difference
from the all-to-all and fits its SM counts into the buffer."""

import dataclasses
import os
import sys
import threading
import types

import numpy as np
import pytest

from epic import reference as ref

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import stress_plan as P  # noqa: E402


def test_every_rank_derives_the_same_schedule_and_data():
    for ranks in (1, 4):
        configs = P.configurations(ranks)
        # What each rank computes on its own: equal, and not a function of the rank.
        digests = [P.digest(P.schedule(7, 1000, P.configurations(ranks), ranks), configs)
                   for _ in range(ranks)]
        assert P.disagreement(digests) is None
        steps = P.schedule(7, 1000, configs, ranks)
        assert sum(len(s.ops) for s in steps) >= 1000
        assert P.schedule(8, 1000, configs, ranks) != steps  # the seed decides
        counts = P.op_counts(steps)
        for op in ("dispatch", "cached dispatch", "combine", "grouped_gemm", "dispatch_gemm",
                   "gemm_combine"):
            assert counts.get(op, 0) > 0, op
        assert len({configs[s.config].experts for s in steps}) > 1  # one buffer, many layouts
        assert any(s.recreate for s in steps) and any(s.buffer == "second" for s in steps)
        assert any(s.empty for s in steps) and any(any(s.delays) for s in steps)
        for s in steps:
            assert s.ops[0] in ("dispatch", "dispatch_gemm")  # the others need its handle
            assert configs[s.config].gemm or not {"grouped_gemm", "gemm_combine"} & set(s.ops)
    # A rank's data is rebuilt alike by every process.
    a, b = P.rank_rng(1, 3, 2, 0).standard_normal(4), P.rank_rng(1, 3, 2, 0).standard_normal(4)
    assert (a == b).all() and not (a == P.rank_rng(1, 3, 1, 0).standard_normal(4)).all()


def test_a_rank_with_another_schedule_is_named():
    configs = P.configurations(2)
    mine, theirs = (P.digest(P.schedule(seed, 100, configs, 2), configs) for seed in (1, 2))
    assert P.disagreement([mine, theirs]) == f"ranks took different schedules: rank 0 {mine}, " \
                                              f"rank 1 {theirs}"


def test_every_kernel_set_is_one_the_runtime_compiles(tmp_path, monkeypatch):
    _C = pytest.importorskip("epic._C")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    runtime = _C.Runtime("virtual", "", "")
    config = next(c for c in P.configurations(2) if c.gemm)
    for spec, variant, kind in P.kernel_sets(config, 2):
        runtime.kernels(spec, variant, kind)


@pytest.mark.parametrize("expand", [False, True])
def test_arrival_order_maps_canonical_rows_to_a_kernels_order(expand):
    """A kernel's rows come in arrival order: rows made in the reference's canonical order and
    placed with to_arrival(arrival_order(...)) combine to the reference's result."""
    rng = np.random.default_rng(0)
    R, E, K, H, T = 3, 12, 3, 16, 9
    idxs = [np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64)
            for _ in range(R)]
    xs = [rng.standard_normal((T, H)).astype(ref.bfloat16) for _ in range(R)]
    expected = ref.dispatch(xs, idxs, num_experts=E, num_max_tokens_per_rank=T,
                            expert_alignment=4 if expand else 1, expand=expand)
    ys = [rng.standard_normal(e.recv_x.shape).astype(ref.bfloat16) for e in expected]
    want = ref.combine(ys, expected)
    arrived = [shuffled(e, rng) for e in expected]
    placed = [P.to_arrival(y, P.arrival_order(a)) for y, a in zip(ys, arrived)]
    for w, g in zip(want, ref.combine(placed, arrived)):
        assert w.combined_x.tobytes() == g.combined_x.tobytes()
    for e, a in zip(expected, arrived):  # and the permutation sorts the kernel's rows
        perm = P.arrival_order(a)
        assert a.recv_x[perm].tobytes() == ref.sort_by_source(a).recv_x.tobytes()
        assert sorted(perm.tolist()) == list(range(len(perm)))
        assert e.recv_x.tobytes() == ref.sort_by_source(a).recv_x.tobytes()


def shuffled(result, rng):
    """`result` in a random arrival order (rows and the metadata that points at them)."""
    meta = result.recv_src_metadata.copy()
    if not result.expand:
        order = rng.permutation(len(meta))
        return dataclasses.replace(result, recv_x=result.recv_x[order],
                                   recv_topk_idx=result.recv_topk_idx[order],
                                   recv_src_metadata=meta[order])
    # Expanded: rows permuted inside each expert's block of real rows; metadata rewritten.
    perm = np.arange(len(result.recv_x))
    for start, count in zip(result.expert_starts(), result.num_unaligned_recv_tokens_per_expert):
        perm[start:start + count] = start + rng.permutation(int(count))
    new_of_old = np.empty_like(perm)
    new_of_old[perm] = np.arange(len(perm))
    slots = meta[:, 2:]
    meta[:, 2:] = np.where(slots >= 0, new_of_old[np.maximum(slots, 0)], -1)
    order = rng.permutation(len(meta))
    return dataclasses.replace(result, recv_x=result.recv_x[perm], recv_src_metadata=meta[order])


def test_the_watchdog_names_a_hung_op_and_exits():
    exits, out = [], types.SimpleNamespace(text="")
    out.write = lambda s: setattr(out, "text", out.text + s)
    out.flush = lambda: None
    done = threading.Event()
    dog = P.Watchdog(0.2, exit=lambda code: (exits.append(code), done.set()), out=out, poll=0.02)
    dog.arm("step 3 op 1 (combine)")
    dog.disarm()  # a finished op is not reported
    dog.arm("step 4 op 0 (dispatch)")
    assert done.wait(5)
    assert exits == [3] and dog.fired == "step 4 op 0 (dispatch)"
    assert "HANG: step 4 op 0 (dispatch) did not finish in 0.2 s" in out.text
    dog.stop()


# --- bench/ep_multi_gpu.py -----------------------------------------------------------------------


class FakeTorch:
    """What ep_bench.Timer touches: CUDA events, a flush buffer, synchronize; and a profiler
    whose records a test drops."""

    def __init__(self, rank, lose):
        self.rank, self.lose, self.calls, self.attempt = rank, lose, 0, 0
        fake = self

        class Event:
            def __init__(self, **_):
                pass

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 1.0

        self.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)
        self.uint8 = "uint8"

        class Profile:
            def __init__(self, activities, acc_events=False):
                fake.attempt += 1

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def events(self):
                if fake.attempt in fake.lose:  # this rank's profiler lost every record
                    return []
                return [types.SimpleNamespace(name="k", device_time_total=5.0)] * 10

        self.profiler = types.SimpleNamespace(ProfilerActivity=types.SimpleNamespace(CUDA=1),
                                              profile=Profile)

    def empty(self, *args, **kwargs):
        return types.SimpleNamespace(fill_=lambda v: None)


def two_ranks(monkeypatch, lose, agreed):
    """Timer.kernels on two simulated ranks (threads); rank 0's profiler loses the records of
    the attempts in `lose`. Returns each rank's number of timed calls."""
    import ep_bench

    barrier, votes = threading.Barrier(2, timeout=5), [None, None]

    def agree_of(rank):
        def agree(ok):  # an all-reduce MIN over two ranks
            votes[rank] = ok
            barrier.wait()
            everyone = all(votes)
            barrier.wait()
            return everyone
        return agree

    fakes = [FakeTorch(r, lose if r == 0 else ()) for r in range(2)]
    # kernels() imports torch.profiler: one fake module that answers with the thread's rank's.
    local = threading.local()
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "torch.profiler", types.SimpleNamespace(
        ProfilerActivity=types.SimpleNamespace(CUDA=1),
        profile=lambda *a, **k: local.fake.profiler.profile(*a, **k)))

    def rank(r):
        local.fake = fake = fakes[r]
        timer = ep_bench.Timer(fake, 10, agree=agree_of(r) if agreed else None)
        try:
            timer.kernels(lambda: setattr(fake, "calls", fake.calls + 1), ["k"], attempts=3)
        except RuntimeError:  # no buffer to fall back on: not what is tested here
            pass
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return [f.calls for f in fakes]


def test_a_lost_profile_is_retried_by_every_rank_together(monkeypatch):
    pytest.importorskip("epic._C")  # ep_bench imports the extension
    # One decision: both ranks repeat, the same calls in the same order (on real ranks each
    # call is a collective: a rank that repeats alone dispatches while the others combine).
    assert two_ranks(monkeypatch, {1}, agreed=True) == [20, 20]


def test_a_difference_from_the_all_to_all_fails_the_run():
    pytest.importorskip("epic._C")
    import ep_multi_gpu as M

    row = dict(tokens=4096, sms=24, equal_to_all_to_all=True)
    same = [dict(rank=0, rows=[row, dict(tokens=4096, baseline="all_to_all_single")]),
            dict(rank=1, rows=[row])]
    assert M.equality_failures(same) == []
    bad = dict(row, equal_to_all_to_all=False, differs=["received rows", "combined tokens"])
    everyone = same[:1] + [dict(rank=1, rows=[bad, dict(bad, sms=64)])]
    assert M.equality_failures(everyone) == [
        "rank 1, 4096 tokens: received rows, combined tokens differ from all_to_all_single's"]


def test_sm_counts_fit_the_buffer():
    pytest.importorskip("epic._C")
    import ep_multi_gpu as M

    # One H200, a buffer of 64 blocks: the analytic 132 cannot run; it is timed at 64, said so.
    sms, notes = M.fit_sms([0, 24, 64], 132, 64)
    assert sms == [24, 64] and notes == [
        "132 SMs (analytic) exceed the buffer's 64 blocks per rank: timed with 64"]
    assert M.fit_sms([0, 24, 64], 20, 132) == ([20, 24, 64], [])
