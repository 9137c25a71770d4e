"""SigLIP (Zhai et al. 2023): CLIP's two towers trained with a sigmoid loss, so each image–text pair is scored alone:
p = σ(e^s·cos(image, text) + b).

    config.json knob            qkv knob                    what it does
    text: (no causal mask)      causal false                 every token sees every (unpadded) token
          (the last token)      pooling "last"               the pooled row: the last one, padding or not (as
                                                             SiglipTextTransformer pools it)
          projection_size       d_proj                       head: a Linear with bias on the pooled row
          hidden_act            activation "gelu_tanh"       gelu_pytorch_tanh (the default)
    image: (no class token)     class_token false            the patches alone, the conv with its bias
          post_layernorm        final_norm                   on every row (last_hidden_state)
          vision_use_head       pooling "probe"              the attention-pooling head (MAP): a learned probe
                                                             attends over the rows (torch's MultiheadAttention),
                                                             then r + MLP(LayerNorm(r)); false: no pooling
    pair: logit_scale, logit_bias   PairWeights              logits_per_image = e^s · cos + b, σ of it each pair's
                                                             probability

Its tensors: TEXT_ROWS and VISION_ROWS below, relative to the tower ("text_model." / "vision_model." in SiglipModel,
none in SiglipTextModel / SiglipVisionModel), CLIP's encoder layers (checkpoints/clip.py). Refused in one line:
SiglipForImageClassification, non-square images or patches, a SiglipModel without the image head (it pools none).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import PairWeights, Weights
from ..runtime.errors import QkvError
from . import clip
from .common import HF_ACTIVATIONS, activation, check_config, need, reads_back
from .table import LINEAR, About, How, Row, layer_norm, linear, write_table
from .tensors import TensorStore
from .vit import Patches

MODEL_TYPES = ("siglip", "siglip_text_model", "siglip_vision_model")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("siglip_text_model",), models="SigLIP's text tower (`SiglipTextModel`)",
          brings="a bidirectional encoder pooled at its last token, then a Linear head (`d_proj`): "
                 "`model.pooled(texts)`",
          kind="encoder"),
    About(types=("siglip_vision_model",), models="SigLIP's image tower (`SiglipVisionModel`)",
          brings="patches without a class token, a final LayerNorm, the attention-pooling head (a learned probe "
                 "attending over the patches, then an MLP: `pooling` \"probe\"; `qkv show` prints its attention)",
          kind="image", refuses=("gradients",)),
    About(types=("siglip",), models="SigLIP (`SiglipModel`: both towers)",
          brings="`model.similarity(images, texts)`: σ(e^s·cos + b) of each image–text pair; `qkv show IMAGE --texts "
                 "\"a cat,a dog\"`",
          kind="image", refuses=("patch", "gradients")),
)

TOWERS = True                          # loaded as models.contrastive's handles: a tower, or the pair

IGNORED = clip.IGNORED

# SiglipTextConfig's and SiglipVisionConfig's defaults
TEXT_DEFAULTS = {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
                 "layer_norm_eps": 1e-6, "pad_token_id": 1, "bos_token_id": 49406, "eos_token_id": 49407}
VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
                   "layer_norm_eps": 1e-6, "vision_use_head": True}


def text_config(hf: dict, where: str = "") -> ModelConfig:
    """The text tower's knobs (a siglip_text_model config.json, or SiglipConfig's text_config)."""
    hf = TEXT_DEFAULTS | check_config(hf, f"config.json {where}".strip())
    d, heads = clip.check_common(hf, where)
    return ModelConfig(
        family="siglip_text_model", vocab_size=need(hf, "vocab_size"), d_model=d,
        n_layers=need(hf, "num_hidden_layers"), n_heads=heads, d_ff=need(hf, "intermediate_size"),
        max_positions=need(hf, "max_position_embeddings"),
        causal=False, norm="layer", norm_place="pre", norm_eps=hf["layer_norm_eps"], position="learned",
        activation=activation(hf["hidden_act"]), final_norm=True, lm_head=False, pooling="last",
        d_proj=hf.get("projection_size") or d, pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"))


def vision_config(hf: dict, where: str = "") -> ModelConfig:
    """The image tower's knobs (a siglip_vision_model config.json, or SiglipConfig's vision_config)."""
    hf = VISION_DEFAULTS | check_config(hf, f"config.json {where}".strip())
    d, heads = clip.check_common(hf, where)
    image, patch = clip.side(hf, "image_size", where), clip.side(hf, "patch_size", where)
    if patch > image:
        raise QkvError(f"config.json {where}patch_size {patch} is larger than image_size {image}; restore the "
                       "checkpoint's config.json")
    head = hf["vision_use_head"]
    if not isinstance(head, bool):
        raise QkvError(f"config.json {where}vision_use_head = {head!r:.20} is not true or false; restore the "
                       "checkpoint's config.json")
    return ModelConfig(
        family="siglip_vision_model", vocab_size=1, d_model=d, n_layers=need(hf, "num_hidden_layers"), n_heads=heads,
        d_ff=need(hf, "intermediate_size"), max_positions=(image // patch) ** 2, causal=False, norm="layer",
        norm_place="pre", norm_eps=hf["layer_norm_eps"], position="learned", activation=activation(hf["hidden_act"]),
        final_norm=True, lm_head=False, image_size=(image, image), patch_size=(patch, patch),
        num_channels=hf["num_channels"], class_token=False, pooling="probe" if head else None)


def config(hf: dict) -> ModelConfig:
    kind = hf.get("model_type")
    if kind == "siglip_text_model":
        clip.architecture(hf, ("SiglipTextModel",), "SiglipTextModel")
        return text_config(hf)
    if kind == "siglip_vision_model":
        clip.architecture(hf, ("SiglipVisionModel",), "SiglipVisionModel")
        return vision_config(hf)
    clip.architecture(hf, ("SiglipModel",), "SiglipModel")
    text = text_config(clip.sub(hf, "text_config"), "text_config.")
    vision = vision_config(clip.sub(hf, "vision_config"), "vision_config.")
    if vision.pooling is None:
        raise QkvError("config.json vision_config.vision_use_head is false: SiglipModel pools no image embedding "
                       "without its head; use a checkpoint with the head (or load its towers alone)")
    if text.d_proj != vision.d_model:
        raise QkvError(f"config.json text_config.projection_size {text.d_proj} is not the image tower's hidden_size "
                       f"{vision.d_model}: SiglipModel compares embeddings of one width; restore the checkpoint's "
                       "config.json")
    return vision.with_(family="siglip", text_tower=text)


def text_dict(cfg: ModelConfig) -> dict:
    return {"model_type": "siglip_text_model", "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "max_position_embeddings": cfg.max_positions, "hidden_act": HF_ACTIVATIONS[cfg.activation],
            "layer_norm_eps": cfg.norm_eps, "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id, "projection_size": cfg.d_proj, "attention_dropout": 0.0}


def vision_dict(cfg: ModelConfig) -> dict:
    return {"model_type": "siglip_vision_model", "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_channels": cfg.num_channels,
            "image_size": cfg.image_size[0], "patch_size": cfg.patch_size[0],
            "hidden_act": HF_ACTIVATIONS[cfg.activation], "layer_norm_eps": cfg.norm_eps,
            "vision_use_head": cfg.pooling == "probe", "attention_dropout": 0.0}


def hf_config(cfg: ModelConfig, labels: list[str] | None = None) -> dict:
    """The config.json of a SiglipModel (or of one tower) with these knobs (LABELS: an image model's, which a tower
    has none of)."""
    if cfg.family == "siglip_text_model":
        hf = text_dict(cfg) | {"architectures": ["SiglipTextModel"]}
    elif cfg.family == "siglip_vision_model":
        hf = vision_dict(cfg) | {"architectures": ["SiglipVisionModel"]}
    else:
        hf = {"model_type": "siglip", "architectures": ["SiglipModel"], "text_config": text_dict(cfg.text_tower),
              "vision_config": vision_dict(cfg)}
    return reads_back(cfg, hf, config)


# ── the tables ───────────────────────────────────────────────────────────────────

class Probe(How):
    """The probe, stored (1, 1, d): ours is (d,)."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, (1, 1, *shape), dtype).reshape(shape)

    def write(self, value, cfg):
        return value.reshape(1, 1, -1)


