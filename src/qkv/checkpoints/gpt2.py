"""GPT-2: pre-norm, learned positions, tanh GELU, W_vocab tied to the embeddings.

Its tensors: `ROWS` below, each checkpoint name (relative to GPT2Model) beside ours and how it is stored, read
both ways (loading and saving).
GPT-2's Conv1D stores weights (in, out), already the way we multiply: no transpose.
`config` / `weights` read a checkpoint by this table; `hf_config` / `tensors` write one, under
GPT2LMHeadModel's names ("transformer." + the names in ROWS; the head is "lm_head").
An attention-only model (d_ff = 0) keeps c_fc (d, 0), c_proj (0, d) and its bias b_out.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, special_ids
from .table import CONV1D, About, Arch, Row, both_ways, fused_qkv, layer_norm, linear, lm_head

MODEL_TYPES = ("gpt2",)                  # the config.json model_type this module reads (families.py finds it)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("gpt2",), models="GPT-2",
          brings="pre-norm LayerNorm, learned positions, fused Q/K/V (`c_attn`), tanh GELU, tied head",
          kind="decoder"),
)

# Tensors a GPT-2 checkpoint may hold that qkv never reads ({i}: a layer), relative to GPT2Model.
IGNORED = {
    "h.{i}.attn.bias": "the causal mask, a buffer older transformers saved",
    "h.{i}.attn.masked_bias": "the mask's fill value, likewise",
    "lm_head.weight": "a stored copy of wte when tie_word_embeddings (transformers ties it to wte too)",
}


def config(hf: dict) -> ModelConfig:
    for knob in ("scale_attn_by_inverse_layer_idx",):
        if hf.get(knob):
            raise QkvError(f"GPT-2 option {knob}=true is not supported; use a standard GPT-2 checkpoint")
    if hf.get("scale_attn_weights") is False:
        raise QkvError("GPT-2 option scale_attn_weights=false is not supported; use a standard GPT-2 checkpoint")
    d = need(hf, "n_embd")
    check_shapes(hf, d, need(hf, "n_head"))
    return ModelConfig(
        family="gpt2", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "n_layer"),
        n_heads=need(hf, "n_head"), d_ff=hf.get("n_inner", 4 * d), max_positions=need(hf, "n_positions"),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned", activation=activation(hf.get("activation_function", "gelu_new")),
        tied_embeddings=hf.get("tie_word_embeddings", True), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=False,                          # wte: a plain nn.Embedding, the pad row learns
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one.
ROWS = [
    Row("tok_embed", "wte.weight", "V d"),
    Row("pos_embed", "wpe.weight", "P d"),
    *layer_norm("block.attn_norm", "h.{i}.ln_1"),
    *fused_qkv("h.{i}.attn.c_attn", CONV1D, True),                     # (d, 3d) = [W_Q | W_K | W_V]
    *linear("block.attn.W_O", "h.{i}.attn.c_proj", "q d", "block.attn.b_O", how=CONV1D),
    *layer_norm("block.ffn_norm", "h.{i}.ln_2"),
    *linear("block.ffn.W_in", "h.{i}.mlp.c_fc", "d f", "block.ffn.b_in", how=CONV1D),
    *linear("block.ffn.W_out", "h.{i}.mlp.c_proj", "f d", "block.ffn.b_out", how=CONV1D),
    *layer_norm("final_norm", "ln_f"),
    lm_head(prefer_stored=False, absent_ties=True),
]
weights, tensors = both_ways(ROWS, "transformer.")

def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """GPT-2's config.json of a llama.cpp file: its own key names, d_model / heads per head, no RoPE."""
    d, H, Hkv, dk = dims["d"], dims["H"], dims["Hkv"], dims["d_head"]
    if Hkv != H or dk * H != d:
        raise QkvError(f"the GGUF gpt2 model has {H} heads of {dk} and {Hkv} K/V heads in d_model {d}; GPT-2 "
                       "has d_model / heads per head and no grouped K/V; the file is damaged")
    return {"n_embd": d, "n_head": H, "n_layer": dims["L"], "n_inner": dims["f"], "n_positions": dims["n_ctx"],
            "layer_norm_epsilon": dims["eps"], "activation_function": "gelu_new", "tie_word_embeddings": False}


# llama.cpp's architecture (gguf_archs): Conv1D weights transposed to (out, in) by its converter.
GGUF = {"gpt2": Arch("gpt2", "GPT2LMHeadModel",
                     {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
                      "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"},
                     {"token_embd": "wte", "position_embd": "wpe", "output_norm": "ln_f", "output": "lm_head"},
                     norm="layer", biases="all", norm_biases=True, layers="h",
                     transposed=("attn_qkv", "attn_output", "ffn_up", "ffn_down"), config=_gguf_config)}


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPT2LMHeadModel with these knobs (no dropout: qkv trains without it)."""
    return reads_back(cfg, {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff, "n_positions": cfg.max_positions, "layer_norm_epsilon": cfg.norm_eps,
        "activation_function": HF_ACTIVATIONS[cfg.activation], "tie_word_embeddings": cfg.tied_embeddings,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "summary_first_dropout": 0.0,
        **special_ids(cfg),
    }, config)


