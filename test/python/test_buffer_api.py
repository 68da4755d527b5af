"""epic.ElasticBuffer without a GPU: the API surface, DeepEP's models, and
every argument check (numpy arrays stand in for tensors; a valid call ends at
"must be a CUDA tensor", after every other check has passed). The rules are the
C++ runtime's (epic._C checks a call's tensors by name, "rank r: ..." in a
virtual world); the Python layer adapts arguments and names what it adapts."""

import dataclasses
import json

import ml_dtypes
import numpy as np
import pytest

import epic
from epic import buffer as B

_C = pytest.importorskip("epic._C", reason="the runtime extension is built by ./install.sh")

R, E, K, H, TMAX = 4, 32, 4, 256, 64


@pytest.fixture
def buf():
    return epic.ElasticBuffer(epic.VirtualWorld(R), num_max_tokens_per_rank=TMAX, hidden=H,
                              num_topk=K)


def inputs(tokens=(10, 3, 0, 7), dtype=ml_dtypes.bfloat16):
    rng = np.random.default_rng(0)
    xs = [np.zeros((t, H), dtype) for t in tokens]
    idxs = [np.stack([rng.permutation(E)[:K] for _ in range(t)]).astype(np.int64)
            if t else np.zeros((0, K), np.int64) for t in tokens]
    ws = [np.ones((t, K), np.float32) for t in tokens]
    return xs, idxs, ws


def test_exports_match_deepep():
    for name in ("ElasticBuffer", "EPHandle", "EventOverlap", "EventHandle", "VirtualWorld"):
        assert hasattr(epic, name)
    fields = {f.name for f in dataclasses.fields(epic.EPHandle)}
    for name in ("do_expand", "num_experts", "expert_alignment", "num_max_tokens_per_rank",
                 "num_sms", "topk_idx", "num_recv_tokens", "num_expanded_tokens",
                 "num_recv_tokens_per_expert_list", "psum_num_recv_tokens_per_scaleup_rank",
                 "psum_num_recv_tokens_per_expert", "num_unaligned_recv_tokens_per_expert",
                 "recv_src_metadata", "dst_buffer_slot_idx"):
        assert name in fields


def test_virtual_world_checks_its_size():
    assert epic.VirtualWorld(8).size() == 8
    with pytest.raises(ValueError, match=r"num_ranks: must be in \[1, 1024\], got 0"):
        epic.VirtualWorld(0)
    with pytest.raises(TypeError, match="num_ranks: expected an int"):
        epic.VirtualWorld("8")


def test_a_virtual_world_of_nodes_needs_nodes_that_split_its_ranks(tmp_path):
    """epic._C's virtual world: gpus_per_node ranks per node, refused before any device work
    unless it divides the ranks."""
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    for gpus in (3, 0, 16):
        with pytest.raises(ValueError, match=r"gpus_per_node must be a positive divisor of "
                                             rf"num_ranks \(8\), got {gpus}$"):
            _C.Buffer.virtual_world(runtime, 8, 2 << 20, 4, gpus_per_node=gpus)
    with pytest.raises(TypeError, match="gpus_per_node"):
        _C.Buffer.virtual_world(runtime, 8, 2 << 20, 4, gpus_per_node="4")


def test_models_are_deepeps():
    w8 = epic.VirtualWorld(8)
    # DeepEP's worked example: H 7168, top-8, FP8, 8192 tokens, EP8 -> 900 MiB.
    assert epic.ElasticBuffer.get_buffer_size_hint(w8, 8192, 7168, 8, True) == 900 << 20
    b = epic.ElasticBuffer(w8, num_max_tokens_per_rank=4096, hidden=7168, num_topk=8,
                           use_fp8_dispatch=True)
    assert b.num_bytes % (2 << 20) == 0
    assert b.get_theoretical_num_sms(256, 8) == 24  # DeepEP's README figure for EP8
    assert b.get_theoretical_num_qps(24) == 9
    assert b.get_logical_domain_size() == (1, 8)
    with pytest.raises(ValueError, match="num_topk"):
        epic.ElasticBuffer.get_buffer_size_hint(w8, 16, 7168, 33)


def test_constructor_checks(buf):
    assert buf.num_ranks == R and buf.num_bytes % (2 << 20) == 0
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        epic.ElasticBuffer(object(), num_bytes=2 << 20)
    with pytest.raises(ValueError, match="num_bytes: must be a multiple of 2 MiB"):
        epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=3 << 20)
    with pytest.raises(ValueError, match="num_bytes: give it, or give num_max_tokens_per_rank"):
        epic.ElasticBuffer(epic.VirtualWorld(2))
    with pytest.raises(ValueError, match="num_cpu_bytes: must be a multiple of 2 MiB"):
        epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20, num_cpu_bytes=3 << 20)
    with pytest.raises(ValueError, match="num_cpu_bytes: must be >= 0"):
        epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20, num_cpu_bytes=-(2 << 20))
    sorted_rows = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=2 << 20, deterministic=True,
                                     num_max_tokens_per_rank=TMAX)
    xs, idxs, _ = inputs()
    with pytest.raises(ValueError, match="do_cpu_sync: a deterministic buffer sorts"):
        sorted_rows.dispatch(xs, idxs, num_experts=E, do_cpu_sync=False)


