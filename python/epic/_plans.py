"""The hot path of ElasticBuffer: plans of checked call signatures, and output pools.

A call's signature is everything its checks depend on: the op and its options, and every
tensor's shape, dtype, contiguity and device (never its address). The first call of a
signature is checked by the C++ runtime (every argument named) and becomes a plan there
(``epic._C.Plan``): its kernels loaded and its parameter table laid out. Every later call of
the signature only binds its tensors' addresses and launches (a few microseconds, no
allocation, no copy, CUDA-graph capturable); a changed shape is a new signature and is
checked again. The decode calls (dispatch without a handle or CPU sync, combine without biases,
on the current stream) skip even the adaptation that computes the key: a buffer keeps, per set
of options, a replay of the last checked call (``epic._dispatch._Replay``,
``epic._combine._Replay``) that compares the new call's tensors' signatures with that call's
and binds them to its plan, or hands the call to the checked path.

Outputs come from a pool of output sets per plan. A set is reused by a later call only when
nothing outside the pool references any of its tensors: no Python reference, no view, no
autograd use (the refcount rules of torch's CUDA-graph trees), so results held by the caller
are never overwritten. A set made while a CUDA graph is captured belongs to the graph (its
replays write it) and is never pooled. A pool keeps at most ``MAX_SETS`` sets; more calls in
flight get sets of their own, freed like any tensor.

A buffer's plans live in a ``PlanCache``: at most ``MAX_PLANS`` plans (least recently used
dropped first), and their pooled sets hold at most ``pool_bytes`` together (the sets of the
least recently used plans are released first; a set larger than the budget is not pooled).
Shapes that change every call (prefill, training) thus cost plans, not memory.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

from . import _tensors as T

__all__ = ["OpPlan", "OutputSet", "PlanCache", "MAX_SETS", "MAX_PLANS", "signature", "signatures",
           "zero_on_launch_stream"]

MAX_SETS = 2
MAX_PLANS = 256


def signature(t):
    """What the checks of tensor `t` depend on (None stays None); "not a torch tensor" for
    anything else (numpy arrays are checked on every call: they never reach a GPU)."""
    if t is None:
        return None
    try:
        return (t.shape, t.dtype, t.is_contiguous(), t.device)
    except AttributeError:
        return NotImplemented


def signatures(pairs):
    """The signatures of every rank's (slot name, tensor) pairs."""
    return tuple(tuple(signature(t) for _, t in p) for p in pairs)


def _refcounts(objects):
    """The refcount of each object (one code path for noting and for checking them, so the
    references this function itself holds are the same both times)."""
    return [sys.getrefcount(o) for o in objects]


class OutputSet:
    """The tensors one call writes, for every rank served: ``per_rank[r][name]``; ``results``
    is what the op hands out built from them (kept with the set). ``addresses`` is the flat
    address list the plan binds (every rank's slots), with the outputs' entries filled in; a
    call writes its inputs' entries."""

    __slots__ = ("per_rank", "results", "addresses", "nbytes", "_tensors", "_refs", "_uses",
                 "_objects", "_object_refs", "pooled", "sealed")

    def __init__(self, per_rank, slot_index, slots_per_rank, pooled):
        self.per_rank = per_rank
        self.results = None
        self.addresses = [0] * (slots_per_rank * len(per_rank))
        for r, tensors in enumerate(per_rank):
            for name, t in tensors.items():
                if name in slot_index:
                    self.addresses[r * slots_per_rank + slot_index[name]] = t.data_ptr()
        self._tensors = [t for tensors in per_rank for t in tensors.values()]
        self.nbytes = sum(_nbytes(t) for t in self._tensors)
        self._refs = self._uses = self._objects = self._object_refs = None
        self.pooled = pooled
        self.sealed = False

    def seal(self, results=None, holder=None):
        """After the set's first call: keeps what every call of it returns, if that is always
        the same (`results`, a list; `holder(result)`: the object of a result the caller may
        hold that holds tensors of the set, e.g. its handle), then notes the refcounts the
        pool alone holds. The caller holds no other reference to the set's tensors or those
        objects meanwhile (a temporary one would count as the pool's). The tensors' C++ use
        counts are noted too: views the results hold (a transposed scale tensor, a handle's
        rows of one tensor) hold their base, and a view the caller makes of them holds it too."""
        self.sealed = True
        self.results = results
        self._objects = [holder(r) for r in results] if holder else []
        self._refs = _refcounts(self._tensors)
        self._uses = [t._use_count() for t in self._tensors]
        self._object_refs = _refcounts(self._objects)

    def free(self):
        """Whether nothing outside the pool uses the set: its tensors (a reference, a view, an
        autograd graph) or the objects that hold them."""
        if (_refcounts(self._objects) != self._object_refs
                or _refcounts(self._tensors) != self._refs):
            return False
        for t, uses in zip(self._tensors, self._uses):
            if t._use_count() != uses or t.requires_grad:
                return False
        return True


