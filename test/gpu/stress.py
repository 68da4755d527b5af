"""Multi-rank stress: 1000+ random ops through epic.ElasticBuffer, every result against
epic.reference, on real ranks (one process per GPU) or on a virtual world.

    torchrun --nproc-per-node N test/gpu/stress.py [--ops 1200] [--fixed-experts]
    python3 test/gpu/stress.py --virtual R [--ops 1200] [--fixed-experts]
    python3 test/gpu/stress.py --compile-only (--world-size N | --virtual R)   # here: kernels

Ops: dispatch, cached dispatch, combine (with and without weights, 0-2 biases), BF16 and FP8,
plain and expanded, zero padding or not, token caps of 64 and 32, and on GEMM-capable
configurations grouped_gemm, dispatch_gemm and gemm_combine. Each step draws a configuration
(test/gpu/stress_plan.py: the schedule comes from one shared seed, so every rank takes the same
decisions), a routing pattern (ranks with no tokens, all on one rank, masked slots), a buffer
(a second one is alive all along), sometimes destroys and re-creates that buffer, runs on the
current stream or DeepEP's async protocol on the comm stream, and first sleeps each rank on
the comm stream for its own random number of GPU cycles.

Comparisons: dispatches bitwise with epic.reference (rows sorted by source; expanded padding
rows left out unless zero padded); combines bitwise with epic.reference.combine of the same
expert outputs; GEMM outputs against torch per expert with a tolerance (the reference says its
sum order differs), fused outputs bitwise against the unfused op, and what the GEMM produced is
combined bitwise like any expert output. Each process rebuilds every rank's inputs from
(seed, step, rank); GEMM outputs are all-gathered.

By default one buffer serves every expert count and token cap (issue 26's first item);
--fixed-experts keeps one buffer per (expert count, token cap), for runs before that fix.
Every op is bounded: the buffers' GPU timeout is 20 s, and a watchdog ends the process naming
the op after --op-timeout seconds. Prints per-op counts and every failure (op, rank, what
differed); exits 1 on any failure.

With 2 or more NCCL processes the run ends with deliberate mismatches, each expecting its
error: num_bytes differing on one rank (refused at construction, naming num_bytes) and num_sms
differing on one rank (the kernels trap at the entry barrier naming both ranks; last, since
the CUDA context is lost). --no-mismatches skips them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import stress_plan as P  # noqa: E402
from epic import reference as ref  # noqa: E402


def compile_only(args):
    """Every kernel set the run may launch, into the kernel cache (the GPU machine has no
    compiler)."""
    from epic import _C

    virtual = args.virtual is not None
    ranks = args.virtual if virtual else args.world_size
    runtime = _C.Runtime("virtual" if virtual else "nccl", "", "")
    start, count = time.time(), 0
    for config in P.configurations(ranks):
        for spec, variant, kind in P.kernel_sets(config, ranks):
            runtime.kernels(spec, variant, kind)
            count += 1
    print(f"stress: {count} kernel sets for {ranks} {'virtual' if virtual else 'NCCL'} ranks in "
          f"{runtime.cache_dir} ({time.time() - start:.1f} s)")
    return 0


class World:
    """The ranks this process serves: all of a virtual world, or its own. Calls take per-rank
    lists either way; `arg` and `out` adapt them to the buffer's convention."""

    def __init__(self, torch, virtual):
        import epic

        self.t, self.virtual = torch, virtual is not None
        if self.virtual:
            self.ranks, self.rank, self.group = virtual, 0, epic.VirtualWorld(virtual)
            self.served = list(range(virtual))
        else:
            import torch.distributed as dist

            sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
            from common import init_distributed

            self.dist = dist
            self.rank, self.ranks = init_distributed(experts=1)
            self.group, self.served = dist.group.WORLD, [self.rank]

    def arg(self, values):
        return values if self.virtual else values[0]

    def out(self, value):
        return value if self.virtual else [value]

    def gather(self, local):
        """Every rank's value from the served ranks' values (`local`, a list)."""
        if self.virtual:
            return local
        everyone = [None] * self.ranks
        self.dist.all_gather_object(everyone, local[0])
        return everyone

    def all_ok(self, ok):
        """One decision for all ranks: True only if `ok` everywhere."""
        if self.virtual:
            return ok
        flag = self.t.tensor([1 if ok else 0], device="cuda")
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN)
        return bool(flag.item())


