"""What the pipeline page receives: one forward pass, box by box, as one compact JSON object.

The page (`pipeline`, assets/pipeline.js) draws the model as its data flow (guide: tokens to logits):

    tokens → X = E[ids] (+ P) → L × [Norm → Q, K, V → S = Q·Kᵀ/√d_k → + M → A = softmax → Z = A·V
           → Concat·W_O → + residual → Norm → FFN → + residual] → final norm → logits → softmax(logits/T)

and opens each box to its real arrays for the chosen token, layer and head. Everything comes
from the engine's trace (`Model.run`, every INTERMEDIATE kept): what attention and the FFN read and
the stream between them are the pass's own records (attn_in, residual_mid, ffn_in, residual_out), never
made again here from the config's knobs.

To stay small on SmolLM2 (30 layers × 9 heads) at 128 tokens, the page keeps only what it shows:

    vector of d_model numbers   its length |x| (float32) and its first DIMS values (float32)
    per-head vector (q, k, v, z)  its length (float32) and its first HEAD_DIMS values (float16)
    A (L, H, n, n)              one byte per weight, as the attention viewer (±0.002, `payload`)
    S (L, H, n, n)              one byte per score (`pipeline_scores`): code 0 = masked (−∞), else
                                S = lo + (code − 1)·step with step = (hi − lo)/254 per (layer, head),
                                so within step/2 of the engine's float32 score (lo and step to float32's
                                precision, as short decimals, and the codes made with exactly those)
    logits (V,)                 the last position's, whole vocabulary, float32 (decoders): the page
                                computes softmax(logits/T), top-k and top-p exactly as qkv.writing.sampling

Arrays travel as `wire` arrays, {"dtype": "f32" | "f16" | "u8", "shape", "data": base64(zlib(little-endian
bytes))} (A with its "scale": 255, as the viewer's).

    {"version": 1, "kind": "pipeline", "title", "model", "family", "text", "lang": "en" | "ko",
     "tokens", "labels": [str] (n), "ids": [int] (n),
     "arch": {d_model, L, H, H_kv, G, d_k, d_ff, V, norm, norm_place, position, activation, gated,
              causal, encoder, eps, scale, final_norm, seq2seq, L_dec, encoder_final_norm, d_embed,
              qk_norm_per_head, embed_norm, position_bias},
     "dims": DIMS, "head_dims": HEAD_DIMS, "start": {"layer", "head", "box": str | null}  (what opens first),
     "stream": {"norm" (L+1, n), "first" (L+1, n, DIMS)}   entering each block; row L: after the last
     "blocks": {name: {"norm" (L, n), "first" (L, n, DIMS)}} for attn_in, attn_out, mid, ffn_in, ffn_out
     "final": {"norm" (n,), "first" (n, DIMS)}             the final hidden states (after the final norm)
     "heads": {q, z: {"norm" (L, H, n), "first" (L, H, n, HEAD_DIMS)}; k, v: (L, H_kv, …)},
     "attention": u8 (L, H, n, n) scale 255, the viewer's (`payload.encode_attention`),
     "scores": {"shape", "lo" [[float]] (L × H), "step" [[float]] (L × H), "data" (u8 array)},
     "output": {"position", "logits" (V,) f32, "top_ids": [int] (TOP), "top_labels": [str] (TOP)} | null,
     "pooled": {"norm", "first" (DIMS,), "unit_first" (DIMS,)} | null   (encoders: mean pooling)
     "arithmetic": {"layers": [int], "q" (l, H, n, d_k), "k", "v" (l, H_kv, m, d_k), "z" (l, H, n, d_k),
                    "scores" (l, H, n, m) with −∞ where masked, "weights" (l, H, n, m), all f32 as the engine's,
                    "bias" (l, H, n, m) f32 | null, "sinks" (l, H) f32 | null (each head's sink logit, gpt-oss: one
                    more term of A's softmax, with no value)}   the attention diagram's cells, whole, for the LAYERS
                    it holds
     "text_en", "text_ko": {key: template}   the page's words (`pipeline_text`: `qkv explain`'s where they fit)}

The diagram (Q × Kᵀ = S → softmax → A, A × V = Z) recomputes any hovered cell from "arithmetic": S[i, j] as
Σ_d q_i[d]·k_j[d] × scale (soft-capped, + bias: ALiBi's or T5's, S minus the rest as the engine added it),
A[i, j] as exp(S[i, j] − max) / Σ, Z[i, c] as Σ_j A[i, j]·v_j[c], each beside the engine's value. Whole
arrays of every layer would be L·(2H·n·d_k + 2H_kv·m·d_k + 2H·n·m) floats: the payload keeps the start
layer's and as many neighbours' as fit in ARITHMETIC_MB (SmolLM2: all 30 layers up to 16 tokens, 2 at 128).

A stack with layers of other kinds (a scan, a linear attention) has, besides, "mixers": each such layer's own steps,
as the pass recorded them (`pipeline_mixer`'s module doc: the fields, what its trace keeps).

An encoder–decoder's payload has, instead of the one stack's fields (tokens … scores), "seq2seq": true,
"target": str and "stacks": {"encoder": {tokens, labels, ids, L, causal, stream, blocks, final, heads,
attention, scores}, "decoder": {the same, its blocks with cross_in, cross_out, mid2 too, and "cross":
{heads (k, v over the source tokens), attention (L, H, n, n_src), scores, source_labels}}}; "output"
is the decoder's last position.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.capabilities import require
from ..core.positions import alibi_slopes
from ..runtime.errors import QkvError
from ..writing.nexttoken import mask_position, token_text
from ..core.trace import DEFAULT_KEEP, MIXER, Trace
from .payload import encode_attention, page_title
from .pipeline_mixer import (arch_entries, attention_layers, check_kept, has_mixers, mixer_arrays, page_reads,
                             softmax_layer)
from .pipeline_scores import decode_scores, encode_scores  # noqa: F401  (decode_scores: the page's S, read back)
from .pipeline_text import TEXTS
from .wire import encode

DIMS = 4                    # first values shown of each d_model vector
HEAD_DIMS = 4               # first values shown of each per-head vector (q, k, v, z)
TOP = 100                   # vocabulary entries spelled for the output list (the most probable first)
MAX_TOKENS = 512            # longest text one page holds (its S and A are L·H·n² bytes each)
ARITHMETIC_MB = 4           # float32 q, k, v, z, S, A kept whole for the diagram's arithmetic: as many layers as fit
# What the page reads of each layer's trace (Model.run keeps them without keep=), and of a cross-attention's
SHOWN = ("residual", "attn_in", "q", "k", "v", "scores", "attentions", "heads", "attn_out", "residual_mid", "ffn_in",
         "ffn_out", "residual_out")
CROSS_SHOWN = ("residual", "attn_in", "q", "k", "v", "scores", "attentions", "heads", "attn_out")
PIPELINE_KEEP = (*DEFAULT_KEEP, *MIXER)     # what a trace for the page keeps: Model.run's, and a scan's own steps
BOXES = ("tokens", "embed", "norm1", "qkv", "qknorm", "rope", "gqa", "scores", "alibi", "softcap", "mask", "attn", "z",
         "out", "res1", "router",                                       # a family's own: q/k norm … the MoE router
         "xnorm", "xqkv", "xattn", "xz", "xout", "xres",                # a decoder's cross-attention (encoder–decoders)
         "mix_x", "mix_qkv", "mix_dt", "mix_bc", "mix_matrix", "mix_out",   # a scan's, a linear attention's steps
         "norm2", "ffn", "res2", "final", "logits", "probs", "hidden", "pooled", "stream")   # the page's boxes (pipeline.js)


def summary(x: np.ndarray, k: int, dtype: str = "f32") -> dict:
    """(..., d) vectors → their lengths (float32) and first k values (`dtype`)."""
    x = np.asarray(x, dtype=np.float32)
    return {"norm": encode(np.linalg.norm(x.astype(np.float64), axis=-1), "f32"),
            "first": encode(x[..., :k], dtype)}


def block_vectors(trace: Trace, cross: Trace | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The residual stream (L+1, n, d_model) and what each block reads and adds (L, n, d_model) each, as the pass
    recorded them (qkv.core.trace.INTERMEDIATES), whatever the block's layout:

        attn_in   what attention read (Norm(X) pre-norm, X post-norm)     attn_out, ffn_out   what joined the stream
        mid       the stream after attention (residual_mid)               ffn_in              what the FFN read
    A decoder with cross-attention (CROSS, its trace) has one more step after mid: mid is then the stream its
    cross-attention starts from (the cross trace's residual), cross_in what it read, cross_out what it added,
    mid2 the stream after it (residual_mid), which the FFN's step starts from. The stream's rows 0..L-1 are
    the blocks' residuals, row L the last block's residual_out. A block without an FFN (Mamba's) reads nothing:
    ffn_in zeros, ffn_out the 0 it records."""
    out: dict[str, list] = {}
    L = len(trace.layers)
    for i in range(L):
        t = trace.layers[i]
        values = {"attn_in": t.attn_in, "attn_out": t.attn_out, "mid": t.residual_mid}
        if cross is not None:
            c = cross.layers[i]
            values.update(mid=c.residual, cross_in=c.attn_in, cross_out=c.attn_out, mid2=t.residual_mid)
        values.update(ffn_in=t.ffn_in if t.ffn_in is not None else np.zeros_like(t.residual),   # a Mamba stack: no
                      ffn_out=t.ffn_out)                                                          # FFN to read it
        for name, value in values.items():
            out.setdefault(name, []).append(value)
    stream = [trace.layers[i].residual for i in range(L)] + [trace.layers[L - 1].residual_out]
    return np.stack(stream), {name: np.stack(v) for name, v in out.items()}


