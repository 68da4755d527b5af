"""Where a group's ranks sit: nodes (NVLink domains) of GPUs, and the mode dispatch uses.

The physical layout is ``(num_nodes, gpus_per_node)``: a node is one NVLink domain (NCCL's
LSA team), ranks are numbered node-major (rank ``r`` is GPU ``r % gpus_per_node`` of node
``r // gpus_per_node``), as in DeepEP and NCCL. The logical layout is what the kernels use:
the physical one in hybrid mode (``allow_hybrid_mode`` and more than one node: a token crosses
the network once per node, then NVLink), else ``(1, num_ranks)``: direct mode, every rank a peer
of every other (NVLink inside the node, the network across nodes).

A :class:`epic.VirtualWorld` knows its layout. For a ``torch.distributed`` group the ranks
all-gather their host names (one node per host); the buffer later takes the NCCL
communicator's LSA team size, which also covers NVLink domains that span hosts.
"""

from __future__ import annotations

import socket

from . import _limits as LIM


def layout_from_hosts(hosts) -> tuple[int, int]:
    """``(num_nodes, gpus_per_node)`` of ranks whose host names are ``hosts`` (rank order).

    Every host must hold the same number of ranks, numbered node-major; anything else is
    refused, naming the first rank out of place."""
    hosts = list(hosts)
    if not hosts:
        raise ValueError("hosts: no ranks")
    per_node = 1
    while per_node < len(hosts) and hosts[per_node] == hosts[0]:
        per_node += 1
    if len(hosts) % per_node:
        raise ValueError(
            f"ranks per node: host {hosts[0]!r} holds ranks 0..{per_node - 1} ({per_node} ranks), "
            f"which does not divide the {len(hosts)} ranks; every node needs as many ranks")
    seen = set()
    for node in range(len(hosts) // per_node):
        name = hosts[node * per_node]
        if name in seen:
            raise ValueError(
                f"rank {node * per_node} is on host {name!r} again after other hosts: ranks must "
                "be numbered node-major (all ranks of one node, then the next node)")
        seen.add(name)
        for r in range(node * per_node, (node + 1) * per_node):
            if hosts[r] != name:
                raise ValueError(
                    f"rank {r} is on host {hosts[r]!r}, but ranks {node * per_node}.."
                    f"{(node + 1) * per_node - 1} should all be on {name!r}: every node needs "
                    f"{per_node} ranks, numbered node-major")
    return len(hosts) // per_node, per_node


def logical_layout(num_nodes: int, gpus_per_node: int, allow_hybrid_mode: bool) -> tuple[int, int]:
    """DeepEP's logical domain: ``(num_nodes, gpus_per_node)`` in hybrid mode, else
    ``(1, num_ranks)``."""
    if allow_hybrid_mode and num_nodes > 1:
        return num_nodes, gpus_per_node
    return 1, num_nodes * gpus_per_node


def check_hybrid(num_nodes: int, gpus_per_node: int) -> None:
    """Refuses a hybrid layout beyond DeepEP's bounds (``EPLimits.def``), naming the bound."""
    if not LIM.MIN_HYBRID_NODES <= num_nodes <= LIM.MAX_HYBRID_NODES:
        raise ValueError(
            f"allow_hybrid_mode: hybrid mode takes {LIM.MIN_HYBRID_NODES}.."
            f"{LIM.MAX_HYBRID_NODES} nodes, this group has {num_nodes}; pass "
            "allow_hybrid_mode=False for direct mode")
    if not LIM.MIN_HYBRID_RANKS_PER_NODE <= gpus_per_node <= LIM.MAX_HYBRID_RANKS_PER_NODE:
        raise ValueError(
            f"allow_hybrid_mode: hybrid mode takes at most {LIM.MAX_HYBRID_RANKS_PER_NODE} GPUs "
            f"per node, this group has {gpus_per_node}; pass allow_hybrid_mode=False")


def physical_layout(group) -> tuple[int, int]:
    """``(num_nodes, gpus_per_node)`` of a VirtualWorld or a ``torch.distributed`` group
    (collective over the group: its ranks all-gather their host names)."""
    from .buffer import VirtualWorld

    if isinstance(group, VirtualWorld):
        return group.num_nodes, group.gpus_per_node
    try:
        size = group.size()
    except AttributeError:
        raise TypeError("group: expected a torch.distributed ProcessGroup or an epic.VirtualWorld, "
                        f"got {type(group).__name__}") from None
    if size == 1:
        return 1, 1
    import torch.distributed as dist

    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return layout_from_hosts(hosts)


def get_physical_domain_size(group) -> tuple[int, int]:
    """DeepEP's ``get_physical_domain_size(group)``: ``(num_rdma_ranks, num_nvlink_ranks)``,
    i.e. nodes and GPUs per node."""
    return physical_layout(group)


def get_logical_domain_size(group, allow_hybrid_mode: bool = True) -> tuple[int, int]:
    """DeepEP's ``get_logical_domain_size(group, allow_hybrid_mode=True)``:
    ``(num_scaleout_ranks, num_scaleup_ranks)``."""
    if not isinstance(allow_hybrid_mode, bool):
        raise TypeError(f"allow_hybrid_mode: expected a bool, got "
                        f"{type(allow_hybrid_mode).__name__}")
    return logical_layout(*physical_layout(group), allow_hybrid_mode)
