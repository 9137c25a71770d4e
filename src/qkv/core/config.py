"""ModelConfig: one dataclass whose knobs describe every family (STYLE habit 4).

A family is a set of knob values, not a subclass:
  BERT  = post-norm + LayerNorm + learned positions + token types + erf GELU, bidirectional
  GPT-2 = pre-norm + LayerNorm + learned positions + tanh GELU, causal, tied W_vocab
  Llama = pre-norm + RMSNorm + RoPE + SwiGLU + GQA, causal (Mistral, Qwen2: the same knobs)
  GPT-J = parallel residual with one LayerNorm + RoPE by interleaved pairs on part of each head + LM-head bias
  Cohere = parallel residual with one LayerNorm + interleaved RoPE + SwiGLU + q/k norms per head + logit scale
  Granite = Llama + embedding, residual, score and logit multipliers
  BLOOM  = pre-norm + embedding LayerNorm + ALiBi (a per-head slope × the key's position on S) + tanh GELU
  Falcon = parallel attention / FFN + MQA or GQA + RoPE, or ALiBi scaled with the scores
  MPT    = pre-norm LayerNorm without β + ALiBi + no biases + erf GELU
Layers of different kinds: each layer's own sliding window (layer_windows: Gemma 2/3, GPT-Neo's local layers,
Qwen's and SmolLM3's sliding layers), the windowed layers' own RoPE base (Gemma 3), layers without RoPE
(SmolLM3); Gemma 2 soft-caps its scores and logits (attn_softcap, final_softcap).
gpt-oss = Llama's blocks + attention sinks (attn_sinks) + sliding / full layers + YaRN + every FFN routed to
clamped-SwiGLU experts with biases (glu_limit, glu_alpha), its router with a bias (MoEWeights.b_router).
EXAONE 4 = OLMo 2's norms after each box + q/k norms per head + sliding layers, the full ones without RoPE
(no_rope_layers); Hunyuan = Llama + q/k norms per head after RoPE (qk_norm_after_rope); Apertus = Llama + q/k norms
+ a plain FFN of xIELU, whose learned scalars are weights of each FFN (FFNWeights.xielu).
Llama 4 = Llama + RoPE by interleaved pairs + chunked attention on its RoPE layers (attention_chunk, chunked_layers),
q and k of those divided by their RMS (qk_l2_norm), NoPE layers whose query grows with its position (temperature_floor,
temperature_scale) + a σ router whose chosen experts read their input scaled by their weight (expert_input_scaled)
beside an ungated shared expert.
An encoder–decoder (encoder_decoder=True) has two stacks under the same knobs: the encoder reads
the source bidirectionally (n_layers blocks), the decoder writes the target causally (n_decoder_layers
blocks, each with a cross-attention to the encoder's output); `causal` then describes the decoder.
  Marian = post-norm + sinusoidal positions + scaled embeddings + final_logits_bias (b_vocab)
  BART   = post-norm + learned positions (offset 2) + embedding LayerNorm + GELU
  T5     = pre-norm + RMSNorm + relative position buckets + no 1/√d_k + no biases + ReLU
           (v1.1, flan-t5, mT5: gated GELU, untied W_vocab; original: tied, decoder output × d_model^-0.5)
  mBART  = BART pre-norm + a final LayerNorm per stack (+ the language id as the first token written)
  Pegasus = pre-norm + sinusoidal positions (Marian's halves, no offset) + a final LayerNorm per stack
  UMT5   = mT5 with a relative position bias table in every layer (AttentionWeights.rel_bias)
  T5Gemma = Gemma 2's blocks in both stacks (+ a norm after the cross-attention: BlockWeights.cross_out_norm, its
           scores soft-capped too), RoPE in each, the encoder's windows reaching both ways (encoder_layer_windows)
  Whisper = pre-norm + a final LayerNorm per stack; the encoder reads log-mel frames through two GELU
           convolutions (audio_mels, Weights.front) + a fixed sinusoidal table, the decoder learned positions
The encoders beside BERT: RoBERTa / XLM-R = BERT + positions counted over the non-pad ids from pad + 1
(positions_from_ids) + a masked-LM head (head_activation); DistilBERT = BERT without token types (its
sinusoidal table, when it has one, starts the learned table); ELECTRA = BERT with E-wide embeddings projected to d_model.
  Longformer = RoBERTa + a window per layer reaching both ways (layer_windows) + global tokens with their own Q, K, V
           (global_tokens); BigBird = BERT + block-sparse attention past (5 + 2r)·b tokens (block_sparse)
DeBERTa = BERT's post-norm blocks + disentangled attention (disentangled: S = c2c + c2p + p2c, each token's content
against the other's bucketed relative position, scaled by attn_scale = 1/√(d_k·(1 + terms))), absolute positions
or none (position "relative"), a masked-LM head under one of two names (head_names); DeBERTa-v2-xlarge adds a
convolution of the first block's input to its output (first_conv).
  ALBERT = ELECTRA's projected embeddings + blocks that share their weights (shared_groups, group_depth: n_layers
           blocks run, each reading one of fewer stored layers, `stored_layer`)
  MPNet  = RoBERTa's positions + T5's bucketed relative bias (relative_buckets, relative_max_distance: one table,
           Weights.rel_bias, added to every layer's scores, both directions)
  Mixtral, Qwen2-MoE = the Llama knobs + a routed FFN (n_experts > 0): each token goes to the k experts
           its router ranks highest, their outputs summed with the router's weights (+ a shared expert)
  dots1 (DeepSeek-V3's router) = Qwen3-MoE's knobs + sigmoid scores, a choice bias, group-limited choice,
           scaled weights, an ungated shared expert; Ernie 4.5 = Llama + interleaved RoPE (+ MoE: softmax
           with a choice bias, an ungated shared expert)
  DeepSeek V2/V3 = Llama's norms and SwiGLU + multi-head latent attention (kv_lora_rank: K, V of every head from
           one latent per token, RoPE on a part of each head) + a routed FFN after its first dense layers
An image model (image_size set: ViT) reads an image cut into patches: its tokens are [CLS] (the table's one
row, tok_embed[0]) and each patch's pixels, flattened, times W_patch + b_patch (blocks.embed); learned positions,
pre-norm LayerNorm blocks, a final LayerNorm, and the classifier on [CLS] as W_vocab (vocab_size = the labels).
  CLIP, SigLIP = two towers (text_tower: the text's config inside the image's), each pooled to one embedding
           (pooling, d_proj, Weights.pool; core/pooling.py): CLIP's text a causal encoder numbered 0..n−1
           (index_positions) with QuickGELU, pooled at its eos; its image ViT's + LayerNorm before the blocks; SigLIP's
           image without [CLS] (class_token False), pooled by a learned probe's attention
ESM-2 = a pre-norm encoder: RoPE, erf GELU, a final LayerNorm, RoBERTa's masked-LM head, and token_dropout's
rescaling of the embeddings by their share of <mask> (mask_dropout_id, with embedding_multiplier 1 − 0.15·0.8).
Jamba = Mamba layers (core/mamba.py's selective scan, RMSNorms on Δ's input, B and C: Mamba.inner_norms) among
attention layers without positions (layer_kinds), every layer followed by a SwiGLU FFN or a routed one (dense_layers).
Qwen3-Next = the gated delta rule's linear attention in some layers' place (delta: core/delta.py) among softmax
layers whose heads are gated (attn_output_gate) + partial RoPE + q/k norms per head + RMSNorm·(1 + w) + Qwen2-MoE's
experts.
An attention-only model (d_ff = 0) has no FFN: each block adds only attention (and b_out, if any)
to the residual stream, as in the induction-head studies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from ..runtime.errors import QkvError
from .disentangled import Disentangled
from .positions import check_rope, resolve_rope, rope_kind

# Upper bounds of the sizes (generous: the largest checkpoints have ~10² layers and heads): a config past them is
# refused before an array is shaped by it. qkv.checkpoints.common bounds config.json's keys the same way.
SIZE_BOUNDS = {**dict.fromkeys(("n_layers", "n_decoder_layers", "n_heads", "n_kv_heads"), 1 << 14),
               **dict.fromkeys(("vocab_size", "d_model", "d_head", "d_ff", "max_positions"), 2**31 - 1),
               "n_experts": 1 << 20, **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "d_v"), 2**31 - 1)}

Norm = Literal["layer", "rms"]
NormPlace = Literal["pre", "post"]
Position = Literal["learned", "sinusoidal", "rope", "relative", "alibi"]
Activation = Literal["gelu", "gelu_tanh", "silu", "relu", "relu2", "xielu",   # xielu: learned scalars per FFN (Apertus)
                     "quick_gelu"]                                        # x·σ(1.702x) (CLIP)
LAYER_KINDS = ("attention", "mamba")   # what a layer of a stack of different kinds has in attention's place
                                       # (layer_kinds)
CONV_ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu", "tanh")   # what first_conv's activation may be (conv_act)


@dataclass(frozen=True)
class ModelConfig:
    """Every knob of a transformer the engine runs, in the guide's letters."""

    family: str                       # "bert", "gpt2", "llama", "mistral", "qwen2", ...
    vocab_size: int                   # V
    d_model: int                      # d_model
    n_layers: int                     # L
    n_heads: int                      # H
    d_ff: int                         # inner width of the FFN (often 4·d_model); 0 = attention-only (no FFN)
    max_positions: int                # the longest input the model was trained for
    n_kv_heads: int | None = None     # GQA/MQA: K/V heads shared by H / n_kv_heads query heads
    d_head: int | None = None         # d_k; defaults to d_model / H
    causal: bool = True               # decoder (causal mask) or encoder (bidirectional)
    norm: Norm = "layer"
    norm_place: NormPlace = "pre"
    norm_eps: float = 1e-5
    position: Position = "learned"
    rope_theta: float = 10000.0
    # position "alibi" (BLOOM, Falcon): S += m_h·p_j, head h's slope times key j's position (positions.alibi_slopes)
    alibi_scaled: bool = False        # Falcon: S = (Q·Kᵀ + m_h·p_j)·scale, the bias scaled with Q·Kᵀ; BLOOM: unscaled
    alibi_bfloat16: bool = False      # Falcon: m_h and m_h·p_j rounded to bfloat16, as it computes them
    rope_scaling: dict | None = field(default=None, compare=False)
    rotary_dim: int | None = None     # RoPE turns the first rotary_dim numbers of each head (GPT-NeoX); None: all d_k
    rope_interleaved: bool = False    # RoPE pairs (0, 1), (2, 3), … of each head (GPT-J, Cohere); False: (i, i + d/2)
    parallel_residual: bool = False   # x + Attn(Norm₁(x)) + FFN(Norm₂(x)): both read the block's input (GPT-NeoX)
    shared_norm: bool = False         # a parallel block's branches read one Norm(x) (Phi, Falcon-7B): ffn_norm None
    qk_norm: str | None = None        # Norm (the config's kind) of q and k before RoPE: "head" each head's d_k
                                      # (Qwen3, Phi), "all" the whole projection H·d_k (OLMo 2); None: none
    qk_norm_after_rope: bool = False  # Hunyuan: each head's q and k normalised after RoPE turns them, not before
    activation: Activation = "gelu"
    d_embed: int | None = None        # the embedding table's width when it is not d_model (OPT-350m's word_embed_proj_dim):
                                      # Weights.embed_in maps it to d_model, unembed_in back before W_vocab
    norm_affine: bool = True          # False: LayerNorms without a stored γ, β (OPT's layer_norm_elementwise_affine):
                                      # γ = 1, β = 0, held as constants and never written or trained
    gated_ffn: bool = False           # SwiGLU: act(x·W_gate) ⊙ (x·W_in), then ·W_out
    glu_limit: float | None = None    # gpt-oss's clamped SwiGLU: g = min(g, c), u = clip(u, −c, c), then
    glu_alpha: float = 1.0            # h = g·σ(α·g) ⊙ (u + 1) (swiglu_limit c, swiglu_alpha α); None: act(g) ⊙ u
    ffn_gate_scale: float = 1.0       # a gated FFN's act((x·W_gate + b_gate)·m) (Falcon-H1's mlp_multipliers[0]; no
                                      # backward: only Falcon-H1, which does not train here, sets it)
    qkv_bias: bool = True
    out_bias: bool = True             # bias of W_O
    ffn_bias: bool = True
    tied_embeddings: bool = False     # W_vocab = embedding tableᵀ
    type_vocab_size: int = 0          # BERT token types (segment A/B); 0 = none
    embed_norm: bool = False          # BERT: LayerNorm right after the embeddings
    final_norm: bool = True           # pre-norm models normalise once more before W_vocab
    lm_head: bool = True              # produce logits (decoders); encoders give hidden states
    sliding_window: int | None = None
    # ── layers of different kinds (Gemma 2/3, GPT-Neo, SmolLM3, Qwen's layer_types); the defaults: all alike
    layer_windows: tuple[int | None, ...] | None = None   # each layer's sliding window (None: full attention);
                                      # None: every layer has `sliding_window`
    local_rope_theta: float | None = None   # RoPE base of the windowed layers (Gemma 3's rope_local_base_freq);
                                      # None: they turn as the full ones
    local_rope_scaling: dict | None = field(default=None, compare=False)   # their rope_scaling (with local_rope_theta)
    no_rope_layers: tuple[int, ...] = ()   # layers whose q, k are not turned by RoPE (SmolLM3)
    # ── Llama 4's layers: chunked attention on its RoPE layers, temperature-tuned queries on its NoPE layers
    attention_chunk: int | None = None   # C: a chunked layer's query at position p sees keys j ≤ p with j // C = p // C
    chunked_layers: tuple[int, ...] = ()   # the layers attending within chunks (layer_types "chunked_attention")
    qk_l2_norm: bool = False          # each head's q and k divided by √(mean(x²) + eps), no weights, on the layers
                                      # RoPE turns, after RoPE (Llama 4's use_qk_norm)
    temperature_floor: int | None = None   # F: a NoPE layer's query × 1 + τ·log(1 + ⌊(p + 1)/F⌋) at position p
    temperature_scale: float = 0.1    # τ (Llama 4's attn_temperature_tuning, floor_scale, attn_scale); None F: none
    attn_softcap: float | None = None   # S = c·tanh(S/c) before the mask (Gemma 2's attn_logit_softcapping)
    attn_sinks: bool = False          # gpt-oss: each head's learned sink logit s_h (AttentionWeights.sinks) joins
                                      # the softmax with no value: A = exp(S)/(Σ exp(S) + exp(s_h)), rows sum to < 1
    # ── sparse attention in real models (core/sparse_layers.py: the masks, drawn by `qkv explain sparse`)
    global_tokens: tuple[int, ...] = ()   # Longformer: the positions (in each row as given) that attend globally: their
                                      # rows read every key through their own Q, K, V (AttentionWeights.W_Qg, …), and
                                      # every query sees them beside its window (transformers' global_attention_mask)
    block_sparse: tuple[int, int] | None = None   # BigBird: (block size b, random blocks r) of its block-sparse
                                      # attention, run on inputs longer than (5 + 2r)·b tokens
                                      # (sparse_layers.bigbird_copies);
                                      # None: full attention (attention_type original_full)
    disentangled: Disentangled | None = None   # DeBERTa: S = c2c + c2p + p2c, Q·Kᵀ plus each token's content
                                      # against the other's relative position (core/disentangled.py); None: S = Q·Kᵀ
    first_conv: tuple[int, str] | None = None   # DeBERTa-v2: (kernel, activation) of a convolution over the first
                                      # block's input added to its output, Norm(y + act(conv(x))) (blocks.conv_beside)
    # ── multi-head latent attention (MLA: DeepSeek V2/V3; latent.latent_attention): each token's K and V of every
    # head come from one latent c = Norm(x·W_V) of kv_lora_rank numbers (K's unturned part and V: c·W_KV_b) and one
    # RoPE key x·W_K shared by the heads; q = x·W_Q, or Norm(x·W_Q)·W_Q_b through a latent of its own. d_head is
    # q·k's width (d_nope + rotary_dim, RoPE turning each head's LAST rotary_dim numbers), d_v each head's V and Z.
    kv_lora_rank: int = 0             # r_kv, the latent's width; 0: plain attention (Q, K, V = X·W)
    q_lora_rank: int = 0              # r_q, q's latent; 0: q = x·W_Q
    d_v: int | None = None            # an MLA head's value width (V, Z; W_O reads H·d_v); None: d_head
    latent_norm_eps: float = 1e-6     # ε of the latents' RMSNorms (transformers' own, not rms_norm_eps)
    rope_deinterleave: bool = False   # MLA (DeepSeek V3's rope_interleave): the RoPE part read as pairs (2i, 2i+1)
                                      # and laid out as halves [x_0, x_2, …, x_1, x_3, …] before rotate-half RoPE
    final_softcap: float | None = None  # logits = c·tanh(logits/c) (Gemma 2's final_logit_softcapping)
    pad_token_id: int | None = None
    # Whether the embedding row of pad_token_id is torch's nn.Embedding(padding_idx=pad_token_id): a lookup
    # of the pad token then passes no gradient to its row (the row still learns through a tied W_vocab),
    # and a fresh single-stack model (qkv.init) starts the row at 0. Each family's reader (qkv.checkpoints)
    # sets it as transformers builds that family's table.
    pad_embedding_frozen: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # ── encoder–decoder models (Marian, BART, mBART, Pegasus, T5, mT5, UMT5); the defaults leave single-stack models unchanged
    encoder_decoder: bool = False     # two stacks: encoder (n_layers) → cross-attention → decoder
    n_decoder_layers: int | None = None   # L of the decoder stack; defaults to n_layers (encoder_decoder only)
    encoder_layer_windows: tuple[int | None, ...] | None = None   # the encoder's own windows (|i − j| < w), when
                                      # they differ from the decoder's layer_windows (T5Gemma: |i − j| ≤ its
                                      # sliding_window, the decoder's i − j < it); None: the same (`encoder_config`)
    scale_embedding: bool = False     # X = E[ids]·√d_model, then + positions (Marian; BART's option)
    embedding_multiplier: float = 1.0    # X = E[ids]·m (Granite's embedding_multiplier); see embed_scale
    mask_dropout_id: int | None = None   # ESM's token_dropout: rows of this id (<mask>) zeroed, each row's E[ids]
                                         # ÷ (1 − r), r its share of them among its real ids (blocks.mask_dropout)
    residual_multiplier: float = 1.0     # each box's output × m before it joins the stream (Granite)
    logit_scale: float = 1.0             # logits = H·W_vocab·s (Cohere's logit_scale, Granite's 1 / logits_scaling)
    position_offset: int = 0          # position p reads row p + offset of the table (BART: 2)
    positions_from_ids: bool = False  # RoBERTa: positions count the ids that are not pad_token_id (not the mask's
                                      # ones): the k-th real token is k, a pad −1, read at row + offset (pad + 1)
    embed_dim: int | None = None      # E, the embedding tables' width when ≠ d_model (ELECTRA): X = Norm(E[ids] + …)·W_embed
                                      # + b_embed, (B, n, E) → (B, n, d_model); None: the tables are d_model wide
    head_activation: Activation | None = None   # a masked-LM head before W_vocab (RoBERTa, DistilBERT, ELECTRA's
                                      # generator): logits = Norm(act(H·W_head + b_head))·W_vocab + b_vocab; None: H·W_vocab
    head_names: str | None = None     # the names a checkpoint's masked-LM head goes by where a family has two
                                      # (DeBERTa's legacy "cls.predictions" or "lm_predictions"); None: its one
    relative_buckets: int = 32        # position "relative" (T5): buckets of the key–query distance
    relative_max_distance: int = 128  # distances from here on share the last bucket
    scale_scores: bool = True         # S = Q·Kᵀ/√d_k; False: S = Q·Kᵀ (T5 folds the scale into W_Q)
    attn_scale: float | None = None   # S = Q·Kᵀ·attn_scale instead (Gemma 2's query_pre_attn_scalar^-½,
                                      # Granite's attention_multiplier, GPT-Neo's 1); None: as scale_scores says
    scale_decoder_output: bool = False   # T5 with a tied W_vocab: logits = (Z·d_model^-0.5)·W_vocab
    decoder_start_token_id: int | None = None   # the first token the decoder reads (Marian: pad, T5: pad)
    forced_bos_token_id: int | None = None      # writing: the first token written is this one (mBART-50's
                                                # target language), as transformers' ForcedBOSTokenLogitsProcessor
    start_from_labels: bool = False   # training: the decoder reads first the label row's last real token
                                      # (mBART's language id, its shift_tokens_right), not decoder_start_token_id
    # ── mixture of experts (Mixtral, Qwen2-MoE): a MoE layer's FFN is routed (blocks.routed_feed_forward)
    n_experts: int = 0                # E gated FFNs per MoE layer; 0: every FFN dense
    experts_per_token: int = 0        # k: each token goes to the k experts its router ranks highest
    norm_top_k: bool = True           # the k chosen probabilities renormalised to sum 1 (Mixtral; Qwen2-MoE: norm_topk_prob)
    d_expert: int | None = None       # each expert's inner width; None: d_ff (Mixtral)
    d_shared_expert: int = 0          # a shared expert every token also takes, gated by σ(x·w) (Qwen2-MoE); 0: none
    dense_layers: tuple[int, ...] = ()   # layers whose FFN is dense (width d_ff) among the MoE layers
    # the router's other forms (DeepSeek-V3, dots1, Ernie 4.5; blocks.route): its scores, how experts are chosen
    # from them, and the weights the chosen experts' outputs are summed with
    router_score: Literal["softmax", "sigmoid"] = "softmax"   # s = softmax(x·W_router), or σ(x·W_router) each
    expert_choice_bias: bool = False  # the choice ranks s + b_choice (MoEWeights.b_choice, DeepSeek-V3's
                                      # e_score_correction_bias, Ernie's moe_statics); the weights stay s[chosen]
    expert_groups: int = 1            # G groups of E/G experts: a group's score is the sum of its 2 highest ranks,
    expert_groups_kept: int = 1       # and only the best expert_groups_kept groups' experts may be chosen
    expert_group_score: Literal["top2", "max"] = "top2"   # a group ranked by its 2 highest (DeepSeek-V3, dots1) or
                                      # by its highest (DeepSeek-V2's group_limited_greedy)
    norm_top_k_min: float = 0.0       # renormalised: w = s / max(Σ s[chosen], this) (Ernie's moe_norm_min);
                                      # sigmoid scores: s / (Σ s[chosen] + 1e-20), as transformers writes them
    routed_scaling: float = 1.0       # the chosen experts' weights × this (DeepSeek-V3's routed_scaling_factor)
    shared_expert_gate: bool = True   # the shared expert gated by σ(x·W_shared_gate) (Qwen2-MoE); False: added as it
                                      # is (DeepSeek, dots1, Ernie 4.5)
    expert_input_scaled: bool = False   # Llama 4: each chosen expert reads its input × its weight, FFN_e(w_e·x), instead
                                      # of its output weighed, w_e·FFN_e(x)
    # ── layers that share their weights (ALBERT): the n_layers blocks run read fewer stored layers
    shared_groups: int = 0            # G groups of stored layers (num_hidden_groups); 0: every block has its own
    group_depth: int = 1              # the layers a group holds, run in turn each time it runs (inner_group_num):
                                      # n_layers = L·group_depth blocks; pass p < L runs group int(p / (L / G))
    # ── image models (ViT): the input is an image of image_size pixels cut into patch_size squares
    image_size: tuple[int, int] | None = None   # (height, width) in pixels; None: a text model
    patch_size: tuple[int, int] | None = None   # (height, width) of a patch; the grid is image_size // patch_size
    num_channels: int = 3                       # C: 3 for RGB, 1 for a grey image
    class_token: bool = True                    # [CLS] (tok_embed[0]) before the patches (ViT, CLIP); False: the
                                                # patches alone (SigLIP)
    # ── towers of an image–text pair (CLIP, SigLIP: core/pooling.py): one row of the last hidden states (or a probe
    # attending over them) is the input's embedding, then Weights.pool's norm and projection
    pooling: Literal["cls", "eos", "last", "probe"] | None = None   # "cls" row 0 (CLIP's image), "eos" the first
                                                # eos_token_id of the ids (its argmax when that id is 2: CLIP's legacy
                                                # configs), "last" the last row (SigLIP's text), "probe" a learned
                                                # query attending over every row, then an MLP (SigLIP's image); None
    d_proj: int | None = None                   # p, the width of the embedding its projection gives; None: none
    index_positions: bool = False               # a causal stack whose positions are 0..n−1 whatever the mask (CLIP's
                                                # text); False: a decoder counts real tokens (left padding)
    text_tower: "ModelConfig | None" = field(default=None, compare=False)   # an image–text pair (CLIP, SigLIP):
                                                # this config is the image tower's, this one the text tower's
    # ── speech (Whisper): the encoder reads log-mel frames through two 1-D convolutions (Weights.front)
    audio_mels: int | None = None               # mel bins per input frame; None: the encoder reads tokens
    source_positions: int | None = None         # the encoder's positions (max_source_positions): the input is
                                                # 2 × this many frames, halved by the second convolution's stride
    # ── state-space blocks (Mamba): each block x + Mixer(RMSNorm(x)), a selective scan instead of attention and no
    # FFN (core/mamba.py: the stack, its state, the attention each layer implies); n_heads groups its channels
    mamba: object | None = None                 # its sizes, a core.mamba.Mamba (not imported here: core.mamba reads
                                                # this config), or Mamba-2's, a core.mamba2.Mamba2 (SSD: a scalar
                                                # decay per head, core/mamba2.py); None: transformer blocks
    # ── stacks of layers of different kinds (Jamba): each layer's box in attention's place, the block around it the
    # same (its norms, its FFN or experts); the kinds: LAYER_KINDS (core/stack.py runs each kind's block)
    layer_kinds: tuple[str, ...] | None = None  # each layer's kind ("attention", "mamba": the selective scan of
                                                # core/mamba.py with cfg.mamba's sizes); None: every layer attention
                                                # (a Mamba model without layer_kinds: every layer a Mamba block, no FFN)
    # ── lightning attention (MiniMax): some layers a causal linear attention with a per-head decay instead of
    # softmax attention, every block's residual steps scaled (core/lightning.py: the box, its state, its implied
    # attention, the block)
    lightning: object | None = None             # its knobs, a core.lightning.Lightning (not imported here, as mamba);
                                                # None: none
    # ── the gated delta rule (Qwen3-Next): some layers' box in attention's place a linear attention keeping a state
    # matrix per head (core/delta.py: the box, its state, its implied attention); the block around it the same
    delta: object | None = None                 # its knobs, a core.delta.GatedDelta (not imported here, as mamba);
                                                # None: none
    attn_output_gate: bool = False              # Z_h ⊙ σ(X·W_G + b_G)_h before W_O (Qwen3-Next's full-attention
                                                # layers: q_proj twice as wide, AttentionWeights.W_G); False: none
    # ── the arithmetic of the pass: "exact" (float32 activations; what analyses are checked against) or "llama.cpp"
    # (a GGUF's stored blocks multiplied as llama.cpp does, StoredMatrix.arith; RMSNorm and plain RoPE's angles as
    # ggml computes them, runtime.llama_arith, read by blocks.norm and stack.rotation); qkv.load(…, arith=) sets it
    arith: Literal["exact", "llama.cpp"] = "exact"

    @property
    def grid(self) -> tuple[int, int] | None:
        """(rows, columns) of an image model's patches (leftover pixels at the right and bottom edges are not
        read, as a strided convolution leaves them); None for a text model."""
        if self.image_size is None:
            return None
        return self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1]

    def absent_special_ids(self) -> dict[str, int]:
        """The eos, bos and pad ids the config names that are not ids of its vocabulary (0 … V−1), by name: a
        model cannot write them, so an eos among them never ends a text (transformers runs such configs, e.g.
        GPT-2's default eos 50256 in a tiny checkpoint; writing says so once, `writing.generate.stop_ids`)."""
        eos = [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id or ())
        named = [("eos_token_id", e) for e in eos] + [("bos_token_id", self.bos_token_id),
                                                      ("pad_token_id", self.pad_token_id)]
        return {name: i for name, i in named if i is not None and not 0 <= i < self.vocab_size}

    def stored_layer(self, layer: int) -> int:
        """The stored layer whose weights block LAYER reads: LAYER itself, or with shared_groups G (ALBERT) the
        layer k = LAYER mod group_depth of group g = int(p / (L / G)), p = LAYER // group_depth the pass of L, numbered
        g·group_depth + k (the float division AlbertTransformer picks its group with)."""
        if not self.shared_groups:
            return layer
        passes = self.n_layers // self.group_depth
        p, k = divmod(layer, self.group_depth)
        return int(p / (passes / self.shared_groups)) * self.group_depth + k

    def moe_layer(self, layer: int) -> bool:
        """Whether LAYER's FFN is routed among experts (else one dense FFN)."""
        return self.n_experts > 0 and layer not in self.dense_layers

    def __post_init__(self) -> None:
        if self.encoder_decoder and self.n_decoder_layers is None:
            object.__setattr__(self, "n_decoder_layers", self.n_layers)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.d_head is None:
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.arith not in ("exact", "llama.cpp"):
            raise QkvError(f"arith {self.arith!r:.40} is not an arithmetic qkv computes; use \"exact\" or "
                           "\"llama.cpp\"")
        for knob in ("vocab_size", "d_model", "n_layers", "n_heads", "max_positions", "n_kv_heads", "d_head"):
            if getattr(self, knob) <= 0:
                raise QkvError(f"{knob}={getattr(self, knob)} must be positive; fix the model's config")
        for knob, most in SIZE_BOUNDS.items():              # generous; past them a config is nonsense
            v = getattr(self, knob)
            if v is not None and v > most:
                raise QkvError(f"{knob}={v:,} is more than qkv reads (at most {most:,}); fix the model's config")
        if self.d_ff < 0:
            raise QkvError(f"d_ff={self.d_ff} must be positive, or 0 for an attention-only model; fix the model's config")
        if self.n_heads % self.n_kv_heads:
            raise QkvError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}; "
                           "fix the model's config")
        if self.rotary_dim is not None and not (2 <= self.rotary_dim <= self.d_head and self.rotary_dim % 2 == 0):
            raise QkvError(f"rotary_dim={self.rotary_dim} must be an even number from 2 to d_head={self.d_head} "
                           "(or none: all of each head); fix the model's config")
        if self.qk_norm not in (None, "head", "all"):
            raise QkvError(f"qk_norm={self.qk_norm!r} must be 'head', 'all' or none; fix the model's config")
        if self.qk_norm_after_rope and self.qk_norm != "head":
            raise QkvError("qk_norm_after_rope (Hunyuan) normalises each head's q and k: it needs qk_norm='head'; "
                           "fix the model's config")
        if self.activation == "xielu" and (self.gated_ffn or self.n_experts):
            raise QkvError("activation 'xielu' (Apertus) is a plain FFN's, with its scalars in each FFN's weights: "
                           "it needs gated_ffn false and no experts; fix the model's config")
        if self.shared_norm and not self.parallel_residual:
            raise QkvError("shared_norm (one norm read by both branches) needs parallel_residual; fix the model's config")
        if self.parallel_residual and self.norm_place != "pre":  # (then BlockWeights.ffn_norm None: one norm, Phi)
            raise QkvError("parallel_residual needs pre-norm blocks (norm_place='pre'); fix the model's config")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise QkvError(f"sliding_window={self.sliding_window} must be a positive number of tokens (or none)")
        if self.layer_windows is not None:
            object.__setattr__(self, "layer_windows", tuple(self.layer_windows))
            if len(self.layer_windows) != self.n_layers or any(w is not None and not (isinstance(w, int) and w > 0)
                                                              for w in self.layer_windows):
                raise QkvError(f"layer_windows must give each of the {self.n_layers} layers a positive window or none; "
                               "fix the model's config")
        object.__setattr__(self, "no_rope_layers", tuple(self.no_rope_layers))
        if any(not 0 <= i < self.n_layers for i in self.no_rope_layers):
            raise QkvError(f"no_rope_layers={self.no_rope_layers} must be layers 0..{self.n_layers - 1}; "
                           "fix the model's config")
        self._check_llama4()
        if not (math.isfinite(self.norm_eps) and self.norm_eps >= 0):
            raise QkvError(f"norm_eps={self.norm_eps} must be a finite number ≥ 0; fix the model's config")
        if self.position == "rope":            # YaRN's and dynamic NTK's numbers filled in as transformers does
            object.__setattr__(self, "rope_scaling", resolve_rope(self.rope_scaling, self.max_positions))
            object.__setattr__(self, "local_rope_scaling", resolve_rope(self.local_rope_scaling, self.max_positions))
            check_rope(self.rope_theta, self.rope_scaling, resolved=True)
            if self.local_rope_theta is not None:
                check_rope(self.local_rope_theta, self.local_rope_scaling, "local_rope", resolved=True)
        for knob in ("attn_softcap", "final_softcap", "local_rope_theta"):
            v = getattr(self, knob)
            if v is not None and not (0 < v < float("inf")):
                raise QkvError(f"{knob}={v} must be a positive finite number (or none); fix the model's config")
        if self.encoder_decoder and self.n_decoder_layers <= 0:
            raise QkvError(f"n_decoder_layers={self.n_decoder_layers} must be positive; fix the model's config")
        if self.encoder_layer_windows is not None:
            object.__setattr__(self, "encoder_layer_windows", tuple(self.encoder_layer_windows))
            self.encoder_config()                # its windows checked as layer_windows are
        if self.position == "relative" and not (2 <= self.relative_buckets // 2 < self.relative_max_distance):
            raise QkvError(f"relative_buckets={self.relative_buckets} must be ≥ 4 and relative_max_distance="
                           f"{self.relative_max_distance} more than half of it; fix the model's config")
        if (self.alibi_scaled or self.alibi_bfloat16) and self.position != "alibi":
            raise QkvError("alibi_scaled / alibi_bfloat16 shape an ALiBi bias: they need position='alibi'; "
                           "fix the model's config")
        if self.first_conv is not None and not (len(self.first_conv) == 2 and isinstance(self.first_conv[0], int)
                                                and self.first_conv[0] > 0 and self.first_conv[1] in CONV_ACTIVATIONS):
            raise QkvError(f"first_conv={self.first_conv} must be (a kernel > 0, one of {CONV_ACTIVATIONS}); fix the "
                           "model's config")
        if self.disentangled is not None and self.disentangled.check():
            raise QkvError(f"{self.disentangled.check()}; fix the model's config")
        if self.attn_scale is not None and not (0 < self.attn_scale < float("inf")):
            raise QkvError(f"attn_scale={self.attn_scale} must be a positive finite number; fix the model's config")
        if self.d_embed is not None and self.d_embed <= 0:
            raise QkvError(f"d_embed={self.d_embed} must be positive (or none: d_model); fix the model's config")
        # eos, bos and pad ids outside the vocabulary are accepted, as transformers accepts them (GPT-2's default
        # 50256 in a tiny test checkpoint): `absent_special_ids` names them, and writing says so once
        if self.forced_bos_token_id is not None and not 0 <= self.forced_bos_token_id < self.vocab_size:
            raise QkvError(f"forced_bos_token_id={self.forced_bos_token_id} is not a token id of the "
                           f"{self.vocab_size}-token vocabulary; fix the model's config")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.experts_per_token <= self.n_experts):
            raise QkvError(f"experts_per_token={self.experts_per_token} must be from 1 to n_experts={self.n_experts} "
                           "(and n_experts ≥ 0); fix the model's config")
        if self.n_experts:
            self._check_router()
        if self.kv_lora_rank or self.q_lora_rank or self.d_v is not None or self.rope_deinterleave:
            self._check_latent()
        if self.glu_limit is not None and not (self.gated_ffn and self.glu_limit > 0
                                               and math.isfinite(self.glu_alpha)):
            raise QkvError(f"glu_limit={self.glu_limit} (clamped SwiGLU) needs gated_ffn, a limit > 0 and a finite "
                           f"glu_alpha (got {self.glu_alpha}); fix the model's config")
        if (self.shared_groups or self.group_depth != 1) and not (
                self.group_depth >= 1 and self.n_layers % self.group_depth == 0
                and 1 <= self.shared_groups <= self.n_layers // self.group_depth):
            raise QkvError(f"shared_groups={self.shared_groups} groups of group_depth={self.group_depth} layers must give "
                           f"n_layers={self.n_layers} blocks: group_depth dividing it, 1 to n_layers / group_depth "
                           "groups; fix the model's config")
        if any(not 0 <= i < self.n_layers for i in self.dense_layers):
            raise QkvError(f"dense_layers={list(self.dense_layers)} must be layers 0..{self.n_layers - 1}; "
                           "fix the model's config")
        for knob in ("embedding_multiplier", "residual_multiplier", "logit_scale", "ffn_gate_scale"):
            if not (0 < getattr(self, knob) < float("inf")):
                raise QkvError(f"{knob}={getattr(self, knob)} must be a positive finite number; fix the model's config")
        if self.scale_embedding and self.embedding_multiplier != 1:
            raise QkvError("scale_embedding (×√d_model) and embedding_multiplier are one factor: give one of them")
        if self.mask_dropout_id is not None and (self.pad_token_id is None
                                                 or not 0 <= self.mask_dropout_id < self.vocab_size):
            raise QkvError(f"mask_dropout_id={self.mask_dropout_id} must be a token id of the {self.vocab_size}-token "
                           "vocabulary, with a pad_token_id (ESM's mask_token_id); fix the model's config")
        if self.position_offset < 0:
            raise QkvError(f"position_offset={self.position_offset} must be ≥ 0; fix the model's config")
        if self.positions_from_ids and (self.pad_token_id is None or self.position_offset != self.pad_token_id + 1):
            raise QkvError(f"positions_from_ids needs pad_token_id and position_offset = pad_token_id + 1 "
                           f"(got {self.pad_token_id}, {self.position_offset}); fix the model's config")
        if self.embed_dim is not None and self.embed_dim <= 0:
            raise QkvError(f"embed_dim={self.embed_dim} must be positive (or none: d_model); fix the model's config")
        if self.image_size is not None:
            self._check_image()
        if self.pooling not in (None, "cls", "eos", "last", "probe"):
            raise QkvError(f"pooling={self.pooling!r} must be 'cls', 'eos', 'last', 'probe' or none; fix the model's config")
        if self.text_tower is not None and (self.image_size is None or self.text_tower.image_size is not None):
            raise QkvError("an image–text pair is an image tower's config holding a text tower's (text_tower); "
                           "fix the model's config")
        if self.layer_kinds is not None:
            self._check_layer_kinds()
        self._check_sparse()
        if self.mamba is not None and self.mamba.check(self):
            raise QkvError(f"{self.mamba.check(self)}; fix the model's config")
        if self.lightning is not None and self.lightning.check(self):
            raise QkvError(f"{self.lightning.check(self)}; fix the model's config")
        if self.delta is not None and self.delta.check(self):
            raise QkvError(f"{self.delta.check(self)}; fix the model's config")
        if self.audio_mels is not None and not (self.encoder_decoder and self.audio_mels > 0
                                                and (self.source_positions or 0) > 0):
            raise QkvError(f"an audio model needs an encoder–decoder, audio_mels={self.audio_mels} > 0 and "
                           f"source_positions={self.source_positions} > 0; fix the model's config")

    def _check_llama4(self) -> None:
        """Llama 4's knobs: chunked layers among the model's with a positive chunk, a positive temperature floor and
        a finite τ ≥ 0."""
        object.__setattr__(self, "chunked_layers", tuple(self.chunked_layers))
        if any(not 0 <= i < self.n_layers for i in self.chunked_layers) or (
                self.chunked_layers and not (isinstance(self.attention_chunk, int) and self.attention_chunk > 0)):
            raise QkvError(f"chunked_layers={self.chunked_layers} must be layers 0..{self.n_layers - 1}, with a "
                           f"positive attention_chunk (got {self.attention_chunk}); fix the model's config")
        if self.temperature_floor is not None and not (
                isinstance(self.temperature_floor, int) and self.temperature_floor > 0
                and math.isfinite(self.temperature_scale) and self.temperature_scale >= 0):
            raise QkvError(f"temperature_floor={self.temperature_floor} must be a positive whole number and "
                           f"temperature_scale={self.temperature_scale} a finite number ≥ 0; fix the model's config")

    def _check_layer_kinds(self) -> None:
        """Layers of different kinds: one known kind per layer, Mamba layers with cfg.mamba's sizes."""
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        if len(self.layer_kinds) != self.n_layers or not set(self.layer_kinds) <= set(LAYER_KINDS):
            raise QkvError(f"layer_kinds must give each of the {self.n_layers} layers one of {', '.join(LAYER_KINDS)}; "
                           "fix the model's config")
        if "mamba" in self.layer_kinds and self.mamba is None:
            raise QkvError("a stack with Mamba layers needs their sizes (mamba); fix the model's config")

    def layer_kind(self, layer: int) -> str:
        """LAYER's kind (LAYER_KINDS, "delta": a layer of cfg.delta, "lightning": one of cfg.lightning's): what its
        block has in attention's place."""
        if self.delta is not None and layer in self.delta.layers:
            return "delta"                               # Qwen3-Next's linear layers (core/delta.py)
        if self.lightning is not None and layer in self.lightning.linear_layers:
            return "lightning"                           # MiniMax's lightning layers (core/lightning.py)
        if self.layer_kinds is not None:
            return self.layer_kinds[layer]
        return "attention" if self.mamba is None else "mamba"

    @property
    def attention_layers(self) -> int:
        """How many layers attend (and keep K, V in a cache): every one, none in a Mamba stack, Jamba's "attention"."""
        return sum(self.layer_kind(i) == "attention" for i in range(self.n_layers))

    def _check_sparse(self) -> None:
        """Sparse attention's knobs: global tokens are distinct positions ≥ 0 of an encoder; BigBird's blocks are
        ≥ 1 token with r ≥ 0 random blocks, in an encoder."""
        object.__setattr__(self, "global_tokens", tuple(sorted({int(t) for t in self.global_tokens})))
        if self.global_tokens and (self.global_tokens[0] < 0 or self.causal):
            raise QkvError(f"global_tokens={list(self.global_tokens)} must be positions ≥ 0 of an encoder's input "
                           "(Longformer); fix the model's config")
        if self.block_sparse is not None:
            object.__setattr__(self, "block_sparse", tuple(self.block_sparse))
            b, r = (self.block_sparse + (0, 0))[:2]
            if len(self.block_sparse) != 2 or not (isinstance(b, int) and isinstance(r, int) and b >= 1 and r >= 0) \
                    or self.causal:
                raise QkvError(f"block_sparse={self.block_sparse} must be (a block size ≥ 1, random blocks ≥ 0) of an "
                               "encoder (BigBird); fix the model's config")

    def _check_router(self) -> None:
        """The router's knobs: a known score, groups that split the experts evenly into groups of two or more
        (a group's score is its two highest), enough kept groups for the k chosen, a positive scale."""
        E, G, kept = self.n_experts, self.expert_groups, self.expert_groups_kept
        if self.expert_group_score not in ("top2", "max"):
            raise QkvError(f"expert_group_score={self.expert_group_score!r} must be 'top2' or 'max'; fix the model's config")
        if self.router_score not in ("softmax", "sigmoid"):
            raise QkvError(f"router_score={self.router_score!r} must be 'softmax' or 'sigmoid'; fix the model's config")
        if not (isinstance(G, int) and isinstance(kept, int) and G >= 1 and E % G == 0 and (G == 1 or E // G >= 2)
                and 1 <= kept <= G and self.experts_per_token <= kept * (E // G)):
            raise QkvError(f"expert_groups={G} (kept {kept}) must split the {E} experts into equal groups of 2 or more, "
                           f"with {self.experts_per_token} experts chosen from the groups kept; fix the model's config")
        if not (0 < self.routed_scaling < float("inf") and 0 <= self.norm_top_k_min < float("inf")):
            raise QkvError(f"routed_scaling={self.routed_scaling} must be positive and norm_top_k_min="
                           f"{self.norm_top_k_min} ≥ 0, both finite; fix the model's config")

    def _check_latent(self) -> None:
        """Multi-head latent attention's knobs: a positive latent, RoPE on part of each head (the last
        rotary_dim numbers, as a plain pair layout or DeepSeek V3's de-interleaved one), one K/V per query head
        (the heads differ through W_KV_b), a positive value width and latent ε."""
        if not (self.kv_lora_rank > 0 and self.q_lora_rank >= 0 and self.position == "rope"
                and self.rotary_dim is not None and self.n_kv_heads == self.n_heads and (self.d_v or 0) > 0
                and math.isfinite(self.latent_norm_eps) and self.latent_norm_eps >= 0
                and not (self.rope_deinterleave and self.rope_interleaved)):
            raise QkvError(f"multi-head latent attention needs kv_lora_rank > 0 (got {self.kv_lora_rank}), q_lora_rank "
                           f"≥ 0, RoPE on rotary_dim numbers, n_kv_heads = n_heads, d_v > 0, a finite "
                           "latent_norm_eps ≥ 0 and one RoPE pair layout; fix the model's config")

    @property
    def latent(self) -> bool:
        """Whether attention is multi-head latent attention (MLA: DeepSeek V2/V3; latent.latent_attention)."""
        return self.kv_lora_rank > 0

    @property
    def d_value(self) -> int:
        """Each head's value width (V, Z): d_v (MLA), else d_head."""
        return self.d_v or self.d_head

    def _check_image(self) -> None:
        """An image model's sizes: whole positive pixels, patches that fit, one position per patch + [CLS]."""
        for knob in ("image_size", "patch_size"):
            v = getattr(self, knob)
            v = (v, v) if isinstance(v, int) else tuple(v or ())
            object.__setattr__(self, knob, v)
            if len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
                raise QkvError(f"{knob}={getattr(self, knob)} must be a positive number of pixels (or a height "
                               "and a width); fix the model's config")
        if not 1 <= self.num_channels <= 4:
            raise QkvError(f"num_channels={self.num_channels} must be 1 (grey) to 4; fix the model's config")
        rows, cols = self.grid
        if rows == 0 or cols == 0:
            raise QkvError(f"patch_size={self.patch_size} is larger than image_size={self.image_size}; "
                           "fix the model's config")
        if self.causal or self.encoder_decoder:
            raise QkvError("an image model is an encoder: causal and encoder_decoder must be false")

    @property
    def score_scale(self) -> float | None:
        """What S = Q·Kᵀ is multiplied by: None for the usual 1/√d_k (the fast kernels' own), else attn_scale,
        or 1.0 where the config folds the scale into W_Q (T5's scale_scores = False)."""
        if self.attn_scale is not None:
            return self.attn_scale
        return None if self.scale_scores else 1.0

    def window(self, layer: int) -> int | None:
        """The sliding window of LAYER's attention (query i sees keys i − w + 1 … i); None: full attention."""
        return self.sliding_window if self.layer_windows is None else self.layer_windows[layer]

    def encoder_config(self) -> "ModelConfig":
        """The knobs an encoder–decoder's encoder runs by: these, with its own windows (encoder_layer_windows) where
        it has them (T5Gemma's reach one further than the decoder's); without them, these."""
        if self.encoder_layer_windows is None:
            return self
        if not self.encoder_decoder:
            raise QkvError("encoder_layer_windows are an encoder–decoder's encoder's windows: they need "
                           "encoder_decoder; fix the model's config")
        return self.with_(layer_windows=self.encoder_layer_windows, encoder_layer_windows=None)

    def chunk(self, layer: int) -> int | None:
        """The chunk LAYER attends within (Llama 4's chunked layers: attention_chunk); None: none."""
        return self.attention_chunk if layer in self.chunked_layers else None

    def mask_kind(self, layer: int) -> tuple[int | None, int | None]:
        """What LAYER's mask depends on beside the input: (its sliding window, its chunk); one mask per kind a pass."""
        return self.window(layer), self.chunk(layer)

    def rope_kind(self, layer: int) -> str | None:
        """Which rotation LAYER's q, k get: "global", "local" (a windowed layer with its own RoPE base, Gemma 3)
        or None (no RoPE: SmolLM3's no_rope_layers, or a model without RoPE)."""
        if self.position != "rope" or layer in self.no_rope_layers:
            return None
        return "local" if self.local_rope_theta is not None and self.window(layer) is not None else "global"

    @property
    def context(self) -> int:
        """The longest input qkv runs or writes: max_positions, or factor × max_positions with dynamic NTK RoPE
        (its base grows past max_position_embeddings so that the model reads factor times as far)."""
        if self.position == "rope" and rope_kind(self.rope_scaling) == "dynamic":
            return int(self.max_positions * max(1.0, float(self.rope_scaling["factor"])))
        return self.max_positions

    @property
    def uniform_layers(self) -> bool:
        """Whether every layer attends with the same mask and rotation (one of each per pass)."""
        return (self.layer_windows is None and self.local_rope_theta is None and not self.no_rope_layers
                and not self.chunked_layers)

    @property
    def embed_scale(self) -> float | None:
        """What the looked-up rows E[ids] are multiplied by: √d_model with scale_embedding (Marian, Gemma),
        else embedding_multiplier (Granite); None when it is 1 (no product)."""
        if self.scale_embedding:
            return math.sqrt(self.d_model)
        return None if self.embedding_multiplier == 1 else self.embedding_multiplier

    @property
    def group_size(self) -> int:
        """How many query heads share one K/V head (1 = plain multi-head, H = MQA)."""
        return self.n_heads // self.n_kv_heads

    def with_(self, **changes) -> "ModelConfig":
        """A copy with some knobs changed."""
        return replace(self, **changes)
