"""DeepEP V1's low-latency mode on a GPU (virtual worlds of 1, 2 and 4 ranks):
``low_latency_dispatch`` (bf16, FP8, round_scale, UE8M0; int64 and int32 ids) and
``low_latency_combine`` bitwise against epic.reference, the receive hook, async_finish,
zero-copy through ``get_next_low_latency_combine_buffer``, two dispatches in flight, the
cumulative statistics, CUDA-graph replay with new inputs, normal-mode calls on the same buffer
in between (the counters cleaned by themselves), and what is refused.

Run on the H200 by tools/device/run.sh (PYTHONPATH=python); skipped without torch or a GPU.
``python test/gpu/test_v1_low_latency.py --prepare`` compiles its kernels (no GPU needed).
"""

import sys

import pytest

# (ranks, experts, top-k, hidden, cap) of the worlds below.
WORLDS = [(1, 8, 4, 256, 16), (2, 16, 4, 256, 8), (4, 32, 8, 512, 24), (2, 64, 8, 7168, 32)]
# (use_fp8, round_scale, use_ue8m0)
CASTS = [(False, False, False), (True, False, False), (True, True, False), (True, True, True)]


def kernel_sets():
    for R, E, K, H, cap in WORLDS:
        for bits in (64, 32):
            for fp8, rnd, ue8m0 in CASTS:
                spec = dict(num_ranks=R, num_experts=E, num_topk=K, hidden=H,
                            dtype="f8E4M3FN" if fp8 else "bf16",
                            num_scale_packs=H // 128 if fp8 else 0, expert_alignment=1,
                            do_expand=False, num_max_tokens_per_rank=cap)
                yield spec, dict(round_scale=rnd, use_ue8m0=ue8m0, parity=0,
                                 topk_idx_bits=bits), "low_latency_dispatch"
            spec = dict(num_ranks=R, num_experts=E, num_topk=K, hidden=H, dtype="bf16",
                        num_scale_packs=0, expert_alignment=1, do_expand=False,
                        num_max_tokens_per_rank=cap)
            yield spec, dict(parity=0, topk_idx_bits=bits), "low_latency_combine"


def prepare():
    """Compiles every kernel set this file launches into $EPIC_CACHE_DIR."""
    import epic._C as C

    runtime = C.Runtime("virtual", "", "")
    n = 0
    for spec, variant, kind in kernel_sets():
        runtime.kernels(spec, variant, kind)
        n += 1
    print(f"test_v1_low_latency: {n} kernel sets in {runtime.cache_dir}")


if __name__ == "__main__" and "--prepare" in sys.argv:
    sys.exit(prepare())

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import numpy as np  # noqa: E402

import epic  # noqa: E402
import epic.deep_ep as deep_ep  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic._tensors import numpy_to_torch, torch_to_numpy  # noqa: E402


