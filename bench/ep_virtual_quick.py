"""First timing of convert-ep-to-comm's kernels: DeepEP's V3 configuration on 8 virtual ranks.

Not the benchmark instrument (that is bench/ep_bench.py): a quick measurement of
where the first kernels stand, run on one H200 through CuPy. It models the staged
dispatch (send + copy), which the virtual backend no longer compiles (one pass):
it refuses a cubin whose dispatch is count + scatter.

    python3 bench/ep_virtual_quick.py <v3 virtual cubin> <its json>

Prints, per blocks-per-rank setting, the median time of each kernel over
repeated launches (CUDA events; inputs rotate between two sets; an L2-sized
buffer is rewritten before each launch), DeepEP's logical bandwidth per rank,
the bytes each kernel really moves and that against the device copy
bandwidth measured in the same run.
"""
import json
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, "test/gpu")
import ep_virtual as ev  # noqa: E402

R, E, K, H, P, TMAX = 8, 256, 8, 7168, 56, 4096
L = E // R
ev.R, ev.E, ev.K, ev.H, ev.P, ev.TMAX, ev.L = R, E, K, H, P, TMAX, L


def copy_bandwidth():
    src = cp.zeros(2 << 30, cp.uint8)
    dst = cp.empty_like(src)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(10):
        start.record()
        dst[...] = src
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return 2 * src.nbytes / np.median(times)


def launch(module, name, world, params, blocks_per_rank):
    """Like the test's launch, without the synchronization (the events time it)."""
    module.get_function(name)((R * blocks_per_rank,), (ev.THREADS,),
                              (np.uint64(world.comm.data.ptr),
                               np.uint64(world.window_desc.data.ptr),
                               np.uint64(params.data.ptr)))


def timed(fn, flush, repeats=20):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(repeats):
        flush[...] = i
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def main():
    cubin, meta = sys.argv[1], sys.argv[2]
    entries = {e["name"]: e for e in json.load(open(meta))["entries"]}
    module = cp.RawModule(path=cubin)
    rng = np.random.default_rng(0)
    peak = copy_bandwidth()
    print(f"device copy bandwidth (read + write): {peak / 1e9:.0f} GB/s")
    flush = cp.empty(256 << 20, cp.uint8)
    d, c = entries["dispatch"], entries["combine"]
    if not d["kernels"][0].endswith("_send"):
        # Its byte model is the staged dispatch's (records, then a copy epilogue).
        sys.exit(f"ep_virtual_quick: the dispatch here is {d['kernels']} (one pass on the "
                 "virtual backend), not the staged send + copy this quick timing models; "
                 "bench/ep_bench.py measures it")
    world = ev.VirtualWorld(max(d["window_bytes"], c["window_bytes"]), barriers=132)
    tokens = TMAX
    dev = []
    for r in range(R):
        idx = np.argsort(-rng.random((tokens, E)), axis=1)[:, :K].astype(np.int64)
        dev.append({
            "x": cp.asarray(rng.integers(0, 255, (tokens, H), dtype=np.uint8)),
            "scale_packs": cp.asarray(rng.random((tokens, P), dtype=np.float32)),
            "topk_idx": cp.asarray(idx),
            "topk_weights": cp.asarray(rng.random((tokens, K), dtype=np.float32)),
            "recv_x": cp.empty((R * TMAX, H), cp.uint8),
            "recv_scale_packs": cp.empty((R * TMAX, P), cp.float32),
            "recv_topk_idx": cp.empty((R * TMAX, K), cp.int64),
            "recv_topk_weights": cp.empty((R * TMAX, K), cp.float32),
            **ev.handle_buffers(tokens),
        })
    params = ev.params_table(d["param_fields"], dev)
    results = []
    # Every rank's blocks must be resident together (entry barriers): keep
    # R * blocks under what the register use allows per SM.
    for blocks in [int(b) for b in os.environ.get("EPIC_BENCH_BLOCKS", "4,8,16").split(",")]:
        send = timed(lambda: launch(module, d["kernels"][0], world, params, blocks), flush)
        copy = timed(lambda: launch(module, d["kernels"][1], world, params, blocks), flush)
        n_recv = [int(a["host_counts"][0]) for a in dev]
        rows = sum(n_recv)
        b_d = H + 4 * P + 8 * K + 4 * K  # DeepEP's logical bytes per received token
        rec_bytes = H + 4 * P + 8 * K + 8  # what one record carries
        # read the row (once per destination), write the record
        send_bytes = rows * (H + 4 * P + rec_bytes)
        copy_bytes = rows * (rec_bytes + H + 4 * P + 8 * K + 4 * K + 4 * (K + 2))
        ys = [cp.asarray(rng.integers(0, 255, (n, 2 * H), dtype=np.uint8)) for n in n_recv]
        cdev = []
        for r in range(R):
            cdev.append({
                "x": ys[r], "topk_weights": dev[r]["recv_topk_weights"],
                "recv_src_metadata": dev[r]["recv_src_metadata"],
                "psum_num_recv_tokens_per_rank": dev[r]["psum_num_recv_tokens_per_rank"],
                "topk_idx": dev[r]["topk_idx"],
                "combined_x": cp.empty((tokens, H), cp.uint16),
                "combined_topk_weights": cp.empty((tokens, K), cp.float32), "num_tokens": tokens,
            })
        cparams = ev.params_table(c["param_fields"], cdev)
        csend = timed(lambda: launch(module, c["kernels"][0], world, cparams, blocks), flush)
        reduce = timed(lambda: launch(module, c["kernels"][1], world, cparams, blocks), flush)
        b_c = 2 * H + 4 * K
        csend_bytes = rows * (2 * H + 2 * H + 4 * K + 4 * K)
        reduce_bytes = rows * 2 * H + R * tokens * 2 * H
        line = {
            "blocks_per_rank": blocks, "received_rows": rows,
            "dispatch_send_ms": send * 1e3, "dispatch_copy_ms": copy * 1e3,
            "combine_send_ms": csend * 1e3, "combine_reduce_ms": reduce * 1e3,
            "dispatch_logical_GBps_per_rank": b_d * rows / R / (send + copy) / 1e9,
            "combine_logical_GBps_per_rank": b_c * rows / R / (csend + reduce) / 1e9,
            "send_fraction_of_copy_bw": send_bytes / send / peak,
            "copy_fraction_of_copy_bw": copy_bytes / copy / peak,
            "combine_send_fraction_of_copy_bw": csend_bytes / csend / peak,
            "reduce_fraction_of_copy_bw": reduce_bytes / reduce / peak,
        }
        results.append(line)
        print(json.dumps(line))
    print(f"{'blocks/rank':>11} {'send ms':>8} {'copy ms':>8} {'c.send':>8} {'reduce':>8} "
          f"{'disp GB/s/rank':>15} {'comb GB/s/rank':>15}")
    for row in results:
        print(f"{row['blocks_per_rank']:>11} {row['dispatch_send_ms']:>8.3f} "
              f"{row['dispatch_copy_ms']:>8.3f} "
              f"{row['combine_send_ms']:>8.3f} {row['combine_reduce_ms']:>8.3f} "
              f"{row['dispatch_logical_GBps_per_rank']:>15.1f} "
              f"{row['combine_logical_GBps_per_rank']:>15.1f}")


if __name__ == "__main__":
    main()