def test_window_outputs_refuses_what_it_cannot_keep_in_place(buf):
    xs, idxs, _ = inputs()
    with pytest.raises(ValueError, match="window_outputs: needs CUDA tensors"):
        buf.dispatch(xs, idxs, num_experts=E, window_outputs=True)
    with pytest.raises(TypeError, match="window_outputs: expected a bool"):
        buf.dispatch(xs, idxs, num_experts=E, window_outputs=1)
    sorted_rows = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=2 << 20, deterministic=True,
                                     num_max_tokens_per_rank=TMAX)
    with pytest.raises(ValueError, match="window_outputs: a deterministic buffer sorts"):
        sorted_rows.dispatch(xs, idxs, num_experts=E, window_outputs=True)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(num_bytes=2**70), ValueError, r"num_bytes: must be \[1, 1099511627776\]"),
    (dict(num_bytes=None, num_max_tokens_per_rank=16, hidden=2**40), ValueError,
     r"hidden: must be \[0, 1048576\], got 1099511627776"),
    (dict(num_gpu_timeout_secs=True), ValueError, r"num_gpu_timeout_secs: must be a positive"),
    (dict(num_cpu_timeout_secs=-5), ValueError, r"num_cpu_timeout_secs: must be a positive"),
    (dict(sl_idx="x"), TypeError, r"sl_idx: expected an int, got str"),
    (dict(cache_dir=123), TypeError, r"cache_dir: expected a path \(str\) or None, got int"),
    (dict(use_fp8_dispatch="yes"), TypeError, r"use_fp8_dispatch: expected a bool, got str"),
])
def test_constructor_values_out_of_range_are_named(kwargs, error, pattern):
    args = dict(num_bytes=2 << 20)
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        epic.ElasticBuffer(epic.VirtualWorld(2), **args)


def test_a_virtual_world_device_is_an_index():
    with pytest.raises(ValueError, match=r"device: a CUDA device index >= 0 or None, got -1"):
        epic.VirtualWorld(4, device=-1)
    assert epic.VirtualWorld(4, device=0).device == 0


def test_the_default_sms_of_a_call_follow_its_own_experts():
    """A buffer made without num_sms gives each call DeepEP's analytic count of that call's
    experts and top-k (never a made-up 256 experts, which 6 ranks do not divide)."""
    six = epic.ElasticBuffer(epic.VirtualWorld(6), num_bytes=2 << 20)
    spec = six._spec(6, 48, 4, 256, "bf16", 0, 1, False, 16)
    assert six._call_sms(spec, 22) == min(22, six.get_theoretical_num_sms(48, 4))
    assert six._call_sms(spec, 1) == 1
    # Experts 6 ranks do not divide: the runtime's own check names them, not the model's.
    assert six._call_sms(six._spec(6, 50, 4, 256, "bf16", 0, 1, False, 16), 22) == 22


def test_the_gpu_timeout_reaches_the_kernel_configuration():
    quick = epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20, num_gpu_timeout_secs=5)
    assert quick._spec(2, 8, 2, 256, "bf16", 0, 1, False, 16)["timeout_ms"] == 5000
    default = epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20)
    assert "timeout_ms" not in default._spec(2, 8, 2, 256, "bf16", 0, 1, False, 16)
    with pytest.raises(ValueError, match="num_gpu_timeout_secs: must be a positive number"):
        epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20, num_gpu_timeout_secs=0)


def test_a_valid_call_stops_at_the_device_check(buf):
    xs, idxs, ws = inputs()
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor, it is on the CPU"):
        buf.dispatch(xs, idxs, ws, num_experts=E)


