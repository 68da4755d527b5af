"""The Python API on a GPU: epic.ElasticBuffer over virtual worlds, checked
bitwise against epic.reference (the executable DeepEP semantics).

Run on the H200 by tools/device/run.sh (PYTHONPATH=python); skipped without
torch or a GPU.
"""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import epic  # noqa: E402
from epic import _tensors as T  # noqa: E402
from epic import reference as ref  # noqa: E402

H = 512
TMAX = 96


to_numpy = T.torch_to_numpy
to_torch = T.numpy_to_torch


def synchronous_round_trip(buffer, xs, idxs, E):
    """Reference outputs: a plain dispatch then combine, CPU-synchronized."""
    recv_x, _, _, handles, _ = buffer.dispatch([to_torch(x) for x in xs],
                                               [to_torch(i) for i in idxs], num_experts=E)
    return buffer.combine(recv_x, handles)[0]


def assert_same_bf16(got, want):
    for r, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"rank {r}"


def inputs(R, E, K, seed, fp8=False, hidden=H):
    rng = np.random.default_rng(seed)
    tokens = [TMAX - 7 * r for r in range(R)]
    tokens[R // 2] = 0  # a rank with nothing to send
    idxs = []
    for t in tokens:
        idx = np.array([rng.permutation(E)[:K] for _ in range(t)], dtype=np.int64).reshape(t, K)
        idx[rng.random(idx.shape) < 0.1] = -1
        idxs.append(idx)
    ws = [rng.standard_normal((t, K)).astype(np.float32) for t in tokens]
    if fp8:
        casts = [ref.per_token_cast_to_fp8(rng.standard_normal((t, hidden)).astype(np.float32))
                 for t in tokens]
        xs, sfs = [c[0] for c in casts], [c[1] for c in casts]
    else:
        xs, sfs = [rng.standard_normal((t, hidden)).astype(ref.bfloat16) for t in tokens], None
    return rng, tokens, idxs, ws, xs, sfs


def as_result(expected, recv_x, recv_sf, recv_idx, recv_w, handle):
    """The kernel's output as a reference DispatchResult (rows in arrival order)."""
    return dataclasses.replace(
        expected,
        recv_x=to_numpy(recv_x),
        recv_scale_packs=to_numpy(recv_sf),
        recv_topk_idx=to_numpy(recv_idx),
        recv_topk_weights=to_numpy(recv_w),
        recv_src_metadata=to_numpy(handle.recv_src_metadata),
    )


def same_bits(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def rows_differ(got, want):
    """Which rows of two arrays differ (for an assertion's message)."""
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return "empty arrays with different bytes"

    def as_bytes(a):
        return np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)
    bad = np.nonzero((as_bytes(got) != as_bytes(want)).any(axis=1))[0]
    return f"{len(bad)} of {len(got)} rows differ, first {bad[:8].tolist()}"


def check_dispatch(expected, got, handle):
    s = ref.sort_by_source(got)
    for field in ("recv_x", "recv_scale_packs", "recv_topk_idx", "recv_src_metadata"):
        e = getattr(expected, field)
        assert e is None or same_bits(getattr(s, field), e), \
            f"{field}: {rows_differ(getattr(s, field), e)}"
    if expected.recv_topk_weights is not None:
        if expected.expand:
            assert same_bits(s.recv_topk_weights, expected.recv_topk_weights), \
                "recv_topk_weights"
        else:
            mine = expected.recv_topk_idx >= 0
            assert same_bits(np.where(mine, s.recv_topk_weights, 0),
                             np.where(mine, expected.recv_topk_weights, 0)), "recv_topk_weights"
    assert handle.num_recv_tokens_per_expert_list == expected.num_recv_tokens_per_expert_list, \
        (f"num_recv_tokens_per_expert_list: {handle.num_recv_tokens_per_expert_list}, "
         f"expected {expected.num_recv_tokens_per_expert_list}")
    for field in ("psum_num_recv_tokens_per_scaleup_rank", "psum_num_recv_tokens_per_expert",
                  "num_unaligned_recv_tokens_per_expert"):
        got, want = to_numpy(getattr(handle, field)), getattr(expected, field)
        assert same_bits(got, want), f"{field}: {got.tolist()}, expected {want.tolist()}"


# Worlds of 2 and 8 ranks, and 8 whose kernels stage every row in the window as a world of
# processes does (the NCCL path's dispatch and combine kernels, on 8 ranks of one GPU).
@pytest.fixture(scope="module", params=[(2, False), (8, False), (8, True)],
                ids=["2", "8", "8-staged"])
def world(request):
    R, staged = request.param
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R, staged=staged), num_max_tokens_per_rank=TMAX,
                                hidden=H, num_topk=6, use_fp8_dispatch=True,
                                explicitly_destroy=True)
    yield R, buffer
    buffer.destroy()


