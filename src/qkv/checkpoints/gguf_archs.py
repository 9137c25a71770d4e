"""llama.cpp's architectures read: GGUF metadata → config.json, GGUF tensors → the Hugging Face tensors the
family module reads, with the few changes llama.cpp's converter (convert_hf_to_gguf.py) made undone. Each
architecture's table (table.Arch: its tensor names by GGUF part, its metadata keys, which of the changes below
it has) lives in its family's module (GGUF = {…} in llama.py, gpt2.py, moe.py, …; families.py gathers them);
here is the machinery they share.

    GGUF arch    family    what the converter changed, undone here
    llama        llama     Q, K rows of each head interleaved (LlamaModel.permute) for its RoPE
    qwen2        qwen2     nothing (rows as Hugging Face's: llama.cpp's NEOX RoPE is rotate-half)
    qwen3        qwen3     nothing; q/k norms per head (attn_q_norm, attn_k_norm: (d_k,))
    gemma        gemma     every RMSNorm weight stored as 1 + w (written back as w); no lm_head (tied)
    gemma2       gemma2    as gemma (norms 1 + w, tied), four norms a block; soft-caps and the window in the
                           metadata, every other layer sliding (llama.cpp's pattern); Q·Kᵀ scaled by 1/√d_k
                           (1/√(d_model / heads) with 46 layers, llama.cpp's 27B): query_pre_attn_scalar
    gemma3       gemma3_text  as gemma2 (norms 1 + w, q/k norms' too), the head written when untied; the layers' kinds
                           with attention.sliding_window (> 0; none: every layer full) from
                           attention.sliding_window_pattern (period 6 without it), the sliding layers' base
                           rope.freq_base_swa (10000 without it), plain, the full ones' rope.freq_base with linear
                           scaling; Q·Kᵀ by 1/√d_k (62 layers: 1/√(d_model / heads)); final_logit_softcapping if written
    olmo2        olmo2     nothing; q/k norms over the whole projection, norms after each box; with
                 / olmo3   attention.sliding_window, OLMo 3 (llama.cpp writes it as olmo2): the layers' kinds
                           (sliding_window_pattern), the sliding layers' base (rope.freq_base_swa), the full layers'
                           scaling (YaRN's attn_factor · (1 + 0.1·ln s): attention_factor), read by olmo3.py
    phi2         phi       nothing (attn_q/k/v); files of the original Phi-2 layout hold one attn_qkv,
                           rows [Q; K; V], split here
    gptneox      gpt_neox  query_key_value's rows by head (q, k, v of head 0, …) regrouped [Q; K; V]:
                           put back by head
    gpt2         gpt2      Conv1D weights (in, out) transposed to (out, in): transposed back
    granite      granite   as llama (Q, K rows interleaved per head); its four multipliers in the metadata
    arcee        arcee     as llama (Q, K rows interleaved per head); no ffn_gate (ReLU² FFN), no biases
    ernie4_5     ernie4_5  nothing (RoPE on interleaved pairs in both); no biases (use_bias false)
    hunyuan-dense hunyuan_v1_dense  nothing; q/k norms per head after RoPE (attn_q_norm, attn_k_norm: (d_k,)); an
                           NTK alpha is in rope.freq_base already (the converter's); no biases
    seed_oss     seed_oss  nothing (rotate-half RoPE in both); post_attention_layernorm is post_attention_norm; q/k/v
                           biases, never o_proj's or the FFN's (llama.cpp's loader reads none)
    phi3         phi3      nothing (qkv_proj, gate_up_proj stay fused: attn_qkv [Q; K; V], ffn_up [gate; up]);
                           attention.sliding_window read and dropped, as llama.cpp does (its Phi-3 SWA is
                           disabled: every earlier token is attended to); LongRoPE (rope_factors_long/short,
                           rope.scaling.attn_factor) refused
    command-r    cohere    nothing (interleaved RoPE in both); q/k LayerNorms per head as one (H, d_k) tensor,
                           as Hugging Face's; no output tensor (always tied), no biases, logit_scale (logits × s)
    stablelm     stablelm  each head's q/k LayerNorm weights stacked into one (H, d_k) attn_q_norm /
                           attn_k_norm: split into norms.{h}; no ffn_norm in a parallel block
    starcoder2   starcoder2 nothing (mlp.c_fc / c_proj are ffn_up / ffn_down); no sliding window in the file:
                           llama.cpp attends to every earlier token, and so does the config written here
    bloom        bloom     query_key_value's rows by head regrouped [Q; K; V] (as GPT-NeoX): put back by head;
                           `output` always written (a copy of token_embd when tied): read untied, the same
                           numbers; ALiBi's maximum bias 8 (llama.cpp's, BLOOM's: no key); the embeddings'
                           LayerNorm is token_embd_norm; context_length is BLOOM's seq_length, else d_model
    falcon       falcon    query_key_value's rows by K/V group (each group's q heads, its k, its v) regrouped
                           [Q; K; V]: put back by group; ln_mlp / ln_attn (two norms, Falcon-40B's new
                           decoder) are attn_norm / attn_norm_2 (sic); one norm: input_layernorm; always parallel,
                           GELU, no biases, RoPE base 10000 (llama.cpp's falcon: no freq_base written)
    mpt          mpt       nothing (Wqkv's rows are [Q; K; V] in both); ALiBi with max_alibi_bias, which must
                           be 8 (Hugging Face's MPT has no other); LayerNorms without biases, no grouped K/V
    llama with   mixtral   Llama's Q/K permutation; each layer's experts stacked into ffn_gate/up/down_exps
    experts                (E, …): split back into block_sparse_moe.experts.{e}.w1 / w3 / w2; the router is
                           ffn_gate_inp (E, d); top-k weights renormalised (llama.cpp does, as Mixtral)
    qwen3moe     qwen3_moe Qwen3's table, experts stacked (mlp.experts.{e}.*_proj); every layer routed,
                           top-k renormalised and no attention biases (llama.cpp's qwen3moe has none)
    qwen2moe     qwen2_moe Qwen2's (Q/K/V biases), experts stacked, the shared expert ffn_*_shexp and its
                           gate ffn_gate_inp_shexp ((1, d) in Hugging Face, (d,) in the file); every layer
                           routed, top-k not renormalised (llama.cpp's qwen2moe never does)
    olmoe        olmoe     OLMo's q/k norms over the whole projection, experts stacked; top-k not renormalised
    chatglm      glm       nothing (RoPE on neighbouring pairs of the first rope.dimension_count in both; gate_up_proj
                           stays fused: ffn_up [gate; up]); q/k/v biases or none, never attn_output's; THUDM's
                           query_key_value (ChatGLM2/3, glm-4-9b-chat) one attn_qkv [Q; K; V], split as phi2's;
                           d_model / heads per head; freq_base, eps and context as the converter wrote them (10000 ·
                           rope_ratio, layernorm_epsilon or 1e-5, seq_length or d_model: what llama.cpp runs)
    glm4         glm4      nothing (RoPE on neighbouring pairs in both; gate_up_proj stays fused: ffn_up [gate;
                           up]); partial RoPE (rope.dimension_count) with a head size of its own (key_length);
                           q/k/v biases or none, never attn_output's; norms after each box (post_attention_norm,
                           post_ffw_norm)
    ernie4_5-moe ernie4_5_moe  as ernie4_5; routed layers from leading_dense_block_count, every
                           interleave_moe_layer_step-th, experts stacked, the choice bias exp_probs_b (E,) (Hugging
                           Face's moe_statics (1, E)), the shared experts one FFN (expert_shared_feed_forward_length)
    dots1        dots1     Qwen3's q/k norms; DeepSeek-V3's router: σ (expert_gating_func 2), exp_probs_b, the shared
                           experts (expert_shared_count × the experts' width), expert_weights_norm / _scale, dense
                           first layers; no groups, no sliding window (llama.cpp's dots1 runs neither)
    exaone4      exaone4   nothing; the window and a bool per layer (attention.sliding_window_pattern): the full
                           layers without RoPE while the model slides (llama.cpp's use_rope), every layer turned
                           without a window
    deepseek2    deepseek_v2 / _v3  latent attention written as one K/V head (key_length r_kv + d_rot) with each
                           head's sizes in key_length_mla / value_length_mla; kv_b_proj split per head into attn_k_b
                           (H, r_kv, d_nope), K's rows transposed, and attn_v_b (H, d_v, r_kv): joined back; V3 by
                           σ gating (with exp_probs_b and groups), V2 by softmax; plain RoPE only
    gpt-oss      gpt_oss   gate_up_proj (E, d, 2·f, gate and up interleaved) split and transposed into ffn_gate_exps
                           and ffn_up_exps (E, f, d), down_proj transposed (E, d, f), biases likewise: joined back; the
                           sinks attn_sinks, the router ffn_gate_inp with its bias; every other layer sliding; the clamp
                           at llama.cpp's fixed 7 / 1.702; YaRN truncated (llama.cpp's corr_dims); MXFP4 experts
    mamba        mamba     A_log written as A = −exp(A_log) (ssm_a, no .weight): back to log(−A); the conv's
                           (E, 1, k) squeezed to (E, k): unsqueezed; D as ssm_d; sizes as ssm.* keys, no attention
    mamba2       mamba2    as mamba; A and D (H,) written (H, 1), dt_bias as ssm_dt.bias, the gated norm's weight (E,)
                           by group (G, E / G): back to (H,), dt_bias, (E,) (_ssm2); the heads are ssm.time_step_rank,
                           the groups ssm.group_count; no clamp of Δ (llama.cpp's scan has none), the chunks 256
    jamba        jamba     Mamba's mixer (as mamba) with its three norms (ssm_dt_norm, ssm_b_norm, ssm_c_norm) among
                           attention layers: attention.head_count_kv one count a layer, 0 for a Mamba layer (the
                           layers' kinds, gguf.hybrid_layers); the routed layers those holding ffn_gate_inp (the file
                           has no key for them; Arch.by_tensors), experts stacked; no RoPE
    granitehybrid granitemoehybrid  Mamba-2's mixer (as mamba2) among Granite's attention layers (Q, K rows interleaved
                           per head; the kinds as jamba's); input_linear's [gate; up] (experts (E, 2·f, d), the shared
                           FFN (2·s, d)) split into ffn_gate_* and ffn_up_*: joined back (_gate_up); Granite's four
                           multipliers; every layer routed; no RoPE (rope.scaling.finetuned, Bamba's, refused)
    apertus      apertus   nothing (rotate-half RoPE in both); no ffn_gate (a plain xIELU FFN); xIELU's four numbers of
                           each layer as the metadata arrays xielu.* (not tensors: made into mlp.act_fn.* beside
                           ffn_norm's plan, Arch.plan); the llama3 RoPE as rope_freqs (gguf.rope_freqs: a longrope
                           table); no biases
    llama4       llama4_text  nothing (RoPE on interleaved pairs in both); the fused experts split and transposed
                           (ffn_gate_exps, ffn_up_exps (E, f, d), ffn_down_exps (E, d, f)): joined back (Arch.plan); a
                           dense layer's FFN feed_forward_length wide, the experts' and the shared one's
                           expert_feed_forward_length; routed layers every interleave_moe_layer_step-th; llama.cpp's
                           fixed chunk 8192, NoPE every 4th layer, temperature floor 8192 and scale 0.1, q/k norms
                           unless 128 experts written into the config; rope_freqs as apertus's
    qwen3next    qwen3_next  the full layers' q_proj (each head's query, then its gate) as stored; every norm but the
                           gated one written 1 + w; the delta layers' A = −exp(A_log), dt_bias as ssm_dt.bias, the conv
                           squeezed (as mamba2's), in_proj_qkvz as stored (ssm_in) or split into attn_qkv [Q; K; V] and
                           attn_gate Z (joined back by key head, Arch.plan); the layers' kinds every
                           full_attention_interval-th full ("delta" the others, `_of_kind`); every FFN routed, top-k
                           renormalised, the σ-gated shared expert (expert_shared_feed_forward_length)
    falcon-h1    falcon_h1 attention and Mamba-2's mixer (as mamba2) in every layer (one head_count_kv); the µP
                           multipliers folded into the weights by the converter (each product's matrix × its multiplier,
                           in_proj's rows × ssm_multipliers): read as they are, every multiplier 1 (the same numbers);
                           the gated norm after the gate (llama.cpp's), or none when the file has no ssm_norm

Experts: <a>.expert_count (E), expert_used_count (the k chosen), expert_feed_forward_length (Qwen's
expert width; OLMoE's and Mixtral's is feed_forward_length) and expert_shared_feed_forward_length
(Qwen2-MoE's shared expert). What llama.cpp's converter does not store (Qwen's dense layers,
mlp_only_layers / decoder_sparse_step; norm_topk_prob, fixed per arch in llama.cpp's graph; OLMoE's
RMSNorm eps, written as 1e-5 whatever the directory says; Mixtral's sliding window) cannot be read
back: the config written here is llama.cpp's model (every layer routed, its renormalisation, no window).

Metadata read (<a>: the arch): context_length, embedding_length, block_count, feed_forward_length,
attention.head_count(_kv), attention.key_length / value_length (the head size), rope.freq_base (10000 when
absent, as llama.cpp assumes), rope.dimension_count (partial RoPE for phi2, gptneox, stablelm; the whole head
elsewhere), attention.layer_norm_epsilon or layer_norm_rms_epsilon, use_parallel_residual (gptneox, stablelm),
rope.scaling.* (linear only; the llama3 RoPE of llama, apertus and llama4 as the tensor rope_freqs); granite's attention.scale
(Q·Kᵀ's factor, 1/√d_k when absent or 0, as llama.cpp), embedding_scale, residual_scale (1 when absent) and
logit_scale (logits / s). Any other <a>.* key changes the maths somewhere (soft-capping, sliding windows, clamped
Q/K/V, experts …): refused in one line, never dropped.
What the file does not say, the family's Hugging Face default gives: the activation (SiLU; Gemma
and GPT-2 the tanh GELU, Phi-2 gelu_new; GPT-NeoX's and Falcon's erf GELU, where llama.cpp computes
the tanh form).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..runtime.errors import QkvError
from .families import GGUF_ARCHS
from .table import Arch

Split = Callable[[np.ndarray], np.ndarray]

# Every architecture's table, by general.architecture: each family module declares its own (GGUF = {…},
# of table.Arch), and families.py gathers them.
ARCHS: dict[str, Arch] = GGUF_ARCHS


# <a>.* keys every arch may carry that qkv reads (or that change nothing it computes).
COMMON_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
               "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
               "attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "rope.freq_base",
               "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
               "rope.scaling.original_context_length", "rope.scaling.finetuned", "expert_count", "expert_used_count")


OWN_HEAD_SIZE = ("glm4", "deepseek2", "qwen3next")    # partial-RoPE archs whose head size is not d_model / heads


def arch_of(name) -> Arch:
    """The table of GGUF architecture NAME, or one error naming those qkv reads."""
    if name not in ARCHS:
        raise QkvError(f"GGUF architecture {name!r:.60} is not supported; qkv runs "
                       f"{', '.join(sorted(a for a in ARCHS if a != 'mixtral'))} (Mistral and Mixtral files are "
                       "'llama')")
    return ARCHS[name]


def check_keys(meta: dict, a: str) -> None:
    """Every <a>.* metadata key is one qkv reads: another (soft-capping, a sliding window, clamped
    Q/K/V …) would change the numbers if dropped, so it is refused in one line."""
    known = set(COMMON_KEYS) | set(ARCHS[a].keys)
    for key in meta:
        if key.startswith(f"{a}.") and key[len(a) + 1:] not in known:
            raise QkvError(f"the GGUF key {key!r:.80} (= {meta[key]!r:.30}) is not read by qkv, and dropping it "
                           f"would change the numbers; qkv runs plain {a} files without it")


def config(meta: dict, a: str, dims: dict) -> dict:
    """The arch's config.json keys (beyond model_type) from the metadata and the common `dims`
    (d, H, Hkv, d_head, L, f, n_ctx, theta, eps, rope_dims): a Llama-like config, then the family's own keys
    (its Arch's `config`: its module's)."""
    arch = ARCHS[a]
    d, H, dk = dims["d"], dims["H"], dims["d_head"]
    if arch.partial_rope:
        if not 0 < dims["rope_dims"] <= dk or dims["rope_dims"] % 2:
            raise QkvError(f"the GGUF model rotates {dims['rope_dims']} of {dk} dimensions per head; it must be "
                           "an even number, at most the head size; the file is damaged")
    elif dims["rope_dims"] != dk:
        raise QkvError(f"the GGUF model rotates {dims['rope_dims']} of {dk} dimensions per head (partial RoPE, "
                       f"or head counts that disagree with the file), which qkv does not run for {a}")
    rope = {"rope_type": "default", "rope_theta": dims["theta"]}
    hf = {"max_position_embeddings": dims["n_ctx"], "tie_word_embeddings": False, "hidden_size": d,
          "num_attention_heads": H, "num_key_value_heads": dims["Hkv"], "head_dim": dk, "num_hidden_layers": dims["L"],
          "intermediate_size": dims["f"], "rope_theta": dims["theta"]}
    hf[arch.eps_key or ("rms_norm_eps" if arch.norm == "rms" else "layer_norm_eps")] = dims["eps"]
    if arch.partial_rope:                                            # d_model / heads per head, part of it turned
        if dk * H != d and a not in OWN_HEAD_SIZE:
            raise QkvError(f"the GGUF {a} model has {H} heads of {dk} in d_model {d}; {a} has d_model / heads per "
                           "head; the file is damaged")
        rope["partial_rotary_factor"] = dims["rope_dims"] / dk
        hf.pop("head_dim")
    hf |= {"rope_parameters": rope, "hidden_act": arch.activation}
    if arch.config is not None:
        hf = arch.config(meta, a, dims, hf)
    if arch.experts:
        hf |= moe_config(arch.family, dims)
    return hf


def moe_config(family: str, dims: dict) -> dict:
    """A mixture's config.json keys as llama.cpp runs the arch: every layer routed, its top-k
    renormalisation fixed per arch (Mixtral, Qwen3-MoE: yes; Qwen2-MoE, OLMoE: no), no window."""
    E, k, fe = dims["E"], dims["k"], dims["f_expert"]
    if family not in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        return {}                                                    # the family's own Arch.config writes its keys
    if family == "mixtral":
        return {"num_local_experts": E, "num_experts_per_tok": k, "intermediate_size": fe, "sliding_window": None}
    hf = {"num_experts": E, "num_experts_per_tok": k, "norm_topk_prob": family == "qwen3_moe"}
    if family == "olmoe":
        return hf | {"intermediate_size": fe, "clip_qkv": None, "attention_bias": False}
    hf |= {"moe_intermediate_size": fe, "mlp_only_layers": [], "decoder_sparse_step": 1,
           "use_sliding_window": False, "sliding_window": None}
    if family == "qwen2_moe":
        return hf | {"shared_expert_intermediate_size": dims["f_shared"], "qkv_bias": True}
    return hf | {"attention_bias": False}


def choices(a: str, names: set[str]) -> dict:
    """What a file of this arch says by the tensors it holds: tied (no `output`), attention biases
    (llama, qwen3, gptneox, starcoder2 — its use_bias, the FFN's too: all of them or none), Phi-2's
    and ChatGLM's fused attn_qkv (the original layouts)."""
    arch = ARCHS[a]
    attn_bias = any(n.startswith("blk.") and n.endswith(".bias") and
                    n.split(".")[2] in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output") for n in names)
    return {"tied": "output.weight" not in names or "output" not in arch.top,   # command-r: always tied
            "attn_bias": {"none": False, "optional": attn_bias}.get(arch.biases, True),
            "qk_norm": any(".attn_q_norm." in n for n in names),         # StableLM: qk_layernorm
            "ffn_norm": any(".ffn_norm." in n for n in names),           # StableLM: none in a parallel block
            "two_norms": any(".attn_norm_2." in n for n in names),       # Falcon-40B's ln_attn, ln_mlp
            "fused": {n.split(".")[1] for n in names if n.startswith("blk.") and ".attn_qkv." in n},
            "routed": {int(n.split(".")[1]) for n in names if n.startswith("blk.") and ".ffn_gate_inp." in n},
            "ssm_norm": any(".ssm_norm." in n for n in names)}       # Falcon-H1: the mixers' gated norm, or none


def expected(a: str, dims: dict, chosen: dict) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name → the shape (Hugging Face order: (out, in)) the metadata implies, for every
    tensor a file of this arch with these `choices` holds: none more, none fewer."""
    arch = ARCHS[a]
    d, f, V, dk = dims["d"], dims["f"], dims["V"], dims["d_head"]
    q, kv = dims["H"] * dk, dims["Hkv"] * dk
    wide = arch.family in ("olmo2", "olmoe")                         # q/k norms over the whole projection
    rows = {"attn_q": q, "attn_k": kv, "attn_v": kv, "attn_qkv": q + 2 * kv, "attn_output": d,
            "ffn_gate": f, "ffn_up": 2 * f if arch.family in ("phi3", "glm", "glm4") else f,   # [gate; up]
            "ffn_down": d}
    cols = {"attn_output": q, "ffn_down": f}
    if arch.experts:                                                 # (E, out, in) each; the router (E, d)
        E, fe, fs = dims["E"], dims["f_expert"], dims.get("f_shared", 0)
        rows |= {"ffn_gate_inp": E, "ffn_gate_shexp": fs, "ffn_up_shexp": fs, "ffn_down_shexp": d}
        cols |= {"ffn_down_shexp": fs}
        stacked = {"ffn_gate_exps": (E, fe, d), "ffn_up_exps": (E, fe, d), "ffn_down_exps": (E, d, fe),
                   "ffn_gate_inp_shexp": (d,), "exp_probs_b": (E,)}
    vector = {"attn_q_norm": q if wide else dk, "attn_k_norm": kv if wide else dk}
    if arch.family in ("stablelm", "cohere"):                        # a LayerNorm of each head's own, no bias
        vector = {"attn_q_norm": (dims["H"], dk), "attn_k_norm": (dims["Hkv"], dk)}
    biased = {"all": set(rows), "qkv": {"attn_q", "attn_k", "attn_v"}, "none": set(),
              "optional": ({"attn_q", "attn_k", "attn_v", "attn_qkv"} | ({"attn_output"} if arch.family not in
                                                                      ("stablelm", "glm", "glm4") else set())
                           if chosen["attn_bias"] else set())
              | ({"ffn_up", "ffn_down"} if arch.family == "gpt_neox" or (arch.family == "starcoder2" and
                                                                       chosen["attn_bias"]) else set())}[arch.biases]
    shapes = {"token_embd.weight": (V, d)}
    if "output_norm" in arch.top:                                    # (an encoder's blocks end in their own norm)
        shapes["output_norm.weight"] = (d,)
    if not chosen["tied"]:
        shapes["output.weight"] = (V, d)
    if arch.family == "phi":                                         # the head's bias, tied or not
        shapes["output.bias"] = (V,)
    if arch.norm_biases and "output_norm" in arch.top:
        shapes["output_norm.bias"] = (d,)
    if "token_types" in arch.top:                                    # BERT's token types: T rows
        shapes["token_types.weight"] = (dims["T"], d)
    if "token_embd_norm" in arch.top:                                # BLOOM: a LayerNorm after the embeddings
        shapes |= {"token_embd_norm.weight": (d,), "token_embd_norm.bias": (d,)}
    if "position_embd" in arch.top:
        shapes["position_embd.weight"] = (dims["n_ctx"], d)
    own = dims.get("part_shapes", {})                                # a family's own (its Arch.config's), None: absent
    for i in range(dims["L"]):
        for part in (*arch.layer, *(arch.experts or ())):
            if "kinds" in dims and not _of_kind(part, dims["kinds"][i]):
                continue                                             # a hybrid: attention or scan parts
            if arch.experts and not _in_layer(arch, part, i, dims):
                continue                                             # a dense layer's experts, a routed one's FFN
            if part in own:                                          # a shape (its weight's), or {kind: shape}
                spec = own[part] if isinstance(own[part], dict) else {
                    "bias" if part == "exp_probs_b" else "weight": own[part]}
                shapes |= {f"blk.{i}.{part}{'.' + kind if kind else ''}": shape for kind, shape in spec.items()
                           if shape is not None}                    # (kind "": a name without one, Mamba's ssm_a)
                continue
            if arch.experts and part in stacked:
                kind = "bias" if part == "exp_probs_b" else "weight"     # the choice bias: blk.{i}.exp_probs_b.bias
                shapes[f"blk.{i}.{part}.{kind}"] = stacked[part]
                continue
            if arch.family in ("phi", "glm") and (part == "attn_qkv") != (str(i) in chosen["fused"]) \
                    and part in ("attn_q", "attn_k", "attn_v", "attn_qkv"):
                continue                                             # Phi-2, ChatGLM: fused, or three
            if arch.family in ("stablelm", "cohere") and ((part in ("attn_q_norm", "attn_k_norm")
                                                           and not chosen["qk_norm"])
                                                          or (part == "ffn_norm" and dims["parallel"])):
                continue                                             # StableLM: q/k norms, ffn_norm as the file says
            if part == "attn_norm_2" and not chosen["two_norms"]:
                continue                                             # Falcon: one norm or two
            p = f"blk.{i}.{part}"
            if part in rows:
                shapes[f"{p}.weight"] = (rows[part], cols.get(part, d))
                if part in biased:
                    shapes[f"{p}.bias"] = (rows[part],)
            else:                                                    # a norm
                size = vector.get(part, d)
                shapes[f"{p}.weight"] = size if isinstance(size, tuple) else (size,)
                if arch.norm_biases and not isinstance(size, tuple):
                    shapes[f"{p}.bias"] = (size,)
    return shapes


# A mixture's parts that only its routed layers hold, and those only its dense layers hold (gguf's names).
ROUTED_PARTS = {"ffn_gate_inp", "exp_probs_b", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                "ffn_gate_inp_shexp"}
DENSE_PARTS = {"ffn_gate", "ffn_up", "ffn_down"}


def _in_layer(arch: Arch, part: str, i: int, dims: dict) -> bool:
    """Whether layer I of a mixture holds PART: its routed layers (i ≥ leading_dense_block_count and (i + 1) a
    multiple of interleave_moe_layer_step, as llama.cpp's graphs route) the router and experts (and the shared
    experts, when they are wider than 0), its dense layers one FFN; every other part, every layer. A family whose
    file says its routed layers by their tensors alone (Jamba: those holding ffn_gate_inp) has them in dims'
    `routed`."""
    routed = i in dims["routed"] if "routed" in dims else i >= dims["dense_lead"] and (i + 1) % dims["moe_step"] == 0
    if part.endswith("_shexp") and not dims["f_shared"]:
        return False
    if part in ROUTED_PARTS or part in arch.experts:
        return routed
    return not routed if part in DENSE_PARTS else True


ATTENTION_PARTS = {"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "attn_q_norm", "attn_k_norm"}
DELTA_PARTS = {"attn_qkv", "attn_gate"}        # Qwen3-Next's gated delta layers: [q; k; v] and z (its newer files)


def _of_kind(part: str, kind: str) -> bool:
    """Whether a hybrid's layer of KIND ("attention", "mamba", "delta": Qwen3-Next's gated delta rule) holds PART:
    attention's parts only the attention layers, the scan's (ssm_*; the delta rule's attn_qkv and attn_gate too) only
    the scan layers, every other part (norms, FFNs) both."""
    if kind == "delta":
        return part in DELTA_PARTS or part not in ATTENTION_PARTS
    if part in DELTA_PARTS:
        return False
    if part in ATTENTION_PARTS:
        return kind == "attention"
    return kind == "mamba" if part.startswith("ssm_") else True


def hf_tensors(a: str, name: str, shape: tuple[int, ...], dims: dict) -> list[tuple[str, tuple, Split]]:
    """The Hugging Face tensors GGUF tensor NAME (of SHAPE) becomes: (name, shape, array → array) each."""
    arch = ARCHS[a]
    stem, kind = name.rsplit(".", 1) if name.endswith((".weight", ".bias")) else (name, "")
    if stem.startswith("blk."):
        _, i, part = stem.split(".", 2)
        prefix = f"{arch.layers}.{i}."
        if arch.plan is not None and (own := arch.plan(part, name, prefix, shape, dims)) is not None:
            return own                                               # the family's own (its module's Arch.plan)
        if part in SSM2_PARTS and arch.family in SSM2_FAMILIES:      # Mamba-2's mixer: one A, D a head
            return _ssm2(prefix + arch.layer[part], part, kind, shape)
        if part in SSM_PARTS:                                        # Mamba's mixer
            return _ssm(prefix + arch.layer[part], part, kind, shape)
        if arch.family == "granitemoehybrid" and part in GATE_UP_PARTS:   # Granite's FFNs: gate and up one matrix
            return _gate_up(prefix + (arch.layer | (arch.experts or {}))[part], part, name, shape, dims)
        if arch.family == "gpt_oss" and part in arch.experts:        # gpt-oss: its experts fused, gate and up
            return _gpt_oss_experts(prefix, name, shape, dims)       # interleaved
        if arch.experts and part in arch.experts:                    # (E, out, in) → experts.{e}: (out, in) each
            return [(prefix + arch.experts[part].format(e=e) + f".{kind}", shape[1:], lambda w, e=e: w[e])
                    for e in range(shape[0])]
        if arch.family == "falcon" and part == "attn_norm" and dims["two_norms"]:
            return [(f"{prefix}ln_mlp.{kind}", shape, lambda w: w)]     # llama.cpp: attn_norm feeds the FFN
        if part == "ffn_gate_inp_shexp":                             # (d,) → Hugging Face's (1, d)
            return [(prefix + arch.layer[part] + f".{kind}", (1, *shape), lambda w: w[None])]
        if arch.family in ("deepseek_v2", "deepseek_v3") and part in ("attn_k_b", "attn_v_b"):
            return _latent_kv_b(prefix + arch.layer["attn_kv_b"], name, shape, dims)
        if part == "attn_sinks":                                     # gpt-oss's sinks (H,): self_attn.sinks, no kind
            return [(prefix + arch.layer[part], shape, lambda w: w)]
        if part == "exp_probs_b":                                    # the choice bias (E,): its own full name,
            rows = arch.family == "ernie4_5_moe"                     # Ernie's moe_statics (1, E)
            return [(prefix + arch.layer[part], (1, *shape) if rows else shape, (lambda w: w[None]) if rows
                     else (lambda w: w))]
        hf = prefix + arch.layer[part]
    else:
        part, hf = stem, arch.top[stem]
    same: Split = lambda w: w                                        # noqa: E731
    if arch.permuted and part in ("attn_q", "attn_k"):
        heads = dims["H"] if part == "attn_q" else dims["Hkv"]
        return [(f"{hf}.{kind}", shape, lambda w: unpermute(w, heads))]             # (H·d_k, d) or (H·d_k,)
    if arch.plus_one and part.endswith("norm"):                      # Gemma's γ = 1 + w: back to w
        return [(f"{hf}.{kind}", shape, lambda w: w - np.float32(1))]
    if part in arch.transposed and kind == "weight":
        return [(f"{hf}.{kind}", shape[::-1], lambda w: np.ascontiguousarray(w.T))]  # (in, out): Conv1D
    if arch.family == "stablelm" and part in ("attn_q_norm", "attn_k_norm"):    # (H, d_k) → norms.{h}: (d_k,) each
        return [(f"{hf}.norms.{h}.{kind}", shape[1:], lambda w, h=h: w[h]) for h in range(shape[0])]
    if part == "attn_qkv" and arch.family in ("phi", "glm"):         # [Q; K; V] rows → q_proj, k_proj, v_proj
        q, kv = dims["H"] * dims["d_head"], dims["Hkv"] * dims["d_head"]
        edges = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        return [(f"{prefix}self_attn.{proj}.{kind}", (hi - lo, *shape[1:]), lambda w, lo=lo, hi=hi: w[lo:hi])
                for proj, (lo, hi) in edges.items()]
    if part == "attn_qkv" and arch.family in ("gpt_neox", "bloom"):  # [Q; K; V] → rows by head (q, k, v of each)
        H, dk = dims["H"], dims["d_head"]
        return [(f"{hf}.{kind}", shape,                                              # (3, H, d_k, …) → (H, 3, d_k, …)
                 lambda w: np.ascontiguousarray(w.reshape(3, H, dk, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)))]
    if part == "attn_qkv" and arch.family == "falcon":               # [Q; K; V] → by K/V group (q…, k, v)
        H, Hkv, dk = dims["H"], dims["Hkv"], dims["d_head"]

        def by_group(w):
            q, k, v = np.split(w, [H * dk, (H + Hkv) * dk])                      # (H·d_k, …), (Hkv·d_k, …) ×2
            parts = [x.reshape(Hkv, -1, dk, *w.shape[1:]) for x in (q, k, v)]     # (Hkv, H/Hkv | 1, d_k, …)
            return np.ascontiguousarray(np.concatenate(parts, axis=1).reshape(w.shape))
        return [(f"{hf}.{kind}", shape, by_group)]
    return [(f"{hf}.{kind}", shape, same)]


SSM_PARTS = {"ssm_conv1d", "ssm_a", "ssm_d"}


def _ssm(hf: str, part: str, kind: str, shape: tuple[int, ...]) -> list[tuple[str, tuple, Split]]:
    """Mamba's mixer tensors llama.cpp's converter changed: A = −exp(A_log), written as ssm_a (no kind), back to
    A_log = log(−A); the conv's weight (E, 1, k) squeezed to (E, k), back to (E, 1, k); D as ssm_d (no kind)."""
    if part == "ssm_a":
        return [(hf, shape, lambda w: np.log(-w))]                   # A_log (E, N)
    if part == "ssm_d":
        return [(hf, shape, lambda w: w)]                            # D (E,)
    if kind == "weight":
        return [(f"{hf}.weight", (shape[0], 1, shape[1]), lambda w: w[:, None, :])]     # (E, 1, k)
    return [(f"{hf}.{kind}", shape, lambda w: w)]


SSM2_PARTS = {"ssm_conv1d", "ssm_a", "ssm_d", "ssm_dt", "ssm_norm"}
SSM2_FAMILIES = ("mamba2", "granitemoehybrid", "falcon_h1")   # families whose mixer is Mamba-2's (its names)

# A gate and its up, which the converter split from one [gate; up] matrix (GraniteMoe's input_linear): gate → up.
GATE_UP = {"ffn_gate_exps": "ffn_up_exps", "ffn_gate_shexp": "ffn_up_shexp", "ffn_gate": "ffn_up"}
GATE_UP_PARTS = {*GATE_UP, *GATE_UP.values(), "ffn_down_exps", "ffn_down_shexp", "ffn_down"}


def _gate_up(hf: str, part: str, name: str, shape: tuple[int, ...], dims: dict) -> list[tuple[str, tuple, Split]]:
    """Granite's fused FFN tensors from llama.cpp's split ones: the up part's plan rebuilds [gate; up] along the rows
    ((E, 2·f, d) from two (E, f, d), or (2·f, d) from two (f, d)), reading the gate too; the gate's plan is none; the
    down part is itself."""
    if part in GATE_UP:
        return []
    if part not in GATE_UP.values():
        return [(f"{hf}.weight", shape, lambda w: w)]
    gate_of = dims["values"][name.replace(f".{part}.", f".{next(g for g, u in GATE_UP.items() if u == part)}.")]
    rows = len(shape) - 2                                            # the out axis: 1 stacked, 0 plain

    def joined(up: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate([gate_of(), up], axis=rows))      # [gate; up]
    return [(f"{hf}.weight", (*shape[:rows], 2 * shape[rows], shape[-1]), joined)]


def _ssm2(hf: str, part: str, kind: str, shape: tuple[int, ...]) -> list[tuple[str, tuple, Split]]:
    """Mamba-2's mixer tensors llama.cpp's converter changed: A = −exp(A_log) and D, each (H,), written (H, 1) as ssm_a
    and ssm_d (no kind): back to A_log = log(−A) and D, (H,); dt_bias as ssm_dt.bias (no weight: HF's name has no
    kind); the gated norm's weight (E,) written (G, E / G) by group: back to (E,); the conv as Mamba's."""
    if part == "ssm_a":
        return [(hf, shape[:1], lambda w: np.log(-w[:, 0]))]         # A_log (H,)
    if part == "ssm_d":
        return [(hf, shape[:1], lambda w: np.ascontiguousarray(w[:, 0]))]     # D (H,)
    if part == "ssm_dt":
        return [(hf, shape, lambda w: w)]                            # dt_bias (H,)
    if part == "ssm_norm":
        return [(f"{hf}.{kind}", (shape[0] * shape[1],), lambda w: w.reshape(-1))]   # (E,)
    return _ssm(hf, part, kind, shape)


def _latent_kv_b(hf: str, name: str, shape: tuple[int, ...], dims: dict) -> list[tuple[str, tuple, Split]]:
    """DeepSeek's kv_b_proj (H·(d_nope + d_v), r_kv), which llama.cpp's converter splits per head into attn_k_b
    (H, r_kv, d_nope), K's rows transposed, and attn_v_b (H, d_v, r_kv): attn_v_b's plan joins them back (reading
    attn_k_b too); attn_k_b's is none."""
    if ".attn_k_b." in name:
        return []
    H, d_v, r = shape
    k_b_of = dims["values"][name.replace(".attn_v_b.", ".attn_k_b.")]
    d_nope = dims["d_head"] - dims["rope_dims"]

    def joined(v_b: np.ndarray) -> np.ndarray:
        k_b = k_b_of().transpose(0, 2, 1)                              # (H, d_nope, r)
        return np.ascontiguousarray(np.concatenate([k_b, v_b], axis=1).reshape(-1, r))   # (H·(d_nope + d_v), r)
    return [(hf + ".weight", (H * (d_nope + d_v), r), joined)]


def _gpt_oss_experts(prefix: str, name: str, shape: tuple[int, ...], dims: dict) -> list[tuple[str, tuple, Split]]:
    """gpt-oss's fused experts from llama.cpp's three stacks: ffn_down_exps (E, d, f) is down_proj (E, f, d)
    transposed (its bias (E, d) as it is); ffn_up_exps's plan rebuilds gate_up_proj (E, d, 2·f), the columns of gate
    (ffn_gate_exps, read too) and up interleaved (its bias (E, 2·f) the same way); ffn_gate_exps's is none."""
    kind = name.rsplit(".", 1)[1]
    p = f"{prefix}mlp.experts."
    if ".ffn_down_exps." in name:
        if kind == "bias":
            return [(f"{p}down_proj_bias", shape, lambda w: w)]
        return [(f"{p}down_proj", (shape[0], shape[2], shape[1]), lambda w: np.ascontiguousarray(w.transpose(0, 2, 1)))]
    if ".ffn_gate_exps." in name:
        return []
    gate_of = dims["values"][name.replace(".ffn_up_exps.", ".ffn_gate_exps.")]

    def interleaved(up: np.ndarray) -> np.ndarray:                   # (E, f, d) or (E, f) each
        gate = gate_of()
        both = np.stack([gate, up], axis=2).reshape(up.shape[0], 2 * up.shape[1], *up.shape[2:])   # rows g0 u0 g1 u1 …
        return np.ascontiguousarray(both.transpose(0, 2, 1) if kind == "weight" else both)
    if kind == "bias":
        return [(f"{p}gate_up_proj_bias", (shape[0], 2 * shape[1]), interleaved)]
    return [(f"{p}gate_up_proj", (shape[0], shape[2], 2 * shape[1]), interleaved)]


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate-half RoPE applies (as transformers' loader does).

    llama.cpp's converter interleaves each head's two rotary halves, rows (h, half, i) →
    (h, i, half); we put them back: (out, …) viewed as (H, d_k/2, 2, …) → (H, 2, d_k/2, …).
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