class Buffers:
    """The main and second buffer, per (expert count, token cap) with --fixed-experts."""

    def __init__(self, world, fixed):
        import epic

        self.world, self.fixed, self.live = world, fixed, {}
        self.size = epic.ElasticBuffer.get_buffer_size_hint(world.group, P.TMAX, P.HMAX, P.KMAX)

    def get(self, name, config, recreate):
        import epic

        key = (name,) + ((config.experts, config.tmax) if self.fixed else ())
        if recreate and key in self.live:
            self.live.pop(key).destroy()
        if key not in self.live:
            self.live[key] = epic.ElasticBuffer(
                self.world.group, num_bytes=self.size, num_max_tokens_per_rank=P.TMAX,
                num_gpu_timeout_secs=P.GPU_TIMEOUT_S, explicitly_destroy=True)
        return self.live[key]

    def destroy(self):
        for b in self.live.values():
            b.destroy()
        self.live.clear()


def rows(rng, tokens, hidden, fp8):
    if not fp8:
        return rng.standard_normal((tokens, hidden)).astype(ref.bfloat16), None
    return ref.per_token_cast_to_fp8(rng.standard_normal((tokens, hidden)).astype(np.float32))


class StepRun:
    """One step's ops on one buffer; `failures` collects (op, rank, what differed)."""

    def __init__(self, torch, world, buffer, step, config, seed, failures):
        from epic._tensors import numpy_to_torch

        self.t, self.w, self.b, self.s, self.c = torch, world, buffer, step, config
        self.seed, self.failures, self.to_torch = seed, failures, numpy_to_torch
        R, c = world.ranks, config
        self.data = []
        for r in range(R):  # every rank's inputs, rebuilt here for the reference
            rng = P.rank_rng(seed, step.index, r, 0)
            tokens, idx = P.routing(rng, step, c, R, r)
            x, sf = rows(rng, tokens, c.hidden, c.fp8)
            w = rng.standard_normal((tokens, c.topk)).astype(np.float32) if c.weights else None
            bias = tuple(rng.standard_normal((tokens, c.hidden)).astype(ref.bfloat16)
                         for _ in range(c.biases)) or None
            self.data.append(dict(tokens=tokens, idx=idx, x=x, sf=sf, w=w, bias=bias))
        self.handles = self.got = self.expected = self.recv = self.recv_w = None
        self.experts_w = self.ys = None  # the local experts' matrices, the GEMM's output

    # --- helpers ---

    def check(self, op, r, ok, what):
        if not ok:
            self.failures.append((f"step {self.s.index} {op}", r, what))
            print(f"stress: FAILED step {self.s.index} {op} rank {r}: {what} "
                  f"(config {self.c}, pattern {self.s.pattern})", flush=True)

    def x_in(self, xs, sfs):
        return [(self.to_torch(xs[r]), self.to_torch(sfs[r])) if self.c.fp8
                else self.to_torch(xs[r]) for r in self.w.served]

    def stream_kwargs(self):
        if self.s.stream == "comm":
            return dict(allocate_on_comm_stream=True, async_with_compute_stream=True,
                        previous_event=self.b.capture())
        return {}

    def finish(self, event):
        if self.s.stream == "comm":
            event.current_stream_wait()

    def delay(self):
        """Each rank sleeps its own random number of cycles on the comm stream; the op's
        stream waits for it (the op starts late on that rank only)."""
        t = self.t
        comm = self.b.get_comm_stream()
        cycles = self.s.delays[self.w.rank] if not self.w.virtual else max(self.s.delays)
        comm.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(comm):
            t.cuda._sleep(cycles)
        t.cuda.current_stream().wait_stream(comm)

    def gemm_weights(self):
        if self.experts_w is None:
            L, H = self.c.experts // self.w.ranks, self.c.hidden
            self.experts_w = [self.to_torch(
                (P.rank_rng(self.seed, self.s.index, r, 1).standard_normal((L, H, H))
                 / H ** 0.5).astype(ref.bfloat16)) for r in self.w.served]
        return self.experts_w

    # --- ops ---

    def dispatch(self, gemm=False):
        from soak import checked, without_padding
        from test_elastic_buffer import as_result, check_dispatch

        c, d, served = self.c, self.data, self.w.served
        # The fused op takes the buffer's token cap (its kernels size scratch by it): GEMM-capable
        # configurations have that cap (stress_plan.configurations), the others pass theirs.
        kw = dict(num_experts=c.experts, expert_alignment=c.alignment,
                  do_zero_padding=c.zero_padding)
        ws = [self.to_torch(d[r]["w"]) for r in served] if c.weights else None
        idx = [self.to_torch(d[r]["idx"]) for r in served]
        xs = [e["x"] for e in d]
        sfs = [e["sf"] for e in d]
        self.delay()
        if gemm:
            recv, recv_w, gemm_out, handles, _ = self.b.dispatch_gemm(
                self.w.arg(self.x_in(xs, sfs)), self.w.arg(idx), self.w.arg(self.gemm_weights()),
                topk_weights=self.w.arg(ws) if ws else None, fusion="always", **kw)
            # The fused op returns no recv_topk_idx: the check below takes the reference's.
            recv_idx, gemm_out = [None] * len(served), self.w.out(gemm_out)
        else:
            recv, recv_idx, recv_w, handles, event = self.b.dispatch(
                self.w.arg(self.x_in(xs, sfs)), self.w.arg(idx),
                self.w.arg(ws) if ws else None, do_expand=c.expand,
                num_max_tokens_per_rank=c.tmax, **kw, **self.stream_kwargs())
            self.finish(event)
            gemm_out = None
        recv = self.w.out(recv)
        if not gemm:
            recv_idx = self.w.out(recv_idx)
        self.recv_w, self.handles = self.w.out(recv_w), self.w.out(handles)
        self.recv = recv
        self.expected = ref.dispatch(
            xs, [e["idx"] for e in d], [e["w"] for e in d] if c.weights else None,
            sfs if c.fp8 else None, num_experts=c.experts, num_max_tokens_per_rank=c.tmax,
            expert_alignment=c.alignment, expand=c.expand, zero_padding=c.zero_padding)
        self.got = {}
        for i, r in enumerate(served):
            data, sf = recv[i] if c.fp8 else (recv[i], None)
            got = as_result(self.expected[r], data, sf, recv_idx[i], self.recv_w[i],
                            self.handles[i])
            if gemm:
                got = dataclasses.replace(got, recv_topk_idx=self.expected[r].recv_topk_idx)
            self.got[r] = got
            try:
                checked(f"rank {r}", check_dispatch, self.expected[r],
                        without_padding(got, c.zero_padding), self.handles[i])
            except (AssertionError, ValueError) as e:
                self.check("dispatch_gemm" if gemm else "dispatch", r, False, str(e))
        if gemm:  # the fused GEMM's rows: bitwise the grouped GEMM of the same rows
            again = self.w.out(self.b.grouped_gemm(self.w.arg(recv), self.w.arg(
                self.gemm_weights()), self.w.arg(self.handles)))
            for i, r in enumerate(served):
                self.check("dispatch_gemm", r, self.t.equal(gemm_out[i].view(self.t.int16),
                                                            again[i].view(self.t.int16)),
                           "GEMM output differs from grouped_gemm of its rows")

    def cached_dispatch(self):
        from soak import checked, without_padding
        from test_elastic_buffer import as_result, check_dispatch

        c, served = self.c, self.w.served
        new = [rows(P.rank_rng(self.seed, self.s.index, r, 2), e["tokens"], c.hidden, c.fp8)
               for r, e in enumerate(self.data)]
        xs, sfs = [n[0] for n in new], [n[1] for n in new]
        self.delay()
        again, again_idx, _, _, event = self.b.dispatch(
            self.w.arg(self.x_in(xs, sfs)), handle=self.w.arg(self.handles), do_expand=c.expand,
            do_zero_padding=c.zero_padding, **self.stream_kwargs())
        self.finish(event)
        again, again_idx = self.w.out(again), self.w.out(again_idx)
        expected = ref.dispatch(xs, [e["idx"] for e in self.data], None,
                                sfs if c.fp8 else None, num_experts=c.experts,
                                num_max_tokens_per_rank=c.tmax, expert_alignment=c.alignment,
                                expand=c.expand, zero_padding=c.zero_padding)
        for i, r in enumerate(served):
            data, sf = again[i] if c.fp8 else (again[i], None)
            result = as_result(expected[r], data, sf, again_idx[i], None, self.handles[i])
            try:
                checked(f"rank {r}", check_dispatch, expected[r],
                        without_padding(result, c.zero_padding), self.handles[i])
            except (AssertionError, ValueError) as e:
                self.check("cached dispatch", r, False, str(e))

    def grouped_gemm(self):
        """y = the expert GEMM of the received rows (torch per expert, tolerance); y is what
        the next combine sends."""
        t, served = self.t, self.w.served
        ys = self.w.out(self.b.grouped_gemm(self.w.arg(self.recv), self.w.arg(
            self.gemm_weights()), self.w.arg(self.handles)))
        for i, r in enumerate(served):
            e = self.expected[r]
            covered = t.zeros(ys[i].shape[0], dtype=t.bool, device=ys[i].device)
            for j, start in enumerate(e.expert_starts().tolist()):
                end = start + int(e.num_unaligned_recv_tokens_per_expert[j])
                if end > start:
                    want = self.recv[i][start:end].float() @ self.gemm_weights()[i][j].float()
                    close = t.allclose(ys[i][start:end].float(), want.to(t.bfloat16).float(),
                                       rtol=1.6e-2, atol=1e-2)
                    self.check("grouped_gemm", r, close, f"expert {j} rows differ from torch")
                covered[start:end] = True
            self.check("grouped_gemm", r, not ys[i][~covered].any(), "padding rows not zero")
        self.ys = ys

    def gemm_rows_differ(self, r, got, want):
        """Which rows of a GEMM output differ: how many, the first few, and whether they are
        expert rows or padding and all zero on either side (what tells a race from a wrong
        product)."""
        t = self.t
        e = self.expected[r]
        valid = t.zeros(want.shape[0], dtype=t.bool, device=want.device)
        for j, start in enumerate(e.expert_starts().tolist()):
            valid[start:start + int(e.num_unaligned_recv_tokens_per_expert[j])] = True
        bad = (got.view(t.int16) != want.view(t.int16)).any(1).nonzero().flatten().tolist()
        rows = [f"{row}({'expert' if valid[row] else 'padding'}, got "
                f"{'zero' if not got[row].any() else 'data'}, want "
                f"{'zero' if not want[row].any() else 'data'})" for row in bad[:4]]
        # grouped_gemm of the same rows again: a stale `want` or a wrong `got`
        again = self.w.out(self.b.grouped_gemm(self.w.arg(self.recv), self.w.arg(
            self.gemm_weights()), self.w.arg(self.handles)))[self.w.served.index(r)]
        t.cuda.synchronize()
        same = {name: t.equal(v.view(t.int16), again.view(t.int16))
                for name, v in (("got", got), ("want", want))}
        return (f"{len(bad)} of {want.shape[0]} rows ({int(valid.sum())} expert rows), "
                f"stream {self.s.stream}: {', '.join(rows)}; equal to grouped_gemm run "
                f"again: {same}")

    def combine(self, fused=False):
        """Plain combine of random rows (or of the GEMM's output), or gemm_combine; bitwise
        against epic.reference.combine of the same rows in canonical order."""
        from epic._tensors import torch_to_numpy

        c, served, t = self.c, self.w.served, self.t
        perms = {}
        for r in served:
            try:
                perms[r] = P.arrival_order(self.got[r])
            except ValueError as e:  # corrupt metadata: reported; the collective goes on
                self.check("combine", r, False, f"dispatch metadata: {e}")
                perms[r] = np.arange(self.got[r].recv_x.shape[0])
        if self.ys is not None:  # the GEMM's output: gathered, in canonical order
            mine = [torch_to_numpy(self.ys[i])[perms[r]] for i, r in enumerate(served)]
            canonical = self.w.gather(mine)
        else:
            canonical = [P.rank_rng(self.seed, self.s.index, r, 3).standard_normal(
                (self.expected[r].recv_x.shape[0], c.hidden)).astype(ref.bfloat16)
                for r in range(self.w.ranks)]
        bias = [e["bias"] for e in self.data] if c.biases else None
        bias_in = self.w.arg([tuple(self.to_torch(b) for b in self.data[r]["bias"])
                              for r in served]) if c.biases else None
        self.delay()
        if fused:
            ys, out, event = self.b.gemm_combine(self.w.arg(self.recv), self.w.arg(
                self.gemm_weights()), self.w.arg(self.handles), bias=bias_in, fusion="always",
                **self.stream_kwargs())
            # In DeepEP's async protocol the outputs are ready once the event is waited for.
            self.finish(event)
            event = None
            out_w = self.w.out(None)
            for i, r in enumerate(served):
                got_y = self.w.out(ys)[i]
                if not t.equal(got_y.view(t.int16), self.ys[i].view(t.int16)):
                    self.check("gemm_combine", r, False,
                               "its GEMM output differs from grouped_gemm's: "
                               f"{self.gemm_rows_differ(r, got_y, self.ys[i])}")
        else:
            y_in = [self.to_torch(P.to_arrival(canonical[r], perms[r])) for r in served]
            out, out_w, event = self.b.combine(
                self.w.arg(y_in), self.w.arg(self.handles),
                topk_weights=self.w.arg(self.recv_w) if c.weights else None, bias=bias_in,
                **self.stream_kwargs())
        if event is not None:
            self.finish(event)
        out, out_w = self.w.out(out), self.w.out(out_w)
        weights = c.weights and not fused  # gemm_combine takes no weights
        want = ref.combine(canonical, self.expected, bias=bias, topk_weights=[
            e.recv_topk_weights for e in self.expected] if weights else None)
        op = "gemm_combine" if fused else "combine"
        for i, r in enumerate(served):
            from test_elastic_buffer import rows_differ, same_bits

            got = torch_to_numpy(out[i])
            self.check(op, r, same_bits(got, want[r].combined_x),
                       f"combined_x: {rows_differ(got, want[r].combined_x)}")
            if weights:
                got = torch_to_numpy(out_w[i])
                self.check(op, r, same_bits(got, want[r].combined_topk_weights),
                           f"combined_topk_weights: "
                           f"{rows_differ(got, want[r].combined_topk_weights)}")


