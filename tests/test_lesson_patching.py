"""explain patching: exact patching, AtP and path patching of one head, every number the page prints recomputed
here another way in float64 on the tiny fixtures — whole hooked forward passes (no batched run from the middle),
finite differences of whole passes instead of a backward, the path's Δ from W_O by explicit arithmetic — the page
in English and Korean, a wrong number refused, the figure, and the command line."""

from __future__ import annotations

import re
import string

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import MODELS, patching_pair, run_main
from qkv.lessons import TOPICS, lesson_module, patching
from qkv.lessons.patching import TEXTS
from qkv.runtime.errors import QkvError

TOL = 1e-8                         # float64: the lesson's numbers against this file's
FAMILIES = ["llama_gqa", "gpt2", "qwen2"]


def inputs(name: str, n: int = 9, at: int = 2):
    """`conftest.patching_pair` with the token at 2 changed."""
    return patching_pair(name, n, at)


@pytest.fixture(scope="module", params=FAMILIES)
def case(request):
    model, clean, corrupted, metric = inputs(request.param)
    return model, clean, corrupted, metric, patching.build(model, pair=(clean, corrupted), metric=metric)


def m_of(model, ids, metric, hooks=None) -> float:
    z = model.run(ids, keep=(), hooks=hooks).logits[-1]
    return float(z[metric[0]] - z[metric[1]])


def with_head(layer: int, head: int, z: np.ndarray) -> dict:
    """A hook on the whole of layer LAYER's Z (B, H, n, d_k) setting head HEAD's to Z (n, d_k)."""
    def fn(v, _l):
        v = v.copy()
        v[:, head] = z
        return v
    return {f"{layer}.heads": fn}


def printed(lesson, lang: str) -> str:
    console = Console(record=True, width=400, highlight=False)
    for part in patching.render(lesson, lang):
        console.print(part)
    return console.export_text()


def fields(s: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(s) if name}


def test_both_languages_have_the_same_sentences():
    assert set(TEXTS["en"]) == set(TEXTS["ko"])
    for key in TEXTS["en"]:
        assert fields(TEXTS["en"][key]) == fields(TEXTS["ko"][key]), key


def test_the_topic_is_registered():
    m = lesson_module("patching")
    assert m is patching and m.DEFAULT_MODEL == "smollm2" and callable(m.render) and callable(m.figures)
    assert list(TOPICS).index("patching") == list(TOPICS).index("vit") + 1


# ── every number, recomputed ─────────────────────────────────────────────────────

def test_the_metric_and_exact_patching(case):
    model, clean, corrupted, metric, le = case
    c, k = model.run(clean, keep=("heads",)), model.run(corrupted, keep=("heads",))
    assert le.m_clean == pytest.approx(m_of(model, clean, metric), abs=TOL)
    assert le.m_corrupted == pytest.approx(m_of(model, corrupted, metric), abs=TOL)
    zc, zk = c.logits[-1], k.logits[-1]
    assert le.logits["clean"] == pytest.approx((zc[metric[0]], zc[metric[1]]), abs=TOL)
    assert le.logits["corrupted"] == pytest.approx((zk[metric[0]], zk[metric[1]]), abs=TOL)
    scale = le.m_clean - le.m_corrupted
    # every head's exact effect by a whole hooked pass: the table the lesson chose from and correlated
    exact = np.array([[(m_of(model, corrupted, metric, with_head(l, h, c.layers[l].heads[h])) - le.m_corrupted)
                       / scale for h in range(le.H)] for l in range(le.L)])                   # (L, H)
    np.testing.assert_allclose(le.heads_exact, exact, atol=TOL)
    l, h = le.layer, le.head
    assert l < le.L - 1 and abs(exact[l, h]) == np.abs(exact[:le.L - 1]).max()            # the head it follows
    assert le.exact == pytest.approx(exact[l, h], abs=TOL)
    assert le.m_patched == pytest.approx(exact[l, h] * scale + le.m_corrupted, abs=TOL)


def directional(model, ids, metric, layer, head, z, dz, eps=1e-5) -> float:
    """dz · ∂m/∂Z at Z = z of head LAYER.HEAD, by a central difference of whole hooked passes."""
    up = m_of(model, ids, metric, with_head(layer, head, z + eps * dz))
    down = m_of(model, ids, metric, with_head(layer, head, z - eps * dz))
    return (up - down) / (2 * eps)


