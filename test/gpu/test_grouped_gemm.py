"""ep.grouped_gemm on the H200: epic's TMA + wgmma kernel against torch (cuBLAS) per expert,
on the rows of real expanded dispatches in virtual worlds.

Run by tools/device/run.sh; the kernels come from the cache tools/device/prepare.sh fills
(`python test/gpu/test_grouped_gemm.py --prepare` there).
"""

import sys

import pytest

# Configurations: (ranks, experts, hidden, N, tokens per rank, expert alignment).
CONFIGS = [(2, 16, 1024, 256, 96, 64), (8, 64, 1024, 512, 64, 128), (8, 256, 7168, 2048, 48, 128)]
TOPK = 6
# FP8 (e4m3 rows and weights, DeepSeek's block scales): (ranks, experts, hidden, N, tokens per
# rank); the expert alignment is 128.
FP8_CONFIGS = [(2, 16, 1024, 256, 96), (8, 256, 7168, 2048, 48)]
SCALE_BLOCK = 128
MLP_INTERMEDIATE = 2048  # DeepSeek V3's expert intermediate size


def spec_of(ranks, experts, hidden, tokens, alignment, fp8=False):
    return dict(num_ranks=ranks, num_experts=experts, num_topk=TOPK, hidden=hidden,
                dtype="f8E4M3FN" if fp8 else "bf16",
                num_scale_packs=hidden // SCALE_BLOCK if fp8 else 0,
                expert_alignment=alignment, do_expand=True, num_max_tokens_per_rank=tokens)


