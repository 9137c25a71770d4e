"""The viewer and figures of an encoder–decoder's trace, without a browser: three kinds of attention
(encoder, decoder, cross) in one self-contained page, each equal to what the model computed.

tests/test_browser_seq2seq.py drives the same documents in Chromium.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import qkv
from conftest import FIXTURES
from qkv import QkvError
from qkv.writing.seq2seq_generate import translation_trace
from qkv.viz.html import View, viewer_html
from qkv.viz import wire
from qkv.viz.payload import PRECISION
from qkv.viz.seq2seq import UNKNOWN_NEXT, kind_traces, save_seq2seq_figures, written
from test_seq2seq_cli import SOURCE, marian_with_tokenizer
from test_viewer import XSS, data_of


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return qkv.load(marian_with_tokenizer(tmp_path_factory.mktemp("marian")))


@pytest.fixture(scope="module")
def school(marian):
    """"나는 학교에 간다" read against "I go to school" (teacher forcing; the decoder reads <pad> I go to school)."""
    return translation_trace(marian, SOURCE, marian.encode("I go to school")[0])


def kinds_of(document: str) -> dict[str, dict]:
    data = data_of(document)
    return {part["kind"]: part for part in data["kinds"]}


def test_the_three_kinds_equal_the_models_attention(marian, school):
    data = data_of(viewer_html(school, tokenizer=marian.tokenizer))
    assert [p["kind"] for p in data["kinds"]] == ["encoder", "decoder", "cross"] and data["kind"] == "cross"
    assert data["text"] == SOURCE and data["title"].endswith("나는 학교에 간다 → I go to school")
    parts = {p["kind"]: p for p in data["kinds"]}
    n_src, n_tgt = 4, 5
    for kind, trace, shape in (("encoder", school.encoder, (2, 4, n_src, n_src)),
                               ("decoder", school, (2, 4, n_tgt, n_tgt)),
                               ("cross", school.cross, (2, 4, n_tgt, n_src))):   # target × source: not square
        assert parts[kind]["attention"]["shape"] == list(shape) == list(trace.attentions.shape)
        assert np.abs(wire.decode(parts[kind]["attention"]) - trace.attentions).max() <= PRECISION + 1e-7
    ids, _ = marian.encode(SOURCE)
    out = marian.forward(ids[None], decoder_input_ids=school.ids[None])       # the model's own cross-attention
    assert np.abs(wire.decode(parts["cross"]["attention"]) - out.cross_attentions[:, 0]).max() <= PRECISION + 1e-6
    assert (parts["encoder"]["causal"], parts["decoder"]["causal"], parts["cross"]["causal"]) == (False, True, False)


def test_cross_rows_are_labelled_by_the_token_they_wrote(marian, school):
    cross = kinds_of(viewer_html(school, tokenizer=marian.tokenizer))["cross"]
    last = marian.tokenizer.id_to_token(int(np.argmax(school.logits[-1])))     # the model's choice after "school"
    assert cross["labels"] == ["I", "go", "to", "school", last]                 # row t wrote token t + 1
    assert cross["read_labels"] == ["<pad>", "I", "go", "to", "school"]        # row t read token t
    assert cross["key_labels"] == ["나는", "학교에", "간다", "</s>"]
    assert "WROTE" in cross["caption"] and "row t is the query that produced target token t + 1" in cross["caption"]
    assert cross["prompt_length"] is None and cross["next"] is None


def test_written_without_logits_or_tokenizer_says_it_does_not_know(school):
    school = copy.copy(school)
    school.tokenizer = None                                                    # a trace that lost its model's tokenizer
    ids, tokens = written(school)                                              # no tokenizer: the last is unknown
    assert tokens[-1] == UNKNOWN_NEXT and ids[-1] == int(np.argmax(school.logits[-1]))
    school_no_logits = kind_traces(school)["decoder"]
    school_no_logits.logits = None
    assert written(school_no_logits)[0][-1] == -1
    assert kinds_of(viewer_html(school))["cross"]["labels"][-1] == UNKNOWN_NEXT


def test_a_translation_has_the_decoders_next_token_view(marian):
    trace = marian.generate(SOURCE, 6, temperature=1, seed=1, trace=True)      # a generation: prompt_length 1
    parts = kinds_of(viewer_html(trace, tokenizer=marian.tokenizer))
    steps = parts["decoder"]["next"]["steps"]
    assert [s["chosen"] for s in steps] == trace.ids[1:].tolist() and parts["encoder"]["next"] is None
    assert parts["decoder"]["prompt_length"] == 1
    assert kinds_of(viewer_html(trace))["decoder"]["next"] == parts["decoder"]["next"]   # the trace's own tokenizer
    trace.tokenizer = None
    assert kinds_of(viewer_html(trace))["decoder"]["next"] is None             # no tokenizer, no candidates


def test_bart_kinds_keep_their_own_layers_and_byte_level_labels():
    model = qkv.load(FIXTURES / "seq2seq" / "bart")
    trace = model.run("the cat sat", target="the dog", keep=("attentions",))
    parts = kinds_of(viewer_html(trace, tokenizer=model.tokenizer))
    assert parts["encoder"]["layers"] == [0, 1] and parts["cross"]["layers"] == parts["decoder"]["layers"] == [0, 1, 2]
    assert parts["encoder"]["labels"] == ["t", "he", "␣c", "at", "␣s", "at"] == parts["cross"]["key_labels"]
    assert parts["cross"]["labels"][:-1] == trace.labels[1:]


def test_hostile_tokens_stay_text(marian):
    trace = translation_trace(marian, "</script><script>alert(1)</script> 간다",
                          marian.encode("</script><script>alert(1)</script> I")[0])
    document = viewer_html(trace, tokenizer=marian.tokenizer, model_name=XSS)
    assert "<script>alert(1)" not in document and "<img" not in document
    parts = kinds_of(document)
    assert parts["cross"]["labels"][0] == parts["encoder"]["labels"][0] == "</script><script>alert(1)</script>"


def test_roles_are_for_one_stack(school):
    with pytest.raises(QkvError, match="roles colour the heads of one stack"):
        viewer_html(school, roles=[[None] * 4] * 2)


def test_a_trace_without_attention_says_how_to_keep_it(marian):
    trace = marian.run(SOURCE, target="I go", keep=("residual",))
    with pytest.raises(QkvError, match="keep=\\('attentions',\\)"):
        viewer_html(trace)


def test_the_notebook_view_of_a_translation(marian, school):
    assert '&quot;kinds&quot;' in View(school, tokenizer=marian.tokenizer)._repr_html_()


def test_figures_of_all_three_kinds(marian, school, tmp_path):
    paths = save_seq2seq_figures(school, tmp_path, layer=0, tokenizer=marian.tokenizer, formats=("svg",))
    names = [p.name for p in paths]
    head = names[0].removeprefix("cross_heatmap_layer0_head").removesuffix(".svg")
    cross = kind_traces(school, marian.tokenizer)["cross"]
    from qkv.viz.figures import focused_head
    assert int(head) == focused_head(cross, 0)                                # the most focused head by default
    assert names[1:] == ["cross_mean_layer0.svg", "cross_layer0.svg", "cross_layer1.svg", "encoder_overview.svg",
                         "decoder_overview.svg"]
    svg = (tmp_path / "cross_layer1.svg").read_text()
    assert "rows = target token written, columns = source tokens" in svg
    assert "encoder self-attention" in (tmp_path / "encoder_overview.svg").read_text()
    with pytest.raises(QkvError, match="not an encoder–decoder's"):
        save_seq2seq_figures(kind_traces(school)["decoder"], tmp_path)
