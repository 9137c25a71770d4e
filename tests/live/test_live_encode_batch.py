"""`Model.encode(list_of_texts)` pads as live transformers' AutoTokenizer(texts, padding=True) does, on fixture
model directories: the same ids and attention mask, the same pad token and side (right by default, left where
tokenizer_config.json says so, tokenizer.json's padding section when there is no config), and the same refusal
when there is no pad token. transformers is imported at module level: without it these tests fail, never skip."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from transformers import AutoTokenizer

import qkv
from qkv.runtime.errors import QkvError
from qkv.inputs.tokenizer import Tokenizer

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello", "a b, 42 times"]
PADDING = {"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": None, "pad_id": 1,
           "pad_type_id": 0, "pad_token": "<s>"}


def checkpoint(tmp_path: Path, name: str, tokenizer_config: dict | None, padding: dict | None = None) -> Path:
    path = tmp_path / name
    shutil.copytree(MODELS / name, path)
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if padding is not None:
        spec = json.loads((path / "tokenizer.json").read_text())
        (path / "tokenizer.json").write_text(json.dumps({**spec, "padding": padding}))
    return path


@pytest.mark.parametrize("name, config, padding", [
    ("gpt2", {"pad_token": "</s>"}, None),
    ("gpt2", {"pad_token": "</s>", "padding_side": "left"}, None),
    ("llama_gqa", {"pad_token": "<pad>", "padding_side": "right"}, None),
    ("gpt2", {"tokenizer_class": "PreTrainedTokenizerFast"}, PADDING),    # tokenizer.json's padding: <s>, left
    ("gpt2", {"tokenizer_class": "PreTrainedTokenizerFast", "padding_side": "right"}, PADDING),   # the config's side
    ("bert", None, None),                                      # [PAD] on the right
    ("roberta", None, None),                                   # <pad> on the right
])
def test_the_batch_equals_transformers(tmp_path, name, config, padding):
    path = checkpoint(tmp_path, name, config, padding)
    ref = AutoTokenizer.from_pretrained(path)(TEXTS, padding=True)
    ids, mask = qkv.load(path).encode(TEXTS)
    assert ids.tolist() == ref["input_ids"] and mask.tolist() == ref["attention_mask"]
    if config is not None or padding is not None:          # the pad token is the tokenizer's own: it alone pads so
        t_ids, t_mask = Tokenizer.from_directory(path).encode(TEXTS)
        assert t_ids.tolist() == ref["input_ids"] and t_mask.tolist() == ref["attention_mask"]


def test_no_pad_token_is_refused_as_transformers_refuses(tmp_path):
    path = checkpoint(tmp_path, "gpt2", {"eos_token": "</s>"})
    with pytest.raises(ValueError, match="does not have a padding token"):
        AutoTokenizer.from_pretrained(path)(TEXTS, padding=True)
    with pytest.raises(QkvError, match="no pad token"):
        Tokenizer.from_directory(path).encode(TEXTS)
