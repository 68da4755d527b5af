"""DeepEP V1's low-latency mode without a GPU: epic.reference's specification of it (the order
of the rows, the ranges, FP8 casts, the weighted combine), the size hint, and the C++ checks of
its calls (each bad argument named before anything runs)."""

import numpy as np
import pytest

import epic._C as C
import epic.deep_ep as deep_ep
from epic import _tensors as T
from epic import reference as ref


def inputs(R=2, E=8, K=3, H=256, tokens=(5, 3), seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((t, H)).astype(ref.bfloat16) for t in tokens[:R]]
    idxs = [np.stack([rng.permutation(E)[:K] for _ in range(t)]).reshape(t, K).astype(np.int64)
            for t in tokens[:R]]
    ws = [rng.uniform(0, 1, (t, K)).astype(np.float32) for t in tokens[:R]]
    return xs, idxs, ws


def test_rows_come_by_source_rank_then_token_and_the_ranges_say_where():
    xs, idxs, _ = inputs()
    idxs[0][1] = [2, -1, 5]
    idxs[1][0] = [2, 7, 1]
    got = ref.low_latency_dispatch(xs, idxs, 8, 6, use_fp8=False)
    L = 4
    for d, res in enumerate(got):
        assert res.recv_x.shape == (L, 2 * 6, 256) and res.recv_x.dtype == ref.bfloat16
        for local in range(L):
            e = d * L + local
            want = [(s, t) for s in range(2) for t in range(len(xs[s])) if e in idxs[s][t]]
            n = int(res.recv_count[local])
            assert n == len(want)
            assert res.src_info[local, :n].tolist() == [t for _, t in want]
            for row, (s, t) in enumerate(want):
                assert res.recv_x[local, row].tobytes() == xs[s][t].tobytes()
            begin = 0
            for s in range(2):
                count = sum(1 for src, _ in want if src == s)
                assert res.layout_range[local, s] == (begin << 32) | count
                begin += count
    # A token naming an expert twice arrives twice (k order).
    idxs[0][0] = [3, 3, -1]
    got = ref.low_latency_dispatch(xs, idxs, 8, 6, use_fp8=False)
    assert got[0].src_info[3, :2].tolist() == [0, 0]
    assert [k for s, t, k in got[0].sources[3][:2]] == [0, 1]


def test_fp8_casts_are_per_token_cast_to_fp8s():
    xs, idxs, _ = inputs(H=512)
    for rnd, ue8m0 in ((False, False), (True, False), (True, True)):
        got = ref.low_latency_dispatch(xs, idxs, 8, 6, use_fp8=True, round_scale=rnd,
                                       use_ue8m0=ue8m0)
        data, sf = ref.per_token_cast_to_fp8(xs[1].astype(np.float32), use_ue8m0=ue8m0,
                                             round_scale=rnd)
        res = got[int(idxs[1][0][0]) // 4]
        local = int(idxs[1][0][0]) % 4
        row = [i for i, (s, t, k) in enumerate(res.sources[local]) if (s, t) == (1, 0)][0]
        assert res.recv_x[local, row].tobytes() == data[0].tobytes()
        assert res.recv_scales[local, row].tobytes() == sf[0].tobytes()
        if rnd and not ue8m0:  # powers of two
            assert (np.frexp(res.recv_scales[local, row])[0] == 0.5).all()
        assert res.recv_scales.dtype == (np.int32 if ue8m0 else np.float32)
    with pytest.raises(ValueError, match="use_ue8m0 needs round_scale"):
        ref.low_latency_dispatch(xs, idxs, 8, 6, use_ue8m0=True)
    with pytest.raises(ValueError, match="more than the cap"):
        ref.low_latency_dispatch(xs, idxs, 8, 4)


def test_round_scale_is_exact_where_log2_rounds():
    """A scale just above a power of two rounds up to the next one (np.log2 in float32 would
    round onto the power itself)."""
    scale = np.float32(np.nextafter(np.float32(2.0 ** -6), np.float32(1)))
    x = np.zeros((1, 128), np.float32)
    x[0, 0] = scale * np.float32(448.0)
    _, sf = ref.per_token_cast_to_fp8(x, round_scale=True)
    assert sf[0, 0] == 2.0 ** -5


def test_combine_is_the_weighted_sum_in_k_order():
    xs, idxs, ws = inputs()
    idxs[0][2] = [-1, -1, -1]
    got = ref.low_latency_dispatch(xs, idxs, 8, 6, use_fp8=False)
    rng = np.random.default_rng(1)
    ys = [rng.standard_normal((4, 12, 256)).astype(ref.bfloat16) for _ in range(2)]
    out = ref.low_latency_combine(ys, got, idxs, ws)
    for s in range(2):
        for t in range(len(xs[s])):
            acc = np.zeros(256, np.float32)
            for k in range(3):
                e = idxs[s][t, k]
                if e < 0:
                    continue
                d, local = divmod(int(e), 4)
                row = got[d].sources[local].index((s, t, k))
                acc = acc + ys[d][local, row].astype(np.float32) * ws[s][t, k]
            assert out[s][t].tobytes() == acc.astype(ref.bfloat16).tobytes()
    assert not out[0][2].astype(np.float32).any()  # no expert: zeros


def test_size_hint_covers_the_kernels_window():
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256)
    layout = C.low_latency_layout(256, 8, 8, 7168)
    assert hint >= layout["base_bytes"] + 128 * layout["bytes_per_token"]
    assert 0.8e9 < hint < 1.2e9  # DeepEP's is of this size too (two buffers of E x cap rows)
    with pytest.raises(ValueError, match="divisible"):
        deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 3, 256)