def test_plain_bf16_dispatch_then_combine_with_biases(world):
    R, buffer = world
    E, K = 8 * R, 6
    rng, tokens, idxs, ws, xs, _ = inputs(R, E, K, seed=R)
    expected = ref.dispatch(xs, idxs, ws, num_experts=E, num_max_tokens_per_rank=TMAX)
    stats = [torch.zeros(E // R, dtype=torch.int32, device="cuda") for _ in range(R)]
    recv_x, recv_idx, recv_w, handles, event = buffer.dispatch(
        [to_torch(x) for x in xs], [to_torch(i) for i in idxs], [to_torch(w) for w in ws],
        cumulative_local_expert_recv_stats=stats, num_experts=E)
    got = []
    for r in range(R):
        assert recv_x[r].shape == (expected[r].num_recv_tokens, H)
        got.append(as_result(expected[r], recv_x[r], None, recv_idx[r], recv_w[r], handles[r]))
        check_dispatch(expected[r], got[r], handles[r])
        assert same_bits(to_numpy(stats[r]), expected[r].num_unaligned_recv_tokens_per_expert)

    # Expert outputs in each rank's arrival order, two biases, weights back.
    ys = [rng.standard_normal((g.num_recv_tokens, H)).astype(ref.bfloat16) for g in got]
    biases = [(rng.standard_normal((t, H)).astype(ref.bfloat16),
               rng.standard_normal((t, H)).astype(ref.bfloat16)) for t in tokens]
    want = ref.combine(ys, got, topk_weights=[g.recv_topk_weights for g in got], bias=biases)
    out, out_w, _ = buffer.combine([to_torch(y) for y in ys], handles, topk_weights=recv_w,
                                   bias=[tuple(to_torch(b) for b in pair) for pair in biases])
    for r in range(R):
        assert same_bits(to_numpy(out[r]), want[r].combined_x)
        assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights)
        # combined_topk_weights reproduce the original weights (0 where masked)
        assert same_bits(to_numpy(out_w[r]), np.where(idxs[r] >= 0, ws[r], 0).astype(np.float32))


def test_fp8_expanded_zero_padding_and_cached_dispatch(world):
    R, buffer = world
    E, K = 8 * R, 6
    rng, tokens, idxs, ws, xs, sfs = inputs(R, E, K, seed=10 + R, fp8=True)
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=E, num_max_tokens_per_rank=TMAX,
                            expert_alignment=128, expand=True, zero_padding=True)
    x_in = [(to_torch(x), to_torch(sf)) for x, sf in zip(xs, sfs)]
    recv, recv_idx, recv_w, handles, _ = buffer.dispatch(
        x_in, [to_torch(i) for i in idxs], [to_torch(w) for w in ws], num_experts=E,
        expert_alignment=128, do_expand=True, do_zero_padding=True)
    got = []
    for r in range(R):
        assert recv_idx[r] is None and recv_w[r].dim() == 1
        data, sf = recv[r]
        assert data.dtype == torch.float8_e4m3fn and data.shape[0] % 128 == 0
        got.append(as_result(expected[r], data, sf, None, recv_w[r], handles[r]))
        check_dispatch(expected[r], got[r], handles[r])

    ys = [rng.standard_normal((g.recv_x.shape[0], H)).astype(ref.bfloat16) for g in got]
    want = ref.combine(ys, got, topk_weights=[g.recv_topk_weights for g in got])
    out, out_w, _ = buffer.combine([to_torch(y) for y in ys], handles, topk_weights=recv_w)
    for r in range(R):
        assert same_bits(to_numpy(out[r]), want[r].combined_x)
        assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights)

    # Cached: same routing, no count exchange, rows land exactly where they did.
    again, again_idx, again_w, again_handles, _ = buffer.dispatch(x_in, handle=handles,
                                                                  do_expand=True,
                                                                  do_zero_padding=True)
    for r in range(R):
        assert again_handles[r] is handles[r] and again_w[r] is None
        assert same_bits(to_numpy(again[r][0]), to_numpy(recv[r][0]))
        assert same_bits(to_numpy(again[r][1]), to_numpy(recv[r][1]))


