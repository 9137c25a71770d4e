"""Helpers for the live cross-checks: random checkpoints made on the fly with transformers.

Every checkpoint is built from a seeded config, every parameter is perturbed with small
noise (so no bias is 0 and no norm weight is 1), saved with `save_pretrained` as
safetensors, loaded back by qkv, and run on a padded batch next to the same model in
transformers (eager attention, eval mode).
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch  # module-level imports: without the reference stack these tests fail, never skip
import transformers
from transformers.utils import logging as hf_logging

import qkv

hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()
torch.set_num_threads(min(2, os.cpu_count() or 1))

# Tolerances against transformers, as the project promises (max abs, valid positions only).
TOL_HIDDEN = 1e-4        # hidden states and logits, float32
TOL_ATTENTION = 1e-5     # attention weights, float32
TOL_HIDDEN_F64 = 1e-9    # float64 end to end
TOL_ATTENTION_F64 = 1e-10

INIT_RANGE = 0.15        # larger than HF's 0.02 so attention is far from uniform
NOISE = 0.02             # added to every parameter

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Add N(0, NOISE²) to every parameter (biases leave 0, norm weights leave 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * NOISE)


def build(cls, config, seed: int, **init_kwargs) -> torch.nn.Module:
    """A seeded, perturbed float32 model in eval mode with eager attention."""
    torch.manual_seed(seed)
    model = cls(config, **init_kwargs)
    perturb_(model, seed + 1)
    model = model.to(torch.float32).eval()
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    return model


def save(model: torch.nn.Module, directory: Path, dtype: str = "float32", **kwargs) -> Path:
    """save_pretrained (safetensors) in `dtype`, without touching `model`; returns the directory.

    transformers 5 always writes safetensors (safe_serialization is accepted and ignored);
    4.x honours it. Either way the directory must hold no pickle weights.
    """
    to_save = model if dtype == "float32" else copy.deepcopy(model).to(TORCH_DTYPES[dtype])
    to_save.save_pretrained(directory, safe_serialization=True, **kwargs)
    files = {p.name for p in Path(directory).iterdir()}
    assert "config.json" in files
    assert "model.safetensors" in files or "model.safetensors.index.json" in files, files
    assert not any(f.endswith((".bin", ".pt")) for f in files), files
    return Path(directory)


def padded_batch(vocab_size: int, lengths: list[int], seed: int, *, low: int = 3, side: str = "right",
                 pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(B, n) random ids in [low, vocab_size), n = max(lengths); padded on `side` with pad_id / mask 0."""
    gen = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(low, vocab_size, (len(lengths), n), generator=gen, dtype=torch.int64).numpy()
    mask = np.zeros_like(ids)
    for r, k in enumerate(lengths):
        sl = slice(0, k) if side == "right" else slice(n - k, n)
        mask[r, sl] = 1
    ids[mask == 0] = pad_id
    return ids, mask


def decoder_positions(mask: np.ndarray) -> np.ndarray:
    """Positions over real tokens, as qkv counts them: cumsum(mask) - 1, clipped at 0."""
    return np.clip(np.cumsum(mask, axis=-1) - 1, 0, None)


