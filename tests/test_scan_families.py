"""What every family of state-space and linear-attention layers shares, checked once over a table of them: Mamba,
Mamba-2, Jamba, Falcon-H1, Granite 4 (granitemoehybrid), MiniMax and Qwen3-Next against transformers on their
committed fixtures (tests/fixtures/make_fixtures.py: a batch right- and left-padded, one sequence, greedy ids with and
without the cache), cached passes against the full pass, what is refused (gradients, bad knobs, direct logit and
input attribution) in one line, a model saved and loaded back, the views and the pipeline page. Each family's own
numbers (its config's knobs, the attention its layers imply, its hooks) stay in tests/test_family_<name>.py; each
row below holds what differs."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, reference, run_main
from qkv.core.cache import KVCache
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

TEXT = "The quick brown fox"


@dataclass(frozen=True)
class Family:
    """One fixture's row: what its reference holds and what the family refuses."""

    name: str
    states: tuple[str, int, int] = ("residual", 0, 0)   # the recorded stream compared with the reference's
    # hidden_states: (our key, their index − layer, last layers left out): "residual" each layer's input,
    # "residual_out" its output (Mamba's: no embeddings first; MiniMax's: the last after the final norm)
    softmax: tuple[str, tuple[int, ...]] | None = None  # (reference key, our layers): the softmax layers' weights
    passes: tuple[int | None, ...] = (5,)               # where each cached pass ends (None: the text's end), then
    # one-token steps to the end
    padding: str | None = None                          # "all" rows or the "real" rows: a pad's column is 0
    recorded: bool = True                               # generate(trace=True) checked against model.run
    grads: str = "not in qkv"                           # the refusal of gradients
    fresh_refused: bool = True                          # qkv.init refuses it ("fresh Mamba") or makes one that runs
    saved: dict = field(default_factory=dict)           # config.json entries qkv's save writes
    saved_as_read: tuple[str, ...] = ()                 # entries written as the fixture's (exactly)
    saved_close: tuple[str, ...] = ()                   # entries written as the fixture's within 1e-12
    figure: str = "grid_layer0.png"                     # what `qkv show --out` draws of layer 0
    refusal: str = "Mamba"                              # the word of `dla` and `attribute`'s refusal
    token: str = " o"                                   # `dla --token`
    bad: tuple[tuple[dict, str], ...] = ()              # config.json changes refused, and a word of the refusal


