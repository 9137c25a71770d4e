"""qkv.train.data: induction batches (repeated random tokens), text corpora with char and byte-level
BPE tokenizers (English and Korean), batches as functions of (seed, step), and every bad input."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.runtime.errors import QkvError
from qkv.train.data import (EOT, UNK, TextCorpus, build_tokenizer, char_tokenizer, induction_batch,
                            repeated_half_targets)

ENGLISH = ("The cat sat on the mat.\tIt was a sunny day;  the dog barked twice.\n"
           "\n  Indented line, trailing spaces   \r\nNumbers 3.14 and émigré café.\n") * 12
KOREAN = ("옛날 옛적에 작은 마을에 한 소년이 살았습니다.\n그 소년은 매일 아침 강가에 나가 물고기를 잡았습니다.\n\n"
          "어느 날, 소년은  커다란 황금 물고기를 만났습니다! 「안녕?」\t끝 \n") * 12
TEXTS = {"english": ENGLISH, "korean": KOREAN}


# ── induction ───────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("bos", [0, 5, None])
def test_induction_batch_repeats_each_row(bos):
    ids = induction_batch(seed=3, step=0, batch=6, half=10, vocab=12, bos=bos)
    o = 0 if bos is None else 1
    assert ids.shape == (6, o + 20) and ids.dtype == np.int64
    assert np.array_equal(ids[:, o:o + 10], ids[:, o + 10:])
    assert ids.min() >= 0 and ids.max() < 12
    if bos is not None:
        assert (ids[:, 0] == bos).all() and not (ids[:, 1:] == bos).any()
    assert len(np.unique(ids[:, o:])) >= 10 - (bos is not None)     # uniform over the others, not constant


def test_induction_batch_depends_only_on_seed_and_step():
    a = induction_batch(1, 7, 4, 16, 50)
    induction_batch(1, 6, 4, 16, 50)                               # what was drawn before does not matter
    assert np.array_equal(a, induction_batch(1, 7, 4, 16, 50))
    assert not np.array_equal(a, induction_batch(1, 8, 4, 16, 50))
    assert not np.array_equal(a, induction_batch(2, 7, 4, 16, 50))


def test_repeated_half_targets():
    # [bos] a b c a b c: positions 3, 4, 5 predict the repeated a, b, c
    assert repeated_half_targets(7, 3, 0).tolist() == [False, False, False, True, True, True, False]
    assert repeated_half_targets(6, 3, None).tolist() == [False, False, True, True, True, False]
    ids = induction_batch(0, 0, 3, 8, 30, bos=2)
    mask = repeated_half_targets(ids.shape[1], 8, 2)
    nxt = np.flatnonzero(mask) + 1                                 # the predicted positions
    assert mask.sum() == 8 and (nxt >= 9).all() and (nxt < 17).all()
    # every predicted token but the first of the half is the one after the earlier copy of the current one
    for t in np.flatnonzero(mask)[1:]:
        assert (ids[:, t + 1] == ids[:, t + 1 - 8]).all() and (ids[:, t] == ids[:, t - 8]).all()
    with pytest.raises(QkvError, match="has 17 tokens, not 16"):
        repeated_half_targets(16, 8, 0)


@pytest.mark.parametrize("kw, words", [
    (dict(batch=0), "batch must be a whole number ≥ 1"),
    (dict(half=0), "half must be"),
    (dict(vocab=2), "vocab must be a whole number ≥ 3"),
    (dict(bos=12), r"bos must be a token id in 0..11"),
    (dict(seed=-1), "seed must be"),
    (dict(step=1.5), "step must be"),
])
def test_bad_induction_settings(kw, words):
    args = dict(seed=0, step=0, batch=2, half=4, vocab=12, bos=0) | kw
    with pytest.raises(QkvError, match=words) as e:
        induction_batch(**args)
    assert "\n" not in str(e.value)


# ── tokenizers and corpora ──────────────────────────────────────────────────────

@pytest.fixture(params=[(lang, kind) for lang in TEXTS for kind in ("char", "bpe")], ids=lambda p: "-".join(p))
def corpus_case(request, tmp_path):
    lang, kind = request.param
    path = tmp_path / f"{lang}.txt"
    path.write_bytes(TEXTS[lang].encode("utf-8"))
    return TEXTS[lang], kind, TextCorpus.from_file(path, tokenizer=kind)


def test_corpus_round_trip_and_ids(corpus_case):
    text, kind, corpus = corpus_case
    ids = np.concatenate([corpus.train_ids, corpus.val_ids])
    assert corpus.train_ids.dtype == corpus.val_ids.dtype == np.int64 and corpus.train_ids.ndim == 1
    assert corpus.decode(ids) == text                                  # exactly: spaces, tabs, \r\n, blank lines
    assert corpus.decode(corpus.train_ids) + corpus.decode(corpus.val_ids) == text or kind == "bpe"
    assert ids.min() >= 0 and ids.max() < corpus.vocab_size
    assert len(corpus.val_ids) == int(len(ids) * 0.1) > 0
    assert corpus.tokenizer.id_to_token(corpus.eot_id) == EOT
    assert corpus.eot_id not in ids                                    # the text's own ids only
    if kind == "char":
        assert len(ids) == len(text) and corpus.vocab_size == len(set(text)) + 2
        assert corpus.tokenizer.token_to_id(UNK) == 0
    else:
        assert len(ids) < len(text) and corpus.vocab_size <= 512


def test_corpus_as_qkv_tokenizer(corpus_case):
    text, kind, corpus = corpus_case
    tok = corpus.qkv_tokenizer()
    ids, _ = tok.encode(text, add_special_tokens=False)
    assert np.array_equal(ids, np.concatenate([corpus.train_ids, corpus.val_ids]))
    assert tok.decode(ids) == text and tok.vocab_size == corpus.vocab_size
    assert tok.eos_token_id == corpus.eot_id
    assert tok.spelling == ("byte-level" if kind == "bpe" else "plain")


def test_corpus_batches(corpus_case):
    _, _, corpus = corpus_case
    a = corpus.batch(seed=0, step=5, batch=8, n=16)
    assert a.shape == (8, 16) and a.dtype == np.int64
    assert np.array_equal(a, corpus.batch(0, 5, 8, 16))
    assert not np.array_equal(a, corpus.batch(0, 6, 8, 16))
    assert not np.array_equal(a, corpus.batch(1, 5, 8, 16))
    train = corpus.train_ids
    for row in a:                                                      # each row is a window of train_ids
        starts = np.flatnonzero(train[: len(train) - 15] == row[0])
        assert any(np.array_equal(train[s:s + 16], row) for s in starts)
    v = corpus.batch(0, 5, 2, 8, split="val")
    assert v.shape == (2, 8) and any(np.array_equal(corpus.val_ids[s:s + 8], v[0])
                                     for s in range(len(corpus.val_ids) - 7))


def test_whole_split_is_one_window():
    corpus = TextCorpus.from_text("abcdefghij", "char", val_fraction=0)
    assert len(corpus.val_ids) == 0
    assert corpus.decode(corpus.batch(0, 0, 3, 10)[2]) == "abcdefghij"


def test_char_tokenizer_splits_every_character():
    """Oniguruma's "." would leave "\\n\\n" as one piece ([UNK]); [\\s\\S] splits it."""
    tok = char_tokenizer("a\n\nb  c\r\n")
    enc = tok.encode("a\n\nb  c\r\n")
    assert enc.tokens == ["a", "\n", "\n", "b", " ", " ", "c", "\r", "\n"]
    assert tok.encode("z").tokens == [UNK]