@pytest.mark.parametrize(
    "mutate, error, pattern",
    [
        (lambda a: a.update(x=a["x"][0]), TypeError,
         r"x: in a virtual world of 4 ranks pass a list"),
        (lambda a: a.update(x=a["x"][:3]), ValueError,
         r"x: expected one entry per rank \(4\), got 3"),
        (lambda a: a["x"].__setitem__(1, a["x"][1].astype(np.float64)), TypeError,
         r"x\[1\]: dtype must be bf16 or f16 or f32 or f8E4M3FN or f8E5M2 or i32 or i64"),
        (lambda a: a["x"].__setitem__(1, a["x"][1].astype(np.float32)), ValueError,
         r"rank 1: x must be bf16, got f32 \(the buffer was configured for bf16\)"),
        (lambda a: a["x"].__setitem__(0, a["x"][0][0]), ValueError,
         r"x\[0\]: expected a 2-D tensor \[tokens, hidden\]"),
        (lambda a: a["x"].__setitem__(0, np.zeros((10, 2 * H), ml_dtypes.bfloat16)[:, ::2]),
         ValueError, r"x\[0\] must be contiguous \(row-major\)"),
        (lambda a: a["x"].__setitem__(0, np.zeros((10, H + 8), ml_dtypes.bfloat16)), ValueError,
         r"rank 1: x must have shape bf16\[3, 264\], got bf16\[3, 256\]"),
        (lambda a: a.update(x=[np.zeros((TMAX + 1, H), ml_dtypes.bfloat16)] * R,
                            topk_idx=[np.full((TMAX + 1, K), -1, np.int64)] * R), ValueError,
         r"rank 0: x has 65 tokens, more than num_max_tokens_per_rank \(64\)"),
        (lambda a: a["topk_idx"].__setitem__(2, a["topk_idx"][2].astype(np.int32)), ValueError,
         r"rank 2: topk_idx must be i64, got i32"),
        (lambda a: a["topk_idx"][3].__setitem__((4, 1), E), ValueError,
         r"topk_idx\[3\]\[4\]\[1\] = 32 is out of range: expert ids are in \[0, 32\)"),
        (lambda a: a["topk_idx"][0].__setitem__((0, 0), -2), ValueError,
         r"topk_idx\[0\]\[0\]\[0\] = -2 is out of range"),
        (lambda a: a["topk_idx"].__setitem__(1, a["topk_idx"][1][:2]), ValueError,
         r"rank 1: topk_idx must have shape i64\[3, 4\], got i64\[2, 4\]"),
        (lambda a: a["topk_weights"].__setitem__(0, np.ones((10, 2), np.float32)), ValueError,
         r"rank 0: topk_weights must have shape f32\[10, 4\], got f32\[10, 2\]"),
        (lambda a: a["topk_weights"].__setitem__(0, None), ValueError,
         "topk_weights: give them for every rank or for none"),
        (lambda a: a.update(num_experts=30), ValueError,
         r"num_experts \(30\) must be divisible by the number of ranks \(4\)"),
        (lambda a: a.update(num_experts=None), ValueError, "num_experts: required"),
        (lambda a: a.update(topk_idx=None), ValueError,
         "topk_idx: required unless a cached handle"),
        (lambda a: a.update(do_zero_padding=True), ValueError, "do_zero_padding needs do_expand"),
        (lambda a: a.update(expert_alignment=0), ValueError, r"expert_alignment: must be >= 1"),
        (lambda a: a.update(num_qps=100), ValueError, r"num_qps: must be \[0, 17\]"),
        (lambda a: a.update(use_tma_aligned_col_major_sf=True), ValueError,
         "use_tma_aligned_col_major_sf: needs FP8 input"),
        (lambda a: a.update(cumulative_local_expert_recv_stats=[np.zeros(3, np.int32)] * R),
         ValueError, r"cumulative_local_expert_recv_stats\[0\]: must be \[8\]"),
        (lambda a: a.update(x=[np.zeros((t.shape[0], 0), ml_dtypes.bfloat16) for t in a["x"]]),
         ValueError, r"x\[0\]: rows of 0 elements"),
        (lambda a: a["topk_idx"][1].__setitem__((2, 3), a["topk_idx"][1][2, 0]), ValueError,
         r"topk_idx\[1\]\[2\]\[3\] = \d+ repeats slot 0 of the token"),
        (lambda a: a.update(do_expand=1), TypeError, r"do_expand: expected a bool, got int"),
        (lambda a: a.update(do_cpu_sync="no"), TypeError, r"do_cpu_sync: expected a bool, got str"),
        (lambda a: a.update(previous_event=5), TypeError,
         r"previous_event: expected an EventHandle .* got int"),
        (lambda a: a.update(expert_alignment=2**40), ValueError,
         r"expert_alignment: 1099511627776 is out of range"),
        (lambda a: a.update(expert_alignment=2048), ValueError,
         r"expert_alignment must be in \[1, 1024\], got 2048"),
    ],
)
def test_bad_dispatch_arguments_are_named(buf, mutate, error, pattern):
    xs, idxs, ws = inputs()
    args = dict(x=xs, topk_idx=idxs, topk_weights=ws, num_experts=E)
    mutate(args)
    with pytest.raises(error, match=pattern):
        buf.dispatch(**args)


def test_fp8_input_is_a_data_and_scale_packs_tuple(buf):
    xs, idxs, _ = inputs(dtype=ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"x\[0\]: FP8 data travels with its scale packs: pass "
                                         r"\(data, scale_packs\)"):
        buf.dispatch(xs, idxs, num_experts=E)
    packs = [np.zeros((x.shape[0], 2), np.float32) for x in xs]
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.dispatch([(x, p) for x, p in zip(xs, packs)], idxs, num_experts=E)
    with pytest.raises(TypeError, match=r"x\[0\]: scale packs are 4-byte values"):
        buf.dispatch([(x, p.astype(np.float16)) for x, p in zip(xs, packs)], idxs, num_experts=E)
    with pytest.raises(ValueError, match=r"rank 1: x_scale_packs must have shape f32\[3, 2\], got "
                                         r"f32\[3, 3\]"):
        bad = [packs[0]] + [np.zeros((p.shape[0], 3), np.float32) for p in packs[1:]]
        buf.dispatch([(x, p) for x, p in zip(xs, bad)], idxs, num_experts=E)
    bf16, _, _ = inputs()
    with pytest.raises(ValueError, match=r"scale packs \(2\) are only allowed with FP8 data"):
        buf.dispatch([(x, p) for x, p in zip(bf16, packs)], idxs, num_experts=E)


