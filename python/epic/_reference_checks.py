"""epic.reference's argument checks: every error names the offending argument (a wrong or
corrupt input fails here, before any work, instead of deep inside an index)."""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from . import _limits

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
_HIDDEN_MULTIPLE = 8  # combine reduces 8 channels a step
_MAX_SOURCE_IDS = 2**31 - 1  # R * Tmax: recv_src_metadata's src_rank * Tmax + token is int32
FP8_E4M3_MAX = 448.0
_FP8_AMAX_FLOOR = 1e-4
# Scale packs travel only with FP8 data (the runtime's rule too).
_FP8_DTYPES = (float8_e4m3fn, np.dtype(ml_dtypes.float8_e5m2))

# The bounds of a world are #ep.config's (EPLimits.def, the one source the verifier and the
# runtime use too): the reference refuses what no kernel runs, so a GPU result is never compared
# against a configuration it cannot have. The alignment bound also keeps aligned counts (a count
# rounded up to A) far from int32/int64 overflow.
MAX_TOPK = _limits.MAX_TOPK  # one warp lane per top-k slot in the kernels
MAX_EXPERT_ALIGNMENT = _limits.MAX_EXPERT_ALIGNMENT
_MAX_RANKS = _limits.MAX_RANKS
_MAX_EXPERTS = _limits.MAX_EXPERTS
_MAX_EXPERTS_PER_RANK = _limits.MAX_LOCAL_EXPERTS
# Hybrid mode's bounds (DeepEP V2's: at most 32 nodes of at most 64 GPUs), from EPLimits.def.
MAX_HYBRID_NODES = _limits.MAX_HYBRID_NODES
MAX_HYBRID_GPUS_PER_NODE = _limits.MAX_HYBRID_RANKS_PER_NODE
_MAX_ELEMENT_INDEX = _limits.MAX_ELEMENT_INDEX


def _describe(a) -> str:
    return f"{a.dtype} array of shape {a.shape}"


def align(n, alignment):
    """Round ``n`` (int or int array) up to a multiple of ``alignment`` (an int >= 1)."""
    alignment = _check_int("alignment", alignment)
    if isinstance(n, np.ndarray):
        if not np.issubdtype(n.dtype, np.integer):
            raise TypeError(f"n: expected int or int array, got {_describe(n)}")
    elif isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n: expected int or int array, got {type(n).__name__}")
    return (n + alignment - 1) // alignment * alignment


def _check_int(name, value, minimum=1, maximum=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected int, got {type(value).__name__}")
    if maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"{name}: expected int in [{minimum}, {maximum}], got {value}")
    if value < minimum:
        raise ValueError(f"{name}: expected int >= {minimum}, got {value}")
    return int(value)


