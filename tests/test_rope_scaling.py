"""YaRN and dynamic-NTK RoPE (core.positions) against transformers' fixtures and exact identities.

llama_yarn (YaRN, factor 4 over an original 32 positions, θ 100: pairs 0–3 on the ramp) is compared with the
other families in tests/test_families.py, test_generate.py, ... . qwen2_dynamic (dynamic NTK, factor 2,
max_position_embeddings 17) is too, inside its first 17 positions; past them (its greedy steps, a 30-token pass)
transformers turns each new query and key with the base of the pass's length and keeps the cached keys as they
were turned, so its cached writing differs from its writing without the cache: qkv equals each way.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.positions import resolve_rope, rope_attention_factor, rope_inv_freq
from qkv.writing.generate import decode
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, Spy, max_abs, reference


def writing(model, ids: np.ndarray, use_cache: bool) -> tuple[list[int], np.ndarray]:
    """Greedy ids (8 new) and the logits each was chosen from (8, 1, V)."""
    spy = Spy(model)
    steps = [int(s.ids[0]) for s in decode(spy, ids, np.ones_like(ids), 8, temperature=0, stop_at_eos=False,
                                           use_cache=use_cache)]
    return steps, np.stack(spy.seen)


@pytest.mark.parametrize("use_cache, suffix", [(True, ""), (False, "_no_cache")])
def test_dynamic_writes_as_transformers_with_and_without_the_cache(use_cache, suffix):
    ref = reference("qwen2_dynamic")
    model = qkv.load(MODELS / "qwen2_dynamic")
    ids, z = writing(model, ref["single_input_ids"], use_cache)
    assert ids == ref[f"greedy_ids{suffix}"][0, 17:].tolist()
    assert max_abs(z, ref[f"greedy_logits{suffix}"]) <= TOL_HIDDEN
    assert max_abs(ref["greedy_logits"][-1], ref["greedy_logits_no_cache"][-1]) > 1e-3   # the two ways differ


def test_dynamic_cache_keeps_its_keys_as_turned():
    """Past max_position_embeddings each step's speeds differ from the cached keys' and the cache is not read
    again (LongRoPE's is): the cached step's logits equal transformers' cached ones above, not a full pass."""
    model = qkv.load(MODELS / "qwen2_dynamic")
    ids = reference("qwen2_dynamic")["single_input_ids"]
    from qkv.core.cache import KVCache
    cache = KVCache(model.config, 1, 20)
    model.last_logits(ids, np.ones((1, 17), np.int64), cache=cache)
    step = model.last_logits(ids[:, :1], np.ones((1, 18), np.int64), cache=cache)[0, -1]
    full = model.forward(np.concatenate([ids, ids[:, :1]], axis=1), attentions=False).logits[0, -1]
    assert cache.rereads == 0 and cache.length == 18
    assert max_abs(step, full) > 1e-4


def test_dynamic_long_pass_equals_transformers():
    ref = reference("qwen2_dynamic")
    out = qkv.load(MODELS / "qwen2_dynamic").forward(ref["long_input_ids"])
    assert max_abs(out.logits, ref["long_logits"]) <= TOL_HIDDEN
    assert max_abs(out.attentions, ref["long_attentions"]) <= TOL_ATTENTION


def test_dynamic_context_is_factor_times_max_positions():
    model = qkv.load(MODELS / "qwen2_dynamic")
    assert model.config.max_positions == 17 and model.config.context == 34
    with pytest.raises(QkvError, match="at most 34"):
        model.forward(np.arange(3, 38)[None])


def test_dynamic_base_grows_only_past_max_positions():
    """θ' = θ·(f·n/N − (f − 1))^(d/(d−2)) for n > N; the plain speeds up to N."""
    scaling = resolve_rope({"rope_type": "dynamic", "factor": 2.0}, 17)
    plain = rope_inv_freq(16, 1e4, None, np.float64)
    for n in (None, 5, 17):
        np.testing.assert_array_equal(rope_inv_freq(16, 1e4, scaling, np.float64, length=n), plain)
    base = 1e4 * (2 * 30 / 17 - 1) ** (16 / 14)
    want = 1 / base ** (np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(rope_inv_freq(16, 1e4, scaling, np.float64, length=30), want, rtol=1e-12)


def test_yarn_numbers_filled_in_as_transformers():
    s = qkv.load(MODELS / "llama_yarn").config.rope_scaling
    assert (s["factor"], s["original_max_position_embeddings"], s["beta_fast"], s["beta_slow"], s["truncate"]) == \
        (4.0, 32, 32, 1, True)
    assert rope_attention_factor(s) == pytest.approx(0.1 * math.log(4.0) + 1)
    both = resolve_rope({"rope_type": "yarn", "factor": 4.0, "mscale": 0.5, "mscale_all_dim": 1.0}, 64)
    assert both["original_max_position_embeddings"] == 64
    assert both["attention_factor"] == pytest.approx((0.05 * math.log(4) + 1) / (0.1 * math.log(4) + 1))
    assert resolve_rope({"rope_type": "yarn", "original_max_position_embeddings": 16}, 64)["factor"] == 4.0


def test_yarn_speeds_between_plain_and_interpolated():
    """ω_i = plain for the pairs before the ramp, plain/factor after it, in between on it; factor 1 = plain."""
    s = resolve_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, 128)
    plain = rope_inv_freq(16, 100.0, None, np.float64)
    yarn = rope_inv_freq(16, 100.0, s, np.float64)
    lo, hi = 0, math.ceil(16 * math.log(32 / (2 * math.pi)) / (2 * math.log(100.0)))     # the ramp: pairs 0..3
    ramp = np.clip((np.arange(8) - lo) / (hi - lo), 0, 1)
    np.testing.assert_allclose(yarn, plain / 4 * ramp + plain * (1 - ramp), rtol=1e-12)
    assert yarn[0] == plain[0] and np.allclose(yarn[hi:], plain[hi:] / 4)
    one = resolve_rope({"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 32}, 128)
    np.testing.assert_allclose(rope_inv_freq(16, 100.0, one, np.float64), plain, rtol=1e-15)
    assert rope_attention_factor(one) == 1.0


@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 4}, "beta_fast ≥ beta_slow"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, "truncate must be true or false"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": "big", "mscale_all_dim": 1.0}, "mscale must be a finite number"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": -1.0}, "attention_factor"),
    ({"rope_type": "dynamic"}, "dynamic needs factor"),
    ({"rope_type": "dynamic", "factor": 1e9}, "factor=1000000000.0 must be from"),
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, "supported: default, linear, dynamic, yarn"),
])
def test_bad_knobs_are_one_line(rope, message, tmp_path):
    shutil.copytree(MODELS / "llama_yarn", tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    hf = json.loads(path.read_text())
    hf["rope_parameters"] = {"rope_theta": 100.0, "original_max_position_embeddings": 32, **rope}
    path.write_text(json.dumps(hf))
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(tmp_path / "m")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["llama_yarn", "qwen2_dynamic"])
def test_saved_scaling_reads_back(name, tmp_path):
    model = qkv.load(MODELS / name)
    back = qkv.load(model.save(tmp_path / "out"))
    assert back.config.rope_scaling == model.config.rope_scaling
    ids = reference(name)["single_input_ids"]
    assert max_abs(back.forward(ids).logits, model.forward(ids).logits) == 0


def test_the_lessons_turn_with_yarns_attention_factor():
    """The walkthrough and the positions lesson recompute q, k with YaRN's speeds and cos, sin × its factor."""
    from qkv.lessons import positions
    from qkv.lessons.attention import walkthrough
    model = qkv.load(MODELS / "llama_yarn")
    assert walkthrough(model, "The cat sat on the mat", layer=1).rope.diff < 1e-4
    assert positions.build(model, "The cat sat on the mat").rope.diff_trace < 1e-4
