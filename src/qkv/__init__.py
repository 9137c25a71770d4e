"""qkv: see inside transformer language models — a NumPy engine that equals the reference.

    >>> import qkv
    >>> model = qkv.load()                      # all-MiniLM-L6-v2, bundled
    >>> trace = model.run("The cat sat on the mat")
    >>> trace.attentions.shape                  # (L, H, n, n)
"""

from .checkpoints import available, load
from .config import ModelConfig
from .errors import QkvError
from .model import Model, Output
from .trace import LayerTrace, Trace

__all__ = ["load", "available", "Model", "ModelConfig", "Output", "QkvError", "Trace", "LayerTrace"]
__version__ = "0.1.0"
