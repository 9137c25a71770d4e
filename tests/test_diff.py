"""qkv.analysis.diff / `qkv diff`: a model against itself is 0 everywhere (exactly); JS, KL and cosine equal a
recomputation from the two traces by scipy and numpy; one head's W_V perturbed changes nothing before that
layer's output (its own and earlier patterns, the stream up to its input: exactly 0) and something after;
re-quantisation equals gguf.quants on each matrix; models of other shapes or tokenizers are one error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, quants
from scipy.spatial.distance import jensenshannon
from scipy.special import log_softmax
from scipy.stats import entropy

import qkv
from qkv.analysis.diff import KEEP, diff, requantized
from qkv.analysis.lens import logit_lens
from qkv.core.weights import Weights
from qkv.models.model import Model
from qkv.runtime.errors import QkvError

MODELS = Path(__file__).parent / "fixtures" / "models"
TEXT = "the cat sat on the mat"


def _load(name: str) -> Model:
    return qkv.load(MODELS / name, dtype=np.float64)


def _perturbed(model: Model, layer: int, kv_head: int, scale: float = 0.5) -> Model:
    """A copy of MODEL with W_V's columns of KV_HEAD in LAYER changed (in W_QKV, which the pass multiplies by,
    and in the W_V view of it), every other weight equal."""
    w: Weights = model.weights.astype(np.float64)
    a = w.blocks[layer].attn
    d_k, d = model.config.d_head, model.config.d_model
    cols = slice(kv_head * d_k, (kv_head + 1) * d_k)
    noise = scale * np.random.default_rng(1).standard_normal((d, d_k))
    a.W_V[:, cols] += noise
    if a.W_QKV is not None:
        q = model.config.n_heads * d_k + model.config.n_kv_heads * d_k          # V's columns come after Q's and K's
        a.W_QKV[:, q + cols.start:q + cols.stop] += noise
    return Model(model.config, w, model.tokenizer, model.name + " (W_V perturbed)")


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "gemma2"])
def test_a_model_against_itself_is_exactly_zero(name):
    model = _load(name)
    for other in (model, Model(model.config, model.weights.astype(np.float64), model.tokenizer, "copy")):
        d = diff(model, other, TEXT)
        assert np.all(d.js == 0) and np.all(d.js_rows == 0)
        assert np.all(d.cosine == 1) and np.all(d.norm_ratio == 1)
        assert np.all(d.lens_kl == 0) and np.all(d.final_kl == 0)


@pytest.mark.parametrize("name, layer", [("llama_gqa", 0), ("llama_gqa", 1), ("gemma2", 1)])
def test_one_heads_values_change_only_what_comes_after_its_layer(name, layer):
    model = _load(name)
    other = _perturbed(model, layer, kv_head=1)
    d = diff(model, other, TEXT)
    L = model.config.n_layers
    assert np.all(d.js[:layer + 1] == 0)                  # W_V moves no pattern of its own layer or before
    assert np.all(d.cosine[:layer + 1] == 1) and np.all(d.norm_ratio[:layer + 1] == 1)   # rows up to its input
    assert np.all(d.lens_kl[:layer + 1] == 0)
    assert np.all(d.cosine[layer + 1, 1:] < 1 - 1e-9)     # its output moves every position past the first
    assert np.all(d.lens_kl[layer + 1:, 1:] > 1e-12) and np.all(d.final_kl[1:] > 1e-12)
    if layer + 1 < L:
        assert np.all(d.js[layer + 1:] > 0)


def test_the_numbers_equal_scipy_and_numpy_from_the_traces():
    model = _load("llama_gqa")
    other = _perturbed(model, 0, kv_head=0)
    d = diff(model, other, TEXT)
    ta, tb = model.run(TEXT, keep=KEEP), other.run(TEXT, keep=KEEP)
    L, H, n = model.config.n_layers, model.config.n_heads, len(d.ids)
    for l in range(L):
        for h in range(H):
            rows = [jensenshannon(ta.layers[l].attentions[h, q], tb.layers[l].attentions[h, q], base=2) ** 2
                    for q in range(n)]                     # scipy's is the square root of the divergence
            np.testing.assert_allclose(d.js_rows[l, h], rows, rtol=1e-9, atol=1e-13)
            assert d.js[l, h] == pytest.approx(np.mean(rows), rel=1e-9, abs=1e-13)
    xa = [ta.layers[l].residual for l in range(L)] + [ta.layers[L - 1].residual_out]
    xb = [tb.layers[l].residual for l in range(L)] + [tb.layers[L - 1].residual_out]
    for l in range(L + 1):
        cos = np.einsum("nd,nd->n", xa[l], xb[l]) / np.linalg.norm(xa[l], axis=1) / np.linalg.norm(xb[l], axis=1)
        np.testing.assert_allclose(d.cosine[l], cos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(d.norm_ratio[l], np.linalg.norm(xb[l], axis=1) / np.linalg.norm(xa[l], axis=1),
                                   rtol=1e-12)
    lens_a, lens_b = logit_lens(model, TEXT), logit_lens(other, TEXT)        # (L+1, n, V) each
    kl = entropy(np.exp(log_softmax(lens_a, axis=-1)), np.exp(log_softmax(lens_b, axis=-1)), axis=-1)
    np.testing.assert_allclose(d.lens_kl, kl, rtol=1e-7, atol=1e-13)
    final_a = model.forward(np.asarray(d.ids)[None], attentions=False).logits[0]
    final_b = other.forward(np.asarray(d.ids)[None], attentions=False).logits[0]
    p = np.exp(log_softmax(final_a, axis=-1))
    np.testing.assert_allclose(d.final_kl, (p * (log_softmax(final_a, axis=-1) - log_softmax(final_b, axis=-1))).sum(-1),
                               rtol=1e-7, atol=1e-13)
    assert d.top_heads(1)[0][2] == d.js.max() and d.top_heads(1)[0][0] == 1


def test_requantized_matrices_are_gguf_quants_of_each_matrix():
    model = qkv.load(MODELS / "llama_gqa")
    q = requantized(model, "Q4_0")
    t = GGMLQuantizationType.Q4_0
    for b, bq in zip(model.weights.blocks, q.weights.blocks):
        for W, Wq in ((b.attn.W_K, bq.attn.W_K), (b.attn.W_QKV, bq.attn.W_QKV), (b.ffn.W_out, bq.ffn.W_out)):
            expected = quants.dequantize(quants.quantize(np.ascontiguousarray(np.asarray(W).T), t), t).T
            np.testing.assert_array_equal(Wq, expected)
        assert np.array_equal(bq.attn.W_QKV[:, :bq.attn.W_Q.shape[1]], bq.attn.W_Q)     # fused and split agree
        np.testing.assert_array_equal(bq.attn_norm.weight, b.attn_norm.weight)
    np.testing.assert_array_equal(q.weights.tok_embed, model.weights.tok_embed)
    assert not np.array_equal(q.weights.blocks[0].attn.W_O, model.weights.blocks[0].attn.W_O)
    d = diff(model, q, TEXT)
    assert d.js.max() > 0 and np.all(d.cosine[0] == 1)                                  # the embeddings kept


def test_other_shapes_or_tokenizers_are_one_error():
    a, b = qkv.load(MODELS / "llama_gqa"), qkv.load(MODELS / "gpt2")
    with pytest.raises(QkvError, match="differ in shape"):
        diff(a, b, TEXT)
    other = Model(a.config, a.weights, qkv.load(MODELS / "bert").tokenizer, "llama_gqa with BERT's tokenizer")
    with pytest.raises(QkvError, match="different tokenizers"):
        diff(a, other, TEXT)
    with pytest.raises(QkvError, match="unknown quantisation"):
        requantized(a, "Q3_K")


def test_the_command_prints_and_writes_a_diff(tmp_path):
    from qkv.cli.app import cli

    model = str(MODELS / "llama_gqa")
    r = CliRunner().invoke(cli, ["diff", TEXT, "--model", model, "--requantize-b", "Q4_0", "--json",
                                 str(tmp_path / "d.json"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "[float32] → Q4_0" in r.output and "L1.H" in r.output
    data = json.loads((tmp_path / "d.json").read_text())
    assert len(data["js"]) == 2 and len(data["js"][0]) == 8 and len(data["lens_kl"]) == 3
    assert data["top_heads"][0]["js"] == max(max(r) for r in data["js"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["diff.html", "diff.json", "diff.png", "diff.svg"]
    r = CliRunner().invoke(cli, ["diff", TEXT, "--model", model, "--json", str(tmp_path / "self.json")])
    assert r.exit_code == 0, r.output
    same = json.loads((tmp_path / "self.json").read_text())
    assert all(x == 0 for row in same["js"] for x in row) and all(x == 1 for row in same["cosine"] for x in row)
    r = CliRunner().invoke(cli, ["diff", TEXT, "--model", model, "--model-b", str(MODELS / "gpt2")])
    assert isinstance(r.exception, QkvError) and "differ in shape" in str(r.exception)


def test_smollm2s_q4_1_matrices_quantise_back_to_their_own_bytes():
    """Why re-quantising SmolLM2 (`qkv diff --requantize-b`) is honest: gguf.quants's rounding of its dequantised
    Q4_1 matrices gives the file's blocks back byte for byte (Q4_1 → Q4_1 diffs to exactly 0)."""
    from qkv.runtime.stored import StoredMatrix

    model = qkv.load("smollm2")
    t = GGMLQuantizationType.Q4_1
    for W in (model.weights.blocks[0].attn.W_O, model.weights.blocks[-1].ffn.W_out):
        assert isinstance(W, StoredMatrix) and W.kind == "Q4_1"
        again = quants.quantize(np.ascontiguousarray(np.asarray(W, np.float32).T), t)    # (d_out, bytes)
        np.testing.assert_array_equal(again, W.raw)
