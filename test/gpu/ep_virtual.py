"""GPU check of convert-ep-to-comm on one GPU: R virtual ranks, against epic.reference.

Runs the kernels that epic-compile made from test/gpu/ep_kernels.mlir
(virtual backend) through CuPy: dispatch and combine, BF16 (weights, two
biases, then one) and FP8 (float32 scale packs, weights, no bias), the
expanded layout (128-row alignment with zero padding, and alignment 1) and
its combine, and cached dispatches of every layout, with token counts at and
below the maximum, masked top-k slots and tokens routed nowhere. Dispatch
must match the reference as sets (the order inside a source rank's group is
the order of slot atomics): after sorting by source id every row, pack, id,
weight and metadata entry is bitwise equal, and the counts and prefix sums
are exact. Combine must be bitwise equal to the reference's fixed-order fp32
sum.

    python3 test/gpu/ep_virtual.py <kernels.cubin> <kernels.json> [ranks (default 8)]
"""
import ctypes
import json
import os
import re
import sys
from dataclasses import replace

import cupy as cp
import ml_dtypes
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
from epic import reference as ref  # noqa: E402

R, E, K, H, TMAX = 8, 64, 6, 2048, 512
L = E // R
P = 16
THREADS = 256
failures = 0


def check(ok, what):
    global failures
    print(f"  {what:<66} {'ok' if ok else 'FAILED'}")
    failures += not ok


def bits_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def descriptor(kind, **values):
    """The bytes of EpicVirtualComm (kind "VCOMM") or EpicVirtualWindow ("VWIN") with `values`
    (pointers as ints), laid out from the one list of their fields,
    runtime/include/epic/device/VirtualWorld.def (C's natural alignment, as ctypes')."""
    types = {"I32": ctypes.c_int32, "U64": ctypes.c_uint64, "U64_PTR": ctypes.c_uint64,
             "CHAR_PTR": ctypes.c_uint64}
    with open(os.path.join(ROOT, "runtime", "include", "epic", "device",
                           "VirtualWorld.def")) as f:
        fields = re.findall(rf"^EPIC_{kind}_FIELD\(\w+, (\w+), (\w+)\)", f.read(), re.M)
    struct = type(kind, (ctypes.Structure,), {"_fields_": [(n, types[t]) for n, t in fields]})
    missing = set(values) - {n for n, _ in fields}
    assert fields and not missing, f"VirtualWorld.def has no {kind} field(s) {missing}"
    return cp.asarray(np.frombuffer(bytes(struct(**values)), np.uint8))


class VirtualWorld:
    """EpicVirtualComm + one window of R slices: one node of R GPUs, as the runtime builds it
    (runtime/lib/VirtualBuffer.cpp)."""

    def __init__(self, window_bytes, barriers=64):
        self.stride = (window_bytes + 4095) // 4096 * 4096
        self.window = cp.zeros(R * self.stride, dtype=cp.uint8)
        self.signals = cp.zeros(R * 4, dtype=cp.uint64)
        self.counters = cp.zeros(R, dtype=cp.uint64)
        # Each team kind's indices: the world's, the one node's LSA team's, R rails'.
        self.barriers = cp.zeros(barriers * (1 + 1 + R), dtype=cp.uint64)
        self.comm = descriptor("VCOMM", num_ranks=R, num_contexts=1, num_signals=4,
                               num_counters=1, num_barriers=barriers, lsa_size=R,
                               signals=self.signals.data.ptr, counters=self.counters.data.ptr,
                               barriers=self.barriers.data.ptr, traffic=0,
                               drop_network_from=-1, gin_mode=0, drop_spares_signal=-1,
                               reserved=0)
        self.window_desc = descriptor("VWIN", base=self.window.data.ptr, stride=self.stride,
                                      num_ranks=R)


