"""The TopK SAE (qkv.features): forward, the hand-written backward against torch autograd (fixtures made by
tests/fixtures/make_sae_fixtures.py), the unit-norm decoder, training on a known sparse dictionary,
bit-for-bit resume, SAELens's file layout both ways, CE loss recovered, and `qkv sae train|eval`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES, MODELS, run_main
from qkv.runtime.errors import QkvError
from qkv.features.activations import write_activations
from qkv.features.evaluate import reconstruction, spliced_loss
from qkv.features.sae import (SAE, SAEConfig, geometric_median, init_sae, loss_and_grads, normalize_decoder,
                              project_decoder_grad, topk, variance)
from qkv.features.saelens import hook_name, load_saelens, save_saelens, site_of
from qkv.features.train import Settings, Trainer, open_run

GRADS = FIXTURES / "sae" / "grads.npz"
NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")


def random_sae(d=8, n=32, k=4, seed=0, **kw) -> SAE:
    rng = np.random.default_rng(seed)
    W_dec = rng.standard_normal((n, d)).astype(np.float32)
    normalize_decoder(W_dec)
    return SAE(SAEConfig(d, n, k, **kw), {"W_enc": W_dec.T + 0.1 * rng.standard_normal((d, n)).astype(np.float32),
                                          "b_enc": 0.1 * rng.standard_normal(n).astype(np.float32), "W_dec": W_dec,
                                          "b_dec": 0.1 * rng.standard_normal(d).astype(np.float32)})


# ── forward ──────────────────────────────────────────────────────────────────────

def test_forward_shapes_and_topk_keeps_the_k_largest_relud():
    sae = random_sae()
    x = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    x_hat, z = sae.forward(x)
    assert x_hat.shape == (50, 8) and z.shape == (50, 32)
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    order = np.argsort(-pre, axis=1)
    for row in range(50):
        kept = set(order[row, :4])
        assert set(np.flatnonzero(z[row])) == {j for j in kept if pre[row, j] > 0}       # ≤ k, all > 0
        assert np.array_equal(z[row, list(kept)], np.maximum(pre[row, list(kept)], 0))
    assert (z >= 0).all() and ((z > 0).sum(axis=1) <= 4).all()
    assert np.allclose(x_hat, z @ sae.W_dec + sae.b_dec, atol=1e-6)
    # without apply_b_dec_to_input the encoder reads x itself
    plain = SAE(SAEConfig(8, 32, 4, apply_b_dec_to_input=False), sae.params)
    assert np.array_equal(plain.encode(x), topk(x @ sae.W_enc + sae.b_enc, 4)[0])


def test_topk_among_allowed_latents_only():
    pre = np.array([[5.0, 4.0, 3.0, -1.0, 2.0]])
    allowed = np.array([False, True, False, True, True])
    z, idx = topk(pre, 2, allowed)
    assert sorted(idx[0]) == [1, 4] and np.array_equal(z, [[0, 4.0, 0, 0, 2.0]])
    z, _ = topk(pre, 3, allowed)                                          # the negative one is kept, ReLU'd to 0
    assert np.array_equal(z, [[0, 4.0, 0, 0, 2.0]])


# ── the backward, against torch autograd ────────────────────────────────────────

def fixture_cases():
    with np.load(GRADS) as z:
        arrays = {k: z[k] for k in z.files}
    cases, i = [], 0
    while f"{i}/x" in arrays:
        cases.append({k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}/")})
        i += 1
    return cases


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_the_backward_equals_torch_autograd(dtype, tol):
    """The loss (MSE + AuxK) and its gradient w.r.t. W_enc, b_enc, W_dec, b_dec equal torch autograd's
    (float64; measured ~3e-16 relative) on five cases: some, none and all latents dead, b_dec not applied to the
    input, k = d_sae, fewer dead latents than k_aux. float32 against the same float64 reference: 1e-5."""
    cases = fixture_cases()
    assert len(cases) == 5
    for c in cases:
        k, k_aux, apply_b = (int(v) for v in c["settings"])
        d, n = c["W_enc"].shape
        cfg = SAEConfig(d, n, k, apply_b_dec_to_input=bool(apply_b))
        params = {name: c[name].astype(dtype) for name in NAMES}
        st = loss_and_grads(params, cfg, c["x"].astype(dtype), variance=float(c["variance"]), dead=c["dead"],
                            k_aux=k_aux, aux_coef=float(c["aux_coef"]))
        assert abs(st.loss - float(c["loss"])) <= tol * abs(float(c["loss"]))
        for name in NAMES:
            ref = c[f"grad_{name}"]
            err = np.abs(st.grads[name].astype(np.float64) - ref).max() / np.abs(ref).max()
            assert err <= tol, (name, err)
        assert (st.aux > 0) == bool(c["dead"].any())


def test_a_wrong_backward_would_fail():
    """The fixture's gradients are not those of the MSE alone: dropping AuxK changes them."""
    c = fixture_cases()[0]
    cfg = SAEConfig(*c["W_enc"].shape, int(c["settings"][0]))
    st = loss_and_grads({n: c[n] for n in NAMES}, cfg, c["x"], variance=float(c["variance"]))
    assert np.abs(st.grads["W_enc"] - c["grad_W_enc"]).max() > 1e-3 * np.abs(c["grad_W_enc"]).max()


