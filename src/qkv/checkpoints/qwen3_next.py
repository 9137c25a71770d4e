"""Qwen3-Next (Qwen; transformers' Qwen3NextForCausalLM): a hybrid of linear attention (the gated delta rule, three
layers of every four by default) and gated softmax attention, every FFN a mixture of experts with a σ-gated shared
expert (core/delta.py runs the linear layers and shows each as the attention it implies).

    config.json knob              qkv knob                      what it does
    layer_types                   delta.layers                  "linear_attention" layers run the gated delta
      (else full_attention_interval 4: every 4th layer full)    rule; "full_attention" ones attend
    linear_num_key_heads (16),    delta.n_k_heads, n_v_heads    Hk key heads, each serving Hv/Hk value heads
      linear_num_value_heads (32)
    linear_key_head_dim (128),    delta.d_k, d_v                their sizes
      linear_value_head_dim (128)
    linear_conv_kernel_dim (4)    delta.conv_kernel             the causal depthwise conv's taps over [q | k | v]
    hidden_act ("silu")           activation                    the FFNs' and the conv's (the gates are SiLU, σ)
    (always)                      attn_output_gate              q_proj twice as wide: each head's Z ⊙ σ(gate)
    (always)                      qk_norm "head"                RMSNorm of each head's q and k before RoPE
    partial_rotary_factor (0.25)  rotary_dim                    RoPE turns the first int(d_k·factor) of each head
    (always)                      Gamma plus one                every RMSNorm (but the delta rule's gated one)
                                                                multiplies by 1 + w: γ is stored less one
    attention_bias (false)        qkv_bias, out_bias            biases of q/k/v_proj (the gate's too) and o_proj
    num_experts (512), num_experts_per_tok (10), moe_intermediate_size (512), norm_topk_prob (true),
    shared_expert_intermediate_size (512), decoder_sparse_step (1), mlp_only_layers ([]): Qwen2-MoE's router,
    experts, σ-gated shared expert and dense layers (intermediate_size wide); num_experts 0: every FFN dense.
    rms_norm_eps, rope_parameters (rope_theta, scalings), head_dim (256), num_key_value_heads (2),
    max_position_embeddings, tie_word_embeddings, pad/bos/eos ids: as Llama's (Qwen3NextConfig's defaults when
    absent). Training's knobs: attention_dropout, router_aux_loss_coef, output_router_logits (qkv does not train
    this family), initializer_range (qkv.init's σ).

Its tensors, relative to Qwen3NextModel ("model."; the head "lm_head"): ROWS below for the embeddings, the norms,
the full-attention layers and the FFNs; each linear layer's under layers.{i}.linear_attn (`read_delta`):
in_proj_qkvz (rows by key head: its q, k, then its value heads' v, then their z), in_proj_ba (by key head: its
value heads' b, then their a), conv1d (C, 1, k), A_log, dt_bias, norm (the gated RMSNorm's γ), out_proj.

llama.cpp's `qwen3next` files (GGUF, `GGUF` below): every RMSNorm but the gated one written as 1 + w (read back as w),
A_log as A = −exp(A_log) (ssm_a), dt_bias as ssm_dt.bias, the conv squeezed to (C, k); in_proj_qkvz either as stored
(ssm_in: gguf 0.19's name) or, as the converter now writes it, split into attn_qkv [Q; K; V] and attn_gate Z, each whole
(joined back by key head, `_gguf_plan`); the delta rule's sizes as ssm.* keys (group_count the key heads,
time_step_rank the value heads, state_size d_k, inner_size the value heads' width), every full_attention_interval-th
layer full. What llama.cpp runs is written into the config: every FFN routed, top-k renormalised, no biases.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.delta import DeltaBlockWeights, DeltaWeights, GatedDelta
from ..core.positions import check_rope
from ..core.weights import NormWeights, Weights
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, ROTARY_BUFFERS, activation, c_arrays, check_shapes, decoder_sizes,
                     longrope_scaling, model_type_keys, need, partial_rope, reads_back, rope_parameters, special_ids)
from .moe import Routed, _dense_layers
from .table import (LINEAR, LLAMA_TOP, QK_NORMS, About, Arch, Gamma, How, Row, dense_layer, gated_ffn, lm_head,
                    read_table, routed_layer, write_table)

MODEL_TYPES = ("qwen3_next",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("qwen3_next",), models="Qwen3-Next (Qwen3-Next-80B-A3B)",
          brings="linear attention by the gated delta rule (a state matrix per head, Sₜ = exp(gₜ)·(I − βₜkₜkₜᵀ)·Sₜ₋₁ + "
                 "βₜkₜvₜᵀ, after a causal conv, read by the L2-normalised q, a gated RMSNorm) in three layers of four,"
                 " each shown as the attention it implies (exact: oₜ = Σₛ A[t, s]·vₛ); softmax layers with an output "
                 "gate σ(x·W_G) per head, partial RoPE, q/k norms; RMSNorm·(1 + w); Qwen2-MoE's experts; the cache "
                 "its conv and delta states beside the full layers' K, V",
          kind="MoE decoder", refuses=("attribute", "dla", "gradients")),
)

ARCHITECTURES = {"qwen3_next": "Qwen3NextForCausalLM"}

IGNORED = ROTARY_BUFFERS | {"mtp.*": "the multi-token-prediction module (transformers does not read it either)"}

DEFAULTS = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
            "num_attention_heads": 16, "num_key_value_heads": 2, "hidden_act": "silu",
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "attention_bias": False, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "decoder_sparse_step": 1, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
            "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True}   # Qwen3NextConfig's own
FACTOR = 0.25                          # its partial_rotary_factor when config.json gives none
LINEAR_LAYER, FULL_LAYER = "linear_attention", "full_attention"


def _layer_types(hf: dict, L: int) -> list[str]:
    """Each layer's kind: layer_types, else full every full_attention_interval-th layer (Qwen3NextConfig's rule)."""
    interval = hf.get("full_attention_interval", 4)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
        raise QkvError(f"config.json full_attention_interval = {interval!r:.30} is not a positive integer; restore "
                       "the checkpoint's config.json")
    types = hf.get("layer_types") or [LINEAR_LAYER if (i + 1) % interval else FULL_LAYER for i in range(L)]
    if not isinstance(types, list) or len(types) != L or any(t not in (LINEAR_LAYER, FULL_LAYER) for t in types):
        shown = sorted(set(map(str, types))) if isinstance(types, list) else repr(types)[:40]
        raise QkvError(f"config.json layer_types {shown} must give each of the {L} layers linear_attention or "
                       "full_attention; restore the checkpoint's config.json")
    return types


def _size(hf: dict, key: str) -> int:
    value = hf[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise QkvError(f"config.json {key} = {value!r:.30} is not a positive integer; restore the checkpoint's "
                       "config.json")
    return value


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    d_k = hf["head_dim"]
    check_shapes(hf, d, H)
    theta, scaling, rotary = partial_rope({k: v for k, v in hf.items() if k not in ("rotary_pct", "rotary_emb_base")},
                                          d_k, default_factor=FACTOR)
    scaling = longrope_scaling(hf, scaling, rotary or d_k)
    check_rope(theta, scaling)
    types = _layer_types(hf, L)
    linear = tuple(i for i, t in enumerate(types) if t == LINEAR_LAYER)
    delta = GatedDelta(layers=linear, n_k_heads=_size(hf, "linear_num_key_heads"),
                       n_v_heads=_size(hf, "linear_num_value_heads"), d_k=_size(hf, "linear_key_head_dim"),
                       d_v=_size(hf, "linear_value_head_dim"), conv_kernel=_size(hf, "linear_conv_kernel_dim"))
    E = hf["num_experts"]
    if isinstance(E, bool) or not isinstance(E, int) or E < 0:
        raise QkvError(f"config.json num_experts = {E!r:.30} is not a whole number; restore the checkpoint's "
                       "config.json")
    k = need(hf, "num_experts_per_tok") if E else 0
    shared = hf["shared_expert_intermediate_size"]
    if E and not (isinstance(k, int) and 1 <= k <= E and isinstance(shared, int) and shared > 0):
        raise QkvError(f"config.json num_experts_per_tok {k} must be 1 to num_experts {E}, and "
                       f"shared_expert_intermediate_size {shared} positive; restore the checkpoint's config.json")
    d_ff, d_expert = need(hf, "intermediate_size"), hf["moe_intermediate_size"] if E else None
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        family="qwen3_next", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf["num_key_value_heads"] or H, d_head=d_k, d_ff=d_ff, max_positions=hf["max_position_embeddings"],
        causal=True, norm="rms", norm_place="pre", norm_eps=hf["rms_norm_eps"], position="rope", rope_theta=theta,
        rope_scaling=scaling, rotary_dim=rotary, activation=activation(hf["hidden_act"] or "silu"), gated_ffn=True,
        qkv_bias=bias, out_bias=bias, ffn_bias=False, qk_norm="head", tied_embeddings=bool(hf["tie_word_embeddings"]),
        final_norm=True, lm_head=True, pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
        n_experts=E, experts_per_token=k, norm_top_k=bool(hf["norm_topk_prob"]),
        d_expert=None if d_expert in (None, d_ff) else d_expert, d_shared_expert=shared if E else 0,
        dense_layers=_dense_layers(hf, L, E), delta=delta if linear else None, attn_output_gate=True)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Qwen3NextForCausalLM with these knobs (transformers 5's rope_parameters)."""
    m = cfg.delta or GatedDelta((), DEFAULTS["linear_num_key_heads"], DEFAULTS["linear_num_value_heads"],
                                DEFAULTS["linear_key_head_dim"], DEFAULTS["linear_value_head_dim"],
                                DEFAULTS["linear_conv_kernel_dim"])
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    return reads_back(cfg, {
        **model_type_keys(cfg, ARCHITECTURES), **decoder_sizes(cfg), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "attention_bias": cfg.qkv_bias,
        "rope_parameters": rope_parameters(cfg, partial_rotary_factor=factor),
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        "layer_types": [LINEAR_LAYER if i in m.layers else FULL_LAYER for i in range(cfg.n_layers)],
        "linear_num_key_heads": m.n_k_heads, "linear_num_value_heads": m.n_v_heads,
        "linear_key_head_dim": m.d_k, "linear_value_head_dim": m.d_v, "linear_conv_kernel_dim": m.conv_kernel,
        "num_experts": cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token or 1,
        "moe_intermediate_size": cfg.d_expert or cfg.d_ff, "norm_topk_prob": cfg.norm_top_k,
        "shared_expert_intermediate_size": cfg.d_shared_expert or DEFAULTS["shared_expert_intermediate_size"],
        "mlp_only_layers": list(cfg.dense_layers), "decoder_sparse_step": 1, "output_router_logits": False,
        **special_ids(cfg),
    }, config)


