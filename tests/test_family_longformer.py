"""Longformer (a sliding window per layer, global tokens with their own Q, K, V) against transformers' committed
references (tests/fixtures/make_fixtures.py: make_sparse_attention): the padded batch and every layer are in
test_families.py; here left padding, one longer sequence with and without global tokens (every layer's full n × n
weights, rebuilt from transformers' banded ones), the identity A·V = Z in float64, the knobs refused in one line,
a save read back, and the commands that show the mask."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core import sparse_layers as sparse
from conftest import (MODELS, TOL_ATTENTION, TOL_HIDDEN, check_encoder_saved_reads_back, check_gradients,
                      check_knob_matters, check_left_padding, check_single_sequence, edited, max_abs, reference,
                      run_main)

NAME = "longformer"


def global_model(dtype=np.float32):
    ref = reference(NAME)
    return qkv.load(MODELS / NAME, dtype=dtype).with_config(global_tokens=tuple(int(t) for t in ref["global_tokens"]))


def test_left_padding_and_a_longer_sequence_equal_the_reference():
    check_left_padding(NAME, logits=True)
    check_single_sequence(NAME, logits=True)


def test_the_windows_are_read_per_layer():
    """attention_window [4, 8]: |i − j| ≤ 2 in layer 0, ≤ 4 in layer 1 (the engine's w = W/2 + 1); RoBERTa's
    positions from pad + 1; the global projections read in every layer."""
    model = qkv.load(MODELS / NAME)
    cfg = model.config
    assert (cfg.layer_windows, cfg.causal, cfg.positions_from_ids, cfg.position_offset) == ((3, 5), False, True, 2)
    assert all(b.attn.W_Qg.shape == (32, 32) and b.attn.b_Vg.shape == (32,) for b in model.weights.blocks)
    A = model.forward(reference(NAME)["single_input_ids"]).attentions          # (L, 1, H, n, n)
    for layer, half in ((0, 2), (1, 4)):
        outside = ~sparse.longformer_visible(17, half)
        assert (A[layer, 0][:, outside] == 0).all() and (A[layer, 0][:, ~outside] > 0).all()


def test_global_tokens_equal_the_reference():
    """global_attention_mask at positions 0 and 5: logits, hidden states and the full weights (the global rows read
    every key through query/key/value_global, every row sees the global columns) as transformers gives them."""
    ref = reference(NAME)
    out = global_model().forward(ref["single_input_ids"])
    assert max_abs(out.logits, ref["global_logits"]) <= TOL_HIDDEN
    assert max_abs(out.hidden, ref["global_hidden"]) <= TOL_HIDDEN
    assert max_abs(out.attentions, ref["global_attentions"]) <= TOL_ATTENTION
    assert (out.attentions[:, 0, :, :, [0, 5]] > 0).all()                      # every row sees the global keys
    assert max_abs(out.logits, ref["single_logits"]) > 100 * TOL_HIDDEN       # and they change the output


def test_each_knob_matters():
    check_knob_matters(NAME, {"layer_windows": (3, 3)})
    check_knob_matters(NAME, {"layer_windows": None})                        # full attention


def test_the_weights_reproduce_each_layer_output_in_float64():
    """Z = A·V on the rows that read K, V (≤ 1e-9); the global rows' Z = A·V_g with V_g = X·W_Vg + b_Vg."""
    ids = reference(NAME)["single_input_ids"][0]
    model = global_model(np.float64)
    trace = model.run(ids, keep=("attentions", "heads", "v", "attn_in"))
    g = list(model.config.global_tokens)
    for i in trace.layer_ids:
        lt, w = trace.layer(i), model.weights.blocks[i].attn
        local = [r for r in range(len(ids)) if r not in g]
        assert max_abs(np.einsum("hij,hjd->hid", lt.attentions, lt.v)[:, local], lt.heads[:, local]) <= 1e-9
        vg = (lt.attn_in @ w.W_Vg + w.b_Vg).reshape(len(ids), 4, 8).transpose(1, 0, 2)   # (H, n, d_k)
        assert max_abs(np.einsum("hij,hjd->hid", lt.attentions, vg)[:, g], lt.heads[:, g]) <= 1e-9


def test_a_long_input_skips_the_tiles_outside_the_window(monkeypatch):
    """Past TILED_MIN_SCORES (lowered here to 16 scores, so that 40 tokens pass it) an unpadded input without global
    tokens runs sparse.sparse_attention on each layer's band: its hidden states equal the plain pass's (the weights
    kept) within 1e-12 in float64, and another window would not."""
    from qkv.core import attention, sparse as kernels

    calls = []

    def counted(*args, **kwargs):
        z, tiles = kernels.sparse_attention(*args, **kwargs)
        calls.append(tiles)
        return z, tiles

    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 16)
    monkeypatch.setattr(attention, "sparse_attention", counted)
    model = qkv.load(MODELS / NAME, dtype=np.float64)
    ids = np.random.default_rng(3).integers(5, 300, (1, 40))
    fast = model.forward(ids, attentions=False).hidden
    assert len(calls) == 2 and calls[0].total == 1                      # one call per layer (tiles of 128: one)
    plain = model.forward(ids, attentions=True).hidden
    assert max_abs(fast, plain) <= 1e-12
    assert max_abs(fast, model.with_config(layer_windows=(3, 3)).forward(ids, attentions=False).hidden) > 1e-3


@pytest.mark.parametrize("change, message", [
    ({"attention_window": 5}, "attention_window 5 must be an even number"),
    ({"attention_window": [4]}, "a list of 2"),
    ({"is_decoder": True}, "is_decoder=true"),
])
def test_what_cannot_run_is_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, NAME, change))
    assert "\n" not in str(e.value)


