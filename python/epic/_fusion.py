"""``fusion=`` of ElasticBuffer.dispatch_gemm and gemm_combine: run the fused kernel or the two
steps it replaces (``dispatch`` + ``grouped_gemm``, ``grouped_gemm`` + ``combine``).

``"auto"`` (the default) asks the fusion cost model the compiler's ``ep-fuse-dispatch-gemm`` and
``ep-fuse-gemm-combine`` passes ask (one C++ header, ``_C.predict_fusion``) with the call's
shape, and fuses only where it predicts a win; ``"always"`` and ``"never"`` decide without it.
Both ways return the same tensors: the fused kernels are bitwise the two steps. The decision of
the last call is kept in ``ElasticBuffer.last_fusion`` (docs/fusion.md explains the model).
"""

MODES = ("auto", "always", "never")
PAIRS = ("dispatch_gemm", "gemm_combine")


def check_mode(mode):
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"fusion: 'auto', 'always' or 'never', got {mode!r}")
    return mode


def chip(device_index):
    """The cost model's name of the GPU (FusionCosts.def's rows): Hopper is ``sm_90a``, the
    target the fused kernels are built for; None without a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device_index)
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def on_gpu(tensors):
    """Whether every input is a CUDA tensor (host inputs are checked, never launched)."""
    return all(getattr(t, "is_cuda", False) for t in tensors)


def predict(b, pair, shape):
    """The model's prediction for one call ({'fused_us', 'steps_us', 'fuse', 'why'}), or None
    where it has no numbers for this GPU. `shape`: tokens (per rank), hidden, n (the GEMM's
    output columns), topk, experts, element_bytes."""
    from ._C import predict_fusion

    name = chip(b._device_index)
    if name is None:
        return None
    # A virtual world's ranks share this GPU; a process holds one rank of its GPU.
    return predict_fusion(pair, dict(shape, ranks=b.num_ranks,
                                     ranks_per_device=0 if b.virtual else 1), name)


def decide(b, pair, mode, shape_of, inputs_on_gpu):
    """Whether this call runs the fused kernel (`shape_of()`: predict's shape, or None where
    the inputs are too odd to price: the two steps' checks then name them); the decision is
    kept in ``b.last_fusion``."""
    check_mode(mode)
    prediction = None
    if mode != "auto":
        fuse, why = mode == "always", f'fusion="{mode}"'
    elif not inputs_on_gpu:
        # Nothing runs: the fused op's checks, the op the caller named.
        fuse, why = True, "host inputs (checked as the fused op, never launched)"
    else:
        shape = shape_of()
        prediction = predict(b, pair, shape) if shape is not None else None
        if prediction is not None:
            fuse, why = prediction["fuse"], prediction["why"]
        elif shape is None:
            fuse, why = False, "inputs the two steps' checks name"
        else:
            fuse, why = False, "the cost model has no numbers for this GPU (FusionCosts.def)"
    b.last_fusion = dict(pair=pair, mode=mode, fused=fuse, why=why,
                         fused_us=prediction["fused_us"] if prediction else None,
                         steps_us=prediction["steps_us"] if prediction else None)
    return fuse
