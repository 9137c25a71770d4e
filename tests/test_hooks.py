"""Hooks (qkv.core.hooks): reading and replacing intermediates during run, forward and generate.

Every check is an identity that can fail:
  - hooks that return their input (at every point of every layer) leave every output and every
    recorded intermediate bit for bit unchanged, on a pre-norm and a post-norm model, batched too;
  - a hook on "heads" zeroing head h equals zero-ablation of (layer, h), bit for bit;
  - hooks on scores / attentions / q act as the math says (an identity mask gives A = I, q = 0
    gives uniform attention over the visible keys);
  - during generate with the KV cache, a read-only hook sees one call per step (the prompt, then
    one token at a time), a hook on attn_out changes the tokens, the same way every run, and the
    same tokens come out with or without the cache (hooks on k reach the cache);
  - a view made by with_hooks / ablate leaves the model itself unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS, max_abs, reference
from qkv.core.trace import INTERMEDIATES

NAMES = list(INTERMEDIATES)


def load(name: str):
    return qkv.load(MODELS / name)


def identity_hooks(calls: list | None = None) -> dict:
    """Every point of every layer, returning its input (optionally noting each call)."""
    def hook(name):
        def fn(value, layer):
            if calls is not None:
                calls.append((name, layer, value.shape))
            return value
        return fn
    return {name: hook(name) for name in NAMES}


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "bert"])
def test_identity_hooks_change_no_bit(name):
    model = load(name)
    ids = reference(name)["input_ids"][0]
    calls = []
    plain, hooked = model.run(ids, keep=NAMES), model.run(ids, keep=NAMES, hooks=identity_hooks(calls))
    assert len(calls) == len(NAMES) * model.config.n_layers
    assert np.array_equal(plain.hidden, hooked.hidden)
    assert plain.logits is None or np.array_equal(plain.logits, hooked.logits)
    for layer in range(model.config.n_layers):
        for what in NAMES:
            assert np.array_equal(getattr(plain.layer(layer), what), getattr(hooked.layer(layer), what)), what


@pytest.mark.parametrize("name", ["llama_gqa", "bert"])
def test_identity_hooks_on_a_padded_batch(name):
    ref = reference(name)
    model = load(name)
    args = (ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    plain, hooked = model.forward(*args), model.forward(*args, hooks=identity_hooks())
    assert np.array_equal(plain.hidden, hooked.hidden)
    assert np.array_equal(plain.attentions, hooked.attentions)


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "bert"])
def test_zeroing_a_head_equals_zero_ablation(name):
    model = load(name)
    ids = reference(name)["input_ids"][0]
    ablated = model.run(ids, ablate=[(1, 2)])
    for key, fn in (("1.heads.2", lambda z, layer: np.zeros_like(z)),
                    ("1.z.2", lambda z, layer: 0),                            # alias, broadcast scalar
                    ("1.heads", lambda z, layer: np.where(np.arange(z.shape[1])[:, None, None] == 2, 0, z))):
        hooked = model.run(ids, hooks={key: fn})
        assert np.array_equal(hooked.hidden, ablated.hidden), key
        assert np.array_equal(hooked.layer(1).heads, ablated.layer(1).heads), key
    assert max_abs(ablated.hidden, model.run(ids).hidden) > 1e-4              # the head did write something


def test_every_layer_and_negative_layers():
    model = load("llama_gqa")
    ids = reference("llama_gqa")["input_ids"][0]
    seen = []
    model.run(ids, hooks={"attn_out": lambda a, layer: seen.append(layer)})
    assert seen == list(range(model.config.n_layers))
    seen.clear()
    model.run(ids, hooks={"-1.ffn_out": lambda f, layer: seen.append(layer)})
    assert seen == [model.config.n_layers - 1]


def test_hooks_on_scores_attentions_and_queries_act_as_the_math_says():
    model = load("gpt2")
    ids = reference("gpt2")["input_ids"][0]
    n = len(ids)
    eye = np.where(np.eye(n, dtype=bool), 0.0, -np.inf)

    t = model.run(ids, hooks={"0.scores": lambda s, layer: s + eye})          # only the diagonal survives
    assert np.array_equal(t.layer(0).attentions[0], np.eye(n, dtype=np.float32))
    v = t.layer(0).v[0]                                                       # (n, d_k) head 0 (H = Hkv)
    assert max_abs(t.layer(0).heads[0], v) <= 1e-6                           # Z = A·V = V

    t = model.run(ids, hooks={"1.attentions.0": lambda a, layer: np.tril(np.ones_like(a))
                              / np.arange(1, n + 1, dtype=np.float32)[:, None]})
    assert max_abs(t.layer(1).attentions[0], np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]) <= 1e-7

    t = model.run(ids, hooks={"1.q": lambda q, layer: 0})                     # S = 0: uniform over visible keys
    assert max_abs(t.layer(1).attentions, np.broadcast_to(t.layer(1).attentions[:1], t.layer(1).attentions.shape)) == 0
    assert max_abs(t.layer(1).attentions[0], np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]) <= 1e-6


def test_residual_hook_replaces_the_stream():
    model = load("llama_gqa")
    ids = reference("llama_gqa")["input_ids"][0]
    other = (ids + 1) % model.config.vocab_size
    want = model.run(other)
    x0 = want.layer(0).residual[None]                                         # (1, n, d_model) its embeddings
    got = model.run(ids, hooks={"0.residual": lambda x, layer: x0})
    assert np.array_equal(got.logits, want.logits)                           # the whole stream swapped at layer 0


# ── generate with the KV cache ───────────────────────────────────────────────────

def test_read_only_hook_sees_one_call_per_step():
    model = load("llama_gqa")
    prompt = reference("llama_gqa")["single_input_ids"][0, :6]                # (6,)
    shapes = []
    out = model.generate(prompt, 5, temperature=0, stop_at_eos=False,
                         hooks={"1.attn_out": lambda a, layer: shapes.append(a.shape)})
    d = model.config.d_model
    assert shapes == [(1, 6, d)] + [(1, 1, d)] * 4                            # prefill, then one token a step
    assert out.tolist() == model.generate(prompt, 5, temperature=0, stop_at_eos=False).tolist()


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_attn_out_hook_changes_generation_deterministically(name):
    model = load(name)
    prompt = reference(name)["single_input_ids"][0, :6]
    kw = dict(temperature=0, stop_at_eos=False)
    plain = model.generate(prompt, 8, **kw)
    hooks = {"0.attn_out": lambda a, layer: -3 * a}
    first, again = model.generate(prompt, 8, hooks=hooks, **kw), model.generate(prompt, 8, hooks=hooks, **kw)
    assert first.tolist() == again.tolist()
    assert first.tolist() != plain.tolist()
    uncached = model.generate(prompt, 8, hooks=hooks, use_cache=False, **kw)
    assert first.tolist() == uncached.tolist()                               # the cache holds the hooked past


def test_key_hooks_reach_the_cache():
    """k hooked before it joins the cache: cached and uncached writing agree."""
    model = load("llama_gqa")
    prompt = reference("llama_gqa")["single_input_ids"][0, :6]
    hooks = {"1.k.0": lambda k, layer: 4 * k, "0.v": lambda v, layer: v[:, ::-1]}
    kw = dict(temperature=0, stop_at_eos=False, hooks=hooks)
    cached, uncached = model.generate(prompt, 8, **kw), model.generate(prompt, 8, use_cache=False, **kw)
    assert cached.tolist() == uncached.tolist()
    assert cached.tolist() != model.generate(prompt, 8, temperature=0, stop_at_eos=False).tolist()


def test_smollm2_generation_with_a_hook(smollm2):
    """SmolLM2 (30 layers): silencing layer 0's attention changes what it writes."""
    prompt = "The capital of France is"
    plain = smollm2.generate(prompt, 4, temperature=0)
    steps = []
    hooked = smollm2.generate(prompt, 4, temperature=0, hooks={"0.attn_out": lambda a, layer: 0,
                                                                 "29.residual": lambda x, l: steps.append(x.shape)})
    assert hooked != plain
    assert [s[1] for s in steps] == [len(smollm2.encode(prompt)[0]), 1, 1, 1]


