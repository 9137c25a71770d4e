"""FFN neurons as key–value memories (Geva et al. 2021, "Transformer Feed-Forward Layers Are Key-Value
Memories"): what makes each neuron of a layer fire, and what it writes.

An FFN is a sum over its d_ff neurons,

    FFN(x) = Σ_i h_i(x)·W_out[i] + b_out,    h = act(x·W_in + b_in)   (gated: act(x·W_gate) ⊙ (x·W_in + b_in))

Column i of W_in (and of W_gate) is a key: h_i, the neuron's memory coefficient (the engine's "neurons"
intermediate), is large where the stream x matches a pattern. Row i of W_out is its value, written into
the stream h_i times. Read through the unembedding as the logit lens reads the stream,

    logits_i = (W_out[i] ⊙ γ) · W_vocab      γ the final norm's scale (LayerNorm: W_out[i] centred over d_model
                                             first, the linear part of the norm); OPT-350m's unembed_in between

(the norm's 1/rms frozen at 1, biases left out, × the logit scale of Cohere and Granite): the tokens with the
largest entries are the ones the value promotes, the smallest the ones it suppresses, per unit of h_i.
A gated FFN's h_i takes either sign: a large negative h_i writes −W_out[i] and swaps the two lists.

    neurons(model, layer, texts=..., text=..., top=K, neuron=...)   → NeuronReport: for each chosen neuron
        its top-activating contexts over a corpus, its statistics there, its promoted / suppressed tokens
    value_logits(model, rows)       (k, d_model) value vectors → (k, V) their logits as above
    default_corpus()                docs/heads-corpus.txt of qkv's source tree (`qkv heads`' example corpus)

Which neurons: `neuron=` the given ones; else with TEXT the `top` of largest max_t h_i on TEXT's tokens; else
the `top` of largest max h_i over the corpus. "Most active" is the largest value of h_i (not |h_i|): where
the neuron writes +W_out[i] the most.

The corpus streams (`corpus.open_corpus`, cut into windows the model takes: `corpus.windows`): windows are
sorted by length within groups of BUFFER and run BATCH_TOKENS padded tokens a pass (right padding, masked),
and per tracked neuron only its `contexts` best (activation, where, the tokens around it) are kept, merged
batch by batch with np.argpartition: memory is bounded by the batch, never the corpus.
A model without an LM head (MiniLM) or with a masked-LM head (not linear in the stream) has no value
logits: the report lists the contexts alone and says why (`NeuronReport.vocab`). A MoE layer (a routed FFN)
has no single d_ff hidden and is refused. The figure and the page: `viz.neuron_figures`.
The streaming pieces (corpus_triples, window_pieces, padded_batches, TopContexts, contexts_of) also serve
the SAE's feature pages (`features.pages`): a latent's top contexts are kept the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..core.blocks import linear, unembed_in
from ..runtime.errors import QkvError, check_index
from ..core.stack import transformer
from ..core.trace import Recorder
from .corpus import Corpus, template_of, windows

if TYPE_CHECKING:
    from ..models.model import Model

TOP = 5                  # neurons chosen when none are given
CONTEXTS = 10            # top-activating contexts kept per neuron
WINDOW = 8               # tokens of context kept on each side of the activating token
TOKENS = 10              # promoted and suppressed tokens listed per neuron
MAX_TOKENS = 512         # the longest window a text is cut into (or the model's context, if shorter)
BATCH_TOKENS = 2048      # padded tokens a forward pass (a stored model dequantises its tiles once a pass: fewer
                         # passes are faster; SmolLM2 peaks ~100 MB above the model's own memory)
BUFFER = 256             # windows sorted by length together, so that a batch pads little
DEFAULT_CORPUS = Path(__file__).resolve().parents[3] / "docs" / "heads-corpus.txt"   # in a source checkout
DEFAULT_NAME = "docs/heads-corpus.txt"


def default_corpus() -> Path:
    """qkv's own corpus (60 English sentences, `qkv heads`' example), where a source checkout has it."""
    if not DEFAULT_CORPUS.is_file():
        raise QkvError(f"no corpus given, and qkv's own ({DEFAULT_NAME} of its source tree) is not installed with "
                       "this package; give one with --file CORPUS (a UTF-8 text file, one text per line)")
    return DEFAULT_CORPUS


@dataclass
class Example:
    """One of a neuron's top-activating contexts: where it is, and the neuron's h on it and around it."""

    text: int                      # the text's index in the corpus (0-based)
    line: int | None               # its first line in the file (None: texts given as a list)
    window: int                    # which window of the text (0 unless a long text was cut)
    position: int                  # the activating token's position in that window
    activation: float              # h_i there
    tokens: list[str]              # the context's tokens as a reader sees them, the activating one at `at`
    at: int
    activations: list[float]       # h_i on each of `tokens`

    @property
    def token(self) -> str:
        return self.tokens[self.at]


@dataclass
class Neuron:
    """One neuron of the layer: its statistics over the corpus, its best contexts, what its value writes."""

    index: int                     # 0..d_ff-1
    max: float                     # over every token of the corpus
    min: float
    mean: float
    positive: float                # the fraction of tokens with h_i > 0
    examples: list[Example]        # the largest activations first
    promotes: list[tuple[int, str, float]] = field(default_factory=list)     # (id, token, logit), largest first
    suppresses: list[tuple[int, str, float]] = field(default_factory=list)   # smallest first
    on_text: float | None = None   # max of h_i over TEXT's tokens (None: no TEXT)


@dataclass
class NeuronReport:
    """What `neurons` found for one layer (see the module)."""

    model: str
    layer: int
    d_ff: int
    gated: bool
    activation: str
    chosen: str                    # how the neurons were chosen
    corpus: str                    # the corpus file as given (or "texts")
    texts: int                     # texts read
    windows: int
    tokens: int                    # tokens the statistics are over
    neurons: list[Neuron]
    vocab: str | None = None       # None: promotes / suppresses computed; else why they are not
    text: str | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)   # (text index, why) of texts not read
    sep: str = ""                  # what views put between tokens: " " for WordPiece (its labels carry no ␣)

    def neuron(self, index: int) -> Neuron:
        for n in self.neurons:
            if n.index == index:
                return n
        raise QkvError(f"neuron {index} is not in this report; it has {[n.index for n in self.neurons]}")

    def as_json(self) -> dict:
        """Plain JSON: the report's fields, each neuron's contexts and tokens as objects."""
        def tokens(items):
            return [{"id": i, "token": t, "logit": round(v, 5)} for i, t, v in items]

        return {
            "model": self.model, "layer": self.layer, "d_ff": self.d_ff, "gated": self.gated,
            "activation": self.activation, "chosen": self.chosen, "corpus": self.corpus, "texts": self.texts,
            "windows": self.windows, "tokens": self.tokens, "text": self.text, "vocab": self.vocab, "sep": self.sep,
            "skipped": [{"text": i, "error": e} for i, e in self.skipped],
            "neurons": [{
                "index": n.index, "max": round(n.max, 5), "min": round(n.min, 5), "mean": round(n.mean, 5),
                "positive": round(n.positive, 5), "on_text": None if n.on_text is None else round(n.on_text, 5),
                "contexts": [{"text": e.text, "line": e.line, "window": e.window, "position": e.position,
                              "token": e.token, "activation": round(e.activation, 5), "tokens": e.tokens, "at": e.at,
                              "activations": [round(a, 5) for a in e.activations]} for e in n.examples],
                "promotes": tokens(n.promotes), "suppresses": tokens(n.suppresses)} for n in self.neurons],
        }


# ── checks ───────────────────────────────────────────────────────────────────────

def check_layer(model: "Model", layer: int) -> int:
    """LAYER (negative from the end) → 0..L-1 of a single-stack model whose FFN there is dense, or one error."""
    cfg = model.config
    if getattr(cfg, "encoder_decoder", False):
        raise QkvError(f"{model.name} is an encoder–decoder; qkv neurons reads a single stack (a decoder such as "
                       "--model smollm2, or an encoder such as minilm)")
    layer = model.check_layer(layer)
    if cfg.moe_layer(layer):
        dense = [i for i in range(cfg.n_layers) if not cfg.moe_layer(i)]
        raise QkvError(f"layer {layer} of {model.name} routes its FFN among {cfg.n_experts} experts (MoE), so it has "
                       "no single d_ff hidden; " + (f"choose a dense layer ({', '.join(map(str, dense))})" if dense
                                                     else "qkv neurons needs a model with dense FFNs"))
    if cfg.d_ff == 0:
        raise QkvError(f"{model.name} has no FFN (d_ff = 0), so no neurons; choose a model with FFNs")
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so text cannot be encoded; add the checkpoint's tokenizer.json")
    return layer


def _chosen(model: "Model", neuron: int | Sequence[int], d_ff: int) -> list[int]:
    """NEURON (one index or several, negative from the end) → distinct indices 0..d_ff-1, or one error."""
    given = [neuron] if isinstance(neuron, (int, np.integer)) else list(neuron)
    if not given:
        raise QkvError("no neuron given; give one or more indices, e.g. --neuron 12,40")
    out = []
    for i in given:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise QkvError(f"neuron {i!r} is not an index; give integers, e.g. --neuron 12,40")
        out.append(check_index("neuron", int(i), d_ff, f"this layer of {model.name}"))
    return list(dict.fromkeys(out))


# ── the value vectors through the unembedding ───────────────────────────────────

def no_vocab(model: "Model") -> str | None:
    """Why the model's neurons have no value logits (None: they have)."""
    w = model.weights
    if w.W_vocab is None:
        return f"{model.name} has no LM head (W_vocab), so the tokens a value promotes are not defined: contexts only"
    if getattr(w, "W_head", None) is not None:
        return (f"{model.name} reads its logits through a masked-LM head (dense, activation, LayerNorm), which is not "
                "linear in the stream: contexts only")
    return None