# ── the unit-norm decoder, the start ─────────────────────────────────────────────

def test_the_decoder_gradient_is_projected_and_rows_renormalised():
    sae = random_sae()
    g = np.random.default_rng(2).standard_normal(sae.W_dec.shape).astype(np.float32)
    project_decoder_grad(sae.W_dec, g)
    assert np.abs((g * sae.W_dec).sum(axis=1)).max() < 1e-5
    W = sae.W_dec * 3.0
    normalize_decoder(W)
    assert np.allclose(np.linalg.norm(W, axis=1), 1, atol=1e-6)
    trainer = Trainer(sae, Settings(latents=32, k=4, steps=5, lr=1e-2), variance=1.0)
    for s in range(5):
        trainer.step(np.random.default_rng(s).standard_normal((16, 8)).astype(np.float32))
    assert np.allclose(np.linalg.norm(sae.W_dec, axis=1), 1, atol=1e-6)


def test_init_is_tied_and_b_dec_is_the_geometric_median():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal((200, 4)), 50 + rng.standard_normal((20, 4))]).astype(np.float32)
    sae = init_sae(SAEConfig(4, 16, 2), x, seed=0)
    assert np.array_equal(sae.W_enc, sae.W_dec.T) and not sae.b_enc.any()
    assert np.allclose(np.linalg.norm(sae.W_dec, axis=1), 1, atol=1e-6)
    m = geometric_median(x)

    def cost(p):
        return np.linalg.norm(x - p, axis=1).sum()
    assert cost(m) <= cost(x.mean(axis=0))
    assert all(cost(m) <= cost(m + 0.01 * e) for e in np.eye(4)) and np.abs(m).max() < 1  # the outliers pull the mean
    assert np.allclose(sae.b_dec, m, atol=1e-5)


# ── training on a known dictionary ───────────────────────────────────────────────

def dictionary(n=64, d=32, seed=0) -> np.ndarray:
    D = np.random.default_rng(seed).standard_normal((n, d))
    return (D / np.linalg.norm(D, axis=1, keepdims=True)).astype(np.float32)       # (n, d) true features


def sparse_batch(D: np.ndarray, step: int, B: int, active: int = 3) -> np.ndarray:
    """B activations, each the sum of ACTIVE true features with coefficients in [0.5, 2], plus an offset."""
    rng = np.random.default_rng([1, step])
    n = D.shape[0]
    idx = np.argsort(rng.random((B, n)), axis=1)[:, :active]
    c = np.zeros((B, n), np.float32)
    np.put_along_axis(c, idx, rng.uniform(0.5, 2.0, (B, active)).astype(np.float32), axis=1)
    return c @ D + 0.1


def test_training_recovers_a_known_sparse_dictionary():
    """64 true features in d = 32, 3 active per sample; an SAE of 128 latents, k = 4, 300 steps of 256:
    FVU 0.06 and all 64 features found with cosine > 0.99 (median) when measured; asserted with margin."""
    D = dictionary()
    sample = np.concatenate([sparse_batch(D, 10**6 + i, 256) for i in range(8)])
    sae = init_sae(SAEConfig(32, 128, 4), sample, seed=0)
    trainer = Trainer(sae, Settings(latents=128, k=4, steps=300, batch=256, lr=3e-3), variance(sample))
    log = [trainer.step(sparse_batch(D, s, 256)) for s in range(300)]
    held_out = reconstruction(sae, [sparse_batch(D, 10**7 + i, 1024) for i in range(4)])
    assert held_out.fvu < 0.12 and np.mean([e["fvu"] for e in log[-20:]]) < 0.12
    assert log[0]["fvu"] > 0.3                                            # it did learn
    assert held_out.l0 <= 4
    best = (D @ sae.W_dec.T).max(axis=1)                                  # each true feature's closest latent
    assert (best > 0.9).mean() >= 0.9


