"""`qkv explain TOPIC`: the guide's steps beyond the attention walkthrough (docs/guide.md), run on real models.

    attention   the walkthrough of one head (qkv.lessons.attention; `qkv explain "some text"`)
    positions   sinusoidal table, RoPE on SmolLM2, MiniLM's learned table
    kv-cache    what the cache holds, step by step, and what it saves
    gqa         query heads sharing K/V heads, and mean-pooling a multi-head model's K/V heads
    linear      linear attention: φ(Q)(φ(K)ᵀV), the state it carries, on MiniMax, Mamba or a softmax model's heads
    sparse      masks the tiled kernel runs (local, global, random, block)
    flash       the online softmax, tile by tile
    ffn         one token's vector through the FFN: W_in, activation, W_out, what the top neurons write
    vit         an image through a Vision Transformer: pixels, patches, [CLS], attention over patches, the answer
    patching    one head of an IOI prompt pair by exact activation patching, AtP and path patching, side by side
    proteins    a protein's contact map from every head's attention (ESM-2's contact head), beside the best heads
    circuits    one small attribution graph: a transcoder, an edge, error nodes, the scores (qkv.graphs.lesson:
                graphs/ comes after lessons/, so cli/explain.py adds it with `register`)

Every topic module `qkv.lessons.<topic>` exposes the same four things:

    DEFAULT_MODEL: str | None           the model it loads when the user names none
    build(model, text) -> Lesson        every number, each checked against the engine (a mismatch
                                        is a bug: RuntimeError naming the number)
    render(lesson, lang) -> list        rich renderables, "en" or "ko"
    figures(lesson, out_dir, lang) -> list[Path]   PNG + SVG, written atomically

Modules are imported only when their topic is asked for (`lesson_module`). The small helpers
the lessons share live here: `same` (the check), `Page` (one language's sentences and tables).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..runtime.errors import QkvError

LANGS = ("en", "ko")


@dataclass(frozen=True)
class Topic:
    """One lesson: the module that builds it and a line for `qkv explain --help`."""

    module: str
    summary: str


TOPICS: dict[str, Topic] = {
    "attention": Topic("qkv.lessons.attention", "one head, step by step: Q, K, V → S → softmax → A·V → W_O (the default)"),
    "positions": Topic("qkv.lessons.positions", "sinusoidal table, RoPE on SmolLM2, MiniLM's learned positions"),
    "kv-cache": Topic("qkv.lessons.kvcache", "what the KV cache holds, token by token, and the time it saves"),
    "gqa": Topic("qkv.lessons.gqa", "query heads sharing K/V heads; a multi-head model's K/V mean-pooled"),
    "linear": Topic("qkv.lessons.linear", "linear attention: the n × n matrix never built, a d × d state carried "
                                          "(MiniMax's lightning layers, Mamba's scans, or a softmax model's q, k, v)"),
    "sparse": Topic("qkv.lessons.sparse", "sparse masks (window, global, random, block) in the tiled kernel"),
    "flash": Topic("qkv.lessons.flash", "FlashAttention's online softmax, tile by tile"),
    "ffn": Topic("qkv.lessons.ffn", "one token through the FFN: W_in, activation, W_out, what its top neurons write"),
    "vit": Topic("qkv.lessons.vit", "an image as patch tokens: pixels, patches · W_patch, [CLS], attention over "
                                    "patches, rollout, the classifier (TEXT: an image file, or a digit 0–9)"),
    "patching": Topic("qkv.lessons.patching", "one head by exact patching, attribution patching (AtP) and path "
                                              "patching, side by side (TEXT: 'CLEAN | CORRUPTED')"),
    "proteins": Topic("qkv.lessons.proteins", "a protein's 3-D contacts from attention: ESM-2's contact map beside "
                                              "the heads that draw it (TEXT: a sequence; --model an ESM-2 checkpoint)"),
}


def register(name: str, topic: Topic) -> None:
    """Add a topic whose module lives in a later folder (graphs/: `circuits`): its folder's command line registers it,
    so that nothing here imports past lessons/ (tests/test_imports.py)."""
    TOPICS.setdefault(name, topic)


def lesson_module(topic: str) -> ModuleType:
    """The module of a topic (imported now), or one clear error naming the topics."""
    if topic not in TOPICS:
        raise QkvError(f"unknown topic {topic!r}; choose one of: {', '.join(TOPICS)}")
    return importlib.import_module(TOPICS[topic].module)


def check_lang(lang: str) -> None:
    if lang not in LANGS:
        raise QkvError(f"unknown language {lang!r}; use --lang en (English) or --lang ko (Korean)")


def same(what: str, mine, engine, tol: float, *, rel: bool = False) -> float:
    """The largest difference between a lesson's number(s) and the engine's; a bug past `tol`.

    rel=True measures it relative to the largest |engine| value (at least 1).
    """
    a, b = np.asarray(mine, np.float64), np.asarray(engine, np.float64)
    if a.shape != b.shape:
        raise RuntimeError(f"lesson: {what} has shape {a.shape}, the engine's {b.shape}")
    diff = float(np.max(np.abs(a - b), initial=0.0))
    scale = max(1.0, float(np.max(np.abs(b), initial=0.0))) if rel else 1.0
    if not np.isfinite(diff) or diff > tol * scale:
        raise RuntimeError(f"lesson: {what} differs from the engine's by {diff:.2e} (tolerance {tol * scale:.1e})")
    return diff


def shape(*dims) -> str:
    return str(tuple(int(d) for d in dims))


def nbytes(b: float) -> str:
    """1536 → '1.5 KiB', 5.0e6 → '4.8 MiB'."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


