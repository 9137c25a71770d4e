"""Helpers shared by the family modules: reading config.json values and linear layers."""

from __future__ import annotations

import numpy as np

from ..errors import QkvError
from .tensors import TensorStore

# Hugging Face activation names → ours.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu", "relu": "relu"}


def activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise QkvError(f"activation {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def need(hf: dict, key: str):
    """A config.json value the model cannot be built without."""
    if key not in hf or hf[key] is None:
        raise QkvError(f"config.json lacks {key!r}; use the config.json that came with the checkpoint")
    return hf[key]


def linear_T(store: TensorStore, name: str, n_in: int, n_out: int, dtype) -> np.ndarray:
    """A torch Linear weight, stored (out, in), as our (in, out) W: a transposed view, no copy."""
    return store.get(name, (n_out, n_in), dtype).T

