"""Direct and hybrid mode across nodes on one GPU: a virtual world of N nodes x M ranks (issue 21).

The runtime's virtual ElasticBuffer with a node topology (`gpus_per_node`) runs the kernels of
configurations with `scaleup_ranks = M`: ranks of a node reach each other through peer
pointers, other nodes through GIN puts and signals, which the virtual world emulates and
counts. Direct mode sends to every rank itself; hybrid mode sends a token once per destination
node, to its forwarder there (the rail peer), which forwards it over NVLink, and the combine
reduces per node at the forwarder. Checked against epic.reference with the same topology:

- dispatch, BF16 (weights) and FP8 (float32 scale packs, weights), plain and expanded (128-row
  alignment, zero padding): rows, packs, ids, weights and metadata bitwise as sets, counts and
  prefix sums exact; a cached dispatch of new rows (plain and expanded) lands where the handle
  says;
- combine with weights and 0, 1 or 2 biases (plain), and of the expanded layout: bitwise equal
  to the reference's fixed-order fp32 sum;
- hybrid: the rows grouped by forwarder index and recv_src_metadata column 1 (item x K +
  master slot) checked by epic.reference.check_hybrid_metadata; the other columns bitwise; the
  combine's three-stage order (rank, node at the forwarder, origin) bitwise;
- the bytes put between nodes (the virtual world's traffic counters, kind 0) equal
  epic.reference.expected_network_bytes(..., mode, record bytes) for each dispatch and (the
  transpose, combine record bytes) each combine; no GIN traffic of any kind inside a node.

    python3 test/gpu/ep_multinode.py --prepare [--nodes N --gpus-per-node M]   # compile only
    python3 test/gpu/ep_multinode.py [--nodes N --gpus-per-node M] [--mode direct|hybrid]

Without --nodes, the worlds 2x4, 4x2 and 2x2; without --mode, both modes. The kernels come from
the cache (EPIC_CACHE_DIR) that --prepare fills where the compiler is (tools/device/prepare.sh).

It needs the virtual world's topology (issue 21, stage 3): epic._C.Buffer.virtual_world(...,
gpus_per_node=M) and Buffer.take_traffic() ([R][R][3] counts: put bytes, put_value bytes, signal
operations). A buffer of another node split (one node of all ranks) refuses these kernels by
name before a launch.
"""
import argparse
import sys
from dataclasses import replace

import ml_dtypes
import numpy as np

sys.path.insert(0, "python")
import epic._C as C  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic.handle import HANDLE_SLOTS  # noqa: E402

K, H, TMAX = 6, 2048, 128
LOCAL = 8  # experts per rank
BLOCKS = 4  # per rank
WORLDS = [(2, 4), (4, 2), (2, 2)]
failures = 0


def check(ok, what):
    global failures
    print(f"  {what:<72} {'ok' if ok else 'FAILED'}", flush=True)
    failures += not ok


def bits_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def spec_of(ranks, gpus_per_node, hybrid, dtype="bf16", expand=False, alignment=1, packs=0):
    return dict(num_ranks=ranks, num_experts=LOCAL * ranks, num_topk=K, hidden=H, dtype=dtype,
                num_scale_packs=packs, expert_alignment=alignment, do_expand=expand,
                num_max_tokens_per_rank=TMAX, num_scaleup_ranks=gpus_per_node, hybrid=hybrid,
                timeout_ms=20000)


def kernel_sets(ranks, m, hybrid):
    """(name, spec, dispatch variant, cached variant, combine variants) of every case."""
    bf16 = spec_of(ranks, m, hybrid)
    fp8 = spec_of(ranks, m, hybrid, "f8E4M3FN", packs=H // 128)
    exp = spec_of(ranks, m, hybrid, expand=True, alignment=128)
    return [
        ("bf16", bf16, dict(weights=True, cached=False, zero_padding=False),
         dict(weights=False, cached=True, zero_padding=False),
         [dict(weights=True, biases=b) for b in (2, 1, 0)]),
        ("fp8", fp8, dict(weights=True, cached=False, zero_padding=False), None,
         [dict(weights=True, biases=0)]),
        ("expanded", exp, dict(weights=True, cached=False, zero_padding=True),
         dict(weights=False, cached=True, zero_padding=True), [dict(weights=True, biases=0)]),
    ]


def prepare(worlds, modes):
    runtime = C.Runtime("virtual", "", "")
    count = 0
    for (n, m), mode in ((w, mode) for w in worlds for mode in modes):
        for _, spec, dv, cv, cvs in kernel_sets(n * m, m, mode == "hybrid"):
            kinds = [("dispatch", dv), ("dispatch", cv)] + [("combine", v) for v in cvs]
            for kind, variant in kinds:
                if variant is not None:
                    runtime.kernels(spec, variant, kind)
                    count += 1
    spec, dv, cv = stall_specs()  # --stall-forwarder's
    runtime.kernels(spec, dv, "dispatch")
    runtime.kernels(spec, cv, "combine")
    count += 2
    print(f"ep_multinode: {count} kernel sets in {runtime.cache_dir}")
    return 0


# --- the runtime's calls ------------------------------------------------------------------


def torch_dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32,
            "i64": torch.int64, "f8E4M3FN": torch.float8_e4m3fn}[name]


