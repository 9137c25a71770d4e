"""GLM and GLM-4 (Zhipu AI; transformers' GlmForCausalLM, Glm4ForCausalLM): Llama's RMSNorm, GQA and SwiGLU
blocks with RoPE on the interleaved pairs of the first part of each head; GLM-4 adds a norm after each box.

    config.json knob         qkv knob                   what it does
    partial_rotary_factor    rotary_dim                 RoPE turns the first int(d_k·factor) numbers of each head
      (default 0.5)                                     (rope_parameters' own first, then the top-level key)
    (always)                 rope_interleaved           … by the pairs (0, 1), (2, 3), … (GLM's rotate_half takes
                                                        x[0::2], x[1::2]; its cos, sin repeated in place: GPT-J's)
    attention_bias (true)    qkv_bias (out_bias off)    biases of q/k/v_proj; o_proj never has one
    rope_parameters          rope_theta, rope_scaling   the base (10000) and its scalings, as Llama's
    (glm4)                   attn_out_norm, ffn_out_norm  post_self_attn_layernorm, post_mlp_layernorm: each box's
                                                        output normalised before it joins the stream (sandwich)
    head_dim (128), num_key_value_heads (2), rms_norm_eps (1.5625e-7), max_position_embeddings (131072),
    pad_token_id (151329), eos_token_id ([151329, 151336, 151338], also for null): GlmConfig's / Glm4Config's
    defaults when config.json leaves them out. The FFN's gate and up are one Linear, gate_up_proj (rows [gate; up]),
    with no biases (GlmConfig has no mlp_bias); attention_dropout is training's.

Its tensors, relative to GlmModel / Glm4Model ("model."; the head is "lm_head"): ROWS below. llama.cpp's `glm4`
files (GGUF): the same tensors (attn_q/k/v with their biases, ffn_up = gate_up_proj, post_attention_norm,
post_ffw_norm), rows as Hugging Face's (its RoPE turns neighbouring pairs, as GLM's).

llama.cpp's `chatglm` files are GLM's (its converter, ChatGLMModel, writes GlmForCausalLM and THUDM's ChatGLM2/3 and
glm-4-9b-chat as `chatglm`): GLM's tensors as stored (ffn_up = gate_up_proj; attn_q/k/v with their biases, or
THUDM's query_key_value as one attn_qkv [Q; K; V], split here), RoPE on neighbouring pairs of the first
rope.dimension_count numbers of each head (GGML's NORM RoPE, GLM's interleaved partial rotary), d_model / heads per
head (llama.cpp's chatglm has no head size of its own), no bias on attn_output, the FFN or the norms. What its
converter writes for a GLM directory is what llama.cpp runs, and what is read here: rope.freq_base 10000 · rope_ratio
(ChatGLM's key: 10000 for a GLM directory, whatever its rope_theta), layer_norm_rms_epsilon ChatGLM's layernorm_epsilon
or 1e-5 (not GLM's rms_norm_eps), context_length seq_length or d_model, rope.dimension_count
(d_model / heads) · partial_rotary_factor.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..core.positions import check_rope
from .common import (HF_ACTIVATIONS, ROTARY_BUFFERS, activation, check_shapes, longrope_scaling, need, partial_rope,
                     decoder_sizes, model_type_keys, reads_back, rope_parameters, special_ids)
from .table import LINEAR, LLAMA_TOP, About, Arch, Row, attention, both_ways, layer_norm, lm_head, qkv_bias

MODEL_TYPES = ("glm", "glm4")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("glm",), models="GLM-4 (2024, `GlmForCausalLM`: glm-4-9b-hf)",
          brings="Llama's boxes with RoPE on interleaved pairs of the first part of each head "
                 "(`partial_rotary_factor`, default 0.5), SwiGLU's gate and up in one matrix (`gate_up_proj`), "
                 "biases on q/k/v only (`attention_bias`), a head size of its own",
          kind="decoder"),
    About(types=("glm4",), models="GLM-4-0414, GLM-Z1 (`Glm4ForCausalLM`)",
          brings="GLM's blocks with a norm after attention and after the FFN before each joins the stream "
                 "(`post_self_attn_layernorm`, `post_mlp_layernorm`: sandwich norms)",
          kind="decoder", refuses=("dla",)),
)

ARCHITECTURES = {"glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM"}

IGNORED = ROTARY_BUFFERS

DEFAULTS = {"head_dim": 128, "num_key_value_heads": 2, "rms_norm_eps": 1.5625e-7, "max_position_embeddings": 131072,
            "attention_bias": True, "hidden_act": "silu", "pad_token_id": 151329,
            "eos_token_id": [151329, 151336, 151338]}                 # GlmConfig's and Glm4Config's own
FACTOR = 0.5                                                           # their partial_rotary_factor


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    family = hf["model_type"]
    d, H, d_k = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "head_dim")
    check_shapes(hf, d, H)
    theta, scaling, rotary = partial_rope({k: v for k, v in hf.items() if k not in ("rotary_pct", "rotary_emb_base")},
                                          d_k, default_factor=FACTOR)  # GLM reads neither GPT-NeoX key
    scaling = longrope_scaling(hf, scaling, rotary or d_k)
    check_rope(theta, scaling)           # a rope_type qkv lacks, θ ≤ 1: refused now, not at the first pass
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf["num_key_value_heads"] or H, d_head=d_k, d_ff=need(hf, "intermediate_size"),
        max_positions=hf["max_position_embeddings"], causal=True, norm="rms", norm_place="pre",
        norm_eps=hf["rms_norm_eps"], position="rope", rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary,
        rope_interleaved=True, activation=activation(hf["hidden_act"]), gated_ffn=True,
        qkv_bias=bool(hf["attention_bias"]), out_bias=False, ffn_bias=False,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf["pad_token_id"], bos_token_id=hf.get("bos_token_id"),
        eos_token_id=DEFAULTS["eos_token_id"] if hf["eos_token_id"] is None else hf["eos_token_id"],   # null: theirs
        pad_embedding_frozen=True,                                     # nn.Embedding's padding_idx
    )


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GlmForCausalLM / Glm4ForCausalLM with these knobs (transformers 5's rope_parameters)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    return reads_back(cfg, {
        **model_type_keys(cfg, ARCHITECTURES),
        **decoder_sizes(cfg), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "attention_bias": cfg.qkv_bias,
        "rope_parameters": rope_parameters(cfg, partial_rotary_factor=factor),
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        **special_ids(cfg),
    }, config)


def sandwich(cfg: ModelConfig) -> bool:               # GLM-4: a norm after attention and after the FFN
    return cfg.family == "glm4"


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. GLM-4's
# post_attention_layernorm is the norm before the FFN (as GLM's); its norms after the boxes have names of their own.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias),
    *layer_norm("block.attn_out_norm", "layers.{i}.post_self_attn_layernorm", bias=False, when=sandwich),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row(("block.ffn.W_gate", "block.ffn.W_in"), "layers.{i}.mlp.gate_up_proj.weight", "d f+f", LINEAR, parts="f f"),
    Row("block.ffn.W_out", "layers.{i}.mlp.down_proj.weight", "f d", LINEAR),
    *layer_norm("block.ffn_out_norm", "layers.{i}.post_mlp_layernorm", bias=False, when=sandwich),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """GLM's and GLM-4's config.json of a llama.cpp file: its head size (glm4's key_length, not d_model / heads; a
    chatglm file's d_model / heads, which GlmConfig's default 128 must not replace), and no pad or bos id but the
    file's (gguf sets those it names; GlmConfig's pad is an id of another vocabulary). An eos the file does not name
    stays GlmConfig's, as for a config.json with eos_token_id null."""
    return hf | {"head_dim": dims["d_head"], "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


# llama.cpp's architectures (gguf_archs reads them by this table): GLM's and GLM-4's tensors under llama.cpp's names.
GGUF = {
    "chatglm": Arch("glm", "GlmForCausalLM",
                    {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                     "attn_v": "self_attn.v_proj", "attn_qkv": "self_attn.qkv",   # attn_qkv: split (hf_tensors)
                     "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                     "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
                    LLAMA_TOP, biases="optional", partial_rope=True, config=_gguf_config),
    "glm4": Arch("glm4", "Glm4ForCausalLM",
                 {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                  "post_attention_norm": "post_self_attn_layernorm", "ffn_norm": "post_attention_layernorm",
                  "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_mlp_layernorm"},
                 LLAMA_TOP, biases="optional", partial_rope=True, config=_gguf_config),
}
