"""The attribution graph page: one graph of `qkv graph … --json` as one self-contained HTML file (inline script,
style and data, no network), in English and Korean, and the annotations its feature cards show.

    graph_page(graph, lang="en")               → str    the page (viz.html.page; viz/assets/graph.js draws it)
    write_graph_page(graph, path, lang="en")   → Path   written atomically
    read_graph(path)                           → dict   a graph's JSON file, read bounded and checked
    annotate(graph, model, transcoders, texts) → dict   the graph with "features" filled (below)

The graph's JSON (version 1, `qkv_graph`: 1) is the one `qkv graph --json` writes: "model", "prompt", "tokens" (n),
"ids", "layers" (L), "d_model", "transcoders", "target" ({"token", "id"} or null), "scores" ({"replacement",
"completeness", "replacement_pruned", "completeness_pruned"}), "thresholds" ({"node", "edge"}), "nodes" (each {"id",
"kind": "embedding" | "feature" | "error" | "logit", "layer" (−1 for embeddings, L for logits), "position", and by kind
"token", "feature", "activation", "norm", "token_id", "probability", "logit", "influence"}), "links" ({"source",
"target", "weight"}: the direct effect of the source on the target's input) and, optional, "features" ({"layer:feature":
{"promotes": [[token, logit]], "suppresses": [...], "contexts": [{"tokens": [str], "values": [z]}]}}). A page's JSON
export adds the reader's view: "supernodes" ([{"name", "members": [node id]}]) and "pinned" ([node id], a path).

What the page holds is bounded (`check_graph`, the page's copy of the graph): numbers rounded to DIGITS significant
digits, at most MAX_NODES nodes (more: one error, prune the graph), the MAX_LINKS strongest links (by |weight|; the
page says how many the graph had: "links_total"), per feature at most TOKENS promoted and suppressed tokens and
CONTEXTS contexts of at most CONTEXT_TOKENS tokens. A pruned 30-token graph of 300 nodes and 3000 links is a page of
0.3 MB, most of it the links (tests/test_graph_page.py measures it; bound 10 MB).

Annotations (`annotate`): for each feature node (layer l, feature f) of the graph, with the graph's transcoders
({layer: SAE}, their decoders writing the FFN's output):
    promotes, suppresses   the logit lens of its decoder row: W_dec[f] (d_model,) through the final norm's γ and
                           W_vocab (`analysis.neurons.value_logits`, as the feature pages read an SAE latent), the
                           TOKENS largest and smallest entries
    contexts               with a corpus (a list of texts, or `features.corpora.open_texts`): each text (its first
                           MAX_TOKENS tokens) run through the model, the FFN's input at layer l ("ffn_in") encoded
                           by the transcoder (z = sae.encode(x)), and the CONTEXTS texts where z_f is largest kept,
                           WINDOW tokens either side of its peak with z_f on each; a decoder's first position is
                           left out (the attention sink, as the feature pages do); reading stops past LIMIT tokens.
Every text from the graph or the corpus reaches the page as JSON data and is set as textContent there.
"""

from __future__ import annotations

import heapq
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..analysis.neurons import corpus_triples, no_vocab, value_logits
from ..runtime.errors import QkvError
from ..runtime.io_json import read_json
from ..viz.html import asset, page, write_html
from ..viz.payload import script_json
from ..viz.words import texts as words_of

if TYPE_CHECKING:
    from ..features.sae import SAE
    from ..models.model import Model

LANGS = ("en", "ko")
KINDS = ("embedding", "feature", "error", "logit")
DIGITS = 4                     # significant digits of every number on the page
MAX_NODES = 20_000             # nodes a page draws (an SVG of more is slow to open): prune the graph first
MAX_LINKS = 20_000             # the strongest links kept (≈ 1 MB of page)
MAX_TOKENS = 4096              # the prompt's tokens
MAX_TEXT = 20_000              # characters of the prompt or a name
TOKENS = 5                     # promoted / suppressed tokens per feature
CONTEXTS = 4                   # top contexts per feature
WINDOW = 6                     # tokens either side of a context's peak
CONTEXT_TOKENS = 2 * WINDOW + 1
CONTEXT_LENGTH = 64            # tokens of each corpus text read (annotate)
LIMIT = 50_000                 # corpus tokens read at most (annotate)
FILE_LIMIT = 256 << 20         # bytes of a graph's JSON file (read_graph)
FIX = "make it again with qkv graph … --json FILE"
_MISSING = object()


