"""qkv: see inside transformer language models — a NumPy engine that equals the reference.

    >>> import qkv
    >>> model = qkv.load()                      # all-MiniLM-L6-v2, bundled
    >>> trace = model.run("The cat sat on the mat")
    >>> trace.attentions.shape                  # (L, H, n, n)
    >>> fresh = qkv.init(model.config, seed=0)  # the same architecture, untrained
    >>> fresh.save("my-model")                  # Hugging Face layout: qkv.load and transformers read it
"""

import importlib

from .checkpoints import available, load
from .checkpoints.fresh import init
from .checkpoints.save import save
from .engine.config import ModelConfig
from .engine.errors import QkvError
from .engine.model import Model, Output
from .engine.audio_model import AudioModel
from .engine.image_model import ImageModel
from .engine.seq2seq import Seq2SeqModel, Seq2SeqOutput
from .engine.trace import LayerTrace, Trace

__all__ = ["load", "available", "init", "save", "Model", "ModelConfig", "Output", "QkvError", "Trace", "LayerTrace",
           "Seq2SeqModel", "Seq2SeqOutput", "ImageModel", "AudioModel"]
__version__ = "0.1.0"

# The folders, reachable as attributes after `import qkv` (qkv.analysis.logit_lens(...), qkv.viz.figures, …):
# each is imported on first use, so `import qkv` stays as light as the engine.
SUBPACKAGES = ("analysis", "bench", "checkpoints", "cli", "engine", "features", "lessons", "train", "viz", "web",
               "writing")


def __getattr__(name: str):
    if name in SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
