"""Gradients that may not be differentiated again, on PyTorch.

The fused and streaming PyTorch losses compute their backward pass from
residuals of the forward pass (the expected code E and expected squared norm
Q of each row) that carry no autograd history. With ``create_graph=True``
(a Hessian, a gradient penalty) autograd would differentiate that backward
as if E and Q were constants and return a wrong second derivative, or all
zeros, without a word. `first_order_only` gives such gradients a node whose
own backward raises, so the mistake is an error, in the way of
``torch.autograd.function.once_differentiable``, with a message that says
which path is twice differentiable. Plain ``backward()`` runs the backward
with grad mode off and gets the gradients untouched.
"""

from __future__ import annotations

import torch

SECOND_ORDER_MESSAGE = (
    "keras_ecoc: the {path} ECOC loss on PyTorch has no second derivative (its "
    "backward pass reads forward-pass residuals that are not differentiated "
    "again). For a Hessian, a gradient penalty or any gradient of a gradient, "
    "use the dense path: fused=False with KERAS_ECOC_LOSS_PATH=dense (Keras "
    "objects: KERAS_ECOC_DISABLE_FUSED=1 and KERAS_ECOC_LOSS_PATH=dense)."
)


class _RaiseOnBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, path, num_inputs, *tensors):
        ctx.path = path
        grads = tensors[num_inputs:]
        # New tensors (not the inputs) so that autograd attaches this node.
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx, *unused):
        raise RuntimeError(SECOND_ORDER_MESSAGE.format(path=ctx.path))


def first_order_only(path: str, inputs, *grads):
    """`grads` (tensors or None), unchanged when grad mode is off (a plain
    ``backward()``); under ``create_graph=True`` wrapped so that
    differentiating them raises (see the module docstring).

    Args:
        path: "fused" or "streaming", for the message.
        inputs: the loss's differentiable inputs as saved for backward (z,
            codes, scale).
        grads: their gradients.
    """
    if not torch.is_grad_enabled():
        return grads
    present = [i for i, g in enumerate(grads) if g is not None]
    anchors = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not present or not anchors:
        return grads
    # A gradient computed from residuals alone has no autograd history, and
    # autograd would take it for a constant (a zero Hessian). Through the
    # inputs as extra arguments the wrapped gradients depend on them in the
    # graph, so a gradient of them with respect to z, the codes or anything
    # upstream reaches this node and raises.
    wrapped = _RaiseOnBackward.apply(path, len(anchors), *anchors,
                                     *(grads[i] for i in present))
    out = list(grads)
    for i, g in zip(present, wrapped):
        out[i] = g
    return tuple(out)
