"""The tuned lens (qkv.analysis.tuned_lens, qkv.features.tuned_lens_train, `qkv tuned-lens`, `qkv lens --tuned`).

Checks: the identity translator (A = 0, b = 0) is the logit lens to the bit; the hand-written gradient of
KL(final ‖ lens_l) through W_vocab, the logits' soft cap and scale, unembed_in and the final norm equals central
finite differences (float64, 1e-6 relative) on families with each of those; training on a tiny fixture lowers the
held-out KL and ends with tuned ≤ logit at every layer; the files round-trip bit for bit under the tuned-lens
package's names (W = Aᵀ); a malformed directory is one QkvError line. The same gradient against torch autograd:
tests/live/test_live_tuned_lens.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.analysis import tuned_lens as tl
from qkv.analysis.lens import KEEP, logit_lens, residual_stream
from qkv.checkpoints.tensors import write_safetensors
from qkv.runtime.errors import QkvError

TEXT = "The cat sat on the mat, and then the dog"
WORDS = ("the cat sat on a mat and then it ran to the red house where a dog slept under old trees in the sun "
         "by a river near some hills").split()


def load64(family: str):
    return qkv.load(MODELS / family, dtype=np.float64)


def random_lens(model, scale: float = 0.05, seed: int = 0) -> tl.TunedLens:
    rng = np.random.default_rng(seed)
    lens = tl.identity_lens(model, np.float64)
    lens.A[:] = rng.normal(0, scale, lens.A.shape)
    lens.b[:] = rng.normal(0, scale, lens.b.shape)
    return lens


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "gemma2", "opt", "cohere", "phi"])
def test_identity_translator_is_the_logit_lens_exactly(family):
    model = load64(family)
    got = tl.tuned_lens(model, tl.identity_lens(model, np.float64), TEXT)
    assert np.array_equal(got, logit_lens(model, TEXT))


def test_the_viewers_tuned_section_of_the_identity_is_the_logit_lens():
    from qkv.analysis.sections import lens_payload

    model = load64("gpt2")
    trace = model.run(TEXT, keep=KEEP)
    section = lens_payload(model, trace, tuned=tl.identity_lens(model, np.float64))
    tuned = section.pop("tuned")
    assert tuned == section == lens_payload(model, trace)


def loss_at(model, lens, layer, x, log_p) -> float:
    """The plain form of the loss: the mean of kl_rows over the rows."""
    q = tl.log_softmax(tl.read(model, tl.translate(lens, layer, x)))
    return float(tl.kl_rows(log_p, q).mean())


# gemma2: the logits' soft cap; cohere: logit_scale; opt: unembed_in; phi: b_vocab; gpt2: LayerNorm; llama: RMSNorm
@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "gemma2", "opt", "cohere", "phi"])
def test_gradient_equals_finite_differences(family):
    model = load64(family)
    lens = random_lens(model)
    x = residual_stream(model, model.run(TEXT, keep=KEEP))                # (L+1, n, d)
    log_p = tl.log_softmax(tl.read(model, x[-1]))                          # (n, V)
    layer = model.config.n_layers - 1
    loss, dA, db = tl.layer_loss(model, lens, layer, x[layer], log_p)
    assert loss == pytest.approx(loss_at(model, lens, layer, x[layer], log_p), rel=1e-12)
    rng, eps = np.random.default_rng(1), 1e-5
    d = model.config.d_model
    for _ in range(6):
        for array, grad, at in ((lens.A, dA, tuple(rng.integers(0, d, 2))), (lens.b, db, (int(rng.integers(0, d)),))):
            where = (layer, *at)
            keep = array[where]
            array[where] = keep + eps
            up = loss_at(model, lens, layer, x[layer], log_p)
            array[where] = keep - eps
            down = loss_at(model, lens, layer, x[layer], log_p)
            array[where] = keep
            numeric = (up - down) / (2 * eps)
            assert grad[at] == pytest.approx(numeric, rel=1e-6, abs=1e-10), (family, where)


def write_corpus(path, lines: int = 700) -> None:
    rng = np.random.default_rng(0)
    path.write_text("\n".join(" ".join(rng.choice(WORDS, 30)) for _ in range(lines)) + "\n", encoding="utf-8")


def test_training_lowers_held_out_kl_below_the_logit_lens_at_every_layer(tmp_path):
    from qkv.features.corpora import open_texts
    from qkv.features.tuned_lens_train import LensSettings, held_out_kl, open_lens_run

    write_corpus(tmp_path / "c.txt")
    texts = open_texts(file=tmp_path / "c.txt")
    model = load64("gpt2")                    # held-out tuned/logit after 10 steps: 0.51 and 0.35 (measured)
    run = open_lens_run(tmp_path / "lens", LensSettings(steps=10, batch=128, context=32, lr=1e-2), model, texts)
    start = run.record["texts_read"]
    assert 0 < start < texts.count                                          # text left over for held-out
    before = held_out_kl(model, run.lens, texts, start, 512, 32)
    assert before["logit"] == before["tuned"]                               # A = 0, b = 0: the logit lens
    run.train()
    after = held_out_kl(model, run.lens, texts, start, 512, 32)
    assert after["logit"] == before["logit"] and after["tokens"] == 512
    assert all(t < 0.8 * g for t, g in zip(after["tuned"], after["logit"])), after
    saved = tl.load_tuned_lens(tmp_path / "lens")                           # the files the run wrote: its lens
    assert np.array_equal(saved.A, run.lens.A.astype(np.float32)) and saved.base_model == model.name


def test_a_run_continues_from_its_checkpoint(tmp_path):
    from qkv.features.corpora import open_texts
    from qkv.features.tuned_lens_train import LensSettings, open_lens_run

    write_corpus(tmp_path / "c.txt", 200)
    texts = open_texts(file=tmp_path / "c.txt")
    model = load64("gpt2")
    settings = LensSettings(steps=6, batch=64, context=32, checkpoint_every=3)
    whole = open_lens_run(tmp_path / "whole", settings, model, texts)
    whole.train()
    first = open_lens_run(tmp_path / "split", settings, model, texts)
    class Stop(Exception):
        pass

    def stop_at_3(step: int, kl: float) -> None:
        if step == 3:
            raise Stop                                                       # a run killed after step 3

    with pytest.raises(Stop):
        first.train(stop_at_3)
    assert first.step == 3
    again = open_lens_run(tmp_path / "split", settings, model, texts)
    assert again.resumed and again.step == 3
    again.train()
    assert np.array_equal(again.lens.A, whole.lens.A) and np.array_equal(again.lens.b, whole.lens.b)
    with pytest.raises(QkvError, match="another settings"):
        open_lens_run(tmp_path / "split", LensSettings(steps=7, batch=64, context=32, checkpoint_every=3), model, texts)


def test_layout_round_trip_bit_equal_under_the_packages_names(tmp_path):
    model = load64("llama_gqa")
    lens = random_lens(model)
    lens.A, lens.b = lens.A.astype(np.float32), lens.b.astype(np.float32)
    tl.save_tuned_lens(lens, tmp_path)
    back = tl.load_tuned_lens(tmp_path)
    assert np.array_equal(back.A, lens.A) and np.array_equal(back.b, lens.b) and back.A.dtype == np.float32
    config = json.loads((tmp_path / "config.json").read_text())
    # the fields of tuned_lens.nn.lenses.TunedLensConfig
    assert set(config) == {"base_model_name_or_path", "d_model", "num_hidden_layers", "bias", "base_model_revision",
                           "unembed_hash", "lens_type"}
    assert (config["d_model"], config["num_hidden_layers"], config["lens_type"]) == (64, 2, "linear_tuned_lens")
    from qkv.checkpoints.tensors import TensorStore

    store = TensorStore(tmp_path / "params.safetensors")
    assert sorted(store.names()) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    W = store.get("1.weight", (64, 64))                                    # torch's Linear: y = h·Wᵀ + b
    h = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    assert np.allclose(h + h @ W.T + store.get("1.bias", (64,)), tl.translate(lens, 1, h), atol=1e-6)


def one_line(directory) -> str:
    with pytest.raises(QkvError) as e:
        tl.load_tuned_lens(directory)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_malformed_files_are_refused_in_one_line(tmp_path):
    model = load64("llama_gqa")
    lens = random_lens(model)
    good = tmp_path / "good"
    tl.save_tuned_lens(lens, good)
    assert "not a directory" in one_line(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    assert "no config.json" in one_line(tmp_path / "empty")

    def variant(name: str, config: dict | None = None, tensors: dict | None = None, raw: bytes | None = None):
        d = tmp_path / name
        d.mkdir()
        cfg = json.loads((good / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
        if raw is not None:
            (d / "params.safetensors").write_bytes(raw)
        elif tensors is not None:
            with open(d / "params.safetensors", "wb") as f:
                write_safetensors(f, tensors)
        return d

    ok = {k: np.asarray(v, np.float32) for k, v in tl.tensors_of(lens).items()}
    assert "d_model" in one_line(variant("text", {"d_model": "64"}, ok))
    assert "lens_type" in one_line(variant("kind", {"lens_type": "something_else"}, ok))
    pickled = variant("pickled")
    (pickled / "params.pt").write_bytes(b"PK\x03\x04 not read")
    assert "pickle" in one_line(pickled)
    assert "has no 1.bias" in one_line(variant("missing", tensors={k: v for k, v in ok.items() if k != "1.bias"}))
    assert "2.weight" in one_line(variant("extra", tensors={**ok, "2.weight": ok["0.weight"]}))
    assert "shape" in one_line(variant("shape", tensors={**ok, "0.bias": ok["0.bias"][:10]}))
    bad = {**ok, "0.weight": ok["0.weight"].copy()}
    bad["0.weight"][3, 4] = np.nan
    assert "NaN" in one_line(variant("nan", tensors=bad))
    assert "layers" in one_line(variant("layers", {"num_hidden_layers": 3}, ok))
    raw = (good / "params.safetensors").read_bytes()
    assert "bad data_offsets" in one_line(variant("short", raw=raw[:-100]))
    assert "params.safetensors" in one_line(variant("header", raw=b"\xff" * 16))
    with pytest.raises(QkvError, match="trained for another model"):
        tl.tuned_lens(load64("gpt2"), tl.TunedLens(np.zeros((3, 64, 64)), np.zeros((3, 64))), TEXT)


def test_a_step_that_does_not_fit_in_memory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from qkv.features.corpora import open_texts
    from qkv.features.tuned_lens_train import LensSettings, open_lens_run
    from qkv.runtime import tuning

    write_corpus(tmp_path / "c.txt", 20)
    monkeypatch.setattr(tuning, "available_memory", lambda: 1 << 20)
    with pytest.raises(QkvError, match="needs about .* GiB.*smaller --batch"):
        open_lens_run(tmp_path / "lens", LensSettings(steps=1, batch=4096), load64("gpt2"),
                      open_texts(file=tmp_path / "c.txt"))
    assert not (tmp_path / "lens").exists()


def test_an_encoder_is_refused():
    with pytest.raises(QkvError, match="decoder"):
        tl.check_model(load64("roberta"))


def test_cli_train_eval_and_lens_tuned(tmp_path, monkeypatch, capsys):
    write_corpus(tmp_path / "c.txt", 300)
    out = tmp_path / "lens"
    code, stdout, err = run_main(monkeypatch, capsys, "tuned-lens", "train", "--model", str(MODELS / "llama_gqa"),
                                 "--file", str(tmp_path / "c.txt"), "--tokens", "256", "--batch", "64", "--context",
                                 "32", "--lr", "1e-2", "--out", str(out))
    assert code == 0, err
    assert (out / "config.json").is_file() and (out / "params.safetensors").is_file()
    code, stdout, err = run_main(monkeypatch, capsys, "tuned-lens", "train", "--model", str(MODELS / "llama_gqa"),
                                 "--file", str(tmp_path / "c.txt"), "--tokens", "256", "--batch", "64", "--context",
                                 "32", "--lr", "1e-2", "--out", str(out))
    assert code == 0 and "nothing to do" in stdout
    code, stdout, err = run_main(monkeypatch, capsys, "tuned-lens", "eval", "--model", str(MODELS / "llama_gqa"),
                                 "--lens", str(out), "--tokens", "256", "--json", str(tmp_path / "kl.json"),
                                 "--out", str(tmp_path / "fig"))
    assert code == 0, err
    assert (tmp_path / "fig" / "tuned_lens_kl.png").is_file() and (tmp_path / "fig" / "tuned_lens_kl.svg").is_file()
    report = json.loads((tmp_path / "kl.json").read_text())
    assert len(report["logit"]) == len(report["tuned"]) == 2 and report["tokens"] == 256
    assert report["from_text"] > 0                                          # after the texts training read
    for l in range(2):
        assert f"{report['logit'][l]:.4f}" in stdout.splitlines()[2 + l]
    code, stdout, err = run_main(monkeypatch, capsys, "lens", TEXT, "--model", str(MODELS / "llama_gqa"),
                                 "--tuned", str(out))
    assert code == 0, err
    assert "tuned lens" in stdout
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    code, _, err = run_main(monkeypatch, capsys, "tuned-lens", "train", "--model", str(MODELS / "llama_gqa"),
                            "--file", str(tmp_path / "c.txt"), "--tokens", "64", "--out", str(tmp_path / "other"))
    assert code == 2 and err.count("\n") == 1 and "holds other files" in err
    code, _, err = run_main(monkeypatch, capsys, "tuned-lens", "eval", "--model", str(MODELS / "gemma2"),
                            "--lens", str(out), "--file", str(tmp_path / "c.txt"))
    assert code == 2 and err.count("\n") == 1 and "trained for" in err
