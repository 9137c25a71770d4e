"""T5Gemma against live transformers: random T5GemmaForConditionalGeneration checkpoints of other knob values.

Each case builds a seeded, perturbed model in transformers (eager attention), saves it, loads it with qkv and
compares on a padded source batch (right and left padding: T5Gemma numbers positions 0..n−1 whatever the
padding) with padded decoder inputs: logits, both hidden states, the three kinds of attention (within 1e-4 and
1e-5), then greedy ids with and without the cache and with an end token that stops a row, qkv.train.gradients
against torch autograd, and a qkv.init model saved by qkv read by transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import TOL_ATTENTION, TOL_HIDDEN, max_abs, padded_batch
from transformers import T5GemmaConfig, T5GemmaForConditionalGeneration, T5GemmaModuleConfig

import qkv
from qkv.train import gradients

NEW = 7
V = 97


def config(tied: bool = True, **module) -> T5GemmaConfig:
    """A small T5Gemma whose two stacks share the module knobs MODULE (over these defaults)."""
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12, sliding_window=3,
                attn_logit_softcapping=5.0, final_logit_softcapping=3.0, initializer_range=0.15,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                pad_token_id=0, eos_token_id=1, bos_token_id=2)
    m = base | module
    return T5GemmaConfig(encoder=T5GemmaModuleConfig(**m).to_dict(), decoder=T5GemmaModuleConfig(**m).to_dict(),
                         vocab_size=V, tie_word_embeddings=tied, attn_implementation="eager")


CASES = [
    pytest.param(config(), id="tied-gqa-window3"),
    pytest.param(config(tied=False, num_hidden_layers=3, num_key_value_heads=1, head_dim=12, query_pre_attn_scalar=12,
                        layer_types=["sliding_attention"] * 3, sliding_window=2, attention_bias=True,
                        rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
                 id="untied-mqa-all-sliding-biases-linear"),
    pytest.param(config(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "full_attention"],
                        sliding_window=5, attn_logit_softcapping=None, final_logit_softcapping=None,
                        hidden_activation="silu", num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                        rms_norm_eps=1e-5, max_position_embeddings=64,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
                                         "original_max_position_embeddings": 16}),
                 id="no-caps-silu-mha-window5-yarn"),
]


def build(cfg: T5GemmaConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = T5GemmaForConditionalGeneration(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


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
                              do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=0).numpy()


@pytest.mark.parametrize("cfg", CASES)
def test_forward_greedy_and_gradients(cfg, tmp_path):
    seed = 7 + cfg.encoder.num_hidden_layers * 10 + cfg.encoder.head_dim
    model = build(cfg, seed)
    model.save_pretrained(tmp_path)
    ours = qkv.load(tmp_path)
    for side in ("right", "left"):                       # the source's padding; the target's is on the right
        ids, mask = padded_batch(V - 1, [9, 6, 3], seed + 2, low=3, side=side)
        dec, dec_mask = padded_batch(V - 1, [6, 4, 6], seed + 3, low=3)
        dec[:, 0] = 2
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
        print(f"t5gemma {side}: " + ", ".join(f"{k} {v:.1e}" for k, v in figures.items()))
        assert max(figures["logits"], figures["hidden"], figures["encoder"]) <= TOL_HIDDEN, figures
        assert max(v for k, v in figures.items() if k.endswith("attentions")) <= TOL_ATTENTION, figures
    greedy = hf_greedy(model, ids, mask)                                               # (3, 1 + NEW)
    for cache in (True, False):
        assert ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False,
                             use_cache=cache).tolist() == greedy.tolist()
    eos = int(greedy[0, 3])                                                            # row 0 stops at its 3rd token
    assert ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop=eos, stop_at_eos=False).tolist() \
        == hf_greedy(model, ids, mask, eos=eos).tolist()
    # gradients: the loss of labels (−100 at the tail of one row) against torch autograd
    rng = np.random.default_rng(seed)
    labels = rng.integers(3, V, (3, 6))
    labels[2, 3:] = -100
    model.train()                                                        # no dropout: every rate is 0
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                labels=torch.from_numpy(labels))
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters()}
    loss, grads = gradients(ours, ids, mask, labels=labels)
    assert abs(loss - out.loss.item()) < 1e-5
    assert set(grads) == set(ref)
    for key, g in ref.items():
        scale = max(np.abs(g).max(), 1e-6)
        assert np.abs(grads[key] - g).max() / scale < 1e-4, key


def test_qkv_saved_models_load_in_transformers(tmp_path):
    """qkv.init + save: transformers reads every tensor (none missing, none left over) and computes the same."""
    hf = config(tied=False, num_hidden_layers=3).to_dict()
    fresh = qkv.init(hf, seed=5, initializer_range=0.2)
    fresh.save(tmp_path / "m")
    model, info = T5GemmaForConditionalGeneration.from_pretrained(tmp_path / "m", attn_implementation="eager",
                                                                  output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids, mask = padded_batch(V - 1, [8, 5], 11, low=3)
    dec = np.array([[2, 5, 6, 7]] * 2)
    ref = reference(model.eval(), ids, mask, dec, np.ones_like(dec))
    out = fresh.forward(ids, mask, dec)
    assert max_abs(out.logits, ref["logits"]) <= TOL_HIDDEN
    assert max(max_abs(out.cross_attentions[:, b], ref["cross_attentions"][:, b]) for b in range(2)) <= TOL_ATTENTION