def test_atp_by_finite_differences_of_whole_passes(case):
    model, clean, corrupted, metric, le = case
    c, k = model.run(clean, keep=("heads",)), model.run(corrupted, keep=("heads",))
    scale = le.m_clean - le.m_corrupted
    atp = np.array([[directional(model, corrupted, metric, l, h, k.layers[l].heads[h],
                                 c.layers[l].heads[h] - k.layers[l].heads[h]) / scale
                     for h in range(le.H)] for l in range(le.L)])                             # (L, H)
    np.testing.assert_allclose(le.heads_atp, atp, atol=1e-6)
    l, h = le.layer, le.head
    assert le.estimate == pytest.approx(atp[l, h], abs=1e-6)
    z, dz = k.layers[l].heads[h], c.layers[l].heads[h] - k.layers[l].heads[h]               # (n, d_k)
    moved = [p for p in range(len(dz)) if np.any(dz[p])]
    assert sorted(p for p, _, _ in le.terms) == moved
    for p, size, term in le.terms:                                                       # each term, alone
        one = np.zeros_like(dz)
        one[p] = dz[p]
        assert size == pytest.approx(np.linalg.norm(dz[p]), abs=TOL)
        assert term == pytest.approx(directional(model, corrupted, metric, l, h, z, one, eps=3e-5), abs=1e-6)
    assert [abs(t) for _, _, t in le.terms] == sorted((abs(t) for _, _, t in le.terms), reverse=True)
    assert sum(t for _, _, t in le.terms) / scale == pytest.approx(le.estimate, abs=1e-6)
    for t, m, line in le.line:                                                           # the real m and AtP's line
        assert m == pytest.approx(m_of(model, corrupted, metric, with_head(l, h, z + t * dz)), abs=TOL)
        assert line == pytest.approx(le.m_corrupted + t * atp[l, h] * scale, abs=1e-6)
    assert [t for t, _, _ in le.line] == list(patching.STEPS)
    assert le.pearson == pytest.approx(np.corrcoef(atp.ravel(), le.heads_exact.ravel())[0, 1], abs=1e-6)
    x = le.heads_exact.ravel()
    assert le.sign == pytest.approx(np.mean(np.sign(atp.ravel()[x != 0]) == np.sign(x[x != 0])))
    assert le.off == int(np.sum(np.abs(atp - le.heads_exact) > 0.5 * np.abs(le.heads_exact)))


def test_path_patching_by_explicit_arithmetic(case):
    """The sender's Δ = (Z_corr − Z_clean)_h · W_O[h] (these families have no output norm, no multiplier); the
    receiver's queries from a pass on x_clean + Δ; the metric of the clean run with them hooked in."""
    model, clean, corrupted, metric, le = case
    cfg, w = model.config, model.weights
    l, h = le.layer, le.head
    assert w.blocks[l].attn_out_norm is None and cfg.residual_multiplier == 1
    c = model.run(clean, keep=("heads", "residual"))
    k = model.run(corrupted, keep=("heads",))
    dk = cfg.d_head
    delta = (k.layers[l].heads[h] - c.layers[l].heads[h]) @ w.blocks[l].attn.W_O[h * dk:(h + 1) * dk]   # (n, d)

    def m_path(rl: int, rh: int) -> float:
        x = c.layers[rl].residual + delta
        q = model.run(clean, keep=("q",), hooks={f"{rl}.residual": lambda v, _l: x[None]}).layers[rl].q[rh]

        def with_query(v, _l):
            v = v.copy()
            v[:, rh] = q
            return v
        return m_of(model, clean, metric, {f"{rl}.q": with_query})

    scale = le.m_clean - le.m_corrupted
    paths = {(rl, rh): (m_path(rl, rh) - le.m_clean) / scale for rl in range(l + 1, le.L) for rh in range(le.H)}
    assert le.receiver == max(paths, key=lambda r: abs(paths[r]))          # the later head the path moves m most by
    assert le.m_path == pytest.approx(m_path(*le.receiver), abs=TOL)
    assert le.path == pytest.approx(paths[le.receiver], abs=TOL)
    noised = m_of(model, clean, metric, with_head(l, h, k.layers[l].heads[h]))
    assert le.noising == pytest.approx((noised - le.m_clean) / scale, abs=TOL)


