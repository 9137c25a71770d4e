"""tuning: measured choices round-trip through the cache, hostile caches are refused, QKV_THREADS pins,
and the choices are what generation and tiled attention actually run with (threadpoolctl's view)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import qkv
from qkv import QkvError
from qkv.core import kernels
from qkv.runtime import threads, tuning
from qkv.runtime.tuning import Choices

from conftest import MODELS


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.fixture(scope="module")
def tiny_decoder():
    return qkv.load(str(MODELS / "gpt2"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private qkv cache, no pins, nothing held in memory; measuring is counted and fast (a fake)."""
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    monkeypatch.delenv(tuning.ENV, raising=False)
    monkeypatch.delenv(threads.DECODE_THREADS_VAR, raising=False)
    calls = []

    def fake_measure():
        calls.append(1)
        return Choices(decode=2, prefill=2, attention=2, q_block=64, k_block=256, source="measured"), {}
    monkeypatch.setattr(tuning, "measure", fake_measure)
    tuning.forget()
    yield tmp_path, calls
    tuning.forget()


def test_the_cache_round_trips(cache_dir):
    tmp, calls = cache_dir
    first = tuning.choices()
    assert calls == [1] and first.source == "measured"
    stored = json.loads((tmp / tuning.FILE).read_text())
    assert stored["machine"] == tuning.machine_key() and stored["choices"] == first.numbers()
    tuning.forget()
    again = tuning.choices()
    assert calls == [1]                                       # read from the file, not measured again
    assert again.numbers() == first.numbers() and again.source == "cache"


@pytest.mark.parametrize("content", [
    b"\x00\xff not json",
    b"[1, 2, 3]",
    json.dumps({"machine": "MACHINE", "choices": {"decode": "rm -rf /", "prefill": 1, "attention": 1,
                                                  "q_block": 64, "k_block": 64}}).encode(),
    json.dumps({"machine": "MACHINE", "choices": {"decode": 10 ** 9, "prefill": 1, "attention": 1,
                                                  "q_block": 64, "k_block": 64}}).encode(),
    json.dumps({"machine": "MACHINE", "choices": {"decode": 0, "prefill": 1, "attention": 1,
                                                  "q_block": 64, "k_block": 64}}).encode(),
    json.dumps({"machine": "MACHINE", "choices": {"decode": 1.5, "prefill": 1, "attention": 1,
                                                  "q_block": 64, "k_block": 64}}).encode(),
    json.dumps({"machine": "MACHINE", "choices": {"decode": 1}}).encode(),
    b" " * 70000 + b"{}",
    b'{"machine": ' + b"[" * 10000 + b"]" * 10000 + b"}",              # nested too deep for Python's parser
])
def test_a_damaged_or_hostile_cache_is_ignored_with_one_line_and_measured_again(cache_dir, content):
    tmp, calls = cache_dir
    content = content.replace(b'"MACHINE"', json.dumps(tuning.machine_key()).encode())
    (tmp / tuning.FILE).write_bytes(content)
    with pytest.warns(UserWarning) as caught:
        got = tuning.choices()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "\n" not in messages[0] and "tuning cache" in messages[0]
    assert calls == [1] and got.source == "measured"
    fixed = json.loads((tmp / tuning.FILE).read_text())       # rewritten with what was measured
    assert fixed["choices"] == got.numbers()


def test_a_symlinked_cache_is_not_followed(cache_dir, tmp_path_factory):
    tmp, calls = cache_dir
    target = tmp_path_factory.mktemp("elsewhere") / "real.json"
    tuning.write_cache(target, Choices(decode=7, prefill=7, attention=7, q_block=7, k_block=7))
    (tmp / tuning.FILE).symlink_to(target)
    with pytest.warns(UserWarning, match="symbolic link"):
        got = tuning.choices()
    assert calls == [1] and got.decode == 2
    assert json.loads(target.read_text())["choices"]["decode"] == 7      # the link's target untouched


