"""Phi-3, StableLM, StarCoder2 and OPT from their committed fixtures (tests/fixtures/models/{phi3, stablelm,
starcoder2, opt}, made by make_fixtures.py; the shared checks of tests/test_families.py run on them too):
gradients equal torch autograd's (grads/*.npz), the knobs transformers reads are honoured or refused in
one line, LongRoPE's two tables, OPT-350m's projected embeddings and post-LN, a save read back, and the CLI.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.cache import KVCache
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

from conftest import MODELS, TOL_HIDDEN, check_gradients, check_saved_reads_back, max_abs, reference, run_main

FIXTURES = Path(__file__).parent / "fixtures"
C2 = ("phi3", "stablelm", "starcoder2", "opt")


def edited(tmp_path: Path, name: str, change: dict) -> Path:
    """A copy of fixture NAME with config.json changed (keys whose value is None removed)."""
    shutil.copytree(MODELS / name, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    cfg = json.loads(path.read_text()) | change
    path.write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return tmp_path / "m"


@pytest.mark.parametrize("name", C2)
def test_gradients_equal_autograd(name):
    # vanishing: OPT's b_K: q·b_K is the same for every key, so dL/db_K = 0 (both sides round-off)
    check_gradients(qkv.load(MODELS / name), name, vanishing=1e-6)


def test_phi3_reads_fused_projections_as_views():
    w = qkv.checkpoints.families.read_weights(*_store("phi3"))
    a, f = w.blocks[0].attn, w.blocks[0].ffn
    assert a.W_Q.base is not None and a.W_Q.base is a.W_K.base is a.W_V.base      # slices of one stored matrix
    assert f.W_gate.base is not None and f.W_gate.base is f.W_in.base


def _store(name):
    from qkv.checkpoints.tensors import TensorStore

    cfg = qkv.checkpoints.families.config_of(json.loads((MODELS / name / "config.json").read_text()))
    return TensorStore(MODELS / name), cfg, np.float32


def test_phi3_longrope_takes_the_long_table_past_the_original_length():
    """The fixture's original length is 12: the 11-token batch takes the short table, the 17-token input the long
    one (both equal transformers: test_families); with the short table alone the 17 tokens give other logits."""
    model = qkv.load(MODELS / "phi3")
    scaling = model.config.rope_scaling
    assert scaling["rope_type"] == "longrope" and scaling["original_max_position_embeddings"] == 12
    assert scaling["attention_factor"] == pytest.approx(np.sqrt(1 + np.log(128 / 12) / np.log(12)))
    ids = reference("phi3")["single_input_ids"]
    short = model.with_config(rope_scaling=scaling | {"long_factor": scaling["short_factor"]})
    assert max_abs(short.forward(ids).logits, reference("phi3")["single_logits"]) > 1e-2


def test_phi3_cached_steps_equal_a_full_recompute_below_the_switch():
    """Below original_max_position_embeddings every pass takes the short table: each cached step equals a full pass."""
    model = qkv.load(MODELS / "phi3")
    ids, cfg, w = reference("phi3")["single_input_ids"][:, :12], model.config, model.weights
    cache = KVCache(cfg, 1, 12)
    transformer(w, cfg, ids[:, :5], np.ones((1, 5), np.int64), rec=Recorder(keep=()), cache=cache)
    for t in range(5, 12):
        _, step = transformer(w, cfg, ids[:, t:t + 1], np.ones((1, t + 1), np.int64), rec=Recorder(keep=()), cache=cache)
        assert max_abs(step, model.forward(ids[:, :t + 1], attentions=False).logits[:, -1:]) <= TOL_HIDDEN


def test_stablelm_has_a_norm_of_its_own_per_head():
    a = qkv.load(MODELS / "stablelm").weights.blocks[0].attn
    assert a.q_norm.weight.shape == (4, 16) and a.k_norm.weight.shape == (2, 16)
    assert not np.allclose(a.q_norm.weight[0], a.q_norm.weight[1])


def test_opt_350m_layout():
    model = qkv.load(MODELS / "opt")
    cfg, w = model.config, model.weights
    assert (cfg.norm_place, cfg.d_embed, cfg.position_offset, w.final_norm) == ("post", 32, 2, None)
    assert w.tok_embed.shape == (cfg.vocab_size, 32) and w.embed_in.shape == (32, 64) and w.unembed_in.shape == (64, 32)
    out = model.forward(reference("opt")["single_input_ids"])
    assert out.hidden.shape[-1] == 32                                 # as transformers' last hidden state


@pytest.mark.parametrize("name", C2)
def test_a_saved_model_reads_back_equal(name, tmp_path):
    check_saved_reads_back(tmp_path, name, "saved")


@pytest.mark.parametrize("name, change, message", [
    ("phi3", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "llama3' is not supported"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                                  "short_factor": [1.0], "long_factor": [1.0, 2.0, 3.0]}}, "short_factor must be 3"),
    ("starcoder2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor < 1"),
    ("stablelm", {"qk_layernorm": "yes"}, "true or false"),
    ("opt", {"do_layer_norm_before": 1}, "true or false"),
    ("opt", {"word_embed_proj_dim": 0}, "positive integer"),
    ("starcoder2", {"norm_epsilon": -1.0}, "positive number"),
])
def test_knobs_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(e.value)


def test_opt_without_affine_norms_refuses_a_file_that_has_them(tmp_path):
    """layer_norm_elementwise_affine false: LayerNorms without γ, β, so a file holding them is not this model."""
    with pytest.raises(QkvError, match="never reads"):
        qkv.load(edited(tmp_path, "opt", {"layer_norm_elementwise_affine": False}))


def test_dla_refuses_post_ln_opt():
    from qkv.analysis.attribution import direct_logit_attribution

    model = qkv.load(MODELS / "opt")
    with pytest.raises(QkvError, match="post-norm"):
        direct_logit_attribution(model, reference("opt")["single_input_ids"][0].tolist(), 5)


@pytest.mark.parametrize("name", C2)
def test_cli_runs_on_the_fixture(name, tmp_path, monkeypatch, capsys):
    path = str(MODELS / name)
    code, out, _ = run_main(monkeypatch, capsys, "generate", "--model", path, "-n", "3", "-t", "0", "The cat sat")
    assert code == 0 and out.startswith("The cat sat")
    assert run_main(monkeypatch, capsys, "show", "--model", path, "--out", str(tmp_path / "v.html"), "The cat sat")[0] == 0
    assert (tmp_path / "v.html").stat().st_size > 1000
    assert run_main(monkeypatch, capsys, "lens", "--model", path, "The cat sat on the mat")[0] == 0
    code, out, _ = run_main(monkeypatch, capsys, "patch", "--model", path, "--token", " the", "--other", " that",
                            "She said that the", "She said that that")
    assert code == 0


def test_pipeline_page_names_the_knobs():
    from qkv.viz.pipeline_payload import arch_of

    opt, stablelm = (qkv.load(MODELS / n) for n in ("opt", "stablelm"))
    assert (arch_of(opt)["d_embed"], arch_of(opt)["norm_place"], arch_of(opt)["final_norm"]) == (32, "post", False)
    assert arch_of(stablelm)["qk_norm_per_head"] and not arch_of(opt)["qk_norm_per_head"]


def test_a_longrope_table_no_reader_resolved_is_refused(tmp_path):
    """Llama's reader passes rope_scaling through: a longrope one (its attention factor unresolved) is refused in
    one line, not run with cos, sin unscaled."""
    table = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
             "original_max_position_embeddings": 8}
    with pytest.raises(QkvError, match="longrope is read for phi3"):             # at load: the config is checked once
        qkv.load(edited(tmp_path, "llama_gqa", {"rope_parameters": table, "rope_scaling": table}))
