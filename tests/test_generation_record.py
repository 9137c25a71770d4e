"""A recorded generation (writing.generate.Recording): its trace equals a pass over the whole text, it
writes exactly what an unrecorded generation writes, and it feeds only what no step has read."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.runtime.errors import QkvError
from qkv.writing.generate import Recording, TextStream, decode
from conftest import DECODER_FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, Spy, max_abs, reference


def load(name):
    return qkv.load(MODELS / name)


def recorded(model, prompt: np.ndarray, new: int, **sampling) -> tuple[Recording, list[int]]:
    record = Recording()
    steps = decode(model, prompt[None], np.ones((1, len(prompt)), np.int64), new, record=record,
                   stop_at_eos=False, **sampling)
    return record, [int(s.ids[0]) for s in steps]


def same_as_a_pass(model, trace, ids: np.ndarray) -> None:
    ref = model.run(ids, keep=("attentions",))
    assert trace.ids.tolist() == ids.tolist() and trace.tokens == ref.tokens
    assert max_abs(trace.attentions, ref.attentions) <= TOL_ATTENTION
    assert max_abs(trace.logits, ref.logits) <= TOL_HIDDEN and max_abs(trace.hidden, ref.hidden) <= TOL_HIDDEN
    assert (trace.model, trace.family, trace.causal, trace.spelling) == (ref.model, ref.family, ref.causal, ref.spelling)


# phi3: the prompt and reply pass original_max_position_embeddings (12), so the recording also follows the step
# that reads the whole sequence again with LongRoPE's long table (tests/test_cache.py)
@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_the_recorded_trace_equals_one_pass_over_prompt_and_reply(name):
    model = load(name)
    prompt = reference(name)["single_input_ids"][0, :6]
    record, new = recorded(model, prompt, 7, temperature=0)
    ids = np.concatenate([prompt, new])
    assert record.ids == ids[:-1].tolist()                                 # the last token: written, not read
    trace = record.trace(model, ids, len(prompt))
    assert record.ids == ids.tolist() and trace.prompt_length == len(prompt)   # it was fed, in one step
    same_as_a_pass(model, trace, ids)
    assert not trace.attentions.flags.writeable                           # the layers' rows, not a copy


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "mistral"])
def test_recording_writes_exactly_what_an_unrecorded_generation_writes(name):
    """A prompt past causal_attention's blocks (64 rows): the prefill keeps its unrecorded route and the
    weights are computed beside it, so every logit is the same to the bit, and so is every sampled token."""
    model = load(name)
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, 90)
    spy = Spy(model)
    plain = [int(s.ids[0]) for s in decode(spy, prompt[None], np.ones((1, 90), np.int64), 12, temperature=1.0,
                                           seed=5, stop_at_eos=False)]
    record, new = recorded(model, prompt, 12, temperature=1.0, seed=5)
    assert new == plain
    assert len(record.ends) == len(spy.seen) == 12
    assert all(np.array_equal(record.logits[t], z[0]) for t, z in zip(record.ends, spy.seen))   # row 0 of (1, V)
    same_as_a_pass(model, record.trace(model, np.concatenate([prompt, new]), 90), np.concatenate([prompt, new]))


def test_a_stream_fed_what_it_wrote_or_stopped_inside_it_gives_the_text_it_kept():
    model = load("gpt2")
    sampled = dict(temperature=1.0, seed=2, stop_at_eos=False)             # "ouvergec": 8 different tokens
    greedy = TextStream(model, "the cat sat on the", 8, **sampled)
    "".join(greedy)
    third = greedy.new_ids[2]
    stopped = TextStream(model, "the cat sat on the", 8, stop=third, record=True, **sampled)   # a stop token
    "".join(stopped)
    assert stopped.new_ids == greedy.new_ids[:2] and len(stopped.recording.ids) == len(stopped.prompt_ids) + 2
    ids = np.concatenate([stopped.prompt_ids, stopped.new_ids])
    trace = stopped.trace()
    assert len(stopped.recording.attentions) == 3                          # the prompt and two steps: nothing fed
    same_as_a_pass(model, trace, ids)
    text = model.tokenizer.decode(greedy.new_ids[:4])
    cut = TextStream(model, "the cat sat on the", 8, stop=text[-2:], record=True, **sampled)
    "".join(cut)                                                           # a stop string ends inside token 4
    assert len(cut.new_ids) == 4
    trace = cut.trace()
    same_as_a_pass(model, trace, np.concatenate([cut.prompt_ids, cut.new_ids]))
    again = cut.trace()                                                    # a second trace feeds nothing more
    assert np.array_equal(again.attentions, trace.attentions) and len(cut.recording.ids) == len(trace.ids)


def test_what_a_recording_cannot_follow_is_one_clear_error():
    model = load("gpt2")
    two = np.array([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(QkvError, match="batch of one"):
        list(decode(model, two, np.ones_like(two), 2, record=Recording()))
    with pytest.raises(QkvError, match="use_cache=True"):
        list(decode(model, two[:1], np.ones((1, 3), np.int64), 2, record=Recording(), use_cache=False))
    record, new = recorded(model, np.array([5, 6, 7]), 3, temperature=0)
    with pytest.raises(QkvError, match="another text"):
        record.trace(model, np.array([5, 6, 8, *new]), 3)
    slow = TextStream(model, "the cat", 3, temperature=0, use_cache=False, record=True)   # nothing to record
    "".join(slow)                                                          # into: a trace is a pass, as before
    assert slow.recording is None
    same_as_a_pass(model, slow.trace(), np.concatenate([slow.prompt_ids, slow.new_ids]))


def test_a_trace_keeping_more_than_attention_takes_a_pass():
    model = load("gpt2")
    stream = TextStream(model, "the cat", 3, temperature=0, record=True)
    "".join(stream)
    trace = stream.trace(("attentions", "residual"))
    assert trace.layers[0].residual is not None and trace.prompt_length == len(stream.prompt_ids)
