"""Post-processing of received rows: canonical order (deterministic buffers) and DeepEP's
TMA-aligned column-major scale packs."""

from __future__ import annotations

__all__ = ["sort_received", "tma_col_major"]


def sort_received(full, n, rows, expand, num_local, aligned_counts, forwarder_groups=None):
    """Puts a rank's received rows in canonical order (by source rank, then
    token; expanded: inside each expert block, padding last) and rewrites the
    handle's metadata so that the kernels find every row where it now is.
    Hybrid mode (`forwarder_groups` = (Tmax, M)): by forwarder index lsa(src)
    first, as the prefix sums per forwarder index group the rows.

    Returns (order of the returned rows: new -> old, the order to apply to a
    cached dispatch's rows, the metadata to show in the handle). Plain: the
    metadata rows move with the data rows (combine pairs them by index),
    `full["recv_row_of_slot"]` says where each slot's row went (a one-pass
    combine reads a contribution at its slot's row), and a cached dispatch
    still writes rows in the first dispatch's slot order, so its rows are
    reordered too. Expanded: the metadata rows stay in slot order
    (a cached dispatch reads them by slot) and their row indices are remapped,
    so a cached dispatch writes straight into the sorted rows.
    """
    import torch

    meta = full["recv_src_metadata"]
    gid = meta[:n, 0].long()
    key = gid
    if forwarder_groups is not None:
        tmax, m = forwarder_groups
        key = gid // tmax % m * (int(gid.max().item()) + 1 if n else 1) + gid
    tokens = torch.argsort(key)
    if not expand:
        meta[:n] = meta[:n].index_select(0, tokens)
        row_of_slot = torch.arange(meta.shape[0], dtype=torch.int32, device=meta.device)
        row_of_slot[tokens] = torch.arange(n, dtype=torch.int32, device=meta.device)
        full["recv_row_of_slot"] = row_of_slot
        return tokens, tokens, meta[:n]
    device = meta.device
    slots = meta[:n, 2:].long()
    owner = torch.full((rows,), -1, dtype=torch.long, device=device)
    used = slots >= 0
    owner[slots[used]] = key[:, None].expand_as(slots)[used]
    expert = torch.repeat_interleave(torch.arange(num_local, device=device),
                                     torch.tensor(aligned_counts, device=device), output_size=rows)
    position = torch.arange(rows, device=device)
    span = int(key.max().item()) + 1 + rows if n else rows + 1
    key = expert * span + torch.where(owner >= 0, owner, span - rows + position)
    order = torch.argsort(key)
    new_of_old = torch.empty_like(order)
    new_of_old[order] = torch.arange(rows, device=device)
    meta[:n, 2:] = torch.where(slots >= 0, new_of_old[slots.clamp(min=0)], slots).to(meta.dtype)
    return order, None, meta[:n].index_select(0, tokens)


def tma_col_major(sf):
    """Scale packs column-major with the token dimension padded to 4 (16 bytes)."""
    import torch

    rows, packs = sf.shape
    padded = (rows + 3) // 4 * 4
    storage = torch.empty((packs, padded), dtype=sf.dtype, device=sf.device)
    storage[:, :rows].copy_(sf.t())
    return storage.as_strided((rows, packs), (1, padded))