@pytest.mark.parametrize("do_expand", [False, True])
def test_cached_fp8_dispatch_of_new_data_lands_where_the_handle_says(world, do_expand):
    R, buffer = world
    E, K = 8 * R, 6
    _, _, idxs, _, xs, sfs = inputs(R, E, K, seed=60 + R, fp8=True)
    _, _, _, _, new_xs, new_sfs = inputs(R, E, K, seed=70 + R, fp8=True)  # same token counts
    # The layouts prepare_buffer_kernels.py compiles; expanded rows are padded to 128, and the
    # padding is zeroed so that every output row is compared.
    alignment = 128 if do_expand else 1
    handles = buffer.dispatch([(to_torch(x), to_torch(sf)) for x, sf in zip(xs, sfs)],
                              [to_torch(i) for i in idxs], num_experts=E,
                              expert_alignment=alignment, do_expand=do_expand)[3]
    expected = ref.dispatch(new_xs, idxs, None, new_sfs, num_experts=E,
                            num_max_tokens_per_rank=TMAX, expert_alignment=alignment,
                            expand=do_expand, zero_padding=do_expand)
    recv, recv_idx, recv_w, again, _ = buffer.dispatch(
        [(to_torch(x), to_torch(sf)) for x, sf in zip(new_xs, new_sfs)], handle=handles,
        do_expand=do_expand, do_zero_padding=do_expand)
    for r in range(R):
        assert again[r] is handles[r] and recv_w[r] is None
        data, sf = recv[r]
        got = as_result(expected[r], data, sf, recv_idx[r], None, handles[r])
        check_dispatch(expected[r], got, handles[r])


# 1032 bf16 = 129 16-byte chunks: lanes of a warp make different numbers of chunk steps, the
# case where a row walk that shuffles inside its chunk loop would hang or read garbage.
H_RAGGED = 1032


