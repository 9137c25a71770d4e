"""The parameters of a model, under the guide's names (STYLE habit 3).

Every matrix is stored the way the math multiplies it, `x · W`: W_Q is (d_model, H·d_k).
A loader may hand in transposed views of a checkpoint's (out, in) matrices; NumPy's
matmul passes those to BLAS without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Iterator

import numpy as np

from ..runtime.errors import QkvError

DTYPES = ("float32", "float64")          # what the engine computes in (bfloat16, float16: not yet)


def check_dtype(dtype) -> np.dtype:
    """float32 or float64 as a NumPy dtype; anything else (a name NumPy does not know such as bfloat16, an
    integer type, an object) one QkvError naming the choices."""
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):
        found = None
    if found is None or found.name not in DTYPES:
        raise QkvError(f"dtype {dtype!r:.40} is not supported; use one of {', '.join(DTYPES)}, or to load: "
                       "\"bfloat16\", \"float16\" or \"stored\" (the weights as the file holds them)")
    return found


@dataclass
class NormWeights:
    """γ and (for LayerNorm) β, each (d_model,).

    stored_offset: γ = the checkpoint's weight + this (Gemma's RMSNorm multiplies by 1 + w: 1.0), so the
    engine reads γ as every norm does and a checkpoint is written back as γ − offset; a gradient tree's
    NormWeights keep 0 (dγ = dw)."""

    weight: np.ndarray
    bias: np.ndarray | None = None
    stored_offset: float = 0.0


@dataclass
class AttentionWeights:
    """Q = X·W_Q, K = X·W_K, V = X·W_V (guide: qkv); output Concat(heads)·W_O (guide: heads)."""

    W_Q: np.ndarray                  # (d_model, H·d_k)
    W_K: np.ndarray                  # (d_model, Hkv·d_k)
    W_V: np.ndarray                  # (d_model, Hkv·d_k)
    W_O: np.ndarray                  # (H·d_k, d_model)
    b_Q: np.ndarray | None = None    # (H·d_k,)
    b_K: np.ndarray | None = None    # (Hkv·d_k,)
    b_V: np.ndarray | None = None    # (Hkv·d_k,)
    b_O: np.ndarray | None = None    # (d_model,)
    q_norm: NormWeights | None = None    # Norm of q before RoPE: weight (d_k,) shared by the heads (Qwen3, Phi), (H, d_k)
                                         # one of its own per head (StableLM) or (H·d_k,) the whole projection (OLMo 2)
    k_norm: NormWeights | None = None    # and of k: (d_k,), (Hkv, d_k) or (Hkv·d_k,)
    rel_bias: np.ndarray | None = None   # (buckets, H) this layer's own relative position bias (UMT5); None: the
                                         # stack's shared one (Weights.rel_bias, T5) or none
    sinks: np.ndarray | None = None      # (H,) each head's sink logit s_h (gpt-oss): it joins the softmax, A =
                                         # exp(S)/(Σ exp(S) + exp(s_h)), with no value; None: none (cfg.attn_sinks)
    # Multi-head latent attention (MLA, DeepSeek; cfg.kv_lora_rank, latent.latent_attention) reads X through the
    # same three: W_Q (d_model, H·d_k), or q's latent (d_model, r_q) with W_Q_b; W_K the RoPE key every head shares
    # (d_model, d_rot); W_V the K/V latent (d_model, r_kv), expanded per head by W_KV_b (b_K, b_V: their parts of
    # kv_a_proj's bias, b_Q q_a_proj's). None elsewhere.
    W_Q_b: np.ndarray | None = None            # (r_q, H·d_k) q = Norm(x·W_Q + b_Q)·W_Q_b
    q_latent_norm: NormWeights | None = None   # (r_q,) that Norm (RMSNorm, ε cfg.latent_norm_eps)
    kv_latent_norm: NormWeights | None = None  # (r_kv,) c = Norm(x·W_V + b_V)
    W_KV_b: np.ndarray | None = None           # (r_kv, H·(d_nope + d_v)) c·W_KV_b: each head's [K_nope | V]
    # DeBERTa's disentangled attention (cfg.disentangled, core/disentangled.py): the relative positions' keys K^r =
    # P·W_Kr + b_Kr (c2p) and queries Q^r = P·W_Qr + b_Qr (p2c); None: none, or W_K, W_Q serve (share_att_key)
    W_Kr: np.ndarray | None = None             # (d_model, H·d_k)
    b_Kr: np.ndarray | None = None             # (H·d_k,)
    W_Qr: np.ndarray | None = None             # (d_model, H·d_k)
    b_Qr: np.ndarray | None = None             # (H·d_k,)
    # Longformer's global attention (cfg.global_tokens): the global tokens' rows read Q_g = X·W_Qg + b_Qg against
    # K_g, V_g of every token (their own projections); None: none
    W_Qg: np.ndarray | None = None             # (d_model, H·d_k)
    b_Qg: np.ndarray | None = None             # (H·d_k,)
    W_Kg: np.ndarray | None = None             # (d_model, H·d_k)
    b_Kg: np.ndarray | None = None             # (H·d_k,)
    W_Vg: np.ndarray | None = None             # (d_model, H·d_k)
    b_Vg: np.ndarray | None = None             # (H·d_k,)
    W_G: np.ndarray | None = None              # (d_model, H·d_k) the output gate, Z_h ⊙ σ(X·W_G + b_G)_h before W_O
    b_G: np.ndarray | None = None              # (H·d_k,) (Qwen3-Next: cfg.attn_output_gate); None: none
    # Set by qkv.core.layout.fast_layout: [W_Q | W_K | W_V] side by side, (d_model, (H + 2·Hkv)·d_k),
    # so that one product gives Q, K and V; W_Q, W_K, W_V are then views of its columns.
    W_QKV: np.ndarray | None = None


@dataclass
class XIELUWeights:
    """An FFN's own xIELU scalars (Apertus; qkv.core.ops.xielu): a_p, a_n learned (α_p = softplus(a_p), α_n = β +
    softplus(a_n)); β, ε constants (transformers' buffers: never trained, no gradient)."""

    alpha_p: np.ndarray              # (1,)
    alpha_n: np.ndarray              # (1,)
    beta: np.ndarray | None = None   # () the slope β·x of both branches (None in a gradient tree)
    eps: np.ndarray | None = None    # () ε < 0: the negative branch's e^min(x, ε) (None in a gradient tree)


@dataclass
class FFNWeights:
    """FFN(x) = act(x·W_in + b_in)·W_out + b_out; gated: (act(x·W_gate + b_gate) ⊙ (x·W_in + b_in))·W_out + b_out."""

    W_in: np.ndarray                 # (d_model, d_ff)
    W_out: np.ndarray                # (d_ff, d_model)
    b_in: np.ndarray | None = None   # (d_ff,)
    b_out: np.ndarray | None = None  # (d_model,)
    W_gate: np.ndarray | None = None  # (d_model, d_ff), SwiGLU only
    b_gate: np.ndarray | None = None  # (d_ff,), its bias (Llama's mlp_bias); None: none
    # Set by qkv.core.layout.fast_layout (SwiGLU only): [W_gate | W_in], (d_model, 2·d_ff), one product
    # for both; W_gate and W_in are then views of its columns.
    W_gate_in: np.ndarray | None = None
    xielu: XIELUWeights | None = None   # the activation's own scalars (cfg.activation "xielu": Apertus); None: none


@dataclass
class MoEWeights:
    """A routed FFN (mixture of experts, Mixtral, Qwen2-MoE): p = softmax(x·W_router) over the E experts,
    the k highest chosen, out = Σ_j w_j·FFN_{e_j}(x) with w_j their probabilities (renormalised where
    the config says), + σ(x·W_shared_gate)·FFN_shared(x) where there is a shared expert (Qwen2-MoE)."""

    W_router: np.ndarray                       # (d_model, E)
    experts: list[FFNWeights]                  # E gated FFNs, each (d_model, d_expert) in, (d_expert, d_model) out
    shared: FFNWeights | None = None           # the shared expert (d_shared_expert wide); None: none
    W_shared_gate: np.ndarray | None = None    # (d_model, 1) its gate; None: the shared expert is added ungated
    b_choice: np.ndarray | None = None         # (E,) added to the scores for the choice of experts only (a constant:
                                               # never trained); None: none (cfg.expert_choice_bias)
    b_router: np.ndarray | None = None         # (E,) the router's bias, logits = x·W_router + b_router (gpt-oss);
                                               # None: none

    def ffns(self) -> list[FFNWeights]:
        """Every FFN inside: the experts, then the shared expert."""
        return self.experts + ([] if self.shared is None else [self.shared])


def ffns_of(ffn: "FFNWeights | MoEWeights") -> list[FFNWeights]:
    """The FFNs a block's FFN box holds: itself, or a routed FFN's experts (and shared expert)."""
    return ffn.ffns() if isinstance(ffn, MoEWeights) else [ffn]


@dataclass
class BlockWeights:
    """One transformer block: attention and FFN, each with its norm (before or after).

    A decoder block of an encoder–decoder also has a cross-attention between the two, whose
    W_Q reads the decoder's stream and W_K, W_V the encoder's output (guide: self-cross: "when the
    decoder writes 'I' it looks at '나는'").
    """

    attn_norm: NormWeights | None                # None: attention reads the stream itself (OLMo 2)
    attn: AttentionWeights
    ffn_norm: NormWeights | None                 # None: no norm before the FFN (OLMo 2); in a parallel block the
    ffn: FFNWeights | MoEWeights                 # FFN then reads attn_norm's output (Phi: one norm for both);
                                                 # MoEWeights: a routed FFN (a MoE layer)
    cross_attn: AttentionWeights | None = None   # encoder–decoder decoders: Q from here, K, V from the encoder
    cross_norm: NormWeights | None = None        # its norm (before or after, as the others)
    cross_out_norm: NormWeights | None = None    # Norm of its output before it joins the stream (T5Gemma)
    attn_out_norm: NormWeights | None = None     # Norm of attention's output before it joins the stream (OLMo 2)
    ffn_out_norm: NormWeights | None = None      # and of the FFN's
    conv: "ConvWeights | None" = None            # DeBERTa-v2's convolution beside its first layer (cfg.first_conv):
    conv_norm: NormWeights | None = None         # out = Norm(block(x) + act(conv(x))), this its norm; None: none


@dataclass
class ConvWeights:
    """A 1-D convolution over time as one product (Whisper's front end): the frames around each output step,
    kernel of them side by side, times W. Frame t of the output reads input frames t·stride − padding + j,
    j < kernel (zeros outside the input)."""

    W: np.ndarray                    # (kernel·C_in, C_out): row j·C_in + c is the file's weight[:, c, j]
    b: np.ndarray                    # (C_out,)
    kernel: int = 3
    stride: int = 1
    padding: int = 1


@dataclass
class PoolWeights:
    """A tower's pooling head (CLIP, SigLIP; cfg.pooling, core/pooling.py): the pooled row h → its embedding
    Norm?(h)·W_proj + b_proj; SigLIP's image: h = the probe's attention over every row, + MLP(LayerNorm(·))."""

    norm: NormWeights | None = None            # (d_model,) on the pooled row only (CLIP's image post_layernorm)
    W_proj: np.ndarray | None = None           # (d_model, p) the projection (text_projection, visual_projection,
    b_proj: np.ndarray | None = None           # (p,)          SigLIP's text head); None: the pooled row itself
    probe: np.ndarray | None = None            # (d_model,) the learned query of SigLIP's attention-pooling head
    probe_attn: AttentionWeights | None = None   # its attention (W_Q reads the probe, W_K, W_V the rows)
    probe_norm: NormWeights | None = None      # LayerNorm before its MLP
    probe_ffn: FFNWeights | None = None        # the MLP, added to the attention's output


@dataclass
class Weights:
    """Everything a forward pass reads: embeddings, L blocks, final norm, W_vocab."""

    tok_embed: np.ndarray                      # (V, d_model) the embedding table; (V, d_embed) with embed_in
    blocks: list[BlockWeights]
    pos_embed: np.ndarray | None = None        # (P, d_model) learned or sinusoidal positions
    type_embed: np.ndarray | None = None       # (T, d_model) BERT token types
    embed_norm: NormWeights | None = None      # BERT: LayerNorm after the embeddings
    W_embed: np.ndarray | None = None          # (E, d_model) ELECTRA: the embeddings projected to d_model after their norm
    b_embed: np.ndarray | None = None          # (d_model,)
    final_norm: NormWeights | None = None      # pre-norm models: before W_vocab
    W_head: np.ndarray | None = None           # (d_model, E) a masked-LM head's dense layer, before W_vocab
    b_head: np.ndarray | None = None           # (E,)
    head_norm: NormWeights | None = None       # its LayerNorm (after act(Z·W_head + b_head))
    W_vocab: np.ndarray | None = None          # (d_model, V); tied: tok_embedᵀ; (d_embed, V) with unembed_in; (E, V) after W_head
    embed_in: np.ndarray | None = None         # (d_embed, d_model) X = E[ids]·embed_in, before the positions (OPT-350m)
    unembed_in: np.ndarray | None = None       # (d_model, d_embed) Z·unembed_in after the final norm, before W_vocab
    b_vocab: np.ndarray | None = None          # (V,) Marian's and BART's final_logits_bias
    rel_bias: np.ndarray | None = None         # (buckets, H) T5: relative position bias, shared by the layers
    rel_embed: np.ndarray | None = None        # (2k, d_model) DeBERTa: the relative positions' table P, every layer's
    rel_norm: NormWeights | None = None        # its LayerNorm (norm_rel_ebd), applied before the layers read it
    front: list[ConvWeights] | None = None     # an audio encoder (Whisper): the convolutions from log-mel frames
                                               # (B, T, mels) to the stream, each followed by GELU
    W_patch: np.ndarray | None = None          # (C·p_h·p_w, d_model) an image model (ViT): each patch's pixels → its
    b_patch: np.ndarray | None = None          # (d_model,) token (the patch convolution as one product); tok_embed (1, d)
                                               # is then the [CLS] token
    pool: PoolWeights | None = None            # a tower's pooling head (CLIP, SigLIP: cfg.pooling); None: none
    W_contact: np.ndarray | None = None        # (L·H,) ESM's contact head: a logistic regression over every layer's
    b_contact: np.ndarray | None = None        # (1,)  heads' maps (analysis/contacts.py); None: none

    def astype(self, dtype) -> "Weights":
        """A copy with every array in `dtype` (float64 for checks)."""
        dtype = check_dtype(dtype)                      # a stored matrix: dequantised, then as the rest
        return _map_arrays(self, lambda a: a.astype(dtype), on_other=lambda m: np.asarray(m, dtype=dtype))

    def nbytes(self) -> int:
        """Bytes of all parameters, each counted once (a tied W_vocab, the views into W_QKV)."""
        total = 0
        seen: set[int] = set()

        def add(a: np.ndarray) -> np.ndarray:
            nonlocal total
            if id(a) not in seen:                        # an array several blocks read (ALBERT's layers): once
                seen.add(id(a))
                total += a.nbytes
            return a

        _map_arrays(self, add)
        stored = {}                                      # matrices kept as a GGUF file's blocks, each once
        _map_arrays(self, lambda a: a, on_other=lambda m: stored.setdefault(id(getattr(m, "matrix", m)), m) and m)
        total += sum(m.nbytes for m in stored.values())
        if isinstance(self.W_vocab, np.ndarray) and np.shares_memory(self.W_vocab, self.tok_embed):
            total -= self.W_vocab.nbytes
        for b in (b for b in self.blocks if b.attn is not None):     # (a Mamba block has no attention)
            parts = [(b.attn.W_QKV, (b.attn.W_Q, b.attn.W_K, b.attn.W_V))]
            parts += [(f.W_gate_in, (f.W_gate, f.W_in)) for f in ffns_of(b.ffn)]
            for fused, named in parts:
                if isinstance(fused, np.ndarray):
                    total -= fused.nbytes                # its columns are W_Q|W_K|W_V or W_gate|W_in
                elif fused is not None:                  # stored: the products read the joined blocks only
                    total -= sum(m.nbytes for m in named)
        return total


@dataclass
class Seq2SeqWeights:
    """An encoder–decoder's two stacks. They share one embedding table (encoder.tok_embed is
    decoder.tok_embed), or each has its own (BART, mBART, Pegasus with tie_word_embeddings false); only the
    decoder has W_vocab, and cross-attention in its blocks."""

    encoder: Weights
    decoder: Weights

    @property
    def tok_embed(self) -> np.ndarray:
        return self.encoder.tok_embed                # (V, d_model), both stacks'

    def astype(self, dtype) -> "Seq2SeqWeights":
        """A copy with every array in `dtype` (float64 for checks); a shared table stays shared."""
        dtype = check_dtype(dtype)
        enc, dec = self.encoder.astype(dtype), self.decoder.astype(dtype)
        if not np.shares_memory(self.encoder.tok_embed, self.decoder.tok_embed):
            return Seq2SeqWeights(enc, dec)                  # each stack's own table (and an untied W_vocab)
        table = self.tok_embed.astype(dtype)
        enc.tok_embed = dec.tok_embed = table
        if self.decoder.W_vocab is not None and np.shares_memory(self.decoder.W_vocab, self.tok_embed):
            dec.W_vocab = table.T
        return Seq2SeqWeights(enc, dec)

    def nbytes(self) -> int:
        """Bytes of all parameters, the shared table counted once."""
        enc, dec = self.encoder.tok_embed, self.decoder.tok_embed
        shared = enc.nbytes if np.shares_memory(enc, dec) else 0
        return self.encoder.nbytes() + self.decoder.nbytes() - shared


@dataclass
class PairWeights:
    """An image–text pair (CLIP, SigLIP): the two towers and the similarity's scalars, logits = e^s·cos (+ b)."""

    vision: Weights
    text: Weights
    logit_scale: np.ndarray                    # () s, the log of the cosine's scale
    logit_bias: np.ndarray | None = None       # () b (SigLIP); None: none (CLIP)

    @property
    def tok_embed(self) -> np.ndarray:
        return self.text.tok_embed

    def astype(self, dtype) -> "PairWeights":
        dtype = check_dtype(dtype)
        return PairWeights(self.vision.astype(dtype), self.text.astype(dtype), self.logit_scale.astype(dtype),
                           None if self.logit_bias is None else self.logit_bias.astype(dtype))

    def nbytes(self) -> int:
        return self.vision.nbytes() + self.text.nbytes() + self.logit_scale.nbytes + (
            0 if self.logit_bias is None else self.logit_bias.nbytes)


def leaves(obj, name: str = "weights") -> Iterator[tuple[str, object]]:
    """(where, leaf) for every array or other holder of numbers (a stored matrix) inside the nested weight dataclasses
    OBJ, in field order ("weights.blocks[0].attn.W_QKV"): the walk `_map_arrays` makes, without building a tree."""
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from leaves(item, f"{name}[{i}]")
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            yield from leaves(getattr(obj, f.name), f"{name}.{f.name}")
    elif obj is not None and hasattr(obj, "shape"):
        yield name, obj


def _map_arrays(obj, fn, on_other=None):
    """Apply fn to every array inside the nested weight dataclasses; returns the new tree. on_other: what
    becomes of anything else that holds numbers (a stored matrix); default: kept as it is."""
    if isinstance(obj, np.ndarray):
        return fn(obj)
    if isinstance(obj, list):
        return [_map_arrays(x, fn, on_other) for x in obj]
    if obj is None or not is_dataclass(obj):
        if on_other is not None and hasattr(obj, "shape"):
            return on_other(obj)
        return obj                                      # None, or a number (NormWeights.stored_offset)
    return type(obj)(**{f.name: _map_arrays(getattr(obj, f.name), fn, on_other) for f in fields(obj)})
