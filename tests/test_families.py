"""Every family against transformers: tiny random checkpoints and their reference outputs.

The fixtures (tests/fixtures/models/*) were made by tests/fixtures/make_fixtures.py with
transformers; every parameter is perturbed away from its init, so a loader that dropped
or swapped a bias or norm would fail here.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from conftest import DECODER_FIXTURES, FAMILY_FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_padded_batch_equals_reference(name):
    ref = reference(name)
    model = qkv.load(MODELS / name)
    out = model.forward(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    valid = ref["attention_mask"].astype(bool)                      # (B, n): compare real tokens only
    assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
    L, B, H, n, _ = ref["attentions"].shape
    assert out.attentions.shape == (L, B, H, n, n)
    for b in range(B):
        rows = valid[b]
        assert max_abs(out.attentions[:, b][:, :, rows], ref["attentions"][:, b][:, :, rows]) <= TOL_ATTENTION
    if "logits" in ref:
        assert max_abs(out.logits[valid], ref["logits"][valid]) <= TOL_HIDDEN
    else:
        assert out.logits is None                                  # encoders give hidden states


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_every_layer_equals_reference(name):
    """The residual stream entering each block equals transformers' hidden_states[i].

    Row 1 of the batch is right-padded and has token type 0: its real tokens, run
    alone, must give the reference's numbers at those positions.
    """
    ref = reference(name)
    model = qkv.load(MODELS / name)
    n = int(ref["attention_mask"][1].sum())
    assert not ref.get("token_type_ids", np.zeros((2, 1)))[1].any()
    trace = model.run(ref["input_ids"][1, :n], keep=("residual",))
    for i in range(model.config.n_layers):
        assert max_abs(trace.layer(i).residual, ref["hidden_states"][i, 1, :n]) <= TOL_HIDDEN
    assert max_abs(trace.hidden, ref["hidden"][1, :n]) <= TOL_HIDDEN


@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_single_sequence_logits(name):
    ref = reference(name)
    out = qkv.load(MODELS / name).forward(ref["single_input_ids"])
    assert max_abs(out.logits, ref["single_logits"]) <= TOL_HIDDEN
    assert max_abs(out.attentions, ref["single_attentions"]) <= TOL_ATTENTION


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_float64_agrees_with_float32(name):
    ref = reference(name)
    m32 = qkv.load(MODELS / name)
    m64 = qkv.load(MODELS / name, dtype=np.float64)
    o32 = m32.forward(ref["input_ids"], ref["attention_mask"])
    o64 = m64.forward(ref["input_ids"], ref["attention_mask"])
    assert o32.hidden.dtype == np.float32 and o64.hidden.dtype == np.float64
    valid = ref["attention_mask"].astype(bool)
    assert max_abs(o32.hidden[valid], o64.hidden[valid]) <= TOL_HIDDEN


@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_left_padding_equals_unpadded(name):
    """Positions count real tokens, so a left-padded row equals the row alone."""
    model = qkv.load(MODELS / name)
    ids = reference(name)["single_input_ids"][0, :9]
    alone = model.forward(ids[None]).logits[0]
    padded = np.concatenate([[0, 0, 0], ids])[None]
    mask = np.array([[0, 0, 0] + [1] * len(ids)])
    out = model.forward(padded, mask).logits[0, 3:]
    assert max_abs(out, alone) <= TOL_HIDDEN


@pytest.mark.parametrize("name", [n for n in FAMILY_FIXTURES if "text" in reference(n)])
def test_tokenizer_matches_reference(name):
    ref = reference(name)
    ids, tokens = qkv.load(MODELS / name).encode(str(ref["text"]))
    assert ids.tolist() == ref["text_ids"].tolist()
    assert len(tokens) == len(ids)


def test_gpt_neox_reads_the_older_rotary_keys(tmp_path):
    """rotary_pct / rotary_emb_base (configs before transformers 5's rope_parameters) are the same knobs."""
    import json
    import shutil

    src = MODELS / "gpt_neox"
    shutil.copytree(src, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters")
    cfg |= {"rotary_pct": params["partial_rotary_factor"], "rotary_emb_base": params["rope_theta"]}
    path.write_text(json.dumps(cfg))
    ref = reference("gpt_neox")
    a = qkv.load(src).forward(ref["input_ids"], ref["attention_mask"]).logits
    b = qkv.load(tmp_path / "m").forward(ref["input_ids"], ref["attention_mask"]).logits
    np.testing.assert_array_equal(a, b)
    assert qkv.load(tmp_path / "m").config.rotary_dim == 4                 # a quarter of d_head 16


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}}, "even count"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.5}}, "(0, 1]"),
    ({"use_parallel_residual": "yes"}, "true or false"),
])
def test_gpt_neox_refuses_bad_knobs_in_one_line(tmp_path, change, message):
    import json
    import shutil

    shutil.copytree(MODELS / "gpt_neox", tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    with pytest.raises(QkvError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        qkv.load(tmp_path / "m")



@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["full_attention", "sliding_attention"]}, "no sliding_window"),   # runs with one: test_family_layers
    ({"layer_types": 3}, "must give each of the 2 layers"),
    ({"use_sliding_window": True}, None),                # no sliding_window given: every layer full, as transformers
    ({"use_bidirectional_attention": True}, None),
])
def test_qwen3_refuses_what_it_cannot_run_in_one_line(tmp_path, change, message):
    import json
    import shutil

    shutil.copytree(MODELS / "qwen3", tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    if message is None:                                  # a knob Qwen3 does not have: not read, loads as before
        assert qkv.load(tmp_path / "m").config.family == "qwen3"
        return
    with pytest.raises(QkvError, match=message):
        qkv.load(tmp_path / "m")
