"""BigBird against live transformers, on random checkpoints of other knob values than the committed fixture's:
block_size 2–4, 1–2 random blocks (transformers does not run 0), inputs just past (5 + 2r)·b (block-sparse) and below
it (full), original_full, use_bias off, rescale_embeddings on or off, gelu / gelu_new / relu, tied or untied, one or
two token types, BigBirdModel (no head). Each is saved by transformers, loaded by qkv and compared on a right- and a
left-padded batch: hidden states and logits within 1e-4; the weights within 1e-5 once qkv's (each key's real share)
are divided by its copies (transformers' matrix writes one copy's share of block 0); the masked-LM gradients equal
torch autograd's; a model qkv saves reads back in transformers with equal logits. transformers switches a model to
full attention for good on a short input: each batch is read by a model loaded again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, TOL_ATTENTION, TOL_HIDDEN, case_seed, check_encoder_saved_by_qkv,
                          check_masked_lm_gradients, max_abs, padded_batch, saved_and_loaded)
from transformers import BigBirdConfig, BigBirdForMaskedLM, BigBirdModel

from qkv.core import sparse_layers as sparse

pytestmark = pytest.mark.live


def big_bird(d=32, heads=4, layers=2, block=2, rand=1, kind="block_sparse", ff=48, act="gelu_new", bias=True,
             rescale=False, tied=True, types=2, vocab=211):
    return BigBirdConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                         intermediate_size=ff, hidden_act=act, attention_type=kind, block_size=block,
                         num_random_blocks=rand, use_bias=bias, rescale_embeddings=rescale, type_vocab_size=types,
                         max_position_embeddings=64, tie_word_embeddings=tied, pad_token_id=0, bos_token_id=2,
                         eos_token_id=3, sep_token_id=3, initializer_range=INIT_RANGE, attn_implementation="eager")


CASES = [   # (class, config, lengths): the longest past (5 + 2r)·b where block-sparse, the others shorter
    pytest.param(BigBirdForMaskedLM, big_bird(), [16, 11, 15], id="mlm-b2-r1"),
    pytest.param(BigBirdForMaskedLM, big_bird(block=3, rand=2, act="relu", rescale=True, tied=False, layers=3),
                 [29, 20, 28], id="mlm-b3-r2-relu-rescale-untied-L3"),
    pytest.param(BigBirdForMaskedLM, big_bird(block=4, rand=1, bias=False, types=1, heads=2), [29, 21, 9],
                 id="mlm-b4-r1-nobias"),
    pytest.param(BigBirdForMaskedLM, big_bird(kind="original_full", act="gelu", rescale=True), [13, 9, 11],
                 id="mlm-original-full"),
    pytest.param(BigBirdModel, big_bird(d=24, heads=3, block=2, rand=2, layers=1), [19, 12, 17], id="model-b2-r2"),
]


def reference(tmp_path, cls, config, ids, mask, tt):
    """transformers' outputs from a model loaded again (full attention if the batch is short, as it switches)."""
    short = config.attention_type == "block_sparse" and ids.shape[1] <= (5 + 2 * config.num_random_blocks) * \
        config.block_size
    model = cls.from_pretrained(tmp_path, attention_type="original_full" if short else config.attention_type).eval()
    model.set_attn_implementation("eager")
    kwargs = {} if tt is None else {"token_type_ids": torch.from_numpy(tt)}
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    output_attentions=True, **kwargs)
    n = ids.shape[1]
    return (out.hidden_states[-1].numpy()[:, :n], None if getattr(out, "logits", None) is None else out.logits.numpy(),
            np.stack([a.numpy()[..., :n, :n] for a in out.attentions]))


