"""Hooks and ablation on encoder–decoders (the Marian, BART, T5 fixtures and ko-en-tiny), without torch.

Knocking out head h of a layer is the same model as one whose W_O has rows h·d_k..(h+1)·d_k set to 0
(Z_h then adds nothing): checked in each stack, against that edit of the weights. Hook names carry the
stack ("encoder.", "cross.", none for the decoder); every spelling of a head in the one key grammar
(qkv.core.hooks.parse_key: "encoder.0.heads.1", "encoder.0.1", ("encoder", 0, 1), ...) ablates the same head,
in Python and in `qkv show --ablate`; bad names and entries get one clear error. Against
transformers making the same edit: tests/live/test_live_seq2seq_hooks.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import qkv
from qkv import QkvError

from conftest import FIXTURES

SEQ2SEQ = ["marian", "bart", "t5", "t5_gated", "mbart", "pegasus", "mt5", "umt5", "t5gemma"]


def load(name):
    return qkv.load(FIXTURES / "seq2seq" / name)


def batch(model, seed=0):
    rng = np.random.default_rng(seed)
    V = model.config.vocab_size
    ids = rng.integers(3, V - 1, (2, 7))
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3])
    dec = rng.integers(3, V - 1, (2, 5))
    dec[:, 0] = model.start_token
    return ids, mask, dec, np.array([[1] * 5, [1] * 3 + [0] * 2])


def zero_rows_of_W_O(model, stack: str, layer: int, head: int):
    """A copy of the model whose W_O in that attention ignores head `head`."""
    edited = copy.deepcopy(model)
    side = edited.weights.encoder if stack == "encoder" else edited.weights.decoder
    attn = side.blocks[layer].cross_attn if stack == "cross" else side.blocks[layer].attn
    d = model.config.d_head
    attn.W_O = attn.W_O.copy()
    attn.W_O[head * d:(head + 1) * d] = 0
    return edited


@pytest.mark.parametrize("name", SEQ2SEQ)
@pytest.mark.parametrize("stack", ["encoder", "decoder", "cross"])
def test_ablating_a_head_equals_zeroing_its_rows_of_W_O(name, stack):
    model = load(name)
    ids, mask, dec, dec_mask = batch(model)
    layer, head = 0, model.config.n_heads - 1
    want = zero_rows_of_W_O(model, stack, layer, head).forward(ids, mask, dec, dec_mask).logits
    plain = model.forward(ids, mask, dec, dec_mask).logits
    got = model.forward(ids, mask, dec, dec_mask, ablate=[(stack, layer, head)]).logits
    rows = dec_mask.astype(bool)
    assert np.abs(plain - want)[rows].max() > 1e-3                # the edit changes the answer
    np.testing.assert_allclose(got[rows], want[rows], atol=1e-5)
    prefix = "" if stack == "decoder" else f"{stack}."
    hooked = model.forward(ids, mask, dec, dec_mask, hooks={f"{prefix}{layer}.heads.{head}": lambda z, layer: 0}).logits
    np.testing.assert_array_equal(hooked, got)
    view = model.ablate([(stack, layer, head)])                   # a view: every pass, generation too
    np.testing.assert_array_equal(view.forward(ids, mask, dec, dec_mask).logits, got)


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_hooks_read_every_stack_as_the_trace_records_it(name):
    model = load(name)
    seen = {}
    hooks = {"encoder.0.attentions": lambda a, layer: seen.__setitem__("encoder", a.copy()),
             "cross.-1.attentions": lambda a, layer: seen.__setitem__("cross", a.copy()),
             "0.ffn_out": lambda f, layer: seen.__setitem__("ffn", f.copy())}
    ids = np.arange(3, 9)
    trace = model.run(ids, [model.start_token, 4, 5, 6], hooks=hooks)
    np.testing.assert_array_equal(seen["encoder"][0], trace.encoder.layer(0).attentions)
    np.testing.assert_array_equal(seen["cross"][0], trace.cross.layer(-1).attentions)
    np.testing.assert_array_equal(seen["ffn"][0], trace.layer(0).ffn_out)
    assert seen["cross"].shape[-2:] == (4, 6)                      # n_tgt × n_src


def test_a_hook_replacing_cross_attention_moves_the_translation():
    model = qkv.load("ko-en-tiny")
    plain = model.generate("나는 학교에 간다", 8, temperature=0)
    uniform = model.with_hooks({"cross.attentions": lambda a, layer: np.full_like(a, 1 / a.shape[-1])})
    assert uniform.generate("나는 학교에 간다", 8, temperature=0) != plain   # no word read from its place
    trace = uniform.run("나는 학교에 간다", "I go to school")
    assert np.allclose(trace.cross.attentions, 1 / len(trace.cross.source_tokens))


def test_mean_ablation_writes_without_a_cache():
    model = qkv.load("ko-en-tiny")
    view = model.ablate([(0, 0)], how="mean")
    with pytest.raises(QkvError, match="without a KV cache"):
        view.generate("나는 학교에 간다", 4, temperature=0)
    assert isinstance(view.generate("나는 학교에 간다", 4, temperature=0, use_cache=False), str)


@pytest.mark.parametrize("bad, message", [
    ({"cross.0.residual": lambda v, l: None}, "cross-attention has"),
    ({"encoder.9.heads": lambda v, l: None}, "layer"),
    ({"cross.0.heads.99": lambda v, l: None}, "head"),
    ([("x", 1)], "hooks must be a dict"),
])
def test_bad_hooks_get_one_clear_error(bad, message):
    model = load("bart")
    with pytest.raises(QkvError, match=message):
        model.run(np.arange(3, 8), [model.start_token, 4], hooks=bad)


@pytest.mark.parametrize("bad", [[("cross", 0)], [("middle", 0, 0)], [(0, 99)], [("encoder", 99, 0)], [(0.5, 1)]])
def test_bad_ablations_get_one_clear_error(bad):
    model = load("marian")
    with pytest.raises(QkvError):
        model.run(np.arange(3, 8), [model.start_token, 4], ablate=bad)


# ── the one key grammar on an encoder–decoder (qkv.core.hooks.parse_key) ─────────

@pytest.mark.parametrize("stack, keys", [
    ("encoder", ["encoder.0.heads.1", "encoder.0.1", "encoder.0.z.1", ("encoder", 0, 1)]),
    ("decoder", ["decoder.0.heads.1", "0.heads.1", "0.1", "decoder.0.1", (0, 1), ("decoder", 0, 1)]),
    ("cross", ["cross.0.heads.1", "cross.0.1", ("cross", 0, 1)]),
])
def test_every_spelling_of_a_head_ablates_alike(stack, keys):
    model = load("marian")
    ids, mask, dec, dec_mask = batch(model)
    want = zero_rows_of_W_O(model, stack, 0, 1).forward(ids, mask, dec, dec_mask).logits
    rows = dec_mask.astype(bool)
    for key in keys:
        got = model.forward(ids, mask, dec, dec_mask, ablate=[key]).logits
        np.testing.assert_allclose(got[rows], want[rows], atol=1e-5, err_msg=str(key))
        assert np.array_equal(model.ablate([key]).forward(ids, mask, dec, dec_mask).logits, got)
    hooked = model.forward(ids, mask, dec, dec_mask, hooks={f"{stack}.0.heads.1": lambda z, layer: 0}).logits
    np.testing.assert_array_equal(hooked, model.forward(ids, mask, dec, dec_mask, ablate=[keys[0]]).logits)


def test_decoder_named_or_not_is_the_same_hook():
    model = load("bart")
    ids, mask, dec, dec_mask = batch(model)
    seen = {}
    for key in ("decoder.1.attn_out", "1.attn_out"):
        model.forward(ids, mask, dec, dec_mask, hooks={key: lambda v, layer, key=key: seen.setdefault(key, v.copy())})
    np.testing.assert_array_equal(seen["decoder.1.attn_out"], seen["1.attn_out"])


@pytest.mark.parametrize("bad, message", [
    (["cross.0.residual"], "cross-attention has"),
    (["encoder.0.heads"], "ablation knocks out one head's Z"),
    (["encoder.9.heads.0"], "encoder layer 9 does not exist"),
    (["middle.0.heads.1"], r"is not \[STACK\.\]\[LAYER\.\]NAME\[\.HEAD\]"),
])
def test_a_bad_ablation_key_names_the_grammar(bad, message):
    model = load("marian")
    with pytest.raises(QkvError, match=message):
        model.run(np.arange(3, 8), [model.start_token, 4], ablate=bad)


def test_qkv_show_ablates_an_encoder_decoder(monkeypatch, capsys):
    """qkv show --ablate on ko-en-tiny: each stack's heads by the grammar's keys, its table and translation those
    of the ablated model (once refused: "--ablate knocks out heads of single-stack models")."""
    from conftest import run_main

    text = "나는 학교에 간다"
    model = qkv.load("ko-en-tiny")
    _, plain, _ = run_main(monkeypatch, capsys, "show", text, "--model", "ko-en-tiny")
    for keys, heads in (("encoder.0.heads.1", [("encoder", 0, 1)]),
                        ("cross.1.heads.0,decoder.0.heads.2", [("cross", 1, 0), (0, 2)]),
                        ("0.2,cross.1.0", [(0, 2), ("cross", 1, 0)])):
        code, out, err = run_main(monkeypatch, capsys, "show", text, "--model", "ko-en-tiny", "--ablate", keys)
        assert code == 0, err
        assert out != plain
        translation = model.ablate(heads).generate(text, 20, temperature=0)
        assert f"translation (greedy): {translation}\n" in out
    code, _, err = run_main(monkeypatch, capsys, "show", text, "--model", "ko-en-tiny", "--ablate", "encoder.0.heads")
    assert code == 2 and "ablation knocks out one head's Z" in err and len(err.strip().splitlines()) == 1


def test_two_spellings_of_one_point_both_run():
    model = load("marian")
    ids, mask, dec, dec_mask = batch(model)
    calls = []
    model.forward(ids, mask, dec, dec_mask, hooks={"1.heads": lambda z, layer: calls.append("heads"),
                                                   "1.z": lambda z, layer: calls.append("z"),
                                                   "decoder.1.heads": lambda z, layer: calls.append("decoder")})
    assert calls == ["heads", "z", "decoder"]
