"""mBART, Pegasus, mT5 and UMT5 against live transformers: random checkpoints of other sizes and knob values.

Each case builds a seeded, perturbed model (test_live_seq2seq.build), saves it with save_pretrained, loads
it with qkv and compares on padded source batches (right and left) with padded decoder inputs: logits,
both hidden states, the three kinds of attention; then greedy generation token for token with and without
the KV cache (and an EOS that stops rows early), with mBART's forced_bos_token_id when its config.json has
one. Also: qkv.init + save read back by transformers, and gradients equal to torch autograd (mBART with
its own shift of the labels, Pegasus with its frozen sinusoids, T5, mT5 and UMT5 with their relative position
bias: one table per stack, or one per layer).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from live_helpers import TOL_ATTENTION, TOL_HIDDEN, max_abs, padded_batch
from test_live_seq2seq import NEW, build, reference
from transformers import (MBartConfig, MBartForConditionalGeneration, MT5Config, MT5ForConditionalGeneration,
                          PegasusConfig, PegasusForConditionalGeneration, T5Config, T5ForConditionalGeneration,
                          UMT5Config, UMT5ForConditionalGeneration)
from transformers.models.pegasus.modeling_pegasus import PegasusSinusoidalPositionalEmbedding

import qkv
from qkv.core.positions import sinusoidal_halves
from qkv.train import gradients


def mbart(d=32, heads=4, enc=2, dec=3, ff=64, vocab=113, act="gelu", scale=True, start=None, **kw):
    return MBartConfig(vocab_size=vocab, d_model=d, encoder_layers=enc, decoder_layers=dec,
                       encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ff,
                       decoder_ffn_dim=ff, max_position_embeddings=64, activation_function=act, scale_embedding=scale,
                       init_std=0.15, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=start,
                       **kw)


def pegasus(d=32, heads=4, enc=2, dec=2, ff=64, vocab=107, act="relu", scale=True, **kw):
    return PegasusConfig(vocab_size=vocab, d_model=d, encoder_layers=enc, decoder_layers=dec,
                         encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ff,
                         decoder_ffn_dim=ff, max_position_embeddings=64, activation_function=act,
                         scale_embedding=scale, init_std=0.15, pad_token_id=0, eos_token_id=1,
                         decoder_start_token_id=0, **kw)


def mt5(d=32, heads=4, d_kv=8, layers=2, ff=48, vocab=101, buckets=16, distance=24, **kw):
    return MT5Config(vocab_size=vocab, d_model=d, d_kv=d_kv, d_ff=ff, num_layers=layers, num_heads=heads,
                     relative_attention_num_buckets=buckets, relative_attention_max_distance=distance,
                     pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **kw)


def umt5(d=32, heads=4, d_kv=8, layers=2, ff=48, vocab=101, buckets=16, distance=24, **kw):
    return UMT5Config(vocab_size=vocab, d_model=d, d_kv=d_kv, d_ff=ff, num_layers=layers, num_heads=heads,
                      relative_attention_num_buckets=buckets, relative_attention_max_distance=distance,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **kw)


# (class, config, untie the head, keys added to config.json after saving)
CASES = [
    pytest.param(MBartForConditionalGeneration, mbart(), False, {}, id="mbart"),
    pytest.param(MBartForConditionalGeneration, mbart(d=48, heads=6, enc=1, dec=2, act="relu", scale=False, start=2),
                 False, {"forced_bos_token_id": 57}, id="mbart-forced-bos"),
    pytest.param(MBartForConditionalGeneration, mbart(d=40, heads=5, enc=3, dec=1, act="gelu_new", vocab=131),
                 False, {"forced_bos_token_id": 5}, id="mbart-odd"),
    pytest.param(PegasusForConditionalGeneration, pegasus(), False, {}, id="pegasus"),
    pytest.param(PegasusForConditionalGeneration, pegasus(d=36, heads=3, enc=1, dec=3, act="gelu", scale=False),
                 False, {}, id="pegasus-d36-unscaled"),
    pytest.param(PegasusForConditionalGeneration, pegasus(d=42, heads=6, enc=3, dec=2, act="swish"), False, {},
                 id="pegasus-d42-swish"),
    pytest.param(MT5ForConditionalGeneration, mt5(), True, {"tie_word_embeddings": False}, id="mt5"),
    pytest.param(MT5ForConditionalGeneration, mt5(d=48, heads=6, d_kv=12, layers=3, buckets=32, distance=128),
                 True, {"tie_word_embeddings": False}, id="mt5-buckets32"),
    pytest.param(MT5ForConditionalGeneration, mt5(feed_forward_proj="gated-silu", d_kv=16, ff=40), False, {},
                 id="mt5-gated-silu-tied"),
    pytest.param(MT5ForConditionalGeneration, mt5(feed_forward_proj="relu", buckets=8, distance=12), True, {},
                 id="mt5-relu"),
    pytest.param(UMT5ForConditionalGeneration, umt5(tie_word_embeddings=False), True, {}, id="umt5"),
    pytest.param(UMT5ForConditionalGeneration, umt5(d=48, heads=6, d_kv=12, layers=3, buckets=32, distance=128,
                                                    feed_forward_proj="relu"), False, {}, id="umt5-tied-rescaled"),
]


def hf_greedy(model, ids, mask, forced, eos=None, use_cache=True) -> np.ndarray:
    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                              do_sample=False, num_beams=1, eos_token_id=eos, forced_eos_token_id=None,
                              forced_bos_token_id=forced, pad_token_id=model.config.pad_token_id,
                              use_cache=use_cache).numpy()


@pytest.mark.parametrize(("cls", "config", "untie", "extra"), CASES)
def test_forward_and_greedy(cls, config, untie, extra, tmp_path):
    seed = sum(map(ord, f"{cls.__name__}{config.d_model}"))
    model = build(cls, config, seed, untie)
    model.save_pretrained(tmp_path)
    if extra:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | extra))
    ours = qkv.load(tmp_path)
    assert ours.config.family == config.model_type
    V, pad = config.vocab_size, config.pad_token_id
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    assert ours.start_token == start
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
        print(f"{cls.__name__} d={config.d_model} {side}: " + ", ".join(f"{k} {v:.1e}" for k, v in figures.items()))
        assert max(figures["logits"], figures["hidden"], figures["encoder"]) <= TOL_HIDDEN, figures
        assert max(v for k, v in figures.items() if k.endswith("attentions")) <= TOL_ATTENTION, figures
    forced = extra.get("forced_bos_token_id")
    greedy = hf_greedy(model, ids, mask, forced)                                       # (3, 1 + NEW)
    if forced is not None:
        assert (greedy[:, 1] == forced).all()
    for cache in (True, False):
        got = ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False, use_cache=cache)
        assert got.tolist() == greedy.tolist(), cache
    assert hf_greedy(model, ids, mask, forced, use_cache=False).tolist() == greedy.tolist()
    eos = int(greedy[0, 3])                                                            # row 0 stops at its 3rd token
    stopped = hf_greedy(model, ids, mask, forced, eos=eos)
    assert ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop=eos, stop_at_eos=False).tolist() \
        == stopped.tolist()


@pytest.mark.parametrize("d", [16, 36, 42, 51])
def test_pegasus_sinusoids_equal_transformers(d):
    """Pegasus's table is Marian's: the sines in the first ⌈d/2⌉ columns (odd d too), cosines after."""
    table = PegasusSinusoidalPositionalEmbedding(70, d).create_weight().numpy()
    assert np.array_equal(sinusoidal_halves(70, d), table)


@pytest.mark.parametrize(("family", "cls", "make"), [
    ("mbart", MBartForConditionalGeneration, mbart), ("pegasus", PegasusForConditionalGeneration, pegasus),
    ("mt5", MT5ForConditionalGeneration, mt5), ("umt5", UMT5ForConditionalGeneration, umt5)])
def test_qkv_saved_models_load_in_transformers(family, cls, make, tmp_path):
    """qkv.init + save: transformers reads every tensor (none missing, none left over) and computes the
    same logits and cross-attention; a loaded checkpoint saved by qkv reads back the same."""
    config = make().to_dict()
    fresh = qkv.init(config, seed=5, initializer_range=0.2)
    assert fresh.config.family == family
    fresh.save(tmp_path / "m")
    model, info = cls.from_pretrained(tmp_path / "m", attn_implementation="eager", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids, mask = padded_batch(config["vocab_size"] - 1, [8, 5], 11, low=3, pad_id=config["pad_token_id"])
    start = fresh.start_token
    dec = np.array([[start, 5, 6, 7]] * 2)
    ref = reference(model.eval(), ids, mask, dec, np.ones_like(dec))
    out = fresh.forward(ids, mask, dec)
    assert max_abs(out.logits, ref["logits"]) <= TOL_HIDDEN
    assert max(max_abs(out.cross_attentions[:, b], ref["cross_attentions"][:, b]) for b in range(2)) <= TOL_ATTENTION
    valid = mask.astype(bool)
    assert max_abs(out.encoder_hidden[valid], ref["encoder_hidden"][valid]) <= TOL_HIDDEN


GRAD_CASES = [
    pytest.param(MBartForConditionalGeneration, MBartConfig, dict(scale_embedding=True), id="mbart"),
    pytest.param(MBartForConditionalGeneration, MBartConfig, dict(activation_function="relu", encoder_layers=1,
                                                                  decoder_layers=3), id="mbart-relu-1x3"),
    pytest.param(PegasusForConditionalGeneration, PegasusConfig, dict(scale_embedding=True), id="pegasus"),
    pytest.param(PegasusForConditionalGeneration, PegasusConfig, dict(activation_function="gelu", decoder_layers=1),
                 id="pegasus-gelu-2x1"),
]


T5_GRAD_CASES = [
    pytest.param(MT5ForConditionalGeneration, mt5(), True, id="mt5"),
    pytest.param(MT5ForConditionalGeneration, mt5(feed_forward_proj="relu", buckets=8, distance=5, d_kv=12), False,
                 id="mt5-relu-tied"),
    pytest.param(T5ForConditionalGeneration, T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=40, num_layers=2,
                 num_decoder_layers=1, num_heads=4, relative_attention_num_buckets=16,
                 relative_attention_max_distance=20, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
                 False, id="t5-v1.0-tied-rescaled"),
    pytest.param(T5ForConditionalGeneration, T5Config(vocab_size=97, d_model=40, d_kv=10, d_ff=40, num_layers=2,
                 num_heads=5, feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=0,
                 eos_token_id=1, decoder_start_token_id=0), True, id="flan-t5-style"),
    pytest.param(UMT5ForConditionalGeneration, umt5(tie_word_embeddings=False, buckets=8, distance=6), True,
                 id="umt5"),
    pytest.param(UMT5ForConditionalGeneration, umt5(feed_forward_proj="gated-silu"), False, id="umt5-tied-rescaled"),
]


@pytest.mark.parametrize("cls, config, untie", T5_GRAD_CASES)
def test_t5_gradients_equal_autograd(cls, config, untie, tmp_path):
    """T5 and mT5 train: unscaled scores, the relative position bias's table (every layer's dB summed by
    bucket, both directions in the encoder, the past in the decoder), v1.0's rescaled tied head, a padded
    source; T5's unused cross-attention bias gets no gradient in either."""
    config.dropout_rate = 0.0
    model = build(cls, config, 3, untie)
    model.train(False)
    model.save_pretrained(tmp_path)
    rng = np.random.default_rng(2)
    src = rng.integers(2, config.vocab_size, (3, 9))
    mask = np.ones_like(src)
    mask[0, 6:] = 0
    src[mask == 0] = 0
    labels = rng.integers(2, config.vocab_size, (3, 7))
    labels[1, 4:] = -100
    out = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask), labels=torch.tensor(labels))
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters() if p.grad is not None}
    loss, grads = gradients(qkv.load(tmp_path), src, mask, labels=labels)
    worst = max(np.linalg.norm(grads[k] - g) / np.linalg.norm(g) for k, g in ref.items())
    print(f"{cls.__name__}: loss {loss:.6f} vs {out.loss.item():.6f}, worst relative error {worst:.1e}")
    assert abs(loss - out.loss.item()) < 1e-5
    assert set(grads) == set(ref)
    assert worst < 1e-4