@dataclass
class Ref:
    hidden: np.ndarray                    # (B, n, d) last hidden state (after the final norm)
    attentions: np.ndarray                # (L, B, H, n, n)
    logits: np.ndarray | None = None      # (B, n, V)


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def run_reference(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray, *, token_type_ids=None,
                  position_ids=None) -> Ref:
    """The transformers model on a batch: last hidden state, attention weights, logits if any."""
    kwargs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                  output_hidden_states=True, output_attentions=True)
    if token_type_ids is not None:
        kwargs["token_type_ids"] = torch.from_numpy(token_type_ids)
    if position_ids is not None:
        kwargs["position_ids"] = torch.from_numpy(position_ids)
    with torch.no_grad():
        out = model(**kwargs)
    logits = getattr(out, "logits", None)
    return Ref(hidden=to_np(out.hidden_states[-1]), attentions=np.stack([to_np(a) for a in out.attentions]),
               logits=None if logits is None else to_np(logits))


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def compare(out: qkv.Output, ref: Ref, mask: np.ndarray, *, tol_hidden: float = TOL_HIDDEN,
            tol_attention: float = TOL_ATTENTION, logits: np.ndarray | None | str = "ref",
            label: str = "") -> dict[str, float]:
    """Hidden, logits and attention weights at valid (mask == 1) query positions, within tolerance.

    `logits="ref"` compares with ref.logits (both None for encoders); an array compares with it.
    Returns the max-abs figures (also printed: `pytest -rP tests/live` shows them).
    """
    valid = mask.astype(bool)                                             # (B, n)
    figures = {"hidden": max_abs(out.hidden[valid], ref.hidden[valid])}
    expected_logits = ref.logits if isinstance(logits, str) else logits
    if expected_logits is None:
        assert out.logits is None, "an encoder must not produce logits"
    else:
        assert out.logits is not None
        figures["logits"] = max_abs(out.logits[valid], expected_logits[valid])
    assert out.attentions.shape == ref.attentions.shape, (out.attentions.shape, ref.attentions.shape)
    # (L, B, H, n_q, n_k): every valid query row, all keys (padding keys must be 0 in both).
    figures["attentions"] = max(max_abs(out.attentions[:, b][:, :, valid[b]], ref.attentions[:, b][:, :, valid[b]])
                                for b in range(valid.shape[0]))
    print(f"{label or 'case'}: " + ", ".join(f"{k} {v:.2e}" for k, v in figures.items()))
    assert figures["hidden"] <= tol_hidden, figures
    assert figures.get("logits", 0.0) <= tol_hidden, figures
    assert figures["attentions"] <= tol_attention, figures
    return figures


# ── a float64 reference for the Llama family ─────────────────────────────────────
# transformers' Llama/Qwen2/Mistral keep three islands of float32 even in a float64 model:
# RoPE's cos/sin (computed from float32 inv_freq and positions), RMSNorm (upcasts to
# float32) and the eager softmax (dtype=torch.float32). They cap agreement near 1e-6, and
# with padding the float64 mask minimum overflows to -inf in the float32 softmax, so a
# fully masked padding row becomes NaN and leaks into real rows (0 weight × NaN value).
# float64_reference lifts exactly those three casts, nothing else.


