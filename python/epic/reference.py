"""Executable numpy specification of DeepEP V2 dispatch/combine semantics (and, from
``_reference_collectives``, of its all-gather, Engram and PP primitives, with reduce-scatter).

The whole expert-parallel world of ``R`` ranks is simulated in one process:
every per-rank quantity is passed as a Python list with one array per rank
(``xs[r]`` is rank ``r``'s ``[T_r, H]`` input, ...). Nothing here models
communication or timing; only *what* ends up where, bit for bit.

Conventions (DeepEP V2 direct mode, ``allow_multiple_reduction=True``):

* ``E`` experts are split evenly: expert ``e`` lives on rank ``e // (E/R)``
  with local id ``e % (E/R)``.
* ``topk_idx[t, j] == -1`` means "no expert"; such slots are ignored
  everywhere. A token is sent once per destination rank that owns at least
  one of its experts.
* The *master slot* of a (token, destination rank) pair is the highest top-k
  position whose expert lives on that rank. Combine adds rank contributions
  in increasing master-slot order, which makes the result bitwise
  reproducible.
* Received rows are in the canonical order: grouped by source rank
  ascending, then source token ascending. A real kernel may permute rows
  inside a group; :func:`sort_by_source` maps such output back to this order.

Topology (``gpus_per_node``, ``hybrid``; issue 21): the ``R = N * M`` ranks
are N nodes of M (``gpus_per_node``) ranks, numbered node-major:
``node(r) = r // M``, ``lsa(r) = r % M``. Direct mode (the default) does not
depend on the topology. Hybrid mode (DeepEP's ``allow_hybrid_mode`` with more
than one node) sends a token once per destination node, over the network, to
its *forwarder* there, the rail peer ``F = node(d) * M + lsa(src)`` (the
source itself for its own node), which forwards it over NVLink to each rank of
its node that owns one of the token's experts. What changes:

* dispatch: rows are grouped by forwarder index ``lsa(src)`` (all sources of
  that local index, from every node), then by source global id; the prefix
  sum per scale-up peer has M entries; ``recv_src_metadata[:, 1]`` depends on
  the forwarder's atomics, so the reference writes -1 there and
  :func:`check_hybrid_metadata` checks a kernel's;
* combine reduces in three stages (per rank, per node at the forwarder, at the
  origin), each in float32 rounded once to bfloat16;
* :func:`expected_network_bytes` gives the bytes that cross nodes.
"""


from __future__ import annotations

from . import _reference_collectives
from ._reference_checks import (  # noqa: F401 - the world limits are part of this API
    FP8_E4M3_MAX, MAX_EXPERT_ALIGNMENT, MAX_HYBRID_GPUS_PER_NODE, MAX_HYBRID_NODES, MAX_TOPK,
    align, bfloat16, float8_e4m3fn)
from ._reference_collectives import *  # noqa: F401,F403 - re-exported through __all__
from ._reference_combine import combine
from ._reference_dispatch import (CombineResult, DispatchResult, dispatch, dispatch_layout,
                                  sort_by_source)
from ._reference_experts import (generate_pre_combine_data, grouped_gemm, per_token_cast_back,
                                 per_token_cast_to_fp8, swiglu_fp8)
from ._reference_hybrid import check_hybrid_metadata, expected_network_bytes
from ._reference_low_latency import LowLatencyResult, low_latency_combine, low_latency_dispatch

__all__ = [
    "MAX_TOPK",
    "MAX_EXPERT_ALIGNMENT",
    "MAX_HYBRID_NODES",
    "MAX_HYBRID_GPUS_PER_NODE",
    "FP8_E4M3_MAX",
    "bfloat16",
    "float8_e4m3fn",
    "DispatchResult",
    "CombineResult",
    "align",
    "dispatch_layout",
    "dispatch",
    "combine",
    "grouped_gemm",
    "swiglu_fp8",
    "sort_by_source",
    "check_hybrid_metadata",
    "expected_network_bytes",
    "per_token_cast_to_fp8",
    "per_token_cast_back",
    "generate_pre_combine_data",
    "LowLatencyResult",
    "low_latency_dispatch",
    "low_latency_combine",
] + _reference_collectives.__all__  # DeepEP V2's other primitives