class Page:
    """One lesson's sentences in one language, and the rules and tables a page is made of."""

    def __init__(self, texts: dict[str, dict[str, str]], lang: str):
        check_lang(lang)
        self.t = texts[lang]
        self.lang = lang

    def say(self, key: str, **values) -> Text:
        return Text(self.t[key].format(**values))

    def rule(self, key: str, bold: bool = False, **values) -> Rule:
        return Rule(Text(self.t[key].format(**values), style="bold" if bold else ""), align="left")

    def table(self, *columns: str) -> Table:
        tab = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 2))
        for c, column in enumerate(columns):
            tab.add_column(Text(self.t.get(column, column)), justify="left" if c == 0 else "right")
        return tab

    @staticmethod
    def row(tab: Table, *cells, bold_first: bool = False) -> None:
        tab.add_row(*[Text(str(c), style="bold" if bold_first and i == 0 else "") for i, c in enumerate(cells)])


# ── the command line's side: `qkv explain [TOPIC] [TEXT]` ────────────────────────

def parse(args: tuple[str, ...] | list[str]) -> tuple[str, str | None]:
    """`qkv explain [TOPIC] [TEXT]` → (topic, text or None): a first argument that names a topic is the
    topic, anything else is the text of the attention walkthrough. A word that looks like a
    misspelt topic, or a second argument after a text, is one clear error."""
    import difflib

    args = list(args)
    if len(args) > 2:
        raise QkvError(f"qkv explain takes a topic and one text, got {len(args)} arguments; quote the text, "
                       "e.g. qkv explain \"The cat sat on the mat\"")
    if not args:
        return "attention", None
    first, text = args[0], (args[1] if len(args) == 2 else None)
    if first in TOPICS:
        return first, text
    word = first.strip().lower()
    near = [t for t in TOPICS if word.replace("_", "-").replace(" ", "-") == t or word.replace("-", "").replace(
        "_", "") == t.replace("-", "")] or difflib.get_close_matches(word, list(TOPICS), n=1, cutoff=0.8)
    if text is not None:
        raise QkvError(f"{first!r} is not a topic (topics: {', '.join(TOPICS)}); to explain a text, give it as "
                       "one quoted argument")
    if near and " " not in first.strip():
        raise QkvError(f"{first!r} is not a topic; did you mean {near[0]!r}? (topics: {', '.join(TOPICS)}; to "
                       f"explain the text {first!r}, run qkv explain attention {first!r})")
    return "attention", first


def topics_help() -> str:
    """The topics, one per line, for `qkv explain --help`."""
    width = max(map(len, TOPICS))
    return "\n".join(f"  {name:<{width}}  {topic.summary}" for name, topic in TOPICS.items())


def attention_figures(model, text: str, layer: int, head: int, out_dir) -> list:
    """--out of the walkthrough: the followed head's attention heatmap (PNG + SVG)."""
    from ..viz.drawing import save_figure
    from ..viz.figures import head_heatmap

    trace = model.run(text, layers=[layer], keep=("attentions",))
    return save_figure(head_heatmap(trace, layer, head), out_dir, f"explain_layer{layer}_head{head}")


def explain_help() -> str:
    """The text of `qkv explain --help`: what it does and every topic."""
    return ("Explain one step of docs/guide.md on a real model, every number recomputed and checked "
            "against the engine, in English or Korean (--lang ko).\n\n"
            "TOPIC is one of the topics below; without one (or when the first argument is not a topic) the "
            "argument is the TEXT of the attention walkthrough: one head of the model through X → Q, K, V → "
            "Q·Kᵀ → S = Q·Kᵀ/√d_k → A = softmax(S + M) → Z = A·V → Concat·W_O, then why √d_k matters (on a decoder, --model "
            "smollm2, also RMSNorm, RoPE, GQA and the causal mask). TEXT defaults to \"The cat sat on the "
            "mat\"; for a text that is a topic's name, run qkv explain attention \"positions\". vit reads an "
            "image instead: TEXT is an image file, or a digit 0–9 for that example digit of digits-vit (default "
            "3).\n\n"
            "\b\nTopics:\n" + topics_help() + "\n\n"
            "--out DIR writes the topic's figures (PNG and SVG). Each topic loads its own model unless --model "
            "is given (attention: minilm; positions, kv-cache, gqa, linear, sparse, flash, ffn, patching, circuits: smollm2; "
            "vit: digits-vit; proteins: none ships, give an ESM-2 checkpoint). --layer chooses the layer of attention, flash, ffn, vit and circuits (ffn's and "
            "circuits' default: the middle one). circuits also needs --transcoders DIR, one transcoder per layer of the model. "
            "patching follows head --layer.--head (default: the one exact patching moves most); its TEXT is two "
            "prompts of the same token count, 'CLEAN | CORRUPTED' (default the IOI pair). proteins' TEXT is a protein's "
            "sequence in one-letter codes (default Trp-cage, NLYIQWLKDGGPSSGRPPPS).")
