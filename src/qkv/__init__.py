"""qkv: see inside transformer language models — a NumPy engine that equals the reference.

    >>> import qkv
    >>> model = qkv.load()                      # all-MiniLM-L6-v2, bundled
    >>> trace = model.run("The cat sat on the mat")
    >>> trace.attentions.shape                  # (L, H, n, n)
    >>> fresh = qkv.init(model.config, seed=0)  # the same architecture, untrained
    >>> fresh.save("my-model")                  # Hugging Face layout: qkv.load and transformers read it
"""

import importlib

from .checkpoints import available
from .models.loading import load
from .models.fresh import init
from .checkpoints.save import save
from .core.config import ModelConfig
from .runtime.errors import QkvError
from .models.model import Model, Output
from .models.audio_model import AudioModel
from .models.image_model import ImageModel
from .models.seq2seq import Seq2SeqModel, Seq2SeqOutput
from .core.trace import LayerTrace, Trace

__all__ = ["load", "available", "init", "save", "Model", "ModelConfig", "Output", "QkvError", "Trace", "LayerTrace",
           "Seq2SeqModel", "Seq2SeqOutput", "ImageModel", "AudioModel"]
__version__ = "0.1.0"

# The folders, reachable as attributes after `import qkv` (qkv.analysis.logit_lens(...), qkv.viz.figures, …):
# each is imported on first use, so `import qkv` stays as light as the engine.
SUBPACKAGES = ("runtime", "core", "inputs", "writing", "checkpoints", "models", "viz", "analysis", "lessons", "train",
               "features", "bench", "web", "cli")


def __getattr__(name: str):
    if name in SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
