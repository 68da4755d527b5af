"""Dispatch and combine as differentiable operations (training).

As DeepEP documents: the backward of a dispatch is a combine of the
gradients (each token's copies are summed back at its source), and the
backward of a combine is a cached dispatch of the gradient (each received
row gets the gradient of the token it was summed into). Works on a
torch.distributed buffer (tensors) and on a virtual world (lists of tensors,
one per rank). BF16 activations; top-k weights travel with their gradients.
"""

from __future__ import annotations

import torch

__all__ = ["dispatch", "combine"]


def _flat(values):
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _shape(buffer, values):
    return values if buffer.virtual else values[0]


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buffer, num_experts, kwargs, box, n, *tensors):
        xs, idxs, ws = tensors[:n], tensors[n:2 * n], tensors[2 * n:]
        has_weights = len(ws) > 0
        recv_x, _, recv_w, handle, _ = buffer.dispatch(
            _shape(buffer, list(xs)), _shape(buffer, list(idxs)),
            _shape(buffer, list(ws)) if has_weights else None, num_experts=num_experts, **kwargs)
        ctx.buffer, ctx.handle, ctx.n, ctx.has_weights = buffer, handle, n, has_weights
        box["handle"] = handle  # the caller's, whether or not a graph is recorded
        return tuple(_flat(recv_x) + (_flat(recv_w) if has_weights else []))

    @staticmethod
    def backward(ctx, *grads):
        n = ctx.n
        grad_x = [g.contiguous() for g in grads[:n]]
        grad_w = [g.contiguous() for g in grads[n:]] if ctx.has_weights else None
        buffer = ctx.buffer
        combined, combined_w, _ = buffer.combine(
            _shape(buffer, grad_x), ctx.handle,
            topk_weights=_shape(buffer, grad_w) if grad_w is not None else None)
        gx = _flat(combined)
        gw = _flat(combined_w) if grad_w is not None else []
        return (None, None, None, None, None, *gx, *([None] * n), *gw)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buffer, handle, n, *xs):
        combined, _, _ = buffer.combine(_shape(buffer, list(xs)), handle)
        ctx.buffer, ctx.handle = buffer, handle
        return tuple(_flat(combined))

    @staticmethod
    def backward(ctx, *grads):
        buffer, handle = ctx.buffer, ctx.handle
        do_expand = _flat(handle)[0].do_expand
        recv, _, _, _, _ = buffer.dispatch(_shape(buffer, [g.contiguous() for g in grads]),
                                           handle=handle, do_expand=do_expand)
        return (None, None, None, *_flat(recv))


def dispatch(buffer, x, topk_idx, topk_weights=None, *, num_experts, **kwargs):
    """Differentiable ``buffer.dispatch`` (BF16 ``x``): returns
    ``(recv_x, recv_topk_weights, handle)``; gradients flow to ``x`` and
    ``topk_weights``. ``kwargs`` go to ``dispatch`` (e.g. ``do_expand``,
    ``expert_alignment``)."""
    xs, idxs = _flat(x), _flat(topk_idx)
    ws = _flat(topk_weights) if topk_weights is not None else []
    n = len(xs)
    box = {}
    outs = _Dispatch.apply(buffer, num_experts, kwargs, box, n, *xs, *idxs, *ws)
    handle = box["handle"]
    recv_x = _shape(buffer, list(outs[:n]))
    recv_w = _shape(buffer, list(outs[n:])) if ws else None
    return recv_x, recv_w, handle


def combine(buffer, x, handle):
    """Differentiable ``buffer.combine`` (unweighted sum, as DeepEP's): the
    gradient of each received row is a cached dispatch of the gradient."""
    xs = _flat(x)
    outs = _Combine.apply(buffer, handle, len(xs), *xs)
    return _shape(buffer, list(outs))
