"""GGUF files with a SentencePiece tokenizer (`tokenizer.ggml.model` "llama": Llama 2, Mistral, Gemma, Phi-3, …),
read by qkv.checkpoints.gguf_spm, against llama.cpp.

The reference is llama.cpp itself (tests/fixtures/make_gguf_spm_fixture.py): two BPE vocabularies trained with
`sentencepiece` (byte fallback), written as llama.cpp's converter writes them — spm_llama (a space put in front of
the text, as Llama), spm_gemma (none, as Gemma), spm_phi3 (spm_llama named so that llama.cpp drops the whitespace
after a special token, its Phi-3 rule) — and llama.cpp's ids (tokenize(text, add_bos=False, special=True)) and
detokenized text for hand-written hard texts and random paragraphs. No llama.cpp is needed to run these tests.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import GGUFValueType as V

import qkv
from conftest import FIXTURES, MODELS, run_main
from qkv.checkpoints import gguf_spm, gguf_tokenizer
from qkv.checkpoints.gguf import metadata, open_reader
from qkv.inputs.tokenizer import Tokenizer
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import make_gguf_fixtures as F  # noqa: E402

GGUF = FIXTURES / "gguf"
NAMES = ("spm_llama", "spm_gemma", "spm_phi3")
REFERENCE = {n: json.loads((GGUF / f"{n}.json").read_text(encoding="utf-8")) for n in NAMES}
NAMED = [(n, c) for n in NAMES for c in REFERENCE[n]["cases"] if c["tag"] != "random"]


def tokenizer_of(path):
    """qkv's tokenizer of GGUF file PATH, as qkv.load builds it (gguf_tokenizer.build → tokenizer.json)."""
    reader = open_reader(path)
    text, config, _ = gguf_tokenizer.build(reader, metadata(reader))
    return Tokenizer.from_json(text, {k: v for k, v in config.items() if k.endswith("_token")})


@pytest.fixture(scope="module")
def tokenizers():
    return {n: tokenizer_of(GGUF / f"{n}.gguf") for n in NAMES}


def ids_of(tokenizer, text: str) -> list[int]:
    ids, _ = tokenizer.encode(text, add_special_tokens=False)
    return ids.tolist()


def test_the_reference_was_made_from_these_files():
    import hashlib

    for name in NAMES:
        assert REFERENCE[name]["gguf"] == f"{name}.gguf"
        assert hashlib.sha256((GGUF / f"{name}.gguf").read_bytes()).hexdigest() == REFERENCE[name]["sha256"]


def test_the_reference_covers_the_hard_texts():
    cases = REFERENCE["spm_llama"]["cases"]
    assert {"leading-space", "spaces", "newlines", "tabs", "digits", "korean", "emoji", "unknown", "specials",
            "code"} <= {c["tag"] for c in cases}
    assert sum(c["tag"] == "random" for c in cases) >= 150
    byte_ids = {i for i, t in enumerate(gguf_spm.vocabulary(open_reader(GGUF / "spm_llama.gguf"))[0])
                if t.startswith("<0x")}
    assert any(byte_ids & set(c["ids"]) for c in cases if c["tag"] == "emoji")          # byte fallback is tested
    # the three files tokenize differently: the space prefix (Gemma's), the whitespace after specials (Phi-3's)
    for other in ("spm_gemma", "spm_phi3"):
        assert sum(a["ids"] != b["ids"] for a, b in zip(cases, REFERENCE[other]["cases"])) >= 20


@pytest.mark.parametrize("name,case", NAMED, ids=lambda v: v if isinstance(v, str) else f"{v['text'][:18]!r}")
def test_named_text_equals_llamacpp(tokenizers, name, case):
    assert ids_of(tokenizers[name], case["text"]) == case["ids"]


@pytest.mark.parametrize("name", NAMES)
def test_every_random_paragraph_equals_llamacpp(tokenizers, name):
    cases = [c for c in REFERENCE[name]["cases"] if c["tag"] == "random"]
    wrong = [c["text"] for c in cases if ids_of(tokenizers[name], c["text"]) != c["ids"]]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ from llama.cpp, the first: {wrong[0]!r}"


