"""Training in NumPy: backprop by hand through every box, AdamW, data, and the training loop.

    qkv.train.gradients(model, input_ids)  → (loss, {checkpoint tensor name: gradient})
    qkv.train.backprop.loss_and_grads(...)    the same on a Weights tree (what the loop uses)
"""

from ..runtime.lazy import submodule
from .gradients import gradients, grads_by_name
from .backprop import loss_and_grads

__all__ = ["gradients", "grads_by_name", "loss_and_grads"]


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.train.optim` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