def make_buffer(R, E, H, cap):
    nbytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(cap, H, R, E)
    return deep_ep.Buffer(epic.VirtualWorld(R), num_rdma_bytes=nbytes, low_latency_mode=True,
                          num_qps_per_rank=max(1, E // R), explicitly_destroy=True)


def make_inputs(R, E, K, H, cap, seed, dtype=np.int64):
    rng = np.random.default_rng(seed)
    xs, idxs, ws = [], [], []
    for r in range(R):
        T = max(0, cap - (r * 3) % 5)  # ragged, some ranks full
        x = (rng.standard_normal((T, H)) * rng.uniform(0.1, 4.0, (T, 1))).astype(ref.bfloat16)
        idx = np.stack([rng.permutation(E)[:K] for _ in range(T)]).reshape(T, K).astype(dtype)
        idx[rng.random(idx.shape) < 0.1] = -1
        xs.append(x)
        idxs.append(idx)
        ws.append(rng.uniform(0.0, 1.0, (T, K)).astype(np.float32))
    return xs, idxs, ws


def gpu(a):
    return numpy_to_torch(a)


def check_dispatch(got, want, fp8, ue8m0):
    """One rank's dispatch outputs against the reference: counts, ranges, sources, valid rows
    and scales, bitwise."""
    recv, count, src_info, layout_range = got
    ok = torch_to_numpy(count).tobytes() == want.recv_count.tobytes()
    ok &= torch_to_numpy(layout_range).tobytes() == want.layout_range.tobytes()
    data, scales = recv if fp8 else (recv, None)
    for local, n in enumerate(want.recv_count):
        n = int(n)
        ok &= torch_to_numpy(src_info[local, :n]).tobytes() == want.src_info[local, :n].tobytes()
        ok &= torch_to_numpy(data[local, :n].contiguous()).tobytes() == \
            want.recv_x[local, :n].tobytes()
        if fp8:
            ok &= torch_to_numpy(scales[local, :n].contiguous()).tobytes() == \
                want.recv_scales[local, :n].tobytes()
    if fp8:
        ok &= scales.stride(1) == 1  # column-major per expert (TMA's layout)
        ok &= scales.dtype == (torch.int32 if ue8m0 else torch.float32)
    return ok


def expert_outputs(want, R, E, H, cap, seed):
    """Every rank's [L, R x cap, H] bf16 expert outputs (random in the valid rows)."""
    rng = np.random.default_rng(seed)
    out = []
    for w in want:
        y = np.zeros((E // R, R * cap, H), ref.bfloat16)
        for local, n in enumerate(w.recv_count):
            y[local, :int(n)] = rng.standard_normal((int(n), H)).astype(ref.bfloat16)
        out.append(y)
    return out


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("bits", [64, 32])
def test_dispatch_and_combine_match_the_reference(world, cast, bits):
    R, E, K, H, cap = world
    fp8, rnd, ue8m0 = cast
    if bits == 32 and world != WORLDS[1]:
        pytest.skip("int32 ids: one world is enough")
    buffer = make_buffer(R, E, H, cap)
    xs, idxs, ws = make_inputs(R, E, K, H, cap, seed=R * 7 + K,
                               dtype=np.int64 if bits == 64 else np.int32)
    want = ref.low_latency_dispatch(xs, idxs, E, cap, use_fp8=fp8, round_scale=rnd,
                                    use_ue8m0=ue8m0)
    stats = [torch.full((E // R,), 5, dtype=torch.int32, device="cuda") for _ in range(R)]
    recv, count, handle, event, hook = buffer.low_latency_dispatch(
        [gpu(x) for x in xs], [gpu(i) for i in idxs], cap, E,
        cumulative_local_expert_recv_stats=stats, use_fp8=fp8, round_scale=rnd,
        use_ue8m0=ue8m0, async_finish=False, return_recv_hook=False)
    torch.cuda.synchronize()
    assert hook is None
    for r in range(R):
        assert check_dispatch((recv[r], count[r], handle[0][r], handle[1][r]), want[r], fp8,
                              ue8m0), f"rank {r}"
        assert torch_to_numpy(stats[r]).tolist() == (want[r].recv_count + 5).tolist()
    ys = expert_outputs(want, R, E, H, cap, seed=11)
    combined, event, hook = buffer.low_latency_combine(
        [gpu(y) for y in ys], [gpu(i) for i in idxs], [gpu(w) for w in ws], handle)
    torch.cuda.synchronize()
    expected = ref.low_latency_combine(ys, want, idxs, ws)
    for r in range(R):
        assert torch_to_numpy(combined[r]).tobytes() == expected[r].tobytes(), f"rank {r}"
    buffer.destroy()


def test_hooks_async_zero_copy_and_two_in_flight():
    R, E, K, H, cap = WORLDS[2]
    buffer = make_buffer(R, E, H, cap)
    a = make_inputs(R, E, K, H, cap, seed=1)
    b = make_inputs(R, E, K, H, cap, seed=2)
    want_a = ref.low_latency_dispatch(a[0], a[1], E, cap, use_fp8=True)
    want_b = ref.low_latency_dispatch(b[0], b[1], E, cap, use_fp8=True)
    # Two dispatches sent before either is received (DeepEP's two buffers).
    ra, ca, ha, _, hook_a = buffer.low_latency_dispatch(
        [gpu(x) for x in a[0]], [gpu(i) for i in a[1]], cap, E, return_recv_hook=True)
    rb, cb, hb, _, hook_b = buffer.low_latency_dispatch(
        [gpu(x) for x in b[0]], [gpu(i) for i in b[1]], cap, E, return_recv_hook=True)
    hook_a()
    hook_b()
    torch.cuda.synchronize()
    for r in range(R):
        assert check_dispatch((ra[r], ca[r], ha[0][r], ha[1][r]), want_a[r], True, False)
        assert check_dispatch((rb[r], cb[r], hb[0][r], hb[1][r]), want_b[r], True, False)
    # Combine A zero-copy with the hook, B async_finish.
    ys_a = expert_outputs(want_a, R, E, H, cap, seed=5)
    ys_b = expert_outputs(want_b, R, E, H, cap, seed=6)
    staged = buffer.get_next_low_latency_combine_buffer(ha)
    for s, y in zip(staged, ys_a):
        s.copy_(gpu(y))
    out_a = [torch.empty((x.shape[0], H), dtype=torch.bfloat16, device="cuda") for x in a[0]]
    ca_, _, hook = buffer.low_latency_combine(staged, [gpu(i) for i in a[1]],
                                              [gpu(w) for w in a[2]], ha, zero_copy=True,
                                              return_recv_hook=True, out=out_a)
    hook()
    cb_, event, _ = buffer.low_latency_combine([gpu(y) for y in ys_b], [gpu(i) for i in b[1]],
                                               [gpu(w) for w in b[2]], hb, async_finish=True)
    event.current_stream_wait()
    torch.cuda.synchronize()
    want_ca = ref.low_latency_combine(ys_a, want_a, a[1], a[2])
    want_cb = ref.low_latency_combine(ys_b, want_b, b[1], b[2])
    for r in range(R):
        assert ca_[r] is out_a[r]
        assert torch_to_numpy(ca_[r]).tobytes() == want_ca[r].tobytes()
        assert torch_to_numpy(cb_[r]).tobytes() == want_cb[r].tobytes()
    buffer.destroy()


def test_graph_replay_with_new_inputs_and_normal_mode_in_between():
    R, E, K, H, cap = WORLDS[1]
    buffer = make_buffer(R, E, H, cap)
    xs, idxs, ws = make_inputs(R, E, K, H, cap, seed=3)
    static_x = [gpu(x) for x in xs]
    static_i = [gpu(i) for i in idxs]
    static_w = [gpu(w) for w in ws]
    want = ref.low_latency_dispatch(xs, idxs, E, cap, use_fp8=True, round_scale=True)
    static_y = [gpu(y) for y in expert_outputs(want, R, E, H, cap, seed=4)]

    def step():
        recv, count, handle, _, _ = buffer.low_latency_dispatch(
            static_x, static_i, cap, E, use_fp8=True, round_scale=True)
        out, _, _ = buffer.low_latency_combine(static_y, static_i, static_w, handle)
        return recv, count, handle, out

    step()  # warm-up: plans and kernels loaded outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            recv, count, handle, out = step()
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (5, 6, 7):
        xs, idxs, ws = make_inputs(R, E, K, H, cap, seed=seed)
        for dst, src in zip(static_x + static_i + static_w, xs + idxs + ws):
            dst.copy_(gpu(src))
        want = ref.low_latency_dispatch(xs, idxs, E, cap, use_fp8=True, round_scale=True)
        ys = expert_outputs(want, R, E, H, cap, seed=seed)
        for dst, y in zip(static_y, ys):
            dst.copy_(gpu(y))
        graph.replay()
        torch.cuda.synchronize()
        expected = ref.low_latency_combine(ys, want, idxs, ws)
        for r in range(R):
            assert check_dispatch((recv[r], count[r], handle[0][r], handle[1][r]), want[r],
                                  True, False), f"replay seed {seed} rank {r}"
            assert torch_to_numpy(out[r]).tobytes() == expected[r].tobytes()
    # Normal-mode calls on the same buffer overwrite the low-latency counters (here: garbage
    # written there); the next low-latency call cleans them first (DeepEP asks the caller to
    # call clean_low_latency_buffer).
    import epic._C as C

    layout = C.low_latency_layout(E, R, K, H)
    for r in range(R):
        buffer._buffer.window_tensor(r).narrow(0, layout["control_at"],
                                               layout["control_bytes"]).fill_(0x5A)
    buffer._ll_dirty = True  # what Buffer.dispatch / combine set
    recv, count, handle, _, _ = buffer.low_latency_dispatch(
        static_x, static_i, cap, E, use_fp8=True, round_scale=True)
    torch.cuda.synchronize()
    for r in range(R):
        assert check_dispatch((recv[r], count[r], handle[0][r], handle[1][r]), want[r], True,
                              False)
    del graph
    buffer.destroy()


def test_refusals():
    R, E, K, H, cap = WORLDS[1]
    buffer = make_buffer(R, E, H, cap)
    xs, idxs, ws = make_inputs(R, E, K, H, cap, seed=9)
    x, i = [gpu(v) for v in xs], [gpu(v) for v in idxs]
    with pytest.raises(ValueError, match="use_ue8m0 needs round_scale"):
        buffer.low_latency_dispatch(x, i, cap, E, use_ue8m0=True)
    with pytest.raises(ValueError, match="dispatch_wait_recv_cost_stats"):
        buffer.low_latency_dispatch(x, i, cap, E,
                                    dispatch_wait_recv_cost_stats=torch.zeros(R, R))
    with pytest.raises(ValueError, match="more than num_max_dispatch_tokens_per_rank"):
        buffer.low_latency_dispatch(x, i, cap - 4, E)
    with pytest.raises(ValueError, match="window|bytes"):  # the window holds cap, not 1000 x cap
        buffer.low_latency_dispatch(x, i, 1000 * cap, E)
    _, _, handle, _, _ = buffer.low_latency_dispatch(x, i, cap, E)
    with pytest.raises(ValueError, match="use_logfmt"):
        buffer.low_latency_combine(x, i, [gpu(w) for w in ws], handle, use_logfmt=True)
    with pytest.raises(TypeError, match="handle"):
        buffer.low_latency_combine(x, i, [gpu(w) for w in ws], (1, 2, 3, 4, 5))
    with pytest.raises(NotImplementedError, match="rank masking"):
        buffer.low_latency_update_mask_buffer(1, True)
    normal = deep_ep.Buffer(epic.VirtualWorld(R), num_nvl_bytes=64 << 20)
    with pytest.raises(ValueError, match="low_latency_mode=False"):
        normal.low_latency_dispatch(x, i, cap, E)
    normal.destroy()
    buffer.destroy()


def test_v1_buffer_helpers():
    """DeepEP V1's capture and get_local_buffer_tensor (a view of the window, no copy)."""
    R, E, K, H, cap = WORLDS[0]
    buffer = make_buffer(R, E, H, cap)
    event = buffer.capture()
    event.current_stream_wait()
    window = buffer._buffer.window_tensor(0)
    view = buffer.get_local_buffer_tensor(torch.bfloat16, torch.Size([4, 8]), offset=16)
    assert view.shape == (4, 8) and view.dtype == torch.bfloat16
    assert view.data_ptr() == window.data_ptr() + 32
    view.fill_(1.5)
    assert torch.equal(window[32:96].view(torch.bfloat16), torch.full((32,), 1.5,
                                                                      dtype=torch.bfloat16,
                                                                      device="cuda"))
    assert buffer.get_local_buffer_tensor(torch.int32, use_rdma_buffer=True).numel() == \
        window.numel() // 4
    with pytest.raises(ValueError, match="past the window"):
        buffer.get_local_buffer_tensor(torch.int32, offset=window.numel())
    buffer.destroy()
