"""Training in NumPy: backprop by hand through every box, AdamW, data, and the training loop.

    qkv.train.gradients(model, input_ids)  → (loss, {checkpoint tensor name: gradient})
    qkv.train.backprop.loss_and_grads(...)    the same on a Weights tree (what the loop uses)
"""

from .gradients import gradients, grads_by_name
from .backprop import loss_and_grads

__all__ = ["gradients", "grads_by_name", "loss_and_grads"]
