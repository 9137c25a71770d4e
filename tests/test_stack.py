"""The one stack runner (qkv.core.stack.run_stack): every kind of model's pass goes through it.

A spy wraps `run_stack` and notes the stack of each call (None: a single stack; "encoder", "decoder"); the
passes of a decoder, an encoder, an image model, an encoder–decoder and Whisper, their writing, activation
patching's rerun (a stream from a block on) and both backwards' taped passes are then seen going through it.
What each kind computes is checked against transformers in tests/test_family_*.py, test_seq2seq*.py,
test_vit.py and test_whisper.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.core import stack

from conftest import FIXTURES, MODELS, reference


class RunnerSpy:
    """run_stack, with each call's stack (None, "encoder" or "decoder") and its start block noted."""

    def __init__(self, run):
        self.run, self.calls = run, []

    def __call__(self, weights, ctx, **kw):
        self.calls.append((kw.get("stack"), kw.get("start", 0), kw.get("stream") is not None))
        return self.run(weights, ctx, **kw)

    @property
    def stacks(self) -> list[str | None]:
        return [s for s, _, _ in self.calls]


@pytest.fixture
def spy(monkeypatch):
    runner = RunnerSpy(stack.run_stack)
    monkeypatch.setattr(stack, "run_stack", runner)
    return runner


def _decoder():
    model = qkv.load(MODELS / "llama_gqa")
    return model, lambda m: m.forward(reference("llama_gqa")["input_ids"]).logits


def _encoder():
    model = qkv.load(MODELS / "bert")
    return model, lambda m: m.forward(reference("bert")["input_ids"]).hidden


def _image():
    model = qkv.load(MODELS / "vit")
    return model, lambda m: m.forward(reference("vit")["pixel_values"]).logits


def _encoder_decoder():
    model = qkv.load(FIXTURES / "seq2seq" / "marian")
    ids = np.arange(3, 9)[None]
    return model, lambda m: m.forward(ids, decoder_input_ids=[[m.start_token, 4, 5]]).logits


def _audio():
    model = qkv.load(MODELS / "whisper")
    c = model.config
    features = np.random.default_rng(0).standard_normal((1, c.audio_mels, 2 * c.source_positions)).astype(np.float32)
    return model, lambda m: m.forward(features, decoder_input_ids=[[m.start_token, 4]]).logits


@pytest.mark.parametrize("kind, make, stacks", [
    ("decoder", _decoder, [None]),
    ("encoder", _encoder, [None]),
    ("image", _image, [None]),
    ("encoder-decoder", _encoder_decoder, ["encoder", "decoder"]),
    ("audio", _audio, ["encoder", "decoder"]),
])
def test_every_kind_runs_through_the_one_runner(spy, kind, make, stacks):
    model, forward = make()
    assert np.isfinite(forward(model)).all()
    assert spy.stacks == stacks, kind


def test_writing_and_patching_run_through_it(spy):
    decoder = qkv.load(MODELS / "llama_gqa")
    ids = reference("llama_gqa")["input_ids"][:1]
    decoder.generate(ids, 3, temperature=0)
    assert len(spy.calls) >= 3 and set(spy.stacks) == {None}                 # the prompt, then a step per token
    spy.calls.clear()
    x = np.zeros((1, 4, decoder.config.d_model), np.float32)
    decoder.from_layer(x, 1)
    assert spy.calls == [(None, 1, True)]                                    # patching: a stream from block 1 on
    spy.calls.clear()
    translator = qkv.load(FIXTURES / "seq2seq" / "marian")
    translator.generate(np.arange(3, 9)[None], 3, temperature=0)
    assert spy.stacks[0] == "encoder" and set(spy.stacks[1:]) == {"decoder"} and len(spy.stacks) >= 3


def test_both_backwards_tape_through_it(spy):
    from qkv.core import backward, seq2seq_backward

    decoder = qkv.load(MODELS / "gpt2")
    ids = reference("gpt2")["input_ids"][:1]
    backward.taped(decoder.weights, decoder.config, ids, np.ones_like(ids))
    assert spy.stacks == [None]
    spy.calls.clear()
    m = qkv.load(FIXTURES / "seq2seq" / "t5")
    src = np.arange(3, 9)[None]
    seq2seq_backward.taped(m.weights, m.config, src, np.ones_like(src), np.array([[m.start_token, 4, 5]]))
    assert spy.stacks == ["encoder", "decoder"]
