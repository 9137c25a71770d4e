"""ViT (Vision Transformer, Dosovitskiy et al. 2021): an image cut into patches read by a pre-norm encoder.

Its tensors: `ROWS` below, each checkpoint name (relative to ViTModel; ViTForImageClassification adds "vit.") beside
ours and how it is stored, read both ways (loading and saving).
The pooler (ViTModel's dense + tanh on [CLS]) is not part of the encoder: IGNORED, as BERT's; so is the mask
token of masked image modelling (used only with bool_masked_pos, which qkv never passes). transformers 5 names
the same tensors layers.{i}.attention.q_proj / o_proj, mlp.fc1 / fc2 in memory and writes the names above.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Weights
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back
from .table import LINEAR, About, How, Row, layer_norm, linear, qkv_bias, read_table, write_table
from .tensors import TensorStore

MODEL_TYPES = ("vit",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("vit",), models="ViT (`ViTForImageClassification`, `ViTModel`)",
          brings="an image's patches as tokens: the patch convolution as one product over flattened patches (square "
                 "or not, 1 or 3 channels), [CLS] first, learned positions, pre-norm LayerNorm blocks (`qkv_bias`), a"
                 " final LayerNorm, the classifier on [CLS] (`id2label`); images processed as "
                 "`preprocessor_config.json` says",
          kind="image"),
)

IGNORED = {
    "pooler.*": "the pooler (a dense layer and tanh on [CLS]), not part of the encoder",
    "embeddings.mask_token": "masked image modelling's token, read only with bool_masked_pos",
}
ARCHITECTURES = ("ViTModel", "ViTForImageClassification")


def _pair(hf: dict, key: str, default: int) -> tuple[int, int]:
    v = hf.get(key, default)
    v = [v, v] if isinstance(v, int) and not isinstance(v, bool) else v
    if not (isinstance(v, (list, tuple)) and len(v) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 65536 for x in v)):
        raise QkvError(f"config.json {key} = {v!r:.40} is not a positive number of pixels (or [height, width]); "
                       "restore the checkpoint's config.json")
    return int(v[0]), int(v[1])


def labels_of(hf: dict) -> list[str]:
    """The classifier's label names, id2label in id order (transformers' default LABEL_i where it has none)."""
    names = hf.get("id2label")
    if names is None:
        return [f"LABEL_{i}" for i in range(hf.get("num_labels", 2))]
    if not (isinstance(names, dict) and names and all(isinstance(v, str) for v in names.values())
            and sorted(names, key=lambda k: int(k) if str(k).isdigit() else -1) == [str(i) for i in range(len(names))]):
        raise QkvError("config.json id2label must name the labels 0, 1, … in order; restore the checkpoint's config.json")
    return [names[str(i)] for i in range(len(names))]


def config(hf: dict) -> ModelConfig:
    kinds = [a for a in hf.get("architectures") or ["ViTModel"] if isinstance(a, str)]
    other = [a for a in kinds if a not in ARCHITECTURES]
    if other:
        raise QkvError(f"{other[0]} is not supported; qkv runs ViT as {' or '.join(ARCHITECTURES)}")
    d, heads = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, heads)
    image, patch = _pair(hf, "image_size", 224), _pair(hf, "patch_size", 16)
    grid = (image[0] // patch[0]) * (image[1] // patch[1])
    return ModelConfig(
        family="vit", vocab_size=len(labels_of(hf)), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=heads, d_head=hf.get("head_dim"), d_ff=need(hf, "intermediate_size"), max_positions=1 + grid,
        causal=False, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_eps", 1e-12), position="learned",
        activation=activation(hf.get("hidden_act", "gelu")), qkv_bias=hf.get("qkv_bias", True), final_norm=True,
        lm_head="ViTForImageClassification" in kinds, image_size=image, patch_size=patch,
        num_channels=hf.get("num_channels", 3),
    )


class Batched(How):
    """A tensor stored with a leading batch axis of 1 (cls_token (1, 1, d), position_embeddings (1, P, d))."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, (1, *shape), dtype).reshape(shape)

    def write(self, value, cfg):
        return value[None]


class Patches(How):
    """The patch convolution, stored (d, C, p_h, p_w): ours is one product, W_patch (C·p_h·p_w, d), a view."""

    def read(self, store, name, shape, dtype, cfg):
        d, C, (ph, pw) = cfg.d_model, cfg.num_channels, cfg.patch_size
        return store.get(name, (d, C, ph, pw), dtype).reshape(d, C * ph * pw).T

    def write(self, value, cfg):
        d, C, (ph, pw) = cfg.d_model, cfg.num_channels, cfg.patch_size
        return value.T.reshape(d, C, ph, pw)


def classifier(cfg: ModelConfig) -> bool:
    return cfg.lm_head


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. With the classifier, the
# encoder's names are under "vit." and the classifier's beside it.
ROWS = [
    Row("tok_embed", "embeddings.cls_token", "1 d", Batched()),                          # [CLS]
    Row("pos_embed", "embeddings.position_embeddings", "P d", Batched()),
    Row("W_patch", "embeddings.patch_embeddings.projection.weight", "d", Patches()),
    Row("b_patch", "embeddings.patch_embeddings.projection.bias", "d"),
    *layer_norm("block.attn_norm", "encoder.layer.{i}.layernorm_before"),
    *linear("block.attn.W_Q", "encoder.layer.{i}.attention.attention.query", "d q", "block.attn.b_Q", qkv_bias),
    *linear("block.attn.W_K", "encoder.layer.{i}.attention.attention.key", "d kv", "block.attn.b_K", qkv_bias),
    *linear("block.attn.W_V", "encoder.layer.{i}.attention.attention.value", "d kv", "block.attn.b_V", qkv_bias),
    *linear("block.attn.W_O", "encoder.layer.{i}.attention.output.dense", "q d", "block.attn.b_O"),
    *layer_norm("block.ffn_norm", "encoder.layer.{i}.layernorm_after"),
    *linear("block.ffn.W_in", "encoder.layer.{i}.intermediate.dense", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "encoder.layer.{i}.output.dense", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "layernorm"),
    Row("W_vocab", "classifier.weight", "d V", LINEAR, classifier, root=True),
    Row("b_vocab", "classifier.bias", "V", when=classifier, root=True),
]


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    if cfg.lm_head and not store.has("classifier.weight"):
        raise QkvError("config.json says ViTForImageClassification but the checkpoint has no classifier; "
                       "use the config.json that came with it")
    return read_table(ROWS, store, cfg, dtype)


def hf_config(cfg: ModelConfig, labels: list[str] | None = None) -> dict:
    """The config.json of a ViTForImageClassification (or, without a classifier, ViTModel) with these knobs."""
    labels = labels or [str(i) for i in range(cfg.vocab_size)]
    return reads_back(cfg, {
        "model_type": "vit", "architectures": ["ViTForImageClassification" if cfg.lm_head else "ViTModel"],
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff, "hidden_act": HF_ACTIVATIONS[cfg.activation], "layer_norm_eps": cfg.norm_eps,
        "image_size": list(cfg.image_size), "patch_size": list(cfg.patch_size), "num_channels": cfg.num_channels,
        "qkv_bias": cfg.qkv_bias, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
    } | ({"head_dim": cfg.d_head} if cfg.d_head * cfg.n_heads != cfg.d_model else {}), config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under ViTForImageClassification's names (ViTModel's without a classifier), as its file stores
    them (Linear: (out, in); the patch convolution (d, C, p, p)); new arrays."""
    return write_table(ROWS, weights, cfg, "" if weights.W_vocab is None else "vit.")