@pytest.mark.parametrize("cls, config_cls, kw", GRAD_CASES)
def test_gradients_equal_autograd(cls, config_cls, kw, tmp_path):
    """Loss within 1e-5; each tensor's gradient within 1e-4 relative error, the key biases' (whose true
    gradient is 0) within 1e-7 absolute. mBART's decoder reads each label row's last real token first."""
    torch.manual_seed(1)
    base = dict(vocab_size=90, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
                pad_token_id=0, eos_token_id=1, bos_token_id=2, decoder_start_token_id=0, dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0)
    model = cls(config_cls(**{**base, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:                              # Pegasus's sinusoids are fixed
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(tmp_path)
    rng = np.random.default_rng(0)
    src = rng.integers(2, 90, (3, 7))
    mask = np.ones_like(src)
    mask[1, 5:] = 0
    src[mask == 0] = 0
    labels = rng.integers(3, 90, (3, 6))
    labels[2, 3:] = -100
    out = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask), labels=torch.tensor(labels))
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters() if p.requires_grad}
    loss, grads = gradients(qkv.load(tmp_path), src, mask, labels=labels)
    print(f"{cls.__name__}: loss {loss:.6f} vs {out.loss.item():.6f}")
    assert abs(loss - out.loss.item()) < 1e-5
    assert set(grads) == set(ref)
    for key, g in ref.items():
        if key.endswith("k_proj.bias"):
            assert np.abs(grads[key] - g).max() < 1e-7, key
        else:
            assert np.linalg.norm(grads[key] - g) / np.linalg.norm(g) < 1e-4, key