def fake_handle(buffer, rank, tokens=10, rows=12):
    """A handle as a dispatch of `tokens` tokens that received `rows` rows leaves it, its
    tensors numpy arrays of the runtime's shapes (epic._C.outputs)."""
    spec = buffer._spec(R, E, K, H, "bf16", 0, 1, False, TMAX)
    variant = dict(weights=False, cached=False, zero_padding=False)
    full = {name: np.zeros(shape, np.int32) for name, _, shape in
            _C.outputs("dispatch", spec, variant, tokens)}
    full["topk_idx"] = np.zeros((tokens, K), np.int64)
    return epic.EPHandle(
        do_expand=False, num_experts=E, expert_alignment=1, num_max_tokens_per_rank=TMAX,
        num_sms=4, topk_idx=full["topk_idx"], num_recv_tokens=rows,
        num_expanded_tokens=rows, num_recv_tokens_per_expert_list=[3] * (E // R),
        psum_num_recv_tokens_per_scaleup_rank=full["psum_num_recv_tokens_per_rank"],
        psum_num_recv_tokens_per_expert=full["psum_num_recv_tokens_per_expert"],
        num_unaligned_recv_tokens_per_expert=full["num_recv_tokens_per_expert"],
        recv_src_metadata=full["recv_src_metadata"],
        dst_buffer_slot_idx=full["dst_buffer_slot_idx"], _buffer=buffer, _rank=rank,
        _full=full, _dtype="bf16", _hidden=H)


def test_handles_are_checked(buf):
    other = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=2 << 20)
    ys = [np.zeros((12, H), ml_dtypes.bfloat16)] * R
    with pytest.raises(ValueError, match=r"handle\[0\]: comes from another ElasticBuffer"):
        buf.combine(ys, [fake_handle(other, r) for r in range(R)])
    with pytest.raises(ValueError, match=r"handle\[1\]: is rank 0's handle, passed for rank 1"):
        buf.combine(ys, [fake_handle(buf, 0) for r in range(R)])
    with pytest.raises(TypeError, match=r"handle\[2\]: expected an EPHandle"):
        buf.combine(ys, [fake_handle(buf, 0), fake_handle(buf, 1), "h", fake_handle(buf, 3)])
    with pytest.raises(ValueError, match="handle: required"):
        buf.combine(ys, None)
    handles = [fake_handle(buf, r) for r in range(R)]
    xs, idxs, _ = inputs()
    with pytest.raises(ValueError, match="topk_idx: must be None with a cached handle"):
        buf.dispatch(xs, idxs, handle=handles)
    with pytest.raises(ValueError, match="do_expand: True differs from the handle's False"):
        buf.dispatch(xs, handle=handles, do_expand=True)


def test_bad_combine_arguments_are_named(buf):
    handles = [fake_handle(buf, r) for r in range(R)]
    ys = [np.zeros((12, H), ml_dtypes.bfloat16)] * R
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.combine(ys, handles)
    with pytest.raises(ValueError, match=r"rank 0: x must be bf16, got f32"):
        buf.combine([y.astype(np.float32) for y in ys], handles)
    with pytest.raises(ValueError, match=r"x\[0\]: expected bf16\[12, 256\] \(one row per row"):
        buf.combine([np.zeros((11, H), ml_dtypes.bfloat16)] * R, handles)
    with pytest.raises(ValueError, match=r"rank 0: topk_weights must have shape f32\[12, 4\]"):
        buf.combine(ys, handles, topk_weights=[np.zeros((12, 3), np.float32)] * R)
    bias = np.zeros((10, H), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"bias\[0\]: at most two bias tensors, got 3"):
        buf.combine(ys, handles, bias=[(bias, bias, bias)] * R)
    with pytest.raises(ValueError, match=r"rank 0: bias_0 must have shape bf16\[10, 256\]"):
        buf.combine(ys, handles, bias=[np.zeros((9, H), ml_dtypes.bfloat16)] * R)


def test_the_compiler_makes_the_kernels_of_a_configuration_without_a_gpu(tmp_path):
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    spec = dict(num_ranks=8, num_experts=256, num_topk=8, hidden=7168, dtype="f8E4M3FN",
                num_scale_packs=56, expert_alignment=128, do_expand=True,
                num_max_tokens_per_rank=4096)
    dispatch = runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False),
                               "dispatch")
    assert dispatch["source"] == "compiled" and dispatch["cubin_bytes"] > 0
    request = json.loads(dispatch["request"])
    assert request["kind"] == "dispatch" and request["dispatch"]["weights"] is True
    assert request["spec"]["max_tokens_per_rank"] == 0  # a run-time value of the kernels
    # The virtual backend dispatches in one pass: slots and counts, then the scatter.
    assert ".entry ep_dispatch_count" in dispatch["ptx"]
    assert ".entry ep_dispatch_scatter" in dispatch["ptx"]
    entry = runtime.entry_ir(spec, dict(weights=True, cached=False, zero_padding=False),
                             "dispatch")
    assert "ep.dispatch" in entry and "func.func @ep_dispatch(" in entry
    again = runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False), "dispatch")
    assert again["source"] == "memory" and again["key"] == dispatch["key"]
    combine = runtime.kernels(spec, dict(weights=False, biases=2), "combine")
    # ... and combines in one pass: one gather kernel, no send into the window.
    assert ".entry ep_combine_gather" in combine["ptx"]
    assert ".entry ep_combine_send" not in combine["ptx"]
    with pytest.raises(ValueError, match="kind must be"):
        runtime.kernels(spec, {}, "gather")
    with pytest.raises(ValueError, match="hidden"):
        runtime.kernels(dict(spec, hidden=7), dict(weights=False, biases=0), "combine")


