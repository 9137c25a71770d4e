"""`qkv show IMAGE --model digits-vit` (cli/show_image.py): the predicted labels and where each head's [CLS]
looks, the overlays of viz/image_figures.py and the viewer's image payload; one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

import qkv
from qkv.viz.image_figures import image_heads, image_layers, image_rollout
from qkv.viz.payload import trace_payload
from conftest import MODELS, run_main

DIGIT = str(qkv.__path__[0]) + "/checkpoints/data/digits-vit/digit-3.png"


@pytest.fixture(scope="module")
def digits():
    return qkv.load("digits-vit")


@pytest.fixture(scope="module")
def three(digits):
    return digits.run(DIGIT)


@pytest.fixture(scope="module")
def rgb_png(tmp_path_factory):
    """An RGB image of the ViT fixture's size (12 × 15: 3 × 3 patches of 4 × 5 pixels)."""
    path = tmp_path_factory.mktemp("img") / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (12, 15, 3), dtype=np.uint8)).save(path)
    return path


def payload_of(page: str) -> dict:
    return json.loads(re.search(r'class="qkv-data">(.*?)</script>', page, re.S).group(1))


def test_show_prints_the_labels_and_each_heads_top_patches_of_the_last_layer(monkeypatch, capsys, digits, three):
    code, out, err = run_main(monkeypatch, capsys, "show", DIGIT, "--model", "digits-vit")
    assert code == 0, err
    top = digits.classify(DIGIT, 3)
    assert top[0][0] == "3"
    assert "predicted: " + ", ".join(f"{label} ({p:.3f})" for label, p in top) in out
    assert "layer 2 (the last, whose [CLS] the classifier reads" in out
    a = three.attentions[2]                                                    # (H, n, n)
    for h in range(4):
        j = int(np.argmax(a[h, 0, 1:]))                                        # the patch [CLS] looks at most
        assert f"head {h}: patch ({j // 4}, {j % 4}) {a[h, 0, 1 + j]:.2f}" in out
    assert "--out DIR draws" in out


def test_a_digit_names_the_shipped_example(monkeypatch, capsys, digits):
    """`qkv show 7 --model digits-vit` reads the shipped digit-7.png and says where it is."""
    code, out, err = run_main(monkeypatch, capsys, "show", "7", "--model", "digits-vit")
    assert code == 0, err
    assert "digit-7.png" in err and "predicted: 7 (" in out
    code, out, err = run_main(monkeypatch, capsys, "show", "77", "--model", "digits-vit")
    assert code == 2 and "is no image file" in err                               # only the ten shipped digits


def test_show_one_head_prints_its_grid_and_ablation_changes_the_prediction(monkeypatch, capsys, digits, three):
    code, out, _ = run_main(monkeypatch, capsys, "show", DIGIT, "--model", "digits-vit", "--layer", "0",
                            "--head", "1")
    assert code == 0
    row = three.attentions[0, 1, 0, 1:].reshape(4, 4)
    for r in range(4):
        assert re.search(rf"\b{r} │ " + " │ ".join(f"{w:.2f}" for w in row[r]), out), out
    code, knocked, _ = run_main(monkeypatch, capsys, "show", DIGIT, "--model", "digits-vit", "--ablate", "2.2,1.0")
    assert code == 0 and "heads knocked out: 2.2, 1.0" in knocked
    ablated = digits.run(DIGIT, ablate=[(2, 2), (1, 0)])
    assert not np.allclose(ablated.logits[0], three.logits[0])
    z = ablated.logits[0].astype(np.float64)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert f"predicted: {np.argmax(p)} ({p.max():.3f})" in knocked


def test_show_out_writes_the_overlays_and_the_viewer_in_image_mode(monkeypatch, capsys, three, tmp_path):
    out = tmp_path / "views"
    code, text, err = run_main(monkeypatch, capsys, "show", DIGIT, "--model", "digits-vit", "--out", str(out))
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["attention.html", "image_heads.png", "image_heads.svg", "image_layers.png", "image_rollout.png"]
    assert f"wrote 5 files to {out}" in text
    for name in names[1:]:
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") if name.endswith(".png") else b"layer 2 head 3" in data
    p = payload_of((out / "attention.html").read_text())
    assert p["tokens"][:2] == ["[CLS]", "patch (0, 0)"] and p["attention"]["shape"] == [3, 4, 17, 17]
    image = p["image"]
    assert {k: image[k] for k in ("height", "width", "rows", "cols", "patch", "first")} == {
        "height": 8, "width": 8, "rows": 4, "cols": 4, "patch": [2, 2], "first": 1}
    assert image["predicted"][0]["label"] == "3" and image["png"].startswith("data:image/png;base64,")
    assert p["rollout"] is not None and p["title"] == "digits-vit · digit-3.png"   # the file, not its folder


