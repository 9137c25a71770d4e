"""Layers of different kinds (group A): Gemma 2, Gemma 3 (text), GPT-Neo, SmolLM3 and Qwen2 with sliding
layers, from their committed fixtures (tests/fixtures/models/, made by make_fixtures.py; reference gradients
in tests/fixtures/grads/, made by make_grad_fixtures.py). The forward, every layer, left padding, float64 and
greedy generation are checked with every other decoder (test_families.py, test_generate.py); here: the
gradients, that each knob changes the numbers (a fixture that passed without it would test nothing), the
refusals in one line, a save read back, and the CLI.

Tolerances: the loss within 1e-5, each gradient within 1e-4 relative error (as test_grads.py); logits 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from conftest import (MODELS, check_gradients, check_knob_matters, check_saved_reads_back, edited, max_abs, reference,
                      run_main)

NEW = ("gemma2", "gemma3_text", "gpt_neo", "smollm3", "qwen2_sliding")


@pytest.mark.parametrize("name", NEW)
def test_gradients_equal_autograd(name):
    # vanishing: b_K of a layer without RoPE: q·b_K is the same for every key, and softmax ignores it; both sides
    # are round-off
    check_gradients(qkv.load(MODELS / name), name, vanishing=1e-6)


@pytest.mark.parametrize("name, knobs", [
    ("gemma2", {"layer_windows": None, "sliding_window": None}),
    ("gemma2", {"attn_softcap": None}),
    ("gemma2", {"final_softcap": None}),
    ("gemma2", {"attn_scale": None}),
    ("gemma3_text", {"local_rope_theta": None}),
    ("gemma3_text", {"layer_windows": None, "sliding_window": None}),
    ("gpt_neo", {"layer_windows": None, "sliding_window": None}),
    ("gpt_neo", {"attn_scale": None}),
    ("smollm3", {"no_rope_layers": ()}),
    ("smollm3", {"layer_windows": None, "sliding_window": None}),
    ("qwen2_sliding", {"layer_windows": None, "sliding_window": None}),
])
def test_each_knob_matters(name, knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(name, knobs)


def test_the_knobs_read():
    g2, g3 = qkv.load(MODELS / "gemma2").config, qkv.load(MODELS / "gemma3_text").config
    assert g2.layer_windows == (5, None, 5) and g2.attn_softcap == 5.0 and g2.final_softcap == 3.0
    assert g2.score_scale == 24 ** -0.5
    assert g3.layer_windows == (6, 6, None) and g3.local_rope_theta == 1e4 and g3.rope_theta == 1e6
    assert g3.rope_scaling["rope_type"] == "linear" and g3.qk_norm == "head"
    assert qkv.load(MODELS / "gpt_neo").config.layer_windows == (None, 5)
    s = qkv.load(MODELS / "smollm3").config
    assert s.no_rope_layers == (1,) and s.layer_windows == (None, 5, None)
    assert qkv.load(MODELS / "qwen2_sliding").config.layer_windows == (None, 5)


def test_long_inputs_take_the_plain_path_under_a_soft_cap():
    """The tiled kernels cannot soft-cap: a long input gives the numbers of the plain pass, recorded or not."""
    model = qkv.load(MODELS / "gemma2")
    ids = np.random.default_rng(0).integers(3, 300, size=(1, 100))
    plain = model.forward(ids).logits                         # attentions kept: the plain path
    fast = model.forward(ids, attentions=False).logits
    assert max_abs(plain, fast) <= 1e-5


@pytest.mark.parametrize("name", NEW)
def test_a_saved_model_reads_back_equal(tmp_path, name):
    check_saved_reads_back(tmp_path, name)


@pytest.mark.parametrize("name, change, message", [
    ("gemma2", {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "must give each"),
    ("gemma2", {"layer_types": ["sliding_attention"]}, "must give each of the 3 layers"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, "positive number"),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "proportional", "factor": 2.0}}},
     "proportional"),
    ("gemma3_text", {"rope_parameters": {"full_attention": 3}}, "not an object"),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_theta": "1e6"}}}, "positive number"),
    ("gemma2", {"rope_parameters": {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4}}, "proportional"),
    ("smollm3", {"rope_parameters": {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4}}, "proportional"),
    ("gpt_neo", {"attention_types": [[["global", "sparse"], 1]]}, "'global' or 'local'"),
    ("gpt_neo", {"attention_types": [[["global"], 3]]}, "each of the 2 layers"),
    ("smollm3", {"no_rope_layers": [1, 2, 1]}, "0 or 1"),
    ("smollm3", {"mlp_bias": True}, "gate_proj.bias"),       # honoured: this file lacks the FFN's biases
    ("qwen2_sliding", {"use_sliding_window": False}, "no sliding_window"),
    ("qwen2_sliding", {"max_window_layers": "1"}, "not a whole number"),
    ("qwen2_sliding", {"max_window_layers": 0}, None),           # layer_types given: they decide
    ("llama_gqa", {"layer_types": ["full_attention", "sliding_attention"]}, "which llama has"),
])
def test_refusals_in_one_line(tmp_path, name, change, message):
    path = edited(tmp_path, name, change)
    if message is None:
        assert qkv.load(path).config.family == name.split("_sliding")[0]
        return
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(path)
    assert "\n" not in str(err.value)


def test_qwen2_default_layer_types_follow_max_window_layers(tmp_path):
    """Without layer_types, Qwen2's sliding layers are those from max_window_layers on (with use_sliding_window)."""
    path = edited(tmp_path, "qwen2_sliding", {}, drop=("layer_types",))
    assert qkv.load(path).config.layer_windows == (None, 5)
    path = edited(tmp_path / "b", "qwen2_sliding", {"max_window_layers": 0}, drop=("layer_types",))
    assert qkv.load(path).config.sliding_window == 5 and qkv.load(path).config.layer_windows is None


