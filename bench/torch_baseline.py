"""Dispatch/combine in plain PyTorch on one device that holds every rank's tensors (a virtual
world of R ranks): the baselines of bench/ep_bench.py.

* `TorchEP`, vectorized: what a skilled engineer writes without a communication library. The
  routing layout comes from one `nonzero` over a [destination, source token] mask, the rows
  move with one `index_select` into persistent outputs, and each combine stage is one gather
  of the rows to sum, bags sorted by size, and one sum per size (float32 accumulation, one
  rounding to bf16). The reference of every speed-up ratio. (Measured on the H200 at V3
  sizes: this combine takes 0.46-0.64x the time of `embedding_bag`, whose kernel reaches
  11-16% of the copy bandwidth; cuSPARSE's CSR SpMM, through `sparse_csr_tensor @ y`, is
  faster still but sums bf16 at reduced precision, further from the exact sum than bf16
  rounding.)
* `NaiveTorchEP`: a loop over (destination, source) pairs with host syncs. Kept, labelled
  "naive", for its combine, which is bitwise DeepEP's (master-slot order).

Both take the torch module as an argument and import nothing at load time (ep_bench imports
torch only where there is a GPU; the tests run on CPU tensors). Received rows come out in the
canonical order of epic.reference: by source rank, then token; expanded rows by local expert
(each block padded to the alignment), then source rank and token.
"""

from __future__ import annotations


# --- the vectorized implementation ---------------------------------------------------------------


