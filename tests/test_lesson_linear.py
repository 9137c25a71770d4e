"""qkv explain linear: every number recomputed here in float64 from the model's trace — a MiniMax lightning layer
(its implied matrix, its state, the model's cache), a Mamba scan, a softmax model's heads through φ — the page in
English and Korean carrying them, the figures written, and what it cannot read refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import MODELS, run_main
from qkv.core.cache import KVCache
from qkv.core.kernels import compare_to_softmax
from qkv.lessons import TOPICS, linear
from qkv.runtime.errors import QkvError

TEXT = "the cat sat on the mat and the dog"


def printed(lesson, lang: str) -> str:
    console = Console(record=True, width=300, highlight=False)
    for part in linear.render(lesson, lang):
        console.print(part)
    return console.export_text()


@pytest.fixture(scope="module")
def minimax():
    return qkv.load(MODELS / "minimax", dtype=np.float64)


def test_both_languages_have_the_same_sentences_and_the_topic_is_listed():
    assert linear.TEXTS["en"].keys() == linear.TEXTS["ko"].keys()
    assert TOPICS["linear"].module == "qkv.lessons.linear" and linear.DEFAULT_MODEL == "smollm2"


def test_a_lightning_layer(minimax):
    """The matrix is (qₜ·kₛ)·λ^(t−s) of the head's q, k; A·V its output; the state Σ λ^(n−1−s)·kₛᵀ·vₛ the one the
    model's cache holds, and q·S the last row of A·V; λ = exp(−slope) of every head."""
    lesson = linear.build(minimax, TEXT)
    assert (lesson.kind, lesson.layer, lesson.head) == ("lightning", 0, 0)
    t = minimax.run(TEXT, keep=("q", "k", "v", "heads"))
    q, k, v = t.layer(0).q[0], t.layer(0).k[0], t.layer(0).v[0]       # (n, d_k) head 0
    n = len(q)
    rate = minimax.weights.blocks[0].lightning.slopes[0]
    want = np.array([[q[i] @ k[j] * np.exp(-rate * (i - j)) if j <= i else 0 for j in range(n)] for i in range(n)])
    assert np.abs(lesson.A - want).max() < 1e-12
    assert np.abs(lesson.A @ v - t.layer(0).heads[0]).max() < 1e-9
    cache = KVCache(minimax.config, 1, n, dtype=np.float64)
    ids = np.array([t.ids])
    minimax.last_logits(ids, np.ones_like(ids), cache=cache)
    assert np.abs(lesson.state - cache.state.S[0][0, 0]).max() < 1e-12
    assert np.abs(q[-1] @ lesson.state - (want @ v)[-1]).max() < 1e-12
    np.testing.assert_allclose(lesson.decay, np.exp(-minimax.weights.blocks[0].lightning.slopes))
    assert lesson.diff_row < 1e-12 and lesson.diff_state < 1e-12
    en, ko = printed(lesson, "en"), printed(lesson, "ko")
    assert "lightning attention (MiniMax)" in en and "라이트닝 어텐션(MiniMax)" in ko
    assert f"a {q.shape[1]} × {v.shape[1]} matrix: {q.shape[1] * v.shape[1]} numbers" in en
    assert f"{lesson.decay[1]:.4f}" in en and f"{lesson.decay[1]:.4f}" in ko


def test_a_mamba_channel():
    """α of the channel that mixes most, α·x̃ the scan's output, h·C the last row."""
    from qkv.core.mamba import hidden_attention, mixer_parts

    model = qkv.load(MODELS / "mamba", dtype=np.float64)
    lesson = linear.build(model, TEXT)
    f = mixer_parts(model.run(TEXT, keep=("attn_in",)).layer(0).attn_in[None], model.weights.blocks[0].mixer,
                    model.config)
    every = hidden_attention(f.dt, f.A, f.Bm, f.Cm)[0]                # (E, n, n)
    c = lesson.head
    assert c == int(np.abs(every).max(axis=(1, 2)).argmax()) and np.abs(lesson.A - every[c]).max() == 0
    assert np.abs(lesson.A @ f.x[0, :, c] - f.y[0, :, c]).max() < 1e-12
    assert lesson.state.shape == (model.config.mamba.d_state, 1)
    assert abs(float(lesson.state[:, 0] @ f.Cm[0, -1]) - f.y[0, -1, c]) < 1e-12
    assert "selective scan (Mamba)" in printed(lesson, "en") and "선택적 스캔(Mamba)" in printed(lesson, "ko")


