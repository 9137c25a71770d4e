"""DeBERTa (v1, model_type "deberta") and DeBERTa-v2/v3 ("deberta-v2"): BERT's post-norm blocks whose scores add
each token's content against the other's relative position (disentangled attention, core/disentangled.py), and
v2-xlarge/xxlarge's convolution beside the first layer (blocks.conv_beside).

Its tensors: `ROWS` below, each checkpoint name (relative to DebertaV2Model / DebertaModel) beside ours and how it
is stored, read both ways (loading and saving). v2 projects Q, K, V apart (query_proj, key_proj, value_proj, with
biases) and the relative table by pos_key_proj (c2p) and pos_query_proj (p2c), or by key_proj and query_proj
themselves (share_att_key: DeBERTa-v3); v1 fuses Q, K, V into in_proj (rows head by head, no bias) with q_bias and
v_bias beside, and projects the table by pos_proj (no bias) and pos_q_proj.

The knobs (transformers' DebertaV2Config / DebertaConfig), each honoured or refused in one line:
  relative_attention, pos_att_type ("c2p|p2c", a list, or a part)   the position terms (none: plain Q·Kᵀ)
  scale 1/√(d_k·(1 + terms))   v2 counts c2p and p2c; v1 every entry of pos_att_type, as transformers does
  max_relative_positions (< 1: max_position_embeddings), position_buckets (v2: log buckets), share_att_key (v2),
  norm_rel_ebd "layer_norm" (v2: the table LayerNorm'ed), position_biased_input (absolute positions added to the
  embeddings, or none), type_vocab_size (0: no token types), hidden_act, layer_norm_eps, pad_token_id
  legacy (the masked-LM head's names: cls.predictions, or lm_predictions.lm_head; the same maths: Norm(act(Z·W +
  b))·Eᵀ + b)
  conv_kernel_size, conv_act (v2: a convolution over the first layer's input added to its output, normalised:
  deberta-v2-xlarge, -xxlarge; blocks.conv_beside)
  refused: embedding_size ≠ hidden_size (embed_proj before the embeddings' norm), an even conv_kernel_size or
  conv_groups ≠ 1, talking_head (v1), attention_head_size ≠ hidden_size / heads, and legacy with
  tie_word_embeddings false.
Padding: transformers hides a padded query's row too (every score min, so the row is uniform); the real tokens'
rows, what qkv compares, are the same either way. Training and input attribution run through the terms (their
backward: core/disentangled.py). `hf_config` / `tensors` write a DebertaV2Model / DebertaModel or its *ForMaskedLM.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..core.config import CONV_ACTIVATIONS, ModelConfig
from ..core.disentangled import TERMS, Disentangled
from ..core.weights import ConvWeights, NormWeights
from ..runtime.errors import QkvError
from . import bert
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, need, reads_back
from .roberta import masked_lm
from .table import BY_GROUP, About, Head, How, Row, both_ways, fused_qkv, linear

MODEL_TYPES = ("deberta", "deberta-v2")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("deberta-v2", "deberta"), models="DeBERTa-v3, DeBERTa-v2, DeBERTa",
          brings="disentangled attention: S = c2c + c2p + p2c, content against relative position both ways (log "
                 "buckets, shared or own position projections, the table's LayerNorm), scale 1/√(d_k·(1 + terms)); "
                 "each term its own score table (hooks, trace, the viewer's Disentangled tab); BERT's post-norm "
                 "blocks, v2's convolution beside the first layer (`conv_kernel_size`), a masked-LM head",
          kind="masked-LM encoder"),
)

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "embeddings.position_embeddings.weight": "absolute positions a model with position_biased_input false never "
                                             "adds (transformers ignores them too)",
    "encoder.rel_embeddings.weight": "the relative table of a model without position terms (pos_att_type empty)",
    "encoder.LayerNorm.*": "the relative table's norm of a model without position terms",
    "pooler.*": "a classification model's pooler (ContextPooler), not part of the encoder",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "DebertaV2ForQuestionAnswering's head",
    "mask_predictions.*": "the replaced-token head of a DeBERTa-v3 pretraining file (transformers ignores it)",
    "cls.predictions.decoder.bias": "cls.predictions.bias's tied copy, in files that hold both",
}


def _terms(hf: dict) -> list:
    """pos_att_type as transformers reads it: "c2p|p2c" split and lowered, a list as it is, none: []."""
    kinds = hf.get("pos_att_type")
    if kinds is None:
        return []
    if isinstance(kinds, str):
        return [t.strip() for t in kinds.lower().split("|")]
    if not isinstance(kinds, list) or not all(isinstance(t, str) for t in kinds):
        raise QkvError(f"DeBERTa pos_att_type {kinds!r:.40} must be a string such as 'c2p|p2c' or a list of them; "
                       "restore the checkpoint's config.json")
    return kinds


def _int(hf: dict, key: str, default: int) -> int:
    v = hf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise QkvError(f"DeBERTa {key} = {v!r:.30} is not a whole number; restore the checkpoint's config.json")
    return v


def _flag(hf: dict, key: str, default: bool) -> bool:
    v = hf.get(key, default)
    if not isinstance(v, bool):
        raise QkvError(f"DeBERTa {key} = {v!r:.30} is not true or false; restore the checkpoint's config.json")
    return v


def refuse(hf: dict, v2: bool, d: int, H: int) -> None:
    """The knobs qkv does not run, each refused in one line naming it."""
    E = hf.get("embedding_size", d)
    if E != d:
        raise QkvError(f"DeBERTa embedding_size={E} ≠ hidden_size={d} (embeddings projected before their norm) is "
                       "not supported; use a checkpoint whose embeddings are hidden_size wide")
    kernel = _int(hf, "conv_kernel_size", 0) if v2 else 0
    if kernel > 0 and (kernel % 2 == 0 or _int(hf, "conv_groups", 1) != 1
                       or hf.get("conv_act", "tanh") not in CONV_ACTIVATIONS):
        raise QkvError(f"DeBERTa-v2's convolution beside the first layer with conv_kernel_size={kernel}, conv_groups="
                       f"{hf.get('conv_groups', 1)!r:.10}, conv_act={hf.get('conv_act', 'tanh')!r:.20} is not supported; "
                       f"qkv runs an odd kernel, one group and conv_act one of {', '.join(CONV_ACTIVATIONS)}")
    if not v2 and _flag(hf, "talking_head", False):
        raise QkvError("DeBERTa talking_head=true (heads mixing their scores) is not supported; use a checkpoint "
                       "without it")
    head = hf.get("attention_head_size", d // H) if v2 else d // H
    if head != d // H:
        raise QkvError(f"DeBERTa-v2 attention_head_size={head} ≠ hidden_size / heads = {d // H} is not supported "
                       "(transformers' output projection reads hidden_size numbers); restore the config.json")
    if masked_lm(hf) and _flag(hf, "legacy", True) and not _flag(hf, "tie_word_embeddings", True):
        raise QkvError("DeBERTa legacy=true with tie_word_embeddings=false (a decoder of its own) is not supported; "
                       "use a checkpoint with tied embeddings")


def disentangled(hf: dict, v2: bool) -> Disentangled | None:
    """The position terms' knobs, or None without relative_attention or without terms."""
    terms = tuple(t for t in TERMS if t in _terms(hf))
    if not _flag(hf, "relative_attention", False) or not terms:
        return None
    far = _int(hf, "max_relative_positions", -1)
    far = far if far >= 1 else _int(hf, "max_position_embeddings", 512)
    norm = str(hf.get("norm_rel_ebd", "none")).lower().split("|")
    return Disentangled(terms=terms, max_distance=far, buckets=max(_int(hf, "position_buckets", -1), 0) if v2 else 0,
                        share_key=v2 and _flag(hf, "share_att_key", False),
                        norm=v2 and "layer_norm" in [x.strip() for x in norm])