@pytest.mark.parametrize("do_expand", [False, True])
def test_ragged_hidden_round_trip_and_kernel_times(world, do_expand):
    R, fixture = world
    E, K, staged = 8 * R, 6, fixture.group.staged
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R, staged=staged), num_max_tokens_per_rank=TMAX,
                                hidden=H_RAGGED, num_topk=K, explicitly_destroy=True)
    # One pass: counts, then every row scattered in place (a cached dispatch: the scatter
    # alone). Staged, as across processes: rows sent into the window, then copied out.
    fresh = ["ep_dispatch_send", "ep_dispatch_copy"] if staged else \
        ["ep_dispatch_count", "ep_dispatch_scatter"]
    cached = fresh if staged else ["ep_dispatch_scatter"]
    try:
        rng, tokens, idxs, ws, xs, _ = inputs(R, E, K, seed=40 + R, hidden=H_RAGGED)
        expected = ref.dispatch(xs, idxs, ws, num_experts=E, num_max_tokens_per_rank=TMAX,
                                expand=do_expand)
        buffer.time_kernels(True)
        recv_x, recv_idx, recv_w, handles, _ = buffer.dispatch(
            [to_torch(x) for x in xs], [to_torch(i) for i in idxs], [to_torch(w) for w in ws],
            num_experts=E, do_expand=do_expand)
        timed = buffer.kernel_times()
        assert [name for name, _ in timed] == fresh, timed
        assert all(seconds > 0 for _, seconds in timed) and buffer.kernel_times() == []
        buffer.time_kernels(False)
        got = [as_result(expected[r], recv_x[r], None, recv_idx[r], recv_w[r], handles[r])
               for r in range(R)]
        for r in range(R):
            check_dispatch(expected[r], got[r], handles[r])
        ys = [rng.standard_normal((g.recv_x.shape[0], H_RAGGED)).astype(ref.bfloat16) for g in got]
        want = ref.combine(ys, got, topk_weights=[g.recv_topk_weights for g in got])
        out, out_w, _ = buffer.combine([to_torch(y) for y in ys], handles, topk_weights=recv_w)
        assert buffer.kernel_times() == []  # timing is off again
        for r in range(R):
            assert same_bits(to_numpy(out[r]), want[r].combined_x)
            assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights)
        buffer.time_kernels(True)
        again, again_idx = buffer.dispatch([to_torch(x) for x in xs], handle=handles,
                                           do_expand=do_expand)[:2]
        timed = buffer.kernel_times()
        buffer.time_kernels(False)
        assert [name for name, _ in timed] == cached, timed
        for r in range(R):
            assert same_bits(to_numpy(again[r]), to_numpy(recv_x[r]))
            if not do_expand:
                assert same_bits(to_numpy(again_idx[r]), to_numpy(recv_idx[r]))
    finally:
        buffer.destroy()


def test_async_events_and_previous_event(world):
    R, buffer = world
    E, K = 8 * R, 6
    _, _, idxs, ws, xs, _ = inputs(R, E, K, seed=20 + R)
    args = ([to_torch(x) for x in xs], [to_torch(i) for i in idxs])
    sync_out = synchronous_round_trip(buffer, xs, idxs, E)
    previous = epic.ElasticBuffer.capture()
    recv_x, _, _, handles, event = buffer.dispatch(*args, num_experts=E, previous_event=previous,
                                                   async_with_compute_stream=True,
                                                   allocate_on_comm_stream=True)
    assert isinstance(event, epic.EventOverlap) and event.event is not None
    event.current_stream_wait()
    out, _, event = buffer.combine(recv_x, handles, async_with_compute_stream=True)
    with event:
        pass
    assert_same_bf16(out, sync_out)


def test_without_cpu_sync_outputs_keep_the_worst_case(world):
    R, buffer = world
    E, K = 8 * R, 6
    _, _, idxs, ws, xs, _ = inputs(R, E, K, seed=30 + R)
    expected = ref.dispatch(xs, idxs, num_experts=E, num_max_tokens_per_rank=TMAX)
    recv_x, recv_idx, _, handles, _ = buffer.dispatch([to_torch(x) for x in xs],
                                                      [to_torch(i) for i in idxs],
                                                      num_experts=E, do_cpu_sync=False,
                                                      num_sms=1)
    for r in range(R):
        assert recv_x[r].shape == (R * TMAX, H)
        assert handles[r].num_recv_tokens_per_expert_list == []
        n = int(handles[r].psum_num_recv_tokens_per_scaleup_rank[-1])
        assert n == expected[r].num_recv_tokens
    out, _, _ = buffer.combine(recv_x, handles)  # worst-case rows, as DeepEP's
    assert_same_bf16(out, synchronous_round_trip(buffer, xs, idxs, E))