def test_a_softmax_models_head_through_phi():
    """φ(Q)·φ(K)ᵀ normalised by rows, times V, is the kernel's output; φ(q)·S / φ(q)·z its last row; each layer's
    comparison is compare_to_softmax's."""
    model = qkv.load(MODELS / "llama_gqa")
    lesson = linear.build(model, TEXT)
    t = model.run(TEXT, keep=("q", "k", "v", "attentions")).layer(0)
    q, k, v = (np.asarray(a, np.float64) for a in (t.q[0], t.k[0], t.v[0]))
    phi = lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))   # noqa: E731
    n = len(q)
    s = phi(q) @ phi(k).T * np.tril(np.ones((n, n)))
    assert np.abs(lesson.A - s / s.sum(1, keepdims=True)).max() < 1e-12
    assert np.abs(lesson.softmax - t.attentions[0]).max() == 0
    assert np.abs(lesson.state - phi(k).T @ v).max() < 1e-12
    c = compare_to_softmax(t.q[None], t.k[None], t.v[None], causal=True)
    assert lesson.layers[0] == (0, pytest.approx(float(c["relative_error"].mean())),
                                pytest.approx(float(c["cosine"].mean())))
    en = printed(lesson, "en")
    assert "is a softmax model" in en and f"{lesson.layers[1][1]:.3f}" in en


def test_the_figures(minimax, tmp_path):
    paths = linear.figures(linear.build(minimax, TEXT), tmp_path, "ko")
    assert sorted(p.name for p in paths) == ["linear.png", "linear.svg"] and all(p.stat().st_size > 0 for p in paths)


def test_an_encoder_is_refused_in_one_line():
    with pytest.raises(QkvError, match="not a decoder") as e:
        linear.build(qkv.load(MODELS / "bert"), TEXT)
    assert "\n" not in str(e.value)


def test_the_command_on_smollm2_in_korean(monkeypatch, capsys, tmp_path):
    """Without --model: SmolLM2's own heads, in Korean, the figures into --out."""
    out = tmp_path / "figs"
    code, stdout, err = run_main(monkeypatch, capsys, "explain", "linear", "--lang", "ko", "--out", str(out))
    assert code == 0, err
    assert "qkv explain linear · SmolLM2-135M-Instruct" in stdout and "② 대신 들고 가는 상태" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["linear.png", "linear.svg"]


def test_the_command_on_minimax(monkeypatch, capsys):
    code, stdout, err = run_main(monkeypatch, capsys, "explain", "linear", "A dog ran home", "--model",
                                 str(MODELS / "minimax"))
    assert code == 0, err
    words = " ".join(stdout.split())                                  # the console wraps where the path's length says
    assert "③ How far each head remembers" in words and "'A dog ran home'" in words


def test_a_gated_delta_layer():
    """Qwen3-Next: A·V is the delta rule's output of the value head, Sᵀ·q̂ its last row."""
    from qkv.core.delta import delta_parts

    model = qkv.load(MODELS / "qwen3_next", dtype=np.float64)
    lesson = linear.build(model, TEXT)
    layer = model.config.delta.layers[0]
    f = delta_parts(model.run(TEXT, keep=("attn_in",)).layer(layer).attn_in[None], model.weights.blocks[layer].delta,
                    model.config)
    assert (lesson.kind, lesson.layer) == ("delta", layer) and np.all(np.triu(lesson.A, 1) == 0)
    assert np.abs(lesson.A @ f.v[0, 0] - f.o[0, 0]).max() < 1e-12
    assert np.abs(f.q[0, 0, -1] @ lesson.state - f.o[0, 0, -1]).max() < 1e-12
    assert "gated delta layer (Qwen3-Next)" in printed(lesson, "en")