# ── the tensors ──────────────────────────────────────────────────────────────────

class QueryAndGate(How):
    """q_proj of a gated attention: per head its d_k query rows, then its d_k gate rows (torch's Linear, (2q, d);
    its bias (2q,) alike). Ours [W_Q | W_G] (d, 2q), each part copied out (a view cannot regroup the rows)."""

    def read(self, store, name, shape, dtype, cfg):
        value = store.get(name, shape[::-1], dtype)
        value = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=dtype)
        return value.T                                                        # (d, 2q) or (2q,)

    def split(self, value, bounds, cfg):
        lead, H, dk = value.shape[:-1], cfg.n_heads, cfg.d_head
        per = value.reshape(*lead, H, 2, dk)                                  # (…, H, [query, gate], d_k)
        return [np.ascontiguousarray(per[..., j, :].reshape(*lead, H * dk)) for j in (0, 1)]

    def write(self, value, cfg):                                              # [W_Q | W_G] (d, 2q) or (2q,)
        lead, H, dk = value.shape[:-1], cfg.n_heads, cfg.d_head
        rows = value.reshape(*lead, 2, H, dk).swapaxes(-3, -2).reshape(*lead, 2 * H * dk)
        return rows.T


QUERY_AND_GATE, PLUS_ONE = QueryAndGate(), Gamma(lambda cfg: True)


