"""qkv explain proteins: the contact map recomputed in float64 from the model's attention as transformers'
EsmModel.predict_contacts computes it (the committed random ESM fixture: its map is noise, the method exact), the
best heads by Pearson's r, the page in English and Korean carrying the numbers, the figures written, and what it
cannot read refused in one line (no model: none ships; a model without a contact head; letters that are no amino
acid)."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import MODELS, reference, run_main
from qkv.lessons import TOPICS, proteins
from qkv.runtime.errors import QkvError


def printed(lesson, lang: str) -> str:
    console = Console(record=True, width=300, highlight=False)
    for part in proteins.render(lesson, lang):
        console.print(part)
    return console.export_text()


@pytest.fixture(scope="module")
def esm():
    return qkv.load(MODELS / "esm", dtype=np.float64)


@pytest.fixture(scope="module")
def lesson(esm):
    return proteins.build(esm)


def test_both_languages_have_the_same_sentences_and_the_topic_is_listed():
    assert proteins.TEXTS["en"].keys() == proteins.TEXTS["ko"].keys()
    assert TOPICS["proteins"].module == "qkv.lessons.proteins" and proteins.DEFAULT_MODEL is None
    assert proteins.DEFAULT_TEXT == "NLYIQWLKDGGPSSGRPPPS"                       # Trp-cage TC5b, 20 residues


def test_the_map_is_the_contact_heads_on_the_models_attention(esm, lesson):
    """P = σ(Σ_c w_c·APC(A_c + A_cᵀ) + b) over every head's attention between <cls> and <eos>, written out here
    from the model's forward pass; symmetric; its r per head is np.corrcoef's over the pairs 6 or more apart."""
    ids, _ = esm.encode(proteins.TRP_CAGE)
    A = esm.forward(ids[None]).attentions[:, 0, :, 1:-1, 1:-1]                   # (L, H, 20, 20)
    z = np.zeros((20, 20))
    for c, a in enumerate(A.reshape(-1, 20, 20)):
        s = a + a.T
        z += esm.weights.W_contact[c] * (s - np.outer(s.sum(1), s.sum(0)) / s.sum())
    want = 1 / (1 + np.exp(-(z + esm.weights.b_contact[0])))
    assert np.abs(lesson.predicted - want).max() < 1e-12
    assert lesson.residues == list(proteins.TRP_CAGE) and lesson.m == 20
    assert lesson.diff_map < 1e-12 and lesson.diff_total < 1e-12 and lesson.diff_r < 1e-12
    i, j = np.triu_indices(20, k=6)
    layer, head, r = lesson.best[0]
    assert abs(np.corrcoef(lesson.best_maps[0][i, j], want[i, j])[0, 1] - r) < 1e-12
    assert [b[2] for b in lesson.best] == sorted((b[2] for b in lesson.best), reverse=True)
    assert all(b - a >= 6 for a, b, _ in lesson.top)


def test_the_fixtures_contacts_equal_transformers_on_its_sequence(esm):
    """The lesson's engine (analysis.contacts) on the fixture's 17-token sequence equals predict_contacts."""
    from qkv.analysis.contacts import contact_features, predict

    ref = reference("esm")
    out = esm.forward(ref["single_input_ids"])
    P = predict(contact_features(out.attentions, ref["single_input_ids"]), esm.weights.W_contact, esm.weights.b_contact)
    assert np.abs(P - ref["single_contacts"]).max() < 1e-5


def test_the_page_carries_the_numbers_in_both_languages(lesson):
    en, ko = printed(lesson, "en"), printed(lesson, "ko")
    layer, head, r = lesson.best[0]
    for page in (en, ko):
        assert proteins.TRP_CAGE in page and f"{layer}.{head}" in page and f"{r:+.3f}" in page
        assert f"{lesson.top[0][2]:.3f}" in page
    assert "Trp-cage (TC5b, PDB 1L2Y)" in en and "Rao et al. (2020)" in en and "the map is noise" in en
    assert "Trp-cage(TC5b, PDB 1L2Y)" in ko and "접촉 지도" in ko
    assert "3 layers × 4 heads = 12 maps of 22 × 22" in en


def test_a_sequence_of_ones_own(esm):
    lesson = proteins.build(esm, "MKTAY IAKQR")                                  # whitespace is dropped
    assert lesson.sequence == "MKTAYIAKQR" and lesson.predicted.shape == (10, 10)
    assert "The sequence given (10 residues)" in printed(lesson, "en")


def test_figures(lesson, tmp_path):
    written = proteins.figures(lesson, tmp_path, "en")
    assert sorted(p.name for p in written) == ["proteins.png", "proteins.svg"]
    assert all(p.stat().st_size > 5000 for p in written)


def test_what_it_cannot_read_is_refused_in_one_line(esm):
    with pytest.raises(QkvError, match="needs an ESM-2 checkpoint and none ships"):
        proteins.build(None)
    with pytest.raises(QkvError, match="has no contact head"):
        proteins.build(qkv.load(MODELS / "bert"))
    with pytest.raises(QkvError, match="'J' is not an amino acid"):
        proteins.build(esm, "MKTJAY")


def test_the_command_line(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "explain", "proteins")
    assert code == 2 and "needs an ESM-2 checkpoint" in err and err.count("\n") <= 1
    code, out, err = run_main(monkeypatch, capsys, "explain", "proteins", "--model", str(MODELS / "esm"),
                              "--lang", "ko", "--out", str(tmp_path / "figs"))
    assert code == 0, err
    assert "NLYIQWLKDGGPSSGRPPPS" in out and (tmp_path / "figs" / "proteins.png").is_file()
    code, out, err = run_main(monkeypatch, capsys, "explain", "proteins", "--layer", "1", "--model",
                              str(MODELS / "esm"))
    assert code == 2 and "does not take them" in err
