"""QK / OV circuits of a head (qkv.analysis.circuits) and `qkv circuits`.

Identities that can fail (float64 arithmetic, tolerance 1e-6 unless said):
  - the copying score from the d_k × d_k matrix W_O·(W_U·W_E)·W_V equals Σλ/Σ|λ| over the
    eigenvalues of the whole V × V circuit W_E·W_V·W_O·W_U, built explicitly (fixtures: V = 400);
  - ov_circuit's k × k matrix and its top outputs are that V × V matrix's rows and columns;
  - a head made to copy (W_O^h = W_V^hᵀ, W_U = W_Eᵀ, γ = 1) scores +1, its negative −1;
  - the QK pattern's mean score and attention at each distance equal the engine's own recorded
    scores S and weights A averaged over that diagonal (GQA: query head h reads K/V head h // G).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.analysis.circuits import (copying_score, copying_scores, embedding, head_weights, ov_circuit,
                                   qk_positions, unembedding)
from qkv.models.model import Model

TOL = 1e-6
TEXT = "the cat sat on the mat and the cat ran"


def full_ov(model, layer, head) -> np.ndarray:
    """W_E·W_V^h·W_O^h·W_U, all V × V of it."""
    h = head_weights(model, layer, head)
    return embedding(model) @ h["W_V"] @ h["W_O"] @ unembedding(model)          # (V, V)


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "bert"])
@pytest.mark.parametrize("layer, head", [(0, 1), (1, 3)])
def test_copying_score_equals_the_full_circuits_eigenvalues(name, layer, head):
    model = qkv.load(MODELS / name)
    lam = np.linalg.eigvals(full_ov(model, layer, head))                        # (V,) V − d_k of them ~0
    assert copying_score(model, layer, head) == pytest.approx(lam.sum().real / np.abs(lam).sum(), abs=TOL)


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_ov_circuit_is_the_full_matrix_restricted(name):
    model = qkv.load(MODELS / name)
    ov = ov_circuit(model, 1, 5 if name == "llama_gqa" else 2, TEXT, top=4)
    M = full_ov(model, ov.layer, ov.head)
    assert len(set(ov.ids.tolist())) == len(ov.ids) < len(model.encode(TEXT)[0])    # distinct tokens of the text
    assert np.abs(ov.matrix - M[np.ix_(ov.ids, ov.ids)]).max() <= TOL
    best = np.argsort(-M[ov.ids[0]])[:4]
    assert [t for t, _ in ov.top_outputs[0]] == [model.tokenizer.label(int(i)) for i in best]
    src, dst, v = ov.top(1)[0]
    assert v == pytest.approx(ov.matrix.max()) and src in ov.labels and dst in ov.labels


def copier(model: Model, layer: int, head: int, sign: float) -> Model:
    """The model with head (layer, head) made to copy: W_O^h = sign·W_V^hᵀ, W_U = W_Eᵀ, every γ 1."""
    d_k, w = model.config.d_head, model.weights
    G = model.config.n_heads // model.config.n_kv_heads
    blk = w.blocks[layer]
    W_O = np.array(blk.attn.W_O, copy=True)
    W_O[head * d_k:(head + 1) * d_k] = sign * blk.attn.W_V[:, (head // G) * d_k:(head // G + 1) * d_k].T
    ones = replace(blk.attn_norm, weight=np.ones_like(blk.attn_norm.weight))
    blocks = list(w.blocks)
    blocks[layer] = replace(blk, attn=replace(blk.attn, W_O=W_O), attn_norm=ones)
    weights = replace(w, blocks=blocks, W_vocab=np.array(w.tok_embed.T),
                      final_norm=replace(w.final_norm, weight=np.ones_like(w.final_norm.weight)))
    return Model(model.config, weights, model.tokenizer, model.name)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_head_made_to_copy_scores_plus_one(sign):
    model = copier(qkv.load(MODELS / "llama_gqa"), 1, 5, sign)                # RMSNorm: no centring
    assert copying_score(model, 1, 5) == pytest.approx(sign, abs=TOL)
    ov = ov_circuit(model, 1, 5, TEXT)
    assert (ov.diagonal == 1.0) == (sign > 0)                                  # each token raises itself most
    assert copying_scores(model)[1, 5] == pytest.approx(sign, abs=TOL)


@pytest.mark.parametrize("name, layer, head", [("llama_gqa", 1, 5), ("gpt2", 0, 2), ("bert", 1, 1)])
def test_qk_by_distance_is_the_engines_scores_by_diagonal(name, layer, head):
    model = qkv.load(MODELS / name)
    ids = np.random.default_rng(1).integers(5, model.config.vocab_size, 12).tolist()
    qk = qk_positions(model, layer, head, ids)
    t = model.run(ids, keep=("scores", "attentions"))
    S, A = t.layer(layer).scores[head].astype(np.float64), t.layer(layer).attentions[head]     # (n, n)
    for d, s, a in zip(qk.deltas, qk.score, qk.attention):
        assert s == pytest.approx(np.diagonal(S, -d).mean(), abs=1e-5)
        assert a == pytest.approx(np.diagonal(A, -d).mean(), abs=1e-6)
    assert qk.deltas[0] == (0 if model.config.causal else -11) and len(qk.deltas) == (12 if model.config.causal else 23)
    if model.config.position == "rope":
        assert qk.table is None
    else:                                                                     # W_pos·W_Q·(W_pos·W_K)ᵀ/√d_k
        h = head_weights(model, layer, head)
        P = embedding(model, model.weights.pos_embed[:5])
        assert np.abs(qk.table[:5, :5] - (P @ h["W_Q"]) @ (P @ h["W_K"]).T / np.sqrt(model.config.d_head)).max() <= TOL
        assert qk.table_by_delta[list(qk.deltas_table).index(0)] == pytest.approx(np.trace(qk.table) / len(qk.table))


def test_minilm_previous_token_head_looks_one_back(minilm):
    """MiniLM's head 1.2 is a previous-token head (qkv heads): among the distances up to 8 (the far
    diagonals hold a pair or two, [SEP] → [CLS]), its mean attention peaks at Δ = +1..+3, looking back."""
    qk = qk_positions(minilm, 1, 2, "The cat sat on the mat because it was warm and the sun was out")
    near = np.abs(qk.deltas) <= 8
    best = int(qk.deltas[near][np.argmax(qk.attention[near])])
    assert 1 <= best <= 3


def test_cli(tmp_path, monkeypatch, capsys):
    gpt2 = str(MODELS / "gpt2")
    code, out, _ = run_main(monkeypatch, capsys, "circuits", "--model", gpt2, "--layer", "1", "--head", "2",
                            TEXT, "--out", str(tmp_path))
    assert code == 0 and "copying score" in out and "QK by relative distance" in out and "position table" in out
    assert (tmp_path / "circuits.png").is_file() and (tmp_path / "circuits.svg").is_file()
    code, _, err = run_main(monkeypatch, capsys, "circuits", "--model", gpt2, "--layer", "0", "--head", "9")
    assert code == 2 and "head 9 does not exist" in err
