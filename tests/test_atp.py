"""Attribution patching (qkv.analysis.atp) and `qkv atp`.

Identities that can fail:
  - each estimate is (a_clean − a_corrupted) · ∂m/∂a: it equals the central finite difference of the real pass
    (model.run with a hook moving the activation along a_clean − a_corrupted by ±ε), float64, within 1e-6 of
    the largest, on llama_gqa (GQA), gpt2, gemma2 (soft-caps), mixtral and qwen2_moe (routed FFNs), phi (a
    parallel block), olmo2 (output norms), granite (a residual multiplier), bloom (ALiBi), opt (post-norm,
    unembed_in) and an encoder's embedding metric (bert);
  - where the metric is linear in the activation from there on (the final norm removed, the last FFN
    silenced) AtP equals exact patching (`patch.patch`) for the last layer's heads, attn_out and ffn_out, and
    AtP* equals exact patching of its queries and keys (`patch_qkv`), within 1e-9, while AtP of the
    queries and keys (linear through the softmax) does not;
  - `agreement` on a hand-built pair: r, sign agreement and the cells wrong by more than half, worked out here;
  - on every fixture the comparison with exact patching gives real numbers in range (its value is reported,
    not held to a threshold: random weights make no circuit).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

import qkv
from conftest import FIXTURES, MODELS, patching_pair, run_main
from test_browser import browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_browser_interpret import fmt_e, hover_cell
from test_viewer import data_of
from qkv.analysis.atp import agreement, atp, compare, patch_qkv
from qkv.analysis.patch import EMBEDDING, patch, sentence_embedding
from qkv.analysis.sections import patch_payload
from qkv.runtime.errors import QkvError
from qkv.viz.html import save_viewer

FAMILIES = ["llama_gqa", "gpt2", "gemma2", "mixtral"]
MORE = ["phi", "olmo2", "granite", "bloom", "qwen2_moe", "opt"]   # the families' other paths (module doc)
EPS = 1e-5


def inputs(name: str, n: int = 9, at: int = 4):
    """`conftest.patching_pair` with the token at 4 changed."""
    return patching_pair(name, n, at)


def measured(model, ids, metric, hooks) -> float:
    """m of the real pass over IDS with HOOKS: the logit difference, or ("embedding", target) its cosine."""
    t = model.run(ids, keep=(), hooks=hooks)
    if metric[0] == EMBEDDING:
        return float(sentence_embedding(t.hidden[None])[0] @ metric[1])
    return float(t.logits[-1, metric[0]] - t.logits[-1, metric[1]])


def finite_difference(model, corrupted, metric, key: str, delta: np.ndarray) -> float:
    """d/dε m(corrupted with the activation KEY moved by ε·DELTA) at ε = 0, by central differences."""
    def moved(eps):
        return measured(model, corrupted, metric, {key: lambda v, layer: v + eps * delta})
    return (moved(EPS) - moved(-EPS)) / (2 * EPS)


def points(model, e, L: int, n: int):
    """(table, cell, hook key, what that hook's value moves by from the traces) for a few components."""
    last, H = L - 1, model.config.n_heads
    rows = [("heads", (0, 1), "0.heads.1", lambda c, k: c.layers[0].heads[1] - k.layers[0].heads[1]),
            ("residual", (last, 4), f"{last}.residual",
             lambda c, k: np.where(np.arange(n)[:, None] == 4, c.layers[last].residual - k.layers[last].residual, 0)),
            ("attn_out", (0, n - 1), "0.attn_out",
             lambda c, k: np.where(np.arange(n)[:, None] == n - 1, c.layers[0].attn_out - k.layers[0].attn_out, 0)),
            ("ffn_out", (0, 6), "0.ffn_out",
             lambda c, k: np.where(np.arange(n)[:, None] == 6, c.layers[0].ffn_out - k.layers[0].ffn_out, 0)),
            ("queries", (last, H - 1), f"{last}.q.{H - 1}",
             lambda c, k: c.layers[last].q[H - 1] - k.layers[last].q[H - 1]),
            ("keys", (0, 0), "0.k.0", lambda c, k: c.layers[0].k[0] - k.layers[0].k[0]),
            ("values", (last, 0), f"{last}.v.0", lambda c, k: c.layers[last].v[0] - k.layers[last].v[0])]
    if e.neurons is not None:
        i = int(np.argmax(np.abs(e.neurons[0])))
        rows.append(("neurons", (0, i), "0.neurons",
                     lambda c, k: np.where(np.arange(c.layers[0].neurons.shape[1]) == i,
                                           c.layers[0].neurons - k.layers[0].neurons, 0)))
    return rows


def check_gradients(model, clean, corrupted, metric, fd_metric):
    e = atp(model, clean, corrupted, metric, normalise=False, star=True)
    keep = ("residual", "heads", "attn_out", "ffn_out", "neurons", "q", "k", "v")
    c, k = model.run(clean, keep=keep), model.run(corrupted, keep=keep)
    L, n = model.config.n_layers, len(clean)
    checked = []
    for table, cell, key, delta in points(model, e, L, n):
        want = finite_difference(model, corrupted, fd_metric, key, delta(c, k))
        checked.append((table, getattr(e, table)[cell], want))
    top = max(abs(w) for _, _, w in checked)
    for table, got, want in checked:
        assert got == pytest.approx(want, abs=1e-6 * top + 1e-10), table
    return e


@pytest.mark.parametrize("name", FAMILIES + MORE)
def test_the_estimate_is_the_finite_difference_of_the_real_pass(name):
    model, clean, corrupted, metric = inputs(name)
    e = check_gradients(model, clean, corrupted, metric, metric)
    assert (e.neurons is None) == (name in ("mixtral", "qwen2_moe"))          # a routed FFN has no single hidden
    assert not e.residual[:, :4].any() and not e.attn_out[:, :4].any()      # before the change: bit for bit 0


def test_an_encoder_with_the_embedding_metric():
    model = qkv.load(MODELS / "bert", dtype=np.float64)
    rng = np.random.default_rng(0)
    clean = rng.integers(5, model.config.vocab_size, 8).tolist()
    corrupted = list(clean)
    corrupted[3] = (clean[3] + 11) % model.config.vocab_size
    target = sentence_embedding(model.run(clean, keep=()).hidden[None])[0]
    check_gradients(model, clean, corrupted, EMBEDDING, (EMBEDDING, target))
    a = compare(atp(model, clean, corrupted, EMBEDDING), patch(model, clean, corrupted, EMBEDDING))
    assert [x.table for x in a] == ["heads", "residual", "attn_out", "ffn_out"]


def linear_tail(name: str):
    """INPUTS(name) with the final norm removed and the last FFN's W_out zeroed: from the last layer's attention
    on, logits are linear in its Z, attn_out and ffn_out, and in its pattern A (V fixed)."""
    model, clean, corrupted, metric = inputs(name)
    w = model.weights
    last = w.blocks[-1]
    blocks = w.blocks[:-1] + [replace(last, ffn=replace(last.ffn, W_out=np.zeros_like(last.ffn.W_out)))]
    model.weights = replace(w, final_norm=None, blocks=blocks)
    return model, clean, corrupted, metric


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_exact_where_the_rest_is_linear(name):
    model, clean, corrupted, metric = linear_tail(name)
    e = atp(model, clean, corrupted, metric, star=True)
    p = patch(model, clean, corrupted, metric)
    q = patch_qkv(model, clean, corrupted, metric)
    for table in ("heads", "attn_out", "ffn_out"):
        assert np.allclose(getattr(e, table)[-1], getattr(p, table)[-1], rtol=0, atol=1e-9), table
    assert np.allclose(e.queries_star[-1], q["queries"][-1], rtol=0, atol=1e-9)
    assert np.allclose(e.keys_star[-1], q["keys"][-1], rtol=0, atol=1e-9)
    assert np.allclose(e.values[-1], q["values"][-1], rtol=0, atol=1e-9)      # V feeds no softmax: AtP is exact
    missed = np.abs(e.queries[-1] - q["queries"][-1]).max() + np.abs(e.keys[-1] - q["keys"][-1]).max()
    assert missed > 1e-4                                                    # linear through the softmax is not
    assert not np.allclose(e.residual[-1], p.residual[-1], atol=1e-6)        # before attention: not linear


def test_agreement_on_a_hand_built_pair():
    estimate = np.array([[1.0, 2.0], [-1.0, 0.1]])
    exact = np.array([[1.0, 2.5], [1.0, 0.3]])
    a = agreement(estimate, exact, "heads")
    e, x = estimate.ravel(), exact.ravel()
    r = ((e - e.mean()) * (x - x.mean())).sum() / math.sqrt(((e - e.mean()) ** 2).sum() * ((x - x.mean()) ** 2).sum())
    assert a.pearson == pytest.approx(r, abs=1e-12) and a.sign == 0.75 and a.cells == 4
    assert [(l, i) for l, i, _, _ in a.wrong] == [(1, 0), (1, 1)]            # |−2| > ½, |−0.2| > 0.15; largest first
    assert agreement(np.zeros((2, 2)), exact).wrong and math.isnan(agreement(np.zeros((2, 2)), exact).pearson)
    with pytest.raises(QkvError, match="one shape"):
        agreement(estimate, exact[:1])


@pytest.mark.parametrize("name", FAMILIES)
def test_beside_exact_patching_the_numbers_are_real(name):
    model, clean, corrupted, metric = inputs(name)
    e = atp(model, clean, corrupted, metric, star=True)
    for a in compare(e, patch(model, clean, corrupted, metric), patch_qkv(model, clean, corrupted, metric)):
        assert -1 - 1e-12 <= a.pearson <= 1 + 1e-12 and 0 <= a.sign <= 1, a.table
        assert all(abs(est - ex) > 0.5 * abs(ex) for _, _, est, ex in a.wrong)
        print(f"{name} {a.table}: r {a.pearson:.3f}, signs {a.sign:.2f}, wrong by > ½: {len(a.wrong)}/{a.cells}")


def test_mistakes_are_one_clear_error():
    model, clean, corrupted, metric = inputs("llama_gqa")
    for call, match in ((lambda: atp(model, clean, corrupted + [1], metric), "clean has 9 tokens and corrupted 10"),
                        (lambda: atp(model, clean, clean, metric), "same metric"),
                        (lambda: atp(model, clean, corrupted, lambda z: z[:, 0]), "differentiates the metric"),
                        (lambda: atp(model, clean, corrupted, (5, 10_000)), "outside")):
        with pytest.raises(QkvError, match=match) as e:
            call()
        assert len(str(e.value).splitlines()) == 1
    seq2seq = qkv.load(FIXTURES / "seq2seq" / "marian")
    with pytest.raises(QkvError, match="encoder–decoder") as e:
        atp(seq2seq, [5, 6, 7], [5, 8, 7], (1, 2))
    assert len(str(e.value).splitlines()) == 1


def test_the_cli(tmp_path, monkeypatch, capsys):
    gpt2 = str(MODELS / "gpt2")
    out, data = tmp_path / "out", tmp_path / "atp.json"
    code, text, err = run_main(monkeypatch, capsys, "atp", "the cat sat on the mat", "the dog sat on the mat", "--model", gpt2, "--token", " a", "--other", " the",
                               "--exact", "--star", "--json", str(data), "--out", str(out))
    assert code == 0, err
    assert "AtP" in text and "exact" in text and "Pearson" in text
    written = json.loads(data.read_text())
    model = qkv.load(gpt2)
    e = atp(model, "the cat sat on the mat", "the dog sat on the mat", (" a", " the"), star=True)
    assert np.allclose(written["atp"]["heads"], e.heads, atol=1e-5)
    assert [a["table"] for a in written["comparison"]][:4] == ["heads", "residual", "attn_out", "ffn_out"]
    assert written["exact"]["heads"] is not None
    assert sorted(f.name for f in out.iterdir()) == ["atp.html", "atp.json", "atp.png", "atp.svg", "patch.png",
                                                     "patch.svg"]
    section = data_of((out / "atp.html").read_text())["patch"]              # the exact maps, the estimate's beside
    assert section["estimate"]["method"] == "attribution patching (AtP*)" and section["method"] is None
    assert np.allclose(section["estimate"]["tables"]["heads"], e.heads, atol=1e-4)
    assert np.allclose(section["tables"]["heads"], written["exact"]["heads"], atol=1e-4)
    alone = tmp_path / "alone"                                               # no --exact: the estimate's maps
    code, text, err = run_main(monkeypatch, capsys, "atp", "the cat sat on the mat", "the dog sat on the mat", "--model", gpt2, "--token", " a", "--other", " the",
                               "--out", str(alone))
    assert code == 0 and "Pearson" not in text
    assert sorted(f.name for f in alone.iterdir()) == ["atp.html", "atp.json", "atp.png", "atp.svg"]
    section = data_of((alone / "atp.html").read_text())["patch"]
    assert section["method"] == "attribution patching (AtP)" and section["estimate"] is None
    assert np.allclose(section["tables"]["ffn_out"], e.ffn_out, atol=1e-4)
    code, _, err = run_main(monkeypatch, capsys, "atp", "the cat sat", "the dog sat on the mat",
                            "--model", gpt2, "--token", " a", "--other", " the", "--out", str(tmp_path / "bad"))
    assert code == 2 and "the same count" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_the_patch_panel_shows_the_estimate_beside_each_exact_map(tab, tmp_path):   # noqa: F811 (fixture)
    """In a real browser (test_browser.py's): each exact map has the estimate's beside it, and hovering a cell of
    either shows its number and the other's."""
    model = qkv.load(MODELS / "gpt2")
    clean, corrupted = "the cat sat on the mat", "the dog sat on the mat"
    e, p = atp(model, clean, corrupted, (" a", " the")), patch(model, clean, corrupted, (" a", " the"))
    path = save_viewer(model.run(clean, keep=("attentions",)), tmp_path / "atp.html",
                       sections={"patch": patch_payload(p, e)}, view="patch")
    data = data_of(path.read_text())["patch"]
    open_viewer(tab, path)
    page = tab.page
    assert page.locator(".qkv-patch canvas.qkv-heat-heads-est").count() == 1
    for name, r, c in [("heads-est", 1, 2), ("heads", 1, 2), ("ffn_out-est", 0, 5)]:
        hover_cell(page, f".qkv-heat-{name}", r, c)
        base = name.replace("-est", "")
        est, exact = data["estimate"]["tables"][base][r][c], data["tables"][base][r][c]
        shown = page.text_content(".qkv-patch .qkv-readout")
        assert shown.endswith(f"{fmt_e(est)} (exact {fmt_e(exact)})" if name != base else
                              f"{fmt_e(exact)} (estimate {fmt_e(est)})"), shown
    assert tab.dialogs == [] and tab.errors == []
