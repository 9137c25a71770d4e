"""GPT-Neo: GPT-2's layout with separate Q, K, V (no biases), unscaled scores and local / global layers.

Its tensors: `ROWS` below, each checkpoint name (relative to GPTNeoModel) beside ours and how it is stored, read
both ways (loading and saving).

Knobs: attention_types, e.g. [[["global", "local"], 12]], expanded to one kind per layer (attention_layers):
a "local" layer's query i sees keys i − window_size + 1 … i (layer_windows), a "global" one every earlier key;
S = Q·Kᵀ with no 1/√d_k (attn_scale 1); activation_function (gelu_new); intermediate_size (None: 4·d_model).
Dropouts are training's: qkv runs the model as transformers does in eval.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, special_ids
from .table import About, Row, attention, both_ways, layer_norm, linear, lm_head

MODEL_TYPES = ("gpt_neo",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("gpt_neo",), models="GPT-Neo",
          brings="global and local layers (`attention_types` expanded per layer, `window_size`), unscaled scores (no "
                 "1/√d_k), separate Q/K/V without biases",
          kind="decoder"),
)

# Tensors a GPT-Neo checkpoint may hold that qkv never reads ({i}: a layer), relative to GPTNeoModel.
IGNORED = {
    "h.{i}.attn.attention.bias": "the causal (or local) mask, a buffer older transformers saved",
    "h.{i}.attn.attention.masked_bias": "the mask's fill value, likewise",
    "lm_head.weight": "a stored copy of wte when tie_word_embeddings",
}


def _attention_layers(hf: dict, L: int) -> list[str]:
    """attention_types [[kinds, repeat], …] expanded as transformers does: kinds repeated, one per layer."""
    types = hf.get("attention_types", [[["global", "local"], 12]])
    try:
        layers = [kind for kinds, repeat in types for _ in range(repeat) for kind in kinds]
    except (TypeError, ValueError):
        layers = None
    if layers is None or len(layers) != L or any(k not in ("global", "local") for k in layers):
        raise QkvError(f"config.json attention_types {str(types)[:60]} must expand to 'global' or 'local' for each "
                       f"of the {L} layers; restore the checkpoint's config.json")
    return layers


def config(hf: dict) -> ModelConfig:
    d, H, L = need(hf, "hidden_size"), need(hf, "num_heads"), need(hf, "num_layers")
    check_shapes(hf, d, H)
    window = hf.get("window_size", 256)
    windows = tuple(window if kind == "local" else None for kind in _attention_layers(hf, L))
    return ModelConfig(
        family="gpt_neo", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        d_ff=hf.get("intermediate_size") or 4 * d, max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned", activation=activation(hf.get("activation_function", "gelu_new")),
        qkv_bias=False, out_bias=True, ffn_bias=True, attn_scale=1.0,
        sliding_window=window if len(set(windows)) == 1 and windows[0] else None,
        layer_windows=None if len(set(windows)) == 1 else windows,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=False,                          # wte: a plain nn.Embedding, the pad row learns
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one.
ROWS = [
    Row("tok_embed", "wte.weight", "V d"),
    Row("pos_embed", "wpe.weight", "P d"),
    *layer_norm("block.attn_norm", "h.{i}.ln_1"),
    *attention("h.{i}.attn.attention", out_bias=True, out="out_proj"),
    *layer_norm("block.ffn_norm", "h.{i}.ln_2"),
    *linear("block.ffn.W_in", "h.{i}.mlp.c_fc", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "h.{i}.mlp.c_proj", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "ln_f"),
    lm_head(prefer_stored=False, absent_ties=True),
]
weights, tensors = both_ways(ROWS, "transformer.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPTNeoForCausalLM with these knobs: each layer's kind as attention_types of one
    layer each (no dropout: qkv trains without it)."""
    windows = {cfg.window(i) for i in range(cfg.n_layers)} - {None}
    if len(windows) > 1:
        raise QkvError(f"GPT-Neo has one window_size for its local layers, not {sorted(windows)}; "
                       "give every windowed layer the same window")
    kinds = [["local" if cfg.window(i) else "global"] for i in range(cfg.n_layers)]
    return reads_back(cfg, {
        "model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_layers": cfg.n_layers, "num_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "attention_types": [[k, 1] for k in kinds], "window_size": windows.pop() if windows else 256,
        "layer_norm_epsilon": cfg.norm_eps, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0, "embed_dropout": 0.0,
        "resid_dropout": 0.0,
        **special_ids(cfg),
    }, config)


