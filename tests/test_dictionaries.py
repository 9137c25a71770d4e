"""The field's SAEs and transcoders read as they are stored (`qkv.features.dictionaries` and its readers).

Every layout is written here by the test itself, from the format's documented names and shapes (numpy + qkv's
safetensors writer, no torch, no network), read back, and checked against the forward pass computed by hand in
THAT format's convention (its transposes, its activation, whether b_dec is subtracted from the input):

  - SAELens (cfg.json + sae_weights.safetensors): every architecture SAELens 6.18 registers (standard, topk,
    jumprelu, transcoder, jumprelu_transcoder, skip_transcoder: W_skip (d_out, d_in) used as x·W_skipᵀ),
    BatchTopK / Matryoshka training checkpoints, and qkv's own topk_transcoder;
  - Gemma Scope params.npz / params.safetensors: z = ReLU(pre)·[pre > θ], no b_dec on the input;
  - circuit-tracer: W_enc (d_sae, d_model) used as F.linear (x·W_encᵀ), per-layer files, config.yaml/json, and
    the cross-layer transcoder (layer l's features write to every layer l' ≥ l);
  - sparsify: encoder.weight (d_sae, d_in), ReLU then TopK, b_dec subtracted for an SAE only.

Round trips qkv → layout → qkv give equal arrays and equal outputs (float32, bit-equal: no arithmetic on the way
but transposes). Hostile files are one QkvError each. `qkv sae eval` and steering run on a JumpReLU SAE and on a
transcoder on the GPT-2 fixture.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.checkpoints.tensors import write_safetensors
from qkv.features.circuit_tracer import CrossLayerTranscoder, load_circuit_tracer, load_clt, save_circuit_tracer
from qkv.features.dictionaries import check_fits, layout, load_dictionary, load_transcoders
from qkv.features.gemmascope import load_gemma_scope, save_gemma_scope, save_gemma_scope_2
from qkv.features.sae import SAE, SAEConfig
from qkv.features.saelens import load_saelens, save_saelens, site_of
from qkv.features.sparsify import load_sparsify, save_sparsify
from qkv.runtime.errors import QkvError

D, N, K = 8, 24, 4
RNG = np.random.default_rng(45)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def safetensors(path, tensors):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        write_safetensors(f, tensors)


def relu(x):
    return np.maximum(x, 0)


def topk_ref(pre, k):
    """The k largest of each row, ReLU'd, the rest 0 (SAELens's TopK, sparsify's fused encoder)."""
    out = np.zeros_like(pre)
    idx = np.argsort(-pre, axis=1)[:, :k]
    np.put_along_axis(out, idx, relu(np.take_along_axis(pre, idx, axis=1)), axis=1)
    return out


def random_box(arch="topk", *, transcoder=False, skip=False, d=D, n=N, layer=1, model="m") -> SAE:
    """A random SAE or transcoder of qkv's, thresholds and biases such that every branch is exercised."""
    cfg = SAEConfig(d_in=d, d_sae=n, k=K if arch == "topk" else None, apply_b_dec_to_input=not transcoder,
                    model=model, layer=layer, site="ffn_in" if transcoder else "resid", architecture=arch,
                    d_out=d if transcoder else None, site_out="ffn_out" if transcoder else None)
    params = {"W_enc": f32(d, n), "b_enc": f32(n, scale=0.1), "W_dec": f32(n, d), "b_dec": f32(d, scale=0.1)}
    if arch == "jumprelu":
        params["threshold"] = np.abs(f32(n, scale=0.5))
    if skip:
        params["W_skip"] = f32(d, d, scale=0.1)
    return SAE(cfg, params)


def same(a: SAE, b: SAE, x: np.ndarray) -> None:
    """Equal arrays and equal outputs (bit for bit) and the same architecture."""
    assert sorted(a.params) == sorted(b.params)
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]), name
    assert (a.config.architecture, a.config.k, a.config.transcoder) == (b.config.architecture, b.config.k,
                                                                        b.config.transcoder)
    assert np.array_equal(a.forward(x)[0], b.forward(x)[0])


