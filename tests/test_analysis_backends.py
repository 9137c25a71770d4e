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


def test_workers_compute_in_the_arithmetic_of_the_model_given(corpus):
    """A GGUF loaded in llama.cpp's arithmetic and analysed by 2 workers: each worker loads it so (the same bits as
    one process; exact arithmetic's differ)."""
    from pathlib import Path

    import qkv

    path = str(Path(__file__).parent / "fixtures" / "gguf" / "tiny-llama-q8_0.gguf")
    texts = ["the cat sat", "on the mat today", "a dog ran"]
    model = qkv.load(path, arith="llama.cpp")
    one = analyse(model, texts).to_json()
    assert analyse(model, texts, workers=2).to_json() == one
    assert analyse(qkv.load(path), texts).to_json() != one


def test_ray_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)           # import ray → ImportError
    with pytest.raises(QkvError, match=r"pip install 'qkv\[ray\]'"):
        analyse("minilm", ["a text"], backend="ray")


def test_workers_need_a_source_they_can_load(minilm):
    from qkv.models.model import Model

    in_memory = Model(minilm.config, minilm.weights, minilm.tokenizer, name="my-own-model")
    with pytest.raises(QkvError, match="does not load this model"):
        analyse(in_memory, ["a text"], workers=2)
    changed = minilm.astype(np.float64)
    changed.weights.blocks[0].attn.W_Q[0, 0] += 1.0                   # same name, other weights
    with pytest.raises(QkvError, match="does not load this model"):
        analyse(changed, ["a text"], workers=2)
    with pytest.raises(QkvError, match="unknown backend"):
        analyse(minilm, ["a text"], backend="spark")


_ORPHAN_SCRIPT = """
import itertools, multiprocessing, sys
from qkv.analysis.backends import WorkerSpec, process_pool

spec = WorkerSpec(sys.argv[1], "float32", 64)
jobs = ((i, None, "the cat sat on the mat") for i in itertools.count())     # never ends
for n, _ in enumerate(process_pool(spec, jobs, 2)):
    if n == 40:                                 # the workers are up and busy: say who they are
        print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
"""


def _alive(pid: int) -> bool:
    """Whether process PID runs (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_parent_is_killed():
    import os
    import signal
    import subprocess
    import time

    from conftest import MODELS, PATIENCE

    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, str(MODELS / "bert")],
                              stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]       # blocks until the pool runs
        assert len(workers) >= 2 and all(_alive(p) for p in workers)
        parent.send_signal(signal.SIGKILL)                                 # no cleanup can run
        parent.wait(timeout=PATIENCE)
        deadline = time.monotonic() + PATIENCE       # the kernel kills them at once (PR_SET_PDEATHSIG): a hang guard
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers if _alive(p)], "workers outlived their parent"
    finally:
        parent.kill()
        for p in workers:                                                  # never leave them running
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("address, message", [
    ("127.0.0.1:1", "cannot reach the Ray cluster at 127.0.0.1:1 (Connection refused)"),
    ("ray://127.0.0.1:1", "cannot reach the Ray cluster at ray://127.0.0.1:1"),
    ("nowhere", "is not host:port"),
    ("127.0.0.1:99999", "is not host:port"),
])
def test_a_ray_address_where_nothing_listens_is_one_line_at_once(monkeypatch, capsys, tmp_path, address, message):
    """Ray itself retries a missing head for about a minute: qkv tries the port first (5 s at most)."""
    from conftest import run_main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n" * 3)
    code, _, err = run_main(monkeypatch, capsys, "heads", "--file", str(corpus), "--backend", "ray", "--address",
                            address, "--model", "minilm")
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