def test_a_vit_directory_reads_an_rgb_image_with_patches_that_are_not_square(monkeypatch, capsys, rgb_png, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "show", str(rgb_png), "--model", str(MODELS / "vit"),
                              "--layer", "1", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert "an image of 12 × 15 pixels in 3 × 3 patches of 4 × 5 pixels" in out and "layer 1:" in out
    assert payload_of((tmp_path / "o" / "attention.html").read_text())["image"]["patch"] == [4, 5]


@pytest.mark.parametrize("args, message", [
    (["missing.png"], "no image file missing.png; give the path of a PNG or JPEG file"),
    (["The cat sat on the mat"], "digits-vit reads images, not text: 'The cat sat on the mat' is no image file"),
    ([DIGIT, "--prefix", "three"], "digits-vit reads an image: drop --prefix"),
    ([DIGIT, "--budget-mb", "3"], "drop --budget-mb"),
    ([DIGIT, "--ablate", "7.0"], "layer"),
    ([DIGIT, "--head", "9"], "head"),
])
def test_mistakes_are_one_line_and_leave_no_directory(monkeypatch, capsys, tmp_path, args, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, "show", *args, "--model", "digits-vit", "--out", "views")
    assert code == 2 and err.count("\n") == 1 and err.startswith("qkv: error: ") and message in err, err
    assert not (tmp_path / "views").exists()


def test_a_file_that_is_not_an_image_is_one_line(monkeypatch, capsys, tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("not a picture")
    code, _, err = run_main(monkeypatch, capsys, "show", str(fake), "--model", "digits-vit")
    assert code == 2 and err.count("\n") == 1 and "is not an image PIL reads" in err


def test_an_image_given_to_a_text_model_is_read_as_text_with_a_note(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "show", DIGIT, "--model", str(MODELS / "gpt2"))
    assert code == 0
    assert "is read as text, not as an image; give an image model (--model digits-vit" in err
    assert "tokens:" in out


def test_the_figures_draw_one_panel_per_head_and_layer(three):
    image, cells = three.image, three.attentions[:, :, 0, 1:].reshape(3, 4, 4, 4)   # (L, H, rows, cols)
    fig = image_heads(image, cells[1], (2, 2), 1, self_weights=three.attentions[1, :, 0, 0])
    assert [ax.get_title() for ax in fig.axes[:4]] == [f"layer 1 head {h}" for h in range(4)]
    overlay = fig.axes[0].images[1]                                            # over the image, nearest, α 0.6
    assert np.array_equal(overlay.get_array(), cells[1, 0]) and overlay.get_extent() == [0, 8, 8, 0]
    assert len(image_layers(image, cells, (2, 2), [0, 1, 2]).axes) == 3 * 4 + 1     # + the colour bar
    fig = image_rollout(image, cells[2, 0], (2, 2), "고양이 <b>", 0.5)
    assert "predicted: 고양이 <b> (0.50)" in fig.get_suptitle()


def test_a_text_trace_has_no_image_in_its_payload():
    from test_viewer import random_trace

    assert trace_payload(random_trace(["a", "b", "c"]))["image"] is None


def test_a_label_with_dollars_is_drawn_as_text(tmp_path):
    """A checkpoint's label is its own text: "$\\frac" or an odd "$" must not be parsed as mathtext."""
    from qkv.viz.drawing import save_figure
    from qkv.viz.image_figures import image_rollout

    fig = image_rollout(np.zeros((8, 8, 1), np.uint8), np.full((4, 4), 1 / 16), (2, 2), "a$b $\\frac", 0.5)
    assert "\\$" in fig._suptitle.get_text()
    assert all(p.stat().st_size > 0 for p in save_figure(fig, tmp_path, "x", formats=("png",)))


def test_the_lens_on_cls_ends_at_the_prediction(monkeypatch, capsys):
    """The terminal's logit lens on [CLS]: one entry per depth (the embeddings, then after each layer), each the
    label the final norm and the classifier read from [CLS]'s stream there; the last one is the prediction."""
    from qkv.analysis.lens import lens_of_trace
    from qkv.checkpoints import digits_dir

    image = str(digits_dir() / "digit-8.png")
    code, out, err = run_main(monkeypatch, capsys, "show", image, "--model", "digits-vit")
    assert code == 0, err
    line = next(l for l in out.splitlines() if l.startswith("the logit lens on [CLS]"))
    model = qkv.load("digits-vit")
    rows = lens_of_trace(model, model.run(image))[:, 0]                    # (L + 1, 10)
    want = [model.labels[int(np.argmax(z))] for z in rows]
    found = re.findall(r"(embeddings|after L\d) (\S+) \(", line)
    assert [w for w, _ in found] == ["embeddings", "after L0", "after L1", "after L2"]
    assert [label for _, label in found] == want and want[-1] == "8"
