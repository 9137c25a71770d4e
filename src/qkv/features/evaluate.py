"""How good an SAE is, in the numbers the field reports.

    FVU    fraction of variance unexplained: Σ‖x − x̂‖² / Σ‖x − mean(x)‖² over the tokens (0: perfect)
    L0     the mean number of non-zero latents per token (≤ k for a TopK SAE)
    dead   the fraction of latents that never fired on these tokens
    CE loss recovered: the model's next-token loss with x̂ spliced in for x at the SAE's layer and site
           (qkv's hooks: "L.residual", the residual stream entering block L, or "L.attn_out", "L.ffn_out"),
           against x replaced by 0 (zero-ablation) and by the mean of x (mean-ablation):
               recovered = (CE_zero − CE_sae) / (CE_zero − CE_clean)       1: as good as the model itself
               recovered vs mean = (CE_mean − CE_sae) / (CE_mean − CE_clean)

The CE losses are means over every predicted token (position t predicts t+1) of every sequence. The splice
replaces the site at every position but the first when skip_first (the default, as the activation store
leaves position 0 out: a decoder's attention sink, whose residual stream is tens of times larger); FVU, L0
and dead count the replaced positions. The mean for mean-ablation is over the same positions' activations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .sae import SAE

HOOK_POINTS = {"resid": "residual", "attn_out": "attn_out", "ffn_out": "ffn_out",
               "ffn_in": "ffn_in", "resid_mid": "residual_mid"}      # the last two: a transcoder's inputs


@dataclass
class Reconstruction:
    """FVU, L0 and dead latents over some tokens."""

    tokens: int
    fvu: float
    l0: float
    dead: float                 # fraction of latents with no non-zero on these tokens
    dead_count: int


class Tally:
    """Σ‖x − x̂‖², Σx, Σ‖x‖², non-zeros and the latents fired, batch after batch (float64 sums)."""

    def __init__(self, sae: SAE):
        self.sae = sae
        d, n = sae.config.width_out, sae.config.d_sae
        self.n, self.err, self.sq = 0, 0.0, 0.0
        self.sum = np.zeros(d, np.float64)
        self.nonzero = 0
        self.fired = np.zeros(n, bool)

    def add(self, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
        """Count a batch x (B, d_in) whose target is Y (B, d_out; a transcoder's) or x itself (an SAE's); returns
        the prediction x̂ (B, d_out). FVU is then of the target."""
        x_hat, z = self.sae.forward(x)
        y = x if y is None else y
        r = (y - x_hat).astype(np.float64)                                 # (B, d_out)
        self.err += float((r * r).sum())
        x64 = y.astype(np.float64)
        self.sq += float((x64 * x64).sum())
        self.sum += x64.sum(axis=0)
        nz = z > 0                                                          # (B, d_sae)
        self.nonzero += int(nz.sum())
        self.fired |= nz.any(axis=0)
        self.n += x.shape[0]
        return x_hat

    def result(self) -> Reconstruction:
        if self.n == 0:
            raise QkvError("no activations to evaluate; give more tokens")
        total = self.sq - float(self.sum @ self.sum) / self.n                # Σ‖x − mean‖² = Σ‖x‖² − N‖mean‖²
        dead = int((~self.fired).sum())
        return Reconstruction(self.n, self.err / total if total > 0 else float("nan"), self.nonzero / self.n,
                              dead / self.fired.size, dead)


def reconstruction(sae: SAE, batches: Iterable[np.ndarray]) -> Reconstruction:
    """FVU, L0 and dead latents of SAE over the activation batches (each (B, d_in))."""
    if sae.config.transcoder:
        raise QkvError("stored activations hold one site, and a transcoder's FVU needs its input and the FFN's output; "
                       "give --file or --corpus instead (the spliced loss reports its FVU)")
    tally = Tally(sae)
    for x in batches:
        if x.ndim != 2 or x.shape[1] != sae.config.d_in:
            raise QkvError(f"activations of shape {x.shape} do not fit an SAE of d_in {sae.config.d_in}; "
                           "give activations of the site the SAE was trained on")
        tally.add(np.asarray(x, dtype=np.float32))
    return tally.result()


@dataclass
class Spliced:
    """The model's next-token loss four ways, the recovered fractions, and the reconstruction on the way."""

    tokens: int                 # predicted tokens
    clean: float
    sae: float
    zero: float
    mean: float
    recovered: float            # (zero − sae) / (zero − clean)
    recovered_vs_mean: float    # (mean − sae) / (mean − clean)
    reconstruction: Reconstruction

    def to_json(self) -> dict:
        return asdict(self)


def check_text_model(model, sae: SAE, layer: int | None = None, site: str | None = None) -> tuple[int, str]:
    """(layer, site) where SAE reads MODEL, once MODEL is known to be a single-stack text model with a
    next-token loss (not an image or audio model, not an encoder–decoder) whose stream at the SAE's hook is
    the SAE's d_in wide; else one QkvError naming the cause (`features.steer.check_model` for width and layer)."""
    from ..models.image_model import ImageModel
    from .steer import check_model

    kind = ("an image model" if isinstance(model, ImageModel) else
            "an encoder–decoder" if getattr(model.config, "encoder_decoder", False) else
            "a model without a tokenizer" if model.tokenizer is None else None)
    if kind is not None:
        raise QkvError(f"{model.name} is {kind}: it has no next-token loss on a text corpus to splice the SAE into; "
                       "give --model with the text model the SAE was trained on (or drop --file / --corpus)")
    layer, site, _ = check_model(model, sae, layer, site)
    return layer, site