def test_a_staged_virtual_world_compiles_the_kernels_processes_run(tmp_path):
    spec = dict(num_ranks=4, num_experts=32, num_topk=4, hidden=512, dtype="bf16",
                num_scale_packs=0, expert_alignment=1, do_expand=False,
                num_max_tokens_per_rank=64)
    variant = dict(weights=True, cached=False, zero_padding=False)
    one_pass = _C.Runtime("virtual", str(tmp_path), "")
    staged = _C.Runtime("virtual", str(tmp_path), "", staged=True)
    assert staged.staged and not one_pass.staged
    dispatch = staged.kernels(spec, variant, "dispatch")
    # The kernels that stage rows in the window, as across processes; their own key.
    assert ".entry ep_dispatch_send" in dispatch["ptx"]
    assert ".entry ep_dispatch_copy" in dispatch["ptx"]
    assert ".entry ep_dispatch_scatter" not in dispatch["ptx"]
    assert dispatch["key"] != one_pass.kernels(spec, variant, "dispatch")["key"]
    combine = staged.kernels(spec, dict(weights=False, biases=0), "combine")
    assert ".entry ep_combine_send" in combine["ptx"]
    assert ".entry ep_combine_gather" not in combine["ptx"]
    with pytest.raises(ValueError, match=r"staged: only the virtual backend"):
        _C.Runtime("nccl", str(tmp_path), "", staged=True)
    with pytest.raises(TypeError, match=r"staged: True or False, got 1"):
        epic.VirtualWorld(2, staged=1)
    assert repr(epic.VirtualWorld(2, staged=True)) == "VirtualWorld(2, staged=True)"
    assert repr(epic.VirtualWorld(num_nodes=2, gpus_per_node=2, staged=True)) == \
        "VirtualWorld(num_nodes=2, gpus_per_node=2, staged=True)"


