"""bench/torch_baseline.py: the plain-PyTorch baselines of bench/ep_bench.py against
epic.reference (dispatch bit for bit; combine within bf16 rounding for the vectorized one,
whose sums' order is torch's, bit for bit for the naive one), on CPU tensors (and CUDA ones
where there is a GPU); and ep_bench's check of epic's rows (in arrival order) against the
baseline's."""

import dataclasses
import os
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", exc_type=ImportError)  # also a broken install

from epic import reference as ref  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import torch_baseline as B  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def world(seed, R=4, E=16, K=4, T=37, H=256, fp8=False):
    """Ragged ranks (rank r sends T - r tokens), some slots masked (-1), one token routed
    nowhere; numpy arrays as epic.reference takes them."""
    rng = np.random.default_rng(seed)
    xs, sfs, idxs, ws = [], [], [], []
    for r in range(R):
        tokens = T - r
        x = rng.standard_normal((tokens, H)).astype(np.float32)
        if fp8:
            data, scales = ref.per_token_cast_to_fp8(x)
            xs.append(data)
            sfs.append(scales)
        else:
            xs.append(x.astype(ref.bfloat16))
        idx = np.stack([rng.permutation(E)[:K] for _ in range(tokens)]).astype(np.int64)
        idx[rng.random(idx.shape) < 0.2] = -1
        idx[0] = -1
        idxs.append(idx)
        ws.append(rng.random((tokens, K), dtype=np.float32))
    return xs, (sfs if fp8 else None), idxs, ws


def to_torch(arrays, device, joint):
    """Per-rank numpy arrays as torch tensors: views of one tensor (`joint`, as ep_bench
    allocates them) or separate ones."""
    def one(a):
        if a.dtype == ref.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        if a.dtype == ref.float8_e4m3fn:
            return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
        return torch.from_numpy(a)
    parts = [one(np.ascontiguousarray(a)) for a in arrays]
    if not joint:
        return [p.to(device) for p in parts]
    return list(torch.cat(parts).to(device).split([p.shape[0] for p in parts]))


def raw(t):
    """A tensor's bytes as numpy (bit-exact comparisons of any dtype)."""
    return t.contiguous().cpu().view(torch.uint8).numpy()


def close(ours, theirs):
    """Within bf16 rounding of the reference's sums (ep_bench's tolerance)."""
    a, b = ours.float().cpu().numpy(), theirs.astype(np.float32)
    return bool((np.abs(a - b) <= 1e-2 + 1e-2 * np.abs(b)).all())