def joined(t, parts):
    """The ranks' tensors (rows of each) as one: a view where they lie back to back in one
    allocation (ep_bench hands the baseline such a copy of the ranks' inputs, kept as one device
    holding every rank would keep them), else a copy made here."""
    first = parts[0]
    end = first.data_ptr()
    for part in parts:
        if (not part.is_contiguous() or part.data_ptr() != end or part.dtype != first.dtype
                or part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return t.cat(parts)
        end += part.numel() * part.element_size()
    rows = sum(part.shape[0] for part in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


def as_words(t, parts):
    """Each part's rows as the widest integers that their bytes (and every part's start) divide
    into: index kernels copy one element per thread, so 8-byte words move an FP8 row in an
    eighth of the steps that bytes would (and index ops need no FP8 support)."""
    for dtype in (t.int64, t.int32, t.int16, t.uint8):
        size = dtype.itemsize
        if all(p.shape[1] * p.element_size() % size == 0
               and p.storage_offset() * p.element_size() % size == 0 for p in parts):
            return [p.view(t.uint8).view(dtype) for p in parts]
    raise AssertionError("unreachable: bytes always divide")


class Bags:
    """Groups ("bags") of rows to sum, one per output row, made by the dispatch (part of its
    handle) for the combine: `index`, every bag's rows, bags sorted by size (one gather);
    `counts[c]`, the bags of c rows (one sum each size); `pos[b]`, bag b's place in size order.
    """

    __slots__ = ("index", "counts", "pos")


def make_bags(t, rows, sizes, K):
    """Bags of `sizes` [n] (at most K) rows each, their rows `rows` bag after bag. Returns the
    bags and their counts per size as a device tensor (`counts` is set once read back)."""
    total = rows.numel()
    order = sizes.argsort(stable=True)
    by_size = sizes[order]
    start = sizes.cumsum(0) - sizes
    # output_size: repeat_interleave would otherwise read the total back (a host sync).
    begin = (by_size.cumsum(0) - by_size).repeat_interleave(by_size, output_size=total)
    first = start[order].repeat_interleave(by_size, output_size=total)
    bags = Bags()
    bags.index = rows[first + t.arange(total, device=rows.device) - begin]
    bags.pos = t.empty_like(order)
    bags.pos[order] = t.arange(order.numel(), device=order.device)
    # Counted on the sorted sizes: atomic adds into K + 1 counters contend (0.14 ms here).
    return bags, t.searchsorted(by_size, t.arange(K + 2, device=rows.device)).diff()


class Dispatched:
    """One dispatch's per-destination outputs (views of persistent buffers) and the routing
    the combine reuses (the handle). `received[d]`: the global token ids (the ranks' tokens
    numbered one after the other) that rank d received, canonical order. `bags`: each source
    token's received rows (plain) or stage-one sums (expanded); `stage1`: each received
    token's expanded rows at its destination."""

    __slots__ = ("x", "sf", "topk_idx", "weights", "num_recv", "received", "expert_rows",
                 "tokens", "bags", "stage1", "pairs")


class TorchEP:
    """Vectorized dispatch/combine (DeepEP's semantics) over R ranks' tensors on one device."""

    def __init__(self, torch, R, E, K, alignment, expand):
        self.t, self.R, self.E, self.K, self.L = torch, R, E, K, E // R
        self.alignment, self.expand = alignment, expand
        self._buffers = {}

    def _out(self, name, rows, tail, dtype, device):
        """The first `rows` rows of a persistent buffer: allocated by the first call (outside
        the timed ones), grown only when a call needs more, as a real implementation's
        receive buffer is."""
        buf = self._buffers.get(name)
        if (buf is None or buf.shape[0] < rows or tuple(buf.shape[1:]) != tuple(tail)
                or buf.dtype != dtype or buf.device != device):
            buf = self.t.empty((rows, *tail), dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:rows]

    def _gather(self, name, src, index):
        """index_select of rows into the persistent buffer `name`."""
        out = self._out(name, index.numel(), src.shape[1:], src.dtype, src.device)
        return self.t.index_select(src, 0, index, out=out)

    def dispatch(self, xs, sfs, idxs, ws):
        """xs[r] [T_r, H] (bf16 or FP8), sfs[r] [T_r, P] 4-byte scale packs or None,
        idxs[r] [T_r, K] int64 (-1: none), ws[r] [T_r, K] float32. Host syncs: the nonzero
        calls and one read of the counts, as a layout that sizes its outputs needs."""
        t, R, K, L = self.t, self.R, self.K, self.L
        dtype = xs[0].dtype
        x = joined(t, as_words(t, xs))
        sf = None if sfs is None else joined(t, as_words(t, sfs))
        idx, w = joined(t, idxs), joined(t, ws)
        N, dev = idx.shape[0], idx.device
        h = Dispatched()
        h.tokens = [v.shape[0] for v in xs]

        dest = idx.div(L, rounding_mode="floor")  # -1 (no expert) is no rank's
        owned = dest.unsqueeze(0) == t.arange(R, device=dev).view(R, 1, 1)  # [R, N, K]
        slots = owned.sum(2)  # owned slots per (destination, token)
        routed = slots > 0
        d, g = routed.nonzero(as_tuple=True)  # by destination, then global token: canonical
        n = routed.sum(1)
        # The combine's bags: each source token's received rows (by destination rank).
        by_token = g.argsort(stable=True)

        if not self.expand:
            h.bags, counts = make_bags(t, by_token, routed.sum(0), K)
            host = t.cat([n, counts]).tolist()
            h.num_recv, h.bags.counts = host[:R], host[R:]
            h.received = list(g.split(h.num_recv))
            h.expert_rows, h.pairs, h.stage1 = None, None, None
            rows = self._gather("x", x, g)
            packs = None if sf is None else self._gather("sf", sf, g)
            weights = self._gather("w", w, g)
            ids = idx.index_select(0, g)
            local = self._out("idx", g.numel(), (K,), idx.dtype, dev)
            t.sub(ids, (d * L).unsqueeze(1), out=local)
            local.masked_fill_(ids.div(L, rounding_mode="floor") != d.unsqueeze(1), -1)
            h.x = [v.view(dtype) for v in rows.split(h.num_recv)]
            h.sf = None if packs is None else [v.view(sfs[0].dtype)
                                               for v in packs.split(h.num_recv)]
            h.weights = list(weights.split(h.num_recv))
            h.topk_idx = list(local.split(h.num_recv))
            return h

        # Expanded: one row per (token, local expert), blocks by global expert (= destination,
        # then local expert), rows in a block by token; each block padded to the alignment.
        A = self.alignment
        pg, pj = (idx >= 0).nonzero(as_tuple=True)  # (token, slot) pairs, by token then slot
        e = idx[pg, pj]
        by_expert = e.argsort(stable=True)
        count = t.searchsorted(e[by_expert], t.arange(self.E + 1, device=dev)).diff()
        aligned = (count + A - 1) // A * A
        shift = (aligned.cumsum(0) - aligned) - (count.cumsum(0) - count)  # padded - packed
        row = t.empty_like(e)
        row[by_expert] = t.arange(e.numel(), device=dev) + shift[e[by_expert]]
        # The combine's first stage sums each received token's rows at its destination (pairs
        # by destination, then token, slots ascending: the received tokens' order); the second
        # sums those per source token, found where the first stage leaves them (`pos`).
        stage1_rows = row[(e.div(L, rounding_mode="floor") * N + pg).argsort(stable=True)]
        h.stage1, counts1 = make_bags(t, stage1_rows, slots[d, g], K)
        h.bags, counts = make_bags(t, h.stage1.pos[by_token], routed.sum(0), K)
        host = t.cat([n, aligned, counts1, counts]).tolist()
        h.num_recv = host[:R]
        h.expert_rows = [host[R + r * L:R + (r + 1) * L] for r in range(R)]
        h.stage1.counts = host[R + self.E:R + self.E + K + 1]
        h.bags.counts = host[R + self.E + K + 1:]
        h.received = list(g.split(h.num_recv))
        h.pairs = (pg, pj, row)
        total = sum(host[R:R + self.E])
        # Padding rows copy token 0's row (their content is undefined, as epic's without
        # zero_padding): one index_select over the whole padded layout.
        source = self._out("source", total, (), t.int64, dev).zero_()
        source[row] = pg
        rows = self._gather("x", x, source)
        packs = None if sf is None else self._gather("sf", sf, source)
        weights = self._out("w", total, (), w.dtype, dev).zero_()
        weights[row] = w[pg, pj]
        per_rank = [sum(c) for c in h.expert_rows]
        h.x = [v.view(dtype) for v in rows.split(per_rank)]
        h.sf = None if packs is None else [v.view(sfs[0].dtype) for v in packs.split(per_rank)]
        h.weights = list(weights.split(per_rank))
        h.topk_idx = None
        return h

    def pair_rows(self, h):
        """([N, K] destination rank, [N, K] row in that rank's output) of each (global source
        token, slot) of the expanded layout, -1 where the slot has no expert. For checks, not
        timed."""
        t = self.t
        pg, pj, row = h.pairs
        starts = t.tensor([0] + [sum(c) for c in h.expert_rows], device=row.device).cumsum(0)
        rank = t.searchsorted(starts[1:], row, right=True)
        shape = (sum(h.tokens), self.K)
        ranks = t.full(shape, -1, dtype=t.int64, device=row.device)
        rows = t.full(shape, -1, dtype=t.int64, device=row.device)
        ranks[pg, pj] = rank
        rows[pg, pj] = row - starts[rank]
        return ranks, rows

    def _sum(self, name, y, bags):
        """Each bag's sum, bags in size order: bags of one row gathered straight into place,
        the others' rows in one gather, then one sum per size (a reduction over [n, c, H]:
        float32 accumulation, one rounding). 0 for an empty bag."""
        t, counts = self.t, bags.counts
        (words,) = as_words(t, [y])
        out = self._out(name, sum(counts), words.shape[1:], words.dtype, y.device)
        out[:counts[0]].zero_()
        lone = counts[0] + counts[1]
        t.index_select(words, 0, bags.index[:counts[1]], out=out[counts[0]:lone])
        rows = self._gather(name + "_rows", words, bags.index[counts[1]:]).view(y.dtype)
        sums = out.view(y.dtype)
        at, row = lone, 0
        for c, n in enumerate(counts[2:], start=2):
            if n:
                t.sum(rows[row:row + n * c].view(n, c, -1), 1, out=sums[at:at + n])
            at, row = at + n, row + n * c
        return out

    def combine(self, ys, h):
        """ys[d]: bf16 rows in the layout of dispatch's output `h`. Per source rank its tokens'
        sums over the ranks' rows (expanded: each rank's rows summed first, rounded to bf16,
        as epic does), float32 accumulation, one rounding; not bitwise DeepEP's (its fixed
        master-slot order), within bf16 rounding of it."""
        t = self.t
        y = joined(t, ys)
        if self.expand:
            y = self._sum("stage1", y, h.stage1).view(y.dtype)
        sums = self._sum("stage2", y, h.bags)
        out = self._gather("combined", sums, h.bags.pos).view(y.dtype)  # token order again
        return list(out.split(h.tokens))


# --- the naive implementation --------------------------------------------------------------------


class NaiveTorchEP:
    """The naive baseline: a loop over (destination, source) pairs and, expanded, over local
    experts, with host syncs at every nonzero. Rows in canonical order; its combine adds
    contributions in DeepEP's master-slot order, bitwise epic's."""

    def __init__(self, torch, R, E, K, alignment, expand):
        self.t, self.R, self.E, self.K, self.L = torch, R, E, K, E // R
        self.alignment, self.expand = alignment, expand

    def dispatch(self, xs, sfs, idxs, ws):
        t, R, L = self.t, self.R, self.L
        # Rows move as bytes (index ops on FP8 tensors are not implemented everywhere).
        xs = [x.view(t.uint8) if x.element_size() == 1 else x for x in xs]
        out = []
        for d in range(R):
            parts_x, parts_sf, parts_w, parts_local, plan = [], [], [], [], []
            for s in range(R):
                owner = (idxs[s] >= 0) & (idxs[s] // L == d)
                tokens = owner.any(dim=1).nonzero().squeeze(1)
                local = t.where(owner[tokens], idxs[s][tokens] - d * L, -1)
                parts_x.append(xs[s].index_select(0, tokens))
                if sfs is not None:
                    parts_sf.append(sfs[s].index_select(0, tokens))
                parts_w.append(ws[s].index_select(0, tokens))
                parts_local.append(local)
                plan.append((s, tokens, owner[tokens]))
            x = t.cat(parts_x)
            sf = t.cat(parts_sf) if sfs is not None else None
            w, local = t.cat(parts_w), t.cat(parts_local)
            result = dict(x=x, sf=sf, w=w, local=local, plan=plan)
            if self.expand:
                counts = t.stack([(local == e).sum() for e in range(L)])
                aligned = (counts + self.alignment - 1) // self.alignment * self.alignment
                starts = t.cumsum(aligned, 0) - aligned
                rows = int(aligned.sum())
                ex = t.zeros((rows, x.shape[1]), dtype=x.dtype, device=x.device)
                esf = None if sf is None else t.zeros((rows, sf.shape[1]), dtype=sf.dtype,
                                                      device=x.device)
                ew = t.zeros(rows, dtype=w.dtype, device=x.device)
                slot_row = t.full(local.shape, -1, dtype=t.int64, device=x.device)
                for e in range(L):
                    tok, slot = (local == e).nonzero(as_tuple=True)  # tokens ascending
                    at = starts[e] + t.arange(tok.numel(), device=x.device)
                    ex[at] = x[tok]
                    if esf is not None:
                        esf[at] = sf[tok]
                    ew[at] = w[tok, slot]
                    slot_row[tok, slot] = at
                result.update(ex=ex, esf=esf, ew=ew, slot_row=slot_row, aligned=aligned)
            out.append(result)
        return out

    def combine(self, ys, handles, idxs):
        """Each source's tokens: fp32 sum from +0.0 of every destination's contribution in
        increasing master-slot order (expanded: the destination first sums its rows in slot
        order and rounds to bf16), rounded once."""
        t, R, K = self.t, self.R, self.K
        outs = []
        for s in range(R):
            T, H = idxs[s].shape[0], ys[0].shape[1]
            acc = t.zeros((T, H), dtype=t.float32, device=idxs[s].device)
            contributions = []  # (master slot, token ids, rows) per destination
            for d in range(R):
                h = handles[d]
                offset = sum(p[1].numel() for p in h["plan"][:s])
                _, tokens, owner = h["plan"][s]
                if not tokens.numel():
                    continue
                rows = offset + t.arange(tokens.numel(), device=acc.device)
                master = (K - 1) - owner.flip(1).int().argmax(dim=1)
                if self.expand:
                    part = t.zeros((tokens.numel(), H), dtype=t.float32, device=acc.device)
                    for j in range(K):  # the destination's own sum, slot order
                        has = owner[:, j]
                        part[has] += ys[d][h["slot_row"][rows[has], j]].float()
                    value = part.to(t.bfloat16).float()
                else:
                    value = ys[d][rows].float()
                contributions.append((master, tokens, value))
            for j in range(K):  # every token gets its contributions in master-slot order
                for master, tokens, value in contributions:
                    pick = master == j
                    acc.index_add_(0, tokens[pick], value[pick])
            outs.append(acc.to(t.bfloat16))
        return outs
