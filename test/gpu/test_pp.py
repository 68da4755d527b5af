"""PP channels on a GPU (virtual worlds of 1, 2, 4 and 8 ranks): sends to ring neighbours and
receives, in random interleavings as DeepEP's test_pp.py runs them (random sizes, dtypes and
directions, more tensors than slots), every received tensor bitwise the one sent, and what the
channels refuse. No kernel: nothing to prepare.

Run on the H200 by tools/device/run.sh (PYTHONPATH=python); skipped without torch or a GPU.
"""

import collections
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import epic  # noqa: E402

MAX_BYTES = 64 << 10


def make_buffer(R, inflight):
    buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=epic.ElasticBuffer.
                                get_pp_buffer_size_hint(MAX_BYTES, inflight),
                                explicitly_destroy=True)
    buffer.pp_set_config(MAX_BYTES, inflight)
    return buffer


def one_rank(R, r, x):
    """A per-rank list with `x` at rank r, None elsewhere."""
    return [x if i == r else None for i in range(R)]


@pytest.mark.parametrize("R, inflight", [(1, 1), (2, 2), (4, 4), (8, 3)])
def test_random_traffic_arrives_in_order_and_bitwise(R, inflight):
    rng = random.Random(10 * R + inflight)
    gen = torch.Generator(device="cuda").manual_seed(R)
    buffer = make_buffer(R, inflight)
    queues = collections.defaultdict(collections.deque)  # (src, dst) -> tensors in flight
    sent = received = 0
    dtypes = [torch.bfloat16, torch.float32, torch.int32, torch.uint8]
    while received < 256:
        r = rng.randrange(R)
        dst = rng.choice([(r + 1) % R, (r - 1) % R])
        full = len(queues[(r, dst)]) >= inflight
        if sent < 256 and not full and (rng.random() < 0.6 or not any(queues.values())):
            dtype = rng.choice(dtypes)
            n = rng.randrange(1, MAX_BYTES // dtype.itemsize + 1)
            x = (torch.randn(n, generator=gen, device="cuda").to(dtype) if dtype.is_floating_point
                 else torch.randint(0, 100, (n,), generator=gen, device="cuda").to(dtype))
            queues[(r, dst)].append(x.clone())
            buffer.pp_send(one_rank(R, r, x), one_rank(R, r, dst))
            x.fill_(0)  # the send copied it, stream-ordered: overwriting it later is fine
            sent += 1
        else:
            pending = [k for k, q in queues.items() if q]
            if not pending:
                continue
            src, dst = rng.choice(pending)
            want = queues[(src, dst)].popleft()
            got = torch.empty_like(want)
            buffer.pp_recv(one_rank(R, dst, got), one_rank(R, dst, src))
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), \
                f"tensor {received} from rank {src} to rank {dst}"
            received += 1
    buffer.destroy()


def test_what_the_channels_refuse():
    R = 4
    buffer = make_buffer(R, 2)
    x = torch.ones(16, device="cuda")
    with pytest.raises(ValueError, match="dst_rank_idx is 2, not a ring neighbour of rank 0"):
        buffer.pp_send(one_rank(R, 0, x), one_rank(R, 0, 2))
    with pytest.raises(ValueError, match="num_max_tensor_bytes is 65536"):
        buffer.pp_send(one_rank(R, 0, torch.ones(MAX_BYTES, device="cuda")), one_rank(R, 0, 1))
    with pytest.raises(RuntimeError, match="rank 3 has sent rank 0 0 tensor"):
        buffer.pp_recv(one_rank(R, 0, x), one_rank(R, 0, 3))
    buffer.pp_send(one_rank(R, 0, x), one_rank(R, 0, 1))
    buffer.pp_send(one_rank(R, 0, x), one_rank(R, 0, 1))
    with pytest.raises(RuntimeError, match="slot\\(s\\) at rank 1 are full"):
        buffer.pp_send(one_rank(R, 0, x), one_rank(R, 0, 1))
    got = torch.zeros(16, device="cuda")
    buffer.pp_recv(one_rank(R, 1, got), one_rank(R, 1, 0))
    buffer.pp_send(one_rank(R, 0, x), one_rank(R, 0, 1))  # a slot is free again
    assert torch.equal(got, x)
    with pytest.raises(TypeError, match="one tensor \\(or None\\) per rank"):
        buffer.pp_send([x], one_rank(R, 0, 1))
    with pytest.raises(ValueError, match="must be contiguous"):
        buffer.pp_send(one_rank(R, 0, torch.ones(4, 4, device="cuda").t()), one_rank(R, 0, 1))
    with pytest.raises(ValueError, match="need a window of"):
        buffer.pp_set_config(1 << 30, 4)
    buffer.destroy()