# ── views ─────────────────────────────────────────────────────────────────────

def test_views_share_weights_and_leave_the_model_alone():
    model = load("llama_gqa")
    ids = reference("llama_gqa")["input_ids"][0]
    plain = model.run(ids)
    view = model.with_hooks({"1.heads.2": lambda z, layer: 0})
    assert view.weights is model.weights and model.hooks is None
    assert np.array_equal(view.run(ids).logits, model.run(ids, ablate=[(1, 2)]).logits)
    assert np.array_equal(model.run(ids).logits, plain.logits)
    both = view.with_hooks({"0.heads.1": lambda z, layer: 0})                  # hooks of a view of a view
    assert np.array_equal(both.run(ids).logits, model.run(ids, ablate=[(1, 2), (0, 1)]).logits)


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_ablate_view_equals_ablate_argument(how):
    model = load("gpt2")
    ids = reference("gpt2")["input_ids"][0]
    view = model.ablate([(1, 2)], how=how)
    assert model.ablated is None
    assert np.array_equal(view.run(ids).logits, model.run(ids, ablate=[(1, 2)], how=how).logits)
    assert np.array_equal(view.forward(ids).logits, model.forward(ids, ablate=[(1, 2)], how=how).logits)
    joined = view.run(ids, ablate=[(0, 0)], how=how)                          # the view's heads and these
    assert np.array_equal(joined.logits, model.run(ids, ablate=[(1, 2), (0, 0)], how=how).logits)


