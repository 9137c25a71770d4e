"""The attribution graph page: one graph of `qkv graph … --json` as one self-contained HTML file (inline script,
style and data, no network), in English and Korean, and the annotations its feature cards show.

    graph_page(graph, lang="en")               → str    the page (viz.html.page; viz/assets/graph.js draws it,
                                                        export.js's rasterise makes its PNG)
    write_graph_page(graph, path, lang="en")   → Path   written atomically
    read_graph(path)                           → dict   a graph's JSON file, read bounded and checked (graphs/files.py)
    annotate(graph, model, transcoders, texts) → dict   the graph with "features" filled (below)

The graph's JSON (version 1, `qkv_graph`: 1) is the one `qkv graph --json` writes: "model", "prompt", "tokens" (n),
"ids", "layers" (L), "d_model", "transcoders", "target" ({"token", "id"} or null), "scores" ({"replacement",
"completeness", "replacement_pruned", "completeness_pruned"}), "thresholds" ({"node", "edge"}), "nodes" (each {"id",
"kind": "embedding" | "feature" | "error" | "logit", "layer" (−1 for embeddings, L for logits), "position", and by kind
"token", "feature", "activation", "norm", "token_id", "probability", "logit", "influence"}), "links" ({"source",
"target", "weight"}: the direct effect of the source on the target's input) and, optional, "features" ({"layer:feature":
{"promotes": [[token, logit]], "suppresses": [...], "contexts": [{"tokens": [str], "values": [z]}]}}). A page's JSON
export adds the reader's view: "supernodes" ([{"name", "members": [node id]}]) and "pinned" ([node id], a path).

What the page holds is bounded (`check_graph`, the page's copy of the graph, made after the schema's one check,
`files.check_graph_json`): numbers rounded to DIGITS significant digits, at most MAX_TOKENS tokens and MAX_NODES nodes
(more: one error, prune the graph), the MAX_LINKS strongest links (by |weight|; the
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
from ..runtime.io_json import Fields
from ..viz.html import asset, page, write_html
from ..viz.payload import script_json
from ..viz.words import texts as words_of
from .files import FIX, SCORES, check_graph_json, read_graph_file

if TYPE_CHECKING:
    from ..features.sae import SAE
    from ..models.model import Model

LANGS = ("en", "ko")
DIGITS = 4                     # significant digits of every number on the page
MAX_NODES = 20_000             # nodes a page draws (an SVG of more is slow to open): prune the graph first
MAX_LINKS = 20_000             # the strongest links kept (≈ 1 MB of page)
MAX_TOKENS = 4096              # the prompt's tokens
MAX_LAYERS = 100_000           # rows of the page's SVG
MAX_TEXT = 20_000              # characters of the prompt
TOKENS = 5                     # promoted / suppressed tokens per feature
CONTEXTS = 4                   # top contexts per feature
WINDOW = 6                     # tokens either side of a context's peak
CONTEXT_TOKENS = 2 * WINDOW + 1
CONTEXT_LENGTH = 64            # tokens a piece of a corpus text read (annotate): each text cut into such pieces
LIMIT = 50_000                 # corpus tokens read at most (annotate)
FILE_LIMIT = 256 << 20         # bytes of a graph's JSON file (read_graph)


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
    return page(title, body, [asset("export.js") + "\n" + asset("graph.js"), "QKV_GRAPH.boot();"])


def write_graph_page(graph: dict, path: str | os.PathLike, lang: str = "en") -> Path:
    """The page of GRAPH written to PATH atomically (never a half-written file)."""
    return write_html(graph_page(graph, lang=lang), path)


def read_graph(path: str | os.PathLike) -> dict:
    """The graph in the JSON file PATH (`qkv graph --json`), read bounded (FILE_LIMIT bytes) with every key of the
    schema checked (`files.read_graph_file`); the page's own bounds are checked where its page is made."""
    return read_graph_file(path, limit=FILE_LIMIT)


# ── the bounded copy the page holds ──────────────────────────────────────────────

# the keys a node keeps on the page, by kind (beside id, kind, layer, position), as the schema has them
_NODE_KEYS = {"embedding": ("token", "influence"), "feature": ("feature", "activation", "influence"),
              "error": ("norm", "influence"), "logit": ("token", "token_id", "probability", "logit", "influence")}
_NUMBERS = ("activation", "norm", "probability", "logit", "influence")