def test_bad_calls_are_refused_before_any_kernel(world):
    R, buffer = world
    E, K = 8 * R, 6
    _, _, idxs, _, xs, _ = inputs(R, E, K, seed=40 + R)
    x = [to_torch(v) for v in xs]
    idx = [to_torch(i) for i in idxs]
    bad = [i.clone() for i in idx]
    bad[0][3, 2] = E + 5
    with pytest.raises(ValueError, match=rf"topk_idx\[0\]\[3\]\[2\] = {E + 5} is out of range"):
        buffer.dispatch(x, bad, num_experts=E)
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor, it is on the CPU"):
        buffer.dispatch([v.cpu() for v in x], idx, num_experts=E)
    too_many = [torch.zeros((TMAX + 1, H), dtype=torch.bfloat16, device="cuda")] * R
    with pytest.raises(ValueError, match="more than num_max_tokens_per_rank"):
        buffer.dispatch(too_many,
                        [torch.full((TMAX + 1, K), -1, dtype=torch.int64, device="cuda")] * R,
                        num_experts=E)
    with pytest.raises(ValueError, match=r"rank 0: topk_idx must be i64, got i32"):
        buffer.dispatch(x, [i.int() for i in idx], num_experts=E)
    other = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=TMAX, hidden=H,
                               explicitly_destroy=True)
    recv_x, _, _, handles, _ = other.dispatch(x, idx, num_experts=E)
    with pytest.raises(ValueError, match=r"handle\[0\]: comes from another ElasticBuffer"):
        buffer.combine(recv_x, handles)
    other.destroy()


@pytest.mark.parametrize("do_expand", [False, True])
def test_autograd_backward_of_dispatch_is_combine_and_back(world, do_expand):
    """Gradients through dispatch -> per-expert scale -> combine, against the
    same computation written with plain torch indexing (float32, exact here:
    small integers in bf16)."""
    from epic import autograd

    R, buffer = world
    E, K = 8 * R, 6
    L = E // R
    rng, tokens, idxs, ws, _, _ = inputs(R, E, K, seed=50 + R)
    xs = [torch.from_numpy(rng.integers(-4, 5, (t, H)).astype(np.float32)).cuda()
          .to(torch.bfloat16).requires_grad_() for t in tokens]
    idx = [to_torch(i) for i in idxs]
    kwargs = dict(do_expand=True, expert_alignment=4) if do_expand else {}
    recv_x, _, handles = autograd.dispatch(buffer, xs, idx, num_experts=E, **kwargs)
    # A toy expert: scale each received row (by its first local expert + 1).
    ys = []
    for r in range(R):
        h = handles[r]
        if do_expand:
            counts = h.num_recv_tokens_per_expert_list
            scale = torch.repeat_interleave(torch.arange(1, L + 1, device="cuda"),
                                            torch.tensor(counts, device="cuda"))
        else:
            scale = torch.ones(h.num_recv_tokens, device="cuda")
        ys.append(recv_x[r] * scale[:, None].to(torch.bfloat16))
    out = autograd.combine(buffer, ys, handles)
    loss = sum((o.float() * (r % 2 + 1)).sum() for r, o in enumerate(out))
    loss.backward()
    # d loss / d x[s][t] = (s % 2 + 1) * sum over the copies of t of their scale
    # (every value stays a small integer: bf16 holds it exactly).
    for s in range(R):
        want = torch.zeros(tokens[s], dtype=torch.float32, device="cuda")
        for t in range(tokens[s]):
            experts = [e for e in idxs[s][t] if e >= 0]
            if do_expand:
                want[t] = sum(e % L + 1 for e in experts)
            else:
                want[t] = len({e // L for e in experts})
        want = (s % 2 + 1) * want[:, None].expand(-1, H)
        assert torch.equal(xs[s].grad.float(), want), f"rank {s}"


@pytest.mark.parametrize("do_expand", [False, True])
def test_deterministic_buffers_return_rows_in_source_order(world, do_expand):
    R, _ = world
    E, K = 8 * R, 6
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=TMAX, hidden=H,
                                num_topk=K, use_fp8_dispatch=True, deterministic=True,
                                explicitly_destroy=True)
    rng, tokens, idxs, ws, xs, sfs = inputs(R, E, K, seed=60 + R, fp8=True)
    alignment = 128 if do_expand else 1
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=E, num_max_tokens_per_rank=TMAX,
                            expert_alignment=alignment, expand=do_expand, zero_padding=do_expand)
    x_in = [(to_torch(x), to_torch(sf)) for x, sf in zip(xs, sfs)]
    # Padding rows are unspecified without zero padding: ask for it to compare them too.
    kwargs = dict(num_experts=E, expert_alignment=alignment, do_expand=do_expand,
                  do_zero_padding=do_expand)
    recv, recv_idx, recv_w, handles, _ = buffer.dispatch(
        x_in, [to_torch(i) for i in idxs], [to_torch(w) for w in ws], **kwargs,
        use_tma_aligned_col_major_sf=True)
    for r in range(R):
        e = expected[r]
        data, sf = recv[r]
        # Already canonical: equal to the reference without sorting.
        assert same_bits(to_numpy(data), e.recv_x)
        assert sf.stride() == (1, (sf.shape[0] + 3) // 4 * 4)  # TMA-aligned column-major
        assert same_bits(to_numpy(sf.contiguous()), e.recv_scale_packs)
        assert same_bits(to_numpy(handles[r].recv_src_metadata), e.recv_src_metadata)
        if not do_expand:
            assert same_bits(to_numpy(recv_idx[r]), e.recv_topk_idx)
    ys = [rng.standard_normal((e.recv_x.shape[0], H)).astype(ref.bfloat16) for e in expected]
    want = ref.combine(ys, expected, topk_weights=[e.recv_topk_weights for e in expected])
    out, out_w, _ = buffer.combine([to_torch(y) for y in ys], handles,
                                   topk_weights=[w.contiguous() for w in recv_w])
    for r in range(R):
        assert same_bits(to_numpy(out[r]), want[r].combined_x)
        assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights)
    again, _, _, _, _ = buffer.dispatch(x_in, handle=handles, do_expand=do_expand,
                                        do_zero_padding=do_expand)
    for r in range(R):
        assert same_bits(to_numpy(again[r][0]), to_numpy(recv[r][0]))
    buffer.barrier()
    buffer.barrier(use_comm_stream=False, with_cpu_sync=True)
    buffer.destroy()


