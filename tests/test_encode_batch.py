"""A list of texts → padded ids (B, n) and an attention mask (B, n), as transformers' tokenizer(texts, padding=True):
its pad token (tokenizer_config.json, else tokenizer.json's padding, else the model config's pad_token_id), its
padding side (right unless the checkpoint says left); forward on the batch equals each text run alone.
The same against transformers' AutoTokenizer: tests/live/test_live_encode_batch.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import qkv
from qkv.runtime.errors import QkvError
from qkv.inputs.tokenizer import Tokenizer
from conftest import MODELS

TEXTS = ["the cat sat on the mat", "hello", "a b"]
# The gpt2 fixture's ids of TEXTS, each alone (its tokenizer.json; tests/live checks them against transformers).
IDS = [[86, 259, 291, 273, 263, 273, 298, 262, 287, 273], [259, 280, 81], [67, 268]]
TOL_LOGITS = 1e-4        # float32, the batch against each text alone, at the real positions


def checkpoint(tmp_path, tokenizer_config: dict | None = None, name: str = "gpt2"):
    """A copy of a fixture model directory with this tokenizer_config.json."""
    path = tmp_path / name
    shutil.copytree(MODELS / name, path)
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


def padded(side: str, pad: int) -> tuple[list[list[int]], list[list[int]]]:
    """IDS padded by hand: (ids, mask)."""
    n = max(map(len, IDS))
    fill = [[pad] * (n - len(r)) for r in IDS]
    ones = [[1] * len(r) for r in IDS]
    zeros = [[0] * (n - len(r)) for r in IDS]
    if side == "left":
        return [f + r for f, r in zip(fill, IDS)], [z + o for z, o in zip(zeros, ones)]
    return [r + f for r, f in zip(IDS, fill)], [o + z for o, z in zip(ones, zeros)]


@pytest.mark.parametrize("config, side, pad", [
    (None, "right", 0),                                               # no pad token: config.json's pad_token_id 0
    ({"pad_token": "</s>"}, "right", 2),
    ({"pad_token": "</s>", "padding_side": "left"}, "left", 2),
    ({"pad_token": "<s>", "padding_side": "right"}, "right", 1),
])
def test_a_list_of_texts_is_padded_as_transformers_pads_it(tmp_path, config, side, pad):
    model = qkv.load(checkpoint(tmp_path, config))
    assert [model.encode(t)[0].tolist() for t in TEXTS] == IDS
    ids, mask = model.encode(TEXTS)
    assert ids.shape == mask.shape == (3, 10) and ids.dtype == mask.dtype == np.int64
    assert (ids.tolist(), mask.tolist()) == padded(side, pad)
    if config is not None:                                            # the tokenizer alone pads the same
        t_ids, t_mask = model.tokenizer.encode(TEXTS)
        assert (t_ids.tolist(), t_mask.tolist()) == padded(side, pad)


def test_the_single_text_api_is_unchanged():
    model = qkv.load(MODELS / "gpt2")
    ids, tokens = model.encode(TEXTS[0])
    assert ids.tolist() == IDS[0] and isinstance(tokens, list) and len(tokens) == len(IDS[0])
    ids, tokens = model.tokenizer.encode(TEXTS[1])
    assert ids.tolist() == IDS[1] and len(tokens) == 3


@pytest.mark.parametrize("side", ["right", "left"])
def test_forward_on_the_batch_equals_each_text_alone(tmp_path, side):
    model = qkv.load(checkpoint(tmp_path, {"pad_token": "</s>", "padding_side": side}))
    ids, mask = model.encode(TEXTS)
    batch = model.forward(ids, mask).logits                          # (3, 10, V)
    for b, text in enumerate(TEXTS):
        alone = model.forward(model.encode(text)[0][None]).logits[0]  # (n_b, V)
        real = mask[b] == 1
        assert np.abs(batch[b][real] - alone).max() <= TOL_LOGITS


def test_tokenizer_json_padding_gives_the_pad_token_and_side(tmp_path):
    """Without a tokenizer_config.json, tokenizer.json's own padding section says (as in transformers)."""
    path = checkpoint(tmp_path)
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["padding"] = {"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": None,
                       "pad_id": 1, "pad_type_id": 0, "pad_token": "<s>"}
    (path / "tokenizer.json").write_text(json.dumps(spec))
    tok = Tokenizer.from_directory(path)
    ids, mask = tok.encode(TEXTS)
    assert (ids.tolist(), mask.tolist()) == padded("left", 1)
    assert tok.encode(TEXTS[1])[0].tolist() == IDS[1]               # one text: still never padded


def test_no_pad_token_anywhere_is_one_line(tmp_path):
    path = checkpoint(tmp_path)
    with pytest.raises(QkvError, match="no pad token") as e:
        Tokenizer.from_directory(path).encode(TEXTS)
    assert "set pad_token in tokenizer_config.json" in str(e.value) and "\n" not in str(e.value)
    model = qkv.load(path)
    model = qkv.Model(model.config.with_(pad_token_id=None), model.weights, model.tokenizer, model.name)
    with pytest.raises(QkvError, match="has no pad token .* set pad_token in tokenizer_config.json"):
        model.encode(TEXTS)


@pytest.mark.parametrize("texts, message", [
    ([], "a non-empty list of texts"),
    (["hello", 3], "a non-empty list of texts"),
    (["hello", "  "], "the text is empty"),
    (["hello", "\udcff"], "text 1 is not valid UTF-8"),
])
def test_bad_lists_are_one_line(texts, message):
    with pytest.raises(QkvError, match=message):
        qkv.load(MODELS / "gpt2").encode(texts)


def test_a_bad_padding_side_is_one_line(tmp_path):
    with pytest.raises(QkvError, match="padding_side is 'middle', not \"left\" or \"right\""):
        qkv.load(checkpoint(tmp_path, {"padding_side": "middle"}))


def test_an_encoder_decoder_pads_its_sources(tmp_path):
    """Marian's batch of sources (right, its pad id) gives each source's encoder output alone."""
    model = qkv.load("ko-en-tiny")
    texts = ["나는 학교에 간다", "나는 간다"]
    ids, mask = model.encode(texts)
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]] and ids[1, -1] == model.tokenizer.pad_token_id == 0
    out = model.forward(ids, mask, [[model.start_token]] * 2)
    for b, text in enumerate(texts):
        alone = model.forward(model.encode(text)[0][None], decoder_input_ids=[[model.start_token]])
        assert np.abs(out.logits[b] - alone.logits[0]).max() <= TOL_LOGITS
