"""Direct logit attribution: how much each head and each FFN writes, directly, into one logit.

    direct_logit_attribution   text or ids, a target token (and another) → Attribution:
                               (L, H) heads, (L,) FFNs, and the terms that are neither
    attribution_of_trace       the same, from a trace that kept KEEP
    token_id                   a token given as text (one token exactly) or as an id

(its figure, layers × heads: `viz.interpret_figures.attribution_figure`)

The residual stream at the last block's output is a sum of pieces,

    x_L = embeddings + Σ_l (Σ_h Z_h·W_O[h] + b_O) + Σ_l (FFN_l − b_out + b_out),

(an encoder–decoder's decoder adds its cross-attention heads the same way, `Attribution.cross`),

and the logit is Norm(x_L)·W_vocab[:, t] (+ b_vocab[t]). With the norm's scale s (its √(mean x²
+ eps), or for LayerNorm √(var + eps)) frozen at its value on the full x_L, as TransformerLens
does, Norm is linear in x_L, so each piece's part is piece·u with u = γ ⊙ W_vocab[:, t] / s
(LayerNorm centres each piece first: piece·(u − mean u)). The parts sum to the logit up to
the final norm's β and b_vocab, reported with the other terms; the tests check that they do.
x_L and s are read from the trace as the pass recorded them (the last layer's residual_out and
final_norm_scale), and what a head's or bias's piece adds to the stream is the core's `joined`
(Granite: × its residual multiplier). A logit scale (Cohere, Granite: logits × s) scales W_vocab's column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..core.capabilities import require
from ..core.layer import joined

if TYPE_CHECKING:
    from ..models.model import Model
    from ..core.trace import Trace

KEEP = ("residual", "heads", "attn_out", "ffn_out", "residual_out", "final_norm_scale")   # what a trace must keep


@dataclass
class Attribution:
    """Each component's direct part of one logit (or logit difference) at one position."""

    heads: np.ndarray              # (L, H) head h of layer l: Z_h·W_O[h rows]·u
    ffns: np.ndarray               # (L,) FFN output without its output bias b_out
    rest: dict[str, float]         # embeddings, b_O, b_out, final norm β, b_vocab (absent ones 0)
    logit: float                   # the model's own logit (difference) at that position
    target: int
    other: int | None
    position: int                  # 0..n-1
    scale: float                   # the final norm's frozen scale s
    cross: np.ndarray | None = None   # (L, H) an encoder–decoder's cross-attention heads; None: a decoder

    def total(self) -> float:
        """Σ heads (+ Σ cross heads) + Σ FFNs + Σ rest: equals `logit` up to rounding."""
        cross = 0.0 if self.cross is None else self.cross.sum()
        return float(self.heads.sum() + cross + self.ffns.sum() + sum(self.rest.values()))

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The k heads of largest |contribution|: (layer, head, contribution), largest first."""
        order = np.argsort(-np.abs(self.heads), axis=None)[:k]
        return [(int(i // self.heads.shape[1]), int(i % self.heads.shape[1]), float(self.heads.flat[i]))
                for i in order]


def check_attribution(model: "Model") -> None:
    """Attribution reads through W_vocab: an encoder without an LM head has no logit to explain."""
    if model.weights.W_vocab is None:
        raise QkvError(f"{model.name} has no LM head (W_vocab), so it has no logits to attribute; "
                       "direct logit attribution needs a decoder, e.g. --model smollm2")


def token_id(model: "Model", token: str | int) -> int:
    """A token given as an id, or as text that must be exactly one token (" Mary", with its space)."""
    if isinstance(token, (int, np.integer)):
        i = int(token)
        V = model.weights.W_vocab.shape[1]
        if not 0 <= i < V:
            raise QkvError(f"token id {i} is outside {model.name}'s vocabulary (0..{V - 1})")
        return i
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json; give the target as a token id")
    if not isinstance(token, str) or token == "":
        raise QkvError("the target token is empty; give one token, e.g. ' Mary' (with its leading space)")
    ids, _ = model.tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        parts = " + ".join(repr(model.tokenizer.decode([int(i)])) for i in ids)
        raise QkvError(f"{token!r} is {len(ids)} tokens for {model.name} ({parts}), not one; "
                       "give a single token (a leading space often matters)")
    unk = model.tokenizer.unk_id
    if unk is not None and int(ids[0]) == unk and token != model.tokenizer.id_to_token(unk):
        raise QkvError(f"{token!r} is not in {model.name}'s vocabulary (it reads as {model.tokenizer.id_to_token(unk)}); "
                       "give a token it has (its case and spacing matter)")
    return int(ids[0])


def _direction(model: "Model", target: int, other: int | None) -> tuple[np.ndarray, float]:
    """(W_vocab[:, t] − W_vocab[:, o] (float64, (d_model,)), b_vocab[t] − b_vocab[o])."""
    W, b = model.weights.W_vocab, model.weights.b_vocab
    w = W[:, target].astype(np.float64)
    bias = 0.0 if b is None else float(b[target])
    if other is not None:
        w = w - W[:, other]
        bias -= 0.0 if b is None else float(b[other])
    return w, bias


def attribution_of_trace(model: "Model", trace: "Trace", target: int, other: int | None = None,
                         position: int = -1) -> Attribution:
    """The direct logit attribution of a trace that kept KEEP (see `direct_logit_attribution`)."""
    check_attribution(model)
    cfg, weights = model.config, model.weights
    require(cfg, model.name, "direct logit attribution", {"sum_of_boxes"},   # Mamba, delta, lightning: refused
            instead="patch its heads (qkv patch) or read the logit lens (qkv lens)")
    if cfg.norm_place == "post":
        raise QkvError(f"{model.name} normalises after each block (post-norm), so its residual stream is no sum "
                       "of heads and FFNs; direct logit attribution needs a pre-norm decoder")
    if any(b.attn_out_norm is not None or b.ffn_out_norm is not None for b in weights.blocks):
        raise QkvError(f"{model.name} normalises each attention and FFN output before it joins the stream (OLMo 2/3, "
                       "Gemma 2/3), so a head's part is no linear piece of it; direct logit attribution needs plain "
                       "residual steps")
    if cfg.final_softcap is not None:
        raise QkvError(f"{model.name} soft-caps its logits (c·tanh(logits/c)), so they are no sum of the parts; direct "
                       "logit attribution needs a linear W_vocab")
    if weights.W_head is not None:
        raise QkvError(f"{model.name} reads its logits through a masked-LM head (dense, activation, LayerNorm) before "
                       "W_vocab, which is not linear; direct logit attribution needs the stream to meet W_vocab directly")
    n = len(trace.ids)
    if not -n <= position < n:
        raise QkvError(f"position {position} is outside the text's {n} tokens (0..{n - 1}, or -1 for the last)")
    p = position % n
    L = cfg.n_layers
    if any(trace.layers.get(l) is None or trace.layers[l].heads is None for l in range(L)):
        raise QkvError(f"direct logit attribution needs every layer's heads; run the model with keep={KEEP}")
    last = trace.layers[L - 1]
    if last.residual_out is None:
        raise QkvError(f"direct logit attribution needs the last layer's residual_out; run the model with keep={KEEP}")
    w, vocab_bias = _direction(model, target, other)                         # (d_model,)
    if cfg.scale_decoder_output:                                             # T5: logits = (Norm(x)·d^-0.5)·W
        w = w * cfg.d_model ** -0.5
    w, vocab_bias = w * cfg.logit_scale, vocab_bias * cfg.logit_scale        # Cohere, Granite: logits × s
    fn = weights.final_norm
    u, scale = w, 1.0                                                        # no final norm: x_L·w itself
    if fn is not None:
        if last.final_norm_scale is None:
            raise QkvError(f"direct logit attribution needs the final norm's scale; run the model with keep={KEEP}")
        scale = float(last.final_norm_scale[p])                              # s, as the pass divided by it
        u = fn.weight.astype(np.float64) * w / scale                         # (d_model,) γ ⊙ w / s
        if cfg.norm != "rms":
            u = u - u.mean()                                                 # piece·(u − ū) = (piece − mean)·u
    heads = np.zeros((L, cfg.n_heads))
    cross = None if trace.cross is None else np.zeros((L, cfg.n_heads))    # an encoder–decoder's decoder
    ffns = np.zeros(L)
    b_O = b_out = 0.0
    for l, blk in enumerate(weights.blocks):
        z = trace.layers[l].heads[:, p].astype(np.float64)                   # (H, d_k)
        Wu = (blk.attn.W_O.astype(np.float64) @ u).reshape(cfg.n_heads, -1)  # (H, d_k) W_O[h rows]·u
        heads[l] = joined(np.einsum("hd,hd->h", z, Wu), cfg)                 # what each head adds to the stream
        if cross is not None:                                                # Z_h of the cross-attention
            zc = trace.cross.layers[l].heads[:, p].astype(np.float64)        # (H, d_k)
            cross[l] = np.einsum("hd,hd->h", zc, (blk.cross_attn.W_O.astype(np.float64) @ u).reshape(cfg.n_heads, -1))
            if blk.cross_attn.b_O is not None:
                b_O += float(blk.cross_attn.b_O.astype(np.float64) @ u)
        f = trace.layers[l].ffn_out[p].astype(np.float64)                    # (d_model,)
        b_ffn = getattr(blk.ffn, "b_out", None)                              # a routed FFN (MoE) has none
        if b_ffn is not None:
            bo = joined(float(b_ffn.astype(np.float64) @ u), cfg)
            b_out += bo
            ffns[l] = f @ u - bo
        else:
            ffns[l] = f @ u
        if blk.attn.b_O is not None:
            b_O += joined(float(blk.attn.b_O.astype(np.float64) @ u), cfg)
    emb = float(trace.layers[0].residual[p].astype(np.float64) @ u)
    beta = 0.0
    if fn is not None and fn.bias is not None:
        beta = float(fn.bias.astype(np.float64) @ w)
    logits = trace.logits
    logit = float(logits[p, target]) - (0.0 if other is None else float(logits[p, other]))
    rest = {"embeddings": emb, "attention biases b_O": b_O, "FFN biases b_out": b_out,
            "final norm bias β": beta, "vocabulary bias b_vocab": vocab_bias}
    return Attribution(heads=heads, ffns=ffns, rest=rest, logit=logit, target=target, other=other,
                       position=p, scale=scale, cross=cross)


def direct_logit_attribution(model: "Model", text_or_ids: str | Sequence[int], target: str | int,
                             other: str | int | None = None, position: int = -1) -> Attribution:
    """Each head's and each FFN's direct part of the logit of TARGET (minus OTHER's, if given)
    at POSITION (default the last), the final norm's scale frozen (as TransformerLens does).

    target, other: a token id, or text that is exactly one token (" Mary", with its space).
    Returns an Attribution: .heads (L, H), .ffns (L,), .rest (embeddings, biases), .logit;
    heads + FFNs + rest sum to the logit. An encoder without an LM head raises QkvError.
    """
    check_attribution(model)
    t = token_id(model, target)
    o = None if other is None else token_id(model, other)
    return attribution_of_trace(model, model.run(text_or_ids, keep=KEEP), t, o, position)
