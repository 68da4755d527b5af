"""The decode-call replays without a GPU (epic._dispatch._Replay, epic._combine._Replay): a
later call replays a checked call only when it is that call with other tensors of the same
signatures; any other call is handed back (None) to the checked path, which names what is
wrong. Replays hold no reference the output pool would count."""

import gc
import sys

import pytest

from epic import _combine, _dispatch, _plans
from epic.buffer import ElasticBuffer
from test_plans import FakeTensor

R = 2
INPUT_SLOTS = ["x", "x_scale_packs", "topk_weights", "topk_idx"]


class FakeRuntimePlan:
    def __init__(self, slots):
        self.slots_per_rank, self.launches = slots, []

    def launch(self, addresses, stream):
        self.launches.append((list(addresses), stream))


class FakeBuffer:
    """What the replays read of an ElasticBuffer (a virtual world of R ranks)."""
    virtual, num_ranks, deterministic = True, R, False

    def __init__(self):
        self._plans = _plans.PlanCache(pool_bytes=10**6)

    def _current_stream(self):
        return 7

    _replay_ranks = ElasticBuffer._replay_ranks  # the real adaptation of per-rank lists
    _ranks_out = ElasticBuffer._ranks_out

    def _finish(self, streams, async_with_compute_stream, outputs):
        return "event"


@pytest.fixture(autouse=True)
def not_capturing(monkeypatch):
    monkeypatch.setattr(_dispatch, "_capturing", lambda: False)
    monkeypatch.setattr(_combine, "_capturing", lambda: False)


def inputs(base, hidden=8, fp8=False, weights=True):
    x = [FakeTensor(base + 0x10 * r, (4, hidden), "f8" if fp8 else "bf16") for r in range(R)]
    if fp8:
        x = [(t, FakeTensor(base + 0x100 + r, (4, 2), "f32")) for r, t in enumerate(x)]
    idx = [FakeTensor(base + 0x200 + r, (4, 2), "i64") for r in range(R)]
    w = [FakeTensor(base + 0x300 + r, (4, 2), "f32") for r in range(R)] if weights else None
    return x, idx, w


def dispatch_replay(fp8=False):
    """A buffer whose plan of the inputs' signatures is checked, with a pooled set sealed
    with its results (what the checked path leaves), and the replay of that call."""
    b = FakeBuffer()
    x, idx, w = inputs(0x1000, fp8=fp8)
    pairs = [_dispatch._input_pairs(*(xr if fp8 else (xr, None)), wr, ir)
             for xr, ir, wr in zip(x, idx, w)]
    slots = INPUT_SLOTS + ["recv_x"]
    made = [{"recv_x": FakeTensor(0x9000 + r)} for r in range(R)]
    plan = _plans.OpPlan(FakeRuntimePlan(len(slots)), slots, lambda: None, made)
    b._plans.add("key", plan)
    out = plan.take(False)
    out.seal([(o["recv_x"], None, None, f"handle {r}") for r, o in enumerate(out.per_rank)])
    call = _dispatch._Call(None, {}, 8, 1, True, False, False, False)
    return b, plan, _dispatch._Replay("key", call, fp8, _plans.signatures(pairs))


@pytest.mark.parametrize("fp8", [False, True])
def test_a_dispatch_of_the_checked_signatures_binds_its_tensors_and_launches(fp8):
    b, plan, replay = dispatch_replay(fp8)
    x, idx, w = inputs(0x5000, fp8=fp8)  # other addresses, the same signatures
    recv_x, _, _, handles, event = replay(b, x, idx, w)
    addresses, stream = plan.plan.launches[-1]
    assert stream == 7 and event == "event" and handles == ["handle 0", "handle 1"]
    for r in range(R):
        row = addresses[r * 5:(r + 1) * 5]
        data, packs = x[r] if fp8 else (x[r], None)
        assert row == [data.address, packs.address if fp8 else 0, w[r].address, idx[r].address,
                       0x9000 + r]
        assert recv_x[r].address == 0x9000 + r