def full(cfg: ModelConfig, i: int) -> bool:                 # layer i attends with softmax (not the delta rule)
    return cfg.delta is None or i not in cfg.delta.layers


def _bias(cfg: ModelConfig) -> bool:
    return cfg.qkv_bias


# The table, read both ways: `weights` reads a checkpoint by it (and each linear layer by `read_delta`), `tensors`
# writes one. Every norm is RMSNorm·(1 + w) (Gamma plus one); the attention's rows are the full layers'.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    Row("block.attn_norm", "layers.{i}.input_layernorm.weight", "d", PLUS_ONE),
    Row(("block.attn.W_Q", "block.attn.W_G"), "layers.{i}.self_attn.q_proj.weight", "d q+q", QUERY_AND_GATE,
        parts="q q", layers=full),
    Row(("block.attn.b_Q", "block.attn.b_G"), "layers.{i}.self_attn.q_proj.bias", "q+q", QUERY_AND_GATE, _bias,
        parts="q q", layers=full),
    Row("block.attn.W_K", "layers.{i}.self_attn.k_proj.weight", "d kv", LINEAR, layers=full),
    Row("block.attn.b_K", "layers.{i}.self_attn.k_proj.bias", "kv", when=_bias, layers=full),
    Row("block.attn.W_V", "layers.{i}.self_attn.v_proj.weight", "d kv", LINEAR, layers=full),
    Row("block.attn.b_V", "layers.{i}.self_attn.v_proj.bias", "kv", when=_bias, layers=full),
    Row("block.attn.W_O", "layers.{i}.self_attn.o_proj.weight", "q d", LINEAR, layers=full),
    Row("block.attn.b_O", "layers.{i}.self_attn.o_proj.bias", "d", when=_bias, layers=full),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_norm.weight", "dk", PLUS_ONE, layers=full),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_norm.weight", "dk", PLUS_ONE, layers=full),
    Row("block.ffn_norm", "layers.{i}.post_attention_layernorm.weight", "d", PLUS_ONE),
    Row("block.ffn", "layers.{i}", "d", Routed(), layers=routed_layer),
    *gated_ffn("layers.{i}.mlp", layers=dense_layer),
    Row("final_norm", "norm.weight", "d", PLUS_ONE),
    lm_head(),
]


