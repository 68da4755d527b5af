"""Bounded fuzzing: hostile inputs must get a clean error, never a crash.

    python3 tools/fuzz.py [--seconds 120] [--seed 1] [--build-dir build]

Three targets, each for a share of the time budget, from fixed seeds:

* IR: the split cases of every .mlir test file, mutated (tokens swapped for other tokens of the
  corpus, numbers replaced by extreme values, lines dropped or duplicated, bytes flipped), through
  `epic-opt` with the verifier alone, `--convert-ep-to-comm`, and `--convert-comm-to-nvvm` of both
  backends. A diagnostic and exit status 1 is the expected answer to a bad input; a signal, an
  assertion, "LLVM ERROR" or a stack dump is a failure.
* the pipeline: `epic-compile --no-cubin` (convert-ep-to-comm through PTX) of the mutated cases, the
  same rule.
* run plans: `epic-compile --run-plan` of mutated ep programs (examples/run), the same rule.
* configurations: random dispatch / cached dispatch / combine configurations (1 to 12 ranks,
  odd counts included, top-k 1 to 9, hidden up to 8192, every dtype, plain and expanded,
  alignments, weights, biases, zero padding) compiled by the runtime (`epic._C.Runtime.kernels`,
  through convert-ep-to-comm, the pipeline and ptxas): a valid one must compile, an invalid one
  must be a named ValueError / TypeError.
* Python: ElasticBuffer, dispatch and combine (numpy inputs: every check runs without a GPU) and
  epic.reference with random hostile arguments: TypeError or ValueError naming an argument is the
  expected answer; any other exception type is a failure.

Prints the inputs tried per target and per minute; exits 1 listing the failing inputs (written
under --out) when any input crashed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRASH_MARKS = ("Assertion", "LLVM ERROR", "Stack dump", "PLEASE submit a bug report",
               "Segmentation fault", "terminate called", "UNREACHABLE")
EXTREMES = ["0", "-1", "1", "-2147483648", "2147483647", "2147483648", "4294967295",
            "4294967296", "9223372036854775807", "-9223372036854775808",
            "18446744073709551616", "1099511627776", "65536", "1024", "1025", "3", "7"]


# --- IR ----------------------------------------------------------------------------------------


def ir_corpus():
    """Every `// -----` case of the IR tests and the examples (without RUN lines)."""
    cases = []
    for path in (sorted((ROOT / "test").rglob("*.mlir"))
                 + sorted((ROOT / "examples").rglob("*.mlir"))):
        text = "\n".join(line for line in path.read_text().splitlines()
                         if "RUN:" not in line and "expected-" not in line)
        cases += [c for c in text.split("// -----") if c.strip()]
    return cases


TOKEN = re.compile(r"%[\w.]+|#[\w.]+|@[\w.]+|!\w+(?:\.\w+)*|-?\d+|\w+|[^\s\w]")


def mutate_ir(rng, text, tokens):
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        lines = text.splitlines()  # of the text as mutated so far: it may have lost every line
        if kind == 0:  # a number -> an extreme value
            numbers = list(re.finditer(r"-?\b\d+\b", text))
            if numbers:
                m = rng.choice(numbers)
                text = text[:m.start()] + rng.choice(EXTREMES) + text[m.end():]
        elif kind == 1:  # a token -> another token of the corpus
            found = list(TOKEN.finditer(text))
            if found:
                m = rng.choice(found)
                text = text[:m.start()] + rng.choice(tokens) + text[m.end():]
        elif kind == 2 and lines:  # drop a line
            del lines[rng.randrange(len(lines))]
            text = "\n".join(lines)
        elif kind == 3 and lines:  # duplicate a line
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            text = "\n".join(lines)
        elif text:  # flip a character
            i = rng.randrange(len(text))
            text = text[:i] + chr(rng.randrange(32, 127)) + text[i + 1:]
    return text


def crashed(proc):
    """Whether a driver's answer is a crash rather than a diagnostic."""
    if proc.returncode < 0 or proc.returncode > 2:
        return True
    err = proc.stderr.decode(errors="replace")
    return any(mark in err for mark in CRASH_MARKS)


