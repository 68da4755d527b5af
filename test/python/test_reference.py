"""Tests of the numpy reference of DeepEP V2 dispatch/combine (epic.reference).

Expected values are computed here with plain per-token loops that follow the
written semantics, independently of the vectorised reference.
"""

import dataclasses
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import epic
from epic import reference as ref

BF16 = ref.bfloat16
FP8 = ref.float8_e4m3fn

# (num_ranks, num_experts, num_topk, max_tokens, expert_alignment)
WORLDS = [
    (1, 8, 2, 16, 1),
    (2, 8, 8, 33, 4),
    (2, 16, 1, 20, 1),
    (4, 16, 4, 64, 1),
    (4, 32, 6, 9, 3),
    (8, 16, 3, 1, 2),
    (8, 32, 8, 40, 128),
]
WORLD_IDS = [f"R{r}-E{e}-K{k}-T{t}-A{a}" for r, e, k, t, a in WORLDS]


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def bits(a):
    """Raw bits of an array, for bitwise comparisons independent of NaN rules."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_bitwise_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


def random_topk(rng, num_tokens, num_experts, num_topk, p_drop=0.2, p_empty=0.1):
    """Distinct experts per row, some slots -1 and some rows entirely -1."""
    idx = np.argsort(rng.random((num_tokens, num_experts)), axis=1)[:, :num_topk].astype(np.int64)
    idx[rng.random((num_tokens, num_topk)) < p_drop] = -1
    idx[rng.random(num_tokens) < p_empty] = -1
    return idx


def make_world(seed, num_ranks, num_experts, num_topk, max_tokens, hidden=256, x_dtype=BF16):
    rng = np.random.default_rng(seed)
    num_tokens = [int(rng.integers(0, max_tokens + 1)) for _ in range(num_ranks)]
    num_tokens[0] = max_tokens  # the largest rank defines the default Tmax
    idxs = [random_topk(rng, t, num_experts, num_topk) for t in num_tokens]
    xs = [rng.standard_normal((t, hidden)).astype(np.float32).astype(x_dtype) for t in num_tokens]
    weights = [rng.random((t, num_topk), dtype=np.float32) for t in num_tokens]
    return rng, xs, idxs, weights


def owned_slots(row, rank, num_local):
    return [j for j, e in enumerate(row) if e >= 0 and e // num_local == rank]


def master_order(row, num_local):
    """Destination ranks of a token, ordered by their master (highest) slot."""
    master = {}
    for j, e in enumerate(row):
        if e >= 0:
            master[int(e) // num_local] = j  # later slots overwrite: highest wins
    return sorted(master, key=master.get)


def ordered_sum(values, init=None):
    """float32 sum in the given order; the first value starts the sum unless init."""
    acc = None if init is None else init.astype(np.float32)
    for v in values:
        v = v.astype(np.float32)
        acc = v.copy() if acc is None else (acc + v).astype(np.float32)
    return acc


def to_bf16(a):
    return np.asarray(a, dtype=np.float32).astype(BF16)


def row_value(hidden, *key):
    """Deterministic bf16 row derived from an integer key."""
    phase = float(np.dot(np.asarray(key, dtype=np.float64) + 1, [0.37, 1.71, 2.93][: len(key)]))
    return to_bf16(np.sin(phase * np.arange(1, hidden + 1, dtype=np.float64)))


def simulate_kernel_order(results, seed):
    """Permute rows as a kernel with atomic slot allocation might.

    Plain rows are shuffled inside each source-rank group; expanded rows are
    shuffled inside each expert's valid block and metadata rows inside each
    source-rank group, with recv_src_metadata[:, 2:] rewritten to match.
    Returns (permuted results, per-rank permutation of the data rows).
    """
    rng = np.random.default_rng(seed)
    out, perms = [], []
    for res in results:
        bounds = np.concatenate([[0], res.psum_num_recv_tokens_per_scaleup_rank])
        meta_perm = np.concatenate(
            [lo + rng.permutation(hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:])]
        ).astype(np.int64)
        meta = res.recv_src_metadata[meta_perm]
        if not res.expand:
            perm = meta_perm
            new = dataclasses.replace(
                res,
                recv_x=res.recv_x[perm],
                recv_scale_packs=(
                    None if res.recv_scale_packs is None else res.recv_scale_packs[perm]
                ),
                recv_topk_idx=res.recv_topk_idx[perm],
                recv_topk_weights=(
                    None if res.recv_topk_weights is None else res.recv_topk_weights[perm]
                ),
                recv_src_metadata=meta,
            )
        else:
            perm = np.arange(res.recv_x.shape[0])
            for start, count in zip(res.expert_starts(), res.num_unaligned_recv_tokens_per_expert):
                perm[start : start + count] = start + rng.permutation(count)
            new_of_old = np.argsort(perm)
            meta[:, 2:] = np.where(meta[:, 2:] >= 0, new_of_old[np.maximum(meta[:, 2:], 0)], -1)
            new = dataclasses.replace(
                res,
                recv_x=res.recv_x[perm],
                recv_scale_packs=(
                    None if res.recv_scale_packs is None else res.recv_scale_packs[perm]
                ),
                recv_topk_weights=(
                    None if res.recv_topk_weights is None else res.recv_topk_weights[perm]
                ),
                recv_src_metadata=meta,
            )
        out.append(new)
        perms.append(perm)
    return out, perms


def assert_results_equal(a, b):
    for field in dataclasses.fields(a):
        va, vb = getattr(a, field.name), getattr(b, field.name)
        if isinstance(va, np.ndarray):
            assert_bitwise_equal(va, vb)
        else:
            assert va == vb, field.name


# ----------------------------------------------------------------------------
# Package
# ----------------------------------------------------------------------------


def test_package_is_light():
    # A fresh interpreter that finds the same epic as this one.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(epic.__file__)))
    code = (
        "import sys, epic; "
        "print(epic.__version__, "
        "'numpy' in sys.modules, 'epic.reference' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0.1.0", "False", "False"]
    assert epic.reference is ref


# ----------------------------------------------------------------------------
# dispatch_layout
# ----------------------------------------------------------------------------


def test_dispatch_layout_small_example():
    topk_idx = np.array([[0, 1], [2, 7], [-1, -1], [5, -1], [-1, 6]])
    per_rank, per_expert, in_rank = ref.dispatch_layout(topk_idx, num_experts=8, num_ranks=4)
    assert per_rank.dtype == np.int32 and per_expert.dtype == np.int32 and in_rank.dtype == bool
    # Token 0 picks two experts of rank 0 but counts once there.
    np.testing.assert_array_equal(per_rank, [1, 1, 1, 2])
    np.testing.assert_array_equal(per_expert, [1, 1, 1, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(
        in_rank,
        [[1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
    )


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_dispatch_layout_matches_loop(world):
    num_ranks, num_experts, num_topk, max_tokens, _ = world
    _, _, idxs, _ = make_world(1, *world[:4])
    num_local = num_experts // num_ranks
    for idx in idxs:
        per_rank, per_expert, in_rank = ref.dispatch_layout(idx, num_experts, num_ranks)
        exp_in_rank = np.zeros((idx.shape[0], num_ranks), dtype=bool)
        exp_per_expert = np.zeros(num_experts, dtype=np.int64)
        for t, row in enumerate(idx):
            for e in row:
                if e >= 0:
                    exp_in_rank[t, e // num_local] = True
                    exp_per_expert[e] += 1
        np.testing.assert_array_equal(in_rank, exp_in_rank)
        np.testing.assert_array_equal(per_rank, exp_in_rank.sum(0))
        np.testing.assert_array_equal(per_expert, exp_per_expert)


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_dispatch_layout_agrees_with_dispatch(world):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    _, xs, idxs, _ = make_world(2, *world[:4])
    results = ref.dispatch(xs, idxs, num_experts=num_experts, expert_alignment=align)
    layouts = [ref.dispatch_layout(idx, num_experts, num_ranks) for idx in idxs]
    num_local = num_experts // num_ranks
    for d, res in enumerate(results):
        assert res.num_recv_tokens == sum(lay[0][d] for lay in layouts)
        per_expert = sum(lay[1] for lay in layouts)[d * num_local : (d + 1) * num_local]
        np.testing.assert_array_equal(res.num_unaligned_recv_tokens_per_expert, per_expert)
        per_source = np.diff(res.psum_num_recv_tokens_per_scaleup_rank, prepend=0)
        np.testing.assert_array_equal(per_source, [lay[0][d] for lay in layouts])


# ----------------------------------------------------------------------------
# dispatch, plain layout
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_dispatch_plain_matches_loop(world):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    _, xs, idxs, weights = make_world(3, *world[:4])
    tmax = max_tokens + 5  # non-default Tmax shows up in the source global id
    results = ref.dispatch(
        xs,
        idxs,
        weights,
        num_experts=num_experts,
        num_max_tokens_per_rank=tmax,
        expert_alignment=align,
    )
    num_local = num_experts // num_ranks
    assert len(results) == num_ranks
    for d, res in enumerate(results):
        rows_x, rows_idx, rows_w, rows_meta, per_source = [], [], [], [], []
        counts = np.zeros(num_local, dtype=np.int64)
        for s in range(num_ranks):
            n = 0
            for t, row in enumerate(idxs[s]):
                slots = owned_slots(row, d, num_local)
                if not slots:
                    continue
                n += 1
                rows_x.append(xs[s][t])
                rows_idx.append(
                    [row[j] - d * num_local if j in slots else -1 for j in range(num_topk)]
                )
                rows_w.append(weights[s][t])
                rows_meta.append([s * tmax + t, s * num_topk + max(slots)] + [-1] * num_topk)
                for j in slots:
                    counts[row[j] - d * num_local] += 1
            per_source.append(n)

        n_recv = len(rows_x)
        hidden = xs[0].shape[1]
        assert res.rank == d and not res.expand
        assert_bitwise_equal(res.recv_x, np.array(rows_x, dtype=BF16).reshape(n_recv, hidden))
        np.testing.assert_array_equal(
            res.recv_topk_idx, np.array(rows_idx).reshape(n_recv, num_topk)
        )
        assert res.recv_topk_idx.dtype == np.int64
        assert_bitwise_equal(
            res.recv_topk_weights, np.array(rows_w, np.float32).reshape(n_recv, num_topk)
        )
        assert res.recv_src_metadata.dtype == np.int32
        want_meta = np.array(rows_meta).reshape(n_recv, num_topk + 2)
        np.testing.assert_array_equal(res.recv_src_metadata, want_meta)
        assert res.recv_scale_packs is None

        aligned = -(-counts // align) * align
        assert res.num_recv_tokens_per_expert_list == aligned.tolist()
        assert all(type(c) is int for c in res.num_recv_tokens_per_expert_list)
        np.testing.assert_array_equal(res.num_unaligned_recv_tokens_per_expert, counts)
        np.testing.assert_array_equal(res.psum_num_recv_tokens_per_expert, np.cumsum(aligned))
        np.testing.assert_array_equal(
            res.psum_num_recv_tokens_per_scaleup_rank, np.cumsum(per_source)
        )
        for a in (
            res.num_unaligned_recv_tokens_per_expert,
            res.psum_num_recv_tokens_per_expert,
            res.psum_num_recv_tokens_per_scaleup_rank,
        ):
            assert a.dtype == np.int32
        np.testing.assert_array_equal(res.topk_idx, idxs[d])
        assert res.num_max_tokens_per_rank == tmax


def test_dispatch_default_tmax_and_ordering():
    xs = [np.zeros((3, 128), BF16), np.zeros((5, 128), BF16)]
    idxs = [np.array([[3], [0], [2]]), np.array([[1], [-1], [2], [3], [0]])]
    results = ref.dispatch(xs, idxs, num_experts=4)
    assert results[0].num_max_tokens_per_rank == 5
    # Rank 1 owns experts 2 and 3: sources ascending, tokens ascending inside.
    np.testing.assert_array_equal(results[1].recv_src_metadata[:, 0], [0, 2, 5 + 2, 5 + 3])
    np.testing.assert_array_equal(results[1].recv_topk_idx[:, 0], [1, 0, 0, 1])
    np.testing.assert_array_equal(results[1].psum_num_recv_tokens_per_scaleup_rank, [2, 4])


def test_master_slot_is_highest_local_slot():
    # Slots 0, 2 and 3 go to rank 1 (experts 4..7); slot 1 to rank 0.
    idx = [np.array([[5, 1, 4, 7, -1]]), np.zeros((0, 5), np.int64)]
    xs = [np.zeros((1, 256), BF16), np.zeros((0, 256), BF16)]
    r0, r1 = ref.dispatch(xs, idx, num_experts=8)
    np.testing.assert_array_equal(r0.recv_src_metadata, [[0, 1, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(r1.recv_src_metadata, [[0, 3, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(r1.recv_topk_idx, [[1, -1, 0, 3, -1]])


def test_dtype_is_preserved():
    rng = np.random.default_rng(4)
    idx = [random_topk(rng, 7, 8, 2, p_empty=0), random_topk(rng, 4, 8, 2, p_empty=0)]
    for dtype in (np.float32, BF16, FP8, np.int8):
        xs = [rng.standard_normal((len(i), 128)).astype(np.float32).astype(dtype) for i in idx]
        for expand in (False, True):
            for res in ref.dispatch(xs, idx, num_experts=8, expand=expand):
                assert res.recv_x.dtype == np.dtype(dtype)


def test_tokens_routed_nowhere_are_not_received():
    xs = [np.ones((4, 128), BF16)] * 2
    idxs = [np.full((4, 3), -1)] * 2
    for expand in (False, True):
        for res in ref.dispatch(xs, idxs, num_experts=4, expert_alignment=8, expand=expand):
            assert res.recv_x.shape == (0, 128)
            assert res.recv_src_metadata.shape == (0, 5)
            assert res.num_recv_tokens_per_expert_list == [0, 0]
            np.testing.assert_array_equal(res.psum_num_recv_tokens_per_scaleup_rank, [0, 0])


# ----------------------------------------------------------------------------
# dispatch, expanded layout
# ----------------------------------------------------------------------------


def test_alignment_counts_and_prefix_sums():
    # One rank, experts 0..2: expert 0 gets 3 tokens, expert 1 none, expert 2 five.
    idx = np.array([[0, 2], [2, 0], [0, 2], [2, -1], [-1, 2]])
    x = np.arange(5 * 128, dtype=np.float32).reshape(5, 128).astype(BF16)
    (plain,) = ref.dispatch([x], [idx], num_experts=3, expert_alignment=4)
    (expd,) = ref.dispatch(
        [x], [idx], num_experts=3, expert_alignment=4, expand=True, zero_padding=True
    )
    for res in (plain, expd):
        assert res.num_recv_tokens_per_expert_list == [4, 0, 8]
        np.testing.assert_array_equal(res.num_unaligned_recv_tokens_per_expert, [3, 0, 5])
    np.testing.assert_array_equal(plain.psum_num_recv_tokens_per_expert, [4, 4, 12])
    # Expanded: start_e + count_e with starts [0, 4, 4].
    np.testing.assert_array_equal(expd.psum_num_recv_tokens_per_expert, [3, 4, 9])
    np.testing.assert_array_equal(expd.expert_starts(), [0, 4, 4])
    assert expd.recv_x.shape == (12, 128) and expd.num_expanded_tokens == 12
    assert expd.recv_topk_idx is None
    # Rows of expert 0: tokens 0,1,2; expert 2: tokens 0..4; everything else padding.
    expected_token = [0, 1, 2, None, 0, 1, 2, 3, 4, None, None, None]
    for row, t in enumerate(expected_token):
        want = np.zeros(128, BF16) if t is None else x[t]
        assert_bitwise_equal(expd.recv_x[row], want)
    np.testing.assert_array_equal(
        expd.recv_src_metadata[:, 2:], [[0, 4], [5, 1], [2, 6], [7, -1], [-1, 8]]
    )
    # The next expert starts at align(psum[e], A).
    psum = expd.psum_num_recv_tokens_per_expert
    np.testing.assert_array_equal(-(-psum[:-1] // 4) * 4, expd.expert_starts()[1:])


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_expanded_rows_equal_plain_rows(world):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    rng, xs, idxs, weights = make_world(5, *world[:4], x_dtype=FP8)  # packs travel with FP8 only
    packs = [
        rng.integers(-(2**31), 2**31, (len(i), 2), dtype=np.int64).astype(np.int32) for i in idxs
    ]
    kwargs = dict(num_experts=num_experts, expert_alignment=align)
    plain = ref.dispatch(xs, idxs, weights, packs, **kwargs)
    expd = ref.dispatch(xs, idxs, weights, packs, expand=True, zero_padding=True, **kwargs)
    num_local = num_experts // num_ranks
    for p, e in zip(plain, expd):
        assert e.expand and e.recv_topk_idx is None
        np.testing.assert_array_equal(e.recv_src_metadata[:, :2], p.recv_src_metadata[:, :2])
        assert (p.recv_src_metadata[:, 2:] == -1).all()
        assert e.num_recv_tokens_per_expert_list == p.num_recv_tokens_per_expert_list
        n_exp = sum(p.num_recv_tokens_per_expert_list)
        assert e.recv_x.shape == (n_exp, xs[0].shape[1]) and e.recv_topk_weights.shape == (n_exp,)
        starts = e.expert_starts()
        counts = e.num_unaligned_recv_tokens_per_expert
        np.testing.assert_array_equal(e.psum_num_recv_tokens_per_expert, starts + counts)

        referenced = np.zeros(n_exp, dtype=bool)
        for i in range(p.num_recv_tokens):
            for j in range(num_topk):
                row = e.recv_src_metadata[i, 2 + j]
                local = p.recv_topk_idx[i, j]
                if local < 0:
                    assert row == -1
                    continue
                assert starts[local] <= row < starts[local] + counts[local]
                assert not referenced[row]
                referenced[row] = True
                assert_bitwise_equal(e.recv_x[row], p.recv_x[i])
                assert_bitwise_equal(e.recv_scale_packs[row], p.recv_scale_packs[i])
                assert e.recv_topk_weights[row] == p.recv_topk_weights[i, j]
        # Valid rows are exactly the first count_e rows of each block; the rest is zero padding.
        valid = np.zeros(n_exp, dtype=bool)
        for start, count in zip(starts, counts):
            valid[start : start + count] = True
        np.testing.assert_array_equal(referenced, valid)
        assert not bits(e.recv_x[~valid]).any()
        assert not e.recv_scale_packs[~valid].any() and not e.recv_topk_weights[~valid].any()
        # Inside each expert block, rows follow the canonical source order.
        for local in range(num_local):
            rows_of = {
                e.recv_src_metadata[i, 2 + j]: e.recv_src_metadata[i, 0]
                for i in range(p.num_recv_tokens)
                for j in range(num_topk)
                if p.recv_topk_idx[i, j] == local
            }
            src_ids = [rows_of[r] for r in sorted(rows_of)]
            assert src_ids == sorted(src_ids)


def test_zero_padding_requires_expand():
    with pytest.raises(ValueError, match="zero_padding"):
        ref.dispatch(
            [np.zeros((1, 128), BF16)], [np.array([[0]])], num_experts=2, zero_padding=True
        )


# ----------------------------------------------------------------------------
# FP8 and opaque scale packs
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("hidden", [128, 256, 200])
def test_per_token_cast_to_fp8(hidden):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((9, hidden)) * rng.uniform(0.01, 100, (9, 1))).astype(np.float32)
    x[3] = 0.0  # amax clamps at 1e-4
    data, scales = ref.per_token_cast_to_fp8(x)
    groups = -(-hidden // 128)
    assert data.dtype == FP8 and data.shape == x.shape
    assert scales.dtype == np.float32 and scales.shape == (9, groups)
    for g in range(groups):
        amax = np.abs(x[:, g * 128 : (g + 1) * 128]).max(axis=1)
        np.testing.assert_allclose(scales[:, g], np.maximum(amax, 1e-4) / 448, rtol=1e-6)
    assert np.abs(data.astype(np.float32)).max() <= 448
    assert not np.isnan(data.astype(np.float32)).any()
    back = ref.per_token_cast_back(data, scales, out_dtype=np.float32)
    # E4M3 has 3 mantissa bits: relative error <= 2^-4 of the group amax.
    for g in range(groups):
        sl = slice(g * 128, (g + 1) * 128)
        err = np.abs(back[:, sl] - x[:, sl]).max(axis=1)
        assert (err <= scales[:, g] * 448 / 16 + 1e-12).all()
    assert ref.per_token_cast_back(data, scales).dtype == BF16
    # bfloat16 input is accepted too.
    data_bf, scales_bf = ref.per_token_cast_to_fp8(x.astype(BF16))
    assert data_bf.shape == x.shape and scales_bf.shape == scales.shape


def test_per_token_cast_ue8m0_packs():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 640)) * 3).astype(np.float32)  # 5 groups -> 2 packs
    data, packs = ref.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert packs.dtype == np.int32 and packs.shape == (5, 2)
    _, fscales = ref.per_token_cast_to_fp8(x)
    exps = packs.view(np.uint8).reshape(5, 8)
    pow2 = (exps[:, :5].astype(np.uint32) << 23).view(np.float32)
    assert (pow2 >= fscales).all() and (pow2 < 2 * fscales).all()
    assert not exps[:, 5:].any()
    back = ref.per_token_cast_back(data, packs, out_dtype=np.float32)
    np.testing.assert_allclose(back, x, atol=np.abs(x).max() / 8)


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("pack_dtype", [np.float32, np.int32])
def test_fp8_and_scale_packs_travel_bit_exactly(expand, pack_dtype):
    num_ranks, num_experts, num_topk = 4, 16, 4
    rng, xs, idxs, _ = make_world(
        8, num_ranks, num_experts, num_topk, 24, hidden=384, x_dtype=np.float32
    )
    casts = [ref.per_token_cast_to_fp8(x) for x in xs]
    data = [c[0] for c in casts]
    packs = [
        rng.integers(0, 2**32, c[1].shape, dtype=np.uint64).astype(np.uint32).view(pack_dtype)
        for c in casts
    ]
    if pack_dtype == np.float32:
        packs[0][:1, :1] = np.array([0x7FC01234], np.uint32).view(np.float32)  # NaN payload
    results = ref.dispatch(
        data, idxs, None, packs, num_experts=num_experts, expert_alignment=4, expand=expand
    )
    tmax = results[0].num_max_tokens_per_rank
    for res in results:
        assert res.recv_x.dtype == FP8 and res.recv_scale_packs.dtype == np.dtype(pack_dtype)
        for i, gid in enumerate(res.recv_src_metadata[:, 0]):
            s, t = divmod(int(gid), tmax)
            rows = [i] if not expand else [r for r in res.recv_src_metadata[i, 2:] if r >= 0]
            for row in rows:
                assert_bitwise_equal(res.recv_x[row], data[s][t])
                assert_bitwise_equal(res.recv_scale_packs[row], packs[s][t])


# ----------------------------------------------------------------------------
# combine
# ----------------------------------------------------------------------------


def expected_combine(idxs, num_local, contribution, hidden, biases=None):
    """Loop version: per token, bias first, then ranks by master slot, bf16 once."""
    out = []
    for s, idx in enumerate(idxs):
        rows = []
        for t, row in enumerate(idx):
            init = None
            if biases is not None and biases[s]:
                init = ordered_sum([b[t] for b in biases[s]])
            acc = ordered_sum([contribution(d, s, t) for d in master_order(row, num_local)], init)
            rows.append(np.zeros(hidden, BF16) if acc is None else to_bf16(acc))
        out.append(np.array(rows, dtype=BF16).reshape(len(idx), hidden))
    return out


def test_combine_of_recv_x_is_sum_over_distinct_ranks_exact():
    # Small integers: every partial sum is exact, so the expected value is order-free.
    rng = np.random.default_rng(9)
    num_ranks, num_experts, num_topk, hidden = 4, 16, 6, 256
    idxs = [random_topk(rng, 30, num_experts, num_topk) for _ in range(num_ranks)]
    xs = [
        rng.integers(-8, 9, (30, hidden)).astype(np.float32).astype(BF16) for _ in range(num_ranks)
    ]
    results = ref.dispatch(xs, idxs, num_experts=num_experts)
    combined = ref.combine([r.recv_x for r in results], results)
    for s in range(num_ranks):
        n_dst = ref.dispatch_layout(idxs[s], num_experts, num_ranks)[2].sum(1)
        # Tokens routed nowhere come back as +0.0 (not x * 0, which may be -0.0).
        want = to_bf16(np.where(n_dst[:, None] > 0, xs[s].astype(np.float32) * n_dst[:, None], 0))
        assert_bitwise_equal(combined[s].combined_x, want)
        assert combined[s].combined_topk_weights is None


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
@pytest.mark.parametrize("num_bias", [0, 1, 2])
def test_combine_plain_matches_loop(world, num_bias):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    rng, xs, idxs, _ = make_world(10, *world[:4])
    hidden = xs[0].shape[1]
    results = ref.dispatch(xs, idxs, num_experts=num_experts, expert_alignment=align)
    tmax = results[0].num_max_tokens_per_rank
    # Each destination rank sends a distinct row per token, keyed by (rank, source id).
    ys = [
        np.array([row_value(hidden, d, gid) for gid in r.recv_src_metadata[:, 0]], BF16).reshape(
            -1, hidden
        )
        for d, r in enumerate(results)
    ]
    biases = [
        tuple(rng.standard_normal((len(i), hidden)).astype(BF16) for _ in range(num_bias))
        for i in idxs
    ]
    bias_arg = None if num_bias == 0 else [b[0] if num_bias == 1 else b for b in biases]
    combined = ref.combine(ys, results, bias=bias_arg)
    want = expected_combine(
        idxs,
        num_experts // num_ranks,
        lambda d,
        s,
        t: row_value(hidden, d, s * tmax + t),
        hidden,
        biases,
    )
    for s in range(num_ranks):
        assert_bitwise_equal(combined[s].combined_x, want[s])


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_combine_expanded_matches_loop(world):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    rng, xs, idxs, _ = make_world(11, *world[:4])
    hidden = xs[0].shape[1]
    num_local = num_experts // num_ranks
    results = ref.dispatch(xs, idxs, num_experts=num_experts, expert_alignment=align, expand=True)
    tmax = results[0].num_max_tokens_per_rank
    ys = []
    for d, res in enumerate(results):
        y = np.zeros(res.recv_x.shape, BF16)
        for i, gid in enumerate(res.recv_src_metadata[:, 0]):
            for j, row in enumerate(res.recv_src_metadata[i, 2:]):
                if row >= 0:
                    y[row] = row_value(hidden, d, gid, j)
        ys.append(y)
    biases = [rng.standard_normal((len(i), hidden)).astype(BF16) for i in idxs]
    combined = ref.combine(ys, results, bias=biases)

    def contribution(d, s, t):
        # Stage 1 on the expert rank: its slots in increasing order, rounded once.
        slots = owned_slots(idxs[s][t], d, num_local)
        return to_bf16(ordered_sum([row_value(hidden, d, s * tmax + t, j) for j in slots]))

    want = expected_combine(idxs, num_local, contribution, hidden, [(b,) for b in biases])
    for s in range(num_ranks):
        assert_bitwise_equal(combined[s].combined_x, want[s])


def test_combine_adds_ranks_in_master_slot_order():
    # fp32: (2^25 + 1) - 2^25 == 0 but (2^25 - 2^25) + 1 == 1, so order is visible.
    num_experts, hidden = 3, 256
    values = {0: 2.0**25, 1: 1.0, 2: -(2.0**25)}  # per destination rank
    cases = {
        (0, 1, 2): 0.0,  # master slots: rank0 -> 0, rank1 -> 1, rank2 -> 2
        (0, 2, 1): 1.0,  # rank 2's slot (1) comes before rank 1's (2)
        (1, 0, 2): 0.0,  # 2^25 + 1 rounds back to 2^25 whichever of the two is first
        (2, 0, 1): 1.0,  # 2^25 - 2^25 first, then + 1
    }
    for order, expected in cases.items():
        idx = np.array([order])  # one expert per rank, R = 3
        xs = [np.zeros((1, hidden), BF16), np.zeros((0, hidden), BF16), np.zeros((0, hidden), BF16)]
        idxs = [idx, np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64)]
        results = ref.dispatch(xs, idxs, num_experts=num_experts)
        ys = [np.full((1, hidden), values[d], np.float32).astype(BF16) for d in range(3)]
        out = ref.combine(ys, results)[0].combined_x
        np.testing.assert_array_equal(
            out.astype(np.float32), np.full((1, hidden), expected, np.float32)
        )


def test_expanded_stage_one_adds_in_slot_order():
    # One rank owns all three experts. Slot order (2^25, -2^25, 1) sums to 1;
    # expert/row order (-2^25, 1, 2^25) or reversed slot order would give 0.
    idx = np.array([[2, 0, 1]])
    (res,) = ref.dispatch([np.zeros((1, 128), BF16)], [idx], num_experts=3, expand=True)
    y = np.zeros((3, 128), np.float32)
    for slot, value in enumerate((2.0**25, -(2.0**25), 1.0)):
        y[res.recv_src_metadata[0, 2 + slot]] = value
    out = ref.combine([y.astype(BF16)], [res])[0].combined_x
    assert (out.astype(np.float32) == 1.0).all()


def test_combine_master_slot_order_within_rank_groups():
    # Rank 0 owns slots 0 and 3 (master 3), rank 1 owns slot 1 and 2 (master 2):
    # rank 1 is added before rank 0 although its lowest slot is later.
    num_experts, hidden = 4, 256
    idx = [np.array([[0, 2, 3, 1]]), np.zeros((0, 4), np.int64)]
    xs = [np.zeros((1, hidden), BF16), np.zeros((0, hidden), BF16)]
    results = ref.dispatch(xs, idx, num_experts=num_experts)
    ys = [np.full((1, hidden), 1.0, BF16), np.full((1, hidden), 2.0**25, BF16)]
    bias = [np.full((1, hidden), -(2.0**25), BF16), np.zeros((0, hidden), BF16)]
    # bias first, then rank 1 (2^25 -> 0), then rank 0 (+1) -> 1; the other order gives 0.
    out = ref.combine(ys, results, bias=bias)[0].combined_x
    assert (out.astype(np.float32) == 1.0).all()


def test_combine_rounds_once_at_the_end():
    # bf16 has an ulp of 2^-7 at 1.0. Rounding after each add would keep 1.0
    # (1 + 2^-8 is a tie, to even); one rounding of the fp32 sum gives 1 + 2^-7.
    idx = [np.array([[0, 1, 2]]), np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64)]
    xs = [np.zeros((1, 128), BF16)] + [np.zeros((0, 128), BF16)] * 2
    results = ref.dispatch(xs, idx, num_experts=3)
    ys = [np.full((1, 128), v, np.float32).astype(BF16) for v in (1.0, 2.0**-8, 2.0**-8)]
    out = ref.combine(ys, results)[0].combined_x
    assert (out.astype(np.float32) == 1.0 + 2.0**-7).all()


def test_combine_tokens_without_experts_get_bias_or_zeros():
    rng = np.random.default_rng(12)
    idx = random_topk(rng, 16, 8, 3, p_empty=0.5)
    empty = (idx < 0).all(1)
    assert empty.any() and (~empty).any()
    xs = [rng.standard_normal((16, 256)).astype(BF16)]
    b0, b1 = (rng.standard_normal((16, 256)).astype(BF16) for _ in range(2))
    for expand in (False, True):
        results = ref.dispatch(xs, [idx], num_experts=8, expand=expand)
        ys = [r.recv_x for r in results]
        no_bias = ref.combine(ys, results)[0].combined_x
        assert not bits(no_bias[empty]).any()
        with_bias = ref.combine(ys, results, bias=[(b0, b1)])[0].combined_x
        bias_sum = to_bf16(b0[empty].astype(np.float32) + b1[empty].astype(np.float32))
        assert_bitwise_equal(with_bias[empty], bias_sum)
        # A single bias is passed through unchanged (up to the sign of zero).
        single = ref.combine(ys, results, bias=[b0])[0].combined_x
        assert_bitwise_equal(single[empty], to_bf16(b0[empty].astype(np.float32) + np.float32(0)))


def test_sum_starts_from_positive_zero():
    # The fold starts at +0.0: a lone contribution keeps its bits except that
    # -0.0 becomes +0.0, and a +0.0 bias changes nothing.
    x = np.array([[-0.0] * 128 + [1.5] * 128], np.float32).astype(BF16)
    results = ref.dispatch([x], [np.array([[1, -1]])], num_experts=2)
    out = ref.combine([results[0].recv_x], results)[0].combined_x
    expected = np.array([[0.0] * 128 + [1.5] * 128], np.float32).astype(BF16)
    assert_bitwise_equal(out, expected)
    zero_bias = np.zeros_like(x)
    with_bias = ref.combine([results[0].recv_x], results, bias=[zero_bias])[0].combined_x
    assert_bitwise_equal(with_bias, out)


@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_generated_data_plain_and_expanded_combine_identically(world):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    rng, xs, idxs, _ = make_world(13, *world[:4])
    kwargs = dict(num_experts=num_experts, expert_alignment=align)
    plain = ref.dispatch(xs, idxs, **kwargs)
    expd = ref.dispatch(xs, idxs, expand=True, **kwargs)
    y_plain = ref.generate_pre_combine_data(plain, seed=3)
    y_expd = ref.generate_pre_combine_data(expd, seed=3)
    for y, r in zip(y_plain, plain):
        assert y.dtype == BF16 and y.shape == r.recv_x.shape
    for y, r in zip(y_expd, expd):
        assert y.dtype == BF16 and y.shape == r.recv_x.shape
    bias = [rng.standard_normal((len(i), xs[0].shape[1])).astype(BF16) for i in idxs]
    a = ref.combine(y_plain, plain, bias=bias)
    b = ref.combine(y_expd, expd, bias=bias)
    for ca, cb in zip(a, b):
        assert_bitwise_equal(ca.combined_x, cb.combined_x)


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_combined_topk_weights_round_trip(world, expand):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    _, xs, idxs, weights = make_world(14, *world[:4])
    results = ref.dispatch(
        xs, idxs, weights, num_experts=num_experts, expert_alignment=align, expand=expand
    )
    ys = [r.recv_x for r in results]
    combined = ref.combine(ys, results, topk_weights=[r.recv_topk_weights for r in results])
    for s in range(num_ranks):
        got = combined[s].combined_topk_weights
        assert got.dtype == np.float32 and got.shape == weights[s].shape
        assert_bitwise_equal(got, np.where(idxs[s] >= 0, weights[s], np.float32(0)))


def test_combined_topk_weights_come_from_the_owning_rank():
    # Each rank sends back a different weight per slot: slot j of a token must
    # come from the rank owning topk_idx[t, j].
    num_ranks, num_experts, num_topk = 4, 16, 5
    _, xs, idxs, _ = make_world(15, num_ranks, num_experts, num_topk, 20)
    num_local = num_experts // num_ranks
    for expand in (False, True):
        results = ref.dispatch(xs, idxs, num_experts=num_experts, expand=expand)
        if expand:
            sent = [np.full(r.recv_x.shape[0], 10.0 * d, np.float32) for d, r in enumerate(results)]
        else:
            sent = [
                (10.0 * d + np.arange(num_topk, dtype=np.float32))[None].repeat(
                    r.num_recv_tokens, 0
                )
                for d, r in enumerate(results)
            ]
        combined = ref.combine([r.recv_x for r in results], results, topk_weights=sent)
        for s, idx in enumerate(idxs):
            owner = idx // num_local
            want = 10.0 * owner + (0 if expand else np.arange(num_topk))
            want = np.where(idx >= 0, want, 0).astype(np.float32)
            np.testing.assert_array_equal(combined[s].combined_topk_weights, want)


# ----------------------------------------------------------------------------
# Determinism and kernel-order independence
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("expand", [False, True])
def test_dispatch_and_combine_are_deterministic(expand):
    world = (8, 32, 8, 40)
    outs = []
    for _ in range(2):
        _, xs, idxs, weights = make_world(16, *world)
        results = ref.dispatch(xs, idxs, weights, num_experts=32, expert_alignment=4, expand=expand)
        ys = ref.generate_pre_combine_data(results, seed=1)
        outs.append((results, ref.combine(ys, results, [r.recv_topk_weights for r in results])))
    (r1, c1), (r2, c2) = outs
    for a, b in zip(r1, r2):
        assert_results_equal(a, b)
    for a, b in zip(c1, c2):
        assert_bitwise_equal(a.combined_x, b.combined_x)
        assert_bitwise_equal(a.combined_topk_weights, b.combined_topk_weights)


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("world", WORLDS, ids=WORLD_IDS)
def test_sort_by_source_canonicalizes_kernel_order(world, expand):
    num_ranks, num_experts, num_topk, max_tokens, align = world
    rng, xs, idxs, weights = make_world(17, *world[:4], x_dtype=FP8)  # packs travel with FP8 only
    packs = [rng.random((len(i), 3), dtype=np.float32) for i in idxs]
    results = ref.dispatch(
        xs,
        idxs,
        weights,
        packs,
        num_experts=num_experts,
        expert_alignment=align,
        expand=expand,
        zero_padding=expand,
    )
    for res in results:
        assert_results_equal(ref.sort_by_source(res), res)  # identity on canonical output
    shuffled, perms = simulate_kernel_order(results, seed=18)
    for res, shuf in zip(results, shuffled):
        assert_results_equal(ref.sort_by_source(shuf), res)

    # Combine only follows the metadata, so a permuted handle with rows
    # permuted the same way gives a bitwise-identical result.
    ys = ref.generate_pre_combine_data(results, seed=2)
    ys_shuffled = [y[p] for y, p in zip(ys, perms)]
    w = [r.recv_topk_weights for r in results]
    w_shuffled = [x[p] for x, p in zip(w, perms)]
    a = ref.combine(ys, results, w)
    b = ref.combine(ys_shuffled, shuffled, w_shuffled)
    for ca, cb in zip(a, b):
        assert_bitwise_equal(ca.combined_x, cb.combined_x)
        assert_bitwise_equal(ca.combined_topk_weights, cb.combined_topk_weights)


# ----------------------------------------------------------------------------
# Input validation: errors name the offending argument
# ----------------------------------------------------------------------------


def _world():
    """Two ranks, E=4, K=2: a small valid input to break one argument at a time."""
    xs = [np.zeros((3, 256), BF16), np.zeros((2, 256), BF16)]
    idxs = [np.array([[0, 1], [2, -1], [-1, -1]]), np.array([[3, 0], [1, 2]])]
    return xs, idxs


def _dispatch_with(**override):
    xs, idxs = _world()
    kwargs = dict(xs=xs, topk_idxs=idxs, num_experts=4)
    kwargs.update(override)
    return lambda: ref.dispatch(**kwargs)


XS, IDXS = _world()
FP8_XS = [x.astype(FP8) for x in XS]
T_K = r"expected int array of shape \[T, K\]"

ERROR_CASES = {
    "layout-float-idx": (
        lambda: ref.dispatch_layout(np.zeros((2, 2), np.float32), 4, 2),
        TypeError,
        rf"topk_idx: {T_K}",
    ),
    "layout-1d-idx": (
        lambda: ref.dispatch_layout(np.zeros(4, np.int64), 4, 2), ValueError, rf"topk_idx: {T_K}"
    ),
    "layout-idx-too-large": (
        lambda: ref.dispatch_layout(np.array([[0, 4]]), 4, 2),
        ValueError,
        r"topk_idx: expert id 4 at \[0, 1\] out of range",
    ),
    "layout-idx-below-minus-one": (
        lambda: ref.dispatch_layout(np.array([[0, -2]]), 4, 2),
        ValueError,
        r"topk_idx: expert id -2",
    ),
    "layout-duplicate-expert": (
        lambda: ref.dispatch_layout(np.array([[1, 1]]), 4, 2),
        ValueError,
        r"topk_idx: row 0 selects an expert more than once",
    ),
    "layout-topk-too-large": (
        lambda: ref.dispatch_layout(np.zeros((1, 33), np.int64), 64, 2),
        ValueError,
        r"topk_idx: top-k must be in \[1, 32\]",
    ),
    "layout-experts-not-divisible": (
        lambda: ref.dispatch_layout(np.array([[0]]), 6, 4),
        ValueError,
        r"num_experts: 6 is not divisible by num_ranks=4",
    ),
    "layout-float-num-experts": (
        lambda: ref.dispatch_layout(np.array([[0]]), 4.0, 2),
        TypeError,
        r"num_experts: expected int",
    ),
    "layout-zero-ranks": (
        lambda: ref.dispatch_layout(np.array([[0]]), 4, 0),
        ValueError,
        r"num_ranks: expected int in \[1, 1024\], got 0",
    ),
    "xs-not-a-list": (_dispatch_with(xs=np.zeros((2, 3, 256))), TypeError, r"xs: expected a list"),
    "xs-empty": (
        _dispatch_with(xs=[], topk_idxs=[]),
        ValueError,
        r"xs: expected at least one rank",
    ),
    "topk-idxs-wrong-length": (
        _dispatch_with(topk_idxs=IDXS[:1]), ValueError, r"topk_idxs: expected 2 entries"
    ),
    "topk-idxs-ragged-k": (
        _dispatch_with(topk_idxs=[IDXS[0], np.array([[3, 0, 1], [1, 2, 0]])]),
        ValueError,
        r"topk_idxs\[1\]: expected int array of shape \[T, 2\]",
    ),
    "topk-idxs-out-of-range": (
        _dispatch_with(topk_idxs=[IDXS[0], np.array([[3, 9], [1, 2]])]),
        ValueError,
        r"topk_idxs\[1\]: expert id 9",
    ),
    "dispatch-experts-not-divisible": (
        _dispatch_with(num_experts=3), ValueError, r"num_experts: 3 is not divisible"
    ),
    "xs-wrong-hidden": (
        _dispatch_with(xs=[XS[0], np.zeros((2, 128), BF16)]),
        ValueError,
        r"xs\[1\]: expected array of shape \[2, 256\]",
    ),
    "xs-wrong-tokens": (
        _dispatch_with(xs=[XS[0], np.zeros((5, 256), BF16)]), ValueError, r"xs\[1\]: expected array"
    ),
    "xs-mixed-dtypes": (
        _dispatch_with(xs=[XS[0], np.zeros((2, 256), np.float32)]),
        TypeError,
        r"xs\[1\]: dtype float32 differs",
    ),
    "weights-not-float32": (
        _dispatch_with(topk_weights=[np.zeros((3, 2)), np.zeros((2, 2), np.float32)]),
        TypeError,
        r"topk_weights\[0\]: expected float32",
    ),
    "weights-wrong-shape": (
        _dispatch_with(topk_weights=[np.zeros((3, 2), np.float32), np.zeros((2, 3), np.float32)]),
        ValueError,
        r"topk_weights\[1\]: expected float32 array of shape \[2, 2\]",
    ),
    "packs-not-4-bytes": (
        _dispatch_with(xs=FP8_XS, scale_packs=[np.zeros((3, 2)), np.zeros((2, 2))]),
        TypeError,
        r"scale_packs\[0\]: expected 4-byte elements",
    ),
    "packs-wrong-shape": (
        _dispatch_with(
            xs=FP8_XS, scale_packs=[np.zeros((3, 2), np.int32), np.zeros((2, 3), np.int32)]
        ),
        ValueError,
        r"scale_packs\[1\]: expected array of shape \[2, 2\]",
    ),
    "tmax-too-small": (
        _dispatch_with(num_max_tokens_per_rank=2),
        ValueError,
        r"num_max_tokens_per_rank: 2 is smaller than the largest token count 3",
    ),
    "alignment-zero": (
        _dispatch_with(expert_alignment=0),
        ValueError,
        r"expert_alignment: expected int in \[1, 1024\], got 0",
    ),
    "cast-float64": (
        lambda: ref.per_token_cast_to_fp8(np.zeros((2, 128))),
        TypeError,
        r"x: expected float32 or bfloat16",
    ),
    "cast-back-not-fp8": (
        lambda: ref.per_token_cast_back(
            np.zeros((2, 128), np.float32), np.zeros((2, 1), np.float32)
        ),
        TypeError,
        r"data: expected float8_e4m3fn",
    ),
    "cast-back-wrong-scales": (
        lambda: ref.per_token_cast_back(np.zeros((2, 256), FP8), np.zeros((2, 1), np.float32)),
        ValueError,
        r"scales: expected shape \[2, 2\]",
    ),
}


@pytest.mark.parametrize("call, exc, match", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_combine_errors_name_the_argument():
    xs, idxs = _world()
    results = ref.dispatch(xs, idxs, num_experts=4)
    ys = [r.recv_x for r in results]
    n0 = results[0].num_recv_tokens
    with pytest.raises(ValueError, match=r"ys: expected 2 entries"):
        ref.combine(ys[:1], results)
    with pytest.raises(
        TypeError, match=rf"ys\[0\]: expected bfloat16 array of shape \[{n0}, 256\]"
    ):
        ref.combine([ys[0].astype(np.float32), ys[1]], results)
    with pytest.raises(ValueError, match=r"ys\[1\]: expected bfloat16 array of shape"):
        ref.combine([ys[0], ys[1][:1]], results)
    with pytest.raises(ValueError, match=r"expand: True does not match the handles"):
        ref.combine(ys, results, expand=True)
    with pytest.raises(
        ValueError, match=rf"topk_weights\[0\]: expected float32 array of shape \[{n0}, 2\]"
    ):
        ref.combine(ys, results, topk_weights=[np.zeros((n0, 3), np.float32)] * 2)
    with pytest.raises(
        TypeError, match=r"bias\[1\]\[0\]: expected bfloat16 array of shape \[2, 256\]"
    ):
        ref.combine(ys, results, bias=[None, np.zeros((2, 256), np.float32)])
    with pytest.raises(ValueError, match=r"bias\[0\]: expected at most two"):
        ref.combine(ys, results, bias=[(xs[0],) * 3, None])
    with pytest.raises(TypeError, match=r"handles: expected a non-empty list"):
        ref.combine(ys, [])
    broken = dataclasses.replace(results[1], recv_src_metadata=results[1].recv_src_metadata[:1])
    missing = r"handles\[1\]: token \d+ of rank \d+ is routed to rank 1 but was not received"
    with pytest.raises(ValueError, match=missing):
        ref.combine([ys[0], ys[1][:1]], [results[0], broken])
    expd = ref.dispatch(xs, idxs, num_experts=4, expand=True)
    n_exp = expd[0].recv_x.shape[0]
    with pytest.raises(
        ValueError, match=rf"topk_weights\[0\]: expected float32 array of shape \[{n_exp}\]"
    ):
        ref.combine([r.recv_x for r in expd], expd, topk_weights=[np.zeros((1, 1), np.float32)] * 2)


def test_grouped_gemm_multiplies_each_experts_rows_by_its_weights():
    R, E, K, H, N, T = 2, 4, 2, 32, 16, 12
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((T, H)).astype(ref.bfloat16) for _ in range(R)]
    idxs = [np.array([rng.permutation(E)[:K] for _ in range(T)], np.int64) for _ in range(R)]
    results = ref.dispatch(xs, idxs, num_experts=E, num_max_tokens_per_rank=T, expand=True,
                           expert_alignment=8)
    w = rng.standard_normal((E // R, H, N)).astype(ref.bfloat16)
    for res in results:
        y = ref.grouped_gemm(res, w, out_dtype=np.float32, fill=np.nan)
        starts, counts = res.expert_starts(), res.num_unaligned_recv_tokens_per_expert
        for e in range(E // R):
            rows = slice(int(starts[e]), int(starts[e] + counts[e]))
            want = res.recv_x[rows].astype(np.float32) @ w[e].astype(np.float32)
            assert np.allclose(y[rows], want, rtol=1e-5, atol=1e-4)
            pad = slice(
                int(starts[e] + counts[e]), int(starts[e]) + res.num_recv_tokens_per_expert_list[e]
            )
            assert np.isnan(y[pad]).all()  # padding: not an expert's row
    with pytest.raises(ValueError, match="needs an expanded dispatch result"):
        ref.grouped_gemm(ref.dispatch(xs, idxs, num_experts=E)[0], w)
    with pytest.raises(ValueError, match=r"weights must be \[2, 32, N\]"):
        ref.grouped_gemm(results[0], w[:1])


# ----------------------------------------------------------------------------
# Hostile inputs: each is a named TypeError / ValueError raised before any work,
# never an internal ZeroDivisionError, IndexError, AttributeError or MemoryError
# ----------------------------------------------------------------------------


def _handles(expand=False, **override):
    """Dispatch results of _world() (with topk weights), rank 1's fields overridden."""
    xs, idxs = _world()
    weights = [np.ones(i.shape, np.float32) for i in idxs]
    results = ref.dispatch(
        xs, idxs, weights, num_experts=4, expand=expand, expert_alignment=1 + 3 * expand
    )
    if override:
        results[1] = dataclasses.replace(results[1], **override)
    return results


