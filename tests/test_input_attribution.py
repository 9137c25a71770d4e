"""qkv attribute / qkv.analysis.input_attribution: input gradients equal torch autograd's (fixtures made by
tests/fixtures/make_attribution_fixtures.py), integrated gradients integrate, and the command's output and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS, run_main
from qkv.analysis import input_attribution as IA
from qkv.analysis import quadrature
from qkv.cli.app import cli

FIXTURES = MODELS.parent / "attribution"
ENCODERS = ("roberta", "distilbert", "bert")
SEQ2SEQ = ("marian", "bart", "t5")
NAMES = sorted(p.stem for p in FIXTURES.glob("*.npz") if p.stem not in ENCODERS + SEQ2SEQ)


def test_the_fixtures_are_there():
    assert len(NAMES) >= 10 and all((FIXTURES / f"{name}.npz").exists() for name in ENCODERS), NAMES


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    ref = dict(np.load(FIXTURES / f"{request.param}.npz"))
    return request.param, qkv.load(MODELS / request.param), ref


def _scale(model, ref) -> float:
    """qkv's e = E[ids]·s over what torch's embedding module gives (1, or s where the family scales after it)."""
    rows = model.weights.tok_embed[ref["input_ids"]] * (model.config.embed_scale or 1.0)
    c = float(np.vdot(rows, ref["embeddings"]) / np.vdot(ref["embeddings"], ref["embeddings"]))
    assert np.abs(rows - c * ref["embeddings"]).max() <= 1e-5 * np.abs(rows).max()
    return c


def _terms(e: np.ndarray, g: np.ndarray) -> float:
    """The scale of gradient × input's sums: max over tokens of Σ_d |e_d·g_d| (a sum that cancels to less keeps
    float32's error of its terms)."""
    return float(np.abs(e * g).sum(-1).max())


def test_gradients_equal_torch_autograd(case):
    name, model, ref = case
    ids, t, o = ref["input_ids"].tolist(), int(ref["target"]), int(ref["other"])
    c = _scale(model, ref)
    gxi = IA.attribute(model, ids, t, method="grad-x-input")
    want = (ref["embeddings"] * ref["grad"]).sum(-1)                       # invariant under e → c·e
    assert gxi.target == t and gxi.method == "grad-x-input"
    assert np.abs(gxi.scores - want).max() <= 1e-4 * _terms(ref["embeddings"], ref["grad"]), name
    sal = IA.attribute(model, ids, t, method="saliency")
    want = np.linalg.norm(ref["grad"], axis=-1) / c                        # ∂z/∂(c·e) = ∂z/∂e / c
    assert np.abs(sal.scores - want).max() <= 1e-4 * want.max(), name
    diff = IA.attribute(model, ids, t, o, method="grad-x-input")
    want = (ref["embeddings"] * ref["grad_diff"]).sum(-1)
    assert np.abs(diff.scores - want).max() <= 1e-4 * _terms(ref["embeddings"], ref["grad_diff"]), name


@pytest.mark.parametrize("name", ["roberta", "distilbert"])
def test_a_masked_lm_encoder_is_attributed_at_its_mask_token(name):
    """z = the logit of the top token at the first mask token: gradient × input and saliency equal autograd's."""
    ref = dict(np.load(FIXTURES / f"{name}.npz"))
    model = qkv.load(MODELS / name)
    ids, t = ref["input_ids"].tolist(), int(ref["target"])
    a = IA.attribute(model, ids, method="grad-x-input")
    assert a.target == t and f"(position {int(ref['mask_at'])})" in a.what
    c = _scale(model, ref)
    assert np.abs(a.scores - (ref["embeddings"] * ref["grad"]).sum(-1)).max() <= 1e-4 * _terms(ref["embeddings"], ref["grad"])
    sal = IA.attribute(model, ids, t, method="saliency")
    want = np.linalg.norm(ref["grad"], axis=-1) / c
    assert np.abs(sal.scores - want).max() <= 1e-4 * want.max()