# ── SAELens ──────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("arch, transcoder, skip, name", [
    ("topk", False, False, "topk"), ("jumprelu", False, False, "jumprelu"), ("relu", False, False, "standard"),
    ("relu", True, False, "transcoder"), ("jumprelu", True, False, "jumprelu_transcoder"),
    ("relu", True, True, "skip_transcoder"), ("topk", True, False, "topk_transcoder"),
    ("topk", True, True, "topk_skip_transcoder"),
])
def test_saelens_round_trip_of_every_architecture(tmp_path, arch, transcoder, skip, name):
    from safetensors.numpy import load_file

    box = random_box(arch, transcoder=transcoder, skip=skip, layer=3)
    save_saelens(box, tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["architecture"] == name
    stored = load_file(str(tmp_path / "s" / "sae_weights.safetensors"))
    if skip:
        assert np.array_equal(stored["W_skip"], box.params["W_skip"].T)          # SAELens: (d_out, d_in)
    if transcoder:
        assert (cfg["d_out"], cfg["hook_name"], cfg["hook_name_out"], cfg["apply_b_dec_to_input"]) == \
            (D, "blocks.3.ln2.hook_normalized", "blocks.3.hook_mlp_out", False)
    back = load_saelens(tmp_path / "s")
    assert back.config == box.config
    same(box, back, f32(30, D))


def test_a_saelens_6_skip_transcoder_computes_as_saelens_does(tmp_path):
    """SAELens 6's cfg (names under metadata, circuit-tracer's mlp.hook_in), W_skip (d_out, d_in): x̂ = ReLU(x·W_enc
    + b_enc)·W_dec + b_dec + x·W_skipᵀ, by hand."""
    W_enc, b_enc, W_dec, b_dec, W_skip = f32(D, N), f32(N), f32(N, D), f32(D), f32(D, D)
    safetensors(tmp_path / "t" / "sae_weights.safetensors",
                {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec, "W_skip": W_skip})
    (tmp_path / "t" / "cfg.json").write_text(json.dumps({
        "architecture": "skip_transcoder", "d_in": D, "d_sae": N, "d_out": D, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": False, "normalize_activations": "none", "reshape_activations": "none",
        "metadata": {"sae_lens_version": "6.18.0", "model_name": "Qwen/Qwen3-0.6B", "hook_name": "blocks.5.mlp.hook_in",
                     "hook_name_out": "blocks.5.hook_mlp_out"}}))
    tc = load_dictionary(tmp_path / "t")
    assert (tc.config.layer, tc.config.site, tc.config.site_out, tc.config.architecture) == (5, "ffn_in", "ffn_out", "relu")
    x = f32(20, D)
    ref = relu(x @ W_enc + b_enc) @ W_dec + b_dec + x @ W_skip.T
    assert np.abs(tc.forward(x)[0] - ref).max() < 1e-5


def test_a_saelens_jumprelu_transcoder_with_a_negative_threshold_is_saelens_s_function(tmp_path):
    """SAELens's JumpReLU is ReLU(pre)·[pre > θ]: a negative θ still lets no negative pre through (qkv reads θ
    as max(θ, 0), the same function)."""
    W_enc, b_enc, W_dec, b_dec = f32(D, N), f32(N), f32(N, D), f32(D)
    theta = np.linspace(-1, 1, N).astype(np.float32)
    safetensors(tmp_path / "j" / "sae_weights.safetensors",
                {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec, "threshold": theta})
    (tmp_path / "j" / "cfg.json").write_text(json.dumps({
        "architecture": "jumprelu_transcoder", "d_in": D, "d_out": D, "d_sae": N, "apply_b_dec_to_input": False,
        "normalize_activations": "none", "model_name": "gemma-2-2b", "hook_name": "blocks.2.ln2.hook_normalized",
        "hook_name_out": "blocks.2.hook_mlp_out"}))
    tc = load_saelens(tmp_path / "j")
    x = f32(40, D)
    pre = x @ W_enc + b_enc
    z = relu(pre) * (pre > theta)
    assert np.array_equal(tc.encode(x) > 0, z > 0)
    assert np.abs(tc.forward(x)[0] - (z @ W_dec + b_dec)).max() < 1e-5


@pytest.mark.parametrize("arch", ["batchtopk", "matryoshka_batchtopk"])
def test_batchtopk_and_matryoshka_training_checkpoints(tmp_path, arch):
    """SAELens saves both for inference as "jumprelu" (θ = topk_threshold for every latent); a training checkpoint
    with its topk_threshold reads as that JumpReLU, one without as TopK with k (the batch average) per token."""
    W_enc, b_enc, W_dec, b_dec = f32(D, N), f32(N), f32(N, D), f32(D)
    cfg = {"architecture": arch, "d_in": D, "d_sae": N, "k": 3.6, "apply_b_dec_to_input": True,
           "normalize_activations": "none", "hook_name": "blocks.0.hook_resid_pre", "matryoshka_widths": [8, 24]}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "cfg.json").write_text(json.dumps(cfg))
    safetensors(tmp_path / "b" / "sae_weights.safetensors", {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec,
                                                              "b_dec": b_dec, "topk_threshold": np.float64(0.3)})
    x = f32(25, D)
    pre = (x - b_dec) @ W_enc + b_enc
    sae = load_saelens(tmp_path / "b")
    assert sae.config.architecture == "jumprelu" and np.all(sae.params["threshold"] == np.float32(0.3))
    assert np.abs(sae.forward(x)[0] - ((pre * (pre > 0.3)) @ W_dec + b_dec)).max() < 1e-5
    safetensors(tmp_path / "b" / "sae_weights.safetensors", {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec,
                                                              "b_dec": b_dec})
    sae = load_saelens(tmp_path / "b")
    assert (sae.config.architecture, sae.config.k) == ("topk", 4)
    assert np.abs(sae.forward(x)[0] - (topk_ref(pre, 4) @ W_dec + b_dec)).max() < 1e-5