def _eager_attention_float64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager_attention_forward with the softmax in the query's dtype."""
    groups = module.num_key_value_groups
    key = key.repeat_interleave(groups, dim=1)                      # = repeat_kv
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=query.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def float64_reference(model: torch.nn.Module, monkeypatch) -> torch.nn.Module:
    """`model` in float64; for RoPE models also float64 RoPE, RMSNorm and softmax (see above)."""
    model = model.to(torch.float64)
    inner = getattr(model, "model", None)
    rot = getattr(inner, "rotary_emb", None)
    if rot is None:
        return model                                                 # BERT, GPT-2: float64 throughout
    cfg = model.config
    params = cfg.rope_parameters
    assert params.get("rope_type", "default") == "default", "float64 reference: plain RoPE only"
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = 1.0 / (float(params["rope_theta"]) ** (torch.arange(0, d, 2, dtype=torch.float64) / d))

    def rope_forward(x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(rot, "forward", rope_forward)
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            def rms_forward(x, m=module):
                return m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
            monkeypatch.setattr(module, "forward", rms_forward)
    modeling = importlib.import_module(type(model).__module__)
    assert hasattr(modeling, "eager_attention_forward")
    monkeypatch.setattr(modeling, "eager_attention_forward", _eager_attention_float64)
    return model


def transformers_version() -> str:
    return transformers.__version__


def hf_greedy(model, ids: np.ndarray, new: int) -> np.ndarray:
    """transformers' greedy ids for IDS (1, n) + NEW tokens, never stopping early."""
    import torch

    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                              max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()


def check_decoder_live(model, ours, vocab: int, label: str, new: int, *, prompt_length: int = 9,
                       positions: bool = True) -> None:
    """A decoder family against transformers: a right- and a left-padded batch (hidden, logits, attention
    within tolerance), then greedy generation with and without the KV cache, token for token.
    positions=False: transformers numbers positions itself (OPT counts them from the mask)."""
    for side, lengths in (("right", [11, 7, 9]), ("left", [11, 6, 9])):
        ids, mask = padded_batch(vocab, lengths, seed=11, low=3, side=side)
        ref = run_reference(model, ids, mask, position_ids=decoder_positions(mask) if positions else None)
        compare(ours.forward(ids, mask), ref, mask, label=f"{label}-{side}")
    prompt = padded_batch(vocab, [prompt_length], seed=12, low=3)[0]
    expected = hf_greedy(model, prompt, new)
    np.testing.assert_array_equal(ours.generate(prompt, new, temperature=0, stop_at_eos=False), expected)
    np.testing.assert_array_equal(ours.generate(prompt, new, temperature=0, use_cache=False, stop_at_eos=False),
                                  expected)


# ── what the family files (test_live_<family>.py) share ───────────────────────────


def case_seed(request) -> int:
    """The test case's own seed: the CRC-32 of its id, below 10 000."""
    return zlib.crc32(request.node.callspec.id.encode()) % 10_000


def saved_and_loaded(cls, config, directory: Path, seed: int, setup=None) -> tuple[torch.nn.Module, qkv.Model]:
    """transformers' seeded, perturbed model (`build`; then SETUP(model) if given), saved to DIRECTORY, and qkv's
    reading of it."""
    model = build(cls, config, seed=seed)
    if setup is not None:
        setup(model)
    save(model, directory)
    return model, qkv.load(directory)


def gguf_and_loaded(cls, config, tmp_path: Path, seed: int) -> tuple[torch.nn.Module, qkv.Model]:
    """transformers' seeded model saved to TMP_PATH/hf, and qkv's reading of llama.cpp's file of it
    (tests/fixtures/gguf_convert.py, written to TMP_PATH/model.gguf)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
    import gguf_convert

    model = build(cls, config, seed=seed)
    save(model, tmp_path / "hf")
    return model, qkv.load(gguf_convert.convert(tmp_path / "hf", tmp_path / "model.gguf"))


def check_decoder_saved_by_qkv(cls, config, tmp_path: Path, setup=None, **from_pretrained) -> None:
    """A decoder qkv saves (of transformers' model with seed 5, SETUP(model) if given) read back by transformers
    (cls.from_pretrained(…, **FROM_PRETRAINED), eager): its logits on ids 3…13 equal qkv's within 1e-4."""
    model = build(cls, config, seed=5)
    if setup is not None:
        setup(model)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    ours.save(tmp_path / "qkv")
    back = cls.from_pretrained(tmp_path / "qkv", **from_pretrained).eval()
    back.set_attn_implementation("eager")
    ids = np.arange(3, 14)[None]                                                   # (1, 11)
    with torch.no_grad():
        logits = back(torch.tensor(ids)).logits.numpy()
    assert np.abs(logits - ours.forward(ids).logits).max() <= 1e-4


def check_encoder_live(model, ours, config, batches, label: str, *, pad_id: int, logits=None) -> tuple:
    """An encoder against transformers on BATCHES ((side, lengths) each: ids in [5, V) padded on that side with
    PAD_ID), with token types (row 0's from position 5 on of type 1) when the config has two or more: hidden states,
    logits and attention weights within tolerance (`compare`). LOGITS(ref, ids, mask, tt): what `compare` gets as
    logits (default "ref": the reference's own). Returns the last batch's (ids, mask)."""
    types = getattr(config, "type_vocab_size", 0)
    for side, lengths in batches:
        ids, mask = padded_batch(config.vocab_size, lengths, seed=11, low=5, side=side, pad_id=pad_id)
        tt = None
        if types > 1:
            tt = np.zeros_like(ids)
            tt[0, 5:] = 1
        ref = run_reference(model, ids, mask, token_type_ids=tt)
        expected = "ref" if logits is None else logits(ref, ids, mask, tt)
        compare(ours.forward(ids, mask, tt), ref, mask, logits=expected, label=f"{label}-{side}")
    return ids, mask


def check_encoder_saved_by_qkv(cls, config, tmp_path: Path, lengths: list[int], *, allowed_missing=None) -> None:
    """An encoder qkv saves (of transformers' model with seed 5) read back by transformers: on a right-padded batch
    (LENGTHS, the config's pad id) its logits equal the original's within 1e-5 and qkv's within 1e-4.
    allowed_missing: the names transformers may find missing (then none unexpected or mismatched)."""
    model = build(cls, config, seed=5)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    ours.save(tmp_path / "qkv")
    if allowed_missing is None:
        back = cls.from_pretrained(tmp_path / "qkv")
    else:
        back, info = cls.from_pretrained(tmp_path / "qkv", output_loading_info=True)
        assert set(info["missing_keys"]) <= allowed_missing and not info["unexpected_keys"] and \
            not info["mismatched_keys"], info
    back = back.eval()
    back.set_attn_implementation("eager")
    ids, mask = padded_batch(config.vocab_size, lengths, seed=3, low=5, pad_id=config.pad_token_id)
    with torch.no_grad():
        a = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
        b = back(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    valid = mask.astype(bool)
    assert max_abs(a[valid], b[valid]) < 1e-5
    assert max_abs(ours.forward(ids, mask).logits[valid], b[valid]) < 1e-4


def assert_gradients_equal(grads: dict[str, np.ndarray], ref: dict[str, np.ndarray], *, atol: float = 1e-6) -> None:
    """The same names, and each gradient within 1e-4 relative error of autograd's (or ATOL absolute where it is 0 but
    for rounding)."""
    assert set(grads) == set(ref)
    for key, g in ref.items():
        err = np.linalg.norm(grads[key] - g) / np.linalg.norm(g)
        assert err < 1e-4 or max_abs(grads[key], g) < atol, f"{key}: relative error {err:.2e}"


def check_masked_lm_gradients(cls, config, tmp_path: Path, seed: int, lengths: list[int], names=None) -> None:
    """qkv.train.gradients with labels against torch autograd of transformers' *ForMaskedLM loss (the model of SEED,
    saved to TMP_PATH) on a batch of LENGTHS padded left for an odd seed, right for an even one, 30 % of its real
    tokens labelled: loss within 1e-5, gradients as `assert_gradients_equal`. NAMES(grads, model_type): torch's
    gradients under the file's names."""
    from qkv.train import gradients

    model = build(cls, config, seed=seed)
    save(model, tmp_path)
    side = "left" if seed % 2 else "right"
    ids, mask = padded_batch(config.vocab_size, lengths, seed=21, low=5, side=side, pad_id=config.pad_token_id)
    gen = np.random.default_rng(seed)
    labels = np.where((gen.random(ids.shape) < 0.3) & (mask == 1), gen.integers(5, config.vocab_size, ids.shape), -100)
    model.zero_grad()
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), labels=torch.from_numpy(labels))
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters() if p.grad is not None}
    if names is not None:
        ref = names(ref, config.model_type)
    loss, grads = gradients(qkv.load(tmp_path), ids, mask, labels=labels)
    assert abs(loss - out.loss.item()) < 1e-5
    assert_gradients_equal(grads, ref)


