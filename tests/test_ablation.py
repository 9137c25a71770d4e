"""Head ablation (`model.run(..., ablate=[(layer, head)])`, `model.forward(..., ablate=...)`).

Every check is an identity that can fail:
  - zero-ablating head h of layer l equals the same model with rows h·d_k..(h+1)·d_k of that
    layer's W_O zeroed (Z_h·W_O[h] is then 0 either way);
  - mean-ablating it equals that model with b_O += mean_n(Z_h)·W_O[h] (the head's average output);
  - ablating nothing is bit for bit the plain pass; ablating a head that writes something changes it.
Tolerance: 1e-6 max abs on hidden states and logits (zero: the two routes add the same exact
zeros; mean: checked in float64, as its two routes sum in another order).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import qkv
from conftest import MODELS, max_abs, reference
from qkv.models.model import Model

TOL = 1e-6
FIXTURES = ["llama_gqa", "gpt2", "bert"]


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


def with_head_out(model: Model, layer: int, head: int, bias_from: np.ndarray | None = None) -> Model:
    """The same model with head `head` of `layer` cut out of W_O (rows h·d_k..(h+1)·d_k zeroed);
    with bias_from (d_k,), that head's constant output bias_from·W_O[h] added to b_O instead."""
    d_k = model.config.d_head
    rows = slice(head * d_k, (head + 1) * d_k)
    block = model.weights.blocks[layer]
    W_O = block.attn.W_O.copy(order="K")     # (H·d_k, d_model), its memory order kept (so is BLAS's sum order)
    b_O = None if block.attn.b_O is None else np.array(block.attn.b_O, copy=True)
    if bias_from is not None:
        extra = bias_from.astype(W_O.dtype) @ W_O[rows]            # (d_model,)
        b_O = extra if b_O is None else b_O + extra
    W_O[rows] = 0
    blocks = list(model.weights.blocks)
    blocks[layer] = replace(block, attn=replace(block.attn, W_O=W_O, b_O=b_O))
    return Model(model.config, replace(model.weights, blocks=blocks), model.tokenizer, model.name)


def ids_of(name: str) -> np.ndarray:
    return reference(name)["input_ids"][0]


def outputs_equal(a, b) -> float:
    worst = max_abs(a.hidden, b.hidden)
    if a.logits is not None:
        worst = max(worst, max_abs(a.logits, b.logits))
    return worst


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("layer, head", [(0, 1), (-1, -1)])
def test_zero_ablation_equals_zeroed_W_O(name, layer, head):
    model = qkv.load(MODELS / name)
    ids = ids_of(name)
    L, H = model.config.n_layers, model.config.n_heads
    ablated = model.run(ids, ablate=[(layer, head)])
    cut = with_head_out(model, layer % L, head % H).run(ids)
    assert outputs_equal(ablated, cut) <= TOL
    assert not ablated.layer(layer % L).heads[head % H].any()      # the trace keeps the ablated Z
    assert outputs_equal(ablated, model.run(ids)) > 1e-4            # and the head did write something


