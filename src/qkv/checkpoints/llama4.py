"""Llama 4's text model (Llama4ForCausalLM, model_type llama4_text): Llama's pre-norm RMSNorm blocks with

  - RoPE by interleaved pairs (transformers turns q, k as complex numbers: pair i is (x_2i, x_2i+1),
    cfg.rope_interleaved), θ 500000 by default, llama3 scaling as Llama 3's;
  - NoPE layers (no_rope_layers: 1 where a layer turns q, k, 0 where not; default every 4th layer has none,
    no_rope_layer_interval), whose queries are tuned by position (attn_temperature_tuning): q · (1 + τ·log(1 +
    ⌊(p + 1)/F⌋)), F floor_scale, τ attn_scale (cfg.temperature_floor, temperature_scale);
  - chunked attention on the RoPE layers (layer_types "chunked_attention", attention_chunk_size C): a query sees the
    keys of its own chunk of C positions only, counted from the row's first real token (cfg.attention_chunk,
    chunked_layers; the NoPE layers attend to everything before them);
  - use_qk_norm: each head's q and k divided by √(mean(x²) + eps) without weights, after RoPE, on the RoPE layers
    (cfg.qk_l2_norm);
  - MoE on the layers moe_layers names (or every interleave_moe_layer_step-th: layer i routed when (i + 1) %
    step = 0): a router without bias whose top num_experts_per_tok logits give the weights σ(logit) (cfg.router_score
    "sigmoid", not renormalised), each chosen expert reading its input × its weight, FFN_e(w·x)
    (cfg.expert_input_scaled), beside a shared SwiGLU expert every token takes ungated; experts and the shared one
    intermediate_size wide, a dense layer's FFN intermediate_size_mlp wide.

Its tensors: `ROWS` below, each checkpoint name (relative to the base model) beside ours and how it is stored, read
both ways (loading and saving):
    layers.{i}.feed_forward.router.weight (E, d)               ffn.W_router (d, E)
    layers.{i}.feed_forward.experts.gate_up_proj (E, d, 2·f)   ffn.experts[e].W_gate = [e][:, :f], W_in = [e][:, f:]
    layers.{i}.feed_forward.experts.down_proj (E, f, d)        ffn.experts[e].W_out = [e] (as we multiply)
    layers.{i}.feed_forward.shared_expert.{gate,up,down}_proj  ffn.shared
    layers.{i}.feed_forward.{gate,up,down}_proj                a dense layer's FFN
A Llama4ForConditionalGeneration checkpoint (model_type llama4: text and images) runs as its text model: the knobs
of its text_config, the tensors under language_model. (`TextOf`); its vision tower and projector (vision_model.*,
multi_modal_projector.*) are not read, and a checkpoint without the language model's tensors is refused in one line.

Knobs transformers reads that change no number qkv computes: output_router_logits, router_aux_loss_coef (no loss
in Llama4ForCausalLM's forward uses them), router_jitter_noise and attention_dropout (training mode only),
initializer_range, use_cache. transformers counts the temperature's position p over the row's cache index, padding
included, and qkv over the real tokens (positions.temperature_scales): the same numbers but for a left-padded row.
llama.cpp's `llama4` files (GGUF, `GGUF` below): the tensors as stored (RoPE on interleaved pairs in both), the fused
experts split and transposed by the converter (ffn_gate_exps, ffn_up_exps (E, f, d), ffn_down_exps (E, d, f): joined
back, `_gguf_plan`), a llama3 RoPE as rope_freqs (read as its table: gguf.rope_freqs). What llama.cpp's loader fixes
rather than reads is written into the config as it runs it: chunks of 8192 on the RoPE layers, no RoPE in every 4th
layer, the temperature's floor 8192 and scale 0.1, q/k norms unless the model has 128 experts (Maverick), the shared
expert as wide as each routed one, no biases; the routed layers every interleave_moe_layer_step-th. A file with
attention.sliding_window 0 (MobileLLM's: llama.cpp then turns every layer but the last) is refused.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.config import ModelConfig
from ..core.positions import check_rope
from ..core.weights import FFNWeights, MoEWeights
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, ROTARY_BUFFERS, activation, check_config, check_shapes, decoder_sizes,
                     reads_back, rope_parameters, special_ids)
from .table import (LLAMA_LAYER, LLAMA_TOP, About, Arch, How, Row, attention, both_ways, dense_layer, gated_ffn,
                    layer_norm, lm_head, out_bias, qkv_bias, routed_layer)

MODEL_TYPES = ("llama4_text", "llama4")           # llama4: Llama4ForConditionalGeneration, its text model run

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("llama4_text", "llama4"), models="Llama 4 (Scout, Maverick: the text model)",
          brings="chunked attention on the RoPE layers (`attention_chunk_size`: each query sees its own chunk, the "
                 "mask drawn as used), NoPE layers (`no_rope_layers`) whose queries grow with log position "
                 "(`attn_temperature_tuning`, `floor_scale`, `attn_scale`), q/k RMS-normalised without weights on the "
                 "RoPE layers (`use_qk_norm`), RoPE by interleaved pairs (llama3 scaling), and MoE layers "
                 "(`moe_layers`, `interleave_moe_layer_step`): σ of the top-k router logits, each expert reading its "
                 "input × its weight, beside an ungated shared expert; a text-and-image checkpoint (`llama4`) runs "
                 "as its text model",
          kind="MoE decoder"),
)

IGNORED = ROTARY_BUFFERS | {
    "vision_model.*": "a Llama4ForConditionalGeneration's vision tower: qkv runs its text model",
    "multi_modal_projector.*": "its projection of the image's features into the text model's stream",
}
TEXT = ("language_model.model.", "language_model.")     # where a text-and-image checkpoint keeps its text model

# Llama4TextConfig's defaults, which a config.json without the key gets (transformers 5.25).
DEFAULTS = {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "num_experts_per_tok": 1, "num_local_experts": 16,
            "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layer_interval": 4,
            "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
            "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2}
DEFAULT_THETA = 500000.0
LAYER_KINDS = ("full_attention", "chunked_attention")


NULLABLE = ("attention_chunk_size", "bos_token_id", "eos_token_id")   # null in config.json means none


def _get(hf: dict, key: str):
    """config.json's KEY, or Llama4TextConfig's default when absent (or null, but where null means none)."""
    if key in NULLABLE:
        return hf.get(key, DEFAULTS[key])
    return DEFAULTS[key] if hf.get(key) is None else hf[key]


def _whole(hf: dict, key: str, least: int) -> int:
    """A whole-number knob of config.json (Llama4TextConfig's default when absent), ≥ LEAST, else one error."""
    v = _get(hf, key)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise QkvError(f"config.json {key} = {v!r:.30} must be a whole number ≥ {least}; restore the checkpoint's "
                       "config.json")
    return v


def _layers(hf: dict, key: str, L: int) -> list[int] | None:
    """config.json's list KEY of layer numbers 0..L−1 (None when absent or null), else one error."""
    v = hf.get(key)
    if v is not None and (not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                                           or not 0 <= i < L for i in v)):
        raise QkvError(f"config.json {key} = {v!r:.40} must be a list of layers 0..{L - 1}; restore the checkpoint's "
                       "config.json")
    return v