def test_saelens_jumprelu_sae_in_saelens_5_layout(tmp_path):
    """SAELens 5's flat cfg.json: architecture jumprelu, activation_fn_str relu, hook_point: (x − b_dec)·W_enc."""
    W_enc, b_enc, W_dec, b_dec, theta = f32(D, N), f32(N), f32(N, D), f32(D), np.abs(f32(N))
    safetensors(tmp_path / "s" / "sae_weights.safetensors",
                {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec, "threshold": theta})
    (tmp_path / "s" / "cfg.json").write_text(json.dumps({
        "architecture": "jumprelu", "d_in": D, "d_sae": N, "activation_fn_str": "relu", "apply_b_dec_to_input": True,
        "hook_point": "blocks.1.hook_resid_post", "model_name": "gpt2", "normalize_activations": "none"}))
    sae = load_dictionary(tmp_path / "s")
    assert (sae.config.layer, sae.config.site, sae.config.k) == (2, "resid", None)
    x = f32(30, D)
    pre = (x - b_dec) @ W_enc + b_enc
    assert np.abs(sae.forward(x)[0] - (relu(pre) * (pre > theta)) @ W_dec - b_dec).max() < 1e-5


def test_hook_names_of_transcoders():
    assert site_of("blocks.4.ln2.hook_normalized") == (4, "ffn_in") == site_of("blocks.4.mlp.hook_in")
    assert site_of("blocks.4.mlp.hook_out") == (4, "ffn_out") and site_of("blocks.4.hook_resid_mid") == (4, "resid_mid")
    assert site_of("blocks.4.hook_mlp_in") == (None, None)      # before the norm: not the FFN's input


# ── Gemma Scope ──────────────────────────────────────────────────────────────────

def gemma_scope_arrays(d=D, n=N, o=D):
    return {"W_enc": f32(d, n), "W_dec": f32(n, o), "b_enc": f32(n), "b_dec": f32(o), "threshold": np.abs(f32(n))}


def gemma_scope_file(folder):
    """gemma_scope_arrays() saved as FOLDER/params.npz (the release's folders say what it reads): (arrays, path)."""
    p, path = gemma_scope_arrays(), folder / "params.npz"
    path.parent.mkdir(parents=True)
    np.savez(path, **p)
    return p, path


def gemma_scope_ref(p, x):
    """Gemma Scope's JumpReLUSAE.forward: no b_dec on the input, ReLU(pre)·[pre > θ]."""
    pre = x @ p["W_enc"] + p["b_enc"]
    return (relu(pre) * (pre > p["threshold"])) @ p["W_dec"] + p["b_dec"]


def test_gemma_scope_npz_of_an_sae_and_where_the_path_says_it_reads(tmp_path):
    p, path = gemma_scope_file(tmp_path / "gemma-scope-2b-pt-res" / "layer_3" / "width_16k" / "average_l0_5")
    sae = load_dictionary(path)
    assert (sae.config.layer, sae.config.site, sae.config.apply_b_dec_to_input) == (4, "resid", False)  # resid_post
    x = f32(30, D)
    assert np.abs(sae.forward(x)[0] - gemma_scope_ref(p, x)).max() < 1e-5
    given = load_gemma_scope(path, layer=1, site="ffn_out")
    assert (given.config.layer, given.config.site) == (1, "ffn_out")


def test_gemma_scope_transcoders_npz_and_gemma_scope_2_safetensors(tmp_path):
    p, path = gemma_scope_file(tmp_path / "gemma-scope-2b-pt-transcoders" / "layer_7" / "width_16k" / "average_l0_9")
    tc = load_dictionary(path)
    assert (tc.config.layer, tc.config.site, tc.config.site_out, tc.config.transcoder) == (7, "ffn_in", "ffn_out", True)
    x = f32(30, D)
    assert np.abs(tc.forward(x)[0] - gemma_scope_ref(p, x)).max() < 1e-5
    skip = f32(D, D)                                      # Gemma Scope 2: lower-case names, affine_skip_connection
    gs2 = {"w_enc": p["W_enc"], "w_dec": p["W_dec"], "b_enc": p["b_enc"], "b_dec": p["b_dec"],
           "threshold": p["threshold"], "affine_skip_connection": skip}
    safetensors(tmp_path / "transcoder_all" / "layer_2_width_16k_l0_big" / "params.safetensors", gs2)
    tc2 = load_dictionary(tmp_path / "transcoder_all" / "layer_2_width_16k_l0_big")
    assert tc2.config.layer == 2 and tc2.config.transcoder
    assert np.abs(tc2.forward(x)[0] - gemma_scope_ref(p, x) - x @ skip).max() < 1e-5


def test_gemma_scope_round_trips(tmp_path):
    box = random_box("jumprelu", transcoder=True, skip=False, layer=2)
    x = f32(20, D)
    same(box, load_gemma_scope(save_gemma_scope(box, tmp_path / "a"), layer=2, transcoder=True), x)
    skip = random_box("jumprelu", transcoder=True, skip=True, layer=2)
    same(skip, load_gemma_scope(save_gemma_scope_2(skip, tmp_path / "b"), layer=2, transcoder=True), x)
    with pytest.raises(QkvError, match="JumpReLU"):
        save_gemma_scope(random_box("topk", transcoder=True), tmp_path / "c")


# ── circuit-tracer ───────────────────────────────────────────────────────────────

