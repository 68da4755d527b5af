"""The DSL on the CPU: epic.language under the interpreter (EPIC_INTERPRET=1), the @epic.jit
launch rules, and the examples in examples/dsl against epic.reference."""

import os
import sys

import ml_dtypes
import numpy as np
import pytest

import epic
import epic.language as el
from epic.dsl.interpreter import KernelError
from epic.dsl.jit import SymmetricMemory

from dsl_kernels import ring, ring_nvlink, scale, take_slots, twice

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("EPIC_INTERPRET", "1")


def test_blocks_masks_and_per_rank_arguments():
    xs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(3)]
    ys = [np.zeros(1000, np.float32) for _ in range(3)]
    scale[(4,)](xs, ys, 1000, 2.0, BLOCK=256, world=epic.VirtualWorld(3))
    for x, y in zip(xs, ys):
        assert np.array_equal(y, 2 * x)  # the masked tail touched nothing out of bounds


@pytest.mark.parametrize("kernel", [ring, ring_nvlink], ids=["put", "nvlink"])
def test_one_sided_put_with_signal_and_wait(kernel):
    """el.put with its signal, and what the nccl backend runs instead of it (stores through a
    peer pointer, then el.signal), move the same data."""
    R, N = 4, 8
    win = SymmetricMemory(R, 8 + 2 * N * 4)
    outs = [np.zeros(N, np.int32) for _ in range(R)]
    kernel[(1,)](win, outs, N=N, world=epic.VirtualWorld(R))
    for r in range(R):
        assert list(outs[r]) == [((r - 1) % R) * 100 + i for i in range(N)]


def test_atomics_give_every_program_of_every_rank_its_own_slot():
    R, P = 4, 5
    win = SymmetricMemory(R, 4)
    outs = [np.full(P, -1, np.int32) for _ in range(R)]
    take_slots[(P,)](win, outs, world=epic.VirtualWorld(R))
    assert sorted(np.concatenate(outs)) == list(range(R * P))
    assert win.view(0, np.int32, 1)[0] == R * P


@epic.jit
def wait_forever(win):
    el.wait(win.to(el.int64), 1, timeout_ms=50)


def test_waits_are_bounded_and_name_the_rank():
    with pytest.raises(KernelError, match=r"rank \d, program 0: el.wait timed out after 50 ms: "
                                          r"the word at byte 0 of rank \d's window is 0, "
                                          r"waited for 1"):
        wait_forever[(1,)](SymmetricMemory(2, 8), world=epic.VirtualWorld(2))


@epic.jit
def out_of_bounds(x_ptr):
    el.load(x_ptr + el.arange(0, 16))


@epic.jit
def not_a_window(x_ptr):
    el.peer_ptr(x_ptr, 0)