def real_rows(result):
    """Rows of a reference expanded output that hold a (token, expert): not padding."""
    slots = result.recv_src_metadata[:, 2:]
    return np.sort(slots[slots >= 0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("joint", [True, False])
def test_vectorized_baseline_is_the_reference(device, expand, fp8, joint):
    R, E, K, A = 4, 16, 4, 8
    xs, sfs, idxs, ws = world(seed=3 + 2 * expand + fp8, R=R, E=E, K=K, fp8=fp8)
    want = ref.dispatch(xs, idxs, ws, sfs, num_experts=E, expert_alignment=A, expand=expand)
    tx, tidx, tw = (to_torch(a, device, joint) for a in (xs, idxs, ws))
    tsf = None if sfs is None else to_torch(sfs, device, joint)
    ep = B.TorchEP(torch, R, E, K, A, expand)
    got = ep.dispatch(tx, tsf, tidx, tw)
    again = ep.dispatch(tx, tsf, tidx, tw)  # the persistent buffers, reused
    assert got.x[0].data_ptr() == again.x[0].data_ptr()

    pair_rank, pair_rows = (p.cpu().numpy() for p in ep.pair_rows(got)) if expand else (0, 0)
    offsets = np.cumsum([0] + [len(i) for i in idxs])
    for d, w in enumerate(want):
        assert got.num_recv[d] == w.num_recv_tokens
        if not expand:
            assert np.array_equal(raw(got.x[d]), w.recv_x.view(np.uint8))
            assert np.array_equal(got.topk_idx[d].cpu().numpy(), w.recv_topk_idx)
            assert np.array_equal(got.weights[d].cpu().numpy(), w.recv_topk_weights)
            if fp8:
                assert np.array_equal(raw(got.sf[d]), w.recv_scale_packs.view(np.uint8))
            continue
        assert got.expert_rows[d] == w.num_recv_tokens_per_expert_list
        rows = real_rows(w)  # padding rows: undefined content (epic without zero_padding)
        assert np.array_equal(raw(got.x[d])[rows], w.recv_x.view(np.uint8)[rows])
        assert np.array_equal(got.weights[d].cpu().numpy(), w.recv_topk_weights)
        if fp8:
            assert np.array_equal(raw(got.sf[d])[rows], w.recv_scale_packs.view(np.uint8)[rows])
        tmax = w.num_max_tokens_per_rank
        meta = w.recv_src_metadata
        g = offsets[meta[:, 0] // tmax] + meta[:, 0] % tmax
        assert np.array_equal(np.where(pair_rank[g] == d, pair_rows[g], -1), meta[:, 2:])

    rng = np.random.default_rng(9)
    ys = [rng.standard_normal((w.recv_x.shape[0], xs[0].shape[1])).astype(ref.bfloat16)
          for w in want]
    combined = ep.combine(to_torch(ys, device, joint), got)
    for out, w in zip(combined, ref.combine(ys, want)):
        assert close(out, w.combined_x)
    assert ep.combine(to_torch(ys, device, joint), got)[0].data_ptr() == combined[0].data_ptr()


@pytest.mark.parametrize("expand", [False, True])
def test_naive_baseline_is_the_reference(expand):
    R, E, K, A = 4, 16, 4, 8
    xs, _, idxs, ws = world(seed=5, R=R, E=E, K=K)
    want = ref.dispatch(xs, idxs, ws, num_experts=E, expert_alignment=A, expand=expand)
    tx, tidx, tw = (to_torch(a, "cpu", True) for a in (xs, idxs, ws))
    naive = B.NaiveTorchEP(torch, R, E, K, A, expand)
    got = naive.dispatch(tx, None, tidx, tw)
    for d, w in enumerate(want):
        rows = real_rows(w) if expand else slice(None)
        x = got[d]["ex" if expand else "x"]
        assert np.array_equal(raw(x)[rows], w.recv_x.view(np.uint8)[rows])
    rng = np.random.default_rng(9)
    ys = [rng.standard_normal((w.recv_x.shape[0], xs[0].shape[1])).astype(ref.bfloat16)
          for w in want]
    combined = naive.combine(to_torch(ys, "cpu", True), got, tidx)
    for out, w in zip(combined, ref.combine(ys, want)):
        assert np.array_equal(raw(out), w.combined_x.view(np.uint8))


def test_joined_is_a_view_only_of_adjacent_rows():
    base = torch.arange(24, dtype=torch.int64).view(8, 3)
    parts = list(base.split([3, 5]))
    assert B.joined(torch, parts).data_ptr() == base.data_ptr()
    assert torch.equal(B.joined(torch, parts), base)
    apart = [base[:2], base[4:]]
    assert torch.equal(B.joined(torch, apart), torch.cat(apart))
    # FP8 rows of 24 bytes move as 8-byte words; a part that starts mid-word as bytes.
    fp8 = torch.zeros((4, 24), dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert B.as_words(torch, list(fp8.split([1, 3])))[0].dtype == torch.int64
    assert B.as_words(torch, [fp8[:, 2:22]])[0].dtype == torch.int16


def arrival_order(result, rng):
    """A reference result with its rows in a kernel's arrival order: plain rows shuffled,
    expanded rows shuffled inside each expert's block (padding stays last) and the received
    tokens' metadata rows shuffled; the slot columns follow."""
    n = result.num_recv_tokens
    tokens = rng.permutation(n)
    meta = result.recv_src_metadata[tokens].copy()
    if not result.expand:
        return dataclasses.replace(
            result, recv_x=result.recv_x[tokens], recv_src_metadata=meta,
            recv_topk_idx=result.recv_topk_idx[tokens],
            recv_topk_weights=result.recv_topk_weights[tokens],
            recv_scale_packs=None if result.recv_scale_packs is None
            else result.recv_scale_packs[tokens])
    perm = np.arange(result.recv_x.shape[0])  # new row -> old row
    for start, count in zip(result.expert_starts(), result.num_unaligned_recv_tokens_per_expert):
        perm[start:start + count] = start + rng.permutation(int(count))
    new_of_old = np.empty_like(perm)
    new_of_old[perm] = np.arange(len(perm))
    meta[:, 2:] = np.where(meta[:, 2:] >= 0, new_of_old[np.maximum(meta[:, 2:], 0)], -1)
    return dataclasses.replace(
        result, recv_x=result.recv_x[perm], recv_src_metadata=meta,
        recv_topk_weights=result.recv_topk_weights[perm],
        recv_scale_packs=None if result.recv_scale_packs is None
        else result.recv_scale_packs[perm])


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("fp8", [False, True])
def test_bench_matches_kernel_rows_by_source(expand, fp8):
    """ep_bench's check of epic against the baseline, on reference results in arrival order
    standing in for epic's: equal, the combines' inputs mapped onto the baseline's rows (the
    sums then bitwise equal), and a changed byte found."""
    pytest.importorskip("epic._C")  # ep_bench imports the extension
    import ep_bench as E

    R, E_, K, A = 4, 16, 4, 8
    xs, sfs, idxs, ws = world(seed=11 + expand + 2 * fp8, R=R, E=E_, K=K, fp8=fp8)
    rng = np.random.default_rng(1)
    kernel = [arrival_order(w, rng) for w in ref.dispatch(
        xs, idxs, ws, sfs, num_experts=E_, expert_alignment=A, expand=expand)]
    one = lambda a: to_torch([a], "cpu", False)[0]  # noqa: E731
    recv = [(one(w.recv_x), one(w.recv_scale_packs)) if fp8 else one(w.recv_x) for w in kernel]
    recv_idx = [None if expand else one(w.recv_topk_idx) for w in kernel]
    recv_w = [one(w.recv_topk_weights) for w in kernel]
    handles = [types.SimpleNamespace(
        recv_src_metadata=one(w.recv_src_metadata), num_recv_tokens=w.num_recv_tokens,
        num_max_tokens_per_rank=w.num_max_tokens_per_rank,
        num_recv_tokens_per_expert_list=w.num_recv_tokens_per_expert_list) for w in kernel]

    ep = B.TorchEP(torch, R, E_, K, A, expand)
    tx, tidx, tw = (to_torch(a, "cpu", True) for a in (xs, idxs, ws))
    mine = ep.dispatch(tx, None if sfs is None else to_torch(sfs, "cpu", True), tidx, tw)
    tokens = [len(i) for i in idxs]
    bad, maps = E.check_dispatch(torch, ep, mine, (recv, recv_idx, recv_w), handles, tokens, fp8)
    assert bad == []

    ys = [rng.standard_normal((w.recv_x.shape[0], xs[0].shape[1])).astype(ref.bfloat16)
          for w in kernel]
    theirs = [one(c.combined_x) for c in ref.combine(ys, kernel)]
    ours = ep.combine(E.torch_layout(torch, [one(y) for y in ys], maps, mine), mine)
    assert E.combine_difference(torch, theirs, ours)[0] == []
    ours[1][0, 0] += 1.0
    far, bitwise = E.combine_difference(torch, theirs, ours)
    assert [s for s, _ in far] == [1] and not bitwise
    assert E.combine_difference(torch, theirs, theirs) == ([], True)

    d = 2
    row = int(maps[d][0][-1])  # a row that holds a token (expanded: not padding)
    (recv[d][0] if fp8 else recv[d]).view(torch.uint8)[row, 0] ^= 1
    bad, _ = E.check_dispatch(torch, ep, mine, (recv, recv_idx, recv_w), handles, tokens, fp8)
    assert bad == [f"rank {d}: recv_x"]


def test_summary_takes_epic_at_its_fastest_against_the_baseline(tmp_path):
    pytest.importorskip("epic._C")  # ep_bench imports the extension
    import ep_bench as E

    cfg = dict(tokens=4096, fp8=True, expand=True, alignment=128)
    sweep = [dict(sms=sms, dispatch_kernel_s=d, combine_kernel_s=c, cached_dispatch_kernel_s=k,
                  dispatch_wall_s=2 * d, combine_wall_s=2 * c,
                  dispatch_logical_gbs_per_rank=1.0, combine_logical_gbs_per_rank=1.0)
             for sms, d, c, k in ((64, 2e-3, 3e-3, 1e-3), (128, 1e-3, 4e-3, 0.5e-3))]
    res = dict(config=cfg, name=E.config_name(cfg), sweep=sweep, equal_to_naive_torch=True,
               bytes=dict(dispatch_floor=2e9, combine_floor=6e9, logical_dispatch=1e9,
                          logical_combine=1e9),
               torch_dispatch_kernel_s=4e-3, torch_combine_kernel_s=6e-3,
               naive_torch_dispatch_wall_s=0.02, naive_torch_combine_wall_s=0.03)
    summary = {res["name"]: E.summarize(res, roofline=4e12)}
    assert summary == {"t4096-fp8-expanded-a128": dict(
        dispatch_x_torch=4.0, combine_x_torch=2.0, dispatch_floor_fraction=0.5,
        cached_floor_fraction=1.0, combine_floor_fraction=0.5, dispatch_wall_ms=2.0,
        combine_wall_ms=6.0, sms=dict(dispatch=128, combine=64, cached_dispatch=128))}
    text = E.table([res], 4e12, summary)
    assert "t4096-fp8-expanded-a128" in text and "4.00x /  2.00x" in text
    E.plot([res], 4e12, 8, str(tmp_path / "plot.png"))  # False without matplotlib
