"""The Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma, OLMo 2): RMSNorm, RoPE, SwiGLU, GQA/MQA.

Its tensors: `ROWS` below, each checkpoint name (relative to LlamaModel) beside ours and how it is stored, read
both ways (loading and saving).
OLMo 2: no norm before attention or the FFN; post_attention_layernorm and post_feedforward_layernorm
normalise their outputs before they join the stream (attn_out_norm, ffn_out_norm), and q_norm / k_norm
the whole projections (qk_norm "all", weights (H·d_k,), (Hkv·d_k,)).
Llama, SmolLM3 (and Granite, Helium, which read Llama's config): mlp_bias gives gate_proj, up_proj and down_proj
biases (b_gate, b_in, b_out: ffn_bias); the other families' MLPs have none, and mlp_bias=true is refused there.
Gemma: its RMSNorm multiplies by (1 + weight), so γ = 1 + the stored weight (written back as γ − 1);
the embeddings are scaled by √d_model (scale_embedding); GeGLU (gelu_pytorch_tanh); a head_dim of its own.
torch's Linear stores W (out, in): we read its transpose, a view. `config` / `weights` read a
checkpoint by this table; `hf_config` / `tensors` write one, under LlamaForCausalLM's names
("model." + the names in ROWS; the head is "lm_head"), Mistral's and Qwen2's alike.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.positions import check_rope
from .common import (HF_ACTIVATIONS, activation, check_shapes, decoder_sizes, layer_types, layer_windows,
                     model_type_keys, need, reads_back, rope_parameters, special_ids, ROTARY_BUFFERS)
from .table import (LLAMA_LAYER, LLAMA_TOP, QK_NORMS, Arch, Gamma, Row, attention, both_ways, ffn_bias, gated_ffn,
                    lm_head, out_bias, qkv_bias)
from .table import About

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "olmo2", "smollm3")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("llama", "mistral", "qwen2", "qwen3"), models="Llama, SmolLM2, Mistral, Qwen2, Qwen3",
          brings="RMSNorm, RoPE (linear / llama3 / YaRN / dynamic-NTK scaling; YaRN and dynamic NTK in every RoPE "
                 "family), SwiGLU, GQA/MQA, sliding window (Mistral; Qwen2/3's sliding layers from "
                 "`max_window_layers` on, or as `layer_types` says), q/k/v biases (Qwen2), RMSNorm of each head's q "
                 "and k before RoPE (Qwen3), biases on the SwiGLU's gate, up and down (Llama's `mlp_bias`)",
          kind="decoder"),
    About(types=("gemma",), models="Gemma (v1)",
          brings="the same boxes with RMSNorm·(1 + w), embeddings scaled by √d_model, GeGLU, a head size of its own",
          kind="decoder"),
    About(types=("olmo2",), models="OLMo 2",
          brings="RMSNorm after attention and after the FFN (none before), q and k RMSNorm over the whole projection",
          kind="decoder", refuses=("dla",)),
    About(types=("smollm3",), models="SmolLM3",
          brings="the Llama boxes with layers that have no RoPE (`no_rope_layers`), sliding layers (`layer_types`)",
          kind="decoder"),
)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "olmo2": "Olmo2ForCausalLM",
                 "smollm3": "SmolLM3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}

GEMMA = {"gemma", "gemma2", "gemma3_text"}   # √d_model-scaled embeddings, tied by default
PLUS_ONE = GEMMA                     # RMSNorm(x)·(1 + w): γ is stored less one
SANDWICH = {"gemma2", "gemma3_text"}  # a norm before and after attention and the FFN
QK_NORM = {"qwen3": "head", "olmo2": "all", "gemma3_text": "head"}
LAYER_KINDS = {"qwen2", "qwen3", "smollm3", "gemma2", "gemma3_text"}   # layer_types: full or sliding layers
MLP_BIAS = {"llama", "smollm3"}      # mlp_bias: biases on gate_proj, up_proj, down_proj (LlamaMLP's)

# Tensors a Llama / Mistral / Qwen2 checkpoint may hold that qkv never reads ({i}: a layer), relative
# to LlamaModel.
IGNORED = ROTARY_BUFFERS


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling, from the old keys or transformers 5's `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) != 1.0:   # either place
        raise QkvError("partial rotary embeddings are not supported; use a checkpoint with full RoPE")
    return float(theta), scaling


def _default_layer_types(hf: dict, family: str, L: int, window: int | None, rope_layers: list) -> list[str]:
    """Each layer's kind when config.json has no layer_types, as the family's config class fills them in."""
    if family in ("qwen2", "qwen3"):                     # the layers from max_window_layers on, with a window
        first = hf.get("max_window_layers", 28)
        if not (isinstance(first, int) and not isinstance(first, bool) and first >= 0):
            raise QkvError(f"config.json max_window_layers = {first!r:.40} is not a whole number; "
                           "restore the checkpoint's config.json")
        sliding = [window is not None and i >= first for i in range(L)]
    elif family == "smollm3":                            # the layers without RoPE, if use_sliding_window
        sliding = [bool(hf.get("use_sliding_window")) and window is not None and not rope_layers[i] for i in range(L)]
    elif family in ("gemma2", "gemma3_text"):            # Gemma 2: every other layer; Gemma 3: 5 of every 6
        pattern = 2 if family == "gemma2" else hf.get("sliding_window_pattern", 6)
        sliding = [bool((i + 1) % pattern) for i in range(L)]
    else:
        sliding = [False] * L
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def _rope_layers(hf: dict, L: int) -> list[int]:
    """SmolLM3's no_rope_layers: 1 where a layer turns q, k by RoPE, 0 where not (default: every 4th has none)."""
    interval = hf.get("no_rope_layer_interval", 4)
    flags = hf.get("no_rope_layers", [int((i + 1) % interval != 0) for i in range(L)])
    if not isinstance(flags, list) or len(flags) != L or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise QkvError(f"config.json no_rope_layers = {flags!r:.40} must be a 0 or 1 for each of the {L} layers; "
                       "restore the checkpoint's config.json")
    return flags


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    L = need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    check_rope(theta, scaling)           # a rope_type qkv lacks, θ ≤ 1, a factor of 1e-300: refused now, not at a pass
    rope_layers = _rope_layers(hf, L) if family == "smollm3" else [1] * L
    window, windows = None, None
    if family == "mistral":
        window = hf.get("sliding_window")
    elif family in LAYER_KINDS:                          # Qwen2/3: sliding_window counts only with use_sliding_window
        window = hf.get("sliding_window", 4096 if family in SANDWICH else None)
        window = None if family in ("qwen2", "qwen3") and not hf.get("use_sliding_window") else window
        window, windows = layer_windows(hf, window, L, _default_layer_types(hf, family, L, window, rope_layers))
    types = hf.get("layer_types")
    if family not in LAYER_KINDS and types is not None and (not isinstance(types, list)
                                                            or any(t != "full_attention" for t in types)):
        shown = sorted(set(map(str, types))) if isinstance(types, list) else repr(types)[:40]
        raise QkvError(f"layer_types {shown} is not every layer full_attention, which {family} has; "
                       "restore the checkpoint's config.json")
    if family in GEMMA and hf.get("use_bidirectional_attention"):
        raise QkvError(f"{family} with use_bidirectional_attention=true is not supported; use a causal checkpoint")
    if hf.get("mlp_bias") and family not in MLP_BIAS:
        raise QkvError(f"{family} with mlp_bias=true is not supported ({family}'s MLP has no biases); "
                       "use a checkpoint without FFN biases")
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L,
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H,
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 2048),
        layer_windows=windows, no_rope_layers=tuple(i for i, f in enumerate(rope_layers) if not f),
        causal=True, norm="rms", norm_place="pre", norm_eps=hf.get("rms_norm_eps", 1e-6),
        position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=activation(hf.get("hidden_act") or hf.get("hidden_activation") or "silu"), gated_ffn=True,
        scale_embedding=family in GEMMA,
        qkv_bias=attention_bias or family == "qwen2", out_bias=attention_bias, ffn_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=QK_NORM.get(family),
        tied_embeddings=bool(hf.get("tie_word_embeddings", family in GEMMA or family == "smollm3")), final_norm=True,
        lm_head=True,
        sliding_window=window, pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,          # nn.Embedding's padding_idx
    )


