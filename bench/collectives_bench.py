"""AGRS, PP and Engram: all-gather, reduce-scatter, ring send/recv and table fetches against
the copy rooflines and torch.

    python bench/collectives_bench.py [--out DIR]      # H200: runs, writes JSON + plot + log lines

Five measurements, each in this one process:

* **Virtual world of 8 ranks, all-gather**, per-rank tensors of 1 to 64 MiB: a session of 4
  all-gathers (DeepEP's test: 4 in flight), timed with CUDA events over the whole session
  (create, 4 all-gathers, their waits, destroy), median of 10 after 2 warm-ups. The copy
  engines move R x R x bytes per all-gather on one GPU; the roofline is one device-to-device
  copy of that many bytes (``torch`` ``copy_``, the same copy engines / HBM), timed the same
  way. Reported: bytes moved per second and its ratio to the roofline, and DeepEP's figure of
  merit ``bytes x R x inflight / t``.
* **Reduce-scatter, same world**: blocks moved by copy engines, the rank-order float32 sum on
  the current stream; against the best torch a skilled engineer writes for 8 virtual ranks
  (one stacked ``sum`` over ranks of the [R, R, n] inputs, one kernel, not rank-ordered) and
  against the bytes the sum must touch.
* **PP, virtual ring of 4 ranks**: every rank sends a tensor (1 to 56 MiB; DeepEP's test uses
  4096 x 7168 bf16 = 56 MiB) to its next neighbour and receives one from its previous, 4 in
  flight per direction: GPU time of 4 rounds. Each tensor is copied twice (into the receiver's
  slot, then out of it): bytes moved against the same copy roofline; DeepEP's send figure
  ``2 x bytes / t`` per rank.
* **Engram, virtual world of 4 ranks**: every rank fetches T x 24 random entries (256 bytes,
  bf16 hidden 128; DeepEP's test fetches 512 x 24) of the world's tables in host memory, fetch
  + wait timed with CUDA events. Against the host-to-device copy roofline of the same bytes (one
  pinned-memory copy: the rows come over the same link) and, for scale, a torch gather from a
  table in GPU memory. Reported: GB/s, its ratio to the roofline, million fetches per second.
* **API overhead on one NCCL rank**: the wall time of one small all-gather (4 KiB) + wait on
  epic's buffer against ``torch.distributed.all_gather_into_tensor`` on a one-rank NCCL group,
  host clock, synchronized, median of 200.

One GPU serves every virtual rank, so "NVLink" is HBM: the ratios say how close the copy-engine
path comes to the device's copy rate, not NVLink's. Writes collectives-<gpu>-<date>.{json,png}.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import epic  # noqa: E402
from multinode_bench import gpu_ms  # noqa: E402  (CUDA-event and wall medians)

R, INFLIGHT = 8, 4
SIZES_MIB = (1, 4, 16, 64)


# (GPU ms from CUDA events, wall ms), medians of 10 after 2 warm-ups.
timed = functools.partial(gpu_ms, iters=10, warmup=2)


def copy_roofline_ms(nbytes):
    """GPU ms of one device-to-device copy of `nbytes` (what the copy engines and HBM give)."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src))[0]


