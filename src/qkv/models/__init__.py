"""The handles a user holds (Model, Seq2SeqModel, ImageModel, AudioModel) and `load`."""

from ..runtime.lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.models.…` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
