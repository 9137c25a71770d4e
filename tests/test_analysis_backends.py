"""The backends agree bit for bit: this process, several local processes, and Ray.

Ray is an optional extra (`pip install 'qkv[ray]'`); `make test` installs it, and this
test fails — it is not skipped — when it is missing, so a passing run means Ray was tested.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qkv import QkvError
from qkv.analysis import analyse, open_corpus

TEXTS = [f"Sentence {i}: the cat sat on mat {i}, then ran after dog {i % 5}." for i in range(40)] + ["\x01"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return open_corpus(path)


@pytest.fixture(scope="module")
def here(corpus):
    return analyse("minilm", corpus).to_json()


def test_local_processes_give_the_same_bits_as_one_process(corpus, here):
    assert analyse("minilm", corpus, workers=2).to_json() == here
    assert here["texts"] == 40 and len(here["failed"]) == 1


def test_ray_gives_the_same_bits_as_one_process(corpus, here):
    try:
        import ray
    except ImportError:
        pytest.fail("ray is not installed: pip install 'qkv[ray]' (make test installs it)")
    try:
        assert analyse("minilm", corpus, backend="ray", workers=2).to_json() == here   # ray.init(num_cpus=2)
        assert not ray.is_initialized()                  # the Ray it started is shut down
    finally:
        ray.shutdown()


def test_ray_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)           # import ray → ImportError
    with pytest.raises(QkvError, match=r"pip install 'qkv\[ray\]'"):
        analyse("minilm", ["a text"], backend="ray")


def test_workers_need_a_source_they_can_load(minilm):
    from qkv.model import Model

    in_memory = Model(minilm.config, minilm.weights, minilm.tokenizer, name="my-own-model")
    with pytest.raises(QkvError, match="does not load this model"):
        analyse(in_memory, ["a text"], workers=2)
    changed = minilm.astype(np.float64)
    changed.weights.blocks[0].attn.W_Q[0, 0] += 1.0                   # same name, other weights
    with pytest.raises(QkvError, match="does not load this model"):
        analyse(changed, ["a text"], workers=2)
    with pytest.raises(QkvError, match="unknown backend"):
        analyse(minilm, ["a text"], backend="spark")
