"""A hardened local HTTP server (standard library only): limits, lanes, request parsing and safe answers.

It knows no page: what each path does is the app's (web/app.py, qkv's routes), handed to `Server` as an
object with `get`, `post` and `csp` (`Routes`). This module never imports the app.

Mistakes get a JSON {"error": "..."} naming the fix: 400 (bad request, two Host headers), 403 (another site or
host name), 404, 411, 413 (a body over MAX_BODY), 503 with Retry-After (the server is full: try again); a bug
gets 500 and the server keeps running. Every answer, errors included, carries the security headers.

Load: at most MAX_THREADS connections are served at once (more get 503 at once), the kernel
queues BACKLOG more. A request's line and headers must arrive within HEAD_SECONDS of its first byte being
awaited (an idle keep-alive connection included), its body within BODY_SECONDS (a body shorter than its
Content-Length: 400 when the client stops sending, 408 at the deadline); and at most MAX_WAITING
connections may be waiting for their request at once — a new connection past that closes the one that
has waited longest, so clients trickling headers (a line every few seconds) never hold every thread.
Work waits in a `Lane`: one at a time, first come first served, at most LANE_WAITING waiting (more get 503);
the app chooses which lane each request takes.

Other sites: it binds 127.0.0.1 unless told otherwise, and on any loopback address answers only
requests addressed to a loopback name (403 otherwise: DNS rebinding). The API (paths under /api/) refuses
requests a browser marks as coming from another site (Sec-Fetch-Site) and POSTs whose Origin is not this
server, so a page the user visits cannot drive it.
"""

from __future__ import annotations

import io
import ipaddress
import json
import re
import socket
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol, Union
from urllib.parse import parse_qs, urlsplit

from ..runtime.errors import QkvError

MAX_BODY = 64 * 1024                # bytes of request body (the app's 10,000 characters of UTF-8 fit)
BACKLOG = 128                       # connections the kernel queues before accept (the default is 5)
MAX_THREADS = 64                    # connections served at once; one more gets 503 at once
LANE_WAITING = 8                    # requests waiting in one lane; one more gets 503 (one user needs few)
RETRY_AFTER = 2                     # seconds a 503 asks the client to wait
HEAD_SECONDS = 10                   # to send a request's line and headers (from when the server awaits it)
BODY_SECONDS = 10                   # to send its body (64 kB at most)
MAX_WAITING = MAX_THREADS // 2      # connections waiting for their request's head at once; a new one past it
                                    # closes the longest-waiting

_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?")   # Host: name or [IPv6] and a port
_SAME_SITE = ("same-origin", "none")       # Sec-Fetch-Site of the page's own requests, or typed by the user
_SECURITY_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_NO_FRAMING = "; frame-ancestors 'none'"   # only a header can forbid framing: added to the app's CSP


def is_loopback(host: str) -> bool:
    """Whether HOST (a name or an address) is this machine only: localhost, 127.0.0.0/8, ::1."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str) -> str | None:
    """The warning `qkv serve --host HOST` prints, or None when only this machine can connect."""
    if is_loopback(host):
        return None
    return f"qkv: warning: listening on {host}, so other machines can reach this page"


class HttpError(Exception):
    """A request the server refuses: an HTTP status and one sentence for the user."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Busy(HttpError):
    """503: the server is full; the client should send again after RETRY_AFTER seconds."""

    def __init__(self, message: str):
        super().__init__(503, message)


class Lane:
    """Work of one kind: one at a time, first come first served, at most `waiting` in the queue."""

    def __init__(self, name: str, waiting: int = LANE_WAITING):
        self.name, self.waiting = name, waiting
        self._turn = threading.Condition()
        self._next = self._serving = 0            # tickets: the next to hand out, the one running

    def enter(self, wait: bool = True) -> None:
        """Wait for this lane's turn (Busy if the queue is full, or if not `wait` and it is taken)."""
        with self._turn:
            queued = self._next - self._serving
            if queued > self.waiting or (queued and not wait):
                raise Busy(f"the server is busy with {queued} {self.name}; send again in a few seconds")
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._turn.wait()

    def leave(self) -> None:
        with self._turn:
            self._serving += 1
            self._turn.notify_all()


class Stream:
    """An answer sent as it is made: one JSON line per event (NDJSON), then the connection closes.

    `events()` yields the events; `close()` is called once the answer ends, sent whole or not (its client left)."""

    def events(self) -> Iterator[dict]:
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Asset:
    """Bytes served as they are (a font), with their Content-Type; cached a day (the same bytes for every page)."""

    data: bytes
    kind: str


Answer = Union[str, dict, Asset, Stream]   # an HTML page, JSON, bytes as they are, or events as they come


