"""CLIP (Radford et al. 2021): a text tower and an image tower trained so that an image and its caption point the same
way; their similarity is e^s·cos(image, text).

    config.json knob            qkv knob                    what it does
    text: hidden_act            activation "quick_gelu"      FFN(x) = x·σ(1.702x) of x·W_in + b_in, then ·W_out + b_out
          (the causal mask)     causal, index_positions      each token sees those before it; positions 0..n−1
                                                             whatever the mask (as CLIPTextEmbeddings numbers them)
          eos_token_id          pooling "eos"                the pooled row: the first eos of each row's ids (its
                                                             argmax when eos_token_id is 2, the legacy configs)
          final_layer_norm      final_norm                   on every row (last_hidden_state)
          projection_dim        d_proj                       text_projection (no bias) of the pooled row
    image: class_embedding      class_token (tok_embed[0])   [CLS] before the patches, the conv without bias
          pre_layrnorm          embed_norm                   LayerNorm of the embeddings, before the blocks
          post_layernorm        pooling "cls", pool.norm     on the pooled [CLS] only (last_hidden_state is before it)
          projection_dim        d_proj                       visual_projection (no bias)
    pair: logit_scale           PairWeights.logit_scale      logits_per_image = e^s · cos(image_embeds, text_embeds)

Pre-norm LayerNorm blocks with biases everywhere (CLIPEncoderLayer), learned positions, images as the ViT family
reads them (inputs/images.py). Its tensors: TEXT_ROWS and VISION_ROWS below, each relative to its tower
("text_model." / "vision_model." in CLIPModel and the *WithProjection models, none in CLIPTextModel /
CLIPVisionModel), the projections and logit_scale at the root. Refused in one line: CLIPForImageClassification,
non-square images or patches (CLIPVisionEmbeddings reads one size), a head_dim of its own.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import PairWeights, Weights
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_config, check_shapes, need, reads_back
from .table import LINEAR, About, How, Row, layer_norm, linear, read_table, write_table
from .tensors import TensorStore
from .vit import Patches

MODEL_TYPES = ("clip", "clip_text_model", "clip_vision_model")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("clip_text_model",), models="CLIP's text tower (`CLIPTextModel`, `CLIPTextModelWithProjection`)",
          brings="a causal mask over an encoder numbered 0..n−1 (`index_positions`), QuickGELU, pooling at the eos "
                 "token (`pooling`), the projection (`d_proj`): `model.pooled(texts)`",
          kind="encoder", refuses=("attribute",)),
    About(types=("clip_vision_model",),
          models="CLIP's image tower (`CLIPVisionModel`, `CLIPVisionModelWithProjection`)",
          brings="[CLS] + a patch convolution without bias, LayerNorm before the blocks, `post_layernorm` on the "
                 "pooled [CLS] alone, the projection: `model.pooled(images)`",
          kind="image", refuses=("gradients",)),
    About(types=("clip",), models="CLIP (`CLIPModel`: both towers)",
          brings="`model.similarity(images, texts)`: e^s·cos of the towers' embeddings, softmax over the texts; "
                 "`qkv show IMAGE --texts \"a cat,a dog\"`",
          kind="image", refuses=("patch", "gradients")),
)

TOWERS = True                          # loaded as models.contrastive's handles: a tower, or the pair

IGNORED = {
    "text_model.embeddings.position_ids": "a buffer (0..n−1), not a parameter",
    "vision_model.embeddings.position_ids": "a buffer (0..P), not a parameter",
    "embeddings.position_ids": "a buffer, not a parameter",
}

# CLIPTextConfig's and CLIPVisionConfig's defaults (a sub-config of config.json may leave any of them out)
TEXT_DEFAULTS = {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "projection_dim": 512,
                 "num_hidden_layers": 12, "num_attention_heads": 8, "max_position_embeddings": 77,
                 "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 49406,
                 "eos_token_id": 49407}
VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "projection_dim": 512, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 32,
                   "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
PROJECTED = {"CLIPTextModel": False, "CLIPTextModelWithProjection": True,      # which architectures project
             "CLIPVisionModel": False, "CLIPVisionModelWithProjection": True}


# ── config.json ↔ knobs ──────────────────────────────────────────────────────────

def side(hf: dict, key: str, what: str) -> int:
    """Image or patch size KEY, one whole number of pixels (CLIP and SigLIP embed square images only)."""
    v = hf[key]
    if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
        v = v[0]
    if not (isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65536):
        raise QkvError(f"config.json {what}{key} = {v!r:.40} is not one positive number of pixels ({what}embeds "
                       "square images only); restore the checkpoint's config.json")
    return v


def architecture(hf: dict, allowed: tuple[str, ...], default: str) -> str:
    kinds = [a for a in hf.get("architectures") or [default] if isinstance(a, str)] or [default]
    if kinds[0] not in allowed:
        raise QkvError(f"{kinds[0]} is not supported; qkv runs {hf.get('model_type')} as {' or '.join(allowed)}")
    return kinds[0]


def check_common(hf: dict, where: str) -> tuple[int, int]:
    """d_model and H of a tower, checked (no head_dim of its own: CLIPAttention reads d_model / H)."""
    d, heads = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    if hf.get("head_dim") not in (None, d // heads):
        raise QkvError(f"config.json {where}head_dim = {hf['head_dim']} is not read by this model (its heads are "
                       "hidden_size / num_attention_heads wide); remove it")
    check_shapes(hf, d, heads)
    return d, heads


def text_config(hf: dict, projection: int | None, where: str = "") -> ModelConfig:
    """The text tower's knobs (a clip_text_model config.json, or CLIPConfig's text_config); PROJECTION: d_proj."""
    hf = TEXT_DEFAULTS | check_config(hf, f"config.json {where}".strip())
    d, heads = check_common(hf, where)
    return ModelConfig(
        family="clip_text_model", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=heads, d_ff=need(hf, "intermediate_size"), max_positions=need(hf, "max_position_embeddings"),
        causal=True, index_positions=True, norm="layer", norm_place="pre", norm_eps=hf["layer_norm_eps"],
        position="learned", activation=activation(hf["hidden_act"]), final_norm=True, lm_head=False,
        pooling="eos", d_proj=projection, pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"))


def vision_config(hf: dict, projection: int | None, where: str = "") -> ModelConfig:
    """The image tower's knobs (a clip_vision_model config.json, or CLIPConfig's vision_config)."""
    hf = VISION_DEFAULTS | check_config(hf, f"config.json {where}".strip())
    d, heads = check_common(hf, where)
    image, patch = side(hf, "image_size", where), side(hf, "patch_size", where)
    if patch > image:
        raise QkvError(f"config.json {where}patch_size {patch} is larger than image_size {image}; restore the "
                       "checkpoint's config.json")
    return ModelConfig(
        family="clip_vision_model", vocab_size=1, d_model=d, n_layers=need(hf, "num_hidden_layers"), n_heads=heads,
        d_ff=need(hf, "intermediate_size"), max_positions=1 + (image // patch) ** 2, causal=False, norm="layer",
        norm_place="pre", norm_eps=hf["layer_norm_eps"], position="learned", activation=activation(hf["hidden_act"]),
        embed_norm=True, final_norm=False, lm_head=False, image_size=(image, image), patch_size=(patch, patch),
        num_channels=hf["num_channels"], class_token=True, pooling="cls", d_proj=projection)


def config(hf: dict) -> ModelConfig:
    kind = hf.get("model_type")
    if kind == "clip_text_model":
        arch = architecture(hf, ("CLIPTextModel", "CLIPTextModelWithProjection"), "CLIPTextModel")
        return text_config(hf, (TEXT_DEFAULTS | hf)["projection_dim"] if PROJECTED[arch] else None)
    if kind == "clip_vision_model":
        arch = architecture(hf, ("CLIPVisionModel", "CLIPVisionModelWithProjection"), "CLIPVisionModel")
        return vision_config(hf, (VISION_DEFAULTS | hf)["projection_dim"] if PROJECTED[arch] else None)
    architecture(hf, ("CLIPModel",), "CLIPModel")
    p = hf.get("projection_dim", 512)
    text = text_config(sub(hf, "text_config") | sub(hf, "text_config_dict"), p, "text_config.")   # the legacy
    vision = vision_config(sub(hf, "vision_config") | sub(hf, "vision_config_dict"), p, "vision_config.")   # *_dict win
    return vision.with_(family="clip", text_tower=text)


def sub(hf: dict, key: str) -> dict:
    v = hf.get(key) or {}
    if not isinstance(v, dict):
        raise QkvError(f"config.json {key} = {v!r:.40} is not an object of knobs; restore the checkpoint's config.json")
    return v


def text_dict(cfg: ModelConfig) -> dict:
    return {"model_type": "clip_text_model", "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "max_position_embeddings": cfg.max_positions, "hidden_act": HF_ACTIVATIONS[cfg.activation],
            "layer_norm_eps": cfg.norm_eps, "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id, "projection_dim": cfg.d_proj or 512, "attention_dropout": 0.0}


def vision_dict(cfg: ModelConfig) -> dict:
    return {"model_type": "clip_vision_model", "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_channels": cfg.num_channels,
            "image_size": cfg.image_size[0], "patch_size": cfg.patch_size[0],
            "hidden_act": HF_ACTIVATIONS[cfg.activation], "layer_norm_eps": cfg.norm_eps,
            "projection_dim": cfg.d_proj or 512, "attention_dropout": 0.0}


def hf_config(cfg: ModelConfig, labels: list[str] | None = None) -> dict:
    """The config.json of a CLIPModel (or of one tower, with its projection if it has one) with these knobs
    (LABELS: an image model's, which a tower has none of)."""
    if cfg.family == "clip_text_model":
        hf = text_dict(cfg) | {"architectures": ["CLIPTextModelWithProjection" if cfg.d_proj else "CLIPTextModel"]}
    elif cfg.family == "clip_vision_model":
        arch = "CLIPVisionModelWithProjection" if cfg.d_proj else "CLIPVisionModel"
        hf = vision_dict(cfg) | {"architectures": [arch]}
    else:
        hf = {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": cfg.d_proj,
              "text_config": text_dict(cfg.text_tower), "vision_config": vision_dict(cfg)}
    return reads_back(cfg, hf, config)


# ── the tables ───────────────────────────────────────────────────────────────────

class Vector(How):
    """A tensor stored without our leading axis of 1 (class_embedding (d,) as tok_embed (1, d))."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, shape[1:], dtype).reshape(shape)

    def write(self, value, cfg):
        return value.reshape(value.shape[1:])


def encoder_rows(at: str = "encoder.layers.{i}") -> list[Row]:
    """A CLIPEncoderLayer (SiglipEncoderLayer alike): LayerNorm, attention with biases, LayerNorm, a two-Linear MLP."""
    return [
        *layer_norm("block.attn_norm", f"{at}.layer_norm1"),
        *linear("block.attn.W_Q", f"{at}.self_attn.q_proj", "d q", "block.attn.b_Q"),
        *linear("block.attn.W_K", f"{at}.self_attn.k_proj", "d kv", "block.attn.b_K"),
        *linear("block.attn.W_V", f"{at}.self_attn.v_proj", "d kv", "block.attn.b_V"),
        *linear("block.attn.W_O", f"{at}.self_attn.out_proj", "q d", "block.attn.b_O"),
        *layer_norm("block.ffn_norm", f"{at}.layer_norm2"),
        *linear("block.ffn.W_in", f"{at}.mlp.fc1", "d f", "block.ffn.b_in"),
        *linear("block.ffn.W_out", f"{at}.mlp.fc2", "f d", "block.ffn.b_out"),
    ]


def projected(cfg: ModelConfig) -> bool:
    return cfg.d_proj is not None


TEXT_ROWS = [
    Row("tok_embed", "embeddings.token_embedding.weight", "V d"),
    Row("pos_embed", "embeddings.position_embedding.weight", "P d"),
    *encoder_rows(),
    *layer_norm("final_norm", "final_layer_norm"),
    Row("pool.W_proj", "text_projection.weight", "d p", LINEAR, projected, root=True),
]

VISION_ROWS = [
    Row("tok_embed", "embeddings.class_embedding", "1 d", Vector()),                    # [CLS]
    Row("W_patch", "embeddings.patch_embedding.weight", "d", Patches()),
    Row("pos_embed", "embeddings.position_embedding.weight", "P d"),
    *layer_norm("embed_norm", "pre_layrnorm"),
    *encoder_rows(),
    *layer_norm("pool.norm", "post_layernorm"),
    Row("pool.W_proj", "visual_projection.weight", "d p", LINEAR, projected, root=True),
]


class Under:
    """A tensor store seen from inside one tower: its names under PREFIX, the root rows' (ROOTS) as they are."""

    def __init__(self, store, prefix: str, roots: set[str]):
        self.store, self.prefix, self.roots = store, prefix, roots

    def name(self, name: str) -> str:
        return name if name in self.roots else self.prefix + name

    def get(self, name: str, shape, dtype):
        return self.store.get(self.name(name), shape, dtype)

    def has(self, name: str) -> bool:
        return self.store.has(self.name(name))


def tower_prefix(store, rows: list[Row], prefix: str) -> str:
    """PREFIX when the store holds the tower under it (CLIPModel, the *WithProjection models), else ""."""
    first = next(r.hf for r in rows if not r.root)
    return prefix if store.has(prefix + first) else ""


def read_tower(rows: list[Row], store, cfg: ModelConfig, dtype, prefix: str, **extra) -> Weights:
    """A tower's Weights by ROWS from STORE, its tensors under PREFIX (or none, a bare tower's checkpoint)."""
    at = tower_prefix(store, rows, prefix)
    return read_table(rows, Under(store, at, {r.hf for r in rows if r.root}), cfg, dtype, **extra)


def read_pair(rows: tuple[list[Row], list[Row]], store, cfg: ModelConfig, dtype, bias: bool,
              **vision) -> PairWeights:
    """Both towers of a pair (TEXT_ROWS-like, VISION_ROWS-like; VISION: more fields of the image tower's Weights)
    and its scalars: logit_scale (and logit_bias, SigLIP's, both then stored (1,))."""
    shape = (1,) if bias else ()
    return PairWeights(vision=read_tower(rows[1], store, cfg, dtype, "vision_model.", **vision),
                       text=read_tower(rows[0], store, cfg.text_tower, dtype, "text_model."),
                       logit_scale=store.get("logit_scale", shape, dtype).reshape(()),
                       logit_bias=store.get("logit_bias", shape, dtype).reshape(()) if bias else None)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights | PairWeights:
    if cfg.text_tower is not None:
        return read_pair((TEXT_ROWS, VISION_ROWS), store, cfg, dtype, bias=False)
    rows = TEXT_ROWS if cfg.family == "clip_text_model" else VISION_ROWS
    return read_tower(rows, store, cfg, dtype, "text_model." if rows is TEXT_ROWS else "vision_model.")


def write_pair(rows: tuple[list[Row], list[Row]], w: PairWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    t = write_table(rows[0], w.text, cfg.text_tower, "text_model.") | write_table(rows[1], w.vision, cfg,
                                                                                   "vision_model.")
    t["logit_scale"] = np.array(w.logit_scale).reshape(() if w.logit_bias is None else (1,))
    if w.logit_bias is not None:
        t["logit_bias"] = np.array(w.logit_bias).reshape(1)
    return t


def tensors(weights: Weights | PairWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under CLIPModel's names (a tower's: the *WithProjection model's with a projection, else the bare
    tower's), as its file stores them; new arrays."""
    if cfg.text_tower is not None:
        return write_pair((TEXT_ROWS, VISION_ROWS), weights, cfg)
    text = cfg.family == "clip_text_model"
    prefix = ("text_model." if text else "vision_model.") if cfg.d_proj else ""
    return write_table(TEXT_ROWS if text else VISION_ROWS, weights, cfg, prefix)