def poisoned(shape, dtype):
    """A device tensor of `dtype` (the runtime's name) whose bytes are all 0x5A: outputs a
    kernel must write (zero padding included) cannot pass by being left alone."""
    import torch

    t = torch.empty(tuple(shape), dtype=torch_dtype(dtype), device="cuda")
    t.view(torch.uint8).fill_(0x5A)
    return t


def runtime_tensor(t, name):
    """(DLPack capsule, dtype name) as the runtime takes it (floats viewed as integers)."""
    import torch

    if t.dtype.is_floating_point:
        t = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])
    return (t.__dlpack__(), name)


DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float32": "f32", "torch.int32": "i32",
               "torch.int64": "i64", "torch.float8_e4m3fn": "f8E4M3FN"}


class World:
    def __init__(self, n, m):
        self.n, self.m, self.ranks = n, m, n * m
        self.runtime = C.Runtime("virtual", "", "")
        self.buffer = None

    def make_buffer(self, metas, short_of_staging=False, one_node=False):
        """A buffer whose window fits every entry: window_bytes + per token x Tmax + per warp x
        the launch's warps (launch metadata); `short_of_staging`: without the staging;
        `one_node`: a world of one node of all ranks (not the kernels' split)."""
        need = max(e["window_bytes"] + e.get("window_bytes_per_token", 0) * TMAX
                   + (0 if short_of_staging else
                      e.get("window_bytes_per_warp", 0) * BLOCKS * (e["threads"] // 32))
                   for e in metas)
        self.buffer = C.Buffer.virtual_world(self.runtime, self.ranks, need, BLOCKS,
                                             gpus_per_node=self.ranks if one_node else self.m)
        check(self.buffer.gpus_per_node == (self.ranks if one_node else self.m),
              "the buffer's world has the nodes asked for")
        self.buffer.take_traffic()  # from zero

    def run(self, kind, spec, variant, calls):
        """One op: plan with every rank's tensors, launch on the current stream, wait."""
        import torch

        slots = C.slots(kind)
        runtime_calls = [{name: runtime_tensor(t, DTYPE_NAMES[str(t.dtype)])
                          for name, t in call.items() if t is not None} for call in calls]
        plan = self.buffer.plan(kind, spec, variant, runtime_calls, BLOCKS)
        addresses = [call[s].data_ptr() if call.get(s) is not None else 0
                     for call in calls for s in slots]
        plan.launch(addresses, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()

    def traffic(self):
        """[R][R][3] GIN traffic since the last call (put bytes, put_value bytes, signals)."""
        t = np.asarray(self.buffer.take_traffic(), dtype=np.int64)
        assert t.shape == (self.ranks, self.ranks, 3), t.shape
        return t

    def same_node(self):
        nodes = np.arange(self.ranks) // self.m
        return nodes[:, None] == nodes[None, :]


def check_traffic(world, traffic, expected, what):
    check(bits_equal(traffic[:, :, 0], expected), f"{what}: bytes put between nodes as expected")
    check(not traffic[world.same_node()].any(), f"{what}: no GIN traffic inside a node")


# --- the cases ----------------------------------------------------------------------------


def run_case(world, name, spec, dvariant, cvariant, combines, seed):
    import torch

    R, M = world.ranks, world.m
    E, A = spec["num_experts"], spec["expert_alignment"]
    hybrid = spec["hybrid"]
    mode = "hybrid" if hybrid else "direct"
    fp8, expand = spec["dtype"] != "bf16", spec["do_expand"]
    records = C.record_bytes(spec)
    print(f"{name} ({mode}): {world.n} nodes x {M} ranks, {BLOCKS} blocks per rank, E={E} K={K} "
          f"H={H} Tmax={TMAX}", flush=True)
    rng = np.random.default_rng(seed)
    tokens = [TMAX if r == 1 else TMAX - 13 * (r + 1) % TMAX for r in range(R)]
    idxs = []
    for t in tokens:
        idx = np.argsort(-rng.random((t, E)), axis=1)[:, :K].astype(np.int64)
        idx[rng.random(idx.shape) < 0.1] = -1  # masked slots
        idx[rng.random(t) < 0.03] = -1  # tokens routed nowhere
        idxs.append(idx)
    ws = [rng.standard_normal((t, K)).astype(np.float32) for t in tokens]
    if fp8:
        casts = [ref.per_token_cast_to_fp8(rng.standard_normal((t, H)).astype(np.float32))
                 for t in tokens]
        xs, sfs = [c[0] for c in casts], [c[1] for c in casts]
    else:
        xs, sfs = [rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16) for t in tokens], None
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=E, num_max_tokens_per_rank=TMAX,
                            expert_alignment=A, expand=expand, zero_padding=expand,
                            gpus_per_node=M, hybrid=hybrid)

    def gpu(a, dtype=None):
        t = torch.from_numpy(np.ascontiguousarray(a.view(np.uint8) if dtype else a)).cuda()
        return t.view(dtype) if dtype else t

    xdtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    calls = []
    for r in range(R):
        call = {"x": gpu(xs[r], xdtype), "topk_idx": gpu(idxs[r]), "topk_weights": gpu(ws[r])}
        if fp8:
            call["x_scale_packs"] = gpu(sfs[r])
        for out, dtype, shape in C.outputs("dispatch", spec, dvariant, tokens[r]):
            call[out] = poisoned(shape, dtype)
        calls.append(call)
    metas = [json_entry(world, spec, dvariant, "dispatch")] + \
        [json_entry(world, spec, v, "combine") for v in combines]
    if cvariant:
        metas.append(json_entry(world, spec, cvariant, "dispatch"))
    if name == "bf16":  # a window without room for the staging is refused, naming it
        world.make_buffer(metas, short_of_staging=True)
        try:
            world.run("dispatch", spec, dvariant, calls)
            refused = ""
        except ValueError as e:
            refused = str(e)
        check("blocks per rank (staging for other nodes)" in refused,
              "a window without the staging per warp is refused before a launch")
        world.make_buffer(metas, one_node=True)  # kernels of N nodes on a world of one
        try:
            world.run("dispatch", spec, dvariant, calls)
            refused = ""
        except ValueError as e:
            refused = str(e)
        check(f"num_scaleup_ranks is {M}" in refused and f"1 node(s) of {R} ranks" in refused,
              f"a world of one node refuses kernels of {world.n} nodes, by name ({refused!r})")
    world.make_buffer(metas)
    world.run("dispatch", spec, dvariant, calls)

    results, ok_counts, ok_rows = [], True, True
    for r in range(R):
        a, e = calls[r], expected[r]
        host = a["host_counts"].cpu().numpy()
        n = int(host[0])
        ok_counts &= n == e.num_recv_tokens
        ok_counts &= list(host[1:]) == list(e.num_recv_tokens_per_expert_list)
        ok_counts &= bits_equal(a["psum_num_recv_tokens_per_rank"].cpu().numpy(),
                                e.psum_num_recv_tokens_per_scaleup_rank)
        ok_counts &= bits_equal(a["num_recv_tokens_per_expert"].cpu().numpy(),
                                e.num_unaligned_recv_tokens_per_expert)
        ok_counts &= bits_equal(a["psum_num_recv_tokens_per_expert"].cpu().numpy(),
                                e.psum_num_recv_tokens_per_expert)
        rows = e.num_expanded_tokens if expand else n
        got = replace(
            e,
            recv_x=a["recv_x"][:rows].view(torch.uint8).cpu().numpy().view(xs[0].dtype),
            recv_scale_packs=a["recv_x_scale_packs"][:rows].cpu().numpy() if fp8 else None,
            recv_topk_idx=None if expand else a["recv_topk_idx"][:n].cpu().numpy(),
            recv_topk_weights=a["recv_topk_weights"][:rows].cpu().numpy(),
            recv_src_metadata=a["recv_src_metadata"][:n].cpu().numpy())
        results.append(got)
        s = ref.sort_by_source(got)
        for field in ("recv_x", "recv_scale_packs", "recv_topk_idx"):
            ok_rows &= getattr(e, field) is None or bits_equal(getattr(s, field),
                                                                 getattr(e, field))
        # Hybrid: column 1 depends on the forwarders' atomics (check_hybrid_metadata below).
        meta, want_meta = s.recv_src_metadata.copy(), e.recv_src_metadata.copy()
        if hybrid:
            meta[:, 1] = want_meta[:, 1] = 0
        ok_rows &= bits_equal(meta, want_meta)
        if expand:
            ok_rows &= bits_equal(s.recv_topk_weights, e.recv_topk_weights)
        else:  # weights of slots not on this rank are unspecified
            owned = e.recv_topk_idx >= 0
            ok_rows &= bits_equal(np.where(owned, s.recv_topk_weights, 0),
                                  np.where(owned, e.recv_topk_weights, 0))
    check(ok_counts, "dispatch: token counts, prefix sums, per-expert counts exact")
    check(ok_rows, "dispatch: rows, packs, ids, weights, metadata bitwise (as sets)")
    if hybrid:
        try:
            ref.check_hybrid_metadata(results, expected)
            problem = ""
        except ValueError as err:
            problem = str(err)
        check(not problem, "dispatch: forwarder groups and metadata column 1 (item x K + master)"
              + (f": {problem}" if problem else ""))
    net = ref.expected_network_bytes(idxs, E, M, mode, records["dispatch"])
    check_traffic(world, world.traffic(), net, "dispatch")

    # Combine: random bf16 rows in each rank's received order back to their sources.
    ys = [rng.standard_normal((g.recv_x.shape[0], H)).astype(ml_dtypes.bfloat16) for g in results]
    back = [g.recv_topk_weights for g in results]
    handle = [h for h in HANDLE_SLOTS if h in calls[0]]  # hybrid: the forwarders' too
    for cv in combines:
        biases = [tuple(rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16)
                        for _ in range(cv["biases"])) for t in tokens]
        want = ref.combine(ys, results, topk_weights=back, bias=biases if cv["biases"] else None,
                           gpus_per_node=M, hybrid=hybrid)
        ccalls = []
        for r in range(R):
            call = {h: calls[r][h] for h in handle}
            call["x"] = gpu(ys[r], torch.bfloat16)
            call["topk_weights"] = gpu(back[r])
            for i, bias in enumerate(biases[r]):
                call[f"bias_{i}"] = gpu(bias, torch.bfloat16)
            for out, dtype, shape in C.outputs("combine", spec, cv, tokens[r]):
                call[out] = poisoned(shape, dtype)
            ccalls.append(call)
        world.run("combine", spec, cv, ccalls)
        what = f"combine, {cv['biases']} bias(es)"
        check(all(bits_equal(ccalls[r]["combined_x"].view(torch.int16).cpu().numpy(),
                             want[r].combined_x.view(np.int16)) for r in range(R)),
              f"{what}: combined_x bitwise equal to the fixed-order fp32 reference")
        check(all(bits_equal(ccalls[r]["combined_topk_weights"].cpu().numpy(),
                             want[r].combined_topk_weights) for r in range(R)),
              f"{what}: combined_topk_weights")
        crec = records["combine"] if cv["weights"] else records["combine_row"]
        check_traffic(world, world.traffic(),
                      ref.expected_network_bytes(idxs, E, M, mode, crec).T, what)

    if cvariant:  # the handle again, new rows: no count exchange, the same records
        xs2 = [rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16) for t in tokens]
        want = ref.dispatch(xs2, idxs, num_experts=E, num_max_tokens_per_rank=TMAX,
                            expert_alignment=A, expand=expand, zero_padding=expand,
                            gpus_per_node=M, hybrid=hybrid)
        cached = []
        for r in range(R):
            call = {h: calls[r][h] for h in handle}
            call["x"] = gpu(xs2[r], torch.bfloat16)
            for out, dtype, shape in C.outputs("dispatch", spec, cvariant, tokens[r]):
                call[out] = poisoned(shape, dtype)
            cached.append(call)
        world.run("dispatch", spec, cvariant, cached)
        ok = True
        for r in range(R):
            rows = results[r].recv_x.shape[0]
            got = replace(results[r], recv_x=cached[r]["recv_x"][:rows].view(torch.int16)
                          .cpu().numpy().view(ml_dtypes.bfloat16),
                          recv_topk_weights=None, recv_scale_packs=None,
                          recv_topk_idx=None if expand else
                          cached[r]["recv_topk_idx"][:results[r].num_recv_tokens].cpu().numpy())
            s, e = ref.sort_by_source(got), want[r]
            ok &= bits_equal(s.recv_x, e.recv_x)
            if not expand:
                ok &= bits_equal(s.recv_topk_idx, e.recv_topk_idx)
        check(ok, "cached dispatch: new rows land where the handle says")
        net = ref.expected_network_bytes(idxs, E, M, mode, records["dispatch"])
        check_traffic(world, world.traffic(), net, "cached dispatch")