def _rope_flags(hf: dict, L: int) -> list[int]:
    """no_rope_layers: 1 where layer i turns q, k by RoPE, 0 where not (a list at least L long; transformers reads
    its first L); absent or empty: no RoPE in every no_rope_layer_interval-th layer."""
    interval = _whole(hf, "no_rope_layer_interval", 1)
    flags = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(L)]
    if not isinstance(flags, list) or len(flags) < L or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise QkvError(f"config.json no_rope_layers = {flags!r:.40} must be a 0 or 1 for each of the {L} layers; "
                       "restore the checkpoint's config.json")
    return [int(f) for f in flags[:L]]


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling: transformers 5's rope_parameters (or the older rope_theta / rope_scaling)."""
    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", params.get("rope_theta", DEFAULT_THETA))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if scaling is not None:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise QkvError("llama4_text with partial rotary embeddings is not supported; use a checkpoint with full RoPE")
    return float(theta), scaling


def _layer_kinds(hf: dict, L: int, rope: list[int]) -> tuple[int | None, tuple[int, ...]]:
    """(attention_chunk_size, the chunked layers) from layer_types (absent: the RoPE layers chunked when a chunk size
    is set, as Llama4TextConfig fills it in); another kind of layer, or chunked layers without a size, refused."""
    chunk = _get(hf, "attention_chunk_size")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise QkvError(f"config.json attention_chunk_size = {chunk!r:.30} must be a positive whole number or null; "
                       "restore the checkpoint's config.json")
    default = ["chunked_attention" if r and chunk is not None else "full_attention" for r in rope]
    types = hf.get("layer_types") or default
    if not isinstance(types, list) or len(types) != L or any(t not in LAYER_KINDS for t in types):
        shown = sorted(set(map(str, types))) if isinstance(types, list) else repr(types)[:40]
        raise QkvError(f"config.json layer_types {shown} must give each of the {L} layers full_attention or "
                       "chunked_attention; restore the checkpoint's config.json")
    chunked = tuple(i for i, t in enumerate(types) if t == "chunked_attention")
    if chunked and chunk is None:
        raise QkvError("config.json has chunked_attention layers but no attention_chunk_size; restore the "
                       "checkpoint's config.json")
    return chunk, chunked