# ── the page ─────────────────────────────────────────────────────────────────────

def graph_page(graph: dict, *, lang: str = "en") -> str:
    """One complete, self-contained HTML document drawing GRAPH (its checked, bounded copy: `check_graph`); LANG,
    "en" or "ko", is the language it opens in (it holds both, and a button to switch)."""
    if lang not in LANGS:
        raise QkvError(f"unknown language {lang!r}; choose from {', '.join(LANGS)}")
    shown = check_graph(graph)
    words = words_of("graph")
    payload = {"graph": shown, "lang": lang, "words": words}
    title = words[lang]["title"].format(model=shown.get("model") or "?")
    body = (f"<style>\n{asset('graph.css')}</style>\n"
            "<div class=\"qkv\" data-qkv-graph></div>\n"
            f"<script type=\"application/json\" class=\"qkv-graph-data\">{script_json(payload)}</script>")
    return page(title, body, [asset("graph.js"), "QKV_GRAPH.boot();"])


def write_graph_page(graph: dict, path: str | os.PathLike, lang: str = "en") -> Path:
    """The page of GRAPH written to PATH atomically (never a half-written file)."""
    return write_html(graph_page(graph, lang=lang), path)


def read_graph(path: str | os.PathLike) -> dict:
    """The graph in the JSON file PATH (`qkv graph --json`), read bounded (FILE_LIMIT bytes) and checked."""
    graph = read_json(path, what=f"the graph {path}", fix=FIX, limit=FILE_LIMIT)
    check_graph(graph, str(path))
    return graph


# ── the checked, bounded copy the page holds ─────────────────────────────────────

def _round(x: float) -> float:
    """X to DIGITS significant digits (the page's numbers)."""
    return float(f"{x:.{DIGITS}g}")


