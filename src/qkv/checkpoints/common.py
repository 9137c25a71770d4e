"""Helpers shared by the family modules: reading and writing config.json values, linear layers,
the tensors a checkpoint may hold unread."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import fields
from typing import Callable, Iterable

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..runtime.stored import StoredMatrix, StoredTable, half_bytes
from .tensors import PREFIXES, TensorStore

# Hugging Face activation names → ours, and ours → the name a config.json we write gives.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu", "relu": "relu", "relu2": "relu2",
               "quick_gelu": "quick_gelu"}
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu", "relu": "relu", "relu2": "relu2",
                  "quick_gelu": "quick_gelu"}


# Every config.json knob a family module reads, with the kind of value it must hold (null = absent).
_POSITIVE_INT = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "num_key_value_heads", "head_dim", "n_embd", "n_layer", "n_head",
                 "n_positions", "type_vocab_size", "sliding_window", "rotary_dim",
                 # encoder–decoders (Marian, BART, T5)
                 "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                 "num_layers", "num_decoder_layers", "num_heads", "d_kv", "relative_attention_num_buckets",
                 "relative_attention_max_distance", "decoder_vocab_size",
                 # Phi-3's LongRoPE, OPT's embedding width
                 "original_max_position_embeddings", "word_embed_proj_dim",
                 # layers of different kinds (GPT-Neo, SmolLM3, Gemma 3's older configs)
                 "window_size", "no_rope_layer_interval", "sliding_window_pattern",
                 # encoders (DistilBERT's names, ELECTRA's embedding width)
                 "dim", "n_layers", "n_heads", "embedding_size", "global_attn_every_n_layers", "local_attention",
                 # mixtures of experts (Mixtral, Qwen2-MoE)
                 "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                 # BLOOM, Falcon
                 "n_embed", "num_kv_heads", "ffn_hidden_size", "num_ln_in_parallel_attn", "pretraining_tp",
                 # MPT (its n_heads, n_layers: DistilBERT's names above)
                 "max_seq_len",
                 # ViT
                 "num_channels", "encoder_stride", "pooler_output_size", "num_labels",
                 # Whisper
                 "num_mel_bins", "max_source_positions", "max_target_positions")
# The FFN's width: 0 = attention-only.
_COUNT = ("intermediate_size", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "ffn_dim", "hidden_dim",
          "num_experts", "shared_expert_intermediate_size")        # 0 experts: every FFN dense (Qwen2-MoE)
# Upper bounds of the sizes above, generous (the largest checkpoints have ~10² layers and heads, ~10⁵ labels, ≤ 128
# mel bins): past them a config is nonsense, and a few sizes shape lists or arrays before any tensor is read (the
# labels' names, each layer's kind), so 10⁹ layers or labels would exhaust memory or time before the tensors' shapes
# are checked against them. Every other size: at most MAX_SIZE (int32, as torch's shapes and ids in practice).
MAX_SIZE = 2**31 - 1
_BOUNDS = {**dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers",
                            "num_decoder_layers", "n_layers", "num_attention_heads", "num_key_value_heads", "n_head",
                            "encoder_attention_heads", "decoder_attention_heads", "num_heads", "n_heads",
                            "num_kv_heads"), 1 << 14),
           **dict.fromkeys(("num_labels", "num_local_experts", "num_experts", "num_experts_per_tok"), 1 << 20),
           **dict.fromkeys(("num_mel_bins", "num_channels"), 1 << 12)}
_ANY_INT = ("pad_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id")   # some Llama conversions say pad_token_id -1
_POSITIVE_FLOAT = ("clip_qkv", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "rope_theta",
                   "rotary_emb_base", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                   "rope_local_base_freq", "norm_eps", "global_rope_theta", "local_rope_theta",
                   # the multipliers (Cohere, Granite)
                   "logit_scale", "logits_scaling", "embedding_multiplier", "residual_multiplier",
                   "attention_multiplier")
_BOOL = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window",
         "scale_attn_by_inverse_layer_idx", "scale_attn_weights", "scale_embedding", "scale_decoder_outputs",
         "share_encoder_decoder_embeddings", "use_parallel_residual", "qk_layernorm",
         "use_bidirectional_attention", "use_qkv_bias", "use_bias", "do_layer_norm_before", "enable_bias",
         "layer_norm_elementwise_affine", "_remove_final_layer_norm", "qkv_bias", "norm_topk_prob",
         "output_router_logits", "use_qk_norm",
         "is_decoder", "add_cross_attention", "sinusoidal_pos_embds",
         "norm_bias", "decoder_bias", "classifier_bias",                # ModernBERT
         "apply_residual_connection_post_layernorm", "slow_but_exact",  # BLOOM
         "alibi", "new_decoder_architecture", "multi_query", "parallel_attn", "bias",   # Falcon
         "use_weighted_layer_sum", "apply_spec_augment")                               # Whisper
_TEXT = ("model_type", "hidden_act", "hidden_activation", "activation_function", "position_embedding_type", "feed_forward_proj",
         "activation", "classifier_activation", "pooler_act")
_OBJECT = ("rope_scaling", "rope_parameters", "attn_config")
# Inside rope_scaling / rope_parameters.
_ROPE_FLOAT = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
               "attention_factor")


# Keys whose null is not "absent": DeepSeek's q_lora_rank null is q without a latent (absent: the default 1536);
# by model type, EXAONE 4's and gpt-oss's sliding_window null is no window (absent: their configs' 4096, 128).
NULL_KEPT = ("q_lora_rank",)
NULL_KEPT_BY_TYPE = {"exaone4": ("sliding_window",), "gpt_oss": ("sliding_window",),
                     "llama4_text": ("attention_chunk_size", "bos_token_id", "eos_token_id",    # null: none;
                                     "num_key_value_heads", "head_dim"),    # null: H, d_model / H (llama4.config)
                     "falcon_h1": ("mamba_d_ssm",)}          # null: mamba_expand · hidden_size channels


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _bad(where: str, key: str, value, want: str) -> QkvError:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return QkvError(f"{where} {key} = {shown} is not {want}; restore the checkpoint's config.json")


def check_config(hf: dict, where: str = "config.json") -> dict:
    """The types and ranges of every knob, before any of them shapes an array: one QkvError naming
    the first bad value (a string "768", a float 12.0, a bool, 0 heads, a negative eps, ...).
    Returns the config without its null values: null means "absent" (the family's default)."""
    kept = NULL_KEPT + NULL_KEPT_BY_TYPE.get(hf.get("model_type"), ())
    hf = {k: v for k, v in hf.items() if v is not None or k in kept}
    if hf.get("use_sliding_window") is False and hf.get("sliding_window") == 0:
        del hf["sliding_window"]                          # Qwen2-MoE writes 0 for "no window": unused, as absent
    for key in _POSITIVE_INT:
        v, most = hf.get(key), _BOUNDS.get(key, MAX_SIZE)
        if key == "sliding_window_pattern" and hf.get("model_type") == "exaone4" and (isinstance(v, str) or v == 0):
            continue                                      # EXAONE 4's "LLLG", or 0 (no window): read by its module
        if key == "type_vocab_size" and v == 0 and hf.get("model_type") in ("deberta", "deberta-v2"):
            continue                                      # DeBERTa: 0 = no token types (its default)
        if key == "num_local_experts" and v == 0 and hf.get("model_type") == "granitemoehybrid":
            continue                                      # Granite 4's dense hybrids (h-micro): the shared FFN alone
        if v is not None and not (_is_int(v) and 0 < v <= most):
            raise _bad(where, key, v, "a positive integer" + (f" up to {most:,}" if _is_int(v) and v > 0 else ""))
    for key in _COUNT:
        v, most = hf.get(key), _BOUNDS.get(key, MAX_SIZE)
        if v is not None and not (_is_int(v) and 0 <= v <= most):
            raise _bad(where, key, v, f"a whole number up to {most:,} (0 = no FFN)")
    for key in _ANY_INT:
        v = hf.get(key)
        if v is not None and not _is_int(v):
            raise _bad(where, key, v, "an integer token id")
    eos = hf.get("eos_token_id")
    if eos is not None and not (_is_int(eos) or (isinstance(eos, list) and all(_is_int(e) for e in eos))):
        raise _bad(where, "eos_token_id", eos, "a token id or a list of token ids")
    for key in _POSITIVE_FLOAT:
        v = hf.get(key)
        if v is not None and not (_is_number(v) and v > 0):
            raise _bad(where, key, v, "a positive number")
    v = hf.get("rope_local_base_freq")                  # Gemma 3's older key; θ ≤ 1 turns every pair alike or not
    if v is not None and not (_is_number(v) and v > 1):  # at all (1/θ^(2i/d)), even where rope_parameters wins
        raise _bad(where, "rope_local_base_freq", v, "a RoPE base above 1")
    for key in ("partial_rotary_factor", "rotary_pct"):
        v = hf.get(key)
        if v is not None and not (_is_number(v) and 0 < v <= 1):
            raise _bad(where, key, v, "a number in (0, 1]")
    for key in _BOOL:
        v = hf.get(key)
        if v is not None and not isinstance(v, bool):
            raise _bad(where, key, v, "true or false")
    for key in _TEXT:
        v = hf.get(key)
        if v is not None and not isinstance(v, str):
            raise _bad(where, key, v, "a string")
    for key in _OBJECT:
        v = hf.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise _bad(where, key, v, "an object (or null)")
        for kind in ("rope_type", "type"):
            if v.get(kind) is not None and not isinstance(v[kind], str):
                raise _bad(where, f"{key}.{kind}", v[kind], "a string")
        for inner in _ROPE_FLOAT:
            if v.get(inner) is not None and not (_is_number(v[inner]) and v[inner] > 0):
                raise _bad(where, f"{key}.{inner}", v[inner], "a positive number")
    return hf


def check_shapes(hf: dict, d_model: int, n_heads: int) -> None:
    """The knobs that must divide each other: d_model by the heads (unless head_dim is given)
    and the query heads by the K/V heads."""
    if hf.get("head_dim") is None and d_model % n_heads:
        raise QkvError(f"config.json: hidden size {d_model} is not divisible by {n_heads} attention heads; "
                       "restore the checkpoint's config.json")
    kv = hf.get("num_key_value_heads")
    if kv is not None and (kv > n_heads or n_heads % kv):
        raise QkvError(f"config.json: num_key_value_heads {kv} does not divide num_attention_heads {n_heads}; "
                       "restore the checkpoint's config.json")


def partial_rope(hf: dict, d_head: int, default_factor: float = 1.0) -> tuple[float, dict | None, int | None]:
    """(rope_theta, rope_scaling, rotary_dim) of a model that may turn only part of each head (GPT-NeoX,
    Phi): from transformers 5's `rope_parameters`, else the older keys (rope_theta / rotary_emb_base,
    partial_rotary_factor / rotary_pct, rope_scaling). rotary_dim = int(d_head · factor), as transformers
    computes it, None when all of each head turns; a factor outside (0, 1] or a count that is not even and
    ≥ 2 is refused in one line."""
    params = hf.get("rope_parameters") or {}
    theta = params.get("rope_theta", hf.get("rotary_emb_base", hf.get("rope_theta", 10000.0)))
    factor = params.get("partial_rotary_factor", hf.get("rotary_pct", hf.get("partial_rotary_factor", default_factor)))
    if not _is_number(factor) or not 0 < factor <= 1:
        raise QkvError(f"config.json partial_rotary_factor = {factor!r} is not a number in (0, 1]; "
                       "restore the checkpoint's config.json")
    rotary = int(d_head * factor)
    if rotary < 2 or rotary % 2:
        raise QkvError(f"RoPE over {rotary} of each head's {d_head} numbers (partial_rotary_factor {factor}) "
                       "needs an even count ≥ 2; restore the checkpoint's config.json")
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return float(theta), scaling, None if rotary == d_head else rotary


def longrope_scaling(hf: dict, scaling: dict | None, rotary: int) -> dict | None:
    """SCALING with a "longrope" kind resolved as transformers' _compute_longrope_parameters reads it, every
    number written in (what qkv.core.positions reads): both factor tables checked (ROTARY/2 positive numbers
    each), original_max_position_embeddings (the config's own key first, as Phi-3's), factor (else
    max_position_embeddings / original) and the attention factor (else √(1 + ln factor / ln original), 1 when
    factor ≤ 1). Any other SCALING is returned as it is."""
    if (scaling or {}).get("rope_type", (scaling or {}).get("type")) != "longrope":
        return scaling
    for key in ("short_factor", "long_factor"):
        table = scaling.get(key)
        if not (isinstance(table, list) and len(table) == rotary // 2 and all(_is_number(v) and v > 0 for v in table)):
            raise QkvError(f"config.json rope_scaling.{key} must be {rotary // 2} positive numbers (one per pair "
                           "of turned dimensions); restore the checkpoint's config.json")
    original = hf.get("original_max_position_embeddings",
                      scaling.get("original_max_position_embeddings", hf.get("max_position_embeddings", 4096)))
    factor = scaling.get("factor") or hf.get("max_position_embeddings", 4096) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_type": "longrope", "short_factor": [float(v) for v in scaling["short_factor"]],
            "long_factor": [float(v) for v in scaling["long_factor"]], "original_max_position_embeddings": int(original),
            "factor": float(factor), "attention_factor": float(attention)}


def activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise QkvError(f"activation {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def need(hf: dict, key: str):
    """A config.json value the model cannot be built without."""
    if key not in hf or hf[key] is None:
        raise QkvError(f"config.json lacks {key!r}; use the config.json that came with the checkpoint")
    return hf[key]


def linear_T(store: TensorStore, name: str, n_in: int, n_out: int, dtype) -> np.ndarray:
    """A torch Linear weight, stored (out, in), as our (in, out) W: a transposed view, no copy."""
    return store.get(name, (n_out, n_in), dtype).T


def conv1d(store: TensorStore, name: str, n_in: int, n_out: int, dtype):
    """A GPT-2 Conv1D weight, stored (in, out): our W (in, out) as it is. Held in 16 bits, the file's rows are
    W's inputs, and the stored products read output rows: rewritten once as Wᵀ's rows (the same numbers)."""
    W = store.get(name, (n_in, n_out), dtype)
    if isinstance(W, StoredTable):
        m = W.matrix
        W = StoredMatrix(m.kind, half_bytes(m.dequantized_rows().T, m.kind), n_in)
    return W


def columns(W, start: int, stop: int):
    """W[:, start:stop], a view: of an array, or of a stored matrix's rows."""
    return W.rows(slice(start, stop)) if isinstance(W, StoredMatrix) else W[:, start:stop]


def reads_back(cfg: ModelConfig, hf: dict, read: Callable[[dict], ModelConfig]) -> dict:
    """HF, the config.json written for CFG, once it reads back as CFG (every knob, rope_scaling too);
    a knob the family's config.json cannot hold (RMSNorm in GPT-2, a window in Llama) is refused."""
    back = read(check_config(hf))
    differ = [f.name for f in fields(cfg) if getattr(back, f.name) != getattr(cfg, f.name)]
    if differ:
        knobs = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in differ)
        raise QkvError(f"a {hf['model_type']} config.json cannot hold {knobs}; change those knobs or the family")
    return hf


def rope_parameters(cfg: ModelConfig, **more) -> dict:
    """transformers 5's rope_parameters of CFG: its scaling (or the "default" kind), θ, and MORE (a partial
    rotary factor)."""
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    if rope.get("rope_type") == "dynamic":               # config.json's own max_position_embeddings holds it
        rope.pop("max_position_embeddings", None)
    return {**rope, "rope_theta": cfg.rope_theta, **more}


def rope_by_layer_type(cfg: ModelConfig, local_theta: float) -> dict:
    """transformers 5's rope_parameters by layer type (Gemma 3, OLMo 3): the full layers' scaling and θ, and the
    sliding layers' own scaling with LOCAL_THETA."""
    full = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    local = {"rope_type": "default"} if cfg.local_rope_scaling is None else dict(cfg.local_rope_scaling)
    return {"full_attention": {**full, "rope_theta": cfg.rope_theta},
            "sliding_attention": {**local, "rope_theta": local_theta}}


def model_type_keys(cfg: ModelConfig, architectures: dict[str, str]) -> dict:
    """config.json's model_type and architectures for CFG's family, one of ARCHITECTURES (model_type → the
    transformers class a module writes); another family is refused in one line."""
    if cfg.family not in architectures:
        raise QkvError(f"family {cfg.family!r} is not one of {sorted(architectures)}; use its own module")
    return {"model_type": cfg.family, "architectures": [architectures[cfg.family]]}


def decoder_sizes(cfg: ModelConfig, head_dim: bool = True) -> dict:
    """The sizes a Llama-style decoder's config.json holds, in transformers' names and order: V, d_model, L, H,
    the K/V heads, d_k (HEAD_DIM false: a family that writes head_dim only where it is not d_model / H, or never),
    the FFN's width and the longest context."""
    sizes = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
             "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads}
    if head_dim:
        sizes["head_dim"] = cfg.d_head
    return sizes | {"intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions}


def special_ids(cfg: ModelConfig) -> dict:
    """The special tokens' ids a config.json holds (pad, bos, eos; eos may be a list)."""
    return {"pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def c_arrays(tensors: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """Each tensor as a new C-ordered array (never a view of the weights); None (absent) left out."""
    return {name: np.array(t, order="C", copy=True) for name, t in tensors.items() if t is not None}


# ── tensors nothing reads ─────────────────────────────────────────────────────────

SHOWN = 3                      # unread tensors named in the error; the rest are counted


@functools.lru_cache(maxsize=None)
def _pattern(pattern: str) -> re.Pattern:
    """An IGNORED pattern as a regex: {i} is a layer number, * any text, the rest literal."""
    parts = re.split(r"(\{i\}|\*)", pattern)
    return re.compile("".join({"{i}": r"\d+", "*": ".*"}.get(p, re.escape(p)) for p in parts))


def ignorable(name: str, ignored: Iterable[str]) -> bool:
    """Whether stored tensor NAME matches a pattern of IGNORED, a family's table of the tensors a
    checkpoint may hold unread (patterns relative to the base model, as `find` reads: the task
    model's prefix, "model." / "bert." / "transformer.", may come first)."""
    return any(_pattern(p).fullmatch(name[len(prefix):]) for p in ignored
               for prefix in PREFIXES if name.startswith(prefix))


def unread(names: Iterable[str], read: set[str], ignored: Iterable[str]) -> list[str]:
    """The NAMES neither READ nor IGNORED, sorted."""
    ignored = tuple(ignored)
    return sorted(n for n in names if n not in read and not ignorable(n, ignored))


def unread_error(names: list[str], holder: str, reader: str, fix: str) -> QkvError:
    """One line: HOLDER has these tensors a READER never reads (the first few named), then FIX."""
    shown = ", ".join(map(repr, names[:SHOWN])) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    count = f"{len(names)} tensor{'s' if len(names) > 1 else ''}"
    return QkvError(f"{holder} has {count} that a {reader} never reads ({shown}); {fix}")


# ── layers of different kinds ─────────────────────────────────────────────────────

LAYER_TYPES = {"full_attention": False, "sliding_attention": True}   # config.json layer_types → windowed?


def layer_windows(hf: dict, window: int | None, n_layers: int, default: list[str]) -> tuple[int | None, tuple | None]:
    """(sliding_window, layer_windows) of ModelConfig from config.json's `layer_types` (DEFAULT when it has
    none: the family's own pattern): a "sliding_attention" layer sees the last WINDOW keys, a "full_attention"
    one all of them. Every layer alike: (its window, None); else (WINDOW, each layer's). Another kind of
    layer, a count other than the layers', or sliding layers without a window are refused in one line."""
    types = hf.get("layer_types", default)
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        shown = sorted(set(map(str, types))) if isinstance(types, list) else repr(types)[:40]
        raise QkvError(f"config.json layer_types {shown} must give each of the {n_layers} layers full_attention or "
                       "sliding_attention; restore the checkpoint's config.json")
    if window is None and any(LAYER_TYPES[t] for t in types):
        raise QkvError("config.json has sliding_attention layers but no sliding_window (or use_sliding_window "
                       "false); restore the checkpoint's config.json")
    windows = tuple(window if LAYER_TYPES[t] else None for t in types)
    return (windows[0], None) if len(set(windows)) == 1 else (window, windows)


def layer_types(cfg: ModelConfig) -> list[str]:
    """config.json's layer_types of CFG (each layer full or sliding)."""
    return ["full_attention" if cfg.window(i) is None else "sliding_attention" for i in range(cfg.n_layers)]


# RoPE's frequencies, a buffer older transformers saved in Llama-style checkpoints ({i}: a layer, relative to
# the base model): qkv computes them from rope_theta. A family's IGNORED table starts from it.
ROTARY_BUFFERS = {
    "layers.{i}.self_attn.rotary_emb.inv_freq": "RoPE's frequencies, a buffer older transformers saved "
                                                "(qkv computes them from rope_theta)",
    "rotary_emb.inv_freq": "the same, kept once for the model",
}
