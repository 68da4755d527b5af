"""ElasticBuffer's Engram API without a GPU: DeepEP's size formula, the host segment's size
rule, the methods' DeepEP signatures, and the kernel's request and record checks (the C++
runtime, no GPU needed). The tables and fetches run on the GPU (test/gpu/test_engram.py)."""

import inspect
import json

import numpy as np
import pytest

import epic
from epic import _C
from epic import reference as ref

BF16 = np.dtype("float16")  # any dtype with itemsize 2 (a torch.dtype on a GPU machine)
FP8 = np.dtype("uint8")


def test_storage_hint_is_deepeps_formula():
    # DeepEP's test_engram.py: 524288 entries x hidden 128 bf16, 512 tokens x 24 entries.
    gpu, cpu = epic.ElasticBuffer.get_engram_storage_size_hint(524288, 128, 512 * 24, BF16)
    assert (gpu, cpu) == (4 << 20, 128 << 20)
    for args in ((1000, 100, 7, BF16), (3, 4096, 1, FP8), (1, 8, 1, np.dtype("float32"))):
        entries, hidden, tmax, dtype = args
        assert epic.ElasticBuffer.get_engram_storage_size_hint(*args) == \
            ref.engram_storage_size_hint(entries, hidden, tmax, dtype.itemsize)
    # 100 x 2 = 200 bytes -> 224 per entry (32-byte aligned): 1000 entries, 224,000 -> 2 MiB.
    assert epic.ElasticBuffer.get_engram_storage_size_hint(1000, 100, 7, BF16)[1] == 2 << 20


def test_bad_arguments_are_named():
    hint = epic.ElasticBuffer.get_engram_storage_size_hint
    with pytest.raises(ValueError, match="num_entries: must be >= 1"):
        hint(0, 128, 1, BF16)
    with pytest.raises(TypeError, match="hidden: expected an int"):
        hint(1, 128.0, 1, BF16)
    with pytest.raises(TypeError, match="dtype: expected a torch.dtype"):
        hint(1, 128, 1, "bf16")
    with pytest.raises(ValueError, match="num_cpu_bytes: must be a multiple of 2 MiB"):
        epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20, num_cpu_bytes=(2 << 20) + 1)


def test_methods_have_deepeps_signatures():
    write = inspect.signature(epic.ElasticBuffer.engram_write)
    assert list(write.parameters) == ["self", "storage", "sf"]
    assert write.parameters["sf"].default is None
    fetch = inspect.signature(epic.ElasticBuffer.engram_fetch)
    assert list(fetch.parameters) == ["self", "indices", "num_qps", "use_tma_aligned_col_major_sf"]
    assert fetch.parameters["num_qps"].default == 0
    assert fetch.parameters["use_tma_aligned_col_major_sf"].default is False
    hint = inspect.signature(epic.ElasticBuffer.get_engram_storage_size_hint)
    assert list(hint.parameters) == ["num_entries", "hidden", "num_max_tokens_per_rank", "dtype"]


def spec(**kw):
    s = dict(num_ranks=4, num_experts=4, num_topk=1, hidden=128, dtype="bf16",
             num_scale_packs=0, expert_alignment=1, do_expand=False, num_max_tokens_per_rank=64)
    s.update(kw)
    return s


def test_the_kernel_request_is_normalized():
    """Specs differing only in what the fetch is not specialized on ask for one kernel set."""
    runtime = _C.Runtime("virtual", "", "")
    a = runtime.entry_ir(spec(), dict(entries_per_rank=10), "engram_fetch")
    b = runtime.entry_ir(spec(num_experts=16, num_topk=4, num_max_tokens_per_rank=7), {},
                         "engram_fetch")
    assert a == b
    assert "ep.engram_fetch" in a and "tensor<?x?xi32> -> tensor<?x?xbf16>" in a


def test_the_kernel_compiles_without_a_gpu(tmp_path):
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    kernels = runtime.kernels(spec(), {}, "engram_fetch")
    assert ".entry ep_engram_fetch_fetch" in kernels["ptx"]
    entry = json.loads(kernels["metadata"])["entries"][0]
    assert entry["entry"] == "engram_fetch" and entry["cooperative"] == 0
    other = runtime.kernels(spec(num_experts=16, num_topk=4), {}, "engram_fetch")
    assert other["key"] == kernels["key"] and other["source"] == "memory"
    with pytest.raises(ValueError, match="hidden"):
        runtime.kernels(spec(hidden=0), {}, "engram_fetch")
