"""`qkv serve`: a local web page where you type text and see its attention (standard library only).

    GET  /                the page: a text box, a model picker and the viewer (viz/html.py)
    GET  /api/models      {"models": [...], "default": ...}: what this server may load
    POST /api/attention   {"text": ..., "model": ...} → the viewer's payload (viz/payload.py)
    GET  /api/attention?text=...&model=...   the same, for curl

Mistakes get a JSON {"error": "..."} naming the fix: 400 (bad request), 404, 411, 413
(text too long for the page or the model); a bug gets 500 and the server keeps running.
Only models on the allow-list load (--model and `qkv.available()`), one forward pass at
a time, so memory stays bounded. It binds 127.0.0.1 unless told otherwise, and there it
answers only requests addressed to a loopback name (403 otherwise: DNS rebinding).
"""

from __future__ import annotations

import json
import math
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .checkpoints import available, load
from .errors import QkvError
from .model import Model
from .viz.html import asset, page as html_page
from .viz.payload import script_json, trace_payload

MAX_CHARS = 10_000                  # characters of text per request
MAX_BODY = 64 * 1024                # bytes of request body (10,000 characters of UTF-8 fit)
MAX_ATTENTION = 60_000_000          # L·H·n² weights per answer (about 60 MB before compression)
EXAMPLE = "The cat sat on the mat"

_CSP_APP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
            "connect-src 'self'; form-action 'none'; base-uri 'none'")
_CSP_HEADER = _CSP_APP + "; frame-ancestors 'none'"     # only a header can forbid framing


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class HttpError(Exception):
    """A request the server refuses: an HTTP status and one sentence for the user."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class App:
    """What the server knows: the allowed model sources, and the models loaded so far."""

    def __init__(self, source: str = "minilm"):
        self.default = source
        self.sources = list(dict.fromkeys([source, *(s for s, _ in available())]))
        self._models: dict[str, Model] = {}
        self._loading = threading.Lock()
        self._running = threading.Lock()     # one forward pass at a time: bounded memory

    def model(self, source: str) -> Model:
        """The model for SOURCE, loaded on first use; only sources on the allow-list."""
        if source not in self.sources:
            raise HttpError(400, f"unknown model {source!r}; this server offers {', '.join(map(repr, self.sources))}")
        with self._loading:
            if source not in self._models:
                self._models[source] = load(source)
            return self._models[source]

    def max_tokens(self, model: Model) -> int:
        """The longest text (in tokens) whose attention fits the model and one answer."""
        c = model.config
        return min(c.max_positions, math.isqrt(MAX_ATTENTION // (c.n_layers * c.n_heads)))

    def attention(self, text, source=None) -> dict:
        """The viewer's payload for TEXT through model SOURCE (default: the server's)."""
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
        if model.tokenizer is not None:
            n, limit = len(model.tokenizer.encode(text)[0]), self.max_tokens(model)
            if n > limit:
                raise HttpError(413, f"the text has {n:,} tokens but {model.name} here takes at most {limit:,}; "
                                     "shorten it")
        with self._running:
            trace = model.run(text, keep=("attentions",))
        return trace_payload(trace, model_name=model.name)

    def page(self) -> str:
        """The app's HTML: the viewer's JS and CSS, the form's JS, and the config."""
        config = {"models": self.sources, "model": self.default, "max_chars": MAX_CHARS, "text": EXAMPLE}
        body = ("<div class=\"qkv qkv-app\">\n<h1>qkv · see attention</h1>\n<div data-qkv-root></div>\n</div>\n"
                f"<script type=\"application/json\" class=\"qkv-app-config\">{script_json(config)}</script>")
        return html_page("qkv · see attention", body, [asset("viewer.js"), asset("app.js")], csp=_CSP_APP)


class Handler(BaseHTTPRequestHandler):
    """Routes one request to the App; every answer is JSON except the page itself."""

    server_version = "qkv"
    timeout = 60                               # a stalled client frees its thread

    @property
    def app(self) -> App:
        return self.server.app                 # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _get(self):
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            return 200, self.app.page()
        if url.path == "/api/models":
            return 200, {"models": self.app.sources, "default": self.app.default}
        if url.path == "/api/attention":
            query = parse_qs(url.query, keep_blank_values=True)
            text = query.get("text", [None])[0]
            return 200, self.app.attention(text, query.get("model", [None])[0])
        raise HttpError(404, f"no page {url.path}; the app is at /")

    def _post(self):
        if urlsplit(self.path).path != "/api/attention":
            raise HttpError(404, f"no endpoint {urlsplit(self.path).path}; POST to /api/attention")
        request = self._json_body()
        return 200, self.app.attention(request.get("text"), request.get("model"))

    def _check_host(self) -> None:
        """Against DNS rebinding: on loopback, answer only requests addressed to a loopback name."""
        if self.server.server_address[0] not in _LOOPBACK:
            return
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        if host not in _LOOPBACK:
            raise HttpError(403, f"this server answers only requests to {' or '.join(_LOOPBACK[:2])}")

    def _json_body(self) -> dict:
        length = self.headers.get("Content-Length")
        if length is None:
            raise HttpError(411, "the request has no Content-Length; send a JSON body with its length")
        try:
            size = int(length)
        except ValueError:
            raise HttpError(400, f"Content-Length {length!r} is not a number") from None
        if size > MAX_BODY:
            self.close_connection = True       # the body is not read: do not reuse this connection
            raise HttpError(413, f"the request is {size:,} bytes; the limit is {MAX_BODY:,}: send a shorter text")
        raw = self.rfile.read(max(size, 0))
        try:
            request = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise HttpError(400, f"the request body is not valid JSON ({e}); "
                                 "send {\"text\": \"...\", \"model\": \"...\"}") from None
        if not isinstance(request, dict):
            raise HttpError(400, "the request body must be a JSON object: {\"text\": \"...\", \"model\": \"...\"}")
        return request

    def _answer(self, route) -> None:
        try:
            self._check_host()
            status, body = route()
        except HttpError as e:
            status, body = e.status, {"error": str(e)}
        except QkvError as e:
            status, body = 400, {"error": str(e)}
        except Exception as e:                 # a bug: say so, log it, keep serving
            traceback.print_exc(file=sys.stderr)
            status, body = 500, {"error": f"internal error ({type(e).__name__}); see the server's log"}
        if isinstance(body, str):
            data, kind = body.encode("utf-8"), "text/html; charset=utf-8"
        else:
            data, kind = json.dumps(body, ensure_ascii=True).encode("ascii"), "application/json"
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            if kind.startswith("text/html"):
                self.send_header("Content-Security-Policy", _CSP_HEADER)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass                               # the client left; nothing to tell it

    def log_message(self, format: str, *args) -> None:
        sys.stderr.write(f"qkv serve: {self.address_string()} {format % args}\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: App):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.app = app

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def make_server(source: str = "minilm", host: str = "127.0.0.1", port: int = 8000) -> Server:
    """A server for model SOURCE (loaded now, so a bad --model fails before serving)."""
    app = App(source)
    app.model(source)
    try:
        return Server((host, port), app)
    except OSError as e:
        raise QkvError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host") from None