def test_ablate_view_generates():
    model = load("gpt2")
    prompt = reference("gpt2")["single_input_ids"][0, :6]
    kw = dict(temperature=0, stop_at_eos=False)
    view = model.ablate([(0, 0), (1, 1)])
    hooked = model.generate(prompt, 6, hooks={"0.heads.0": lambda z, layer: 0, "1.heads.1": lambda z, layer: 0}, **kw)
    assert view.generate(prompt, 6, **kw).tolist() == hooked.tolist()
    with pytest.raises(qkv.QkvError, match="without a KV cache"):
        model.ablate([(0, 0)], how="mean").generate(prompt, 2, **kw)
    assert model.ablate([(0, 0)], how="mean").generate(prompt, 2, use_cache=False, **kw).shape == (1, 8)


# ── mistakes ─────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("hooks, message", [
    ({"3.heads": lambda v, l: v}, "layer 3 does not exist"),
    ({"0.heads.8": lambda v, l: v}, "head 8 does not exist"),
    ({"0.k.2": lambda v, l: v}, "K/V head 2 does not exist"),
    ({"0.attn_out.1": lambda v, l: v}, "hook it without a head"),
    ({"0.values": lambda v, l: v}, "unknown intermediate 'values'"),
    ({"0.heads.x": lambda v, l: v}, "is not \\[STACK.\\]\\[LAYER.\\]NAME\\[.HEAD\\]"),
    ({"0.heads": 3}, "is not a function"),
    ({"0.attn_out": lambda v, l: v[:, :1, :2]}, "returned shape"),
    ({"0.heads": lambda v, l: "no"}, "returned <U2 values"),
    (["0.heads"], "must be a dict"),
])
def test_mistakes_are_one_clear_error(hooks, message):
    model = load("llama_gqa")                                                 # L = 2, H = 8, Hkv = 2
    with pytest.raises(qkv.QkvError, match=message):
        model.run(reference("llama_gqa")["input_ids"][0], hooks=hooks)


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


# ── the one key grammar (parse_key): every spelling, every kind ─────────────────

