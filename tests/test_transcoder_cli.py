"""`qkv transcoders train|eval` on a tiny model: the files a run writes, the same command continuing it, eval's
report, and bad input as one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from conftest import MODELS, run_main

MODEL = str(MODELS / "llama_gqa")


@pytest.fixture()
def text(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(f"w{(i * 5 + j) % 37} and{j % 4}" for j in range(30 + i % 11))
                              for i in range(40)) + "\n", encoding="utf-8")
    return path


def train_args(text, out, *more):
    return ("transcoders", "train", "--model", MODEL, "--file", str(text), "--tokens", "480", "--latents", "32",
            "--k", "4", "--batch", "96", "--context", "32", "--checkpoint-every", "2", "--out", str(out), *more)


def test_train_then_eval(text, tmp_path, monkeypatch, capsys):
    out = tmp_path / "tc"
    code, stdout, err = run_main(monkeypatch, capsys, *train_args(text, out))
    assert code == 0, err
    assert "5 steps, 480 tokens" in stdout and "wrote 2 transcoders" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "layer_00", "layer_01", "log.jsonl", "qkv.json"]
    meta = json.loads((out / "qkv.json").read_text())
    assert meta["qkv"] == "transcoders" and meta["state"]["step"] == 5 and meta["final"]["tokens"] == 480
    assert json.loads((out / "layer_01" / "cfg.json").read_text())["hook_name_out"] == "blocks.1.hook_mlp_out"
    before = (out / "layer_00" / "sae_weights.safetensors").read_bytes()
    code, stdout, _ = run_main(monkeypatch, capsys, *train_args(text, out))          # again: already complete
    assert code == 0 and "5 steps" in stdout
    assert (out / "layer_00" / "sae_weights.safetensors").read_bytes() == before
    code, stdout, err = run_main(monkeypatch, capsys, "transcoders", "eval", "--transcoders", str(out), "--file",
                                 str(text), "--tokens", "200", "--context", "40", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["model"] and report["tokens"] == 5 * 39 and [e["layer"] for e in report["layers"]] == [0, 1]
    assert all(0 <= e["dead"] <= 1 and e["l0"] <= 4 for e in report["layers"])
    code, stdout, err = run_main(monkeypatch, capsys, "transcoders", "eval", "--transcoders", str(out / "layer_01"),
                                 "--model", MODEL, "--file", str(text), "--tokens", "100", "--layers", "1")
    assert code == 0, err
    assert "CE loss recovered" in stdout and "layer" in stdout


@pytest.mark.parametrize("args, words", [
    (("--k", "64"), "--k 64 is more than --latents 32"),
    (("--layers", "7"), "layer 7 is not in 0..1"),
    (("--steps", "3"), "give --steps or --tokens, not both"),
    (("--lr", "5"), "--lr 5 is more than 1"),
    (("--architecture", "relu"), "'relu' is not one of"),
    (("--latents", "100000000"), "GiB"),
    (("--threads", "99"), "--threads 99"),
])
def test_bad_train_input_is_one_line(text, tmp_path, monkeypatch, capsys, args, words):
    code, _, err = run_main(monkeypatch, capsys, *train_args(text, tmp_path / "x"), *args)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_other_settings_on_a_run_and_bad_eval_input_are_one_line(text, tmp_path, monkeypatch, capsys):
    out = tmp_path / "tc"
    assert run_main(monkeypatch, capsys, *train_args(text, out))[0] == 0
    code, _, err = run_main(monkeypatch, capsys, *train_args(text, out, "--lr", "0.001"))
    assert code == 2 and "--lr" in err and "another --out" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.txt").write_text("x")
    code, _, err = run_main(monkeypatch, capsys, *train_args(text, tmp_path / "junk"))
    assert code == 2 and "holds other files" in err
    code, _, err = run_main(monkeypatch, capsys, "transcoders", "eval", "--transcoders", str(tmp_path / "junk"),
                            "--file", str(text))
    assert code == 2 and "holds no dictionary" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(monkeypatch, capsys, "transcoders", "eval", "--transcoders", str(out), "--model",
                            str(MODELS / "gemma2"), "--file", str(text))               # d 32, not 64
    assert code == 2 and "64" in err and "32" in err and len(err.strip().splitlines()) == 1, err