def all_gather_rows():
    import torch

    rows = []
    group = epic.VirtualWorld(R)
    for mib in SIZES_MIB:
        elements = (mib << 20) // 2
        session = INFLIGHT * epic.ElasticBuffer.get_agrs_num_max_session_bytes(
            group, (elements,), torch.bfloat16)
        buffer = epic.ElasticBuffer(group, num_bytes=epic.ElasticBuffer.get_agrs_buffer_size_hint(
            group, session), explicitly_destroy=True)
        buffer.agrs_set_config(session, INFLIGHT)
        xs = [[torch.randn(elements, device="cuda").to(torch.bfloat16) for _ in range(R)]
              for _ in range(INFLIGHT)]

        def one_session():
            with buffer.agrs_new_session():
                handles = [buffer.all_gather(x)[1] for x in xs]
                for h in handles:
                    h()

        ms, wall = timed(one_session)
        moved = INFLIGHT * R * R * (mib << 20)  # every rank's tensor into every rank's window
        copy_ms = copy_roofline_ms(moved)
        buffer.destroy()
        row = dict(op="all_gather", mib_per_rank=mib, session_gpu_ms=ms, session_wall_ms=wall,
                   bytes_moved=moved, gbs=moved / ms / 1e6, roofline_gbs=moved / copy_ms / 1e6,
                   deepep_gbs=(mib << 20) * R * INFLIGHT / ms / 1e6)
        row["x_roofline"] = row["gbs"] / row["roofline_gbs"]
        rows.append(row)
        print(f"all_gather {mib:>3} MiB/rank x {R} ranks x {INFLIGHT}: {ms:.3f} ms/session "
              f"({wall:.3f} wall), {row['gbs']:.0f} GB/s moved, roofline {row['roofline_gbs']:.0f}"
              f" GB/s ({row['x_roofline']:.2f}x), DeepEP's bytes*R*inflight/t "
              f"{row['deepep_gbs']:.0f} GB/s", flush=True)
    return rows