def _round(x: float) -> float:
    """X to DIGITS significant digits (the page's numbers)."""
    return float(f"{x:.{DIGITS}g}")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_graph(graph: dict, source: str = "the graph") -> dict:
    """The copy of GRAPH a page holds (module doc: numbers rounded, sizes bounded), after the schema's check
    (`files.check_graph_json`: every key) and the page's own bounds; any fault one QkvError saying what is wrong.
    The graph itself is not changed."""
    check_graph_json(graph, source)
    _check_bounds(graph, source)
    out: dict[str, Any] = {key: graph[key] for key in ("qkv_graph", "model", "prompt", "transcoders")}
    out |= {"tokens": list(graph["tokens"]), "ids": [int(i) for i in graph["ids"]], "layers": int(graph["layers"]),
            "d_model": int(graph["d_model"])}
    target = graph["target"]
    out["target"] = None if target is None else {"token": target["token"], "id": int(target["id"])}
    out["scores"] = {k: _round(graph["scores"][k]) for k in SCORES}
    out["thresholds"] = {k: _round(graph["thresholds"][k]) for k in ("node", "edge")}
    nodes = [_node(d) for d in graph["nodes"]]
    known = {d["id"] for d in nodes}
    links = [{"source": l["source"], "target": l["target"], "weight": _round(l["weight"])} for l in graph["links"]]
    out["nodes"] = nodes
    if len(links) > MAX_LINKS:                                                   # the strongest, in their order
        keep = set(np.argsort([-abs(l["weight"]) for l in links], kind="stable")[:MAX_LINKS].tolist())
        out["links_total"] = len(links)
        links = [l for i, l in enumerate(links) if i in keep]
    out["links"] = links
    features = {f"{d['layer']}:{d['feature']}" for d in nodes if d["kind"] == "feature"}
    notes = graph.get("features") or {}
    out["features"] = {k: _annotation(v, f"{source}: features[{k}]") for k, v in notes.items() if k in features}
    for key in ("supernodes", "pinned"):                                         # a page's own export: its view
        if isinstance(graph.get(key), list):
            out[key] = _view(key, graph[key], known)
    return out


def _check_bounds(graph: dict, source: str) -> None:
    """What a page draws beyond the schema's ranges: MAX_TOKENS tokens of at most 200 characters, a prompt of
    MAX_TEXT characters, MAX_LAYERS layers, MAX_NODES nodes (an SVG of more is slow to open)."""
    if graph["layers"] > MAX_LAYERS:
        raise QkvError(f"{source}: the page draws at most {MAX_LAYERS:,} layers, not {graph['layers']:,}")
    tokens = graph["tokens"]
    if len(tokens) > MAX_TOKENS or any(len(t) > 200 for t in tokens):
        raise QkvError(f"{source}: the page draws at most {MAX_TOKENS:,} tokens of at most 200 characters; "
                       "give a shorter prompt")
    if len(graph["prompt"]) > MAX_TEXT:
        raise QkvError(f"{source}: the page shows a prompt of at most {MAX_TEXT:,} characters; give a shorter one")
    if len(graph["nodes"]) > MAX_NODES:
        raise QkvError(f"{source}: nodes has {len(graph['nodes']):,} entries, more than the page draws "
                       f"({MAX_NODES:,}); prune the graph harder (raise qkv graph's node threshold)")


def _node(d: dict) -> dict:
    """One node of the (checked) graph as the page holds it: its kind's keys, numbers rounded."""
    node = {"id": d["id"], "kind": d["kind"], "layer": int(d["layer"]), "position": int(d["position"])}
    for key in _NODE_KEYS[d["kind"]]:
        if key in _NUMBERS:
            node[key] = _round(d[key])
        elif key == "token":
            node[key] = d[key]
        else:                                                                    # feature, token_id (64.0 → 64)
            node[key] = int(d[key])
    return node


def _annotation(raw: Any, where: str) -> dict:
    """A feature's annotation, checked (the schema leaves it open) and bounded: TOKENS tokens each way, CONTEXTS
    contexts of CONTEXT_TOKENS tokens."""
    note = Fields(raw, where, FIX)
    out = {}
    for key in ("promotes", "suppresses"):
        pairs = note.array(key, [])
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and _finite(p[1]) for p in pairs):
            raise QkvError(f"{where}: {key} must be a list of [token, logit] pairs; {FIX}")
        out[key] = [[p[0][:200], _round(p[1])] for p in pairs[:TOKENS]]
    contexts = []
    for i, raw_context in enumerate(note.array("contexts", [])[:CONTEXTS]):
        context = note.sub(f"contexts[{i}]", raw_context)
        toks, values = context.array("tokens", []), context.array("values", [])
        if len(toks) != len(values) or not all(isinstance(t, str) for t in toks) or not all(map(_finite, values)):
            raise QkvError(f"{context.source}: tokens must be a list of texts as long as its values (numbers); {FIX}")
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


def _pieces(model: "Model", texts, max_tokens: int, skip: int) -> Iterator[list[int]]:
    """The corpus's texts as token ids, each text cut into pieces of MAX_TOKENS (a book or a play is one text of
    tens of thousands of tokens, more than the model reads at once); pieces of SKIP tokens or fewer left out."""
    for text in _texts(texts):
        if not isinstance(text, str) or not text.strip():
            continue
        ids = [int(i) for i in model.tokenizer.encode(text)[0]]
        for start in range(0, len(ids), max_tokens):
            if len(ids) - start > skip:
                yield ids[start:start + max_tokens]


def _contexts(notes: dict, model: "Model", transcoders: dict, wanted: dict[int, list[int]], texts, contexts: int,
              window: int, max_tokens: int, limit: int) -> None:
    """Each feature's CONTEXTS texts where it fires most: per piece of a text (`_pieces`) its peak z_f (transcoder of its layer on the
    FFN's input there), kept in a heap of the largest; their windows written into NOTES."""
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so the corpus cannot be read; add it")
    skip = 1 if model.config.causal else 0                                       # the attention sink
    best: dict[str, list] = {key: [] for key in notes}                           # key → heap of (z, serial, context)
    serial, read = 0, 0
    label = model.tokenizer.label
    for ids in _pieces(model, texts, max_tokens, skip):
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