# ── runs in a directory: bit-for-bit resume ─────────────────────────────────────

@pytest.fixture
def store(tmp_path):
    D = dictionary(n=48, d=16)
    x = np.concatenate([sparse_batch(D[:, :16], 10**5 + i, 1000) for i in range(6)])
    return write_activations(tmp_path / "acts", x, model="synthetic", layer=2, site="resid", shard_tokens=1500)


def open_store_run(out, acts, **kw):
    from qkv.features.train import SAMPLE, store_batches

    s = Settings(**{"latents": 32, "k": 3, "steps": 40, "batch": 128, "lr": 3e-3, "checkpoint_every": 10, **kw})
    return open_run(out, s, d_in=acts.d, batches=store_batches(acts, s.batch, s.seed, s.steps),
                    sample=lambda: acts.sample(min(SAMPLE, acts.tokens), seed=s.seed),
                    source={"model": acts.model, "layer": acts.layer, "site": acts.site})


def test_a_resumed_run_ends_bit_for_bit_equal(store, tmp_path):
    """60 steps at once, against a run stopped at step 45 (its last checkpoint at 40, as after kill -9) and
    started again: the same parameters, AdamW moments and dead-latent counts, bit for bit. The store holds
    46 batches of 128, so the resumed part crosses into the second pass over it. The resume checkpoints every 5
    steps, not 10: how often changes no number."""
    whole = open_store_run(tmp_path / "whole", store, steps=60)
    whole.train()

    class Killed(Exception):
        pass

    def kill_at_45(e):
        if e["step"] == 45:
            raise Killed

    broken = open_store_run(tmp_path / "broken", store, steps=60)
    with pytest.raises(Killed):
        broken.train(kill_at_45)
    again = open_store_run(tmp_path / "broken", store, steps=60, checkpoint_every=5)
    assert again.resumed_from is not None and again.trainer.step_count == 40
    again.train()
    a, b = whole.trainer.arrays(), again.trainer.arrays()
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert [e["fvu"] for e in whole.log] == [e["fvu"] for e in again.log]


def test_a_run_killed_before_its_first_checkpoint_starts_over(store, tmp_path):
    class Killed(Exception):
        pass

    def kill_at_5(e):
        if e["step"] == 5:
            raise Killed

    with pytest.raises(Killed):
        open_store_run(tmp_path / "r", store, steps=12).train(kill_at_5)
    (tmp_path / "r" / "checkpoints").mkdir(exist_ok=True)
    (tmp_path / "r" / "checkpoints" / "step-00000010.npz").write_bytes(b"torn")      # unreadable
    again = open_store_run(tmp_path / "r", store, steps=12)
    assert again.resumed_from is None and again.trainer.step_count == 0
    again.train()
    whole = open_store_run(tmp_path / "whole", store, steps=12)
    whole.train()
    assert all(np.array_equal(v, again.trainer.arrays()[k]) for k, v in whole.trainer.arrays().items())


def test_a_run_with_other_settings_is_refused(store, tmp_path):
    open_store_run(tmp_path / "r", store, steps=10).train()
    with pytest.raises(QkvError, match="--k 3, not 4"):
        open_store_run(tmp_path / "r", store, steps=10, k=4)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(QkvError, match="holds other files"):
        open_store_run(tmp_path / "other", store)


# ── SAELens's layout ─────────────────────────────────────────────────────────────

def test_a_saved_sae_reloads_equal_and_the_files_are_saelens(tmp_path):
    from safetensors.numpy import load_file

    sae = random_sae(d=8, n=32, k=4)
    sae.config.model, sae.config.layer, sae.config.site = "smollm2", 15, "resid"
    save_saelens(sae, tmp_path / "s", context_size=128, dataset_path="shakespeare")
    back = load_saelens(tmp_path / "s")
    assert back.config == sae.config
    for name in NAMES:
        assert np.array_equal(back.params[name], sae.params[name])
    stored = load_file(str(tmp_path / "s" / "sae_weights.safetensors"))     # the safetensors library reads it
    assert sorted(stored) == sorted(NAMES)
    assert stored["W_enc"].shape == (8, 32) and stored["W_dec"].shape == (32, 8)   # SAELens: (d_in, d_sae), (d_sae, d_in)
    for name in NAMES:
        assert stored[name].dtype == np.float32 and np.array_equal(stored[name], sae.params[name])
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["activation_fn_str"] == "topk"
    assert cfg["activation_fn_kwargs"] == {"k": 4}
    assert (cfg["d_in"], cfg["d_sae"], cfg["hook_name"], cfg["hook_layer"]) == (8, 32, "blocks.15.hook_resid_pre", 15)
    assert (cfg["model_name"], cfg["dtype"], cfg["apply_b_dec_to_input"], cfg["normalize_activations"]) == \
        ("smollm2", "float32", True, "none")
    assert (cfg["context_size"], cfg["dataset_path"]) == (128, "shakespeare")
    # every field SAELens 5's SAEConfig requires (its from_dict has no defaults for these)
    assert {"finetuning_scaling_factor", "hook_head_index", "prepend_bos", "dataset_trust_remote_code",
            "sae_lens_training_version", "device"} <= cfg.keys()