def test_an_encoder_without_a_head_is_attributed_by_its_sentence_embedding(monkeypatch):
    """BERT without an LM head: z = cos(mean-pooled final hidden states, a second text's); equal to autograd's,
    and IG's scores sum to z(e) − z(0) (learned positions: the path is smooth)."""
    ref = dict(np.load(FIXTURES / "bert.npz"))
    model = qkv.load(MODELS / "bert")
    compare = ref["compare_ids"]
    monkeypatch.setattr(model, "encode", lambda text, **kw: (compare, None) if text == "COMPARE" else (ref["input_ids"], None))
    a = IA.attribute(model, ref["input_ids"].tolist(), compare="COMPARE")
    assert a.target is None and a.what.startswith("cos(sentence embedding")
    assert np.abs(a.scores - (ref["embeddings"] * ref["grad"]).sum(-1)).max() <= 1e-4 * _terms(ref["embeddings"], ref["grad"])
    ig = IA.attribute(model, ref["input_ids"].tolist(), compare="COMPARE", method="ig", keep_first=False)
    assert ig.completeness <= 0.02, ig.completeness
    with pytest.raises(qkv.QkvError, match="no LM head: give --compare"):
        IA.attribute(model, ref["input_ids"].tolist())


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_an_encoder_decoder_is_attributed_over_its_source_and_target(name):
    """z = the logit of the top next target token after the start token and two more: gradient × input over
    the source's tokens and the target's equals autograd's through each stack's embedding module."""
    ref = dict(np.load(FIXTURES / f"{name}.npz"))
    model = qkv.load(MODELS.parent / "seq2seq" / name)
    a = IA.attribute(model, ref["input_ids"].tolist(), prefix=ref["decoder_ids"][1:].tolist())
    assert a.target == int(ref["target"]) and a.what.endswith("after 3 target tokens")
    n = len(ref["input_ids"])
    assert a.sides == ["source"] * n + ["target"] * 3 and a.ids[n] == int(ref["decoder_ids"][0])
    for side, got in (("source", a.scores[:n]), ("target", a.scores[n:])):
        e, g = ref[f"{side}_embeddings"], ref[f"{side}_grad"]
        assert np.abs(got - (e * g).sum(-1)).max() <= 1e-4 * _terms(e, g), (name, side)


def test_an_encoder_decoders_integrated_gradients_integrate():
    """ko-en-tiny, the decoder's start token kept: 64 nodes sum to z(e) − z(0) within 2 %."""
    model = qkv.load("ko-en-tiny")
    a = IA.attribute(model, "나는 학교에 간다", prefix="I go to", method="ig")
    assert a.target_label == "school" and a.baseline == "zero, start token kept"
    assert a.completeness <= 0.02, a.completeness
    assert a.scores[a.sides.index("target")] == 0                         # the start token, kept


def test_the_default_target_is_the_top_next_token(case):
    name, model, ref = case
    a = IA.attribute(model, ref["input_ids"].tolist(), method="saliency")
    assert a.target == int(ref["target"])


@pytest.mark.parametrize("name", ["gpt2", "gpt_neo"])
def test_integrated_gradients_sum_to_the_logit_gap_where_the_path_is_smooth(name):
    """Learned positions keep the stream away from zero: 64 nodes integrate z(e) − z(0) to within 2 %."""
    model = qkv.load(MODELS / name)
    ids = np.random.default_rng(1).integers(3, model.config.vocab_size, 8).tolist()
    a = IA.attribute(model, ids, method="ig", steps=64, keep_first=False)
    assert a.baseline == "zero" and a.steps == 64
    zeros = np.zeros((1, 8, model.weights.tok_embed.shape[1]), np.float32)
    z0 = IA._z(model, np.asarray(ids)[None], zeros, IA.Output(target=a.target))[0]
    assert a.baseline_logit == pytest.approx(float(z0))
    assert a.completeness <= 0.02, a.completeness
    assert np.isclose(a.scores.sum(), a.logit - a.baseline_logit, rtol=0.02)


def test_integrated_gradients_batches_give_the_same_scores(monkeypatch):
    model = qkv.load(MODELS / "llama_gqa")
    ids = list(range(5, 12))
    whole = IA.attribute(model, ids, method="ig", steps=12, baseline="pad")
    monkeypatch.setattr(IA, "BATCH_TOKENS", len(ids) * 5)                    # 12 nodes in batches of 5, 5, 2
    parts = IA.attribute(model, ids, method="ig", steps=12, baseline="pad")
    assert np.allclose(whole.scores, parts.scores, rtol=1e-4, atol=1e-6 * np.abs(whole.scores).max())
    assert whole.baseline.startswith("pad (token ")