def circuit_tracer_layer(jump=True, skip=False):
    """One layer as circuit-tracer's SingleLayerTranscoder.to_safetensors writes it (nn.Linear's W_enc)."""
    t = {"W_enc": f32(N, D), "b_enc": f32(N, scale=0.1), "W_dec": f32(N, D), "b_dec": f32(D)}
    if jump:
        t["activation_function.threshold"] = np.linspace(-0.5, 1, N).astype(np.float32)
    if skip:
        t["W_skip"] = f32(D, D)
    return t


def circuit_tracer_ref(t, x, k=None):
    """circuit-tracer's forward: pre = F.linear(x, W_enc, b_enc); JumpReLU pre·[pre > θ] (no ReLU), TopK without
    ReLU, or ReLU; out = z·W_dec + b_dec + x·W_skipᵀ."""
    pre = x @ t["W_enc"].T + t["b_enc"]
    if k is not None:
        z = np.zeros_like(pre)
        idx = np.argsort(-pre, axis=1)[:, :k]
        np.put_along_axis(z, idx, np.take_along_axis(pre, idx, axis=1), axis=1)
    elif "activation_function.threshold" in t:
        z = pre * (pre > t["activation_function.threshold"])
    else:
        z = relu(pre)
    out = z @ t["W_dec"] + t["b_dec"]
    return out + x @ t["W_skip"].T if "W_skip" in t else out


def test_circuit_tracer_transcoder_set_from_config_yaml(tmp_path):
    layers = [circuit_tracer_layer(jump=True, skip=True), circuit_tracer_layer(jump=True, skip=True)]
    for i, t in enumerate(layers):
        safetensors(tmp_path / "ct" / f"layer_{i}.safetensors", t)
    (tmp_path / "ct" / "config.yaml").write_text(
        'model_kind: transcoder_set\nmodel_name: "google/gemma-2-2b"\nfeature_input_hook: "ln2.hook_normalized"\n'
        "feature_output_hook: 'hook_mlp_out'\n")
    tcs = load_transcoders(tmp_path / "ct")
    assert sorted(tcs) == [0, 1] and tcs[1].config.model == "google/gemma-2-2b"
    x = f32(30, D)
    for i, t in enumerate(layers):
        assert (tcs[i].config.layer, tcs[i].config.site, tcs[i].config.architecture) == (i, "ffn_in", "jumprelu")
        assert np.abs(tcs[i].forward(x)[0] - circuit_tracer_ref(t, x)).max() < 1e-5
    one = load_dictionary(tmp_path / "ct" / "layer_1.safetensors")
    assert np.array_equal(one.forward(x)[0], tcs[1].forward(x)[0])


def test_circuit_tracer_topk_from_config_json_and_listed_files(tmp_path):
    """A JSON config with the same keys (no PyYAML needed); activation topk with k; the older list of
    {id, layer, filepath}. circuit-tracer's TopK keeps the k largest without a ReLU: equal to qkv's when they are
    positive, as here (b_enc large)."""
    t = circuit_tracer_layer(jump=False)
    t["b_enc"] = t["b_enc"] + 20
    safetensors(tmp_path / "ct" / "files" / "mine_0.safetensors", t)
    (tmp_path / "ct" / "config.json").write_text(json.dumps({
        "model_name": "meta-llama/Llama-3.2-1B", "feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out",
        "activation": "topk", "k": K, "transcoders": [{"id": "a", "layer": 0, "filepath": "files/mine_0.safetensors"}]}))
    tc = load_circuit_tracer(tmp_path / "ct")[0]
    x = f32(30, D)
    assert (tc.config.architecture, tc.config.k) == ("topk", K)
    assert np.abs(tc.forward(x)[0] - circuit_tracer_ref(t, x, k=K)).max() < 1e-4


def test_circuit_tracer_round_trip(tmp_path):
    for arch in ("topk", "jumprelu", "relu"):
        tcs = {i: random_box(arch, transcoder=True, skip=arch == "relu", layer=i) for i in range(3)}
        save_circuit_tracer(tcs, tmp_path / arch)
        back = load_transcoders(tmp_path / arch)
        for i in range(3):
            same(tcs[i], back[i], f32(20, D))


def test_a_cross_layer_transcoder_loads_and_writes_every_later_layer(tmp_path):
    L = 3
    enc, dec = [], []
    for l in range(L):
        e = {f"W_enc_{l}": f32(N, D), f"b_enc_{l}": f32(N), f"b_dec_{l}": f32(D), f"threshold_{l}": np.abs(f32(N))}
        d = {f"W_dec_{l}": f32(N, L - l, D)}
        safetensors(tmp_path / "clt" / f"W_enc_{l}.safetensors", e)
        safetensors(tmp_path / "clt" / f"W_dec_{l}.safetensors", d)
        enc.append(e)
        dec.append(d)
    assert layout(tmp_path / "clt") == "clt"
    clt = load_clt(tmp_path / "clt")
    assert isinstance(clt, CrossLayerTranscoder) and (clt.n_layers, clt.d_sae, clt.site) == (L, N, "resid_mid")
    xs = {l: f32(10, D) for l in range(L)}
    ys = clt.forward(xs)
    zs = {}
    for l in range(L):                                     # by hand: z_l = pre·[pre > θ], pre = x·W_encᵀ + b_enc
        pre = xs[l] @ enc[l][f"W_enc_{l}"].T + enc[l][f"b_enc_{l}"]
        zs[l] = pre * (pre > enc[l][f"threshold_{l}"])
    for target in range(L):
        want = enc[target][f"b_dec_{target}"] + sum(zs[l] @ dec[l][f"W_dec_{l}"][:, target - l] for l in range(target + 1))
        assert np.abs(ys[target] - want).max() < 1e-4
    with pytest.raises(QkvError, match="cross-layer"):
        load_dictionary(tmp_path / "clt")