def test_char_vocab_size_keeps_the_most_frequent():
    tok = char_tokenizer("aaaabbbcc d", vocab_size=5)                 # [UNK], EOT, a, b, c
    assert sorted(tok.get_vocab()) == sorted([UNK, EOT, "a", "b", "c"])
    assert tok.decode(tok.encode("abc").ids) == "abc"


def test_bpe_vocab_size_and_determinism():
    a = build_tokenizer("bpe", KOREAN, 300)
    assert a.get_vocab_size() == 300 and a.token_to_id(EOT) == 0
    assert a.to_str() == build_tokenizer("bpe", KOREAN, 300).to_str()
    unseen = "처음 보는 글자: 뷁 🙂"
    assert a.decode(a.encode(unseen).ids) == unseen                   # bytes cover any text


def test_corpus_from_a_saved_tokenizer():
    """On resume a run reads its tokenizer.json back instead of training a new one."""
    from tokenizers import Tokenizer as HFTokenizer

    first = TextCorpus.from_text(KOREAN, "bpe", vocab_size=400)
    again = TextCorpus(KOREAN, HFTokenizer.from_str(first.tokenizer.to_str()))
    assert np.array_equal(first.train_ids, again.train_ids) and np.array_equal(first.val_ids, again.val_ids)


def test_utf8_bom_is_dropped(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "한국어 text\n".encode() * 20)
    corpus = TextCorpus.from_file(path)
    assert corpus.decode(np.concatenate([corpus.train_ids, corpus.val_ids])) == "한국어 text\n" * 20