def test_a_hand_written_saelens_6_directory_loads(tmp_path):
    """SAELens 6's cfg.json (k at the top, names under metadata), a decoder not yet unit-norm with
    rescale_acts_by_decoder_norm, hook_resid_post: qkv's forward equals SAELens's formulas computed here."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    d, n, k = 6, 20, 3
    W_enc, b_enc = rng.standard_normal((d, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    W_dec, b_dec = (rng.standard_normal((n, d)) * 2).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    out = tmp_path / "community"
    out.mkdir()
    save_file({"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}, str(out / "sae_weights.safetensors"))
    (out / "cfg.json").write_text(json.dumps({
        "architecture": "topk", "d_in": d, "d_sae": n, "k": k, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": True, "normalize_activations": "none", "reshape_activations": "none",
        "rescale_acts_by_decoder_norm": True,
        "metadata": {"sae_lens_version": "6.18.0", "model_name": "SmolLM2-135M", "hook_name": "blocks.3.hook_resid_post"}}))
    sae = load_saelens(out)
    assert (sae.config.model, sae.config.layer, sae.config.site, sae.config.k) == ("SmolLM2-135M", 4, "resid", 3)
    assert np.allclose(np.linalg.norm(sae.W_dec, axis=1), 1, atol=1e-6)
    x = rng.standard_normal((30, d)).astype(np.float32)
    norms = np.linalg.norm(W_dec, axis=1)                                 # SAELens's TopKSAE.encode / decode:
    pre = ((x - b_dec) @ W_enc + b_enc) * norms                           # hidden_pre · ‖W_dec‖
    z = topk(pre, k)[0]
    ref = (z / norms) @ W_dec + b_dec                                     # (acts / ‖W_dec‖) @ W_dec + b_dec
    assert np.abs(sae.forward(x)[0] - ref).max() < 1e-4


def test_the_layout_of_saelens_5_with_older_names_loads(tmp_path):
    sae = random_sae(d=4, n=8, k=2)
    save_saelens(sae, tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    for old, new in (("activation_fn_str", "activation_fn"), ("hook_name", "hook_point")):
        cfg[new] = cfg.pop(old)
    cfg["hook_point"] = "blocks.2.hook_mlp_out"
    del cfg["architecture"]
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    back = load_saelens(tmp_path / "s")
    assert (back.config.k, back.config.layer, back.config.site) == (2, 2, "ffn_out")


def test_bad_saelens_directories_say_what_is_wrong(tmp_path):
    sae = random_sae(d=4, n=8, k=2)
    save_saelens(sae, tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    (tmp_path / "s" / "cfg.json").write_text(json.dumps({**cfg, "architecture": "gated", "activation_fn_str": "relu"}))
    with pytest.raises(QkvError, match="'gated' dictionary, which qkv does not read"):
        load_saelens(tmp_path / "s")
    (tmp_path / "s" / "cfg.json").write_text(json.dumps({**cfg, "d_sae": 9}))
    with pytest.raises(QkvError, match="shape"):
        load_saelens(tmp_path / "s")
    with pytest.raises(QkvError, match="no cfg.json"):
        load_saelens(tmp_path)


def test_hook_names_and_sites():
    assert hook_name(15, "resid") == "blocks.15.hook_resid_pre" and site_of("blocks.15.hook_resid_pre") == (15, "resid")
    assert site_of("blocks.14.hook_resid_post") == (15, "resid")
    assert site_of(hook_name(3, "attn_out")) == (3, "attn_out") and site_of(hook_name(3, "ffn_out")) == (3, "ffn_out")
    assert site_of("blocks.3.attn.hook_z") == (None, None)


# ── CE loss recovered ────────────────────────────────────────────────────────────

def identity_sae(d: int, layer: int, site: str, model: str | None = None) -> SAE:
    """latents = k = d, W_enc = W_dec = I, b_dec = −M, so z = x + M > 0 and x̂ = x (up to rounding)."""
    M = 100.0
    eye = np.eye(d, dtype=np.float32)
    return SAE(SAEConfig(d, d, d, model=model, layer=layer, site=site),
               {"W_enc": eye.copy(), "b_enc": np.zeros(d, np.float32), "W_dec": eye.copy(),
                "b_dec": np.full(d, -M, np.float32)})


@pytest.fixture(scope="module")
def gpt2():
    import qkv

    return qkv.load(str(MODELS / "gpt2"))


def sequences(model, count=3, n=12):
    rng = np.random.default_rng(7)
    return [rng.integers(0, model.config.vocab_size, n) for _ in range(count)]


@pytest.mark.parametrize("site", ["resid", "attn_out", "ffn_out"])
def test_an_identity_sae_recovers_all_of_the_loss_and_a_zero_sae_none(gpt2, site):
    d = gpt2.config.d_model
    sp = spliced_loss(gpt2, identity_sae(d, 1, site), sequences(gpt2), layer=1, site=site)
    assert sp.zero != sp.clean and abs(sp.sae - sp.clean) < 1e-4
    assert abs(sp.recovered - 1) < 1e-3 and abs(sp.recovered_vs_mean - 1) < 1e-3
    assert sp.reconstruction.fvu < 1e-8 and sp.reconstruction.l0 == d
    zero = SAE(SAEConfig(d, 8, 2, layer=1, site=site),
               {"W_enc": np.ones((d, 8), np.float32), "b_enc": np.zeros(8, np.float32),
                "W_dec": np.zeros((8, d), np.float32), "b_dec": np.zeros(d, np.float32)})
    sp0 = spliced_loss(gpt2, zero, sequences(gpt2), layer=1, site=site)
    assert sp0.sae == sp0.zero and sp0.recovered == 0.0
    assert sp0.clean == sp.clean and sp0.zero == sp.zero and sp0.mean == sp.mean


def test_the_clean_loss_is_the_models_and_the_hook_splices_where_the_store_reads(gpt2):
    """CE clean equals the loss computed from the model's own logits; zeroing the residual stream entering
    block 0 from position 1 on equals running the model on embeddings zeroed there."""
    from qkv.features.evaluate import next_token_loss

    seqs = sequences(gpt2, count=2)
    sp = spliced_loss(gpt2, identity_sae(gpt2.config.d_model, 0, "resid"), seqs, layer=0, site="resid")
    total = sum(next_token_loss(gpt2.forward(s[None], attentions=False).logits, s[None])[0] for s in seqs)
    assert abs(sp.clean - total / sp.tokens) < 1e-9
    assert sp.tokens == sum(len(s) - 1 for s in seqs)


# ── the command line ─────────────────────────────────────────────────────────────

def test_qkv_sae_train_and_eval(store, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sae"
    args = ("sae", "train", "--acts", str(store.path), "--latents", "32", "--k", "3", "--batch", "128",
            "--steps", "30", "--lr", "3e-3", "--checkpoint-every", "10", "--out", str(out))
    code, stdout, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "FVU" in stdout and "L0" in stdout and "dead" in stdout
    assert {"cfg.json", "sae_weights.safetensors", "qkv.json", "log.jsonl", "checkpoints"} <= {p.name for p in out.iterdir()}
    meta = json.loads((out / "qkv.json").read_text())
    assert meta["final"]["steps"] == 30 and meta["source"]["layer"] == 2
    code, stdout, err = run_main(monkeypatch, capsys, *args[:-2], "--out", str(out))      # again: complete, same files
    assert code == 0, err
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(out), "--acts", str(store.path), "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["acts"]["fvu"] < 0.5 and report["acts"]["l0"] <= 3 and report["latents"] == 32
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(out), "--acts", str(store.path))
    assert code == 0 and "FVU" in stdout and "dead latents" in stdout


def test_qkv_sae_eval_splices_into_a_model(tmp_path, monkeypatch, capsys, gpt2):
    sae = identity_sae(gpt2.config.d_model, 1, "resid", model=str(MODELS / "gpt2"))
    save_saelens(sae, tmp_path / "id")
    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat and looked at the dog.\nA second line of text, for more tokens.\n")
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(tmp_path / "id"), "--file", str(text),
                                 "--tokens", "40", "--context", "16", "--json")
    assert code == 0, err
    ce = json.loads(stdout)["ce"]
    assert abs(ce["recovered"] - 1) < 1e-3 and ce["zero"] > ce["clean"]
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(tmp_path / "id"), "--file", str(text),
                                 "--from-text", "1", "--json")                   # the second line only
    assert code == 0, err
    assert json.loads(stdout)["ce"]["tokens"] < ce["tokens"]
    code, _, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(tmp_path / "id"), "--file", str(text),
                            "--from-text", "2")
    assert code == 2 and "holds 2 texts" in err


@pytest.mark.parametrize("args, message", [
    (("--acts", "{missing}", "--latents", "8", "--k", "2"), "is not a directory"),
    (("--acts", "{acts}", "--latents", "8", "--k", "20"), "--k 20 is more than --latents 8"),
    (("--acts", "{acts}", "--latents", "8"), "give --k"),
    (("--acts", "{acts}", "--latents", "8", "--k", "2", "--steps", "3", "--tokens", "100"), "not both"),
    (("--acts", "{acts}", "--latents", "8", "--k", "2", "--batch", "100000"), "--batch 100000 is more than"),
])
def test_qkv_sae_train_refuses_bad_input_in_one_line(store, tmp_path, monkeypatch, capsys, args, message):
    args = [a.format(missing=tmp_path / "nope", acts=store.path) for a in args]
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "train", *args, "--out", str(tmp_path / "out"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_store_of_another_width_is_refused(store, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sae"
    common = ("--latents", "16", "--k", "2", "--batch", "128", "--steps", "2")
    assert run_main(monkeypatch, capsys, "sae", "train", "--acts", str(store.path), *common, "--out", str(out))[0] == 0
    wide = write_activations(tmp_path / "wide", np.ones((500, 24), np.float32) * np.arange(24), model="m",
                             layer=0, site="resid")
    code, _, err = run_main(monkeypatch, capsys, "sae", "train", "--acts", str(wide.path), *common, "--out", str(out))
    assert code == 2 and "width 16" in err and "24" in err
    code, _, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(out), "--acts", str(wide.path))
    assert code == 2 and "24-wide" in err


# ── damaged SAE files and bad flags: one line, exit 2 ────────────────────────────

def saved_sae(tmp_path, name="s", d=16, n=32, k=3) -> "Path":
    sae = random_sae(d=d, n=n, k=k)
    sae.config.model, sae.config.layer, sae.config.site = "synthetic", 2, "resid"
    return save_saelens(sae, tmp_path / name)


def one_line(code, err, *words):
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)


DEEP = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("change, words", [
    ("deep", ("cfg.json", "nested too deeply")),                       # was a RecursionError
    ({"hook_name": 5}, ("cfg.json", "hook_name must be text")),       # was a TypeError
    ({"d_in": 64.7}, ("cfg.json", "d_in must be a whole number", "64.7")),   # was truncated to 64
    ({"d_sae": None}, ("cfg.json", "has no d_sae")),
    ({"activation_fn_kwargs": {"k": "3"}}, ("k must be a whole number", "'3'")),   # was read as 3
    ({"activation_fn_kwargs": {"k": 33}}, ("k must be a whole number from 1 to 32",)),
    ({"metadata": [1]}, ("metadata must be an object",)),           # was ignored
    ({"model_name": 5}, ("model_name must be text",)),               # was reported as the model 5
    ({"apply_b_dec_to_input": "no"}, ("apply_b_dec_to_input must be true or false",)),   # was read as true
])
def test_a_damaged_cfg_json_is_one_line(store, tmp_path, monkeypatch, capsys, change, words):
    out = saved_sae(tmp_path)
    cfg = json.loads((out / "cfg.json").read_text())
    text = DEEP if change == "deep" else json.dumps({k: v for k, v in {**cfg, **change}.items() if v is not None})
    (out / "cfg.json").write_text(text)
    code, _, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(out), "--acts", str(store.path))
    one_line(code, err, *words)


@pytest.mark.parametrize("damage, words", [
    ("shape", ("sae_weights.safetensors", "W_enc has shape (16, 32)", "cfg.json (d_in 24")),
    ("nan", ("sae_weights.safetensors", "NaN")),
    ("int", ("sae_weights.safetensors", "must be floats")),
    ("pickle", ("sae_weights.pt is a pickle",)),
])
def test_damaged_sae_weights_are_one_line_naming_the_file(store, tmp_path, monkeypatch, capsys, damage, words):
    from safetensors.numpy import load_file, save_file

    out = saved_sae(tmp_path)
    weights = out / "sae_weights.safetensors"
    tensors = load_file(str(weights))
    if damage == "shape":                                                 # cfg.json says another width
        cfg = json.loads((out / "cfg.json").read_text())
        (out / "cfg.json").write_text(json.dumps({**cfg, "d_in": 24}))
    elif damage == "nan":
        tensors["W_dec"][3, 1] = np.nan
        save_file(tensors, str(weights))
    elif damage == "int":
        save_file({**tensors, "b_enc": tensors["b_enc"].astype(np.int32)}, str(weights))
    else:
        weights.rename(out / "sae_weights.pt")
    code, _, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(out), "--acts", str(store.path))
    one_line(code, err, *words)


@pytest.mark.parametrize("change, words", [
    ("deep", ("qkv.json", "nested too deeply")),                     # was a RecursionError
    ({"variance": -1}, ("qkv.json", "variance must be a number")),   # was trained with it
    ({"settings": {"k": "3"}}, ("qkv.json: settings: k must be a whole number",)),
    ({"source": {"d": 16.5}}, ("qkv.json: source: d must be a whole number",)),
])
def test_a_damaged_run_file_is_one_line(store, tmp_path, monkeypatch, capsys, change, words):
    out = tmp_path / "sae"
    args = ("sae", "train", "--acts", str(store.path), "--latents", "32", "--k", "3", "--batch", "128",
            "--steps", "4", "--out", str(out))
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    meta = json.loads((out / "qkv.json").read_text())
    if change != "deep":
        for key, value in change.items():
            meta[key] = {**meta[key], **value} if isinstance(value, dict) else value
    (out / "qkv.json").write_text(DEEP if change == "deep" else json.dumps(meta))
    code, _, err = run_main(monkeypatch, capsys, *args[:-4], "--steps", "8", "--out", str(out))
    one_line(code, err, *words)


def test_a_damaged_checkpoint_or_log_line_is_passed_over(store, tmp_path):
    """The newest checkpoint holding NaN weights is passed over (named in run.skipped), the one before it
    resumed; a log line nested 3000 deep or not UTF-8 is dropped, not a RecursionError."""
    open_store_run(tmp_path / "r", store, steps=20).train()
    newest = tmp_path / "r" / "checkpoints" / "step-00000020.npz"
    with np.load(newest) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["param/W_enc"][0, 0] = np.nan
    np.savez(newest, **arrays)
    with open(tmp_path / "r" / "log.jsonl", "ab") as f:
        f.write(b'{"step": ' + b"[" * 3000 + b"\n\xff\xfe\n")
    again = open_store_run(tmp_path / "r", store, steps=20)
    assert again.resumed_from.name == "step-00000010.npz" and again.trainer.step_count == 10
    assert len(again.skipped) == 1 and "param/W_enc holds NaN" in again.skipped[0]
    assert [e["step"] for e in again.log] == list(range(1, 11))
    again.train()
    assert np.isfinite(again.sae.W_enc).all()


@pytest.mark.parametrize("args, words", [
    (("--batch", "0"), ("--batch must be a whole number from 1",)),              # was a ZeroDivisionError
    (("--aux-coef", "1e300"), ("--aux-coef must be a number from 0 to 10",)),    # was 'lower --lr' at best
    (("--lr", "2"), ("--lr 2 is more than 1",)),
    (("--latents", "1000000000"), ("--latents must be a whole number from 1 to",)),
    (("--steps", "1000000000"), ("--steps must be a whole number from 1 to 100,000,000",)),   # was a run of 10^9 steps
    (("--threads", "THREADS"), ("--threads", "core")),                           # was accepted
])
def test_qkv_sae_train_bounds_every_size(store, tmp_path, monkeypatch, capsys, args, words):
    from qkv.runtime.threads import cores

    args = [str(cores() + 1) if a == "THREADS" else a for a in args]
    code, _, err = run_main(monkeypatch, capsys, "sae", "train", "--acts", str(store.path), "--latents", "32",
                            "--k", "3", "--batch", "128", "--steps", "2", *args, "--out", str(tmp_path / "o"))
    one_line(code, err, *words)
    assert not (tmp_path / "o").exists()


def test_qkv_sae_train_refuses_a_run_larger_than_the_memory(store, tmp_path, monkeypatch, capsys):
    """20 000 latents × d 16 at --batch 128 need ~130 MB (`Settings.memory`); with 64 MB available: refused
    before anything is allocated or written, naming the sizes that fit."""
    import qkv.runtime.tuning as tuning

    monkeypatch.setattr(tuning, "available_memory", lambda: 64 << 20)
    code, _, err = run_main(monkeypatch, capsys, "sae", "train", "--acts", str(store.path), "--latents", "20000",
                            "--k", "3", "--batch", "128", "--steps", "1", "--out", str(tmp_path / "o"))
    one_line(code, err, "20,000 latents", "GiB", "give fewer --latents")
    assert not (tmp_path / "o").exists()


def test_the_memory_estimate_bounds_a_real_run():
    """Settings.memory against tracemalloc's peak of a trainer (SAE, AdamW) taking AuxK steps and copying
    its arrays for a checkpoint: never less, at most twice as much (measured 1.05–1.4× over three sizes)."""
    import tracemalloc

    d, n, B = 32, 8192, 256
    x = np.random.default_rng(0).standard_normal((B, d)).astype(np.float32)
    s = Settings(latents=n, k=16, steps=4, batch=B, dead_tokens=1)         # every latent dead after one step: AuxK
    tracemalloc.start()
    try:
        trainer = Trainer(init_sae(SAEConfig(d, n, 16), x, median=False), s, variance=1.0)
        for _ in range(3):
            trainer.step(x)
        trainer.arrays()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = s.memory(d) - 16 * 32768 * d                                 # the sample is not part of this run
    assert peak <= estimate <= 2 * peak, (peak, estimate)


def test_the_worker_and_thread_flags_share_one_check(monkeypatch):
    from qkv.runtime import threads

    monkeypatch.setattr(threads, "cores", lambda: 2)
    assert threads.check_count("--workers", 2) == 2 and threads.check_count("--workers", None) is None
    with pytest.raises(QkvError, match="--workers 12: this machine has 2 cores; give --workers from 1 to 2"):
        threads.check_count("--workers", 12)
    assert threads.check_count("--workers", 12, here=False) == 12          # a Ray cluster elsewhere
    with pytest.raises(QkvError, match="--threads 0"):
        threads.check_count("--threads", 0)


def test_nan_activations_are_named_not_variance_0(tmp_path, monkeypatch, capsys):
    x = np.random.default_rng(0).standard_normal((600, 8)).astype(np.float32)
    acts = write_activations(tmp_path / "acts", x, model="m", layer=0, site="resid")
    shard = np.load(acts.shards[0][0])
    shard[5, 3] = np.nan
    np.save(acts.shards[0][0], shard)
    code, _, err = run_main(monkeypatch, capsys, "sae", "train", "--acts", str(acts.path), "--latents", "16",
                            "--k", "2", "--batch", "64", "--steps", "2", "--out", str(tmp_path / "o"))
    one_line(code, err, "NaN")
    assert "variance 0" not in err


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_non_finite_loss_names_its_term(monkeypatch):
    """An AuxK term that overflows says --aux-coef, a reconstruction error at the first step says the
    activations are too large: not 'lower --lr' for both."""
    import qkv.features.train as train

    sae = random_sae()
    trainer = Trainer(sae, Settings(latents=32, k=4, steps=5), variance=1.0)
    real = train.loss_and_grads

    def aux_overflows(*a, **kw):
        st = real(*a, **kw)
        st.aux, st.loss = float("inf"), float("inf")
        return st
    monkeypatch.setattr(train, "loss_and_grads", aux_overflows)
    with pytest.raises(QkvError, match="the AuxK term became inf at step 0.*lower --aux-coef"):
        trainer.step(np.ones((4, 8), np.float32))
    monkeypatch.setattr(train, "loss_and_grads", real)
    with pytest.raises(QkvError, match="too large for float32"):
        trainer.step(np.full((4, 8), 1e30, np.float32))


def test_negative_feature_indices_are_refused(tmp_path, monkeypatch, capsys):
    out = saved_sae(tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("some text\n")
    code, _, err = run_main(monkeypatch, capsys, "sae", "features", "--sae", str(out), "--model", str(MODELS / "gpt2"),
                            "--file", str(text), "--feature", "-1")
    one_line(code, err, "--feature -1 is negative")


def test_qkv_sae_eval_on_an_image_model_is_one_line(tmp_path, monkeypatch, capsys):
    out = saved_sae(tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat.\n")
    code, _, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(out), "--model", "digits-vit",
                            "--file", str(text))
    one_line(code, err, "image model", "give --model with the text model")