def test_another_machine_s_cache_is_measured_again_quietly(cache_dir):
    tmp, calls = cache_dir
    other = dict(tuning.machine_key(), cpu="some other CPU")
    (tmp / tuning.FILE).write_text(json.dumps({"machine": other, "choices": Choices().numbers()}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = tuning.choices()
    assert calls == [1] and got.source == "measured"


def test_qkv_cache_off_keeps_the_choices_in_memory_only(cache_dir, monkeypatch):
    tmp, calls = cache_dir
    monkeypatch.setenv("QKV_CACHE", "off")
    assert tuning.cache_file() is None
    tuning.choices()
    tuning.choices()
    assert calls == [1] and not (tmp / tuning.FILE).exists()


def test_the_environment_variable_pins_choices(cache_dir, monkeypatch):
    _, calls = cache_dir
    monkeypatch.setenv(tuning.ENV, "decode:1, prefill:3,k_block:128")
    got = tuning.choices()
    assert (got.decode, got.prefill, got.k_block) == (1, 3, 128)
    assert (got.attention, got.q_block) == (2, 64)           # the others as measured
    assert got.source.endswith("pinned")
    for bad in ("decode", "decode:0", "decode:two", "threads:2", "decode:1;prefill:2"):
        monkeypatch.setenv(tuning.ENV, bad)
        with pytest.raises(QkvError, match=tuning.ENV) as e:
            tuning.choices()
        assert "\n" not in str(e.value)


def test_more_threads_must_be_measurably_faster():
    assert tuning._best({1: 1.0, 2: 1.5}) == 1               # 2 threads slower: 1
    assert tuning._best({1: 1.0, 2: 0.97}) == 1              # within the margin: the fewer
    assert tuning._best({1: 1.0, 2: 0.6}) == 2
    assert tuning._best({1: 1.0, 2: 0.6, 4: 0.58}) == 2


def test_a_real_measurement_gives_usable_choices(monkeypatch, tmp_path):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    before = blas_threads()
    got, seconds = tuning.measure(rounds=2)
    assert blas_threads() == before                          # thread limits restored
    assert 1 <= got.decode <= threads.cores() and 1 <= got.prefill <= threads.cores()
    assert 1 <= got.attention <= threads.cores()
    assert (got.q_block, got.k_block) in tuning.BLOCKS
    assert set(seconds["decode"]) == set(tuning._counts()) and all(s > 0 for s in seconds["decode"].values())
    # the fewest threads within the margin of the fastest, from the very seconds measured
    assert got.decode == tuning._best(seconds["decode"]) and got.prefill == tuning._best(seconds["prefill"])


def test_generation_runs_with_the_pinned_threads(cache_dir, monkeypatch, tiny_decoder):
    model = tiny_decoder
    seen = []
    real = type(model).last_logits

    def spy(self, ids, *args, **kwargs):
        seen.append((ids.shape[1], blas_threads()[0]))
        return real(self, ids, *args, **kwargs)
    monkeypatch.setattr(type(model), "last_logits", spy)
    monkeypatch.setenv(tuning.ENV, "decode:1,prefill:1")
    ids = np.arange(5)[None]
    model.generate(ids, 4, temperature=0, stop_at_eos=False)
    assert seen[0] == (5, 1)                                 # the prompt: prefill's count
    assert all(n == 1 for length, n in seen[1:]) and len(seen) == 4
    if threads.cores() > 1:
        seen.clear()
        monkeypatch.setenv(tuning.ENV, "decode:2,prefill:2")
        model.generate(ids, 3, temperature=0, stop_at_eos=False)
        assert [n for _, n in seen] == [2] * 3


def test_prefill_never_raises_the_caller_s_limit(cache_dir, monkeypatch, tiny_decoder):
    monkeypatch.setenv(tuning.ENV, "prefill:2")
    seen = []
    real = type(tiny_decoder).last_logits

    def spy(self, ids, *args, **kwargs):
        seen.append(blas_threads()[0])
        return real(self, ids, *args, **kwargs)
    monkeypatch.setattr(type(tiny_decoder), "last_logits", spy)
    with threads.blas_threads(1):                            # a worker process held to one thread
        tiny_decoder.generate(np.arange(5)[None], 1, temperature=0, stop_at_eos=False)
    assert seen == [1]


def test_tiled_attention_uses_the_tuned_blocks_and_workers(cache_dir, monkeypatch):
    seen = {}
    real = kernels.parallel_map

    def spy(fn, items, workers=None):
        items = list(items)
        seen["starts"], seen["workers"] = sorted(items), workers
        return real(fn, items, workers=workers)
    monkeypatch.setattr(kernels, "parallel_map", spy)
    monkeypatch.setenv(tuning.ENV, "attention:1,q_block:64,k_block:128")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 200, 8), dtype=np.float32) for _ in range(3))
    out = kernels.tiled_attention(q, k, v, causal=True)
    assert seen == {"starts": [0, 64, 128, 192], "workers": 1}
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(8)
    s = np.where(np.tril(np.ones((200, 200), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    ref = (a / a.sum(-1, keepdims=True)) @ v.astype(np.float64)
    assert np.abs(out - ref).max() < 1e-5


def test_parallel_map_with_fewer_workers_keeps_order():
    got = threads.parallel_map(lambda x: x * 3, range(11), workers=1)
    assert got == [3 * x for x in range(11)]
    if threads.cores() > 2:
        assert threads.parallel_map(lambda x: x * 3, range(11), workers=2) == got


def test_choices_measured_while_busy_are_measured_again_when_idle(cache_dir, monkeypatch):
    tmp, calls = cache_dir
    load = {"now": 2.0 * threads.cores()}
    monkeypatch.setattr(tuning.os, "getloadavg", lambda: (load["now"], 0.0, 0.0))
    tuning.choices()                                          # measured busy
    assert json.loads((tmp / tuning.FILE).read_text())["load"] == load["now"]
    tuning.forget()
    tuning.choices()
    assert calls == [1]                                       # still busy: the cache holds
    tuning.forget()
    load["now"] = 0.1
    tuning.choices()
    assert calls == [1, 1]                                    # idle now: measured again, quietly
    tuning.forget()
    load["now"] = 0.0
    tuning.choices()
    assert calls == [1, 1]                                    # measured idle: kept
