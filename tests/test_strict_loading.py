"""Strict loading (issue 22): config.json's model_type is checked before any other value.

The fixtures are copied into tmp_path and changed there.
"""

from __future__ import annotations

import json
import shutil

import pytest

import qkv
from conftest import MODELS
from qkv.checkpoints import FAMILIES, config_of


def copy(source, tmp_path):
    dst = tmp_path / source.name
    shutil.copytree(source, dst)
    return dst


def edit_config(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def refusal(source) -> str:
    with pytest.raises(qkv.QkvError) as e:
        qkv.load(source)
    message = str(e.value)
    assert "\n" not in message
    return message


# ── model_type first ─────────────────────────────────────────────────────────────

@pytest.mark.parametrize("fixture, changes", [
    ("qwen2", dict(model_type="qwen2_moe", sliding_window=0)),            # Qwen2-MoE configs say 0 (unused)
    ("bert", dict(model_type="deberta-v2", type_vocab_size=0)),          # DeBERTa-v2 has no token types
])
def test_an_unsupported_family_is_named_before_its_values(tmp_path, fixture, changes):
    d = copy(MODELS / fixture, tmp_path)
    edit_config(d, **changes)
    message = refusal(d)
    assert message == (f"model_type {changes['model_type']!r} is not supported; "
                       f"qkv runs {', '.join(sorted(FAMILIES))}")
    with pytest.raises(qkv.QkvError, match="is not supported"):
        config_of(json.loads((d / "config.json").read_text()))
    with pytest.raises(qkv.QkvError, match="is not supported"):
        qkv.init(json.loads((d / "config.json").read_text()))


def test_a_supported_family_still_gets_the_value_reason(tmp_path):
    d = copy(MODELS / "mistral", tmp_path)
    edit_config(d, sliding_window=0)
    assert "sliding_window = 0 is not a positive integer" in refusal(d)


@pytest.mark.parametrize("kind", [["gpt2"], {"a": 1}, 7, None])
def test_a_model_type_that_is_not_a_name(kind):
    with pytest.raises(qkv.QkvError, match="model_type .* is not supported"):
        config_of({"model_type": kind, "n_embd": "64"})
