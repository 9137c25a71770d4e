"""`qkv serve` without a browser: the API's answers and every refusal, through plain HTTP.

tests/test_browser.py drives the page itself in Chromium. The tests wait on events (an answer, a hook
called, a lane freed), never for a number of seconds: PATIENCE only guards against a hang.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

import qkv
from qkv.web.app import MAX_CHARS, make_server
from qkv.web.server import Busy
from qkv.analysis import attention_flow, attention_rollout, logit_lens
from qkv.viz import wire
from qkv.viz.payload import PRECISION
from conftest import MODELS, running_server

BERT = str(MODELS / "bert")                     # 2 layers × 4 heads, 64 positions: fast
SENTENCE = "The cat sat on the mat"
PATIENCE = 900      # seconds a client waits for the server's next bytes: a hang guard, not a speed limit (on a
                    # busy 2-core machine a SmolLM2 reply's logit lens alone took two minutes)


@pytest.fixture(scope="module")
def server():
    with running_server(BERT) as srv:
        yield srv


def call(srv, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, decoded body) of one request; JSON bodies are parsed."""
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=PATIENCE)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        kind = r.getheader("Content-Type", "")
        return r.status, r, json.loads(data) if kind.startswith("application/json") else data.decode()
    finally:
        conn.close()


def post(srv, obj) -> tuple[int, dict]:
    status, _, body = call(srv, "POST", "/api/attention", json.dumps(obj).encode(),
                           {"Content-Type": "application/json"})
    return status, body


def test_binds_to_this_machine_only_by_default(server):
    assert server.server_address[0] == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")


def test_the_page_is_self_contained(server):
    status, r, page = call(server, "GET", "/")
    assert status == 200 and r.getheader("Content-Type") == "text/html; charset=utf-8"
    assert "frame-ancestors 'none'" in r.getheader("Content-Security-Policy")
    assert "QKV.mount" in page and 'class="qkv-app-config"' in page
    assert "https://" not in page and "http://" not in page


def test_models_lists_the_given_model_first_and_the_bundled_one(server):
    status, _, body = call(server, "GET", "/api/models")
    assert status == 200 and body["default"] == BERT and body["models"][0] == BERT and "minilm" in body["models"]


def test_attention_answers_the_viewers_payload(server):
    status, body = post(server, {"text": "the cat sat"})
    assert status == 200, body
    want = qkv.load(BERT).run("the cat sat", keep=("attentions",))
    assert body["tokens"] == want.tokens and body["layers"] == [0, 1] and body["heads"] == 4
    got = wire.decode(body["attention"])                                # (2, 4, n, n)
    assert got.shape == want.attentions.shape
    assert np.abs(got - want.attentions).max() <= PRECISION + 1e-7


def test_attention_carries_the_viewers_rollout_tab_and_no_lens_for_an_encoder(server):
    status, body = post(server, {"text": "the cat sat"})
    assert status == 200, body
    trace = qkv.load(BERT).run("the cat sat", keep=("attentions",))
    got = wire.decode(body["rollout"]["rollout"])                          # (L, n, n)
    assert np.abs(got - attention_rollout(trace)).max() <= PRECISION + 1e-7
    assert np.abs(wire.decode(body["rollout"]["flow"]) - attention_flow(trace)).max() <= PRECISION + 1e-7
    assert body["lens"] is None                                              # BERT has no LM head


def test_attention_by_get_and_another_allowed_model(server):
    query = urllib.parse.urlencode({"text": "The cat sat on the mat", "model": "minilm"})
    status, _, body = call(server, "GET", "/api/attention?" + query)
    assert status == 200, body
    assert body["model"] == "all-MiniLM-L6-v2" and body["tokens"][:3] == ["[CLS]", "the", "cat"]


