"""The local replacement model of one prompt ("Circuit Tracing", Ameisen et al. 2025, §2): the model's own pass
with everything that is not linear in the residual stream held at what the real pass computed, and each FFN
read as a transcoder plus an error:

    attention     A = softmax(S + M) frozen at the real pass's (hook "attentions"): Z = A·V is linear in X
    norms         every norm divides by the real pass's scale s (hooks "attn_norm_scale", "ffn_norm_scale",
                  "final_norm_scale", and the output norms' "attn_out_norm_scale", "ffn_out_norm_scale")
    FFN           ffn_out = transcoder(ffn_in) + error,  error = the real ffn_out − transcoder(ffn_in),
                  one constant vector per layer and position (an error node)

so that, on this prompt, it gives the model's own logits (exactly, up to rounding), while every path from a
node to a logit is a product of linear maps. A transcoder of layer L reads "ffn_in" (what the FFN reads,
after its norm) and writes "ffn_out" (what joins the stream, after any output norm and multiplier):
out = z·W_dec + b_dec (+ x·W_skip), z = its encoder's activations (qkv.features.sae.SAE).

The real pass is run once, keeping its tape (qkv.core.blocks_backward.Tape) too: the graph's backward
(qkv.graphs.graph) reads the norms' inputs and the patterns from it, as the exact backward does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..core.blocks import norm_scale
from ..core.blocks_backward import Tape
from ..core.ops import ACTIVATIONS
from ..core.stack import transformer
from ..core.trace import Recorder, spelled
from ..features.sae import SAE, pre_acts
from ..runtime.errors import QkvError

SCALES = ("attn_norm_scale", "ffn_norm_scale", "attn_out_norm_scale", "ffn_out_norm_scale")


class KeptTape(Tape):
    """A tape whose records stay after they are read: the graph runs one backward per batch of targets."""

    def pop(self, layer: int | None, box: str):
        return self.records[layer, box]


@dataclass
class Replacement:
    """The real pass of one prompt, what the replacement model freezes, and its transcoders' readings.
    Lists are per layer; n the prompt's tokens."""

    model: object
    ids: np.ndarray                          # (n,)
    tokens: list[str]                        # (n,) as the tokenizer spells them
    transcoders: dict[int, SAE]              # layer → its transcoder
    attentions: list[np.ndarray]             # L × (H, n, n) the real pass's patterns
    scales: dict[str, np.ndarray]            # hook key ("3.ffn_norm_scale", "29.final_norm_scale") → (n,)
    ffn_in: list[np.ndarray]                 # L × (n, d_model) what each FFN read
    ffn_out: list[np.ndarray]                # L × (n, d_model) what each FFN's step added to the stream
    errors: list[np.ndarray]                 # L × (n, d_model) ffn_out − transcoder(ffn_in)
    acts: list[np.ndarray]                   # L × (n, d_sae) the transcoders' activations
    logits: np.ndarray | None                # (n, V) the model's logits (soft-capped where the model caps them);
                                             # None without an LM head (an encoder: its hidden states)
    embeddings: np.ndarray                   # (n, d_model) the stream entering block 0
    hidden: np.ndarray                       # (n, d_model) after the final norm (what W_vocab reads)
    tape: KeptTape = field(repr=False)       # the real pass's records, for the frozen backward
    held: tuple[int, ...] = ()               # positions whose ffn_out is held at the real pass's (`hold`)

    @property
    def n_layers(self) -> int:
        return len(self.ffn_in)

    def hold(self, layer: int, out: np.ndarray) -> np.ndarray:
        """OUT (…, n, d) with LAYER's ffn_out at the held positions set to the real pass's: there the FFN is a
        constant, as a bias is (no feature, no error node, no skip path)."""
        at = [p for p in self.held if p < out.shape[-2]]                      # a pass over the first m < n too
        if not at:
            return out
        out = out.astype(np.result_type(out, self.ffn_out[layer]))           # a copy; float32 b_dec: widened
        out[..., at, :] = self.ffn_out[layer][at]
        return out

    def release(self, d: np.ndarray) -> np.ndarray:
        """D (…, n, d) with the held positions zeroed: a gradient that must not pass through a held FFN."""
        at = [p for p in self.held if p < d.shape[-2]]
        if not at:
            return d
        d = d.copy()
        d[..., at, :] = 0
        return d

    def transcode(self, layer: int, x: np.ndarray, edit: Callable | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(z (…, d_sae), out (…, d_out)) of LAYER's transcoder on x (…, d_in): out = z·W_dec + b_dec (+ x·W_skip).
        edit(layer, z) → z: features changed before they are decoded (an intervention)."""
        sae = self.transcoders[layer]
        rows = x.reshape(-1, x.shape[-1])                                      # (N, d_in)
        z = sae.encode(rows)                                                   # (N, d_sae)
        if edit is not None:
            z = edit(layer, z.reshape(*x.shape[:-1], -1)).reshape(z.shape)
        out = decoded(sae, z, rows)                                            # (N, d_out)
        return z.reshape(*x.shape[:-1], -1), out.reshape(*x.shape[:-1], -1)

    def frozen_hooks(self) -> dict[str, Callable]:
        """The hooks that hold every pattern and norm scale at the real pass's: key → fn (qkv.core.hooks)."""
        hooks: dict[str, Callable] = {f"{i}.attentions": _const(a[None]) for i, a in enumerate(self.attentions)}
        hooks |= {key: _const(s[None]) for key, s in self.scales.items()}
        return hooks

    def hooks(self, extra: Mapping[str, Callable] | None = None, edit: Callable | None = None,
              ffn_out: Sequence[np.ndarray] | None = None) -> dict[str, Callable]:
        """The hooks that run the replacement model through `model.forward(ids, hooks=…)`: patterns and scales
        frozen, ffn_out = transcoder(ffn_in) + error at every layer. edit(layer, z) → z: change features
        (z (B, n, d_sae)) before they are decoded; ffn_out: L × (n, d) constants to use instead (every node
        held, a transcoder's skip too: the frozen system with nothing left to move). extra: more hooks, run after these (on a key in
        both, this one's hook first, then EXTRA's)."""
        seen: dict[int, np.ndarray] = {}

        def read(x, layer):
            seen[layer] = x
            return None

        def replaced(out, layer):
            if ffn_out is not None:
                return ffn_out[layer]
            return self.hold(layer, self.transcode(layer, seen.pop(layer), edit)[1] + self.errors[layer])  # (B, n, d)

        hooks = self.frozen_hooks() | {"ffn_in": read, "ffn_out": replaced}
        for key, fn in (extra or {}).items():
            hooks[key] = _then(hooks[key], fn) if key in hooks else fn
        return hooks


def _const(value: np.ndarray) -> Callable:
    return lambda _, layer: value


def _then(first: Callable, second: Callable) -> Callable:
    def both(value, layer):
        new = first(value, layer)
        value = value if new is None else new
        new = second(value, layer)
        return value if new is None else new
    return both


def decoded(sae: SAE, z: np.ndarray, x: np.ndarray) -> np.ndarray:
    """z·W_dec + b_dec (+ x·W_skip, a transcoder's linear skip from its input): z (N, d_sae), x (N, d_in)."""
    out = z @ sae.params["W_dec"] + sae.params["b_dec"]                       # (N, d_out)
    skip = sae.params.get("W_skip")
    return out if skip is None else out + x @ skip


def check_transcoders(model, transcoders: Mapping[int, SAE]) -> dict[int, SAE]:
    """TRANSCODERS as {layer: SAE}, one per layer of MODEL, each reading and writing d_model; else one QkvError."""
    cfg = model.config
    if not isinstance(transcoders, Mapping) or not transcoders:
        raise QkvError("give the transcoders as {layer: SAE}, one for every layer of the model")
    missing = [i for i in range(cfg.n_layers) if i not in transcoders]
    extra = sorted(set(transcoders) - set(range(cfg.n_layers)))
    if missing or extra:
        what = (f"no transcoder for layer(s) {', '.join(map(str, missing[:8]))}" if missing
                else f"transcoder(s) for layer(s) {', '.join(map(str, extra[:8]))}, which {model.name} does not have")
        raise QkvError(f"{what}: a replacement model needs one transcoder for each of {model.name}'s "
                       f"{cfg.n_layers} layers (0–{cfg.n_layers - 1}); train or load the missing ones")
    for i in range(cfg.n_layers):
        sae = transcoders[i]
        if not isinstance(sae, SAE):
            raise QkvError(f"the transcoder of layer {i} is a {type(sae).__name__}, not an SAE")
        d_in, d_out = sae.params["W_enc"].shape[0], sae.params["W_dec"].shape[1]
        if (d_in, d_out) != (cfg.d_model, cfg.d_model):
            raise QkvError(f"the transcoder of layer {i} maps {d_in} → {d_out} numbers, but {model.name}'s FFN "
                           f"reads and writes d_model = {cfg.d_model}; use transcoders made for this model")
    return {i: transcoders[i] for i in range(cfg.n_layers)}


def check_model(model) -> None:
    """One QkvError for a model the replacement model cannot be built on (no blocks, an encoder–decoder, an
    image or audio model, a stream projected to the tables' width)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "weights") or not hasattr(model.weights, "blocks"):
        raise QkvError("attribution graphs need a single-stack text model (e.g. qkv.load('smollm2'))")
    w = model.weights
    if w.W_patch is not None or w.front is not None or cfg.encoder_decoder or cfg.position == "relative":
        raise QkvError(f"{model.name} is not a single-stack text model; attribution graphs read a decoder "
                       "(or a text encoder with an LM head)")
    if cfg.latent:
        raise QkvError(f"{model.name}'s attention is multi-head latent attention (DeepSeek): its values come from a "
                       "normalised latent, not X·W_V, which the graph's frozen attention does not model yet; use "
                       "another model")
    if w.W_embed is not None or w.unembed_in is not None or cfg.scale_decoder_output:
        raise QkvError(f"{model.name}'s stream is projected between the blocks and the tables (ELECTRA, OPT-350m), "
                       "which the graph does not model yet; use another model")


def prompt_ids(model, text_or_ids) -> tuple[np.ndarray, list[str]]:
    """(ids (n,), tokens) of a text (the model's tokenizer, special tokens included) or of given ids."""
    if isinstance(text_or_ids, str):
        ids, tokens = model.encode(text_or_ids)
        return np.asarray(ids, dtype=np.int64), list(tokens)
    ids, _ = model.check_ids(text_or_ids)
    if ids.shape[0] != 1:
        raise QkvError(f"give one prompt (a text or a row of ids), got {ids.shape[0]} rows")
    return ids[0], spelled(model.tokenizer, ids[0])


def replacement(model, text_or_ids, transcoders: Mapping[int, SAE], held: Sequence[int] = ()) -> Replacement:
    """The local replacement model of one prompt: the real pass (recorded and taped), each layer's transcoder
    read on what its FFN read, and the errors that make the replacement reproduce the real ffn_out.
    held: positions whose FFN outputs are held at the real pass's, a constant like a bias, with no feature or
    error node there (`sink_positions`: a causal model's first token, the attention sink the transcoders were
    not trained on; circuit-tracer holds a BOS token so)."""
    check_model(model)
    transcoders = check_transcoders(model, transcoders)
    ids, tokens = prompt_ids(model, text_or_ids)
    held = tuple(sorted({int(p) for p in held}))
    if any(not 0 <= p < len(ids) for p in held):
        raise QkvError(f"cannot hold positions {list(held)} of a prompt of {len(ids)} tokens; give positions "
                       f"from 0 to {len(ids) - 1}")
    if len(held) == len(ids):
        raise QkvError("every position of the prompt is held, so the graph would have no feature; hold fewer "
                       "(a prompt of more than one token)")
    cfg = model.config
    keep = ("attentions", "ffn_in", "ffn_out", "residual", *SCALES, "final_norm_scale")
    rec, tape = Recorder(keep=keep), KeptTape()
    hidden, logits = transformer(model.weights, cfg, ids[None], np.ones((1, len(ids)), np.int64), rec=rec, tape=tape)
    store = rec.store
    L = cfg.n_layers
    scales = {f"{i}.{name}": store[i][name][0] for i in range(L) for name in (*SCALES, "final_norm_scale")
              if name in store[i]}
    layers = [store[i] for i in range(L)]
    rep = Replacement(model=model, ids=ids, tokens=tokens, transcoders=transcoders,
                      attentions=[s["attentions"][0] for s in layers], scales=scales,
                      ffn_in=[s["ffn_in"][0] for s in layers], ffn_out=[s["ffn_out"][0] for s in layers],
                      errors=[], acts=[], logits=None if logits is None else logits[0],
                      embeddings=layers[0]["residual"][0], hidden=hidden[0], tape=tape, held=held)
    for i in range(L):
        z, out = rep.transcode(i, rep.ffn_in[i])                               # (n, d_sae), (n, d)
        error = rep.ffn_out[i] - out                                           # (n, d)
        z[list(held)], error[list(held)] = 0, 0                                # held: no node there
        rep.acts.append(z)
        rep.errors.append(error)
    return rep


def sink_positions(model, n: int) -> tuple[int, ...]:
    """The positions a graph holds by default: a causal model's first token when the prompt has more (the
    attention sink: its stream is unlike any other position's, and qkv's transcoders and feature pages leave
    it out); none for an encoder."""
    return (0,) if model.config.causal and n > 1 else ()


# ── the logits, linear in the final hidden states ────────────────────────────────

def head_gate(rep: Replacement) -> tuple[np.ndarray, np.ndarray] | None:
    """A masked-LM head's frozen non-linearities (BERT): Norm(act(H·W_head + b)) read as r ⊙ u with
    r = act(u)/u held (GELU's u·Φ(u): Φ(u) held), and its norm dividing by the real pass's scale:
    (r (n, E), s (n,)); None without such a head."""
    w, cfg = rep.model.weights, rep.model.config
    if w.W_head is None:
        return None
    u = rep.hidden @ w.W_head + w.b_head                                        # (n, E)
    a = ACTIVATIONS[cfg.head_activation](u)                                     # (n, E)
    safe = np.where(u == 0, 1.0, u)
    r = np.where(u == 0, 0.0, a / safe)                                         # (n, E)
    return r, norm_scale(a, cfg)


def unembed(rep: Replacement, hidden: np.ndarray, position: int, gate=None) -> np.ndarray:
    """The logits before any soft-cap of one position's final hidden states hidden (…, d_model), through the
    head with its non-linearities frozen (`head_gate`): (…, V). Linear (affine) in hidden."""
    w, cfg = rep.model.weights, rep.model.config
    if gate is not None:
        r, s = gate
        a = (hidden @ w.W_head + w.b_head) * r[position]                       # (…, E)
        a = a - a.mean(axis=-1, keepdims=True) if cfg.norm != "rms" else a
        hidden = a / s[position] * w.head_norm.weight + (0 if w.head_norm.bias is None else w.head_norm.bias)
    logits = hidden @ w.W_vocab                                                  # (…, V)
    if w.b_vocab is not None:
        logits = logits + w.b_vocab
    return logits * cfg.logit_scale if cfg.logit_scale != 1 else logits