@pytest.mark.parametrize("name", NAMES)
def test_bos_is_added_as_llamacpp_adds_it(tokenizers, name):
    for case in REFERENCE[name]["with_bos"]:
        ids, _ = tokenizers[name].encode(case["text"])
        assert ids.tolist() == case["ids"], case["text"]


@pytest.mark.parametrize("name", NAMES)
def test_decoding_equals_llamacpp(tokenizers, name):
    """Where llama.cpp's detokenize gives UTF-8 back, qkv's decode gives the same text (the space prefix taken off,
    control tokens written out); where llama.cpp gives the text itself back, so does qkv."""
    cases = [c for c in REFERENCE[name]["cases"] if c["decoded"]]
    assert len(cases) == len(REFERENCE[name]["cases"])
    for c in cases:
        assert tokenizers[name].decode(c["ids"]) == c["decoded"], c["text"]
    assert sum(c["decoded"] == c["text"] for c in cases) >= 100


def test_the_tokenizer_reads_as_sentencepiece(tokenizers):
    tok = tokenizers["spm_llama"]
    assert tok.spelling == "sentencepiece"
    assert tok.labels(ids_of(tok, "the cat"))[0].strip("␣ ") == "the"
    assert tok.unk_id == 0 and tok.special_tokens["bos_token"] == "<s>" and tok.eos_token_id == 2


# ── a model with this tokenizer: qkv.load, chat template, `qkv generate` ────────────────────────────────────────

def spm_metadata(path, **changes) -> dict[str, tuple]:
    """The tokenizer.* keys of GGUF file PATH as (value, type[, item type]), CHANGES ({key: value, (value, type) or
    None to drop}) applied: what a test writes into another file."""
    reader = GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        meta[key] = (field.contents(), kind, field.types[-1]) if kind == V.ARRAY else (field.contents(), kind)
    for key, value in changes.items():
        key = f"tokenizer.ggml.{key}"
        if value is None:
            meta.pop(key, None)
        elif isinstance(value, tuple):
            meta[key] = value
        else:
            meta[key] = (value,) + meta[key][1:]
    return meta


TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A tiny Llama (tests/fixtures/models/llama_gqa's shape, random weights) as llama.cpp's converter writes it
    (tests/fixtures/gguf_convert.py), with spm_llama's SentencePiece vocabulary and a chat template."""
    import gguf_convert

    tmp = tmp_path_factory.mktemp("spm")
    vocab = spm_metadata(GGUF / "spm_llama.gguf")
    size = len(vocab["tokenizer.ggml.tokens"][0])
    hf = json.loads((MODELS / "llama_gqa" / "config.json").read_text()) | {
        "vocab_size": size, "bos_token_id": 1, "eos_token_id": 2}
    directory = qkv.init(hf, seed=3).save(tmp / "hf")
    vocab["tokenizer.chat_template"] = (TEMPLATE, V.STRING)
    original = gguf_convert.vocabulary
    gguf_convert.vocabulary = lambda directory, hf: vocab
    try:
        return gguf_convert.convert(directory, tmp / "spm-llama.gguf")
    finally:
        gguf_convert.vocabulary = original


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def test_a_model_file_loads_with_its_sentencepiece_tokenizer(model_file, private_cache):
    model = qkv.load(model_file)
    for case in REFERENCE["spm_llama"]["with_bos"] + REFERENCE["spm_llama"]["cases"][:40]:
        ids, _ = model.tokenizer.encode(case["text"])
        want = case["ids"] if "tag" not in case else [1] + case["ids"]
        assert ids.tolist() == want, case["text"]
    text = model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert text == "<s>[INST] Hi [/INST]"
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert ids[0] == 1 and ids.count(1) == 1                # the template's BOS, once: nothing added around it
    assert ids[1:] == ids_of(model.tokenizer, "[INST] Hi [/INST]")
    logits = model.forward(np.array([ids])).logits
    assert logits.shape == (1, len(ids), 700)


def test_generate_runs_on_the_file(model_file, private_cache, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "generate", "The cat sat", "--model", str(model_file), "-n", "4",
                              "-t", "0")
    assert code == 0, err
    assert out.strip().startswith("The cat sat")


# ── damaged and unsupported files: one line each ─────────────────────────────────────────────────────────────

def build_with(tmp_path, base: str = "spm_llama", **changes):
    meta = {"general.architecture": ("llama", V.STRING)} | spm_metadata(GGUF / f"{base}.gguf", **changes)
    path = F.write(tmp_path / "edited.gguf", meta, {})
    reader = open_reader(path)
    return gguf_tokenizer.build(reader, metadata(reader))


def tokens_types_scores():
    tokens, scores, types = gguf_spm.vocabulary(open_reader(GGUF / "spm_llama.gguf"))
    return list(tokens), list(types), list(scores)


def _refusals():
    tokens, types, scores = tokens_types_scores()
    first_merged = next(i for i, t in enumerate(tokens) if types[i] == 1 and len(t) > 1)
    tied = list(scores)
    tied[tokens.index("en")] = tied[tokens.index("nd")]     # e|n|d: "en" (the later token) and "nd" meet on "n"
    no_byte = list(tokens)
    no_byte[tokens.index("<0x41>")] = "<0x41 gone>"
    twice = list(tokens)
    twice[tokens.index("<0x41>")] = tokens[first_merged]
    overlap = list(tokens)
    overlap[tokens.index("<|im_end|>")] = "_end|><|im"                 # its end starts <|im_start|>
    byte_as_normal = list(types)
    byte_as_normal[tokens.index("<0x0A>")] = 1
    return [
        ({"scores": None}, "no tokenizer.ggml.scores"),
        ({"scores": scores[:-1]}, "scores"),
        ({"scores": [float("nan")] + scores[1:]}, "not all finite"),
        ({"token_type": [9] + types[1:]}, "not a token type"),
        ({"token_type": types[:-3]}, "token types"),
        ({"scores": tied}, "share a score and a piece"),
        ({"tokens": no_byte}, "no byte token <0x41>"),
        ({"token_type": byte_as_normal}, "not typed byte"),
        ({"tokens": twice}, "lists a token twice"),
        ({"tokens": overlap}, "overlap"),
        ({"add_space_prefix": ("yes", V.STRING)}, "not true or false"),
    ]


@pytest.mark.parametrize("changes,message", _refusals(), ids=lambda v: next(iter(v)) if isinstance(v, dict) else v)
def test_damaged_files_are_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(QkvError, match=message) as e:
        build_with(tmp_path, **changes)
    assert "\n" not in str(e.value)


def test_the_edits_above_change_only_what_they_say(tmp_path):
    """The unedited metadata, written back by build_with, still builds and tokenizes as llama.cpp."""
    text, config, size = build_with(tmp_path)
    tok = Tokenizer.from_json(text)
    case = REFERENCE["spm_llama"]["cases"][0]
    assert ids_of(tok, case["text"]) == case["ids"] and size == 700 and config["add_bos_token"] is True


def test_llamacpp_defaults_when_the_file_says_nothing(tmp_path):
    """No add_space_prefix, add_bos_token or special ids: llama.cpp's SentencePiece defaults (a space in front, BOS
    added, unk 0, bos 1, eos 2)."""
    text, config, _ = build_with(tmp_path, add_space_prefix=None, add_bos_token=None, bos_token_id=None,
                                 eos_token_id=None, unknown_token_id=None)
    tok = Tokenizer.from_json(text)
    case = REFERENCE["spm_llama"]["with_bos"][0]
    assert tok.encode(case["text"])[0].tolist() == case["ids"]
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")


def test_add_eos_puts_eos_behind(tmp_path):
    text, _, _ = build_with(tmp_path, add_eos_token=True, add_bos_token=False)
    tok = Tokenizer.from_json(text)
    case = REFERENCE["spm_llama"]["cases"][0]
    assert tok.encode(case["text"])[0].tolist() == case["ids"] + [2]


# ── every short text: qkv against llama.cpp's merge loop, written out ─────────────────────────────────────────

def llamacpp_spm(text: str, vocab: dict[str, int], scores: list[float], prefix: bool) -> list[int]:
    """llama.cpp's SentencePiece tokenization of TEXT without special tokens (llm_tokenizer_spm_session), plainly:
    a space in front (PREFIX), spaces as ▁, characters merged pairwise — the adjacent join that is the token of the
    highest score, the leftmost of equal scores — while any join is a token; a piece that is no token as its
    bytes <0xXX>. (llama.cpp keeps the candidate joins in a priority queue; picking the best anew each step is the
    same order.)"""
    pieces = list(("\u2581" if prefix else "") + text.replace(" ", "\u2581"))
    while True:
        joins = [(scores[vocab[a + b]], -i) for i, (a, b) in enumerate(zip(pieces, pieces[1:])) if a + b in vocab]
        if not joins:
            break
        i = -max(joins)[1]
        pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
    return [i for p in pieces for i in ([vocab[p]] if p in vocab else
                                        [vocab[f"<0x{b:02X}>"] for b in p.encode("utf-8")])]


@pytest.mark.parametrize("name", ("spm_llama", "spm_gemma"))
def test_the_written_out_loop_is_llamacpp(name):
    """The loop above gives llama.cpp's ids on every recorded text without a special token in it."""
    tokens, scores, _ = gguf_spm.vocabulary(open_reader(GGUF / f"{name}.gguf"))
    vocab = {t: i for i, t in enumerate(tokens)}
    cases = [c for c in REFERENCE[name]["cases"] if "<" not in c["text"] and c["text"]]
    assert len(cases) >= 100
    for c in cases:
        assert llamacpp_spm(c["text"], vocab, scores, name != "spm_gemma") == c["ids"], c["text"]


@pytest.mark.parametrize("name", ("spm_llama", "spm_gemma"))
def test_every_short_text_equals_llamacpps_loop(tokenizers, name):
    """Every text of up to 5 characters from spaces, ▁, a newline and letters the vocabulary merges most (where
    two joins of one score could meet: runs of spaces, 'the', 'he'): qkv's ranked merges give the loop's ids."""
    import itertools

    tokens, scores, _ = gguf_spm.vocabulary(open_reader(GGUF / f"{name}.gguf"))
    vocab = {t: i for i, t in enumerate(tokens)}
    texts = ["".join(p) for n in range(1, 6) for p in itertools.product(" the\u2581\nan", repeat=n)]
    got = tokenizers[name]._tok.encode_batch(texts, add_special_tokens=False)
    wrong = [t for t, e in zip(texts, got) if e.ids != llamacpp_spm(t, vocab, scores, name != "spm_gemma")]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, the first: {wrong[0]!r}"


@pytest.mark.parametrize("left,right", [("\u2581t", "in"), ("he", "er")])
def test_ties_a_ranked_list_can_follow_tokenize_as_llamacpp(tmp_path, left, right):
    """Two merged tokens of one score, accepted: sharing no piece ("▁t", "in"), or meeting as h|e|r where the left
    one ("he") comes first in the file, as the merge list ranks it. On every short text of their letters qkv gives
    llama.cpp's leftmost-first ids. (The refused way round, "en" after "nd" on e|n|d, differs on 18 of the 1364
    texts of up to 5 of " end" when let through.)"""
    import itertools

    tokens, types, scores = tokens_types_scores()
    scores[tokens.index(right)] = scores[tokens.index(left)]
    text, _, _ = build_with(tmp_path, scores=scores)
    tok = Tokenizer.from_json(text)
    vocab = {t: i for i, t in enumerate(tokens)}
    texts = ["".join(p) for n in range(1, 6) for p in itertools.product(sorted(set(left + right + " ")), repeat=n)]
    got = tok._tok.encode_batch(texts, add_special_tokens=False)
    wrong = [t for t, e in zip(texts, got) if e.ids != llamacpp_spm(t, vocab, scores, True)]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, the first: {wrong[0]!r}"
