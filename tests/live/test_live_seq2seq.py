"""Encoder–decoders against live transformers: random Marian, BART and T5 checkpoints of many shapes.

Each case builds a seeded, perturbed model in transformers, saves it with save_pretrained, loads it
with qkv and compares on a padded source batch with padded decoder inputs (logits, both hidden
states, the three kinds of attention), then greedy generation token for token, with and without an
EOS that stops rows early. Also: the pieces against transformers' own (T5's buckets, Marian's
sinusoids), and qkv's saved seq2seq models read by transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import TOL_ATTENTION, TOL_HIDDEN, max_abs, padded_batch
from transformers import (BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel, T5Config,
                          T5ForConditionalGeneration)
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.models.t5.modeling_t5 import T5Attention

import qkv
from qkv.core.positions import relative_buckets, sinusoidal_halves

NEW = 7


def build(cls, config, seed: int, untie: bool = False) -> torch.nn.Module:
    """A seeded model, every trained parameter and final_logits_bias perturbed, eval, eager attention.
    Marian's frozen sinusoids stay as they are (transformers never saves them). untie: a T5 v1.1
    head of its own (transformers 5 ties T5's head in memory)."""
    torch.manual_seed(seed)
    model = cls(config)
    if untie:
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone() * 0.7)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.add_(torch.randn(model.final_logits_bias.shape, generator=gen) * 0.3)
    model = model.eval()
    model.set_attn_implementation("eager")
    return model


def marian(d=32, heads=4, enc=2, dec=2, ff=64, vocab=97, act="swish", scale=True, **kw):
    return MarianConfig(vocab_size=vocab, d_model=d, encoder_layers=enc, decoder_layers=dec,
                        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ff,
                        decoder_ffn_dim=ff, max_position_embeddings=64, activation_function=act, scale_embedding=scale,
                        init_std=0.15, pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1, eos_token_id=0, **kw)


def bart(d=32, heads=4, enc=2, dec=3, ff=64, vocab=113, act="gelu", scale=False, **kw):
    return BartConfig(vocab_size=vocab, d_model=d, encoder_layers=enc, decoder_layers=dec,
                      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ff,
                      decoder_ffn_dim=ff, max_position_embeddings=64, activation_function=act, scale_embedding=scale,
                      init_std=0.15, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, **kw)


def t5(d=32, heads=4, d_kv=8, layers=2, ff=64, vocab=101, proj="relu", buckets=8, distance=20, **kw):
    return T5Config(vocab_size=vocab, d_model=d, d_kv=d_kv, d_ff=ff, num_layers=layers, num_heads=heads,
                    relative_attention_num_buckets=buckets, relative_attention_max_distance=distance,
                    feed_forward_proj=proj, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **kw)


CASES = [
    pytest.param(MarianMTModel, marian(), False, id="marian"),
    pytest.param(MarianMTModel, marian(d=48, heads=6, enc=1, dec=3, act="relu", scale=False), False, id="marian-relu"),
    pytest.param(MarianMTModel, marian(d=40, heads=5, enc=3, dec=1, act="gelu", vocab=131), False, id="marian-odd"),
    pytest.param(BartForConditionalGeneration, bart(), False, id="bart"),
    pytest.param(BartForConditionalGeneration, bart(d=48, heads=3, enc=3, dec=2, act="gelu_new", scale=True),
                 False, id="bart-scaled"),
    pytest.param(T5ForConditionalGeneration, t5(), False, id="t5"),
    pytest.param(T5ForConditionalGeneration, t5(d=48, heads=6, d_kv=16, buckets=32, distance=128, layers=3),
                 False, id="t5-buckets32"),
    pytest.param(T5ForConditionalGeneration, t5(proj="gated-gelu", d_kv=12, ff=40, tie_word_embeddings=False),
                 True, id="t5-v1.1"),
    pytest.param(T5ForConditionalGeneration, t5(proj="gated-silu", buckets=16, distance=9, tie_word_embeddings=False),
                 True, id="t5-gated-silu"),
]


def reference(model, ids, mask, dec, dec_mask) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    decoder_input_ids=torch.from_numpy(dec), decoder_attention_mask=torch.from_numpy(dec_mask),
                    output_attentions=True, output_hidden_states=True)
    return {"logits": out.logits.numpy(), "hidden": out.decoder_hidden_states[-1].numpy(),
            "encoder_hidden": out.encoder_last_hidden_state.numpy(),
            "encoder_attentions": np.stack([a.numpy() for a in out.encoder_attentions]),
            "attentions": np.stack([a.numpy() for a in out.decoder_attentions]),
            "cross_attentions": np.stack([a.numpy() for a in out.cross_attentions])}


