"""`qkv bench atp` on the fixtures: its numbers are `compare(atp(…), patch(…))`, its report names every family.

The SmolLM2 part (IOI pairs, timing) runs only as `qkv bench atp`; here its report is rendered from made-up
numbers, and its pairs are checked on a stand-in tokenizer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS
from qkv.analysis.atp import atp, compare
from qkv.analysis.patch import patch
from qkv.bench import atp as ab
from qkv.cli.bench import atp_command_line, bench

FAMILY = "llama_gqa"


@pytest.fixture(scope="module")
def families() -> list[dict]:
    return ab.fixtures(MODELS)


def test_the_numbers_are_compare_of_atp_and_patch_computed_directly(families):
    model = qkv.load(MODELS / FAMILY, dtype=np.float64)
    clean = np.random.default_rng(3).integers(0, model.config.vocab_size, 9)      # the pair the section documents
    corrupted = clean.copy()
    corrupted[4] = (clean[4] + 7) % model.config.vocab_size
    moved = model.run(clean, keep=()).logits[-1] - model.run(corrupted, keep=()).logits[-1]
    metric = (int(np.argmax(moved)), int(np.argmin(moved)))
    assert ab.fixture_pair(model) == (clean.tolist(), corrupted.tolist(), metric)
    want = compare(atp(model, clean.tolist(), corrupted.tolist(), metric),
                   patch(model, clean.tolist(), corrupted.tolist(), metric))
    got = next(f for f in families if f["family"] == FAMILY)
    assert got["kind"] == "decoder" and list(got["tables"]) == [a.table for a in want] == list(ab.TABLES)
    for a in want:
        t = got["tables"][a.table]
        assert t["pearson"] == pytest.approx(a.pearson, abs=1e-12) and t["sign"] == pytest.approx(a.sign, abs=1e-12)
        assert (t["cells"], t["wrong"]) == (a.cells, len(a.wrong))
    text = ab.markdown(families, None)
    row = next(line for line in text.splitlines() if line.startswith(f"| {FAMILY} |"))
    heads = want[0]
    assert f"r {heads.pearson:.2f} · signs {heads.sign:.0%}" in row and f"{len(heads.wrong)}/{heads.cells} off" in row


def test_the_report_names_every_family_and_why_one_is_not_measured(families):
    text = ab.markdown(families, None)
    names = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file())
    assert [f["family"] for f in families] == names
    for name in names:
        assert name in text, name
    kinds = {f["family"]: f["kind"] for f in families}
    assert kinds["whisper"] == "refused" and kinds["bert"] == "encoder" and kinds["gpt2"] == "decoder"
    assert ("| whisper | refused: attribution patching of an encoder–decoder (whisper) is not supported; use qkv "
            "patch, which patches its decoder exactly |") in text
    assert "Not decoders, so not in the table" in text and "bert, bert_pooler" in text
    assert str(MODELS) not in text and "### Every family fixture" in text and "IOI" not in text
    assert text.endswith(f"```sh\n{ab.COMMAND}\n```")


def test_rounding_cells_count_as_zero():
    """A cell patching leaves at 1e-16 and AtP at 0 is neither a wrong sign nor a wrong cell; a real one is."""
    from qkv.analysis.atp import agreement

    exact = np.array([[1e-16, 1.0], [0.5, -0.2]])
    estimate = np.array([[0.0, 1.1], [-0.5, -0.21]])
    kept = ab._agreement(agreement(estimate, exact, "heads"))
    assert kept["wrong"] == 1 and kept["wrong_cells"][0][:2] == [1, 0]      # (1, 0): the wrong sign
    assert kept["sign"] == pytest.approx(2 / 3)
    assert "signs 67% · 1/4 off" in ab._cell(kept)
    loud = agreement(np.array([[0.3, 1.0], [0.5, -0.2]]), exact, "heads")     # an estimate where nothing moves
    assert [w[:2] for w in loud.wrong] == [(0, 0)]


class Words:
    """A stand-in tokenizer: one token per word, two for a word of more than 5 letters."""

    unk_id = None

    def encode(self, text, add_special_tokens=False):
        return [i for w in text.split() for i in [len(w)] * (1 + (len(w) > 5))], None

    def decode(self, ids):
        return "?"


class Model:
    """A stand-in model whose sentences split a capitalised word of more than 4 letters in two (names read
    alone by Words: Sarah is one token alone, two in a sentence)."""

    name, tokenizer = "words", Words()

    def encode(self, text):
        words = [w.strip(",") for w in text.split()]
        return np.array([i for w in words for i in [len(w)] * (1 + (w.istitle() and len(w) > 4))]), None


def test_the_ioi_pairs_keep_equal_lengths_and_say_why_one_is_dropped(monkeypatch):
    clean, corrupted, metric = ab.ioi_texts("Mary", "John", "store", "drink")
    assert clean == "When Mary and John went to the store, John gave a drink to"
    assert corrupted == "When Mary and John went to the store, Mary gave a drink to" and metric == (" Mary", " John")
    monkeypatch.setattr(ab, "IOI", [("Mary", "John", "store", "drink"), ("Alice", "Robert", "park", "ball"),
                                    ("Sarah", "Tom", "school", "book")])
    kept, dropped = ab.ioi_pairs(Model(), 5)
    assert [m for _, _, m in kept] == [(" Mary", " John")]
    assert dropped == ["Alice/Robert: a name is not one token", "Sarah/Tom: 14 tokens clean, 15 corrupted"]
    assert ab.ioi_pairs(Model(), 1) == (kept, [])                   # the first COUNT kept: the rest not read


def fake_pair(i: int, wrong: list, qkv: bool) -> dict:
    tables = {"heads": {"pearson": 0.9 + i / 100, "sign": 0.95, "cells": 270,
                        "wrong": len(wrong), "wrong_cells": wrong}}
    if qkv:
        for t in ("queries", "queries (AtP*)", "keys", "keys (AtP*)", "values"):
            tables[t] = {"pearson": 0.8, "sign": 0.9, "cells": 90, "wrong": 0,
                         "wrong_cells": []}
    return {"clean": "c", "corrupted": "k", "names": ["Mary", "John"], "tokens": 14, "metric": [6.0, -5.0],
            "seconds": {"atp": 1.0, "exact": 20.0 + i, "atp_star": 1.5, **({"exact_qkv": 40.0} if qkv else {})},
            "first": "atp", "tables": tables}


def test_the_smollm2_report_from_made_up_numbers(families):
    often = [[23, 3, 0.1, 0.58]]
    pairs = [fake_pair(0, often + [[1, 1, 0.0, 0.2]], True), fake_pair(1, often, False),
             fake_pair(2, often, False), fake_pair(3, [], False)]
    mach = {"cpu": "Test CPU", "cores": 2, "python": "3.11.7", "numpy": "2.4.6", "vector": ["avx2"],
            "blas": {"internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell", "num_threads": 2},
            "env": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}}
    result = {"pairs": pairs, "dropped": ["Anna/David: 15 tokens clean, 14 corrupted"], "model": "SmolLM2",
              "shape": [30, 9, 3], "load_s": 9.0, "machine": mach, "others_cores": 0.5, "settle_s": 0.5,
              "threads": 2}
    assert ab.summary(pairs, "heads") == {"pairs": 4, "mean_r": pytest.approx(0.915), "worst_r": 0.9,
                                          "mean_sign": 0.95, "worst_sign": 0.95}
    several, heads = ab.often_wrong(pairs)
    assert several == 2
    assert heads == [{"layer": 23, "head": 3, "pairs": 3, "estimate": pytest.approx(0.1), "exact": 0.58}]
    text = ab.markdown(families, result, command="qkv bench atp --pairs 4")
    assert "### SmolLM2: IOI pairs" in text and "(30 layers × 9 heads, 3 K/V heads)" in text
    assert "| 1 | Mary / John | 14 | r 0.90 · signs 95% · 1/270 off |" not in text       # pair 1 has 2 wrong
    assert "| 1 | Mary / John | 14 | r 0.90 · signs 95% · 2/270 off | r 0.80 · signs 90% · 0/90 off |" in text
    assert "| 2 | Mary / John | 14 | r 0.91 · signs 95% · 1/270 off | — | — | — | — | 1.00 / 21.0 | 21× |" in text
    assert "- `heads` (4 pair(s)): r mean 0.915, worst 0.900; signs mean 95.0%, worst 95.0%" in text
    assert "- `keys (AtP*)` (1 pair(s))" in text
    assert "at least 2 of the 4 pairs (1; " in text and "L23.H3 (3/4; exact +0.580, AtP +0.100)" in text
    assert "Dropped: Anna/David: 15 tokens clean, 14 corrupted." in text
    assert "against exact patching's 86.0 s (**22×**; per pair 22× the median, 20–23×)" in text and "40.0 s a pair" in text
    assert "kernel Haswell, 2 threads" in text and "Other processes kept 0.50 cores busy" in text
    assert not math.isnan(ab.summary(pairs, "queries")["mean_r"]) and ab.summary(pairs, "missing") is None


def test_the_command_writes_its_section(tmp_path):
    out = tmp_path / "bench.md"
    out.write_text("# Benchmarks\n\nkept\n")
    r = CliRunner().invoke(bench, ["atp", "--pairs", "0", "--fixtures", str(MODELS), "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n") and "<!-- bench:atp -->" in text and "<!-- /bench:atp -->" in text
    assert "| gpt2 | r " in text and "qkv bench atp --fixtures" in text
    assert atp_command_line(ab.FIXTURES, ab.PAIRS, ab.QKV_PAIRS, None, "docs/benchmarks.md") == ab.COMMAND
    assert atp_command_line("f", 3, 0, 1, None) == "qkv bench atp --fixtures f --pairs 3 --qkv-pairs 0 --threads 1"
    r = CliRunner().invoke(bench, ["atp", "--pairs", "0", "--fixtures", str(tmp_path)])
    assert "no model fixtures under" in str(r.exception)


def test_no_pair_kept_is_said():
    text = ab.markdown([], {"pairs": [], "dropped": ["Mary/John: 15 tokens clean, 14 corrupted"], "model": "M",
                            "shape": [1, 1, 1]})
    assert "### M: IOI pairs\n\nNo pair kept: Mary/John: 15 tokens clean, 14 corrupted." in text