@pytest.mark.parametrize("change", [
    lambda x, idx, w: (x, idx, [w[0], FakeTensor(0x1, (4, 3), "f32")]),  # a new shape
    lambda x, idx, w: (x, [idx[0], FakeTensor(0x1, (4, 2), "i32")], w),  # a new dtype
    lambda x, idx, w: ([x[0], FakeTensor(0x1, (4, 8), contiguous=False)], idx, w),
    lambda x, idx, w: ([x[0], FakeTensor(0x1, (4, 8), device="cuda:1")], idx, w),
    lambda x, idx, w: (x, idx, None),  # weights dropped
    lambda x, idx, w: (x, idx, [w[0], None]),  # weights of one rank only
    lambda x, idx, w: (x[:1], idx, w),  # a rank missing
    lambda x, idx, w: (tuple(x), idx, w),  # not a list
    lambda x, idx, w: ([x[0], "tokens"], idx, w),  # not a tensor
    lambda x, idx, w: ([(x[0], x[0])] + x[1:], idx, w),  # an FP8 tuple to a bf16 call
])
def test_any_other_dispatch_goes_to_the_checked_path(change):
    b, plan, replay = dispatch_replay()
    assert replay(b, *change(*inputs(0x5000))) is None
    assert plan.plan.launches == []


def test_a_dispatch_whose_plan_was_dropped_goes_to_the_checked_path():
    b, plan, replay = dispatch_replay()
    b._plans.clear()
    assert replay(b, *inputs(0x5000)) is None and plan.plan.launches == []


class Handle:
    """Stands in for an EPHandle: its tensors, bound after x and the weights."""

    def __init__(self, base):
        self.tensors = [FakeTensor(base + i) for i in range(2)]

    def _bindings(self):
        return [("h0", self.tensors[0]), ("h1", self.tensors[1])]


def combine_replay():
    b = FakeBuffer()
    handles = [Handle(0x7000 + 0x10 * r) for r in range(R)]
    x, _, w = inputs(0x1000)
    pairs = [[("x", xr), ("topk_weights", wr)] + h._bindings()
             for xr, wr, h in zip(x, w, handles)]
    slots = ["x", "topk_weights", "h0", "h1", "combined_x"]
    plan = _plans.OpPlan(FakeRuntimePlan(len(slots)), slots,
                         lambda: [{"combined_x": FakeTensor(0x8800 + r)} for r in range(R)])
    b._plans.add("key", plan)
    replay = _combine._Replay("key", pairs)
    replay.add(handles)
    return b, plan, replay, handles


def test_a_combine_of_a_known_handle_binds_its_tensors():
    b, plan, replay, handles = combine_replay()
    x, _, w = inputs(0x5000)
    combined, _, _ = replay(b, x, handles, w)
    addresses, _ = plan.plan.launches[-1]
    assert addresses[:5] == [x[0].address, w[0].address, 0x7000, 0x7001, combined[0].address]


def test_a_combine_of_another_handle_or_signature_goes_to_the_checked_path():
    b, plan, replay, handles = combine_replay()
    x, _, w = inputs(0x5000)
    assert replay(b, x, [Handle(0x7000), handles[1]], w) is None  # a handle never checked
    assert replay(b, x, handles, None) is None  # weights dropped
    assert replay(b, x, handles[:1], w) is None
    assert replay(b, [x[0], FakeTensor(0x1, (5, 8))], handles, w) is None
    assert plan.plan.launches == []


def test_a_combine_replay_holds_no_reference_to_its_handles():
    b, plan, replay, _ = combine_replay()
    handles = [Handle(0x7200 + r) for r in range(R)]
    h = handles[0]
    before = sys.getrefcount(h)
    replay.add(handles)
    after = sys.getrefcount(h)  # (outside the assert: pytest's rewrite holds its operands)
    assert after == before  # the pool's refcount rule sees nothing
    del h
    first_id = id(handles[0])
    del handles
    gc.collect()
    others = [Handle(0x7100 + r) for r in range(R)]
    if id(others[0]) == first_id:  # the address reused: the dead reference still misses
        assert replay(b, inputs(0x5000)[0], others, inputs(0x5000)[2]) is None
    assert len(replay.known) == 2


def test_a_combine_replay_knows_a_bounded_number_of_handles():
    b, plan, replay, handles = combine_replay()
    kept = [[Handle(0x100 * i + r) for r in range(R)] for i in range(6)]
    for hs in kept:
        replay.add(hs)
    assert len(replay.known) == _combine._Replay.MAX_KNOWN
    x, _, w = inputs(0x5000)
    assert replay(b, x, handles, w) is None  # the oldest were forgotten
    assert replay(b, x, kept[-1], w) is not None
