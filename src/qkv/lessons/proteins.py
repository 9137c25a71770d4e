"""`qkv explain proteins`: attention that draws a protein's 3-D contacts (Rao et al. 2020, "Transformer protein
language models are unsupervised structure learners"), on an ESM-2 checkpoint.

A masked language model over millions of protein sequences learns that residues which touch in the folded
protein change together (a mutation on one side is compensated on the other): to guess a masked residue, a head
does well to look at its contact partners. Such a head's attention map IS a contact map, up to noise; ESM's contact
head reads them out:

    A        every layer's attention (L, H, n, n) over <cls> residues <eos>, <cls> and <eos> dropped: (L·H, m, m)
    F_c      = APC(A_c + A_cᵀ)                     each head's map symmetrised, then average-product corrected
    P[i, j]  = σ(Σ_c w_c·F_c[i, j] + b)            a logistic regression over the L·H heads (fit on a few known
                                                   structures; the language model itself never saw one)

The lesson recomputes every step here, head by head (plain loops), and checks each number against
qkv.analysis.contacts (which equals transformers' EsmModel.predict_contacts: tests/test_family_esm.py) before it
prints; then the map, drawn, beside the single heads whose map best matches it (Pearson's r over the pairs at least
6 apart). The example: Trp-cage TC5b, a 20-residue miniprotein that folds on its own (Neidigh et al. 2002, PDB 1L2Y):
NLYIQWLKDGGPSSGRPPPS. No ESM checkpoint ships with qkv (no download): the lesson needs --model DIR.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.contacts import contacts, pairs
from ..runtime.errors import QkvError
from . import Page, same
from ..viz.words import texts

TEXTS = texts("proteins")          # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = None               # none ships: an ESM-2 checkpoint is given with --model
TRP_CAGE = "NLYIQWLKDGGPSSGRPPPS"  # Trp-cage TC5b (Neidigh, Fesinmeyer & Andersen 2002; PDB 1L2Y), 20 residues
DEFAULT_TEXT = TRP_CAGE
NEEDS_MODEL = ("qkv explain proteins needs an ESM-2 checkpoint and none ships with qkv: give --model DIR (e.g. "
               "facebook/esm2_t6_8M_UR50D's config.json, model.safetensors and vocab.txt), or in a source checkout "
               "--model tests/fixtures/models/esm (a random test model: its map is noise, the method exact)")
SHADES = " ·░▒▓█"                  # the printed map's cells, from the map's lowest P to its highest
BEST = 3                           # the single heads shown beside the map
TOP = 8                            # the surest contacts listed


@dataclass
class Lesson:
    """One protein's contact map through one ESM model, every step recomputed and checked."""

    model: str
    sequence: str
    residues: list[str]            # (m,) the residues between <cls> and <eos>
    n_layers: int
    n_heads: int
    predicted: np.ndarray          # (m, m) P
    best: list[tuple[int, int, float]]   # (layer, head, r), best first
    best_maps: np.ndarray          # (BEST, m, m) those heads' F
    weights: np.ndarray            # (L, H) the regression's w
    bias: float                    # its b
    top: list[tuple[int, int, float]]    # (i, j, P) the surest pairs at least `separation` apart
    separation: int
    diff_features: float           # F recomputed here − analysis.contacts'
    diff_map: float                # P recomputed here − analysis.contacts'
    diff_total: float              # Σ F_c (APC makes every head's map sum to 0)
    diff_r: float                  # r of the best head recomputed with np.corrcoef − analysis.contacts'

    @property
    def m(self) -> int:
        return len(self.residues)