def _check_number(name, value):
    """A real number (int or float, not bool) as a Python float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name}: {type(value).__name__} too large for a float") from None


def _check_dtype(name, value, allowed=None):
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a numpy dtype, got {value!r}") from None
    if allowed is not None and dtype not in allowed:
        raise TypeError(f"{name}: expected one of {', '.join(map(str, allowed))}, got {dtype}")
    return dtype


def _is_list(values):
    """A list or tuple of per-rank values (a str or an array is not)."""
    return isinstance(values, Sequence) and not isinstance(values, (str, bytes, np.ndarray))


def _check_array(name, a):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected numpy array, got {type(a).__name__}")
    return a


def _check_per_rank(name, values, num_ranks):
    if not _is_list(values):
        raise TypeError(
            f"{name}: expected a list with one entry per rank, got {type(values).__name__}"
        )
    if len(values) != num_ranks:
        raise ValueError(f"{name}: expected {num_ranks} entries (one per rank), got {len(values)}")
    return list(values)


def _check_experts(num_experts, num_ranks, prefix=""):
    num_experts = _check_int(f"{prefix}num_experts", num_experts, 1, _MAX_EXPERTS)
    num_ranks = _check_int(f"{prefix}num_ranks", num_ranks, 1, _MAX_RANKS)
    if num_experts % num_ranks:
        raise ValueError(
            f"{prefix}num_experts: {num_experts} is not divisible by num_ranks={num_ranks}"
        )
    if num_experts // num_ranks > _MAX_EXPERTS_PER_RANK:
        raise ValueError(
            f"{prefix}num_experts: {num_experts} over {num_ranks} ranks is "
            f"{num_experts // num_ranks} experts per rank, more than {_MAX_EXPERTS_PER_RANK}"
        )
    return num_experts, num_ranks


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected bool, got {type(value).__name__}")
    return bool(value)


def _check_topology(num_ranks, gpus_per_node, hybrid, prefix=""):
    """``(M, N, hybrid)`` of a world of ``num_ranks`` ranks on N nodes of ``gpus_per_node`` (M)
    ranks each, numbered node-major (``node(r) = r // M``). ``gpus_per_node=None`` is one node.
    Hybrid mode needs at least two nodes and DeepEP's hybrid bounds."""
    hybrid = _check_bool(f"{prefix}hybrid", hybrid)
    if gpus_per_node is None:
        m = num_ranks
    else:
        m = _check_int(f"{prefix}gpus_per_node", gpus_per_node)
        if num_ranks % m:
            raise ValueError(
                f"{prefix}gpus_per_node: {m} does not divide the {num_ranks} ranks "
                "(the world is N nodes of gpus_per_node ranks each)"
            )
    n = num_ranks // m
    if hybrid:
        if n < 2:
            raise ValueError(
                f"{prefix}hybrid: needs more than one node, but gpus_per_node ({m}) == number "
                f"of ranks ({num_ranks}); use hybrid=False"
            )
        if n > MAX_HYBRID_NODES:
            raise ValueError(
                f"{prefix}hybrid: at most {MAX_HYBRID_NODES} nodes, got {n} "
                f"({num_ranks} ranks / gpus_per_node {m})"
            )
        if m > MAX_HYBRID_GPUS_PER_NODE:
            raise ValueError(
                f"{prefix}gpus_per_node: hybrid allows at most {MAX_HYBRID_GPUS_PER_NODE} GPUs "
                f"per node, got {m}"
            )
    return m, n, hybrid


def _handle_topology(h):
    """``(gpus_per_node, hybrid)`` a handle was dispatched with: its fields, or one node in
    direct mode for an object without them."""
    m = getattr(h, "gpus_per_node", None)
    return (h.num_ranks if m is None else m), getattr(h, "hybrid", False)


def _check_topk_idx(name, a, num_experts, num_topk=None):
    """Validate a ``[T, K]`` routing array and return it as int64."""
    _check_array(name, a)
    expected = "[T, K]" if num_topk is None else f"[T, {num_topk}]"
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name}: expected int array of shape {expected}, got {_describe(a)}")
    if a.ndim != 2 or (num_topk is not None and a.shape[1] != num_topk):
        raise ValueError(f"{name}: expected int array of shape {expected}, got {_describe(a)}")
    k = a.shape[1]
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"{name}: top-k must be in [1, {MAX_TOPK}], got K={k}")
    if k > num_experts:
        raise ValueError(f"{name}: top-k K={k} exceeds num_experts={num_experts}")
    idx = a.astype(np.int64)
    bad = (idx < -1) | (idx >= num_experts)
    if a.dtype.kind == "u":  # an id past int64 would wrap, maybe to a valid-looking -1
        bad |= a >= num_experts
    if bad.any():
        t, j = map(int, np.argwhere(bad)[0])
        raise ValueError(
            f"{name}: expert id {a[t, j]} at [{t}, {j}] out of range [-1, {num_experts})"
        )
    # Duplicate experts in a row would make "one row per (token, expert)" ambiguous.
    srt = np.sort(idx, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if dup.any():
        t = int(np.argwhere(dup)[0, 0])
        raise ValueError(f"{name}: row {t} selects an expert more than once: {idx[t].tolist()}")
    return idx


def _check_float32(name, a, shape, shape_text):
    _check_array(name, a)
    if a.dtype != np.float32:
        raise TypeError(
            f"{name}: expected float32 array of shape {shape_text}, got {_describe(a)}"
        )
    if a.shape != shape:
        raise ValueError(
            f"{name}: expected float32 array of shape {shape_text}, got {_describe(a)}"
        )
    return a


def _check_bf16(name, a, shape, shape_text):
    _check_array(name, a)
    if a.dtype != bfloat16:
        raise TypeError(
            f"{name}: expected bfloat16 array of shape {shape_text}, got {_describe(a)}"
        )
    if a.shape != shape:
        raise ValueError(
            f"{name}: expected bfloat16 array of shape {shape_text}, got {_describe(a)}"
        )
    return a


# What the functions taking handles read from one (DispatchResult's fields of the same names).
_HANDLE_FIELDS = (
    "num_ranks", "num_experts", "num_max_tokens_per_rank", "expand", "topk_idx", "recv_x",
    "recv_src_metadata", "num_recv_tokens_per_expert_list", "num_unaligned_recv_tokens_per_expert",
)


def _check_counts(name, values, n):
    """``n`` counts >= 0 (a list of ints or an int array) as an array."""
    try:
        a = np.asarray(values)
    except (ValueError, OverflowError):  # ragged
        a = None
    if a is None or a.shape != (n,) or not np.issubdtype(a.dtype, np.integer) or (a < 0).any():
        raise ValueError(f"{name}: expected {n} counts >= 0, got {values!r}")
    return a


def _check_handle(name, h):
    """Check the structure of a dispatch handle (a :class:`DispatchResult`, possibly with a
    kernel's arrays swapped in), so that a wrong or corrupt one fails here, named, instead of
    deep inside an index. Kernel buffers may be worst-case sized: rows are bounded below only."""
    if not all(hasattr(h, f) for f in _HANDLE_FIELDS):
        raise TypeError(
            f"{name}: expected a handle from reference.dispatch, got {type(h).__name__}"
        )
    num_experts, num_ranks = _check_experts(h.num_experts, h.num_ranks, f"{name}.")
    _check_int(f"{name}.num_max_tokens_per_rank", h.num_max_tokens_per_rank)
    k = _check_topk_idx(f"{name}.topk_idx", h.topk_idx, num_experts).shape[1]
    x = _check_array(f"{name}.recv_x", h.recv_x)
    if x.ndim != 2:
        raise ValueError(f"{name}.recv_x: expected array of shape [rows, H], got {_describe(x)}")
    meta = _check_array(f"{name}.recv_src_metadata", h.recv_src_metadata)
    if not np.issubdtype(meta.dtype, np.integer) or meta.ndim != 2 or meta.shape[1] != k + 2:
        raise ValueError(
            f"{name}.recv_src_metadata: expected int array of shape [N, {k + 2}], "
            f"got {_describe(meta)}"
        )
    num_local = num_experts // num_ranks
    field = f"{name}.num_recv_tokens_per_expert_list"
    aligned = _check_counts(field, h.num_recv_tokens_per_expert_list, num_local)
    field = f"{name}.num_unaligned_recv_tokens_per_expert"
    if (_check_counts(field, h.num_unaligned_recv_tokens_per_expert, num_local) > aligned).any():
        raise ValueError(f"{field}: exceeds num_recv_tokens_per_expert_list {aligned.tolist()}")
    # Plain rows are the metadata's; expanded rows cover every aligned block.
    rows = int(aligned.sum()) if h.expand else meta.shape[0]
    if x.shape[0] < rows:
        raise ValueError(f"{name}.recv_x: expected at least {rows} rows, got {_describe(x)}")
    rows = x.shape[0] if h.expand else rows  # sort_by_source moves every expanded row
    for field in (("recv_scale_packs", "recv_topk_weights")
                  + (() if h.expand else ("recv_topk_idx",))):
        a = getattr(h, field, None)
        if a is not None and (_check_array(f"{name}.{field}", a).ndim == 0 or a.shape[0] < rows):
            raise ValueError(f"{name}.{field}: expected at least {rows} rows, got {_describe(a)}")
    return h


def _check_handles(handles):
    """``handles`` of one world: one handle per rank, agreeing on the world."""
    if not _is_list(handles) or not handles:
        raise TypeError("handles: expected a non-empty list of dispatch results, one per rank")
    handles = [_check_handle(f"handles[{r}]", h) for r, h in enumerate(handles)]
    h0 = handles[0]
    for r, h in enumerate(handles):
        for field in ("num_ranks", "num_experts", "num_max_tokens_per_rank", "expand"):
            if getattr(h, field) != getattr(h0, field):
                raise ValueError(f"handles[{r}]: {field} differs from handles[0]")
        if h.num_ranks != len(handles):
            raise ValueError(
                f"handles: got {len(handles)} handles for a world of {h.num_ranks} ranks"
            )
        m, hybrid = _handle_topology(h)
        _check_topology(h.num_ranks, m, hybrid, f"handles[{r}].")
        if (m, hybrid) != _handle_topology(h0):
            raise ValueError(
                f"handles[{r}]: gpus_per_node/hybrid ({m}, {hybrid}) differ from handles[0]'s "
                f"{_handle_topology(h0)}"
            )
        if h.topk_idx.shape[1] != h0.topk_idx.shape[1]:
            raise ValueError(f"handles[{r}]: top-k differs from handles[0]")
        if h.recv_x.shape[1] != h0.recv_x.shape[1]:
            raise ValueError(
                f"handles[{r}]: recv_x rows of hidden size {h.recv_x.shape[1]} differ from "
                f"handles[0]'s {h0.recv_x.shape[1]}"
            )
    return handles


def _source_ids(handles):
    """Per handle, its source global ids (``recv_src_metadata[:, 0]``) as int64, checked to
    name a token of a source rank (``src * Tmax + t``, ``t < T_src``) at most once; expanded
    handles' rows (``recv_src_metadata[:, 2:]``) are checked too."""
    tmax = handles[0].num_max_tokens_per_rank
    num_tokens = np.array([h.topk_idx.shape[0] for h in handles], dtype=np.int64)
    out = []
    for d, h in enumerate(handles):
        ids = h.recv_src_metadata[:, 0].astype(np.int64)
        src, tok = np.divmod(ids, tmax)
        bad = (ids < 0) | (src >= len(handles))
        bad |= tok >= num_tokens[np.where(bad, 0, src)]
        if bad.any() or len(np.unique(ids)) != len(ids):
            raise ValueError(f"handles[{d}]: recv_src_metadata[:, 0] is out of range or not unique")
        if h.expand:
            _expanded_row_owners(h, f"handles[{d}]")  # in range, none twice
        out.append(ids)
    return out


def _to_bf16(a):
    """Round float32 to bfloat16, nearest-even (ml_dtypes' cast)."""
    return a.astype(bfloat16)


def _expanded_row_owners(result, name="result"):
    """Metadata row owning each expanded row; -1 for padding.

    Raises ValueError if a row is referenced twice or out of range, which
    means the handle is corrupt.
    """
    n_exp = result.recv_x.shape[0]
    owner = np.full(n_exp, -1, dtype=np.int64)
    meta_rows, slots = np.nonzero(result.recv_src_metadata[:, 2:] >= 0)
    rows = result.recv_src_metadata[meta_rows, 2 + slots].astype(np.int64)
    if (rows >= n_exp).any() or len(np.unique(rows)) != len(rows):
        raise ValueError(
            f"{name}.recv_src_metadata: expanded row indices are out of range or not unique"
        )
    owner[rows] = meta_rows
    return owner