@pytest.mark.parametrize("key, want", [
    ("3.heads", (None, 3, "heads", None)),
    ("heads", (None, None, "heads", None)),
    ("-1.attn_out", (None, -1, "attn_out", None)),
    ("3.heads.2", (None, 3, "heads", 2)),
    ("3.z.2", (None, 3, "heads", 2)),
    ("3.2", (None, 3, "heads", 2)),                       # qkv show --ablate's LAYER.HEAD
    ((3, 2), (None, 3, "heads", 2)),                      # ablate=[(layer, head)]
    ("encoder.3.heads.2", ("encoder", 3, "heads", 2)),
    ("decoder.3.heads.2", ("decoder", 3, "heads", 2)),
    ("cross.3.heads.2", ("cross", 3, "heads", 2)),
    ("encoder.0.1", ("encoder", 0, "heads", 1)),
    (("encoder", 3, 2), ("encoder", 3, "heads", 2)),
    (["cross", 0, np.int64(1)], ("cross", 0, "heads", 1)),
    ("cross.attentions", ("cross", None, "attentions", None)),
    ("encoder.-1.k.0", ("encoder", -1, "k", 0)),
])
def test_every_spelling_of_a_key_parses_alike(key, want):
    from qkv.core.hooks import parse_key

    got = parse_key(key)
    assert (got.stack, got.layer, got.name, got.head) == want


@pytest.mark.parametrize("key", ["0.heads.x", "", "3", "encoder.", "encoder.3", "a.b.c.d", "3.heads.2.1",
                                 ("cross", 0), ("middle", 0, 0), (0.5, 1), (True, 1), (1, 2, 3, 4), 3, None])
def test_a_key_outside_the_grammar_is_one_error_that_shows_it(key):
    from qkv.core.hooks import parse_key

    with pytest.raises(qkv.QkvError, match=r"is not \[STACK\.\]\[LAYER\.\]NAME\[\.HEAD\] with STACK encoder, "
                                           r"decoder or cross.*\(layer, head\) pairs"):
        parse_key(key)


def test_a_decoder_ablates_by_any_spelling_of_a_head():
    """"0.heads.1", "0.1", "0.z.1" and (0, 1) knock out the same head, bit for bit; a hook zeroing it too."""
    model = load("llama_gqa")
    ids = reference("llama_gqa")["input_ids"][0]
    want = model.run(ids, ablate=[(0, 1)]).logits
    assert max_abs(want, model.run(ids).logits) > 1e-4
    for spelling in (["0.heads.1"], ["0.1"], ["0.z.1"], "0.heads.1", [(0, 1), "0.heads.1"]):
        assert np.array_equal(model.run(ids, ablate=spelling).logits, want), spelling
        assert np.array_equal(model.ablate(spelling).run(ids).logits, want), spelling
    assert np.array_equal(model.run(ids, hooks={"0.heads.1": lambda z, layer: 0}).logits, want)


@pytest.mark.parametrize("ablate, message", [
    (["encoder.0.heads.1"], "is a single stack, with no encoder; name its heads without a stack, e.g. '0.heads.1'"),
    (["decoder.0.1"], "is a single stack, with no decoder"),
    (["0.attn_out"], "ablation knocks out one head's Z"),
    (["0.attn_out.1"], "attn_out is one array for all heads"),
    (["0.heads"], "ablation knocks out one head's Z"),
    (["heads.1"], "ablation knocks out one head's Z"),
    (["0.q.1"], "ablation knocks out one head's Z"),
    (["0.heads.x"], r"is not \[STACK\.\]\[LAYER\.\]NAME\[\.HEAD\]"),
])
def test_a_bad_ablation_key_is_one_clear_error(ablate, message):
    model = load("llama_gqa")
    with pytest.raises(qkv.QkvError, match=message):
        model.run(reference("llama_gqa")["input_ids"][0], ablate=ablate)


def test_a_single_stack_refuses_hooks_that_name_a_stack():
    model = load("llama_gqa")
    with pytest.raises(qkv.QkvError, match="is a single stack, with no cross; name its points without a stack, "
                                           "e.g. '0.attentions'"):
        model.run(reference("llama_gqa")["input_ids"][0], hooks={"cross.0.attentions": lambda a, layer: None})
