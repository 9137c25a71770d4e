"""Shared test helpers: where the fixtures are, and how to compare with the reference."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = FIXTURES / "models"
IMAGE_FIXTURES = ("vit", "vit_base")       # image models (ViT): pixel_values in, tests/test_vit.py
AUDIO_FIXTURES = ("whisper", "whisper_base")   # speech (Whisper): log-mel features in, tests/test_whisper.py
SSM_FIXTURES = ("mamba",)                  # state-space stacks, no attention weights to compare: test_family_mamba.py
FAMILY_FIXTURES = sorted(p.name for p in MODELS.iterdir()
                         if (p / "config.json").is_file() and p.name not in IMAGE_FIXTURES + AUDIO_FIXTURES + SSM_FIXTURES)
ENCODER_PREFIXES = ("bert", "roberta", "xlm_roberta", "distilbert", "electra", "modernbert", "albert", "nomic_bert",
                    "mpnet", "deberta")    # encoders: no KV cache, no greedy ids
DECODER_FIXTURES = [n for n in FAMILY_FIXTURES if not n.startswith(ENCODER_PREFIXES)]

# Tolerances against transformers (float32), as the project promises.
TOL_HIDDEN = 1e-4       # hidden states and logits, max abs
TOL_ATTENTION = 1e-5    # attention weights, max abs

# Tests wait on events (a line from a child, a file listed, a selector shown), never for a number of seconds.
# PATIENCE only bounds such a wait so that a hang fails instead of blocking the run: a hang guard, never a speed
# limit (on a busy 2-core machine a step that takes a second idle has taken minutes). Seconds; Playwright's
# waits get it in milliseconds (tests/test_browser.py's `tab`).
PATIENCE = 900

# tests/live needs torch + transformers and re-checks against them live: only
# `make test-live` (pytest tests/live) runs it, never the ordinary `pytest`.
collect_ignore = ["live"]


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`qkv ARGS` through the real entry point (`qkv.cli.app.main`): (exit code, stdout, stderr)."""
    from qkv.cli.app import main

    monkeypatch.setattr(sys, "argv", ["qkv", *args])
    with pytest.raises(SystemExit) as e:
        main()
        raise SystemExit(0)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@contextmanager
def running_server(source: str, **options) -> Iterator:
    """`qkv serve` for SOURCE on a free port of 127.0.0.1, serving from a thread while inside."""
    from qkv.web.app import make_server

    srv = make_server(source, port=0, **options)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


class Spy:
    """A model whose passes' last logits are kept, (B, V) each: what each generated token was chosen from."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def last_logits(self, *args, **kw):
        z = self.model.last_logits(*args, **kw)                  # (B, 1, V)
        self.seen.append(z[:, -1].copy())
        return z


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def patching_pair(name: str, n: int = 9, at: int = 4):
    """A patching case on fixture NAME: the model in float64, clean ids (n,) from a fixed generator, corrupted ids
    (the token at AT changed) and (answer, wrong): the two tokens whose last-position logit the change raises most
    and lowers most (a large difference, so relative errors stay small)."""
    import qkv

    model = qkv.load(MODELS / name, dtype=np.float64)
    clean = np.random.default_rng(3).integers(0, model.config.vocab_size, n)
    corrupted = clean.copy()
    corrupted[at] = (clean[at] + 7) % model.config.vocab_size
    moved = model.run(clean, keep=()).logits[-1] - model.run(corrupted, keep=()).logits[-1]     # (V,)
    return model, clean.tolist(), corrupted.tolist(), (int(np.argmax(moved)), int(np.argmin(moved)))


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def minilm():
    import qkv

    return qkv.load("minilm")
