"""qkv's web app (`qkv serve`): a local page where you type text and see its attention, and the API behind it.

What each path does, served by the hardened server of web/server.py (limits, lanes, request parsing, safe
answers, other sites refused):

    GET  /                the page: a text box, a model picker and the viewer (viz/html.py); its Graph tab draws a
                          graph's JSON the reader opens (viz/assets/graph.js), in the page: nothing is sent here
    GET  /api/models      {"models": [...], "default": ...}: what this server may load
    POST /api/attention   {"text": ..., "model": ...} → the viewer's payload (viz/payload.py)
    GET  /api/attention?text=...&model=...   the same, for curl
    POST /api/pipeline    {"text": ..., "model": ..., "lang": "en" | "ko", "layer"?: int} → the pipeline page's
                          payload (viz/pipeline.py: every box of one forward pass; the whole q, k, v of LAYER and
                          its neighbours for the attention diagram), fetched when the page's Pipeline mode asks
    POST /api/graph       {"text": ...} → the attribution graph of TEXT's next token on the server's own model
                          (qkv.graphs: build_graph, prune_graph at the default thresholds, graph_json, each feature
                          annotated with the tokens it promotes), the JSON the Graph tab draws; only on a server
                          started with transcoders (`qkv serve --transcoders DIR`), up to MAX_GRAPH_TOKENS tokens,
                          in the long lane
    POST /api/pipeline/next  {"text", "model", "lang", "temperature", "top_k", "top_p", "seed"} → one new
                          token drawn by the engine (qkv.writing.sampling) and the pipeline of the longer text:
                          {"id", "token", "text", "payload"}
    POST /api/chat        {"messages": [{"role", "content"}, ...], "model": ..., "max_new_tokens": ...}
                          → the reply as it is written, one JSON object per line (NDJSON):
                            {"prompt": n, "dropped": k}   the conversation took n tokens (k old turns left out)
                            {"piece": "..."} …            the reply, piece by piece
                            {"done": true, "reply": ..., "stopped": "end of turn" | "length",
                             "payload": the viewer's payload of the conversation and the reply, its "lens"
                             null}                         sent as the reply ends: the writer is free from here
                            {"lens": the payload's "lens" section, or null and "note": why not}   the logit lens
                                                          of a decoder's reply, computed after it as heavy work
                          or {"error": ...} as the last line if something breaks mid-way

Mistakes get a JSON {"error": "..."} naming the fix (400; 413: text too long for the page or the model; 503
with Retry-After: a lane is full). Only models on the allow-list load (--model and `qkv.available()`). The
server keeps no conversation: the page sends the turns so far with each message.

Work that runs a model waits in a lane (web/server.py's Lane), each one pass at a time. The lane is chosen by
the work's cost (`work`: multiply-adds, from the tokens, the model's size and what the request computes), not
by its tokens alone: light work (≤ SMALL_WORK, e.g. attention of 64 MiniLM tokens) in the short lane, so a
one-line request never waits behind heavy ones, even heavy ones short in tokens (a SmolLM2 pipeline page of 6
tokens costs more than 64 MiniLM tokens); the rest in the long lane. A chat reply is written by the writer,
its own lane: one reply at a time, a second refused at once (503) rather than queued behind a reply of
unknown length. The writer is freed as the reply ends; what the reply's views add after (the logit lens: a
pass and (L+1)·n·V more) waits in the long lane like any heavy work. Memory stays bounded by three passes,
one per lane.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from ..analysis.sections import lens_payload, sections_keep, shows_lens, viewer_sections
from ..checkpoints import DIGITS, LLM, SPEECH, available
from ..models.audio_model import AudioModel
from ..models.image_model import ImageModel
from ..models.loading import load
from ..models.model import Model
from ..runtime.errors import QkvError
from ..viz import hangul
from ..viz.html import asset, page as html_page, pipeline_js, viewer_js
from ..viz.payload import script_json, trace_payload
from ..viz.pipeline import PIPELINE_KEEP, pipeline_payload, pipeline_trace
from ..viz.words import texts
from ..writing.sampling import Sampling
from ..writing.seq2seq_generate import translation_trace
from .server import Answer, Asset, Busy, HttpError, Lane, Server, Stream

MAX_CHARS = 10_000                  # characters of text per request (in UTF-8 they fit the server's MAX_BODY)
MAX_ATTENTION = 60_000_000          # L·H·n² weights per answer (about 60 MB before compression)
MAX_PIPELINE_TOKENS = 256           # tokens of one pipeline page (its S and A are L·H·n² bytes each)
MAX_GRAPH_BYTES = 64 << 20          # a graph's JSON the Graph tab opens (read in the page, never sent here)
MAX_GRAPH_TOKENS = 32               # tokens of a prompt whose graph the server computes (a backward sweep per
                                    # batch of targets: features × positions grow with n)
LANGS = ("en", "ko")
EXAMPLE = "The cat sat on the mat"
MAX_MESSAGE = 2_000                 # characters of one chat message
MAX_TURNS = 64                      # messages in one conversation
MAX_NEW_TOKENS = 256                # the longest reply the page may ask for
NEW_TOKENS = 160                    # the reply's length when the page does not say
ROLES = ("system", "user", "assistant")
SMALL_WORK = 1e9                    # multiply-adds (work()) of work that runs in the short lane: attention of
                                    # 64 MiniLM tokens is 0.7e9, a pipeline page of 6 SmolLM2 tokens 3.2e9
PIPELINE_PASSES = 4                 # what a pipeline page costs, in passes: it keeps and summarises every
                                    # intermediate (measured, against attention: 4× on 6 SmolLM2 tokens, 7× on 52 MiniLM)

_CSP_APP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
            "connect-src 'self'; font-src 'self'; form-action 'none'; base-uri 'none'")   # font: hangul.woff


def work(model: Model, n: int, kind: str = "attention") -> float:
    """The multiply-adds of one request on n tokens of MODEL, roughly: what decides its lane. Tokens alone do not
    (a SmolLM2 token costs 13 MiniLM tokens; its logit lens 6 passes more):

        a pass       n · (L · block + d_model · V) + L · n² · d_model    block: W_Q, W_K, W_V, W_O, the FFN
        "attention"  a pass, and the logit lens's (L + 1) · n · d_model · V when the viewer shows it
        "pipeline"   PIPELINE_PASSES passes
        "next"       two passes and a pipeline page of n tokens
    """
    c = model.config
    decoder = (c.n_decoder_layers or c.n_layers) if getattr(c, "encoder_decoder", False) else 0   # its own stack
    L = c.n_layers + decoder
    d, d_k = c.d_model, c.d_head or c.d_model // c.n_heads
    attention = d * d_k * (2 * c.n_heads + 2 * (c.n_kv_heads or c.n_heads))       # W_Q, W_O; W_K, W_V
    ffn = (3 if c.gated_ffn else 2) * d * c.d_ff * max(1, c.experts_per_token)      # a routed token: k experts
    head = getattr(model.weights, "decoder", model.weights).W_vocab        # an encoder–decoder's: its decoder's
    V = 0 if head is None else head.shape[1]
    one_pass = n * (L * (attention + ffn) + d * V) + L * n * n * d
    if kind == "attention":
        return one_pass + ((L + 1) * n * d * V if shows_lens(model, n) else 0)
    return (PIPELINE_PASSES + (2 if kind == "next" else 0)) * one_pass


class App:
    """qkv's app: the allowed model sources, the models loaded so far, the lanes, and the routes the server calls
    (`get`, `post`: web/server.py's `Routes`)."""

    csp = _CSP_APP                             # the page's Content-Security-Policy (the server adds: no framing)

    def __init__(self, source: str = "minilm", transcoders: dict | None = None):
        self.default = source
        self.transcoders = transcoders         # {layer: SAE} of the default model (POST /api/graph), or None
        text_models = (s for s, _ in available() if s not in (DIGITS, SPEECH))
        self.sources = list(dict.fromkeys([source, *text_models]))
        self._models: dict[str, Model] = {}
        self._loading = threading.Lock()
        self.short = Lane("light requests")    # one pass at a time per lane: bounded memory
        self.long = Lane("heavy requests")
        self.writer = Lane("replies")          # one chat reply at a time (a second: 503 at once)

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, Answer]:
        """GET: the page, its Hangul font, the model list, or attention for curl (?text=...&model=...)."""
        if path in ("/", "/index.html"):
            return 200, self.page()
        if path == "/hangul.woff" and hangul.full_face() is not None:
            return 200, Asset(hangul.full_face(), "font/woff")
        if path == "/api/models":
            return 200, {"models": self.sources, "default": self.default}
        if path == "/api/attention":
            return 200, self.attention(query.get("text", [None])[0], query.get("model", [None])[0])
        raise HttpError(404, f"no page {path}; the app is at /")

    def post(self, path: str, body: Callable[[], dict]) -> tuple[int, Answer]:
        """POST: attention, a pipeline page, its next token or a chat reply; the body read once the path is known."""
        if path == "/api/chat":
            return 200, self.chat(body())
        if path == "/api/pipeline":
            return 200, self.pipeline(body())
        if path == "/api/pipeline/next":
            return 200, self.next_token(body())
        if path == "/api/graph":
            return 200, self.graph(body())
        if path != "/api/attention":
            raise HttpError(404, f"no endpoint {path}; POST to /api/attention, /api/pipeline, /api/pipeline/next, "
                                 "/api/graph or /api/chat")
        request = body()
        return 200, self.attention(request.get("text"), request.get("model"))

    def model(self, source: str) -> Model:
        """The model for SOURCE, loaded on first use; only sources on the allow-list."""
        if source not in self.sources:
            raise HttpError(400, f"unknown model {source!r}; this server offers {', '.join(map(repr, self.sources))}")
        with self._loading:
            if source not in self._models:
                model = load(source)
                if isinstance(model, (ImageModel, AudioModel)):     # their input is a file: never read one a page names
                    kind = "images" if isinstance(model, ImageModel) else "sound"
                    self.sources.remove(source)
                    raise QkvError(f"{model.name} reads {kind}, and qkv serve shows text models; look at it with "
                                   f"qkv show FILE --model {source}")
                self._models[source] = model
            return self._models[source]

    def max_tokens(self, model: Model) -> int:
        """The longest text (in tokens) whose attention fits the model and one answer."""
        c = model.config
        return min(c.max_positions, math.isqrt(MAX_ATTENTION // (c.n_layers * c.n_heads)))

    def _checked(self, text, source, limit: int | None = None) -> tuple[Model, int]:
        """The model for SOURCE and TEXT's length in tokens, or the reason the request is refused."""
        if not isinstance(text, str):
            raise HttpError(400, "missing field 'text' (a string); send {\"text\": \"...\", \"model\": \"...\"}")
        if source is None:
            source = self.default
        if not isinstance(source, str):
            raise HttpError(400, "field 'model' must be a string, one of " + ", ".join(map(repr, self.sources)))
        if len(text) > MAX_CHARS:
            raise HttpError(413, f"the text has {len(text):,} characters; the limit is {MAX_CHARS:,}: shorten it")
        if not text.strip():
            raise HttpError(400, "the text is empty; type some words to look at")
        model = self.model(source)
        n = len(text)
        if model.tokenizer is not None:
            n, most = len(model.tokenizer.encode(text)[0]), self.max_tokens(model)
            most = most if limit is None else min(most, limit)
            if n > most:
                raise HttpError(413, f"the text has {n:,} tokens but {model.name} here takes at most {most:,}"
                                     f"{' on this page' if limit is not None else ''}; shorten it")
        return model, n

    def _lane(self, model: Model, n: int, kind: str) -> Lane:
        """The short lane for light work (≤ SMALL_WORK multiply-adds), the long lane for the rest."""
        return self.short if work(model, n, kind) <= SMALL_WORK else self.long

    def attention(self, text, source=None) -> dict:
        """The viewer's payload for TEXT through model SOURCE (default: the server's)."""
        model, n = self._checked(text, source)
        lane = self._lane(model, n, "attention")
        lane.enter()
        try:                                   # the payload too: one L·H·n² array per lane at a time
            if getattr(model.config, "encoder_decoder", False):     # its translation, and three kinds of attention
                return trace_payload(translation_trace(model, text), tokenizer=model.tokenizer)
            trace = model.run(text, keep=sections_keep(model, n))
            return trace_payload(trace, sections=viewer_sections(model, trace))    # named after trace.model
        finally:
            lane.leave()

    def pipeline(self, request: dict) -> dict:
        """The pipeline page's payload for request {"text", "model", "lang", "layer"?} (viz/pipeline.py; layer: the
        one opened, whose whole q, k, v the attention diagram's arithmetic gets first)."""
        lang = self._lang(request)
        model, n = self._checked(request.get("text"), request.get("model"), MAX_PIPELINE_TOKENS)
        layer = self._layer(request, model)
        lane = self._lane(model, n, "pipeline")
        lane.enter()
        try:
            return pipeline_payload(model, pipeline_trace(model, request["text"]), lang=lang, layer=layer)
        finally:
            lane.leave()

    def next_token(self, request: dict) -> dict:
        """One token more: the engine draws it from softmax(filter(logits[last] / T)) (qkv.writing.sampling),
        then the pipeline of the text with it: {"id", "token", "text", "payload"}."""
        lang = self._lang(request)
        sampling = self._sampling(request)
        text = request.get("text")
        model, n = self._checked(text, request.get("model"), MAX_PIPELINE_TOKENS - 1)
        layer = self._layer(request, model)
        if getattr(model.config, "encoder_decoder", False):
            raise HttpError(400, f"{model.name} is an encoder–decoder: the page shows its translation; "
                                 f"\"next token\" writes with a decoder, e.g. {LLM!r}")
        if model.weights.W_vocab is None or not model.config.causal:
            raise HttpError(400, f"{model.name} is an encoder: it writes no next token; choose a decoder, "
                                 f"e.g. {LLM!r}")
        lane = self._lane(model, n + 1, "next")
        lane.enter()
        try:
            trace = model.run(text)
            new = int(sampling.pick(trace.logits[-1:].astype(np.float64), sampling.rng())[0])
            ids = [int(i) for i in trace.ids] + [new]                    # the very token drawn, not re-read
            longer = model.run(ids, keep=PIPELINE_KEEP)                 # (a scan's own steps too)
            longer.text = text + model.tokenizer.decode([new])
            return {"id": new, "token": model.tokenizer.label(new), "text": longer.text,
                    "payload": pipeline_payload(model, longer, lang=lang, layer=layer)}
        finally:
            lane.leave()

    def graph(self, request: dict) -> dict:
        """The attribution graph of request {"text"} on the server's own model over its transcoders, as the Graph
        tab draws it (module doc)."""
        from ..graphs.files import graph_json
        from ..graphs.graph import build_graph
        from ..graphs.page import annotate
        from ..graphs.prune import EDGE_THRESHOLD, NODE_THRESHOLD, prune_graph

        if self.transcoders is None:
            raise HttpError(400, "this server has no transcoders, so it computes no graphs; start it with "
                                 "qkv serve --transcoders DIR, or open a graph's JSON")
        if request.get("model", self.default) != self.default:
            raise HttpError(400, f"the transcoders are {self.default!r}'s: graphs are computed on that model only")
        model, _ = self._checked(request.get("text"), self.default, MAX_GRAPH_TOKENS)
        self.long.enter()
        try:
            graph = build_graph(model, request["text"], self.transcoders)
            pruned, scores = prune_graph(graph, NODE_THRESHOLD, EDGE_THRESHOLD)
            data = graph_json(graph, pruned, scores, node_threshold=NODE_THRESHOLD, edge_threshold=EDGE_THRESHOLD,
                              prompt=request["text"], transcoders=f"{len(self.transcoders)} per-layer transcoders")
            return annotate(data, model, self.transcoders)
        finally:
            self.long.leave()

    @staticmethod
    def _layer(request: dict, model) -> int:
        """The request's "layer" (absent: 0), one of MODEL's (an encoder–decoder's: its decoder's)."""
        layer = request.get("layer", 0)
        c = model.config
        L = c.n_decoder_layers if getattr(c, "encoder_decoder", False) else c.n_layers
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < L:
            raise HttpError(400, f"field 'layer' must be a whole number from 0 to {L - 1}, got {str(layer)[:20]}")
        return layer

    @staticmethod
    def _lang(request: dict) -> str:
        lang = request.get("lang", "en")
        if lang not in LANGS:
            raise HttpError(400, f"field 'lang' must be one of {', '.join(map(repr, LANGS))}, got {str(lang)[:20]!r}")
        return lang

    @staticmethod
    def _sampling(request: dict) -> Sampling:
        """The request's temperature, top_k, top_p and seed, checked (numbers or null)."""
        settings = {}
        for key, kind in (("temperature", (int, float)), ("top_k", int), ("top_p", (int, float)), ("seed", int)):
            value = request.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
                raise HttpError(400, f"field {key!r} must be a number or null, got {str(value)[:20]!r}")
            settings[key] = value
        return Sampling(**settings)

    def chat(self, request: dict) -> "ChatReply":
        """Check a chat request and take the writer's place; the reply is written as it is iterated."""
        from ..writing.chat import check_can_chat

        messages, source, max_new = self._chat_request(request)
        model = self.model(source)
        check_can_chat(model)
        messages, n, dropped = self._fitted(model, messages, max_new)
        try:
            self.writer.enter(wait=False)
        except Busy:
            raise Busy("the model is busy writing another reply; send again when it is done") from None
        return ChatReply(self.writer, self.long, model, messages, n, max_new, dropped)

    def _chat_request(self, request: dict) -> tuple[list[dict], str, int]:
        """(messages, model source, max_new_tokens) of a chat request, or the reason it is refused."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HttpError(400, "missing field 'messages': send {\"messages\": [{\"role\": \"user\", "
                                 "\"content\": \"...\"}], \"model\": \"...\"}")
        if len(messages) > MAX_TURNS:
            raise HttpError(413, f"the conversation has {len(messages)} messages; the limit is {MAX_TURNS}: "
                                 "start a new chat")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or set(m) != {"role", "content"} or m["role"] not in ROLES \
                    or not isinstance(m["content"], str):
                raise HttpError(400, f"message {i} must be {{\"role\": \"system\" | \"user\" | \"assistant\", "
                                     "\"content\": \"...\"}")
            if len(m["content"]) > MAX_MESSAGE:
                raise HttpError(413, f"message {i} has {len(m['content']):,} characters; the limit is "
                                     f"{MAX_MESSAGE:,}: shorten it")
        if messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            raise HttpError(400, "the last message must be the user's, and not empty: type a message")
        if sum(len(m["content"]) for m in messages) > MAX_CHARS:
            raise HttpError(413, f"the conversation has more than {MAX_CHARS:,} characters: start a new chat")
        source = request.get("model", self.chat_default)
        if not isinstance(source, str):
            raise HttpError(400, "field 'model' must be a string, one of " + ", ".join(map(repr, self.sources)))
        max_new = request.get("max_new_tokens", NEW_TOKENS)
        if isinstance(max_new, bool) or not isinstance(max_new, int) or not 1 <= max_new <= MAX_NEW_TOKENS:
            raise HttpError(400, f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, "
                                 f"got {max_new!r}")
        return messages, source, max_new

    def _fitted(self, model: Model, messages: list[dict], max_new: int) -> tuple[list[dict], int, int]:
        """The conversation without its oldest turns (a system message stays) as far as needed for the
        prompt and the reply to fit what one answer may show: (messages, prompt tokens, turns left out)."""
        first = 1 if messages[0]["role"] == "system" else 0
        limit = self.max_tokens(model)
        dropped = 0
        while True:
            n = len(model.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
            if n + max_new <= limit:
                return messages, n, dropped
            if len(messages) - first <= 1:
                raise HttpError(413, f"the message takes {n:,} tokens and the reply up to {max_new}, but "
                                     f"{model.name} here shows at most {limit:,}: shorten the message")
            messages = messages[:first] + messages[first + 2:]
            dropped += 1

    def can_chat(self, source: str) -> bool:
        """Whether SOURCE, if already loaded, is a decoder with a chat template."""
        from ..writing.chat import check_can_chat

        model = self._models.get(source)
        try:
            return model is not None and check_can_chat(model) is None
        except QkvError:
            return False

    @property
    def chat_default(self) -> str:
        """The model the chat starts with: the server's own if it can chat, else the bundled LLM."""
        return self.default if self.can_chat(self.default) or LLM not in self.sources else LLM

    def example(self) -> str:
        """The text the page runs first: a protein's sequence for a protein model (ESM: its Contacts tab), else
        EXAMPLE."""
        from ..lessons.proteins import TRP_CAGE

        model = self._models.get(self.default)
        return TRP_CAGE if model is not None and getattr(model.weights, "W_contact", None) is not None else EXAMPLE

    def page(self) -> str:
        """The app's HTML: the viewer's JS and CSS, the form's and the chat's JS and CSS, and the config."""
        config = {"models": self.sources, "model": self.default, "max_chars": MAX_CHARS, "text": self.example(),
                  "pipeline_tokens": MAX_PIPELINE_TOKENS, "chat_model": self.chat_default,
                  "chat_ready": self.can_chat(self.default), "max_message": MAX_MESSAGE, "max_new_tokens": NEW_TOKENS,
                  "graph_words": texts("graph"), "graph_bytes": MAX_GRAPH_BYTES,
                  "graph_compute": self.transcoders is not None, "graph_tokens": MAX_GRAPH_TOKENS}
        body = (f"<style>\n{asset('app.css')}\n{asset('pipeline.css')}\n{asset('graph.css')}</style>\n"
                "<div class=\"qkv qkv-app\">\n<h1>qkv · see attention</h1>\n<div data-qkv-root></div>\n</div>\n"
                f"<script type=\"application/json\" class=\"qkv-app-config\">{script_json(config)}</script>")
        face = (f'@font-face {{ font-family: "{hangul.FAMILY}"; src: url("hangul.woff") format("woff"); '
                'font-weight: 100 900; }\n'
                if hangul.font_path() is not None else "")   # every syllable: chat replies may hold any
        return html_page("qkv · see attention", body,
                         [viewer_js(), pipeline_js(), asset("graph.js"), asset("app.js")],
                         csp=_CSP_APP, face=face)


class ChatReply(Stream):
    """One reply being written: holds the writer from creation until the reply ends (or `close`).

    Iterating `events()` writes the reply (greedy, as `Model.chat`), yielding the NDJSON events of the
    module doc (the server sends each as it comes). "done" carries the viewer's payload of prompt + reply made
    from what the writing recorded (attention, each token's candidates, rollout: no second pass), and is sent
    with the writer free; the logit lens, a pass and (L+1)·n·V more, follows as heavy work in the long lane.
    """

    def __init__(self, writer: Lane, heavy: Lane, model: Model, messages: list[dict], prompt: int,
                 max_new: int, dropped: int):
        self._writer, self._heavy, self.model, self.messages = writer, heavy, model, messages
        self.max_new, self.prompt, self.dropped = max_new, prompt, dropped
        self._writing = True

    def events(self):
        from ..writing.chat import chat_stream

        yield {"prompt": self.prompt, "dropped": self.dropped}
        stream = chat_stream(self.model, self.messages, self.max_new, record=True)   # greedy, ends at the end of
        for piece in stream:                                                          # turn, recorded as it runs
            yield {"piece": piece}
        trace = stream.trace()                   # from the recording: no pass over the text
        payload = trace_payload(trace, title=f"{self.model.name} · chat", tokenizer=self.model.tokenizer,
                                sections=viewer_sections(self.model, trace, lens_limit=0))   # the lens: below
        self.close()                             # the reply is written: another may be
        yield {"done": True, "reply": self.model.tokenizer.decode(stream.new_ids, skip_special_tokens=True),
               "stopped": "length" if len(stream.new_ids) >= self.max_new else "end of turn", "payload": payload}
        if shows_lens(self.model, len(trace.ids)):
            yield self._lens(trace)

    def _lens(self, trace) -> dict:
        """{"lens": the viewer's lens section} of the reply's TRACE, computed in the long lane (waiting there as
        any heavy request does), or {"lens": None, "note": why} when that lane is full."""
        try:
            self._heavy.enter()
        except Busy:
            return {"lens": None, "note": "the server is busy with heavy requests, so the logit lens was left out"}
        try:
            return {"lens": lens_payload(self.model, trace)}      # a pass keeping the stream's parts, then the lens
        finally:
            self._heavy.leave()

    def close(self) -> None:
        """Free the writer (once): the reply is written, or its client left."""
        if self._writing:
            self._writing = False
            self._writer.leave()


def make_server(source: str = "minilm", host: str = "127.0.0.1", port: int = 8000,
                transcoders: str | None = None, steer: Callable[[Model], Model] | None = None) -> Server:
    """A server for model SOURCE (loaded now, so a bad --model fails before serving); TRANSCODERS: a folder of
    SOURCE's per-layer transcoders (`features.dictionaries.load_transcoders`), read and checked now too, with
    which the Graph tab computes graphs; STEER: SOURCE's model → the view of it the server uses (`qkv serve
    --steer`: every pass of that model steered)."""
    app = App(source)
    model = app.model(source)
    if steer is not None:
        model = app._models[source] = steer(model)
    if transcoders is not None:
        from ..features.dictionaries import load_transcoders
        from ..graphs.replacement import check_model, check_transcoders

        check_model(model)
        app.transcoders = check_transcoders(model, load_transcoders(transcoders))
    try:
        return Server((host, port), app)
    except OSError as e:
        raise QkvError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host") from None
