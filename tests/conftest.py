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
SSM_FIXTURES = ("mamba", "mamba2", "jamba", "minimax", "qwen3_next",   # state-space and linear-attention stacks,
                "granitemoehybrid", "falcon_h1")     # no attention weights to compare (Jamba, MiniMax, Qwen3-Next,
                                                     # Granite 4: in some layers only; Falcon-H1: a mixer beside
                                                     # each): test_scan_families.py (what they share),
                                                     # test_family_mamba.py, test_family_jamba.py,
                                                     # test_family_minimax.py, test_family_qwen3_next.py,
                                                     # test_family_granitemoehybrid.py, test_family_falcon_h1.py
FAMILY_FIXTURES = sorted(p.name for p in MODELS.iterdir()
                         if (p / "config.json").is_file() and p.name not in IMAGE_FIXTURES + AUDIO_FIXTURES + SSM_FIXTURES)
ENCODER_PREFIXES = ("bert", "roberta", "xlm_roberta", "distilbert", "electra", "modernbert", "albert", "nomic_bert",
                    "mpnet", "deberta", "longformer", "big_bird", "esm")   # encoders: no KV cache, no greedy ids
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


@pytest.fixture(autouse=True)
def readable_steps(request, monkeypatch):
    """Generation in the suite takes the readable one-token step (QKV_STEP=readable): the definition each family is
    checked against transformers with. The compiled step (core/step_compiled.py) is checked against it in
    tests/test_step_compiled.py, the one file that runs it: each of its plans takes 10–30 s to compile in every
    process with a cache of its own, and taken everywhere they made the suite 12 minutes longer."""
    if request.module.__name__ != "test_step_compiled":
        monkeypatch.setenv("QKV_STEP", "readable")


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


@pytest.fixture(scope="module")
def model(request):
    """The fixture at the test module's PATH (a family's, tests/test_family_*.py), float32, loaded once a module; a
    module's own `model` fixture, where it has one, comes first."""
    import qkv

    return qkv.load(request.module.PATH)


@pytest.fixture(scope="module")
def model64(request):
    """As `model`, computing in float64 (the implied-attention identities, to 1e-9)."""
    import qkv

    return qkv.load(request.module.PATH, dtype=np.float64)


# ── checks that the family tests (tests/test_family_*.py) share ───────────────────────────────────────────────────


def edited(tmp_path: Path, name: str, change: dict, drop: tuple = ()) -> Path:
    """Fixture NAME copied to TMP_PATH/NAME with its config.json changed (DROP's keys removed, CHANGE's set); its path."""
    import json
    import shutil

    path = tmp_path / name
    shutil.copytree(MODELS / name, path)
    hf = json.loads((path / "config.json").read_text())
    hf = {k: v for k, v in hf.items() if k not in drop} | change
    (path / "config.json").write_text(json.dumps(hf))
    return path


def check_gradients(model, name: str, *, labels: bool = False, atol: float | None = None,
                    vanishing: float | None = None, zero_norm: bool = False) -> dict[str, np.ndarray]:
    """MODEL's loss and gradients on grads/<NAME>.npz (make_grad_fixtures.py) against transformers' loss (within
    1e-5) and torch autograd's gradient of every parameter (the same names and shapes, each within 1e-4 relative
    error); returns ours. labels: the masked-LM loss over the file's labels. atol: a gradient within ATOL absolute
    passes too (one that is 0 but for rounding). vanishing: where autograd's norm is below it, ours must be too
    (both round-off). zero_norm: where autograd's is exactly 0, the relative error is our largest |value|."""
    from qkv.train import gradients

    ref = np.load(FIXTURES / "grads" / f"{name}.npz")
    extra = {"labels": ref["labels"]} if labels else {}
    loss, grads = gradients(model, ref["input_ids"], ref["attention_mask"], **extra)
    assert abs(loss - float(ref["loss"])) < 1e-5
    expected = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(expected)
    for key, g_ref in expected.items():
        assert grads[key].shape == g_ref.shape, key
        scale = np.linalg.norm(g_ref)
        if vanishing is not None and scale < vanishing:
            assert np.linalg.norm(grads[key]) < vanishing, key
            continue
        err = np.linalg.norm(grads[key] - g_ref) / scale if scale or not zero_norm else np.abs(grads[key]).max()
        assert err < 1e-4 or (atol is not None and max_abs(grads[key], g_ref) < atol), \
            f"{key}: relative error {err:.2e}"
    return grads


