"""CLIP and SigLIP against transformers' committed references (tests/fixtures/make_fixtures.py, make_clip_siglip:
models/clip_siglip/<name>): each tower's hidden states, every layer's stream and attention weights, its pooled row
and embedding (right and left padding for text), a pair's logits_per_image and SigLIP's probe attention; images
through the checkpoint's processor (CLIP's shorter-side resize and center crop); the knobs refused in one line;
the tables read both ways; `qkv show IMAGE --texts` and the views on a tower."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import qkv
from qkv import QkvError
from qkv.checkpoints.families import family_of
from qkv.core.ops import quick_gelu, quick_gelu_backward
from qkv.models.contrastive import ImageTower, PairModel, TextTower
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, run_main

HERE = MODELS / "clip_siglip"
PAIRS = ("clip", "siglip")
TEXTS = ("clip_text", "siglip_text")
IMAGES = ("clip_vision", "siglip_vision")


def ref_of(name: str) -> dict[str, np.ndarray]:
    with np.load(HERE / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def towers(name: str):
    """(text tower or None, image tower or None, the reference's key prefix of each) of fixture NAME."""
    model = qkv.load(HERE / name)
    if isinstance(model, PairModel):
        return model.text, model.vision, "text_", "vision_"
    return (model, None, "", None) if isinstance(model, TextTower) else (None, model, None, "")


def check_text(model: TextTower, ref: dict, at: str) -> None:
    ids, mask = ref["input_ids"], ref["attention_mask"]
    real = mask.astype(bool)
    out = model.forward(ids, mask)
    assert max_abs(out.hidden[real], ref[f"{at}hidden"][real]) <= TOL_HIDDEN
    for b in range(2):
        rows = real[b]                                        # the padded row's real query rows
        assert max_abs(out.attentions[:, b][:, :, rows], ref[f"{at}attentions"][:, b][:, :, rows]) <= TOL_ATTENTION
    trace = model.run(ids[0], keep=("residual",))             # row 0, unpadded: every layer's stream
    for i in range(model.config.n_layers):
        assert max_abs(trace.layer(i).residual, ref[f"{at}hidden_states"][i, 0]) <= TOL_HIDDEN
    pooled = model.pooled(input_ids=ids, attention_mask=mask)
    if model.config.family == "siglip_text_model":           # its pooler_output is the head's: our embeds
        assert max_abs(pooled.embeds, ref[f"{at}pooled"]) <= TOL_HIDDEN
    else:
        assert max_abs(pooled.pooled, ref[f"{at}pooled"]) <= TOL_HIDDEN
    if f"{at}embeds" in ref:
        assert max_abs(pooled.embeds, ref[f"{at}embeds"]) <= TOL_HIDDEN
    left = model.forward(ref["left_input_ids"], ref["left_attention_mask"])
    real = ref["left_attention_mask"].astype(bool)
    assert max_abs(left.hidden[real], ref[f"{at}left_hidden"][real]) <= TOL_HIDDEN
    lp = model.pooled(input_ids=ref["left_input_ids"], attention_mask=ref["left_attention_mask"])
    want = lp.embeds if model.config.family == "siglip_text_model" else lp.pooled
    assert max_abs(want, ref[f"{at}left_pooled"]) <= TOL_HIDDEN


def check_image(model: ImageTower, ref: dict, at: str) -> None:
    x = ref["pixel_values"]
    out = model.forward(x)
    assert max_abs(out.hidden, ref[f"{at}hidden"]) <= TOL_HIDDEN           # last_hidden_state
    assert max_abs(out.attentions, ref[f"{at}attentions"]) <= TOL_ATTENTION
    trace = model.run(pixel_values=x[1], keep=("residual",))
    for i in range(model.config.n_layers):
        assert max_abs(trace.layer(i).residual, ref[f"{at}hidden_states"][i, 1]) <= TOL_HIDDEN
    if f"{at}pooled" not in ref:                                             # SiglipVisionModel without its head
        with pytest.raises(QkvError, match="pools no embedding"):
            model.pooled(x)
        return
    pooled = model.pooled(x)
    assert max_abs(pooled.pooled, ref[f"{at}pooled"]) <= TOL_HIDDEN
    if f"{at}embeds" in ref:
        assert max_abs(pooled.embeds, ref[f"{at}embeds"]) <= TOL_HIDDEN
    if f"{at}probe_attentions" in ref:                                       # SigLIP's pooling head, (B, H, P)
        assert max_abs(pooled.probe_attentions, ref[f"{at}probe_attentions"]) <= TOL_ATTENTION


@pytest.mark.parametrize("name", PAIRS + TEXTS + IMAGES)
def test_each_tower_equals_the_reference(name):
    text, image, t, v = towers(name)
    ref = ref_of(name)
    if text is not None:
        check_text(text, ref, t)
    if image is not None:
        check_image(image, ref, v)


@pytest.mark.parametrize("name", PAIRS)
def test_the_pairs_logits_per_image_equal_the_reference(name):
    model, ref = qkv.load(HERE / name), ref_of(name)
    s = model.similarity(ref["pixel_values"], ref["input_ids"], ref["attention_mask"])
    assert max_abs(s.logits_per_image, ref["logits_per_image"]) <= TOL_HIDDEN
    if name == "clip":                                       # which text, of these, fits each image
        np.testing.assert_allclose(s.probs.sum(axis=1), 1, atol=1e-12)
        z = ref["logits_per_image"].astype(np.float64)
        np.testing.assert_allclose(s.probs, np.exp(z) / np.exp(z).sum(1, keepdims=True), atol=1e-6)
    else:                                                    # each pair on its own
        np.testing.assert_allclose(s.probs, 1 / (1 + np.exp(-ref["logits_per_image"].astype(np.float64))), atol=1e-6)
    assert s.kind == ("softmax" if name == "clip" else "sigmoid")


@pytest.mark.parametrize("name", PAIRS)
def test_an_image_file_goes_through_the_checkpoints_processor(name, tmp_path):
    """A 23 × 17 PNG: CLIP's shorter side to 8 then the middle 8 × 8 (bicubic, CLIP's mean and std), SigLIP's resized
    to 8 × 8: the pixel values transformers' PIL processor gives, to the bit."""
    model, ref = qkv.load(HERE / name), ref_of(name)
    path = tmp_path / "image.png"
    path.write_bytes(ref["image_png"].tobytes())
    shown, pixels = model.vision.pixel_values(str(path))
    assert shown.shape == (8, 8, 3)
    np.testing.assert_array_equal(pixels, ref["image_pixel_values"][0])
    a = model.similarity(str(path), ["a photo of the cat", "the dog"])
    b = model.similarity(ref["image_pixel_values"], ["a photo of the cat", "the dog"])
    np.testing.assert_array_equal(a.logits_per_image, b.logits_per_image)


def test_clip_pools_at_the_first_eos_and_texts_pad_inertly():
    """CLIP's texts padded to the longest (pad 1, a mask): each row's embedding is the text's alone; the eos (id 3)
    pools, not the largest id (13 in "the red"... ids) as the legacy rule would."""
    model = qkv.load(HERE / "clip")
    both = model.text.pooled(["a photo of the cat", "red"]).embeds
    alone = model.text.pooled(["red"]).embeds
    assert max_abs(both[1:], alone) <= 1e-6
    ids, _ = model.text.encode("red")
    assert ids.tolist() == [2, 13, 3]
    hidden = model.text.forward(ids[None]).hidden[0]
    assert max_abs(model.text.pooled(["red"]).pooled[0], hidden[2]) == 0          # the eos row, not 13's


def test_clip_text_with_eos_2_pools_at_the_largest_id():
    """eos_token_id 2 (configs before transformers' PR #24773): the argmax of the ids pools."""
    model, ref = qkv.load(HERE / "clip_text"), ref_of("clip_text")
    assert model.config.eos_token_id == 2
    hidden = model.forward(ref["input_ids"], ref["attention_mask"]).hidden
    at = ref["input_ids"].argmax(axis=1)
    pooled = model.pooled(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"]).pooled
    np.testing.assert_array_equal(pooled, hidden[np.arange(2), at])


def test_siglip_texts_pad_to_the_longest_position_without_a_mask():
    """SiglipProcessor(padding="max_length"): every text filled to max_position_embeddings (12) with the pad id and
    no attention mask, so the pooled last row is at the same position for every text."""
    model = qkv.load(HERE / "siglip")
    ids, mask = model.text.batch(["a photo of the cat", "red"])
    assert ids.shape == (2, 12) and mask.all() and (ids[1, 3:] == 1).all()
    want = model.text.pooled(input_ids=ids, attention_mask=mask).embeds
    np.testing.assert_array_equal(model.text.pooled(["a photo of the cat", "red"]).embeds, want)


def test_float64_agrees_with_float32():
    for name in PAIRS:
        ref = ref_of(name)
        a = qkv.load(HERE / name).similarity(ref["pixel_values"], ref["input_ids"], ref["attention_mask"])
        b = qkv.load(HERE / name, dtype=np.float64).similarity(ref["pixel_values"], ref["input_ids"],
                                                                 ref["attention_mask"])
        assert b.image_embeds.dtype == np.float64 and max_abs(a.logits_per_image, b.logits_per_image) <= 1e-5


def test_no_class_token_reads_the_patches_alone():
    """SigLIP's image: P tokens (no [CLS]), labelled by patch; CLIP's: [CLS] first."""
    siglip, clip = qkv.load(HERE / "siglip").vision, qkv.load(HERE / "clip").vision
    x = ref_of("siglip")["pixel_values"][0]
    trace = siglip.run(pixel_values=x)
    assert trace.tokens == ["patch (0, 0)", "patch (0, 1)", "patch (1, 0)", "patch (1, 1)"]
    assert trace.layer(0).attentions.shape == (2, 4, 4)
    assert clip.run(pixel_values=ref_of("clip")["pixel_values"][0]).tokens[0] == "[CLS]"


def test_quick_gelu_and_its_backward():
    x = np.linspace(-6, 6, 41)
    np.testing.assert_allclose(quick_gelu(x), x / (1 + np.exp(-1.702 * x)), rtol=1e-15)
    h = 1e-6
    numeric = (quick_gelu(x + h) - quick_gelu(x - h)) / (2 * h)
    np.testing.assert_allclose(quick_gelu_backward(np.ones_like(x), x), numeric, atol=1e-8)


# ── the tables, both ways ─────────────────────────────────────────────────────

@pytest.mark.parametrize("name", PAIRS + TEXTS + IMAGES)
def test_the_table_writes_back_the_checkpoint_it_read(name):
    model = qkv.load(HERE / name)
    written = family_of(model.config.family).tensors(model.weights, model.config)
    stored = load_file(str(HERE / name / "model.safetensors"))
    assert sorted(written) == sorted(stored)
    for key, value in stored.items():
        np.testing.assert_array_equal(written[key], value, err_msg=key)


@pytest.mark.parametrize("name", TEXTS + IMAGES)
def test_a_tower_saved_reads_back_as_itself(name, tmp_path):
    model = qkv.load(HERE / name)
    model.save(tmp_path / "m")
    back = qkv.load(tmp_path / "m")
    assert type(back) is type(model) and back.config == model.config
    ref = ref_of(name)
    if name in TEXTS:
        a, b = (m.pooled(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"]).embeds
                for m in (model, back))
    else:
        a, b = model.forward(ref["pixel_values"]).hidden, back.forward(ref["pixel_values"]).hidden
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", PAIRS + TEXTS + IMAGES)
def test_the_config_json_reads_back(name):
    model = qkv.load(HERE / name)
    family = family_of(model.config.family)
    hf = family.hf_config(model.config)
    assert family.config(hf) == model.config
    if model.config.text_tower is not None:
        assert family.config(hf).text_tower == model.config.text_tower


# ── refused in one line ────────────────────────────────────────────────────────

def edited(tmp_path, name: str, change) -> str:
    shutil.copytree(HERE / name, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    hf = json.loads(path.read_text())
    change(hf)
    path.write_text(json.dumps(hf))
    return str(tmp_path / "m")


@pytest.mark.parametrize("name, change, message", [
    ("clip", lambda hf: hf.update(architectures=["CLIPForImageClassification"]), "CLIPForImageClassification is not"),
    ("siglip", lambda hf: hf.update(architectures=["SiglipForImageClassification"]), "SiglipForImageClassification"),
    ("clip", lambda hf: hf["vision_config"].update(image_size=[8, 12]), "square images only"),
    ("clip_vision", lambda hf: hf.update(patch_size=[4, 3]), "square images only"),
    ("clip", lambda hf: hf["text_config"].update(head_dim=8), "head_dim = 8 is not read"),
    ("clip", lambda hf: hf["text_config"].update(hidden_act="swiglu"), "activation 'swiglu' is not supported"),
    ("siglip", lambda hf: hf["vision_config"].update(vision_use_head=False), "pools no image embedding"),
    ("siglip_vision", lambda hf: hf.update(vision_use_head="yes"), "vision_use_head"),
    ("clip", lambda hf: hf.update(text_config=[1]), "text_config"),
    ("siglip", lambda hf: hf["text_config"].update(projection_size=9), "embeddings of one width"),
    ("clip_vision", lambda hf: hf.update(patch_size=16), "larger than image_size"),
])
def test_knobs_transformers_reads_are_honoured_or_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(e.value)


def test_an_extra_tensor_is_refused(tmp_path):
    shutil.copytree(HERE / "clip", tmp_path / "m")
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    extra = {"vision_model.extra.weight": np.ones(3, np.float32)}
    save_file(tensors | extra, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(QkvError, match="1 tensor that a clip model never reads"):
        qkv.load(tmp_path / "m")


def test_training_and_text_on_the_pair_are_refused_in_one_line():
    from qkv.train import gradients

    pair = qkv.load(HERE / "clip")
    for model, inputs in ((pair.vision, ref_of("clip")["pixel_values"]), (pair.text, ref_of("clip")["input_ids"])):
        with pytest.raises(QkvError):
            gradients(model, inputs, labels=np.array([0, 1]) if model is pair.vision else inputs)
    with pytest.raises(QkvError, match="two towers"):
        pair.run("a cat")
    with pytest.raises(QkvError, match="save each tower"):
        pair.save("anywhere")
    with pytest.raises(QkvError, match="reads images, not text"):
        pair.similarity("a photo of a cat", ["a cat"])


# ── the CLI and the views ──────────────────────────────────────────────────────

@pytest.mark.parametrize("name", PAIRS)
def test_qkv_show_scores_an_image_against_texts(name, monkeypatch, capsys, tmp_path):
    model, ref = qkv.load(HERE / name), ref_of(name)
    path = tmp_path / "image.png"
    path.write_bytes(ref["image_png"].tobytes())
    code, out, err = run_main(monkeypatch, capsys, "show", str(path), "--model", str(HERE / name),
                              "--texts", "a photo of the cat, the dog")
    assert code == 0, err
    s = model.similarity(str(path), ["a photo of the cat", "the dog"])
    for text, logit, p in zip(("a photo of the cat", "the dog"), s.logits_per_image[0], s.probs[0]):
        assert f"{text}" in out and f"{logit:.3f}" in out and f"{p:.3f}" in out
    assert ("softmax over the texts" if name == "clip" else "σ of each pair") in out
    assert ("where [CLS] looks" in out) == (name == "clip") and ("probe looks" in out) == (name == "siglip")


@pytest.mark.parametrize("args, message", [
    (["--texts", "a cat,,a dog"], "empty text"),
    (["--model", str(MODELS / "vit"), "--texts", "a cat"], "drop --texts"),
])
def test_qkv_show_texts_mistakes_are_one_line(args, message, monkeypatch, capsys, tmp_path):
    path = tmp_path / "image.png"
    path.write_bytes(ref_of("clip")["image_png"].tobytes())
    model = [] if "--model" in args else ["--model", str(HERE / "clip")]
    code, out, err = run_main(monkeypatch, capsys, "show", str(path), *model, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", PAIRS)
def test_other_commands_refuse_a_pair_in_one_line(name, monkeypatch, capsys, tmp_path):
    path = tmp_path / "image.png"
    path.write_bytes(ref_of(name)["image_png"].tobytes())
    code, out, err = run_main(monkeypatch, capsys, "patch", str(path), str(path), "--model", str(HERE / name))
    assert code == 2 and "is an image–text pair" in err and len(err.strip().splitlines()) == 1


def test_views_of_a_text_tower(monkeypatch, capsys, tmp_path):
    """A text tower is an encoder to the views: show (with the viewer and the pipeline page), heads, rollout and
    patching run on it (CLIP's attention causal)."""
    shutil.copytree(HERE / "clip_text", tmp_path / "t")
    shutil.copy(HERE / "clip" / "tokenizer.json", tmp_path / "t" / "tokenizer.json")
    for command in ("show", "heads", "rollout", "patch"):
        more = ["a photo of the dog"] if command == "patch" else []
        code, out, err = run_main(monkeypatch, capsys, command, "a photo of the cat", *more, "--model",
                                  str(tmp_path / "t"))
        assert code == 0, f"{command}: {err}"
    code, out, err = run_main(monkeypatch, capsys, "show", "a photo of the cat", "--model", str(tmp_path / "t"),
                              "--out", str(tmp_path / "o"))
    assert code == 0 and (tmp_path / "o" / "pipeline.html").is_file(), err
    trace = qkv.load(tmp_path / "t").run("a photo of the cat")
    a = trace.layer(0).attentions                                            # (H, n, n): causal
    assert np.allclose(np.triu(a, 1), 0) and np.allclose(a.sum(-1), 1)


def test_views_of_an_image_tower(monkeypatch, capsys, tmp_path):
    """CLIP's image tower draws as a ViT ([CLS]'s attention, --out); SigLIP's prints its probe's and refuses --out;
    activation patching runs on both towers alone (their rows' `patch`)."""
    path = tmp_path / "image.png"
    path.write_bytes(ref_of("clip")["image_png"].tobytes())
    code, out, err = run_main(monkeypatch, capsys, "show", str(path), "--model", str(HERE / "clip"),
                              "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert (tmp_path / "o" / "attention.html").is_file()
    code, out, err = run_main(monkeypatch, capsys, "show", str(path), "--model", str(HERE / "siglip"),
                              "--out", str(tmp_path / "s"))
    assert code == 2 and "no [CLS]" in err and not (tmp_path / "s").exists()
    other = tmp_path / "other.png"
    other.write_bytes(ref_of("siglip")["image_png"].tobytes())
    for name in IMAGES:
        code, out, err = run_main(monkeypatch, capsys, "patch", str(path), str(other), "--model", str(HERE / name))
        assert code == 0 and "largest effect" in out, err


def test_the_legacy_config_dicts_win(tmp_path):
    """CLIPConfig's text_config_dict / vision_config_dict are merged over text_config / vision_config."""
    path = edited(tmp_path, "clip", lambda hf: hf.update(text_config_dict={"hidden_act": "gelu"},
                                                         vision_config_dict={"layer_norm_eps": 1e-3}))
    model = qkv.load(path)
    assert model.text.config.activation == "gelu" and model.vision.config.norm_eps == 1e-3


def test_hooks_and_ablation_reach_the_embedding():
    """A tower is the engine's own pass: knocking out both heads of its last layer and zeroing that layer's heads by
    a hook give one embedding, another than the plain one."""
    vision, x = qkv.load(HERE / "siglip").vision, ref_of("siglip")["pixel_values"]
    plain = vision.pooled(x).embeds
    knocked = vision.ablate([(1, 0), (1, 1)]).pooled(x).embeds
    hooked = vision.with_hooks({"1.heads": lambda z, layer: z * 0}).pooled(x).embeds
    assert max_abs(knocked, plain) > 1e-3 and max_abs(knocked, hooked) <= 1e-6
