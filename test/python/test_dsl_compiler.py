"""The DSL's compiler front end: @epic.jit kernels -> comm + upstream MLIR (built through
epic._ir) -> PTX and cubin, checked on the IR text; errors point at the kernel's source line."""

import ml_dtypes
import numpy as np
import pytest

import epic
import epic.language as el
from epic.dsl.codegen import CompileError
from epic.dsl.jit import SymmetricMemory

from dsl_kernels import ring, scale, take_slots

pytest.importorskip("epic._ir", reason="the DSL compiler is built where LLVM/MLIR are")


def test_blocks_become_per_thread_vectors_with_masked_accesses():
    x = np.zeros(1000, np.float32)
    k = scale.compile(x, x, 1000, 2.0, BLOCK=1024)  # 128 threads: 8 elements each
    ir = k.asm["ir"]
    assert "gpu.func @scale(%arg0: !comm.dev_comm, %arg1: !llvm.ptr<1>, %arg2: !llvm.ptr<1>, " \
           "%arg3: i32, %arg4: f32) kernel" in ir
    assert "arith.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : vector<8xi32>" in ir
    assert "llvm.intr.masked.load" in ir and "llvm.intr.masked.store" in ir
    assert "arith.mulf" in ir and "vector.broadcast %arg4 : f32 to vector<8xf32>" in ir
    assert ".entry scale" in k.asm["ptx"] and len(k.asm["cubin"]) > 0
    assert k.metadata["kernels"][0]["spill_store_bytes"] == 0
    # Compiled once per specialization.
    assert scale.compile(x, x, 7, 3.0, BLOCK=1024) is k
    assert scale.compile(x, x, 7, 3.0, BLOCK=256) is not k
    small = scale.compile(x, x, 7, 3.0, BLOCK=64)  # fewer elements than threads
    assert "arith.cmpi slt" in small.asm["ir"] and "vector<1xf32>" in small.asm["ir"]


@pytest.mark.parametrize("backend", ["virtual", "nccl"])
def test_communication_maps_onto_the_comm_dialect(backend):
    k = ring.compile(SymmetricMemory(2, 4096), np.zeros(64, np.int32), N=64, backend=backend)
    ir = k.asm["ir"]
    assert "%arg1: !comm.window" in ir
    for text in ("comm.team world", "comm.team_rank", "comm.team_size", "comm.local_ptr",
                 "comm.peer_ptr", "bytes from %arg1", "coop block", "comm.flush",
                 "comm.red add release scope sys", "comm.wait_flag", "timeout_ms 10000"):
        assert text in ir, text
    assert ".entry ring" in k.asm["ptx"]


@epic.jit
def accumulate(x_ptr, out_ptr, n, BLOCK: el.constexpr):
    acc = el.zeros((BLOCK,), el.float32)
    for i in range(0, n, BLOCK):
        offsets = i + el.arange(0, BLOCK)
        acc += el.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    if el.program_id(0) == 0:
        el.store(out_ptr + el.arange(0, BLOCK), acc)
    for j in el.static_range(2):
        el.store(out_ptr + BLOCK * (j + 1) + el.arange(0, BLOCK), acc * 2.0)


def test_loops_carry_values_and_branches_and_static_loops_unroll():
    x = np.zeros(4096, np.float32)
    ir = accumulate.compile(x, x, 4096, BLOCK=256).asm["ir"]
    assert "iter_args" in ir and "-> (vector<2xf32>)" in ir
    assert "scf.if" in ir
    assert ir.count("llvm.store") == 3  # the branch's and the two unrolled ones


@epic.jit
def reduces(x_ptr, out_ptr, BLOCK: el.constexpr):
    el.store(out_ptr, el.cumsum(el.load(x_ptr + el.arange(0, BLOCK))))


@epic.jit
def row_stats(x_ptr, out_ptr, BLOCK: el.constexpr):
    row = el.load(x_ptr + el.program_id(0) * BLOCK + el.arange(0, BLOCK))
    el.store(out_ptr + 3 * el.program_id(0), el.sum(row))
    el.store(out_ptr + 3 * el.program_id(0) + 1, el.max(row))
    el.store(out_ptr + 3 * el.program_id(0) + 2, el.min(row))


@pytest.mark.parametrize("block", [64, 1024])
def test_reductions_go_through_the_thread_the_warp_and_shared_memory(block):
    x = np.zeros(4096, np.float32)
    k = row_stats.compile(x, x, BLOCK=block)
    ir = k.asm["ir"]
    for text in ("vector.reduction <add>", "vector.reduction <maximumf>",
                 "vector.reduction <minimumf>", "gpu.shuffle  xor", "#gpu.address_space<workgroup>",
                 "memref.get_global @epic_scratch2"):
        assert text in ir, text
    if block < 128:  # threads past the block contribute the identity (-inf for max)
        assert "0xFF800000" in ir
    assert ".entry row_stats" in k.asm["ptx"]