@pytest.mark.parametrize("body, status, message", [
    (b"not json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"{}", 400, "missing field 'text'"),
    (b'{"text": 5}', 400, "missing field 'text'"),
    (b'{"text": "   "}', 400, "the text is empty"),
    (b'{"text": "hi", "model": 3}', 400, "'model' must be a string"),
    (b'{"text": "hi", "model": "/etc"}', 400, "unknown model '/etc'; this server offers"),
    (json.dumps({"text": "a" * (MAX_CHARS + 1)}).encode(), 413, "10,001 characters; the limit is 10,000"),
    (json.dumps({"text": "word " * 100}).encode(), 413, "takes at most 64; shorten it"),
])
def test_bad_requests_get_a_clear_json_error(server, body, status, message):
    got, r, answer = call(server, "POST", "/api/attention", body, {"Content-Type": "application/json"})
    assert got == status and r.getheader("Content-Type") == "application/json"
    assert message in answer["error"], answer


def test_a_body_too_large_is_refused_before_reading_it(server):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=PATIENCE)
    conn.putrequest("POST", "/api/attention")
    conn.putheader("Content-Length", str(10**9))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and "limit is 65,536" in json.loads(r.read())["error"]
    conn.close()


def test_missing_content_length_and_unknown_paths(server):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=PATIENCE)
    conn.putrequest("POST", "/api/attention")
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 411 and "Content-Length" in json.loads(r.read())["error"]
    conn.close()
    assert call(server, "GET", "/nope")[0] == 404
    assert call(server, "POST", "/nope", b"{}")[0] == 404


def test_requests_for_another_host_name_are_refused(server):
    status, _, body = call(server, "GET", "/api/models", headers={"Host": "attacker.example:8000"})
    assert status == 403 and "only requests to 127.0.0.1 or localhost" in body["error"]
    assert call(server, "GET", "/api/models", headers={"Host": "localhost"})[0] == 200
    for host in ("localhost:1@evil.example", "127.0.0.1:80/x", "localhost:8000:1", "[::1", "local host", ""):
        status, _, body = call(server, "GET", "/api/models", headers={"Host": host})   # parsed exactly, or refused
        assert status == 403 and "only requests to" in body["error"], host
    assert call(server, "GET", "/api/models", headers={"Host": "[::1]:8000"})[0] == 200


def raw(srv, request: bytes) -> str:
    """The whole answer to REQUEST sent as bytes (headers a client library would not send twice)."""
    with socket.create_connection(srv.server_address[:2], timeout=PATIENCE) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):                 # to the end: these answers close the connection
            answer += chunk
    return answer.decode()


