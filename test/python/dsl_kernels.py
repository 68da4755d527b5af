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
