"""Nodes and GPUs per node: VirtualWorld, the domain sizes, the models and the call spec."""

import pytest

import epic
from epic import _topology


def test_virtual_world_of_nodes():
    w = epic.VirtualWorld(num_nodes=2, gpus_per_node=4)
    assert (w.num_ranks, w.num_nodes, w.gpus_per_node, w.size()) == (8, 2, 4, 8)
    assert repr(w) == "VirtualWorld(num_nodes=2, gpus_per_node=4)"
    assert repr(epic.VirtualWorld(8)) == "VirtualWorld(8)"
    assert epic.VirtualWorld(8).gpus_per_node == 8
    assert epic.VirtualWorld(8, num_nodes=4).gpus_per_node == 2
    assert epic.VirtualWorld(8, num_nodes=2, gpus_per_node=4).num_nodes == 2


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, TypeError, "give num_ranks, or num_nodes and gpus_per_node"),
    ({"num_ranks": 8, "num_nodes": 3}, ValueError, r"num_nodes: 3 does not divide num_ranks \(8\)"),
    ({"num_ranks": 6, "num_nodes": 2, "gpus_per_node": 4}, ValueError,
     r"num_ranks: 6 != num_nodes \(2\) x gpus_per_node \(4\) = 8"),
    ({"num_nodes": 0, "gpus_per_node": 4}, ValueError, r"num_nodes: must be \[1, 1024\], got 0"),
    ({"num_nodes": 2, "gpus_per_node": 0}, ValueError, r"gpus_per_node: must be \[1, 1024\]"),
    ({"num_nodes": 2, "gpus_per_node": "4"}, TypeError, "gpus_per_node: expected an int"),
    ({"num_nodes": True, "gpus_per_node": 4}, TypeError, "num_nodes: expected an int"),
    ({"num_nodes": 64, "gpus_per_node": 32}, ValueError, r"num_ranks: must be in \[1, 1024\]"),
])
def test_virtual_world_refuses(kwargs, error, match):
    with pytest.raises(error, match=match):
        epic.VirtualWorld(**kwargs)


def test_layout_from_hosts():
    assert _topology.layout_from_hosts(["a"] * 4) == (1, 4)
    assert _topology.layout_from_hosts(["a", "a", "b", "b", "c", "c"]) == (3, 2)
    assert _topology.layout_from_hosts(["a", "b", "c"]) == (3, 1)
    with pytest.raises(ValueError, match=r"rank 3 is on host 'c', but ranks 2..3 should all be on "
                                         r"'b'"):
        _topology.layout_from_hosts(["a", "a", "b", "c"])
    with pytest.raises(ValueError, match=r"rank 4 is on host 'a' again after other hosts: ranks "
                                         "must be numbered node-major"):
        _topology.layout_from_hosts(["a", "a", "b", "b", "a", "a"])
    with pytest.raises(ValueError, match=r"holds ranks 0..1 \(2 ranks\), which does not divide "
                                         "the 3 ranks"):
        _topology.layout_from_hosts(["a", "a", "b"])
    with pytest.raises(ValueError, match="hosts: no ranks"):
        _topology.layout_from_hosts([])


def test_domain_sizes_are_deepeps():
    w = epic.VirtualWorld(num_nodes=2, gpus_per_node=4)
    assert epic.get_physical_domain_size(w) == (2, 4)
    assert epic.get_logical_domain_size(w) == (2, 4)
    assert epic.get_logical_domain_size(w, allow_hybrid_mode=False) == (1, 8)
    assert epic.get_logical_domain_size(epic.VirtualWorld(8)) == (1, 8)
    with pytest.raises(TypeError, match="allow_hybrid_mode: expected a bool"):
        epic.get_logical_domain_size(w, 1)
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        epic.get_physical_domain_size(object())


def _buffer(world, **kwargs):
    return epic.ElasticBuffer(world, num_max_tokens_per_rank=128, hidden=1024, num_topk=8,
                              **kwargs)


def test_buffer_attributes_hybrid_and_direct():
    w = epic.VirtualWorld(num_nodes=2, gpus_per_node=4)
    hybrid = _buffer(w)
    assert hybrid.get_physical_domain_size() == (2, 4)
    assert hybrid.get_logical_domain_size() == (2, 4)
    assert (hybrid.hybrid, hybrid.num_allocated_qps) == (True, 129)
    assert (hybrid.scaleout_rank_idx, hybrid.scaleup_rank_idx) == (0, 0)
    direct = _buffer(w, allow_hybrid_mode=False)
    assert direct.get_physical_domain_size() == (2, 4)
    assert direct.get_logical_domain_size() == (1, 8)
    assert (direct.hybrid, direct.num_allocated_qps) == (False, 17)
    assert _buffer(w, num_allocated_qps=33).num_allocated_qps == 33
    one = _buffer(epic.VirtualWorld(8))
    assert (one.hybrid, one.get_physical_domain_size(), one.num_allocated_qps) == (
        False, (1, 8), 17)


