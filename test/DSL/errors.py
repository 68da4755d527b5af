# What the compiler cannot do fails with the kernel's file and line, before any IR is emitted.
# RUN: not %python -m epic.dsl %s gathers --arg x='*f32' --arg idx='*i32' --arg BLOCK=64 2>&1 \
# RUN:     | FileCheck %s --check-prefix=GATHER
# RUN: not %python -m epic.dsl %s spins --arg x='*f32' 2>&1 | FileCheck %s --check-prefix=SPIN
# RUN: not %python -m epic.dsl %s mixes --arg x='*f32' --arg BLOCK=64 2>&1 \
# RUN:     | FileCheck %s --check-prefix=MIX
# RUN: not %python -m epic.dsl %s changes --arg x='*f32' --arg n=i32 2>&1 \
# RUN:     | FileCheck %s --check-prefix=TYPE
# RUN: not %python -m epic.dsl %s gathers --arg x='*f32' 2>&1 | FileCheck %s --check-prefix=ARGS
# RUN: not %python -m epic.dsl %s nothing 2>&1 | FileCheck %s --check-prefix=NAME

import epic
import epic.language as el


@epic.jit
def gathers(x, idx, BLOCK: el.constexpr):
    rows = el.load(idx + el.arange(0, BLOCK))
    # GATHER: error: {{.*}}errors.py:[[@LINE+1]]: pointer blocks must be scalar + el.arange(...) (gathers are not supported by the compiler yet)
    el.load(x + rows)


@epic.jit
def spins(x):
    # SPIN: error: {{.*}}errors.py:[[@LINE+1]]: while True never ends: kernels have no break
    while True:
        pass


@epic.jit
def mixes(x, BLOCK: el.constexpr):
    v = el.load(x + el.arange(0, BLOCK))
    # MIX: error: {{.*}}errors.py:[[@LINE+1]]: mixed element types i1 and i32
    el.store(x + el.arange(0, BLOCK), (v > 0) + el.arange(0, BLOCK))


@epic.jit
def changes(x, n):
    v = 0
    # TYPE: error: {{.*}}errors.py:[[@LINE+1]]: v changes type in the loop (i32 before, f32 after)
    for i in range(n):
        v = el.load(x + i)  # noqa: F841 - the type change is what this test checks

# ARGS: error: gathers: give --arg for idx, BLOCK
# NAME: error: {{.*}}errors.py has no @epic.jit kernel 'nothing' (it has: changes, gathers, mixes, spins)