def prepare():
    """Compiles every kernel this file launches into $EPIC_CACHE_DIR (no GPU needed)."""
    import epic._C as C
    from epic.moe import layer_kernels

    runtime = C.Runtime("virtual", "", "")
    count = 0
    for ranks, experts, hidden, n, tokens, alignment in CONFIGS:
        spec = spec_of(ranks, experts, hidden, tokens, alignment)
        runtime.kernels(spec, dict(weights=False, cached=False, zero_padding=False), "dispatch")
        runtime.kernels(spec, dict(weights=False, biases=0), "combine")
        for out in ("bf16", "f32"):
            runtime.kernels(spec, dict(n=n, out_dtype=out), "grouped_gemm")
            count += 1
    # The fused dispatch + GEMM (ep-fuse-dispatch-gemm), with and without weights.
    for ranks, experts, hidden, n, tokens, alignment in CONFIGS[:2]:
        spec = spec_of(ranks, experts, hidden, tokens, alignment)
        for weights in (False, True):
            runtime.kernels(spec, dict(weights=weights, cached=False, zero_padding=False, n=n,
                                       out_dtype="bf16"), "dispatch_gemm")
            # the unfused dispatch it is compared with
            runtime.kernels(spec, dict(weights=weights, cached=False, zero_padding=False),
                            "dispatch")
            count += 1
    # test_grouped_gemm_output_feeds_the_combine and the fused GEMM + combine
    # (ep-fuse-gemm-combine): a square expert GEMM.
    for ranks, experts, hidden, n, tokens, alignment in CONFIGS[:2]:
        spec = spec_of(ranks, experts, hidden, tokens, alignment)
        runtime.kernels(spec, dict(n=hidden, out_dtype="bf16"), "grouped_gemm")
        runtime.kernels(spec, dict(weights=False, cached=False, zero_padding=False, n=hidden,
                                   out_dtype="bf16"), "dispatch_gemm")
        for biases in (0, 2):
            runtime.kernels(spec, dict(biases=biases), "gemm_combine")
            runtime.kernels(spec, dict(weights=False, biases=biases), "combine")
            count += 1
    for ranks, experts, hidden, n, tokens in FP8_CONFIGS:
        spec = spec_of(ranks, experts, hidden, tokens, SCALE_BLOCK, fp8=True)
        runtime.kernels(spec, dict(weights=False, cached=False, zero_padding=False), "dispatch")
        for out in ("bf16", "f32"):
            runtime.kernels(spec, dict(n=n, out_dtype=out), "grouped_gemm")
            count += 1
    # The V3 layer's kernels, in one pass and (test_persistent_layer_equals_the_five_ops'
    # staged world) staging its rows in the window as a world of processes does.
    ranks, experts, hidden, _, tokens = FP8_CONFIGS[1]
    spec = spec_of(ranks, experts, hidden, tokens, SCALE_BLOCK, fp8=True)
    for layer_runtime in (runtime, C.Runtime("virtual", "", "", staged=True)):
        # The layer's five ops (test_fp8_expert_mlp's gate/up and down FP8 GEMMs and SwiGLU,
        # test_fp8_moe_layer_matches_torch's dispatch with routing weights and combine) and
        # the same layer as one persistent kernel (ep.moe_layer).
        for persistent in (False, True):
            for variant, kind in layer_kernels(hidden, MLP_INTERMEDIATE, persistent):
                layer_runtime.kernels(spec, variant, kind)
        count += 3
        # test_swiglu_op_matches_torch's BF16 result.
        layer_runtime.kernels(spec, dict(n=MLP_INTERMEDIATE, in_dtype="bf16", out_dtype="bf16"),
                              "swiglu")
    # test_fp8_expert_mlp_step_by_step's SwiGLU + FP8 re-quant (the @epic.jit kernel; rows a
    # multiple of 16 or not: the DSL specializes on it).
    import numpy as np

    from epic import _tensors as T
    from epic.activations import _swiglu_fp8

    for rows in (256, 200):
        gate_up = [np.zeros((rows, 2 * MLP_INTERMEDIATE), T.numpy_dtype("bf16"))] * ranks
        out = [np.zeros((rows, MLP_INTERMEDIATE), T.numpy_dtype("f8E4M3FN"))] * ranks
        scales = [np.zeros((rows, MLP_INTERMEDIATE // SCALE_BLOCK), np.float32)] * ranks
        _swiglu_fp8.compile(gate_up, out, scales, [rows] * ranks, INTER=MLP_INTERMEDIATE,
                            backend="virtual", abi="runtime", ranks=ranks)
    print(f"test_grouped_gemm: {count} grouped GEMM kernel sets in {runtime.cache_dir}")


if __name__ == "__main__" and "--prepare" in sys.argv:
    sys.exit(prepare())

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import os  # noqa: E402

import epic  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import ep_bench  # noqa: E402  (DeepSeek's block FP8 cast, shared with the benches)

FUSION_MODES = ["always", "never", "auto"]


def check_decision(buffer, pair, mode):
    """The call went the way its mode says: auto the cost model's way for this call's shape."""
    decision = buffer.last_fusion
    assert decision["pair"] == pair and decision["mode"] == mode
    if mode != "auto":
        assert decision["fused"] == (mode == "always")
        return
    assert decision["fused_us"] is not None, decision["why"]  # the H200 has the model's numbers
    assert decision["fused"] == (decision["fused_us"] < decision["steps_us"]), decision
    assert ("fused" in decision["why"]) and ("two steps" in decision["why"])


@pytest.mark.parametrize("ranks, experts, hidden, n, tokens, alignment", CONFIGS)
def test_grouped_gemm_matches_torch_per_expert(ranks, experts, hidden, n, tokens, alignment):
    g = torch.Generator(device="cuda").manual_seed(hidden + ranks)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    xs = [torch.randn((tokens - r, hidden), generator=g, device="cuda").to(torch.bfloat16)
          for r in range(ranks)]
    idxs = [torch.rand((tokens - r, experts), generator=g, device="cuda").topk(TOPK).indices
            for r in range(ranks)]
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=alignment)
    ws = [(torch.randn((L, hidden, n), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]
    out32 = buffer.grouped_gemm(recv, ws, handles, out_dtype=torch.float32)
    out16 = buffer.grouped_gemm(recv, ws, handles)
    torch.cuda.synchronize()
    for r in range(ranks):
        assert out16[r].dtype == torch.bfloat16 and out16[r].shape == (recv[r].shape[0], n)
        covered = torch.zeros(recv[r].shape[0], dtype=torch.bool, device="cuda")
        for e, (start, end) in enumerate(ep_bench.expert_rows(handles[r], L, alignment)):
            if end == start:
                continue
            want = recv[r][start:end].float() @ ws[r][e].float()
            torch.testing.assert_close(out32[r][start:end], want, rtol=1e-4, atol=1e-3,
                                       msg=lambda m: f"rank {r} expert {e}: {m}")
            torch.testing.assert_close(out16[r][start:end], want.to(torch.bfloat16),
                                       rtol=1.6e-2, atol=1e-2)
            covered[start:end] = True
        # Padding rows are not an expert's: the API returns them zero.
        assert not out32[r][~covered].any()
    buffer.destroy()


def quantize_blocks(t, rows_block):
    return ep_bench.quantize_blocks(torch, t, rows_block)


@pytest.mark.parametrize("ranks, experts, hidden, n, tokens", FP8_CONFIGS)
def test_fp8_grouped_gemm_matches_the_dequantized_product(ranks, experts, hidden, n, tokens):
    """An FP8 dispatch's rows and scale packs feed the FP8 grouped GEMM directly; its result is
    the product of the dequantized operands (fp32 sums per 128-channel block, promoted in fp32),
    padding rows zero."""
    g = torch.Generator(device="cuda").manual_seed(hidden + n)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    xs = [quantize_blocks(torch.randn((tokens - r, hidden), generator=g, device="cuda"), 1)
          for r in range(ranks)]
    idxs = [torch.rand((tokens - r, experts), generator=g, device="cuda").topk(TOPK).indices
            for r in range(ranks)]
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=SCALE_BLOCK)
    ws = [quantize_blocks(torch.randn((L, n, hidden), generator=g, device="cuda")
                          / hidden ** 0.5, SCALE_BLOCK) for _ in range(ranks)]
    out32 = buffer.grouped_gemm(recv, ws, handles, out_dtype=torch.float32)
    out16 = buffer.grouped_gemm(recv, ws, handles)
    torch.cuda.synchronize()
    for r in range(ranks):
        rows, row_scales = recv[r]
        assert out16[r].dtype == torch.bfloat16 and out16[r].shape == (rows.shape[0], n)
        x = ep_bench.dequantize_blocks(rows, row_scales, 1)
        w = ep_bench.dequantize_blocks(*ws[r], SCALE_BLOCK)
        covered = torch.zeros(rows.shape[0], dtype=torch.bool, device="cuda")
        for e, (start, end) in enumerate(ep_bench.expert_rows(handles[r], L, SCALE_BLOCK)):
            if end == start:
                continue
            want = x[start:end] @ w[e].T
            # FP8 tensor cores sum a block's 128 products with fewer mantissa bits than fp32.
            torch.testing.assert_close(out32[r][start:end], want, rtol=2e-3, atol=5e-3,
                                       msg=lambda m: f"rank {r} expert {e}: {m}")
            torch.testing.assert_close(out16[r][start:end], want.to(torch.bfloat16),
                                       rtol=1.6e-2, atol=1e-2)
            covered[start:end] = True
        assert covered.any() and not out32[r][~covered].any()
    buffer.destroy()


def fp8_layer_buffer(staged=False):
    """An ElasticBuffer of a virtual EP8 world at V3's shape (FP8_CONFIGS[1])."""
    ranks, _, hidden, _, tokens = FP8_CONFIGS[1]
    return epic.ElasticBuffer(epic.VirtualWorld(ranks, staged=staged),
                              num_max_tokens_per_rank=tokens, hidden=hidden, num_topk=TOPK,
                              explicitly_destroy=True)


def fp8_mlp_world(seed, staged=False):
    """A virtual EP8 world at V3's shape with FP8 tokens, routing (top-k ids and softmax
    weights) and every rank's FP8 expert MLP weights: (buffer, xs, idxs, ws, w13, w2)."""
    ranks, experts, hidden, _, tokens = FP8_CONFIGS[1]
    inter, L = MLP_INTERMEDIATE, experts // ranks
    g = torch.Generator(device="cuda").manual_seed(seed)
    buffer = fp8_layer_buffer(staged)
    xs = [quantize_blocks(torch.randn((tokens, hidden), generator=g, device="cuda"), 1)
          for _ in range(ranks)]
    idxs = [torch.rand((tokens, experts), generator=g, device="cuda").topk(TOPK).indices
            for _ in range(ranks)]
    ws = [torch.rand((tokens, TOPK), generator=g, device="cuda").softmax(dim=1)
          for _ in range(ranks)]
    w13 = [quantize_blocks(torch.randn((L, 2 * inter, hidden), generator=g, device="cuda")
                           / hidden ** 0.5, SCALE_BLOCK) for _ in range(ranks)]
    w2 = [quantize_blocks(torch.randn((L, hidden, inter), generator=g, device="cuda")
                          / inter ** 0.5, SCALE_BLOCK) for _ in range(ranks)]
    return buffer, xs, idxs, ws, w13, w2


def test_fp8_expert_mlp_step_by_step():
    """A V3 expert MLP in FP8 on the rows of an FP8 dispatch: gate/up GEMM (N = 2I), SwiGLU with
    the FP8 re-quant (epic.activations.swiglu_fp8), down GEMM (K = I, N = hidden), each step
    against torch on the previous step's own output (dequantized)."""
    from epic.activations import swiglu_fp8

    ranks, experts, hidden, _, tokens = FP8_CONFIGS[1]
    inter, L = MLP_INTERMEDIATE, experts // ranks
    buffer, xs, idxs, _, w13, w2 = fp8_mlp_world(21)
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=SCALE_BLOCK)
    gate_up = buffer.grouped_gemm(recv, w13, handles)
    act = swiglu_fp8(gate_up, buffer=buffer)
    down = buffer.grouped_gemm(list(zip(*act)), w2, handles)
    torch.cuda.synchronize()
    for r in range(ranks):
        assert gate_up[r].shape == (recv[r][0].shape[0], 2 * inter)
        assert down[r].shape == (recv[r][0].shape[0], hidden)
        x = ep_bench.dequantize_blocks(*recv[r], 1)
        a = ep_bench.dequantize_blocks(act[0][r], act[1][r], 1)
        for e, (start, end) in enumerate(ep_bench.expert_rows(handles[r], L, SCALE_BLOCK)):
            if end == start:
                continue
            want13 = x[start:end] @ ep_bench.dequantize_blocks(*w13[r], SCALE_BLOCK)[e].T
            torch.testing.assert_close(gate_up[r][start:end].float(), want13, rtol=1.6e-2,
                                       atol=2e-2)
            gate, up = gate_up[r][start:end].float().chunk(2, dim=1)
            torch.testing.assert_close(a[start:end], torch.nn.functional.silu(gate) * up,
                                       rtol=2.0 ** -3, atol=1e-2)
            want2 = a[start:end] @ ep_bench.dequantize_blocks(*w2[r], SCALE_BLOCK)[e].T
            torch.testing.assert_close(down[r][start:end].float(), want2, rtol=1.6e-2, atol=2e-2)
    buffer.destroy()


@pytest.mark.parametrize("persistent", [False, True], ids=["five_ops", "persistent"])
def test_fp8_moe_layer_matches_torch(persistent):
    """epic.moe.moe_layer_fp8 (FP8 dispatch, gate/up GEMM, SwiGLU + FP8 re-quant, down GEMM,
    routing weights, combine) on a virtual EP8 world against the layer in float32 on the
    dequantized inputs: within FP8's error (the intermediate is re-quantized to e4m3). As five
    ops, and as one persistent kernel (ep.moe_layer)."""
    from epic.moe import moe_layer_fp8

    torch.cuda.empty_cache()  # the reference's 28 GiB of dequantized weights, once per run
    ranks, experts, hidden, _, tokens = FP8_CONFIGS[1]
    buffer, xs, idxs, ws, w13, w2 = fp8_mlp_world(23)
    ys = moe_layer_fp8(buffer, xs, idxs, ws, w13, w2, num_experts=experts,
                       persistent=persistent)
    torch.cuda.synchronize()
    # Every expert's dequantized weights, expert-major over the ranks.
    w13f = torch.cat([ep_bench.dequantize_blocks(*w, SCALE_BLOCK) for w in w13])
    w2f = torch.cat([ep_bench.dequantize_blocks(*w, SCALE_BLOCK) for w in w2])
    for r in range(ranks):
        x = ep_bench.dequantize_blocks(*xs[r], 1)
        want = torch.zeros((tokens, hidden), device="cuda")
        for j in range(TOPK):
            for e in idxs[r][:, j].unique().tolist():
                t = (idxs[r][:, j] == e).nonzero().squeeze(1)
                gate, up = (x[t] @ w13f[e].T).chunk(2, dim=1)
                want[t] += ws[r][t, j, None] * ((torch.nn.functional.silu(gate) * up) @ w2f[e].T)
        got = ys[r].float()
        assert got.shape == (tokens, hidden)
        error = (got - want).norm() / want.norm()
        assert error < 3e-2, f"rank {r}: relative error {error:.3g}"
    buffer.destroy()


@pytest.mark.parametrize("staged", [False, True], ids=["one_pass", "staged"])
def test_persistent_layer_equals_the_five_ops(staged):
    """ep.moe_layer runs the five ops' code in one kernel: its result is bitwise theirs, eager
    and replayed from a CUDA graph (no host step inside the layer), call after call (the
    kernel leaves its barrier counters at zero), with some ranks sending no token. Staged:
    the kernels a world of processes runs (rows staged in the window), the five ops and the
    persistent layer both bitwise the one-pass five ops."""
    from epic.buffer import _device_wait_reports
    from epic.moe import moe_layer_fp8

    ranks, experts, hidden, _, tokens = FP8_CONFIGS[1]
    buffer, xs, idxs, ws, w13, w2 = fp8_mlp_world(31, staged=staged)
    xs[3] = (xs[3][0][:0], xs[3][1][:0])  # rank 3 sends nothing
    idxs[3], ws[3] = idxs[3][:0], ws[3][:0]

    def layer(persistent, on=buffer):
        return moe_layer_fp8(on, xs, idxs, ws, w13, w2, num_experts=experts,
                             do_cpu_sync=False, persistent=persistent)

    want = [y.clone() for y in layer(False)]
    if staged:
        one_pass = fp8_layer_buffer()
        reference = [y.clone() for y in layer(False, on=one_pass)]
        torch.cuda.synchronize()
        one_pass.destroy()
        for r in range(ranks):
            assert torch.equal(want[r].view(torch.int16), reference[r].view(torch.int16)), \
                f"rank {r}: the staged five ops differ from the one-pass five ops"
    for call in range(3):
        got = layer(True)
        torch.cuda.synchronize()
        for r in range(ranks):
            assert torch.equal(got[r].view(torch.int16), want[r].view(torch.int16)), \
                f"call {call}, rank {r}: the persistent layer differs from the five ops"
    # Back to back, no sync between the calls: where the staged kernel stalled (a GEMM
    # pipeline wait of one block, intermittently: bench/NOTES.md, 2026-12-07, fourth session).
    outs = [layer(True) for _ in range(20)]
    with _device_wait_reports():  # a stalled block's report, if a bounded wait timed out
        torch.cuda.synchronize()
    for call, got in enumerate(outs):
        for r in range(ranks):
            assert torch.equal(got[r].view(torch.int16), want[r].view(torch.int16)), \
                f"back-to-back call {call}, rank {r}: the persistent layer differs"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(True)
    for replay in range(2):
        for y in captured:
            y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for r in range(ranks):
            assert torch.equal(captured[r].view(torch.int16), want[r].view(torch.int16)), \
                f"replay {replay}, rank {r}: the captured layer differs"
    buffer.destroy()


def test_swiglu_op_matches_torch():
    """ElasticBuffer.swiglu (the compiler's ep.swiglu) on the gate/up GEMM's rows of an FP8
    dispatch: FP8 results with their block scales, BF16 results, and FP8 results of rows
    times their routing weights, against torch on every expert's rows; padding rows zero."""
    ranks, experts, hidden, _, tokens = FP8_CONFIGS[1]
    inter, L = MLP_INTERMEDIATE, experts // ranks
    buffer, xs, idxs, ws, w13, _ = fp8_mlp_world(29)
    recv, _, recv_w, handles, _ = buffer.dispatch(xs, idxs, ws, num_experts=experts,
                                                  do_expand=True, expert_alignment=SCALE_BLOCK)
    gate_up = buffer.grouped_gemm(recv, w13, handles)
    act = buffer.swiglu(gate_up, handles)  # FP8 after an FP8 dispatch: (rows, scales)
    plain = buffer.swiglu(gate_up, handles, out_dtype=torch.bfloat16)
    # The routing weights times each row's y (a list of ranks: copies, the pool reuses sets).
    weighted = [(a.clone(), b.clone()) for a, b in buffer.swiglu(gate_up, handles,
                                                                  weights=recv_w)]
    torch.cuda.synchronize()
    for r in range(ranks):
        rows, scales = act[r]
        assert rows.dtype == torch.float8_e4m3fn and rows.shape == (gate_up[r].shape[0], inter)
        assert scales.shape == (gate_up[r].shape[0], inter // SCALE_BLOCK)
        expert = torch.zeros(gate_up[r].shape[0], dtype=torch.bool, device="cuda")
        for start, end in ep_bench.expert_rows(handles[r], L, SCALE_BLOCK):
            expert[start:end] = True
        gate, up = gate_up[r][expert].float().chunk(2, dim=1)
        y = torch.nn.functional.silu(gate) * up
        amax = y.abs().unflatten(1, (-1, SCALE_BLOCK)).amax(dim=2)
        torch.testing.assert_close(scales[expert], amax.clamp(min=1e-4) / 448, rtol=1e-5,
                                   atol=0)
        got = ep_bench.dequantize_blocks(rows[expert], scales[expert], 1)
        # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of the value (2^-10 of the scale
        # below e4m3's normal range).
        bound = y.abs() * 2.0 ** -4 + scales[expert].repeat_interleave(SCALE_BLOCK, 1) * 2.0 ** -9
        assert ((got - y).abs() <= bound * 1.001).all()
        torch.testing.assert_close(plain[r][expert].float(), y, rtol=2.0 ** -8, atol=1e-6)
        wy = y * recv_w[r][expert][:, None]
        wamax = wy.abs().unflatten(1, (-1, SCALE_BLOCK)).amax(dim=2)
        torch.testing.assert_close(weighted[r][1][expert], wamax.clamp(min=1e-4) / 448,
                                   rtol=1e-5, atol=0)
        wgot = ep_bench.dequantize_blocks(weighted[r][0][expert], weighted[r][1][expert], 1)
        wbound = (wy.abs() * 2.0 ** -4
                  + weighted[r][1][expert].repeat_interleave(SCALE_BLOCK, 1) * 2.0 ** -9)
        assert ((wgot - wy).abs() <= wbound * 1.001).all()
        assert not rows[~expert].view(torch.uint8).any() and not scales[~expert].any()
        assert not plain[r][~expert].any()
    buffer.destroy()


def test_a_rank_that_received_nothing():
    """Every token goes to rank 0's experts: rank 1 receives no rows, and its expert GEMM (and
    the fused GEMM + combine) has nothing to do instead of refusing an empty TMA map."""
    ranks, experts, hidden, n, tokens, alignment = CONFIGS[0]
    g = torch.Generator(device="cuda").manual_seed(7)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    xs = [torch.randn((tokens, hidden), generator=g, device="cuda").to(torch.bfloat16)
          for _ in range(ranks)]
    idxs = [torch.rand((tokens, L), generator=g, device="cuda").topk(TOPK).indices
            for _ in range(ranks)]  # experts 0 .. L-1: rank 0's
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=alignment)
    ws = [(torch.randn((L, hidden, n), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]
    out = buffer.grouped_gemm(recv, ws, handles)
    torch.cuda.synchronize()
    assert sum(handles[1].num_recv_tokens_per_expert_list) == 0
    assert out[1].shape[0] == recv[1].shape[0] and not out[1].any()
    start, end = ep_bench.expert_rows(handles[0], L, alignment)[0]
    assert end > start
    torch.testing.assert_close(out[0][start:end],
                               (recv[0][start:end].float() @ ws[0][0].float()).to(torch.bfloat16),
                               rtol=1.6e-2, atol=1e-2)
    buffer.destroy()


def test_grouped_gemm_output_feeds_the_combine():
    """dispatch -> grouped GEMM -> combine, unfused, against torch doing the same math."""
    ranks, experts, hidden, n, tokens, alignment = CONFIGS[0]
    g = torch.Generator(device="cuda").manual_seed(5)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    xs = [torch.randn((tokens, hidden), generator=g, device="cuda").to(torch.bfloat16)
          for _ in range(ranks)]
    idxs = [torch.rand((tokens, experts), generator=g, device="cuda").topk(TOPK).indices
            for _ in range(ranks)]
    # A square expert GEMM (N = hidden) so that its output can be combined.
    ws = [(torch.randn((L, hidden, hidden), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=alignment)
    ys = buffer.grouped_gemm(recv, ws, handles)
    combined, _, _ = buffer.combine(ys, handles)
    torch.cuda.synchronize()
    for r in range(ranks):
        want = torch.zeros((tokens, hidden), device="cuda")
        scale = torch.zeros((tokens, hidden), device="cuda")
        for t in range(tokens):
            for e in idxs[r][t].tolist():
                term = (xs[r][t].float() @ ws[e // L][e % L].float()).to(torch.bfloat16).float()
                want[t] += term
                scale[t] += term.abs()
        # Each term may differ from torch's by an ulp of the term (another accumulation order
        # in the GEMM), and the terms cancel: the error bound scales with sum |term|.
        error = (combined[r].float() - want).abs()
        assert (error <= 1e-2 * scale + 1e-2).all(), \
            f"rank {r}: worst error {error.max().item()} (bound {(1e-2 * scale + 1e-2).min()})"
    buffer.destroy()


@pytest.mark.parametrize("ranks, experts, hidden, n, tokens, alignment", CONFIGS[:2])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("fusion", FUSION_MODES)
def test_fused_dispatch_gemm_equals_the_two_steps(ranks, experts, hidden, n, tokens, alignment,
                                                  weights, fusion):
    """ep.dispatch_gemm (copy role + GEMM role waiting per tile) gives the rows, weights and
    handle of the expanded dispatch, and bitwise the grouped GEMM of those rows; so does every
    fusion mode (auto goes the way the cost model predicts)."""
    g = torch.Generator(device="cuda").manual_seed(17 + ranks)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    xs = [torch.randn((tokens - r, hidden), generator=g, device="cuda").to(torch.bfloat16)
          for r in range(ranks)]
    idxs = [torch.rand((tokens - r, experts), generator=g, device="cuda").topk(TOPK).indices
            for r in range(ranks)]
    ws = [torch.rand((tokens - r, TOPK), generator=g, device="cuda") for r in range(ranks)] \
        if weights else None
    experts_w = [(torch.randn((L, hidden, n), generator=g, device="cuda") / hidden ** 0.5)
                 .to(torch.bfloat16) for _ in range(ranks)]
    recv, recv_w, fused, handles, _ = buffer.dispatch_gemm(
        xs, idxs, experts_w, topk_weights=ws, num_experts=experts, expert_alignment=alignment,
        fusion=fusion)
    check_decision(buffer, "dispatch_gemm", fusion)
    # The same dispatch unfused: the same multiset of rows per expert.
    plain, _, plain_w, plain_handles, _ = buffer.dispatch(
        xs, idxs, ws, num_experts=experts, do_expand=True, expert_alignment=alignment)
    separate = buffer.grouped_gemm(recv, experts_w, handles)
    torch.cuda.synchronize()
    for r in range(ranks):
        assert handles[r].num_recv_tokens_per_expert_list == \
            plain_handles[r].num_recv_tokens_per_expert_list
        assert torch.equal(fused[r].view(torch.int16), separate[r].view(torch.int16)), \
            f"rank {r}: the fused GEMM differs from the grouped GEMM of the same rows"
        for e, (start, end) in enumerate(ep_bench.expert_rows(handles[r], L, alignment)):
            mine = recv[r][start:end].view(torch.int16).sort(0).values
            theirs = plain[r][start:end].view(torch.int16).sort(0).values
            assert torch.equal(mine, theirs), f"rank {r} expert {e}: rows differ"
    buffer.destroy()


@pytest.mark.parametrize("ranks, experts, hidden, n, tokens, alignment", CONFIGS[:2])
@pytest.mark.parametrize("biases", [0, 2])
@pytest.mark.parametrize("fusion", FUSION_MODES)
def test_fused_gemm_combine_equals_the_two_steps(ranks, experts, hidden, n, tokens, alignment,
                                                 biases, fusion):
    """ep.gemm_combine (tokens sent from the GEMM's epilogue as their rows finish) returns the
    grouped GEMM's output and bitwise the combine of it."""
    g = torch.Generator(device="cuda").manual_seed(29 + ranks + biases)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    counts = [tokens - 3 * r for r in range(ranks)]  # uneven token counts per rank
    xs = [torch.randn((c, hidden), generator=g, device="cuda").to(torch.bfloat16) for c in counts]
    idxs = []
    for c in counts:
        idx = torch.rand((c, experts), generator=g, device="cuda").topk(TOPK).indices
        idx[torch.rand((c, TOPK), generator=g, device="cuda") < 0.1] = -1  # masked top-k
        idxs.append(idx)
    ws = [(torch.randn((L, hidden, hidden), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]
    bias = [tuple(torch.randn((c, hidden), generator=g, device="cuda").to(torch.bfloat16)
                  for _ in range(biases)) for c in counts] if biases else None
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=alignment)
    ys, fused, _ = buffer.gemm_combine(recv, ws, handles, bias=bias, fusion=fusion)
    check_decision(buffer, "gemm_combine", fusion)
    separate_ys = buffer.grouped_gemm(recv, ws, handles)
    separate, _, _ = buffer.combine(separate_ys, handles, bias=bias)
    torch.cuda.synchronize()
    for r in range(ranks):
        assert torch.equal(ys[r].view(torch.int16), separate_ys[r].view(torch.int16)), \
            f"rank {r}: the fused GEMM's output differs from the grouped GEMM's"
        assert torch.equal(fused[r].view(torch.int16), separate[r].view(torch.int16)), \
            f"rank {r}: the fused combine differs from the combine of the GEMM's output"
    # Twice: the per-tile counters and token counts were reset for the next call.
    ys2, fused2, _ = buffer.gemm_combine(recv, ws, handles, bias=bias, fusion=fusion)
    torch.cuda.synchronize()
    for r in range(ranks):
        assert torch.equal(fused2[r].view(torch.int16), separate[r].view(torch.int16)), \
            f"rank {r}: a second fused call differs"
    buffer.destroy()


def test_both_fusions_alternate_on_one_buffer():
    """dispatch_gemm -> gemm_combine, three times on one buffer: each fused kernel keeps
    counters in the window across calls, and neither may disturb the other's."""
    ranks, experts, hidden, n, tokens, alignment = CONFIGS[0]
    g = torch.Generator(device="cuda").manual_seed(41)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    ws = [(torch.randn((L, hidden, hidden), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]
    for step in range(3):
        xs = [torch.randn((tokens - step, hidden), generator=g, device="cuda").to(torch.bfloat16)
              for _ in range(ranks)]
        idxs = [torch.rand((tokens - step, experts), generator=g, device="cuda").topk(TOPK).indices
                for _ in range(ranks)]
        recv, _, y, handles, _ = buffer.dispatch_gemm(xs, idxs, ws, num_experts=experts,
                                                      fusion="always",
                                                      expert_alignment=alignment)
        ys, combined, _ = buffer.gemm_combine(recv, ws, handles, fusion="always")
        want_y = buffer.grouped_gemm(recv, ws, handles)
        want, _, _ = buffer.combine(want_y, handles)
        torch.cuda.synchronize()
        for r in range(ranks):
            assert torch.equal(y[r].view(torch.int16), want_y[r].view(torch.int16)), \
                f"step {step} rank {r}: dispatch_gemm's output differs"
            assert torch.equal(ys[r].view(torch.int16), want_y[r].view(torch.int16)), \
                f"step {step} rank {r}: gemm_combine's GEMM output differs"
            assert torch.equal(combined[r].view(torch.int16), want[r].view(torch.int16)), \
                f"step {step} rank {r}: gemm_combine's combine differs"
    buffer.destroy()


def test_expert_gemm_ops_replay_from_a_cuda_graph():
    """dispatch_gemm (no CPU sync), grouped_gemm and gemm_combine captured in one CUDA graph;
    replays with new tokens and routing written into the same inputs give bitwise what eager
    calls give. An expert's received rows come in arrival order (slots are taken by atomics,
    as in DeepEP), so rows are compared within a call (the fused GEMM's and gemm_combine's
    against grouped_gemm of the same received rows, padding rows zero in all) and the combined
    tokens, which are in token order, across graph and eager calls."""
    ranks, experts, hidden, n, tokens, alignment = CONFIGS[0]
    g = torch.Generator(device="cuda").manual_seed(43)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    ws = [(torch.randn((L, hidden, hidden), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]

    def new_inputs():
        return ([torch.randn((tokens, hidden), generator=g, device="cuda").to(torch.bfloat16)
                 for _ in range(ranks)],
                [torch.rand((tokens, experts), generator=g, device="cuda").topk(TOPK).indices
                 for _ in range(ranks)])

    xs, idxs = new_inputs()

    def step():
        recv, _, y, handles, _ = buffer.dispatch_gemm(xs, idxs, ws, num_experts=experts,
                                                      fusion="always",
                                                      expert_alignment=alignment,
                                                      do_cpu_sync=False)
        unfused = buffer.grouped_gemm(recv, ws, handles)
        ys, combined, _ = buffer.gemm_combine(recv, ws, handles, fusion="always")
        return y, unfused, ys, combined

    step()  # warm-up: plans made, kernels loaded
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        new_xs, new_idxs = new_inputs()
        for dst, src in zip(xs + idxs, new_xs + new_idxs):
            dst.copy_(src)
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        for name, (y, unfused, ys, combined) in (("graph", captured), ("eager", eager)):
            for r in range(ranks):
                assert torch.equal(y[r].view(torch.int16), unfused[r].view(torch.int16)), \
                    f"{name} rank {r}: dispatch_gemm's rows differ from grouped_gemm's"
                assert torch.equal(ys[r].view(torch.int16), unfused[r].view(torch.int16)), \
                    f"{name} rank {r}: gemm_combine's rows differ from grouped_gemm's"
        for r in range(ranks):
            assert torch.equal(captured[3][r].view(torch.int16), eager[3][r].view(torch.int16)), \
                f"rank {r}: the replayed combine differs from the eager one"
    buffer.destroy()


def test_gemm_combine_zeroes_its_output_on_the_communication_stream():
    """With previous_event (DeepEP's stream protocol) gemm_combine runs on the communication
    stream, which waits for that event only. The compute stream is kept busy after the event:
    zeroes for the GEMM output's padding rows written there would land after the kernels' rows
    (what test/gpu/stress.py found with one NCCL rank)."""
    ranks, experts, hidden, n, tokens, alignment = CONFIGS[0]
    g = torch.Generator(device="cuda").manual_seed(47)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=tokens,
                                hidden=hidden, num_topk=TOPK, explicitly_destroy=True)
    L = experts // ranks
    ws = [(torch.randn((L, hidden, hidden), generator=g, device="cuda") / hidden ** 0.5)
          .to(torch.bfloat16) for _ in range(ranks)]
    xs = [torch.randn((tokens, hidden), generator=g, device="cuda").to(torch.bfloat16)
          for _ in range(ranks)]
    idxs = [torch.rand((tokens, experts), generator=g, device="cuda").topk(TOPK).indices
            for _ in range(ranks)]
    recv, _, _, handles, _ = buffer.dispatch(xs, idxs, num_experts=experts, do_expand=True,
                                             expert_alignment=alignment)
    want = buffer.grouped_gemm(recv, ws, handles)
    # The plan made, the kernels loaded (which syncs).
    buffer.gemm_combine(recv, ws, handles, fusion="always")
    torch.cuda.synchronize()
    event = buffer.capture()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of compute-stream work after the event
    ys, _, done = buffer.gemm_combine(recv, ws, handles, previous_event=event, fusion="always",
                                      async_with_compute_stream=True)
    done.current_stream_wait()
    torch.cuda.synchronize()
    for r in range(ranks):
        assert want[r].any(), f"rank {r}: no rows to compare"
        assert torch.equal(ys[r].view(torch.int16), want[r].view(torch.int16)), \
            f"rank {r}: gemm_combine's GEMM output differs from grouped_gemm's"
    buffer.destroy()