def _combine_with(ys=None, expand=False, **override):
    handles = _handles(expand, **override)
    return lambda: ref.combine([h.recv_x for h in _handles(expand)] if ys is None else ys, handles)


def _duplicate_expanded_rows():
    meta = _handles(expand=True)[1].recv_src_metadata.copy()
    meta[:, 2:] = np.where(meta[:, 2:] >= 0, 0, -1)  # every local slot claims row 0
    return meta


GEMM_W = np.zeros((2, 256, 16), BF16)

HOSTILE_CASES = {
    # align: used to divide by the alignment.
    "align-zero": (lambda: ref.align(5, 0), ValueError, r"alignment: expected int >= 1, got 0"),
    "align-negative": (
        lambda: ref.align(5, -4),
        ValueError,
        r"alignment: expected int >= 1, got -4",
    ),
    "align-float": (lambda: ref.align(5, 2.5), TypeError, r"alignment: expected int, got float"),
    "align-str-n": (lambda: ref.align("5", 4), TypeError, r"n: expected int or int array, got str"),
    "align-float-array-n": (
        lambda: ref.align(np.array([1.5]), 4),
        TypeError,
        r"n: expected int or int array, got float64 array",
    ),
    # combine: handles that are not handles used to be AttributeErrors.
    "combine-str-handles": (
        lambda: ref.combine([np.zeros((1, 256), BF16)] * 2, ["h0", "h1"]),
        TypeError,
        r"handles\[0\]: expected a handle from reference\.dispatch, got str",
    ),
    "combine-one-str-handle": (
        lambda: ref.combine([h.recv_x for h in _handles()], [_handles()[0], "h1"]),
        TypeError,
        r"handles\[1\]: expected a handle from reference\.dispatch, got str",
    ),
    "combine-handles-a-str": (
        lambda: ref.combine([], "h0h1"),
        TypeError,
        r"handles: expected a non-empty list of dispatch results",
    ),
    "combine-too-few-handles": (
        lambda: ref.combine([h.recv_x for h in _handles()][:1], _handles()[:1]),
        ValueError,
        r"handles: got 1 handles for a world of 2 ranks",
    ),
    "combine-too-many-handles": (
        lambda: ref.combine([h.recv_x for h in _handles()] * 2, _handles() * 2),
        ValueError,
        r"handles: got 4 handles for a world of 2 ranks",
    ),
    "combine-handle-topk-idx-1d": (
        _combine_with(topk_idx=np.zeros(2, np.int64)),
        ValueError,
        r"handles\[1\]\.topk_idx: expected int array of shape \[T, K\]",
    ),
    "combine-handle-recv-x-none": (
        _combine_with(ys=[np.zeros((2, 256), BF16)] * 2, recv_x=None),
        TypeError,
        r"handles\[1\]\.recv_x: expected numpy array, got NoneType",
    ),
    "combine-handle-metadata-1d": (
        _combine_with(recv_src_metadata=np.zeros(3, np.int32)),
        ValueError,
        r"handles\[1\]\.recv_src_metadata: expected int array of shape \[N, 4\]",
    ),
    "combine-handle-counts-wrong-length": (
        _combine_with(num_recv_tokens_per_expert_list=[1]),
        ValueError,
        r"handles\[1\]\.num_recv_tokens_per_expert_list: expected 2 counts >= 0, got \[1\]",
    ),
    "combine-expanded-rows-twice": (
        _combine_with(expand=True, recv_src_metadata=_duplicate_expanded_rows()),
        ValueError,
        r"handles\[1\]\.recv_src_metadata: expanded row indices are out of range or not unique",
    ),
    # combine: rows of another hidden size than dispatch moved.
    "combine-other-hidden": (
        lambda: ref.combine(
            [np.zeros((h.num_recv_tokens, 128), BF16) for h in _handles()], _handles()
        ),
        ValueError,
        r"ys\[0\]: expected bfloat16 array of shape \[3, 256\] "
        r"\(the rows dispatch moved to rank 0\), "
        r"got bfloat16 array of shape \(3, 128\)",
    ),
    "combine-other-hidden-expanded": (
        lambda: ref.combine(
            [_handles(True)[0].recv_x, np.zeros((_handles(True)[1].recv_x.shape[0], 64), BF16)],
            _handles(True),
        ),
        ValueError,
        r"ys\[1\]: expected bfloat16 array of shape \[\d+, 256\] "
        r"\(the rows dispatch moved to rank 1\), "
        r"got bfloat16 array of shape \(\d+, 64\)",
    ),
    # grouped_gemm: used to be AttributeErrors or numpy's errors.
    "gemm-none-result": (
        lambda: ref.grouped_gemm(None, GEMM_W),
        TypeError,
        r"result: expected a handle from reference\.dispatch, got NoneType",
    ),
    "gemm-none-weights": (
        lambda: ref.grouped_gemm(_handles(True)[0], None),
        TypeError,
        r"weights: expected numpy array, got NoneType",
    ),
    "gemm-object-weights": (
        lambda: ref.grouped_gemm(_handles(True)[0], GEMM_W.astype(object)),
        TypeError,
        r"weights: expected a numeric array, got object",
    ),
    "gemm-bad-out-dtype": (
        lambda: ref.grouped_gemm(_handles(True)[0], GEMM_W, out_dtype="junk"),
        TypeError,
        r"out_dtype: expected a numpy dtype, got 'junk'",
    ),
    "gemm-str-fill": (
        lambda: ref.grouped_gemm(_handles(True)[0], GEMM_W, fill="nan"),
        TypeError,
        r"fill: expected a number, got str",
    ),
    # dispatch: expert_alignment and the other limits of a world (the runtime's and #ep.config's).
    "alignment-2-62": (
        _dispatch_with(expert_alignment=2**62),
        ValueError,
        rf"expert_alignment: expected int in \[1, 1024\], got {2**62}",
    ),
    "alignment-2-62-expanded": (
        _dispatch_with(expert_alignment=2**62, expand=True),
        ValueError,
        r"expert_alignment: expected int in",
    ),
    "alignment-1025": (
        _dispatch_with(expert_alignment=1025),
        ValueError,
        r"expert_alignment: expected int in \[1, 1024\]",
    ),
    "alignment-negative": (
        _dispatch_with(expert_alignment=-128),
        ValueError,
        r"expert_alignment: expected int in \[1, 1024\]",
    ),
    "experts-2-62": (
        _dispatch_with(num_experts=2**62), ValueError, r"num_experts: expected int in \[1, 2048\]"
    ),
    "layout-experts-2-62": (
        lambda: ref.dispatch_layout(np.array([[0]]), 2**62, 2),
        ValueError,
        r"num_experts: expected int in \[1, 2048\]",
    ),
    "experts-per-rank-512": (
        lambda: ref.dispatch([np.zeros((1, 8), BF16)], [np.array([[0]])], num_experts=512),
        ValueError,
        r"num_experts: 512 over 1 ranks is 512 experts per rank, more than 256",
    ),
    "ranks-1025": (
        lambda: ref.dispatch([np.zeros((0, 8), BF16)] * 1025, [np.zeros((0, 1), np.int64)] * 1025,
                             num_experts=1025),
        ValueError,
        r"xs: expected at most 1024 ranks, got 1025",
    ),
    "topk-above-experts": (
        lambda: ref.dispatch([np.zeros((1, 8), BF16)], [np.array([[0, -1, -1]])], num_experts=2),
        ValueError,
        r"topk_idxs\[0\]: top-k K=3 exceeds num_experts=2",
    ),
    "hidden-zero": (
        _dispatch_with(xs=[np.zeros((3, 0), BF16), np.zeros((2, 0), BF16)]),
        ValueError,
        r"xs\[0\]: hidden size must be a positive multiple of 8",
    ),
    "hidden-12": (
        _dispatch_with(xs=[np.zeros((3, 12), BF16), np.zeros((2, 12), BF16)]),
        ValueError,
        r"xs\[0\]: hidden size must be a positive multiple of 8",
    ),
    "tmax-overflows-int32-ids": (
        _dispatch_with(num_max_tokens_per_rank=2**30),
        ValueError,
        r"num_max_tokens_per_rank: 2 ranks x 1073741824 tokens overflow the int32 source ids",
    ),
    "uint64-expert-id-wraps-to-minus-one": (
        lambda: ref.dispatch_layout(np.array([[2**64 - 1]], np.uint64), 4, 2),
        ValueError,
        r"topk_idx: expert id 18446744073709551615 at \[0, 0\] out of range",
    ),
    # dispatch: scale packs only travel with FP8 data.
    "packs-with-bf16": (
        _dispatch_with(scale_packs=[np.zeros((3, 2), np.float32), np.zeros((2, 2), np.float32)]),
        TypeError,
        r"scale_packs: only for FP8 data \(float8_e4m3fn or float8_e5m2\), but xs are bfloat16",
    ),
    "packs-with-float32": (
        _dispatch_with(
            xs=[x.astype(np.float32) for x in XS], scale_packs=[np.zeros((3, 2), np.int32)] * 2
        ),
        TypeError,
        r"scale_packs: only for FP8 data",
    ),
    # sort_by_source and generate_pre_combine_data on what is not a handle.
    "sort-none": (
        lambda: ref.sort_by_source(None),
        TypeError,
        r"result: expected a handle from reference\.dispatch",
    ),
    "sort-no-local-experts": (
        lambda: ref.sort_by_source(_handles(True, num_recv_tokens_per_expert_list=[])[1]),
        ValueError,
        r"result\.num_recv_tokens_per_expert_list: expected 2 counts >= 0, got \[\]",
    ),
    "sort-short-weights": (
        lambda: ref.sort_by_source(_handles(recv_topk_weights=np.zeros((1, 2), np.float32))[1]),
        ValueError,
        r"result\.recv_topk_weights: expected at least 3 rows",
    ),
    "generate-empty": (
        lambda: ref.generate_pre_combine_data([]), TypeError, r"handles: expected a non-empty list"
    ),
    "generate-str-handles": (
        lambda: ref.generate_pre_combine_data(["h0", "h1"]),
        TypeError,
        r"handles\[0\]: expected a handle from reference\.dispatch, got str",
    ),
    "generate-too-few-handles": (
        lambda: ref.generate_pre_combine_data(_handles()[:1]),
        ValueError,
        r"handles: got 1 handles for a world of 2 ranks",
    ),
    "generate-source-id-out-of-range": (
        lambda: ref.generate_pre_combine_data(
            _handles(recv_src_metadata=np.full((3, 4), 50, np.int32))
        ),
        ValueError,
        r"handles\[1\]: recv_src_metadata\[:, 0\] is out of range or not unique",
    ),
    "generate-str-seed": (
        lambda: ref.generate_pre_combine_data(_handles(), seed="1"),
        TypeError,
        r"seed: expected a number",
    ),
    "cast-back-bad-out-dtype": (
        lambda: ref.per_token_cast_back(
            np.zeros((2, 128), FP8), np.ones((2, 1), np.float32), 128, "junk"
        ),
        TypeError,
        r"out_dtype: expected a numpy dtype, got 'junk'",
    ),
}


