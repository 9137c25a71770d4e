"""Training in NumPy: backprop by hand through every box, AdamW, data, and the training loop.

    qkv.train.gradients(model, input_ids)  → (loss, {checkpoint tensor name: gradient})
    qkv.train.grads.loss_and_grads(...)    the same on a Weights tree (what the loop uses)
"""

from .grads import gradients, loss_and_grads  # noqa: F401
