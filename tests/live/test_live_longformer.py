"""Longformer against live transformers, on random checkpoints of other knob values than the committed fixture's: one
window for every layer or one per layer (4 to 8, the padding a multiple of each; transformers fails on 2), 1–3
layers, other widths and heads, gelu / gelu_new / relu, tied or untied, one or two token types, LongformerModel (no
head); global tokens none, one, or several on a padded batch. Each is saved by transformers, loaded by qkv and
compared on a right- and a left-padded batch: hidden states and logits within 1e-4, every layer's full n × n weights
(rebuilt from transformers' banded form and its global rows) within 1e-5; the masked-LM gradients without global
tokens equal torch autograd's; a model qkv saves reads back in transformers with equal logits."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, TOL_ATTENTION, TOL_HIDDEN, case_seed, check_encoder_saved_by_qkv,
                          check_masked_lm_gradients, max_abs, padded_batch, saved_and_loaded)
from transformers import LongformerConfig, LongformerForMaskedLM, LongformerModel

pytestmark = pytest.mark.live

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from make_fixtures import longformer_dense  # noqa: E402  (the fixture's own rebuilding of the banded weights)


def longformer(d=32, heads=4, layers=2, window=4, ff=48, act="gelu", tied=True, types=1, pad=1, vocab=211):
    return LongformerConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                            intermediate_size=ff, hidden_act=act, attention_window=window, type_vocab_size=types,
                            max_position_embeddings=64, layer_norm_eps=1e-5, tie_word_embeddings=tied,
                            pad_token_id=pad, bos_token_id=0, eos_token_id=2, sep_token_id=2,
                            initializer_range=INIT_RANGE)


CASES = [
    pytest.param(LongformerForMaskedLM, longformer(), (), id="mlm-w4"),
    pytest.param(LongformerForMaskedLM, longformer(layers=3, window=[4, 8, 8], act="gelu_new", tied=False), (0,),
                 id="mlm-L3-w4-8-8-untied-global0"),
    pytest.param(LongformerForMaskedLM, longformer(d=48, heads=6, window=6, act="relu", types=2), (1, 4, 7),
                 id="mlm-h6-w6-relu-types2-global147"),
    pytest.param(LongformerModel, longformer(d=24, heads=2, layers=1, window=4, pad=0), (3,), id="model-L1-w4-global3"),
]


def run(model, ids, mask, glob, tt=None) -> dict[str, np.ndarray]:
    """transformers' outputs on a batch, every layer's weights as the full (B, H, n, n) (`longformer_dense`)."""
    extra = {} if tt is None else {"token_type_ids": torch.from_numpy(tt)}
    if glob:
        g = torch.zeros(ids.shape, dtype=torch.int64)
        g[:, list(glob)] = 1
        extra["global_attention_mask"] = g
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    output_attentions=True, **extra)
    windows = model.config.attention_window
    n = ids.shape[1]
    att = np.stack([longformer_dense(a, None if out.global_attentions is None else out.global_attentions[i], w,
                                     list(glob), n) for i, (a, w) in enumerate(zip(out.attentions, windows))])
    return {"hidden": out.hidden_states[-1].numpy(), "attentions": att,
            "logits": None if getattr(out, "logits", None) is None else out.logits.numpy()}


@pytest.mark.parametrize(("cls", "config", "glob"), CASES)
def test_encoder(cls, config, glob, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    ours = ours.with_config(global_tokens=glob)
    for side in ("right", "left"):
        ids, mask = padded_batch(config.vocab_size, [13, 9, 11], seed=11, low=5, side=side, pad_id=config.pad_token_id)
        tt = None
        if config.type_vocab_size > 1:
            tt = np.zeros_like(ids)
            tt[0, 5:] = 1
        if side == "left" and glob:                                  # a global token must be a real one
            mask[:, list(glob)] = 1
        ref = run(model, ids, mask, glob, tt)
        out = ours.forward(ids, mask, tt)
        valid = mask.astype(bool)
        assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
        if ref["logits"] is not None:
            assert max_abs(out.logits[valid], ref["logits"][valid]) <= TOL_HIDDEN
        for b in range(ids.shape[0]):
            rows = valid[b]
            assert max_abs(out.attentions[:, b][:, :, rows], ref["attentions"][:, b][:, :, rows]) <= TOL_ATTENTION




@pytest.mark.parametrize(("cls", "config"), [c.values[:2] for c in CASES if c.values[0] is LongformerForMaskedLM])
def test_masked_lm_gradients_equal_autograd(cls, config, tmp_path):
    """Without global tokens: loss within 1e-5, every gradient within 1e-4 relative error; the global projections,
    which nothing reads then, get none in either."""
    seed = sum(map(ord, str(config.attention_window))) + config.num_hidden_layers
    check_masked_lm_gradients(cls, config, tmp_path, seed, [12, 8, 10])


def test_a_model_qkv_saves_reads_back_in_transformers(tmp_path):
    config = longformer(layers=2, window=[4, 8], tied=False)
    check_encoder_saved_by_qkv(LongformerForMaskedLM, config, tmp_path, [10, 7],
                               allowed_missing={"lm_head.bias", "lm_head.decoder.bias"})


def test_a_long_input_equals_transformers_without_n_by_n(tmp_path):
    """1100 tokens and a padded row of 1000 (windows 32 and 64, global tokens 0 and 517): hidden states and logits of
    the pass that keeps no weight (core/sparse_layers.py's kernel: only the band and the global columns of each
    block of queries) within 1e-4; each row's 16 largest weights (run(keep=("attention_top",)), what the views of a
    long input read) are transformers' 16 largest, within 1e-5, at the same keys."""
    from qkv.core.attention import top_of

    config = longformer(window=[32, 64])
    config.max_position_embeddings = 1200
    model, ours = saved_and_loaded(LongformerForMaskedLM, config, tmp_path, 1100)
    glob = (0, 517)
    ours = ours.with_config(global_tokens=glob)
    ids, mask = padded_batch(config.vocab_size, [1100, 1000], seed=12, low=5, side="right", pad_id=config.pad_token_id)
    ref = run(model, ids, mask, glob)
    out = ours.forward(ids, mask, attentions=False)
    valid = mask.astype(bool)
    assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
    assert max_abs(out.logits[valid], ref["logits"][valid]) <= TOL_HIDDEN
    trace = ours.run(ids[0], keep=("attention_top",), top=16)
    for i in trace.layer_ids:
        got, want = trace.layer(i).attention_top, top_of(ref["attentions"][i, 0], 16)
        assert max_abs(got.weight, want.weight) <= TOL_ATTENTION
        theirs = np.take_along_axis(ref["attentions"][i, 0], got.index.astype(np.intp), axis=-1)   # (H, n, 16)
        assert max_abs(got.weight, theirs) <= TOL_ATTENTION