def next_token_loss(logits: np.ndarray, ids: np.ndarray) -> tuple[float, int]:
    """(Σ over positions t < n−1 of −log softmax(logits[t])[ids[t+1]], how many), logits (B, n, V), ids (B, n)."""
    z = logits[:, :-1].astype(np.float64)                                 # (B, n−1, V)
    z -= z.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(z).sum(axis=-1))                                 # (B, n−1)
    target = np.take_along_axis(z, ids[:, 1:, None], axis=-1)[..., 0]     # (B, n−1)
    return float((logz - target).sum()), int(target.size)


def spliced_loss(model, sae: SAE, sequences: Sequence[np.ndarray], *, layer: int, site: str,
                 skip_first: bool = True, progress: Callable[[int, int], None] = lambda done, total: None) -> Spliced:
    """CE clean / with the SAE / zero- / mean-ablated at (LAYER, SITE), over SEQUENCES (each (n,) ids, n ≥ 2).

    Four passes a sequence: clean (which also records x for the mean and the reconstruction numbers),
    then x̂ = SAE(x), 0 and mean(x) in x's place through the hook `"{layer}.{point}"`. A transcoder reads x at
    SITE and replaces what it writes (site_out, the FFN's output y) with x̂; the mean and zero ablations replace y."""
    if site not in HOOK_POINTS:
        raise QkvError(f"unknown site {site!r}; give one of {', '.join(HOOK_POINTS)}")
    L = model.config.n_layers
    if not 0 <= layer < L:
        raise QkvError(f"the SAE reads layer {layer}, but {model.name} has layers 0..{L - 1}; give the model it "
                       "was trained on")
    for width in (sae.config.d_in, sae.config.width_out):
        if model.config.d_model != width:
            raise QkvError(f"the SAE reads {width}-wide activations, {model.name}'s are {model.config.d_model}; "
                           "give the model it was trained on")
    key = f"{layer}.{HOOK_POINTS[site]}"
    out_key = f"{layer}.{HOOK_POINTS[sae.config.site_out or 'ffn_out']}" if sae.config.transcoder else key
    tally = Tally(sae)
    seen = {"sum": np.zeros(sae.config.width_out, np.float64), "n": 0, "x": None}

    first = 1 if skip_first else 0                                        # positions first.. are replaced

    def record(x, layer):                                                 # x (1, n, d): what is replaced
        seen["sum"] += x[0, first:].astype(np.float64).sum(axis=0)
        seen["n"] += x.shape[1] - first

    def replaced(x, new):                                                 # x (1, n, d), new (n − first, d)
        out = np.array(x)
        out[0, first:] = new
        return out

    def grab(x, layer):                                                   # a transcoder's input, read first
        seen["x"] = np.asarray(x[0, first:], dtype=np.float32)

    def reconstruct(x, layer):
        if out_key == key:
            return replaced(x, tally.add(np.asarray(x[0, first:], dtype=np.float32)))
        return replaced(x, tally.add(seen["x"], np.asarray(x[0, first:], dtype=np.float32)))

    def hooks(fn) -> dict:
        return {out_key: fn} if out_key == key else {key: grab, out_key: fn}

    sums = {"clean": 0.0, "sae": 0.0, "zero": 0.0, "mean": 0.0}
    count, total = 0, 2 * len(sequences)
    for i, ids in enumerate(sequences):
        ids = np.asarray(ids, dtype=np.int64)[None]                        # (1, n)
        if ids.shape[1] < 2 + first:
            raise QkvError(f"a sequence needs at least {2 + first} tokens to have a replaced token to predict from")
        out = model.forward(ids, attentions=False, hooks={out_key: record})
        loss, n = next_token_loss(out.logits, ids)
        sums["clean"] += loss
        count += n
        progress(i + 1, total)
    mean = (seen["sum"] / seen["n"]).astype(np.float32)                 # (d,) the mean of x
    for i, ids in enumerate(sequences):
        ids = np.asarray(ids, dtype=np.int64)[None]
        for name, fn in (("sae", reconstruct), ("zero", lambda x, layer: replaced(x, 0)),
                         ("mean", lambda x, layer: replaced(x, mean))):
            out = model.forward(ids, attentions=False, hooks=hooks(fn))
            sums[name] += next_token_loss(out.logits, ids)[0]
        progress(len(sequences) + i + 1, total)
    ce = {k: v / count for k, v in sums.items()}
    return Spliced(count, ce["clean"], ce["sae"], ce["zero"], ce["mean"],
                   _fraction(ce["zero"], ce["sae"], ce["clean"]), _fraction(ce["mean"], ce["sae"], ce["clean"]),
                   tally.result())


def _fraction(ablated: float, sae: float, clean: float) -> float:
    """(ablated − sae) / (ablated − clean); nan when the ablation does not change the loss."""
    gap = ablated - clean
    return (ablated - sae) / gap if gap != 0 else float("nan")


def token_sequences(tokenizer, texts: Iterable[str], tokens: int, context: int = 128) -> list[np.ndarray]:
    """TOKENS token ids of TEXTS (one after another, no special tokens), cut into sequences of CONTEXT
    (the last one shorter if need be, dropped if under 3)."""
    if tokens < 2:
        raise QkvError(f"--tokens must be ≥ 2, got {tokens}")
    ids: list[int] = []
    for text in texts:
        if text.strip():
            ids.extend(int(i) for i in tokenizer.encode(text, add_special_tokens=False)[0])
        if len(ids) >= tokens:
            break
    ids = ids[:tokens]
    seqs = [np.array(ids[i: i + context], np.int64) for i in range(0, len(ids), context)]
    seqs = [s for s in seqs if len(s) >= 3]
    if not seqs:
        raise QkvError("the text gives fewer than 2 tokens; give a longer --file")
    return seqs