def two_by_two(topk, **options):
    """An ElasticBuffer over a virtual world of 2 nodes x 2 GPUs (hybrid unless told)."""
    return epic.ElasticBuffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=2),
                              num_max_tokens_per_rank=TMAX, hidden=H, num_topk=topk,
                              explicitly_destroy=True, **options)


def dispatch_two_nodes(buffer, topk, seed, hybrid):
    """A BF16 dispatch with weights on a two_by_two buffer: (rng, routing, the reference's
    results, then recv_x, recv_topk_idx, recv_topk_weights and handles as dispatch returns)."""
    R, E = 4, 32
    rng, _, idxs, ws, xs, _ = inputs(R, E, topk, seed=seed)
    expected = ref.dispatch(xs, idxs, ws, num_experts=E, num_max_tokens_per_rank=TMAX,
                            gpus_per_node=2, hybrid=hybrid)
    recv_x, recv_idx, recv_w, handles, _ = buffer.dispatch(
        [to_torch(x) for x in xs], [to_torch(i) for i in idxs], [to_torch(w) for w in ws],
        num_experts=E)
    return rng, idxs, expected, recv_x, recv_idx, recv_w, handles


def combine_two_nodes(buffer, rng, got, handles, recv_w):
    """Random rows back through the combine with weights: bitwise as the reference's."""
    ys = [rng.standard_normal((g.num_recv_tokens, H)).astype(ref.bfloat16) for g in got]
    want = ref.combine(ys, got, topk_weights=[g.recv_topk_weights for g in got])
    out, out_w, _ = buffer.combine([to_torch(y) for y in ys], handles, topk_weights=recv_w)
    for r in range(len(got)):
        assert same_bits(to_numpy(out[r]), want[r].combined_x), f"rank {r}"
        assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights), f"rank {r}"


