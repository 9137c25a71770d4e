"""digits-vit, the ViT qkv ships (src/qkv/checkpoints/data/digits-vit, made by `qkv train --task digits`): it loads
by name, classifies the held-out digits as its README says, reads its example PNGs, and the training task runs,
resumes bit for bit and writes a model transformers' layout holds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import qkv
from qkv.checkpoints import digits_dir
from qkv.cli.app import cli
from qkv.train.digits import accuracy, digits, shifted, split
from conftest import check_training_resumes, run_main


@pytest.fixture(scope="module")
def model():
    return qkv.load("digits-vit")


def test_held_out_accuracy(model):
    """The README's figure: 97.5 % of the 359 held-out images (350), never trained on."""
    images, labels = digits()
    train, test = split()
    assert len(test) == 359 and not set(train) & set(test) and len(train) + len(test) == len(labels)
    acc, loss = accuracy(model, images[test], labels[test])
    assert round(acc * len(test)) == 350 and loss < 0.1


def test_example_digits_are_held_out_and_classified(model):
    images, labels = digits()
    test = split()[1]
    for d in range(10):
        pixels = np.asarray(Image.open(digits_dir() / f"digit-{d}.png"))
        assert pixels.shape == (8, 8) and pixels.dtype == np.uint8
        first = test[labels[test] == d][0]
        np.testing.assert_array_equal(pixels, images[first, ..., 0])     # the first held-out image of d
        assert model.classify(digits_dir() / f"digit-{d}.png", 1)[0][0] == str(d)


def test_a_big_photo_of_a_digit_is_resized(model, tmp_path):
    """A 64 × 64 drawing, dark ink on white (what a user gives), resized to 8 × 8 as the processor says."""
    big = np.asarray(Image.open(digits_dir() / "digit-7.png").resize((64, 64), Image.NEAREST))
    Image.fromarray(big).convert("RGB").save(tmp_path / "seven.png")
    trace = model.run(tmp_path / "seven.png")
    assert trace.image.shape == (8, 8, 1) and trace.grid == (4, 4) and len(trace.tokens) == 17
    assert model.labels[int(np.argmax(trace.logits[0]))] == "7"


def test_shifted_moves_images_and_fills_white():
    images = np.zeros((50, 8, 8, 1), np.uint8)
    out = shifted(images, np.random.default_rng(0))
    moved = (out == 255).reshape(50, -1).sum(axis=1)
    assert set(moved) <= {0, 8, 15} and (moved > 0).any()             # a row, a column, or both came in white


def test_listed_by_qkv_models():
    assert any(name == "digits-vit" and "bundled" in text for name, text in qkv.available())


def test_digits_run_trains_resumes_and_saves(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--task", "digits", "--out", str(out), "--layers", "1", "--heads", "2", "--d-model", "16",
            "--batch", "8", "--steps", "6", "--every", "3", "--checkpoint-every", "3"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "vit 1 layers × 2 heads, d_model 16" in r.output and "held-out accuracy" in r.output
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "accuracy" in e] == [0, 3, 6]
    for name in ("model/config.json", "model/model.safetensors", "model/preprocessor_config.json",
                 "examples/digit-0.png", "loss.png"):
        assert (out / name).is_file(), name
    check_training_resumes(args, out, at=3, later=6)
    trained = qkv.load(out / "model")
    assert trained.labels == [str(i) for i in range(10)] and trained.config.grid == (4, 4)


def test_digits_refuses_another_arch(tmp_path, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "train", "--task", "digits", "--arch", "gpt2", "--out",
                            str(tmp_path / "r"))
    assert code == 2 and "digits a vit" in err and len(err.strip().splitlines()) == 1