def _dense(value, dtype) -> np.ndarray:
    """A tensor as an array: a 16-bit matrix a store holds as its bytes (qkv.load(..., dtype="bfloat16")) is
    widened, as the delta rule's elementwise products need."""
    return value if isinstance(value, np.ndarray) else np.asarray(value, dtype=dtype)


def read_delta(store, cfg: ModelConfig, i: int, dtype) -> DeltaWeights:
    """Layer I's gated delta layer (layers.{i}.linear_attn), its fused projections split into core/delta.py's
    letters."""
    m, d = cfg.delta, cfg.d_model
    Hk, Hv, dk, dv, r = m.n_k_heads, m.n_v_heads, m.d_k, m.d_v, m.n_v_heads // m.n_k_heads
    p = f"layers.{i}.linear_attn."

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return _dense(store.get(p + name, shape, dtype), dtype)

    def cols(rows: np.ndarray) -> np.ndarray:                  # (…, out, d) rows of a Linear → (d, out), C order
        return np.ascontiguousarray(rows.reshape(-1, d).T)

    qkvz = get("in_proj_qkvz.weight", (2 * Hk * dk + 2 * Hv * dv, d)).reshape(Hk, 2 * dk + 2 * r * dv, d)
    ba = get("in_proj_ba.weight", (2 * Hv, d)).reshape(Hk, 2 * r, d)                 # by key head: [b | a]
    v0, z0 = 2 * dk, 2 * dk + r * dv
    return DeltaWeights(
        W_q=cols(qkvz[:, :dk]), W_k=cols(qkvz[:, dk:v0]), W_v=cols(qkvz[:, v0:z0]), W_z=cols(qkvz[:, z0:]),
        W_b=cols(ba[:, :r]), W_a=cols(ba[:, r:]),
        conv=np.ascontiguousarray(get("conv1d.weight", (m.channels, 1, m.conv_kernel))[:, 0]),
        A_log=get("A_log", (Hv,)), b_dt=get("dt_bias", (Hv,)), norm=NormWeights(get("norm.weight", (dv,))),
        W_out=np.ascontiguousarray(get("out_proj.weight", (d, Hv * dv)).T))