def params_table(fields, records, stride):
    """One record of `stride` bytes per rank: each field a pointer (device array) or an int.
    The kernels take the table by value (comm.param_table): it stays in host memory. The
    records hold every rank's cap (max_tokens_per_rank), which static-cap kernels ignore."""
    table = np.zeros((R, stride // 8), np.uint64)
    for r, record in enumerate(records):
        for name, value in dict(record, max_tokens_per_rank=TMAX).items():
            i = fields.index(name)
            table[r, i] = value.data.ptr if isinstance(value, cp.ndarray) else np.uint64(value)
    return table


def handle_buffers(tokens):
    """What a non-cached dispatch writes besides the data: the handle and the counts."""
    return {
        "recv_src_metadata": cp.full((R * TMAX, K + 2), -7, cp.int32),
        "psum_num_recv_tokens_per_rank": cp.zeros(R, cp.int32),
        "num_recv_tokens_per_expert": cp.zeros(L, cp.int32),
        "psum_num_recv_tokens_per_expert": cp.zeros(L, cp.int32),
        "host_counts": cp.zeros(1 + L, cp.int32),
        "num_tokens": tokens,
        "dst_buffer_slot_idx": cp.full((tokens, K), -7, cp.int32),
    }


_driver = ctypes.CDLL("libcuda.so.1")


def launch(module, name, world, params, blocks_per_rank):
    """The kernel with (device communicator, window descriptor, the table by value)."""
    kernel = module.get_function(name)
    kernel = getattr(kernel, "kernel", kernel)  # cupy's RawKernel holds the driver's Function
    comm = ctypes.c_uint64(world.comm.data.ptr)
    window = ctypes.c_uint64(world.window_desc.data.ptr)
    args = (ctypes.c_void_p * 3)(ctypes.addressof(comm), ctypes.addressof(window),
                                 params.ctypes.data)
    result = _driver.cuLaunchKernel(ctypes.c_void_p(kernel.ptr), R * blocks_per_rank, 1, 1,
                                    THREADS, 1, 1, 0, None, args, None)
    assert result == 0, f"cuLaunchKernel({name}) failed: CUresult {result}"
    cp.cuda.runtime.deviceSynchronize()


def launch_entry(module, entry, world, params, blocks_per_rank):
    """The entry's kernels in order (a cached dispatch on this backend is one kernel)."""
    for name in entry["kernels"]:
        launch(module, name, world, params, blocks_per_rank)


def token_counts(step):
    """Rank 1 at num_max_tokens_per_rank, every other rank below it."""
    return [TMAX if r == 1 else TMAX - step * (r + 1) for r in range(R)]


def make_routing(rng, tokens):
    scores = rng.random((tokens, E))
    idx = np.argsort(-scores, axis=1)[:, :K].astype(np.int64)
    idx[rng.random(idx.shape) < 0.1] = -1  # masked slots
    idx[rng.random(tokens) < 0.03] = -1  # tokens routed nowhere
    return idx


def run(module, entries, fp8, blocks_per_rank, seed):
    name = "fp8" if fp8 else "bf16"
    print(f"{name}: {R} virtual ranks x {blocks_per_rank} blocks x {THREADS} threads, "
          f"E={E} K={K} H={H} Tmax={TMAX}")
    rng = np.random.default_rng(seed)
    tokens = token_counts(37)
    idxs = [make_routing(rng, t) for t in tokens]
    ws = [rng.standard_normal((t, K)).astype(np.float32) for t in tokens]
    if fp8:
        casts = [ref.per_token_cast_to_fp8(rng.standard_normal((t, H)).astype(np.float32))
                 for t in tokens]
        xs = [c[0] for c in casts]
        sfs = [c[1] for c in casts]
    else:
        xs = [rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16) for t in tokens]
        sfs = None
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=E, num_max_tokens_per_rank=TMAX)

    d_entry, c_entry = entries[f"dispatch_{name}"], entries[f"combine_{name}"]
    world = VirtualWorld(max(d_entry["window_bytes"], c_entry["window_bytes"]))
    xbytes = xs[0].dtype.itemsize
    dev = []
    for r in range(R):
        a = {
            "x": cp.asarray(xs[r].view(np.uint8)), "topk_idx": cp.asarray(idxs[r]),
            "topk_weights": cp.asarray(ws[r]),
            "recv_x": cp.zeros((R * TMAX, H * xbytes), cp.uint8),
            "recv_topk_idx": cp.full((R * TMAX, K), -7, cp.int64),
            "recv_topk_weights": cp.zeros((R * TMAX, K), cp.float32),
            **handle_buffers(tokens[r]),
        }
        if fp8:
            a["scale_packs"] = cp.asarray(sfs[r])
            a["recv_scale_packs"] = cp.zeros((R * TMAX, P), cp.float32)
        dev.append(a)
    params = params_table(d_entry["param_fields"], dev, d_entry["param_stride"])
    launch_entry(module, d_entry, world, params, blocks_per_rank)

    results = []
    ok_counts = ok_rows = True
    for r in range(R):
        a, e = dev[r], expected[r]
        n = int(a["host_counts"][0])
        ok_counts &= n == e.num_recv_tokens
        ok_counts &= bits_equal(cp.asnumpy(a["psum_num_recv_tokens_per_rank"]),
                                e.psum_num_recv_tokens_per_scaleup_rank)
        ok_counts &= bits_equal(cp.asnumpy(a["num_recv_tokens_per_expert"]),
                                e.num_unaligned_recv_tokens_per_expert)
        ok_counts &= bits_equal(cp.asnumpy(a["psum_num_recv_tokens_per_expert"]),
                                e.psum_num_recv_tokens_per_expert)
        ok_counts &= (list(cp.asnumpy(a["host_counts"][1:]))
                      == list(e.num_recv_tokens_per_expert_list))
        got = replace(
            e,
            recv_x=cp.asnumpy(a["recv_x"][:n]).view(xs[0].dtype),
            recv_scale_packs=cp.asnumpy(a["recv_scale_packs"][:n]) if fp8 else None,
            recv_topk_idx=cp.asnumpy(a["recv_topk_idx"][:n]),
            recv_topk_weights=cp.asnumpy(a["recv_topk_weights"][:n]),
            recv_src_metadata=cp.asnumpy(a["recv_src_metadata"][:n]),
        )
        results.append(got)
        s = ref.sort_by_source(got)
        for field in ("recv_x", "recv_scale_packs", "recv_topk_idx", "recv_src_metadata"):
            ok_rows &= getattr(e, field) is None or bits_equal(getattr(s, field), getattr(e, field))
        masked = e.recv_topk_idx >= 0  # weights of slots not on this rank are unspecified
        ok_rows &= bits_equal(np.where(masked, s.recv_topk_weights, 0),
                              np.where(masked, e.recv_topk_weights, 0))
    check(ok_counts, "dispatch: token counts, prefix sums, per-expert counts exact")
    check(ok_rows, "dispatch: rows, packs, local ids, weights, metadata bitwise (as sets)")
    check(all(np.all(np.diff(ref.sort_by_source(g).recv_src_metadata[:, 0]) > 0) for g in results),
          "dispatch: every source token received at most once per rank")

    # Combine: each rank sends random bf16 rows (in its own received order) back.
    ys = [rng.standard_normal((g.num_recv_tokens, H)).astype(ml_dtypes.bfloat16) for g in results]
    back = [g.recv_topk_weights for g in results]
    biases = [(rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16),
               rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16))
              for t in tokens] if not fp8 else None
    want = ref.combine(ys, results, topk_weights=back, bias=biases)
    cdev = []
    for r in range(R):
        a = {
            "x": cp.asarray(ys[r].view(np.uint16)), "topk_weights": cp.asarray(back[r]),
            "recv_src_metadata": dev[r]["recv_src_metadata"],
            "psum_num_recv_tokens_per_rank": dev[r]["psum_num_recv_tokens_per_rank"],
            "topk_idx": dev[r]["topk_idx"],
            "dst_buffer_slot_idx": dev[r]["dst_buffer_slot_idx"],  # the one-pass gather's
            "combined_x": cp.full((tokens[r], H), 0x7FC1, cp.uint16),  # poisoned
            "combined_topk_weights": cp.full((tokens[r], K), np.nan, cp.float32),
            "num_tokens": tokens[r],
        }
        if biases:
            a["bias0"] = cp.asarray(biases[r][0].view(np.uint16))
            a["bias1"] = cp.asarray(biases[r][1].view(np.uint16))
        cdev.append(a)
    cparams = params_table(c_entry["param_fields"], cdev, c_entry["param_stride"])
    launch_entry(module, c_entry, world, cparams, blocks_per_rank)
    ok_x = all(bits_equal(cp.asnumpy(cdev[r]["combined_x"]).view(ml_dtypes.bfloat16),
                          want[r].combined_x)
               for r in range(R))
    ok_w = all(bits_equal(cp.asnumpy(cdev[r]["combined_topk_weights"]),
                          want[r].combined_topk_weights)
               for r in range(R))
    check(ok_x, "combine: combined_x bitwise equal to the fixed-order fp32 reference")
    check(ok_w, "combine: combined_topk_weights equal the original weights")
    check(all(bits_equal(want[r].combined_topk_weights, np.where(idxs[r] >= 0, ws[r], 0))
              for r in range(R)),
          "combine: (reference) weights round-trip to the dispatch's weights")
    if biases:  # the same rows back with one bias
        want1 = ref.combine(ys, results, topk_weights=back, bias=[(b[0],) for b in biases])
        b1_entry = entries["combine_bf16_b1"]
        for a in cdev:
            a.pop("bias1")
            a["combined_x"].fill(0x7FC1)
        b1_params = params_table(b1_entry["param_fields"], cdev, b1_entry["param_stride"])
        launch_entry(module, b1_entry, world, b1_params, blocks_per_rank)
        check(all(bits_equal(cp.asnumpy(cdev[r]["combined_x"]).view(ml_dtypes.bfloat16),
                             want1[r].combined_x)
                  for r in range(R)), "combine with one bias: bitwise equal to the reference")
    # Counters must be back to zero for the next call: run the same dispatch again.
    launch_entry(module, d_entry, world, params, blocks_per_rank)
    check(all(int(dev[r]["host_counts"][0]) == expected[r].num_recv_tokens for r in range(R)),
          "dispatch again on the same window: same counts (workspace back to zero)")
    if not fp8:
        run_cached(module, entries["dispatch_bf16_cached"], world, dev, results, idxs, tokens,
                   blocks_per_rank, rng, expand=False)