def build(model, text: str | None = None) -> Lesson:
    """The lesson on MODEL (an ESM checkpoint) reading TEXT, a protein's one-letter sequence (default Trp-cage)."""
    if model is None:
        raise QkvError(NEEDS_MODEL)
    if getattr(model.weights, "W_contact", None) is None:
        raise QkvError(f"{model.name} has no contact head (contact_head.regression): qkv explain proteins reads an "
                       "ESM-2 checkpoint; give --model DIR of one")
    sequence = "".join((text or DEFAULT_TEXT).split())
    unknown = model.tokenizer.unknown_words(sequence) if model.tokenizer is not None else []
    if unknown:
        raise QkvError(f"{unknown[0]!r} is not an amino acid of {model.name}'s vocabulary; give the sequence in "
                       "one-letter codes, upper case (e.g. NLYIQWLKDGGPSSGRPPPS)")
    engine = contacts(model, sequence)                               # qkv.analysis.contacts
    trace = model.run(sequence, keep=("attentions",))
    cfg, w = model.config, model.weights
    L, H, m = cfg.n_layers, cfg.n_heads, engine.predicted.shape[0]
    tol = 1e-9 if np.dtype(model.dtype) == np.float64 else 1e-5       # the trace's pass against the engine's
    z = np.zeros((m, m))
    total = 0.0
    for layer in range(L):
        A = np.asarray(trace.layer(layer).attentions, np.float64)    # (H, n, n) this layer's heads
        for head in range(H):
            a = A[head, 1:-1, 1:-1]                                  # (m, m) <cls> and <eos> dropped
            s = a + a.T                                              # symmetrised
            f = s - np.outer(s.sum(1), s.sum(0)) / s.sum()           # APC: row sums × column sums / total removed
            same(f"layer {layer} head {head}'s corrected map", f, engine.features[layer, head], tol, rel=True)
            total = max(total, abs(float(f.sum())) / float(s.sum()))
            z += float(w.W_contact[layer * H + head]) * f            # Σ_c w_c·F_c
    P = 1 / (1 + np.exp(-(z + float(w.b_contact[0]))))               # (m, m) σ(… + b)
    diff_features = same("every head's corrected map", _features(trace, L, H), engine.features, tol, rel=True)
    diff_map = same("the contact map σ(Σ w·F + b)", P, engine.predicted, tol)
    same("the contact map's symmetry", P, P.T, 1e-12)
    diff_total = same("each corrected map's total (APC leaves 0)", total, 0.0, 1e-9)
    best = engine.best_heads(BEST)
    i, j = pairs(m, engine.separation)
    layer, head, r = best[0]
    diff_r = same("the best head's r", np.corrcoef(engine.features[layer, head][i, j], engine.predicted[i, j])[0, 1], r,
                  1e-9)
    return Lesson(model=model.name, sequence=sequence, residues=engine.residues, n_layers=L, n_heads=H, predicted=P,
                  best=best, best_maps=np.stack([engine.features[b[0], b[1]] for b in best]),
                  weights=np.asarray(w.W_contact, np.float64).reshape(L, H), bias=float(w.b_contact[0]),
                  top=engine.top_contacts(TOP), separation=engine.separation, diff_features=diff_features,
                  diff_map=diff_map, diff_total=diff_total, diff_r=diff_r)


def _features(trace, L: int, H: int) -> np.ndarray:
    """(L, H, m, m) every head's APC(A + Aᵀ) over the residues, the whole stack at once (what the loop built)."""
    A = np.stack([np.asarray(trace.layer(i).attentions, np.float64)[:, 1:-1, 1:-1] for i in range(L)])   # (L, H, m, m)
    s = A + np.swapaxes(A, -1, -2)
    return s - s.sum(-1, keepdims=True) * s.sum(-2, keepdims=True) / s.sum((-1, -2), keepdims=True)


# ── the page ─────────────────────────────────────────────────────────────────────

def grid(residues: list[str], M: np.ndarray) -> str:
    """M (m, m) as text: one shade a cell, from M's lowest off-diagonal value to its highest, residues as labels."""
    m = len(residues)
    off = M[~np.eye(m, dtype=bool)] if m > 1 else M.ravel()
    lo, hi = float(off.min()), float(off.max())
    level = np.clip((M - lo) / (hi - lo or 1.0) * (len(SHADES) - 1), 0, len(SHADES) - 1).round().astype(int)
    rows = ["   " + "".join(r[0] for r in residues)]
    for i in range(m):
        rows.append(f"{residues[i][0]:>2} " + "".join("╲" if i == j else SHADES[level[i, j]] for j in range(m)))
    return "\n".join(rows)


