"""Corpus runs: reading files, windows, failures that do not stop the run, checkpoints and resuming."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS
from qkv import QkvError
from qkv.analysis import analyse, open_corpus
from qkv.analysis.corpus import template_of, windows

SENTENCES = ["The cat sat on the mat.", "A dog ran after the cat, barking.", "Attention is all you need.",
             "The old man built a small boat.", "She read the long report twice.", "Rain fell on the quiet town."]


def write(tmp_path, text: str | bytes, name: str = "corpus.txt"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def same_report(a, b) -> None:
    """Bit-for-bit the same numbers, roles and failures."""
    assert a.to_json() == b.to_json()


# ── reading ─────────────────────────────────────────────────────────────────────

def test_one_text_per_line_skips_blank_and_whitespace_lines(tmp_path):
    c = open_corpus(write(tmp_path, "first text\n\n   \t\nsecond text\r\n  third  \n"))
    assert c.count == 3
    assert list(c.texts()) == [(0, 1, "first text"), (1, 4, "second text"), (2, 5, "third")]
    assert list(c.texts(start=2)) == [(2, 5, "third")]


def test_paragraphs_are_separated_by_blank_lines(tmp_path):
    c = open_corpus(write(tmp_path, "\ufeffone\nstill one\n\n  \ntwo\n"), split="paragraph")
    assert list(c.texts()) == [(0, 1, "one\nstill one"), (1, 5, "two")]


def test_the_hash_follows_the_content(tmp_path):
    a = open_corpus(write(tmp_path, "a\nb\n", "a.txt"))
    b = open_corpus(write(tmp_path, "a\nc\n", "b.txt"))
    assert a.sha256 != b.sha256 and a.count == b.count == 2


@pytest.mark.parametrize("content, message", [
    (b"", "holds no text"),
    (b"  \n\t\n   \n", "holds no text"),
    (b"hello\x00world\n", "looks binary"),
    (bytes(range(256)), "looks binary"),
])
def test_bad_corpora_are_refused_with_the_fix(tmp_path, content, message):
    with pytest.raises(QkvError, match=message):
        open_corpus(write(tmp_path, content))


def test_missing_file_and_directory_are_refused(tmp_path):
    with pytest.raises(QkvError, match="cannot read"):
        open_corpus(tmp_path / "nope.txt")
    with pytest.raises(QkvError, match="is a directory"):
        open_corpus(tmp_path)
    with pytest.raises(QkvError, match="unknown split"):
        open_corpus(write(tmp_path, "a\n"), split="words")


# ── windows ─────────────────────────────────────────────────────────────────────

def test_templates_of_bert_and_gpt2(minilm):
    bert = template_of(minilm.tokenizer)
    assert (bert.prefix, bert.suffix, bert.tokens) == ((101,), (102,), ("[CLS]", "[SEP]"))
    gpt2 = template_of(qkv.load(MODELS / "gpt2").tokenizer)
    assert gpt2.prefix == gpt2.suffix == ()


def test_long_texts_are_cut_into_wrapped_windows(minilm):
    ids, _ = minilm.tokenizer.encode(" ".join(SENTENCES * 3))
    t = template_of(minilm.tokenizer)
    pieces = windows(ids, 16, t)
    assert len(pieces) == -(-(len(ids) - 2) // 14)
    assert all(len(p) <= 16 and p[0] == 101 and p[-1] == 102 for p in pieces)
    assert np.array_equal(np.concatenate([p[1:-1] for p in pieces]), ids[1:-1])        # every token once
    assert windows(ids, len(ids), t)[0] is not None and len(windows(ids, len(ids), t)) == 1
    with pytest.raises(QkvError, match="larger --window"):
        windows(ids, 2, t)


def test_a_text_longer_than_the_window_is_pooled_over_its_windows(minilm):
    long_text = " ".join(SENTENCES)
    whole = analyse(minilm, [long_text])
    cut = analyse(minilm, [long_text], window=12)
    assert whole.windows == 1 and cut.windows > 1 and cut.texts == 1
    assert cut.roles[0][2] == "previous"                                  # windows do not hide a head's role
    with pytest.raises(QkvError, match="outside 2..512"):
        analyse(minilm, ["hi"], window=513)


# ── runs ────────────────────────────────────────────────────────────────────────

def test_a_text_that_fails_is_reported_and_the_run_goes_on(tmp_path, minilm):
    path = write(tmp_path, "\n".join(SENTENCES[:2] + ["\x01\x02\x03"] + SENTENCES[2:4]) + "\n")
    report = analyse(minilm, open_corpus(path))
    assert report.texts == 4
    assert [(f.index, f.line) for f in report.failures] == [(2, 3)]
    assert "gives no tokens" in report.failures[0].error
    assert report.to_json()["failed"] == [{"index": 2, "line": 3, "error": "the text gives no tokens"}]


def test_a_run_where_every_text_fails_says_so(minilm):
    with pytest.raises(QkvError, match="no text could be analysed"):
        analyse(minilm, ["\x01", "\x02"])


def test_each_text_counts_once_whatever_its_length(minilm):
    a, b = SENTENCES[0], SENTENCES[1]
    both = analyse(minilm, [a, b])
    one, two = analyse(minilm, [a]), analyse(minilm, [b])
    assert np.allclose(both.stats["prev"], (one.stats["prev"] + two.stats["prev"]) / 2, atol=1e-15)


class Stop(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_same_bits(tmp_path, minilm):
    corpus = open_corpus(write(tmp_path, "\n".join(SENTENCES * 2) + "\n"))
    whole = analyse(minilm, corpus)
    ckpt = tmp_path / "run.npz"
    done = []

    def stop_after_five(k):
        done.append(k)
        if sum(done) >= 5:
            raise Stop

    with pytest.raises(Stop):
        analyse(minilm, corpus, checkpoint=ckpt, progress=stop_after_five)
    assert ckpt.exists()
    resumed_from = []
    resumed = analyse(minilm, corpus, checkpoint=ckpt, progress=resumed_from.append)
    assert resumed_from[0] == 5                                       # the 5 done texts are not run again
    assert sum(resumed_from) == corpus.count
    same_report(resumed, whole)
    same_report(analyse(minilm, corpus, checkpoint=ckpt), whole)     # a finished checkpoint: same answer


def test_a_checkpoint_of_another_corpus_is_refused(tmp_path, minilm):
    ckpt = tmp_path / "run.npz"
    analyse(minilm, open_corpus(write(tmp_path, "one text\n", "a.txt")), checkpoint=ckpt)
    with pytest.raises(QkvError, match="belongs to another run"):
        analyse(minilm, open_corpus(write(tmp_path, "another text\n", "b.txt")), checkpoint=ckpt)
    write(tmp_path, b"not a checkpoint", "bad.npz")
    with pytest.raises(QkvError, match="not a qkv heads checkpoint"):
        analyse(minilm, open_corpus(tmp_path / "a.txt"), checkpoint=tmp_path / "bad.npz")
    with pytest.raises(QkvError, match="needs a corpus file"):
        analyse(minilm, ["a list"], checkpoint=ckpt)


def test_decoders_report_cls_and_sep_as_not_applicable():
    report = analyse(str(MODELS / "gpt2"), ["the cat sat on the mat, the cat ran."])
    assert report.stats["cls"] is None and report.stats["sep"] is None
    assert set(report.not_applicable) == {"cls", "sep"}
    js = report.to_json()
    assert js["stats"]["cls"] == [[None] * 4] * 2                     # L × H of null, never 0
    assert report.stats["next"].max() == 0.0                          # causal: nothing after the token
    assert report.detectors["duplicate_token"] is not None            # "the cat" repeats


# ── long lines: read and cut in bounded pieces ──────────────────────────────────

def test_a_long_line_becomes_bounded_texts_that_keep_every_word(tmp_path):
    """A line of ~590 KB (no text may pass PIECE characters, the file is read PIECE bytes at a time): cut after a
    space, each piece a text of that line, every word kept in order; the hash is the file's bytes' own."""
    import hashlib

    from qkv.analysis.corpus import PIECE

    line = " ".join(f"word{i}" for i in range(80_000))
    path = write(tmp_path, f"short one\n{line}\nlast\n")
    c = open_corpus(path)
    texts = list(c.texts())
    assert c.count == len(texts) > 3 and all(len(t) <= PIECE for _, _, t in texts)
    assert texts[0] == (0, 1, "short one") and texts[-1] == (c.count - 1, 3, "last")
    assert {n for _, n, _ in texts[1:-1]} == {2} and " ".join(t for _, _, t in texts[1:-1]) == line
    assert c.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert list(c.texts(start=c.count - 1)) == [texts[-1]]


def test_a_long_line_without_spaces_is_cut_between_characters(tmp_path):
    """No whitespace to cut at: the pieces end between two characters, never inside a UTF-8 sequence."""
    from qkv.analysis.corpus import PIECE

    line = "é中😀" * 40_000                                          # 2, 3 and 4 bytes a character
    texts = [t for _, _, t in open_corpus(write(tmp_path, line + "\r\nok")).texts()]
    assert "".join(texts[:-1]) == line and texts[-1] == "ok" and all(len(t) <= PIECE for t in texts)


def test_a_long_paragraph_is_cut_between_its_lines(tmp_path):
    from qkv.analysis.corpus import PIECE

    lines = [f"line {i} of a paragraph that goes on" for i in range(5000)]               # ~180 KB, no blank line
    texts = [t for _, _, t in open_corpus(write(tmp_path, "\n".join(lines) + "\n\nnext\n"), "paragraph").texts()]
    assert len(texts) > 2 and all(len(t) <= PIECE for t in texts) and texts[-1] == "next"
    assert "\n".join(texts[:-1]).split("\n") == lines
