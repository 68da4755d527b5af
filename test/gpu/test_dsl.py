"""The DSL on a GPU: @epic.jit kernels compiled by epic and launched by the runtime on virtual
worlds of one GPU (epic.dsl.target.Target), checked against numpy and epic.reference.

Run on the H200 by tools/device/run.sh (the GPU machine has no compiler: the kernels come from
the DSL and kernel caches). tools/device/prepare.sh runs this same file here with
EPIC_INTERPRET=1 EPIC_DSL_PRECOMPILE=1: every launch then runs in the interpreter (so the data,
and with it every specialization, are the GPU run's) and is compiled for the GPU on the way.
"""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "dsl"))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

import dispatch_combine  # noqa: E402
import least_loaded_replica  # noqa: E402
import low_latency_dispatch  # noqa: E402
from dsl_kernels import (claim_once, exclusive_offsets, halvings, ring, scale,  # noqa: E402
                         take_slots)
from epic.dsl.target import Target  # noqa: E402

PRECOMPILING = os.environ.get("EPIC_DSL_PRECOMPILE", "") not in ("", "0")


def target(ranks, window_bytes=1 << 16):
    t = Target.choose(ranks, window_bytes)
    if not t.gpu and not PRECOMPILING:
        pytest.skip("no GPU here (EPIC_DSL_PRECOMPILE=1 compiles this file's kernels instead)")
    return t


