"""Transcoders (qkv.features.transcoder, transcoder_train, transcoder_eval): the hand-written TopK backward against
finite differences (against torch autograd: tests/live/test_live_transcoder.py), the numba kernels against their plain forms, training
on a tiny model lowering the loss, bit-for-bit resume after a kill, JumpReLU's threshold learning, the layer
directories read back, and CE recovered against a hand computation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MODELS
from qkv.features.sae import SAE, SAEConfig, topk
from qkv.features.transcoder import topk_loss_and_grads
from qkv.features.dictionaries import load_transcoders
from qkv.features.transcoder_eval import evaluate_transcoders
from qkv.features.transcoder_kernels import rows_dot, top_k_rows
from qkv.features.transcoder_settings import TranscoderSettings
from qkv.features.transcoder_train import LOG_FILE, Source, cut_windows, layer_dir, open_transcoder_run
from qkv.runtime.errors import QkvError

NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")


def transcoder(architecture="topk", d=8, n=32, k=4, skip=False, seed=0) -> SAE:
    rng = np.random.default_rng(seed)
    cfg = SAEConfig(d_in=d, d_sae=n, k=k if architecture == "topk" else None, apply_b_dec_to_input=False,
                    architecture=architecture, d_out=d, site_out="ffn_out", layer=0, site="ffn_in")
    params = {"W_enc": rng.standard_normal((d, n)), "b_enc": 0.1 * rng.standard_normal(n),
              "W_dec": rng.standard_normal((n, d)) / np.sqrt(d), "b_dec": 0.1 * rng.standard_normal(d)}
    if architecture == "jumprelu":
        params["threshold"] = rng.uniform(0.2, 1.0, n)
    if skip:
        params["W_skip"] = 0.1 * rng.standard_normal((d, d))
    return SAE(cfg, params)


def pair(B=16, d=8, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, d)), rng.standard_normal((B, d))


# ── the kernels, against their plain forms ──────────────────────────────────────

@pytest.mark.parametrize("B, n, k", [(64, 576, 4), (50, 1000, 7), (9, 40, 40), (30, 64, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_top_k_rows_keeps_what_the_plain_topk_keeps(B, n, k, dtype):
    """z from the kernel's (idx, values) is exactly sae.topk's (argpartition), k from 1 to n."""
    pre = np.random.default_rng(B + n).standard_normal((B, n)).astype(dtype)
    idx, vals = top_k_rows(pre, k)
    z = np.zeros_like(pre)
    np.put_along_axis(z, idx, np.maximum(vals, 0), axis=1)
    assert idx.shape == (B, k) and np.array_equal(z, topk(pre, k)[0])
    assert np.array_equal(np.take_along_axis(pre, idx, axis=1), vals)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-13)])
def test_rows_dot_equals_the_dense_product_at_the_kept_latents(dtype, tol):
    rng = np.random.default_rng(0)
    W, v = rng.standard_normal((50, 33)).astype(dtype), rng.standard_normal((20, 33)).astype(dtype)
    idx = rng.integers(0, 50, (20, 6))
    want = np.take_along_axis(v.astype(np.float64) @ W.T.astype(np.float64), idx, axis=1)
    assert np.abs(rows_dot(W, idx, v) - want).max() <= tol * np.abs(want).max()


# ── the backwards ───────────────────────────────────────────────────────────────

def test_the_topk_backward_equals_finite_differences():
    """Without torch: central differences of the loss (no AuxK; the kept set does not change for a step of 1e-6)."""
    sae = transcoder()
    x, y = pair()
    st = topk_loss_and_grads(sae.params, sae.config, x, y, variance=2.0)
    rng = np.random.default_rng(3)
    for name in NAMES:
        p = sae.params[name]
        for flat in rng.choice(p.size, 5, replace=False):
            at = np.unravel_index(flat, p.shape)
            old = p[at]
            p[at] = old + 1e-6
            up = topk_loss_and_grads(sae.params, sae.config, x, y, variance=2.0).loss
            p[at] = old - 1e-6
            down = topk_loss_and_grads(sae.params, sae.config, x, y, variance=2.0).loss
            p[at] = old
            assert abs((up - down) / 2e-6 - st.grads[name][at]) <= 1e-6 * max(1.0, abs(st.grads[name][at])), name


def test_the_losses_refuse_the_wrong_box():
    x, y = pair()
    with pytest.raises(QkvError, match="TopK"):
        topk_loss_and_grads(transcoder("jumprelu").params, transcoder("jumprelu").config, x, y)
    with pytest.raises(QkvError, match="takes x"):
        topk_loss_and_grads(transcoder().params, transcoder().config, x, y[:, :3])


# ── training on a tiny model ────────────────────────────────────────────────────

TEXTS = [" ".join(f"w{(i * 7 + j * 3) % 41} the{j % 5}" for j in range(40 + i % 17)) for i in range(60)]


@pytest.fixture(scope="module")
def llama():
    import qkv

    return qkv.load(MODELS / "llama_gqa")


def start(llama, out, sha="0" * 64, **kw):
    """A run on the fixture model over TEXTS (windows of 32, the first token skipped)."""
    settings = TranscoderSettings(**{"latents": 64, "k": 4, "steps": 12, "batch": 96, "lr": 3e-3,
                                     "checkpoint_every": 4, "context": 32, **kw})
    win = cut_windows(llama.tokenizer, TEXTS, settings.context, 1, settings.steps * settings.batch)
    layers = settings.layers or tuple(range(llama.config.n_layers))
    source = Source(model=str(MODELS / "llama_gqa"), corpus="texts", sha256=sha, layers=layers,
                    d=llama.config.d_model)
    return open_transcoder_run(out, settings, llama, source, win)


def params_of(run):
    return {(layer, k): v.copy() for layer in run.source.layers for k, v in run.trainers[layer].params.items()}


def test_training_lowers_the_loss_of_every_layer(llama, tmp_path):
    run = start(llama, tmp_path / "run", steps=40, checkpoint_every=40)
    run.train()
    fvu = np.array([e["layers"]["fvu"] for e in run.log])                 # (steps, layers)
    assert fvu.shape == (40, 2)
    assert (fvu[-10:].mean(axis=0) < 0.8 * fvu[:5].mean(axis=0)).all(), fvu[[0, -1]]
    assert all(3 <= e["l0"] <= 4 for e in run.log)          # k kept, ReLU may zero a few
    meta = json.loads((tmp_path / "run" / "qkv.json").read_text())
    assert meta["state"]["step"] == 40 and meta["layers"]["1"]["fvu"] == fvu[-1, 1]


def test_each_layer_trains_in_its_inputs_units_and_writes_the_models(llama, tmp_path):
    """y is trained as y / c, c = √v_y / s_x of step 0's batch (qkv.json's out_scale), the pre-activations start
    centred, and the transcoder written out predicts y itself: its FVU on (x, y) equals the training units' FVU on
    (x, y / c), and its decoder rows have norm c."""
    from qkv.features.sae import variance
    from qkv.features.transcoder_train import ffn_rows

    run = start(llama, tmp_path / "u", steps=3, checkpoint_every=3)
    x, y = ffn_rows(llama, [1], run.win, run.win.pieces(0, 96, 0))[1]
    c = float(np.sqrt(variance(y)) / np.sqrt(np.mean(np.sum(x.astype(np.float64) ** 2, axis=1))))
    t = run.trainers[1]
    assert t.out_scale == pytest.approx(c, rel=1e-12) and not 0.9 < c < 1.1            # the fixture's FFN: c ≠ 1
    pre = x @ t.sae.params["W_enc"] + t.sae.params["b_enc"]                            # (B, n) at step 0
    assert np.abs(pre.mean(axis=0)).max() < 1e-4 * np.abs(pre).max()
    run.train()
    meta = json.loads((tmp_path / "u" / "qkv.json").read_text())
    assert meta["layers"]["1"]["out_scale"] == t.out_scale
    mine, written = run.sae(1), load_transcoders(tmp_path / "u")[1]
    assert all(np.array_equal(written.params[k], mine.params[k]) for k in mine.params)
    assert np.allclose(np.linalg.norm(mine.params["W_dec"], axis=1), t.out_scale, rtol=1e-5)
    v = variance(y)
    model_units = topk_loss_and_grads(mine.params, mine.config, x, y, variance=v).fvu
    training_units = topk_loss_and_grads(t.sae.params, t.sae.config, x, (y / t.out_scale).astype(np.float32),
                                         variance=v / t.out_scale ** 2).fvu
    assert model_units == pytest.approx(training_units, rel=1e-5)


def test_a_run_written_before_out_scale_resumes_with_1(llama, tmp_path):
    """A qkv.json without out_scale (runs trained before it) reads as 1: such a run goes on as it began."""
    from qkv.features.transcoder_settings import read_run

    start(llama, tmp_path / "old", steps=4, checkpoint_every=2).train()
    path = tmp_path / "old" / "qkv.json"
    meta = json.loads(path.read_text())
    for one in meta["layers"].values():
        del one["out_scale"]
    path.write_text(json.dumps(meta))
    assert {one["out_scale"] for one in read_run(tmp_path / "old")["layers"].values()} == {1.0}
    again = start(llama, tmp_path / "old", steps=4, checkpoint_every=2)
    assert again.step == 4 and all(t.out_scale == 1.0 for t in again.trainers.values())
    assert all(again.sae(layer) is again.trainers[layer].sae for layer in again.source.layers)


class Killed(Exception):
    pass


def test_a_killed_run_resumes_bit_for_bit(llama, tmp_path):
    """Killed after step 6 (its newest checkpoint: step 4): started again, it ends with every array and every log
    line of a run never stopped."""
    whole = start(llama, tmp_path / "whole")
    whole.train()

    def kill(e):
        if e["step"] == 6:
            raise Killed

    cut = start(llama, tmp_path / "cut")
    with pytest.raises(Killed):
        cut.train(kill)
    again = start(llama, tmp_path / "cut")
    assert again.resumed_from.name == "step-00000004.npz" and again.step == 4
    again.train()
    a, b = params_of(whole), params_of(again)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    timing = ("seconds", "step_seconds", "pass_seconds", "cpu_seconds")
    strip = [{k: v for k, v in e.items() if k not in timing} for e in whole.log]
    assert strip == [{k: v for k, v in e.items() if k not in timing} for e in again.log]
    lines = (tmp_path / "cut" / LOG_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 13))
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == \
        ["step-00000008.npz", "step-00000012.npz"]


def test_a_resume_may_checkpoint_more_often(llama, tmp_path):
    """How often a run checkpoints changes no number: resumed with --checkpoint-every 3 it ends as a run never
    stopped, and the new interval is what qkv.json records."""
    whole = start(llama, tmp_path / "whole")
    whole.train()

    def kill(e):
        if e["step"] == 6:
            raise Killed

    with pytest.raises(Killed):
        start(llama, tmp_path / "cut").train(kill)
    again = start(llama, tmp_path / "cut", checkpoint_every=3)
    assert again.step == 4
    again.train()
    a, b = params_of(whole), params_of(again)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "cut" / "qkv.json").read_text())["settings"]["checkpoint_every"] == 3


def test_ctrl_c_finishes_the_step_then_saves_and_stops(llama, tmp_path):
    import os
    import signal

    from qkv.train.loop import Interrupted

    def press(e):
        if e["step"] == 5:
            os.kill(os.getpid(), signal.SIGINT)                          # noted; step 5 ends, is saved, the run stops

    with pytest.raises(Interrupted) as stopped:
        start(llama, tmp_path / "r").train(press)
    assert stopped.value.step == 5 and stopped.value.checkpoint.name == "step-00000005.npz"
    assert start(llama, tmp_path / "r").step == 5


def test_a_run_killed_before_its_first_checkpoint_starts_over(llama, tmp_path):
    def kill(e):
        raise Killed

    with pytest.raises(Killed):
        start(llama, tmp_path / "r").train(kill)
    run = start(llama, tmp_path / "r")
    assert run.step == 0 and run.resumed_from is None and run.log == []


def test_other_settings_are_refused_on_resume(llama, tmp_path):
    start(llama, tmp_path / "r", steps=4).train()
    with pytest.raises(QkvError, match="--latents 64, not 32"):
        start(llama, tmp_path / "r", steps=4, latents=32)
    with pytest.raises(QkvError, match="another corpus"):
        start(llama, tmp_path / "r", sha="1" * 64, steps=4)


def test_jumprelu_learns_its_thresholds(llama, tmp_path):
    """With a strong L0 penalty θ rises (AdamW on log θ) and L0 falls; the transcoder's threshold is exp(log θ)."""
    run = start(llama, tmp_path / "j", architecture="jumprelu", k=None, steps=30, l0_coef=0.02, bandwidth=0.05,
                threshold=0.01, checkpoint_every=30, layers=(1,))
    before = run.sae(1).params["threshold"].copy()
    run.train()
    after = run.sae(1).params["threshold"]
    assert np.log(after).mean() > np.log(before).mean() + 0.05
    assert run.log[-1]["l0"] < 0.5 * run.log[0]["l0"]
    assert np.array_equal(after, np.exp(run.trainers[1].params["log_threshold"]))