def value_logits(model: "Model", rows: np.ndarray) -> np.ndarray:
    """(k, d_model) vectors written into the residual stream → (k, V) their logits: (v ⊙ γ)·W_vocab (see the module).
    W_vocab may be stored (a GGUF's blocks): the product reads it in place, never dequantised whole."""
    why = no_vocab(model)
    if why is not None:
        raise QkvError(why)
    w, cfg = model.weights, model.config
    v = np.array(rows, dtype=np.float32)                                     # (k, d_model)
    if w.final_norm is not None:
        if cfg.norm == "layer":
            v -= v.mean(axis=-1, keepdims=True)                              # LayerNorm's centring: linear
        v *= w.final_norm.weight                                             # γ
    z = linear(unembed_in(v, w), w.W_vocab)                                  # (k, V)
    return z * np.float32(cfg.logit_scale) if cfg.logit_scale != 1 else z


def value_rows(model: "Model", layer: int, index: Sequence[int]) -> np.ndarray:
    """W_out[index] (k, d_model) float32 of LAYER's FFN; a stored W_out (GGUF) is dequantised for this layer
    alone (d_ff·d_model numbers: 3.5 MB for SmolLM2)."""
    W = np.asarray(model.weights.blocks[layer].ffn.W_out)                   # (d_ff, d_model)
    return np.asarray(W[np.asarray(index, dtype=np.int64)], dtype=np.float32)


