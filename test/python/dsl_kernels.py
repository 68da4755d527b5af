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
def ring_nvlink(win, out, N: el.constexpr):
    """ring without GIN (what the nccl backend runs): stores through the next rank's pointer,
    then a release signal."""
    me, R = el.rank(), el.num_ranks()
    data = (win + 8).to(el.int32)
    offsets = el.arange(0, N)
    el.store(data + N + offsets, me * 100 + offsets)
    nxt = (me + 1) % R
    el.store(el.peer_ptr(data, nxt) + offsets, el.load(data + N + offsets))
    el.signal(el.peer_ptr(win.to(el.int64), nxt))
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


@epic.jit
def copy_in_parts(src, dst, n, BLOCK: el.constexpr, PARTS: el.constexpr):
    """Copies n elements PARTS blocks at a time, every part loaded before the first store (the
    tuples of an el.static_range hold the parts)."""
    for start in range(0, n, PARTS * BLOCK):
        cols, parts = (), ()
        for u in el.static_range(PARTS):
            cols += (start + u * BLOCK + el.arange(0, BLOCK),)
            parts += (el.load(src + cols[u], mask=cols[u] < n),)
        for u in el.static_range(PARTS):
            el.store(dst + cols[u], parts[u], mask=cols[u] < n)


# Calls between @epic.jit functions: inlined by the compiler, run in place by the interpreter.
@epic.jit
def twice(x):
    return x * 2


@epic.jit
def offsets_of(start, BLOCK: el.constexpr):
    """The block [start, start + BLOCK) (a constexpr parameter)."""
    return start + el.arange(0, BLOCK)


@epic.jit
def split_at(x, limit):
    """x's elements below the limit and the others, each zero elsewhere (a tuple)."""
    below = x < limit
    return el.where(below, x, 0.0), el.where(below, 0.0, x)


@epic.jit
def load_part(ptr, start, n, BLOCK: el.constexpr):
    """The columns [start, start + BLOCK) and the elements there (a helper calling one)."""
    cols = offsets_of(start, BLOCK=BLOCK)
    return cols, el.load(ptr + cols, mask=cols < n, other=0.0)


@epic.jit
def split_doubled(x_ptr, lo_ptr, hi_ptr, n, limit, BLOCK: el.constexpr):
    """2x, split at the limit into lo (below) and hi (the rest)."""
    cols, x = load_part(x_ptr, el.program_id(0) * BLOCK, n, BLOCK)
    lo, hi = split_at(twice(x), limit)
    el.store(lo_ptr + cols, lo, mask=cols < n)
    el.store(hi_ptr + cols, hi, mask=cols < n)


@epic.jit
def sum_doubled(x_ptr, out_ptr, n, BLOCK: el.constexpr):
    """The sum of 2x over n elements (calls in a loop, their results carried)."""
    acc = el.zeros((BLOCK,), el.float32)
    for start in range(0, n, BLOCK):
        cols, x = load_part(x_ptr, start, n, BLOCK=BLOCK)
        acc += twice(x)
    el.store(out_ptr, el.sum(acc))


# Calls the compiler refuses (the interpreter refuses the same ones): the errors name
# the lines that say so.
@epic.jit
def countdown(x_ptr, n):
    if n > 0:
        countdown(x_ptr, n - 1)  # the line the error names
    el.store(x_ptr, n)


@epic.jit
def calls_countdown(x_ptr, n):
    countdown(x_ptr, n)  # the call site


@epic.jit
def returns_early(x):
    if x > 0:
        return x  # the line the error names
    return 0


@epic.jit
def calls_returns_early(x_ptr):
    el.store(x_ptr, returns_early(el.load(x_ptr)))


@epic.jit
def calls_with_too_many(x_ptr):
    el.store(x_ptr, twice(el.load(x_ptr), 3))  # the line the error names


@epic.jit
def passes_a_value_as_constexpr(x_ptr):
    el.store(x_ptr + offsets_of(0, el.load(x_ptr)), 1)  # the line the error names


def line_of(kernel, text):
    """The line of `kernel`'s source file where its first line holding `text` is."""
    import inspect

    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)