def _number(hf: dict, key: str) -> float:
    """A float knob of config.json (the default when absent): finite and ≥ 0."""
    v = _get(hf, key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise QkvError(f"config.json {key} = {v!r:.30} is not a finite number ≥ 0; restore the checkpoint's "
                       "config.json")
    return float(v)


def config(hf: dict) -> ModelConfig:
    if hf.get("model_type") == "llama4":                # text and images: the text model's knobs
        text = hf.get("text_config") or {}
        if not isinstance(text, dict):
            raise QkvError("config.json text_config is not an object; restore the checkpoint's config.json")
        return config(check_config({**text, "model_type": "llama4_text"}, "config.json text_config"))
    if hf.get("quantization_config") is not None:
        raise QkvError("llama4_text with quantised weights (quantization_config) is not supported; load it in "
                       "transformers unquantised, save_pretrained it, and open that copy")
    d, H, L = _whole(hf, "hidden_size", 1), _whole(hf, "num_attention_heads", 1), _whole(hf, "num_hidden_layers", 1)
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    check_rope(theta, scaling)
    rope = _rope_flags(hf, L)
    chunk, chunked = _layer_kinds(hf, L, rope)
    step = _whole(hf, "interleave_moe_layer_step", 1)
    moe = _layers(hf, "moe_layers", L)
    moe = sorted(set(range(step - 1, L, step) if moe is None else moe))
    E, k = _whole(hf, "num_local_experts", 1 if moe else 0), _whole(hf, "num_experts_per_tok", 1 if moe else 0)
    if moe and k > E:
        raise QkvError(f"config.json num_experts_per_tok {k} must be from 1 to the {E} experts (num_local_experts); "
                       "restore the checkpoint's config.json")
    d_ff, f = _whole(hf, "intermediate_size_mlp", 1), _whole(hf, "intermediate_size", 1)
    tuned = _get(hf, "attn_temperature_tuning")
    bias = bool(_get(hf, "attention_bias"))
    return ModelConfig(
        family="llama4_text", vocab_size=_whole(hf, "vocab_size", 1), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=_whole(hf, "num_key_value_heads", 1) if hf.get("num_key_value_heads", 0) is not None else H,
        d_head=_whole(hf, "head_dim", 1) if hf.get("head_dim", 0) is not None else d // H, d_ff=d_ff,
        max_positions=_whole(hf, "max_position_embeddings", 1), causal=True, norm="rms", norm_place="pre",
        norm_eps=_number(hf, "rms_norm_eps"), position="rope", rope_theta=theta, rope_scaling=scaling,
        rope_interleaved=True, no_rope_layers=tuple(i for i, r in enumerate(rope) if not r),
        attention_chunk=chunk, chunked_layers=chunked, qk_l2_norm=bool(_get(hf, "use_qk_norm")),
        temperature_floor=_whole(hf, "floor_scale", 1) if tuned else None, temperature_scale=_number(hf, "attn_scale"),
        activation=activation(_get(hf, "hidden_act")), gated_ffn=True, qkv_bias=bias, out_bias=bias, ffn_bias=False,
        tied_embeddings=bool(_get(hf, "tie_word_embeddings")), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=_get(hf, "bos_token_id"),
        eos_token_id=_get(hf, "eos_token_id"), pad_embedding_frozen=True,            # nn.Embedding's padding_idx
        n_experts=E if moe else 0, experts_per_token=k if moe else 0, norm_top_k=False, router_score="sigmoid",
        d_expert=None if f == d_ff or not moe else f, d_shared_expert=f if moe else 0, shared_expert_gate=False,
        dense_layers=tuple(i for i in range(L) if i not in moe) if moe else (), expert_input_scaled=bool(moe),
    )


class Experts(How):
    """A MoE layer's FFN under layers.{i}.feed_forward: the router (E, d), the E experts stored fused (gate_up_proj
    (E, d, 2·f): [gate | up] halves of the last axis, down_proj (E, f, d), as we multiply) and the shared expert's
    three Linears: one MoEWeights whose experts are views."""

    def read(self, store, name, shape, dtype, cfg):
        d, E, f = cfg.d_model, cfg.n_experts, cfg.d_expert or cfg.d_ff
        p = f"{name}.feed_forward"
        gate_up = store.get(f"{p}.experts.gate_up_proj", (E, d, 2 * f), dtype)          # (E, d, 2·f)
        down = store.get(f"{p}.experts.down_proj", (E, f, d), dtype)                    # (E, f, d)
        experts = [FFNWeights(W_gate=gate_up[e][:, :f], W_in=gate_up[e][:, f:], W_out=down[e]) for e in range(E)]
        s, fs = f"{p}.shared_expert", cfg.d_shared_expert
        shared = FFNWeights(W_gate=store.get(f"{s}.gate_proj.weight", (fs, d), dtype).T,           # (d, f)
                            W_in=store.get(f"{s}.up_proj.weight", (fs, d), dtype).T,
                            W_out=store.get(f"{s}.down_proj.weight", (d, fs), dtype).T)            # (f, d)
        return MoEWeights(W_router=store.get(f"{p}.router.weight", (E, d), dtype).T,  # (d, E)
                          experts=experts, shared=shared)

    def write_all(self, name, value, cfg):
        p, s = f"{name}.feed_forward", f"{name}.feed_forward.shared_expert"
        gate_up = np.stack([np.concatenate([x.W_gate, x.W_in], axis=-1) for x in value.experts])   # (E, d, 2·f)
        return {f"{p}.router.weight": value.W_router.T, f"{p}.experts.gate_up_proj": gate_up,
                f"{p}.experts.down_proj": np.stack([x.W_out for x in value.experts]),             # (E, f, d)
                f"{s}.gate_proj.weight": value.shared.W_gate.T, f"{s}.up_proj.weight": value.shared.W_in.T,
                f"{s}.down_proj.weight": value.shared.W_out.T}


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Experts(), layers=routed_layer),
    *gated_ffn("layers.{i}.feed_forward", layers=dense_layer),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