def check_saved_by_qkv_on(cls, model, ours, prompt: np.ndarray, directory: Path) -> None:
    """OURS saved by qkv to DIRECTORY and read back by transformers (cls, eager): its logits on PROMPT (1, n) equal
    MODEL's within 1e-5."""
    ours.save(directory)
    back = cls.from_pretrained(directory).eval()
    back.set_attn_implementation("eager")
    with torch.no_grad():
        a, b = model(torch.from_numpy(prompt)).logits.numpy(), back(torch.from_numpy(prompt)).logits.numpy()
    assert max_abs(a, b) < 1e-5


def check_decoder_gradients(model, ours, autograd, names=None) -> None:
    """qkv.train.gradients of OURS against torch autograd of MODEL (AUTOGRAD(model, ids, mask) → (loss, gradients))
    on a right-padded batch of lengths 12, 9, 5: loss within 1e-5, the same names (NAMES(torch's) → the file's), each
    gradient within 1e-4 of its norm + 1e-7 (top-1 routing: each weight is 1 whatever the logits, so the router's
    gradient is 0 up to rounding)."""
    from qkv.train import gradients

    ids, mask = padded_batch(model.config.vocab_size, [12, 9, 5], seed=13, low=3)
    loss_ref, ref = autograd(model, ids, mask)
    if names is not None:
        ref = names(ref)
    loss, grads = gradients(ours, ids, mask)
    assert abs(loss - loss_ref) < 1e-5, (loss, loss_ref)
    assert set(grads) == set(ref)
    for key, g in ref.items():
        assert np.linalg.norm(grads[key] - g) <= 1e-4 * np.linalg.norm(g) + 1e-7, key