@pytest.mark.parametrize("kw", [{}, {"architecture": "jumprelu", "k": None, "skip": True}])
def test_the_layer_directories_read_back_equal(llama, tmp_path, kw):
    run = start(llama, tmp_path / "r", steps=4, **kw)
    run.train()
    got = load_transcoders(tmp_path / "r")
    assert list(got) == [0, 1] and (tmp_path / "r" / layer_dir(1) / "cfg.json").is_file()
    for layer, sae in got.items():
        mine = run.sae(layer)
        assert sae.config.architecture == mine.config.architecture and sae.config.k == mine.config.k
        assert (sae.config.layer, sae.config.site, sae.config.site_out) == (layer, "ffn_in", "ffn_out")
        assert set(sae.params) == set(mine.params)
        assert all(np.array_equal(sae.params[k], mine.params[k]) for k in mine.params)


# ── eval ────────────────────────────────────────────────────────────────────────

def test_ce_recovered_equals_a_hand_computation(llama, tmp_path):
    """Every number of evaluate_transcoders from plain full passes with hooks (model.forward), float32 ≤ 1e-5."""
    from qkv.features.evaluate import next_token_loss

    run = start(llama, tmp_path / "r", steps=8)
    run.train()
    tcs = {layer: run.sae(layer) for layer in (0, 1)}
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, llama.config.vocab_size, 10) for _ in range(5)] + [rng.integers(3, 100, 7)]
    ev = evaluate_transcoders(llama, tcs, seqs, batch_tokens=20)

    def ce(hooks_of):
        total = count = 0
        for s in seqs:
            ids = np.asarray(s)[None]
            seen = {}

            def keep(x, layer):
                seen[layer] = np.array(x)

            def swap(x, layer):
                out = np.array(x)
                out[:, 1:] = tcs[layer].forward(seen[layer][0, 1:].astype(np.float32))[0]
                return out

            def zero(x, layer):
                out = np.array(x)
                out[:, 1:] = 0
                return out

            spec = {}
            for layer, how in hooks_of.items():
                if how == "swap":
                    spec[f"{layer}.ffn_in"] = keep
                spec[f"{layer}.ffn_out"] = swap if how == "swap" else zero
            loss, n = next_token_loss(llama.forward(ids, attentions=False, hooks=spec).logits, ids)
            total, count = total + loss, count + n
        return total / count

    clean, rep0, zero0 = ce({}), ce({0: "swap"}), ce({0: "zero"})
    rep_all, zero_all = ce({0: "swap", 1: "swap"}), ce({0: "zero", 1: "zero"})
    assert ev.tokens == 5 * 9 + 6
    for got, want in ((ev.clean, clean), (ev.layers[0].replaced, rep0), (ev.layers[0].zero, zero0),
                      (ev.replaced_all, rep_all), (ev.zero_all, zero_all)):
        assert abs(got - want) <= 1e-5 * abs(want)
    assert abs(ev.recovered_all - (zero_all - rep_all) / (zero_all - clean)) <= 1e-4
    assert abs(ev.layers[0].recovered - (zero0 - rep0) / (zero0 - clean)) <= 1e-4
    x = np.concatenate([llama.run(list(s), layers=[1], keep=("ffn_in",)).layer(1).ffn_in[1:] for s in seqs])
    y = np.concatenate([llama.run(list(s), layers=[1], keep=("ffn_out",)).layer(1).ffn_out[1:] for s in seqs])
    r = y - tcs[1].forward(x.astype(np.float32))[0]
    fvu = (r.astype(np.float64) ** 2).sum() / ((y - y.mean(axis=0)).astype(np.float64) ** 2).sum()
    assert abs(ev.layers[1].fvu - fvu) <= 1e-4 * fvu
