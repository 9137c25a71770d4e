"""explain: the guide's steps for one head of the real model, numbers equal to the model's, in English and Korean."""

from __future__ import annotations

import math
import string
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

import qkv
from qkv.lessons import attention as explain, attention_render as explain_render

from qkv.lessons.attention_render import TEXTS
from conftest import MODELS, PATIENCE, run_main

STEPS = ["⓪", "①", "②", "③", "④", "⑤", "⑥", "⑦", "⑧"]


@pytest.fixture(scope="module")
def walk(minilm):
    return explain.walkthrough(minilm)                              # "The cat sat on the mat", layer 0, head 2


def printed(w: explain.Walkthrough, lang: str) -> str:
    console = Console(record=True, width=200, highlight=False)
    for part in explain_render.render(w, lang):
        console.print(part)
    return console.export_text()


def line_of(text: str, start: str) -> list[str]:
    """The words of the first line that starts with `start` (after leading spaces)."""
    return next(line.split() for line in text.splitlines() if line.lstrip().startswith(start))


def test_walkthrough_is_the_models_computation(walk, minilm):
    t = minilm.run("The cat sat on the mat", layers=[0]).layer(0)
    assert (walk.layer, walk.head, walk.arch.d_k, walk.n) == (0, 2, 32, 8)
    assert walk.Q.shape == walk.K.shape == walk.V.shape == walk.Z.shape == (8, 32)
    np.testing.assert_allclose(walk.S, t.scores[2], atol=1e-5)
    np.testing.assert_allclose(walk.S_raw / math.sqrt(32), t.scores[2], atol=1e-5)
    np.testing.assert_allclose(walk.A, t.attentions[2], atol=1e-6)
    np.testing.assert_allclose(walk.out, t.attn_out, atol=1e-4)
    assert walk.tokens[walk.row] == "sat" and int(np.argmax(walk.A[walk.row])) == 2   # sat → cat


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_every_step_with_real_shapes_and_numbers(walk, lang):
    text = printed(walk, lang)
    for mark in STEPS:
        assert mark in text
    for shape in ["(8, 384)", "(384, 384)", "(384, 32)", "(8, 32)", "(32, 8)", "(8, 8)"]:
        assert shape in text
    assert "[CLS]" in text and "√32 = 5.657" in text
    # the S/√d_k corner: the row of "sat" in step ④ is the model's scores, to 2 decimals
    after_scaling = text[text.index("④"):]
    assert line_of(after_scaling, "sat") == ["sat"] + [f"{v:.2f}" for v in walk.S[3, :4]]
    # the softmax row of "sat" in step ⑤
    row = line_of(text, "A[sat]")[1:]
    assert row == [explain_render._num(float(v)) for v in walk.A[3]] and row[2] == "1.000"
    # the variance table: d_k = 64 gives about 64, scaled about 1
    var64 = line_of(text[text.index("⑧"):], "64 ")
    assert abs(float(var64[1]) - 64) < 4 and abs(float(var64[3]) - 1) < 0.06
    assert "[1.000, 1.0e-43, 1.0e-43]" in text                          # softmax([100, 1, 1])


def test_korean_uses_the_guides_vocabulary(walk):
    text = printed(walk, "ko")
    for word in ["쿼리", "키", "밸류", "점수 행렬", "스케일링", "소프트맥스", "가중합", "도서관", "인과 마스킹"
                 if walk.causal else "잔차"]:
        assert word in text, word
    assert "“sat”은(는) “cat”(토큰 2)을(를) 가장 많이 봅니다" in text


def test_both_languages_say_the_same_things():
    fields = {lang: {k: sorted(f for _, f, _, _ in string.Formatter().parse(v) if f) for k, v in t.items()}
              for lang, t in TEXTS.items()}
    assert fields["en"] == fields["ko"]


def test_scaling_demonstration_measures_d_k():
    for d_k, var, scaled in explain.scaling_variance():
        assert abs(var / d_k - 1) < 0.1 and abs(scaled - 1) < 0.1
    w = explain.softmax(np.array([100.0, 1.0, 1.0]))
    assert w[0] > 0.999999 and w[1] < 1e-40


def test_a_wrong_step_cannot_print(minilm, monkeypatch):
    monkeypatch.setattr(explain, "softmax", lambda s: np.exp(s) / np.exp(s).sum(-1, keepdims=True) * 0.99)
    with pytest.raises(AssertionError, match="A differs from the model's"):
        explain.walkthrough(minilm)


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gpt_neox", "qwen3", "phi", "gemma", "olmo2"])
def test_decoders_with_mask_rope_and_gqa(name):
    w = explain.walkthrough(qkv.load(MODELS / name), "the cat sat on the mat", layer=-1, head=1)
    text = printed(w, "en")
    assert w.causal and "−∞" in text and "Causal mask" in text
    assert ("RoPE" in text) == (name != "gpt2") and ("GQA" in text) == (w.arch.group > 1)
    assert "pre-norm" in text and "Norm(X)·W_Q^1" in text




