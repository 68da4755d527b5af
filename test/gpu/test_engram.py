"""Engram on a GPU (virtual worlds of 1, 2, 4 and 8 ranks): tables written into the ranks' host
segments, rows fetched by global entry id with the kernel of ep.engram_fetch, bitwise against
epic.reference.engram_fetch (data and FP8 scale packs, both sf layouts), as DeepEP's
test_engram.py checks them; tables re-written with other sizes; CUDA-graph replay; what the
buffer refuses.

Run on the H200 by tools/device/run.sh (PYTHONPATH=python); skipped without torch or a GPU.
"""

import sys

import pytest

# (ranks, hidden, dtype) of every fetch below and in bench/collectives_bench.py.
KERNELS = [(R, 128, "bf16") for R in (1, 2, 4, 8)] + [(2, 256, "f8E4M3FN"),
                                                      (4, 256, "f8E4M3FN"), (4, 8, "f32"),
                                                      (4, 24, "f16"), (4, 7168, "bf16"),
                                                      (4, 1000, "f32"), (2, 256, "bf16")]


def prepare():
    """Compiles every fetch kernel this file and the bench launch into $EPIC_CACHE_DIR (no GPU
    needed; the GPU machine has no compiler)."""
    import epic._C as C

    for backend in ("virtual", "nccl"):
        runtime = C.Runtime(backend, "", "")
        for ranks, hidden, dtype in KERNELS:
            fp8 = dtype.startswith("f8")
            spec = dict(num_ranks=ranks, num_experts=ranks, num_topk=1, hidden=hidden,
                        dtype=dtype, num_scale_packs=1 if fp8 else 0, expert_alignment=1,
                        do_expand=False, num_max_tokens_per_rank=4096 * 24)
            runtime.kernels(spec, {}, "engram_fetch")
    print(f"test_engram: {2 * len(KERNELS)} kernel sets in {runtime.cache_dir}")


if __name__ == "__main__" and "--prepare" in sys.argv:
    sys.exit(prepare())

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import epic  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic._tensors import torch_to_numpy  # noqa: E402


def numpy_of(t):
    return torch_to_numpy(t.contiguous())


def make_buffer(R, entries, hidden, tokens, dtype=torch.bfloat16):
    gpu, cpu = epic.ElasticBuffer.get_engram_storage_size_hint(entries, hidden, tokens, dtype)
    return epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=max(gpu, 2 << 20),
                              num_cpu_bytes=cpu, explicitly_destroy=True)


def tables_for(R, entries, hidden, dtype, gen):
    if dtype.is_floating_point and dtype.itemsize == 1:
        return [(torch.randn((entries, hidden), generator=gen, device="cuda") * 8).to(dtype)
                for _ in range(R)]
    return [torch.randn((entries, hidden), generator=gen, device="cuda").to(dtype)
            for _ in range(R)]


def check_fetch(buffer, tables, idxs, sf=None, col_major=False):
    data, packs = buffer.engram_fetch(idxs, use_tma_aligned_col_major_sf=col_major)()
    want = ref.engram_fetch([numpy_of(t) for t in tables], [numpy_of(i) for i in idxs],
                            None if sf is None else numpy_of(sf))
    for r, ((got, got_sf), (expected, expected_sf)) in enumerate(zip(zip(data, packs), want)):
        assert tuple(got.shape) == expected.shape, r
        assert numpy_of(got).tobytes() == expected.tobytes(), f"rank {r}'s rows"
        if sf is None:
            assert got_sf is None
        else:
            assert tuple(got_sf.shape) == expected_sf.shape
            assert numpy_of(got_sf).tobytes() == expected_sf.tobytes(), f"rank {r}'s sf"
            if col_major:  # tokens contiguous, padded to 4 (16-byte TMA rows)
                assert got_sf.stride(0) == 1
                assert got_sf.stride(1) % 4 == 0 and got_sf.stride(1) >= got_sf.shape[0]


@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_bf16_fetches(R):
    """DeepEP's shape scaled down: 4096 entries x hidden 128 per rank, 64 tokens x 24 entries,
    several fetches of random ids (every owner, first and last entries included), a table
    re-written with other contents."""
    gen = torch.Generator(device="cuda").manual_seed(R)
    entries, hidden = 4096, 128
    buffer = make_buffer(R, entries, hidden, 64 * 24)
    try:
        for write in range(2):
            tables = tables_for(R, entries, hidden, torch.bfloat16, gen)
            buffer.engram_write(tables)
            for tokens, m in ((64, 24), (1, 1), (7, 3), (128, 2)):
                idxs = [torch.randint(0, R * entries, (tokens, m), generator=gen, device="cuda",
                                      dtype=torch.int32) for _ in range(R)]
                idxs[0].view(-1)[0] = 0
                idxs[-1].view(-1)[-1] = R * entries - 1
                check_fetch(buffer, tables, idxs)
    finally:
        buffer.destroy()


@pytest.mark.parametrize("R", [2, 4])
@pytest.mark.parametrize("col_major", [False, True])
def test_fp8_fetches_with_scale_packs(R, col_major):
    gen = torch.Generator(device="cuda").manual_seed(10 + R)
    entries, hidden, packs = 1024, 256, 2
    buffer = make_buffer(R, entries, hidden, 33 * 5, torch.float8_e4m3fn)
    try:
        tables = tables_for(R, entries, hidden, torch.float8_e4m3fn, gen)
        sf = torch.rand((R * entries, packs), generator=gen, device="cuda")
        buffer.engram_write(tables, [sf] * R)
        idxs = [torch.randint(0, R * entries, (33, 5), generator=gen, device="cuda",
                              dtype=torch.int32) for _ in range(R)]
        check_fetch(buffer, tables, idxs, sf, col_major)
    finally:
        buffer.destroy()


