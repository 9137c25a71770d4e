"""ViT (image models) against transformers' committed references (tests/fixtures/make_vit_fixtures.py): the
forward pass, every layer, the classifier, the image processing, the backward (autograd's gradients), and what
the engine gives every model — hooks, ablation, rollout, the lens on [CLS] — on patches; images and configs
refused in one line."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

import qkv
from qkv import QkvError
from qkv.analysis.rollout import attention_rollout
from qkv.checkpoints import vit
from qkv.inputs.images import MAX_PIXELS, patch_labels, patches_of
from qkv.train import gradients
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference, run_main

IMAGES = ("vit", "vit_base")


@pytest.fixture(scope="module")
def models():
    return {name: qkv.load(MODELS / name) for name in IMAGES}


@pytest.mark.parametrize("name", IMAGES)
def test_forward_equals_reference(models, name):
    ref, model = reference(name), models[name]
    out = model.forward(ref["pixel_values"])
    assert max_abs(out.hidden, ref["hidden"]) <= TOL_HIDDEN
    assert max_abs(out.attentions, ref["attentions"]) <= TOL_ATTENTION
    if name == "vit":
        assert out.logits.shape == ref["logits"].shape and max_abs(out.logits, ref["logits"]) <= TOL_HIDDEN
    else:
        assert out.logits is None                                  # a ViTModel: no classifier


@pytest.mark.parametrize("name", IMAGES)
def test_every_layer_equals_reference(models, name):
    """The stream entering each block is transformers' hidden_states[i], for each image of the batch."""
    ref, model = reference(name), models[name]
    for b in range(2):
        trace = model.run(pixel_values=ref["pixel_values"][b])
        for i in range(model.config.n_layers):
            assert max_abs(trace.layer(i).residual, ref["hidden_states"][i, b]) <= TOL_HIDDEN
        assert max_abs(trace.attentions, ref["attentions"][:, b]) <= TOL_ATTENTION


def test_tokens_are_patches_row_by_row(models):
    model = models["vit"]
    cfg = model.config
    assert cfg.grid == (3, 3) and cfg.patch_size == (4, 5) and cfg.image_size == (12, 15)
    labels = patch_labels(cfg)
    assert labels[:4] == ["[CLS]", "patch (0, 0)", "patch (0, 1)", "patch (0, 2)"] and labels[-1] == "patch (2, 2)"
    x = np.arange(2 * 3 * 12 * 15, dtype=np.float32).reshape(2, 3, 12, 15)
    p = patches_of(x, cfg)                                          # (B, 9, 3·4·5)
    assert p.shape == (2, 9, 60)
    np.testing.assert_array_equal(p[1, 5].reshape(3, 4, 5), x[1, :, 4:8, 10:15])   # patch (1, 2)
    base = models["vit_base"].config                                # 10 × 10 in 4 × 4: 2 rows of pixels never read
    assert base.grid == (2, 2) and patches_of(np.zeros((1, 1, 10, 10), np.float32), base).shape == (1, 4, 16)


@pytest.mark.parametrize("name", IMAGES)
def test_image_processing_equals_transformers(models, name):
    """An RGBA PNG, part transparent, through qkv's preprocess = ViTImageProcessor with the same settings."""
    ref, model = reference(name), models[name]
    shown, pixels = model.pixel_values(Image.open(io.BytesIO(ref["image_png"].tobytes())))
    assert shown.dtype == np.uint8 and shown.shape == (*model.config.image_size, model.config.num_channels)
    assert max_abs(pixels, ref["image_pixel_values"][0]) <= 1e-6
    assert model.processing.resample == (3 if name == "vit" else 2)          # its preprocessor_config.json, or the default


