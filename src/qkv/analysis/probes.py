"""Linear probes: is a label linearly readable from a layer's stream? Logistic regression (scikit-learn) on the
activations of labelled texts, scored on texts it never saw, beside a control task that tells reading from
memorising (Hewitt & Liang 2019, "Designing and Interpreting Probes with Control Tasks").

For each layer L (the stream leaving block L, "L.residual_out", at each text's last token or averaged over its
tokens but the first, as qkv.analysis.steering reads it):

    X_L (N, d_model) → standardised (per dimension: (x − μ)/σ, from the training texts) → p(y | x) = softmax(W x + b)
    accuracy         = share of the held-out texts whose argmax is their label
    control accuracy = the same probe trained and scored on control labels: each word type (the text's last
                       word, lower-cased) gets one label drawn at random from the labels' own distribution, so a
                       probe can only score on held-out texts whose word it memorised
    selectivity      = accuracy − control accuracy

A probe that is accurate and selective reads something the stream encodes; an accurate but unselective one could
be memorising word types. The probe's direction — its weight vector in the residual basis, w / σ (the gradient of
its logit in x), made unit length — is a steering vector: for two labels, the direction towards the second
(`probe_directions`, saved by `qkv probe --out` as a llama.cpp control vector).

    report = probe_layers(model, texts, labels, layers=range(1, 30))
    report.layers[12].accuracy, report.layers[12].selectivity
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .steering import POINT, POSITIONS, side_activations

if TYPE_CHECKING:
    from ..models.model import Model

POINTS = ("residual", "attn_in", "attn_out", "residual_mid", "ffn_in", "ffn_pre", "neurons", "ffn_out",
          "residual_out")                       # the recorded activations with one vector a position (core.trace)

MAX_BYTES = 64 << 20                    # a probe data file larger than this is refused (it is read whole)


@dataclass
class LayerProbe:
    """One layer's probe: held-out accuracy on the labels and on the control task, and the probe's direction."""
    layer: int
    accuracy: float                     # held-out, the labels
    train_accuracy: float
    control_accuracy: float             # held-out, the control labels (per word type)
    direction: np.ndarray               # (d_model,) unit, residual basis: towards the second label (two labels);
                                        # the first class's row otherwise

    @property
    def selectivity(self) -> float:
        return self.accuracy - self.control_accuracy

    def as_json(self) -> dict:
        return {"layer": self.layer, "accuracy": self.accuracy, "train_accuracy": self.train_accuracy,
                "control_accuracy": self.control_accuracy, "selectivity": self.selectivity}


@dataclass
class ProbeReport:
    model: str
    labels: list[str]                   # the classes, sorted
    n_train: int
    n_test: int
    position: str
    majority: float                     # held-out accuracy of always answering the most common training label
    point: str = POINT                  # the activation probed, "L.point" (core.trace.INTERMEDIATES)
    layers: dict[int, LayerProbe] = field(default_factory=dict)

    def best(self) -> LayerProbe:
        return max(self.layers.values(), key=lambda p: (p.accuracy, p.selectivity, -p.layer))

    def as_json(self) -> dict:
        return {"model": self.model, "labels": self.labels, "n_train": self.n_train, "n_test": self.n_test,
                "position": self.position, "point": self.point, "majority": self.majority,
                "control": "Hewitt & Liang 2019: one random label per word type (the text's last word)",
                "layers": [p.as_json() for p in self.layers.values()]}


# ── data: text<TAB>label lines or JSON lines {"text": …, "label": …} ──────────────────────────────────────

def read_probe_data(path: str | Path) -> tuple[list[str], list[str]]:
    """(texts, labels) from PATH: UTF-8, one example a line, either TEXT<TAB>LABEL or a JSON object with "text" and
    "label" (a .jsonl file, or any file whose first line starts with '{'); blank lines skipped. One error naming the
    line for anything else, and for data no probe can be scored on (`check_probe_data`)."""
    from ..runtime.io import open_regular

    path = Path(path)
    try:
        with open_regular(path, MAX_BYTES) as f:
            raw = f.read()
    except OSError as e:
        raise QkvError(f"cannot read {path}: {e.strerror or e}; give a readable file of TEXT<TAB>LABEL lines") from None
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise QkvError(f"{path} is not UTF-8 text; give TEXT<TAB>LABEL lines or JSON lines in UTF-8") from None
    filled = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    as_json = path.suffix.lower() == ".jsonl" or (filled and filled[0][1].lstrip().startswith("{"))
    texts, labels = [], []
    for number, line in filled:
        text, label = (_json_line if as_json else _tab_line)(path, number, line)
        texts.append(text)
        labels.append(label)
    check_probe_data(texts, labels, str(path))
    return texts, labels


def _tab_line(path: Path, number: int, line: str) -> tuple[str, str]:
    text, sep, label = line.rpartition("\t")
    if not sep or not text.strip() or not label.strip():
        raise QkvError(f"{path} line {number} is not TEXT<TAB>LABEL (a tab, with text before it and a label after "
                       "it); fix that line")
    return text.strip(), label.strip()


def _json_line(path: Path, number: int, line: str) -> tuple[str, str]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise QkvError(f"{path} line {number} is not JSON ({e.msg}); give one object a line, "
                       '{"text": "…", "label": "…"}') from None
    if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not item["text"].strip():
        raise QkvError(f'{path} line {number} has no "text" string; give {{"text": "…", "label": "…"}}')
    label = item.get("label")
    if isinstance(label, bool) or not isinstance(label, (str, int)) or not str(label).strip():
        raise QkvError(f'{path} line {number}: "label" must be a non-empty string or an integer; fix that line')
    return item["text"].strip(), str(label).strip()


def check_probe_data(texts: Sequence[str], labels: Sequence[str], where: str = "the data") -> None:
    """One error unless there are two labels or more, each on at least 4 texts (2 to train on, 2 held out), and as
    many labels as texts."""
    if len(texts) != len(labels):
        raise QkvError(f"{where}: {len(texts)} texts and {len(labels)} labels; give one label per text")
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    if len(counts) < 2:
        raise QkvError(f"{where} has {len(counts)} label{'s' if len(counts) != 1 else ''}; a probe needs two or "
                       "more (e.g. positive and negative)")
    few = [k for k, c in counts.items() if c < 4]
    if few:
        raise QkvError(f"{where}: label {few[0]!r} is on {counts[few[0]]} texts; give each label at least 4 (some "
                       "to train on, some held out)")


# ── the probe ────────────────────────────────────────────────────────────────────────────────────────────────

def word_type(text: str) -> str:
    """The control task's word type of a text: its last word, lower-cased, without punctuation."""
    words = re.findall(r"\w+", text.lower())
    return words[-1] if words else text.strip().lower()