def head_arrays(layers: list) -> dict:
    """q, z (L, H, n, d_k) and k, v (L, H_kv, n_k, d_k) of the kept layers, summarised (module doc)."""
    return {name: summary(np.stack([getattr(t, field) for t in layers]), HEAD_DIMS, "f16")
            for name, field in (("q", "q"), ("k", "k"), ("v", "v"), ("z", "heads"))}


def arithmetic_layers(per_layer: int, L: int, center: int, budget: int) -> list[int]:
    """The layers whose whole arrays fit in BUDGET bytes at PER_LAYER each: CENTER first, then its neighbours
    outward (center + 1, center − 1, …); always CENTER itself."""
    order = sorted(range(L), key=lambda i: (abs(i - center), i < center))
    return sorted(order[:max(1, min(L, budget // max(1, per_layer)))])


def arithmetic_arrays(cfg, layers: list, center: int, *, bias: bool = False, cap: float | None = None,
                      sinks: np.ndarray | None = None) -> dict:
    """What the attention diagram recomputes its hovered cells from (module doc: "arithmetic"), for the layers
    around CENTER that fit in ARITHMETIC_MB. BIAS: the scores carry a position bias (ALiBi, T5), kept as
    S − cap(scale·q·kᵀ) where S is finite (0 where masked); CAP: the scores' soft-cap (Gemma 2); SINKS: (L, H)
    each layer's sink logits (gpt-oss), or None."""
    t0 = layers[0]
    H, n, dk = t0.q.shape
    Hkv, m, _ = t0.k.shape
    per_layer = 4 * (2 * H * n * dk + 2 * Hkv * m * dk + (3 if bias else 2) * H * n * m)
    keep = arithmetic_layers(per_layer, len(layers), center, ARITHMETIC_MB << 20)
    pick = lambda field: np.stack([getattr(layers[i], field) for i in keep]).astype(np.float32)   # noqa: E731
    out = {"layers": keep, **{name: encode(pick(field), "f32") for name, field in
                              (("q", "q"), ("k", "k"), ("v", "v"), ("z", "heads"), ("scores", "scores"),
                               ("weights", "attentions"))}, "bias": None,
           "sinks": None if sinks is None else encode(np.asarray(sinks, np.float32)[keep], "f32")}   # (l, H)
    if bias:
        scale = cfg.score_scale or 1 / math.sqrt(dk)
        G = H // Hkv
        rows = []
        for i in keep:
            t = layers[i]
            raw = np.einsum("hnd,hmd->hnm", t.q.astype(np.float64), np.repeat(t.k, G, axis=0).astype(np.float64)) * scale
            if cap:
                raw = cap * np.tanh(raw / cap)
            s = t.scores.astype(np.float64)
            rows.append(np.where(np.isfinite(s), s - raw, 0.0))
        out["bias"] = encode(np.stack(rows), "f32")                              # (l, H, n, m)
    return out


def stack_arrays(cfg, blocks, trace: Trace, cross: Trace | None = None, center: int = 0, bias: bool = False,
                 mixers: bool = False) -> dict:
    """One stack's part of the payload: its tokens, stream, block vectors, heads, A and S (and cross), and the
    whole arrays of the layers around CENTER for the diagram's arithmetic (BIAS: the scores carry a position bias;
    MIXERS: the layers of a scan or a linear attention carry their own steps, `pipeline_mixer`)."""
    stream, vectors = block_vectors(trace, cross)                               # (L+1, n, d), {name: (L, n, d)}
    layers = attention_layers(cfg, trace, len(blocks), mixers)
    out = {
        "tokens": [str(t) for t in trace.tokens], "labels": trace.labels, "ids": [int(i) for i in trace.ids],
        "L": len(blocks), "causal": bool(trace.causal),
        "stream": summary(stream, DIMS),
        "blocks": {name: summary(v, DIMS) for name, v in vectors.items()},
        "final": summary(trace.hidden, DIMS),
        "heads": head_arrays(layers),
        "attention": encode_attention(np.stack([t.attentions for t in layers])),    # (L, H, n, n)
        "scores": encode_scores(np.stack([t.scores for t in layers])),             # (L, H, n, n)
        "arithmetic": arithmetic_arrays(cfg, layers, center, bias=bias, cap=cfg.attn_softcap,
                                        sinks=np.stack([b.attn.sinks for b in blocks]) if cfg.attn_sinks else None),
    }
    if mixers:                                                                  # Mamba, Qwen3-Next, MiniMax, …
        out["mixers"] = mixer_arrays(cfg, blocks, trace, center, HEAD_DIMS)
    if any(t.experts is not None for t in layers):                              # a mixture of experts' router
        out["router"] = [None if t.experts is None else
                         {"experts": [[int(e) for e in row] for row in t.experts],               # (n, k)
                          "weights": [[round(float(x), 6) for x in row] for row in t.expert_weights]}
                         for t in layers]
    if cross is not None:
        xl = [cross.layers[i] for i in range(len(blocks))]
        out["cross"] = {"heads": head_arrays(xl), "source_labels": cross.key_labels,
                        "attention": encode_attention(np.stack([t.attentions for t in xl])),   # (L, H, n, n_src)
                        "scores": encode_scores(np.stack([t.scores for t in xl])),            # (L, H, n, n_src)
                        "arithmetic": arithmetic_arrays(cfg, xl, center)}
    return out


def is_seq2seq(model) -> bool:
    return bool(getattr(model.config, "encoder_decoder", False))


def check_trace(model, trace: Trace) -> None:
    """The trace must hold every intermediate of every layer, from this model (one clear error if not)."""
    cfg = model.config
    if is_seq2seq(model):
        if trace.cross is None or trace.encoder is None:
            raise QkvError(f"{model.name} is an encoder–decoder: give the trace of model.run(source)")
        for part, L in ((trace.encoder, cfg.n_layers), (trace, cfg.n_decoder_layers), (trace.cross, cfg.n_decoder_layers)):
            names = CROSS_SHOWN if part is trace.cross else SHOWN
            if len(part.layers) != L or any(getattr(t, name) is None for t in part.layers.values() for name in names):
                raise QkvError("the pipeline page needs every intermediate of every layer; make the trace with "
                               "model.run(source) (no keep=)")
        return
    if trace.cross is not None:
        raise QkvError(f"this is an encoder–decoder's trace but {model.name} has one stack; use the same model")
    require(cfg, model.name, "the pipeline page", {"pipeline"}, instead="read its attention in the viewer (qkv show "
            "--out DIR)")                       # every kind draws its steps (core/capabilities.py)
    missing = [i for i in range(cfg.n_layers) if i not in trace.layers
               or any(getattr(trace.layers[i], name) is None for name in page_reads(cfg, i, SHOWN))]
    check_kept(model, trace, missing)                                      # a scan's or linear attention's steps
    if missing or trace.head_ids is not None:
        raise QkvError("the pipeline page needs every intermediate of every layer and head; "
                       "make the trace with model.run(text) (no layers=, keep= or heads=)")
    n = len(trace.tokens)
    first = trace.layers[0]
    heads = softmax_layer(cfg, trace)                                       # whose q, k, v the page shows
    vocab = None if trace.logits is None else trace.logits.shape[-1]
    if (first.residual.shape != (n, cfg.d_model) or first.attentions.shape[0] != cfg.n_heads
            or heads is not None and (heads.q.shape[0] != cfg.n_heads or heads.k.shape[0] != cfg.n_kv_heads)
            or len(trace.layers) != cfg.n_layers
            or vocab != (None if model.weights.W_vocab is None else model.weights.W_vocab.shape[1])):
        raise QkvError(f"this trace does not come from {model.name} (its sizes differ); run the text "
                       "through the same model")
    if n > MAX_TOKENS:
        raise QkvError(f"the text has {n} tokens; the pipeline page holds at most {MAX_TOKENS}: shorten it")


def _alibi_slopes(c) -> list[float] | None:
    """ALiBi's slope of each head as the scores get it (S += m_h·p_j; Falcon's already × the score scale);
    None without ALiBi."""
    if c.position != "alibi":
        return None
    slopes = alibi_slopes(c.n_heads).astype(np.float64)
    if c.alibi_scaled:
        slopes = slopes * (c.score_scale or 1 / math.sqrt(c.d_head))
    return [float(m) for m in slopes]


def arch_of(model) -> dict:
    """The knobs and sizes the page names (the guide's letters)."""
    c, w = model.config, model.weights
    last = getattr(w, "decoder", w)                                 # the stack that ends in W_vocab, if any
    d_k = c.d_head or c.d_model // c.n_heads
    return {"d_model": c.d_model, "L": c.n_layers, "H": c.n_heads, "H_kv": c.n_kv_heads,
            "G": c.n_heads // c.n_kv_heads, "d_k": d_k, "d_ff": c.d_ff, "V": c.vocab_size, "norm": c.norm,
            "norm_place": c.norm_place, "position": c.position, "activation": c.activation,
            "gated": bool(c.gated_ffn), "causal": bool(c.causal), "encoder": last.W_vocab is None,
            "eps": float(f"{c.norm_eps:.6g}"), "scale": c.score_scale,   # ε: a float32 file's 9.99999974e-06 is 1e-05
            "rope_interleaved": bool(c.rope_interleaved),             # RoPE pairs (2i, 2i+1): GPT-J, Cohere
            "multipliers": {"embedding": c.embed_scale or 1.0, "residual": c.residual_multiplier,
                            "logits": c.logit_scale},                 # X = E·m, x + out·m, logits·s (Granite, Cohere)
            # the family's own boxes: a parallel residual (GPT-NeoX, Phi, GPT-J, Cohere), q/k norms (Qwen3, OLMo 2:
            # "head" or "all"), norms after each box (OLMo 2, Gemma 2/3), each layer's window, RoPE's rotary width
            "parallel": bool(c.parallel_residual), "qk_norm": c.qk_norm,
            "out_norms": any(b.attn_out_norm is not None for b in getattr(last, "blocks", ())),
            "layer_windows": [c.window(i) for i in range(c.n_layers)] if c.causal and not is_seq2seq(model) else None,
            "layer_chunks": [c.chunk(i) for i in range(c.n_layers)] if c.chunked_layers else None,   # Llama 4
            "rope_kinds": [c.rope_kind(i) for i in range(c.n_layers)], "rotary_dim": c.rotary_dim,
            # multi-head latent attention (DeepSeek): K, V from a latent per token (core/latent.py); None: plain
            "latent": {"r_kv": c.kv_lora_rank, "r_q": c.q_lora_rank, "d_v": c.d_value} if c.latent else None,
            "rope_theta": c.rope_theta,
            **arch_entries(c, is_seq2seq(model)),                     # layers of other kinds (Mamba, Qwen3-Next, …)
            "alibi": _alibi_slopes(c),
            "final_norm": last.final_norm is not None, "seq2seq": is_seq2seq(model),
            "L_dec": c.n_decoder_layers if is_seq2seq(model) else None,
            "encoder_final_norm": w.encoder.final_norm is not None if is_seq2seq(model) else None,
            # OPT-350m: the table's width, mapped to d_model and back (None: d_model); StableLM: a q/k norm per head
            "d_embed": c.d_embed,
            "qk_norm_per_head": any(getattr(b.attn, "q_norm", None) is not None and b.attn.q_norm.weight.ndim == 2
                                    for b in getattr(last, "blocks", ())),          # (b.attn None: a Mamba block)
            "embed_norm": getattr(w, "encoder", w).embed_norm is not None,            # BERT, BART, mBART
            "position_bias": position_bias_of(w),
            # layers of different kinds (Gemma 2/3, GPT-Neo, SmolLM3, Qwen's sliding layers): each layer's window
            # (None: full), the layers without RoPE, the sliding layers' own RoPE base; Gemma 2's soft-caps
            "windows": [c.window(i) for i in range(c.n_layers)] if not c.uniform_layers else None,
            "no_rope_layers": list(c.no_rope_layers), "local_rope_theta": c.local_rope_theta,
            "attn_softcap": c.attn_softcap, "final_softcap": c.final_softcap,
            # the encoders after BERT: a masked-LM head before W_vocab, E-wide embeddings projected to d_model
            # (ELECTRA), positions counted over the non-pad ids (RoBERTa)
            "mlm_head": getattr(last, "W_head", None) is not None, "embed_dim": c.embed_dim,
            "positions_from_ids": bool(c.positions_from_ids),
            # a mixture of experts (Mixtral, Qwen2-MoE): its routed FFN's router; None for a dense model
            "moe": None if not c.n_experts else {
                "experts": c.n_experts, "k": c.experts_per_token, "renormalised": c.norm_top_k,
                "d_expert": c.d_expert or c.d_ff, "shared": c.d_shared_expert or None,
                "dense_layers": list(c.dense_layers),
                # DeepSeek-V3's router (dots1), Ernie 4.5's: σ scores, a choice bias, groups, a scale, no shared gate
                "score": c.router_score, "choice_bias": c.expert_choice_bias, "groups": c.expert_groups,
                "groups_kept": c.expert_groups_kept, "scale": c.routed_scaling, "shared_gated": c.shared_expert_gate}}


def position_bias_of(weights) -> str | None:
    """T5's learned bias on the scores: "shared" (one table per stack, T5, mT5), "per_layer" (UMT5), None."""
    stack = getattr(weights, "encoder", weights)
    if stack.rel_bias is not None:
        return "shared"
    first = stack.blocks[0].attn if stack.blocks else None                 # None: a Mamba block's (no attention)
    return "per_layer" if first is not None and first.rel_bias is not None else None


def output_payload(model, trace: Trace) -> dict | None:
    """The last position's logits (V,) float32 and the TOP most probable tokens spelled (a masked-LM encoder's:
    its first mask token's, if the text has one); None for encoders without an LM head."""
    if trace.logits is None:
        return None
    at = mask_position(model, trace.ids) if not model.config.causal else None
    at = len(trace.tokens) - 1 if at is None else at
    z = np.asarray(trace.logits[at], dtype=np.float32)                          # (V,)
    top = np.lexsort((np.arange(len(z)), -z.astype(np.float64)))[:TOP]          # by logit, lower id first
    labels = [token_text(model.tokenizer, int(i)) if model.tokenizer is not None else str(int(i)) for i in top]
    return {"position": at, "logits": encode(z, "f32"),
            "top_ids": [int(i) for i in top], "top_labels": labels}


def pooled_payload(trace: Trace) -> dict:
    """Mean pooling of the final hidden states (what sentence-transformers does for MiniLM), and its unit vector."""
    mean = trace.hidden.astype(np.float64).mean(axis=0)                         # (d_model,)
    length = float(np.linalg.norm(mean))
    return {"norm": length, "first": [float(x) for x in mean[:DIMS].astype(np.float32)],
            "unit_first": [float(x) for x in (mean / length)[:DIMS].astype(np.float32)] if length else None}


def words() -> dict:
    """{"text_en": {...}, "text_ko": {...}}: the page's sentences in both languages (`pipeline_text`)."""
    return {f"text_{lang}": dict(texts) for lang, texts in TEXTS.items()}


def pipeline_payload(model, trace: Trace, *, title: str | None = None, lang: str = "en", layer: int = 0,
                     head: int = 0, box: str | None = None) -> dict:
    """The JSON object of the pipeline page for TRACE (`model.run(text)`) of MODEL (module doc).

    lang: the page's first language ("en" or "ko"; it has a toggle); layer, head, box: what it opens
    first (negative layers count from the end; box: one of BOXES, default the output end)."""
    if lang not in TEXTS:
        raise QkvError(f"unknown language {lang!r}; choose from {sorted(TEXTS)}")
    if box is not None and box not in BOXES:
        raise QkvError(f"unknown box {box!r}; choose from {', '.join(BOXES)}")
    check_trace(model, trace)
    cfg = model.config
    layer, head = model.check_layer(layer), model.check_head(head)
    if title is None:
        title = page_title(model.name, trace.encoder.text if trace.encoder is not None else trace.text)
    top = {"version": 1, "kind": "pipeline", "title": title or "pipeline", "model": model.name, "family": cfg.family,
           "lang": lang, "arch": arch_of(model), "dims": DIMS, "head_dims": HEAD_DIMS,
           "start": {"layer": layer, "head": head, "box": box}, "output": output_payload(model, trace), **words()}
    bias = (cfg.position == "alibi" or position_bias_of(model.weights) is not None   # what S adds to q·k·scale
            or cfg.disentangled is not None)                                          # (DeBERTa: c2p + p2c)
    if is_seq2seq(model):                      # two stacks: the source through the encoder, the target through the decoder
        w = model.weights
        return {**top, "seq2seq": True, "text": trace.encoder.text, "target": model.tokenizer.decode(
                    [int(i) for i in trace.ids[1:]], skip_special_tokens=True) if model.tokenizer else None,
                "pooled": None, "stacks": {
                    "encoder": stack_arrays(cfg, w.encoder.blocks, trace.encoder, center=min(layer, cfg.n_layers - 1),
                                            bias=bias),
                    "decoder": stack_arrays(cfg, w.decoder.blocks, trace, trace.cross,
                                            center=min(layer, cfg.n_decoder_layers - 1), bias=bias)}}
    return {**top, "text": trace.text, **stack_arrays(cfg, model.weights.blocks, trace, center=layer, bias=bias,
                                                     mixers=has_mixers(cfg)),
            "pooled": pooled_payload(trace) if trace.logits is None else None}