class Routes(Protocol):
    """What the app gives the server: an answer (status, Answer) for each GET and POST, and its pages' CSP."""

    csp: str                                                     # the Content-Security-Policy of its HTML pages

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, Answer]:
        """GET PATH with its query string parsed (parse_qs, blank values kept); HttpError for a refusal."""

    def post(self, path: str, body: Callable[[], dict]) -> tuple[int, Answer]:
        """POST PATH; `body()` reads the request's JSON object (checked, within MAX_BODY): call it once the
        path is known, so an unknown path is refused before its body is read."""


class DeadlineReader(io.RawIOBase):
    """The connection's bytes, each recv bounded by what is left before `deadline` (time.monotonic()): a
    client sending a byte every few seconds still runs out of time, where a socket timeout per recv would
    wait forever. Past the deadline: TimeoutError (which BaseHTTPRequestHandler turns into a closed connection)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.deadline = sock, time.monotonic() + HEAD_SECONDS

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client took too long to send its request")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class Handler(BaseHTTPRequestHandler):
    """Checks one request and hands it to the app's routes; every answer is JSON except the pages and assets."""

    server_version = "qkv"
    timeout = 20                               # writing an answer to a client that stopped reading

    def setup(self) -> None:
        super().setup()
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """One request: HEAD_SECONDS for its line and headers, counted among the waiting connections until then."""
        self._reader.deadline = time.monotonic() + HEAD_SECONDS
        self.server.waiting(self.connection, True)           # type: ignore[attr-defined]
        try:
            super().handle_one_request()
        finally:
            self.server.waiting(self.connection, False)      # type: ignore[attr-defined]

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:                                               # the head is in: no longer waiting; the body's own time
            self.server.waiting(self.connection, False)      # type: ignore[attr-defined]
            self._reader.deadline = time.monotonic() + BODY_SECONDS
        return ok

    @property
    def app(self) -> Routes:
        return self.server.app                 # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _get(self) -> tuple[int, Answer]:
        url = urlsplit(self.path)
        return self.app.get(url.path, parse_qs(url.query, keep_blank_values=True))

    def _post(self) -> tuple[int, Answer]:
        return self.app.post(urlsplit(self.path).path, self._json_body)

    def _check_host(self) -> None:
        """One Host header (HTTP/1.1: two are a bad request, and the checks below would read only the first);
        against DNS rebinding: on loopback, answer only requests addressed to a loopback name."""
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:
            raise HttpError(400, f"the request has {len(hosts)} Host headers; send one")
        if not is_loopback(self.server.server_address[0]):
            return
        found = _HOST.fullmatch(self.headers.get("Host") or "")       # a name or [address], then :port at most
        if not found or not is_loopback(found.group(1)):
            raise HttpError(403, f"this server answers only requests to {self.server.server_address[0]} or localhost")

    def _check_site(self) -> None:
        """Against other sites: the API answers only the page itself, curl and the like.

        Browsers mark each request with the site it comes from (Sec-Fetch-Site) and a POST with its
        Origin; either one naming another site or another port is refused. The page itself (GET /)
        may be opened from a link anywhere."""
        if not urlsplit(self.path).path.startswith("/api/"):
            return
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site.lower() not in _SAME_SITE:
            raise HttpError(403, f"refused a request from another site (Sec-Fetch-Site: {site[:40]}); "
                                 "use the page this server serves")
        origin = self.headers.get("Origin")
        if origin is None:
            return
        if origin.lower() != f"http://{self.headers.get('Host', '')}".lower():
            raise HttpError(403, f"refused a request from another origin ({origin[:80]}); "
                                 "use the page this server serves")

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
        try:
            raw = self.rfile.read(max(size, 0))
        except (TimeoutError, OSError):
            self.close_connection = True
            raise HttpError(408, f"the request body did not arrive within {BODY_SECONDS} s; send all "
                                 f"{size:,} bytes its Content-Length promises") from None
        if len(raw) < size:
            self.close_connection = True
            raise HttpError(400, f"the request body has {len(raw):,} bytes, fewer than its Content-Length "
                                 f"{size:,}; send the whole body")
        try:
            request = json.loads(raw.decode("utf-8"))
            json.dumps(request, ensure_ascii=False).encode("utf-8")     # a lone surrogate (\\ud800) fails here
        except (UnicodeError, ValueError) as e:
            raise HttpError(400, f"the request body is not valid JSON in UTF-8 ({e}); "
                                 "send {\"text\": \"...\", \"model\": \"...\"}") from None
        except RecursionError:
            raise HttpError(400, "the request body nests too deeply; "
                                 "send {\"text\": \"...\", \"model\": \"...\"}") from None
        if not isinstance(request, dict):
            raise HttpError(400, "the request body must be a JSON object: {\"text\": \"...\", \"model\": \"...\"}")
        return request

    def _answer(self, route: Callable[[], tuple[int, Answer]]) -> None:
        try:
            self._check_host()
            self._check_site()
            status, body = route()
        except HttpError as e:
            status, body = e.status, {"error": str(e)}
        except QkvError as e:
            status, body = 400, {"error": str(e)}
        except Exception as e:                 # a bug: say so, log it, keep serving
            traceback.print_exc(file=sys.stderr)
            status, body = 500, {"error": f"internal error ({type(e).__name__}); see the server's log"}
        self.connection.settimeout(self.timeout)     # writing: the reads' deadline is over (DeadlineReader)
        if isinstance(body, Stream):
            return self._stream(body)
        self._send(status, body)

    def _send(self, status: int, body: str | dict | Asset) -> None:
        """One whole answer: a page (a str), an Asset or JSON, with the security headers."""
        if isinstance(body, str):
            data, kind = body.encode("utf-8"), "text/html; charset=utf-8"
        elif isinstance(body, Asset):
            data, kind = body.data, body.kind
        else:
            data, kind = json.dumps(body, ensure_ascii=True).encode("ascii"), "application/json"
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in _SECURITY_HEADERS.items():
                self.send_header(name, value)
            if kind.startswith("text/html"):
                self.send_header("Content-Security-Policy", self.app.csp + _NO_FRAMING)
            if status == 503:
                self.send_header("Retry-After", str(RETRY_AFTER))
            if isinstance(body, Asset):
                self.send_header("Cache-Control", "max-age=86400")   # the same bytes for every page
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass                               # the client left; nothing to tell it

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (bad request line, 501 unknown method, 414 ...) as JSON
        with the security headers, like every other answer."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        hint = "; the API takes GET and POST" if code == 501 else ""
        self._send(code, {"error": f"{message or phrase}{hint}"})

    def _stream(self, answer: Stream) -> None:
        """Send the answer's events as they come, one JSON line each, then close the connection
        (no Content-Length: HTTP/1.0 ends the body by closing). A client that leaves stops the events."""
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            for name, value in _SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            events = answer.events()
            try:
                for event in events:
                    self._line(event)
            except (BrokenPipeError, ConnectionResetError):
                return                         # the client left: stop writing
            except QkvError as e:
                self._line({"error": str(e)})
            except Exception as e:             # a bug: say so, log it, keep serving
                traceback.print_exc(file=sys.stderr)
                self._line({"error": f"internal error ({type(e).__name__}); see the server's log"})
            finally:
                events.close()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            answer.close()

    def _line(self, event: dict) -> None:
        self.wfile.write(json.dumps(event, ensure_ascii=True).encode("ascii") + b"\n")
        self.wfile.flush()

    def log_message(self, format: str, *args) -> None:
        sys.stderr.write(f"qkv serve: {self.address_string()} {format % args}\n")