@epic.jit
def fails_on_rank_one(win):
    if el.rank() == 1:
        el.store(win, 1 // (el.rank() - 1))  # the line the error names
    el.barrier()


def test_kernel_errors_say_where():
    x = np.zeros(8, np.float32)
    with pytest.raises(KernelError, match=r"rank 0, program 0: el.load: out of bounds: byte "
                                          r"offset 32 of a 32-byte buffer"):
        out_of_bounds[(1,)](x, world=epic.VirtualWorld(1))
    with pytest.raises(KernelError, match="el.peer_ptr needs a pointer into a symmetric window"):
        not_a_window[(1,)](x, world=epic.VirtualWorld(1))
    # The first failure is reported, not the barrier the others were left at; an error Python
    # raised names the kernel's line.
    from dsl_kernels import line_of

    with pytest.raises(KernelError, match=r"rank 1, program \d: .*test_dsl_interpreter.py:" +
                       str(line_of(fails_on_rank_one, "names")) +
                       r": ZeroDivisionError: integer division or modulo by zero"):
        fails_on_rank_one[(2,)](SymmetricMemory(3, 8), world=epic.VirtualWorld(3))


def test_language_values():
    assert np.array_equal(el.cumsum(np.array([1, 2, 3], np.int32)), [1, 3, 6])
    with pytest.raises(ValueError, match="power of two"):
        el.arange(0, 6)
    saturated = el.cast(np.array([1000.0, -1000.0, 1.0], np.float32), el.float8e4nv)
    assert saturated.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert list(saturated.astype(np.float32)) == [448.0, -448.0, 1.0]
    with pytest.raises(RuntimeError, match="inside an @epic.jit kernel"):
        el.rank()


def test_launch_rules(monkeypatch):
    xs = [np.zeros(4, np.float32)] * 2
    with pytest.raises(TypeError, match=r"launch it as scale\[grid\]"):
        scale(xs, xs, 4, 1.0, BLOCK=4)
    with pytest.raises(TypeError, match="pass world=epic.VirtualWorld"):
        scale[(1,)](xs, xs, 4, 1.0, BLOCK=4)
    with pytest.raises(ValueError, match="argument x_ptr has 2 entries for 3 ranks"):
        scale[(1,)](xs, xs, 4, 1.0, BLOCK=4, world=epic.VirtualWorld(3))
    with pytest.raises(ValueError, match="grid"):
        scale[(0,)](xs, xs, 4, 1.0, BLOCK=4, world=epic.VirtualWorld(2))
    with pytest.raises(TypeError, match="constexpr BLOCK must be a Python constant"):
        scale[(1,)](xs, xs, 4, 1.0, BLOCK=np.zeros(1), world=epic.VirtualWorld(2))
    monkeypatch.setenv("EPIC_INTERPRET", "0")
    with pytest.raises(TypeError, match="on a GPU a kernel runs on an epic.ElasticBuffer"):
        scale[(1,)](xs, xs, 4, 1.0, BLOCK=4, world=epic.VirtualWorld(2))


def test_specialization_key_covers_dtypes_constexprs_and_alignment():
    def key(*args, **kwargs):
        return scale.specialization_key(scale.signature.bind(*args, **kwargs))

    f32, f16 = np.zeros(64, np.float32), np.zeros(64, np.float16)
    base = key(f32, f32, 64, 1.0, BLOCK=32)
    assert key(f32, f32, 48, 2.0, BLOCK=32) == base
    assert key(f32, f32, 7, 2.0, BLOCK=32) != base  # multiples of 16 specialize
    assert key(f32, f32, [64, 32], 1.0, BLOCK=32) == key(f32, f32, 64, 1.0, BLOCK=32)[:2] + \
        (("n", "per-rank", ("int", "i32", False, True)),) + base[3:]
    assert key(f32, f32, [64, 8], 1.0, BLOCK=32)[2][2][3] is False  # all ranks or none
    assert key(f16, f32, 64, 1.0, BLOCK=32) != base
    assert key(f32, f32, 64, 1.0, BLOCK=64) != base
    assert key(f32, f32, 1, 1.0, BLOCK=32) != base  # n == 1 specializes
    aligned = np.zeros(80, np.float32)
    offset = (16 - aligned.ctypes.data % 16) // 4 + 1  # one float past a 16-byte boundary
    assert key(aligned[offset:offset + 64], f32, 64, 1.0, BLOCK=32) != base


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_the_dsl_dispatch_combine_example_matches_the_reference(ranks):
    sys.path.insert(0, os.path.join(ROOT, "examples", "dsl"))
    import dispatch_combine

    dispatch_ok, combine_ok = dispatch_combine.run(ranks, tokens=16, K=min(4, 4 * ranks))
    assert dispatch_ok and combine_ok


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_the_dsl_low_latency_dispatch_example_matches_the_reference(ranks):
    sys.path.insert(0, os.path.join(ROOT, "examples", "dsl"))
    import low_latency_dispatch

    assert low_latency_dispatch.run(ranks, tokens=6, K=min(3, 2 * ranks), H=256, L=2)


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_dsl_least_loaded_replica_example_balances_and_delivers_once(ranks):
    sys.path.insert(0, os.path.join(ROOT, "examples", "dsl"))
    import least_loaded_replica

    ok, balanced, loads, primary = least_loaded_replica.run(ranks, tokens=24)
    assert ok
    assert balanced, (loads, primary)


def test_cumsum_cas_and_while_loops():
    from dsl_kernels import claim_once, exclusive_offsets, halvings

    counts = [np.array([3, 0, 5, 1, 2], np.int32)] * 2
    outs = [np.full(5, -1, np.int32) for _ in range(2)]
    exclusive_offsets[(1,)](counts, outs, 5, BLOCK=8, world=epic.VirtualWorld(2))
    assert all(list(o) == [0, 3, 3, 8, 9] for o in outs)

    R, P = 3, 4
    win = SymmetricMemory(R, 4)
    owners = [np.full(P, -1, np.int32) for _ in range(R)]
    claim_once[(P,)](win, owners, world=epic.VirtualWorld(R))
    olds = np.concatenate(owners)
    winner = win.view(0, np.int32, 1)[0]
    assert 1 <= winner <= R * P and (olds == 0).sum() == 1 and set(olds) == {0, winner}

    x, out = [np.array([1000], np.int32)], [np.zeros(1, np.int32)]
    halvings[(1,)](x, out, 10, world=epic.VirtualWorld(1))
    assert out[0][0] == 7  # 1000 500 250 125 62 31 15 7


def test_tuples_hold_the_values_of_a_static_range():
    from dsl_kernels import copy_in_parts

    xs = [np.arange(1000, dtype=np.float32) + r for r in range(2)]
    ys = [np.zeros(1000, np.float32) for _ in range(2)]
    copy_in_parts[(1,)](xs, ys, 1000, BLOCK=64, PARTS=4, world=epic.VirtualWorld(2))
    assert all(np.array_equal(x, y) for x, y in zip(xs, ys))  # 1000: the last group is ragged


def test_prepared_launches_and_targets_run_in_the_interpreter():
    from epic.dsl.target import Target

    target = Target(3, 64, gpu=False)
    assert "interpreter" in target.name and target.launch["world"].num_ranks == 3
    xs = [target.tensor(np.arange(1000, dtype=np.float32) * (r + 1)) for r in range(3)]
    assert all(x.ctypes.data % 256 == 0 for x in xs)  # as CUDA allocates: same specialization
    ys = [target.zeros(1000, np.float32) for _ in range(3)]
    prepared = scale.prepare[(4,)](xs, ys, 1000, 2.0, BLOCK=256, **target.launch)
    assert not ys[0].any()  # prepared, not run
    prepared()
    assert all(np.array_equal(target.numpy(y), 2 * x) for x, y in zip(xs, ys))
    target.fill_window(1, np.int32, 4, 16, -1)
    assert list(target.window_view(1, np.int32, 4, 16)) == [-1] * 4
    assert not target.window_view(0, np.int32, 4, 16).any()
    with pytest.raises(TypeError, match="buffer must be an epic.ElasticBuffer"):
        scale.prepare[(1,)](xs, ys, 1000, 2.0, BLOCK=256, buffer="gpu")


def test_calls_of_jit_functions_run_in_the_calling_program():
    from dsl_kernels import split_doubled, sum_doubled

    xs = [np.arange(1000, dtype=np.float32) / 100 + r for r in range(2)]
    los = [np.full(1000, -1, np.float32) for _ in range(2)]
    his = [np.full(1000, -1, np.float32) for _ in range(2)]
    split_doubled[(4,)](xs, los, his, 1000, 5.0, BLOCK=256, world=epic.VirtualWorld(2))
    for x, lo, hi in zip(xs, los, his):
        assert np.array_equal(lo, np.where(2 * x < 5, 2 * x, 0))
        assert np.array_equal(hi, np.where(2 * x < 5, 0, 2 * x))
    out = [np.zeros(1, np.float32) for _ in range(2)]
    sum_doubled[(1,)](xs, out, 1000, BLOCK=256, world=epic.VirtualWorld(2))
    assert all(np.isclose(o[0], 2 * x.sum()) for x, o in zip(xs, out))
    with pytest.raises(TypeError, match=r"launch it as twice\[grid\]"):  # outside a kernel
        twice(1.0)


def test_calls_follow_the_compilers_rules_and_name_the_line():
    from dsl_kernels import (calls_countdown, calls_with_too_many, countdown, line_of,
                             passes_a_value_as_constexpr)

    x, world = np.full(4, 4, np.int32), epic.VirtualWorld(1)
    there = r"rank 0, program 0: .*dsl_kernels.py:"
    with pytest.raises(KernelError, match=there + str(line_of(countdown, "names")) +
                       r": recursive call of countdown \(calls_countdown -> countdown -> "
                       r"countdown\)"):
        calls_countdown[(1,)](x, 3, world=world)
    with pytest.raises(KernelError, match=there + str(line_of(calls_with_too_many, "names")) +
                       r": twice\(x\): too many positional arguments"):
        calls_with_too_many[(1,)](x, world=world)
    with pytest.raises(KernelError, match=there + str(line_of(passes_a_value_as_constexpr,
                                                               "names")) +
                       r": offsets_of: BLOCK is an el.constexpr, it takes a constant"):
        passes_a_value_as_constexpr[(1,)](x, world=world)
