"""The logit lens, direct logit attribution and activation patching on encoder–decoders, through
`DecoderView` (the decoder inside, writing one target after a source), without torch.

Lens: its rows are the decoder's residual stream, which transformers' `decoder_hidden_states` give
for the Marian, BART and T5 fixtures (within 1e-4), and its last row is transformers' logits. DLA
(pre-norm T5): heads + cross-attention heads + FFNs + the rest sum to the logit. Patching: every
cell equals the same patch made with hooks on the Seq2SeqModel (no second engine: from_layer reruns
the decoder with the corrupted source's memory). Against transformers making the same patch:
tests/live/test_live_seq2seq_hooks.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv import QkvError
from qkv.analysis.attribution import KEEP as DLA_KEEP, attribution_of_trace
from qkv.analysis.lens import KEEP, lens_of_trace, residual_stream
from qkv.analysis.patch import patch, patch_one
from qkv.cli.app import cli
from qkv.models.seq2seq import DecoderView

from conftest import FIXTURES, run_main

SEQ2SEQ = ["marian", "bart", "t5", "t5_gated", "mbart", "pegasus", "mt5", "umt5", "t5gemma"]
TOL = 1e-4


def fixture(name):
    model = qkv.load(FIXTURES / "seq2seq" / name)
    return model, np.load(FIXTURES / "seq2seq" / name / "reference.npz")


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_the_lens_reads_the_decoders_residual_stream_as_transformers_has_it(name):
    model, ref = fixture(name)
    view = DecoderView(model, ref["decoder_input_ids"][0, 1:])           # row 0: nothing padded
    trace = view.run(ref["input_ids"][0], keep=KEEP)
    x = residual_stream(view, trace)                                     # (L+1, n, d_model)
    L = model.config.n_decoder_layers
    assert x.shape[0] == L + 1
    hs = ref["decoder_hidden_states"][:, 0]                              # (L+1, n, d) transformers'
    assert np.abs(x[:L] - hs[:L]).max() < TOL                            # every block's input
    if model.config.norm_place == "post":
        assert np.abs(x[L] - hs[L]).max() < TOL
    lens = lens_of_trace(view, trace)                                    # (L+1, n, V)
    assert np.abs(lens[-1] - ref["logits"][0]).max() < TOL               # the last row is the model's logits
    assert np.abs(lens[0] - lens[-1]).max() > 1e-2                       # and the first is not


def test_the_lens_of_ko_en_tiny_ends_on_its_translation():
    model = qkv.load("ko-en-tiny")
    view = DecoderView(model)                                            # its own translation, less </s>
    trace = view.run("나는 학교에 간다", keep=KEEP)
    lens = lens_of_trace(view, trace)
    written = model.tokenizer.decode(trace.ids[1:], skip_special_tokens=True)
    assert written == model.generate("나는 학교에 간다", 16, temperature=0)
    assert [model.tokenizer.decode([int(i)]) for i in lens[-1].argmax(-1)][:-1] == \
        [model.tokenizer.decode([int(i)]) for i in trace.ids[1:]]       # row L predicts each next word


@pytest.mark.parametrize("name", ["t5", "t5_gated", "mbart", "pegasus", "mt5", "umt5"])
def test_dla_of_a_pre_norm_encoder_decoder_sums_to_its_logit(name):
    model, ref = fixture(name)
    view = DecoderView(model, ref["decoder_input_ids"][0, 1:4])
    trace = view.run(ref["input_ids"][0], keep=DLA_KEEP)
    target, other = int(np.argmax(trace.logits[-1])), int(np.argmin(trace.logits[-1]))
    a = attribution_of_trace(view, trace, target, other)
    assert a.cross is not None and a.cross.shape == (model.config.n_decoder_layers, model.config.n_heads)
    assert np.abs(a.cross).max() > 1e-3                                  # the source is read, through them
    assert a.total() == pytest.approx(a.logit, rel=1e-4, abs=1e-4)


def test_dla_refuses_a_post_norm_translator():
    view = DecoderView(qkv.load("ko-en-tiny"), "")
    with pytest.raises(QkvError, match="post-norm"):
        attribution_of_trace(view, view.run("나는 학교에 간다", keep=DLA_KEEP), 5)


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_patching_an_encoder_decoder_equals_the_same_patch_made_with_hooks(name):
    model, ref = fixture(name)
    clean, corrupted = ref["input_ids"][0, :7], ref["input_ids"][1, :5]  # sources of other lengths
    prefix = ref["decoder_input_ids"][0, 1:4]
    view = DecoderView(model, prefix)
    V = model.config.vocab_size
    answer, wrong = (int(i) for i in np.argsort(view.run(clean).logits[-1])[-2:])
    metric = (answer, wrong)
    m = lambda logits: logits[-1, answer] - logits[-1, wrong]            # noqa: E731
    target = [model.start_token, *prefix]
    c_trace = model.run(clean, target)
    m_clean, m_corrupt = m(c_trace.logits), m(model.run(corrupted, target).logits)
    L, H = model.config.n_decoder_layers, model.config.n_heads
    p = patch(view, clean, corrupted, metric)
    assert p.cross.shape == (L, H) and p.heads.shape == (L, H) and p.residual.shape == (L, len(target))
    for what, layer, index, key in (("cross", L - 1, 1, f"cross.{L - 1}.heads.1"), ("heads", L - 1, 2, f"{L - 1}.heads.2")):
        source = (c_trace.cross if what == "cross" else c_trace).layers[layer].heads[index]   # (n, d_k)
        hooked = model.run(corrupted, target, hooks={key: lambda z, layer: source[None]})
        want = (m(hooked.logits) - m_corrupt) / (m_clean - m_corrupt)
        got = patch_one(view, clean, corrupted, metric, what, layer, [index])
        assert got == pytest.approx(want, abs=1e-4)
        assert getattr(p, what)[layer, index] == pytest.approx(want, abs=1e-4)
    assert np.abs(p.cross).max() > 1e-3                                  # the sources differ only through it
    assert np.all(p.residual[0] == 0)                                    # the same target: nothing to patch at 0


def test_the_commands_take_an_encoder_decoder(tmp_path, monkeypatch, capsys):
    runner = CliRunner()
    r = runner.invoke(cli, ["lens", "나는 학교에 간다", "--model", "ko-en-tiny", "--out", str(tmp_path / "lens")])
    assert r.exit_code == 0, r.output
    assert "school" in r.output and (tmp_path / "lens" / "lens.html").is_file()
    r = runner.invoke(cli, ["patch", "나는 학교에 간다", "너는 학교에 간다", "--model", "ko-en-tiny", "--token", "I",
                            "--other", "you", "--out", str(tmp_path / "patch")])
    assert r.exit_code == 0, r.output
    assert "cross-attention heads:" in r.output and (tmp_path / "patch" / "patch.json").is_file()
    code, _, err = run_main(monkeypatch, capsys, "patch", "나는 학교에 간다", "너는 학교에 간다", "--model", "ko-en-tiny",
                            "--token", "I", "--other", "You")           # ko-en-tiny has no "You": never <unk>
    assert code == 2 and "not in ko-en-tiny's vocabulary" in err
    code, _, err = run_main(monkeypatch, capsys, "dla", "나는 학교에 간다", "--model", "ko-en-tiny", "--token", "I")
    assert code == 2 and "post-norm" in err and "Traceback" not in err
    code, _, err = run_main(monkeypatch, capsys, "lens", "The cat", "--model", str(FIXTURES / "models" / "gpt2"),
                            "--prefix", "x")
    assert code == 2 and "--prefix is for encoder–decoders" in err and len(err.strip().splitlines()) == 1