def _call(R=2, E=8, K=4, H=256, cap=8, tokens=5, fp8=True, ue8m0=False, **override):
    L, rows = E // R, R * cap
    groups = H // 128
    call = {"x": np.zeros((tokens, H), ref.bfloat16),
            "topk_idx": np.zeros((tokens, K), np.int64),
            "recv_x": np.zeros((L, rows, H), ref.float8_e4m3fn if fp8 else ref.bfloat16),
            "recv_count": np.zeros(L, np.int32), "src_info": np.zeros((L, rows), np.int32),
            "layout_range": np.zeros((L, R), np.int64), "route": np.zeros((L, rows), np.int32)}
    if fp8:
        call["recv_x_scales"] = (np.zeros((L, (groups + 3) // 4, rows), np.int32) if ue8m0 else
                                 np.zeros((L, groups, rows), np.float32))
    call.update(override)
    spec = dict(num_ranks=R, num_experts=E, num_topk=K, hidden=H,
                dtype="f8E4M3FN" if fp8 else "bf16", num_scale_packs=groups if fp8 else 0,
                expert_alignment=1, do_expand=False, num_max_tokens_per_rank=cap)
    runtime = [{k: T.to_runtime(v) for k, v in call.items() if v is not None}
               for _ in range(R)]
    return spec, runtime


def test_the_runtime_checks_name_each_bad_argument():
    variant = dict(round_scale=False, use_ue8m0=False, parity=0, topk_idx_bits=64)
    spec, calls = _call()
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # all checked, then: host memory
        C.check("low_latency_dispatch", spec, variant, calls)
    for override, message in (
            (dict(recv_x=np.zeros((4, 16, 256), ref.bfloat16)), "recv_x must be f8E4M3FN"),
            (dict(recv_x_scales=np.zeros((4, 16, 2), np.float32)), "recv_x_scales must have "
                                                                   "shape"),
            (dict(x=np.zeros((9, 256), ref.bfloat16), topk_idx=np.zeros((9, 4), np.int64)),
             "more than num_max_dispatch_tokens_per_rank"),
            (dict(route=np.zeros((4, 16), np.int64)), "route must be i32"),
            (dict(topk_idx=np.zeros((5, 4), np.float32)), "topk_idx must be an i32 or i64")):
        spec, calls = _call(**override)
        with pytest.raises(ValueError, match=message):
            C.check("low_latency_dispatch", spec, variant, calls)
    spec, calls = _call()
    with pytest.raises(ValueError, match="parity must be 0 or 1"):
        C.check("low_latency_dispatch", spec, dict(variant, parity=2), calls)
    with pytest.raises(ValueError, match="use_ue8m0 needs round_scale"):
        C.check("low_latency_dispatch", spec, dict(variant, use_ue8m0=True), calls)
    spec, calls = _call(H=320)
    with pytest.raises(ValueError, match="multiple of 128"):
        C.check("low_latency_dispatch", spec, variant, calls)


def test_a_call_launches_one_kernel_or_the_phases_apart():
    """Without a receive hook both phases run in one kernel (the entry's third); with one, the
    send now and the receive when the hook is called, on the stream current then; each call
    moves the region parity on."""
    from epic._v1_low_latency import LowLatencyMethods

    launches = []

    class Plan:
        def launch(self, addresses, stream, first, kernels):
            launches.append((tuple(addresses), stream, first, kernels))

    class Buffer:
        stream = 7
        _destroyed = False

        def _current_stream(self):
            return self.stream

    class Caller(LowLatencyMethods):
        _buffer = Buffer()

    caller, plan = Caller(), type("P", (), {"plan": Plan()})()
    assert caller._ll_launch_phases(plan, [1, 2], False) is None
    assert launches == [((1, 2), 7, 2, 1)] and caller._ll_state()["parity"] == 1
    addresses = [3]
    hook = caller._ll_launch_phases(plan, addresses, True, stream=9)
    assert launches[-1] == ((3,), 9, 0, 1) and caller._ll_state()["parity"] == 0
    Caller._buffer.stream = 11
    addresses[0] = 4  # a pooled set's list, rewritten by a later call before the hook
    hook()
    assert launches[-1] == ((3,), 11, 1, 1) and len(launches) == 3
    Caller._buffer._destroyed = True  # a hook called after destroy() is refused by name
    with pytest.raises(RuntimeError, match="Buffer was destroyed"):
        hook()
    assert len(launches) == 3


def test_destroy_drops_the_low_latency_replays():
    """After destroy() no replay of a checked signature runs: the next call is checked and
    the destroyed buffer is named there."""
    from epic import _v1

    class Elastic:
        destroyed = False

        def destroy(self):
            self.destroyed = True

    buffer = _v1.Buffer.__new__(_v1.Buffer)
    buffer._buffer = Elastic()
    buffer._ll_state()["fast"]["key"] = lambda *args: None
    buffer.destroy()
    assert buffer._buffer.destroyed and "_ll" not in buffer.__dict__
    assert buffer._ll_state()["fast"] == {}