class Server(ThreadingHTTPServer):
    """One thread per connection, at most MAX_THREADS; a connection beyond gets 503 at once."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], app: Routes):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.app = app
        self._threads_free = threading.BoundedSemaphore(MAX_THREADS)
        self._waiting: OrderedDict[socket.socket, None] = OrderedDict()   # oldest first
        self._waiting_lock = threading.Lock()

    def waiting(self, connection: socket.socket, yes: bool) -> None:
        """Count CONNECTION among those waiting for their request's head (yes) or not."""
        with self._waiting_lock:
            if yes:
                self._waiting[connection] = None
            else:
                self._waiting.pop(connection, None)

    def _close_longest_waiting(self) -> bool:
        """Close the connection that has waited longest for its request (its thread ends at once)."""
        with self._waiting_lock:
            if not self._waiting:
                return False
            oldest, _ = self._waiting.popitem(last=False)
        try:
            oldest.shutdown(socket.SHUT_RDWR)                 # its blocked recv returns: the thread ends
        except OSError:
            pass
        return True

    def process_request(self, request, client_address) -> None:
        while len(self._waiting) >= MAX_WAITING and self._close_longest_waiting():
            pass
        free = self._threads_free.acquire(blocking=False)
        if not free and self._close_longest_waiting():        # a thread a trickling client held
            free = self._threads_free.acquire(timeout=1.0)
        if not free:
            self._refuse(request)
            return
        self.waiting(request, True)                           # waiting from accept, before its thread runs
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.waiting(request, False)
            self._threads_free.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.waiting(request, False)
            self._threads_free.release()

    def _refuse(self, request: socket.socket) -> None:
        """503 on a connection no thread can take, written without waiting (this is the accept loop)."""
        body = json.dumps({"error": f"the server is busy with {MAX_THREADS} connections; "
                                    "send again in a few seconds"}).encode("ascii")
        head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER}\r\nConnection: close\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in _SECURITY_HEADERS.items()) + "\r\n")
        try:
            request.setblocking(False)
            try:
                request.recv(MAX_BODY)             # what has come already: closing on unread data resets
            except (BlockingIOError, OSError):
                pass
            request.send(head.encode("ascii") + body)
        except OSError:
            pass
        self.shutdown_request(request)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