def test_classify_and_trace(models, tmp_path):
    model = models["vit"]
    ref = reference("vit")
    (tmp_path / "x.png").write_bytes(ref["image_png"].tobytes())
    top = model.classify(tmp_path / "x.png", k=5)
    assert [name for name, _ in top] and {name for name, _ in top} == {"cat", "dog", "mat", "sat", "the"}
    assert abs(sum(p for _, p in top) - 1) < 1e-6 and top[0][1] >= top[-1][1]
    trace = model.run(str(tmp_path / "x.png"))
    z = trace.logits[0].astype(np.float64)                            # row 0: [CLS], the classification
    assert model.labels[int(np.argmax(z))] == top[0][0]
    assert trace.image.shape == (12, 15, 3) and trace.grid == (3, 3) and trace.label_names == model.labels
    trace.save(tmp_path / "t")
    back = qkv.Trace.load(tmp_path / "t")
    np.testing.assert_array_equal(back.image, trace.image)
    assert back.grid == (3, 3) and back.tokens == trace.tokens and back.label_names == model.labels
    np.testing.assert_allclose(back.attentions, trace.attentions)


def test_backward_equals_autograd(models):
    """Every parameter's gradient of transformers' ViTForImageClassification loss (autograd, committed)."""
    ref, model = reference("vit"), models["vit"]
    loss, grads = gradients(model, ref["pixel_values"], labels=ref["labels"])
    assert abs(loss - float(ref["loss"])) < 1e-5
    expected = {k[len("grad."):]: ref[k] for k in ref if k.startswith("grad.")}
    assert set(grads) == set(expected)
    for key, g_ref in expected.items():             # b_K's gradient is 0 (softmax ignores a constant per row):
        scale = max(np.linalg.norm(g_ref), 1e-3)     # both sides are float noise there, compared absolutely
        err = np.linalg.norm(grads[key] - g_ref) / scale
        assert grads[key].shape == g_ref.shape and err < 1e-4, f"{key}: relative error {err:.2e}"


def test_hooks_and_ablation_act_on_patches(models):
    model = models["vit"]
    x = reference("vit")["pixel_values"][0]
    plain = model.run(pixel_values=x)
    seen = []
    hooked = model.run(pixel_values=x, hooks={"1.attentions": lambda a, layer: seen.append(a.shape) or a})
    assert seen == [(1, 4, 10, 10)] and max_abs(hooked.logits, plain.logits) == 0
    zero = model.run(pixel_values=x, hooks={"0.heads": lambda z, layer: z * 0})
    ablated = model.run(pixel_values=x, ablate=[(0, h) for h in range(4)])
    assert max_abs(zero.logits, ablated.logits) <= 1e-6 and max_abs(ablated.logits, plain.logits) > 1e-3
    np.testing.assert_array_equal(model.ablate([(0, 1)]).forward(x).logits,
                                  model.forward(x, ablate=[(0, 1)]).logits)


def test_rollout_from_cls_is_a_distribution_over_patches(models):
    trace = models["vit"].run(pixel_values=reference("vit")["pixel_values"][1])
    R = attention_rollout(trace)                                     # (L, n, n)
    np.testing.assert_allclose(R.sum(axis=-1), 1, atol=1e-5)
    assert R.shape == (3, 10, 10) and (R >= 0).all()
    A = 0.5 * trace.attentions[0].mean(axis=0) + 0.5 * np.eye(10)    # layer 0: (A + I)/2 of the mean head
    np.testing.assert_allclose(R[0], A / A.sum(axis=-1, keepdims=True), atol=1e-6)


def test_logit_lens_on_cls_ends_at_the_classifier(models):
    """Each layer's stream at [CLS] through the final norm and the classifier; the last is the logits."""
    model = models["vit"]
    from qkv.analysis.lens import KEEP, lens_of_trace

    trace = model.run(pixel_values=reference("vit")["pixel_values"][0], keep=KEEP)
    lens = lens_of_trace(model, trace)                               # (L + 1, n, labels)
    assert lens.shape == (4, 10, 5)
    assert max_abs(lens[-1][0], trace.logits[0]) <= TOL_HIDDEN


