"""Whisper (speech to text) against transformers' committed references (tests/fixtures/make_whisper_fixtures.py):
the convolutions over log-mel frames, both stacks, the cross-attention of each text token over the frames, what the
engine gives every encoder–decoder (hooks, ablation, the trace and its viewer), a save read back, and what qkv
leaves out refused in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.models.audio_model import AudioModel
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference

AUDIO = ("whisper", "whisper_base")


@pytest.fixture(scope="module")
def models():
    return {name: qkv.load(MODELS / name) for name in AUDIO}


@pytest.mark.parametrize("name", AUDIO)
def test_forward_equals_reference(models, name):
    ref, model = reference(name), models[name]
    assert isinstance(model, AudioModel)
    out = model.forward(ref["input_features"], decoder_input_ids=ref["decoder_input_ids"])
    assert max_abs(out.encoder_hidden, ref["encoder_hidden"]) <= TOL_HIDDEN
    assert max_abs(out.hidden, ref["hidden"]) <= TOL_HIDDEN
    for mine, key in ((out.encoder_attentions, "encoder_attentions"), (out.attentions, "attentions"),
                      (out.cross_attentions, "cross_attentions")):
        assert mine.shape == ref[key].shape and max_abs(mine, ref[key]) <= TOL_ATTENTION, key
    if name == "whisper":
        assert max_abs(out.logits, ref["logits"]) <= TOL_HIDDEN
    else:
        assert out.logits is None                                    # a WhisperModel has no head


@pytest.mark.parametrize("name", AUDIO)
def test_the_convolutions_and_every_encoder_layer(models, name):
    """Row 0 of transformers' encoder hidden states is GELU(conv2(GELU(conv1(x)))) + the sinusoids: the stream
    entering encoder block 0; then each block's input."""
    ref, model = reference(name), models[name]
    for b in range(2):
        trace = model.run(ref["input_features"][b], ref["decoder_input_ids"][b])
        for i in range(model.config.n_layers):
            assert max_abs(trace.encoder.layer(i).residual, ref["encoder_hidden_states"][i, b]) <= TOL_HIDDEN
        assert max_abs(trace.cross.attentions, ref["cross_attentions"][:, b]) <= TOL_ATTENTION


def test_a_trace_labels_frames_by_time_and_has_a_viewer(models, tmp_path):
    from qkv.viz.html import save_viewer

    ref, model = reference("whisper"), models["whisper"]
    trace = model.run(ref["input_features"][0], ref["decoder_input_ids"][0])
    assert trace.cross.source_tokens == ["0.00s", "0.02s", "0.04s", "0.06s", "0.08s", "0.10s", "0.12s", "0.14s"]
    assert trace.encoder.tokens == trace.cross.source_tokens and trace.cross.attentions.shape == (2, 2, 5, 8)
    np.testing.assert_allclose(trace.cross.attentions.sum(axis=-1), 1, atol=1e-6)
    page = save_viewer(trace, tmp_path / "attention.html")
    assert "0.14s" in page.read_text(encoding="utf-8")


def test_hooks_and_ablation_reach_the_cross_attention(models):
    ref, model = reference("whisper"), models["whisper"]
    x, dec = ref["input_features"][:1], ref["decoder_input_ids"][:1]
    plain = model.forward(x, decoder_input_ids=dec)
    ablated = model.forward(x, decoder_input_ids=dec, ablate=[("cross", 1, 0), ("encoder", 0, 1)])
    zeroed = model.forward(x, decoder_input_ids=dec, hooks={"cross.1.heads": lambda z, l: _zero_head(z, 0),
                                                           "encoder.0.heads": lambda z, l: _zero_head(z, 1)})
    assert max_abs(ablated.logits, zeroed.logits) <= 1e-6 and max_abs(ablated.logits, plain.logits) > 1e-4
    np.testing.assert_array_equal(model.ablate([("cross", 1, 0)]).forward(x, decoder_input_ids=dec).logits,
                                  model.forward(x, decoder_input_ids=dec, ablate=[("cross", 1, 0)]).logits)


def _zero_head(z, h):
    z = z.copy()
    z[:, h] = 0
    return z


def test_save_reads_back_under_transformers_names(models, tmp_path):
    model = models["whisper"]
    model.save(tmp_path / "m")
    again = qkv.load(tmp_path / "m")
    ref = reference("whisper")
    a = again.forward(ref["input_features"], decoder_input_ids=ref["decoder_input_ids"])
    b = model.forward(ref["input_features"], decoder_input_ids=ref["decoder_input_ids"])
    np.testing.assert_array_equal(a.logits, b.logits)
    hf = json.loads((tmp_path / "m" / "config.json").read_text())
    assert hf["model_type"] == "whisper" and hf["num_mel_bins"] == 6 and hf["max_source_positions"] == 8


def test_what_qkv_leaves_out_is_refused(models):
    ref, model = reference("whisper"), models["whisper"]
    written = model.transcribe(ref["input_features"][0])        # writing: tests/test_transcribe.py
    np.testing.assert_array_equal(model.generate(ref["input_features"][0])[0], written.ids)
    own = model.run(ref["input_features"][0])                  # no target: the model's own transcript
    assert own.cross.attentions.shape[-1] == 8
    with pytest.raises(QkvError, match="transcribe"):
        model.stream(ref["input_features"][0])
    with pytest.raises(QkvError, match=r"input_features must be log-mel floats of shape \(B, 6, 16\)"):
        model.forward(ref["input_features"][:, :, :10])
    bad = ref["input_features"].copy()
    bad[0, 0, 0] = np.inf
    with pytest.raises(QkvError, match="inf or NaN"):
        model.forward(bad)
    from qkv.train import gradients

    with pytest.raises(QkvError, match="audio encoder's convolutions is not in qkv"):
        gradients(model, np.zeros((1, 8), np.int64), labels=ref["decoder_input_ids"][:1, 1:])


def _edited(tmp_path, change: dict):
    shutil.copytree(MODELS / "whisper", tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    return tmp_path / "m"


@pytest.mark.parametrize("change, message", [
    ({"use_weighted_layer_sum": True}, "use_weighted_layer_sum"),
    ({"architectures": ["WhisperForAudioClassification"]}, "WhisperForAudioClassification is not supported"),
    ({"decoder_attention_heads": 4}, "different heads"),
    ({"num_mel_bins": 0}, "num_mel_bins"),
    ({"max_source_positions": 9}, "embed_positions"),                 # the checkpoint's table has 8 rows
])
def test_bad_configs_are_refused(tmp_path, change, message):
    with pytest.raises(QkvError, match=message):
        qkv.load(_edited(tmp_path, change))