def test_two_host_headers_are_a_bad_request(server):
    """Issue 42: a request naming two hosts was answered (the checks read the first); HTTP/1.1 says 400."""
    for hosts in ([b"127.0.0.1", b"attacker.example"], [b"localhost", b"localhost"], [b"a.example", b"127.0.0.1"]):
        head = b"".join(b"Host: %s\r\n" % h for h in hosts)
        answer = raw(server, b"GET /api/models HTTP/1.1\r\n" + head + b"Connection: close\r\n\r\n")
        assert answer.startswith("HTTP/1.0 400") and "2 Host headers; send one" in answer, answer
        assert "X-Content-Type-Options: nosniff" in answer
    answer = raw(server, b"GET /api/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert answer.startswith("HTTP/1.0 200")


def test_a_bug_answers_500_and_the_server_keeps_serving(server, monkeypatch, capsys):
    def broken(text, source=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(server.app, "attention", broken)
    status, body = post(server, {"text": "hi"})
    assert status == 500 and body == {"error": "internal error (RuntimeError); see the server's log"}
    monkeypatch.undo()
    assert post(server, {"text": "hi"})[0] == 200
    assert "RuntimeError: boom" in capsys.readouterr().err


def test_concurrent_requests_all_answer(server):
    results = []
    threads = [threading.Thread(target=lambda k=k: results.append(post(server, {"text": f"cat {k}"})[0]))
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [200] * 4


# the command ------------------------------------------------------------------

def qkv_cmd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qkv", *args], capture_output=True, text=True, timeout=PATIENCE)


def test_serve_prints_its_url_and_answers():
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "serve", "--model", BERT, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"qkv: serving {BERT} at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "api/models", timeout=PATIENCE) as r:
            assert json.load(r)["default"] == BERT
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()


def test_serve_mistakes_give_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, message in [(["--model", "no-such-model"], "no model 'no-such-model'"),
                              (["--model", BERT, "--port", str(port)], f"cannot listen on 127.0.0.1:{port}")]:
            r = qkv_cmd("serve", *args)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr


# chat ---------------------------------------------------------------------------

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm_server():
    with running_server("smollm2") as srv:
        yield srv


def chat_events(srv, obj) -> tuple[int, str, list[dict]]:
    """(status, content type, the JSON lines of the answer) of one POST /api/chat."""
    status, r, body = call(srv, "POST", "/api/chat", json.dumps(obj).encode(), {"Content-Type": "application/json"})
    kind = r.getheader("Content-Type")
    if kind == "application/json":
        return status, kind, [body]
    return status, kind, [json.loads(line) for line in body.splitlines() if line.strip()]


def done_of(events: list[dict]) -> dict:
    """The "done" event of a chat answer (the logit lens may follow it)."""
    return next(e for e in events if e.get("done"))


class Chat:
    """One POST /api/chat read line by line as the server writes it (the test decides when to read on)."""

    def __init__(self, srv, obj):
        self.conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=PATIENCE)
        self.conn.request("POST", "/api/chat", json.dumps(obj).encode(), {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        self.events: list[dict] = []

    def until(self, key: str) -> dict:
        """Read events up to the first holding KEY (an exception if the answer ends before)."""
        while True:
            line = self.response.readline()
            if not line:
                raise AssertionError(f"the answer ended without {key!r}: {self.events}")
            self.events.append(json.loads(line))
            if key in self.events[-1]:
                return self.events[-1]

    def close(self) -> None:
        self.conn.close()


def test_chat_streams_the_reply_then_the_attention_of_every_token(llm_server):
    status, kind, events = chat_events(llm_server, {"messages": QUESTION, "max_new_tokens": 24})
    assert status == 200 and kind == "application/x-ndjson", events
    model = llm_server.app.model("smollm2")
    prompt = model.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    assert events[0] == {"prompt": len(prompt), "dropped": 0}
    pieces = [e["piece"] for e in events[1:-2]]
    done, lens_event = events[-2:]                                       # the reply's views, then its lens
    assert len(pieces) > 3 and all(set(e) == {"piece"} for e in events[1:-2])     # streamed, piece by piece
    assert "".join(pieces) == done["reply"] == model.chat(QUESTION, max_new_tokens=24)   # greedy, as Model.chat
    assert "Paris" in done["reply"] and done["stopped"] == "end of turn"
    p = done["payload"]
    new = len(p["tokens"]) - len(prompt)
    assert p["prompt_length"] == len(prompt) and 3 < new < 24 and p["model"] == "SmolLM2-135M-Instruct"
    ids = np.concatenate([prompt, model.tokenizer.encode(done["reply"], add_special_tokens=False)[0]])
    want = model.run(ids, keep=("attentions",))
    assert p["tokens"] == want.tokens
    got = wire.decode(p["attention"])                                   # (30, 9, n, n)
    assert got.shape == want.attentions.shape == (30, 9, len(ids), len(ids))
    assert np.abs(got - want.attentions).max() <= PRECISION + 1e-6
    assert len(p["next"]["steps"]) == new                                     # each reply token's candidates
    assert p["lens"] is None and set(lens_event) == {"lens"}                  # the lens comes after the reply
    lens = logit_lens(model, ids)                                            # (L + 1, n, V): the lens tab's source
    final = lens[-1].argmax(-1)                                              # the model's own predictions
    probs = np.exp(lens - lens.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want_p = np.take_along_axis(probs, np.broadcast_to(final[None, :, None], probs.shape[:2] + (1,)), -1)[..., 0]
    got = lens_event["lens"]
    assert np.abs(wire.decode(got["prob"]) - want_p).max() <= 1e-5 and got["predicted"] == final.tolist()
    assert got["positions"] == len(ids) and p["rollout"] is not None


def test_chat_stops_at_max_new_tokens_and_carries_the_conversation(llm_server):
    turns = QUESTION + [{"role": "assistant", "content": "The capital of France is Paris."},
                        {"role": "user", "content": "And of Italy?"}]
    status, _, events = chat_events(llm_server, {"messages": turns, "max_new_tokens": 3, "model": "smollm2"})
    assert status == 200 and done_of(events)["stopped"] == "length"
    model = llm_server.app.model("smollm2")
    assert done_of(events)["reply"] == model.chat(turns, max_new_tokens=3)
    assert events[0]["prompt"] == len(model.tokenizer.apply_chat_template(turns, add_generation_prompt=True))


def test_chat_leaves_out_the_oldest_turns_when_the_conversation_is_too_long(llm_server):
    old = [{"role": r, "content": "word " * 300} for r in ("user", "assistant")]
    status, _, events = chat_events(llm_server, {"messages": old + QUESTION, "max_new_tokens": 2})
    assert status == 200 and events[0]["dropped"] == 1
    model = llm_server.app.model("smollm2")
    assert events[0]["prompt"] == len(model.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))


@pytest.mark.parametrize("request_body, status, message", [
    ({}, 400, "missing field 'messages'"),
    ({"messages": []}, 400, "missing field 'messages'"),
    ({"messages": [{"role": "user"}]}, 400, "message 0 must be"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "message 0 must be"),
    ({"messages": [{"role": "user", "content": "  "}]}, 400, "the last message must be the user's, and not empty"),
    ({"messages": QUESTION + [{"role": "assistant", "content": "Paris."}]}, 400, "the last message must be"),
    ({"messages": [{"role": "user", "content": "a" * 2001}]}, 413, "2,001 characters; the limit is 2,000"),
    ({"messages": QUESTION * 65}, 413, "65 messages; the limit is 64"),
    ({"messages": [{"role": "user", "content": "word " * 399}]}, 413, "shorten the message"),
    ({"messages": QUESTION, "max_new_tokens": 257}, 400, "max_new_tokens must be a whole number from 1 to 256"),
    ({"messages": QUESTION, "max_new_tokens": "9"}, 400, "max_new_tokens must be"),
    ({"messages": QUESTION, "model": "minilm"}, 400, "all-MiniLM-L6-v2 is an encoder"),
    ({"messages": QUESTION, "model": "/etc"}, 400, "unknown model '/etc'"),
])
def test_chat_refusals_are_one_clear_json_error(llm_server, request_body, status, message):
    got, kind, events = chat_events(llm_server, request_body)
    assert (got, kind) == (status, "application/json") and message in events[0]["error"], events


def test_one_reply_at_a_time(llm_server):
    app = llm_server.app
    app.writer.enter()                                       # as if another reply were being written
    try:
        status, _, events = chat_events(llm_server, {"messages": QUESTION, "max_new_tokens": 2})
        assert status == 503 and "busy writing another reply" in events[0]["error"]
    finally:
        app.writer.leave()
    assert chat_events(llm_server, {"messages": QUESTION, "max_new_tokens": 2})[0] == 200


def test_the_writer_is_free_as_the_reply_ends_and_the_lens_follows(llm_server, monkeypatch):
    """Issue 43: the chat held the writer (Send disabled, other tabs 503) while it computed the logit lens,
    seconds to minutes after the reply. Now "done" comes as the reply ends, the writer free, and the lens
    after it. The lens is held (a hook) until a second reply has been written and shown in full."""
    import qkv.analysis.sections as sections

    lens_top, started, release = sections.lens_top, threading.Event(), threading.Event()

    def held(*args, **kwargs):                       # the first lens waits for the test; the next ones do not
        started.set()
        release.wait(PATIENCE)
        return lens_top(*args, **kwargs)

    monkeypatch.setattr(sections, "lens_top", held)
    first = Chat(llm_server, {"messages": QUESTION, "max_new_tokens": 8})
    second = None
    try:
        assert first.response.status == 200
        assert started.wait(PATIENCE)                # the first reply's lens is being computed, and held
        second = Chat(llm_server, {"messages": QUESTION, "max_new_tokens": 2})
        assert second.response.status == 200, second.response.read()           # the writer is free: not 503
        done = second.until("done")                  # a whole reply, its views, while the first lens is held
        assert not release.is_set() and done["payload"]["lens"] is None and done["stopped"] == "length"
        assert first.until("done")["payload"]["lens"] is None                   # sent before its lens began
        release.set()
        assert first.until("lens")["lens"]["positions"] == len(first.events[-2]["payload"]["tokens"])
        assert second.until("lens")["lens"]["positions"] == len(done["payload"]["tokens"])
    finally:
        release.set()
        first.close()
        if second is not None:
            second.close()


def test_a_client_that_leaves_frees_the_writer(llm_server, monkeypatch):
    import qkv.web.app as server
    import qkv.writing.chat as chat

    freed, close = threading.Event(), server.ChatReply.close
    streams, chat_stream = [], chat.chat_stream

    def closing(reply):
        close(reply)
        if reply.messages == count:                      # this test's reply (an earlier one may close late)
            freed.set()

    def recorded(*args, **kwargs):
        streams.append(chat_stream(*args, **kwargs))
        return streams[-1]

    monkeypatch.setattr(server.ChatReply, "close", closing)
    monkeypatch.setattr(chat, "chat_stream", recorded)
    count = [{"role": "user", "content": "Count from 1 to 500, separated by commas."}]
    body = json.dumps({"messages": count, "max_new_tokens": 200}).encode()
    with socket.create_connection(llm_server.server_address[:2], timeout=PATIENCE) as sock:
        sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        answer = sock.makefile("rb")
        while answer.readline().strip():                     # the status line and headers
            pass
        assert json.loads(answer.readline())["prompt"] > 0
        assert "piece" in json.loads(answer.readline())      # the writing has begun
        answer.close()
        sock.shutdown(socket.SHUT_RDWR)                      # leave in the middle of the reply
    assert freed.wait(PATIENCE)                              # the writer notices, stops, and lets go
    assert len(streams[0].new_ids) < 200                     # stopped early: it did not write on to the end
    llm_server.app.writer.enter(wait=False)                  # free: no Busy
    llm_server.app.writer.leave()
    assert chat_events(llm_server, {"messages": QUESTION, "max_new_tokens": 2})[0] == 200


def test_the_page_starts_in_chat_mode_for_a_chat_model(llm_server, server):
    page = call(llm_server, "GET", "/")[2]
    config = json.loads(page.split('class="qkv-app-config">')[1].split("</script>")[0])
    assert config["chat_ready"] is True and config["chat_model"] == "smollm2" and "smollm2" in config["models"]
    config = json.loads(call(server, "GET", "/")[2].split('class="qkv-app-config">')[1].split("</script>")[0])
    assert config["chat_ready"] is False and config["chat_model"] == "smollm2"


# ── hostile requests (issue 11): other sites, odd JSON, a full server ───────────────────────────

SECURITY = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def has_security_headers(r) -> bool:
    return all(r.getheader(k) == v for k, v in SECURITY.items())


def test_the_api_refuses_other_sites_and_origins(server):
    host, port = server.server_address[:2]
    body, json_kind = json.dumps({"text": "hi"}).encode(), {"Content-Type": "application/json"}
    for headers in ({"Origin": "https://attacker.example"}, {"Origin": "null"},
                    {"Origin": f"http://{host}:{port + 1}"},                    # another port: another origin
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
        status, r, answer = call(server, "POST", "/api/attention", body, {**json_kind, **headers})
        assert status == 403 and "another" in answer["error"] and has_security_headers(r), (headers, answer)
    status, _, answer = call(server, "GET", "/api/attention?text=hi", headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "another site" in answer["error"]
    # the page's own requests, and the page opened from a link on another site, are answered
    own = {"Origin": f"http://{host}:{port}", "Sec-Fetch-Site": "same-origin"}
    assert call(server, "POST", "/api/attention", body, {**json_kind, **own})[0] == 200
    assert call(server, "GET", "/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"})[0] == 200


@pytest.mark.parametrize("body, message", [
    (b'{"text": "a \\ud800 b"}', "not valid JSON in UTF-8"),                # a lone surrogate
    (b'{"text": "hi", "x": ["\\udfff"]}', "not valid JSON in UTF-8"),
    (b"[" * 30_000 + b"]" * 30_000, "nests too deeply"),
    (b'{"text": ' + b"[" * 2_000 + b"]" * 2_000 + b"}", "nests too deeply"),
])
def test_odd_json_is_a_400_not_a_500(server, body, message):
    got, r, answer = call(server, "POST", "/api/attention", body, {"Content-Type": "application/json"})
    assert got == 400 and message in answer["error"] and has_security_headers(r), answer


def test_every_error_page_carries_the_security_headers(server):
    status, r, answer = call(server, "PUT", "/api/attention", b"{}")
    assert status == 501 and r.getheader("Content-Type") == "application/json" and has_security_headers(r)
    assert "GET and POST" in answer["error"]
    status, r, _ = call(server, "GET", "/nope")
    assert status == 404 and has_security_headers(r)


def test_any_loopback_address_keeps_the_host_check():
    from qkv.web.server import exposure_warning

    with running_server(BERT, host="127.0.0.2") as srv:
        port = srv.server_address[1]
        status, _, body = call(srv, "GET", "/api/models", headers={"Host": f"attacker.example:{port}"})
        assert status == 403 and "only requests to 127.0.0.2 or localhost" in body["error"]
        assert call(srv, "GET", "/api/models", headers={"Host": f"127.0.0.2:{port}"})[0] == 200
        assert call(srv, "GET", "/api/models", headers={"Host": f"localhost:{port}"})[0] == 200
    assert exposure_warning("127.0.0.2") is None and exposure_warning("::1") is None
    assert exposure_warning("localhost") is None
    assert "other machines can reach" in exposure_warning("0.0.0.0") and exposure_warning("192.168.1.5")


def test_a_short_text_does_not_wait_behind_a_long_one(server, monkeypatch):
    import qkv.web.app

    app = server.app
    monkeypatch.setattr(qkv.web.app, "SMALL_WORK", qkv.web.app.work(app.model(BERT), 6))   # 6 tokens
    app.long.enter()                                     # as if a long text were being computed
    try:
        status, body = post(server, {"text": "the cat"})                       # short: its own lane
        assert status == 200 and body["tokens"]
        monkeypatch.setattr(app.long, "waiting", 0)
        status, r, answer = call(server, "POST", "/api/attention",
                                 json.dumps({"text": "the cat sat on the mat and then on the dog"}).encode())
        assert status == 503 and r.getheader("Retry-After") and "send again" in answer["error"]
        assert has_security_headers(r)
    finally:
        app.long.leave()
    assert post(server, {"text": "the cat sat on the mat and then on the dog"})[0] == 200


def test_lanes_go_by_the_cost_of_the_work_not_its_tokens(llm_server):
    """Issue 42: a pipeline page of 6 SmolLM2 tokens shared the short lane with one-line attention requests
    (tokens ≤ 64), which then waited behind it. A lane is chosen by work(): tokens × the model's size, and
    what the request computes (a pipeline page, a logit lens)."""
    from qkv.web.app import SMALL_WORK, work

    app = llm_server.app
    minilm, smollm2, gpt2 = app.model("minilm"), app.model("smollm2"), qkv.load(str(MODELS / "gpt2"))
    assert work(minilm, 64) <= SMALL_WORK < work(minilm, 128)              # MiniLM's attention: as before
    assert work(smollm2, 6, "pipeline") > SMALL_WORK and work(smollm2, 6) > SMALL_WORK     # heavy though short
    assert work(gpt2, 64, "pipeline") <= SMALL_WORK                          # a tiny model's page is light
    assert work(smollm2, 6, "pipeline") > 4 * work(minilm, 6, "pipeline")    # per token, the bigger model costs more
    assert work(minilm, 30, "next") > work(minilm, 30, "pipeline") > work(minilm, 30)
    assert app._lane(smollm2, 6, "pipeline") is app.long and app._lane(minilm, 6, "attention") is app.short


def test_a_short_request_is_served_while_heavy_short_pages_run(llm_server, monkeypatch):
    """Heavy pages short in tokens (SmolLM2's pipeline of 6 tokens) fill their lane, the first held in a hook
    until the test lets it go: a one-line attention request is answered meanwhile."""
    import qkv.web.app as server

    page, started, release = server.pipeline_payload, threading.Event(), threading.Event()

    def held(*args, **kwargs):                           # a heavy page in progress, its lane held
        started.set()
        release.wait(PATIENCE)
        return page(*args, **kwargs)

    monkeypatch.setattr(server, "pipeline_payload", held)
    app, answers = llm_server.app, []
    request = json.dumps({"text": SENTENCE, "model": "smollm2"}).encode()
    heavy = [threading.Thread(target=lambda: answers.append(call(llm_server, "POST", "/api/pipeline", request)[0]))
             for _ in range(3)]
    try:
        for t in heavy:
            t.start()
        assert started.wait(PATIENCE)                    # a heavy page is being computed, and held
        app.short.enter(wait=False)                      # the short lane is free (Busy if the page held it)
        app.short.leave()
        status, body = post(llm_server, {"text": SENTENCE, "model": "minilm"})
        assert status == 200 and body["tokens"][:3] == ["[CLS]", "the", "cat"] and not release.is_set()
    finally:
        release.set()
        for t in heavy:
            t.join(PATIENCE)
    assert answers == [200] * 3


def test_lanes_serve_in_order_and_bound_their_queue():
    from qkv.web.server import Lane

    lane, order = Lane("tests", waiting=2), []
    lane.enter()

    def wait_in_line(i):
        lane.enter()
        order.append(i)
        lane.leave()

    threads = []
    for i in range(2):
        threads.append(threading.Thread(target=wait_in_line, args=(i,)))
        threads[-1].start()
        while lane._next < i + 2:                          # the thread holds its ticket
            time.sleep(0.01)
    with pytest.raises(Busy, match="busy with 3 tests"):
        lane.enter()                                       # 1 running + 2 waiting: full
    taken = Lane("replies")
    taken.enter()
    with pytest.raises(Busy, match="busy with 1 replies"):
        taken.enter(wait=False)                            # a chat reply does not queue: 503 at once
    lane.leave()
    for t in threads:
        t.join(timeout=30)
    assert order == [0, 1]


def test_connections_beyond_the_thread_cap_get_503_at_once(monkeypatch):
    """Threads held by requests under way: one connection more gets 503 at once. Threads held by connections
    that have not sent their request (idle, or trickling it): the longest-waiting is closed instead."""
    import qkv.web.server

    monkeypatch.setattr(qkv.web.server, "MAX_THREADS", 3)
    with running_server(BERT) as srv:
        idle = [socket.create_connection(srv.server_address[:2], timeout=30) for _ in range(3)]   # say nothing
        time.sleep(0.2)
        assert call(srv, "GET", "/api/models")[0] == 200
        assert idle[0].recv(10) == b""                    # the one that waited longest was closed for it
        for s in idle:
            s.close()
        time.sleep(0.3)                                   # their threads end
        busy = []
        for _ in range(3):                                # heads sent, bodies still to come: requests under way
            s = socket.create_connection(srv.server_address[:2], timeout=30)
            s.sendall(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
            busy.append(s)
            time.sleep(0.2)                               # its head is read before the next one comes
        try:
            status, r, answer = call(srv, "GET", "/api/models")
            assert status == 503 and r.getheader("Retry-After") and has_security_headers(r)
            assert "busy with 3 connections" in answer["error"]
        finally:
            for s in busy:
                s.close()
        for _ in range(100):                               # their threads end: the server answers again
            if call(srv, "GET", "/api/models")[0] == 200:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server did not recover after the idle connections closed")
    assert srv.request_queue_size >= 128


def test_a_broken_hugging_face_cache_entry_breaks_neither_models_nor_serve(tmp_path, monkeypatch, capsys):
    import shutil

    from conftest import run_main

    hub = tmp_path / "hub"

    def cached(name: str, ref: str | None = "abc123") -> object:
        snap = hub / f"models--someone--{name}" / "snapshots" / "abc123"
        shutil.copytree(MODELS / "gpt2", snap)
        if ref is not None:
            (snap.parents[1] / "refs").mkdir()
            (snap.parents[1] / "refs" / "main").write_text(ref)
        return snap

    cached("good")
    cached("list-config").joinpath("config.json").write_text("[1]")
    cached("odd-type").joinpath("config.json").write_text('{"model_type": ["gpt2"]}')
    cached("not-json").joinpath("config.json").write_text("{")
    cached("escape", ref="../..")                               # refs/main leads out of the snapshots
    cached("no-ref", ref=None)
    (hub / "models--someone--empty").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))

    listed = dict(qkv.available())
    assert listed["someone/good"] == "gpt2 (supported) in the Hugging Face cache" and "someone/no-ref" in listed
    assert not {"someone/list-config", "someone/odd-type", "someone/not-json", "someone/escape",
                "someone/empty"} & set(listed)
    code, out, err = run_main(monkeypatch, capsys, "models")
    assert code == 0 and "someone/good" in out and not err
    with pytest.raises(qkv.QkvError, match="refs/main leads outside its snapshots; delete"):
        qkv.load("someone/escape")
    with pytest.raises(qkv.QkvError, match="not a JSON object"):
        qkv.load("someone/list-config")
    assert qkv.load("someone/no-ref").config.family == "gpt2"
    srv = make_server(BERT, port=0)                             # the model list skips the broken ones
    try:
        assert "someone/good" in srv.app.sources and "someone/escape" not in srv.app.sources
    finally:
        srv.server_close()


def test_image_and_sound_models_are_not_served():
    """Their input is a file: a page must never make the server read one it names. The web app shows text models:
    digits-vit is not on its list, and serving an image or a Whisper model is one line at startup."""
    from qkv.web.app import App

    assert "digits-vit" not in App("minilm").sources
    for source, kind in (("digits-vit", "images"), (str(MODELS / "whisper"), "sound")):
        with pytest.raises(qkv.QkvError, match=f"reads {kind}, and qkv serve shows text models"):
            make_server(source, port=0)


# ── the hardened server apart from the app (issue 44) ───────────────────────────────────────────

def test_the_server_knows_no_app():
    """web/server.py is the hardened HTTP server alone: it imports the standard library and qkv.runtime, never
    the app (web/app.py) nor what the app shows (models, views, analyses)."""
    import ast

    import qkv.web.server

    tree = ast.parse(open(qkv.web.server.__file__, encoding="utf-8").read())
    relative = {("." * node.level) + (node.module or "") for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level}
    assert relative == {"..runtime.errors"}, relative
    absolute = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in absolute if name.split(".")[0] in ("qkv", "numpy")}, absolute


def test_the_server_serves_any_routes_with_its_checks():
    """Routes of another app: the server answers them with its own checks (Host, other sites, JSON bodies, the
    security headers, the pages' CSP with framing forbidden, a stream as NDJSON)."""
    import threading

    from qkv.web.server import Asset, HttpError, Server, Stream

    class Events(Stream):
        closed = False

        def events(self):
            yield {"n": 1}
            yield {"n": 2}

        def close(self):
            Events.closed = True

    class Echo:
        csp = "default-src 'none'"

        def get(self, path, query):
            if path == "/":
                return 200, "<p>hi</p>"
            if path == "/font":
                return 200, Asset(b"\0font", "font/woff")
            raise HttpError(404, f"no page {path}")

        def post(self, path, body):
            if path == "/api/stream":
                return 200, Events()
            return 200, {"echo": body(), "path": path}

    srv = Server(("127.0.0.1", 0), Echo())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        status, r, page = call(srv, "GET", "/")
        assert status == 200 and page == "<p>hi</p>" and has_security_headers(r)
        assert r.getheader("Content-Security-Policy") == "default-src 'none'; frame-ancestors 'none'"
        status, r, font = call(srv, "GET", "/font")
        assert status == 200 and r.getheader("Content-Type") == "font/woff" and "max-age=86400" in r.msg.get_all("Cache-Control")
        assert call(srv, "GET", "/nope")[0] == 404
        status, _, answer = call(srv, "POST", "/api/x", b'{"a": 1}', {"Content-Type": "application/json"})
        assert status == 200 and answer == {"echo": {"a": 1}, "path": "/api/x"}
        assert call(srv, "POST", "/api/x", b"[1]")[0] == 400
        assert call(srv, "POST", "/api/x", b"{}", {"Sec-Fetch-Site": "cross-site"})[0] == 403
        assert call(srv, "GET", "/", headers={"Host": "attacker.example"})[0] == 403
        status, r, lines = call(srv, "POST", "/api/stream", b"{}")
        assert status == 200 and r.getheader("Content-Type") == "application/x-ndjson"
        assert [json.loads(line) for line in lines.splitlines()] == [{"n": 1}, {"n": 2}] and Events.closed
    finally:
        srv.shutdown()
        srv.server_close()