# ── sparsify ─────────────────────────────────────────────────────────────────────

def sparsify_dir(path, *, transcode, skip=False):
    t = {"encoder.weight": f32(N, D), "encoder.bias": f32(N), "W_dec": f32(N, D), "b_dec": f32(D)}
    if skip:
        t["W_skip"] = f32(D, D)
    safetensors(path / "sae.safetensors", t)
    (path / "cfg.json").write_text(json.dumps({
        "activation": "topk", "expansion_factor": 3, "normalize_decoder": True, "num_latents": 0, "k": K,
        "multi_topk": False, "skip_connection": skip, "transcode": transcode, "d_in": D}))
    return t


def sparsify_ref(t, x, transcode):
    """sparsify's SparseCoder: x − b_dec for an SAE only, ReLU(x·encoder.weightᵀ + bias), TopK, ·W_dec + b_dec,
    + x·W_skipᵀ."""
    s = x if transcode else x - t["b_dec"]
    out = topk_ref(relu(s @ t["encoder.weight"].T + t["encoder.bias"]), K) @ t["W_dec"] + t["b_dec"]
    return out + x @ t["W_skip"].T if "W_skip" in t else out


def test_sparsify_hookpoints_sae_and_transcoder(tmp_path):
    sae_t = sparsify_dir(tmp_path / "layers.0", transcode=False)
    sae = load_dictionary(tmp_path / "layers.0")
    assert (sae.config.layer, sae.config.site, sae.config.d_sae, sae.config.apply_b_dec_to_input) == (1, "resid", N, True)
    x = f32(30, D)
    assert np.abs(sae.forward(x)[0] - sparsify_ref(sae_t, x, False)).max() < 1e-5
    tcs = {i: sparsify_dir(tmp_path / "run" / f"layers.{i}.mlp", transcode=True, skip=True) for i in range(2)}
    loaded = load_transcoders(tmp_path / "run")
    for i, t in tcs.items():
        assert (loaded[i].config.layer, loaded[i].config.site, loaded[i].config.site_out) == (i, "ffn_in", "ffn_out")
        assert np.abs(loaded[i].forward(x)[0] - sparsify_ref(t, x, True)).max() < 1e-5


def test_sparsify_round_trip(tmp_path):
    for box in (random_box("topk", layer=2), random_box("topk", transcoder=True, skip=True, layer=1)):
        same(box, load_sparsify(save_sparsify(box, tmp_path)), f32(20, D))
    with pytest.raises(QkvError, match="TopK"):
        save_sparsify(random_box("jumprelu"), tmp_path)


# ── qkv's per-layer transcoders, and one transcoder through every layout ──────────

def test_qkv_transcoder_folders_and_every_layout_give_the_same_numbers(tmp_path):
    """A transcoder of qkv's (as `qkv transcoders train` writes it: DIR/layer_NN/ in SAELens's layout) and the
    same written in each external layout read back to the same arrays and outputs, for each architecture a
    layout can hold."""
    x = f32(40, D)
    tcs = {i: random_box("topk", transcoder=True, layer=i) for i in range(2)}
    for i, tc in tcs.items():
        save_saelens(tc, tmp_path / "qkv" / f"layer_{i:02d}")
    back = load_transcoders(tmp_path / "qkv")
    for i, tc in tcs.items():
        same(tc, back[i], x)
        same(tc, load_sparsify(save_sparsify(back[i], tmp_path / "sparsify")), x)
    save_circuit_tracer(back, tmp_path / "ct")
    for i, tc in load_transcoders(tmp_path / "ct").items():
        same(tcs[i], tc, x)
    jump = random_box("jumprelu", transcoder=True, layer=1)
    save_saelens(jump, tmp_path / "j")
    for path in (save_gemma_scope(load_dictionary(tmp_path / "j"), tmp_path / "gs" / "layer_1"),
                 save_gemma_scope_2(jump, tmp_path / "gs2" / "layer_1")):
        same(jump, load_dictionary(path, transcoder=True), x)


# ── hostile files and dictionaries that do not fit: one line each ────────────────

