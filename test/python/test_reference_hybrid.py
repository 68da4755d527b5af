"""Tests of epic.reference's topology: hybrid dispatch and combine, check_hybrid_metadata and
expected_network_bytes (issue 21, stage 2).

The hand-built worlds' expected values are written out here, worked by hand from DeepEP V2's
hybrid semantics (forwarders, column 1 of the metadata, per-node reduction); the random worlds
are checked against plain per-token loops, independently of the vectorised reference.
"""

import dataclasses

import numpy as np
import pytest
from test_reference import assert_bitwise_equal, random_topk, simulate_kernel_order, to_bf16

from epic import reference as ref

BF16 = ref.bfloat16
H = 8
# Exact powers of two: sums of them are exact in float32, and the bf16 roundings are ties.
HALF_ULP_AT_ONE = 2.0**-8  # bf16 keeps 8 significant bits: 1 + 2**-8 is a tie, rounds to 1
TINY = 2.0**-24  # float32: 1 + 2**-24 is a tie, rounds to 1


# ----------------------------------------------------------------------------
# Hand-built worlds
# ----------------------------------------------------------------------------

# 2 nodes x 2 GPUs, one expert per rank (expert e on rank e), Tmax = 2, gid = 2 * rank + token.
IDX_2X2 = [
    np.array([[0, 3], [2, -1]]),  # gids 0, 1
    np.array([[1, 3]]),  # gid 2
    np.array([[3, 0], [-1, -1]]),  # gids 4, 5
    np.array([[2, 1], [0, 1]]),  # gids 6, 7
]


def xs_for(idxs):
    """Rank r's token t is the row of value 10 r + t."""
    return [np.full((len(a), H), 10 * r, np.float32) + np.arange(len(a))[:, None]
            for r, a in enumerate(idxs)]


def dispatch_2x2(**kw):
    xs = [x.astype(BF16) for x in xs_for(IDX_2X2)]
    return ref.dispatch(xs, IDX_2X2, num_experts=4, num_max_tokens_per_rank=2, **kw)


def test_hybrid_dispatch_2x2_by_hand():
    got = dispatch_2x2(gpus_per_node=2, hybrid=True)
    # Receiver d's rows: forwarder index lsa(src) = src % 2 first, then the source id. Group 0
    # holds sources 0 and 2 of both nodes, group 1 sources 1 and 3.
    want_ids = [[0, 4, 7], [2, 6, 7], [1, 6], [0, 4, 2]]
    want_psum = [[2, 3], [0, 3], [1, 2], [2, 3]]
    want_x = [[0, 20, 31], [10, 30, 31], [1, 30], [0, 20, 10]]
    # Local expert 0 where the slot's expert is the receiver's, else -1.
    want_local = [
        [[0, -1], [-1, 0], [0, -1]],
        [[0, -1], [-1, 0], [-1, 0]],
        [[0, -1], [0, -1]],
        [[-1, 0], [0, -1], [-1, 0]],
    ]
    for d, r in enumerate(got):
        assert (r.gpus_per_node, r.hybrid) == (2, True)
        assert r.recv_src_metadata[:, 0].tolist() == want_ids[d]
        assert (r.recv_src_metadata[:, 1:] == -1).all()  # column 1: check_hybrid_metadata's
        assert r.psum_num_recv_tokens_per_scaleup_rank.dtype == np.int32
        assert r.psum_num_recv_tokens_per_scaleup_rank.tolist() == want_psum[d]
        assert r.recv_x[:, 0].astype(np.float32).tolist() == want_x[d]
        assert r.recv_topk_idx.tolist() == want_local[d]
        assert r.num_unaligned_recv_tokens_per_expert.tolist() == [len(want_ids[d])]
        assert ref.sort_by_source(r).recv_src_metadata[:, 0].tolist() == want_ids[d]

    # Direct mode over the same two nodes: source order, one prefix sum entry per rank, and
    # column 1 = src * K + master slot, whatever the topology.
    direct = dispatch_2x2(gpus_per_node=2)
    assert direct[3].recv_src_metadata[:, :2].tolist() == [[0, 1], [2, 3], [4, 4]]
    assert direct[3].psum_num_recv_tokens_per_scaleup_rank.tolist() == [1, 2, 3, 3]
    assert direct[1].psum_num_recv_tokens_per_scaleup_rank.tolist() == [0, 1, 1, 3]
    one_node = dispatch_2x2()
    for a, b in zip(direct, one_node):
        assert a.gpus_per_node == 2 and b.gpus_per_node == 4 and not a.hybrid
        assert_same_arrays(a, b)


def assert_same_arrays(a, b):
    for field in dataclasses.fields(a):
        va, vb = getattr(a, field.name), getattr(b, field.name)
        if isinstance(va, np.ndarray):
            assert_bitwise_equal(va, vb)


def test_hybrid_dispatch_2x2_expanded_by_hand():
    got = dispatch_2x2(gpus_per_node=2, hybrid=True, expand=True, expert_alignment=4)
    r3 = got[3]
    # Expert 0 of rank 3 takes its rows in the hybrid order: gid 0 (slot 1), 4 (slot 0), 2 (1).
    assert r3.recv_src_metadata.tolist() == [[0, -1, -1, 0], [4, -1, 1, -1], [2, -1, -1, 2]]
    assert r3.recv_x[:, 0].astype(np.float32).tolist() == [0, 20, 10, 0]  # one padding row
    assert r3.num_recv_tokens_per_expert_list == [4]
    assert r3.psum_num_recv_tokens_per_expert.tolist() == [3]
    assert r3.psum_num_recv_tokens_per_scaleup_rank.tolist() == [2, 3]


