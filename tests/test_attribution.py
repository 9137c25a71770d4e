"""Direct logit attribution (qkv.analysis.direct_logit_attribution) and `qkv dla`.

Identities that can fail, float32 models, tolerance 1e-4 max abs (logits):
- heads + FFNs + the other terms (embeddings, b_O, b_out, final norm β, b_vocab) sum to the
  model's own logit, `model.forward(ids).logits[0, position, target]` (or the difference
  target − other), on SmolLM2 (RMSNorm) and the GPT-2 (LayerNorm, biases) / Llama GQA / MQA /
  Mistral / Qwen2 fixtures;
- one layer's heads plus its b_O term equal that layer's recorded attn_out read through the
  frozen final norm (Norm with s fixed, computed here directly from the norm's formula).
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import DECODER_FIXTURES, MODELS, run_main
from qkv.analysis import direct_logit_attribution
from qkv.analysis.attribution import KEEP, attribution_of_trace, token_id
from qkv.runtime.errors import QkvError

TOL = 1e-4             # max abs, logits
IOI = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


def _frozen_read(model, piece: np.ndarray, x: np.ndarray, w: np.ndarray) -> float:
    """piece through the final norm with the scale of the full residual x, then ·w (float64)."""
    cfg, fn = model.config, model.weights.final_norm
    x, piece = x.astype(np.float64), piece.astype(np.float64)
    if cfg.norm == "rms":
        y = piece / np.sqrt(np.mean(x * x) + cfg.norm_eps)
    else:
        y = (piece - piece.mean()) / np.sqrt(np.var(x) + cfg.norm_eps)
    return float((y * fn.weight) @ w)


@pytest.mark.parametrize("name", [n for n in DECODER_FIXTURES
                                  if n not in ("olmo2", "olmo3", "opt", "gemma2", "gemma3_text", "glm4", "exaone4")])
# OLMo 2/3, GLM-4, EXAONE 4 (output norms), OPT-350m (post-LN): refused; Gemma 2/3 (output norms, soft-capped logits):
# test_family_layers.py
@pytest.mark.parametrize("position", [-1, 4])
def test_the_parts_sum_to_the_logit_on_fixtures(name, position):
    model = qkv.load(MODELS / name)
    ids = np.random.default_rng(7).integers(0, model.config.vocab_size, 11)
    logits = model.forward(ids[None]).logits[0, position]                  # (V,)
    one = direct_logit_attribution(model, ids.tolist(), 5, position=position)
    two = direct_logit_attribution(model, ids.tolist(), 5, 9, position=position)
    L, H = model.config.n_layers, model.config.n_heads
    assert one.heads.shape == (L, H) and one.ffns.shape == (L,)
    assert abs(one.total() - float(logits[5])) <= TOL
    assert abs(two.total() - float(logits[5] - logits[9])) <= TOL
    assert abs(one.logit - float(logits[5])) <= TOL


def test_gpt2_reports_its_biases():
    """GPT-2 has b_O, b_out and a LayerNorm β: each is a term of its own, not hidden in a head."""
    a = direct_logit_attribution(qkv.load(MODELS / "gpt2"), [3, 1, 4, 1, 5, 9], 7)
    for term in ("attention biases b_O", "FFN biases b_out", "final norm bias β"):
        assert a.rest[term] != 0.0


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_a_layers_heads_are_its_attention_output(name):
    model = qkv.load(MODELS / name)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    trace = model.run(ids, keep=KEEP)
    a = attribution_of_trace(model, trace, 7)
    last = trace.layers[model.config.n_layers - 1]
    x = (last.residual[-1] + last.attn_out[-1]) + last.ffn_out[-1]          # (d_model,) the last block's output
    w = model.weights.W_vocab[:, 7].astype(np.float64)
    b_O = model.weights.blocks[0].attn.b_O
    bias = 0.0 if b_O is None else _frozen_read(model, b_O, x, w)
    expected = _frozen_read(model, trace.layers[0].attn_out[-1], x, w)
    assert abs(a.heads[0].sum() + bias - expected) <= TOL


def test_the_parts_sum_to_the_logit_on_smollm2(smollm2):
    ids, _ = smollm2.encode(IOI)
    logits = smollm2.forward(ids[None]).logits[0, -1]
    mary, john = token_id(smollm2, " Mary"), token_id(smollm2, " John")
    a = direct_logit_attribution(smollm2, IOI, " Mary", " John")
    assert a.heads.shape == (30, 9)
    assert abs(a.total() - float(logits[mary] - logits[john])) <= TOL
    assert a.logit > 0                                                     # the model prefers " Mary"
    b = direct_logit_attribution(smollm2, IOI, mary)
    assert abs(b.total() - float(logits[mary])) <= TOL


def test_a_target_of_several_tokens_says_how_it_tokenizes(smollm2):
    with pytest.raises(QkvError, match=r"2 tokens .*' Mary' \+ ' Jane'"):
        direct_logit_attribution(smollm2, IOI, " Mary Jane")


def test_an_encoder_without_an_lm_head_says_so(minilm):
    with pytest.raises(QkvError, match="no LM head"):
        direct_logit_attribution(minilm, "The cat sat.", 5)


def test_cli_prints_the_top_heads_and_writes_the_map(monkeypatch, capsys, tmp_path):
    out = tmp_path / "dla"
    code, stdout, err = run_main(monkeypatch, capsys, "dla", IOI, "--token", " Mary", "--other", " John",
                                 "--top", "3", "--out", str(out))
    assert code == 0, err
    assert "logit(␣Mary) − logit(␣John)" in stdout
    assert sum(1 for line in stdout.splitlines() if ".H" in line) == 3
    assert sorted(p.name for p in out.iterdir()) == ["dla.png", "dla.svg"]
    assert (out / "dla.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (("dla", "The cat", "--model", "minilm", "--token", " x"), "no LM head"),
    (("dla", IOI, "--token", " Mary Jane"), "2 tokens"),
    (("dla", "", "--token", " Mary"), "empty"),
])
def test_cli_mistakes_are_one_line(monkeypatch, capsys, args, message):
    code, stdout, err = run_main(monkeypatch, capsys, *args)
    assert code == 2 and err.startswith("qkv: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_dla_refuses_a_model_that_normalises_each_boxs_output():
    """OLMo 2 normalises attention's and the FFN's outputs before they join the stream: no linear parts."""
    import qkv
    from qkv import QkvError
    from qkv.analysis.attribution import KEEP, attribution_of_trace

    from conftest import MODELS

    model = qkv.load(MODELS / "olmo2")
    with pytest.raises(QkvError, match="normalises each attention and FFN output"):
        attribution_of_trace(model, model.run("the cat sat", keep=KEEP), 5)