# ── streaming the corpus ─────────────────────────────────────────────────────────

def corpus_triples(texts) -> tuple[Iterator[tuple[int, int | None, str]], int | None, str]:
    """(index, line, text) triples, how many (None: unknown), and the corpus's name."""
    if isinstance(texts, Corpus):
        return texts.texts(), texts.count, str(texts.path)
    if isinstance(texts, (str, bytes)):
        raise QkvError("texts= takes a list of texts or open_corpus(path), not one string; give [text] for one")
    count = len(texts) if hasattr(texts, "__len__") else None
    return ((i, None, t) for i, t in enumerate(texts)), count, "texts"


def window_pieces(model: "Model", texts, length: int, skipped: list,
                  progress) -> Iterator[tuple[tuple[int, int, int], np.ndarray]]:
    """((text, line, window), ids (n,)) for every window of every text; a text that cannot be read is skipped."""
    template = template_of(model.tokenizer)
    triples, count, _ = texts
    for done, (index, line, text) in enumerate(triples, 1):
        try:
            if not isinstance(text, str):
                raise QkvError(f"not a string ({type(text).__name__})")
            ids, _ = model.tokenizer.encode(text)
            if len(ids) <= len(template.prefix) + len(template.suffix):
                raise QkvError("the text gives no tokens")
            for k, piece in enumerate(windows(ids, length, template)):
                yield (index, -1 if line is None else line, k), piece
        except QkvError as e:
            skipped.append((index, str(e)))
        if progress is not None:
            progress(done, count)