class _Reader:
    """The values of one JSON object of the graph, checked; every fault one QkvError naming WHERE and the fix."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise QkvError(f"{where} is not a JSON object; {FIX}")
        self.data, self.where = data, where

    def wrong(self, key: str, wanted: str) -> QkvError:
        return QkvError(f"{self.where}: {key} must be {wanted}, not {str(self.data.get(key))[:40]!r}; {FIX}")

    def integer(self, key: str, lo: int, hi: int, default: Any = _MISSING) -> int | None:
        v = self.data.get(key)
        if v is None:
            if default is _MISSING:
                raise QkvError(f"{self.where} has no {key}; {FIX}")
            return default
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.wrong(key, f"a whole number from {lo} to {hi}")
        return v

    def number(self, key: str) -> float | None:
        v = self.data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.wrong(key, "a finite number")
        return _round(v)

    def text(self, key: str, default: Any = None) -> str | None:
        v = self.data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str) or len(v) > MAX_TEXT:
            raise self.wrong(key, f"text of at most {MAX_TEXT:,} characters")
        return v

    def array(self, key: str, most: int) -> list:
        v = self.data.get(key)
        if not isinstance(v, list):
            raise self.wrong(key, "a list")
        if len(v) > most:
            raise QkvError(f"{self.where}: {key} has {len(v):,} entries, more than the page draws ({most:,}); "
                           "prune the graph harder (raise qkv graph's node threshold)")
        return v


def check_graph(graph: dict, source: str = "the graph") -> dict:
    """The copy of GRAPH a page holds (module doc: numbers rounded, sizes bounded), or one QkvError saying what is
    wrong with it. The graph itself is not changed."""
    top = _Reader(graph, source)
    if graph.get("qkv_graph") != 1:
        raise QkvError(f"{source} is not a graph of qkv (no \"qkv_graph\": 1); {FIX}")
    tokens = top.array("tokens", MAX_TOKENS)
    if not all(isinstance(t, str) and len(t) <= 200 for t in tokens):
        raise top.wrong("tokens", "a list of short texts")
    L = top.integer("layers", 0, 100_000)
    n = len(tokens)
    out: dict[str, Any] = {"qkv_graph": 1, "model": top.text("model", ""), "prompt": top.text("prompt", ""),
                           "tokens": list(tokens), "layers": L, "d_model": top.integer("d_model", 1, 1 << 20, None),
                           "transcoders": top.text("transcoders", "")}
    ids = graph.get("ids")
    out["ids"] = [int(i) for i in ids] if isinstance(ids, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids) else []
    out["target"] = _target(graph.get("target"), source)
    for key, names in (("scores", ("replacement", "completeness", "replacement_pruned", "completeness_pruned")),
                       ("thresholds", ("node", "edge"))):
        part = graph.get(key)
        out[key] = None if part is None else {k: _Reader(part, f"{source}: {key}").number(k) for k in names}
    nodes = [_node(raw, f"{source}: nodes[{i}]", L, n) for i, raw in enumerate(top.array("nodes", MAX_NODES))]
    known = {d["id"] for d in nodes}
    if len(known) != len(nodes):
        raise QkvError(f"{source}: two nodes have the same id; {FIX}")
    links = [_link(raw, f"{source}: links[{i}]", known) for i, raw in enumerate(top.array("links", 1 << 24))]
    out["nodes"] = nodes
    if len(links) > MAX_LINKS:                                                   # the strongest, in their order
        keep = set(np.argsort([-abs(l["weight"]) for l in links], kind="stable")[:MAX_LINKS].tolist())
        out["links_total"] = len(links)
        links = [l for i, l in enumerate(links) if i in keep]
    out["links"] = links
    features = {f"{d['layer']}:{d['feature']}" for d in nodes if d["kind"] == "feature"}
    notes = graph.get("features") or {}
    if not isinstance(notes, dict):
        raise top.wrong("features", "an object")
    out["features"] = {k: _annotation(v, f"{source}: features[{k}]") for k, v in notes.items() if k in features}
    for key in ("supernodes", "pinned"):                                         # a page's own export: its view
        if isinstance(graph.get(key), list):
            out[key] = _view(key, graph[key], known)
    return out


def _target(raw: Any, source: str) -> dict | None:
    if raw is None:
        return None
    r = _Reader(raw, f"{source}: target")
    return {"token": r.text("token", ""), "id": r.integer("id", 0, 1 << 31, None)}


def _node(raw: Any, where: str, L: int, n: int) -> dict:
    """One node of the schema, its fields checked and rounded (unknown fields left out)."""
    r = _Reader(raw, where)
    node_id = r.text("id")
    if not node_id or len(node_id) > 200:
        raise r.wrong("id", "a short text such as \"F:12:5:881\"")
    kind = r.data.get("kind")
    if kind not in KINDS:
        raise r.wrong("kind", " | ".join(KINDS))
    layer = r.integer("layer", -1, L)
    node = {"id": node_id, "kind": kind, "layer": layer, "position": r.integer("position", 0, max(n - 1, 0))}
    if kind == "feature":
        node["feature"] = r.integer("feature", 0, 1 << 31)
    if kind in ("embedding", "logit"):
        node["token"] = r.text("token", "")
    if kind == "logit":
        node["token_id"] = r.integer("token_id", 0, 1 << 31, None)
    for key in ("activation", "norm", "probability", "logit", "influence"):
        value = r.number(key)
        if value is not None:
            node[key] = value
    return node


def _link(raw: Any, where: str, known: set[str]) -> dict:
    r = _Reader(raw, where)
    source, target = r.text("source"), r.text("target")
    if source not in known or target not in known:
        raise QkvError(f"{where} joins {str(source)[:40]!r} → {str(target)[:40]!r}, which are not both nodes; {FIX}")
    weight = r.number("weight")
    if weight is None:
        raise r.wrong("weight", "a finite number")
    return {"source": source, "target": target, "weight": weight}


def _annotation(raw: Any, where: str) -> dict:
    """A feature's annotation, bounded: TOKENS tokens each way, CONTEXTS contexts of CONTEXT_TOKENS tokens."""
    r = _Reader(raw, where)
    out = {}
    for key in ("promotes", "suppresses"):
        pairs = r.data.get(key) or []
        if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], (int, float))
                and not isinstance(p[1], bool) and math.isfinite(p[1]) for p in pairs):
            raise r.wrong(key, "a list of [token, logit] pairs")
        out[key] = [[p[0][:200], _round(p[1])] for p in pairs[:TOKENS]]
    contexts = []
    for i, c in enumerate((r.data.get("contexts") or [])[:CONTEXTS]):
        cr = _Reader(c, f"{where}.contexts[{i}]")
        toks, values = cr.data.get("tokens"), cr.data.get("values")
        if not (isinstance(toks, list) and isinstance(values, list) and len(toks) == len(values)
                and all(isinstance(t, str) for t in toks)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)):
            raise cr.wrong("tokens", "a list of texts as long as its values (numbers)")
        peak = int(np.argmax(values)) if values else 0
        lo = max(0, min(peak - WINDOW, len(toks) - CONTEXT_TOKENS))
        contexts.append({"tokens": [t[:200] for t in toks[lo:lo + CONTEXT_TOKENS]],
                         "values": [_round(v) for v in values[lo:lo + CONTEXT_TOKENS]]})
    out["contexts"] = contexts
    return out