def test_other_row_sizes_and_dtypes():
    """Rows of 32 bytes to 14 KiB, entries 32-byte aligned in the table or not."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    R = 4
    for dtype, hidden in ((torch.float32, 8), (torch.float16, 24), (torch.bfloat16, 7168),
                          (torch.float32, 1000)):
        buffer = make_buffer(R, 300, hidden, 40, dtype)
        try:
            tables = tables_for(R, 300, hidden, dtype, gen)
            buffer.engram_write(tables)
            idxs = [torch.randint(0, R * 300, (10, 4), generator=gen, device="cuda",
                                  dtype=torch.int32) for _ in range(R)]
            check_fetch(buffer, tables, idxs)
        finally:
            buffer.destroy()


def test_graph_replay():
    """A fetch captured once and replayed with new ids in the same tensors."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    R, entries, hidden = 2, 512, 256
    buffer = make_buffer(R, entries, hidden, 256)
    try:
        tables = tables_for(R, entries, hidden, torch.bfloat16, gen)
        buffer.engram_write(tables)
        idxs = [torch.zeros((16, 8), dtype=torch.int32, device="cuda") for _ in range(R)]
        buffer.engram_fetch(idxs)()  # plans and loads the kernel outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            data, _ = buffer.engram_fetch(idxs)()
        for _ in range(3):
            for i in idxs:
                i.copy_(torch.randint(0, R * entries, i.shape, generator=gen, device="cuda",
                                      dtype=torch.int32))
            graph.replay()
            torch.cuda.synchronize()
            want = ref.engram_fetch([numpy_of(t) for t in tables], [numpy_of(i) for i in idxs])
            for got, (expected, _) in zip(data, want):
                assert numpy_of(got).tobytes() == expected.tobytes()
    finally:
        buffer.destroy()


def test_refusals():
    R = 2
    gen = torch.Generator(device="cuda").manual_seed(7)
    no_segment = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=2 << 20,
                                    explicitly_destroy=True)
    try:
        with pytest.raises(ValueError, match="no host segment"):
            no_segment.engram_write([torch.zeros((4, 128), dtype=torch.bfloat16,
                                                 device="cuda")] * R)
    finally:
        no_segment.destroy()
    buffer = make_buffer(R, 256, 128, 16)
    try:
        idx = [torch.zeros((2, 2), dtype=torch.int32, device="cuda")] * R
        with pytest.raises(ValueError, match="no table was written"):
            buffer.engram_fetch(idx)
        tables = tables_for(R, 256, 128, torch.bfloat16, gen)
        with pytest.raises(ValueError, match="do not fit|need .* bytes"):
            buffer.engram_write(tables_for(R, 1 << 15, 128, torch.bfloat16, gen))
        with pytest.raises(ValueError, match="like rank 0's"):
            buffer.engram_write([tables[0], tables[1][:100]])
        with pytest.raises(ValueError, match="sf.*required with FP8"):
            buffer.engram_write([t.to(torch.float8_e4m3fn) for t in tables])
        with pytest.raises(ValueError, match="sf.*only with them"):
            buffer.engram_write(tables, [torch.zeros((2 * 256, 1), device="cuda")] * R)
        with pytest.raises(ValueError, match="hidden: 12 is not a multiple of 8"):
            buffer.engram_write([torch.zeros((4, 12), dtype=torch.bfloat16, device="cuda")] * R)
        buffer.engram_write(tables)
        bad = [torch.tensor([[0, 1], [2, R * 256]], dtype=torch.int32, device="cuda"), idx[1]]
        with pytest.raises(ValueError, match=r"indices\[0\]\[1, 1\] = 512 is not an entry"):
            buffer.engram_fetch(bad)
        with pytest.raises(TypeError, match="int32"):
            buffer.engram_fetch([i.long() for i in idx])
        with pytest.raises(ValueError, match="num_qps"):
            buffer.engram_fetch(idx, num_qps=-1)
        # Nothing was lost: the table still fetches.
        check_fetch(buffer, tables, [torch.arange(4, dtype=torch.int32, device="cuda")
                                     .view(2, 2) * 100] * R)
    finally:
        buffer.destroy()


def test_dispatch_still_works_with_a_host_segment():
    """The window's device part is unchanged by the segment after it: a dispatch + combine
    round trip on a buffer with a host segment equals, bitwise, the same calls on one without."""
    # A configuration test/gpu/prepare_buffer_kernels.py compiles (hidden 512, top-6, Tmax 96).
    R, T, H, E, K = 2, 96, 512, 16, 6
    gen = torch.Generator(device="cuda").manual_seed(11)
    xs = [torch.randn((T, H), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(R)]
    idxs = [torch.stack([torch.randperm(E, generator=gen, device="cuda")[:K] for _ in range(T)])
            for _ in range(R)]
    ws = [torch.rand((T, K), generator=gen, device="cuda") for _ in range(R)]
    results = []
    for cpu_bytes in (0, 2 << 20):
        buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=64 << 20,
                                    num_max_tokens_per_rank=T, num_cpu_bytes=cpu_bytes,
                                    explicitly_destroy=True)
        try:
            recv, _, recv_w, handle, _ = buffer.dispatch(xs, topk_idx=idxs, topk_weights=ws,
                                                         num_experts=E)
            combined, _, _ = buffer.combine(recv, handle)
            results.append([numpy_of(c).tobytes() for c in combined])
        finally:
            buffer.destroy()
    assert results[0] == results[1]