# ── the page, a wrong number, the figure ─────────────────────────────────────────

@pytest.mark.parametrize("lang, words", [("en", ("① The metric", "② Exact patching of head", "Pearson r",
                                                 "④ Path patching", "⑤ Side by side")),
                                         ("ko", ("① 지표", "② 헤드", "피어슨 r", "④ 경로 패칭", "⑤ 나란히 보기"))])
def test_the_page_prints_the_numbers(case, lang, words):
    *_, le = case
    text = printed(le, lang)
    for w in words:
        assert w in text
    assert le.auto and (TEXTS[lang]["exact_auto"].format(L=le.L, H=le.H)[:20] in text)
    for value in (le.m_clean, le.m_corrupted, le.m_patched, le.exact, le.estimate, le.path, le.noising, le.m_path):
        assert f"{value:+.4f}" in text
    assert f"{le.pearson:.3f}" in text and f"{le.layer}.{le.head}" in text
    assert f"{le.receiver[0]}.{le.receiver[1]}" in text
    for p, _, t in le.terms[:patching.TERMS]:
        assert f"{t:+.4f}" in text


def _nudged(result):
    """A result of the engine with its number moved by 1e-3: what a bug would print."""
    if isinstance(result, float):
        return result + 1e-3
    if hasattr(result, "effect"):
        result.effect += 1e-3
    else:
        result.heads = result.heads + 1e-3
    return result


@pytest.mark.parametrize("name, message", [("patch", "m(clean), m(corrupted) from the whole pass"),
                                           ("atp", "AtP: Σ_p Δa_p·∂m/∂a_p by central differences"),
                                           ("path_patch", "the path alone against its cell"),
                                           ("patch_one", "the sender's whole effect on the clean run")])
def test_a_wrong_number_cannot_print(monkeypatch, name, message):
    model, clean, corrupted, metric = inputs("llama_gqa")
    real = getattr(patching, name)

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        if name == "patch":
            out.clean += 1e-3
            return out
        return _nudged(out)
    monkeypatch.setattr(patching, name, wrong)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        patching.build(model, pair=(clean, corrupted), metric=metric)


def test_the_figure(case, tmp_path):
    *_, le = case
    written = patching.figures(le, tmp_path, "ko")
    assert sorted(p.name for p in written) == ["patching.png", "patching.svg"]
    assert all(p.stat().st_size > 0 for p in written)


def test_a_chosen_head_and_mistakes():
    model, clean, corrupted, metric = inputs("llama_gqa")
    le = patching.build(model, pair=(clean, corrupted), metric=metric, layer=0, head=3)
    assert (le.layer, le.head) == (0, 3) and le.exact == pytest.approx(le.heads_exact[0, 3])
    assert not le.auto and "patch moves m most" not in printed(le, "en")     # only said of the head it picks
    with pytest.raises(QkvError, match="in the last layer"):
        patching.build(model, pair=(clean, corrupted), metric=metric, layer=-1, head=0)
    with pytest.raises(QkvError, match="give both --layer and --head"):
        patching.build(model, pair=(clean, corrupted), metric=metric, layer=0)
    with pytest.raises(QkvError, match=re.escape("'CLEAN | CORRUPTED'")):
        patching.build(model, "just one prompt")
    with pytest.raises(QkvError, match="the same count"):
        patching.build(model, pair=(clean, corrupted[:-1]), metric=metric)
    with pytest.raises(QkvError, match="is an encoder"):
        patching.build(qkv.load(MODELS / "bert"))


def test_the_command_line(monkeypatch, capsys, tmp_path):
    gqa = str(MODELS / "llama_gqa")
    code, out, err = run_main(monkeypatch, capsys, "explain", "patching", "the cat sat | the dog sat", "--model", gqa,
                              "--lang", "ko", "--layer", "0", "--head", "2", "--out", str(tmp_path))
    assert code == 0, err
    assert "qkv explain patching ·" in out and "② 헤드 0.2의 정확한 패칭" in out and "⑤ 나란히 보기" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["patching.png", "patching.svg"]
    code, out, err = run_main(monkeypatch, capsys, "explain", "patching", "the cat sat", "--model", gqa)
    assert code == 2 and "CLEAN | CORRUPTED" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_main(monkeypatch, capsys, "explain", "--help")
    assert "\n    patching " in out
