"""DeepEP's environment variables, read by epic where they mean something for it.

One table (``VARIABLES``) says what epic does with each ``EP_*`` variable DeepEP V2 reads; the
rest of epic asks this module instead of reading ``os.environ`` itself. Variables that do not
apply to epic (its NIC probing, NVCC flags, NCCL library checks) get one warning naming them,
the first time ``epic.deep_ep`` is imported with them set.
"""

from __future__ import annotations

import os
import sys
import warnings

# name -> (status, what epic does). status: "honoured" or "not applicable".
VARIABLES = {
    "EP_JIT_CACHE_DIR": ("honoured", "the kernel cache directory (as EPIC_CACHE_DIR, which wins "
                                     "when both are set)"),
    "EP_JIT_DUMP_PTX": ("honoured", "prints where each loaded kernel set's PTX is (the cache "
                                    "keeps kernels.ptx with every cubin)"),
    "EP_JIT_DUMP_SASS": ("honoured", "writes kernels.sass next to each loaded cubin (cuobjdump "
                                     "-sass) and prints its path"),
    "EP_JIT_DUMP_ASM": ("honoured", "both of the above"),
    "EP_BUFFER_DEBUG": ("honoured", "prints each buffer's size, world, SMs and host segment when "
                                    "it is created"),
    "EP_NUM_TOPK_IDX_BITS": ("honoured", "topk_idx_t is torch.int8/16/32/64; epic.deep_ep's "
                                         "dispatch returns recv_topk_idx in it"),
    "EP_AVOID_RECORD_STREAM": ("honoured", "async calls keep their tensors alive in the "
                                           "returned event instead of record_stream"),
    "EP_REUSE_NCCL_COMM": ("honoured", "0: epic creates its own communicator instead of "
                                       "splitting PyTorch's (as EPIC_REUSE_NCCL_COMM)"),
    "EP_DISABLE_GIN": ("not applicable", "epic requests GIN only for worlds of several NVLink "
                                         "domains, which need it"),
    "EP_SUPPRESS_NCCL_CHECK": ("not applicable", "epic checks the NCCL version its kernels were "
                                                 "built for, by name, not the library's bytes"),
    "EP_NIC_NAME": ("not applicable", "epic does not probe the NIC (ibstat); pass rdma_gbs to "
                                      "get_theoretical_num_sms"),
    "EP_OVERRIDE_RDMA_SL": ("not applicable", "epic sets no RDMA service level"),
    "EP_NUM_MAX_LOCAL_RANKS": ("not applicable", "epic sizes NCCL windows without it"),
    "EP_JIT_DEBUG": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_JIT_NVCC_COMPILER": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_JIT_CPP_STANDARD": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_JIT_PRINT_COMPILER_COMMAND": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_JIT_PTXAS_VERBOSE": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_JIT_PTXAS_CHECK": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_JIT_WITH_LINEINFO": ("not applicable", "epic's compiler is MLIR, not NVCC"),
    "EP_GIN_GDAKI_DEBUG": ("not applicable", "a macro of DeepEP's CUDA sources"),
}

_TOPK_BITS = (8, 16, 32, 64)
_warned = False


def _set(name):
    value = os.environ.get(name)
    return value is not None and value not in ("", "0")


def topk_idx_bits():
    """``EP_NUM_TOPK_IDX_BITS`` (default 64), refused by name when it is not a width epic's
    kernels read."""
    text = os.environ.get("EP_NUM_TOPK_IDX_BITS", "64")
    try:
        bits = int(text)
    except ValueError:
        bits = -1
    if bits not in _TOPK_BITS:
        raise ValueError(f"EP_NUM_TOPK_IDX_BITS={text!r}: top-k ids are 8, 16, 32 or 64-bit "
                         "integers")
    return bits


def topk_idx_dtype():
    import torch

    return {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[topk_idx_bits()]


def avoid_record_stream():
    return _set("EP_AVOID_RECORD_STREAM")


def buffer_debug():
    return _set("EP_BUFFER_DEBUG")


def dump_ptx():
    return _set("EP_JIT_DUMP_PTX") or _set("EP_JIT_DUMP_ASM")


def dump_sass():
    return _set("EP_JIT_DUMP_SASS") or _set("EP_JIT_DUMP_ASM")


def apply():
    """What DeepEP's import does with its variables, done for epic: the cache directory and
    the communicator reuse become epic's own settings (unless those are set), topk_idx_t's
    width is checked, and the variables that do not apply are named once."""
    global _warned
    if os.environ.get("EP_JIT_CACHE_DIR") and not os.environ.get("EPIC_CACHE_DIR"):
        os.environ["EPIC_CACHE_DIR"] = os.environ["EP_JIT_CACHE_DIR"]
    if "EP_REUSE_NCCL_COMM" in os.environ and "EPIC_REUSE_NCCL_COMM" not in os.environ:
        os.environ["EPIC_REUSE_NCCL_COMM"] = os.environ["EP_REUSE_NCCL_COMM"]
    topk_idx_bits()
    ignored = sorted(name for name, (status, _) in VARIABLES.items()
                     if status == "not applicable" and name in os.environ)
    if ignored and not _warned:
        _warned = True
        warnings.warn("epic.deep_ep: these DeepEP variables do not apply to epic and are "
                      "ignored: " + ", ".join(f"{n} ({VARIABLES[n][1]})" for n in ignored),
                      stacklevel=3)


def note_kernels(runtime, kind, spec, variant):
    """EP_JIT_DUMP_PTX / _SASS: where the kernel set of one plan lies (printed once each)."""
    import subprocess

    info = runtime.kernels(spec, variant, kind)
    entry = os.path.join(runtime.cache_dir, "kernels", info["key"])
    if entry in _noted:
        return
    _noted.add(entry)
    if dump_ptx():
        print(f"epic: {kind} kernels' PTX: {os.path.join(entry, 'kernels.ptx')}", file=sys.stderr)
    if dump_sass():
        sass = os.path.join(entry, "kernels.sass")
        try:
            with open(sass, "w") as out:
                subprocess.run(["cuobjdump", "-sass", os.path.join(entry, "kernels.cubin")],
                               stdout=out, stderr=subprocess.PIPE, check=True)
            print(f"epic: {kind} kernels' SASS: {sass}", file=sys.stderr)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"epic: EP_JIT_DUMP_SASS: cuobjdump -sass failed for {entry} ({e})",
                  file=sys.stderr)


_noted = set()


def table():
    """Every DeepEP variable, its status in epic and what epic does with it, one per line."""
    width = max(len(name) for name in VARIABLES)
    return "\n".join(f"{name:<{width}}  {status:<14}  {what}"
                     for name, (status, what) in sorted(VARIABLES.items()))


if __name__ == "__main__":  # python -m epic._deepep_env
    print(table())
