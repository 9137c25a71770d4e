"""explain sparse and explain flash: every number recomputed here from the model's trace, in float64,
the page in English and Korean carrying those numbers, and the figures written."""

from __future__ import annotations

import dataclasses
import math
import re
import string

import numpy as np
import pytest
from rich.console import Console

import qkv
from qkv.core import sparse as sp
from qkv.runtime.errors import QkvError
from qkv.core.kernels import tiled_attention
from qkv.lessons import flash, sparse
from qkv.lessons.flash import TEXTS as FLASH_TEXTS
from qkv.lessons.sparse import TEXTS as SPARSE_TEXTS

COST = (128, 256)                                   # the cost part at small n: the test stays quick


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def sparse_lesson(smollm2):
    return sparse.build(smollm2, cost_sizes=COST, repeats=1)


@pytest.fixture(scope="module")
def flash_lesson(smollm2):
    return flash.build(smollm2)


def printed(parts: list) -> str:
    console = Console(record=True, width=400, highlight=False)
    for part in parts:
        console.print(part)
    return console.export_text()


def softmax64(s: np.ndarray) -> np.ndarray:
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


@pytest.mark.parametrize("texts", [SPARSE_TEXTS, FLASH_TEXTS])
def test_both_languages_have_the_same_sentences(texts):
    assert set(texts["en"]) == set(texts["ko"])
    for key in texts["en"]:
        assert fields(texts["en"][key]) == fields(texts["ko"][key]), key


def fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


# ── sparse ───────────────────────────────────────────────────────────────────────

def test_sparse_numbers_from_the_trace(sparse_lesson, smollm2):
    le = sparse_lesson
    count = lambda c: len(smollm2.encode(" ".join([sparse.PARAGRAPH] * c))[0])   # noqa: E731
    assert count(le.copies) >= sparse.MIN_TOKENS > count(le.copies - 1)   # the fewest copies that reach it
    assert le.copy_tokens == count(2) - count(1)
    trace = smollm2.run(" ".join([sparse.PARAGRAPH] * le.copies), layers=[0, 18])
    n = len(trace.tokens)
    assert le.n == n and (le.L, le.H, le.H_kv, le.d_k) == (30, 9, 3, 64)
    patterns = {p.name: p for p in sp.gallery(True, sparse.WINDOW, sparse.BLOCK)}
    assert [r.name for r in le.patterns] == list(patterns)
    for r in le.patterns:
        allowed = patterns[r.name].mask(n)                                  # (n, n)
        assert r.density == pytest.approx(allowed.mean())
        b = sparse.BLOCK
        tiles = [allowed[i:i + b, j:j + b] for i in range(0, n, b) for j in range(0, n, b)]
        assert (r.tiles.total, r.tiles.skipped) == (len(tiles), sum(not t.any() for t in tiles))
        for layer in (0, 18):                                               # recomputed: dense float64, masked
            lt = trace.layer(layer)
            q, k, v = (x.astype(np.float64) for x in (lt.q, lt.k, lt.v))
            k, v = np.repeat(k, 3, 0), np.repeat(v, 3, 0)
            s = np.where(allowed, q @ k.transpose(0, 2, 1) / 8.0, -np.inf)    # (H, n, n), √64 = 8
            z = softmax64(s) @ v
            Z = lt.heads.astype(np.float64)
            err = np.mean(np.linalg.norm(z - Z, axis=(1, 2)) / np.linalg.norm(Z, axis=(1, 2)))
            assert r.error[layer] == pytest.approx(err, rel=1e-3, abs=1e-5)
            assert r.mass[layer] == pytest.approx((lt.attentions * allowed).sum(-1).mean(), rel=1e-5)
    by = {r.name: r for r in le.patterns}
    assert by["causal"].error.max() < 1e-5 and by["causal"].mass.min() == pytest.approx(1.0, abs=1e-5)
    assert by["longformer"].mass.mean() > by["window"].mass.mean()          # the first token's weight comes back
    first = np.mean([trace.layer(i).attentions[:, sparse.WINDOW:, 0].mean() for i in (0, 18)])
    assert le.first_mass > 0 and abs(first - le.first_mass) < 0.5          # the full mean over 30 layers is in le


