"""The viewer's Contacts panel (`viz.contact_panel`, built by `analysis.sections.contact_payload` from a trace of an ESM
model): its numbers are analysis.contacts' (which are transformers' EsmModel.predict_contacts, the committed
fixture), it reaches `qkv show SEQ --model ESM --out` pages and `qkv serve`'s answers, and only for a model with a
contact head. The page itself: test_browser_contacts.py."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS, max_abs, reference, running_server
from test_viewer import XSS, data_of
from qkv.analysis.contacts import contact_map, contacts
from qkv.analysis.sections import contact_payload, sections_keep, viewer_sections
from qkv.cli.app import cli
from qkv.runtime.errors import QkvError
from qkv.viz import contact_panel
from qkv.viz.contact_panel import contact_section
from qkv.viz.html import save_viewer
from qkv.viz.wire import decode

ESM = MODELS / "esm"
TOL_CONTACTS = 1e-5          # P against transformers' predict_contacts (test_family_esm's tolerance)
F32 = 2.0 ** -25             # P ≤ 1 as float32: half an ulp at most
F16_REL, F16_ABS = 2.0 ** -11, 2.0 ** -25      # a head's map as float16: relative, and subnormals' absolute


@pytest.fixture(scope="module")
def esm():
    return qkv.load(ESM)


def _fixture_sequence(model) -> tuple[str, np.ndarray]:
    """The fixture's single sequence as letters (its ids through the vocabulary), and its ids."""
    ids = reference("esm")["single_input_ids"][0]
    vocab = (ESM / "vocab.txt").read_text().split()
    return "".join(vocab[i] for i in ids[1:-1]), ids


def check_section(section: dict, cm, positions: int) -> None:
    """SECTION carries CM's numbers: P to float32's rounding, each head's map to float16's, r, the best heads and the
    surest pairs as analysis.contacts gives them."""
    L, H, m, _ = cm.features.shape
    assert section["positions"] == positions == m + 2 and section["residues"] == cm.residues
    assert (section["layers"], section["heads"], section["separation"]) == (L, H, cm.separation)
    assert max_abs(decode(section["predicted"]), cm.predicted) <= F32
    heads = [tuple(x) for x in section["maps"]["heads"]]
    maps = decode(section["maps"]["values"])                                        # (k, m, m)
    assert maps.shape == (len(heads), m, m)
    for k, (l, h) in enumerate(heads):
        np.testing.assert_allclose(maps[k], cm.features[l, h], rtol=F16_REL, atol=F16_ABS)
    np.testing.assert_allclose(section["scores"], cm.scores, rtol=0, atol=5e-7)
    best = cm.best_heads(contact_panel.TOP)
    assert [(b["layer"], b["head"]) for b in section["best"]] == [(l, h) for l, h, _ in best]
    assert [(t["i"], t["j"]) for t in section["top"]] == [(i, j) for i, j, _ in cm.top_contacts(contact_panel.TOP)]


def test_the_section_holds_the_contact_map_transformers_predicts(esm):
    """From a trace of the fixture's sequence: P equal to transformers' predict_contacts (TOL_CONTACTS), and every
    number equal to analysis.contacts' own pass over the sequence (to the wire's float32 and float16)."""
    sequence, ids = _fixture_sequence(esm)
    trace = esm.run(sequence, keep=sections_keep(esm, len(ids)))
    np.testing.assert_array_equal(trace.ids, ids)
    section = contact_payload(esm, trace)
    assert max_abs(decode(section["predicted"]), reference("esm")["single_contacts"][0]) <= TOL_CONTACTS
    cm = contacts(esm, sequence)
    check_section(section, cm, len(ids))
    assert [tuple(x) for x in section["maps"]["heads"]] == [(l, h) for l in range(3) for h in range(4)]  # every head
    assert viewer_sections(esm, trace)["contacts"] == section