def test_atomics_run_once_per_program_and_broadcast_the_old_value():
    ir = take_slots.compile(SymmetricMemory(2, 64), np.zeros(8, np.int32)).asm["ir"]
    assert "comm.atomic_rmw add relaxed scope sys" in ir
    assert ir.count("gpu.barrier") >= 2 and "memref<1xi32, #gpu.address_space<workgroup>>" in ir


@epic.jit
def gathers(x_ptr, idx_ptr, BLOCK: el.constexpr):
    rows = el.load(idx_ptr + el.arange(0, BLOCK))
    el.load(x_ptr + rows)


@epic.jit
def mixes(x_ptr, BLOCK: el.constexpr):
    v = el.load(x_ptr + el.arange(0, BLOCK))
    el.store(x_ptr + el.arange(0, BLOCK), (v > 0) + el.arange(0, BLOCK))


@epic.jit
def spins(x_ptr):
    while True:
        pass


def test_what_the_compiler_cannot_do_points_at_the_line():
    x = np.zeros(64, np.float32)
    i = np.zeros(64, np.int32)
    with pytest.raises(CompileError, match=r"test_dsl_compiler.py:\d+: el.cumsum of bf16 blocks: "
                                           r"cast to f32 or i32 first"):
        reduces.compile(x.astype(ml_dtypes.bfloat16), x, BLOCK=64)
    with pytest.raises(CompileError, match="gathers are not supported by the compiler yet"):
        gathers.compile(x, i, BLOCK=64)
    with pytest.raises(CompileError, match="mixed element types i1 and i32"):
        mixes.compile(x, BLOCK=64)
    with pytest.raises(CompileError, match="while True never ends"):
        spins.compile(x)


@epic.jit
def fp8_round_trip(x_ptr, q_ptr, y_ptr, BLOCK: el.constexpr):
    offsets = el.arange(0, BLOCK)
    q = el.load(x_ptr + offsets).to(el.float32).to(el.float8e4nv)
    el.store(q_ptr + offsets, q)
    el.store(y_ptr + offsets, el.load(q_ptr + offsets).to(el.float32))


@pytest.mark.parametrize("block", [64, 1024])
def test_fp8_conversions_use_the_hardware_instructions(block):
    import ml_dtypes

    k = fp8_round_trip.compile(np.zeros(block, ml_dtypes.bfloat16),
                               np.zeros(block, ml_dtypes.float8_e4m3fn),
                               np.zeros(block, np.float32), BLOCK=block)
    ir, ptx = k.asm["ir"], k.asm["ptx"]
    assert "nvvm.convert.f32x2.to.f8x2" in ir and "satfinite" in ir
    assert "nvvm.convert.f8x2.to.f16x2" in ir and "vector<" in ir
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.rn.f16x2.e4m3x2" in ptx


def test_the_dsl_examples_compile():
    """The schemes of examples/dsl: every kernel of the dispatch + combine and the replica
    dispatch and the low-latency dispatch with its fused FP8 quantization compile to PTX."""
    import os
    import sys

    from epic import reference as ref

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "dsl"))
    import dispatch_combine as dc
    import least_loaded_replica as lr
    import low_latency_dispatch as ll

    R, K, H, T, L = 4, 4, 64, 24, 4
    layout = dc.Layout(R, K, H, T)
    win = SymmetricMemory(R, layout.bytes)
    x = np.zeros((T, H), ref.bfloat16)
    idx, w = np.zeros((T, K), np.int64), np.zeros((T, K), np.float32)
    where = dict(ROWS=layout.rows, META=layout.meta, LOCAL=layout.local, WEIGHTS=layout.weights)
    rows = R * T
    kernels = [
        dc.dispatch_send.compile(x, idx, w, T, win, H=H, K=K, BK=4, BH=32, L=L, TMAX=T, **where),
        dc.dispatch_copy.compile(win, np.zeros((rows, H), ref.bfloat16),
                                 np.zeros((rows, K + 2), np.int32), np.zeros((rows, K), np.int64),
                                 np.zeros((rows, K), np.float32), np.zeros(1, np.int32),
                                 H=H, K=K, BK=4, BM=8, BH=32, **where),
        dc.combine_send.compile(x, np.zeros((T, K + 2), np.int32), np.zeros(1, np.int32), win,
                                H=H, K=K, BH=32, TMAX=T, COMBINE=layout.combine),
        dc.combine_reduce.compile(idx, x, T, win, H=H, K=K, BK=4, BH=32, L=L, TMAX=T,
                                  COMBINE=layout.combine),
        lr.replica_dispatch.compile(x, idx, T, SymmetricMemory(R, lr.Layout(64, H).bytes), H=H,
                                    K=K, L=L, BH=32, ROWS=16, INFO=16 + 64 * H * 2, CAPACITY=64),
    ]
    low = ll.Layout(R, L, 256, 8)
    kernels.append(ll.ll_dispatch.compile(
        np.zeros((8, 256), ref.bfloat16), idx[:8], 8, SymmetricMemory(R, low.bytes),
        np.zeros(L * R, np.int64), H=256, K=K, L=L, TMAX=8, ARRIVED=low.arrived,
        EXPECTED=low.expected, ROWS=low.rows, SCALES=low.scales, SOURCES=low.sources))
    for k in kernels:
        assert f".entry {k.name}" in k.asm["ptx"]
        assert k.metadata["kernels"][0]["spill_store_bytes"] == 0
    assert "cvt.rn.satfinite.e4m3x2.f32" in kernels[-1].asm["ptx"]  # the fused quantization