def test_hybrid_bounds_are_refused_by_name():
    with pytest.raises(ValueError, match="allow_hybrid_mode: hybrid mode takes at most 64 GPUs"):
        _buffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=128))
    with pytest.raises(ValueError, match=r"allow_hybrid_mode: hybrid mode takes 2..32 nodes"):
        _buffer(epic.VirtualWorld(num_nodes=64, gpus_per_node=2))
    # Direct mode has no such bound.
    assert _buffer(epic.VirtualWorld(num_nodes=64, gpus_per_node=2),
                   allow_hybrid_mode=False).get_logical_domain_size() == (1, 128)


def test_models_see_the_nodes():
    # DeepEP's README figures for E=256, K=8 with 400 Gb/s NICs: 2 and 4 nodes of 8 -> 12 and 6.
    assert _buffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=8)).get_theoretical_num_sms(
        256, 8) == 12
    assert _buffer(epic.VirtualWorld(num_nodes=4, gpus_per_node=8)).get_theoretical_num_sms(
        256, 8) == 6
    # Direct mode across nodes is not one NVLink domain: more of the traffic is network.
    across = _buffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=8), allow_hybrid_mode=False)
    single = _buffer(epic.VirtualWorld(16))
    assert across.get_theoretical_num_sms(256, 8) != single.get_theoretical_num_sms(256, 8)
    hybrid = _buffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=8))
    assert hybrid.get_theoretical_num_qps(4) == 4 * 16 + 1
    assert hybrid.get_theoretical_num_qps(12) == 129  # capped at the allocated contexts
    assert across.get_theoretical_num_qps(12) == 9
    # Hybrid sizes by DeepEP's hybrid formula, more than one domain of the same ranks.
    hint = epic.ElasticBuffer.get_buffer_size_hint
    # DeepEP's worked example: EP 2 nodes x 8, H 7168, top-8, FP8, 8192 tokens -> 2286 MiB by
    # its formula; epic's hybrid kernels need more: the combine keeps the origins' K x Tmax
    # and the forwarders' K x N x Tmax records at once (8 x 3 x 8192 x 14368 bytes).
    big = hint(epic.VirtualWorld(num_nodes=2, gpus_per_node=8), 8192, 7168, 8, True)
    assert big >= 2286 << 20 and big >= 8 * 3 * 8192 * 14368 and big % (2 << 20) == 0
    assert hint(epic.VirtualWorld(16), 8192, 7168, 8, True) < hint(
        epic.VirtualWorld(num_nodes=2, gpus_per_node=8), 8192, 7168, 8, True)


def test_spec_carries_the_layout_only_across_nodes():
    one = _buffer(epic.VirtualWorld(8))
    spec = one._spec(8, 64, 8, 1024, "bf16", 0, 1, False, 128)
    assert "num_scaleup_ranks" not in spec and "hybrid" not in spec
    two = _buffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=4))  # hybrid, DeepEP's default
    spec = two._spec(8, 64, 8, 1024, "bf16", 0, 1, False, 128)
    assert (spec["num_scaleup_ranks"], spec["hybrid"]) == (4, True)
    direct = _buffer(epic.VirtualWorld(num_nodes=2, gpus_per_node=4), allow_hybrid_mode=False)
    spec = direct._spec(8, 64, 8, 1024, "bf16", 0, 1, False, 128)
    assert (spec["num_scaleup_ranks"], spec["hybrid"]) == (4, False)


def test_the_size_hint_across_nodes_counts_the_staging_of_the_blocks():
    hint = epic.ElasticBuffer.get_buffer_size_hint
    two = epic.VirtualWorld(num_nodes=2, gpus_per_node=2)
    few = hint(two, 96, 7168, 6, allow_hybrid_mode=False, num_sms=1)
    many = hint(two, 96, 7168, 6, allow_hybrid_mode=False, num_sms=32)
    # 31 more blocks x 32 warps x 2 slots of a record of at least the BF16 row (14 KiB).
    assert many - few >= 31 * 32 * 2 * 7168 * 2 - (2 << 20)
    one = epic.VirtualWorld(4)  # one node: nothing is staged
    assert hint(one, 96, 7168, 6, num_sms=1) == hint(one, 96, 7168, 6, num_sms=32)
    with pytest.raises(ValueError, match="num_sms"):
        hint(two, 96, 7168, 6, allow_hybrid_mode=False, num_sms=0)
