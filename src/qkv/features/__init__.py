"""Features, not just heads: a model's activations stored at scale (`activations`) and sparse
autoencoders that decompose them into sparse, mostly interpretable features (README, "Features:
sparse autoencoders")."""

from ..runtime.lazy import submodule


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.features.saelens` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