@pytest.mark.parametrize(("cls", "config", "lengths"), CASES)
def test_encoder(cls, config, lengths, tmp_path, request):
    _, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    blocks = None if config.attention_type == "original_full" else (config.block_size, config.num_random_blocks)
    assert ours.config.block_sparse == blocks
    for side in ("right", "left"):
        ids, mask = padded_batch(config.vocab_size, lengths, seed=11, low=5, side=side, pad_id=0)
        tt = None
        if config.type_vocab_size > 1:
            tt = np.zeros_like(ids)
            tt[0, 5:] = 1
        hidden, logits, att = reference(tmp_path, cls, config, ids, mask, tt)
        out = ours.forward(ids, mask, tt)
        valid = mask.astype(bool)
        assert max_abs(out.hidden[valid], hidden[valid]) <= TOL_HIDDEN
        if logits is not None:
            assert max_abs(out.logits[valid], logits[valid]) <= TOL_HIDDEN
        n = ids.shape[1]
        c = np.ones((n, n)) if blocks is None or not sparse.bigbird_sparse(n, *blocks) else sparse.bigbird_copies(
            n, *blocks)
        ours_share = np.where(c > 0, out.attentions / np.maximum(c, 1), 0)
        for b in range(ids.shape[0]):
            assert max_abs(ours_share[:, b][:, :, valid[b]], att[:, b][:, :, valid[b]]) <= TOL_ATTENTION


@pytest.mark.parametrize(("cls", "config", "lengths"), [c.values for c in CASES
                                                        if c.values[0] is BigBirdForMaskedLM])
def test_masked_lm_gradients_equal_autograd(cls, config, lengths, tmp_path):
    """Loss within 1e-5, every gradient within 1e-4 relative error, through block-sparse attention where the batch
    is long enough (the copies of block 0 a constant bias)."""
    seed = config.block_size * 10 + config.num_random_blocks + config.num_hidden_layers
    check_masked_lm_gradients(cls, config, tmp_path, seed, lengths)


def test_a_model_qkv_saves_reads_back_in_transformers(tmp_path):
    config = big_bird(block=2, rand=1, tied=False, bias=False)
    check_encoder_saved_by_qkv(BigBirdForMaskedLM, config, tmp_path, [16, 9],
                               allowed_missing={"bert.pooler.weight", "bert.pooler.bias", "cls.predictions.bias"})


def test_a_long_input_equals_transformers_without_n_by_n(tmp_path):
    """1100 tokens and a padded row of 1000 (blocks of 8, two random blocks): hidden states and logits of the pass
    that keeps no weight (core/sparse_layers.py's kernel: each block of queries with only its key blocks) within
    1e-4; each row's 16 largest weights (run(keep=("attention_top",))) divided by their copies are transformers'
    weights at those keys, within 1e-5."""
    config = big_bird(block=8, rand=2)
    config.max_position_embeddings = 1200
    _, ours = saved_and_loaded(BigBirdForMaskedLM, config, tmp_path, 1100)
    ids, mask = padded_batch(config.vocab_size, [1100, 1000], seed=12, low=5, side="right", pad_id=0)
    hidden, logits, att = reference(tmp_path, BigBirdForMaskedLM, config, ids, mask, None)
    out = ours.forward(ids, mask, attentions=False)
    valid = mask.astype(bool)
    assert max_abs(out.hidden[valid], hidden[valid]) <= TOL_HIDDEN
    assert max_abs(out.logits[valid], logits[valid]) <= TOL_HIDDEN
    trace = ours.run(ids[0], keep=("attention_top",), top=16)
    n = ids.shape[1]
    rows = np.arange(n)[None, :, None]
    for i in trace.layer_ids:
        got = trace.layer(i).attention_top
        index = got.index.astype(np.intp)                                        # (H, n, 16)
        copies = sparse.SparseMask(n=n, m=n, causal=False, blocks=(8, 2)).copies(np.arange(n), np.arange(n))
        share = got.weight / np.maximum(copies[rows, index], 1)
        assert max_abs(share, np.take_along_axis(att[i, 0], index, axis=-1)) <= TOL_ATTENTION