def hf_greedy(model, ids, mask, eos=None) -> np.ndarray:
    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                              do_sample=False, num_beams=1, eos_token_id=eos, forced_eos_token_id=None,
                              forced_bos_token_id=None, pad_token_id=model.config.pad_token_id).numpy()


@pytest.mark.parametrize(("cls", "config", "untie"), CASES)
def test_forward_and_greedy(cls, config, untie, tmp_path):
    seed = sum(map(ord, f"{cls.__name__}{config.d_model}"))
    model = build(cls, config, seed, untie)
    model.save_pretrained(tmp_path)
    ours = qkv.load(tmp_path)
    V, pad, start = config.vocab_size, config.pad_token_id, config.decoder_start_token_id
    for side in ("right", "left"):                       # the source's padding; the target's is on the right
        ids, mask = padded_batch(V - 1, [9, 6, 3], seed + 2, low=3, side=side, pad_id=pad)
        dec, dec_mask = padded_batch(V - 1, [6, 4, 6], seed + 3, low=3, pad_id=pad)
        dec[:, 0] = start
        ref = reference(model, ids, mask, dec, dec_mask)
        out = ours.forward(ids, mask, dec, dec_mask)
        src, tgt = mask.astype(bool), dec_mask.astype(bool)
        figures = {"logits": max_abs(out.logits[tgt], ref["logits"][tgt]),
                   "hidden": max_abs(out.hidden[tgt], ref["hidden"][tgt]),
                   "encoder": max_abs(out.encoder_hidden[src], ref["encoder_hidden"][src])}
        for name, rows in (("encoder_attentions", src), ("attentions", tgt), ("cross_attentions", tgt)):
            got = getattr(out, name)
            assert got.shape == ref[name].shape, (name, got.shape, ref[name].shape)
            figures[name] = max(max_abs(got[:, b][:, :, rows[b]], ref[name][:, b][:, :, rows[b]]) for b in range(3))
        print(f"{cls.__name__} {side}: " + ", ".join(f"{k} {v:.1e}" for k, v in figures.items()))
        assert max(figures["logits"], figures["hidden"], figures["encoder"]) <= TOL_HIDDEN, figures
        assert max(v for k, v in figures.items() if k.endswith("attentions")) <= TOL_ATTENTION, figures
    greedy = hf_greedy(model, ids, mask)                                               # (3, 1 + NEW)
    assert ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False).tolist() == greedy.tolist()
    eos = int(greedy[0, 3])                                                            # row 0 stops at its 3rd token
    stopped = hf_greedy(model, ids, mask, eos=eos)
    assert ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop=eos, stop_at_eos=False).tolist() \
        == stopped.tolist()


def test_relative_buckets_equal_transformers():
    rel = torch.arange(-400, 400)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (16, 9), (64, 300), (6, 4)):
            expected = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=buckets,
                                                             max_distance=distance).numpy()[0]
            got = relative_buckets(np.array([0]), np.arange(-400, 400), bidirectional, buckets, distance)[0]
            assert got.tolist() == expected.tolist(), (bidirectional, buckets, distance)


@pytest.mark.parametrize("d", [16, 32, 50, 512])
def test_marian_sinusoids_equal_transformers(d):
    table = MarianSinusoidalPositionalEmbedding(70, d).create_weight().numpy()
    assert np.array_equal(sinusoidal_halves(70, d), table)


@pytest.mark.parametrize(("family", "cls"), [("marian", MarianMTModel), ("bart", BartForConditionalGeneration),
                                             ("t5", T5ForConditionalGeneration)])
def test_qkv_saved_models_load_in_transformers(family, cls, tmp_path):
    """qkv.init + save: transformers' from_pretrained reads every tensor (none missing, none left over)
    and computes the same logits and cross-attention."""
    config = {"marian": marian, "bart": bart, "t5": t5}[family]().to_dict()
    fresh = qkv.init(config, seed=5, initializer_range=0.2)
    fresh.save(tmp_path / "m")
    model, info = cls.from_pretrained(tmp_path / "m", attn_implementation="eager", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids, mask = padded_batch(config["vocab_size"] - 1, [8, 5], 11, low=3, pad_id=config["pad_token_id"])
    dec = np.array([[config["decoder_start_token_id"], 5, 6, 7]] * 2)
    ref = reference(model.eval(), ids, mask, dec, np.ones_like(dec))
    out = fresh.forward(ids, mask, dec)
    assert max_abs(out.logits, ref["logits"]) <= TOL_HIDDEN
    valid = mask.astype(bool)
    assert max(max_abs(out.cross_attentions[:, b], ref["cross_attentions"][:, b]) for b in range(2)) <= TOL_ATTENTION
    assert max_abs(out.encoder_hidden[valid], ref["encoder_hidden"][valid]) <= TOL_HIDDEN