def reduce_scatter_rows():
    import torch

    rows = []
    group = epic.VirtualWorld(R)
    for mib in SIZES_MIB:
        elements = (mib << 20) // 2
        session = 2 * epic.ElasticBuffer.get_agrs_num_max_session_bytes(
            group, (elements // R,), torch.bfloat16)
        buffer = epic.ElasticBuffer(group, num_bytes=epic.ElasticBuffer.get_agrs_buffer_size_hint(
            group, session), explicitly_destroy=True)
        buffer.agrs_set_config(session, 2)
        xs = [torch.randn(elements, device="cuda").to(torch.bfloat16) for _ in range(R)]

        def one():
            with buffer.agrs_new_session():
                _, handle = buffer.reduce_scatter(xs)
                handle()

        ms, wall = timed(one)
        stacked = torch.stack(xs).view(R, R, elements // R)

        def baseline():  # every rank's block r summed (one kernel), what a torch user writes
            return stacked.float().sum(0).to(torch.bfloat16)

        base_ms, base_wall = timed(baseline)
        buffer.destroy()
        # The floor: the blocks moved once (R x bytes read and written) and summed once (read).
        copy_ms = copy_roofline_ms(3 * R * (mib << 20) // 2)
        row = dict(op="reduce_scatter", mib_per_rank=mib, gpu_ms=ms, wall_ms=wall,
                   torch_stacked_sum_gpu_ms=base_ms, torch_stacked_sum_wall_ms=base_wall,
                   floor_ms=copy_ms * 2, x_torch=base_ms / ms, x_floor=copy_ms * 2 / ms)
        rows.append(row)
        print(f"reduce_scatter {mib:>3} MiB/rank x {R}: {ms:.3f} ms ({wall:.3f} wall); torch "
              f"stacked sum {base_ms:.3f} ms -> {row['x_torch']:.2f}x; floor {row['floor_ms']:.3f}"
              f" ms ({row['x_floor']:.2f}x)", flush=True)
    return rows


def pp_rows(ranks=4, inflight=4):
    import torch

    rows = []
    for mib in (1, 8, 56):
        nbytes = mib << 20
        buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_bytes=epic.ElasticBuffer.
                                    get_pp_buffer_size_hint(nbytes, inflight),
                                    explicitly_destroy=True)
        buffer.pp_set_config(nbytes, inflight)
        xs = [torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16) for _ in range(ranks)]
        outs = [torch.empty_like(x) for x in xs]
        nxt = [(r + 1) % ranks for r in range(ranks)]
        prv = [(r - 1) % ranks for r in range(ranks)]

        def rounds():  # 4 tensors to every next neighbour, then 4 received from every previous
            for _ in range(inflight):
                buffer.pp_send(xs, nxt)
            for _ in range(inflight):
                buffer.pp_recv(outs, prv)

        ms, wall = timed(rounds)
        assert all(torch.equal(outs[r], xs[prv[r]]) for r in range(ranks))
        moved = 2 * ranks * inflight * nbytes
        copy_ms = copy_roofline_ms(moved)
        buffer.destroy()
        row = dict(op="pp", mib=mib, ranks=ranks, inflight=inflight, gpu_ms=ms, wall_ms=wall,
                   gbs=moved / ms / 1e6, roofline_gbs=moved / copy_ms / 1e6,
                   deepep_send_gbs=2 * nbytes * inflight / ms / 1e6)
        row["x_roofline"] = row["gbs"] / row["roofline_gbs"]
        rows.append(row)
        print(f"pp {mib:>3} MiB x {ranks} ranks x {inflight} in flight: {ms:.3f} ms ({wall:.3f} "
              f"wall), {row['gbs']:.0f} GB/s moved, roofline {row['roofline_gbs']:.0f} GB/s "
              f"({row['x_roofline']:.2f}x)", flush=True)
    return rows


def overhead_row():
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    group = dist.group.WORLD
    x = torch.randn(2048, device="cuda").to(torch.bfloat16)  # 4 KiB
    out = torch.empty(1, 2048, dtype=torch.bfloat16, device="cuda")
    session = 64 * epic.ElasticBuffer.get_agrs_num_max_session_bytes(group, x.shape, x.dtype)
    buffer = epic.ElasticBuffer(group, num_bytes=epic.ElasticBuffer.get_agrs_buffer_size_hint(
        group, session), explicitly_destroy=True)
    buffer.agrs_set_config(session, 32)

    def wall_us(fn, iters=200):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        walls = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(walls)

    torch_us = wall_us(lambda: dist.all_gather_into_tensor(out, x, group=group))
    buffer.create_agrs_session()
    count = [0]

    def ours():
        if count[0] == 32:  # a session holds 32 all-gathers: a new one, as a user would
            buffer.destroy_agrs_session()
            buffer.create_agrs_session()
            count[0] = 0
        count[0] += 1
        buffer.all_gather(x)[1]()

    epic_us = wall_us(ours)
    buffer.destroy_agrs_session()
    buffer.destroy()
    dist.destroy_process_group()
    row = dict(op="api_overhead_one_nccl_rank", bytes=4096, epic_wall_us=epic_us,
               torch_all_gather_into_tensor_wall_us=torch_us, x_torch=torch_us / epic_us)
    print(f"one NCCL rank, 4 KiB all-gather + wait: epic {epic_us:.1f} us, torch "
          f"all_gather_into_tensor {torch_us:.1f} us ({row['x_torch']:.2f}x)", flush=True)
    return row


def engram_rows(ranks=4, entries=65536, hidden=128):
    """Engram fetches on a virtual world: every rank fetches T x M random entries of the world's
    table (bf16, hidden 128: 256-byte entries in host memory). Against the host-to-device copy
    roofline of the same bytes (one pinned-memory copy) and a torch gather from a table in GPU
    memory (what the fetch would cost if the table fit the GPU)."""
    import torch

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    group = epic.VirtualWorld(ranks)
    gpu, cpu = epic.ElasticBuffer.get_engram_storage_size_hint(entries, hidden, 4096 * 24)
    buffer = epic.ElasticBuffer(group, num_bytes=2 << 20, num_cpu_bytes=cpu,
                                explicitly_destroy=True)
    tables = [torch.randn((entries, hidden), generator=gen, device="cuda").to(torch.bfloat16)
              for _ in range(ranks)]
    buffer.engram_write(tables)
    world = torch.cat(tables)
    for tokens, m in ((64, 24), (512, 24), (4096, 24)):
        idxs = [torch.randint(0, ranks * entries, (tokens, m), generator=gen, device="cuda",
                              dtype=torch.int32) for _ in range(ranks)]
        ms, wall = timed(lambda: buffer.engram_fetch(idxs)())
        moved = ranks * tokens * m * hidden * 2
        host = torch.empty(moved // 2, dtype=torch.bfloat16).pin_memory()
        dev = torch.empty(moved // 2, dtype=torch.bfloat16, device="cuda")
        h2d_ms = timed(lambda: dev.copy_(host, non_blocking=True))[0]
        flat = [i.view(-1).long() for i in idxs]
        torch_ms = timed(lambda: [world.index_select(0, f) for f in flat])[0]
        row = dict(op="engram_fetch", ranks=ranks, tokens=tokens, entries_per_token=m,
                   bytes=moved, gpu_ms=ms, wall_ms=wall, gbs=moved / ms / 1e6,
                   h2d_roofline_gbs=moved / h2d_ms / 1e6,
                   mfetch_per_s=ranks * tokens * m / ms / 1e3,
                   torch_gpu_table_gather_ms=torch_ms)
        row["x_roofline"] = row["gbs"] / row["h2d_roofline_gbs"]
        rows.append(row)
        print(f"engram_fetch {ranks} ranks x {tokens}x{m} entries of {hidden * 2} B: {ms:.3f} ms "
              f"({wall:.3f} wall), {row['gbs']:.1f} GB/s, H2D roofline "
              f"{row['h2d_roofline_gbs']:.1f} GB/s ({row['x_roofline']:.2f}x), "
              f"{row['mfetch_per_s']:.0f} M fetches/s; torch gather from a GPU table "
              f"{torch_ms:.3f} ms", flush=True)
    buffer.destroy()
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ag = [r for r in rows if r["op"] == "all_gather"]
    a.plot([r["mib_per_rank"] for r in ag], [r["gbs"] for r in ag], "o-", label="AGRS all_gather")
    a.plot([r["mib_per_rank"] for r in ag], [r["roofline_gbs"] for r in ag], "k--",
           label="D2D copy roofline")
    a.set_xscale("log", base=2)
    a.set_xlabel("MiB per rank")
    a.set_ylabel("GB/s moved")
    a.set_title(f"all-gather, {R} virtual ranks, {INFLIGHT} per session", fontsize=10)
    a.legend()
    rs = [r for r in rows if r["op"] == "reduce_scatter"]
    b.plot([r["mib_per_rank"] for r in rs], [r["gpu_ms"] for r in rs], "o-", label="epic")
    b.plot([r["mib_per_rank"] for r in rs], [r["torch_stacked_sum_gpu_ms"] for r in rs], "s-",
           label="torch stacked sum")
    b.plot([r["mib_per_rank"] for r in rs], [r["floor_ms"] for r in rs], "k--", label="floor")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("MiB per rank")
    b.set_ylabel("ms")
    b.set_title("reduce-scatter (rank-order fp32 sum)", fontsize=10)
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    import torch

    rows = all_gather_rows() + reduce_scatter_rows() + pp_rows() + engram_rows() + \
        [overhead_row()]
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    stem = os.path.join(args.out, f"collectives-{gpu}-{datetime.date.today().isoformat()}")
    os.makedirs(args.out, exist_ok=True)
    summary = dict(
        all_gather_min_x_roofline=min(r["x_roofline"] for r in rows if r["op"] == "all_gather"),
        reduce_scatter_min_x_torch=min(r["x_torch"] for r in rows if r["op"] == "reduce_scatter"),
        pp_min_x_roofline=min(r["x_roofline"] for r in rows if r["op"] == "pp"),
        engram_min_x_h2d_roofline=min(r["x_roofline"] for r in rows
                                      if r["op"] == "engram_fetch"),
        api_overhead_x_torch=rows[-1]["x_torch"])
    with open(stem + ".json", "w") as f:
        json.dump(dict(rows=rows, summary=summary, ranks=R, inflight=INFLIGHT), f, indent=1)
    plot(rows, stem + ".png")
    print(f"summary: {summary}\nwrote {stem}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