def run_step(torch, world, buffers, step, configs, seed, failures, watchdog):
    config = configs[step.config]
    watchdog.arm(f"step {step.index}: {'re-creating' if step.recreate else 'getting'} the "
                 f"{step.buffer} buffer on rank {world.rank}")
    buffer = buffers.get(step.buffer, config, step.recreate)
    run = StepRun(torch, world, buffer, step, config, seed, failures)
    for n, op in enumerate(step.ops):
        watchdog.arm(f"step {step.index} op {n} ({op}) on rank {world.rank}, config "
                     f"{config}, buffer {step.buffer}")
        if op == "dispatch":
            run.dispatch()
        elif op == "dispatch_gemm":
            run.dispatch(gemm=True)
        elif op == "cached dispatch":
            run.cached_dispatch()
        elif op == "grouped_gemm":
            run.grouped_gemm()
        elif op == "combine":
            run.combine()
        else:
            run.combine(fused=True)
        torch.cuda.synchronize()
        watchdog.disarm()


def deliberate_mismatches(torch, world, size, configs, watchdog):
    """Mistakes only several processes can make, each expecting its error (NCCL worlds of 2 or
    more; the virtual world's ranks share one call): a buffer whose num_bytes differs on rank
    0, refused at construction naming num_bytes on every rank; then a dispatch whose num_sms
    differs on rank 0, which the kernels trap at the entry barrier naming both ranks. The trap
    loses the CUDA context, so this comes last. Returns this rank's failures."""
    import epic

    failures = []
    watchdog.arm("deliberate mismatch: num_bytes larger on rank 0")
    try:
        epic.ElasticBuffer(world.group, num_bytes=size + (1 << 20) * (world.rank == 0),
                           num_max_tokens_per_rank=P.TMAX, explicitly_destroy=True).destroy()
        failures.append(("mismatch num_bytes", world.rank, "accepted"))
    except Exception as e:  # noqa: BLE001 - what is refused, and how, is the check
        if "num_bytes" not in str(e):
            failures.append(("mismatch num_bytes", world.rank, f"refused without naming "
                             f"num_bytes: {type(e).__name__}: {e}"))
    watchdog.disarm()
    c = next(c for c in configs if not c.fp8 and not c.weights)
    buffer = epic.ElasticBuffer(world.group, num_bytes=size, num_max_tokens_per_rank=P.TMAX,
                                num_gpu_timeout_secs=P.GPU_TIMEOUT_S, explicitly_destroy=True)
    x = torch.randn((16, c.hidden), device="cuda").to(torch.bfloat16)
    idx = torch.rand((16, c.experts), device="cuda").topk(c.topk).indices
    watchdog.arm("deliberate mismatch: num_sms larger on rank 0 (the kernels trap)")
    try:
        buffer.dispatch(x, idx, num_experts=c.experts, expert_alignment=c.alignment,
                        do_expand=c.expand, do_zero_padding=c.zero_padding,
                        num_max_tokens_per_rank=c.tmax, num_sms=4 if world.rank == 0 else 2)
        torch.cuda.synchronize()
        failures.append(("mismatch num_sms", world.rank, "ran"))
    except Exception as e:  # noqa: BLE001
        if "disagree" not in str(e):
            failures.append(("mismatch num_sms", world.rank, f"failed without naming the "
                             f"disagreement: {type(e).__name__}: {e}"))
    watchdog.disarm()
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--virtual", type=int, help="R ranks of a virtual world in this process")
    parser.add_argument("--fixed-experts", action="store_true",
                        help="one buffer per expert count and token cap (before issue 26's fix)")
    parser.add_argument("--op-timeout", type=float, default=120,
                        help="seconds an op may take before the watchdog ends the run")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--no-mismatches", action="store_true",
                        help="skip the deliberate mismatches at the end (NCCL, 2+ ranks)")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args)
    import torch

    watchdog = P.Watchdog(args.op_timeout)
    watchdog.arm("start-up (process group, the ranks' schedules)")
    world = World(torch, args.virtual)
    configs = P.configurations(world.ranks)
    steps = P.schedule(args.seed, args.ops, configs, world.ranks)
    problem = P.disagreement(world.gather([P.digest(steps, configs)]))
    watchdog.disarm()
    if problem:
        print(f"stress: {problem}", flush=True)
        return 1
    buffers = Buffers(world, args.fixed_experts)
    failures, start, done, stopped = [], time.time(), 0, False
    for step in steps:
        fatal = False
        try:
            run_step(torch, world, buffers, step, configs, args.seed, failures, watchdog)
        except Exception as e:  # noqa: BLE001 - a refused call or a CUDA error: the run stops
            watchdog.disarm()
            fatal = True
            failures.append((f"step {step.index} ({', '.join(step.ops)})", world.rank,
                             f"{type(e).__name__}: {e}"))
            print(f"stress: FAILED step {step.index} ({', '.join(step.ops)}) rank {world.rank}: "
                  f"{type(e).__name__}: {e}", flush=True)
        # One decision for all ranks: stop everywhere if any rank cannot go on (a CUDA error
        # leaves its context unusable; the others would wait for it in the next op).
        watchdog.arm(f"the ranks' agreement after step {step.index}")
        try:
            stopped = not world.all_ok(not fatal)
        except Exception:  # noqa: BLE001 - this rank's CUDA is gone
            stopped = True
        watchdog.disarm()
        if stopped:
            break
        done += len(step.ops)
    counts = P.op_counts(steps[:step.index + 1])
    if stopped:  # CUDA may be unusable somewhere: each rank reports its own, no cleanup
        report(args, world, counts, done, start, [failures])
        watchdog.stop()
        sys.stdout.flush()
        os._exit(1)
    watchdog.arm("the end: destroying the buffers, gathering the failures")
    buffers.destroy()
    everyone = world.gather([failures])
    watchdog.disarm()
    if world.rank == 0:
        report(args, world, counts, done, start, everyone)
    if not world.virtual and world.ranks > 1 and not args.no_mismatches:
        # Last: the trap loses the CUDA context; each rank reports its own outcome.
        mismatched = deliberate_mismatches(torch, world, buffers.size, configs, watchdog)
        for what, rank, detail in mismatched:
            print(f"stress: FAILED {what} rank {rank}: {detail}", flush=True)
        print(f"stress: rank {world.rank}: deliberate mismatches "
              f"{'refused as expected' if not mismatched else 'NOT refused as expected'}",
              flush=True)
        watchdog.stop()
        sys.stdout.flush()
        os._exit(1 if any(everyone) or mismatched else 0)
    watchdog.stop()
    if not world.virtual:
        world.dist.destroy_process_group()
    return 1 if any(everyone) else 0


def report(args, world, counts, done, start, everyone):
    """Per-op counts and every failure (`everyone`: each rank's list)."""
    mode = f"virtual world of {world.ranks}" if world.virtual else f"{world.ranks} process(es)"
    print(f"stress: {mode}, seed {args.seed}, {done} ops in {time.time() - start:.0f} s, "
          f"{'one buffer per expert count' if args.fixed_experts else 'expert counts mixed'}")
    for op, n in sorted(counts.items()):
        print(f"  {op:16s} {n}")
    for fs in everyone:
        for what, rank, detail in fs:
            print(f"  FAILED {what} rank {rank}: {detail}")
    print(f"stress: {sum(len(f) for f in everyone)} failures", flush=True)

if __name__ == "__main__":
    sys.exit(main())