def config(hf: dict) -> ModelConfig:
    v2 = hf["model_type"] == "deberta-v2"
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    refuse(hf, v2, d, H)
    kinds = _terms(hf)
    scale_terms = sum(t in kinds for t in TERMS) if v2 else len(kinds)    # v1 counts every entry
    types = _int(hf, "type_vocab_size", 0)
    return ModelConfig(
        family=hf["model_type"], vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 512),
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-7),
        position="learned" if _flag(hf, "position_biased_input", True) else "relative",
        attn_scale=1.0 / math.sqrt(d // H * (1 + scale_terms)), disentangled=disentangled(hf, v2),
        activation=activation(hf.get("hidden_act", "gelu")), type_vocab_size=max(types, 0), embed_norm=True,
        final_norm=False, lm_head=masked_lm(hf), head_activation=activation(hf.get("hidden_act", "gelu")),
        qkv_bias=True, tied_embeddings=True, pad_token_id=hf.get("pad_token_id", 0), pad_embedding_frozen=True,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        head_names=("cls.predictions" if _flag(hf, "legacy", True) else "lm_predictions") if masked_lm(hf) else None,
        first_conv=(hf["conv_kernel_size"], hf.get("conv_act", "tanh")) if v2 and _int(hf, "conv_kernel_size", 0) > 0
        else None,
    )


