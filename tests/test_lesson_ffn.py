"""explain ffn: one token through the FFN box, recomputed here another way (the engine's own FFN box on the
lesson's input, the value logits from the dense weights), on every layout the lesson explains, the page in
English and Korean, the figures, and the command line."""

from __future__ import annotations

import string

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import MODELS, run_main
from qkv.core.blocks import feed_forward, norm
from qkv.runtime.errors import QkvError
from qkv.core.trace import INTERMEDIATES
from qkv.lessons import ffn, lesson_module
from qkv.lessons.ffn import TEXTS

# layouts: sequential pre-norm (GPT-2, SmolLM2), parallel (GPT-NeoX), Phi's one shared norm, a norm after the
# FFN too (Gemma 2), no norm before it (OLMo 2), Granite's multiplier, post-norm encoders, a dense layer of a MoE
FIXTURES = {"gpt2": "pre", "gpt_neox": "parallel", "phi": "parallel_shared", "gemma2": "pre", "olmo2": "pre_bare",
            "granite": "pre", "bert": "post", "opt": "post", "qwen2_moe": "pre"}


@pytest.fixture(scope="module")
def smol():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def smol_lesson(smol):
    return ffn.build(smol)


def printed(parts: list) -> str:
    console = Console(record=True, width=400, highlight=False)
    for part in parts:
        console.print(part)
    return console.export_text()


def fields(s: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(s) if name}


def test_both_languages_have_the_same_sentences():
    assert set(TEXTS["en"]) == set(TEXTS["ko"])
    for key in TEXTS["en"]:
        assert fields(TEXTS["en"][key]) == fields(TEXTS["ko"][key]), key


def test_the_topic_is_registered():
    m = lesson_module("ffn")
    assert m is ffn and m.DEFAULT_MODEL == "smollm2" and callable(m.render) and callable(m.figures)


def engine_ffn(model, lesson) -> np.ndarray:
    """What joins the stream, from the engine's own boxes on the lesson's input h: FFN(h), its norm after
    (Gemma 2, OLMo 2), × the residual multiplier (Granite)."""
    w, cfg = model.weights.blocks[lesson.layer], model.config
    f = feed_forward(lesson.h.astype(np.float32)[None, None], w.ffn, cfg)                 # (1, 1, d_model)
    if w.ffn_out_norm is not None:
        f = norm(f, w.ffn_out_norm, cfg)
    return (f * cfg.residual_multiplier)[0, 0]


def check_partials(lesson):
    """Ranked by |a_i|·‖W_out[i]‖; their share grows with k; k = d_ff is the whole output."""
    shares = [p.share for p in lesson.partials if p.k]
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
    assert [p.k for p in lesson.partials if p.k][-1] == lesson.d_ff
    assert lesson.partials[-1].cos == pytest.approx(1.0, abs=1e-9) and lesson.partials[-1].rel < 1e-9
    assert lesson.curve[-1] == pytest.approx(1.0, abs=1e-9) and len(lesson.curve) == lesson.d_ff
    assert [nr.size for nr in lesson.top] == sorted((nr.size for nr in lesson.top), reverse=True)


def test_smollm2_through_its_gated_ffn(smol, smol_lesson):
    le = smol_lesson
    assert (le.layer, le.labels[le.pos], le.pos) == (15, "␣mat", 5)
    assert le.gated and le.activation == "silu" and le.layout == "pre" and le.d_ff == 1536 and le.stored
    trace = smol.run("The cat sat on the mat", layers=[15], keep=("ffn_out",))
    np.testing.assert_allclose(le.joined, trace.layer(15).ffn_out[5], atol=0)
    # the engine's FFN box on the lesson's h gives the lesson's FFN(h): h is what the engine's FFN read
    np.testing.assert_allclose(le.y, engine_ffn(smol, le), rtol=0, atol=1e-4 * np.abs(le.y).max())
    # a = SiLU(g) ⊙ u, and u, g from the weights dequantised here (the gguf blocks, read independently)
    W = smol.weights.blocks[15].ffn
    u = le.h @ np.asarray(W.W_in, np.float64)
    g = le.h @ np.asarray(W.W_gate, np.float64)
    np.testing.assert_allclose(le.u, u, atol=1e-9)
    np.testing.assert_allclose(le.a, g / (1 + np.exp(-g)) * u, atol=1e-9)
    if "neurons" in INTERMEDIATES:
        assert le.diffs["neurons"] is not None and le.diffs["neurons"] < 1e-5
    assert le.diffs["ffn_out"] < 1e-4 * np.abs(le.joined).max()
    assert le.ffn_params == 3 * 576 * 1536 and le.attn_params == 576 * 576 * 2 + 2 * 576 * 192
    check_partials(le)
    assert [p.k for p in le.partials] == [1, 10, 100, 1536]
    assert le.partials[0].cos < le.partials[1].cos < le.partials[2].cos < le.partials[3].cos