def test_sparse_cost_rows(sparse_lesson):
    c = sparse_lesson.cost
    assert [r["n"] for r in c["rows"]] == list(COST)
    names = ["dense", "tiled"] + [p.name for p in sp.gallery(True, sparse.WINDOW, sparse.BLOCK)]
    for row in c["rows"]:
        n, got = row["n"], row["methods"]
        assert list(got) == names
        assert all(m["seconds"] > 0 and m["peak_bytes"] > 0 for m in got.values())
        assert got["dense"]["peak_bytes"] >= 4 * 9 * n * n                 # the dense method holds H·n² scores
        if n >= 4 * sparse.WINDOW:     # O(n·window) against O(n²): at n = 128 the two are near (the worker
            assert got["window"]["peak_bytes"] < got["dense"]["peak_bytes"]   # threads' buffers vary, 0.6–1.0×)
        assert got["window"]["visited"] == int((sp.sliding_window(sparse.WINDOW).tiles(n, n, sparse.BLOCK) != 0).sum())


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_sparse_page_carries_the_numbers(sparse_lesson, lang):
    text = printed(sparse.render(sparse_lesson, lang))
    for r in sparse_lesson.patterns:
        assert r.label in text and f"{r.tiles.visited} / {r.tiles.total}" in text
        assert f"{r.error.mean():.3f}" in text and f"{r.mass.mean():.1%}" in text and f"{r.density:.1%}" in text
    assert f"n = {sparse_lesson.n}" in text and f"{sparse_lesson.first_mass:.1%}" in text
    for row in sparse_lesson.cost["rows"]:
        assert f"{row['methods']['window']['seconds'] * 1e3:.1f}" in text
    assert ("①" in text and "③" in text) and (("희소" in text) == (lang == "ko"))


def test_sparse_figures(sparse_lesson, tmp_path):
    paths = sparse.figures(sparse_lesson, tmp_path, "ko")
    assert sorted(p.name for p in paths) == sorted(f"sparse_{k}.{f}" for k in ("gallery", "error", "cost")
                                                   for f in ("png", "svg"))
    for p in paths:
        head = p.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in p.read_bytes()


def test_sparse_on_an_encoder(minilm):
    le = sparse.build(minilm, "The cat sat on the mat.", cost_sizes=(64,), repeats=1)
    assert not le.causal and le.patterns[0].name == "full" and le.n >= sparse.MIN_TOKENS
    assert le.patterns[0].density == 1.0 and le.patterns[0].tiles.skipped == 0


def test_sparse_fits_its_paragraph_to_a_short_context():
    from conftest import MODELS

    model = qkv.load(str(MODELS / "gpt2"))                       # a context of 128 positions
    le = sparse.build(model, None, cost_sizes=(64,), repeats=1)
    assert model.config.max_positions == 128 and 64 < le.n <= 128 and le.copies >= 2
    with pytest.raises(QkvError, match="reads at most 128"):      # the user's own text is not cut
        sparse.build(model, "word " * 200, cost_sizes=(64,), repeats=1)


def test_sparse_refuses_a_long_text(minilm):
    with pytest.raises(QkvError, match="at most"):
        sparse.build(minilm, "word " * 1100, cost_sizes=(64,), repeats=1)


# ── flash ────────────────────────────────────────────────────────────────────────

def head_inputs(model, le):
    lt = model.run(flash.DEFAULT_TEXT).layer(le.layer)
    G = model.config.n_heads // model.config.n_kv_heads
    return lt, lt.q[le.head].astype(np.float64), lt.k[le.head // G].astype(np.float64), lt.v[le.head // G].astype(
        np.float64)


