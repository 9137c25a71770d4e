"""SmolLM2's tokenizer, rebuilt from GGUF metadata, against llama.cpp's.

The reference is llama.cpp itself (the runtime the GGUF was made for):
tests/fixtures/smollm2/tokenizer_llamacpp.json holds its ids for a few dozen hand-written
edge cases and a couple of hundred random paragraphs (make_smollm2_tokenizer_fixture.py,
through llama-cpp-python's `tokenize(text, add_bos=False, special=True)`). For
`tokenizer.ggml.pre = smollm` llama.cpp splits every digit off first, then applies the
GPT-2 byte-level regex.

transformers' GGUF converter does not know `smollm`: it falls back to the plain GPT-2
regex, and so differs on some texts (whitespace runs before digits, ½, ①).
tokenizer_transformers.json records its ids there (make_smollm2_fixtures.py); the tests
below show qkv is right on every one of them.
"""

from __future__ import annotations

import json

import pytest

import qkv
from conftest import FIXTURES
from gguf_names import FakeReader
from qkv.checkpoints import gguf_tokenizer
from qkv.runtime.errors import QkvError

SMOLLM2 = FIXTURES / "smollm2"
REFERENCE = json.loads((SMOLLM2 / "tokenizer_llamacpp.json").read_text(encoding="utf-8"))
CASES = REFERENCE["cases"]
NAMED = [c for c in CASES if c["tag"] != "random"]
TRANSFORMERS = json.loads((SMOLLM2 / "tokenizer_transformers.json").read_text(encoding="utf-8"))
DIFFER = {int(i): ids for i, ids in TRANSFORMERS["differ"].items()}


@pytest.fixture(scope="module")
def tokenizer():
    return qkv.load("smollm2").tokenizer


def ids_of(tokenizer, text: str) -> list[int]:
    ids, _ = tokenizer.encode(text)
    return ids.tolist()


def test_the_reference_covers_what_the_issue_names():
    tags = {c["tag"] for c in CASES}
    assert {"english", "korean", "code", "digits", "space-digits", "fractions", "circled", "emoji",
            "specials"} <= tags
    assert sum(c["tag"] == "random" for c in CASES) >= 200
    text = "".join(c["text"] for c in CASES)
    for needle in ("½", "①", "<|im_start|>", "<|im_end|>", "\n    ", "\t", "  1", "🙂", "고양이"):
        assert needle in text, needle


@pytest.mark.parametrize("case", NAMED, ids=lambda c: f"{c['tag']}:{c['text'][:20]!r}")
def test_named_text_equals_llamacpp(tokenizer, case):
    assert ids_of(tokenizer, case["text"]) == case["ids"]


def test_every_random_paragraph_equals_llamacpp(tokenizer):
    wrong = [c["text"] for c in CASES if c["tag"] == "random" and ids_of(tokenizer, c["text"]) != c["ids"]]
    assert not wrong, f"{len(wrong)} paragraphs differ from llama.cpp, the first: {wrong[0]!r}"


def test_decoding_gives_the_text_back(tokenizer):
    for c in CASES:
        assert tokenizer.decode(c["ids"]) == c["text"]


def test_specials_are_one_token_each(tokenizer):
    assert ids_of(tokenizer, "<|im_start|>") == [1]
    assert ids_of(tokenizer, "<|im_end|>") == [2]
    assert ids_of(tokenizer, "<|endoftext|>") == [0]
    ids = ids_of(tokenizer, "<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == ids.count(2) == 1
    assert ids_of(tokenizer, "Hello")[0] != 1                   # add_bos_token is false: nothing added


def test_every_digit_is_its_own_piece(tokenizer):
    """smollm splits every number character off before the GPT-2 regex, so no space joins it."""
    pieces = [tokenizer.decode([i]) for i in ids_of(tokenizer, "x = 1234567890")]
    assert pieces == ["x", " =", " ", *"1234567890"]
    for c in "7½①²":
        assert ids_of(tokenizer, " " + c) == ids_of(tokenizer, " ") + ids_of(tokenizer, c), c
        assert ids_of(tokenizer, "a  " + c) == ids_of(tokenizer, "a") + ids_of(tokenizer, "  ") + ids_of(tokenizer, c)


def test_transformers_gpt2_fallback_differs_and_qkv_is_right(tokenizer):
    """transformers' converted tokenizer (plain GPT-2 regex) differs from llama.cpp on these
    texts; qkv equals llama.cpp on each of them."""
    assert TRANSFORMERS["cases"] == len(CASES)
    assert DIFFER, "transformers' tokenizer no longer differs: check whether it learned `smollm`"
    tags = {CASES[i]["tag"] for i in DIFFER}
    assert {"space-digits", "fractions", "circled"} <= tags, tags
    for i, theirs in DIFFER.items():
        ours = ids_of(tokenizer, CASES[i]["text"])
        assert ours == CASES[i]["ids"] != theirs
    # Where it agrees, everything else is already tested against llama.cpp above.


def test_the_smollm_pre_tokenizer_splits_digits_before_the_gpt2_regex():
    pre = gguf_tokenizer._pre_tokenizer("smollm")
    pieces = [p for p, _ in pre.pre_tokenize_str("a  12 ½")]
    assert pieces == ["a", "ĠĠ", "1", "2", "Ġ", "Â½"]                    # (byte-level letters)


def test_an_unknown_pre_tokenizer_is_one_clear_error():
    with pytest.raises(QkvError, match="pre-tokenizer 'nope' is not supported"):
        gguf_tokenizer._pre_tokenizer("nope")


@pytest.mark.parametrize("pre, expected", [("gpt2", ["ab", "c"]), ("llama3", ["abc"])])
def test_llama3_takes_a_whole_token_before_merging(pre, expected):
    """llama.cpp's `ignore_merges` for llama3: a piece that is a token is taken whole, even when
    no merge builds it (the merges alone give ab + c)."""
    from tokenizers import Tokenizer

    tokens = ["a", "b", "c", "ab", "abc"]
    reader = FakeReader({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b"]})
    text, _, _ = gguf_tokenizer.build(reader, {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre})
    assert Tokenizer.from_str(text).encode("abc").tokens == expected
