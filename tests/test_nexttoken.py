"""The next-token distribution P = softmax(logits / T) (guide: temperature): equal to the formula written
out by hand, the very distribution `sample` draws from, and `qkv next` (torch and transformers'
temperature warper: tests/live/test_live_nexttoken.py).

Real logits come from SmolLM2-135M-Instruct (the installed model; `make test` installs it).
Tolerances: float64 against float64, 1e-12 max abs; the viewer's page data (logits kept
to 4 decimals) 1e-3.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.writing.nexttoken import (candidates, distribution, entropy, next_token_logits, token_text, top_tokens,
                           visible)
from qkv.writing import sampling
from qkv.writing.sampling import sample
from conftest import MODELS, run_main

PROMPT = "The capital of France is"
TEMPERATURES = [0.3, 0.5, 1.0, 2.0]
TOL = 1e-12


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def z(smollm2) -> np.ndarray:
    """The logits of the token after PROMPT, (V,) float32."""
    ids, _ = smollm2.encode(PROMPT)
    return next_token_logits(smollm2, ids)


def test_next_token_logits_are_the_last_row_of_the_forward_pass(smollm2, z):
    ids, _ = smollm2.encode(PROMPT)
    assert z.shape == (49152,)
    assert np.abs(z - smollm2.forward(ids, attentions=False).logits[0, -1]).max() < 1e-4     # TOL_HIDDEN
    assert smollm2.tokenizer.decode([int(np.argmax(z))]) == " Paris"


def _softmax_by_hand(z: np.ndarray, T: float) -> list[float]:
    """softmax(z / T) the way the guide writes it, one float at a time (math.exp, math.fsum)."""
    top = max(float(v) for v in z)
    e = [math.exp((float(v) - top) / T) for v in z]
    total = math.fsum(e)
    return [x / total for x in e]


@pytest.mark.parametrize("T", TEMPERATURES)
def test_distribution_equals_softmax_of_logits_over_T(z, T):
    """Against the formula written out by hand; tests/live/test_live_nexttoken.py checks torch and
    transformers' temperature warper."""
    want = np.array(_softmax_by_hand(z, T))
    got = distribution(z, T)
    assert got.dtype == np.float64 and got.shape == z.shape
    assert np.abs(got - want).max() < TOL and abs(got.sum() - 1) < TOL


def test_distribution_is_the_one_sampling_draws_from(z):
    """Reused, not copied: the same numbers as qkv.writing.sampling, and sample()'s draws follow them."""
    assert distribution is sampling.distribution
    for T in TEMPERATURES:
        assert np.array_equal(distribution(z, T), distribution(z[None], T)[0])          # any leading shape
    T = 1.5
    P = distribution(z, T)
    top, p_top = top_tokens(P, 5)
    rng = np.random.default_rng(7)
    draws = np.concatenate([sample(np.tile(z, (100, 1)), rng, T) for _ in range(30)])         # 3 000
    counts = np.array([(draws == i).sum() for i in top] + [(~np.isin(draws, top)).sum()])
    expected = np.append(p_top, 1 - p_top.sum()) * len(draws)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.515                                 # χ² with 5 degrees of freedom, significance 0.001


def test_temperature_zero_is_greedy_one_hot(z):
    P = distribution(z, 0)
    assert P.sum() == 1 and P[np.argmax(z)] == 1
    assert sample(z[None], np.random.default_rng(0), 0)[0] == np.argmax(z)
    assert entropy(P) == 0
    ties = distribution(np.array([1.0, 3.0, 3.0]), 0)
    assert ties.tolist() == [0, 1, 0]                    # the first of equal maxima, as np.argmax


def test_distribution_keeps_leading_axes():
    x = np.random.default_rng(0).normal(size=(2, 3, 7))
    for T in (0, 0.7):
        P = distribution(x, T)
        assert P.shape == x.shape and np.allclose(P.sum(-1), 1)


@pytest.mark.parametrize("T", [0.5, 1.0, 2.0])
def test_entropy_is_minus_sum_p_log2_p(z, T):
    P = distribution(z, T)
    want = -math.fsum(p * math.log2(p) for p in P.tolist() if p > 0)
    assert abs(float(entropy(P)) - want) < 1e-9
    assert entropy(np.full(8, 1 / 8)) == pytest.approx(3.0)                    # uniform over 8: 3 bits


def test_lower_temperature_sharpens_higher_flattens(z):
    H = [float(entropy(distribution(z, T))) for T in (0.25, 0.5, 1, 2, 4)]
    assert H == sorted(H) and H[-1] < math.log2(len(z))