def test_the_multimodal_gemma3_is_refused_in_one_line(tmp_path):
    path = edited(tmp_path, "gemma3_text", {"model_type": "gemma3"})
    with pytest.raises(QkvError, match="gemma3_text"):
        qkv.load(path)


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text", "gpt_neo"])
def test_the_cli_runs_on_the_fixtures(tmp_path, monkeypatch, capsys, name):
    out = tmp_path / f"{name}.html"
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(MODELS / name), "--out", str(out),
                            "the cat sat on the mat")
    assert code == 0 and (out / "attention.html").is_file(), err
    for args in (("generate", "--model", str(MODELS / name), "-n", "4", "the cat"),
                 ("lens", "--model", str(MODELS / name), "the cat sat on the mat"),
                 ("patch", "--model", str(MODELS / name), "the cat sat on the", "the dog sat on the",
                  "--token", " the", "--other", " a")):
        code, text, err = run_main(monkeypatch, capsys, *args)
        assert code == 0 and text.strip(), err


def test_direct_logit_attribution_is_refused_where_the_logit_is_no_sum():
    from qkv.analysis.attribution import direct_logit_attribution

    with pytest.raises(QkvError, match="Gemma 2/3"):
        direct_logit_attribution(qkv.load(MODELS / "gemma2"), [3, 4, 5], 7)
    capped = qkv.load(MODELS / "gpt_neo").with_config(final_softcap=3.0)
    with pytest.raises(QkvError, match="soft-caps its logits"):
        direct_logit_attribution(capped, [3, 4, 5], 7)


def test_the_pipeline_page_names_each_layers_kind():
    from qkv.viz.pipeline_payload import arch_of

    arch = arch_of(qkv.load(MODELS / "gemma2"))
    assert arch["windows"] == [5, None, 5] and arch["attn_softcap"] == 5.0 and arch["final_softcap"] == 3.0
    assert arch_of(qkv.load(MODELS / "smollm3"))["no_rope_layers"] == [1]
    assert arch_of(qkv.load(MODELS / "llama_gqa"))["windows"] is None


@pytest.mark.parametrize("name, layer", [("gemma2", 0), ("gemma2", 1), ("gemma3_text", 0), ("gemma3_text", 2),
                                         ("gpt_neo", 1)])
def test_the_walkthrough_follows_each_layers_kind(name, layer):
    """The attention lesson recomputes the layer's own scale, soft-cap, window and rotation (or none)."""
    from qkv.lessons.attention import walkthrough

    model = qkv.load(MODELS / name)
    w = walkthrough(model, "the cat sat on the mat and the dog", layer=layer)
    assert (w.rope is None) == (model.config.rope_kind(layer) is None)


def test_the_walkthrough_of_a_layer_without_rope():
    from qkv.lessons.attention import walkthrough

    model = qkv.load(MODELS / "gemma3_text").with_config(no_rope_layers=(1,))     # SmolLM3's knob
    assert walkthrough(model, "the cat sat on the mat", layer=1).rope is None


def test_hooks_and_some_heads_see_the_capped_windowed_scores():
    """A hook on S, or keeping only some heads' weights (their own blocked path), gives the pass's numbers."""
    model = qkv.load(MODELS / "gemma2")
    ids = reference("gemma2")["single_input_ids"][0]
    full = model.run(ids, keep=("attentions", "scores"))
    hooked = model.run(ids, keep=("attentions",), hooks={f"{i}.scores": lambda s, layer: s for i in range(3)})
    some = model.run(ids, keep=("attentions", "scores"), heads=[1, 3])
    for i in range(3):
        np.testing.assert_array_equal(hooked.layer(i).attentions, full.layer(i).attentions)
        assert max_abs(some.layer(i).attentions, full.layer(i).attentions[[1, 3]]) <= 1e-6
        assert np.nanmax(np.abs(np.where(np.isinf(some.layer(i).scores), 0, some.layer(i).scores))) <= 5.0
    np.testing.assert_array_equal(hooked.logits, full.logits)