def test_the_runtime_abi_reads_arguments_from_per_rank_records():
    import json

    k = ring.compile(SymmetricMemory(2, 4096), np.zeros(64, np.int32), N=64, abi="runtime")
    ir = k.asm["ir"]
    assert "comm.rank_params %arg2 stride 128 via %arg0" in ir
    assert "gpu.launch_func  @dsl_kernels::@ring" in ir
    (entry,) = k.metadata["entries"]
    assert entry["name"] == "ring_launch" and entry["kernels"] == ["ring"]
    assert entry["param_fields"] == ["out"] and entry["param_stride"] == 128
    assert entry["threads"] == 128 and entry["cooperative"] == 1
    assert json.dumps(entry)


def test_a_gpu_launch_compiles_for_the_runtime_then_needs_the_device(monkeypatch):
    monkeypatch.setenv("EPIC_INTERPRET", "0")
    _C = pytest.importorskip("epic._C")
    if _C.cuda_device_count():
        pytest.skip("a GPU is here: the GPU suite launches compiled kernels")
    buffer = epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20)
    x = [np.zeros(64, np.float32)] * 2
    with pytest.raises(RuntimeError, match="no CUDA device here"):
        scale[(1,)](x, x, 64, 1.0, BLOCK=64, buffer=buffer)
    with pytest.raises(TypeError, match="buffer must be an epic.ElasticBuffer"):
        scale[(1,)](x, x, 64, 1.0, BLOCK=64, buffer="gpu")


def test_the_ir_is_cached_on_disk_for_machines_without_the_compiler(monkeypatch, tmp_path):
    import sys

    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    x = np.zeros(256, np.float32)
    fresh = epic.jit(scale.fn)  # no in-memory cache yet
    k = fresh.compile(x, x, 256, 2.0, BLOCK=256)
    (cached,) = (tmp_path / "dsl").glob("scale-*.json")
    # Without epic._ir (a GPU machine), a new process finds the same IR on disk...
    monkeypatch.setitem(sys.modules, "epic._ir", None)
    monkeypatch.delattr(epic, "_ir", raising=False)
    again = epic.jit(scale.fn).compile(x, x, 256, 2.0, BLOCK=256)
    assert again.asm["ir"] == k.asm["ir"] and "ptx" not in again.asm
    # ...and says what to do for a specialization nobody compiled.
    with pytest.raises(RuntimeError, match="not in the DSL cache"):
        epic.jit(scale.fn).compile(x, x, 256, 2.0, BLOCK=128)
    assert cached.exists()


@pytest.mark.parametrize("block", [8, 512])
def test_cumsum_cas_and_while_compile(block):
    from dsl_kernels import claim_once, exclusive_offsets, halvings

    c = np.zeros(block, np.int32)
    k = exclusive_offsets.compile(c, c, 5, BLOCK=block)
    ir = k.asm["ir"]
    assert ir.count("gpu.shuffle  up") == 6  # 5 steps of the warp scan + the exclusive shift
    assert "memref<4xi32, #gpu.address_space<workgroup>>" in ir  # the 4 warps' totals
    assert k.metadata["kernels"][0]["spill_store_bytes"] == 0
    k = claim_once.compile(SymmetricMemory(2, 64), c)
    assert "comm.atomic_cas acq_rel scope sys" in k.asm["ir"]
    assert "atom.acq_rel.sys.cas.b32" in k.asm["ptx"]
    ir = halvings.compile(c, c, 10).asm["ir"]
    assert "scf.while" in ir and "scf.condition" in ir


@epic.jit
def while_on_a_block(x_ptr):
    v = el.load(x_ptr + el.arange(0, 4))
    while v > 0:
        v = v - 1


def test_while_needs_a_scalar_condition():
    x = np.zeros(4, np.int32)
    with pytest.raises(CompileError, match="while needs a scalar condition"):
        while_on_a_block.compile(x)