def test_one_node_of_integrated_gradients_is_the_gradient_at_the_midpoint():
    """IG with one Gauss–Legendre node: (e − 0)·∂z/∂e(e/2); checked against gradient × input of the model
    whose token embeddings are halved (the same point), times 2."""
    model = qkv.load(MODELS / "gpt2")
    ids = [5, 9, 14, 3]
    ig = IA.attribute(model, ids, method="ig", steps=1, keep_first=False, tolerance=0)   # the node as asked
    assert ig.steps == 1 and ig.completeness > 0.02 and ig.refinement is None
    rows = model.weights.tok_embed[np.asarray(ids)][None]
    g, _ = IA._gradient(model, np.asarray(ids)[None], rows * np.float32(0.5), IA.Output(target=ig.target))
    assert np.allclose(ig.scores, (rows[0] * g[0]).sum(-1), rtol=1e-5, atol=1e-7)


def test_integrated_gradients_keep_the_first_token_by_default():
    """SmolLM2: with its first token (the attention sink) kept on the path, 64 nodes integrate z(e) − z(0) to
    within 2 % on a short prompt, where moving it too leaves the 64 nodes' sum far off; the first token scores 0."""
    model = qkv.load("smollm2")
    kept = IA.attribute(model, "The capital of France is", method="ig", steps=64)
    assert kept.target_label == "␣Paris" and kept.baseline == "zero, first token kept"
    assert kept.scores[0] == 0 and kept.completeness <= 0.02, kept.completeness
    assert kept.steps == 64 and kept.refinement is None                  # no refinement needed
    moved = IA.attribute(model, "The capital of France is", method="ig", steps=64, keep_first=False, tolerance=0)
    assert moved.completeness > 0.1 and moved.scores[0] != 0
    assert kept.logit == moved.logit


def _held_out_llama(std: float, seed: int):
    """A Llama-shaped decoder no fixture holds, made here: 4 pre-norm blocks of RMSNorm (ε 10⁻⁶), 8 query
    heads sharing 2 K/V heads, RoPE, SwiGLU, an untied W_vocab; matrices N(0, std²) (qkv.init, as
    transformers initialises them with initializer_range std)."""
    config = {"model_type": "llama", "vocab_size": 320, "hidden_size": 64, "num_attention_heads": 8,
              "num_key_value_heads": 2, "intermediate_size": 172, "num_hidden_layers": 4, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 128, "rope_theta": 10000.0, "tie_word_embeddings": False}
    return qkv.init(config, seed=seed, initializer_range=std)


@pytest.mark.parametrize(("std", "seed"), [(0.1, 2), (0.3, 1)])
def test_integrated_gradients_reach_two_percent_on_a_held_out_llama(std, seed):
    """The issue's case, at the defaults (64 nodes, the zero baseline, the first token kept): the 64
    Gauss–Legendre nodes on [0, 1] miss z(e) − z(b) by 4.6 % (std 0.1) and 97 % (std 0.3), since each other
    token's stream starts below its norm's ε and z changes within α ≈ 10⁻⁴ of the start; the default refines
    until ≤ 2 % and says from what to what. Its scores, not only their sum, are those of a ten times tighter
    integral within 1 % of the largest."""
    model = _held_out_llama(std, seed)
    ids = np.random.default_rng(seed).integers(3, 320, 12).tolist()
    a = IA.attribute(model, ids, method="ig")
    assert a.completeness <= 0.02, (a.completeness, a.steps)
    assert a.requested_steps == 64 and a.requested_error > 0.04 and a.steps > 64 and a.tolerance == 0.02
    assert a.refinement == (f"64 steps were {100 * a.requested_error:.2f} % apart, more than the 2 % tolerance: "
                            f"refined adaptively to {a.steps} steps")
    plain = IA.attribute(model, ids, method="ig", tolerance=0)          # the 64 nodes as Captum sums them
    assert plain.steps == 64 and plain.refinement is None
    assert plain.completeness == pytest.approx(a.requested_error, rel=1e-6)
    tight = IA.attribute(model, ids, method="ig", tolerance=0.002)
    assert tight.completeness <= 0.002
    assert np.abs(a.scores - tight.scores).max() <= 0.01 * np.abs(tight.scores).max()