@pytest.mark.parametrize("call, exc, match", HOSTILE_CASES.values(), ids=HOSTILE_CASES.keys())
def test_hostile_input_is_a_named_error(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_limits_themselves_are_accepted():
    # The bounds are inclusive, and FP8 of either kind carries scale packs.
    assert ref.MAX_EXPERT_ALIGNMENT == 1024
    xs, idxs = _world()
    (r0, _) = ref.dispatch(xs, idxs, num_experts=4, expert_alignment=1024, expand=True)
    assert r0.num_recv_tokens_per_expert_list == [1024, 1024]
    (r0,) = ref.dispatch([np.zeros((1, 8), BF16)], [np.array([[255]])], num_experts=256)
    assert r0.num_unaligned_recv_tokens_per_expert[255] == 1
    e5m2 = [np.ones((1, 8), np.dtype(ml_dtypes.float8_e5m2))]
    (r0,) = ref.dispatch(
        e5m2, [np.array([[0]])], None, [np.full((1, 1), 7, np.int32)], num_experts=2
    )
    assert r0.recv_scale_packs.tolist() == [[7]]
    assert ref.align(5, 4) == 8 and ref.align(np.array([0, 1, 4, 5]), 4).tolist() == [0, 4, 4, 8]


def test_combine_with_a_tmax_near_the_int32_limit():
    # Source ids go up to R * Tmax - 1 = 2**31 - 1: combine finds rows without an R * Tmax table.
    xs, idxs = _world()
    tmax = 2**30 - 1
    results = ref.dispatch(xs, idxs, num_experts=4, num_max_tokens_per_rank=tmax)
    assert results[0].recv_src_metadata[:, 0].max() >= tmax
    got = ref.combine([r.recv_x for r in results], results)
    want = ref.combine([r.recv_x for r in results], ref.dispatch(xs, idxs, num_experts=4))
    for a, b in zip(got, want):
        assert_bitwise_equal(a.combined_x, b.combined_x)


def test_fp8_casts_with_wide_groups_and_no_tokens():
    # A group wider than the row is one group: the same result as group == H, nothing allocated
    # for the padding; zero tokens with UE8M0 packs used to fail a reshape.
    x = np.random.default_rng(3).standard_normal((2, 96)).astype(np.float32)
    for ue8m0 in (False, True):
        data, scales = ref.per_token_cast_to_fp8(x, group=2**40, use_ue8m0=ue8m0)
        want_data, want_scales = ref.per_token_cast_to_fp8(x, group=96, use_ue8m0=ue8m0)
        assert_bitwise_equal(data, want_data)
        assert_bitwise_equal(scales, want_scales)
        assert_bitwise_equal(ref.per_token_cast_back(data, scales, group=2**40),
                             ref.per_token_cast_back(data, scales, group=96))
        empty, packs = ref.per_token_cast_to_fp8(np.zeros((0, 128), np.float32), use_ue8m0=ue8m0)
        assert ref.per_token_cast_back(empty, packs).shape == (0, 128)