def has_head(cfg: ModelConfig) -> bool:
    return cfg.pooling == "probe"


TEXT_ROWS = [
    Row("tok_embed", "embeddings.token_embedding.weight", "V d"),
    Row("pos_embed", "embeddings.position_embedding.weight", "P d"),
    *clip.encoder_rows(),
    *layer_norm("final_norm", "final_layer_norm"),
    *linear("pool.W_proj", "head", "d p", "pool.b_proj"),
]

_QKV = ("pool.probe_attn.W_Q", "pool.probe_attn.W_K", "pool.probe_attn.W_V")
VISION_ROWS = [
    Row("W_patch", "embeddings.patch_embedding.weight", "d", Patches()),
    Row("b_patch", "embeddings.patch_embedding.bias", "d"),
    Row("pos_embed", "embeddings.position_embedding.weight", "P d"),
    *clip.encoder_rows(),
    *layer_norm("final_norm", "post_layernorm"),
    Row("pool.probe", "head.probe", "d", Probe(), has_head),
    Row(_QKV, "head.attention.in_proj_weight", "d q+q+q", LINEAR, has_head, parts="q q q"),
    Row(tuple(w.replace("W_", "b_") for w in _QKV), "head.attention.in_proj_bias", "q+q+q", when=has_head,
        parts="q q q"),
    *linear("pool.probe_attn.W_O", "head.attention.out_proj", "q d", "pool.probe_attn.b_O", when=has_head),
    *layer_norm("pool.probe_norm", "head.layernorm", when=has_head),
    *linear("pool.probe_ffn.W_in", "head.mlp.fc1", "d f", "pool.probe_ffn.b_in", when=has_head),
    *linear("pool.probe_ffn.W_out", "head.mlp.fc2", "f d", "pool.probe_ffn.b_out", when=has_head),
]


def no_class_token(cfg: ModelConfig, dtype) -> np.ndarray:
    """The image tower's token table: empty (no [CLS]), (0, d_model), kept for the model's dtype."""
    return np.zeros((0, cfg.d_model), dtype)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights | PairWeights:
    if cfg.text_tower is not None:
        return clip.read_pair((TEXT_ROWS, VISION_ROWS), store, cfg, dtype, bias=True,
                              tok_embed=no_class_token(cfg, dtype))
    if cfg.family == "siglip_text_model":
        return clip.read_tower(TEXT_ROWS, store, cfg, dtype, "text_model.")
    return clip.read_tower(VISION_ROWS, store, cfg, dtype, "vision_model.", tok_embed=no_class_token(cfg, dtype))


def tensors(weights: Weights | PairWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under SiglipModel's names (a tower's: the bare tower's), as its file stores them; new arrays."""
    if cfg.text_tower is not None:
        return clip.write_pair((TEXT_ROWS, VISION_ROWS), weights, cfg)
    return write_table(TEXT_ROWS if cfg.family == "siglip_text_model" else VISION_ROWS, weights, cfg)