def test_save_reads_back_and_transformers_layout(models, tmp_path):
    model = models["vit"]
    model.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors",
                                                                 "preprocessor_config.json"]
    again = qkv.load(tmp_path / "m")
    x = reference("vit")["pixel_values"]
    np.testing.assert_array_equal(again.forward(x).logits, model.forward(x).logits)
    assert again.labels == model.labels and again.processing == model.processing
    hf = json.loads((tmp_path / "m" / "config.json").read_text())
    assert hf["architectures"] == ["ViTForImageClassification"] and hf["id2label"]["2"] == "mat"


def test_fresh_vit_trains_a_step():
    """qkv.init of a ViT config: an ImageModel whose loss falls after one plain gradient step."""
    from qkv.train.backprop import image_loss_and_grads
    from qkv.train.digits import vit_config

    model = qkv.init(vit_config(16, 1, 2), seed=3)
    x = np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    labels = np.array([1, 2, 3, 4])
    patches = patches_of(x, model.config)
    loss, g = image_loss_and_grads(model.weights, model.config, patches, labels)
    model.weights.W_vocab -= 0.5 * g.W_vocab
    model.weights.tok_embed -= 0.5 * g.tok_embed
    assert image_loss_and_grads(model.weights, model.config, patches, labels)[0] < loss


# ── refused in one line ──────────────────────────────────────────────────────────

def _png(path, size, mode="RGB"):
    Image.new(mode, size).save(path)
    return path


def test_bad_images_are_refused(models, tmp_path):
    model = models["vit"]
    (tmp_path / "text.png").write_text("not an image")
    (tmp_path / "dir.png").mkdir()
    cases = [(tmp_path / "missing.png", "no image file"), (tmp_path / "text.png", "not an image"),
             (tmp_path / "dir.png", "directory"), (np.zeros((4, 4), np.float32), "uint8"),
             (np.zeros((4, 4, 2), np.uint8), "(H, W) or (H, W, C)"), (12, "not int")]
    for source, message in cases:
        with pytest.raises(QkvError, match=message.replace("(", r"\(").replace(")", r"\)")):
            model.run(source)


def test_a_decompression_bomb_is_refused_from_its_header(models, tmp_path):
    """A PNG that claims more than MAX_PIXELS pixels is refused before its pixels are decoded."""
    import struct
    import zlib

    side = int(MAX_PIXELS ** 0.5) + 100
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    body = zlib.compress(b"\0" * 1000)
    (tmp_path / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body)
                                        + chunk(b"IEND", b""))
    with pytest.raises(QkvError, match="pixels, more than qkv reads"):
        model_run = models["vit"].run
        model_run(tmp_path / "bomb.png")


def test_images_of_every_mode_are_read(models, tmp_path):
    """Grey, palette, RGBA and 16-bit images become the model's channels; any size is resized."""
    for mode, size in (("L", (30, 20)), ("P", (8, 8)), ("RGBA", (15, 12)), ("I;16", (40, 40))):
        trace = models["vit"].run(_png(tmp_path / f"{mode.replace(';', '')}.png", size, mode))
        assert trace.image.shape == (12, 15, 3)
    assert models["vit_base"].run(_png(tmp_path / "c.png", (10, 10))).image.shape == (10, 10, 1)
    for mode, fmt in (("LAB", "TIFF"), ("CMYK", "JPEG"), ("F", "TIFF")):       # LAB → grey goes through RGB
        path = tmp_path / f"x.{fmt.lower()}"
        Image.new(mode, (9, 7)).save(path, format=fmt)
        assert models["vit_base"].run(path).image.shape == (10, 10, 1)
        assert models["vit"].run(path).image.shape == (12, 15, 3)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_float_image_of_nan_pixels_is_refused(models, tmp_path, monkeypatch, capsys, bad):
    """A 32-bit float TIFF (PIL mode "F") with NaN or infinite pixels: converting it to grey or RGB would make
    them 0 or 255 and the model would classify a picture the file lacks; refused in one line (a finite one is read)."""
    pixels = np.full((7, 9), bad, np.float32)
    pixels[0, :2] = 30.0
    Image.fromarray(pixels, mode="F").save(tmp_path / "nan.tif")
    for model in (models["vit"], models["vit_base"]):
        with pytest.raises(QkvError, match=r"nan.tif has 61 of its 63 pixels NaN or infinite"):
            model.run(tmp_path / "nan.tif")
        with pytest.raises(QkvError, match="the image has 61 of its 63 pixels NaN"):
            model.run(Image.open(tmp_path / "nan.tif"))
    code, _, err = run_main(monkeypatch, capsys, "show", str(tmp_path / "nan.tif"), "--model", str(MODELS / "vit"))
    assert code == 2 and err.count("\n") == 1 and "pixels NaN or infinite" in err, err
    Image.fromarray(np.where(np.isfinite(pixels), pixels, 0), mode="F").save(tmp_path / "finite.tif")
    assert models["vit"].run(tmp_path / "finite.tif").image.shape == (12, 15, 3)


