"""GGUF files loaded by qkv against transformers' own GGUF loader (make test-live).

Every tiny random GGUF of tests/fixtures/make_gguf_fixtures.py — llama with GQA, Mistral
(written by llama.cpp as architecture llama: MQA, untied output) and qwen2 (q/k/v biases),
each with its linear weights in every tensor type qkv reads (F32, F16, BF16, Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) — is loaded by `qkv.load(path)` and by
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)` (float32, eager attention).
Both dequantise with the `gguf` package, so the weights must be identical after qkv undoes
llama.cpp's Q/K row permutation; on a padded batch (right- and left-padded rows) the
logits agree within 1e-4 and the attention weights within 1e-5 (max abs, valid positions).

transformers and torch are imported at module level: without them these tests fail, they
are never skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

import qkv
from live_helpers import TOL_ATTENTION, TOL_HIDDEN, max_abs
from qkv.checkpoints import gguf_cache

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
import make_gguf_fixtures as F  # noqa: E402

pytestmark = pytest.mark.live

CASES = [(kind, q) for kind in F.SPECS for q in F.QUANT_TYPES]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def reference_model(path: Path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def check_outputs(path: Path, model: qkv.Model, ref) -> dict[str, float]:
    """qkv and transformers on one padded batch: logits 1e-4, attention weights 1e-5 (valid rows)."""
    ids, mask = F.padded_batch(model.config.vocab_size)
    positions = np.clip(np.cumsum(mask, axis=-1) - 1, 0, None)
    with torch.no_grad():
        out = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                  position_ids=torch.from_numpy(positions), output_attentions=True)
    mine = model.forward(ids, mask)
    valid = mask.astype(bool)
    logits = max_abs(mine.logits[valid], out.logits.numpy()[valid])
    theirs = np.stack([a.numpy() for a in out.attentions])                      # (L, B, H, n, n)
    attention = max(max_abs(mine.attentions[:, b][:, :, valid[b]], theirs[:, b][:, :, valid[b]])
                    for b in range(len(ids)))
    print(f"{path.name}: logits {logits:.1e} (|logits| ≤ {np.abs(out.logits.numpy()).max():.1f}), "
          f"attention {attention:.1e}")
    assert logits <= TOL_HIDDEN and attention <= TOL_ATTENTION, (logits, attention)
    return {"logits": logits, "attention": attention}


@pytest.mark.parametrize("kind,qtype", CASES, ids=[f"{k}-{q}" for k, q in CASES])
def test_gguf_equals_transformers(tmp_path, kind, qtype):
    path = F.make(tmp_path / f"{kind}-{qtype}.gguf", kind, qtype)
    model = qkv.load(path)
    ref = reference_model(path)
    # The dequantised weights: identical, name by name (transformers' names carry a `model.` prefix).
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v.numpy() for k, v in ref.state_dict().items()}
    if model.config.tied_embeddings:
        assert "lm_head.weight" not in mine
        theirs.pop("lm_head.weight")
    theirs = {k: v for k, v in theirs.items() if not k.endswith("rotary_emb.inv_freq")}
    assert set(mine) == set(theirs)
    for name, w in mine.items():
        assert w.dtype == np.float32 and w.shape == theirs[name].shape, name
        assert np.array_equal(w, theirs[name]), (name, max_abs(w, theirs[name]))
    check_outputs(path, model, ref)


def test_unquantised_weights_come_back_exactly(tmp_path):
    """An F32 file: qkv's weights equal the Hugging Face weights the file was written from,
    bit for bit — llama.cpp's Q/K permutation undone (llama), left alone (qwen2)."""
    for kind in ("llama", "qwen2"):
        spec = F.SPECS[kind]
        path = F.make(tmp_path / f"{kind}.gguf", kind, "F32")
        mine = load_file(gguf_cache.converted(path) / "model.safetensors")
        original = F.hf_weights(spec)
        assert set(mine) == set(original)
        for name, w in original.items():
            assert np.array_equal(mine[name], w), name


def test_alignment_and_separate_output(tmp_path):
    """`general.alignment` = 64 and a separate output.weight: still equal to transformers."""
    path = F.make(tmp_path / "aligned.gguf", "mistral", "Q5_1", alignment=64)
    check_outputs(path, qkv.load(path), reference_model(path))


@pytest.mark.parametrize("name", F.COMMITTED)
def test_committed_references_are_current(name):
    """The committed reference outputs are what transformers computes on the committed files today."""
    path = F.HERE / f"{name}.gguf"
    with np.load(F.HERE / "reference.npz") as z:
        ids, mask, logits = z[f"{name}/ids"], z[f"{name}/mask"], z[f"{name}/logits"]
    now = F.transformers_outputs(path, ids, mask)
    # float32 logits of the same computation differ run to run by ~1e-6 (torch's thread count and BLAS
    # kernel choose the order of the sums: 1.07e-6 seen); a changed reference differs by far more
    assert max_abs(now["logits"], logits) <= 1e-5
    check_outputs(path, qkv.load(path), reference_model(path))