def test_hostile_files_are_one_line(tmp_path):
    p = gemma_scope_arrays()
    (tmp_path / "pk").mkdir()
    np.savez(tmp_path / "pk" / "params.npz", **{**p, "b_dec": np.array([object()] * D, dtype=object)})
    with pytest.raises(QkvError, match="pickle"):
        load_dictionary(tmp_path / "pk" / "params.npz", layer=0, site="resid")
    (tmp_path / "nan").mkdir()
    np.savez(tmp_path / "nan" / "params.npz", **{**p, "b_enc": np.full(N, np.nan, np.float32)})
    with pytest.raises(QkvError, match="NaN"):
        load_dictionary(tmp_path / "nan", layer=0, site="resid")
    (tmp_path / "shape").mkdir()
    np.savez(tmp_path / "shape" / "params.npz", **{**p, "threshold": f32(N + 1)})
    with pytest.raises(QkvError, match="threshold has shape"):
        load_dictionary(tmp_path / "shape", layer=0, site="resid")
    (tmp_path / "att" / "layer_1").mkdir(parents=True)
    np.savez(tmp_path / "att" / "layer_1" / "params.npz", **p)
    with pytest.raises(QkvError, match="hook_z"):
        load_dictionary(tmp_path / "att" / "layer_1")
    sparsify_dir(tmp_path / "layers.1", transcode=False)
    cfg = json.loads((tmp_path / "layers.1" / "cfg.json").read_text())
    (tmp_path / "layers.1" / "cfg.json").write_text(json.dumps({**cfg, "activation": "groupmax"}))
    with pytest.raises(QkvError, match="groupmax"):
        load_dictionary(tmp_path / "layers.1")
    (tmp_path / "layers.1" / "cfg.json").write_text(json.dumps({**cfg, "num_latents": N + 1}))
    with pytest.raises(QkvError, match="encoder.weight has shape"):
        load_dictionary(tmp_path / "layers.1")
    save_saelens(random_box("jumprelu"), tmp_path / "gated")
    cfg = json.loads((tmp_path / "gated" / "cfg.json").read_text())
    (tmp_path / "gated" / "cfg.json").write_text(json.dumps({**cfg, "architecture": "gated"}))
    with pytest.raises(QkvError, match="'gated' dictionary, which qkv does not read"):
        load_dictionary(tmp_path / "gated")
    (tmp_path / "gated" / "cfg.json").write_text(json.dumps({**cfg, "hook_name": "blocks.2.attn.hook_z"}))
    with pytest.raises(QkvError, match="'blocks.2.attn.hook_z', a hook point qkv's dictionaries do not read"):
        load_dictionary(tmp_path / "gated")
    save_saelens(random_box("jumprelu"), tmp_path / "nothr")
    with open(tmp_path / "nothr" / "sae_weights.safetensors", "wb") as f:
        write_safetensors(f, {k: v for k, v in random_box("relu").params.items()})
    with pytest.raises(QkvError, match="no tensor threshold"):
        load_dictionary(tmp_path / "nothr")


