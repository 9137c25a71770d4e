"""The engine: the maths of a transformer's forward pass (and backward), box by box, and the
handles a user holds (Model, Seq2SeqModel)."""

from .lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.engine.kernels` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