def render(lesson: Lesson, lang: str = "en") -> list:
    from rich.columns import Columns
    from rich.text import Text

    p, L = Page(TEXTS, lang), lesson
    LH = L.n_layers * L.n_heads
    strongest = np.argsort(-np.abs(L.weights), axis=None, kind="stable")[:3]
    named = ", ".join(f"{c // L.n_heads}.{c % L.n_heads} ({L.weights.flat[c]:+.3f})" for c in strongest)
    out = [p.rule("title", bold=True, model=L.model), p.say("intro"), Text(""),
           p.rule("s_sequence"), p.say("trp_cage" if L.sequence == TRP_CAGE else "sequence", m=L.m),
           Text("  " + L.sequence, style="bold"), Text(""),
           p.rule("s_steps"),
           p.say("steps", L=L.n_layers, H=L.n_heads, LH=LH, n=L.m + 2, m=L.m, named=named, b=L.bias),
           p.say("checked", diff_features=L.diff_features, diff_map=L.diff_map, diff_total=L.diff_total),
           Text(""), p.rule("s_map")]
    off = L.predicted[~np.eye(L.m, dtype=bool)]
    out += [p.say("map", lo=float(off.min()), hi=float(off.max()), shades=SHADES.strip())]
    layer, head, r = L.best[0]
    out += [Columns([Text(p.t["map_title"] + "\n" + grid(L.residues, L.predicted)),
                     Text(p.t["best_title"].format(layer=layer, head=head, r=r) + "\n" +
                          grid(L.residues, L.best_maps[0]))], padding=(0, 4)), Text("")]
    tab = p.table("col_pair", "col_residues", "col_p")
    for i, j, prob in L.top:
        Page.row(tab, f"{i + 1}–{j + 1}", f"{L.residues[i]}·{L.residues[j]}", f"{prob:.3f}", bold_first=True)
    out += [p.say("top", separation=L.separation), tab, Text(""), p.rule("s_heads"),
            p.say("heads", separation=L.separation, diff_r=L.diff_r)]
    tab = p.table("col_head", "col_r", "col_w")
    for lay, hd, rr in L.best:
        Page.row(tab, f"{lay}.{hd}", f"{rr:+.3f}", f"{L.weights[lay, hd]:+.4f}", bold_first=True)
    out += [tab, Text(""), p.say("noise"), p.say("end")]
    return out


# ── the figures ──────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """proteins: the predicted contact map beside the maps of the heads that best match it."""
    from ..viz.drawing import new_figure, save_all, styled

    t, L = Page(TEXTS, lang).t, lesson
    labels = [f"{r}{i + 1}" for i, r in enumerate(L.residues)]

    @styled
    def draw():
        panels = [(L.predicted, t["fig_map"], "viridis")]
        panels += [(M, t["fig_head"].format(layer=lay, head=hd, r=r), "RdBu_r")
                   for M, (lay, hd, r) in zip(L.best_maps, L.best)]
        fig = new_figure(4.2 * len(panels), 4.4)
        axes = np.atleast_1d(fig.subplots(1, len(panels)))
        for ax, (M, title, cmap) in zip(axes, panels):
            shown = np.where(np.eye(L.m, dtype=bool), np.nan, M)
            lim = float(np.nanmax(np.abs(shown))) or 1.0
            im = ax.imshow(shown, cmap=cmap, **({} if cmap == "viridis" else {"vmin": -lim, "vmax": lim}))
            ax.set(title=title, xticks=range(L.m), yticks=range(L.m))
            ax.set_xticklabels(labels, rotation=90, fontsize=6)
            ax.set_yticklabels(labels, fontsize=6)
            fig.colorbar(im, ax=ax, shrink=0.8)
        fig.suptitle(t["fig_title"].format(model=L.model, m=L.m))
        return fig

    return save_all(out_dir, [("proteins", draw)], ["png", "svg"])
