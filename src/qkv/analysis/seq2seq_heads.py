"""What each head of an encoder–decoder does: three kinds of attention, each with the statistics
that mean something for it (`analyse` hands an encoder–decoder here).

    source text ─model.run (greedy translation)─▶ three attentions of one text
        encoder self   (L_enc, H, n_src, n_src)  bidirectional, as BERT:   self prev next punct first end max entropy
        decoder self   (L_dec, H, n_tgt, n_tgt)  causal, as a decoder:     self prev punct first max entropy
        cross          (L_dec, H, n_tgt, n_src)  target → source:          punct first end max entropy
    ─▶ each text counts once: means over texts, (L, H) per statistic and kind

The statistics are stats.py's (Clark et al. 2019) plus two:

    end = (1/n_q)·Σᵢ Σ_{j∈</s>} A[i,j]     to the source's end token(s) (Marian, T5: </s>), the no-op target
    max = (1/n_q)·Σᵢ maxⱼ A[i,j]           how focused: 1 = every row on one key, 1/n_k = evenly spread

Left out, with the reason kept in `not_applicable`: self, prev and next in cross-attention (query and
key positions are in two different sentences, so distances between them mean nothing); next in the
decoder (causal: a token never sees the next one); end in the decoder (the target's </s> is its last
token, seen only by itself). [CLS] and [SEP] are BERT's: encoder–decoder tokenizers add neither.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from ..runtime.errors import QkvError
from .corpus import Corpus, template_of
from .stats import attention_to, diagonal, entropy, punctuation_positions, uniform_entropy
from .totals import Failure

KINDS = ("encoder", "decoder", "cross")
KIND_TITLES = {"encoder": "encoder self-attention (source ↔ source, bidirectional)",
               "decoder": "decoder self-attention (target → earlier target, causal)",
               "cross": "cross-attention (target → source)"}
KIND_STATS = {"encoder": ("self", "prev", "next", "punct", "first", "end", "max", "entropy"),
              "decoder": ("self", "prev", "punct", "first", "max", "entropy"),
              "cross": ("punct", "first", "end", "max", "entropy")}
NOT_APPLICABLE = {
    "decoder": {"next": "causal: a token never sees the next one",
                "end": "the target's </s> is its last token, seen only by itself"},
    "cross": {name: "query and key positions are in two different sentences" for name in ("self", "prev", "next")},
}
SEQ2SEQ_DESCRIPTIONS = {"end": "attention to the source's end token (</s>)",
                        "max": "the largest weight of each row (1 = one key only)"}


def focus(attn: np.ndarray) -> np.ndarray:
    """(1/n_q)·Σᵢ maxⱼ A[i,j]: (..., n_q, n_k) → (...)."""
    return np.asarray(attn, dtype=np.float64).max(-1).mean(-1)


def kind_stats(kind: str, A: np.ndarray, key_tokens: list[str], end: list[int]) -> dict[str, np.ndarray]:
    """The statistics of KIND_STATS[kind] of one text's attention A (L, H, n_q, n_k) → name → (L, H).

    key_tokens: the keys' tokens (n_k); end: the positions of the source's end token(s) among them.
    """
    A = np.asarray(A, dtype=np.float64)                             # (L, H, n_q, n_k)
    make = {"self": lambda: diagonal(A, 0), "prev": lambda: diagonal(A, -1), "next": lambda: diagonal(A, 1),
            "punct": lambda: attention_to(A, punctuation_positions(key_tokens)),
            "first": lambda: attention_to(A, [0]), "end": lambda: attention_to(A, end),
            "max": lambda: focus(A), "entropy": lambda: entropy(A)}
    return {name: make[name]() for name in KIND_STATS[kind]}       # (L, H) each


@dataclass
class KindReport:
    """One kind of attention's statistics: name → (L, H), means over texts."""

    kind: str
    layers: int
    heads: int
    tokens: int                                  # query tokens over all texts (source or target)
    stats: dict[str, np.ndarray]
    uniform_entropy: float                       # mean entropy of evenly spread attention, same texts
    not_applicable: dict[str, str]

    def to_json(self) -> dict:
        return {"title": KIND_TITLES[self.kind], "layers": self.layers, "heads": self.heads, "tokens": self.tokens,
                "stats": {name: np.asarray(v).tolist() for name, v in self.stats.items()},
                "not_applicable": self.not_applicable, "uniform_entropy": self.uniform_entropy}