def test_top_tokens_are_the_most_probable_in_order(z):
    P = distribution(z, 1.0)
    ids, p = top_tokens(P, 10)
    want = sorted(range(len(P)), key=lambda i: (-P[i], i))[:10]
    assert ids.tolist() == want and p.tolist() == [P[i] for i in want]
    order = [top_tokens(distribution(z, T), 10)[0].tolist() for T in (0.3, 1, 3)]
    assert order[0] == order[1] == order[2]                                    # T > 0 never reorders


def test_candidates_rebuild_the_full_vocabulary_probabilities(z):
    """top-k logits + rest(T) give softmax over all V tokens, not a renormalisation over the k kept."""
    temps = [0.1, 0.7, 1.0, 2.0]
    second = int(top_tokens(distribution(z, 1), 2)[0][1])
    far = int(np.argsort(z)[100])                                             # a token ranked far below the top
    c = candidates(np.stack([z, z]), [second, far], 10, temps)
    assert c["ids"].shape == (2, 11) and c["ids"][0, 10] == -1 and c["ids"][1, 10] == far
    assert c["rank"].tolist() == [2, 1 + int((z > z[far]).sum())]
    for row in range(2):
        ids = c["ids"][row][c["ids"][row] >= 0]
        zk = z[ids].astype(np.float64)
        for j, T in enumerate(temps):
            P = distribution(z, T)
            denom = np.exp(zk / T - zk.max() / T).sum() + np.exp(c["rest"][row, j] - zk.max() / T)
            p = np.exp(zk / T - zk.max() / T) / denom
            assert np.abs(p - P[ids]).max() < 1e-9
            other = np.exp(c["rest"][row, j] - zk.max() / T) / denom
            assert abs(other - (1 - P[ids].sum())) < 1e-9
            assert abs(c["entropy"][row, j] - entropy(P)) < 1e-12


def test_visible_whitespace_and_token_text(smollm2):
    assert visible(" the") == "␣the" and visible("\n\n") == "↵↵" and visible("\t") == "⇥"
    assert visible("") == "∅" and visible("a\x00b") == "a\\x00b"
    tok = smollm2.tokenizer
    assert token_text(tok, tok.token_to_id("ĠParis")) == "␣Paris"
    assert token_text(tok, tok.token_to_id("Ċ")) == "↵"
    partial = tok.token_to_id("âĢ")                                           # 2 of the 3 bytes of "…"
    assert partial is not None and token_text(tok, partial) == "⟨E2 80⟩"      # its bytes, not a lone U+FFFD


@pytest.mark.parametrize("bad, match", [(-1, "temperature must be ≥ 0"), (float("nan"), "temperature must be ≥ 0"),
                                        (1e-320, "too small to compute; give 0 for greedy or at least 0.0001")])
def test_bad_temperature_is_a_clear_error(bad, match):
    with pytest.raises(QkvError, match=match):
        distribution(np.zeros(3), bad)


def test_top_tokens_bad_input():
    with pytest.raises(QkvError, match="k must be a whole number"):
        top_tokens(np.ones(3) / 3, 0)
    with pytest.raises(QkvError, match="one distribution"):
        top_tokens(np.ones((2, 3)) / 3, 1)


def test_an_encoder_has_no_next_token(minilm):
    with pytest.raises(QkvError, match="is an encoder .* use a decoder"):
        next_token_logits(minilm, np.array([101, 102]))


# qkv next --------------------------------------------------------------------------