def v1(cfg: ModelConfig) -> bool:
    return cfg.family == "deberta"


def relative(cfg: ModelConfig) -> bool:
    return cfg.disentangled is not None


def term(name: str):
    """Whether a layer has its own projection of the table for the term NAME (not shared with W_K, W_Q)."""
    return lambda cfg: relative(cfg) and name in cfg.disentangled.terms and not cfg.disentangled.share_key


class Table(How):
    """The relative table P (2k, d_model): its rows are the config's 2k, not a size of the table's symbols."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, (2 * cfg.disentangled.span, cfg.d_model), dtype)


def _v2(cond=None):
    return lambda cfg: not v1(cfg) and (cond is None or cond(cfg))


def _v1(cond=None):
    return lambda cfg: v1(cfg) and (cond is None or cond(cfg))


SELF = "encoder.layer.{i}.attention.self"

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. BERT's embeddings (positions
# only with position_biased_input, token types only when there are some) and post-norm blocks under BERT's names
# but for attention's projections; the relative table (and its norm); then the masked-LM head beside "deberta.".
ROWS = [
    Row("tok_embed", "embeddings.word_embeddings.weight", "V d"),
    Row("pos_embed", "embeddings.position_embeddings.weight", "P d", when=lambda cfg: cfg.position == "learned"),
    Row("type_embed", "embeddings.token_type_embeddings.weight", "T d", when=lambda cfg: cfg.type_vocab_size > 0),
    *bert.layer_norm("embed_norm", "embeddings.LayerNorm"),
    Row("rel_embed", "encoder.rel_embeddings.weight", "d", Table(), relative),
    *bert.layer_norm("rel_norm", "encoder.LayerNorm", when=lambda cfg: relative(cfg) and cfg.disentangled.norm),
    # v2: three projections with biases, the table's own ones
    *linear("block.attn.W_Q", f"{SELF}.query_proj", "d q", "block.attn.b_Q", when=_v2()),
    *linear("block.attn.W_K", f"{SELF}.key_proj", "d kv", "block.attn.b_K", when=_v2()),
    *linear("block.attn.W_V", f"{SELF}.value_proj", "d kv", "block.attn.b_V", when=_v2()),
    *linear("block.attn.W_Kr", f"{SELF}.pos_key_proj", "d q", "block.attn.b_Kr", when=_v2(term("c2p"))),
    *linear("block.attn.W_Qr", f"{SELF}.pos_query_proj", "d q", "block.attn.b_Qr", when=_v2(term("p2c"))),
    # v1: Q, K, V fused head by head without a bias, q_bias and v_bias beside; pos_proj without a bias
    *[replace(r, when=_v1()) for r in fused_qkv(f"{SELF}.in_proj", BY_GROUP)],
    Row("block.attn.b_Q", f"{SELF}.q_bias", "q", when=_v1()),
    Row("block.attn.b_V", f"{SELF}.v_bias", "kv", when=_v1()),
    *linear("block.attn.W_Kr", f"{SELF}.pos_proj", "d q", when=_v1(term("c2p"))),
    *linear("block.attn.W_Qr", f"{SELF}.pos_q_proj", "d q", "block.attn.b_Qr", when=_v1(term("p2c"))),
    *[r for r in bert.BLOCK_ROWS if ".attention.self." not in r.hf],
]


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


def head_rows(hf: str, dense: str, names: str) -> list[Row]:
    """The masked-LM head under HF (when config.json's legacy names it NAMES): Z·W_head + b_head (DENSE), its
    LayerNorm, b_vocab."""
    norm = dense.replace("dense", "LayerNorm")
    rows = [*linear("W_head", f"{hf}.{dense}", "d d", "b_head"), *bert.layer_norm("head_norm", f"{hf}.{norm}"),
            Row("b_vocab", f"{hf}.{'bias' if names == 'cls.predictions' else 'lm_head.bias'}", "V")]
    return [replace(r, when=lambda cfg: cfg.lm_head and cfg.head_names == names, root=True) for r in rows]


# The masked-LM head: logits = Norm(act(Z·W_head + b_head))·Eᵀ + b (W_vocab is always the word embeddings: legacy's
# decoder is tied to them, lm_predictions reads them), under legacy's names (cls.predictions.transform.dense, …) or
# legacy false's (lm_predictions.lm_head.dense, …), as config.json's legacy says.
ROWS += [*head_rows("cls.predictions", "transform.dense", "cls.predictions"),
         *head_rows("lm_predictions", "lm_head.dense", "lm_predictions"),
         Row("W_vocab", "cls.predictions.decoder.weight", "d V", Head(prefer_stored=False), masked_lm_head, root=True)]
_read, _write = both_ways(ROWS, lambda w: "" if w.W_head is None else "deberta.")


CONV = "encoder.conv"                  # DeBERTa-v2's convolution beside the first layer (cfg.first_conv)


def read_conv(store, cfg: ModelConfig, dtype) -> tuple[ConvWeights, NormWeights]:
    """The convolution (d, d, k) as one product's W (k·d, d) (row j·d + c is the file's weight[:, c, j]), its
    bias and its LayerNorm."""
    d, k = cfg.d_model, cfg.first_conv[0]
    W = store.get(f"{CONV}.conv.weight", (d, d, k), dtype)
    conv = ConvWeights(W=np.ascontiguousarray(W.transpose(2, 1, 0)).reshape(k * d, d),
                       b=store.get(f"{CONV}.conv.bias", (d,), dtype), kernel=k, stride=1, padding=(k - 1) // 2)
    norm = NormWeights(store.get(f"{CONV}.LayerNorm.weight", (d,), dtype), store.get(f"{CONV}.LayerNorm.bias", (d,),
                                                                                  dtype))
    return conv, norm


def weights(store, cfg: ModelConfig, dtype):
    """The family's Weights from STORE by its table (and the first layer's convolution, where the config has one); a
    masked-LM config whose file holds no head is refused."""
    w = _read(store, cfg, dtype)
    if cfg.first_conv is not None:
        w.blocks[0].conv, w.blocks[0].conv_norm = read_conv(store, cfg, dtype)
    if cfg.lm_head and (w.W_head is None or w.b_vocab is None or w.head_norm is None):
        raise QkvError(f"config.json names a DeBERTa masked-LM model whose head is {cfg.head_names}.* (legacy "
                       f"{cfg.head_names == 'cls.predictions'}) but the checkpoint does not hold it; use the config.json "
                       "that came with it")
    return w


def tensors(w, cfg: ModelConfig) -> dict:
    """Every tensor under transformers' full names, by the family's table and the first layer's convolution."""
    t = _write(w, cfg)
    conv, norm = w.blocks[0].conv, w.blocks[0].conv_norm
    if conv is not None:
        base = "" if w.W_head is None else "deberta."
        k, d = conv.kernel, conv.W.shape[1]
        t |= c_arrays({f"{base}{CONV}.conv.weight": conv.W.reshape(k, -1, d).transpose(2, 1, 0),   # (d, d, k)
                       f"{base}{CONV}.conv.bias": conv.b, f"{base}{CONV}.LayerNorm.weight": norm.weight,
                       f"{base}{CONV}.LayerNorm.bias": norm.bias})
    return t


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a DebertaV2Model / DebertaModel (or its *ForMaskedLM) with these knobs (no dropout)."""
    d = cfg.disentangled
    kind = "DebertaV2" if cfg.family == "deberta-v2" else "Deberta"
    return reads_back(cfg, {
        "model_type": cfg.family, "architectures": [kind + ("ForMaskedLM" if cfg.lm_head else "Model")],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "position_biased_input": cfg.position == "learned", "relative_attention": d is not None,
        "pos_att_type": _pos_att_type(cfg),
        "max_relative_positions": d.max_distance if d is not None else -1,
        **({"position_buckets": d.buckets if d is not None else -1, "share_att_key": bool(d and d.share_key),
            "norm_rel_ebd": "layer_norm" if d is not None and d.norm else "none",
            "conv_kernel_size": cfg.first_conv[0] if cfg.first_conv else 0,
            "conv_act": cfg.first_conv[1] if cfg.first_conv else "tanh", "conv_groups": 1}
           if cfg.family == "deberta-v2" else {}),
        "legacy": cfg.head_names != "lm_predictions", "tie_word_embeddings": True, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    }, config)


def _pos_att_type(cfg: ModelConfig) -> list[str]:
    """pos_att_type: the position terms, and as many more entries as the scale counts (relative_attention false: the
    scale still counts pos_att_type; v1 counts any entry, e.g. "p2p")."""
    terms = list(cfg.disentangled.terms) if cfg.disentangled is not None else []
    count = round(1.0 / (cfg.attn_scale ** 2 * cfg.d_head)) - 1                  # 1/√(d_k·(1 + count))
    more = [t for t in (*TERMS, "p2p") if t not in terms]
    return terms + more[:count - len(terms)]