_weights, tensors = both_ways(ROWS, "model.")


class TextOf:
    """A Llama4ForConditionalGeneration checkpoint's tensors seen as its language model's: NAME is read as
    language_model.model.NAME (language_model.NAME: the head); everything else as the checkpoint answers it."""

    def __init__(self, store):
        self.store = store

    def _name(self, name: str) -> str:
        return next((p + name for p in TEXT if self.store.has(p + name)), TEXT[0] + name)

    def has(self, name: str) -> bool:
        return self.store.has(self._name(name))

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        return self.store.get(self._name(name), shape, dtype)

    def get_stored(self, name: str, shape: tuple[int, ...]):
        return self.store.get_stored(self._name(name), shape)

    def __getattr__(self, attr: str):
        return getattr(self.store, attr)


def weights(store, cfg: ModelConfig, dtype):
    """The Weights of STORE by ROWS: a Llama4ForCausalLM's tensors, or a text-and-image checkpoint's text model's
    (`TextOf`); one without either is refused."""
    if store.has("embed_tokens.weight"):
        return _weights(store, cfg, dtype)
    if store.has(TEXT[0] + "embed_tokens.weight"):
        return _weights(TextOf(store), cfg, dtype)
    raise QkvError("the checkpoint holds no Llama 4 text model (no embed_tokens.weight, nor language_model.model."
                   "embed_tokens.weight); save it as a Llama4ForCausalLM (transformers: the model's language_model"
                   ".save_pretrained) and open that")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Llama4ForCausalLM with these knobs, once it reads back as CFG."""
    if cfg.family != "llama4_text":
        raise QkvError(f"family {cfg.family!r} is not llama4_text; use its own module")
    L = cfg.n_layers
    moe = [i for i in range(L) if cfg.moe_layer(i)]
    hf = {
        "model_type": "llama4_text", "architectures": ["Llama4ForCausalLM"],
        **decoder_sizes(cfg), "intermediate_size": cfg.d_expert or cfg.d_ff, "intermediate_size_mlp": cfg.d_ff,
        "rms_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": cfg.qkv_bias, "attention_dropout": 0.0,
        "no_rope_layers": [int(i not in cfg.no_rope_layers) for i in range(L)],
        "attention_chunk_size": cfg.attention_chunk,
        "layer_types": ["chunked_attention" if i in cfg.chunked_layers else "full_attention" for i in range(L)],
        "use_qk_norm": cfg.qk_l2_norm, "attn_temperature_tuning": cfg.temperature_floor is not None,
        "floor_scale": cfg.temperature_floor or DEFAULTS["floor_scale"], "attn_scale": cfg.temperature_scale,
        "num_local_experts": cfg.n_experts or DEFAULTS["num_local_experts"],
        "num_experts_per_tok": cfg.experts_per_token or DEFAULTS["num_experts_per_tok"], "moe_layers": moe,
        "output_router_logits": False, "router_aux_loss_coef": 0.0,
        **special_ids(cfg),
    }
    return reads_back(cfg, hf, config)


# ── llama.cpp's `llama4` (GGUF) ───────────────────────────────────────────────────────────────────────────────────

# What llama.cpp's llama4 loader fixes (no key says them): the chunk, every NO_ROPE_STEP-th layer without RoPE, the
# temperature's floor and scale; its q/k norms off for the 128-expert model (Maverick).
GGUF_CHUNK, NO_ROPE_STEP, GGUF_TEMPERATURE = 8192, 4, (8192, 0.1)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Llama 4's config.json of a llama.cpp file, as llama.cpp's loader runs it (see the module's docstring); the
    shared expert as wide as a routed one (in the sizes, for the tensors' shapes). attention.sliding_window 0 refused,
    any other window read as llama.cpp does (chunks of 8192); expert_feed_forward_length and interleave_moe_layer_step
    required, as llama.cpp's loader requires them."""
    window = meta.get(f"{a}.attention.sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise QkvError(f"the GGUF value {a}.attention.sliding_window = {window!r:.20} is not a whole number; the file "
                       "is damaged")
    for key in ("expert_feed_forward_length", "interleave_moe_layer_step"):     # (llama.cpp's loader requires them)
        if f"{a}.{key}" not in meta:
            raise QkvError(f"the GGUF file lacks '{a}.{key}'; it is not a complete llama.cpp model")
    if window == 0:
        raise QkvError("the GGUF llama4 model has attention.sliding_window 0 (MobileLLM's: llama.cpp attends to every "
                       "earlier token and turns every layer but the last), which qkv does not run; use a Llama 4 "
                       "file (Scout, Maverick) with chunked attention")
    L, E, step = dims["L"], dims["E"], dims["moe_step"]
    dims["f_shared"] = dims["f_expert"]
    rope = [int((i + 1) % NO_ROPE_STEP != 0) for i in range(L)]
    floor, scale = GGUF_TEMPERATURE
    return hf | {"intermediate_size": dims["f_expert"], "intermediate_size_mlp": dims["f"], "num_local_experts": E,
                 "num_experts_per_tok": dims["k"], "interleave_moe_layer_step": step,
                 "moe_layers": [i for i in range(L) if (i + 1) % step == 0], "no_rope_layers": rope,
                 "attention_chunk_size": GGUF_CHUNK, "attention_bias": False,
                 "layer_types": ["chunked_attention" if r else "full_attention" for r in rope],
                 "attn_temperature_tuning": True, "floor_scale": floor, "attn_scale": scale, "use_qk_norm": E != 128}


