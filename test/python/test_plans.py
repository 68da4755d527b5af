"""epic._plans without a GPU: what a plan's key depends on, and the output pool's reuse rules
(a set is handed out again only when nothing outside the pool holds any of its tensors)."""

import gc

import numpy as np

from epic import _plans


class FakeTensor:
    """What the pool reads of a torch tensor: its address, its C++ use count (views and
    autograd hold the TensorImpl) and whether autograd tracks it."""

    def __init__(self, address, shape=(4, 8), dtype="bf16", contiguous=True, device="cuda:0"):
        self.address, self.shape, self.dtype, self.device = address, shape, dtype, device
        self.contiguous, self.uses, self.requires_grad = contiguous, 1, False

    def data_ptr(self):
        return self.address

    def _use_count(self):
        return self.uses

    def is_contiguous(self):
        return self.contiguous


class FakePlan:
    slots_per_rank = 3

    def __init__(self):
        self.launches = []

    def launch(self, addresses, stream):
        self.launches.append((list(addresses), stream))


def make_plan():
    made = []

    def outputs():
        made.append(1)
        base = 0x1000 * len(made)
        return [{"out": FakeTensor(base), "counts": FakeTensor(base + 0x100)}]

    plan = _plans.OpPlan(FakePlan(), ["x", "out", "counts"], outputs)
    return plan, made


def call(plan, x, results_of=None, capturing=False):
    """One call: a set taken, the input bound, launched, sealed on first use (keeping the
    objects `results_of` makes, as a dispatch keeps its handles)."""
    out = plan.take(capturing)
    plan.launch(out, [[("x", x)]], stream=7)
    if not out.sealed:
        out.seal(*((results_of(out), lambda r: r) if results_of else ()))
    return out


def test_the_key_holds_everything_the_checks_read():
    t = FakeTensor(0x100)
    assert _plans.signature(t) == ((4, 8), "bf16", True, "cuda:0")
    for other in (FakeTensor(0x100, shape=(5, 8)), FakeTensor(0x100, dtype="f16"),
                  FakeTensor(0x100, contiguous=False), FakeTensor(0x100, device="cuda:1")):
        assert _plans.signature(other) != _plans.signature(t)
    assert _plans.signature(FakeTensor(0x999)) == _plans.signature(t)  # not the address
    assert _plans.signature(None) is None
    assert _plans.signature(np.zeros(3)) is NotImplemented  # checked on every call


def test_inputs_and_outputs_are_bound_by_slot():
    plan, _ = make_plan()
    out = call(plan, FakeTensor(0xA00))
    assert plan.plan.launches[0] == ([0xA00, 0x1000, 0x1100], 7)
    assert out.per_rank[0]["out"].address == 0x1000


def test_a_set_is_reused_only_when_nothing_holds_it():
    plan, made = make_plan()
    held = call(plan, FakeTensor(0xA00)).per_rank[0]["out"]  # the caller keeps a result
    second = call(plan, FakeTensor(0xA00))
    assert len(made) == 2 and second.per_rank[0]["out"] is not held
    del held
    gc.collect()
    third = call(plan, FakeTensor(0xA00))
    assert len(made) == 2  # the first set again
    assert third.per_rank[0]["out"].address == 0x1000


def test_views_and_autograd_keep_a_set_busy():
    plan, made = make_plan()
    first = call(plan, FakeTensor(0xA00)).per_rank[0]
    first["out"].uses = 2  # a view of it lives (it holds the TensorImpl)
    second = call(plan, FakeTensor(0xA00)).per_rank[0]["out"]  # held by the caller
    assert len(made) == 2
    first["out"].uses = 1
    first["counts"].requires_grad = True  # handed to autograd
    del first
    call(plan, FakeTensor(0xA00))
    assert len(made) == 3 and second  # neither pooled set was free: a set of its own