def test_flash_steps_recomputed(flash_lesson, smollm2):
    le = flash_lesson
    lt, q, k, v = head_inputs(smollm2, le)
    n = len(q)
    assert (le.n, le.block, le.row, le.causal) == (n, math.ceil(n / 3), n - 1, True)
    s = q[le.row] @ k.T / 8.0                                          # (n,) the last row sees every key
    for st in le.steps:
        seen = slice(0, st.k1)
        m = s[seen].max()
        assert st.m_new == pytest.approx(m, abs=1e-12)
        assert st.l_new == pytest.approx(np.exp(s[seen] - m).sum(), rel=1e-12)
        np.testing.assert_allclose(st.acc_new, np.exp(s[seen] - m) @ v[seen], rtol=1e-10, atol=1e-12)
        if st.k0:
            old = s[:st.k0].max()
            assert st.m_old == pytest.approx(old, abs=1e-12) and st.rescale == pytest.approx(math.exp(old - m))
        else:
            assert st.m_old == -np.inf and st.rescale == 0.0 and st.l_old == 0.0
    np.testing.assert_allclose(le.out, softmax64(s) @ v, atol=1e-12)
    np.testing.assert_allclose(le.out, lt.heads[le.head, le.row], atol=1e-5)
    z = tiled_attention(lt.q[None, le.head:le.head + 1], lt.k[None, le.head // 3:le.head // 3 + 1],
                        lt.v[None, le.head // 3:le.head // 3 + 1], causal=True, block_size=le.block)[0, 0]
    np.testing.assert_allclose(le.block_out, z[le.q0:le.q1], atol=1e-5)


def test_flash_picks_the_head_whose_max_grows_most(flash_lesson, smollm2):
    le = flash_lesson
    trace = smollm2.run(flash.DEFAULT_TEXT)
    counts = {}
    for layer in trace.layer_ids:
        lt = trace.layer(layer)
        for h in range(9):
            s = lt.q[h, le.row].astype(np.float64) @ lt.k[h // 3].astype(np.float64).T
            tops = np.maximum.accumulate([s[j:j + le.block].max() for j in range(0, le.n, le.block)])
            counts[layer, h] = int((np.diff(tops) > 0).sum())
    assert counts[le.layer, le.head] == max(counts.values()) >= 1
    assert sum(st.m_new > st.m_old for st in le.steps[1:]) == counts[le.layer, le.head]


def test_flash_block_of_queries(flash_lesson, smollm2):
    le = flash_lesson
    lt, q, k, v = head_inputs(smollm2, le)
    S = np.where(np.tril(np.ones((le.n, le.n), bool)), q @ k.T / 8.0, -np.inf)
    kinds = {"full", "partial", "hidden"}
    assert {bt.kind for bt in le.block_tiles} == kinds                  # the middle block shows all three
    for bt in le.block_tiles:
        part = S[le.q0:le.q1, bt.k0:bt.k1]
        want = "hidden" if np.isneginf(part).all() else "full" if np.isfinite(part).all() else "partial"
        assert bt.kind == want
        m = S[le.q0:le.q1, :bt.k1].max(-1)
        np.testing.assert_allclose(bt.m, m, atol=1e-12)
        np.testing.assert_allclose(bt.l, np.exp(S[le.q0:le.q1, :bt.k1] - m[:, None]).sum(-1), rtol=1e-12)
    assert (le.grid == sp.HIDDEN).sum() == sum(range(le.grid.shape[0]))    # the tiles above the diagonal


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_flash_page_carries_the_numbers(flash_lesson, lang):
    le = flash_lesson
    text = printed(flash.render(le, lang))
    for st in le.steps:
        assert f"{st.rescale:.4f}" in text and f"{st.m_new:.3f}" in text and f"{st.l_new:.3f}" in text
    assert f"{le.out[0]:+.3f}, {le.out[1]:+.3f}" in text
    for bt in le.block_tiles:
        if bt.kind != "hidden":
            assert f"m {bt.m[0]:.2f} · ℓ {bt.l[0]:.2f}" in text
    assert f"layer {le.layer}" in text if lang == "en" else f"{le.layer}번 층" in text


def test_flash_figures(flash_lesson, tmp_path):
    paths = flash.figures(flash_lesson, tmp_path, "en")
    assert sorted(p.name for p in paths) == ["flash_steps.html", "flash_steps.png", "flash_steps.svg",
                                             "flash_tiles.png", "flash_tiles.svg"]
    assert all(p.stat().st_size > 1000 for p in paths)
    page = (tmp_path / "flash_steps.html").read_text()
    frames = len(flash_lesson.steps) + 1                                   # one a step, and the end
    assert page.count('class="frame"') == frames and page.count("<svg") == frames
    assert "<script src" not in page and not re.search(r"(src|href)=[\"'](https?:|//)", page)   # nothing loaded


def test_flash_animation_in_korean_embeds_the_hangul_face(flash_lesson):
    """The page's title is Korean text: its font stack names the embedded face, which holds the title's syllables."""
    from qkv.viz.hangul import FAMILY

    page = flash._animation(flash_lesson, FLASH_TEXTS["ko"])
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert re.search("[\uac00-\ud7a3]", title)
    assert f'@font-face {{ font-family: "{FAMILY}"; src: url(data:font/woff;base64,' in page
    assert re.search(rf"body\{{font-family:[^}}]*'{FAMILY}'[^}}]*sans-serif", page)


def test_flash_animation_escapes_the_tokens(flash_lesson):
    labels = list(flash_lesson.labels)
    labels[flash_lesson.row] = "<img src=x onerror=alert(1)>"
    page = flash._animation(dataclasses.replace(flash_lesson, labels=labels), FLASH_TEXTS["en"])
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_flash_on_an_encoder_with_a_chosen_head(minilm):
    le = flash.build(minilm, layer=0, head=2, block=4)
    assert (le.layer, le.head, le.block, le.causal, le.row) == (0, 2, 4, False, 3)
    assert (le.grid == sp.FULL).all() and len(le.steps) == math.ceil(le.n / 4)
    t = minilm.run(flash.DEFAULT_TEXT, layers=[0]).layer(0)
    np.testing.assert_allclose(le.out, t.heads[2, 3], atol=1e-5)
    with pytest.raises(QkvError):
        flash.build(minilm, layer=0, head=12)


@pytest.mark.parametrize("family", ["phi3", "qwen2_sliding", "gemma2", "gemma3_text", "starcoder2"])
def test_flash_on_sliding_and_soft_capped_layers(family):
    """Each layer as the model computes it: its sliding window (keys further back than w are −∞ in S, the
    kernel told the window) and Gemma 2's soft-cap; the tiled result equals the model's head output."""
    from conftest import MODELS

    model = qkv.load(MODELS / family)
    text = list(range(3, 3 + 14))                                     # 14 tokens: longer than every window
    cfg = model.config
    assert any(cfg.window(li) and cfg.window(li) < 14 for li in range(cfg.n_layers))
    for li in range(cfg.n_layers):
        le = flash.build(model, text, layer=li, head=0, block=4)
        t = model.run(text).layer(li)
        np.testing.assert_allclose(le.out, t.heads[0, le.row], rtol=1e-4, atol=1e-5)
        w = cfg.window(li)
        if w:
            assert np.isneginf(le.S[le.row, :le.row - w + 1]).all() and np.isfinite(le.S[le.row, le.row - w + 1:le.row + 1]).all()


def test_flash_refuses_an_encoders_local_layer():
    from conftest import MODELS

    model = qkv.load(MODELS / "modernbert_local")
    local = next(li for li in range(model.config.n_layers) if model.config.window(li))
    with pytest.raises(QkvError, match="local layer"):
        flash.build(model, list(range(3, 12)), layer=local, head=0)


# ── the benchmark (the lesson's cost part at larger n) ───────────────────────────

def test_bench_sparse_writes_its_section(monkeypatch, capsys, tmp_path):
    from conftest import run_main

    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nkept prose\n")
    code, stdout, err = run_main(monkeypatch, capsys, "bench", "sparse", "--sizes", "96", "--sizes", "160",
                                 "--repeats", "1", "--window", "16", "--block", "16", "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept prose\n") and "<!-- bench:sparse -->" in text
    assert "## Sparse attention" in text and "vector extensions" in text
    assert "qkv bench sparse --sizes 96 --sizes 160 --repeats 1 --window 16 --block 16 --out" in text
    rows = [line for line in text.splitlines() if line.startswith("| 160 |")]
    assert len(rows) == 3                                                   # time, memory, tiles
    tiles = rows[2].split("|")[2:-1]                                        # causal … block
    p = sp.sliding_window(16)
    want = f"{p.density(160):.1%} · {int((p.tiles(160, 160, sp.BLOCK) != 0).sum())}/{p.tiles(160, 160, sp.BLOCK).size}"
    assert tiles[1].strip() == want


def test_bench_sparse_refuses_bad_sizes(monkeypatch, capsys):
    from conftest import run_main

    code, _, err = run_main(monkeypatch, capsys, "bench", "sparse", "--sizes", "0")
    assert code == 2 and "--sizes" in err and "Traceback" not in err
    from qkv.bench import sparse as sb

    with pytest.raises(QkvError, match="--sizes"):
        sb.measure(sizes=())