# ── bad input ───────────────────────────────────────────────────────────────────

def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(QkvError, match="no such file") as e:
        TextCorpus.from_file(tmp_path / "nope.txt")
    assert "give a UTF-8 text file" in _one_line(e)
    with pytest.raises(QkvError, match="is a directory") as e:
        TextCorpus.from_file(tmp_path)
    _one_line(e)


@pytest.mark.parametrize("content, words", [(b"", "is empty"), (b"  \n\t\r\n  ", "is only whitespace")])
@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_empty_or_blank_file(tmp_path, content, words, kind):
    path = tmp_path / "blank.txt"
    path.write_bytes(content)
    with pytest.raises(QkvError, match=words) as e:
        TextCorpus.from_file(path, tokenizer=kind)
    assert str(path) in _one_line(e)


def test_not_utf8_names_the_byte_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("안녕 café".encode("utf-8") + " naïve".encode("latin-1"))
    offset = len("안녕 café naï".encode("utf-8")) - 2                     # where the Latin-1 ï (0xef) sits
    with pytest.raises(QkvError, match=f"not UTF-8 \\(byte 0xef at byte offset {offset}\\)") as e:
        TextCorpus.from_file(path)
    _one_line(e)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_text_too_short_for_a_window(tmp_path, kind):
    path = tmp_path / "short.txt"
    path.write_text("안녕하세요 world", encoding="utf-8")
    corpus = TextCorpus.from_file(path, tokenizer=kind, val_fraction=0.2)
    have = len(corpus.train_ids)
    with pytest.raises(QkvError, match=f"train split has {have} tokens, too few for one window of n=64 "
                                       r"tokens \(needs 64\)") as e:
        corpus.batch(0, 0, 1, 64)
    _one_line(e)
    with pytest.raises(QkvError, match=f"val split has {len(corpus.val_ids)} tokens.*larger val_fraction"):
        corpus.batch(0, 0, 1, max(2, len(corpus.val_ids) + 1), split="val")


@pytest.mark.parametrize("kw, words", [
    (dict(tokenizer="word"), "unknown tokenizer kind 'word'; use one of char, bpe"),
    (dict(tokenizer="bpe", vocab_size=100), r"vocab_size for bpe must be a whole number in 257..65536"),
    (dict(tokenizer="bpe", vocab_size=10**6), r"vocab_size for bpe must be"),
    (dict(tokenizer="char", vocab_size=2), r"vocab_size for char must be a whole number in 3..65536"),
    (dict(tokenizer="char", vocab_size=12.5), r"vocab_size for char must be"),
    (dict(val_fraction=1.0), r"val_fraction must be in \[0, 1\)"),
    (dict(val_fraction=-0.1), r"val_fraction must be in \[0, 1\)"),
])
def test_bad_settings(tmp_path, kw, words):
    path = tmp_path / "t.txt"
    path.write_text(ENGLISH, encoding="utf-8")
    with pytest.raises(QkvError, match=words) as e:
        TextCorpus.from_file(path, **kw)
    _one_line(e)


@pytest.mark.parametrize("kw, words", [
    (dict(split="test"), "unknown split 'test'"),
    (dict(n=1), "n must be a whole number ≥ 2"),
    (dict(batch=0), "batch must be"),
    (dict(seed=-3), "seed must be"),
])
def test_bad_batch_settings(kw, words):
    corpus = TextCorpus.from_text(ENGLISH)
    with pytest.raises(QkvError, match=words) as e:
        corpus.batch(**(dict(seed=0, step=0, batch=2, n=8) | kw))
    _one_line(e)


def test_text_with_lone_surrogates_is_refused():
    with pytest.raises(QkvError, match="not valid UTF-8"):
        TextCorpus.from_text("bad \udcff byte" * 10)