class OpPlan:
    """A C++ plan with the slot layout of its op and its pool of output sets."""

    __slots__ = ("plan", "slot_index", "slots", "make_outputs", "sets", "cache", "_first", "sms")

    def __init__(self, plan, slot_names, make_outputs, first_outputs=None, cache=None, sms=0):
        self.plan = plan
        self.sms = sms  # the SMs (blocks per rank) its calls use, as DeepEP's handles report
        self.slot_index = {name: i for i, name in enumerate(slot_names)}
        self.slots = plan.slots_per_rank
        # () -> (per-rank dicts of new output tensors), for the pool to call.
        self.make_outputs = make_outputs
        self.sets = []
        self.cache = cache  # the PlanCache whose byte budget the pooled sets count against
        self._first = first_outputs  # the outputs the plan was checked with: the first set

    def take(self, capturing):
        """An output set for the next call: a free pooled one, else a new one."""
        if not capturing:
            for s in self.sets:
                if s.sealed and s.free():
                    return s
        outputs, self._first = self._first or self.make_outputs(), None
        s = OutputSet(outputs, self.slot_index, self.slots, False)
        if not capturing and len(self.sets) < MAX_SETS and \
                (self.cache is None or self.cache.admit(self, s.nbytes)):
            s.pooled = True
            self.sets.append(s)
        return s

    def release(self):
        """Drops the pooled sets (tensors the caller still holds stay valid: they are
        ordinary tensors); returns the bytes they held."""
        freed = sum(s.nbytes for s in self.sets)
        self.sets = []
        return freed

    def launch(self, outputs, inputs, stream):
        """Binds `inputs` (per rank, (slot name, tensor or address) pairs) and the outputs'
        addresses, and launches on `stream`."""
        addresses, index, slots = outputs.addresses, self.slot_index, self.slots
        for r, pairs in enumerate(inputs):
            base = r * slots
            for name, value in pairs:
                addresses[base + index[name]] = (
                    0 if value is None else value if isinstance(value, int) else value.data_ptr())
        self.plan.launch(addresses, stream)


class PlanCache:
    """A buffer's plans by signature, least recently used first, with the byte budget of
    their pooled output sets."""

    def __init__(self, pool_bytes, max_plans=MAX_PLANS):
        self.pool_bytes, self.max_plans = pool_bytes, max_plans
        self.pooled_bytes = 0
        self._plans = OrderedDict()

    def __len__(self):
        return len(self._plans)

    def keys(self):
        return list(self._plans.keys())

    def items(self):
        return list(self._plans.items())

    def get(self, key):
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        return plan

    def add(self, key, plan):
        plan.cache = self
        self._plans[key] = plan
        while len(self._plans) > self.max_plans:
            _, old = self._plans.popitem(last=False)
            self.pooled_bytes -= old.release()
            old.cache = _NO_POOL  # a caller may still run it (its later sets are not pooled)

    def admit(self, plan, nbytes):
        """Whether `plan` may pool a new set of `nbytes`: other plans' sets are released,
        least recently used first, until it fits in the budget."""
        if nbytes > self.pool_bytes:
            return False
        for other in self._plans.values():
            if self.pooled_bytes + nbytes <= self.pool_bytes:
                break
            if other is not plan:
                self.pooled_bytes -= other.release()
        if self.pooled_bytes + nbytes > self.pool_bytes:
            return False
        self.pooled_bytes += nbytes
        return True

    def clear(self):
        for plan in self._plans.values():
            plan.release()
        self._plans.clear()
        self.pooled_bytes = 0


_NO_POOL = PlanCache(pool_bytes=0)


def _nbytes(t):
    try:
        return t.numel() * t.element_size()
    except AttributeError:  # what the pool's tests stand in for tensors with
        return getattr(t, "nbytes", 0)


def zero_on_launch_stream(tensors, streams):
    """Zeroes `tensors` where the kernels will run. `streams`: None (the current stream), or
    (compute, comm) under DeepEP's stream protocol, where the communication stream waits for
    `previous_event` only: a zero written on the compute stream could land after the kernels
    wrote their rows."""
    if streams is None:
        for t in tensors:
            t.fill(0) if not T.is_torch(t) else t.zero_()
        return
    import torch

    comm = streams[1]
    with torch.cuda.stream(comm):
        for t in tensors:
            t.zero_()
            t.record_stream(comm)  # the caller may drop it while the kernels still write it
