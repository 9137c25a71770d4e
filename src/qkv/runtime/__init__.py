"""What every layer runs on: errors, atomic files and bounded JSON, threads, this machine's tuning,
weights kept as stored (quantised blocks) and the compiled kernels that read them."""

from .lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.runtime.…` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
