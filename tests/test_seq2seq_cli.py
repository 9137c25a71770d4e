"""The commands on an encoder–decoder: `qkv translate`, and `show`, `generate`, `next`, `heads` on one.

The tiny random Marian of tests/fixtures/seq2seq has no tokenizer: `marian_with_tokenizer` copies it
and adds a word-level one (as qkv.train.ko_en builds ko-en-tiny's: split on spaces, </s> appended),
so the commands read Korean words. Its translations are noise, but deterministic: each output is
checked against the Python API (`Seq2SeqModel.generate`, `.forward`, `.run`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import FIXTURES, MODELS, run_main
from qkv.cli.app import cli
from qkv.writing.seq2seq_generate import translation_trace
from qkv.writing.nexttoken import distribution
from qkv.core.trace import Trace
from qkv.viz.seq2seq import cross_written

SOURCE = "나는 학교에 간다"
WORDS = ["나는", "너는", "학교에", "집에", "간다", "갔다", "I", "you", "go", "went", "to", "school", "home",
         "</script><script>alert(1)</script>"]


def marian_with_tokenizer(directory: Path) -> Path:
    """The Marian fixture (V = 120; </s> = 0 = EOS, <pad> = 119 = the decoder's start) in DIRECTORY,
    with a word-level tokenizer.json over WORDS and fillers w16 … w118."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    shutil.copytree(FIXTURES / "seq2seq" / "marian", directory, dirs_exist_ok=True)
    vocab = {"</s>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), 119)})
    vocab["<pad>"] = 119
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return marian_with_tokenizer(tmp_path_factory.mktemp("marian"))


@pytest.fixture(scope="module")
def marian(marian_dir):
    return qkv.load(marian_dir)


def invoke(*args: str):
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r


def one_line_error(monkeypatch, capsys, *args: str) -> str:
    """`qkv ARGS` must fail as a user mistake: exit 2, nothing on stdout, one line on stderr."""
    code, out, err = run_main(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    return lines[0]


# translate ---------------------------------------------------------------------------

def test_translate_prints_the_greedy_translation(marian, marian_dir):
    r = invoke("translate", SOURCE, "--model", str(marian_dir), "-n", "6")
    assert r.output == marian.generate(SOURCE, 6, temperature=0) + "\n"


def test_translate_samples_repeatably_with_a_seed(marian, marian_dir):
    args = ("translate", SOURCE, "--model", str(marian_dir), "-n", "6", "-t", "1", "--seed", "1")
    first, again = invoke(*args).output, invoke(*args).output
    assert first == again == marian.generate(SOURCE, 6, temperature=1, seed=1) + "\n"
    assert len(set(first.split())) > 2                                    # not the greedy repetition
    assert invoke(*args[:-1], "2").output != first


def test_translate_trace_saves_three_traces_and_the_viewer(marian, marian_dir, tmp_path):
    out = tmp_path / "t"
    r = CliRunner().invoke(cli, ["translate", SOURCE, "--model", str(marian_dir), "-n", "6", "-t", "1",
                                 "--seed", "1", "--trace", str(out)])
    assert r.exit_code == 0, r.output
    expected = marian.generate(SOURCE, 6, temperature=1, seed=1, trace=True)
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "cross", "encoder", "trace.json", "trace.npz"]
    decoder, encoder, cross = Trace.load(out), Trace.load(out / "encoder"), Trace.load(out / "cross")
    assert decoder.tokens == expected.tokens and decoder.tokens[0] == "<pad>" and len(decoder.tokens) == 7
    assert np.allclose(decoder.attentions, expected.attentions)
    assert encoder.tokens == ["나는", "학교에", "간다", "</s>"] and encoder.text == SOURCE
    assert np.allclose(encoder.attentions, expected.encoder.attentions)
    assert cross.source_tokens == encoder.tokens and cross.attentions.shape == (2, 4, 7, 4)    # n_tgt × n_src
    assert np.allclose(cross.attentions, expected.cross.attentions)
    html = (out / "attention.html").read_text()
    assert '"kinds":' in html and "Cross-attention" in html
    assert f"saved in {out}; open {out / 'attention.html'} in a browser" in r.output


def test_generate_on_an_encoder_decoder_translates(marian_dir):
    translated = invoke("translate", SOURCE, "--model", str(marian_dir), "-n", "5").output
    assert invoke("generate", SOURCE, "--model", str(marian_dir), "-n", "5").output == translated    # greedy too
    sampled = invoke("generate", SOURCE, "--model", str(marian_dir), "-n", "5", "-t", "1", "--seed", "1").output
    assert sampled == invoke("translate", SOURCE, "--model", str(marian_dir), "-n", "5", "-t", "1",
                             "--seed", "1").output
    assert not sampled.startswith(SOURCE)                                  # the target alone, not prompt + text


def test_translate_default_length_fits_the_target_positions(marian_dir, tmp_path):
    """-n defaults to 40, or fewer when the model has fewer positions (ko-en-tiny has 32)."""
    small = tmp_path / "small"
    shutil.copytree(marian_dir, small)
    config = json.loads((small / "config.json").read_text())
    config["max_position_embeddings"] = 12
    (small / "config.json").write_text(json.dumps(config))
    model = qkv.load(small)
    assert invoke("translate", "w20", "--model", str(small)).output == model.generate("w20", 11, temperature=0) + "\n"


@pytest.mark.parametrize("args, message", [
    (["translate", "x", "--model", str(MODELS / "gpt2")], "continue a text with `qkv generate`"),
    (["translate", "x", "--model", "minilm"], "is not an encoder–decoder (bert)"),
    (["translate", "", "--model", "{marian}"], "the text is empty"),
    (["translate", "x", "--model", "{marian}", "-n", "64"], "lower max_new_tokens to at most 63"),
    (["translate", "x", "--model", "{marian}", "-t", "-1"], "temperature"),
    (["generate", "", "--model", "{marian}"], "the text is empty"),
    (["generate", "x", "--model", "{marian}", "--trace", "{marian}/t", "--lens"], "three kinds of attention"),
    (["translate", "x", "--model", str(FIXTURES / "seq2seq" / "t5")], "no tokenizer.json"),
])
def test_translate_mistakes_are_one_line(monkeypatch, capsys, marian_dir, args, message):
    line = one_line_error(monkeypatch, capsys, *[a.replace("{marian}", str(marian_dir)) for a in args])
    assert message in line


def test_a_failed_translation_leaves_no_trace_dir(monkeypatch, capsys, marian_dir, tmp_path):
    one_line_error(monkeypatch, capsys, "translate", "", "--model", str(marian_dir), "--trace", str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


# next --------------------------------------------------------------------------------

def shown_probabilities(output: str) -> dict[str, float]:
    """token → P at the one temperature of a `qkv next -t T` table."""
    rows = [line.split("│") for line in output.splitlines() if line.count("│") == 3 and line.split("│")[0].strip()]
    return {cells[1].strip(): float(cells[3]) for cells in rows}


def test_next_gives_the_first_target_token_after_the_source(marian, marian_dir):
    r = invoke("next", SOURCE, "--model", str(marian_dir), "-t", "1", "--top-k", "5")
    ids, _ = marian.encode(SOURCE)
    z = marian.forward(ids[None], decoder_input_ids=[[marian.start_token]]).logits[0, -1]    # (V,)
    P = distribution(z, 1.0)
    best = np.argsort(-P)[:5]
    assert "the next target token after the 4 source tokens and the start token" in r.output
    assert shown_probabilities(r.output) == {marian.tokenizer.id_to_token(int(i)): round(float(P[i]), 4) for i in best}


def test_next_after_a_target_prefix(marian, marian_dir):
    r = invoke("next", SOURCE, "--model", str(marian_dir), "-t", "1", "--prefix", "I go", "--top-k", "3")
    ids, _ = marian.encode(SOURCE)
    tok = marian.tokenizer
    dec = [[marian.start_token, tok.token_to_id("I"), tok.token_to_id("go")]]
    P = distribution(marian.forward(ids[None], decoder_input_ids=dec).logits[0, -1], 1.0)
    assert "and the target 'I go'" in r.output
    assert shown_probabilities(r.output) == {tok.id_to_token(int(i)): round(float(P[i]), 4) for i in np.argsort(-P)[:3]}


@pytest.mark.parametrize("args, message", [
    (["--chat"], "--chat works on single-stack models"),
    (["--ablate", "0.1"], "--ablate works on single-stack models"),
])
def test_next_refuses_what_an_encoder_decoder_lacks(monkeypatch, capsys, marian_dir, args, message):
    assert message in one_line_error(monkeypatch, capsys, "next", SOURCE, "--model", str(marian_dir), *args)


def test_next_target_on_a_decoder_is_one_line(monkeypatch, capsys):
    line = one_line_error(monkeypatch, capsys, "next", "the cat", "--model", str(MODELS / "gpt2"), "--prefix", "x")
    assert "--prefix is the target so far of an encoder–decoder" in line


# show --------------------------------------------------------------------------------

def table_rows(output: str) -> list[list[str]]:
    """The cells of the rows of the terminal tables (lines with │)."""
    return [[c.strip() for c in line.split("│")] for line in output.splitlines() if "│" in line]


def test_show_prints_where_each_target_token_looks_in_the_source(marian, marian_dir):
    r = invoke("show", SOURCE, "--model", str(marian_dir), "--prefix", "I go to school", "--layer", "0")
    trace = translation_trace(marian, SOURCE, marian.encode("I go to school")[0])
    cross = cross_written(trace, marian.tokenizer)
    assert cross.tokens[:4] == ["I", "go", "to", "school"] and trace.tokens[:2] == ["<pad>", "I"]
    assert "source: 0:나는 1:학교에 2:간다 3:</s>" in r.output and "target (given): I go to school" in r.output
    assert "target, as written: 0:I 1:go 2:to 3:school 4:" in r.output
    a = cross.layer(0).attentions                                           # (H, n_tgt, n_src)
    src = trace.encoder.labels
    rows = table_rows(r.output)
    assert len(rows) == 5 and [row[1] for row in rows] == cross.labels
    for i, row in enumerate(rows):
        for h in range(4):
            j = int(np.argmax(a[h, i]))
            assert row[2 + h] == f"{src[j]} {a[h, i, j]:.2f}".replace("0.", ".", 1)
        m = a.mean(0)[i]
        assert row[6] == f"{src[int(np.argmax(m))]} {m.max():.2f}".replace("0.", ".", 1)   # the mean of the heads


def test_show_translates_when_no_target_is_given(marian, marian_dir):
    r = invoke("show", SOURCE, "--model", str(marian_dir))
    translation = marian.generate(SOURCE, 63, temperature=0)
    assert f"translation (greedy): {translation}" in " ".join(r.output.split())     # the console wraps it
    assert "cross-attention, decoder layer 1:" in r.output                 # the last decoder layer by default


def test_show_one_head_prints_its_cross_matrix(marian, marian_dir):
    r = invoke("show", SOURCE, "--model", str(marian_dir), "--prefix", "I go to school", "--head", "2",
               "--layer", "-1")
    trace = translation_trace(marian, SOURCE, marian.encode("I go to school")[0])
    a = trace.cross.layer(1).attentions[2]                                  # (n_tgt, n_src) = (5, 4)
    rows = [line.split("│") for line in r.output.splitlines() if line.count("│") == 4]
    assert [row[0].strip() for row in rows][:4] == ["I", "go", "to", "school"]
    assert [[float(c) for c in row[1:]] for row in rows] == [[round(float(x), 2) for x in r_] for r_ in a]


def test_show_out_writes_cross_heatmaps_both_stacks_and_the_viewer(marian_dir, tmp_path):
    out = tmp_path / "views"
    r = invoke("show", SOURCE, "--model", str(marian_dir), "--prefix", "I go to school", "--head", "1",
               "--out", str(out))
    names = sorted(p.name for p in out.iterdir())
    figures = ["cross_heatmap_layer1_head1", "cross_mean_layer1", "cross_layer0", "cross_layer1", "encoder_overview",
               "decoder_overview"]
    assert names == sorted(["attention.html", "pipeline.html"] + [f"{f}.{x}" for f in figures for x in ("png", "svg")])
    assert f"wrote 14 files to {out} (cross-attention heatmap of head 1):" in r.output
    assert (out / "cross_layer0.png").read_bytes().startswith(b"\x89PNG")
    svg = (out / "cross_mean_layer1.svg").read_text()
    assert "mean of 4 heads" in svg and "target token written" in svg
    html = (out / "attention.html").read_text()
    assert '"kind":"cross"' in html and "</script><script>alert(1)" not in html


@pytest.mark.parametrize("args, message", [
    (["--ablate", "encoder.9.heads.0"], "encoder layer 9 does not exist"),
    (["--layer", "2"], "decoder layer 2 does not exist"),
    (["--head", "4"], "head 4 does not exist"),
    (["--prefix", ""], "the text is empty"),
])
def test_show_mistakes_touch_nothing(monkeypatch, capsys, marian_dir, tmp_path, args, message):
    out = tmp_path / "views"
    line = one_line_error(monkeypatch, capsys, "show", SOURCE, "--model", str(marian_dir), *args, "--out", str(out))
    assert message in line and not out.exists()


def test_show_target_on_a_single_stack_is_one_line(monkeypatch, capsys):
    assert "--prefix is the target text of an encoder–decoder" in one_line_error(
        monkeypatch, capsys, "show", "hi", "--prefix", "x")


def test_show_on_bart_with_its_own_tokenizer(tmp_path):
    """BART: byte-level tokens, 2 encoder and 3 decoder layers."""
    r = invoke("show", "the cat sat", "--model", str(FIXTURES / "seq2seq" / "bart"), "--out", str(tmp_path))
    assert "source: 0:t 1:he 2:␣c 3:at 4:␣s 5:at" in r.output and "decoder layer 2:" in r.output
    assert (tmp_path / "cross_layer2.png").is_file() and not (tmp_path / "cross_layer3.png").exists()


def test_translate_and_show_say_when_source_words_are_unknown(monkeypatch, capsys):
    """Every word of this sentence is outside ko-en-tiny's small vocabulary: the translation still
    prints, with one warning line on stderr naming the unknown words and some the model does know."""
    from conftest import run_main

    code, out, err = run_main(monkeypatch, capsys, "translate", "오늘 날씨가 정말 좋네요", "--model", "ko-en-tiny")
    assert code == 0 and out.strip()
    lines = [l for l in err.splitlines() if l.startswith("warning:")]
    assert len(lines) == 1 and "4 of 4 source tokens are unknown to ko-en-tiny" in lines[0]
    assert "오늘, 날씨가, 정말, 좋네요" in lines[0] and "학교에" not in lines[0].split("e.g.")[0]
    assert "words like these, e.g." in lines[0]
    code, out, err = run_main(monkeypatch, capsys, "translate", "나는 학교에 간다", "--model", "ko-en-tiny")
    assert code == 0 and out.strip() == "I go to school" and "warning" not in err
    code, out, err = run_main(monkeypatch, capsys, "show", "나는 날씨가 간다", "--model", "ko-en-tiny")
    assert code == 0 and "1 of 3 source tokens are unknown to ko-en-tiny" in err and "날씨가" in err
