"""`qkv serve` without a browser: the API's answers and every refusal, through plain HTTP.

tests/test_browser.py drives the page itself in Chromium.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request

import numpy as np
import pytest

import qkv
from qkv.server import MAX_CHARS, make_server
from qkv.viz.payload import PRECISION, decode_attention
from conftest import MODELS

BERT = str(MODELS / "bert")                     # 2 layers × 4 heads, 64 positions: fast


@pytest.fixture(scope="module")
def server():
    srv = make_server(BERT, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def call(srv, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, decoded body) of one request; JSON bodies are parsed."""
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
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
    got = decode_attention(body["attention"])                                # (2, 4, n, n)
    assert got.shape == want.attentions.shape
    assert np.abs(got - want.attentions).max() <= PRECISION + 1e-7


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
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.putrequest("POST", "/api/attention")
    conn.putheader("Content-Length", str(10**9))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and "limit is 65,536" in json.loads(r.read())["error"]
    conn.close()


def test_missing_content_length_and_unknown_paths(server):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
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
    return subprocess.run([sys.executable, "-m", "qkv", *args], capture_output=True, text=True, timeout=120)


def test_serve_prints_its_url_and_answers():
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "serve", "--model", BERT, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"qkv: serving {BERT} at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "api/models", timeout=30) as r:
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
