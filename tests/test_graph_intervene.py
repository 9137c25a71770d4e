"""Interventions (qkv.graphs.intervene): the edit grammar and its one-line refusals; the edited pass of the real model
equals a hand-built edit of it (float64, constant hooks added one layer at a time); an edit of a feature that is
not active changes nothing, bit for bit; the graph's predicted change equals the replacement model's actual change
to first order (a scale by 1.001), and the prediction from the graph's own edges (qkv.graphs.graph, the engine's
backward) equals the one from the frozen forward pass.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS
from qkv.core.hooks import Hooks
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.graphs.graph import build_graph
from qkv.graphs.intervene import Edit, check_edits, graph_change, intervene, parse_edits, predicted_change
from qkv.graphs.prune import prune_graph
from qkv.graphs.replacement import replacement
from qkv.runtime.errors import QkvError
from test_graph_qk import TEXT, transcoders


def setup(family: str = "llama_gqa"):
    model = qkv.load(MODELS / family, dtype=np.float64)
    tcs = transcoders(model)
    return model, tcs, replacement(model, TEXT, tcs)


def test_the_grammar():
    assert parse_edits("L12:F881@5=0") == [Edit(12, 881, 5, "set", 0.0)]
    assert parse_edits("L12:F881@5*2, L3:F7=-1.5e-1,L0:F0@-1*0") == [
        Edit(12, 881, 5, "scale", 2.0), Edit(3, 7, None, "set", -0.15), Edit(0, 0, -1, "scale", 0.0)]
    assert [str(e) for e in parse_edits("L12:F881@5=0,L3:F7*2.5")] == ["L12:F881@5=0", "L3:F7*2.5"]
    for bad in ("", "L1F2=0", "L1:F2", "L1:F2@3", "L1:F-2=0", "L1:F2=abc", "L1:F2@3=0,", "F2@3=0"):
        with pytest.raises(QkvError, match="e.g.") as e:
            parse_edits(bad)
        assert "\n" not in str(e.value)


def test_edits_are_checked_against_the_model_in_one_line():
    model, tcs, rep = setup()
    n, L = len(rep.ids), model.config.n_layers
    assert check_edits(parse_edits("L-1:F3@-1=0"), tcs, L, n) == [Edit(1, 3, n - 1, "set", 0.0)]
    for spec, message in [("L2:F3=0", "layer 2 does not exist"), ("L1:F40=0", "feature 40 does not exist"),
                          ("L1:F3@10=0", "position 10 does not exist"), ("L1:F3@2=0,L1:F3@2*2", "give each once"),
                          ("L1:F3=0,L1:F3@2*2", "give each once")]:
        with pytest.raises(QkvError, match=message) as e:
            check_edits(parse_edits(spec), tcs, L, n)
        assert "\n" not in str(e.value)
    with pytest.raises(QkvError, match="no transcoder"):
        check_edits(parse_edits("L1:F3=0"), {0: tcs[0]}, L, n)


def hooked_logits(model, ids, hooks, layer: int | None = None):
    """(last logits (V,), ffn_in of LAYER (n, d) or None) of a pass with HOOKS (constant additions)."""
    rec = Recorder(keep=("ffn_in",))
    _, logits = transformer(model.weights, model.config, ids[None], np.ones((1, len(ids)), np.int64), rec=rec,
                            hooks=Hooks(hooks, model.config) if hooks else None)
    return logits[0, -1], None if layer is None else rec.store[layer]["ffn_in"][0]


def adding(vector_at: np.ndarray):
    """A hook adding VECTOR_AT (n, d) to the value (1, n, d)."""
    return lambda out, layer: out + vector_at[None]


def test_the_edit_equals_a_hand_built_edit_of_the_pass():
    """Set a layer-0 feature to 0 at one position and double a layer-1 feature everywhere: layer 1's old values
    are read on the pass that layer 0's edit already changed (hand-built: pass by pass, constant hooks)."""
    model, tcs, rep = setup()
    n, ids = len(rep.ids), rep.ids
    p = 4
    a = int(np.argmax(rep.acts[0][p]))
    b = int(np.argmax((rep.acts[1] != 0).sum(axis=0)))                    # a layer-1 feature active somewhere
    assert rep.acts[0][p, a] > 0 and (rep.acts[1][:, b] > 0).sum() >= 2
    got = intervene(model, TEXT, tcs, f"L0:F{a}@{p}=0,L1:F{b}*2", rep=rep)
    # hand-built: layer 0's change from the unedited pass, then layer 1's from the pass with it
    _, x0 = hooked_logits(model, ids, {}, 0)
    old_a = tcs[0].encode(x0[p:p + 1])[0, a]
    add0 = np.zeros((n, model.config.d_model))
    add0[p] = (0 - old_a) * tcs[0].W_dec[a]
    _, x1 = hooked_logits(model, ids, {"0.ffn_out": adding(add0)}, 1)
    old_b = tcs[1].encode(x1)[:, b]                                          # (n,)
    add1 = (2 * old_b - old_b)[:, None] * tcs[1].W_dec[b]                   # (n, d)
    want, _ = hooked_logits(model, ids, {"0.ffn_out": adding(add0), "1.ffn_out": adding(add1)})
    before, _ = hooked_logits(model, ids, {})
    assert np.abs(got.after - want).max() <= 1e-9 and np.abs(got.before - before).max() <= 1e-12
    assert np.abs(got.change).max() > 1e-3                                  # the edits do move the logits
    assert old_b[p] != pytest.approx(rep.acts[1][p, b])                     # layer 1 did read the edited pass
    applied = {(e.layer, q): (old, new) for e, q, old, new in got.applied}
    assert applied[(0, p)] == (pytest.approx(old_a), 0.0)
    assert [applied[(1, q)] for q in range(n)] == [(pytest.approx(o), pytest.approx(2 * o)) for o in old_b]