def _sharp_path(delta: float):
    """z(x) = tanh(x₀/δ) + x₁² for points x (b, 2, 1) of two one-number tokens, and its gradient: along the
    path α·e, z's first term rises within α ≈ δ of the start, as a Llama's does below its norms' ε."""
    def value(x):
        return np.tanh(x[:, 0, 0] / delta) + x[:, 1, 0] ** 2                          # (b,)

    def gradient(x):
        g = np.stack([(1 - np.tanh(x[:, 0, 0] / delta) ** 2) / delta, 2 * x[:, 1, 0]], axis=1)   # (b, 2)
        return g[..., None].astype(np.float32), value(x)
    return gradient, value


def test_a_sharp_path_is_refined_to_the_exact_integral():
    """IG of z(x) = tanh(x₀/δ) + x₁² from 0 to e = (1, 0.5), δ = 10⁻⁴: the exact scores are tanh(1/δ) = 1 and
    0.25. 64 nodes on [0, 1] give the first 0.03; the refinement bisects its way to the start and gives it
    within 0.5 %; with too few nodes allowed it says how far it still is."""
    gradient, value = _sharp_path(1e-4)
    rows = np.array([[[1.0], [0.5]]], np.float32)                               # (1, 2, 1)

    def ig(tolerance):
        result = IA.InputAttribution(["a", "b"], [0, 1], np.zeros(2), "ig", 0, None, 0.0)
        IA._scores(result, rows, np.zeros_like(rows), 64, 16, gradient, value, tolerance)
        return result

    plain = ig(None)
    assert plain.steps == 64 and plain.scores[0] < 0.1 and plain.completeness > 0.5
    a = ig(0.02)
    assert a.requested_error == pytest.approx(plain.completeness) and a.steps > 64
    assert np.allclose(a.scores, [1.0, 0.25], atol=5e-3) and a.completeness <= 0.02
    assert "still" not in a.refinement


@pytest.mark.parametrize(("delta", "budget", "end"), [
    (1e-5, 256, "refined adaptively to {steps} steps, still {error:.2f} % apart (256 nodes evaluated at most)"),
    (1e-9, 160, "an adaptive refinement (160 nodes at most) came no closer"),
])
def test_a_refinement_that_runs_out_of_nodes_says_how_far_it_is(monkeypatch, delta, budget, end):
    """Too few nodes allowed for how sharp the path is: the line says how far the sum still is, or that the
    nodes asked for were kept (no closer), never that the tolerance was met."""
    gradient, value = _sharp_path(delta)
    rows = np.array([[[1.0], [0.5]]], np.float32)
    monkeypatch.setattr(quadrature, "REFINE_NODES", budget)
    result = IA.InputAttribution(["a", "b"], [0, 1], np.zeros(2), "ig", 0, None, 0.0)
    IA._scores(result, rows, np.zeros_like(rows), 64, 16, gradient, value, 0.02)
    assert result.completeness > 0.02 and result.completeness <= result.requested_error
    assert result.refinement.startswith(f"64 steps were {100 * result.requested_error:.2f} % apart, more than the 2 % "
                                        "tolerance: ")
    assert result.refinement.endswith(end.format(steps=result.steps, error=100 * result.completeness))


def test_a_text_too_long_for_the_backward_is_refused_before_the_work(monkeypatch):
    model = qkv.load(MODELS / "gpt2")
    monkeypatch.setattr(IA, "TAPE_BYTES", model.config.n_layers * model.config.n_heads * 4 * 10 ** 2)   # 10 tokens
    assert len(IA.attribute(model, list(range(3, 13))).scores) == 10
    with pytest.raises(qkv.QkvError, match=r"attribute at most 10 tokens .* \(shorten the text\)"):
        IA.attribute(model, list(range(3, 14)), method="ig")