def run_tool(argv, stdin, timeout=20):
    try:
        return subprocess.run(argv, input=stdin.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None  # a hang is a failure too


# --- Python ------------------------------------------------------------------------------------


def python_case(rng):
    """(description, callable) of one hostile Python call."""
    import ml_dtypes
    import numpy as np

    import epic
    from epic import reference as ref

    values = [0, -1, 1, 2, 3, 2**31, 2**40, -2**63, 1.5, True, None, "x", [], (), {}, object(),
              np.int64(4), float("nan")]
    R, E, K, H = 2, 8, 2, 64

    def good_inputs(tokens=3):
        idx = [np.array([rng.sample(range(E), K) for _ in range(tokens)], np.int64)
               for _ in range(R)]
        xs = [np.zeros((tokens, H), ml_dtypes.bfloat16) for _ in range(R)]
        return xs, idx

    kind = rng.randrange(4)
    if kind == 0:  # the constructor
        name = rng.choice(["num_bytes", "num_max_tokens_per_rank", "hidden", "num_topk",
                           "use_fp8_dispatch", "num_sms", "num_gpu_timeout_secs",
                           "num_cpu_timeout_secs", "sl_idx", "cache_dir", "output_pool_bytes",
                           "num_allocated_qps", "deterministic"])
        value = rng.choice(values)
        args = dict(num_bytes=2 << 20)
        args[name] = value
        return (f"ElasticBuffer({name}={value!r})",
                lambda: epic.ElasticBuffer(epic.VirtualWorld(R), **args))
    if kind == 1:  # dispatch
        name = rng.choice(["num_experts", "num_max_tokens_per_rank", "expert_alignment",
                           "num_sms", "num_qps", "do_expand", "do_cpu_sync", "do_zero_padding",
                           "previous_event", "topk_weights", "x", "topk_idx", "handle"])
        value = rng.choice(values)
        xs, idx = good_inputs()
        args = dict(x=xs, topk_idx=idx, num_experts=E, num_max_tokens_per_rank=16)
        if name in ("x", "topk_idx") and rng.random() < 0.5:  # one rank's entry
            entries = list(args[name])
            entries[rng.randrange(R)] = value
            value = entries
        args[name] = value
        buffer = epic.ElasticBuffer(epic.VirtualWorld(R), num_bytes=2 << 20)
        return f"dispatch({name}={value!r})", lambda: buffer.dispatch(**args)
    if kind == 2:  # the reference's dispatch
        name = rng.choice(["num_experts", "num_max_tokens_per_rank", "expert_alignment",
                           "expand", "scale_packs"])
        value = rng.choice(values)
        xs, idx = good_inputs()
        args = dict(num_experts=E, num_max_tokens_per_rank=16)
        args[name] = value
        return (f"reference.dispatch({name}={value!r})",
                lambda: ref.dispatch(xs, idx, **args))
    # the reference's align and combine
    value, other = rng.choice(values), rng.choice(values)
    if rng.random() < 0.5:
        return f"reference.align({value!r}, {other!r})", lambda: ref.align(value, other)
    xs, idx = good_inputs()
    handles = ref.dispatch(xs, idx, num_experts=E, num_max_tokens_per_rank=16)
    ys = [np.zeros((h.recv_x.shape[0], H), ml_dtypes.bfloat16) for h in handles]
    slot = rng.randrange(3)
    args = [ys, list(handles), None]
    args[slot] = value if rng.random() < 0.5 else [value] * R
    return (f"reference.combine(arg {slot} = {value!r})",
            lambda: ref.combine(args[0], args[1], topk_weights=args[2]))


def config_case(rng, runtime):
    """(description, callable) compiling the kernels of one random configuration."""
    ranks = rng.choice([1, 2, 3, 5, 6, 7, 8, 12])
    experts = ranks * rng.choice([1, 2, 3, 4, 8, 16])
    fp8 = rng.random() < 0.5
    dtype = rng.choice(["f8E4M3FN", "f8E5M2"]) if fp8 else rng.choice(["bf16", "f16", "f32"])
    spec = dict(num_ranks=ranks, num_experts=experts, num_topk=rng.randint(1, min(9, experts)),
                hidden=8 * rng.randint(1, 1024), dtype=dtype,
                num_scale_packs=rng.randint(1, 64) if fp8 else 0,
                expert_alignment=rng.choice([1, 2, 3, 64, 128, 1024]),
                do_expand=rng.random() < 0.5, num_max_tokens_per_rank=rng.choice([1, 7, 128, 4096]))
    if rng.random() < 0.5:
        variant = dict(weights=rng.random() < 0.5, biases=rng.randint(0, 2))
        spec.update(dtype="bf16", num_scale_packs=0)  # combine sends bf16 rows
        kind = "combine"
    else:
        cached = rng.random() < 0.3
        variant = dict(weights=not cached and rng.random() < 0.5, cached=cached,
                       zero_padding=spec["do_expand"] and rng.random() < 0.5)
        kind = "dispatch"
    return f"kernels({spec}, {variant}, {kind!r})", lambda: runtime.kernels(spec, variant, kind)


# --- driver ------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--out", default="/tmp/epic-fuzz")
    args = parser.parse_args()
    build = pathlib.Path(args.build_dir)
    opt, compiler = build / "bin" / "epic-opt", build / "bin" / "epic-compile"
    for tool in (opt, compiler):
        if not tool.exists():
            sys.exit(f"fuzz: {tool} is missing: build first (./install.sh)")
    sys.path.insert(0, str(ROOT / "python"))
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    corpus = ir_corpus()
    tokens = sorted({t for c in corpus for t in TOKEN.findall(c)})
    programs = [p.read_text() for p in sorted((ROOT / "examples" / "run").glob("*.mlir"))]
    passes = [[], ["--convert-ep-to-comm"], ["--convert-comm-to-nvvm=backend=virtual"],
              ["--convert-comm-to-nvvm=backend=nccl"]]
    failures, counts = [], {"ir": 0, "pipeline": 0, "run plans": 0, "configurations": 0,
                            "python": 0}
    shares = {"ir": 0.4, "pipeline": 0.15, "run plans": 0.1, "configurations": 0.15,
              "python": 0.2}
    from epic import _C

    runtime = _C.Runtime("virtual", os.path.join(args.out, "kernels"), "")
    for target, share in shares.items():
        deadline = time.monotonic() + args.seconds * share
        started = time.monotonic()
        while time.monotonic() < deadline:
            counts[target] += 1
            if target == "ir":
                text = mutate_ir(rng, rng.choice(corpus), tokens)
                argv = [str(opt), "-", "--allow-unregistered-dialect"] + rng.choice(passes)
                proc, what = run_tool(argv, text), " ".join(argv[3:]) or "verify"
            elif target == "pipeline":
                text = mutate_ir(rng, rng.choice(corpus), tokens)
                argv = [str(compiler), "-", "--no-cubin", "-o", os.path.join(args.out, "ptx")]
                proc, what = run_tool(argv, text, timeout=60), "epic-compile --no-cubin"
            elif target == "run plans":
                text = mutate_ir(rng, rng.choice(programs), tokens)
                argv = [str(compiler), "-", "--run-plan", "-o", os.path.join(args.out, "plan")]
                proc, what = run_tool(argv, text, timeout=60), "epic-compile --run-plan"
            else:
                what, call = python_case(rng) if target == "python" else config_case(rng, runtime)
                try:
                    call()
                except (TypeError, ValueError):
                    pass
                except RuntimeError as e:  # "no CUDA device": every check passed
                    if "no CUDA device" not in str(e):
                        failures.append((target, what, f"{type(e).__name__}: {e}"))
                except Exception as e:  # noqa: BLE001 - what the fuzzer is looking for
                    failures.append((target, what, f"{type(e).__name__}: {e}"))
                continue
            if proc is None or crashed(proc):
                path = os.path.join(args.out, f"crash-{len(failures)}.mlir")
                pathlib.Path(path).write_text(text)
                detail = "timeout" if proc is None else proc.stderr.decode(errors="replace")[-400:]
                failures.append((target, f"{what} < {path}", detail))
        minutes = max(time.monotonic() - started, 1e-9) / 60
        print(f"fuzz: {target}: {counts[target]} inputs, {counts[target] / minutes:.0f} per minute",
              flush=True)
    for target, what, detail in failures[:20]:
        print(f"fuzz: FAILED {target}: {what}\n    {detail}")
    print(f"fuzz: {sum(counts.values())} inputs, {len(failures)} failures (seed {args.seed})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