@pytest.mark.parametrize("args, message", [
    (["--lang", "xx"], "unknown language 'xx'"),
    (["--layer", "6"], "layer 6 does not exist"),
    (["--head", "-13"], "head -13 does not exist"),
    ([""], "the text is empty"),
    (["word " * 600], "at most 512"),
])
def test_mistakes_give_one_line_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "explain", *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_cli_explain_in_korean():
    r = subprocess.run([sys.executable, "-m", "qkv", "explain", "--lang", "ko", "--head", "-10"],
                       capture_output=True, text=True, timeout=PATIENCE, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    assert "12개 헤드 중 2번 헤드" in r.stdout and "⑧ 왜 √d_k로 나누나" in r.stdout


# a real LLM: SmolLM2 (RMSNorm, RoPE, GQA, the causal mask) -------------------------

@pytest.fixture(scope="module")
def smol():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def smol_walk(smol):
    return explain.walkthrough(smol)                                 # "The cat sat on the mat", layer 0, head 2


def test_smollm2_walkthrough_recomputes_rope_gqa_and_rmsnorm(smol, smol_walk):
    w, t = smol_walk, smol.run("The cat sat on the mat", layers=[0]).layer(0)
    a = w.arch
    assert (w.n, a.H, a.H_kv, a.group, a.d_k, w.kv_head, w.group_heads) == (6, 9, 3, 3, 64, 0, [0, 1, 2])
    assert a.W_Q == (576, 576) and a.W_K == (576, 192) and t.q.shape == (9, 6, 64) and t.k.shape == (3, 6, 64)
    assert a.norm == "rms" and w.row == 5 and w.tokens[w.row] == "Ġmat"            # a decoder: its last token
    # RMSNorm by its formula
    g = smol.weights.blocks[0].attn_norm.weight.astype(np.float64)
    X = t.residual.astype(np.float64)
    np.testing.assert_allclose(w.Xn, X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-5) * g, rtol=1e-9)
    # RoPE: the unrotated q, k turned pair by pair (angle p·θ^(−2i/d)) are the model's q, k
    r = w.rope
    pos, inv = np.arange(6)[:, None], 100000.0 ** (-np.arange(32) / 32)
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    for pre, used in ((r.Q_pre, t.q[2]), (r.K_pre, t.k[0])):
        turned = np.concatenate([pre[:, :32] * c - pre[:, 32:] * s, pre[:, :32] * s + pre[:, 32:] * c], -1)
        np.testing.assert_allclose(turned, used, atol=2e-5)
        np.testing.assert_allclose(np.linalg.norm(turned, axis=-1), np.linalg.norm(pre, axis=-1), rtol=1e-12)
    # q·k after RoPE: the same at the same distance, different at another; row 1 is the model's score
    dots = {(m, p): d for m, p, d in r.relative}
    assert len({round(d, 9) for (m, p), d in dots.items() if m - p == 2}) == 1 and len(dots) == 6
    assert abs(dots[(5, 3)] - t.scores[2, 5, 3] * 8) < 1e-4 and abs(dots[(5, 5)] - dots[(5, 3)]) > 0.1
    # GQA: heads 0, 1, 2 all read K/V head 0; the causal mask is −∞ exactly above the diagonal
    for h in (0, 1, 2):
        np.testing.assert_allclose(np.tril(t.q[h] @ t.k[0].T / 8), np.tril(t.scores[h]), atol=1e-5)
    assert np.array_equal(np.isneginf(w.S), np.triu(np.ones((6, 6), bool), 1))


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_smollm2_prints_the_steps_bert_lacks(smol_walk, lang):
    text = printed(smol_walk, lang)
    for mark in STEPS + ["①a RMSNorm", "②a RoPE", "②b GQA"]:
        assert mark in text, mark
    for shape in ["(6, 576)", "(576, 192)", "(9, 6, 64)", "(3, 6, 64)", "(6, 6)"]:
        assert shape in text
    assert "θ" in text and "= 100000" in text and "0, 1, [2]" in text and "ε = 1e-05" in text
    # the relative-position table: 4 rows at distance 2 with the same q·k, the model's S[mat, on]·√d_k
    rows = [line.split() for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()
            and len(line.split()) == 4 and line.split()[2] == "2"]
    assert [r[:2] for r in rows] == [["5", "3"], ["15", "13"], ["105", "103"], ["1005", "1003"]]
    assert {r[3] for r in rows} == {f"{smol_walk.S_raw[5, 3]:.4f}"}
    # the scaled scores of step ④, whole: 15 of 36 masked (and −∞ twice in the sentence about the mask)
    after = text[text.index("④"):text.index("⑤")]
    assert after.count("−∞") == 2 + 15 and line_of(after, "␣mat")[1:] == [f"{v:.2f}" for v in smol_walk.S[5]]
    assert "b_O" not in text                                            # SmolLM2 has no bias in W_O


def test_cli_explain_smollm2_in_korean(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "explain", "--model", "smollm2", "--lang", "ko")
    assert code == 0, err
    assert "②a RoPE: 위치만큼 회전하는 Q와 K" in out and "쿼리 헤드 9개가 K/V 헤드 3개를 공유" in out
    assert "9개 헤드 중 2번 헤드" in out
