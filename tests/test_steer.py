"""Steering with an SAE feature (`qkv.features.steer`, `qkv generate|chat --sae DIR --steer F:A`).

Every check is an identity that can fail:
  - the hook adds exactly Σ α_f·W_dec[f] at the SAE's layer and site: the recorded residual stream (or
    attention / FFN output) with the hook minus without it is that vector at every position, to float32
    rounding;
  - α = 0 changes no logit; a large α changes what greedy decoding writes;
  - generating with the KV cache gives the same tokens as without it (use_cache=False) under steering;
  - the commands write what model.generate with the same hooks writes, and refuse mistakes in one line.
The SAEs are made here (random unit decoder rows, as `init_sae` starts one) on the committed GPT-2 fixture.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.runtime.errors import QkvError
from qkv.features.sae import SAEConfig, init_sae
from qkv.features.saelens import load_saelens, save_saelens
from qkv.features.steer import parse_steer, steering_hooks, steering_vector

TEXT = "the cat sat on the mat and the dog ran to the park"
PROMPT = "the cat sat on"


def make_sae(directory, model, *, layer: int = 1, site: str = "resid", d_sae: int = 96, k: int = 6,
             name: str | None = None):
    """A TopK SAE of MODEL's width reading LAYER's SITE, initialised from that site's activations on TEXT,
    saved in SAELens's layout in DIRECTORY (cfg.json names NAME as its model) and loaded back."""
    keep = {"resid": "residual"}.get(site, site)
    x = getattr(model.run(TEXT, layers=[layer], keep=(keep,)).layer(layer), keep)          # (n, d_model)
    cfg = SAEConfig(d_in=model.config.d_model, d_sae=d_sae, k=k, model=name, layer=layer, site=site)
    save_saelens(init_sae(cfg, x, seed=3), directory)
    return load_saelens(directory)


@pytest.fixture(scope="module")
def gpt2():
    return qkv.load(MODELS / "gpt2")


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory, gpt2):
    directory = tmp_path_factory.mktemp("sae") / "gpt2-l1"
    make_sae(directory, gpt2, name=str(MODELS / "gpt2"))
    return directory


@pytest.mark.parametrize(("layer", "site", "point"), [(1, "resid", "residual"), (0, "attn_out", "attn_out"),
                                                      (1, "ffn_out", "ffn_out")])
def test_the_hook_adds_alpha_times_the_decoder_rows(gpt2, tmp_path, layer, site, point):
    sae = make_sae(tmp_path / site, gpt2, layer=layer, site=site)
    features = {5: 7.5, 40: -3.0}
    plain = getattr(gpt2.run(TEXT, layers=[layer], keep=(point,)).layer(layer), point)          # (n, d)
    hooked = getattr(gpt2.run(TEXT, layers=[layer], keep=(point,),
                              hooks=steering_hooks(sae, features)).layer(layer), point)         # (n, d)
    want = 7.5 * sae.W_dec[5].astype(np.float64) - 3.0 * sae.W_dec[40]                          # (d,)
    diff = hooked.astype(np.float64) - plain                                                     # (n, d)
    assert diff.shape == plain.shape and len(diff) > 5
    scale = np.abs(plain).max() + np.abs(want).max()
    assert np.abs(diff - want[None, :]).max() <= 2e-6 * scale, np.abs(diff - want).max()
    assert np.allclose(steering_vector(sae, features), want, atol=1e-6)
    if point == "residual":                                           # the stream after it moved too
        later = gpt2.run(TEXT, hooks=steering_hooks(sae, features)).logits
        assert np.abs(later - gpt2.run(TEXT).logits).max() > 1e-3


def test_alpha_zero_changes_nothing(gpt2, sae_dir):
    sae = load_saelens(sae_dir)
    plain = gpt2.run(TEXT).logits
    assert np.array_equal(gpt2.run(TEXT, hooks=steering_hooks(sae, {3: 0.0})).logits, plain)
    assert gpt2.generate(PROMPT, 8, temperature=0, hooks=steering_hooks(sae, {3: 0.0})) == \
        gpt2.generate(PROMPT, 8, temperature=0)


