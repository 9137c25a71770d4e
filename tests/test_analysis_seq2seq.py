"""`qkv heads` on an encoder–decoder (ko-en-tiny): encoder, decoder and cross-attention reported apart,
each with the statistics that mean something for it, equal to numbers taken from model.forward."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv.analysis import analyse
from qkv.analysis.seq2seq_heads import KIND_STATS, KINDS, Seq2SeqHeadReport
from qkv.cli.app import cli, main
from qkv.runtime.errors import QkvError

TEXTS = ["나는 학교에 간다", "그녀는 공원에서 책을 읽었어요"]


@pytest.fixture(scope="module")
def model():
    return qkv.load("ko-en-tiny")


@pytest.fixture(scope="module")
def report(model):
    return analyse(model, TEXTS)


def test_three_kinds_each_layers_by_heads(model, report):
    assert isinstance(report, Seq2SeqHeadReport)
    assert list(report.kinds) == list(KINDS) and report.texts == 2
    assert report.translations == ["I go to school", "she read a book in the park"]
    depth = {"encoder": model.config.n_layers, "decoder": model.config.n_decoder_layers,
             "cross": model.config.n_decoder_layers}
    for kind, k in report.kinds.items():
        assert list(k.stats) == list(KIND_STATS[kind])
        for values in k.stats.values():
            assert values.shape == (depth[kind], model.config.n_heads)


def test_cross_leaves_out_positions_of_two_sentences(report):
    cross = report.kinds["cross"]
    for name in ("self", "prev", "next"):
        assert name not in cross.stats and name in cross.not_applicable
    assert "next" in report.kinds["decoder"].not_applicable      # causal
    assert "next" in report.kinds["encoder"].stats                 # bidirectional


def test_cross_stats_within_their_ranges(report):
    cross = report.kinds["cross"]
    for name in ("first", "end", "punct"):
        assert np.all((cross.stats[name] >= 0) & (cross.stats[name] <= 1 + 1e-9))
    n_src = (4, 5)                                        # 나는 학교에 간다 </s>; 그녀는 공원에서 책을 읽었어요 </s>
    assert np.all(cross.stats["max"] <= 1 + 1e-9) and np.all(cross.stats["max"] >= 1 / max(n_src) - 1e-9)
    assert np.all(cross.stats["entropy"] >= 0) and np.all(cross.stats["entropy"] <= np.log(max(n_src)) + 1e-9)
    assert cross.uniform_entropy == pytest.approx(np.mean(np.log(n_src)))
    assert cross.stats["max"].max() > 0.8                           # a trained translator's cross-attention focuses


def test_stats_equal_a_direct_computation_from_forward(model):
    """One text: the cross `end` and `max` and the encoder `prev` are what forward's attentions give."""
    one = analyse(model, TEXTS[:1])
    ids, _ = model.encode(TEXTS[0])
    target = model.without_end(model.generate(ids[None], 20, temperature=0)[0])[None]   # (1, n_tgt) greedy, from the
    # start token, less the final </s>: the last row writes it (model.run's decoder input, as `qkv show`'s)
    out = model.forward(ids[None], decoder_input_ids=target)
    cross = out.cross_attentions[:, 0].astype(np.float64)                     # (L_dec, H, n_tgt, n_src)
    np.testing.assert_allclose(one.kinds["cross"].stats["end"], cross[..., -1].mean(-1), atol=1e-6)
    np.testing.assert_allclose(one.kinds["cross"].stats["max"], cross.max(-1).mean(-1), atol=1e-6)
    enc = out.encoder_attentions[:, 0].astype(np.float64)                    # (L_enc, H, n_src, n_src)
    n_src = enc.shape[-1]
    np.testing.assert_allclose(one.kinds["encoder"].stats["prev"],
                               np.diagonal(enc, -1, axis1=-2, axis2=-1).sum(-1) / n_src, atol=1e-6)
    dec = out.attentions[:, 0].astype(np.float64)                            # (L_dec, H, n_tgt, n_tgt)
    np.testing.assert_allclose(one.kinds["decoder"].stats["first"], dec[..., 0].mean(-1), atol=1e-6)


def test_single_stack_options_are_refused(model):
    with pytest.raises(QkvError, match="--window"):
        analyse(model, TEXTS, window=8)
    with pytest.raises(QkvError, match="in this process"):
        analyse(model, TEXTS, workers=2)


def test_cli_prints_three_tables_and_writes_three_kinds(tmp_path):
    r = CliRunner().invoke(cli, ["heads", *TEXTS, "--model", "ko-en-tiny"])
    assert r.exit_code == 0, (r.output, r.exception)
    for title in ("encoder self-attention", "decoder self-attention", "cross-attention (target → source)"):
        assert title in r.stdout
    assert "self, prev, next: query and key positions are in two different sentences" in r.stdout
    out = tmp_path / "heads"
    r = CliRunner().invoke(cli, ["heads", *TEXTS, "--model", "ko-en-tiny", "--out", str(out), "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    data = json.loads(r.stdout)
    assert data == json.loads((out / "heads.json").read_text())
    assert data["encoder_decoder"] is True and list(data["kinds"]) == list(KINDS)
    assert list(data["kinds"]["cross"]["stats"]) == list(KIND_STATS["cross"])
    assert len(data["kinds"]["cross"]["stats"]["end"]) == 2 and len(data["kinds"]["cross"]["stats"]["end"][0]) == 4


def test_cli_mistake_is_one_line_exit_2_and_leaves_no_folder(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["qkv", "heads", TEXTS[0], "--model", "ko-en-tiny", "--window", "8",
                                      "--out", str(tmp_path / "h")])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "drop --window" in err
    assert not (tmp_path / "h").exists()
