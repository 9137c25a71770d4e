"""`qkv explain vit`: an image through a Vision Transformer, step by step (default: digits-vit on an example digit).

    image (H, W) ─× 1/255, (x − mean)/std─▶ pixel_values (C, H, W)
      ─cut─▶ patches (P, C·p_h·p_w)               patch (r, c): rows p_h·r …, columns p_w·c …, flattened
      ─·W_patch + b_patch─▶ tokens (P, d_model)    the stride-p convolution, as one product
      ─[CLS] first, + P─▶ X (1 + P, d_model)       the residual stream entering layer 0
      ─L pre-norm blocks─▶ Norm ─row 0·W_vocab + b_vocab─▶ logits (labels,) ─softmax─▶ the answer

Every number is recomputed here in float64 from the weights (the whole pass: each block's LayerNorms,
attention, W_O and FFN) and checked against the engine's trace before anything prints: pixel_values,
the patches, the convolution computed window by window, X, every layer's residual stream, the chosen
layer's scores and weights of every head, attention rollout (qkv.analysis.rollout) and the logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ..runtime.errors import QkvError
from ..core.ops import ACTIVATIONS
from . import Page, same, shape
from .attention import norm_of
from ..viz.words import texts

TEXTS = texts("vit")               # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "digits-vit"
DEFAULT_DIGIT = "3"                # the example digit read when no image is given
SHOWN = 4                          # numbers of a vector shown
TOP = 5                            # keys of the followed head's [CLS] row listed
MAX_PATCHES = 16                   # rows of the patch table
MAX_PIXELS = 16                    # pixel rows and columns printed
TOL = 1e-4                         # float32 engine against float64 lesson, relative to the largest value
INK = " ░▒▓█"                      # white … black


@dataclass
class Lesson:
    model: str
    image: str                     # what was read, in words (an example digit, or the file's name)
    example: bool                  # the image is one of digits-vit's example digits
    true_label: str | None         # the digit an example shows
    shown: np.ndarray              # (h, w, C) uint8, the image as the model reads it
    mean: float                    # the normalisation of channel 0
    std: float
    x: np.ndarray                  # (C, h, w) pixel_values, float64
    patch: tuple[int, int]         # (p_h, p_w)
    grid: tuple[int, int]          # (rows, cols)
    patches: np.ndarray            # (P, C·p_h·p_w)
    labels: list[str]              # "[CLS]", "patch (0, 0)", …
    W_patch_shape: tuple[int, int]
    darkest: int                   # the patch followed through ③ (0-based among the patches)
    tokens: np.ndarray             # (P, d_model) patches·W_patch + b_patch
    X: np.ndarray                  # (1 + P, d_model)
    layer: int
    L: int
    H: int
    d_k: int
    S: np.ndarray                  # (H, 1 + P) [CLS]'s scores in the layer
    A: np.ndarray                  # (H, 1 + P) [CLS]'s attention weights
    head: int                      # the followed head: the most weight on one patch
    rollout: np.ndarray            # (1 + P,) row 0 of R after all L layers
    logits: np.ndarray             # (labels,)
    probs: np.ndarray              # (labels,)
    label_names: list[str]
    activation: str
    diffs: dict[str, float]

    @property
    def d_model(self) -> int:
        return self.X.shape[1]

    @property
    def P(self) -> int:
        return len(self.patches)


def example_image(digit: str = DEFAULT_DIGIT) -> Path:
    """The example digit-D.png shipped with digits-vit (qkv.checkpoints.digits_dir())."""
    from ..checkpoints import digits_dir

    return digits_dir() / f"digit-{digit}.png"


def shipped_digit(text: str) -> str | None:
    """The digit 0–9 TEXT names (digits-vit ships an example of each: `example_image`), else None."""
    digit = text.strip()
    return digit if len(digit) == 1 and digit in "0123456789" else None


def build(model, text: str | None = None, *, layer: int | None = None) -> Lesson:
    """The image TEXT (a file; a digit 0–9 or nothing: digits-vit's example digit) through the ViT `model`,
    attention followed in `layer` (default 0); every number checked against the engine."""
    from ..models.image_model import ImageModel

    if not isinstance(model, ImageModel):
        raise QkvError(f"{model.name} reads text; qkv explain vit follows an image model: use --model digits-vit "
                       "(the default) or a ViT directory")
    cfg, w = model.config, model.weights
    if cfg.norm_place != "pre" or cfg.norm != "layer" or w.W_vocab is None:
        raise QkvError(f"{model.name} is not a pre-norm ViT classifier; qkv explain vit follows one such as "
                       "digits-vit: use --model digits-vit")
    layer = 0 if layer is None else model.check_layer(layer)
    true_label = None
    if text is None or shipped_digit(text):
        digit = DEFAULT_DIGIT if text is None else shipped_digit(text)
        source, image, true_label = example_image(digit), f"digit-{digit}.png", digit
    else:
        source, image = Path(text), Path(text).name
    shown, pixel_values = model.pixel_values(str(source))                    # (h, w, C) uint8, (C, h, w)
    trace = model.run(pixel_values=pixel_values, keep=("residual", "scores", "attentions"))
    diffs: dict[str, float] = {}

    # ① pixels → pixel_values: × rescale_factor, then (x − mean) / std per channel
    pr = model.processing
    x = shown.transpose(2, 0, 1).astype(np.float64)                          # (C, h, w)
    if pr.do_rescale:
        x = x * pr.rescale_factor
    mean, std = np.array(pr.image_mean)[:, None, None], np.array(pr.image_std)[:, None, None]
    if pr.do_normalize:
        x = (x - mean) / std
    diffs["pixels"] = same("pixel_values", x, pixel_values, 1e-6)

    # ② the patches: patch (r, c) = x[:, p_h·r : p_h·(r+1), p_w·c : p_w·(c+1)], flattened channel, row, column
    (ph, pw), (rows, cols), C = cfg.patch_size, cfg.grid, cfg.num_channels
    patches = np.stack([x[:, ph * r:ph * (r + 1), pw * c:pw * (c + 1)].reshape(-1)
                        for r in range(rows) for c in range(cols)])          # (P, C·p_h·p_w)
    from ..inputs.images import patches_of
    diffs["patches"] = same("the patches", patches, patches_of(pixel_values[None], cfg)[0], 1e-6)

    # ③ tokens = patches·W_patch + b_patch; the same as the stride-p convolution, window by window
    W, b = w.W_patch.astype(np.float64), w.b_patch.astype(np.float64)        # (C·p_h·p_w, d), (d,)
    tokens = patches @ W + b                                                 # (P, d_model)
    filters = W.T.reshape(-1, C, ph, pw)                                     # (d_model, C, p_h, p_w) Conv2d's weight
    conv = np.empty((rows, cols, len(filters)))                              # (rows, cols, d_model)
    for r in range(rows):
        for c in range(cols):
            window = x[:, ph * r:ph * r + ph, pw * c:pw * c + pw]            # (C, p_h, p_w), stride = kernel
            conv[r, c] = (filters * window).sum(axis=(1, 2, 3)) + b
    diffs["conv"] = same("the convolution", conv.reshape(rows * cols, -1), tokens, 1e-9, rel=True)
    X = np.concatenate([w.tok_embed[:1].astype(np.float64), tokens]) + w.pos_embed.astype(np.float64)  # (1 + P, d)
    diffs["X"] = same("X = [CLS; tokens] + P", X, trace.layer(0).residual, TOL, rel=True)

    # the whole pass in float64: each pre-norm block, then the final norm and the classifier at [CLS]
    resid, S_all, A_all = _forward(model, X)
    diffs["residual"] = max(same(f"the residual stream entering layer {i}", resid[i], trace.layer(i).residual,
                                 TOL, rel=True) for i in range(cfg.n_layers))
    lt = trace.layer(layer)
    kept = np.isfinite(lt.scores)
    diffs["scores"] = same(f"layer {layer}'s scores", S_all[layer][kept], lt.scores[kept], TOL, rel=True)
    diffs["attentions"] = same(f"layer {layer}'s attention weights", A_all[layer], lt.attentions, 1e-5)
    final = norm_of(resid[-1], w.final_norm.weight, w.final_norm.bias, "layer", cfg.norm_eps)    # (1 + P, d)
    diffs["hidden"] = same("the final norm", final, trace.hidden, TOL, rel=True)
    logits = final[0] @ w.W_vocab.astype(np.float64) + (0 if w.b_vocab is None else w.b_vocab)   # (labels,)
    diffs["logits"] = same("the logits", logits, trace.logits[0], TOL, rel=True)

    # ⑤ rollout: Â = ½·mean_h A + ½·I, rows renormalised; R = Â_L ⋯ Â_1
    n = X.shape[0]
    R = np.eye(n)
    for A in A_all:
        Ahat = 0.5 * A.mean(axis=0) + 0.5 * np.eye(n)                        # (n, n)
        R = (Ahat / Ahat.sum(-1, keepdims=True)) @ R
    from ..analysis.rollout import attention_rollout
    diffs["rollout"] = same("attention rollout", R, attention_rollout(trace)[-1], 1e-5)

    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    A0 = A_all[layer][:, 0]                                                  # (H, 1 + P) [CLS]'s rows
    return Lesson(model=model.name, image=image, example=true_label is not None, true_label=true_label, shown=shown,
                  mean=float(mean.flat[0]), std=float(std.flat[0]), x=x, patch=(ph, pw), grid=(rows, cols),
                  patches=patches, labels=list(trace.tokens), W_patch_shape=tuple(W.shape),
                  darkest=int(np.argmin(patches.mean(axis=1))), tokens=tokens, X=X, layer=layer,
                  L=cfg.n_layers, H=cfg.n_heads, d_k=cfg.d_head, S=S_all[layer][:, 0], A=A0,
                  head=int(np.argmax(A0[:, 1:].max(axis=1))), rollout=R[0], logits=logits, probs=probs,
                  label_names=list(model.labels), activation=cfg.activation, diffs=diffs)


def _forward(model, X: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """The L pre-norm blocks in float64: x ← x + Attn(Norm₁(x)), x ← x + FFN(Norm₂(x)).
    Returns the residual stream entering each layer and after the last ((L + 1) × (n, d)), and each layer's
    scores S and weights A (L × (H, n, n))."""
    cfg = model.config
    H, d_k, n = cfg.n_heads, cfg.d_head, X.shape[0]
    scale = 1 / math.sqrt(d_k) if cfg.score_scale is None else cfg.score_scale
    f64 = lambda a: None if a is None else np.asarray(a, np.float64)        # noqa: E731
    x, resid, S_all, A_all = X, [X], [], []
    for blk in model.weights.blocks:
        a, f = blk.attn, blk.ffn
        h = norm_of(x, f64(blk.attn_norm.weight), f64(blk.attn_norm.bias), "layer", cfg.norm_eps)   # (n, d)
        q, k, v = (h @ f64(W) + (0 if bias is None else f64(bias)) for W, bias in
                   ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V)))           # (n, H·d_k) each
        q, k, v = (m.reshape(n, H, d_k).transpose(1, 0, 2) for m in (q, k, v))   # (H, n, d_k)
        S = q @ k.transpose(0, 2, 1) * scale                                 # (H, n, n)
        A = np.exp(S - S.max(-1, keepdims=True))
        A /= A.sum(-1, keepdims=True)                                        # (H, n, n) softmax
        Z = (A @ v).transpose(1, 0, 2).reshape(n, H * d_k)                   # (n, H·d_k) Concat(heads)
        x = x + Z @ f64(a.W_O) + (0 if a.b_O is None else f64(a.b_O))        # (n, d)
        h = norm_of(x, f64(blk.ffn_norm.weight), f64(blk.ffn_norm.bias), "layer", cfg.norm_eps)     # (n, d)
        u = h @ f64(f.W_in) + (0 if f.b_in is None else f64(f.b_in))         # (n, d_ff)
        x = x + _act(u, cfg.activation) @ f64(f.W_out) + (0 if f.b_out is None else f64(f.b_out))   # (n, d)
        resid.append(x)
        S_all.append(S)
        A_all.append(A)
    return resid, S_all, A_all


def _act(u: np.ndarray, name: str) -> np.ndarray:
    """GELU(u) = u·Φ(u) = ½·u·(1 + erf(u/√2)); another activation: the engine's."""
    if name == "gelu":
        erf = np.frompyfunc(math.erf, 1, 1)
        return 0.5 * u * (1 + erf(u / math.sqrt(2)).astype(np.float64))
    return ACTIVATIONS[name](u)


# ── the page ─────────────────────────────────────────────────────────────────────

def _vec(v: np.ndarray, k: int = SHOWN) -> str:
    return "[" + ", ".join(f"{x:+.3f}" for x in v[:k]) + (", …]" if len(v) > k else "]")


def _ink(row: np.ndarray) -> str:
    """Grey values 0–255 → block characters, two per pixel (dark ink = full block)."""
    return "".join(INK[int(round((255 - v) / 255 * (len(INK) - 1)))] * 2 for v in row)


def _grid(values: np.ndarray, rows: int, cols: int) -> list[str]:
    """Weights over the patches, row by row (P,) → lines of whole percents on the patch grid."""
    return [" ".join(f"{100 * v:3.0f}" for v in values[r * cols:(r + 1) * cols]) for r in range(rows)]


def _side_by_side(blocks: list[tuple[str, list[str]]], gap: int = 4) -> list[Text]:
    """Blocks of lines (a heading and its lines) printed next to each other."""
    width = [max(len(h), *(len(s) for s in lines)) for h, lines in blocks]
    out = [Text((" " * gap).join(h.ljust(wd) for (h, _), wd in zip(blocks, width)))]
    for i in range(len(blocks[0][1])):
        out.append(Text((" " * gap).join(lines[i].ljust(wd) for (_, lines), wd in zip(blocks, width))))
    return out


def render(lesson: Lesson, lang: str = "en") -> list:
    p, le = Page(TEXTS, lang), lesson
    (ph, pw), (rows, cols) = le.patch, le.grid
    C, h, w = le.x.shape
    image = p.t["example"].format(name=le.image, model=DEFAULT_MODEL) if le.example else le.image
    out = [p.rule("title", bold=True, model=le.model),
           p.say("intro", image=image, model=le.model, h=h, w=w, rows=rows, cols=cols, ph=ph, pw=pw, L=le.L,
                 H=le.H, d=le.d_model), Text("")]

    sh, sw = min(h, MAX_PIXELS), min(w, MAX_PIXELS)
    grey = le.shown.mean(axis=2) if C > 1 else le.shown[:, :, 0]           # (h, w)
    out += [p.rule("s_pixels"), p.say("pixels_rgb" if C > 1 else "pixels", h=h, w=w, C=C)]
    if (sh, sw) != (h, w):
        out.append(p.say("pixels_big", h=h, w=w, sh=sh, sw=sw))
    for r in range(sh):
        out.append(Text("  " + _ink(grey[r, :sw]) + "    " + " ".join(f"{v:3d}" for v in le.shown[r, :sw, 0])))
    out.append(p.say("normalise", mean=le.mean, std=le.std, white=(1 - le.mean) / le.std,
                     black=-le.mean / le.std, shape=shape(*le.x.shape)))
    for r in range(sh):
        out.append(Text("  " + " ".join(f"{v:+.2f}" for v in le.x[0, r, :sw])))
    out += [p.say("normalise_check", diff=le.diffs["pixels"]), Text("")]

    k = le.patches.shape[1]
    out += [p.rule("s_patches", rows=rows, cols=cols, ph=ph, pw=pw),
            p.say("patches", ph=ph, pw=pw, ph1=ph - 1, pw1=pw - 1, k=k, P=le.P)]
    tab = p.table("col_patch", "col_rows", "col_cols", "col_values")
    for i in range(min(le.P, MAX_PATCHES)):
        r, c = divmod(i, cols)
        p.row(tab, le.labels[1 + i], f"{ph * r}–{ph * r + ph - 1}", f"{pw * c}–{pw * c + pw - 1}",
              _vec(le.patches[i], 8), bold_first=True)
    out.append(tab)
    if le.P > MAX_PATCHES:
        out.append(p.say("patches_more", more=le.P - MAX_PATCHES))
    out += [p.say("patches_check", diff=le.diffs["patches"]), Text("")]

    i = le.darkest
    out += [p.rule("s_embed"),
            p.say("embed", ws=shape(*le.W_patch_shape), k=k, d=le.d_model, patch=le.labels[1 + i]),
            Text(f"  {_vec(le.patches[i], 8)} · W_patch + b_patch = {_vec(le.tokens[i])}   "
                 f"{shape(le.d_model)}"),
            p.say("conv", d=le.d_model, C=C, ph=ph, pw=pw, P=le.P, diff=le.diffs["conv"]),
            p.say("cls", ps=shape(le.P + 1, le.d_model), xs=shape(le.P + 1, le.d_model))]
    out.append(Text(f"  {p.t['row_cls']:<22} {_vec(le.X[0])}"))
    out.append(Text(f"  {p.t['row_patch'].format(patch=le.labels[1 + i], i=1 + i):<22} {_vec(le.X[1 + i])}"))
    out += [p.say("embed_check", diff=le.diffs["X"]), Text("")]

    out += [p.rule("s_attn", layer=le.layer), p.say("attn", rows=rows, cols=cols)]
    for start in range(0, le.H, 4):                                           # four heads to a line of grids
        out += _side_by_side([(p.t["head_grid"].format(head=hd, own=le.A[hd, 0]), _grid(le.A[hd, 1:], rows, cols))
                              for hd in range(start, min(le.H, start + 4))])
    hd = le.head
    best = 1 + int(np.argmax(le.A[hd, 1:]))
    out.append(p.say("head_row", head=hd, w=le.A[hd, best], patch=le.labels[best], d_k=le.d_k, top=TOP))
    s, a = le.S[hd], le.A[hd]
    e = np.exp(s - s.max())                                                   # (1 + P,)
    tab = p.table("col_key", "col_score", "col_exp", "col_weight")
    for j in np.argsort(-a, kind="stable")[:TOP]:
        p.row(tab, le.labels[j], f"{s[j]:+.3f}", f"{e[j]:.4f}", f"{a[j]:.4f}", bold_first=True)
    out += [tab, p.say("attn_sum", n=len(s), total=float(e.sum()), one=float(a.sum())),
            p.say("attn_check", H=le.H, layer=le.layer, ds=le.diffs["scores"], da=le.diffs["attentions"]), Text("")]

    R = le.rollout
    most = 1 + int(np.argmax(R[1:]))
    out += [p.rule("s_rollout", L=le.L), p.say("rollout", L=le.L, own=R[0])]
    out += [Text("  " + line) for line in _grid(R[1:], rows, cols)]
    out += [p.say("rollout_end", patch=le.labels[most], w=R[most], diff=le.diffs["rollout"]), Text("")]

    out += [p.rule("s_classify"), p.say("classify", L=le.L, ws=shape(le.d_model, len(le.logits)))]
    tab = p.table("col_label", "col_logit", "col_prob")
    for j in np.argsort(-le.probs, kind="stable"):
        p.row(tab, le.label_names[j], f"{le.logits[j]:+.3f}", f"{le.probs[j]:.4f}", bold_first=True)
    top = int(np.argmax(le.probs))
    end = "classify_true" if le.true_label is not None and le.true_label in le.label_names else "classify_end"
    out += [tab, p.say(end, model=le.model, label=le.label_names[top], p=le.probs[top], true=le.true_label),
            p.say("classify_check", act=le.activation.upper(), dr=le.diffs["residual"], dl=le.diffs["logits"])]
    return out


# ── the figure ───────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """vit: the image with its patch grid, [CLS]'s attention over the patches per head of the layer, the
    rollout over the patches, and the label probabilities (PNG + SVG)."""
    from ..viz.drawing import new_figure, save_all, styled

    t, le = Page(TEXTS, lang).t, lesson
    (ph, pw), (rows, cols) = le.patch, le.grid
    grey = le.shown.mean(axis=2)                                              # (h, w)

    def overlay(ax, weights: np.ndarray, title: str):
        ax.imshow(grey, cmap="gray", vmin=0, vmax=255, extent=(0, cols * pw, rows * ph, 0))
        ax.imshow(weights.reshape(rows, cols), cmap="magma", alpha=0.6, extent=(0, cols * pw, rows * ph, 0))
        for r in range(rows):
            for c in range(cols):
                ax.text((c + 0.5) * pw, (r + 0.5) * ph, f"{100 * weights[r * cols + c]:.0f}", ha="center",
                        va="center", fontsize=7, color="white")
        ax.set(xticks=[], yticks=[], title=title)

    @styled
    def draw():
        per_row = max(3, le.H)
        fig = new_figure(2.4 * per_row, 5.4)
        axes = fig.subplots(2, per_row)
        a = axes[0, 0]
        a.imshow(grey, cmap="gray", vmin=0, vmax=255)
        for r in range(1, rows):
            a.axhline(r * ph - 0.5, color="C0", lw=1)
        for c in range(1, cols):
            a.axvline(c * pw - 0.5, color="C0", lw=1)
        a.set(xticks=[], yticks=[], title=t["fig_image"].format(image=le.image, rows=rows, cols=cols))
        overlay(axes[0, 1], le.rollout[1:],
                t["fig_rollout"].format(L=le.L))
        b = axes[0, 2]
        y = np.arange(len(le.probs))
        b.barh(y, le.probs, color=["C3" if j == int(np.argmax(le.probs)) else "C0" for j in y])
        b.set_yticks(y, le.label_names, fontsize=8)
        b.invert_yaxis()
        b.set(xlim=(0, 1), title=t["fig_probs"])
        for ax in axes[0, 3:]:
            ax.set_visible(False)
        for hd in range(per_row):
            if hd < le.H:
                overlay(axes[1, hd], le.A[hd, 1:], t["fig_head"].format(layer=le.layer, head=hd))
            else:
                axes[1, hd].set_visible(False)
        fig.suptitle(t["fig_title"].format(model=le.model, P=le.P), fontsize=11)
        return fig

    return save_all(out_dir, [("vit", draw)], ["png", "svg"])
