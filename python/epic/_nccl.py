"""Which NCCL communicator an ``ElasticBuffer`` of a ``torch.distributed`` group runs on.

epic never issues collectives on PyTorch's communicator: it splits its own from it
(``ncclCommSplit`` in the runtime), so its barriers cannot interleave with PyTorch's
collectives from other threads and the buffer outlives the process group. The split reads
PyTorch's communicator with epic's NCCL library, so both must be the same NCCL release;
otherwise (or with ``EPIC_REUSE_NCCL_COMM=0``) epic makes a new communicator from a unique id.
"""

from __future__ import annotations

import os


def torch_nccl_version(torch):
    """torch.cuda.nccl.version() as an NCCL_VERSION_CODE-like tuple, or None if torch has no
    NCCL (older torch returns the code as an int, newer a (major, minor, patch) tuple)."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, int):
        return version_triple(version)
    return tuple(int(v) for v in version[:3])


def version_triple(code: int) -> tuple:
    """(major, minor, patch) of an NCCL_VERSION_CODE: X*10000 + Y*100 + Z, below 2.9
    X*1000 + Y*100 + Z (nccl.h's NCCL_VERSION)."""
    if code >= 10000:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def torch_nccl_mismatch(torch_version, loaded_code: int):
    """None if epic may split PyTorch's communicator: torch's NCCL is exactly (major.minor.patch)
    the NCCL epic loaded; else why not (a communicator is a struct of one NCCL release)."""
    epic_version = version_triple(loaded_code)
    name = ".".join(map(str, epic_version))
    if torch_version is None:
        return f"torch reports no NCCL version (epic's is {name})"
    if tuple(torch_version) != epic_version:
        return (f"torch's NCCL is {'.'.join(map(str, torch_version))} but epic's is {name}: "
                "epic makes its own communicator")
    return None


def pytorch_comm(group, C) -> tuple[int, str]:
    """PyTorch's NCCL communicator of ``group`` to split epic's from, if every rank can, and
    why not where not (collective over ``group``)."""
    import torch
    import torch.distributed as dist

    ptr, reason = 0, "EPIC_REUSE_NCCL_COMM=0"
    if os.environ.get("EPIC_REUSE_NCCL_COMM", "1") != "0":
        reason = torch_nccl_mismatch(torch_nccl_version(torch), C.nccl_loaded_version())
        if reason is None:
            dist.barrier(group=group)  # PyTorch creates its communicator lazily
            try:
                backend = group._get_backend(torch.device("cuda", torch.cuda.current_device()))
                ptr = int(backend._comm_ptr())
                reason = "" if ptr else "the process group has no NCCL communicator"
            except (AttributeError, RuntimeError, TypeError) as error:
                reason = f"PyTorch did not give its communicator ({error})"
    everyone = torch.tensor([1 if ptr else 0], device="cuda")
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN, group=group)
    if int(everyone.item()):
        return ptr, ""
    return 0, reason or "another rank cannot split PyTorch's communicator"


def broadcast_unique_id(group, rank: int, C) -> bytes:
    """Rank 0's new NCCL unique id, on every rank of ``group``."""
    import torch.distributed as dist

    box = [C.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]