def test_smollm2_top_neurons_promote_what_their_values_score(smol, smol_lesson):
    """The promoted tokens of each top neuron: sign(a_i)·W_out[i] ⊙ γ through the tied W_vocab, recomputed from
    the embedding table's rows (RMSNorm: no centring)."""
    le, w = smol_lesson, smol.weights
    W_out = np.asarray(w.blocks[le.layer].ffn.W_out, np.float64)
    gamma = np.asarray(w.final_norm.weight, np.float64)
    table = np.asarray(w.W_vocab, np.float64)                                  # (d_model, V)
    for nr in le.top[:2]:
        z = (np.sign(nr.a) * W_out[nr.index] * gamma) @ table                  # (V,)
        up = [smol.tokenizer.label(int(i)) for i in np.argsort(-z)[:ffn.TOKENS]]
        assert [t for t, _ in nr.promoted] == up
        np.testing.assert_allclose([v for _, v in nr.promoted], np.sort(z)[::-1][:ffn.TOKENS], rtol=1e-4)
        assert [t for t, _ in nr.suppressed] == [smol.tokenizer.label(int(i)) for i in np.argsort(z)[:ffn.TOKENS]]
    neurons = pytest.importorskip("qkv.analysis.neurons")
    if hasattr(neurons, "value_logits"):                                       # the same convention as qkv neurons
        nr = le.top[0]
        z = neurons.value_logits(smol, np.sign(nr.a) * np.asarray(w.blocks[le.layer].ffn.W_out)[[nr.index]])[0]
        assert [v for _, v in nr.promoted] == pytest.approx(np.sort(z)[::-1][:ffn.TOKENS], rel=1e-5)


@pytest.mark.parametrize("name, layout", list(FIXTURES.items()))
def test_every_layout_equals_the_engine(name, layout):
    model = qkv.load(MODELS / name)
    le = ffn.build(model)
    assert le.layout == layout and le.layer == model.config.n_layers // 2
    assert le.out_norm == (name in ("gemma2", "olmo2")) and (le.multiplier != 1) == (name == "granite")
    trace = model.run("The cat sat on the mat", layers=[le.layer], keep=("ffn_out",))
    np.testing.assert_array_equal(le.joined, trace.layer(le.layer).ffn_out[le.pos])
    np.testing.assert_allclose(engine_ffn(model, le), le.joined, rtol=0, atol=1e-4 * max(1, np.abs(le.joined).max()))
    check_partials(le)
    assert (le.no_vocab is None) == (model.weights.W_vocab is not None)


def test_gpt2_value_logits_centre_before_gamma():
    """GPT-2's final norm is a LayerNorm: a value is centred, then scaled by γ, then read through W_vocab."""
    model = qkv.load(MODELS / "gpt2")
    le = ffn.build(model, layer=0)
    w = model.weights
    v = np.sign(le.top[0].a) * np.asarray(w.blocks[0].ffn.W_out, np.float64)[le.top[0].index]
    z = ((v - v.mean()) * np.asarray(w.final_norm.weight)) @ np.asarray(w.W_vocab, np.float64)
    assert [t for t, _ in le.top[0].promoted] == [model.tokenizer.label(int(i)) for i in np.argsort(-z)[:ffn.TOKENS]]


def test_a_wrong_input_cannot_print(monkeypatch):
    """Reading the parallel block's FFN input as a sequential block's (Norm₂(x + a) instead of Norm₂(x)) is
    caught by the check against the engine."""
    model = qkv.load(MODELS / "gpt_neox")
    monkeypatch.setattr(ffn, "_layout", lambda cfg, w: "pre")
    with pytest.raises(RuntimeError, match="against the engine's ffn_out"):
        ffn.build(model)


