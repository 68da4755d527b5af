"""Direct and hybrid mode across nodes, host side (no GPU): the kernels of a configuration with
`num_scaleup_ranks` compile through the runtime's provider, their launch metadata says what the
runtime must give them (staging per warp, GIN signals), and the record sizes the network
traffic is counted in come from the window's one layout (EPWindow.h)."""

import json

import pytest

_C = pytest.importorskip("epic._C", reason="the runtime extension is built by ./install.sh")

R, M, E, K, H = 8, 4, 64, 6, 2048


def spec(**kw):
    base = dict(num_ranks=R, num_experts=E, num_topk=K, hidden=H, dtype="bf16",
                num_scale_packs=0, expert_alignment=1, do_expand=False,
                num_max_tokens_per_rank=128, num_scaleup_ranks=M)
    base.update(kw)
    return base


def metadata(result):
    (entry,) = json.loads(result["metadata"])["entries"]
    return entry


def test_record_bytes_follow_the_window_layout():
    # bf16, K = 6: a 4096-byte row, ids and weights (24 bytes each), token and master (8),
    # rounded to 16; the combine record is the row and the weights rounded to 16.
    assert _C.record_bytes(spec()) == dict(dispatch=4160, combine=4128, combine_row=4096,
                                           staging_per_warp=2 * 4160)
    # FP8 with 16 packs: a 2048-byte row, 64 bytes of packs.
    fp8 = _C.record_bytes(spec(dtype="f8E4M3FN", num_scale_packs=16))
    assert fp8["dispatch"] == 2048 + 64 + 48 + 8 + 8  # 2176, a multiple of 16
    assert fp8["staging_per_warp"] == 2 * 4128  # the combine record is the larger
    with pytest.raises(ValueError, match="hidden"):
        _C.record_bytes(spec(hidden=0))


def test_direct_kernels_of_two_nodes_compile_and_ask_for_staging_and_signals(tmp_path):
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    dispatch = runtime.kernels(spec(), dict(weights=True, cached=False, zero_padding=False),
                               "dispatch")
    assert json.loads(dispatch["request"])["spec"]["scaleup_ranks"] == M
    meta = metadata(dispatch)
    assert meta["gin_signals"] == 8 + 2 * R
    assert meta["window_bytes_per_warp"] == _C.record_bytes(spec())["staging_per_warp"]
    assert meta["kernels"] == ["ep_dispatch_send", "ep_dispatch_copy"]
    combine = metadata(runtime.kernels(spec(), dict(weights=True, biases=1), "combine"))
    assert combine["gin_signals"] == 8 + 2 * R
    assert combine["window_bytes_per_warp"] == meta["window_bytes_per_warp"]
    # A cached dispatch across nodes is the send and copy kernels: the one-pass scatter
    # writes other ranks' tensors, which ranks of other nodes cannot.
    cached = metadata(runtime.kernels(spec(), dict(weights=False, cached=True,
                                                   zero_padding=False), "dispatch"))
    assert cached["kernels"] == ["ep_dispatch_send", "ep_dispatch_copy"]


def test_one_node_kernels_ask_for_neither(tmp_path):
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    for scaleup in (0, R):  # 0: one node of all ranks
        meta = metadata(runtime.kernels(spec(num_scaleup_ranks=scaleup),
                                        dict(weights=True, cached=False, zero_padding=False),
                                        "dispatch"))
        assert "gin_signals" not in meta and "window_bytes_per_warp" not in meta
    cached = metadata(runtime.kernels(spec(num_scaleup_ranks=0),
                                      dict(weights=False, cached=True, zero_padding=False),
                                      "dispatch"))
    assert cached["kernels"] == ["ep_dispatch_scatter"]


def test_hybrid_kernels_forward_through_one_rank_per_node(tmp_path):
    runtime = _C.Runtime("virtual", str(tmp_path), "")
    variant = dict(weights=True, cached=False, zero_padding=False)
    meta = metadata(runtime.kernels(spec(hybrid=True), variant, "dispatch"))
    assert meta["kernels"] == ["ep_dispatch_send", "ep_dispatch_forward", "ep_dispatch_copy"]
    assert meta["gin_signals"] == 8 + 2 * R
    assert meta["param_fields"][-2:] == ["fwd_src_metadata", "fwd_counts"]
    # The forwarders' regions: (R + N) dispatch records or K x (N + 1) combine records per
    # token, more than direct mode's R or K.
    direct = metadata(runtime.kernels(spec(), variant, "dispatch"))
    rec = _C.record_bytes(spec())
    assert direct["window_bytes_per_token"] == max(R * rec["dispatch"], K * rec["combine"])
    assert meta["window_bytes_per_token"] == max((R + 2) * rec["dispatch"],
                                                 K * 3 * rec["combine"])
    combine = metadata(runtime.kernels(spec(hybrid=True), dict(weights=True, biases=1),
                                       "combine"))
    assert combine["kernels"] == ["ep_combine_send", "ep_combine_forward", "ep_combine_reduce"]
    cached = metadata(runtime.kernels(spec(hybrid=True), dict(weights=False, cached=True,
                                                              zero_padding=False), "dispatch"))
    assert cached["kernels"] == meta["kernels"]


def test_hybrid_handle_has_the_forwarder_tensors():
    outs = {name: (dtype, shape) for name, dtype, shape in
            _C.outputs("dispatch", spec(hybrid=True),
                       dict(weights=True, cached=False, zero_padding=False), 100)}
    # Rows grouped per forwarder index (M), the forwarder's items: N x Tmax of them.
    assert outs["psum_num_recv_tokens_per_rank"] == ("i32", (M,))
    assert outs["fwd_src_metadata"] == ("i32", (2 * 128, K + 2))
    assert outs["fwd_counts"] == ("i32", (2,))
    direct = {name for name, _, _ in _C.outputs(
        "dispatch", spec(), dict(weights=True, cached=False, zero_padding=False), 100)}
    assert "fwd_src_metadata" not in direct and "fwd_counts" not in direct
    # hybrid metadata column 1 is item x K + slot, item < N x Tmax: bounded by name.
    with pytest.raises(ValueError, match="hybrid metadata holds item x K"):
        _C.outputs("dispatch", spec(hybrid=True, num_ranks=64, num_experts=64 * 8,
                                    num_scaleup_ranks=2, num_topk=32,
                                    num_max_tokens_per_rank=1 << 21),
                   dict(weights=False, cached=False, zero_padding=False), 1)