def test_global_tokens_are_refused_where_they_cannot_run():
    """Past the input, on a model without global projections, in training, under a hook on the weights: one QkvError
    each."""
    from qkv.train import gradients

    ids = np.array([[5, 6, 7, 8]])
    model = qkv.load(MODELS / NAME)

    def same(value, layer):
        return value

    for call, message in ((lambda: model.with_config(global_tokens=(9,)).forward(ids), "past the input's 4 tokens"),
                          (lambda: qkv.load(MODELS / "roberta").with_config(global_tokens=(0,)).forward(ids),
                           "global projections"),
                          (lambda: model.with_config(global_tokens=(0,)).run(ids[0]), None),
                          (lambda: model.with_config(global_tokens=(0,)).run(ids[0], hooks={"0.attentions": same}),
                           "miss the global tokens' rows"),
                          (lambda: gradients(model.with_config(global_tokens=(0,)), ids, labels=ids), "training")):
        if message is None:
            call()                                                           # runs
            continue
        with pytest.raises(QkvError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
    gradients(model, ids, labels=ids)                                        # without global tokens it trains


def test_gradients_equal_autograd():
    """grads/longformer.npz: transformers' LongformerForMaskedLM loss and torch autograd's gradient of every
    parameter (no global tokens: the global projections get none), within 1e-4 relative error."""
    check_gradients(qkv.load(MODELS / NAME), NAME, labels=True, atol=1e-6)


def test_save_reads_back_equal(tmp_path):
    check_encoder_saved_reads_back(tmp_path, NAME, hidden=True)


def test_show_takes_global_tokens_and_draws_the_mask(monkeypatch, capsys, tmp_path):
    """`qkv show --global-tokens 0,3` runs with them (its rows read every key); heads and rollout run; the pipeline
    page is written."""
    model = str(MODELS / NAME)
    text = "The cat sat on the mat and looked at the door."
    code, out, err = run_main(monkeypatch, capsys, "show", text, "--model", model, "--global-tokens", "0,3",
                              "--layer", "1", "--out", str(tmp_path / "show"))
    assert code == 0, err
    assert (tmp_path / "show" / "attention.html").is_file() and (tmp_path / "show" / "pipeline.html").is_file()
    code, out, err = run_main(monkeypatch, capsys, "show", text, "--model", model, "--global-tokens", "99")
    assert code == 2 and "past the input" in err and len(err.strip().splitlines()) == 1
    for command in (("heads", text), ("rollout", text)):
        code, out, err = run_main(monkeypatch, capsys, *command, "--model", model)
        assert code == 0, err


def test_explain_sparse_draws_each_layer_mask(monkeypatch, capsys, tmp_path):
    """The lesson on Longformer: each layer's own mask (window |i − j| ≤ W/2), recomputed from q, k, v with error
    0 against the model's own output."""
    from qkv.lessons import sparse as lesson

    le = lesson.build(qkv.load(MODELS / NAME, dtype=np.float64), cost_sizes=())
    assert [o.window for o in le.own] == [4, 8]
    assert all(o.error <= 1e-9 for o in le.own)
    assert le.own[0].density < le.own[1].density < 1
    glob = lesson.build(global_model(np.float64), cost_sizes=())              # the global rows from Q_g, K_g, V_g
    assert all(o.error <= 1e-9 and "global [0, 5]" in o.label for o in glob.own)
    assert (glob.own[0].mask[[0, 5]] == 1).all() and (glob.own[0].mask[:, [0, 5]] == 1).all()
    code, out, err = run_main(monkeypatch, capsys, "explain", "sparse", "--model", str(MODELS / NAME),
                              "--out", str(tmp_path))
    assert code == 0, err
    assert "the model's own" in out.lower() and (tmp_path / "sparse_own.png").is_file()


def test_every_command_that_runs_a_pass_takes_global_tokens(monkeypatch, capsys):
    """--global-tokens 0,3 is honoured by heads, rollout, lens, patch, attribute (occlusion), neurons, next and
    explain sparse: each runs and prints other numbers than without it (explain sparse: the layers' own masks say "global
    [0, 3]"); a model without global attention (BigBird) and a list that is not of positions are refused in one line;
    gradient attributions through the global rows, which have no backward here, too."""
    model = str(MODELS / NAME)
    text = "The cat sat on the mat and looked at the door."
    commands = [("heads", text), ("rollout", text), ("lens", text),
                ("patch", text, "The dog sat on the mat and looked at the door."),
                ("attribute", "The cat sat on the <mask>.", "--method", "occlusion"), ("neurons", text, "--layer", "0"),
                ("next", "The cat sat on the <mask>.")]
    for command in commands:
        code, without, err = run_main(monkeypatch, capsys, *command, "--model", model)
        assert code == 0, err
        code, out, err = run_main(monkeypatch, capsys, *command, "--model", model, "--global-tokens", "0,3")
        assert code == 0, err
        assert out != without, command
    code, out, err = run_main(monkeypatch, capsys, "explain", "sparse", "--model", model, "--global-tokens", "0,3")
    assert code == 0 and "global [0, 3]" in out, err
    for args, message in ((("rollout", text, "--model", str(MODELS / "big_bird"), "--global-tokens", "0"),
                           "needs a model with global attention"),
                          (("heads", text, "--model", model, "--global-tokens", "a,b"), "positions ≥ 0"),
                          (("attribute", "The cat sat on the <mask>.", "--model", model, "--global-tokens", "0"),
                           "gradients through Longformer's global tokens")):
        code, out, err = run_main(monkeypatch, capsys, *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