def table_rows(out: str) -> dict[str, list[str]]:
    """The printed table: token → its cells after the token column."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 3:
            rows[cells[1]] = cells[2:]
    return rows


def test_next_prints_top_k_per_temperature_and_entropy(monkeypatch, capsys, smollm2, z):
    code, out, err = run_main(monkeypatch, capsys, "next", PROMPT, "--model", "smollm2", "-t", "0,0.5,1,2",
                              "--top-k", "5")
    assert code == 0 and err == ""
    assert "SmolLM2-135M-Instruct: the next token after 5 tokens, P = softmax(logits / T)" in out
    assert "T=0" in out and "T=0.5" in out and "T=1" in out and "T=2" in out
    rows = table_rows(out)
    ids, _ = top_tokens(distribution(z, 1), 5)
    temps = [0, 0.5, 1, 2]
    for i in ids:
        cells = rows[token_text(smollm2.tokenizer, i)]
        assert cells[0] == str(int(i))
        assert [float(c) for c in cells[1:]] == pytest.approx([distribution(z, T)[i] for T in temps], abs=5e-5)
    assert rows["␣Paris"][1] == "1.0000"                                      # greedy: one-hot on " Paris"
    H = [float(c) for c in rows["entropy (bits)"][1:]]
    assert H == pytest.approx([float(entropy(distribution(z, T))) for T in temps], abs=5e-4)
    other = [float(c) for c in rows[f"other {len(z) - 5} tokens"][1:]]
    assert other == pytest.approx([1 - distribution(z, T)[ids].sum() for T in temps], abs=5e-5)


def test_next_repeated_t_equals_a_comma_list(monkeypatch, capsys):
    _, comma, _ = run_main(monkeypatch, capsys, "next", "Hello", "--model", str(MODELS / "gpt2"), "-t", "0.5,2")
    _, repeated, _ = run_main(monkeypatch, capsys, "next", "Hello", "--model", str(MODELS / "gpt2"),
                              "-t", "0.5", "--temperature", "2", "-t", "0.5")
    assert comma == repeated and "T=0.5" in comma and "T=2" in comma
    _, default, _ = run_main(monkeypatch, capsys, "next", "Hello", "--model", str(MODELS / "gpt2"))
    assert all(f"T={T}" in default for T in ("0.5", "1", "2"))
    assert sum(1 for line in default.splitlines() if line[:2].strip().isdigit()) == 10     # --top-k 10


def test_next_writes_the_bar_chart_atomically(monkeypatch, capsys, tmp_path):
    out = tmp_path / "chart"
    code, text, _ = run_main(monkeypatch, capsys, "next", PROMPT, "--model", "smollm2", "--out", str(out))
    assert code == 0
    assert sorted(os.listdir(out)) == ["next_token.png", "next_token.svg"]    # no temporary file left
    assert (out / "next_token.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / "next_token.svg").read_text()
    assert "<svg" in svg and "T = 0.5" in svg and "T = 2" in svg and "Paris" in svg and "bits" in svg
    assert f"wrote {out / 'next_token.png'}" in text


def test_next_chat_wraps_text_in_the_chat_template(monkeypatch, capsys, smollm2):
    question = "What is the capital of France?"
    code, out, _ = run_main(monkeypatch, capsys, "next", question, "--chat", "-t", "1")
    ids = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    assert code == 0 and f"the next token after {len(ids)} tokens" in out
    P = distribution(next_token_logits(smollm2, np.asarray(ids)), 1.0)
    top = int(np.argmax(P))
    assert table_rows(out)[token_text(smollm2.tokenizer, top)][1:] == [f"{P[top]:.4f}"]


def test_next_chat_without_a_template_is_one_line(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "next", "Hello", "--chat", "--model", str(MODELS / "gpt2"))
    assert code == 2 and out == "" and err.startswith("qkv: error: ") and err.count("\n") == 1
    assert "chat template" in err


@pytest.mark.parametrize("args, message", [
    (["--model", "minilm"],
     "all-MiniLM-L6-v2 is an encoder (bert): it has no next-token distribution; use a decoder, e.g. --model smollm2"),
    (["-t", "hot"], "temperature 'hot' is not a number; give numbers ≥ 0, e.g. -t 0.5,1,2"),
    (["-t", "0.5,-1"], "temperature must be ≥ 0 (0 = greedy), got -1.0"),
    (["-t", "1e-320"], "temperature 9.99989e-321 is too small to compute; give 0 for greedy or at least 0.0001"),
])
def test_next_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "next", "Hello", *args)
    assert code == 2 and out == "" and err == f"qkv: error: {message}\n"


def test_next_out_unwritable_is_one_line(monkeypatch, capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    code, _, err = run_main(monkeypatch, capsys, "next", "Hello", "--model", str(MODELS / "gpt2"),
                            "--out", str(tmp_path / "a-file" / "dir"))
    assert code == 2 and err.startswith("qkv: error: cannot write figures to") and err.count("\n") == 1
    assert os.listdir(tmp_path) == ["a-file"]


def test_candidates_of_a_vocabulary_smaller_than_k_keep_everything():
    z = np.array([[0.5, 2.0, -1.0, 1.0]])
    c = candidates(z, [2], 10, [0.5, 1.0])
    assert c["ids"].tolist() == [[1, 3, 0, 2, -1]] and c["rank"].tolist() == [4]
    assert np.isneginf(c["rest"]).all()                                       # nothing outside: the page gets null
    assert np.allclose(c["entropy"][0], [entropy(distribution(z[0], T)) for T in (0.5, 1.0)], atol=1e-12)