def _view(key: str, raw: list, known: set[str]) -> list:
    """A page's saved view: supernodes [{"name", "members"}] or the pinned path [id], the unknown ids left out."""
    if key == "pinned":
        return [i for i in raw[:MAX_NODES] if isinstance(i, str) and i in known]
    return [{"name": str(g.get("name", ""))[:60], "members": [m for m in g.get("members", [])[:MAX_NODES]
                                                               if isinstance(m, str) and m in known]}
            for g in raw[:1000] if isinstance(g, dict) and isinstance(g.get("members"), list)]


# ── annotations ──────────────────────────────────────────────────────────────────

def annotate(graph: dict, model: "Model", transcoders: "dict[int, SAE]", texts=None, *, top: int = TOKENS,
             contexts: int = CONTEXTS, window: int = WINDOW, max_tokens: int = CONTEXT_LENGTH,
             limit: int = LIMIT) -> dict:
    """GRAPH with "features" filled for each of its feature nodes (module doc): the TOP tokens its transcoder's
    decoder row promotes and suppresses, and with TEXTS (a list of texts, or `features.corpora.open_texts(...)`)
    its CONTEXTS top activating contexts, WINDOW tokens either side. transcoders: {layer: SAE} (`features.sae`:
    encode(ffn_in) → z, W_dec (d_sae, d_model)). A new dict; GRAPH is not changed."""
    for name, value, least in (("top", top, 1), ("contexts", contexts, 1), ("window", window, 0),
                               ("max_tokens", max_tokens, 2), ("limit", limit, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise QkvError(f"{name}={value!r} must be a whole number ≥ {least}")
    check_graph(graph)
    wanted: dict[int, list[int]] = {}                                            # layer → its features, sorted
    for d in graph["nodes"]:
        if d["kind"] == "feature":
            wanted.setdefault(d["layer"], []).append(d["feature"])
    wanted = {layer: sorted(set(fs)) for layer, fs in sorted(wanted.items())}
    for layer, fs in wanted.items():
        sae = transcoders.get(layer)
        if sae is None:
            raise QkvError(f"the graph has features of layer {layer} but no transcoder was given for it; give the "
                           "transcoders the graph was made with")
        if max(fs) >= sae.W_dec.shape[0] or sae.W_dec.shape[1] != model.config.d_model:
            raise QkvError(f"layer {layer}'s transcoder ({sae.W_dec.shape[0]} features of width {sae.W_dec.shape[1]})"
                           f" does not fit the graph's features or {model.name}; give the transcoders the graph was "
                           "made with")
    notes = {f"{layer}:{f}": {"promotes": [], "suppresses": [], "contexts": []}
             for layer, fs in wanted.items() for f in fs}
    if no_vocab(model) is None:
        for layer, fs in wanted.items():
            _promotes(notes, model, layer, fs, transcoders[layer], top)
    if texts is not None:
        _contexts(notes, model, transcoders, wanted, texts, contexts, window, max_tokens, limit)
    out = dict(graph)
    out["features"] = {**(graph.get("features") or {}), **notes}
    return out


def _promotes(notes: dict, model: "Model", layer: int, fs: list[int], sae: "SAE", top: int) -> None:
    """Each feature's logit lens: (W_dec[f] ⊙ γ)·W_vocab, its TOP largest and smallest tokens."""
    logits = value_logits(model, np.asarray(sae.W_dec)[fs])                     # (k, V)
    label = model.tokenizer.label
    for f, v in zip(fs, logits):
        up, down = np.argsort(-v, kind="stable")[:top], np.argsort(v, kind="stable")[:top]
        notes[f"{layer}:{f}"]["promotes"] = [[label(int(t)), _round(float(v[t]))] for t in up]
        notes[f"{layer}:{f}"]["suppresses"] = [[label(int(t)), _round(float(v[t]))] for t in down]


def _texts(texts) -> Iterator[str]:
    """The corpus's texts: a list, `analysis.corpus.open_corpus(path)` or `features.corpora.open_texts(...)`."""
    if hasattr(texts, "texts") and hasattr(texts, "sha256") and hasattr(texts, "count"):    # features.corpora.Texts
        return (t for _, _, t in texts.texts(0))
    triples, _, _ = corpus_triples(texts)
    return (t for _, _, t in triples)


def _contexts(notes: dict, model: "Model", transcoders: dict, wanted: dict[int, list[int]], texts, contexts: int,
              window: int, max_tokens: int, limit: int) -> None:
    """Each feature's CONTEXTS texts where it fires most: per text its peak z_f (transcoder of its layer on the
    FFN's input there), kept in a heap of the largest; their windows written into NOTES."""
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so the corpus cannot be read; add it")
    skip = 1 if model.config.causal else 0                                       # the attention sink
    best: dict[str, list] = {key: [] for key in notes}                           # key → heap of (z, serial, context)
    serial, read = 0, 0
    label = model.tokenizer.label
    for text in _texts(texts):
        if not isinstance(text, str) or not text.strip():
            continue
        ids = [int(i) for i in model.encode(text)[0][:max_tokens]]
        if len(ids) <= skip:
            continue
        trace = model.run(ids, layers=list(wanted), keep=("ffn_in",))
        for layer, fs in wanted.items():
            x = np.asarray(trace.layer(layer).ffn_in)                            # (n, d_model)
            z = np.asarray(transcoders[layer].encode(x))[:, fs]                  # (n, k)
            z[:skip] = 0
            for j, f in enumerate(fs):
                p = int(np.argmax(z[:, j]))
                if z[p, j] <= 0:
                    continue
                serial += 1
                lo, hi = max(0, p - window), min(len(ids), p + window + 1)
                item = (float(z[p, j]), -serial, {"tokens": [label(i) for i in ids[lo:hi]],
                                                  "values": [_round(float(v)) for v in z[lo:hi, j]]})
                heap = best[f"{layer}:{f}"]
                (heapq.heappush if len(heap) < contexts else heapq.heappushpop)(heap, item)
        read += len(ids)
        if read >= limit:
            break
    for key, heap in best.items():
        notes[key]["contexts"] = [c for _, _, c in sorted(heap, key=lambda e: (-e[0], -e[1]))]