def padded_batches(pieces: Iterator, pad: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ids (B, n), lengths (B,), where (B, 3)): windows of similar length, right-padded, ≤ BATCH_TOKENS padded tokens."""
    while True:
        group = sorted(islice(pieces, BUFFER), key=lambda p: len(p[1]))
        if not group:
            return
        start = 0
        while start < len(group):
            end = start + 1
            while end < len(group) and (end + 1 - start) * len(group[end][1]) <= BATCH_TOKENS:
                end += 1
            part = group[start:end]
            lengths = np.array([len(p) for _, p in part])
            ids = np.full((len(part), lengths.max()), pad, np.int64)               # (B, n)
            for r, (_, p) in enumerate(part):
                ids[r, :len(p)] = p
            yield ids, lengths, np.array([w for w, _ in part], np.int64)
            start = end


class TopContexts:
    """Per tracked neuron (K columns), its C largest activations so far, where they were and their contexts."""

    def __init__(self, K: int, C: int, w: int):
        self.C, self.offsets = C, np.arange(-w, w + 1)                         # (2w+1,)
        self.value = np.full((C, K), -np.inf, np.float32)                      # (C, K)
        self.where = np.full((C, K, 4), -1, np.int64)                          # text, line, window, position
        self.ids = np.full((C, K, 2 * w + 1), -1, np.int64)                    # the context's token ids (-1: none)
        self.acts = np.full((C, K, 2 * w + 1), np.nan, np.float32)             # h on them
        self.lo = np.full(K, np.inf)                                           # min over the corpus
        self.sum, self.positive, self.count = np.zeros(K), np.zeros(K), 0

    def add(self, h: np.ndarray, ids: np.ndarray, lengths: np.ndarray, where: np.ndarray) -> None:
        """h (B, n, K) one batch's activations, ids (B, n), lengths (B,), where (B, 3)."""
        B, n, K = h.shape
        real = np.arange(n)[None, :] < lengths[:, None]                        # (B, n)
        values = h[real]                                                       # (T, K) the real tokens
        self.lo = np.minimum(self.lo, values.min(axis=0))
        self.sum += values.sum(axis=0, dtype=np.float64)
        self.positive += (values > 0).sum(axis=0)
        self.count += len(values)
        flat = np.where(real.reshape(-1, 1), h.reshape(B * n, K), -np.inf)    # (B·n, K)
        c = min(self.C, B * n)
        rows = np.argpartition(-flat, c - 1, axis=0)[:c]                       # (c, K) each column's c largest
        value = np.take_along_axis(flat, rows, axis=0)                         # (c, K)
        b, p = np.divmod(rows, n)                                              # (c, K) batch row, position
        pos = p[..., None] + self.offsets                                      # (c, K, 2w+1)
        inside = (pos >= 0) & (pos < lengths[b][..., None])
        pos = np.clip(pos, 0, n - 1)
        ctx_ids = np.where(inside, ids[b[..., None], pos], -1)                 # (c, K, 2w+1)
        ctx_acts = np.where(inside, h[b[..., None], pos, np.arange(K)[None, :, None]], np.nan)
        at = np.concatenate([where[b], p[..., None]], axis=-1)                 # (c, K, 4)
        both = np.concatenate([self.value, value])                             # (C + c, K)
        keep = np.argpartition(-both, self.C - 1, axis=0)[:self.C]             # (C, K)
        self.value = np.take_along_axis(both, keep, axis=0)
        for name, new in (("where", at), ("ids", ctx_ids), ("acts", ctx_acts)):
            joined = np.concatenate([getattr(self, name), new])                # (C + c, K, ·)
            setattr(self, name, np.take_along_axis(joined, keep[..., None], axis=0))

    def maxima(self) -> np.ndarray:
        return self.value.max(axis=0)                                          # (K,)


def _stream(model: "Model", layer: int, texts, cols: np.ndarray | None, contexts: int, window: int,
            length: int, skipped: list, progress) -> tuple[TopContexts, int, int]:
    """Every window of TEXTS through the model, LAYER's neurons COLS (None: all) tracked → (best, windows, texts)."""
    cfg, d_ff = model.config, model.config.d_ff
    best = TopContexts(d_ff if cols is None else len(cols), contexts, window)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None and 0 <= cfg.pad_token_id < cfg.vocab_size else 0
    seen = set()
    count = 0
    for ids, lengths, where in padded_batches(window_pieces(model, texts, length, skipped, progress), pad):
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)   # (B, n)
        rec = Recorder(layers=[layer], keep=("neurons",))
        transformer(model.weights, cfg, ids, mask, rec=rec, stop=layer + 1)   # blocks 0..LAYER only
        h = rec.store[layer]["neurons"]                                        # (B, n, d_ff)
        best.add(h if cols is None else h[..., cols], ids, lengths, where)
        seen.update(where[:, 0].tolist())
        count += len(ids)
    return best, count, len(seen)


# ── the report ───────────────────────────────────────────────────────────────────