def test_an_inactive_feature_zeroed_changes_nothing():
    model, tcs, rep = setup()
    p = 2
    f = int(np.flatnonzero(rep.acts[0][p] == 0)[0])
    never = int(np.flatnonzero((rep.acts[1] == 0).all(axis=0))[0])          # a layer-1 feature never active
    for spec in (f"L0:F{f}@{p}=0", f"L0:F{f}@{p}*5", f"L1:F{never}=0"):
        r = intervene(model, TEXT, tcs, spec, rep=rep)
        assert np.array_equal(r.after, r.before)
        assert not np.any(r.predicted)
    r = intervene(model, TEXT, tcs, f"L0:F{f}@{p}=1", rep=rep)               # an inactive feature set: it moves
    assert np.abs(r.change).max() > 1e-4 and np.abs(r.predicted).max() > 1e-4


@pytest.mark.parametrize("family, tolerance", [("llama_gqa", 1e-8), ("gpt2", 1e-8), ("olmo2", 1e-8),
                                                ("gemma2", 1e-4)])
def test_the_prediction_is_the_replacement_models_change_to_first_order(family, tolerance):
    """Scale an active feature by 1.001 in the replacement model (patterns, norms and errors frozen; its features
    respond through their transcoders): the change is the prediction up to second order (Gemma 2's soft-capped
    logits are curved: their second-order term is ~1e-6 of the change)."""
    model, tcs, rep = setup(family)
    p = 3
    f = int(np.argmax(rep.acts[0][p]))
    r = intervene(model, TEXT, tcs, f"L0:F{f}@{p}*1.001", rep=rep, frozen=True)
    top = r.top(10)
    scale = np.abs(r.predicted[top]).max()
    assert scale > 1e-7
    assert np.abs(r.change[top] - r.predicted[top]).max() <= tolerance * scale
    np.testing.assert_allclose(r.before, rep.logits[-1], atol=1e-10)          # the replacement reproduces the model


