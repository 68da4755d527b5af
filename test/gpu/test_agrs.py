"""AGRS sessions on a GPU (virtual worlds of 1, 2, 4 and 8 ranks): all-gathers by copy engines
and the reduce-scatter, bitwise against epic.reference, in random interleavings as DeepEP's
test_agrs.py runs them (all-gathers of random shapes, in place or batched at random, sessions
ended and re-created), and what a session refuses. No kernel is involved: nothing to prepare.

Run on the H200 by tools/device/run.sh (PYTHONPATH=python); skipped without torch or a GPU.
"""

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import epic  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic._tensors import torch_to_numpy  # noqa: E402

SHAPES = [(32, 64, 2048), (4096,), (7, 33), (1, 8), (3, 5, 7)]


def make_buffer(R, session_bytes, ops=32):
    group = epic.VirtualWorld(R)
    num_bytes = epic.ElasticBuffer.get_agrs_buffer_size_hint(group, session_bytes)
    buffer = epic.ElasticBuffer(group, num_bytes=num_bytes, explicitly_destroy=True)
    buffer.agrs_set_config(session_bytes, ops)
    return buffer


def random_tensor(gen, shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, device="cuda").to(dtype)
    return torch.randint(-1000, 1000, shape, generator=gen, device="cuda", dtype=dtype)


def numpy_of(t):
    return torch_to_numpy(t.contiguous())


def check_gathered(gathered, inputs):
    want = ref.all_gather([numpy_of(x) for x in inputs])
    for r, (got, expected) in enumerate(zip(gathered, want)):
        assert tuple(got.shape) == expected.shape, r
        assert numpy_of(got).tobytes() == expected.tobytes(), f"rank {r}'s gathered tensor"


@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_random_interleavings(R):
    """128 all-gathers of random shapes and dtypes across sessions of up to 4, in place or not,
    single or batched; every gathered tensor checked once the session's work is done, and again
    (unchanged) right before its session ends."""
    rng = random.Random(R)
    gen = torch.Generator(device="cuda").manual_seed(R)
    dtypes = [torch.bfloat16, torch.float32, torch.int32, torch.float8_e4m3fn]
    per_session = 4
    worst = max(epic.ElasticBuffer.get_agrs_num_max_session_bytes(epic.VirtualWorld(R), s,
                                                                 torch.float32)
                for s in SHAPES[1:])
    buffer = make_buffer(R, per_session * 2 * worst + 4096, ops=per_session)
    done = 0
    while done < 128:
        kept = []
        with buffer.agrs_new_session():
            for _ in range(per_session):
                count = rng.choice([1, 1, 2])
                shapes = [rng.choice(SHAPES[1:]) for _ in range(count)]
                dtype = rng.choice(dtypes)
                make = (lambda s: random_tensor(gen, s, torch.float32).to(dtype)) \
                    if dtype == torch.float8_e4m3fn else (lambda s: random_tensor(gen, s, dtype))
                if rng.random() < 0.5:  # in place: write into the slots the session gives
                    slots = buffer.agrs_get_inplace_tensor(
                        tuple(shapes) if count > 1 else shapes[0], dtype)
                    inputs = []
                    for r in range(R):
                        mine = slots[r] if count > 1 else (slots[r],)
                        for slot, shape in zip(mine, shapes):
                            slot.copy_(make(shape))
                        inputs.append(list(mine))
                else:
                    inputs = [[make(s) for s in shapes] for _ in range(R)]
                expected = [[x.clone() for x in per_rank] for per_rank in inputs]
                if count > 1:
                    *gathered, handle = buffer.all_gather(inputs)
                else:
                    gathered, handle = buffer.all_gather([x[0] for x in inputs])
                    gathered = [gathered]
                handle()
                for i in range(count):
                    check_gathered(gathered[i], [expected[r][i] for r in range(R)])
                    kept.append((gathered[i], [expected[r][i] for r in range(R)]))
                done += 1
            for gathered, expected in kept:  # still there: later all-gathers used other memory
                check_gathered(gathered, expected)
    buffer.destroy()