@dataclass
class Seq2SeqHeadReport:
    """An encoder–decoder's heads: one KindReport per kind of attention, and the translations read."""

    model: str
    texts: int
    kinds: dict[str, KindReport]                 # KINDS → report
    translations: list[str]                      # the model's greedy translation of each analysed text
    failures: list[Failure] = field(default_factory=list)

    def to_json(self) -> dict:
        """The JSON object of `qkv heads --json` on an encoder–decoder."""
        return {"model": self.model, "encoder_decoder": True, "texts": self.texts,
                "kinds": {kind: report.to_json() for kind, report in self.kinds.items()},
                "translations": self.translations, "failed": [asdict(f) for f in self.failures]}


def check_options(window, backend: str, workers: int | None, checkpoint) -> None:
    """What `analyse` offers single-stack models only: say so, with the fix."""
    if window is not None:
        raise QkvError("--window cuts single-stack texts; an encoder–decoder reads each source whole: drop --window")
    if backend != "local" or (workers or 1) > 1 or checkpoint is not None:
        raise QkvError("an encoder–decoder's heads are analysed in this process: drop --backend, --workers "
                       "and --checkpoint")


def analyse_seq2seq(model, texts: Iterable[str] | Corpus, max_new_tokens: int | None = None,
                    progress: Callable[[int], None] | None = None) -> Seq2SeqHeadReport:
    """Every head of an encoder–decoder over `texts` (sources), each translated greedily by the model.

    Runs in this process; each text counts once. A text that fails (too long, no tokens) is
    recorded in `failures` and skipped. progress: called with 1 after each text.
    """
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so text cannot be encoded; "
                       "add the checkpoint's tokenizer.json")
    template = template_of(model.tokenizer)
    special, suffix = len(template.prefix) + len(template.suffix), len(template.suffix)
    jobs = texts.texts() if isinstance(texts, Corpus) else ((i, None, t) for i, t in enumerate(texts))
    sums: dict[str, dict[str, np.ndarray]] = {kind: {} for kind in KINDS}
    uniform = dict.fromkeys(KINDS, 0.0)
    tokens = dict.fromkeys(KINDS, 0)
    translations, failures = [], []
    for index, line, text in jobs:
        try:
            trace = _trace(model, text, special, max_new_tokens)
        except QkvError as e:
            failures.append(Failure(index, line, str(e)))
            continue
        finally:
            if progress is not None:
                progress(1)
        src, tgt = trace.encoder.tokens, trace.tokens
        n_src, n_tgt = len(src), len(tgt)
        end = list(range(n_src - suffix, n_src))                    # the template's </s>
        per_kind = {"encoder": (trace.encoder.attentions, src, n_src, False),
                    "decoder": (trace.attentions, tgt, n_tgt, True),
                    "cross": (trace.cross.attentions, src, n_src, False)}
        for kind, (A, keys, n_k, causal) in per_kind.items():
            for name, value in kind_stats(kind, A, keys, end).items():
                sums[kind][name] = sums[kind].get(name, 0.0) + value    # (L, H)
            uniform[kind] += uniform_entropy(n_k, causal)
            tokens[kind] += A.shape[-2]
        translations.append(model.tokenizer.decode(trace.ids[1:], skip_special_tokens=True))
    count = len(translations)
    if count == 0:
        first = f": text {failures[0].index}: {failures[0].error}" if failures else ""
        raise QkvError(f"no text could be analysed{first}; give texts with words in them")
    cfg = model.config
    depth = {"encoder": cfg.n_layers, "decoder": cfg.n_decoder_layers, "cross": cfg.n_decoder_layers}
    kinds = {}
    for kind in KINDS:
        lacking = dict(NOT_APPLICABLE.get(kind, {}))
        stats = {name: v / count for name, v in sums[kind].items()}
        if suffix == 0 and "end" in stats:
            del stats["end"]
            lacking["end"] = f"{model.name}'s tokenizer adds no end token to the source"
        kinds[kind] = KindReport(kind=kind, layers=depth[kind], heads=cfg.n_heads, tokens=tokens[kind], stats=stats,
                                 uniform_entropy=uniform[kind] / count, not_applicable=lacking)
    return Seq2SeqHeadReport(model=model.name, texts=count, kinds=kinds, translations=translations,
                             failures=failures)


def _trace(model, text: str, special: int, max_new_tokens: int | None):
    """The trace of one source and its greedy translation (attentions only), or QkvError.

    special: how many tokens the tokenizer adds around every text ([CLS] … </s>)."""
    if len(model.tokenizer.encode(text)[0]) <= special:
        raise QkvError("the text gives no tokens")
    return model.run(text, keep=("attentions",), max_new_tokens=max_new_tokens)