# 2 nodes x 4 GPUs, one token per rank (gid = rank), one expert per rank.
IDX_2X4 = [np.array([row]) for row in
           ([0, 1], [5, 2], [3, 5], [3, -1], [5, 4], [0, 6], [5, 7], [1, 5])]


def test_hybrid_dispatch_2x4_by_hand():
    xs = [x.astype(BF16) for x in xs_for(IDX_2X4)]
    got = ref.dispatch(xs, IDX_2X4, num_experts=8, gpus_per_node=4, hybrid=True)
    # Rank 5 gets sources 1, 2, 4, 6, 7: forwarder index 0 {4}, 1 {1}, 2 {2, 6}, 3 {7}.
    assert got[5].recv_src_metadata[:, 0].tolist() == [4, 1, 2, 6, 7]
    assert got[5].psum_num_recv_tokens_per_scaleup_rank.tolist() == [1, 2, 4, 5]
    assert got[5].recv_x[:, 0].astype(np.float32).tolist() == [40, 10, 20, 60, 70]
    # Rank 3 gets sources 2 and 3 (forwarder indices 2, 3); rank 0 gets 0 and 5 (0, 1).
    assert got[3].recv_src_metadata[:, 0].tolist() == [2, 3]
    assert got[3].psum_num_recv_tokens_per_scaleup_rank.tolist() == [0, 0, 1, 2]
    assert got[0].recv_src_metadata[:, 0].tolist() == [0, 5]
    assert got[0].psum_num_recv_tokens_per_scaleup_rank.tolist() == [1, 2, 2, 2]
    direct = ref.dispatch(xs, IDX_2X4, num_experts=8, gpus_per_node=4)
    assert direct[5].recv_src_metadata[:, 0].tolist() == [1, 2, 4, 6, 7]
    assert direct[5].psum_num_recv_tokens_per_scaleup_rank.tolist() == [0, 1, 2, 2, 3, 3, 4, 5]


# ----------------------------------------------------------------------------
# Random worlds against per-token loops
# ----------------------------------------------------------------------------

# (nodes, gpus per node, experts, top-k, max tokens, alignment)
TOPOLOGIES = [(2, 2, 8, 3, 12, 1), (2, 4, 16, 5, 9, 4), (4, 2, 16, 4, 7, 2), (3, 1, 6, 2, 5, 1)]
TOPOLOGY_IDS = [f"{n}x{m}-E{e}-K{k}" for n, m, e, k, _, _ in TOPOLOGIES]