def test_an_encoder_skips_the_vocabulary(minilm, tmp_path):
    le = ffn.build(minilm)
    assert le.labels[le.pos] == "mat" and le.pos == 6 and le.layout == "post" and le.no_vocab == "no_head"
    assert "has no LM head (W_vocab)" in printed(ffn.render(le, "en"))
    assert "LM 헤드(W_vocab)가 없습니다" in printed(ffn.render(le, "ko"))
    paths = ffn.figures(le, tmp_path, "ko")
    assert sorted(p.name for p in paths) == ["ffn_neurons.png", "ffn_neurons.svg"]


def test_a_chosen_layer_and_token(smol):
    le = ffn.build(smol, "Once upon a time", layer=-1, token=0)
    assert le.layer == 29 and le.pos == 0 and le.labels[0] == "Once"
    with pytest.raises(QkvError, match="token 9 does not exist"):
        ffn.build(smol, "Once upon a time", token=9)


def test_moe_layers_are_refused_with_the_dense_ones_named():
    with pytest.raises(QkvError, match=r"routed FFN \(MoE: 4 experts, each token takes 2\)"):
        ffn.build(qkv.load(MODELS / "mixtral"))
    with pytest.raises(QkvError, match=r"choose a dense layer with --layer \(1\)"):
        ffn.build(qkv.load(MODELS / "qwen2_moe"), layer=0)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_the_page_carries_the_numbers(smol_lesson, lang):
    le = smol_lesson
    text = printed(ffn.render(le, lang))
    for p in le.partials:
        assert f"{p.cos:.4f}" in text
    for nr in le.top:
        assert f"{nr.a:+.3f}" in text and nr.promoted[0][0] in text
    assert f"{le.diffs['ffn_out']:.1e}" in text and "Q4_1" in text and "2,654,208" in text
    heading = {"en": "① Where the FFN sits", "ko": "① FFN의 자리"}[lang]
    assert heading in text


def test_both_languages_give_the_same_parts(smol_lesson, minilm):
    for le in (smol_lesson, ffn.build(minilm)):
        en, ko = ffn.render(le, "en"), ffn.render(le, "ko")
        assert len(en) == len(ko) and [type(p) for p in en] == [type(p) for p in ko]


def test_figures_are_written(smol_lesson, tmp_path):
    paths = ffn.figures(smol_lesson, tmp_path, "ko")
    assert {p.stem for p in paths} == {"ffn_neurons", "ffn_promoted"} and {p.suffix for p in paths} == {".png", ".svg"}
    assert sorted(tmp_path.iterdir()) == sorted(paths)
    for p in paths:
        head = p.read_bytes()[:400]
        assert head.startswith(b"\x89PNG\r\n\x1a\n") if p.suffix == ".png" else b"<svg" in head


def test_the_command_in_korean_with_figures(monkeypatch, capsys, tmp_path):
    out = tmp_path / "figs"
    code, stdout, err = run_main(monkeypatch, capsys, "explain", "ffn", "--lang", "ko", "--out", str(out))
    assert code == 0, err
    assert "qkv explain ffn · SmolLM2-135M-Instruct · 15번 층 (30개 중)" in stdout and "⑥ 검사" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["ffn_neurons.png", "ffn_neurons.svg", "ffn_promoted.png",
                                                     "ffn_promoted.svg"]


def test_the_command_with_a_model_and_layer(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "explain", "ffn", "A dog ran home", "--model",
                              str(MODELS / "gpt2"), "--layer", "0")
    assert code == 0, err
    assert "layer 0 of 2" in out and "GELU with the tanh approximation" in out


@pytest.mark.parametrize("args, message", [
    (["--model", str(MODELS / "mixtral")], "is a routed FFN (MoE: 4 experts"),
    (["--head", "1"], "ffn follows one layer's FFN, which has no heads"),
    (["--layer", "30"], "layer 30 does not exist"),
    (["--model", "ko-en-tiny"], "is an encoder–decoder"),
])
def test_mistakes_give_one_line_and_exit_2(monkeypatch, capsys, tmp_path, args, message):
    out_dir = tmp_path / "never"
    code, out, err = run_main(monkeypatch, capsys, "explain", "ffn", *args, "--out", str(out_dir))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: ") and message in lines[0], err
    assert not out_dir.exists()
