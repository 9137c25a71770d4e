"""Pictures of a trace: matplotlib figures (`figures`) and the self-contained HTML viewer (`html`)."""

from ..runtime.lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.viz.figures` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