def random_world(seed, nodes, gpus, experts, topk, max_tokens, one_rank_per_node=False):
    rng = np.random.default_rng(seed)
    ranks = nodes * gpus
    tokens = [int(rng.integers(0, max_tokens + 1)) for _ in range(ranks)]
    tokens[0] = max_tokens
    if one_rank_per_node:
        # Each token's experts live on ranks of one local index l, one rank per node.
        local = experts // ranks
        idxs = []
        for t in tokens:
            rows = []
            for _ in range(t):
                lsa = int(rng.integers(gpus))
                pool = [e for e in range(experts) if (e // local) % gpus == lsa]
                row = np.full(topk, -1)
                row[:min(topk, len(pool))] = rng.permutation(pool)[:topk]
                row[rng.random(topk) < 0.2] = -1
                rows.append(rng.permutation(row))
            idxs.append(np.array(rows, dtype=np.int64).reshape(t, topk))
    else:
        idxs = [random_topk(rng, t, experts, topk) for t in tokens]
    xs = [rng.standard_normal((t, 16)).astype(np.float32).astype(BF16) for t in tokens]
    weights = [rng.random((t, topk), dtype=np.float32) for t in tokens]
    return rng, xs, idxs, weights


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=TOPOLOGY_IDS)
def test_hybrid_dispatch_matches_loop(topology):
    nodes, gpus, experts, topk, tmax, align = topology
    _, xs, idxs, weights = random_world(1, nodes, gpus, experts, topk, tmax)
    ranks, local = nodes * gpus, experts // (nodes * gpus)
    kw = dict(num_experts=experts, expert_alignment=align, gpus_per_node=gpus)
    hybrid = ref.dispatch(xs, idxs, weights, **kw, hybrid=True)
    direct = ref.dispatch(xs, idxs, weights, **kw)
    for d in range(ranks):
        order, psum = [], []
        for g in range(gpus):
            for s in range(g, ranks, gpus):
                for t in range(len(idxs[s])):
                    if any(e >= 0 and e // local == d for e in idxs[s][t]):
                        order.append((s, t))
            psum.append(len(order))
        h, e = hybrid[d], direct[d]
        assert h.recv_src_metadata[:, 0].tolist() == [s * tmax + t for s, t in order]
        assert h.psum_num_recv_tokens_per_scaleup_rank.tolist() == psum
        assert (h.recv_src_metadata[:, 1] == -1).all()
        for i, (s, t) in enumerate(order):
            assert_bitwise_equal(h.recv_x[i], xs[s][t])
            assert_bitwise_equal(h.recv_topk_weights[i], weights[s][t])
        # The rest is direct mode's, rows in the hybrid order.
        perm = np.argsort(e.recv_src_metadata[:, 0])[
            np.argsort(np.argsort(h.recv_src_metadata[:, 0]))]
        assert_bitwise_equal(h.recv_topk_idx, e.recv_topk_idx[perm])
        assert_bitwise_equal(h.recv_src_metadata[:, 2:], e.recv_src_metadata[perm, 2:])
        for field in ("psum_num_recv_tokens_per_expert", "num_unaligned_recv_tokens_per_expert"):
            assert_bitwise_equal(getattr(h, field), getattr(e, field))


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=TOPOLOGY_IDS)
def test_hybrid_sort_by_source_restores_kernel_order(topology):
    nodes, gpus, experts, topk, tmax, align = topology
    _, xs, idxs, weights = random_world(2, nodes, gpus, experts, topk, tmax)
    for expand in (False, True):
        want = ref.dispatch(xs, idxs, weights, num_experts=experts, expert_alignment=align,
                            expand=expand, gpus_per_node=gpus, hybrid=True)
        shuffled, _ = simulate_kernel_order(want, seed=3)
        for w, s in zip(want, shuffled):
            assert_same_arrays(ref.sort_by_source(w), w)  # the identity on canonical output
            assert_same_arrays(ref.sort_by_source(s), w)


def hybrid_combine_loop(idxs, local, gpus, value, biases=None):
    """Three stages per token, written out: value(d, s, t) is rank d's stage-1 row."""
    out = []
    for s, idx in enumerate(idxs):
        rows = []
        for t, row in enumerate(idx):
            rank_master, node_master = {}, {}
            for j, e in enumerate(row):
                if e >= 0:
                    rank_master[int(e) // local] = j  # later slots overwrite: highest wins
                    node_master[int(e) // local // gpus] = j
            partial = {}
            for node in node_master:
                members = [d for d in rank_master if d // gpus == node]
                acc = np.zeros(H, np.float32)
                for d in sorted(members, key=rank_master.get):
                    acc = (acc + value(d, s, t).astype(np.float32)).astype(np.float32)
                partial[node] = to_bf16(acc).astype(np.float32)
            acc = np.zeros(H, np.float32)
            for b in (biases[s] if biases else ()):
                acc = (acc + b[t].astype(np.float32)).astype(np.float32)
            for node in sorted(node_master, key=node_master.get):
                acc = (acc + partial[node]).astype(np.float32)
            rows.append(to_bf16(acc))
        out.append(np.array(rows, dtype=BF16).reshape(len(idx), H))
    return out


def value_table(results):
    """value(d, s, t): rank d's plain row of token t of rank s."""
    rows = {}
    for d, r in enumerate(results):
        tmax = r.num_max_tokens_per_rank
        for i, gid in enumerate(r.recv_src_metadata[:, 0]):
            rows[d, int(gid) // tmax, int(gid) % tmax] = r.recv_x[i]
    return lambda d, s, t: rows[d, s, t]


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=TOPOLOGY_IDS)
@pytest.mark.parametrize("num_bias", [0, 2])
def test_hybrid_combine_matches_three_stage_loop(topology, num_bias):
    nodes, gpus, experts, topk, tmax, _ = topology
    rng, _, idxs, _ = random_world(4, nodes, gpus, experts, topk, tmax)
    # Rows of mixed magnitudes, so that orders and roundings show in the bits.
    xs = [(rng.standard_normal((len(a), H)) * 2.0 ** rng.integers(-9, 9, (len(a), 1)))
          .astype(np.float32).astype(BF16) for a in idxs]
    biases = [tuple(rng.standard_normal((len(a), H)).astype(np.float32).astype(BF16)
                    for _ in range(num_bias)) for a in idxs]
    results = ref.dispatch(xs, idxs, num_experts=experts, gpus_per_node=gpus, hybrid=True)
    ys = [r.recv_x for r in results]
    got = ref.combine(ys, results, bias=biases if num_bias else None)
    want = hybrid_combine_loop(idxs, experts // (nodes * gpus), gpus, value_table(results),
                               biases if num_bias else None)
    for g, w in zip(got, want):
        assert_bitwise_equal(g.combined_x, w)
    # Rows in a kernel's order give the same result.
    shuffled, perms = simulate_kernel_order(results, seed=5)
    again = ref.combine([y[p] for y, p in zip(ys, perms)], shuffled,
                        bias=biases if num_bias else None)
    for g, a in zip(got, again):
        assert_bitwise_equal(g.combined_x, a.combined_x)
    if gpus > 1 and num_bias == 0:
        # The world is large enough for the two modes to differ somewhere.
        direct = ref.combine(ys, ref.dispatch(xs, idxs, num_experts=experts))
        assert any(not np.array_equal(g.combined_x.view(np.uint16), e.combined_x.view(np.uint16))
                   for g, e in zip(got, direct))


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=TOPOLOGY_IDS)
@pytest.mark.parametrize("expand", [False, True])
def test_hybrid_equals_direct_with_one_rank_per_node(topology, expand):
    nodes, gpus, experts, topk, tmax, _ = topology
    rng, xs, idxs, weights = random_world(6, nodes, gpus, experts, topk, tmax,
                                          one_rank_per_node=True)
    kw = dict(num_experts=experts, gpus_per_node=gpus, expand=expand)
    hybrid = ref.dispatch(xs, idxs, weights, hybrid=True, **kw)
    direct = ref.dispatch(xs, idxs, weights, **kw)
    biases = [(rng.standard_normal((len(a), 16)).astype(np.float32).astype(BF16),)
              for a in idxs]
    ys_h = [(rng.standard_normal(r.recv_x.shape) * 2.0 ** rng.integers(-9, 9, (len(r.recv_x), 1)))
            .astype(np.float32).astype(BF16) for r in hybrid]
    # The same row for the same (token, slot) in both layouts' orders.
    ys_d = []
    for h, e, y in zip(hybrid, direct, ys_h):
        y_d = np.zeros_like(y)
        if expand:
            owned = h.recv_src_metadata[:, 2:] >= 0
            by_id = {(int(g), j): y[row] for g, rows in zip(h.recv_src_metadata[:, 0],
                                                            h.recv_src_metadata[:, 2:])
                     for j, row in enumerate(rows) if row >= 0}
            for g, rows in zip(e.recv_src_metadata[:, 0], e.recv_src_metadata[:, 2:]):
                for j, row in enumerate(rows):
                    if row >= 0:
                        y_d[row] = by_id[int(g), j]
            assert owned.sum() == len(by_id)
        else:
            by_id = dict(zip(h.recv_src_metadata[:, 0].tolist(), y))
            for i, g in enumerate(e.recv_src_metadata[:, 0]):
                y_d[i] = by_id[int(g)]
        ys_d.append(y_d)
    w_h = [r.recv_topk_weights for r in hybrid]
    w_d = [r.recv_topk_weights for r in direct]
    got = ref.combine(ys_h, hybrid, topk_weights=w_h, bias=biases)
    want = ref.combine(ys_d, direct, topk_weights=w_d, bias=biases)
    for g, w, original, idx in zip(got, want, weights, idxs):
        assert_bitwise_equal(g.combined_x, w.combined_x)
        assert_bitwise_equal(g.combined_topk_weights, w.combined_topk_weights)
        assert_bitwise_equal(g.combined_topk_weights, np.where(idx >= 0, original, 0))


def test_hybrid_expanded_combine_equals_plain_with_generated_data():
    _, xs, idxs, _ = random_world(7, 2, 4, 16, 5, 9)
    kw = dict(num_experts=16, gpus_per_node=4, hybrid=True)
    plain = ref.dispatch(xs, idxs, **kw)
    expanded = ref.dispatch(xs, idxs, expand=True, expert_alignment=4, **kw)
    a = ref.combine(ref.generate_pre_combine_data(plain, seed=1), plain)
    b = ref.combine(ref.generate_pre_combine_data(expanded, seed=1), expanded)
    for x, y in zip(a, b):
        assert_bitwise_equal(x.combined_x, y.combined_x)


# ----------------------------------------------------------------------------
# Hybrid combine: orders and roundings, by hand
# ----------------------------------------------------------------------------


def combine_by_value(idxs, experts, gpus, values, bias=None, expand=False):
    """Combine where rank d's row of token (s, t) is the constant values[d, s, t] (0 if absent);
    returns (hybrid, direct) channel 0 of every token as floats."""
    out = []
    for hybrid in (True, False):
        xs = [np.zeros((len(a), H), BF16) for a in idxs]
        results = ref.dispatch(xs, idxs, num_experts=experts, gpus_per_node=gpus, hybrid=hybrid)
        ys = []
        for d, r in enumerate(results):
            tmax = r.num_max_tokens_per_rank
            ys.append(np.array([[values.get((d, *divmod(int(g), tmax)), 0.0)] * H
                                for g in r.recv_src_metadata[:, 0]], np.float32)
                      .reshape(-1, H).astype(BF16))
        got = ref.combine(ys, results, bias=bias)
        out.append([c.combined_x[:, 0].astype(np.float32).tolist() for c in got])
    return out


def test_hybrid_rounds_once_per_node_2x2():
    # Token 0 of rank 0 picks experts 2, 1, 3: rank 2 (node 1, slot 0), rank 1 (node 0, slot 1),
    # rank 3 (node 1, slot 2). Rows: 1, 2**-8, 2**-8.
    # Direct: 0 + 1 + 2**-8 + 2**-8 = 1 + 2**-7 in float32, a bf16: 1.0078125.
    # Hybrid: node 1 = bf16(1 + 2**-8) = 1 (a tie, to even); node 0 = 2**-8; at the origin,
    # node 0 (node master 1) then node 1 (node master 2): 2**-8 + 1 -> bf16 1.
    idxs = [np.array([[2, 1, 3]]), np.array([[-1, -1, -1]]), np.array([[-1, -1, -1]]),
            np.array([[-1, -1, -1]])]
    values = {(2, 0, 0): 1.0, (1, 0, 0): HALF_ULP_AT_ONE, (3, 0, 0): HALF_ULP_AT_ONE}
    hybrid, direct = combine_by_value(idxs, 4, 2, values)
    assert hybrid[0] == [1.0] and direct[0] == [1.0078125]


def test_hybrid_adds_nodes_in_node_master_order_2x2():
    # Token 0 of rank 1 picks experts 0, 2, 1: node 0 holds slots 0 and 2 (ranks 0, 1), node 1
    # slot 1 (rank 2), so node 1 comes first (node master 1 < 2), though node 0 has the lowest
    # slot. Rows: rank 0: 2**-24, rank 2: -1, rank 1: 0; bias 1.
    # Hybrid: node 0 = bf16(2**-24 + 0) = 2**-24; 1 + (-1) + 2**-24 = 2**-24.
    # Nodes by lowest slot, or direct (ranks 0, 2, 1): 1 + 2**-24 = 1 (a tie), - 1, + 0 = 0.
    idxs = [np.array([[-1, -1, -1]]), np.array([[0, 2, 1]]), np.array([[-1, -1, -1]]),
            np.array([[-1, -1, -1]])]
    values = {(0, 1, 0): TINY, (2, 1, 0): -1.0, (1, 1, 0): 0.0}
    bias = [None, (np.ones((1, H), BF16),), None, None]
    hybrid, direct = combine_by_value(idxs, 4, 2, values, bias=bias)
    assert hybrid[1] == [TINY] and direct[1] == [0.0]


def test_hybrid_node_sum_in_rank_master_order_2x4():
    # 2 x 4, one expert per rank. Token 0 of rank 4 picks experts 3, 1, 2, 5: node 0 gets ranks
    # 3, 1, 2 (slots 0, 1, 2), node 1 rank 5 (slot 3). Rows 1, 2**-24, -1, 0.
    # Node 0 in master order: (1 + 2**-24) + -1 = 0; by rank index: (2**-24 - 1) + 1 = 2**-24.
    # Token 1 of rank 4 picks 6, 0, 7: node 1 (rank 4's own: it is the forwarder) ranks 6, 7
    # (slots 0, 2), node 0 rank 0 (slot 1); rows 1, 2**-8, 2**-8. Direct: 1 + 2**-8 + 2**-8 =
    # 1.0078125. Hybrid: node 1 = bf16(1 + 2**-8) = 1, rounded at the origin's own node too;
    # node 0 (master 1) then node 1 (master 2): 2**-8 + 1 -> 1.
    idxs = [np.full((1, 4), -1) for _ in range(8)]
    idxs[4] = np.array([[3, 1, 2, 5], [6, 0, 7, -1]])
    values = {(3, 4, 0): 1.0, (1, 4, 0): TINY, (2, 4, 0): -1.0, (5, 4, 0): 0.0,
              (6, 4, 1): 1.0, (0, 4, 1): HALF_ULP_AT_ONE, (7, 4, 1): HALF_ULP_AT_ONE}
    hybrid, direct = combine_by_value(idxs, 8, 4, values)
    assert hybrid[4] == [0.0, 1.0]
    assert direct[4] == [0.0, 1.0078125]


def test_hybrid_expanded_combine_by_hand():
    # 2 x 2 with two experts per rank, expanded: stage 1 sums a rank's rows of a token first.
    # Token 0 of rank 0 picks experts 4, 5, 2 (slots 0, 1 on rank 2, slot 2 on rank 1):
    # rank 2's rows 1 and 2**-8 -> stage 1: bf16(1 + 2**-8) = 1; rank 1's row 2**-8.
    # Hybrid: node 1 = 1, node 0 = 2**-8; origin: node 1 (master 1), node 0 (master 2) -> 1.
    idxs = [np.array([[4, 5, 2]]), np.full((1, 3), -1), np.full((1, 3), -1), np.full((1, 3), -1)]
    xs = [np.zeros((1, H), BF16) for _ in idxs]
    results = ref.dispatch(xs, idxs, num_experts=8, gpus_per_node=2, hybrid=True, expand=True)
    ys = [np.zeros(r.recv_x.shape, BF16) for r in results]
    row = results[2].recv_src_metadata[0, 2:]  # slots 0 and 1 on rank 2
    ys[2][row[0]] = 1.0
    ys[2][row[1]] = HALF_ULP_AT_ONE
    ys[1][results[1].recv_src_metadata[0, 4]] = HALF_ULP_AT_ONE
    got = ref.combine(ys, results)
    assert got[0].combined_x[0, 0].astype(np.float32) == 1.0


def test_hybrid_combine_refuses_single_reduction_and_mismatched_topology():
    results = dispatch_2x2(gpus_per_node=2, hybrid=True)
    ys = [r.recv_x for r in results]
    with pytest.raises(ValueError, match=r"allow_multiple_reduction: False is not supported: "
                                         r"hybrid combine reduces per node"):
        ref.combine(ys, results, allow_multiple_reduction=False)
    direct = dispatch_2x2()
    with pytest.raises(ValueError, match=r"allow_multiple_reduction: False is not supported"):
        ref.combine([r.recv_x for r in direct], direct, allow_multiple_reduction=False)
    with pytest.raises(TypeError, match=r"allow_multiple_reduction: expected bool"):
        ref.combine(ys, results, allow_multiple_reduction=None)
    with pytest.raises(ValueError, match=r"hybrid: False does not match the handles"):
        ref.combine(ys, results, hybrid=False)
    with pytest.raises(ValueError, match=r"gpus_per_node: 1 does not match the handles"):
        ref.combine(ys, results, gpus_per_node=1)
    with pytest.raises(ValueError, match=r"hybrid: True does not match the handles"):
        ref.combine([r.recv_x for r in direct], direct, hybrid=True)
    with pytest.raises(ValueError, match=r"handles\[1\]: gpus_per_node/hybrid \(4, False\)"):
        ref.combine(ys, [results[0], direct[1], results[2], results[3]])
    # Values that agree with the handles are accepted.
    want = ref.combine(ys, results)
    again = ref.combine(ys, results, gpus_per_node=2, hybrid=True)
    for a, b in zip(want, again):
        assert_bitwise_equal(a.combined_x, b.combined_x)


class Bare:
    """A handle with the routing fields only (a kernel's object without the topology)."""

    def __init__(self, result):
        for f in ("num_ranks", "num_experts", "num_max_tokens_per_rank", "expand", "topk_idx",
                  "recv_x", "recv_src_metadata", "num_recv_tokens_per_expert_list",
                  "num_unaligned_recv_tokens_per_expert"):
            setattr(self, f, getattr(result, f))


def test_combine_of_handles_without_topology_takes_the_arguments():
    results = dispatch_2x2(gpus_per_node=2, hybrid=True)
    ys = [r.recv_x for r in results]
    bare = [Bare(r) for r in results]
    want = ref.combine(ys, results)
    got = ref.combine(ys, bare, gpus_per_node=2, hybrid=True)
    for a, b in zip(want, got):
        assert_bitwise_equal(a.combined_x, b.combined_x)
    with pytest.raises(ValueError, match=r"hybrid: needs more than one node"):
        ref.combine(ys, bare, hybrid=True)


# ----------------------------------------------------------------------------
# check_hybrid_metadata
# ----------------------------------------------------------------------------


def with_kernel_column_1(results, tmax, gpus, topk):
    """Column 1 as a kernel might write it: each forwarder numbers the tokens of each source
    in reverse token order (its atomics' choice), the same item at every receiver."""
    local = results[0].num_experts // results[0].num_ranks
    out = []
    for d, r in enumerate(results):
        meta = r.recv_src_metadata.copy()
        for i, gid in enumerate(meta[:, 0]):
            s, t = divmod(int(gid), tmax)
            row = results[s].topk_idx[t]
            node = d // gpus
            # The source's tokens with an expert in this node, numbered from the last.
            sent = [u for u in range(len(results[s].topk_idx))
                    if any(e >= 0 and e // local // gpus == node for e in results[s].topk_idx[u])]
            slot = len(sent) - 1 - sent.index(t)
            master = max(j for j, e in enumerate(row) if e >= 0 and e // local == d)
            meta[i, 1] = ((s // gpus) * tmax + slot) * topk + master
        out.append(dataclasses.replace(r, recv_src_metadata=meta))
    return out


def test_check_hybrid_metadata_accepts_a_kernels_column_1():
    want = dispatch_2x2(gpus_per_node=2, hybrid=True)
    got = with_kernel_column_1(want, 2, 2, 2)
    # By hand for rank 0 (K = 2, Tmax = 2, item = node(src) * 2 + slot at the forwarder):
    # gid 0 (rank 0 token 0: rank 0 sends only it to node 0, slot 0; node 0; master 0) -> 0;
    # gid 4 (rank 2 token 0, slot 0, node 1, master 1) -> (2 + 0) * 2 + 1 = 5;
    # gid 7 (rank 3 token 1: rank 3 sends tokens 0 and 1 to node 0, numbered from the last, so
    # slot 0; node 1; master 0) -> 4.
    assert got[0].recv_src_metadata[:, 1].tolist() == [0, 5, 4]
    ref.check_hybrid_metadata(got, want)
    ref.check_hybrid_metadata(got, want, gpus_per_node=2)
    shuffled, _ = simulate_kernel_order(got, seed=11)
    ref.check_hybrid_metadata(shuffled, want)


@pytest.mark.parametrize("topology", TOPOLOGIES[:3], ids=TOPOLOGY_IDS[:3])
def test_check_hybrid_metadata_accepts_random_worlds(topology):
    nodes, gpus, experts, topk, tmax, _ = topology
    _, xs, idxs, _ = random_world(8, nodes, gpus, experts, topk, tmax)
    want = ref.dispatch(xs, idxs, num_experts=experts, gpus_per_node=gpus, hybrid=True)
    got, _ = simulate_kernel_order(with_kernel_column_1(want, tmax, gpus, topk), seed=9)
    ref.check_hybrid_metadata(got, want)


def corrupt(results, rank, row, column, value):
    out = list(results)
    meta = out[rank].recv_src_metadata.copy()
    meta[row, column] = value
    out[rank] = dataclasses.replace(out[rank], recv_src_metadata=meta)
    return out


def swap_rows(results, rank, a, b):
    out = list(results)
    meta = out[rank].recv_src_metadata.copy()
    meta[[a, b]] = meta[[b, a]]
    out[rank] = dataclasses.replace(out[rank], recv_src_metadata=meta)
    return out


WANT_2X2 = dispatch_2x2(gpus_per_node=2, hybrid=True)
GOOD_2X2 = with_kernel_column_1(WANT_2X2, 2, 2, 2)

METADATA_ERRORS = {
    "reference-minus-one": (
        WANT_2X2, r"results\[0\].recv_src_metadata\[0\] \(token 0 of rank 0\): column 1 is -1"),
    # Rank 0's row 1 is gid 4 with master slot 1: slot 0 instead.
    "wrong-master-slot": (
        corrupt(GOOD_2X2, 0, 1, 1, 4),
        r"results\[0\].recv_src_metadata\[1\] \(token 0 of rank 2\): column 1 = 4 decodes to "
        r"slot 0, expected 1"),
    # gid 4 comes from node 1; item 1 is node 0's.
    "wrong-node": (
        corrupt(GOOD_2X2, 0, 1, 1, 1 * 2 + 1),
        r"decodes to item 1 of node 0, expected node\(src\) = 1"),
    # gid 7 reaches ranks 0 and 1 through forwarder 1 (node 0, index 1): two items.
    "two-items-for-one-token": (
        corrupt(GOOD_2X2, 1, 2, 1, (2 + 1) * 2 + 1),
        r"results\[0\].recv_src_metadata\[2\] and results\[1\].recv_src_metadata\[2\]: token 1 "
        r"of rank 3 has items 2 and 3 at forwarder 1"),
    # gid 6 (rank 3 token 0, at rank 1 through forwarder 1) takes gid 7's item 2.
    "one-item-for-two-tokens": (
        corrupt(GOOD_2X2, 1, 1, 1, 2 * 2 + 1),
        r"token 0 of rank 3 and token 1 of rank 3 share item 2 at forwarder 1"),
    # Rank 0: gid 4 (index 0) and gid 7 (index 1) trade places across the groups.
    "row-in-the-wrong-group": (
        swap_rows(GOOD_2X2, 0, 1, 2),
        r"results\[0\].recv_src_metadata\[1\] \(token 1 of rank 3\): forwarder index lsa\(3\) = 1, "
        r"but the row is in forwarder group 0"),
    "psum": (
        [dataclasses.replace(GOOD_2X2[0], psum_num_recv_tokens_per_scaleup_rank=np.array(
            [1, 3], np.int32))] + GOOD_2X2[1:],
        r"results\[0\].psum_num_recv_tokens_per_scaleup_rank: \[1, 3\], expected \[2, 3\]"),
    "other-tokens": (
        corrupt(GOOD_2X2, 2, 0, 0, 5),
        r"results\[2\].recv_src_metadata\[:, 0\]: the source ids are not the reference's"),
}


@pytest.mark.parametrize("results, match", METADATA_ERRORS.values(), ids=METADATA_ERRORS.keys())
def test_check_hybrid_metadata_finds(results, match):
    with pytest.raises(ValueError, match=match):
        ref.check_hybrid_metadata(results, WANT_2X2)


def test_check_hybrid_metadata_argument_errors():
    with pytest.raises(ValueError, match=r"handles: not a hybrid dispatch"):
        ref.check_hybrid_metadata(GOOD_2X2, dispatch_2x2(gpus_per_node=2))
    with pytest.raises(ValueError, match=r"gpus_per_node: 4 does not match the handles"):
        ref.check_hybrid_metadata(GOOD_2X2, WANT_2X2, gpus_per_node=4)
    with pytest.raises(ValueError, match=r"results: expected 4 entries"):
        ref.check_hybrid_metadata(GOOD_2X2[:3], WANT_2X2)
    with pytest.raises(TypeError, match=r"results\[0\]: expected a dispatch result"):
        ref.check_hybrid_metadata([r.recv_src_metadata for r in GOOD_2X2], WANT_2X2)
    short = [dataclasses.replace(GOOD_2X2[0], recv_src_metadata=GOOD_2X2[0].recv_src_metadata[:2])]
    with pytest.raises(ValueError, match=r"results\[0\].recv_src_metadata: expected int array "
                                         r"of shape \[3, 4\]"):
        ref.check_hybrid_metadata(short + GOOD_2X2[1:], WANT_2X2)


# ----------------------------------------------------------------------------
# expected_network_bytes
# ----------------------------------------------------------------------------


def test_network_bytes_2x2_by_hand():
    # Node 0 = ranks 0, 1; node 1 = ranks 2, 3. Per token, its destination ranks:
    #   rank 0: t0 -> {0, 3}, t1 -> {2}; rank 1: t0 -> {1, 3}; rank 2: t0 -> {3, 0}, t1 -> none;
    #   rank 3: t0 -> {2, 1}, t1 -> {0, 1}.
    # Direct, remote ranks only: 0->3, 0->2, 1->3, 2->0, 3->1, 3->0, 3->1.
    direct = ref.expected_network_bytes(IDX_2X2, 4, 2, "direct", 100)
    assert direct.dtype == np.int64
    assert direct.tolist() == [[0, 0, 100, 100],
                               [0, 0, 0, 100],
                               [100, 0, 0, 0],
                               [100, 200, 0, 0]]
    # Hybrid, once per (token, remote node), to the rail peer D * 2 + lsa(src):
    # rank 0's t0 and t1 -> node 1 -> rank 2; rank 1's t0 -> node 1 -> rank 3;
    # rank 2's t0 -> node 0 -> rank 0; rank 3's t0 and t1 -> node 0 -> rank 1.
    hybrid = ref.expected_network_bytes(IDX_2X2, 4, 2, "hybrid", 100)
    assert hybrid.tolist() == [[0, 0, 200, 0],
                               [0, 0, 0, 100],
                               [100, 0, 0, 0],
                               [0, 200, 0, 0]]
    # One node: nothing crosses.
    assert not ref.expected_network_bytes(IDX_2X2, 4, None, "direct", 100).any()
    assert not ref.expected_network_bytes(IDX_2X2, 4, 4, "direct", 100).any()


def test_network_bytes_2x4_by_hand():
    # IDX_2X4, one token per rank: rank 1 -> {5, 2}, rank 2 -> {3, 5}, rank 5 -> {0, 6},
    # rank 7 -> {1, 5} cross nodes; ranks 0, 3 (node 0) and 4, 6 (node 1) stay in their node.
    want = np.zeros((8, 8), np.int64)
    want[1, 5] = want[2, 5] = want[5, 0] = want[7, 1] = 7  # direct: each remote rank
    assert ref.expected_network_bytes(IDX_2X4, 8, 4, "direct", 7).tolist() == want.tolist()
    want = np.zeros((8, 8), np.int64)
    # Hybrid: to the rail peer D * 4 + lsa(src): 1 -> 5, 2 -> 6, 5 -> 1, 7 -> 3.
    want[1, 5] = want[2, 6] = want[5, 1] = want[7, 3] = 7
    assert ref.expected_network_bytes(IDX_2X4, 8, 4, "hybrid", 7).tolist() == want.tolist()
    # A token with two experts on node 1 crosses once in hybrid mode, twice in direct mode.
    idxs = [np.array([[4, 6]])] + [np.zeros((0, 2), np.int64)] * 7
    assert ref.expected_network_bytes(idxs, 8, 4, "direct", 1)[0].tolist() == [0] * 4 + [1, 0, 1, 0]
    assert ref.expected_network_bytes(idxs, 8, 4, "hybrid", 1)[0].tolist() == [0] * 4 + [1, 0, 0, 0]


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=TOPOLOGY_IDS)
def test_network_bytes_match_loop(topology):
    nodes, gpus, experts, topk, tmax, _ = topology
    _, _, idxs, _ = random_world(10, nodes, gpus, experts, topk, tmax)
    ranks, local = nodes * gpus, experts // (nodes * gpus)
    direct = np.zeros((ranks, ranks), np.int64)
    hybrid = np.zeros((ranks, ranks), np.int64)
    for s, idx in enumerate(idxs):
        for row in idx:
            dests = {int(e) // local for e in row if e >= 0}
            for d in dests:
                if d // gpus != s // gpus:
                    direct[s, d] += 3
            for node in {d // gpus for d in dests} - {s // gpus}:
                hybrid[s, node * gpus + s % gpus] += 3
    assert ref.expected_network_bytes(idxs, experts, gpus, "direct", 3).tolist() == direct.tolist()
    assert ref.expected_network_bytes(idxs, experts, gpus, "hybrid", 3).tolist() == hybrid.tolist()


# ----------------------------------------------------------------------------
# Argument errors name the argument
# ----------------------------------------------------------------------------


def _dispatch(**kw):
    xs = [x.astype(BF16) for x in xs_for(IDX_2X2)]
    args = dict(num_experts=4)
    args.update(kw)
    return lambda: ref.dispatch(xs, IDX_2X2, **args)


def _empty_world(ranks, **kw):
    xs = [np.zeros((0, 8), BF16)] * ranks
    idxs = [np.zeros((0, 1), np.int64)] * ranks
    return lambda: ref.dispatch(xs, idxs, num_experts=ranks, **kw)


def _bytes(idxs=IDX_2X2, experts=4, gpus=2, mode="hybrid", record=16):
    return lambda: ref.expected_network_bytes(idxs, experts, gpus, mode, record)


ARGUMENT_ERRORS = {
    "gpus-not-dividing": (_dispatch(gpus_per_node=3), ValueError,
                          r"gpus_per_node: 3 does not divide the 4 ranks"),
    "gpus-more-than-ranks": (_dispatch(gpus_per_node=8), ValueError,
                             r"gpus_per_node: 8 does not divide the 4 ranks"),
    "gpus-zero": (_dispatch(gpus_per_node=0), ValueError, r"gpus_per_node: expected int >= 1"),
    "gpus-float": (_dispatch(gpus_per_node=2.0), TypeError, r"gpus_per_node: expected int"),
    "hybrid-one-node-default": (_dispatch(hybrid=True), ValueError,
                                r"hybrid: needs more than one node, but gpus_per_node \(4\) == "
                                r"number of ranks \(4\); use hybrid=False"),
    "hybrid-one-node": (_dispatch(hybrid=True, gpus_per_node=4), ValueError,
                        r"hybrid: needs more than one node"),
    "hybrid-not-bool": (_dispatch(hybrid="yes", gpus_per_node=2), TypeError,
                        r"hybrid: expected bool, got str"),
    "hybrid-too-many-nodes": (_empty_world(66, gpus_per_node=2, hybrid=True), ValueError,
                              r"hybrid: at most 32 nodes, got 33"),
    "hybrid-too-many-gpus": (_empty_world(130, gpus_per_node=65, hybrid=True), ValueError,
                             r"gpus_per_node: hybrid allows at most 64 GPUs per node, got 65"),
    "hybrid-metadata-overflow": (_dispatch(gpus_per_node=2, hybrid=True,
                                           num_max_tokens_per_rank=536870800), ValueError,
                                 r"num_max_tokens_per_rank: hybrid metadata column 1"),
    "bytes-mode": (_bytes(mode="both"), ValueError, r"mode: expected 'direct' or 'hybrid', "
                                                    r"got 'both'"),
    "bytes-mode-none": (_bytes(mode=None), ValueError, r"mode: expected"),
    "bytes-record-zero": (_bytes(record=0), ValueError, r"record_bytes: expected int >= 1"),
    "bytes-gpus": (_bytes(gpus=3), ValueError, r"gpus_per_node: 3 does not divide the 4 ranks"),
    "bytes-hybrid-one-node": (_bytes(gpus=4), ValueError, r"hybrid: needs more than one node"),
    "bytes-not-a-list": (_bytes(idxs=np.zeros((4, 2, 2), np.int64)), TypeError,
                         r"topk_idx_per_rank: expected a non-empty list"),
    "bytes-empty": (_bytes(idxs=[]), TypeError, r"topk_idx_per_rank: expected a non-empty list"),
    "bytes-bad-expert": (_bytes(idxs=IDX_2X2[:3] + [np.array([[4, 0]])]), ValueError,
                         r"topk_idx_per_rank\[3\]: expert id 4"),
    "bytes-experts": (_bytes(experts=6), ValueError, r"num_experts: 6 is not divisible"),
}


@pytest.mark.parametrize("call, exc, match", ARGUMENT_ERRORS.values(), ids=ARGUMENT_ERRORS.keys())
def test_argument_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_hybrid_limits_themselves_are_accepted():
    assert (ref.MAX_HYBRID_NODES, ref.MAX_HYBRID_GPUS_PER_NODE) == (32, 64)
    (r,) = _empty_world(64, gpus_per_node=2, hybrid=True)()[:1]
    assert r.psum_num_recv_tokens_per_scaleup_rank.tolist() == [0, 0]
    (r,) = _empty_world(128, gpus_per_node=64, hybrid=True)()[:1]
    assert r.psum_num_recv_tokens_per_scaleup_rank.shape == (64,)
    # N x Tmax x K at the element index bound.
    got = _dispatch(gpus_per_node=2, hybrid=True, num_max_tokens_per_rank=536870655)()
    assert got[0].num_max_tokens_per_rank == 536870655
