"""qkv.analysis.occlusion: occlusion and Shapley values equal a recomputation by hand (each absent token's id
replaced by the pad token's, through model.forward; Shapley by its permutation formula over all p! orders),
Shapley efficiency Σ φ = z(x) − z(baseline) to 1e-9 (float64) exactly enumerated and sampled, the symmetry
and dummy axioms on a constructed game, batches equal single rows, and `qkv attribute --method shapley`."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv.analysis import occlusion
from qkv.analysis.input_attribution import baseline_rows
from qkv.analysis.occlusion import _Game, exact_shapley, player_spans, prompt_attribution, sampled_shapley
from qkv.runtime.errors import QkvError

MODELS = Path(__file__).parent / "fixtures" / "models"
TEXT = "the cat sat"                     # llama_gqa: 6 tokens, 5 players with the first kept


@pytest.fixture(scope="module")
def llama():
    return qkv.load(MODELS / "llama_gqa", dtype=np.float64)


def _pad(model) -> int:
    """The pad baseline's token (as input_attribution.baseline_rows picks it)."""
    rows = np.zeros((1, 1, model.config.d_model))
    name = baseline_rows(model, rows, "pad")[1]                            # "pad (token N)"
    return int(name.split("token ")[1].rstrip(")"))


def _v(model, ids: np.ndarray, present: set[int], players: list[int], target: int) -> float:
    """z of the text with every player outside PRESENT's token id replaced by the pad token's, by model.forward."""
    changed = ids.copy()
    for i in players:
        if i not in present:
            changed[i] = _pad(model)
    return float(model.forward(changed[None], attentions=False).logits[0, -1, target])


def test_occlusion_equals_replacing_each_token_by_the_pad_token(llama):
    a = prompt_attribution(llama, TEXT, method="occlusion", baseline="pad")
    ids = np.asarray(a.ids)
    players = [s[0] for s in a.spans]
    assert players == list(range(1, len(ids)))                             # the first token kept
    full = _v(llama, ids, set(players), players, a.target)
    assert a.logit == pytest.approx(full, abs=1e-9)
    for j, i in enumerate(players):
        expected = full - _v(llama, ids, set(players) - {i}, players, a.target)
        assert a.span_scores[j] == pytest.approx(expected, abs=1e-9)
        assert a.scores[i] == pytest.approx(expected, abs=1e-9)
    assert a.scores[0] == 0.0


def test_exact_shapley_equals_the_permutation_formula_and_is_efficient(llama):
    a = prompt_attribution(llama, TEXT, method="shapley", baseline="pad")
    assert a.exact and a.evaluations == 2 ** len(a.spans)
    ids, players = np.asarray(a.ids), [s[0] for s in a.spans]
    v = {S: _v(llama, ids, set(S), players, a.target) for k in range(len(players) + 1)
         for S in itertools.combinations(players, k)}
    phi = np.zeros(len(players))
    for order in itertools.permutations(range(len(players))):               # all p! orders, by hand
        before: list[int] = []
        for j in order:
            phi[j] += v[tuple(sorted(before + [players[j]]))] - v[tuple(sorted(before))]
            before.append(players[j])
    phi /= math.factorial(len(players))
    np.testing.assert_allclose(a.span_scores, phi, rtol=0, atol=1e-9)
    gap = v[tuple(players)] - v[()]
    assert abs(a.span_scores.sum() - gap) <= 1e-9
    assert a.baseline_logit == pytest.approx(v[()], abs=1e-9)
    assert a.efficiency_error <= 1e-9 and a.to_json()["efficiency_error"] <= 1e-9


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_sampled_shapley_is_efficient_and_reproducible(name):
    model = qkv.load(MODELS / name, dtype=np.float64)
    a = prompt_attribution(model, "the cat sat on the mat", method="shapley", exact=False, samples=7, seed=3)
    assert a.samples == 8 and a.antithetic                                   # 4 pairs
    assert abs(a.span_scores.sum() - (a.logit - a.baseline_logit)) <= 1e-9 * max(1, abs(a.logit))
    assert a.scores.sum() == pytest.approx(a.span_scores.sum(), abs=1e-9)
    again = prompt_attribution(model, "the cat sat on the mat", method="shapley", exact=False, samples=7, seed=3)
    np.testing.assert_array_equal(a.span_scores, again.span_scores)
    other = prompt_attribution(model, "the cat sat on the mat", method="shapley", exact=False, samples=7, seed=4)
    assert not np.array_equal(a.span_scores, other.span_scores)


def test_batches_give_the_same_values_as_single_rows(llama):
    for method, exact in (("occlusion", None), ("shapley", True), ("shapley", False)):
        kw = dict(method=method, exact=exact, samples=6, spans="tokens")
        one = prompt_attribution(llama, "the cat sat on the mat", batch=1, **kw)
        many = prompt_attribution(llama, "the cat sat on the mat", **kw)
        np.testing.assert_allclose(one.span_scores, many.span_scores, rtol=0, atol=1e-12)


