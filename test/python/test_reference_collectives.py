"""epic.reference's all-gather, reduce-scatter, Engram fetch and PP transfer (DeepEP V2's other
primitives) and DeepEP's buffer-size formulas for them."""

import ml_dtypes
import numpy as np
import pytest

from epic import reference as ref

bf16 = ml_dtypes.bfloat16


def test_all_gather_stacks_every_rank_in_rank_order():
    rng = np.random.default_rng(0)
    ts = [rng.standard_normal((3, 5)).astype(bf16) for _ in range(4)]
    out = ref.all_gather(ts)
    assert len(out) == 4
    for gathered in out:
        assert gathered.shape == (4, 3, 5)
        for r in range(4):
            assert gathered[r].tobytes() == ts[r].tobytes()
    with pytest.raises(ValueError, match=r"tensors\[2\]: expected bfloat16 of shape \(3, 5\)"):
        ref.all_gather(ts[:2] + [np.zeros((3, 4), bf16)] + ts[3:])


def test_reduce_scatter_sums_in_float32_in_rank_order_and_rounds_once():
    R = 4
    # Block 0 of every rank: 1.0 from rank 0, 2^-9 from the others. In float32 the sum is
    # 1 + 3 * 2^-9 (three quarters of a bfloat16 ulp at 1), which rounds up to 1 + 2^-7; adding
    # in bfloat16 step by step would stay at 1.0.
    ts = [np.full((R * 2, 3), 2.0**-9, bf16) for _ in range(R)]
    ts[0][:2] = 1.0
    out = ref.reduce_scatter(ts)
    assert len(out) == R and out[0].dtype == bf16 and out[0].shape == (2, 3)
    assert (out[0].astype(np.float32) == 1 + 2.0**-7).all()
    for r in range(1, R):
        assert (out[r].astype(np.float32) == np.float32(bf16(4 * 2.0**-9))).all()
    f32 = [t.astype(np.float32) for t in ts]
    assert ref.reduce_scatter(f32)[0].dtype == np.float32
    with pytest.raises(ValueError, match="multiple of the 4 ranks"):
        ref.reduce_scatter([np.zeros((6, 3), bf16)] * R)
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        ref.reduce_scatter([np.zeros((8, 3), np.int32)] * R)


def test_engram_fetch_reads_global_entries_and_their_scale_packs():
    R, entries, H, P = 3, 5, 4, 2
    rng = np.random.default_rng(1)
    tables = [rng.integers(0, 255, (entries, H)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
              for _ in range(R)]
    sf = rng.standard_normal((R * entries, P)).astype(np.float32)
    idx = [np.array([[0, 14], [7, 7]], np.int32), np.zeros((0, 2), np.int32),
           np.array([[5, 9]], np.int32)]
    out = ref.engram_fetch(tables, idx, sf)
    data, packs = out[0]
    assert data.shape == (2, 2 * H) and packs.shape == (2, 2 * P)
    assert data[0, H:].tobytes() == tables[2][4].tobytes()  # entry 14: rank 2, local 4
    assert data[1, :H].tobytes() == tables[1][2].tobytes()  # entry 7: rank 1, local 2
    assert packs[0, P:].tobytes() == sf[14].tobytes()
    assert out[1][0].shape == (0, 2 * H)
    with pytest.raises(ValueError, match=r"indices\[2\]\[0, 1\] = 15 is not an entry"):
        ref.engram_fetch(tables, idx[:2] + [np.array([[5, 15]], np.int32)], sf)
    with pytest.raises(ValueError, match="sf: required with FP8 tables"):
        ref.engram_fetch(tables, idx)
    bf_tables = [t.astype(np.float32).astype(bf16) for t in tables]
    assert ref.engram_fetch(bf_tables, idx)[2][1] is None


def test_pp_transfer_keeps_each_pairs_order_and_only_ring_neighbours():
    a, b, c = (np.full((2,), v, np.float32) for v in (1, 2, 3))
    got = ref.pp_transfer([(0, 1, a), (0, 3, b), (0, 1, c)], 4)
    assert [x[0] for x in got[(1, 0)]] == [1, 3] and [x[0] for x in got[(3, 0)]] == [2]
    with pytest.raises(ValueError, match="rank 0 sends to 2, which is not a ring neighbour"):
        ref.pp_transfer([(0, 2, a)], 4)


def test_buffer_sizes_are_deepeps_formulas():
    # test_agrs.py's all-gathers of (32, 64, 2048) bf16 on 8 ranks: 64 MiB each.
    assert ref.agrs_num_max_session_bytes(8, [(32, 64, 2048)] * 2, 2) == 2 * (64 << 20)
    assert ref.agrs_num_max_session_bytes(3, [(5,)], 2) == 32  # 30 bytes, 32-byte aligned
    assert ref.agrs_buffer_size_hint(1) == 2 << 20
    # test_engram.py: 524288 entries x hidden 128 bf16 per rank, 512 tokens.
    assert ref.engram_storage_size_hint(524288, 128, 512) == (2 << 20, 128 << 20)
    assert ref.engram_storage_size_hint(10, 100, 10, itemsize=1)[0] == 2 << 20  # 128-byte entries
    # test_pp.py: (4096, 7168) bf16, 4 in flight.
    assert ref.pp_buffer_size_hint(4096 * 7168 * 2, 4) == 4096 * 7168 * 2 * 16
    with pytest.raises(ValueError, match="max_inflight"):
        ref.pp_buffer_size_hint(1, 0)
