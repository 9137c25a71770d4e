"""ViT (Vision Transformer, Dosovitskiy et al. 2021): an image cut into patches read by a pre-norm encoder.

    checkpoint name (relative to ViTModel; ViTForImageClassification adds "vit.")   qkv name
    embeddings.cls_token (1, 1, d)                          tok_embed (1, d): [CLS], the table's one row
    embeddings.patch_embeddings.projection (d, C, p, p)     W_patch (C·p·p, d), b_patch: the convolution of
                                                            stride p as one product over flattened patches
    embeddings.position_embeddings (1, 1 + P, d)            pos_embed (1 + P, d)
    encoder.layer.{i}.layernorm_before                      attn_norm (before attention)
    encoder.layer.{i}.attention.attention.query/key/value   W_Q / W_K / W_V (+ b where qkv_bias)
    encoder.layer.{i}.attention.output.dense                W_O
    encoder.layer.{i}.layernorm_after                       ffn_norm (before the FFN)
    encoder.layer.{i}.intermediate.dense / output.dense     W_in / W_out
    layernorm                                               final_norm
    classifier (ViTForImageClassification, at the root)     W_vocab (d, labels), b_vocab: read at [CLS]
The pooler (ViTModel's dense + tanh on [CLS]) is not part of the encoder: IGNORED, as BERT's; so is the mask
token of masked image modelling (used only with bool_masked_pos, which qkv never passes). transformers 5 names
the same tensors layers.{i}.attention.q_proj / o_proj, mlp.fc1 / fc2 in memory and writes the names above.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

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


def _norm(store: TensorStore, prefix: str, d: int, dtype) -> NormWeights:
    return NormWeights(store.get(f"{prefix}.weight", (d,), dtype), store.get(f"{prefix}.bias", (d,), dtype))


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.d_head
    C, (ph, pw) = cfg.num_channels, cfg.patch_size

    def block(i: int) -> BlockWeights:
        p = f"encoder.layer.{i}"
        a = f"{p}.attention.attention"
        bias = (lambda name, n: store.get(name, (n,), dtype)) if cfg.qkv_bias else (lambda name, n: None)
        attn = AttentionWeights(
            W_Q=linear_T(store, f"{a}.query.weight", d, hd, dtype), b_Q=bias(f"{a}.query.bias", hd),
            W_K=linear_T(store, f"{a}.key.weight", d, hd, dtype), b_K=bias(f"{a}.key.bias", hd),
            W_V=linear_T(store, f"{a}.value.weight", d, hd, dtype), b_V=bias(f"{a}.value.bias", hd),
            W_O=linear_T(store, f"{p}.attention.output.dense.weight", hd, d, dtype),
            b_O=store.get(f"{p}.attention.output.dense.bias", (d,), dtype))
        ffn = FFNWeights(W_in=linear_T(store, f"{p}.intermediate.dense.weight", d, f, dtype),
                         b_in=store.get(f"{p}.intermediate.dense.bias", (f,), dtype),
                         W_out=linear_T(store, f"{p}.output.dense.weight", f, d, dtype),
                         b_out=store.get(f"{p}.output.dense.bias", (d,), dtype))
        return BlockWeights(attn_norm=_norm(store, f"{p}.layernorm_before", d, dtype), attn=attn,
                            ffn_norm=_norm(store, f"{p}.layernorm_after", d, dtype), ffn=ffn)

    e = "embeddings"
    conv = store.get(f"{e}.patch_embeddings.projection.weight", (d, C, ph, pw), dtype)     # (d, C, p, p)
    has_head = cfg.lm_head
    if has_head and not store.has("classifier.weight"):
        raise QkvError("config.json says ViTForImageClassification but the checkpoint has no classifier; "
                       "use the config.json that came with it")
    return Weights(
        tok_embed=store.get(f"{e}.cls_token", (1, 1, d), dtype).reshape(1, d),               # [CLS]
        pos_embed=store.get(f"{e}.position_embeddings", (1, cfg.max_positions, d), dtype).reshape(cfg.max_positions, d),
        W_patch=conv.reshape(d, C * ph * pw).T,                                             # (C·p·p, d) a view
        b_patch=store.get(f"{e}.patch_embeddings.projection.bias", (d,), dtype),
        blocks=[block(i) for i in range(cfg.n_layers)],
        final_norm=_norm(store, "layernorm", d, dtype),
        W_vocab=linear_T(store, "classifier.weight", d, cfg.vocab_size, dtype) if has_head else None,
        b_vocab=store.get("classifier.bias", (cfg.vocab_size,), dtype) if has_head else None,
    )


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
    d, C, (ph, pw) = cfg.d_model, cfg.num_channels, cfg.patch_size
    v = "vit." if weights.W_vocab is not None else ""
    t = {f"{v}embeddings.cls_token": weights.tok_embed.reshape(1, 1, d),
         f"{v}embeddings.position_embeddings": weights.pos_embed[None],
         f"{v}embeddings.patch_embeddings.projection.weight": weights.W_patch.T.reshape(d, C, ph, pw),
         f"{v}embeddings.patch_embeddings.projection.bias": weights.b_patch,
         f"{v}layernorm.weight": weights.final_norm.weight, f"{v}layernorm.bias": weights.final_norm.bias}
    for i, b in enumerate(weights.blocks):
        p, a, f = f"{v}encoder.layer.{i}", b.attn, b.ffn
        t |= {f"{p}.attention.attention.query.weight": a.W_Q.T, f"{p}.attention.attention.query.bias": a.b_Q,
              f"{p}.attention.attention.key.weight": a.W_K.T, f"{p}.attention.attention.key.bias": a.b_K,
              f"{p}.attention.attention.value.weight": a.W_V.T, f"{p}.attention.attention.value.bias": a.b_V,
              f"{p}.attention.output.dense.weight": a.W_O.T, f"{p}.attention.output.dense.bias": a.b_O,
              f"{p}.layernorm_before.weight": b.attn_norm.weight, f"{p}.layernorm_before.bias": b.attn_norm.bias,
              f"{p}.layernorm_after.weight": b.ffn_norm.weight, f"{p}.layernorm_after.bias": b.ffn_norm.bias,
              f"{p}.intermediate.dense.weight": f.W_in.T, f"{p}.intermediate.dense.bias": f.b_in,
              f"{p}.output.dense.weight": f.W_out.T, f"{p}.output.dense.bias": f.b_out}
    if weights.W_vocab is not None:
        t |= {"classifier.weight": weights.W_vocab.T, "classifier.bias": weights.b_vocab}
    return c_arrays(t)
