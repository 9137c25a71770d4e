"""One text through the model, reduced to numbers per head: the unit of work of every backend.

    text ─tokenizer─▶ ids ─windows─▶ each window: model.run ─▶ A (L, H, n, n)
         ─▶ head_stats, detector masses ─▶ pooled over the windows, weighted by their tokens

A text that fits the model is one window, and its numbers are exactly `head_stats` of its
attention. A longer one is cut into windows (`corpus.windows`); pooling by token count
makes every query token of the text count once, as the (1/n)·Σᵢ of the definitions does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import QkvError
from ..models.model import Model
from .corpus import Template, template_of, windows
from .detectors import duplicate_token_pattern, pattern_mass, previous_token_pattern
from .stats import CLS, SEP, head_stats, uniform_entropy
from .totals import Failure, TextResult


@dataclass
class Setup:
    """What a worker needs to analyse texts, made once per worker: the model and its template."""

    model: Model
    window: int
    template: Template
    cls: str | None               # how the tokenizer spells [CLS], None if it adds none
    sep: str | None

    @property
    def not_applicable(self) -> dict[str, str]:
        """Statistics this tokenizer cannot have, and why."""
        return {name: f"{self.model.name}'s tokenizer adds no {tok} token"
                for name, tok, spelled in (("cls", CLS, self.cls), ("sep", SEP, self.sep)) if spelled is None}


def prepare(model: Model, window: int | None = None) -> Setup:
    """Check the model can read text and the window fits; find its [CLS]/[SEP]."""
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so text cannot be encoded; "
                       "add the checkpoint's tokenizer.json")
    limit = model.config.max_positions
    window = limit if window is None else int(window)
    if not 2 <= window <= limit:
        raise QkvError(f"--window {window} is outside 2..{limit} ({model.name}'s context); choose a size in it")
    template = template_of(model.tokenizer)
    return Setup(model=model, window=window, template=template,
                 cls=CLS if CLS in template.tokens else None, sep=SEP if SEP in template.tokens else None)


def analyse_text(setup: Setup, text: str) -> TextResult:
    """The statistics and detector scores of one text, (L, H) each, pooled over its windows."""
    model = setup.model
    ids, _ = model.tokenizer.encode(text)
    if len(ids) <= len(setup.template.prefix) + len(setup.template.suffix):
        raise QkvError("the text gives no tokens")
    sums: dict[str, np.ndarray] = {}
    total = 0                                                   # tokens over all windows
    uniform = 0.0
    weight_sum = None                                           # Σ A over the windows, (L, H)
    has_duplicates = False
    pieces = windows(ids, setup.window, setup.template)
    for piece in pieces:
        trace = model.run(piece, keep=("attentions",))
        A = trace.attentions                                    # (L, H, n, n)
        n = len(piece)
        for name, value in head_stats(A, trace.tokens, cls=setup.cls, sep=setup.sep, sinks=trace.sinks).items():
            if value is not None:
                sums[name] = sums.get(name, 0.0) + n * value    # (L, H), token-weighted
        dup = duplicate_token_pattern(piece)
        has_duplicates |= bool(dup.any())
        for name, pattern in (("previous_token", previous_token_pattern(n)), ("duplicate_token", dup)):
            sums[name] = sums.get(name, 0.0) + pattern_mass(A, pattern)
        mass = A.astype(np.float64).sum((-2, -1))               # (L, H), = n up to rounding
        weight_sum = mass if weight_sum is None else weight_sum + mass
        uniform += n * uniform_entropy(n, model.config.causal)
        total += n
    values = {name: v / total for name, v in sums.items() if name not in ("previous_token", "duplicate_token")}
    values["previous_token"] = sums["previous_token"] / weight_sum   # TransformerLens: Σ(A⊙P) / ΣA
    if has_duplicates:                                          # no repeated token: no evidence either way
        values["duplicate_token"] = sums["duplicate_token"] / weight_sum
    values["uniform_entropy"] = np.float64(uniform / total)
    return TextResult(values=values, tokens=total, windows=len(pieces))


def analyse_job(setup: Setup, index: int, line: int | None, text: str) -> tuple[int, TextResult | Failure]:
    """analyse_text, with a failure turned into a Failure record so the run goes on."""
    try:
        return index, analyse_text(setup, text)
    except QkvError as e:
        return index, Failure(index, line, str(e))
    except Exception as e:                                      # noqa: BLE001 — report it, keep going
        return index, Failure(index, line, f"{type(e).__name__}: {e}")
