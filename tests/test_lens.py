"""The logit lens (qkv.analysis.logit_lens) and `qkv lens`.

Identity that can fail: row L of the lens (the last block's output, rebuilt from the kept
residual stream, through the final norm and W_vocab) equals the model's own logits,
`model.forward(ids).logits[0]`, within 1e-4 max-abs, on SmolLM2 and the GPT-2 / Llama /
Qwen2 / Mistral fixtures. Row 0 is the embeddings read through the same head.
Against transformers' hidden_states: tests/live/test_live_lens.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import DECODER_FIXTURES, MODELS, max_abs, run_main
from qkv.analysis import logit_lens
from qkv.analysis.lens import KEEP, final_prediction, lens_of_trace, residual_stream
from qkv.core.blocks import logits_of, norm
from qkv.runtime.errors import QkvError

TOL = 1e-4             # max abs, logits


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_last_row_equals_the_logits_on_fixtures(name):
    model = qkv.load(MODELS / name)
    ids = np.random.default_rng(7).integers(0, model.config.vocab_size, 11)
    lens = logit_lens(model, ids.tolist())
    L, V = model.config.n_layers, model.config.vocab_size
    assert lens.shape == (L + 1, 11, V)
    assert max_abs(lens[-1], model.forward(ids[None]).logits[0]) <= TOL


def test_last_row_equals_the_logits_on_smollm2(smollm2):
    text = "The capital of France is"
    lens = logit_lens(smollm2, text)
    ids, _ = smollm2.encode(text)
    assert lens.shape == (31, len(ids), 49152)
    assert max_abs(lens[-1], smollm2.forward(ids[None]).logits[0]) <= TOL
    assert smollm2.tokenizer.label(int(lens[-1, -1].argmax())) == "␣Paris"


def test_row_zero_reads_the_embeddings(smollm2):
    """Row 0 is the embeddings (the first block's input) through the final norm and W_vocab."""
    ids, _ = smollm2.encode("Hello world")
    trace = smollm2.run(ids.tolist(), keep=KEEP)
    x = smollm2.weights.tok_embed[ids]                                     # (n, d_model), no positions: RoPE
    assert np.array_equal(residual_stream(smollm2, trace)[0], x)
    expected = logits_of(norm(x, smollm2.weights.final_norm, smollm2.config), smollm2.weights, smollm2.config)
    assert max_abs(lens_of_trace(smollm2, trace)[0], expected) <= TOL


def test_a_middle_row_is_that_blocks_input(smollm2):
    trace = smollm2.run("One two three", keep=KEEP)
    assert np.array_equal(residual_stream(smollm2, trace)[7], trace.layers[7].residual)


def test_final_prediction_is_the_softmax_of_each_row():
    lens = np.random.default_rng(0).normal(size=(4, 3, 10)).astype(np.float32) * 5
    ids, probs = final_prediction(lens)
    assert np.array_equal(ids, lens[-1].argmax(-1))
    z = lens.astype(np.float64)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    assert np.allclose(probs, np.take_along_axis(p, ids[None, :, None], -1)[..., 0], atol=1e-12)


def test_an_encoder_without_an_lm_head_says_so(minilm):
    with pytest.raises(QkvError, match="no LM head"):
        logit_lens(minilm, "The cat sat.")


def test_a_trace_without_the_residual_stream_says_so(smollm2):
    with pytest.raises(QkvError, match="residual"):
        lens_of_trace(smollm2, smollm2.run("Hi there", keep=("attentions",)))


def test_cli_prints_every_layer_and_writes_the_map(monkeypatch, capsys, tmp_path):
    out = tmp_path / "lens"
    code, stdout, err = run_main(monkeypatch, capsys, "lens", "The capital of France is", "--top", "2",
                                 "--out", str(out))
    assert code == 0, err
    assert "final prediction ␣Paris" in stdout
    rows = [line for line in stdout.splitlines() if line.strip().startswith(("emb", "30 "))]
    assert len(rows) == 2 and "␣Paris" in rows[1]
    assert sorted(p.name for p in out.iterdir()) == ["lens.html", "lens.png", "lens.svg"]
    assert (out / "lens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (("lens", "The cat", "--model", "minilm"), "no LM head"),
    (("lens", ""), "empty"),
])
def test_cli_mistakes_are_one_line(monkeypatch, capsys, args, message):
    code, stdout, err = run_main(monkeypatch, capsys, *args)
    assert code == 2 and err.startswith("qkv: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_top_out_of_range_is_a_usage_error(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "lens", "Hi", "--top", "0")
    assert code == 2 and "'--top'" in err and "Traceback" not in err


def test_cli_unwritable_out_fails_before_the_work(monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, stdout, err = run_main(monkeypatch, capsys, "lens", "Hi", "--out", str(blocker / "sub"))
    assert code == 2 and err.startswith("qkv: error: cannot write") and stdout == ""