FAMILIES = (
    Family("mamba", states=("residual_out", 0, 0), padding="all", figure="heatmap_layer0_head0.png",
           saved={"model_type": "mamba", "expand": 2, "time_step_rank": 3},
           bad=(({"state_size": 0}, "state_size"), ({"expand": 1.5}, "expand"),
                ({"use_conv_bias": "yes"}, "use_conv_bias"), ({"hidden_act": "tanh"}, "activation"))),
    Family("mamba2", passes=(5, 8), padding="all", grads="Mamba-2.*not in qkv",
           saved={"model_type": "mamba2", "num_heads": 8, "n_groups": 2,
                  "time_step_limit": [0.0, {"__float__": "Infinity"}]},      # transformers' JSON for ∞
           bad=(({"state_size": 0}, "state_size"), ({"expand": 3}, "expand"), ({"n_groups": 3}, "n_groups"),
                ({"use_conv_bias": "yes"}, "use_conv_bias"), ({"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
                ({"time_step_limit": "none"}, "time_step_limit"), ({"hidden_act": "tanh"}, "activation"))),
    Family("jamba", softmax=("attentions", (1, 3)), padding="real",
           saved={"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 3, "expert_layer_offset": 0},
           bad=(({"attn_layer_offset": 2}, "attn_layer_offset"), ({"expert_layer_offset": 3}, "expert_layer_offset"),
                ({"num_experts_per_tok": 5}, "num_experts_per_tok"), ({"mamba_expand": 1.5}, "mamba_expand"),
                ({"mamba_conv_bias": "yes"}, "mamba_conv_bias"), ({"mamba_dt_rank": 0}, "mamba_dt_rank"),
                ({"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 4, "mamba_expand": 1,
                  "hidden_size": 36}, "n_heads"))),
    Family("falcon_h1", softmax=("attentions", (0, 1)), passes=(5, 8), recorded=False,
           saved_as_read=("ssm_multipliers", "mlp_multipliers", "attention_in_multiplier", "mamba_norm_before_gate"),
           saved_close=("key_multiplier",),
           bad=(({"mlp_multipliers": [1.0]}, "mlp_multipliers"),
                ({"ssm_multipliers": [1, 1, 1, -1, 1]}, "ssm_multipliers"), ({"mamba_d_head": 7}, "mamba_d_head"),
                ({"key_multiplier": 0}, "key_multiplier"),
                ({"mamba_rms_norm": "yes"}, "mamba_rms_norm"), ({"time_step_limit": [2, 1]}, "time_step_limit"),
                ({"hidden_act": "tanh"}, "activation"))),
    Family("granitemoehybrid", softmax=("attentions", (1,)), passes=(5, 8),
           saved={"layer_types": ["mamba", "attention", "mamba"], "num_local_experts": 3},
           bad=(({"position_embedding_type": "alibi"}, "position_embedding_type"),
                ({"layer_types": ["mamba", "moe", "mamba"]}, "layer_types"),
                ({"layer_types": ["mamba"]}, "layer_types"),
                ({"mamba_n_heads": 2, "mamba_d_head": 32}, "attention heads must divide"),
                ({"mamba_d_head": 4}, "mamba_d_head"), ({"mamba_n_groups": 3}, "n_groups"),
                ({"num_experts_per_tok": 4}, "num_experts_per_tok"), ({"time_step_limit": [1, 0]}, "time_step_limit"),
                ({"logits_scaling": 0}, "logits_scaling"), ({"hidden_act": "tanh"}, "activation"))),
    Family("minimax", states=("residual_out", 1, 1), softmax=("full_attentions", (1,)), passes=(6, 9),
           padding="real", fresh_refused=False, refusal="MiniMax",
           saved={"layer_types": ["linear_attention", "full_attention", "linear_attention"], "block_size": 4},
           bad=(({"layer_types": ["linear_attention", "sliding_attention", "full_attention"]}, "layer_types"),
                ({"block_size": 0}, "block_size"), ({"mlp_beta_factor": "big"}, "mlp_beta_factor"),
                ({"num_experts_per_tok": 5}, "num_experts_per_tok"))),
    Family("qwen3_next", softmax=("full_attentions", (1,)), passes=(5, 6, 7, 8, 9, 10, 11, 12, None), padding="all",
           fresh_refused=False, figure="heatmap_layer0_head0.png", refusal="linear-attention", token="o",
           saved={"model_type": "qwen3_next"}, saved_as_read=("layer_types",),
           bad=(({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
                ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention"]}, "layer_types"),
                ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
                ({"linear_num_value_heads": 2, "linear_value_head_dim": 3}, "value channels"),
                ({"hidden_act": "tanh"}, "activation"),
                ({"full_attention_interval": 0, "layer_types": None}, "full_attention_interval"))),
)
ROWS = [pytest.param(f, id=f.name) for f in FAMILIES]


@functools.lru_cache(maxsize=None)
def loaded(name: str) -> qkv.Model:
    """Fixture NAME's model (float32), loaded once for the module."""
    return qkv.load(MODELS / name)


def hf_config(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


@pytest.mark.parametrize("f", ROWS)
def test_the_padded_batch_equals_the_reference(f):
    """Three rows (full, right-padded, left-padded: both sides padded): logits, final hidden states, the stream of
    every layer and the softmax layers' weights (every key of each real query row) at the real positions."""
    model, ref = loaded(f.name), reference(f.name)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    key, shift, left_out = f.states
    rec = Recorder(keep=(key, "attentions"))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0                      # both sides padded
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers - left_out):
        assert np.abs(rec.store[layer][key] - ref["hidden_states"][layer + shift])[real].max() < TOL_HIDDEN, layer
    name, layers = f.softmax or ("", ())
    for j, layer in enumerate(layers):
        A = rec.store[layer]["attentions"]                           # (B, H, n, n)
        for b in range(len(ids)):
            got, want = A[b][:, real[b]], ref[name][j, b][:, real[b]]
            assert np.abs(got - want).max() < TOL_ATTENTION, (layer, b)


@pytest.mark.parametrize("f", ROWS)
def test_one_sequence_and_greedy_ids_with_and_without_the_cache(f):
    model, ref = loaded(f.name), reference(f.name)
    assert np.abs(model.forward(ref["single_input_ids"]).logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


@pytest.mark.parametrize("f", ROWS)
def test_the_cached_passes_equal_the_full_pass(f):
    """Passes ending where the row says, then one token at a time, each from the state the earlier ones left (conv
    inputs, scan or delta states, the softmax layers' K, V): each pass's last logits are the full pass's."""
    model = loaded(f.name)
    ids = reference(f.name)["greedy_ids"]
    n = ids.shape[1]
    full = model.forward(ids).logits[0]                             # (n, V)
    cache = KVCache(model.config, 1, n, dtype=model.dtype)
    ends = [n if end is None else end for end in f.passes]
    start = 0
    for end in ends + list(range(ends[-1] + 1, n + 1)):
        z = model.last_logits(ids[:, start:end], np.ones((1, end), np.int64), cache=cache)
        assert np.abs(z[0, -1] - full[end - 1]).max() < 1e-5, end
        start = end


@pytest.mark.parametrize("f", [r for r in ROWS if r.values[0].padding])
def test_padding_takes_no_attention(f):
    """A left-padded row: the pads' columns are 0 (in every row, or in the real rows where a softmax layer's pad rows
    attend), and its real rows are the row alone's."""
    model, ref = loaded(f.name), reference(f.name)
    ids, mask = ref["input_ids"][2:], ref["attention_mask"][2:]
    real = mask[0].astype(bool)
    out = model.forward(ids, mask)                                   # attentions (L, 1, H, n, n)
    alone = model.forward(ids[:, real]).attentions
    rows = out.attentions[:, 0] if f.padding == "all" else out.attentions[:, 0][:, :, real]
    assert np.all(rows[..., ~real] == 0)
    assert np.abs(out.attentions[:, 0][:, :, real][:, :, :, real] - alone[:, 0]).max() < 1e-5


@pytest.mark.parametrize("f", [r for r in ROWS if r.values[0].recorded])
def test_a_recorded_generation_shows_the_full_pass(f):
    """generate(trace=True): every step's attention rows (implied, from the state's keys; softmax) equal model.run's
    over the text."""
    model = loaded(f.name)
    trace = model.generate(reference(f.name)["single_input_ids"], max_new_tokens=5, stop_at_eos=False, trace=True)
    again = model.run(trace.ids.tolist())
    assert np.abs(trace.attentions - again.attentions).max() < 1e-5
    assert np.abs(trace.logits - again.logits).max() < 1e-4


@pytest.mark.parametrize("f", ROWS)
def test_gradients_are_refused_in_one_line(f):
    from qkv.train.gradients import gradients

    with pytest.raises(QkvError, match=f.grads) as e:
        gradients(loaded(f.name), reference(f.name)["single_input_ids"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("f", ROWS)
def test_a_fresh_model_is_refused_in_one_line_or_runs(f):
    """qkv.init: a scan's family is refused in one line; a linear attention's fresh model runs (every layer's
    attention drawn)."""
    if f.fresh_refused:
        with pytest.raises(QkvError, match="fresh Mamba") as e:
            qkv.init(hf_config(f.name))
        assert "\n" not in str(e.value)
        return
    fresh = qkv.init(hf_config(f.name), seed=1)
    ids = reference(f.name)["single_input_ids"]                    # (1, n)
    out, cfg, n = fresh.forward(ids), fresh.config, ids.shape[1]
    assert np.isfinite(out.logits).all() and out.attentions.shape == (cfg.n_layers, 1, cfg.n_heads, n, n)


@pytest.mark.parametrize("f", ROWS)
def test_saved_and_loaded_back(f, tmp_path):
    """The same config and logits to the bit; config.json's entries as the row says."""
    model = loaded(f.name)
    saved = model.save(tmp_path / "m")
    back = qkv.load(saved)
    ids = reference(f.name)["single_input_ids"]
    assert back.config == model.config and np.array_equal(back.forward(ids).logits, model.forward(ids).logits)
    hf, mine = json.loads((saved / "config.json").read_text()), hf_config(f.name)
    for key, want in f.saved.items():
        assert hf[key] == want, key
    for key in f.saved_as_read:
        assert hf[key] == mine[key], key
    for key in f.saved_close:
        assert abs(hf[key] - mine[key]) < 1e-12, key


@pytest.mark.parametrize("f, change, words", [pytest.param(f, change, words, id=f"{f.name}-{words}-{i}")
                                              for f in FAMILIES for i, (change, words) in enumerate(f.bad)])
def test_bad_knobs_are_refused_in_one_line(f, change, words):
    from qkv.checkpoints.families import config_of

    with pytest.raises(QkvError, match=words) as e:
        config_of(hf_config(f.name) | change)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("f", ROWS)
def test_the_views_run_and_the_rest_refuse(f, monkeypatch, capsys, tmp_path):
    """show (the viewer, layer 0's figure, the pipeline page with the layers' own steps), heads, rollout, lens, next,
    generate run; direct logit attribution and input attribution refuse in one line naming the family's layers."""
    path, out = str(MODELS / f.name), tmp_path / "views"
    code, _, err = run_main(monkeypatch, capsys, "show", TEXT, "--model", path, "--out", str(out))
    assert code == 0, err
    assert (out / "attention.html").is_file() and (out / f.figure).is_file()
    assert '"mixers"' in (out / "pipeline.html").read_text()
    for command in ("heads", "rollout", "lens", "next", "generate"):
        code, _, err = run_main(monkeypatch, capsys, command, TEXT, "--model", path)
        assert code == 0, (command, err)
    for command, more in (("dla", ("--token", f.token)), ("attribute", ())):
        code, _, err = run_main(monkeypatch, capsys, command, TEXT, "--model", path, *more)
        assert code == 2 and f.refusal in err and err.count("\n") == 1, (command, err)


@pytest.mark.parametrize("f", ROWS)
def test_the_pipeline_page_draws_the_layers_own_steps(f):
    """The pipeline page draws each scan's or linear attention's own steps, ending in its implied matrix
    (tests/test_pipeline_scan.py checks the numbers); a trace without them (Model.run keeps none) is refused in one
    line naming pipeline_trace."""
    from qkv.viz.pipeline import pipeline_html, pipeline_trace

    model = loaded(f.name)
    assert '"mixers"' in pipeline_html(model, pipeline_trace(model, TEXT))
    with pytest.raises(QkvError, match="pipeline page.*pipeline_trace") as e:
        pipeline_html(model, model.run(TEXT))
    assert "\n" not in str(e.value)
