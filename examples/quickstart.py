"""epic in one page: DeepEP's V3 dispatch and combine on a virtual EP8 world.

    python examples/quickstart.py [--ranks 8] [--tokens 512] [--dump-ir]

On a GPU: 8 virtual ranks on one GPU each dispatch random tokens in FP8 (one
float32 scale per 128 channels) to the owners of their top-8 of 256 experts,
in the expanded layout a grouped GEMM reads (rows grouped by expert, padded
to 128); a toy expert scales each row by its expert; combine sums the rows
back. Both are checked bitwise against epic.reference (DeepEP's semantics)
and a short report is printed. Without a GPU it says so, compiles the same
kernels on the CPU and prints what the compiler made.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import epic  # noqa: E402
from common import (ALIGNMENT, EXPERTS, GROUP, HIDDEN, TOPK, V3_VARIANTS,  # noqa: E402
                    make_inputs, to_numpy, to_torch, toy_expert_torch, v3_spec)
from epic import reference as ref  # noqa: E402


def epic_opt():
    local = os.path.join(HERE, "..", "build", "bin", "epic-opt")
    return local if os.path.exists(local) else shutil.which("epic-opt")


def show_compiler(args, backend="virtual"):
    """The kernels of the configuration, compiled here (no GPU needed)."""
    import json

    from epic import _C

    runtime = _C.Runtime(backend, args.cache_dir or "", "")
    for kind, variant in V3_VARIANTS:
        spec = v3_spec(args.ranks, args.tokens)
        k = runtime.kernels(spec, variant, kind)
        meta = json.loads(k["metadata"])
        kernels = ", ".join(f"{m['name']} ({m['registers']} registers, {m['spill_store_bytes']} "
                            f"bytes spilled)" for m in meta["kernels"])
        print(f"  {kind}: kernel request {len(k['request'])} bytes -> PTX "
              f"{len(k['ptx'].splitlines())} lines -> cubin {k['cubin_bytes']} bytes "
              f"[{k['source']} in {k['seconds']:.3f} s]")
        print(f"    kernels: {kernels}")
        if args.dump_ir:
            # The runtime writes no IR: the compiler builds the ep op from the request.
            ir = runtime.entry_ir(spec, variant, kind)
            print(f"--- {kind}: kernel request ---\n{k['request']}")
            print(f"--- {kind}: entry IR (the ep op) ---\n{ir}")
            tool = epic_opt()
            if tool:
                lowered = subprocess.run([tool, "--convert-ep-to-comm", "-"], input=ir,
                                         text=True, capture_output=True, check=True).stdout
                print(f"--- {kind}: after convert-ep-to-comm (comm + upstream ops) ---\n{lowered}")
            else:
                print(f"--- {kind}: (epic-opt is not here: the convert-ep-to-comm stage is not "
                      "shown) ---")
            print(f"--- {kind}: PTX ---\n{k['ptx']}")
    return k


def run_on_gpu(args):
    import dataclasses

    import torch

    R, T = args.ranks, args.tokens
    counts, xs, sfs, idxs, ws = make_inputs(R, T)
    world = epic.VirtualWorld(R)
    buffer = epic.ElasticBuffer(world, num_max_tokens_per_rank=T, hidden=HIDDEN, num_topk=TOPK,
                                use_fp8_dispatch=True, explicitly_destroy=True,
                                cache_dir=args.cache_dir)
    if args.dump_ir:
        show_compiler(args)
    x_in = [(to_torch(torch, x), to_torch(torch, sf)) for x, sf in zip(xs, sfs)]
    idx_in, w_in = [to_torch(torch, i) for i in idxs], [to_torch(torch, w) for w in ws]

    def dispatch():
        return buffer.dispatch(x_in, idx_in, w_in, num_experts=EXPERTS, expert_alignment=ALIGNMENT,
                               do_expand=True)

    start = time.perf_counter()
    recv, _, recv_w, handles, _ = dispatch()  # first call: kernels compiled or loaded
    torch.cuda.synchronize()
    first = time.perf_counter() - start

    # A toy expert per local expert e: dequantize, scale by (e + 1) / 32, BF16.
    ys = [toy_expert_torch(torch, *recv[r], handles[r].num_recv_tokens_per_expert_list,
                           EXPERTS // R) for r in range(R)]
    combined, combined_w, _ = buffer.combine(ys, handles, topk_weights=recv_w)

    # Time the steady state with CUDA events (one warm-up above).
    begin, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    begin.record()
    recv2, _, recv_w2, handles2, _ = dispatch()
    mid.record()
    buffer.combine(ys, handles2, topk_weights=recv_w2)
    end.record()
    torch.cuda.synchronize()

    # Check against the reference: dispatch rows as sets, combine bitwise.
    expected = ref.dispatch(xs, idxs, ws, sfs, num_experts=EXPERTS, num_max_tokens_per_rank=T,
                            expert_alignment=ALIGNMENT, expand=True)
    got, dispatch_ok = [], True
    for r in range(R):
        g = dataclasses.replace(expected[r], recv_x=to_numpy(torch, recv[r][0]),
                                recv_scale_packs=to_numpy(torch, recv[r][1]),
                                recv_topk_weights=to_numpy(torch, recv_w[r]),
                                recv_src_metadata=to_numpy(torch, handles[r].recv_src_metadata))
        s = ref.sort_by_source(g)
        for field in ("recv_x", "recv_scale_packs", "recv_src_metadata", "recv_topk_weights"):
            dispatch_ok &= getattr(s, field).tobytes() == getattr(expected[r], field).tobytes()
        got.append(g)
    want = ref.combine([to_numpy(torch, y) for y in ys], got,
                       topk_weights=[g.recv_topk_weights for g in got])
    combine_ok = all(
        to_numpy(torch, combined[r]).tobytes() == want[r].combined_x.tobytes()
        and to_numpy(torch, combined_w[r]).tobytes() == want[r].combined_topk_weights.tobytes()
        for r in range(R))

    received = [h.num_recv_tokens for h in handles]
    rows = [h.num_expanded_tokens for h in handles]
    print(f"epic quickstart: DeepEP V3 (hidden {HIDDEN}, {EXPERTS} experts, top-{TOPK}, FP8 with "
          f"{HIDDEN // GROUP} scales per token, expanded, alignment {ALIGNMENT})")
    print(f"  world: {R} virtual ranks on {torch.cuda.get_device_name()}, "
          f"{buffer.num_bytes >> 20} MiB buffer per rank, {handles[0].num_sms} SMs per rank")
    print(f"  tokens sent per rank:     {counts}")
    print(f"  tokens received per rank: {received}")
    print(f"  expanded rows per rank:   {rows}")
    print(f"  first dispatch (kernels from the cache or compiled): {first * 1e3:.1f} ms")
    print(f"  dispatch {begin.elapsed_time(mid):.3f} ms, combine {mid.elapsed_time(end):.3f} ms "
          f"(all {R} ranks, CPU sync included)")
    print(f"  dispatch vs epic.reference (rows, scales, weights, metadata): "
          f"{'ok' if dispatch_ok else 'MISMATCH'}")
    print(f"  combine vs epic.reference (bitwise, weights back): "
          f"{'ok' if combine_ok else 'MISMATCH'}")
    buffer.destroy()
    return 0 if dispatch_ok and combine_ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per rank (at most)")
    parser.add_argument("--dump-ir", action="store_true",
                        help="print the IR at each stage and the PTX")
    parser.add_argument("--cache-dir", default=None, help="kernel cache (default $EPIC_CACHE_DIR)")
    args = parser.parse_args()
    from epic import _C

    if _C.cuda_device_count() == 0:
        print("epic quickstart: no CUDA GPU here, so nothing runs; the compiler does not need one.")
        print(f"Compiling the DeepEP V3 kernels for {args.ranks} virtual ranks, "
              f"{args.tokens} tokens per rank:")
        show_compiler(args)
        print("On a machine with a GPU the same command dispatches, combines and checks.")
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("epic quickstart: a GPU is here but torch is not installed (pip install torch)")
        return 1
    return run_on_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