def control_labels(texts: Sequence[str], labels: Sequence[str], seed: int = 0) -> list[str]:
    """Hewitt & Liang's control task: one label per word type (`word_type`), drawn from the labels' own
    distribution, the same for every text of that type."""
    rng = np.random.default_rng(seed)
    types = sorted({word_type(t) for t in texts})
    drawn = rng.choice(np.asarray(labels, dtype=object), size=len(types), replace=True)
    table = dict(zip(types, drawn))
    return [str(table[word_type(t)]) for t in texts]


def split(labels: Sequence[str], test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices, stratified by label: each label's share held out, at least one text of each."""
    if not 0.0 < test_fraction < 1.0:
        raise QkvError(f"the held-out share is {test_fraction}; give a number between 0 and 1, e.g. 0.25")
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels, dtype=object)
    train, test = [], []
    for label in sorted(set(labels.tolist())):
        idx = rng.permutation(np.flatnonzero(labels == label))                           # (n_label,)
        k = min(len(idx) - 1, max(1, int(round(test_fraction * len(idx)))))
        test += idx[:k].tolist()
        train += idx[k:].tolist()
    return np.sort(np.array(train)), np.sort(np.array(test))


def fit_probe(x_train: np.ndarray, y_train: Sequence[str], x_test: np.ndarray, y_test: Sequence[str],
              c: float = 1.0) -> tuple[float, float, np.ndarray]:
    """Logistic regression on standardised activations → (held-out accuracy, training accuracy, W in the residual
    basis (K, d_model): W_std / σ, one row per class (one row for two classes: towards the second))."""
    from sklearn.linear_model import LogisticRegression

    mu = x_train.mean(axis=0)                                                            # (d,)
    sigma = x_train.std(axis=0)                                                          # (d,)
    sigma = np.where(sigma > 0, sigma, 1.0)
    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit((x_train - mu) / sigma, list(y_train))
    test = float(np.mean(clf.predict((x_test - mu) / sigma) == np.asarray(y_test, dtype=object)))
    train = float(np.mean(clf.predict((x_train - mu) / sigma) == np.asarray(y_train, dtype=object)))
    return test, train, clf.coef_ / sigma                                                # (K, d)