@pytest.mark.parametrize("n, block", [(1000, 256), (4096, 1024)])
def test_blocks_masks_and_vector_accesses(n, block):
    t = target(2)
    xs = [np.arange(n, dtype=np.float32) * (r + 1) for r in range(2)]
    ys = [t.zeros(n, np.float32) for _ in range(2)]
    scale[(-(-n // block),)]([t.tensor(x) for x in xs], ys, n, 2.0, BLOCK=block, **t.launch)
    t.synchronize()
    for x, y in zip(xs, ys):
        assert np.array_equal(t.numpy(y), 2 * x)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_put_signal_wait_between_ranks(ranks):
    t, n = target(ranks), 64
    outs = [t.zeros(n, np.int32) for _ in range(ranks)]
    ring[(1,)](t.window, outs, N=n, **t.launch)
    t.synchronize()
    for r in range(ranks):
        assert list(t.numpy(outs[r])) == [((r - 1) % ranks) * 100 + i for i in range(n)]


def test_the_virtual_world_counts_puts_and_drops_a_ranks_network():
    """ring's el.put is a comm.put, GIN traffic in the virtual world (its signal is an NVLink
    store): the runtime's buffer counts its bytes per (from, to) pair, zeroes them once taken,
    and with rank 1's network dropped its put never lands (and sends nothing) while the ring's
    signal still arrives. The kernels are test_put_signal_wait_between_ranks's (4 ranks)."""
    ranks, n = 4, 64
    t = target(ranks)
    if not t.gpu:
        pytest.skip("the runtime's traffic counters are on the GPU; nothing new to compile")
    for dropped in (-1, 1):
        t = target(ranks)  # a fresh, zeroed window
        world = t.window._runtime()
        world.set_drop_network_from(dropped)
        outs = [t.zeros(n, np.int32) for _ in range(ranks)]
        ring[(1,)](t.window, outs, N=n, **t.launch)
        t.synchronize()
        want = np.zeros((ranks, ranks, 3), np.int64)
        for r in range(ranks):
            got = list(t.numpy(outs[(r + 1) % ranks]))
            if r == dropped:
                assert got == [0] * n, f"rank {r}'s dropped put landed"
            else:
                assert got == [r * 100 + i for i in range(n)]
                want[r, (r + 1) % ranks, 0] = 4 * n  # put bytes, no put_value, no GIN signal
        traffic = world.take_traffic()
        assert traffic.shape == (ranks, ranks, 3) and traffic.dtype == np.int64
        assert np.array_equal(traffic, want), traffic
        assert not world.take_traffic().any()
    assert world.gpus_per_node == ranks  # Target's world is one node
    for bad in (4, -2):
        with pytest.raises(ValueError, match=rf"rank must be a rank of the world, \[0, 3\], or "
                                             rf"-1 for none, got {bad}"):
            world.set_drop_network_from(bad)


def test_remote_atomics_and_compare_and_swap():
    ranks, programs = 4, 6
    t = target(ranks)
    outs = [t.zeros(programs, np.int32) for _ in range(ranks)]
    take_slots[(programs,)](t.window, outs, **t.launch)
    t.synchronize()
    assert sorted(np.concatenate([t.numpy(o) for o in outs])) == list(range(ranks * programs))
    t = target(ranks)  # a fresh window: the word starts at 0
    owners = [t.zeros(programs, np.int32) for _ in range(ranks)]
    claim_once[(programs,)](t.window, owners, **t.launch)
    t.synchronize()
    olds = np.concatenate([t.numpy(o) for o in owners])
    winner = int(t.window_view(0, np.int32, 1)[0])
    assert 1 <= winner <= ranks * programs and (olds == 0).sum() == 1
    assert set(olds.tolist()) == {0, winner}


@pytest.mark.parametrize("block", [8, 512])
def test_cumsum_and_while(block):
    t = target(1)
    rng = np.random.default_rng(block)
    n = block - 3
    counts = rng.integers(0, 50, block).astype(np.int32)
    out = t.zeros(block, np.int32)
    exclusive_offsets[(1,)]([t.tensor(counts)], [out], n, BLOCK=block, **t.launch)
    steps = t.zeros(1, np.int32)
    halvings[(1,)]([t.tensor(np.array([1000], np.int32))], [steps], 10, **t.launch)
    t.synchronize()
    want = np.cumsum(counts[:n]) - counts[:n]
    assert np.array_equal(t.numpy(out)[:n], want)
    assert int(t.numpy(steps)[0]) == 7


@pytest.mark.parametrize("ranks, tokens, hidden", [(2, 24, 64), (4, 48, 2048), (8, 32, 7168)])
def test_dispatch_combine_example_matches_the_reference(ranks, tokens, hidden):
    layout = dispatch_combine.Layout(ranks, 4, hidden, tokens)
    d, c = dispatch_combine.run(ranks, tokens, H=hidden, programs=4,
                                target=target(ranks, layout.bytes))
    assert d, "dispatch differs from epic.reference"
    assert c, "combine differs from epic.reference (bitwise)"


@pytest.mark.parametrize("ranks", [2, 4])
def test_low_latency_dispatch_example_matches_the_reference(ranks):
    layout = low_latency_dispatch.Layout(ranks, 4, 256, 8)
    assert low_latency_dispatch.run(ranks, 8, target=target(ranks, layout.bytes))


def test_low_latency_dispatch_replays_from_a_cuda_graph():
    """Prepared once, captured in a CUDA graph, replayed: every replay delivers the same rows and
    leaves the counters at zero (the next replay depends on it)."""
    import ml_dtypes

    R, L, H, K, tokens = 4, 4, 256, 4, 8
    layout = low_latency_dispatch.Layout(R, L, H, tokens)
    t = target(R, layout.bytes)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((tokens, H)).astype(ml_dtypes.bfloat16) for _ in range(R)]
    idxs = [np.array([rng.permutation(L * R)[:K] for _ in range(tokens)], np.int64)
            for _ in range(R)]
    counts = [t.zeros(L * R, np.int64) for _ in range(R)]
    prepared = low_latency_dispatch.ll_dispatch.prepare[(2,)](
        [t.tensor(x) for x in xs], [t.tensor(i) for i in idxs], [tokens] * R, t.window, counts,
        H=H, K=K, L=L, TMAX=tokens, ARRIVED=layout.arrived, EXPECTED=layout.expected,
        ROWS=layout.rows, SCALES=layout.scales, SOURCES=layout.sources, **t.launch)
    want = [np.zeros(L * R, np.int64) for _ in range(R)]
    for s in range(R):
        for e in idxs[s].reshape(-1):
            want[e // L][e % L * R + s] += 1
    if not t.gpu:  # precompiling: the interpreter runs it once
        prepared()
        assert all(np.array_equal(t.numpy(c), w) for c, w in zip(counts, want))
        return
    import torch

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        prepared()
    for replay in range(3):
        for c in counts:
            c.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for r in range(R):
            assert np.array_equal(t.numpy(counts[r]), want[r]), f"replay {replay}, rank {r}"
        assert not any(t.window_view(r, np.int64, 2 * L * R).any() for r in range(R))


def test_least_loaded_replica_example_delivers_once_and_balances():
    ranks, tokens = 4, 32
    capacity = sum(tokens - (r % 3) for r in range(ranks)) * 2
    t = target(ranks, least_loaded_replica.Layout(capacity, 64).bytes)
    ok, balanced, loads, primary = least_loaded_replica.run(ranks, tokens, target=t)
    assert ok, "a (token, expert) pair is missing, repeated or off its replicas"
    assert balanced, f"rows per rank {loads}, fixed primaries {primary}"


@pytest.mark.parametrize("ranks, intermediate", [(2, 256), (8, 2048)])
def test_swiglu_fp8_matches_the_reference(ranks, intermediate):
    """epic.activations.swiglu_fp8 (el.exp as PTX ex2.approx, the e4m3 conversion) on every rank
    of a virtual world against epic.reference.swiglu_fp8."""
    from epic import reference as ref
    from epic.activations import swiglu_fp8

    t = target(ranks)
    rng = np.random.default_rng(intermediate)
    xs = [(rng.standard_normal((40 + r, 2 * intermediate)) * 3).astype(ref.bfloat16)
          for r in range(ranks)]
    outs = [t.zeros((len(x), intermediate), ref.float8_e4m3fn) for x in xs]
    scales = [t.zeros((len(x), intermediate // 128), np.float32) for x in xs]
    swiglu_fp8([t.tensor(x) for x in xs], out=outs, scales=scales, **t.launch)
    t.synchronize()
    for x, o, s in zip(xs, outs, scales):
        got_s, want = t.numpy(s), ref.swiglu_fp8(x)
        np.testing.assert_allclose(got_s, want[1], rtol=1e-5)
        got = t.numpy(o).astype(np.float32).reshape(len(x), -1, 128) * got_s[:, :, None]
        np.testing.assert_allclose(
            got, want[0].astype(np.float32).reshape(got.shape) * want[1][:, :, None],
            rtol=2.0 ** -3, atol=float(got_s.max()) * 2.0 ** -9)
