"""Compile one @epic.jit kernel from the command line and print a stage (Triton's
``python -m triton.tools.compile``, for experimenting with the IR and for lit tests).

    python -m epic.dsl examples/dsl/dispatch_combine.py combine_send \\
        --arg y_ptr='*bf16' --arg meta_ptr='*i32' --arg count=i32 --arg win=window \\
        --arg H=128 --arg K=4 --arg BH=64 --arg TMAX=32 --arg COMBINE=4096 [--emit ir|ptx|metadata]

Arguments by name: ``*f32 *bf16 *f16 *fp8 *i8 *i32 *i64`` (a 16-byte aligned tensor of that
type), ``i32`` / ``i64`` / ``f32`` (a runtime scalar; ``i32=1`` the value 1, which Triton-style
specialization treats apart), ``window`` (the symmetric window), or a Python literal for an
``el.constexpr``. The emitted IR parses with ``epic-opt``; PTX is what ptxas sees.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys

import numpy as np

from .jit import JITFunction, SymmetricMemory

_TENSORS = {"f32": "float32", "f16": "float16", "i8": "uint8", "i32": "int32", "i64": "int64"}


def _tensor_dtype(name):
    import ml_dtypes

    special = {"bf16": ml_dtypes.bfloat16, "fp8": ml_dtypes.float8_e4m3fn}
    if name in special:
        return np.dtype(special[name])
    if name in _TENSORS:
        return np.dtype(_TENSORS[name])
    raise ValueError(f"unknown tensor type *{name} (one of *" +
                     " *".join(sorted(list(_TENSORS) + list(special))) + ")")


def argument(spec: str, constexpr: bool):
    """A stand-in value with the specialization `spec` describes."""
    if constexpr:
        try:
            return ast.literal_eval(spec)
        except (ValueError, SyntaxError):
            return spec  # a string constexpr
    if spec.startswith("*"):
        return np.zeros(16, _tensor_dtype(spec[1:]))  # numpy's allocations are 16-byte aligned
    if spec == "window":
        return SymmetricMemory(1, 16)
    kind, _, value = spec.partition("=")
    if kind in ("i32", "i64"):
        return int(value) if value else 2  # any value but 1 compiles the general kernel
    if kind == "f32":
        return float(value) if value else 0.5
    raise ValueError(f"argument spec {spec!r}: *<type>, i32, i64, f32, window, or a constexpr "
                     "literal")


def load_kernel(path, name) -> JITFunction:
    if not os.path.exists(path):
        raise SystemExit(f"error: {path}: no such file")
    spec = importlib.util.spec_from_file_location("epic_dsl_user_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    kernel = getattr(module, name, None)
    if not isinstance(kernel, JITFunction):
        found = sorted(k for k, v in vars(module).items() if isinstance(v, JITFunction))
        raise SystemExit(f"error: {path} has no @epic.jit kernel {name!r} (it has: "
                         f"{', '.join(found) or 'none'})")
    return kernel


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m epic.dsl",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("kernel")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=SPEC")
    parser.add_argument("--emit", choices=["ir", "ptx", "metadata"], default="ir")
    parser.add_argument("--num-warps", type=int, default=4)
    parser.add_argument("--backend", choices=["virtual", "nccl"], default="virtual")
    parser.add_argument("--abi", choices=["direct", "runtime"], default="direct")
    parser.add_argument("--ranks", type=int, default=1,
                        help="with --abi runtime: the world size of the buffers it runs on (the "
                             "by-value parameter table holds a record per rank on the virtual "
                             "backend)")
    args = parser.parse_args(argv)

    kernel = load_kernel(args.file, args.kernel)
    specs = {}
    for item in args.arg:
        name, sep, spec = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --arg {item!r}: NAME=SPEC")
        specs[name] = spec
    parameters = list(kernel.signature.parameters)
    unknown = sorted(set(specs) - set(parameters))
    if unknown:
        raise SystemExit(f"error: {args.kernel} has no parameter {', '.join(unknown)} (it has "
                         f"{', '.join(parameters)})")
    missing = [p for p in parameters if p not in specs and
               kernel.signature.parameters[p].default is kernel.signature.parameters[p].empty]
    if missing:
        raise SystemExit(f"error: {args.kernel}: give --arg for {', '.join(missing)}")
    try:
        values = {n: argument(s, n in kernel.constexprs) for n, s in specs.items()}
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    from .codegen import CompileError

    try:
        compiled = kernel.compile(num_warps=args.num_warps, backend=args.backend, abi=args.abi,
                                  ranks=args.ranks, **values)
    except CompileError as e:
        raise SystemExit(f"error: {e}") from None
    if args.emit == "metadata":
        print(json.dumps(compiled.metadata, indent=2))
    else:
        if args.emit not in compiled.asm:
            raise SystemExit("error: no PTX here (the IR came from the DSL cache; the compiler "
                             "epic._ir is built where LLVM/MLIR are)")
        sys.stdout.write(compiled.asm[args.emit])
    return 0


if __name__ == "__main__":
    sys.exit(main())