def probe_activations(activations: dict[int, np.ndarray], texts: Sequence[str], labels: Sequence[str], *,
                      model: str = "", position: str = "last", point: str = POINT, test_fraction: float = 0.25,
                      seed: int = 0, c: float = 1.0) -> ProbeReport:
    """Probes on given activations ({L: X (N, d)}): per layer, held-out accuracy, the control task's and the
    probe's direction (module doc). The split and the control labels are the same for every layer."""
    check_probe_data(texts, labels)
    train, test = split(labels, test_fraction, seed)
    y = np.asarray(labels, dtype=object)
    control = np.asarray(control_labels(texts, labels, seed), dtype=object)
    classes = sorted(set(labels))
    common = max(classes, key=lambda k: (int(np.sum(y[train] == k)), k))
    report = ProbeReport(model=model, labels=classes, n_train=len(train), n_test=len(test), position=position,
                         majority=float(np.mean(y[test] == common)), point=point)
    for layer, x in activations.items():
        acc, train_acc, w = fit_probe(x[train], y[train], x[test], y[test], c)
        if len(set(control[train].tolist())) > 1:
            control_acc = fit_probe(x[train], control[train], x[test], control[test], c)[0]
        else:                                                  # one control label drawn for all: always right
            control_acc = float(np.mean(control[test] == control[train][0]))
        direction = w[0] / max(float(np.linalg.norm(w[0])), 1e-300)                      # (d,)
        report.layers[layer] = LayerProbe(layer, acc, train_acc, control_acc, direction)
    return report


def probe_layers(model: "Model", texts: Sequence[str], labels: Sequence[str], layers: Sequence[int], *,
                 position: str = "last", point: str = POINT, test_fraction: float = 0.25, seed: int = 0,
                 c: float = 1.0, progress: Callable[[int, int], None] | None = None) -> ProbeReport:
    """Probe the activation POINT ("residual_out": the stream leaving the block; any of POINTS) of every layer of
    LAYERS (0..L−1) of MODEL for LABELS of TEXTS (module doc)."""
    if position not in POSITIONS:
        raise QkvError(f"unknown position {position!r}; give one of {', '.join(POSITIONS)}")
    if point not in POINTS:
        raise QkvError(f"cannot probe {point!r}; give one of {', '.join(POINTS)}")
    check_probe_data(texts, labels)
    layers = sorted({model.check_layer(layer) for layer in layers})
    if not layers:
        raise QkvError(f"no layer to probe; give layers among 0..{model.config.n_layers - 1}, or all")
    acts = side_activations(model, texts, layers, position, progress, point)
    return probe_activations(acts, texts, labels, model=model.name, position=position, point=point,
                             test_fraction=test_fraction, seed=seed, c=c)


def probe_directions(report: ProbeReport) -> dict[int, np.ndarray]:
    """{L: unit direction (d_model,)} of a two-label probe, for the layers llama.cpp can steer (1 on): adding it
    moves the stream towards the second label (report.labels[1]). One error for more than two labels."""
    if report.point != POINT:
        raise QkvError(f"the probe read {report.point!r}; a control vector is added to the stream leaving a block, "
                       f"so make its direction from a probe of {POINT!r}")
    if len(report.labels) != 2:
        raise QkvError(f"the probe has {len(report.labels)} labels; a steering direction is made from a probe of "
                       "two (e.g. positive and negative)")
    return {layer: p.direction for layer, p in report.layers.items() if layer >= 1}
