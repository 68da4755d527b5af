"""The DSL's compiler front end: @epic.jit kernels -> comm + upstream MLIR (built through
epic._ir) -> PTX and cubin, checked on the IR text; errors point at the kernel's source line."""

import re

import ml_dtypes
import numpy as np
import pytest

import epic
import epic.language as el
from epic.dsl.codegen import CompileError
from epic.dsl.jit import SymmetricMemory

from dsl_kernels import line_of, ring, ring_nvlink, scale, take_slots, twice

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


def test_communication_maps_onto_the_comm_dialect():
    k = ring.compile(SymmetricMemory(2, 4096), np.zeros(64, np.int32), N=64)
    ir = k.asm["ir"]
    assert "%arg1: !comm.window" in ir
    for text in ("comm.team world", "comm.team_rank", "comm.team_size", "comm.local_ptr",
                 "comm.peer_ptr", "bytes from %arg1", "coop block", "comm.flush",
                 "comm.red add release scope sys", "comm.wait_flag", "timeout_ms 10000"):
        assert text in ir, text
    assert ".entry ring" in k.asm["ptx"]
    # On the nccl backend the same ring goes over NVLink: peer stores, then a release signal.
    k = ring_nvlink.compile(SymmetricMemory(2, 4096), np.zeros(64, np.int32), N=64,
                            backend="nccl")
    assert "comm.put" not in k.asm["ir"] and "comm.peer_ptr" in k.asm["ir"]
    assert ".entry ring_nvlink" in k.asm["ptx"] and "red.release.sys.add.u64" in k.asm["ptx"]


@epic.jit
def send_block(dst, src, n):
    el.put(dst, src, n)


@epic.jit
def sends_through_a_call(win):
    send_block(el.peer_ptr(win, 1), win + 64, 8)


@epic.jit
def puts_through_a_local_name(win):
    copy = el.put
    copy(el.peer_ptr(win, 1), win + 64, 8)


@epic.jit
def flushes(win):
    el.flush()