def test_generation_with_the_cache_equals_generation_without_it(gpt2, sae_dir):
    sae = load_saelens(sae_dir)
    hooks = steering_hooks(sae, {3: 40.0, 17: -20.0})
    ids, _ = gpt2.encode(PROMPT)
    cached = gpt2.generate(ids[None, :], 12, temperature=0, hooks=hooks)                        # (1, n + 12)
    whole = gpt2.generate(ids[None, :], 12, temperature=0, hooks=hooks, use_cache=False)
    assert np.array_equal(cached, whole)
    plain = gpt2.generate(ids[None, :], 12, temperature=0)
    assert not np.array_equal(cached, plain)                          # the steering is felt


def test_the_generate_command_steers_as_model_generate(monkeypatch, capsys, gpt2, sae_dir):
    sae = load_saelens(sae_dir)
    args = ["generate", PROMPT, "--model", str(MODELS / "gpt2"), "-t", "0", "-n", "8"]
    code, plain, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    code, out, err = run_main(monkeypatch, capsys, *args, "--sae", str(sae_dir), "--steer", "3:40,17:-20")
    assert code == 0, err
    want = gpt2.generate(PROMPT, 8, temperature=0, hooks=steering_hooks(sae, {3: 40.0, 17: -20.0}))
    assert out == PROMPT + want + "\n" and out != plain


def test_parse_steer():
    assert parse_steer("12:8") == {12: 8.0}
    assert parse_steer(" 12:8 , 40:-4.5,12:1") == {12: 9.0, 40: -4.5}
    for bad in ("12", "a:1", "12:x", "12:8,", ":3", "1:nan"):
        with pytest.raises(QkvError):
            parse_steer(bad)


def test_python_errors(gpt2, sae_dir):
    sae = load_saelens(sae_dir)
    with pytest.raises(QkvError, match="not one of the SAE's latents 0..95"):
        steering_hooks(sae, {96: 1.0})
    with pytest.raises(QkvError, match="no feature"):
        steering_hooks(sae, {})


@pytest.mark.parametrize(("args", "message"), [
    (["--steer", "3:8"], "give --sae SAE_DIR too"),
    (["--sae", "SAE"], "give --steer FEATURE:ALPHA too"),
    (["--sae", "SAE", "--steer", "3"], "is not FEATURE:ALPHA"),
    (["--sae", "SAE", "--steer", "3:8;4:1"], "is not FEATURE:ALPHA"),
    (["--sae", "SAE", "--steer", "96:8"], "not one of the SAE's latents 0..95"),
    (["--sae", "SAE", "--steer", "-1:8"], "not one of the SAE's latents 0..95"),
    (["--sae", "NARROW", "--steer", "3:8"], "reads 32-wide activations"),
    (["--sae", "no/such/sae", "--steer", "3:8"], "is not a directory"),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_commands_refuse_bad_steering_in_one_line(monkeypatch, capsys, tmp_path, sae_dir, args, message, command):
    narrow = tmp_path / "narrow"
    cfg = SAEConfig(d_in=32, d_sae=48, k=4, layer=1, site="resid")
    save_saelens(init_sae(cfg, np.random.default_rng(0).standard_normal((20, 32)).astype(np.float32)), narrow)
    args = [{"SAE": str(sae_dir), "NARROW": str(narrow)}.get(a, a) for a in args]
    code, out, err = run_main(monkeypatch, capsys, command, "hello", "--model", str(MODELS / "gpt2"), "-n", "2", *args)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_chat_command_steers_smollm2(monkeypatch, capsys, tmp_path):
    smol = qkv.load("smollm2")
    sae_dir = tmp_path / "smol"
    sae = make_sae(sae_dir, smol, layer=10, d_sae=64, k=4, name="smollm2")
    question = "What is the capital of France?"
    code, plain, err = run_main(monkeypatch, capsys, "chat", question, "-n", "6")
    assert code == 0, err
    code, zero, err = run_main(monkeypatch, capsys, "chat", question, "-n", "6", "--sae", str(sae_dir), "--steer", "3:0")
    assert code == 0 and zero == plain, err
    code, out, err = run_main(monkeypatch, capsys, "chat", question, "-n", "6", "--sae", str(sae_dir), "--steer", "3:300")
    assert code == 0, err
    want = smol.with_hooks(steering_hooks(sae, {3: 300.0})).chat(question, 6)
    assert out == want + "\n" and out != plain