def check_knob_matters(name: str, change) -> None:
    """Fixture NAME's logits on its single sequence are met (TOL_HIDDEN), and missed by more than 100 × TOL_HIDDEN
    with CHANGE: a dict of config knobs (model.with_config) or a function of the model giving another."""
    import qkv

    ref = reference(name)
    model = qkv.load(MODELS / name)
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN
    other = change(model) if callable(change) else model.with_config(**change)
    assert max_abs(other.forward(ref["single_input_ids"]).logits, ref["single_logits"]) > 100 * TOL_HIDDEN


def check_saved_reads_back(tmp_path: Path, name: str, folder: str = "m") -> dict:
    """Fixture NAME saved to TMP_PATH/FOLDER and loaded back: the same config and, on its single sequence, the same
    logits to the bit. Returns the config.json written."""
    import json

    import qkv

    model = qkv.load(MODELS / name)
    model.save(tmp_path / folder)
    back = qkv.load(tmp_path / folder)
    assert back.config == model.config
    ids = reference(name)["single_input_ids"]
    np.testing.assert_array_equal(back.forward(ids).logits, model.forward(ids).logits)
    return json.loads((tmp_path / folder / "config.json").read_text())


def check_encoder_saved_reads_back(tmp_path: Path, name: str, *, hidden: bool = True, logits: bool = True) -> None:
    """Encoder fixture NAME saved and loaded back: the same config, and on its padded batch (with its token types)
    the same HIDDEN states and/or LOGITS to the bit."""
    import qkv

    ref = reference(name)
    model = qkv.load(MODELS / name)
    model.save(tmp_path / "saved")
    again = qkv.load(tmp_path / "saved")
    assert again.config == model.config
    a = model.forward(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    b = again.forward(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    if hidden:
        np.testing.assert_array_equal(a.hidden, b.hidden)
    if logits:
        np.testing.assert_array_equal(a.logits, b.logits)


def check_left_padding(name: str, *, logits: bool) -> None:
    """Encoder fixture NAME on its left-padded batch: the hidden states (and the masked-LM LOGITS) at the real
    tokens equal transformers' within TOL_HIDDEN."""
    import qkv

    ref = reference(name)
    out = qkv.load(MODELS / name).forward(ref["left_input_ids"], ref["left_attention_mask"])
    real = ref["left_attention_mask"].astype(bool)                     # (B, n)
    assert max_abs(out.hidden[real], ref["left_hidden"][real]) <= TOL_HIDDEN
    if logits:
        assert max_abs(out.logits[real], ref["left_logits"][real]) <= TOL_HIDDEN


def check_single_sequence(name: str, *, logits: bool) -> None:
    """Encoder fixture NAME on its one longer sequence: hidden states (TOL_HIDDEN), attentions (TOL_ATTENTION) and
    the masked-LM LOGITS (TOL_HIDDEN) equal transformers'; logits=False: the model gives none."""
    import qkv

    ref = reference(name)
    out = qkv.load(MODELS / name).forward(ref["single_input_ids"])
    assert max_abs(out.hidden, ref["single_hidden"]) <= TOL_HIDDEN
    assert max_abs(out.attentions, ref["single_attentions"]) <= TOL_ATTENTION
    if logits:
        assert max_abs(out.logits, ref["single_logits"]) <= TOL_HIDDEN
    else:
        assert out.logits is None


def check_router_trace_round_trip(tmp_path: Path, name: str) -> None:
    """Fixture NAME's trace of its single sequence saved and loaded: each layer's router, experts and expert_weights
    read back equal (None where a layer has none)."""
    import qkv
    from qkv.core.trace import Trace

    model = qkv.load(MODELS / name)
    trace = model.run(reference(name)["single_input_ids"][0])
    back = Trace.load(trace.save(tmp_path / "t"))
    for i in trace.layer_ids:
        for what in ("router", "experts", "expert_weights"):
            a, b = getattr(trace.layer(i), what), getattr(back.layer(i), what)
            assert (a is None and b is None) or np.array_equal(a, b), (i, what)


def check_training_resumes(args: list[str], out: Path, at: int, later: int) -> None:
    """A finished `qkv train` run in OUT, its model and its later checkpoint (step LATER) removed: the same command
    resumes from its checkpoint at step AT and writes the same weights, bit for bit."""
    import shutil

    from click.testing import CliRunner

    from qkv.cli.app import cli

    first = (out / "model" / "model.safetensors").read_bytes()
    shutil.rmtree(out / "model")
    (out / "checkpoints" / f"step-{later:08d}.npz").unlink()
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert f"resuming from step {at}" in r.output
    assert (out / "model" / "model.safetensors").read_bytes() == first