def test_the_nccl_backend_refuses_gin_calls_naming_the_kernel_and_the_line(monkeypatch):
    """The runtime's NCCL device communicator has no GIN contexts or signals: el.put and
    el.flush (GIN) are refused when a kernel is compiled for backend="nccl", at the call's line
    (then the call sites), naming the kernel and what to write instead; the virtual world
    compiles them."""
    from epic.dsl.checks import SourceError

    win = SymmetricMemory(2, 4096)
    file = ring.fn.__code__.co_filename
    with pytest.raises(SourceError) as e:
        ring.compile(win, np.zeros(64, np.int32), N=64, backend="nccl")
    assert str(e.value).startswith(
        f"{file}:{line_of(ring, 'el.put(')}: el.put in kernel ring cannot run on the nccl "
        "backend: it is a GIN put, and the runtime's NCCL device communicator has no GIN "
        "contexts or signals; copy over NVLink instead: el.store(el.peer_ptr(dst, peer) + "
        "offsets, el.load(src + offsets)), then el.signal(el.peer_ptr(flag, peer))")
    here = re.escape(__file__)
    with pytest.raises(SourceError, match=(
            rf"^{here}:{line_of(send_block, 'el.put(')}: el.put in kernel sends_through_a_call "
            rf"cannot run on the nccl backend: .*\n  in send_block, called at "
            rf"{here}:{line_of(sends_through_a_call, 'send_block(')}$")):
        sends_through_a_call.compile(win, backend="nccl")
    # A call the static check cannot resolve, the code generator refuses alike.
    with pytest.raises(CompileError, match=(
            rf"^{here}:{line_of(puts_through_a_local_name, 'copy(')}: el.put in kernel "
            "puts_through_a_local_name cannot run on the nccl backend")):
        puts_through_a_local_name.compile(win, backend="nccl")
    with pytest.raises(SourceError, match=(
            rf"^{here}:{line_of(flushes, 'el.flush(')}: el.flush in kernel flushes cannot run on "
            "the nccl backend: it is a GIN flush.*NVLink stores need no flush")):
        flushes.compile(win, backend="nccl")
    for kernel in (sends_through_a_call, puts_through_a_local_name, flushes):
        assert ".entry" in kernel.compile(win).asm["ptx"]  # the virtual world has them
    # Refused before the caches: a machine without the compiler does not run a stale IR.
    import sys

    monkeypatch.setitem(sys.modules, "epic._ir", None)
    monkeypatch.delattr(epic, "_ir", raising=False)
    with pytest.raises(SourceError, match="el.put in kernel ring"):
        epic.jit(ring.fn).compile(win, np.zeros(64, np.int32), N=64, backend="nccl")


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
        dc.combine_reduce.compile(idx, x, T, win, H=H, K=K, BH=32, L=L, TMAX=T,
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


def test_tuples_let_a_static_range_issue_its_loads_before_its_stores():
    from dsl_kernels import copy_in_parts

    x = np.zeros(4096, np.float32)
    k = copy_in_parts.compile(x, x, 4000, BLOCK=512, PARTS=4)  # 4 x f32 = 16 bytes a thread
    ir, ptx = k.asm["ir"], k.asm["ptx"]
    loads = ir[:ir.index("llvm.store")]  # all four parts' loads (whole, ragged) come first
    assert loads.count("llvm.load") == 4 and loads.count("llvm.intr.masked.load") == 4
    assert ptx.count("ld.global.v4.b32") == 4 and ptx.count("st.global.v4.b32") == 4
    assert k.metadata["kernels"][0]["spill_store_bytes"] == 0


@epic.jit
def indexes_at_run_time(x_ptr, i):
    values = (el.load(x_ptr), el.load(x_ptr + 1))
    el.store(x_ptr, values[i])


@epic.jit
def indexes_a_block(x_ptr):
    el.store(x_ptr, el.arange(0, 64)[0])


@epic.jit
def indexes_past_the_end(x_ptr):
    values = (el.load(x_ptr),)
    el.store(x_ptr, values[1])


@epic.jit
def carries_a_tuple(x_ptr, n):
    sums = (el.load(x_ptr), el.load(x_ptr + 1))
    for i in range(n):
        sums = (sums[0] + 1, sums[1] + 2)
    el.store(x_ptr, sums[0])


@epic.jit
def branches_on_a_tuple(x_ptr, n):
    values = (el.load(x_ptr),)
    if n > 0:
        values = (el.load(x_ptr + 1),)
    el.store(x_ptr, values[0])


def test_tuples_are_compile_time_values_indexed_by_constants():
    x = np.zeros(64, np.int32)
    with pytest.raises(CompileError, match=r"test_dsl_compiler.py:\d+: sums is a tuple reassigned "
                                           r"in a loop: tuples are compile-time values"):
        carries_a_tuple.compile(x, 4)  # not the first iteration's tuple, silently
    with pytest.raises(CompileError, match="values is a tuple reassigned in a branch"):
        branches_on_a_tuple.compile(x, 4)
    with pytest.raises(CompileError, match="a tuple index must be a constant"):
        indexes_at_run_time.compile(x, 2)
    with pytest.raises(CompileError, match="only tuples can be indexed"):
        indexes_a_block.compile(x)
    with pytest.raises(CompileError, match=r"tuple index 1 out of range \(1 elements\)"):
        indexes_past_the_end.compile(x)


@epic.jit
def while_on_a_block(x_ptr):
    v = el.load(x_ptr + el.arange(0, 4))
    while v > 0:
        v = v - 1


def test_while_needs_a_scalar_condition():
    x = np.zeros(4, np.int32)
    with pytest.raises(CompileError, match="while needs a scalar condition"):
        while_on_a_block.compile(x)


def test_calls_of_jit_functions_are_inlined():
    from dsl_kernels import split_doubled, sum_doubled

    x = np.zeros(1000, np.float32)
    k = split_doubled.compile(x, x, x, 1000, 1.5, BLOCK=256)  # a value, a tuple, nested calls
    ir = k.asm["ir"]
    assert ir.count("gpu.func") == 1 and "func.call" not in ir  # one kernel, the calls inlined
    assert ir.count("llvm.intr.masked.load") == 1 and ir.count("llvm.intr.masked.store") == 2
    assert "arith.mulf" in ir and ir.count("arith.select") == 2  # twice, split_at's two halves
    # offsets_of's block stays `scalar + arange`: whole-vector accesses.
    assert "{alignment = 8 : i64} : !llvm.ptr<1> -> vector<2xf32>" in ir
    assert k.metadata["kernels"][0]["spill_store_bytes"] == 0
    ir = sum_doubled.compile(x, x, 1000, BLOCK=256).asm["ir"]
    assert "iter_args" in ir and "-> (vector<2xf32>)" in ir  # acc carried through the calls
    # The callees' sources are part of the disk cache's key.
    assert {f.__name__ for f in split_doubled.dependencies()} == \
        {"load_part", "offsets_of", "split_at", "twice"}


@epic.jit
def mixes_in_a_helper(x, BLOCK: el.constexpr):
    return (x > 0) + el.arange(0, BLOCK)  # the line the error names


@epic.jit
def calls_mixes(x_ptr, BLOCK: el.constexpr):
    el.store(x_ptr + el.arange(0, BLOCK), mixes_in_a_helper(el.load(x_ptr), BLOCK))


def test_calls_that_cannot_be_inlined_point_at_the_line():
    from dsl_kernels import (calls_countdown, calls_returns_early, calls_with_too_many, countdown,
                             passes_a_value_as_constexpr, returns_early)

    x = np.zeros(64, np.int32)
    there = r"dsl_kernels.py:"
    with pytest.raises(CompileError, match=there + str(line_of(countdown, "names")) +
                       r": recursive call of countdown \(calls_countdown -> countdown -> "
                       r"countdown\): calls of @epic.jit functions are inlined, so a function "
                       r"cannot call itself\n"
                       r"  in countdown, called at .*" + there +
                       str(line_of(calls_countdown, "call site"))):
        calls_countdown.compile(x, 3)
    with pytest.raises(CompileError, match=there + str(line_of(returns_early, "names")) +
                       r": returns_early: a return inside a loop or a branch"):
        calls_returns_early.compile(x)
    with pytest.raises(CompileError, match=there + str(line_of(calls_with_too_many, "names")) +
                       r": twice\(x\): too many positional arguments"):
        calls_with_too_many.compile(x)
    with pytest.raises(CompileError, match=there + str(line_of(passes_a_value_as_constexpr,
                                                               "names")) +
                       r": offsets_of: BLOCK is an el.constexpr, it takes a constant"):
        passes_a_value_as_constexpr.compile(x)
    # An error in the callee names its line, then the call site.
    here = r"test_dsl_compiler.py:"
    with pytest.raises(CompileError, match=here + str(line_of(mixes_in_a_helper, "names")) +
                       r": mixed element types i1 and i32: cast one with \.to\(\.\.\.\)\n"
                       r"  in mixes_in_a_helper, called at .*" + here +
                       str(line_of(calls_mixes, "mixes_in_a_helper("))):
        calls_mixes.compile(x, BLOCK=64)
    with pytest.raises(TypeError, match=r"launch it as twice\[grid\]"):  # outside a kernel
        twice(1.0)


def test_a_runtime_abi_specialization_is_compiled_once(monkeypatch, tmp_path):
    """The in-process compile fills the runtime's kernel cache (epic-compile is not run on the
    same IR again), and a new process takes the kernels from there without compiling."""
    _C = pytest.importorskip("epic._C")
    import epic._ir as ir

    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EPIC_COMPILE", "/bin/false")  # a launch that compiled would fail
    args = (SymmetricMemory(2, 4096), np.zeros(64, np.int32))
    k = epic.jit(ring.fn).compile(*args, N=64, abi="runtime", ranks=2)
    runtime = _C.Runtime("virtual", "", "")
    assert runtime.kernels_for_ir(k.asm["ir"])["source"] != "compiled"  # found, not compiled
    assert runtime.cached_kernels(k.asm["ir"])["ptx"] == k.asm["ptx"]

    def no_second_compile(*_):
        raise AssertionError("compiled again")

    monkeypatch.setattr(ir, "compile", no_second_compile)
    again = epic.jit(ring.fn).compile(*args, N=64, abi="runtime", ranks=2)  # a fresh cache
    assert again.asm == k.asm and again.metadata == k.metadata