def delta_tensors(w: DeltaWeights, cfg: ModelConfig, i: int) -> dict[str, np.ndarray]:
    """Layer I's linear_attn tensors under transformers' full names, as its file stores them (`read_delta` back)."""
    m, d = cfg.delta, cfg.d_model
    Hk, r, dk, dv = m.n_k_heads, m.n_v_heads // m.n_k_heads, m.d_k, m.d_v
    p = f"model.layers.{i}.linear_attn."

    def grouped(W: np.ndarray, size: int) -> np.ndarray:      # (d, Hk·size) → rows (Hk, size, d)
        return W.T.reshape(Hk, size, d)

    qkvz = np.concatenate([grouped(w.W_q, dk), grouped(w.W_k, dk), grouped(w.W_v, r * dv), grouped(w.W_z, r * dv)],
                          axis=1).reshape(-1, d)
    ba = np.concatenate([grouped(w.W_b, r), grouped(w.W_a, r)], axis=1).reshape(-1, d)
    return {p + "in_proj_qkvz.weight": qkvz, p + "in_proj_ba.weight": ba, p + "conv1d.weight": w.conv[:, None, :],
            p + "A_log": w.A_log, p + "dt_bias": w.b_dt, p + "norm.weight": w.norm.weight,
            p + "out_proj.weight": w.W_out.T}


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a Qwen3NextForCausalLM checkpoint: ROWS, and each linear layer's block a DeltaBlockWeights
    holding its gated delta layer in attention's place."""
    w = read_table(ROWS, store, cfg, dtype)
    for i in (cfg.delta.layers if cfg.delta is not None else ()):
        b = w.blocks[i]
        w.blocks[i] = DeltaBlockWeights(**{f: getattr(b, f) for f in b.__dataclass_fields__},
                                        delta=read_delta(store, cfg, i, dtype))
    return w


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under transformers' full names, as its file stores it; new arrays."""
    t = write_table(ROWS, weights, cfg, "model.")
    for i, b in enumerate(weights.blocks):
        if isinstance(b, DeltaBlockWeights):
            t |= c_arrays(delta_tensors(b.delta, cfg, i))
    return t


# ── llama.cpp's `qwen3next` (GGUF) ────────────────────────────────────────────────────────────────────────────────

def _gguf_whole(meta: dict, key: str) -> int:
    """The GGUF number KEY, a positive whole number, else one error."""
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise QkvError(f"the GGUF value {key} = {value!r:.30} is missing or not a positive whole number; the file is "
                       "damaged")
    return value


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Qwen3-Next's config.json of a llama.cpp file, as llama.cpp runs it (every FFN routed with the σ-gated shared
    expert, the shared expert feed_forward_length wide when the file gives no width of its own, top-k renormalised),
    the layers' kinds (every full_attention_interval-th full, llama.cpp's rule) and the delta rule's shapes (dims'
    kinds, part_shapes). Refused: the experts' width or the key heads missing, value heads that are no whole multiple
    of the key heads, an inner size that is no whole number of value heads."""
    d, H, dk, L = dims["d"], dims["H"], dims["d_head"], dims["L"]
    _gguf_whole(meta, f"{a}.expert_feed_forward_length")       # required: llama.cpp's default when absent (its FFN
    #                                                             width / k) is no Qwen3-Next's
    Hk, Hv, dqk = _gguf_whole(meta, f"{a}.ssm.group_count"), dims["dt_rank"], dims["d_state"]
    interval = _gguf_whole(meta, f"{a}.full_attention_interval") if f"{a}.full_attention_interval" in meta else 4
    if Hv % Hk or dims["d_inner"] % Hv:
        raise QkvError(f"the GGUF qwen3next model has {Hv} value heads (ssm.time_step_rank) for {Hk} key heads "
                       f"(ssm.group_count) and {dims['d_inner']} value channels (ssm.inner_size); it needs a whole "
                       "number of value heads per key head and of channels per value head; the file is damaged")
    dv, k = dims["d_inner"] // Hv, dims["d_conv"]
    if not dims["f_shared"]:
        dims["f_shared"] = dims["f"]                                 # llama.cpp: n_ff_shexp, else n_ff
    C, V = 2 * Hk * dqk + Hv * dv, Hv * dv                           # the conv's channels, the values' width
    types = [LINEAR_LAYER if (i + 1) % interval else FULL_LAYER for i in range(L)]
    dims["kinds"] = tuple("delta" if t == LINEAR_LAYER else "attention" for t in types)
    dims["key_heads"] = Hk
    dims["part_shapes"] = {"attn_q": (2 * H * dk, d), "ssm_in": (C + V, d), "attn_qkv": (C, d), "attn_gate": (V, d),
                           "ssm_ba": (2 * Hv, d), "ssm_conv1d": (C, k), "ssm_dt": {"bias": (Hv,)}, "ssm_a": {"": (Hv,)},
                           "ssm_norm": (dv,), "ssm_out": (d, V)}
    return hf | {"head_dim": dk, "layer_types": types, "linear_num_key_heads": Hk, "linear_num_value_heads": Hv,
                 "linear_key_head_dim": dqk, "linear_value_head_dim": dv, "linear_conv_kernel_dim": k,
                 "num_experts": dims["E"], "num_experts_per_tok": dims["k"], "moe_intermediate_size": dims["f_expert"],
                 "shared_expert_intermediate_size": dims["f_shared"], "norm_topk_prob": True, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "attention_bias": False}


def _gguf_layout(hf: dict, dims: dict, chosen: dict) -> None:
    """Which of the two layouts of in_proj_qkvz the file holds (by its tensors): attn_qkv and attn_gate (the current
    converter's) or ssm_in (gguf 0.19's); the other's parts are absent from every layer."""
    newer = bool(chosen["fused"])
    dims["part_shapes"] |= {"ssm_in": None} if newer else {"attn_qkv": None, "attn_gate": None}