def test_two_nodes_direct_round_trip():
    """2 nodes x 2 GPUs, direct mode: the other node's ranks are reached through (virtual) GIN,
    NVLink pointers stay in the node (one across would trap); bitwise as the reference."""
    R, K = 4, 6
    buffer = two_by_two(K, allow_hybrid_mode=False)
    try:
        assert buffer.get_physical_domain_size() == (2, 2)
        assert buffer.get_logical_domain_size() == (1, 4)
        rng, _, expected, recv_x, recv_idx, recv_w, handles = dispatch_two_nodes(
            buffer, K, seed=21, hybrid=False)
        got = [as_result(expected[r], recv_x[r], None, recv_idx[r], recv_w[r], handles[r])
               for r in range(R)]
        for r in range(R):
            check_dispatch(expected[r], got[r], handles[r])
        assert buffer._state.gpus_per_node == 2  # created by the first call
        traffic = np.asarray(buffer._state.take_traffic()).reshape(R, R, 3)
        node = np.arange(R) // 2
        assert traffic[node[:, None] != node[None, :], 0].sum() > 0, "no puts between nodes"
        assert not traffic[node[:, None] == node[None, :]].any(), "GIN traffic inside a node"
        combine_two_nodes(buffer, rng, got, handles, recv_w)
    finally:
        buffer.destroy()


def test_two_nodes_hybrid_deterministic_rows_in_reference_order():
    """A deterministic hybrid buffer returns the rows in the reference's hybrid order (by
    forwarder index lsa(src), then source id), without sorting on the caller's side."""
    R, K = 4, 6
    buffer = two_by_two(K, deterministic=True)
    try:
        rng, _, expected, recv_x, recv_idx, _, handles = dispatch_two_nodes(
            buffer, K, seed=23, hybrid=True)
        for r in range(R):
            e = expected[r]
            assert same_bits(to_numpy(recv_x[r]), e.recv_x), \
                f"rank {r}: {rows_differ(to_numpy(recv_x[r]), e.recv_x)}"
            assert same_bits(to_numpy(recv_idx[r]), e.recv_topk_idx), f"rank {r}"
            meta = to_numpy(handles[r].recv_src_metadata)
            assert same_bits(meta[:, 0], e.recv_src_metadata[:, 0]), f"rank {r}: source ids"
            assert same_bits(to_numpy(handles[r].psum_num_recv_tokens_per_scaleup_rank),
                             e.psum_num_recv_tokens_per_scaleup_rank), f"rank {r}"
        got = [as_result(expected[r], recv_x[r], None, recv_idx[r], None, handles[r])
               for r in range(R)]
        ref.check_hybrid_metadata(got, expected)
        ys = [rng.standard_normal((g.num_recv_tokens, H)).astype(ref.bfloat16) for g in got]
        want = ref.combine(ys, got)
        out, _, _ = buffer.combine([to_torch(y) for y in ys], handles)
        for r in range(R):
            assert same_bits(to_numpy(out[r]), want[r].combined_x), f"rank {r}"
    finally:
        buffer.destroy()


def test_two_nodes_hybrid_round_trip():
    """2 nodes x 2 GPUs, hybrid mode (DeepEP's default across nodes): a token crosses to each
    other node once, to its forwarder there; the combine reduces per node at the forwarder.
    Bitwise as the reference's hybrid semantics; column 1 of the metadata by
    check_hybrid_metadata; puts between nodes exactly expected_network_bytes(hybrid)."""
    R, E, K = 4, 32, 6
    buffer = two_by_two(K)
    try:
        assert buffer.get_logical_domain_size() == (2, 2)
        rng, idxs, expected, recv_x, recv_idx, recv_w, handles = dispatch_two_nodes(
            buffer, K, seed=22, hybrid=True)
        got = [as_result(expected[r], recv_x[r], None, recv_idx[r], recv_w[r], handles[r])
               for r in range(R)]
        ref.check_hybrid_metadata(got, expected)
        for r in range(R):  # column 1 checked above; the reference writes -1 there
            got[r].recv_src_metadata[:, 1] = -1
            check_dispatch(expected[r], got[r], handles[r])
        traffic = np.asarray(buffer._state.take_traffic()).reshape(R, R, 3)
        record = epic._C.record_bytes(buffer._spec(R, E, K, H, "bf16", 0, 1, False, TMAX))
        want_net = ref.expected_network_bytes(idxs, E, 2, "hybrid", record["dispatch"])
        assert same_bits(traffic[:, :, 0].astype(np.int64), want_net.astype(np.int64))
        node = np.arange(R) // 2
        assert not traffic[node[:, None] == node[None, :]].any(), "GIN traffic inside a node"
        for r in range(R):
            got[r].recv_src_metadata[:] = to_numpy(handles[r].recv_src_metadata)
        combine_two_nodes(buffer, rng, got, handles, recv_w)
    finally:
        buffer.destroy()