def test_with_the_first_token_held_edits_skip_it_and_the_prediction_stays_first_order():
    """A graph holding position 0 (the attention sink) has no feature there: an edit without a position touches
    every other position (in the real pass and the prediction alike), an edit at position 0 is refused; the
    frozen pass's change is still the prediction to first order."""
    model, tcs = setup()[:2]
    rep = replacement(model, TEXT, tcs, (0,))
    f = int(np.argmax(rep.acts[0][3]))
    r = intervene(model, TEXT, tcs, f"L0:F{f}*1.001", rep=rep, frozen=True)
    assert {p for _, p, _, _ in r.applied} == set(range(1, len(rep.ids)))
    top = r.top(10)
    scale = np.abs(r.predicted[top]).max()
    assert scale > 1e-7 and np.abs(r.change[top] - r.predicted[top]).max() <= 1e-8 * scale
    np.testing.assert_allclose(r.before, rep.logits[-1], atol=1e-10)
    with pytest.raises(QkvError, match="position 0, which this graph holds"):
        intervene(model, TEXT, tcs, f"L0:F{f}@0=0", rep=rep)


def test_the_graphs_edges_predict_what_the_frozen_pass_predicts():
    """The prediction through every edge of the graph (built by the engine's backward) equals the frozen forward
    pass's, as the change of logit − mean logit; a pruned graph keeps only some of the paths."""
    model, tcs, _ = setup()
    graph = build_graph(model, TEXT, tcs)
    p = 4
    f = int(np.argmax(graph.rep.acts[0][p]))
    b = int(np.flatnonzero(graph.rep.acts[1][p])[0])
    edits = check_edits(parse_edits(f"L0:F{f}@{p}*1.7,L1:F{b}@{p}=0"), tcs, model.config.n_layers, len(graph.rep.ids))
    full = predicted_change(graph.rep, edits)                                # (V,)
    want = (full - full.mean())[graph.logit_ids]
    got = graph_change(graph, edits)
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max() and np.abs(want).max() > 1e-4
    pruned, _ = prune_graph(graph, 0.5, 0.5)
    assert graph_change(graph, edits, pruned).shape == want.shape
    inactive = int(np.flatnonzero(graph.rep.acts[0][p] == 0)[0])
    assert graph_change(graph, check_edits(parse_edits(f"L0:F{inactive}@{p}=1"), tcs, 2, len(graph.rep.ids))) is None


def test_the_printed_table():
    model, tcs, rep = setup()
    f = int(np.argmax(rep.acts[0][4]))
    r = intervene(model, TEXT, tcs, f"L0:F{f}@4=0,L1:F0=0", rep=rep)
    text = r.text(5)
    assert f"L0:F{f}@4=0 (was {rep.acts[0][4, f]:.4g})" in text and "L1:F0=0 (moved at" in text
    assert "predicted" in text.split("\n")[1] and len(r.rows(5)) >= 5
    row = r.rows(5)[0]
    assert row["change"] == pytest.approx(row["after"] - row["before"])
    assert row["token"] == r.spell(row["id"])


def test_qkv_graph_intervene_and_qk(tmp_path, monkeypatch, capsys):
    """`qkv graph … --intervene … --qk …` prints the logits' moves beside the prediction and the QK table with its
    sum check; a bad edit or pair is one line, exit 2, before any graph is built."""
    from conftest import run_main
    from qkv.features.saelens import save_saelens

    model, tcs, rep = setup()
    for layer, sae in tcs.items():
        save_saelens(sae, tmp_path / f"layer_{layer:02d}")
    f = int(np.argmax(rep.acts[0][4]))
    base = ("graph", TEXT, "--model", str(MODELS / "llama_gqa"), "--transcoders", str(tmp_path))
    code, out, err = run_main(monkeypatch, capsys, *base, "--intervene", f"L0:F{f}@4=0", "--qk", "1:3@7,4")
    assert code == 0, err
    assert "layer 1 head 3: query 7 → key 4" in out and "sum check" in out
    check = [line for line in out.splitlines() if "sum check" in line][0]
    assert float(check.split("|difference| ")[1].rstrip(")")) < 1e-5          # float32 here
    assert f"L0:F{f}@4=0 (was" in out and "predicted" in out and "pruned graph" in out
    for bad, message in [(("--intervene", "L0:F99=0"), "feature 99 does not exist"),
                         (("--qk", "1:3@4,7"), "key 7 comes after query 4"), (("--intervene", "L0F1"), "e.g.")]:
        code, out, err = run_main(monkeypatch, capsys, *base, *bad)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1
        assert "attributing" not in err