STALL_WORLD, STALL_RANK, STALL_TIMEOUT_MS = (2, 2), 1, 2000


def stall_specs():
    """The stalled-forwarder run's kernels: hybrid 2x2, BF16, a 2 s bound on every wait."""
    n, m = STALL_WORLD
    spec = dict(spec_of(n * m, m, True), timeout_ms=STALL_TIMEOUT_MS)
    return spec, dict(weights=True, cached=False, zero_padding=False), dict(weights=True, biases=0)


def stall_forwarder():
    """A hybrid dispatch, then rank 1's network stalls (it still joins entry barriers): in the
    combine, rank 1 forwards for rank 3 (its rail peer in node 1), whose wait for rank 1's done
    signal (8 + R + 1) must time out naming rank 1; the kernel traps, the launch fails. Run as
    a process of its own (the CUDA context is lost); tools/device/run.sh greps the report."""
    import torch

    (n, m), stalled = STALL_WORLD, STALL_RANK
    world = World(n, m)
    spec, dv, cv = stall_specs()
    R, E = world.ranks, spec["num_experts"]
    world.make_buffer([json_entry(world, spec, dv, "dispatch"),
                       json_entry(world, spec, cv, "combine")])
    rng = np.random.default_rng(5)
    calls = []
    for r in range(R):
        t = TMAX // 2
        # Every token has experts in both nodes: each forwarder has work for every origin.
        idx = np.stack([rng.permutation(E)[:K] for _ in range(t)]).astype(np.int64)
        idx[:, 0], idx[:, 1] = rng.integers(0, E // n, t), rng.integers(E // n, E, t)
        idx[:, 2:] = -1
        call = {"x": torch.randn((t, H), dtype=torch.bfloat16, device="cuda"),
                "topk_idx": torch.from_numpy(idx).cuda(),
                "topk_weights": torch.rand((t, K), device="cuda")}
        for out, dtype, shape in C.outputs("dispatch", spec, dv, t):
            call[out] = poisoned(shape, dtype)
        calls.append(call)
    world.run("dispatch", spec, dv, calls)
    print("stall: the dispatch ran; rank", stalled, "stalls now (after the entry barrier)",
          flush=True)
    handle = [h for h in HANDLE_SLOTS if h in calls[0]]
    ccalls = []
    for r in range(R):
        call = {h: calls[r][h] for h in handle}
        call["x"] = torch.randn((calls[r]["recv_x"].shape[0], H), dtype=torch.bfloat16,
                                device="cuda")
        call["topk_weights"] = calls[r]["recv_topk_weights"]
        for out, dtype, shape in C.outputs("combine", spec, cv, calls[r]["x"].shape[0]):
            call[out] = poisoned(shape, dtype)
        ccalls.append(call)
    world.buffer.set_drop_network_from(stalled, after_entry=True)
    try:
        world.run("combine", spec, cv, ccalls)
    except Exception as e:  # the trap: the launch (or the sync after it) fails
        print(f"stall: the launch failed as it must: {type(e).__name__}: {e}", flush=True)
        return 0
    print("stall: FAILED: the combine finished although rank", stalled, "stalled")
    return 1


def json_entry(world, spec, variant, kind):
    import json

    return json.loads(world.runtime.kernels(spec, variant, kind)["metadata"])["entries"][0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--mode", choices=["direct", "hybrid"],
                        help="one mode only (default: both)")
    parser.add_argument("--prepare", action="store_true", help="compile the kernels only")
    parser.add_argument("--stall-forwarder", action="store_true",
                        help="hybrid 2x2: a forwarder stalls in the combine; its rail peer's "
                             "bounded wait must name it (the process's CUDA context is lost)")
    args = parser.parse_args()
    if (args.nodes is None) != (args.gpus_per_node is None):
        parser.error("--nodes and --gpus-per-node go together")
    worlds = [(args.nodes, args.gpus_per_node)] if args.nodes else WORLDS
    for n, m in worlds:
        if n < 2 or m < 1:
            parser.error(f"--nodes must be at least 2 and --gpus-per-node at least 1, got {n}x{m}")
    modes = [args.mode] if args.mode else ["direct", "hybrid"]
    if args.stall_forwarder:
        return stall_forwarder()
    if args.prepare:
        return prepare(worlds, modes)
    for seed, (n, m) in enumerate(worlds):
        world = World(n, m)
        for mode in modes:
            for i, (name, spec, dv, cv, cvs) in enumerate(kernel_sets(n * m, m, mode == "hybrid")):
                run_case(world, name, spec, dv, cv, cvs, seed=10 * seed + i)
    print("ep multinode:", "passed" if failures == 0 else f"FAILED ({failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