@pytest.mark.parametrize("R", [1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_reduce_scatter_is_the_rank_order_sum(R, dtype):
    gen = torch.Generator(device="cuda").manual_seed(7 * R)
    buffer = make_buffer(R, 8 << 20)
    with buffer.agrs_new_session():
        for rows, cols in ((R * 3, 129), (R, 4096), (R * 64, 7)):
            xs = [torch.randn((rows, cols), generator=gen, device="cuda").to(dtype)
                  for _ in range(R)]
            if dtype != torch.float16:
                want = ref.reduce_scatter([numpy_of(x) for x in xs])
            else:  # the reference takes bfloat16 / float32; the same sum, rounded to float16
                sums = [np.zeros((rows // R, cols), np.float32) for _ in range(R)]
                for s in range(R):
                    for r in range(R):
                        block = xs[s][r * (rows // R):(r + 1) * (rows // R)].float().cpu().numpy()
                        sums[r] = sums[r] + block
                want = [s.astype(np.float16) for s in sums]
            out, handle = buffer.reduce_scatter(xs)
            handle()
            for r in range(R):
                assert tuple(out[r].shape) == (rows // R, cols)
                assert numpy_of(out[r]).tobytes() == np.asarray(want[r]).tobytes(), \
                    f"rank {r}, {rows}x{cols} {dtype}"
    buffer.destroy()


def test_reduce_scatter_order_matters():
    """The inputs make a different rank order give a different float32 sum: a reduction in any
    other order fails the check above."""
    R = 4
    big = torch.full((R, 1), 2.0 ** 24, device="cuda")
    xs = [big.clone() if r == 0 else torch.full((R, 1), 1.0, device="cuda") for r in range(R)]
    xs[1] = -big.clone()
    buffer = make_buffer(R, 1 << 20)
    with buffer.agrs_new_session():
        out, handle = buffer.reduce_scatter(xs)
        handle()
        # (2^24 + -2^24) + 1 + 1 = 2 in rank order; 2^24 + 1 first would lose the 1.
        assert [float(o[0]) for o in out] == [2.0] * R
    buffer.destroy()


def test_what_a_session_refuses():
    R = 2
    buffer = make_buffer(R, 1 << 20, ops=2)
    x = [torch.ones(8, device="cuda") for _ in range(R)]
    with pytest.raises(RuntimeError, match="no AGRS session is open"):
        buffer.all_gather(x)
    buffer.create_agrs_session()
    with pytest.raises(ValueError, match="already open"):
        buffer.create_agrs_session()
    with pytest.raises(ValueError, match="an AGRS session is open; destroy it first"):
        buffer.agrs_set_config(1 << 20, 2)
    with pytest.raises(RuntimeError, match="where the PP slots are"):
        buffer.pp_send(x, [1, 0])
    with pytest.raises(RuntimeError, match="AGRS session is open on this buffer"):
        buffer.dispatch(x, topk_idx=[torch.zeros((8, 1), dtype=torch.int64, device="cuda")] * R,
                        num_experts=2)
    with pytest.raises(ValueError, match=r"t\[1\]: torch.float32 \(4,\), but rank 0's"):
        buffer.all_gather([torch.ones(8, device="cuda"), torch.ones(4, device="cuda")])
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        buffer.all_gather([torch.ones(8), torch.ones(8)])
    with pytest.raises(ValueError, match="num_max_session_bytes is 1048576"):
        buffer.all_gather([torch.ones(1 << 18, device="cuda") for _ in range(R)])
    _, h1 = buffer.all_gather(x)
    _, h2 = buffer.all_gather(x)
    h1(), h2()
    with pytest.raises(ValueError, match="already holds 2 all-gathers"):
        buffer.all_gather(x)
    with pytest.raises(ValueError, match="multiple of the 2 ranks"):
        buffer.reduce_scatter([torch.ones(3, device="cuda") for _ in range(R)])
    buffer.destroy_agrs_session()
    with pytest.raises(ValueError, match="no AGRS session is open"):
        buffer.destroy_agrs_session()
    with pytest.raises(ValueError, match="need a window of"):
        buffer.agrs_set_config(1 << 30, 2)
    buffer.destroy()


def test_sessions_reuse_memory_after_release():
    """Two sessions place their first all-gather at the same window offset: the second one's
    copies waited for every rank's release of the first (its data is the new one's)."""
    R = 4
    buffer = make_buffer(R, 1 << 20)
    ptrs = []
    for value in (1.0, 2.0):
        with buffer.agrs_new_session():
            gathered, handle = buffer.all_gather(
                [torch.full((64,), value + r, device="cuda") for r in range(R)])
            handle()
            ptrs.append(gathered[0].data_ptr())
            for r in range(R):
                assert gathered[r][:, 0].tolist() == [value + s for s in range(R)]
    assert ptrs[0] == ptrs[1]
    buffer.destroy()