def test_circuit_tracer_configs_refuse_what_they_cannot_hold(tmp_path):
    safetensors(tmp_path / "ct" / "layer_0.safetensors", circuit_tracer_layer())
    base = {"feature_input_hook": "ln2.hook_normalized", "feature_output_hook": "hook_mlp_out"}
    for change, words in (({"transcoders": ["hf://mntss/x/layer_0.safetensors"]}, "qkv does not download"),
                          ({"feature_input_hook": "attn.hook_z"}, "not a point qkv reads"),
                          ({"feature_output_hook": "hook_resid_post"}, "qkv's replace the FFN's output"),
                          ({"activation": "topk"}, "has no k")):
        (tmp_path / "ct" / "config.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(QkvError, match=words):
            load_transcoders(tmp_path / "ct")
    (tmp_path / "y").mkdir()                                   # pyyaml is a dependency: read, never skipped
    (tmp_path / "y" / "config.yaml").write_text("a: &x [feature_input_hook]\nb: *x\n")
    with pytest.raises(QkvError, match="aliases"):
        load_transcoders(tmp_path / "y")


@pytest.fixture(scope="module")
def gpt2():
    return qkv.load(MODELS / "gpt2")


def test_check_fits_is_one_line_for_each_misfit(gpt2):
    d, L = gpt2.config.d_model, gpt2.config.n_layers
    assert check_fits(gpt2, random_box("jumprelu", d=d, layer=1)) is None
    assert check_fits(gpt2, {i: random_box("topk", transcoder=True, d=d, layer=i) for i in range(L)}) is None
    with pytest.raises(QkvError, match=f"reads {D}-wide vectors and .* is {d} wide"):
        check_fits(gpt2, random_box("jumprelu", layer=1))
    with pytest.raises(QkvError, match=f"reads layer 7 and .* has layers 0..{L - 1}"):
        check_fits(gpt2, random_box("jumprelu", d=d, layer=7))
    odd = random_box("relu", d=d, layer=1)
    odd.config.site = "attn_z"
    with pytest.raises(QkvError, match="not a hook point qkv reads"):
        check_fits(gpt2, odd)
    odd.config.site = None
    with pytest.raises(QkvError, match="does not say which layer"):
        check_fits(gpt2, odd)
    with pytest.raises(QkvError, match="transcoder of layer 1 reads"):
        check_fits(gpt2, {0: random_box("topk", transcoder=True, d=d, layer=0), 1: random_box("topk", transcoder=True)})
    clt = CrossLayerTranscoder([f32(D, N)] * 2, f32(2, N), [f32(N, 2, D), f32(N, 1, D)], f32(2, D), None)
    with pytest.raises(QkvError, match="cross-layer transcoder has 2 layers of width 8"):
        check_fits(gpt2, clt)


def test_sae_eval_on_stored_activations_refuses_a_transcoder(tmp_path):
    from qkv.features.evaluate import reconstruction

    with pytest.raises(QkvError, match="a transcoder's FVU needs its input and the FFN's output"):
        reconstruction(random_box("topk", transcoder=True), iter([f32(4, D)]))


# ── the commands on a JumpReLU SAE and a transcoder ──────────────────────────────

def fitted(gpt2, arch, *, transcoder=False, layer=1, scale=1.0):
    """A dictionary of GPT-2's width whose latents fire on its activations (thresholds below the typical pre)."""
    box = random_box(arch, transcoder=transcoder, d=gpt2.config.d_model, n=48, layer=layer, model=str(MODELS / "gpt2"))
    box.params["W_dec"] *= np.float32(scale)
    if "threshold" in box.params:
        box.params["threshold"][:] = 0.5
    return box


def test_sae_eval_on_a_jumprelu_sae_and_a_transcoder(gpt2, tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\nand the dog ran to the park today\n")
    for name, box in (("jump", fitted(gpt2, "jumprelu")), ("tc", fitted(gpt2, "topk", transcoder=True, scale=0.1))):
        save_saelens(box, tmp_path / name)
        code, out, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(tmp_path / name), "--file",
                                  str(corpus), "--tokens", "16", "--context", "8", "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["architecture"] == box.config.architecture and report["transcoder"] == box.config.transcoder
        ce = report["ce"]
        assert ce["site"] == box.config.site and np.isfinite([ce["clean"], ce["sae"], ce["fvu"]]).all()
        assert ce["l0"] > 0 and ce["sae"] != ce["clean"]
    code, out, err = run_main(monkeypatch, capsys, "sae", "eval", "--sae", str(tmp_path / "jump"), "--file", str(corpus),
                              "--tokens", "16", "--context", "8")
    assert code == 0 and "JumpReLU" in out and "k None" not in out, err


def test_a_transcoder_splices_exactly_into_the_ffn_output(gpt2):
    """spliced_loss with a transcoder: x̂ = transcoder(ffn_in) replaces ffn_out; checked against a hand-made hook."""
    from qkv.features.evaluate import next_token_loss, spliced_loss

    tc = fitted(gpt2, "jumprelu", transcoder=True, layer=0)
    ids = np.asarray(gpt2.tokenizer.encode("the cat sat on the mat and", add_special_tokens=False)[0], np.int64)
    sp = spliced_loss(gpt2, tc, [ids], layer=0, site="ffn_in")
    seen = {}
    hooks = {"0.ffn_in": lambda v, layer: seen.__setitem__("x", np.array(v[0, 1:], np.float32)),
             "0.ffn_out": lambda v, layer: np.concatenate([v[:, :1], tc.forward(seen["x"])[0][None]], axis=1)}
    out = gpt2.forward(ids[None], attentions=False, hooks=hooks)
    want = next_token_loss(out.logits, ids[None])[0] / (len(ids) - 1)
    assert abs(sp.sae - want) < 1e-9


def test_steering_with_a_jumprelu_sae_and_with_a_transcoder(gpt2, tmp_path):
    from qkv.features.steer import steering_hooks

    text = "the cat sat on the mat"
    for box, point in ((fitted(gpt2, "jumprelu"), "residual"), (fitted(gpt2, "relu", transcoder=True), "ffn_out")):
        save_saelens(box, tmp_path / point)
        sae = load_dictionary(tmp_path / point)
        plain = getattr(gpt2.run(text, layers=[1], keep=(point,)).layer(1), point)
        hooked = getattr(gpt2.run(text, layers=[1], keep=(point,), hooks=steering_hooks(sae, {3: 5.0})).layer(1), point)
        assert np.abs(hooked - plain - 5.0 * sae.W_dec[3]).max() < 1e-4        # a transcoder steers where it writes


def test_generate_steers_with_a_jumprelu_sae_in_gemma_scope_layout(gpt2, tmp_path, monkeypatch, capsys):
    box = fitted(gpt2, "jumprelu")
    box.config.apply_b_dec_to_input = False
    path = save_gemma_scope(box, tmp_path / "gemma-scope-x-res" / "layer_0")      # layer_0 res → resid at 1
    code, out, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", str(MODELS / "gpt2"), "-n", "3",
                              "--sae", str(path), "--steer", "3:8")
    assert code == 0, err
    code, _, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", str(MODELS / "gpt2"), "-n", "3",
                            "--sae", str(tmp_path / "nowhere"), "--steer", "3:8")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_feature_pages_of_a_jumprelu_sae_and_a_transcoder(gpt2, tmp_path, monkeypatch, capsys):
    """`qkv sae show` and `qkv sae features` (tables and the offline page) read a JumpReLU SAE and a transcoder
    (encoded from the FFN's input); no k is printed for a box that has none."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\nand the dog ran to the park today\n")
    for name, box in (("jump", fitted(gpt2, "jumprelu")), ("tc", fitted(gpt2, "relu", transcoder=True))):
        save_saelens(box, tmp_path / name)
        code, out, err = run_main(monkeypatch, capsys, "sae", "show", "the cat sat on", "--sae", str(tmp_path / name),
                                  "--out", str(tmp_path / f"{name}-show"))
        assert code == 0 and "(k " not in out and f"layer 1 {box.config.site}" in out, err
        assert (tmp_path / f"{name}-show" / "features.html").is_file()
        code, out, err = run_main(monkeypatch, capsys, "sae", "features", "--sae", str(tmp_path / name), "--file",
                                  str(corpus), "--top", "2", "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["k"] is None and report["site"] == box.config.site and len(report["features"]) == 2


def test_load_transcoders_refuses_what_is_not_a_set_of_transcoders(tmp_path):
    one = random_box("jumprelu", transcoder=True, layer=4)
    save_saelens(one, tmp_path / "one")
    assert list(load_transcoders(tmp_path / "one")) == [4]                 # one transcoder: its own layer
    save_saelens(random_box("topk"), tmp_path / "sae")
    with pytest.raises(QkvError, match="is one SAE"):
        load_transcoders(tmp_path / "sae")
    save_saelens(random_box("topk", transcoder=True, layer=1), tmp_path / "set" / "layer_00")
    with pytest.raises(QkvError, match="named for layer 0 but its transcoder reads layer 1"):
        load_transcoders(tmp_path / "set")
    save_saelens(random_box("topk"), tmp_path / "mixed" / "layer_00")
    with pytest.raises(QkvError, match="is an SAE"):
        load_transcoders(tmp_path / "mixed")
    (tmp_path / "empty").mkdir()
    with pytest.raises(QkvError, match="holds no dictionary"):
        load_transcoders(tmp_path / "empty")
    attn = random_box("topk", transcoder=True, layer=0)
    attn.config.site, attn.config.site_out = "resid", "attn_out"        # a transcoder, but not of an FFN
    save_saelens(attn, tmp_path / "attn" / "layer_00")
    with pytest.raises(QkvError, match="reads 'resid' and writes 'attn_out'"):
        load_transcoders(tmp_path / "attn")
    with pytest.raises(QkvError, match="is not a directory"):
        load_transcoders(tmp_path / "missing")


# ── the check: a transcoder trained by qkv, through every layout ─────────

TRAIN_TEXTS = [" ".join(f"w{(i * 7 + j * 3) % 41} the{j % 5}" for j in range(40 + i % 17)) for i in range(40)]


@pytest.mark.parametrize("kw, layouts", [
    ({}, ("saelens", "circuit_tracer", "sparsify")),
    ({"architecture": "jumprelu", "k": None}, ("saelens", "circuit_tracer", "gemmascope", "gemmascope2")),
    ({"architecture": "jumprelu", "k": None, "skip": True}, ("saelens", "circuit_tracer", "gemmascope2")),
])
def test_a_transcoder_trained_by_qkv_gives_the_same_numbers_in_every_layout(tmp_path, kw, layouts):
    """`qkv transcoders train`'s run (4 steps on the Llama fixture) → its layer folders → each external layout →
    read back: the same arrays, the same outputs on the model's own FFN inputs (bit for bit), and
    `load_transcoders` of each layout's folder gives every layer."""
    from qkv.features import transcoder_train as train
    from qkv.features.transcoder_settings import TranscoderSettings

    llama = qkv.load(MODELS / "llama_gqa")
    settings = TranscoderSettings(**{"latents": 64, "k": 4, "steps": 4, "batch": 64, "lr": 3e-3,
                                     "checkpoint_every": 4, "context": 32, **kw})
    win = train.cut_windows(llama.tokenizer, TRAIN_TEXTS, settings.context, 1, settings.steps * settings.batch)
    layers = tuple(range(llama.config.n_layers))
    source = train.Source(model=str(MODELS / "llama_gqa"), corpus="texts", sha256="0" * 64, layers=layers,
                          d=llama.config.d_model)
    train.open_transcoder_run(tmp_path / "run", settings, llama, source, win).train()
    trained = load_transcoders(tmp_path / "run")
    assert sorted(trained) == list(layers)
    run = llama.run(TRAIN_TEXTS[0][:120], keep=("ffn_in",))
    writers = {
        "saelens": lambda tcs, out: [save_saelens(t, out / f"layer_{i:02d}") for i, t in tcs.items()],
        "circuit_tracer": lambda tcs, out: save_circuit_tracer(tcs, out),
        "sparsify": lambda tcs, out: [save_sparsify(t, out) for t in tcs.values()],
        "gemmascope": lambda tcs, out: [save_gemma_scope(t, out / f"layer_{i}") for i, t in tcs.items()],
        "gemmascope2": lambda tcs, out: [save_gemma_scope_2(t, out / f"layer_{i}") for i, t in tcs.items()],
    }
    for name in layouts:
        writers[name](trained, tmp_path / name)
        back = load_transcoders(tmp_path / name)
        assert sorted(back) == list(layers), name
        for layer, tc in trained.items():
            x = run.layer(layer).ffn_in.reshape(-1, llama.config.d_model).astype(np.float32)    # (n, d_model)
            same(tc, back[layer], x)
            assert (back[layer].config.site, back[layer].config.site_out) == ("ffn_in", "ffn_out"), name