def out_projection(model, stack: str, layer: int):
    """The W_O module of one attention: T5's layout (mT5, UMT5) or BART's (mBART, Pegasus)."""
    if hasattr(model, "encoder") and hasattr(model.encoder, "block"):
        if stack == "encoder":
            return model.encoder.block[layer].layer[0].SelfAttention.o
        block = model.decoder.block[layer]
        return block.layer[0].SelfAttention.o if stack == "decoder" else block.layer[1].EncDecAttention.o
    side = model.model.encoder if stack == "encoder" else model.model.decoder
    return (side.layers[layer].self_attn if stack != "cross" else side.layers[layer].encoder_attn).out_proj


@pytest.mark.parametrize(("cls", "config", "untie", "extra"), CASES[::2])
def test_a_knocked_out_head_equals_transformers(cls, config, untie, extra, tmp_path):
    """A head of each stack zeroed before W_O in torch (a pre-hook) = qkv's ablation = a hook returning 0."""
    model = build(cls, config, 17, untie)
    model.save_pretrained(tmp_path)
    ours = qkv.load(tmp_path)
    V, pad = config.vocab_size, config.pad_token_id
    ids, mask = padded_batch(V - 1, [8, 5], 19, low=3, pad_id=pad)
    dec, dec_mask = padded_batch(V - 1, [6, 4], 20, low=3, pad_id=pad)
    dec[:, 0] = ours.start_token
    rows, c = dec_mask.astype(bool), ours.config
    plain = ours.forward(ids, mask, dec, dec_mask, attentions=False).logits
    for stack in ("encoder", "decoder", "cross"):
        layer, head = (c.n_layers if stack == "encoder" else c.n_decoder_layers) - 1, c.n_heads - 1

        def zero_head(_module, args):
            z = args[0].clone()                                          # (B, n, H·d_k) the concatenated heads
            z[..., head * c.d_head:(head + 1) * c.d_head] = 0
            return (z,)

        handle = out_projection(model, stack, layer).register_forward_pre_hook(zero_head)
        with torch.no_grad():
            ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                        decoder_input_ids=torch.from_numpy(dec),
                        decoder_attention_mask=torch.from_numpy(dec_mask)).logits.numpy()
        handle.remove()
        ablated = ours.forward(ids, mask, dec, dec_mask, attentions=False, ablate=[(stack, layer, head)]).logits
        prefix = "" if stack == "decoder" else f"{stack}."
        hooked = ours.forward(ids, mask, dec, dec_mask, attentions=False,
                              hooks={f"{prefix}{layer}.heads.{head}": lambda z, layer: 0}).logits
        assert max_abs(plain[rows], ref[rows]) > 10 * TOL_HIDDEN, f"{stack}: the edit must move the logits"
        assert max_abs(ablated[rows], ref[rows]) < TOL_HIDDEN, stack
        np.testing.assert_array_equal(hooked, ablated)
