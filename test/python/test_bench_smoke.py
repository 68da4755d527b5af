"""bench/ep_bench.py cannot rot: its smoke mode runs in CI (no GPU: it compiles
the kernels of a tiny configuration and checks its byte model on reference
routing statistics)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_bench_smoke_mode(tmp_path):
    _C = pytest.importorskip("epic._C")
    if _C.cuda_device_count():
        pytest.skip("a GPU is here: tools/device/run.sh bench runs the real benchmark")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ep_bench.py"), "--smoke",
                          "--out", str(tmp_path)], capture_output=True, text=True,
                         env=dict(os.environ, EPIC_CACHE_DIR=str(tmp_path / "cache")))
    assert out.returncode == 0, out.stderr
    (report,) = [json.load(open(tmp_path / f)) for f in os.listdir(tmp_path) if f.endswith(".json")]
    assert report["compile"]["cold_compile_s"] > 0 and report["compile"]["warm_load_s"] >= 0
    stats, model = report["byte_model"]["stats"], report["byte_model"]["bytes"]
    assert 0 < stats["recv_tokens"] <= stats["pairs"] <= stats["expanded_rows"]
    # Every received token's row is sent once and written once at least.
    row = report["args"]["hidden"] + 4 * (report["args"]["hidden"] // 128)
    assert model["ep_dispatch_send"] >= 2 * stats["recv_tokens"] * row
    assert model["logical_combine"] == stats["recv_tokens"] * (2 * report["args"]["hidden"] + 4 * 8)


def test_multi_gpu_bench_compiles_its_kernels(tmp_path):
    pytest.importorskip("epic._C")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ep_multi_gpu.py"),
                          "--compile-only", "--world-size", "2", "--tokens", "64"],
                         capture_output=True, text=True,
                         env=dict(os.environ, EPIC_CACHE_DIR=str(tmp_path / "cache")))
    assert out.returncode == 0, out.stderr
    assert "ep_multi_gpu: kernels for 2 ranks" in out.stdout


def test_a_size_out_of_memory_is_skipped_by_name(capsys):
    """gemm_bench and layer_bench go on past a size that does not fit and name it."""
    pytest.importorskip("epic._C")  # ep_bench imports the extension
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ep_bench

    class Cuda:
        @staticmethod
        def get_device_name():
            return "NVIDIA H100 80GB HBM3"

    class Torch:
        cuda = Cuda

    error = RuntimeError("CUDA out of memory. Tried to allocate 3.50 GiB\nmore detail")
    record = ep_bench.out_of_memory(Torch, "layer_bench", 4096, error)
    assert record == dict(tokens=4096, why="CUDA out of memory. Tried to allocate 3.50 GiB")
    assert capsys.readouterr().out == (
        "layer_bench: 4096 tokens per rank do not fit NVIDIA H100 80GB HBM3 (CUDA out of memory. "
        "Tried to allocate 3.50 GiB); skipped\n")
