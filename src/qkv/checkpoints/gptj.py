"""GPT-J: one LayerNorm read by both parallel branches, interleaved partial RoPE, an LM head with a bias.

Its tensors: `ROWS` below, each checkpoint name (relative to GPTJModel) beside ours and how it is stored, read
both ways (loading and saving).

A block: x + Attn(Norm(x)) + FFN(Norm(x)) (`parallel_residual`, one norm: ffn_norm None). RoPE turns the
first rotary_dim numbers of each head (`rotary_dim`) by pairs (0, 1), (2, 3), … (`rope_interleaved`:
GPT-J's rotate_every_two, its sin/cos repeated in place), with base 10000. Dropouts are training's.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, special_ids
from .table import About, Row, attention, both_ways, layer_norm, linear, lm_head

MODEL_TYPES = ("gptj",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("gptj",), models="GPT-J",
          brings="one LayerNorm read by a parallel attention and FFN, RoPE by interleaved pairs (0, 1), (2, 3), … on "
                 "the first `rotary_dim` numbers of each head, an LM head with a bias",
          kind="decoder"),
)

# Tensors a GPT-J checkpoint may hold that qkv never reads ({i}: a layer), relative to GPTJModel.
IGNORED = {
    "h.{i}.attn.bias": "the causal mask, a buffer older transformers saved",
    "h.{i}.attn.masked_bias": "the mask's fill value, likewise",
    "h.{i}.attn.embed_positions": "the sin/cos table, a buffer older transformers saved (qkv computes it)",
}


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "n_embd"), need(hf, "n_head")
    check_shapes(hf, d, H)
    rotary = hf.get("rotary_dim")
    if rotary is None and H > 1:           # transformers builds d_model/2 angles for each d_model/H-wide head
        raise QkvError(f"GPT-J with rotary_dim null turns all {d} numbers of the model as one head, which "
                       f"transformers cannot apply to {H} heads either; give rotary_dim ≤ {d // H}")
    if rotary is not None and rotary > d // H:
        raise QkvError(f"GPT-J rotary_dim {rotary} is wider than a head ({d // H}); give rotary_dim ≤ {d // H}")
    return ModelConfig(
        family="gptj", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "n_layer"), n_heads=H,
        d_ff=4 * d if hf.get("n_inner") is None else hf["n_inner"], max_positions=hf.get("n_positions", 2048), causal=True,
        norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="rope", rope_theta=10000.0, rotary_dim=None if rotary in (None, d // H) else rotary,
        rope_interleaved=True, parallel_residual=True,
        activation=activation(hf.get("activation_function", "gelu_new")), gated_ffn=False,
        qkv_bias=False, out_bias=False, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. One norm before both
# boxes (the block is parallel); the head's bias is stored, tied or not.
ROWS = [
    Row("tok_embed", "wte.weight", "V d"),
    *layer_norm("block.attn_norm", "h.{i}.ln_1"),
    *attention("h.{i}.attn", out="out_proj"),
    *linear("block.ffn.W_in", "h.{i}.mlp.fc_in", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "h.{i}.mlp.fc_out", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "ln_f"),
    lm_head(),
    Row("b_vocab", "lm_head.bias", "V", root=True),
]
weights, tensors = both_ways(ROWS, "transformer.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPTJForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "gptj", "architectures": ["GPTJForCausalLM"],
        "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff, "n_positions": cfg.max_positions, "rotary_dim": cfg.rotary_dim or cfg.d_head,
        "layer_norm_epsilon": cfg.norm_eps, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        **special_ids(cfg),
    }, config)