def run_cached(module, entry, world, dev, first, idxs, tokens, blocks_per_rank, rng, expand,
               zero_padding=None):
    """Cached dispatch of new data with the handle of `first`: same rows, no count exchange."""
    xs = [rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16) for t in tokens]
    want = ref.dispatch(xs, idxs, num_experts=E, num_max_tokens_per_rank=TMAX,
                        expert_alignment=first[0].expert_alignment, expand=expand,
                        zero_padding=expand if zero_padding is None else zero_padding)
    cached = []
    for r in range(R):
        rows = first[r].recv_x.shape[0]
        a = dict(dev[r])  # the handle: routing, slots, prefix sums, counts, metadata
        a["x"] = cp.asarray(xs[r].view(np.uint8))
        a["recv_x"] = cp.full((rows, H * 2), 0x5A, cp.uint8)  # poisoned
        if not expand:
            a["recv_topk_idx"] = cp.full((rows, K), -7, cp.int64)
        a["host_counts"] = cp.full(1 + L, -7, cp.int32)  # a cached dispatch does not count
        cached.append(a)
    params = params_table(entry["param_fields"], cached, entry["param_stride"])
    launch_entry(module, entry, world, params, blocks_per_rank)
    ok = True
    for r in range(R):
        # The handle on the device (the latest non-cached dispatch wrote it).
        meta = cp.asnumpy(dev[r]["recv_src_metadata"][:first[r].num_recv_tokens])
        got = replace(first[r], recv_x=cp.asnumpy(cached[r]["recv_x"]).view(ml_dtypes.bfloat16),
                      recv_topk_weights=None, recv_scale_packs=None, recv_src_metadata=meta,
                      recv_topk_idx=None if expand else cp.asnumpy(cached[r]["recv_topk_idx"]))
        s, e = ref.sort_by_source(got), want[r]
        ok &= (bits_equal(s.recv_x, e.recv_x)
               and bits_equal(s.recv_src_metadata, e.recv_src_metadata))
        if not expand:
            ok &= bits_equal(s.recv_topk_idx, e.recv_topk_idx)
        ok &= int(cached[r]["host_counts"][0]) == -7
    check(ok, f"cached {'expanded ' if expand else ''}dispatch: "
              "new rows land where the handle says")


