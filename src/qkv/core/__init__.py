"""The maths of a pass: operations, positions, masks, attention, the blocks and their backward,
the stack runner, hooks, the trace of what a pass computed, tokens as a reader sees them."""

from ..runtime.lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.core.…` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