def _gguf_plan(part: str, name: str, prefix: str, shape: tuple, dims: dict) -> list | None:
    """The experts as Llama4ForCausalLM stores them, from llama.cpp's three stacks: gate_up_proj (E, d, 2·f) is
    ffn_up_exps's plan, [gate | up] along the last axis from ffn_gate_exps and ffn_up_exps (E, f, d) transposed (the
    gate read too); down_proj (E, f, d) is ffn_down_exps (E, d, f) transposed; ffn_gate_exps's plan is none. Every
    other tensor the common plan."""
    p = f"{prefix}feed_forward.experts."
    if part == "ffn_gate_exps":
        return []
    if part == "ffn_down_exps":
        return [(p + "down_proj", (shape[0], shape[2], shape[1]), lambda w: np.ascontiguousarray(w.transpose(0, 2, 1)))]
    if part != "ffn_up_exps":
        return None
    gate_of = dims["values"][name.replace(".ffn_up_exps.", ".ffn_gate_exps.")]

    def joined(up: np.ndarray) -> np.ndarray:                      # (E, f, d) each → (E, d, 2·f)
        return np.ascontiguousarray(np.concatenate([gate_of(), up], axis=1).transpose(0, 2, 1))
    return [(p + "gate_up_proj", (shape[0], shape[2], 2 * shape[1]), joined)]


# llama.cpp's architecture (gguf_archs reads it by this table): Llama's attention, the FFN under feed_forward (a dense
# layer's, or the router, the stacked experts and the shared expert); rope_freqs its llama3 RoPE.
GGUF = {
    "llama4": Arch("llama4_text", "Llama4ForCausalLM",
                   {k: v.replace("mlp.", "feed_forward.") for k, v in LLAMA_LAYER.items()}
                   | {"ffn_gate_inp": "feed_forward.router", "ffn_gate_shexp": "feed_forward.shared_expert.gate_proj",
                      "ffn_up_shexp": "feed_forward.shared_expert.up_proj",
                      "ffn_down_shexp": "feed_forward.shared_expert.down_proj"},
                   LLAMA_TOP | {"rope_freqs": "rope_parameters"},
                   keys=("interleave_moe_layer_step", "expert_feed_forward_length", "attention.sliding_window"),
                   experts={"ffn_gate_exps": "feed_forward.experts.gate_up_proj",
                            "ffn_up_exps": "feed_forward.experts.gate_up_proj",
                            "ffn_down_exps": "feed_forward.experts.down_proj"},
                   config=_gguf_config, plan=_gguf_plan),
}