@pytest.mark.parametrize("do_expand", [False, True])
def test_window_outputs_write_rows_in_place_and_combine_reads_them_there(do_expand):
    """window_outputs: the outputs and handle lie in each rank's window, the kernels meet at
    barriers and reach each other's tensors through the records they publish there (the
    protocol a multi-process world runs); the same results as the reference, and the combine
    reads its input in place, bitwise the same sums."""
    for R in (2, 8):
        E, K = 8 * R, 6
        buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=64 << 20,
                                    num_max_tokens_per_rank=TMAX, hidden=H, num_topk=K,
                                    use_fp8_dispatch=True, explicitly_destroy=True)
        rng, tokens, idxs, ws, xs, sfs = inputs(R, E, K, seed=80 + R, fp8=True)
        alignment = 128 if do_expand else 1
        expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=E, num_max_tokens_per_rank=TMAX,
                                expert_alignment=alignment, expand=do_expand,
                                zero_padding=do_expand)
        x_in = [(to_torch(x), to_torch(sf)) for x, sf in zip(xs, sfs)]
        recv, recv_idx, recv_w, handles, _ = buffer.dispatch(
            x_in, [to_torch(i) for i in idxs], [to_torch(w) for w in ws], num_experts=E,
            expert_alignment=alignment, do_expand=do_expand, do_zero_padding=do_expand,
            window_outputs=True)
        got = []
        for r in range(R):
            data, sf = recv[r]
            assert buffer._in_window(data, r) and buffer._in_window(sf, r)
            got.append(as_result(expected[r], data, sf, None if do_expand else recv_idx[r],
                                 recv_w[r], handles[r]))
            check_dispatch(expected[r], got[r], handles[r])
        ys = [rng.standard_normal((g.recv_x.shape[0], H)).astype(ref.bfloat16) for g in got]
        want = ref.combine(ys, got, topk_weights=[g.recv_topk_weights for g in got])
        # The copy path first (x outside the window), then in place: the same bits.
        staged, staged_w, _ = buffer.combine([to_torch(y) for y in ys], handles,
                                             topk_weights=recv_w)
        inputs_in_window = buffer.combine_input_buffer(handles)
        for r in range(R):
            inputs_in_window[r].copy_(to_torch(ys[r]))
            assert buffer._in_window(inputs_in_window[r], r)
        out, out_w, _ = buffer.combine(inputs_in_window, handles, topk_weights=recv_w)
        for r in range(R):
            assert same_bits(to_numpy(out[r]), want[r].combined_x)
            assert same_bits(to_numpy(out_w[r]), want[r].combined_topk_weights)
            assert same_bits(to_numpy(staged[r]), to_numpy(out[r]))
            assert same_bits(to_numpy(staged_w[r]), to_numpy(out_w[r]))
        # A later dispatch with window_outputs reuses the memory: the old handle is refused.
        buffer.dispatch(x_in, [to_torch(i) for i in idxs], num_experts=E,
                        expert_alignment=alignment, do_expand=do_expand,
                        do_zero_padding=do_expand, window_outputs=True)
        with pytest.raises(ValueError, match="a later dispatch with window_outputs"):
            buffer.combine(inputs_in_window, handles)
        with pytest.raises(ValueError, match="window_outputs: a cached dispatch"):
            buffer.dispatch(x_in, handle=handles, do_expand=do_expand, window_outputs=True)
        copied = buffer.dispatch(x_in, [to_torch(i) for i in idxs], num_experts=E,
                                 expert_alignment=alignment, do_expand=do_expand,
                                 do_zero_padding=do_expand)[3]
        with pytest.raises(ValueError, match="not of a dispatch with window_outputs=True"):
            buffer.combine_input_buffer(copied)
        buffer.destroy()
