"""qkv.lessons.vit (`qkv explain vit`): every number the page prints, recomputed here another way (the engine's
own pieces: patches_of, model.run, classify) and found on the page, in English and Korean."""

from __future__ import annotations

import re
import string

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import MODELS, run_main
from qkv.runtime.errors import QkvError
from qkv.inputs.images import patches_of
from qkv.lessons import lesson_module, vit
from qkv.lessons.vit import TEXTS


@pytest.fixture(scope="module")
def digits():
    return qkv.load("digits-vit")


@pytest.fixture(scope="module")
def lesson(digits):
    return vit.build(digits)


def printed(le, lang: str) -> str:
    console = Console(record=True, width=250, highlight=False)
    for part in vit.render(le, lang):
        console.print(part)
    return console.export_text()


def fields(s: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(s) if f}


def test_both_languages_have_the_same_sentences():
    assert TEXTS["en"].keys() == TEXTS["ko"].keys()
    for key in TEXTS["en"]:
        assert fields(TEXTS["en"][key]) == fields(TEXTS["ko"][key]), key


def test_the_topic_is_registered():
    m = lesson_module("vit")
    assert m.DEFAULT_MODEL == "digits-vit" and callable(m.build) and callable(m.render) and callable(m.figures)


def test_every_number_equals_the_engine(digits, lesson):
    shown, pv = digits.pixel_values(str(vit.example_image("3")))
    trace = digits.run(pixel_values=pv)
    np.testing.assert_array_equal(lesson.shown, shown)
    np.testing.assert_allclose(lesson.x, pv, atol=1e-6)
    np.testing.assert_allclose(lesson.patches, patches_of(pv[None], digits.config)[0], atol=1e-6)
    assert lesson.patches.shape == (16, 4) and lesson.X.shape == (17, 64)
    # patch (1, 2) is rows 2–3, columns 4–5 of the normalised image, row by row
    np.testing.assert_allclose(lesson.patches[1 * 4 + 2], pv[0, 2:4, 4:6].reshape(-1), atol=1e-6)
    np.testing.assert_allclose(lesson.X, trace.layer(0).residual, atol=1e-5)
    A = trace.layer(lesson.layer).attentions[:, 0]                           # (H, 17) [CLS]'s rows
    np.testing.assert_allclose(lesson.A, A, atol=1e-5)
    np.testing.assert_allclose(lesson.A.sum(axis=1), 1, atol=1e-12)
    np.testing.assert_allclose(lesson.logits, trace.logits[0], atol=1e-4)
    top = digits.classify(str(vit.example_image("3")), k=1)[0]
    assert lesson.label_names[int(np.argmax(lesson.probs))] == top[0] == "3"
    assert lesson.probs.max() == pytest.approx(top[1], abs=1e-5)
    assert all(d < 1e-4 for d in lesson.diffs.values()), lesson.diffs


def test_a_wrong_computation_cannot_print(digits, monkeypatch):
    monkeypatch.setattr(vit, "_act", lambda u, name: np.maximum(u, 0))       # ReLU instead of GELU
    with pytest.raises(RuntimeError, match="differs from the engine's"):
        vit.build(digits)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_the_page_carries_the_numbers(lesson, lang):
    out = printed(lesson, lang)
    assert "qkv explain vit · digits-vit" in out
    assert "255 223 112  16  32 112 207 255" in out or " ".join(f"{v:3d}" for v in lesson.shown[0, :, 0]) in out
    assert f"{lesson.logits[int(np.argmax(lesson.probs))]:+.3f}" in out
    assert f"{lesson.A[lesson.head].max():.4f}" in out
    assert "█" in out
    if lang == "ko":
        assert re.search("[가-힣]", out) and "답" in out
    else:
        assert "equal" in out.lower() and "digits-vit answers 3" in out


def test_another_layer_a_file_and_another_vit(digits, tmp_path):
    le = vit.build(digits, str(vit.example_image("7")), layer=-1)
    assert le.layer == 2 and not le.example and le.image == "digit-7.png"
    assert le.label_names[int(np.argmax(le.probs))] == "7"
    fixture = qkv.load(str(MODELS / "vit"))                                  # RGB, 4 × 5 patches on a 3 × 3 grid
    le = vit.build(fixture)
    assert le.patches.shape == (9, 3 * 4 * 5) and "3 × 3" in printed(le, "en")
    written = vit.figures(le, tmp_path, "ko")
    assert sorted(p.name for p in written) == ["vit.png", "vit.svg"]


def test_the_command_in_english_and_korean(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "explain", "vit")
    assert code == 0, err
    assert "① The image as pixels" in out and "⑥ The answer" in out and "digits-vit answers 3" in out
    code, out, err = run_main(monkeypatch, capsys, "explain", "vit", "4", "--lang", "ko", "--layer", "1",
                              "--out", str(tmp_path / "figs"))
    assert code == 0, err
    assert "④ 패치 위의 어텐션: 1번 층에서 [CLS]가 보는 곳" in out and "digit-4.png" in out
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["vit.png", "vit.svg"]


@pytest.mark.parametrize("args, message", [
    (["vit", "--model", "minilm"], "qkv explain vit follows an image model"),
    (["vit", "no-such-image.png"], "no image file"),
    (["vit", "--head", "1"], "drop --head"),
    (["vit", "--layer", "9"], "layer"),
])
def test_mistakes_give_one_line_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "explain", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_text_model_is_refused_before_it_runs(minilm):
    with pytest.raises(QkvError, match="reads text"):
        vit.build(minilm)