@pytest.mark.parametrize("name", FIXTURES)
def test_forward_ablation_on_a_padded_batch(name):
    ref = reference(name)
    model = qkv.load(MODELS / name)
    args = (ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    heads = [(0, 0), (1, 2)]
    out = model.forward(*args, ablate=heads)
    cut = with_head_out(with_head_out(model, 0, 0), 1, 2).forward(*args)
    assert outputs_equal(out, cut) <= TOL
    assert max_abs(out.attentions, cut.attentions) <= TOL          # weights are not what is ablated


@pytest.mark.parametrize("name", FIXTURES)
def test_mean_ablation_is_the_heads_average_output(name):
    """In float64: the two routes sum the head's output in another order (float32 differs by ~1e-6)."""
    model = qkv.load(MODELS / name).astype(np.float64)
    ids = ids_of(name)
    z = model.run(ids, keep=("heads",)).layer(1).heads[2]          # (n, d_k): layer 1 is unchanged before its W_O
    ablated = model.run(ids, ablate=[(1, 2)], how="mean")
    assert outputs_equal(ablated, with_head_out(model, 1, 2, bias_from=z.mean(axis=0)).run(ids)) <= TOL
    assert np.allclose(ablated.layer(1).heads[2], z.mean(axis=0), atol=1e-6)


@pytest.mark.parametrize("name", FIXTURES)
def test_ablating_nothing_is_the_plain_pass_bit_for_bit(name):
    model = qkv.load(MODELS / name)
    ids = ids_of(name)
    plain = model.run(ids)
    for nothing in (None, []):
        again = model.run(ids, ablate=nothing)
        assert np.array_equal(again.hidden, plain.hidden)
        assert again.logits is None or np.array_equal(again.logits, plain.logits)


def test_forward_and_run_agree(name="llama_gqa"):
    model = qkv.load(MODELS / name)
    ids = ids_of(name)
    for how in ("zero", "mean"):
        out = model.forward(ids, ablate=[(1, 5)], how=how)
        assert max_abs(out.logits[0], model.run(ids, ablate=[(1, 5)], how=how).logits) <= TOL


@pytest.mark.parametrize("bad, message", [
    ([(2, 0)], "layer 2 does not exist"),
    ([(0, 8)], "head 8 does not exist"),
    ([(0,)], "(layer, head) pairs"),
    ([3], "(layer, head) pairs"),
    ([(0.5, 1)], "(layer, head) pairs"),
])
def test_bad_ablation_is_one_clear_error(bad, message):
    model = qkv.load(MODELS / "llama_gqa")
    with pytest.raises(qkv.QkvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model.run(ids_of("llama_gqa"), ablate=bad)
    with pytest.raises(qkv.QkvError, match="unknown ablation 'max'"):
        model.run(ids_of("llama_gqa"), ablate=[(0, 0)], how="max")


def test_smollm2_zero_ablation_equals_zeroed_W_O(smollm2):
    ids, _ = smollm2.encode("When Mary and John went to the store, John gave a drink to")
    for layer, head in [(0, 4), (17, 8)]:
        ablated = smollm2.run(ids, keep=(), ablate=[(layer, head)])
        cut = with_head_out(smollm2, layer, head).run(ids, keep=())
        assert outputs_equal(ablated, cut) <= TOL
        assert outputs_equal(ablated, smollm2.run(ids, keep=())) > 1e-3


def test_next_token_logits_with_ablation_equals_run():
    from qkv.writing.nexttoken import next_token_logits

    model = qkv.load(MODELS / "gpt2")
    ids = ids_of("gpt2")
    z = next_token_logits(model, ids, ablate=[(1, 2)])
    assert max_abs(z, model.run(ids, ablate=[(1, 2)]).logits[-1]) <= TOL
    assert max_abs(z, next_token_logits(model, ids)) > 1e-4


def test_cli_ablate(monkeypatch, capsys):
    from conftest import run_main

    gpt2 = str(MODELS / "gpt2")
    code, out, _ = run_main(monkeypatch, capsys, "next", "the cat sat", "--model", gpt2, "-t", "1",
                            "--ablate", "1.2,0.0")
    assert code == 0 and "heads 1.2,0.0 zero-ablated" in out
    code, out, _ = run_main(monkeypatch, capsys, "show", "the cat sat", "--model", gpt2, "--ablate", "1.2")
    assert code == 0 and "layer 0" in out
    for bad, message in (("3", "is not [STACK.][LAYER.]NAME[.HEAD]"), ("2.0", "layer 2 does not exist"), ("0.4", "head 4 does not exist")):
        code, _, err = run_main(monkeypatch, capsys, "next", "the cat sat", "--model", gpt2, "--ablate", bad)
        assert code == 2 and message in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_mean_ablation_averages_real_tokens_only(name):
    """Row 1 of the fixture's batch is right-padded: mean-ablated in the batch, its real tokens
    give what they give alone (the padding's Z is left out of the mean)."""
    ref = reference(name)
    model = qkv.load(MODELS / name)
    n = int(ref["attention_mask"][1].sum())
    assert n < ref["attention_mask"].shape[1]
    out = model.forward(ref["input_ids"], ref["attention_mask"], ablate=[(0, 1)], how="mean", attentions=False)
    alone = model.run(ref["input_ids"][1, :n], ablate=[(0, 1)], how="mean", keep=())
    assert max_abs(out.logits[1, :n], alone.logits) <= 1e-5