def run_expanded(module, entries, blocks_per_rank, seed, A=128, zero_padding=True, suffix=""):
    print(f"expanded: {R} virtual ranks x {blocks_per_rank} blocks, alignment {A}"
          f"{', zero padding' if zero_padding else ''}")
    rng = np.random.default_rng(seed)
    tokens = token_counts(29)
    idxs = [make_routing(rng, t) for t in tokens]
    ws = [rng.standard_normal((t, K)).astype(np.float32) for t in tokens]
    xs = [rng.standard_normal((t, H)).astype(ml_dtypes.bfloat16) for t in tokens]
    expected = ref.dispatch(xs, idxs, ws, num_experts=E, num_max_tokens_per_rank=TMAX,
                            expert_alignment=A, expand=True, zero_padding=zero_padding)
    d_entry, c_entry = entries[f"dispatch_exp{suffix}"], entries[f"combine_exp{suffix}"]
    world = VirtualWorld(max(d_entry["window_bytes"], c_entry["window_bytes"]))
    max_rows = -(-(R * TMAX * min(K, L) + (A - 1) * L) // A) * A
    dev = []
    for r in range(R):
        dev.append({
            "x": cp.asarray(xs[r].view(np.uint8)), "topk_idx": cp.asarray(idxs[r]),
            "topk_weights": cp.asarray(ws[r]),
            # poisoned: padding must be zeroed
            "recv_x": cp.full((max_rows, H * 2), 0x5A, cp.uint8),
            "recv_topk_weights": cp.full(max_rows, np.nan, cp.float32),
            **handle_buffers(tokens[r]),
        })
    params = params_table(d_entry["param_fields"], dev, d_entry["param_stride"])
    launch_entry(module, d_entry, world, params, blocks_per_rank)
    results = []
    ok_counts = ok_rows = True
    for r in range(R):
        a, e = dev[r], expected[r]
        n = int(a["host_counts"][0])
        rows = int(cp.asnumpy(a["host_counts"][1:]).sum())
        ok_counts &= n == e.num_recv_tokens and rows == e.num_expanded_tokens
        ok_counts &= bits_equal(cp.asnumpy(a["num_recv_tokens_per_expert"]),
                                e.num_unaligned_recv_tokens_per_expert)
        ok_counts &= bits_equal(cp.asnumpy(a["psum_num_recv_tokens_per_expert"]),
                                e.psum_num_recv_tokens_per_expert)
        got = replace(e, recv_x=cp.asnumpy(a["recv_x"][:rows]).view(ml_dtypes.bfloat16),
                      recv_topk_weights=cp.asnumpy(a["recv_topk_weights"][:rows]),
                      recv_src_metadata=cp.asnumpy(a["recv_src_metadata"][:n]))
        results.append(got)
        s = ref.sort_by_source(got)
        for field in ("recv_x", "recv_topk_weights", "recv_src_metadata"):
            ok_rows &= bits_equal(getattr(s, field), getattr(e, field))
    check(ok_counts, "expanded dispatch: counts, expanded rows, per-expert prefix sums exact")
    check(ok_rows, "expanded dispatch: rows by expert, zero padding, weights, metadata (as sets)")

    ys = [rng.standard_normal((g.recv_x.shape[0], H)).astype(ml_dtypes.bfloat16) for g in results]
    back = [g.recv_topk_weights for g in results]
    want = ref.combine(ys, results, topk_weights=back)
    cdev = []
    for r in range(R):
        cdev.append({
            "x": cp.asarray(ys[r].view(np.uint16)), "topk_weights": cp.asarray(back[r]),
            "recv_src_metadata": dev[r]["recv_src_metadata"],
            "psum_num_recv_tokens_per_rank": dev[r]["psum_num_recv_tokens_per_rank"],
            "topk_idx": dev[r]["topk_idx"],
            "dst_buffer_slot_idx": dev[r]["dst_buffer_slot_idx"],  # the one-pass gather's
            "combined_x": cp.full((tokens[r], H), 0x7FC1, cp.uint16),
            "combined_topk_weights": cp.full((tokens[r], K), np.nan, cp.float32),
            "num_tokens": tokens[r],
        })
    cparams = params_table(c_entry["param_fields"], cdev, c_entry["param_stride"])
    launch_entry(module, c_entry, world, cparams, blocks_per_rank)
    check(all(bits_equal(cp.asnumpy(cdev[r]["combined_x"]).view(ml_dtypes.bfloat16),
                         want[r].combined_x)
              for r in range(R)),
          "expanded combine: per-rank fp32 sums, then the origin's, bitwise")
    check(all(bits_equal(cp.asnumpy(cdev[r]["combined_topk_weights"]),
                         want[r].combined_topk_weights)
              for r in range(R)), "expanded combine: combined_topk_weights")
    run_cached(module, entries[f"dispatch_exp{suffix}_cached"], world, dev, results, idxs, tokens,
               blocks_per_rank, rng, expand=True, zero_padding=zero_padding)


def main():
    global R, E, L
    cubin, meta = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:  # the kernels compiled for another world size, 8 experts per rank
        R = int(sys.argv[3])
        E, L = 8 * R, 8
    entries = {e["name"]: e for e in json.load(open(meta))["entries"]}
    module = cp.RawModule(path=cubin)
    run(module, entries, fp8=False, blocks_per_rank=4, seed=1)
    run(module, entries, fp8=True, blocks_per_rank=3, seed=2)
    run_expanded(module, entries, blocks_per_rank=4, seed=3)
    run_expanded(module, entries, blocks_per_rank=4, seed=4, A=1, zero_padding=False, suffix="1")
    print("ep virtual:", "passed" if failures == 0 else f"FAILED ({failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