GAMMA = Gamma(lambda cfg: cfg.family in PLUS_ONE)      # every RMSNorm's γ (Gemma: stored less one)


def _plain(cfg: ModelConfig) -> bool:                  # a norm before each box, none after
    return cfg.family not in SANDWICH and cfg.family != "olmo2"


def _before(cfg: ModelConfig) -> bool:                 # a norm before attention (all but OLMo 2)
    return cfg.family != "olmo2"


def _sandwich(cfg: ModelConfig) -> bool:               # Gemma 2/3: norms before and after each box
    return cfg.family in SANDWICH


def _after(cfg: ModelConfig) -> bool:                  # norms after each box (Gemma 2/3, OLMo 2)
    return cfg.family in SANDWICH or cfg.family == "olmo2"


def _per_head(cfg: ModelConfig) -> bool:               # q/k norms over each head's d_k (Qwen3, Gemma 3)
    return cfg.qk_norm == "head"


def _whole(cfg: ModelConfig) -> bool:                  # q/k norms over the whole projection (OLMo 2)
    return cfg.qk_norm == "all"


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    Row("block.attn_norm", "layers.{i}.input_layernorm.weight", "d", GAMMA, _before),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_norm.weight", "dk", GAMMA, _per_head),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_norm.weight", "dk", GAMMA, _per_head),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_norm.weight", "q", GAMMA, _whole),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_norm.weight", "kv", GAMMA, _whole),
    Row("block.ffn_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA, _plain),
    Row("block.attn_out_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA, _after),
    Row("block.ffn_norm", "layers.{i}.pre_feedforward_layernorm.weight", "d", GAMMA, _sandwich),
    Row("block.ffn_out_norm", "layers.{i}.post_feedforward_layernorm.weight", "d", GAMMA, _after),
    *gated_ffn("layers.{i}.mlp"),
    *[Row(f"block.ffn.{b}", f"layers.{{i}}.mlp.{proj}.bias", size, when=ffn_bias)      # mlp_bias
      for b, proj, size in (("b_gate", "gate_proj", "f"), ("b_in", "up_proj", "f"), ("b_out", "down_proj", "d"))],
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Llama / Mistral / Qwen2 / … ForCausalLM model with these knobs (`hf_dict`), once it
    reads back as CFG."""
    return reads_back(cfg, hf_dict(cfg), config)


def hf_dict(cfg: ModelConfig) -> dict:
    """The config.json of a Llama / Mistral / Qwen2 ForCausalLM model with these knobs.

    Biases: Llama has one switch for all four projections (attention_bias), Mistral none, Qwen2
    always q/k/v and never o_proj. RoPE: rope_theta and rope_scaling as transformers 4 writes them,
    and rope_parameters as transformers 5 does.
    """
    family = cfg.family
    hf = {
        **model_type_keys(cfg, ARCHITECTURES),
        **decoder_sizes(cfg),
        "rms_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "rope_theta": cfg.rope_theta, "rope_parameters": rope_parameters(cfg),
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        **special_ids(cfg),
    }
    if cfg.rope_scaling is not None:
        hf["rope_scaling"] = dict(cfg.rope_scaling)
    if family != "qwen2":
        hf |= {"attention_bias": cfg.out_bias}
    if family in MLP_BIAS:
        hf["mlp_bias"] = cfg.ffn_bias
    if family == "mistral":
        hf["sliding_window"] = cfg.sliding_window
    elif family in LAYER_KINDS:
        windowed = any(cfg.window(i) is not None for i in range(cfg.n_layers))
        hf |= {"layer_types": layer_types(cfg), "sliding_window": cfg.sliding_window if windowed else None}
        if family != "gemma2" and family != "gemma3_text":
            hf |= {"use_sliding_window": windowed, "max_window_layers": cfg.n_layers}
    if family == "smollm3":
        hf["no_rope_layers"] = [int(i not in cfg.no_rope_layers) for i in range(cfg.n_layers)]
    return hf


def _no_window(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Qwen2's and Qwen3's config.json of a llama.cpp file: no sliding window (llama.cpp's has none)."""
    return hf | {"use_sliding_window": False, "sliding_window": None}


# llama.cpp's architectures (gguf_archs reads them by this table; its olmo2, OLMo 2 and OLMo 3: olmo3.py's).
GGUF = {
    "llama": Arch("llama", "LlamaForCausalLM", LLAMA_LAYER, LLAMA_TOP | {"rope_freqs": "rope_parameters"},
                  biases="optional", permuted=True,
                  keys=("tensor_data_layout",)),
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", LLAMA_LAYER, LLAMA_TOP, biases="qkv", config=_no_window),
    "qwen3": Arch("qwen3", "Qwen3ForCausalLM", LLAMA_LAYER | QK_NORMS, LLAMA_TOP, biases="optional",
                  config=_no_window),
    "gemma": Arch("gemma", "GemmaForCausalLM", LLAMA_LAYER, LLAMA_TOP, plus_one=True, activation="gelu_pytorch_tanh"),
}
