"""@epic.jit kernels shared by the interpreter's and the compiler's tests: the same source runs
on the CPU and compiles to PTX."""

import epic
import epic.language as el


@epic.jit
def scale(x_ptr, y_ptr, n, factor, BLOCK: el.constexpr):
    offsets = el.program_id(0) * BLOCK + el.arange(0, BLOCK)
    mask = offsets < n
    el.store(y_ptr + offsets, el.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


@epic.jit
def ring(win, out, N: el.constexpr):
    """Every rank puts its block into the next rank's window and signals; waits for its own."""
    me, R = el.rank(), el.num_ranks()
    data = (win + 8).to(el.int32)
    offsets = el.arange(0, N)
    el.store(data + N + offsets, me * 100 + offsets)  # the staging half
    nxt = (me + 1) % R
    el.put(el.peer_ptr(data, nxt), data + N, N, signal=el.peer_ptr(win.to(el.int64), nxt))
    el.wait(win.to(el.int64), 1)
    el.store(out + offsets, el.load(data + offsets))


@epic.jit
def take_slots(win, out):
    """Every program of every rank takes a slot from a counter on rank 0."""
    slot = el.atomic_add(el.peer_ptr(win.to(el.int32), 0), 1, scope="sys")
    el.store(out + el.program_id(0), slot)


@epic.jit
def exclusive_offsets(counts_ptr, out_ptr, n, BLOCK: el.constexpr):
    """Where each expert's rows start: the exclusive prefix sum of the counts."""
    i = el.arange(0, BLOCK)
    counts = el.load(counts_ptr + i, mask=i < n, other=0)
    el.store(out_ptr + i, el.cumsum(counts) - counts, mask=i < n)


@epic.jit
def claim_once(win, owner):
    """The first program of any rank to swap 0 -> its id owns the word on rank 0."""
    me = el.rank() * el.num_programs(0) + el.program_id(0)
    old = el.atomic_cas(el.peer_ptr(win.to(el.int32), 0), 0, me + 1, sem="acq_rel", scope="sys")
    el.store(owner + el.program_id(0), old)


@epic.jit
def halvings(x_ptr, out_ptr, limit):
    """How many halvings bring x under the limit (a data-dependent while loop)."""
    v = el.load(x_ptr)
    steps = 0
    while v > limit:
        v = v // 2
        steps += 1
    el.store(out_ptr, steps)