def test_views_the_results_keep_are_the_pools_own():
    """A set whose kept results hold a view of a tensor (a transposed scale tensor, a handle's
    row of one tensor) counts that view's use as its own: free while nothing else uses the
    tensor, busy while a caller's view of it lives."""
    plan, made = make_plan()

    def with_view(s):
        s.per_rank[0]["out"].uses = 2  # the view the results keep
        return [object()]

    first = call(plan, FakeTensor(0xA00), with_view).per_rank[0]  # the set's own dict
    call(plan, FakeTensor(0xA00))
    assert len(made) == 1  # free again: the view is the pool's
    first["out"].uses = 3  # a caller made a view of the results' view
    call(plan, FakeTensor(0xA00))
    assert len(made) == 2
    first["out"].uses = 2
    call(plan, FakeTensor(0xA00))
    assert len(made) == 2


def test_results_kept_with_the_set_are_watched():
    """A set that keeps the objects it returns (a dispatch's handles) is busy while the
    caller holds one of them, though the tensors' refcounts do not move."""
    class Handle:
        def __init__(self, tensors):
            self.tensors = tensors

    def handles(s):
        return [Handle(list(s.per_rank[0].values()))]

    # A temporary reference while the set is sealed (the results of the call being made)
    # must not count as the pool's: here the helper's `results_of(out)` list is one.

    plan, made = make_plan()
    handle = call(plan, FakeTensor(0xA00), handles).results[0]
    call(plan, FakeTensor(0xA00), handles)
    assert len(made) == 2
    del handle
    gc.collect()
    call(plan, FakeTensor(0xA00))
    assert len(made) == 2


def test_sets_made_while_capturing_belong_to_the_graph():
    plan, made = make_plan()
    captured = call(plan, FakeTensor(0xA00), capturing=True)
    assert not captured.pooled and plan.sets == []
    del captured
    call(plan, FakeTensor(0xA00))
    call(plan, FakeTensor(0xA00), capturing=True)  # a free pooled set is not taken either
    assert len(made) == 3


def test_the_pool_is_bounded():
    plan, made = make_plan()
    sets, held = [], []
    for _ in range(_plans.MAX_SETS + 2):  # the caller keeps every call's results
        sets.append(call(plan, FakeTensor(0xA00)))
        held.append(sets[-1].per_rank[0]["out"])
    assert len(made) == _plans.MAX_SETS + 2 and len(plan.sets) == _plans.MAX_SETS
    assert [s.pooled for s in sets] == [True] * _plans.MAX_SETS + [False, False]


class SizedTensor(FakeTensor):
    nbytes = 1000


def sized_plan(cache, key):
    made = []

    def outputs():
        made.append(1)
        return [{"out": SizedTensor(0x1000 * len(made))}]

    plan = _plans.OpPlan(FakePlan(), ["x", "out"], outputs)
    cache.add(key, plan)
    return plan, made


def test_pooled_bytes_stay_within_the_budget_least_recent_plans_released_first():
    cache = _plans.PlanCache(pool_bytes=2500)
    a, _ = sized_plan(cache, "a")
    b, _ = sized_plan(cache, "b")
    c, _ = sized_plan(cache, "c")
    call(a, FakeTensor(0xA00))
    call(b, FakeTensor(0xA00))
    assert cache.pooled_bytes == 2000 and len(a.sets) == len(b.sets) == 1
    assert cache.get("a") is a  # now b is the least recently used
    call(c, FakeTensor(0xA00))
    assert cache.pooled_bytes == 2000 and len(b.sets) == 0 and len(a.sets) == len(c.sets) == 1


def test_a_set_larger_than_the_budget_is_not_pooled():
    cache = _plans.PlanCache(pool_bytes=999)
    a, made = sized_plan(cache, "a")
    first = call(a, FakeTensor(0xA00))
    assert not first.pooled and a.sets == [] and cache.pooled_bytes == 0
    del first
    call(a, FakeTensor(0xA00))
    assert len(made) == 2  # every call allocates


def test_the_plan_count_is_bounded():
    cache = _plans.PlanCache(pool_bytes=10**6, max_plans=3)
    plans = [sized_plan(cache, k)[0] for k in "abcd"]
    for p in plans:
        call(p, FakeTensor(0xA00))
    assert len(cache) == 3 and cache.get("a") is None and cache.get("d") is plans[3]
    assert cache.pooled_bytes == 3000  # "a" was dropped: its set is not pooled
    assert plans[0].sets == [] and all(len(p.sets) == 1 for p in plans[1:])
