"""Every GGUF pre-tokenizer name qkv reads, against llama.cpp's own token ids.

tests/fixtures/gguf/pretokenizers_llamacpp.json (make_gguf_pretokenizer_fixture.py) holds, for each name
in gguf_tokenizer.PRE_TOKENIZERS, the ids llama.cpp gives a few dozen texts that tell the regexes apart
(and some random paragraphs) when SmolLM2's vocabulary, with a few tokens more that show each regex's
pieces in the ids, is read under that name; and one text with the name's BOS default. Here qkv rebuilds
the same tokenizer from the same metadata and must give the same ids, exactly, for every (name, text).
"""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from gguf_names import FakeReader
from qkv.checkpoints import gguf_tokenizer, smollm2_file
from qkv.inputs.tokenizer import Tokenizer
from qkv.runtime.errors import QkvError

REFERENCE = json.loads((FIXTURES / "gguf" / "pretokenizers_llamacpp.json").read_text(encoding="utf-8"))
TEXTS = REFERENCE["texts"]
KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


@pytest.fixture(scope="module")
def vocabulary():
    from gguf import GGUFReader

    fields = GGUFReader(smollm2_file()).fields
    tokens, merges, types = (fields[k].contents() for k in KEYS)
    more = REFERENCE["more_tokens"]                     # the fixture's extra tokens and merges (see its script)
    arrays = [tokens + more, REFERENCE["more_merges"] + merges, types + [1] * len(more)]
    return FakeReader(dict(zip(KEYS, arrays))), {      # SmolLM2's arrays, read once
        "tokenizer.ggml.bos_token_id": fields["tokenizer.ggml.bos_token_id"].contents(),
        "tokenizer.ggml.eos_token_id": fields["tokenizer.ggml.eos_token_id"].contents()}


@pytest.fixture(scope="module")
def tokenizers(vocabulary):
    """name → qkv's tokenizer for SmolLM2's vocabulary under that pre-tokenizer, built once per distinct
    table entry (names with equal entries build the same tokenizer), as the fixture's files say: no
    add_bos_token key."""
    reader, ids = vocabulary
    built: dict = {}

    def get(name: str) -> Tokenizer:
        spec = gguf_tokenizer._pre(name)
        if spec not in built:
            meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name, **ids}
            text, config, _ = gguf_tokenizer.build(reader, meta)
            built[spec] = Tokenizer.from_json(text, special_tokens=config)
        return built[spec]
    return get


def test_every_name_has_llamacpp_reference_and_nothing_else():
    assert set(REFERENCE["pre"]) == set(gguf_tokenizer.PRE_TOKENIZERS)
    for name, ref in REFERENCE["pre"].items():
        assert len(ref["ids"]) == len(TEXTS), name


def test_the_texts_separate_the_regexes():
    text = "".join(TEXTS)
    for needle in ("12345", "YOU'LL", "'RE", "工作", "カタカナ", "고양이", "🦙", "  1", "\n\n  3", "\r\n",
                   "    return", "------", "!!!!!!", "Müller", "1,000,000", "ÉCOLE", "\u00a0", "\u3000", "\u2126",
                   "\u212a", "\u094d", "ា", "camelCase", " xyzzy"):
        assert needle in text, needle
    assert sum(len(t) > 80 for t in TEXTS) >= 8                       # the random paragraphs


@pytest.mark.parametrize("name", sorted(REFERENCE["pre"]))
def test_ids_equal_llamacpp(tokenizers, name):
    tok = tokenizers(name)
    wrong = [(t, ref) for t, ref in zip(TEXTS, REFERENCE["pre"][name]["ids"])
             if tok.encode(t, add_special_tokens=False)[0].tolist() != ref]
    assert not wrong, f"{name}: {len(wrong)} of {len(TEXTS)} texts differ from llama.cpp; the first: {wrong[0][0]!r}"


@pytest.mark.parametrize("name", sorted(REFERENCE["pre"]))
def test_the_bos_default_equals_llamacpp(tokenizers, name):
    """A file without tokenizer.ggml.add_bos_token gets llama.cpp's default for its name (BOS for
    llama3's kin and tekken, none otherwise)."""
    ids = tokenizers(name).encode(REFERENCE["bos_text"])[0].tolist()
    assert ids == REFERENCE["pre"][name]["bos_ids"]


def test_the_file_says_whether_to_add_bos(vocabulary):
    reader, ids = vocabulary
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe", **ids,
            "tokenizer.ggml.add_bos_token": False}
    text, config, _ = gguf_tokenizer.build(reader, meta)
    assert config["add_bos_token"] is False
    assert Tokenizer.from_json(text).encode("Hello")[0].tolist()[0] != ids["tokenizer.ggml.bos_token_id"]


def test_the_older_spelling_gpt2_is_gpt_2():
    assert gguf_tokenizer._pre("gpt2") is gguf_tokenizer._pre("gpt-2")


def test_a_name_is_a_sequence_of_isolated_splits_then_bytes():
    spec = gguf_tokenizer.PRE_TOKENIZERS["deepseek-llm"]
    pre = json.loads(gguf_tokenizer._pre_tokenizer("deepseek-llm").__getstate__())
    steps = pre["pretokenizers"]
    assert [s["type"] for s in steps] == ["Split"] * len(spec.regexes) + ["ByteLevel"]
    assert all(s["behavior"] == "Isolated" for s in steps[:-1]) and steps[-1]["use_regex"] is False


@pytest.mark.parametrize("name", ["nope", "kimi-k2", "gemma4"])
def test_an_unknown_name_is_one_line(vocabulary, name):
    reader, ids = vocabulary
    with pytest.raises(QkvError, match=f"pre-tokenizer '{name}' is not supported") as e:
        gguf_tokenizer.build(reader, {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name, **ids})
    assert "\n" not in str(e.value)