def _gguf_plan(part: str, name: str, prefix: str, shape: tuple, dims: dict) -> list | None:
    """The delta rule's tensors llama.cpp's converter changed beyond Mamba's (gguf_archs' common plans: A = −exp(A_log),
    the conv squeezed): dt_bias as ssm_dt.bias; the gated norm's γ as it is (every other norm 1 + w); in_proj_qkvz
    (rows by key head: q, k, its value heads' v, their z) from attn_qkv [Q; K; V] and attn_gate Z, each whole — the
    plan of attn_qkv, reading attn_gate too; attn_gate's is none."""
    p = f"{prefix}linear_attn."
    if part == "ssm_dt":
        return [(p + "dt_bias", shape, lambda w: w)]
    if part == "ssm_norm":
        return [(p + "norm.weight", shape, lambda w: w)]
    if part == "attn_gate":
        return []
    if part != "attn_qkv":
        return None
    z_of = dims["values"][name.replace(".attn_qkv.", ".attn_gate.")]
    Hk, dk = dims["key_heads"], dims["d_state"]

    def by_key_head(qkv: np.ndarray) -> np.ndarray:                 # (C, d), (Hv·dv, d) → (C + Hv·dv, d)
        q, k, v = np.split(qkv, [Hk * dk, 2 * Hk * dk])
        parts = [x.reshape(Hk, -1, x.shape[-1]) for x in (q, k, v, z_of())]     # (Hk, rows of each, d)
        return np.ascontiguousarray(np.concatenate(parts, axis=1).reshape(-1, qkv.shape[-1]))
    return [(p + "in_proj_qkvz.weight", (shape[0] + dims["d_inner"], shape[1]), by_key_head)]


# llama.cpp's architecture (gguf_archs reads it by this table): the full layers' attention (q_proj twice as wide: each
# head's query, then its gate), the delta layers' mixer as ssm_* (or attn_qkv and attn_gate), Qwen2-MoE's experts.
GGUF = {
    "qwen3next": Arch("qwen3_next", "Qwen3NextForCausalLM",
                      {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                       "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", **QK_NORMS,
                       "ssm_in": "linear_attn.in_proj_qkvz", "attn_qkv": "linear_attn.in_proj_qkvz",
                       "attn_gate": "linear_attn.in_proj_qkvz", "ssm_ba": "linear_attn.in_proj_ba",
                       "ssm_conv1d": "linear_attn.conv1d", "ssm_dt": "linear_attn.dt_bias",
                       "ssm_a": "linear_attn.A_log", "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj",
                       "post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate",
                       "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
                       "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate"},
                      LLAMA_TOP, plus_one=True, partial_rope=True,
                      keys=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                            "ssm.group_count", "full_attention_interval", "expert_feed_forward_length",
                            "expert_shared_feed_forward_length"),
                      experts={"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
                               "ffn_down_exps": "mlp.experts.{e}.down_proj"},
                      config=_gguf_config, by_tensors=_gguf_layout, plan=_gguf_plan),
}