def neurons(model: "Model", layer: int, *, texts: Iterable[str] | Corpus | None = None, text: str | None = None,
            top: int = TOP, neuron: int | Sequence[int] | None = None, contexts: int = CONTEXTS,
            window: int = WINDOW, tokens: int = TOKENS, max_tokens: int = MAX_TOKENS,
            progress: Callable[[int, int | None], None] | None = None) -> NeuronReport:
    """LAYER's FFN neurons as key–value memories (see the module): the chosen neurons' `contexts` top-activating
    contexts over TEXTS (a list of texts, or `open_corpus(path)`; None: `default_corpus()`), each with `window`
    tokens on either side, their statistics there, and the `tokens` tokens their value vectors promote and
    suppress. Chosen: NEURON (one index or several); else the TOP of largest max activation on TEXT; else
    over the corpus. max_tokens: longer texts are cut into windows of this many tokens (at most the model's
    context). progress(texts done, texts in all or None): called as the corpus streams."""
    from .corpus import open_corpus

    layer = check_layer(model, layer)
    cfg = model.config
    d_ff = int(model.weights.blocks[layer].ffn.W_out.shape[0])
    for name, value, least in (("top", top, 1), ("contexts", contexts, 1), ("window", window, 0), ("tokens", tokens, 1)):
        if not isinstance(value, (int, np.integer)) or value < least:
            raise QkvError(f"{name}={value!r} must be an integer ≥ {least}")
    length = min(int(max_tokens), cfg.max_positions)
    if length < 2:
        raise QkvError(f"max_tokens={max_tokens} leaves no room for a text; give at least 2")
    given = None if neuron is None else _chosen(model, neuron, d_ff)
    on_text = None
    if text is not None:
        on_text = model.run(text, layers=[layer], keep=("neurons",)).layer(layer).neurons.max(axis=0)   # (d_ff,)
    if given is not None:
        cols, chosen = np.array(given), "the neurons asked for"
    elif on_text is not None:
        cols = np.argsort(-on_text, kind="stable")[:top]
        chosen = f"the {len(cols)} of largest max activation on TEXT"
    else:
        cols, chosen = None, f"the {min(top, d_ff)} of largest max activation over the corpus"
    source = corpus_triples(open_corpus(default_corpus()) if texts is None else texts)
    name = DEFAULT_NAME if texts is None else source[2]
    skipped: list[tuple[int, str]] = []
    best, count, read = _stream(model, layer, source, cols, int(contexts), int(window), length, skipped, progress)
    if best.count == 0:
        why = f": {skipped[0][1]}" if skipped else ""
        raise QkvError(f"the corpus {name} gave no tokens to measure{why}; give texts with words in them")
    order = np.arange(len(cols)) if cols is not None else np.argsort(-best.maxima(), kind="stable")[:top]
    index = np.arange(d_ff)[order] if cols is None else cols
    why = no_vocab(model)
    logits = None if why is not None else value_logits(model, value_rows(model, layer, index))   # (k, V)
    label, top_value = model.tokenizer.label, best.maxima()
    out = []
    for k, (j, i) in enumerate(zip(order, index)):
        n = Neuron(index=int(i), max=float(top_value[j]), min=float(best.lo[j]), mean=float(best.sum[j] / best.count),
                   positive=float(best.positive[j] / best.count), examples=contexts_of(best, int(j), label),
                   on_text=None if on_text is None else float(on_text[i]))
        if logits is not None:
            z = logits[k]
            up, down = np.argsort(-z, kind="stable")[:tokens], np.argsort(z, kind="stable")[:tokens]
            n.promotes = [(int(t), label(int(t)), float(z[t])) for t in up]
            n.suppresses = [(int(t), label(int(t)), float(z[t])) for t in down]
        out.append(n)
    act = cfg.activation + ("-gated" if model.weights.blocks[layer].ffn.W_gate is not None else "")
    return NeuronReport(model=model.name, layer=layer, d_ff=d_ff, gated=model.weights.blocks[layer].ffn.W_gate is not None,
                        activation=act, chosen=chosen, corpus=name, texts=read, windows=count, tokens=best.count,
                        neurons=out, vocab=why, text=text, skipped=skipped,
                        sep=" " if model.tokenizer.spelling == "plain" else "")


def contexts_of(best: TopContexts, j: int, label) -> list[Example]:
    """Column J's kept contexts, the largest activation first (ties: the earlier text, window, position)."""
    value, where = best.value[:, j], best.where[:, j]                          # (C,), (C, 4)
    found = np.isfinite(value)
    order = np.lexsort((where[:, 3], where[:, 2], where[:, 0], -value))
    out = []
    for r in order[found[order]]:
        inside = best.ids[r, j] >= 0                                           # (2w+1,)
        first = int(np.argmax(inside))
        ids, acts = best.ids[r, j][inside], best.acts[r, j][inside]
        t, line, w, p = (int(x) for x in where[r])
        out.append(Example(text=t, line=None if line < 0 else line, window=w, position=p, activation=float(value[r]),
                           tokens=[label(int(i)) for i in ids], at=len(best.offsets) // 2 - first,
                           activations=[float(a) for a in acts]))
    return out
