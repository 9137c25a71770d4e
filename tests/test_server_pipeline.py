"""`qkv serve`'s pipeline endpoints without a browser: the payload is the engine's, "next token" draws
what qkv.writing.sampling draws, and every refusal is one clear JSON error (tests/test_server.py: the rest)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from qkv.writing.sampling import Sampling
from qkv.web.app import MAX_PIPELINE_TOKENS
from qkv.viz import wire
from conftest import MODELS, running_server
from test_server import call

GPT2, BERT = str(MODELS / "gpt2"), str(MODELS / "bert")
SENTENCE = "The cat sat on the mat"


@pytest.fixture(scope="module")
def server():
    with running_server(GPT2) as srv:
        yield srv


def post(srv, path: str, obj) -> tuple[int, dict]:
    status, _, body = call(srv, "POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json"})
    return status, body


def test_the_pipeline_payload_is_the_engines(server):
    model = qkv.load(GPT2)
    trace = model.run(SENTENCE)
    status, p = post(server, "/api/pipeline", {"text": SENTENCE, "lang": "ko"})
    assert status == 200 and p["kind"] == "pipeline" and p["lang"] == "ko" and p["tokens"] == trace.tokens
    assert np.array_equal(wire.decode(p["output"]["logits"]), trace.logits[-1])
    np.testing.assert_allclose(wire.decode(p["stream"]["norm"])[0],
                               np.linalg.norm(trace.layers[0].residual.astype(np.float64), axis=-1), rtol=1e-5)
    assert p["arithmetic"]["layers"] == [0, 1]
    status, p = post(server, "/api/pipeline", {"text": SENTENCE, "layer": 1})
    assert status == 200 and p["start"]["layer"] == 1 and 1 in p["arithmetic"]["layers"]


def test_an_encoder_gets_its_pipeline_but_no_next_token():
    with running_server(BERT) as srv:
        status, p = post(srv, "/api/pipeline", {"text": SENTENCE})
        assert status == 200 and p["output"] is None and p["pooled"]["norm"] > 0
        status, body = post(srv, "/api/pipeline/next", {"text": SENTENCE})
        assert status == 400 and "is an encoder: it writes no next token" in body["error"]


def test_next_token_draws_what_qkv_sampling_draws(server):
    model = qkv.load(GPT2)
    logits = model.run(SENTENCE).logits[-1:]
    status, body = post(server, "/api/pipeline/next", {"text": SENTENCE, "temperature": 0})
    greedy = int(np.argmax(logits[0]))
    assert status == 200 and body["id"] == greedy and body["token"] == model.tokenizer.label(greedy)
    assert body["text"] == SENTENCE + model.tokenizer.decode([greedy])
    p = body["payload"]
    assert p["ids"] == model.run(SENTENCE).ids.tolist() + [greedy] and p["text"] == body["text"]
    settings = {"temperature": 1.3, "top_k": 40, "top_p": 0.9, "seed": 7}
    want = int(Sampling(**settings).pick(logits.astype(np.float64), Sampling(**settings).rng())[0])
    status, body = post(server, "/api/pipeline/next", {"text": SENTENCE, **settings})
    assert status == 200 and body["id"] == want


@pytest.mark.parametrize("path, request_body, status, message", [
    ("/api/pipeline", {}, 400, "missing field 'text'"),
    ("/api/pipeline", {"text": "  "}, 400, "the text is empty"),
    ("/api/pipeline", {"text": "hi", "lang": "fr"}, 400, "field 'lang' must be one of 'en', 'ko'"),
    ("/api/pipeline", {"text": "hi", "model": "nope"}, 400, "unknown model 'nope'"),
    ("/api/pipeline", {"text": "cat " * (MAX_PIPELINE_TOKENS + 1)}, 413, "on this page; shorten it"),
    ("/api/pipeline/next", {"text": "hi", "temperature": "hot"}, 400, "field 'temperature' must be a number"),
    ("/api/pipeline/next", {"text": "hi", "temperature": -1}, 400, "temperature must be ≥ 0"),
    ("/api/pipeline/next", {"text": "hi", "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ("/api/pipeline/next", {"text": "hi", "top_k": True}, 400, "field 'top_k' must be a number"),
    ("/api/pipeline", {"text": "hi", "layer": 2}, 400, "field 'layer' must be a whole number from 0 to 1, got 2"),
    ("/api/pipeline", {"text": "hi", "layer": "1"}, 400, "field 'layer' must be a whole number"),
    ("/api/pipeline/next", {"text": "hi", "layer": -1}, 400, "field 'layer' must be a whole number"),
    ("/api/pipeline/next", {"text": "hi", "layer": True}, 400, "field 'layer' must be a whole number"),
])
def test_refusals_are_one_clear_json_error(server, path, request_body, status, message):
    got, body = post(server, path, request_body)
    assert got == status and message in body["error"] and "\n" not in body["error"]


def test_the_app_page_carries_the_pipeline_but_not_its_data(server):
    status, r, page = call(server, "GET", "/")
    assert status == 200 and "QKV_PIPELINE" in page and ".qkv-pipeline" in page
    assert "qkv-pipeline-data" not in page                       # the payload comes only when asked for


def test_an_encoder_decoder_shows_its_translation_but_writes_no_next_token():
    with running_server("ko-en-tiny") as srv:
        status, p = post(srv, "/api/pipeline", {"text": "나는 학교에 간다"})
        assert status == 200 and p["seq2seq"] and p["target"] == "I go to school"
        status, body = post(srv, "/api/pipeline/next", {"text": "나는 학교에 간다"})
        assert status == 400 and "is an encoder–decoder" in body["error"]


def test_serve_on_the_translator_shows_its_page_its_translation_and_refuses_chat_in_one_line():
    """`qkv serve --model ko-en-tiny`: GET / is the page (not a 500) before and after the model is loaded,
    Show attention answers the translation's three kinds of attention, chat is one clear refusal."""
    with running_server("ko-en-tiny") as srv:
        for _ in range(2):                                       # the second time, the model is loaded
            status, _, page = call(srv, "GET", "/")
            assert status == 200 and "QKV_PIPELINE" in page
            status, p = post(srv, "/api/attention", {"text": "나는 학교에 간다"})
            assert status == 200 and p["kind"] == "cross" and p["title"].endswith("→ I go to school")
        status, body = post(srv, "/api/chat", {"messages": [{"role": "user", "content": "안녕"}],
                                               "model": "ko-en-tiny"})
        assert status == 400 and "is an encoder–decoder (a translator)" in body["error"]
        assert "qkv translate" in body["error"] and "\n" not in body["error"]
