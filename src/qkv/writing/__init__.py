"""Writing with a model: the decoding loops, sampling, chat and the next-token distribution."""

from ..runtime.lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.writing.sampling` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