def test_a_long_protein_carries_the_best_heads_maps_only(esm, monkeypatch):
    """Past MAX_VALUES the section carries the MAX_MAPS best-matching heads' maps, best first, still equal to
    analysis.contacts'; r of every head stays."""
    monkeypatch.setattr(contact_panel, "MAX_VALUES", 100)
    monkeypatch.setattr(contact_panel, "MAX_MAPS", 3)
    cm = contacts(esm, "NLYIQWLKDGGPSSGRPPPS")
    section = contact_section(cm, positions=22)
    assert [tuple(x) for x in section["maps"]["heads"]] == [(l, h) for l, h, _ in cm.best_heads(3)]
    check_section(section, cm, 22)


def test_no_contacts_without_a_contact_head_or_every_layer(esm):
    """BERT has no contact head; a trace of one layer, or of some heads, cannot feed the regression: no section
    (and contact_map says why)."""
    bert = qkv.load(MODELS / "bert")
    trace = bert.run(reference("bert")["input_ids"][0][:5])
    assert viewer_sections(bert, trace)["contacts"] is None
    assert contact_payload(esm, esm.run("NLYIQW", layers=[0])) is None
    assert contact_payload(esm, esm.run("NLYIQW", heads=[1])) is None
    one = esm.run("NLYIQW", layers=[0])
    with pytest.raises(QkvError, match="the contact head reads every layer's heads .12.; got attention of 1 layers"):
        contact_map(esm, one.ids, one.tokens, one.attentions)


def test_a_map_of_another_sequence_is_refused(esm):
    cm = contacts(esm, "NLYIQWLKDG")
    with pytest.raises(QkvError, match="does not fit a trace of 11 tokens"):
        contact_section(cm, positions=11)


def test_hostile_residue_labels_stay_in_the_json(esm, tmp_path):
    """A residue spelled as markup reaches the page as JSON text (escaped inside the script element), never as HTML."""
    trace = esm.run("NLYIQWLKDG", keep=sections_keep(esm, 12))
    trace.tokens[1] = XSS
    path = save_viewer(trace, tmp_path / "v.html", sections=viewer_sections(esm, trace), view="contacts")
    document = path.read_text(encoding="utf-8")
    assert "<img" not in document
    data = data_of(document)
    assert data["contacts"]["residues"][0] == XSS and data["view"] == "contacts"
    assert any(p["id"] == "contacts" and p["title"] == "Contacts" and p["layer"] for p in data["panels"])


def test_show_out_writes_the_contacts_tab(esm, tmp_path):
    """`qkv show SEQ --model ESM --out DIR`: the viewer's page holds the section, equal to analysis.contacts'."""
    sequence = "NLYIQWLKDGGPSSGRPPPS"
    r = CliRunner().invoke(cli, ["show", sequence, "--model", str(ESM), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "the viewer's Contacts tab" in r.output
    data = data_of((tmp_path / "out" / "attention.html").read_text(encoding="utf-8"))
    check_section(data["contacts"], contacts(esm, sequence), len(sequence) + 2)


def test_the_web_app_answers_with_contacts_for_an_esm_model(esm):
    """`qkv serve --model ESM`: the page runs a protein's sequence first, and /api/attention answers with the
    section (equal to analysis.contacts'); a text model's answer has none."""
    from test_server import call, post

    with running_server(str(ESM)) as srv:
        status, _, page = call(srv, "GET", "/")
        assert status == 200 and '"text":"NLYIQWLKDGGPSSGRPPPS"' in page
        status, body = post(srv, {"text": "NLYIQWLKDG"})
        assert status == 200, body
        check_section(body["contacts"], contacts(esm, "NLYIQWLKDG"), 12)
    with running_server(str(MODELS / "bert")) as srv:
        status, body = post(srv, {"text": "the cat"})
        assert status == 200 and body["contacts"] is None
        assert '"text":"The cat sat on the mat"' in call(srv, "GET", "/")[2]