def test_pixel_values_are_checked(models):
    model = models["vit"]
    with pytest.raises(QkvError, match=r"pixel_values must be floats of shape \(B, 3, 12, 15\)"):
        model.forward(np.zeros((1, 3, 12, 12), np.float32))
    bad = np.zeros((1, 3, 12, 15), np.float32)
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(QkvError, match="inf or NaN"):
        model.forward(bad)
    with pytest.raises(QkvError, match="reads images, not text: 'the cat sat' is no image file"):
        model.run("the cat sat")
    with pytest.raises(QkvError, match="reads images, not text: look at one with qkv show IMAGE"):
        model.encode("the cat sat")
    with pytest.raises(QkvError, match="writes no text"):
        model.generate("a")


def _edited(tmp_path, change: dict, name: str = "vit", file: str = "config.json"):
    shutil.copytree(MODELS / name, tmp_path / "m")
    path = tmp_path / "m" / file
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    return tmp_path / "m"


@pytest.mark.parametrize("change, message", [
    ({"patch_size": 0}, "patch_size"),
    ({"image_size": [12, "15"]}, "image_size"),
    ({"patch_size": 16}, "patch_size"),                                    # a grid of 0 patches
    ({"num_channels": 7}, "num_channels"),
    ({"architectures": ["ViTForMaskedImageModeling"]}, "ViTForMaskedImageModeling is not supported"),
    ({"id2label": {"0": "a", "2": "b"}}, "id2label"),
    ({"image_size": 16}, "position_embeddings"),                           # the checkpoint's table is 1 + 9 rows
])
def test_bad_configs_are_refused(tmp_path, change, message):
    with pytest.raises(QkvError, match=message):
        qkv.load(_edited(tmp_path, change))


@pytest.mark.parametrize("change, message", [
    ({"image_mean": [0.5]}, "image_mean"), ({"image_std": [0.2, 0.0, 0.2]}, "image_std"),
    ({"size": {"height": 0, "width": 3}}, "size"), ({"resample": 9}, "resample"),
    ({"do_center_crop": True}, "center crop"),
])
def test_bad_preprocessor_configs_are_refused(tmp_path, change, message):
    with pytest.raises(QkvError, match=message):
        qkv.load(_edited(tmp_path, change, file="preprocessor_config.json"))


def test_config_of_reads_knobs():
    cfg = vit.config({"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                      "intermediate_size": 8, "image_size": 224, "patch_size": 16, "qkv_bias": False,
                      "hidden_act": "gelu_new", "layer_norm_eps": 1e-6, "architectures": ["ViTModel"]})
    assert (cfg.grid, cfg.max_positions, cfg.qkv_bias, cfg.activation, cfg.lm_head) == ((14, 14), 197, False,
                                                                                          "gelu_tanh", False)


@pytest.mark.parametrize("text, message", [("{not json", "is not valid JSON"), ("[1, 2]", "is not a JSON object")])
def test_a_broken_preprocessor_config_is_one_line(tmp_path, text, message):
    shutil.copytree(MODELS / "vit", tmp_path / "m")
    (tmp_path / "m" / "preprocessor_config.json").write_text(text)
    with pytest.raises(QkvError, match=f"preprocessor_config.json {message}.*restore the checkpoint's "
                                       "preprocessor_config.json"):
        qkv.load(tmp_path / "m")
