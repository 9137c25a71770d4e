"""What a model reads, made ready: text to ids (tokenizer, chat templates) and images to pixels."""

from ..runtime.lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.inputs.…` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