def test_quickstart_without_a_gpu_compiles_and_says_so(tmp_path):
    import os
    import subprocess
    import sys

    if _C.cuda_device_count():
        pytest.skip("a GPU is here: tools/device/run.sh runs the quickstart on it")
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = subprocess.run([sys.executable, os.path.join(root, "examples", "quickstart.py"),
                          "--tokens", "64", "--cache-dir", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "no CUDA GPU here, so nothing runs" in out
    assert "dispatch: kernel request" in out and "ep_dispatch_count (" in out
    assert "combine: kernel request" in out and "ep_combine_gather (" in out


def test_window_tensor_checks_the_rank_then_needs_the_device():
    buf = epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=2 << 20)
    with pytest.raises(ValueError, match=r"rank: must be \[0, 1\], got 2"):
        buf.window_tensor(2)
    if _C.cuda_device_count() == 0:
        with pytest.raises(RuntimeError, match="no CUDA device here"):
            buf.window_tensor(1)


def test_grouped_gemm_checks_its_arguments_before_the_device(buf):
    import dataclasses

    L = E // R
    xs = [np.zeros((12, H), ml_dtypes.bfloat16)] * R
    ws = [np.zeros((L, H, 128), ml_dtypes.bfloat16)] * R
    with pytest.raises(ValueError, match="handle: required"):
        buf.grouped_gemm(xs, ws, None)
    plain = [fake_handle(buf, r) for r in range(R)]
    with pytest.raises(ValueError, match=r"needs an expanded dispatch \(do_expand=True\)"):
        buf.grouped_gemm(xs, ws, plain)
    handles = [dataclasses.replace(h, do_expand=True) for h in plain]
    with pytest.raises(ValueError, match=r"x\[0\]: expected bf16\[12, K\] \(the dispatch's "
                                         r"recv_x\), got bf16\[11, 256\]"):
        buf.grouped_gemm([x[:11] for x in xs], ws, handles)
    with pytest.raises(ValueError, match=r"rank 0: weights must be bf16, got f32"):
        buf.grouped_gemm(xs, [w.astype(np.float32) for w in ws], handles)
    with pytest.raises(ValueError, match=rf"rank 0: weights must have shape bf16\[{L}, 256, N\]"):
        buf.grouped_gemm(xs, [w[:1] for w in ws], handles)
    with pytest.raises(TypeError, match="out_dtype: bf16, f16 or float32"):
        buf.grouped_gemm(xs, ws, handles, out_dtype="int8")
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.grouped_gemm(xs, ws, handles, out_dtype="float32")


def test_grouped_gemm_takes_rows_of_any_width_k(buf):
    """An expert's down GEMM: rows of the intermediate width K (not the hidden size) with
    [L, K, N] weights pass every check; the kernel request carries K, and a K equal to the
    hidden size is the same request as none."""
    import dataclasses

    L = E // R
    handles = [dataclasses.replace(fake_handle(buf, r), do_expand=True) for r in range(R)]
    xs = [np.zeros((12, 512), ml_dtypes.bfloat16)] * R
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.grouped_gemm(xs, [np.zeros((L, 512, H), ml_dtypes.bfloat16)] * R, handles)
    with pytest.raises(ValueError, match=rf"rank 0: weights must have shape bf16\[{L}, 512, N\] "
                                         r"\(K = x's 512 columns\)"):
        buf.grouped_gemm(xs, [np.zeros((L, H, H), ml_dtypes.bfloat16)] * R, handles)
    with pytest.raises(ValueError, match=r"rank 0: x has 96 columns: the grouped GEMM steps "
                                         r"through K in blocks of 64"):
        buf.grouped_gemm([np.zeros((12, 96), ml_dtypes.bfloat16)] * R,
                         [np.zeros((L, 96, H), ml_dtypes.bfloat16)] * R, handles)
    spec = buf._spec(R, E, K, H, "bf16", 0, 1, True, TMAX)
    runtime = _C.Runtime("virtual", "", "")
    narrow = runtime.kernels(spec, dict(n=256, out_dtype="bf16", k=512), "grouped_gemm")
    assert json.loads(narrow["request"])["gemm"]["k"] == 512
    maps = json.loads(narrow["metadata"])["entries"][0]["tensor_maps"]
    assert maps[0]["cols"] == 512 and maps[1]["rows"] == L * 512
    same = [runtime.kernels(spec, dict(n=256, out_dtype="bf16", k=k), "grouped_gemm")["key"]
            for k in (0, H)]
    assert same[0] == same[1] != narrow["key"]


def test_fp8_grouped_gemm_checks_its_arguments_before_the_device(buf):
    """FP8 rows (an FP8 dispatch's handle, hidden / 128 f32 scale packs) multiply [L, N, H]
    FP8 weights, each side with its block scales; everything else is refused by name."""
    L, N, P, f8 = E // R, 128, H // 128, ml_dtypes.float8_e4m3fn
    handles = [dataclasses.replace(fake_handle(buf, r), do_expand=True, _dtype="f8E4M3FN",
                                   _num_scale_packs=P) for r in range(R)]
    x = (np.zeros((12, H), f8), np.ones((12, P), np.float32))
    w = (np.zeros((L, N, H), f8), np.ones((L, N // 128, P), np.float32))
    with pytest.raises(TypeError, match=r"x\[0\]: FP8 rows come with their block scales: pass "
                                        r"\(x_fp8, x_scales\), got ndarray"):
        buf.grouped_gemm([x[0]] * R, [w] * R, handles)
    with pytest.raises(TypeError, match=r"weights\[0\]: FP8 weights come with their block scales"):
        buf.grouped_gemm([x] * R, [w[0]] * R, handles)
    with pytest.raises(TypeError, match=r"x scales\[0\]: dtype must be f32, got bf16"):
        buf.grouped_gemm([(x[0], x[1].astype(ml_dtypes.bfloat16))] * R, [w] * R, handles)
    with pytest.raises(ValueError, match=rf"rank 0: weights must have shape f8E4M3FN\[{L}, N, "
                                         rf"{H}\]"):
        buf.grouped_gemm([x] * R, [(np.zeros((L, H, N), f8), w[1])] * R, handles)
    one_scale = np.ones((12, 1), np.float32)
    with pytest.raises(ValueError, match=r"rank 0: x_scales must have shape f32\[12, 2\] "
                                         r"\(one f32 scale per 128 channels\), got f32\[12, 1\]"):
        buf.grouped_gemm([(x[0], one_scale)] * R, [w] * R, handles)
    with pytest.raises(ValueError,
                       match=rf"rank 0: weight_scales must have shape f32\[{L}, 1, 2\]"):
        buf.grouped_gemm([x] * R, [(w[0], np.ones((1, 1, P), np.float32))] * R, handles)
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.grouped_gemm([x] * R, [w] * R, handles)
    # UE8M0-packed scales (4 to an int32) are not multiplied yet: named, not misread.
    packed = [dataclasses.replace(h, _num_scale_packs=1) for h in handles]
    with pytest.raises(ValueError, match=r"x_scales must have shape f32\[12, 2\] \(one f32 "
                                         r"scale per 128 channels\), got f32\[12, 1\]: the "
                                         r"dispatch's 1 scale packs a row \(UE8M0"):
        buf.grouped_gemm([(x[0], one_scale)] * R, [w] * R, packed)


def test_swiglu_checks_its_arguments_before_the_device(buf):
    """ep.swiglu on an expanded dispatch's gate/up rows: [rows, 2 I] bf16/f16/f32, I a
    multiple of 128; FP8 results (the default after an FP8 dispatch) come with their scales."""
    gate_up = [np.zeros((12, 512), ml_dtypes.bfloat16)] * R
    with pytest.raises(ValueError, match="handle: required"):
        buf.swiglu(gate_up, None)
    plain = [fake_handle(buf, r) for r in range(R)]
    with pytest.raises(ValueError, match=r"swiglu needs an expanded dispatch \(do_expand=True\)"):
        buf.swiglu(gate_up, plain)
    handles = [dataclasses.replace(h, do_expand=True) for h in plain]
    with pytest.raises(ValueError, match=r"gate_up\[0\]: expected \[12, 2 I\] \(the gate/up "
                                         r"GEMM's output .*I a multiple of 128\), got "
                                         r"bf16\[12, 384\]"):
        buf.swiglu([np.zeros((12, 384), ml_dtypes.bfloat16)] * R, handles)
    with pytest.raises(ValueError, match=r"gate_up\[1\]: expected \[12, 2 I\]"):
        buf.swiglu([gate_up[0], gate_up[0][:11]] + gate_up[2:], handles)
    with pytest.raises(TypeError, match=r"gate_up\[0\]: dtype must be bf16 or f16 or f32, got "
                                        r"f8E4M3FN"):
        buf.swiglu([np.zeros((12, 512), ml_dtypes.float8_e4m3fn)] * R, handles)
    with pytest.raises(TypeError, match="out_dtype: float8_e4m3fn, bf16, f16 or float32, got "
                                        "'int8'"):
        buf.swiglu(gate_up, handles, out_dtype="int8")
    with pytest.raises(TypeError, match=r"weights\[0\]: dtype must be f32, got bf16"):
        buf.swiglu(gate_up, handles, weights=[np.zeros(12, ml_dtypes.bfloat16)] * R)
    with pytest.raises(ValueError, match=r"rank 0: weights must have shape f32\[12\], got "
                                         r"f32\[11\]"):
        buf.swiglu(gate_up, handles, weights=[np.zeros(11, np.float32)] * R)
    with pytest.raises(TypeError, match="zero_padding"):
        buf.swiglu(gate_up, handles, zero_padding="no")
    with pytest.raises(TypeError, match="zero_padding"):
        buf.grouped_gemm(gate_up, [np.zeros((E // R, 512, 128), ml_dtypes.bfloat16)] * R,
                         handles, zero_padding=None)
    for out_dtype in (None, "float8_e4m3fn", "float32"):
        with pytest.raises(ValueError, match=r"gate_up\[0\] must be a CUDA tensor"):
            buf.swiglu(gate_up, handles, out_dtype=out_dtype, zero_padding=False)


def test_swiglu_kernels_are_compiled_for_their_dtypes(buf):
    """The request says the rows' and the result's dtypes and K = 2 I; the kernel's record is
    the op's six fields (weights: null for none, one kernel for both); an FP8 and a BF16
    result are two kernels."""
    runtime = _C.Runtime("virtual", "", "")
    spec = buf._spec(R, E, K, H, "f8E4M3FN", H // 128, 128, True, TMAX)
    fp8 = runtime.kernels(spec, dict(n=256, in_dtype="bf16", out_dtype="f8E4M3FN"), "swiglu")
    request = json.loads(fp8["request"])
    assert request["kind"] == "swiglu"
    assert request["gemm"] == {"n": 256, "out_dtype": "f8E4M3FN", "k": 512, "in_dtype": "bf16"}
    entry = json.loads(fp8["metadata"])["entries"][0]
    assert entry["param_fields"] == ["gate_up", "out", "scales",
                                     "psum_num_recv_tokens_per_expert", "num_rows", "weights"]
    assert entry["cooperative"] == 0 and entry["window_bytes"] == 0
    bf16 = runtime.kernels(spec, dict(n=256, in_dtype="bf16", out_dtype="bf16"), "swiglu")
    assert bf16["key"] != fp8["key"]
    with pytest.raises(ValueError, match=r"swiglu's gate/up rows \(gemm.in_dtype\) must be bf16, "
                                         r"f16 or f32, got \"i8\""):
        runtime.kernels(spec, dict(n=256, in_dtype="i8", out_dtype="bf16"), "swiglu")


def test_dispatch_gemm_checks_its_arguments_before_the_device(buf):
    xs, idxs, _ = inputs()
    L = E // R
    ws = [np.zeros((L, H, 128), ml_dtypes.bfloat16)] * R
    with pytest.raises(TypeError, match=r"x\[0\]: the fused dispatch \+ GEMM takes bf16 or f16"):
        buf.dispatch_gemm([(x, None) for x in xs], idxs, ws, num_experts=E)
    with pytest.raises(ValueError, match=r"rank 0: experts must be bf16, got f32"):
        buf.dispatch_gemm(xs, idxs, [w.astype(np.float32) for w in ws], num_experts=E)
    with pytest.raises(ValueError, match=r"rank 1: the experts' shape or the output dtype differ "
                                         r"from rank 0's"):
        buf.dispatch_gemm(xs, idxs, [ws[0], np.zeros((L, H, 256), ml_dtypes.bfloat16)] + ws[2:],
                          num_experts=E)
    with pytest.raises(TypeError, match="out_dtype: bf16, f16 or float32"):
        buf.dispatch_gemm(xs, idxs, ws, num_experts=E, out_dtype="int8")
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.dispatch_gemm(xs, idxs, ws, num_experts=E)


def test_gemm_combine_checks_its_arguments_before_the_device(buf):
    import dataclasses

    L = E // R
    xs = [np.zeros((12, H), ml_dtypes.bfloat16)] * R
    ws = [np.zeros((L, H, H), ml_dtypes.bfloat16)] * R
    with pytest.raises(ValueError, match="handle: required"):
        buf.gemm_combine(xs, ws, None)
    plain = [fake_handle(buf, r) for r in range(R)]
    with pytest.raises(ValueError, match=r"gemm_combine needs an expanded dispatch"):
        buf.gemm_combine(xs, ws, plain)
    handles = [dataclasses.replace(h, do_expand=True) for h in plain]
    with pytest.raises(ValueError, match=r"rank 0: lhs must be bf16, got f16|"
                                         r"rank 0: x must be bf16, got f16"):
        buf.gemm_combine([x.astype(np.float16) for x in xs], ws, handles)
    with pytest.raises(ValueError, match=rf"rank 0: weights must be \[{L}, 256, 256\]: the combine "
                                         rf"sends hidden-wide rows, got bf16\[{L}, 256, 128\]"):
        buf.gemm_combine(xs, [np.zeros((L, H, 128), ml_dtypes.bfloat16)] * R, handles)
    with pytest.raises(ValueError, match=r"x\[0\] must be a CUDA tensor"):
        buf.gemm_combine(xs, ws, handles)


def test_cuda_errors_at_sync_points_carry_the_device_wait_reports(monkeypatch):
    """Fused GEMM kernels report a timed-out wait into mapped memory, not stdout: an error
    torch raises at one of the buffer's sync points gets those reports appended."""
    report = "; device wait timed out after 100 ms: rank 3 block 5 thread 0 waited for peer 2"

    class Extension:
        reports = [report]

        @staticmethod
        def take_device_wait_reports():
            return Extension.reports.pop() if Extension.reports else ""

    class AcceleratorError(RuntimeError):  # what torch raises for a failed kernel
        pass

    monkeypatch.setattr(B, "_C", lambda: Extension)
    with pytest.raises(AcceleratorError, match="unspecified launch failure; device wait timed "
                                               "out after 100 ms: rank 3 block 5"):
        with B._device_wait_reports():
            raise AcceleratorError("CUDA error: unspecified launch failure")
    # Taken once; without reports the error is the original one.
    with pytest.raises(RuntimeError, match=r"^CUDA error: unspecified launch failure$"):
        with B._device_wait_reports():
            raise RuntimeError("CUDA error: unspecified launch failure")
    with B._device_wait_reports():  # nothing raised: nothing asked
        pass
    assert Extension.reports == []


@pytest.mark.parametrize("change, error, message", [
    (dict(num_experts=2**40), ValueError, r"num_experts: 1099511627776 is out of range"),
    (dict(expert_alignment=2**31), ValueError, r"expert_alignment: 2147483648 is out of range"),
    (dict(expert_alignment=4096), ValueError, r"expert_alignment must be in \[1, 1024\], got 4096"),
    (dict(num_scale_packs=2**20), ValueError, r"num_scale_packs must be in \[0, 65536\]"),
    (dict(num_max_tokens_per_rank=2**28), ValueError,
     r"num_max_tokens_per_rank 268435456 needs .* rows .* 32-bit element indices"),
    (dict(hidden="7168"), TypeError, r"hidden: expected an int, got str"),
    (dict(do_expand=1), TypeError, r"do_expand: expected a bool, got int"),
    (dict(num_topk=True), TypeError, r"num_topk: expected an int, got bool"),
])
def test_the_runtime_names_a_bad_spec_field(tmp_path, change, error, message):
    """Values a C++ int cannot hold, values out of #ep.config's bounds (EPLimits.def) and
    mistyped ones are refused naming the field, not as a bare cast error."""
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    spec = dict(num_ranks=8, num_experts=256, num_topk=8, hidden=7168, dtype="f8E4M3FN",
                num_scale_packs=56, expert_alignment=128, do_expand=True,
                num_max_tokens_per_rank=4096)
    spec.update(change)
    with pytest.raises(error, match=message):
        runtime.kernels(spec, dict(weights=True, cached=False, zero_padding=False), "dispatch")


def test_the_runtime_names_a_missing_variant_field(tmp_path):
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    spec = dict(num_ranks=2, num_experts=16, num_topk=2, hidden=256, dtype="bf16",
                num_scale_packs=0, expert_alignment=1, do_expand=False, num_max_tokens_per_rank=8)
    with pytest.raises(ValueError, match=r"missing field 'weights'"):
        runtime.kernels(spec, dict(cached=False, zero_padding=False), "dispatch")
    with pytest.raises(ValueError, match=r"missing field 'num_topk'"):
        runtime.kernels({k: v for k, v in spec.items() if k != "num_topk"},
                        dict(weights=False, biases=0), "combine")


def test_dispatch_layout_refuses_what_it_cannot_count(buf):
    """get_dispatch_layout (ep.dispatch_layout's kernels): bad arguments named before any
    launch; on a machine without a GPU the runtime's checks run and say nothing ran."""
    idx = [np.array([[0, 1], [3, -1]], np.int64)] * buf.num_ranks
    experts = 2 * buf.num_ranks
    with pytest.raises(ValueError, match="num_experts: 3 experts do not split over 4 ranks"):
        buf.get_dispatch_layout(idx, 3)
    with pytest.raises(TypeError, match="async_finish: expected a bool"):
        buf.get_dispatch_layout(idx, experts, async_finish=1)
    with pytest.raises(TypeError, match=r"topk_idx\[0\]: expected int64 or int32 expert ids"):
        buf.get_dispatch_layout([i.astype(np.float32) for i in idx], experts)
    with pytest.raises(ValueError, match=r"topk_idx\[0\]: expected a 2-D tensor \[tokens, top-k\]"):
        buf.get_dispatch_layout([i[0] for i in idx], experts)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        buf.get_dispatch_layout(idx, experts)
