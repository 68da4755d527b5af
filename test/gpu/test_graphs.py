"""The hot path on a GPU: CUDA-graph capture and replay of dispatch and combine, the plans
that cache a signature's checks (and what they still refuse), the output pool's lifetime, and
the token cap as a run-time value. Virtual worlds of 2 and 8 ranks, bitwise against
epic.reference and against eager calls.

Run on the H200 by tools/device/run.sh (PYTHONPATH=python); skipped without torch or a GPU.
The kernels are the ones prepare_buffer_kernels.py compiles for test_elastic_buffer.py.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import epic  # noqa: E402
from epic import reference as ref  # noqa: E402
from test_elastic_buffer import H, TMAX, as_result, check_dispatch, inputs, to_torch  # noqa: E402

K = 6


@pytest.fixture(scope="module", params=[2, 8])
def world(request):
    R = request.param
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=TMAX, hidden=H,
                                num_topk=K, use_fp8_dispatch=True, explicitly_destroy=True)
    yield R, buffer
    buffer.destroy()


def static_inputs(R, E, seed, fp8):
    """Every rank's inputs as CUDA tensors (the graph's static inputs), and the numpy copies."""
    _, tokens, idxs, ws, xs, sfs = inputs(R, E, K, seed=seed, fp8=fp8)
    x = [(to_torch(a), to_torch(b)) for a, b in zip(xs, sfs)] if fp8 else \
        [to_torch(a) for a in xs]
    return x, [to_torch(i) for i in idxs], [to_torch(w) for w in ws], (xs, sfs, idxs, ws)


def write(static, new):
    """New data into the static inputs (same shapes): what a replay then reads."""
    for dst, src in zip(static, new):
        if isinstance(dst, tuple):
            for d, s in zip(dst, src):
                d.copy_(s)
        else:
            dst.copy_(src)


@pytest.mark.parametrize("fp8, do_expand", [(False, False), (True, False), (True, True)])
def test_graph_replays_equal_eager_calls(world, fp8, do_expand):
    """dispatch(do_cpu_sync=False) + a toy expert + combine (weights back, one bias) captured
    once; replays with new data written into the same inputs give what eager calls give."""
    R, buffer = world
    E = 8 * R
    alignment = 128 if do_expand else 1
    x, idx, w, _ = static_inputs(R, E, 100 + R, fp8)
    bias = [torch.randn((t.shape[0], H), device="cuda").to(torch.bfloat16) for t in idx]
    kwargs = dict(num_experts=E, expert_alignment=alignment, do_expand=do_expand,
                  do_zero_padding=do_expand, do_cpu_sync=False)

    def step():
        recv, _, recv_w, handles, _ = buffer.dispatch(x, idx, w, **kwargs)
        rows = [r[0] if isinstance(r, tuple) else r for r in recv]
        ys = [(r.float() * 0.5 if r.dtype != torch.float8_e4m3fn else r.float()).to(torch.bfloat16)
              for r in rows]
        out, out_w, _ = buffer.combine(ys, handles, topk_weights=recv_w, bias=bias)
        return out, out_w

    step()  # warm-up: the plans are made and the kernels loaded outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, graph_w = step()
    for seed in (200 + R, 300 + R):
        new_x, new_idx, new_w, _ = static_inputs(R, E, seed, fp8)
        write(x, new_x), write(idx, new_idx), write(w, new_w)
        graph.replay()
        eager_out, eager_w = step()
        torch.cuda.synchronize()
        for r in range(R):
            assert torch.equal(graph_out[r].view(torch.int16), eager_out[r].view(torch.int16))
            assert torch.equal(graph_w[r], eager_w[r])


def test_graph_replays_of_a_cached_dispatch_follow_the_handle(world):
    R, buffer = world
    E = 8 * R
    x, idx, _, (_, _, idxs, _) = static_inputs(R, E, 120 + R, True)
    handles = buffer.dispatch(x, idx, num_experts=E)[3]
    buffer.dispatch(x, handle=handles)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, recv_idx, _, _, _ = buffer.dispatch(x, handle=handles)
    new_x, _, _, (xs, sfs, _, _) = static_inputs(R, E, 130 + R, True)  # same token counts
    write(x, new_x)
    graph.replay()
    torch.cuda.synchronize()
    expected = ref.dispatch(xs, idxs, None, sfs, num_experts=E, num_max_tokens_per_rank=TMAX)
    for r in range(R):
        got = as_result(expected[r], recv[r][0], recv[r][1], recv_idx[r], None, handles[r])
        check_dispatch(expected[r], got, handles[r])


def test_what_a_graph_cannot_hold_is_refused_with_a_reason(world):
    R, buffer = world
    E = 8 * R
    x, idx, _, _ = static_inputs(R, E, 140 + R, False)
    buffer.dispatch(x, idx, num_experts=E, do_cpu_sync=False)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"do_cpu_sync=True.*cannot be captured.*pass "
                                           r"do_cpu_sync=False"):
        with torch.cuda.graph(graph):
            buffer.dispatch(x, idx, num_experts=E)  # do_cpu_sync defaults to True
    # A signature whose kernels this process never loaded: warm up first.
    fresh = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=TMAX, hidden=H,
                               num_topk=K, explicitly_destroy=True)
    fresh._runtime()
    with pytest.raises(RuntimeError, match=r"not loaded yet.*cannot be captured.*warm-up"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fresh.dispatch(x, idx, num_experts=E, do_cpu_sync=False)
    with pytest.raises(RuntimeError, match=r"creating an ElasticBuffer .*cannot be captured"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=2 << 20)._runtime()
    fresh.destroy()
    # The buffer still works after the refusals.
    recv, _, _, handles, _ = buffer.dispatch(x, idx, num_experts=E)
    assert len(buffer.combine(recv, handles)[0]) == R


def test_a_cached_signature_still_names_a_bad_argument(world):
    """After the first call checked a signature, a later call of it is checked by address:
    a misaligned tensor of the same shape is refused naming it; a new shape is checked anew."""
    R, buffer = world
    E = 8 * R
    x, idx, w, _ = static_inputs(R, E, 150 + R, False)
    buffer.dispatch(x, idx, w, num_experts=E, do_cpu_sync=False)
    shifted = []
    for t in x:  # the same shape, 2 bytes off: rows move as 16-byte vectors
        storage = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
        shifted.append(storage[1:].view(t.shape).copy_(t))
    with pytest.raises(ValueError, match=r"x\[0\] must be 16-byte aligned"):
        buffer.dispatch(shifted, idx, w, num_experts=E, do_cpu_sync=False)
    # Rank 1's rows narrower than rank 0's: a new signature, checked before any kernel loads.
    narrow = [x[0]] + [t[:, : H // 2].contiguous() for t in x[1:]]
    with pytest.raises(ValueError, match=r"rank 1: x must have shape bf16\[\d+, 512\]"):
        buffer.dispatch(narrow, idx, w, num_experts=E, do_cpu_sync=False)
    # and the signature still runs
    buffer.dispatch(x, idx, w, num_experts=E, do_cpu_sync=False)


def test_pooled_outputs_are_never_overwritten_while_held(world):
    R, buffer = world
    E = 8 * R
    x, idx, _, _ = static_inputs(R, E, 160 + R, False)
    first = buffer.dispatch(x, idx, num_experts=E, do_cpu_sync=False)
    kept = [t.clone() for t in first[0]]
    x2, idx2, _, _ = static_inputs(R, E, 170 + R, False)
    for _ in range(4):  # more calls than the pool has sets
        second = buffer.dispatch(x2, idx2, num_experts=E, do_cpu_sync=False)
    torch.cuda.synchronize()
    for r in range(R):
        assert torch.equal(first[0][r].view(torch.int16), kept[r].view(torch.int16))
        assert second[0][r].data_ptr() != first[0][r].data_ptr()
    # Once nothing holds them, the pool hands the same tensors out again (no allocation).
    ptrs = {t.data_ptr() for t in first[0]} | {t.data_ptr() for t in second[0]}
    del first, second
    again = buffer.dispatch(x2, idx2, num_experts=E, do_cpu_sync=False)
    assert {t.data_ptr() for t in again[0]} <= ptrs


def test_the_token_cap_is_a_run_time_value(world):
    """Caps 32, 64 and 96 on one buffer: one kernel set, each call right at its cap."""
    R, buffer = world
    E = 8 * R
    keys = set()
    for cap in (32, 64, 96):
        rng = np.random.default_rng(cap)
        tokens = [cap - r for r in range(R)]
        idxs = [np.array([rng.permutation(E)[:K] for _ in range(t)], np.int64) for t in tokens]
        xs = [rng.standard_normal((t, H)).astype(ref.bfloat16) for t in tokens]
        before = set(buffer._plans.keys())
        recv, recv_idx, _, handles, _ = buffer.dispatch(
            [to_torch(a) for a in xs], [to_torch(i) for i in idxs], num_experts=E,
            num_max_tokens_per_rank=cap)
        keys |= {buffer._plans.get(k).plan.key for k in set(buffer._plans.keys()) - before}
        expected = ref.dispatch(xs, idxs, num_experts=E, num_max_tokens_per_rank=cap)
        for r in range(R):
            got = as_result(expected[r], recv[r], None, recv_idx[r], None, handles[r])
            check_dispatch(expected[r], got, handles[r])
    assert len(keys) == 1, keys