def test_a_stored_model_is_attributed_in_float32(tmp_path):
    """SmolLM2 (the GGUF file kept as its blocks): the gradient runs on a float32 copy, and gradient × input of
    the stored model is the float32 model's."""
    stored = qkv.load("smollm2")
    text = "The capital of France is"
    a = IA.attribute(stored, text, " Paris")
    b = IA.attribute(qkv.load("smollm2", dtype="float32"), text, " Paris")
    assert a.target_label == "␣Paris" and a.tokens[:2] == ["The", "␣capital"]
    assert np.allclose(a.scores, b.scores, rtol=1e-4, atol=1e-5 * np.abs(b.scores).max())


# ── the command ──────────────────────────────────────────────────────────────────

def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_attribute_json_and_files(tmp_path):
    out = tmp_path / "attr"
    r = run("attribute", "the cat sat on", "--model", str(MODELS / "gpt2"), "--method", "ig", "--steps", "16",
            "--json", "--out", str(out))
    assert r.exit_code == 0, r.output
    data = json.loads(r.output.splitlines()[0])
    assert set(data) >= {"tokens", "scores", "target", "logit", "baseline_logit", "method", "steps", "completeness_error",
                         "requested_steps", "requested_completeness_error", "tolerance"}
    assert len(data["tokens"]) == len(data["scores"]) and data["method"] == "ig" and data["steps"] == 16
    assert sorted(p.name for p in out.iterdir()) == ["attribute.html", "attribute.json", "attribute.png", "attribute.svg"]
    assert json.loads((out / "attribute.json").read_text())["scores"] == data["scores"]


def test_attribute_says_when_integrated_gradients_were_refined():
    """One node misses z(e) − z(b) by far: the table says so in one line and the refined steps; --tolerance 0
    keeps the one node."""
    args = ("attribute", "the cat sat on", "--model", str(MODELS / "gpt2"), "--method", "ig", "--steps", "1")
    r = run(*args)
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[-1].startswith("1 step was ") and "more than the 2 % tolerance: refined adaptively to " in lines[-1]
    steps = int(lines[-1].split("refined adaptively to ")[1].split()[0])
    assert steps > 1 and f"{steps} steps: " in lines[-2] and "still" not in lines[-1]
    r = run(*args, "--tolerance", "0")
    assert r.exit_code == 0 and "refined" not in r.output and "1 steps: " in r.output.splitlines()[-1], r.output


def test_attribute_an_encoders_similarity_from_the_command_line(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "attribute", "The cat sat on the mat.", "--model", "minilm",
                              "--compare", "A kitten rested on a rug.", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["target"] is None and data["tokens"][0] == "[CLS]" and 0 < data["logit"] < 1
    assert data["output"] == "cos(sentence embedding, 'A kitten rested on a rug.''s)"


def test_attribute_table_and_a_logit_difference():
    model = qkv.load(MODELS / "gpt2")
    a, b = model.tokenizer.label(5), model.tokenizer.label(9)
    text_a, text_b = model.tokenizer.decode([5]), model.tokenizer.decode([9])
    r = run("attribute", "the cat sat on", "--model", str(MODELS / "gpt2"), "--token", text_a, "--other", text_b)
    assert r.exit_code == 0, r.output
    assert f"logit({a}) − logit({b})" in r.output and "score" in r.output
    want = IA.attribute(model, "the cat sat on", text_a, text_b)
    assert f"{want.scores[0]:+.4f}" in r.output


@pytest.mark.parametrize(("args", "message"), [
    (["--token", "catcatcat dog"], "not one"),
    (["--other", "the"], "--other needs --token"),
    (["--token", "t", "--other", "t"], "the same token"),
    (["--steps", "0"], "0"),
    (["--method", "ig", "--tolerance", "1"], "--tolerance"),
    (["--method", "ig", "--tolerance", "-0.1"], "--tolerance"),
    (["--method", "lime"], "lime"),
    (["--baseline", "mean"], "mean"),
    (["--model", "minilm"], "give --compare TEXT"),
    (["--model", "minilm", "--compare", "a dog", "--token", "t"], "leave out --token"),
    (["--compare", "a dog"], "--compare is for encoders"),
    (["--model", str(MODELS / "roberta")], "put its mask token"),
    (["--model", "ko-en-tiny", "--compare", "a"], "--compare is for encoders"),
    (["--prefix", "the"], "--prefix is for an encoder–decoder"),
])
def test_attribute_refuses_bad_input_in_one_line(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "attribute", "the cat sat on", "--model", str(MODELS / "gpt2"), *args)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 4, err
