"""AGRS sessions, PP channels and Engram on real ranks (one process per GPU, NCCL): the copy engines
write into the peers' NVLink (LSA) mappings of the window, the flags cross processes.

    torchrun --nproc-per-node N test/gpu/collectives_distributed.py

Every process makes every rank's inputs (seeded), so each checks its own results against
epic.reference: all-gathers (single, batched, in place) across two sessions, a reduce-scatter,
and PP sends to both ring neighbours (more than the slots hold, so the flow control waits).
Rank 0 prints one line per check with every rank's verdict.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import epic  # noqa: E402
from epic import reference as ref  # noqa: E402
from epic._tensors import torch_to_numpy  # noqa: E402


def rank_inputs(world, seed, shape, dtype):
    out = []
    for r in range(world):
        gen = torch.Generator().manual_seed(seed * 1000 + r)
        out.append(torch.randn(shape, generator=gen).to(dtype))
    return out


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    shapes = [(32, 64, 256), (4096,), (world * 8, 96)]
    session = sum(epic.ElasticBuffer.get_agrs_num_max_session_bytes(group, s, torch.float32)
                  for s in shapes) * 2
    buffer = epic.ElasticBuffer(group, num_bytes=epic.ElasticBuffer.get_agrs_buffer_size_hint(
        group, session), explicitly_destroy=True)
    buffer.agrs_set_config(session, 8)
    results = []

    def check(name, ok):
        verdicts = [None] * world
        dist.all_gather_object(verdicts, bool(ok))
        results.append(all(verdicts))
        if rank == 0:
            print(f"{name}: {'ok' if all(verdicts) else 'FAILED'} {verdicts}", flush=True)

    def gathered_ok(gathered, inputs):  # rank order, bit for bit
        want = ref.all_gather([torch_to_numpy(x) for x in inputs])[rank]
        return torch_to_numpy(gathered).tobytes() == want.tobytes()

    for s in range(2):
        with buffer.agrs_new_session():
            xs = rank_inputs(world, 10 + s, shapes[0], torch.bfloat16)
            gathered, handle = buffer.all_gather(xs[rank].cuda())
            handle()
            check(f"session {s}: all_gather {shapes[0]} bf16", gathered_ok(gathered, xs))

            a, b = (rank_inputs(world, 20 + s, shapes[1], torch.float32),
                    rank_inputs(world, 30 + s, shapes[1], torch.float32))
            slots = buffer.agrs_get_inplace_tensor((shapes[1], shapes[1]), torch.float32)
            slots[0].copy_(a[rank].cuda())
            slots[1].copy_(b[rank].cuda())
            first, second, handle = buffer.all_gather(list(slots))
            handle()
            check(f"session {s}: batched all_gather in place",
                  gathered_ok(first, a) and gathered_ok(second, b))

            cs = rank_inputs(world, 40 + s, shapes[2], torch.bfloat16)
            out, handle = buffer.reduce_scatter(cs[rank].cuda())
            handle()
            want = ref.reduce_scatter([torch_to_numpy(x) for x in cs])[rank]
            check(f"session {s}: reduce_scatter {shapes[2]} bf16",
                  torch_to_numpy(out).tobytes() == want.tobytes())
    buffer.destroy()

    # PP: 6 tensors to each neighbour through 2 slots per direction, received in send order.
    inflight, count, shape = 2, 6, (64, 96)
    nbytes = 64 * 96 * 2
    pp = epic.ElasticBuffer(group, num_bytes=epic.ElasticBuffer.get_pp_buffer_size_hint(
        nbytes, inflight), explicitly_destroy=True)
    pp.pp_set_config(nbytes, inflight)
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def tensor(sender, receiver, i):
        return rank_inputs(world, 1000 + 37 * sender + 7 * receiver + i, shape,
                           torch.bfloat16)[sender].cuda()

    ok = True
    for i in range(count):
        pp.pp_send(tensor(rank, nxt, i), nxt)
        if world > 2:
            pp.pp_send(tensor(rank, prv, i), prv)
        got = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        pp.pp_recv(got, prv)
        ok &= bool(torch.equal(got, tensor(prv, rank, i)))
        if world > 2:
            pp.pp_recv(got, nxt)
            ok &= bool(torch.equal(got, tensor(nxt, rank, i)))
    torch.cuda.synchronize()
    check(f"PP: {count} tensors to each ring neighbour through {inflight} slots", ok)
    pp.destroy()

    # A receive posted before its send (on another stream): the wait outlasts the buffer's GPU
    # timeout (1 s here), is reported naming the sender's arrival count, and completes when the
    # send comes.
    if world == 1:
        from epic import _C

        late = epic.ElasticBuffer(group, num_bytes=epic.ElasticBuffer.get_pp_buffer_size_hint(
            nbytes, 1), num_gpu_timeout_secs=1, explicitly_destroy=True)
        late.pp_set_config(nbytes, 1)
        got = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        before = len(_C.stream_wait_reports())
        late.pp_recv(got, 0)
        time.sleep(2.5)
        reports = _C.stream_wait_reports()[before:]
        sender = torch.cuda.Stream()
        with torch.cuda.stream(sender):
            late.pp_send(tensor(0, 0, 99), 0)
        torch.cuda.synchronize()
        check("PP: a receive waiting past the timeout is reported, then completes",
              len(reports) == 1 and "pp_recv of rank 0 from rank 0" in reports[0]
              and "arrival count" in reports[0] and "needs 1, holds 0" in reports[0]
              and bool(torch.equal(got, tensor(0, 0, 99))))
        if rank == 0 and reports:
            print(f"  report: {reports[0]}", flush=True)
        late.destroy()

    # Engram: a one-rank world fetches from its own host segment (the window NCCL registers is
    # the device part and the segment); a world of several ranks is refused by name.
    entries, hidden = 1000, 128
    gpu_bytes, cpu_bytes = epic.ElasticBuffer.get_engram_storage_size_hint(entries, hidden, 64)
    if world == 1:
        engram = epic.ElasticBuffer(group, num_bytes=max(gpu_bytes, 2 << 20),
                                    num_cpu_bytes=cpu_bytes, explicitly_destroy=True)
        table = rank_inputs(1, 77, (entries, hidden), torch.bfloat16)[0].cuda()
        engram.engram_write(table)
        ids = torch.randint(0, entries, (64, 4), dtype=torch.int32, device="cuda")
        data, sf = engram.engram_fetch(ids)()
        want = ref.engram_fetch([torch_to_numpy(table)], [torch_to_numpy(ids)])[0][0]
        check("Engram: 64 x 4 entries from the own host segment",
              torch_to_numpy(data).tobytes() == want.tobytes() and sf is None)
        engram.destroy()
    else:
        try:
            epic.ElasticBuffer(group, num_bytes=2 << 20, num_cpu_bytes=cpu_bytes,
                               explicitly_destroy=True)._runtime()
            refused = False
        except RuntimeError as e:
            refused = "num_cpu_bytes" in str(e)
        check(f"Engram on {world} NCCL ranks: refused by name", refused)
    dist.destroy_process_group()
    if rank == 0:
        print(f"AGRS, PP and Engram on {world} NCCL rank(s): "
              f"{'passed' if all(results) else 'FAILED'}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
