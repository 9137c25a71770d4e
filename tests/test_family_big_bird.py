"""BigBird (block-sparse attention past (5 + 2r)·b tokens, full attention below) against transformers' committed
references (tests/fixtures/make_fixtures.py: make_sparse_attention; block_size 2, one random block: sparse past 14
tokens): the padded batch and every layer (11 tokens: full) are in test_families.py; here left padding, one longer
sequence and a longer padded batch (block-sparse), the copies of block 0 transformers' eval mode reads, the identity
A·V = Z in float64, the knobs refused in one line, a save read back, and the commands that show the mask."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core import sparse_layers as sparse
from conftest import (MODELS, TOL_ATTENTION, TOL_HIDDEN, check_encoder_saved_reads_back, check_gradients,
                      check_knob_matters, check_left_padding, edited, max_abs, reference, run_main)

NAME = "big_bird"


def test_left_padding_equals_the_reference():
    check_left_padding(NAME, logits=True)


def test_the_block_sparse_knobs_are_read():
    cfg = qkv.load(MODELS / NAME).config
    assert (cfg.block_sparse, cfg.scale_embedding, cfg.qkv_bias, cfg.activation) == ((2, 1), True, True, "gelu_tanh")
    assert not sparse.bigbird_sparse(14, 2, 1) and sparse.bigbird_sparse(15, 2, 1)      # (5 + 2r)·b = 14


def test_the_copies_of_each_key_follow_transformers_blocks():
    """n = 15 (padded to 16: 8 blocks of 2, r = 1): blocks 0 and 7 see every key once; block 1 its blocks 0–2 and
    7 with block 0 twice (the "random" block of eval mode is block 0); blocks 2–5 block 0 twice, their neighbours
    and block 7; block 6 block 0 twice, blocks 5–7; the padding's column 15 cut off."""
    c = sparse.bigbird_copies(15, 2, 1)
    assert c.shape == (15, 15)
    blocks = c[::2, ::2]                                                # (8, 8) one entry per pair of blocks
    want = np.array([[1, 1, 1, 1, 1, 1, 1, 1],
                     [2, 1, 1, 0, 0, 0, 0, 1],
                     [2, 1, 1, 1, 0, 0, 0, 1],
                     [2, 0, 1, 1, 1, 0, 0, 1],
                     [2, 0, 0, 1, 1, 1, 0, 1],
                     [2, 0, 0, 0, 1, 1, 1, 1],
                     [2, 0, 0, 0, 0, 1, 1, 1],
                     [1, 1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(blocks, want)
    assert (sparse.bigbird_copies(15, 2, 3)[2:14, :2] == 4).all()          # r = 3: block 0 four times


def test_a_longer_sequence_runs_block_sparse_as_transformers():
    """17 tokens (> 14): hidden states and logits within 1e-4; the weights each key really got are transformers'
    matrix (one copy's share) times its copies: A / c = A_hf where c > 0, and A = 0 where c = 0."""
    ref = reference(NAME)
    out = qkv.load(MODELS / NAME).forward(ref["single_input_ids"])
    assert max_abs(out.hidden, ref["single_hidden"]) <= TOL_HIDDEN
    assert max_abs(out.logits, ref["single_logits"]) <= TOL_HIDDEN
    c = sparse.bigbird_copies(17, 2, 1)
    A = out.attentions                                                   # (L, 1, H, n, n)
    assert (A[..., c == 0] == 0).all()
    assert max_abs(np.where(c > 0, A / np.maximum(c, 1), 0), ref["single_attentions"]) <= TOL_ATTENTION
    assert max_abs(A, ref["single_attentions"]) > 0.01                     # block 0's copies: not one share
    np.testing.assert_allclose(A.sum(-1), 1, atol=1e-5)


def test_a_padded_batch_runs_block_sparse_as_transformers():
    """Two rows of 20 (row 1 ends in 5 pads): logits at the real tokens, the weights of row 0 (one share each)."""
    ref = reference(NAME)
    out = qkv.load(MODELS / NAME).forward(ref["sparse_input_ids"], ref["sparse_attention_mask"])
    real = ref["sparse_attention_mask"].astype(bool)
    assert max_abs(out.logits[real], ref["sparse_logits"][real]) <= TOL_HIDDEN
    c = sparse.bigbird_copies(20, 2, 1)
    theirs = ref["sparse_attentions"][:, 0]
    assert max_abs(np.where(c > 0, out.attentions[:, 0] / np.maximum(c, 1), 0), theirs) <= TOL_ATTENTION


def test_each_knob_matters():
    check_knob_matters(NAME, {"block_sparse": None})                    # full attention on 17 tokens
    check_knob_matters(NAME, {"block_sparse": (2, 0)})                  # no copies of block 0
    check_knob_matters(NAME, {"scale_embedding": False})


def test_the_weights_reproduce_each_layer_output_in_float64():
    """Z = A·V with the copies counted in A (≤ 1e-9), on a block-sparse input."""
    ids = reference(NAME)["single_input_ids"][0]
    trace = qkv.load(MODELS / NAME, dtype=np.float64).run(ids, keep=("attentions", "heads", "v"))
    for i in trace.layer_ids:
        lt = trace.layer(i)
        assert max_abs(np.einsum("hij,hjd->hid", lt.attentions, lt.v), lt.heads) <= 1e-9


@pytest.mark.parametrize("change, message", [
    ({"attention_type": "flash"}, "attention_type 'flash'"),
    ({"block_size": 0}, "block_size=0"),
    ({"num_random_blocks": 0}, "num_random_blocks=0"),
    ({"is_decoder": True}, "is_decoder=true"),
])
def test_what_cannot_run_is_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, NAME, change))
    assert "\n" not in str(e.value)


def test_original_full_reads_as_full_attention(tmp_path):
    model = qkv.load(edited(tmp_path, NAME, {"attention_type": "original_full"}))
    assert model.config.block_sparse is None


def test_gradients_equal_autograd():
    """grads/big_bird.npz (20 tokens: block-sparse): transformers' loss and torch autograd's gradient of every
    parameter, within 1e-4 relative error: the copies of block 0 a constant bias of the scores."""
    check_gradients(qkv.load(MODELS / NAME), NAME, labels=True, atol=1e-6)


def test_save_reads_back_equal(tmp_path):
    check_encoder_saved_reads_back(tmp_path, NAME, hidden=True)


def test_block_sparse_trains_with_the_mask_it_runs():
    """The gradient through the copies' constant bias: finite differences of the masked-LM loss agree (float64)."""
    from qkv.train import gradients

    model = qkv.load(MODELS / NAME, dtype=np.float64)
    ids = reference(NAME)["single_input_ids"]
    labels = np.where(np.arange(17) % 3 == 0, ids, -100)
    loss, grads = gradients(model, ids, labels=labels)
    key = next(k for k in grads if k.endswith("layer.0.attention.self.query.weight"))
    W = model.weights.blocks[0].attn.W_Q
    step = 1e-6
    W[3, 5] += step
    up, _ = gradients(model, ids, labels=labels)
    W[3, 5] -= step
    assert abs((up - loss) / step - grads[key][5, 3]) < 1e-4 * max(1.0, abs(grads[key][5, 3]))


def test_show_heads_rollout_and_the_lesson_run(monkeypatch, capsys, tmp_path):
    model = str(MODELS / NAME)
    text = "the cat sat on the mat and looked at the door for a long time"
    code, out, err = run_main(monkeypatch, capsys, "show", text, "--model", model, "--out", str(tmp_path / "show"))
    assert code == 0, err
    assert (tmp_path / "show" / "pipeline.html").is_file()
    for command in (("heads", text), ("rollout", text)):
        code, out, err = run_main(monkeypatch, capsys, *command, "--model", model)
        assert code == 0, err
    from qkv.lessons import sparse as lesson

    le = lesson.build(qkv.load(MODELS / NAME, dtype=np.float64), cost_sizes=())
    assert le.own and all(o.error <= 1e-9 for o in le.own) and le.own[0].copies == 2