def _constructed(weights: np.ndarray, pair: float = 0.0) -> _Game:
    """A game of len(WEIGHTS) players, one position each, the rows 1 and the baseline 0: v(S) = Σ_{i∈S} w_i
    + PAIR · [0 ∈ S and 1 ∈ S]."""
    p = len(weights)

    def z(points: np.ndarray) -> np.ndarray:
        x = points[:, :, 0].astype(np.float64)                               # (b, p) 1 present, 0 absent
        return x @ weights + pair * x[:, 0] * x[:, 1]

    return _Game(z, np.ones((1, p, 2)), np.zeros((1, p, 2)), np.eye(p, dtype=bool), per=5)


def test_symmetry_and_dummy_axioms_on_a_constructed_game():
    w = np.array([0.5, 0.5, 0.0, 2.0])                                       # 0 and 1 symmetric, 2 a dummy
    phi, full, empty = exact_shapley(_constructed(w, pair=3.0))
    assert phi[0] == pytest.approx(phi[1], abs=1e-15)                        # symmetry
    assert phi[2] == 0.0                                                      # dummy: no marginal anywhere
    np.testing.assert_allclose(phi, [2.0, 2.0, 0.0, 2.0], atol=1e-15)        # the pair's 3 split evenly
    assert (full, empty) == (6.0, 0.0)
    rng = np.random.default_rng(0)
    sampled, _, _ = sampled_shapley(_constructed(w), 5, rng)                 # additive: any order gives w
    np.testing.assert_allclose(sampled, w, atol=1e-15)
    sampled, _, _ = sampled_shapley(_constructed(w * 0, pair=1.0), 3, rng)   # x0·x1: a pair and its reverse
    np.testing.assert_allclose(sampled, [0.5, 0.5, 0.0, 0.0], atol=1e-15)    # split it exactly


def test_a_broken_telescope_is_caught(monkeypatch):
    game = _constructed(np.array([1.0, 2.0, 3.0]))
    real = game.values
    monkeypatch.setattr(game, "values", lambda masks: real(masks) + 1e-6 * np.arange(len(masks)) ** 2)   # rows disagree
    with pytest.raises(AssertionError, match="efficiency"):
        sampled_shapley(game, 4, np.random.default_rng(0))


def test_spans_group_words_and_explicit_positions():
    labels = ["<s>", "The", "␣qu", "ick", "␣fox", ".", "↵", "Next"]
    assert player_spans(labels, "words", True) == [[1], [2, 3], [4, 5], [6], [7]]
    assert player_spans(labels, "words", False) == [[0, 1], [2, 3], [4, 5], [6], [7]]
    assert player_spans(["[CLS]", "play", "##ing", "now"], "words", True) == [[1, 2], [3]]
    assert player_spans(labels, "1-3,5", True) == [[1, 2, 3], [5]]
    for bad, says in (("1-3,3", "two groups"), ("0-9", "within"), ("a", "groups of positions"), ("3-1", "ends")):
        with pytest.raises(QkvError, match=says):
            player_spans(labels, bad, True)
    with pytest.raises(QkvError, match="nothing to attribute"):
        player_spans(labels, [], True)
    assert player_spans(["<s>"], "tokens", True) == [[0]]                    # a one-token text: its only token


def test_spans_of_words_share_their_score(llama):
    a = prompt_attribution(llama, "the cat sat on the mat", method="shapley", spans="words")
    for span, phi in zip(a.spans, a.span_scores):
        np.testing.assert_allclose(a.scores[span], phi / len(span), atol=1e-15)
    assert abs(a.span_scores.sum() - (a.logit - a.baseline_logit)) <= 1e-9


def test_mistakes_are_one_error(llama, monkeypatch):
    monkeypatch.setattr(occlusion, "MAX_EXACT_PLAYERS", 3)
    with pytest.raises(QkvError, match="exact Shapley"):
        prompt_attribution(llama, "the cat sat on the mat", exact=True)
    with pytest.raises(QkvError, match="--samples"):
        prompt_attribution(llama, TEXT, samples=0)
    with pytest.raises(QkvError, match="baseline"):
        prompt_attribution(llama, TEXT, baseline="blank")


def test_the_command_prints_and_writes_shapley_values(tmp_path):
    from qkv.cli.app import cli

    runner = CliRunner()
    args = ["attribute", TEXT, "--model", str(MODELS / "llama_gqa"), "--method", "shapley"]
    r = runner.invoke(cli, args + ["--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["method"] == "shapley" and data["exact"] and data["players"] == len(data["tokens"]) - 1
    assert abs(sum(data["span_scores"]) - (data["logit"] - data["baseline_logit"])) <= 1e-5   # float32 model
    r = runner.invoke(cli, args + ["--sampled", "--samples", "4", "--spans", "words", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "Shapley values of" in r.output and "4 permutations" in r.output
    page = (tmp_path / "o" / "attribute.html").read_text()
    assert '"method": "shapley"' in page or '"method":"shapley"' in page
    r = runner.invoke(cli, args + ["--spans", "0-99"])
    assert isinstance(r.exception, QkvError) and "--spans" in str(r.exception)     # main() prints it, exit 2
