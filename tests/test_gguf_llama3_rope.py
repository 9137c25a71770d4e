"""A Llama 3.x GGUF: llama.cpp's converter writes the llama3 RoPE as the tensor rope_freqs (one factor s_i per pair of
turned dimensions), and qkv reads it as a table of factors (gguf.rope_freqs), so the file computes what its directory
computes: the same inverse frequencies (float32's rounding), logits ≤ 1e-5 and the same greedy ids (the refusals:
tests/test_gguf.py)."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

import qkv
from conftest import FIXTURES, MODELS
from qkv.core.positions import rope_inv_freq

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
TOL_LOGITS = 1e-5


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def llama3_directory(tmp_path, source: str = "llama_gqa", rope: dict = LLAMA3):
    """The fixture's weights under a config whose RoPE is ROPE."""
    d = tmp_path / f"{source}-llama3"
    shutil.copytree(MODELS / source, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = rope
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_the_converter_writes_the_factors_llama_cpp_computes(tmp_path):
    """Short wavelengths keep their speed (s = 1), long ones turn `factor` times slower, the ones between smoothly."""
    s = C.rope_factors(json.loads((llama3_directory(tmp_path) / "config.json").read_text()))
    assert s.shape == (4,) and s[0] == 1.0 and s[-1] == 8.0 and np.all(np.diff(s) >= 0)


def test_a_llama3_file_equals_its_directory(tmp_path):
    d = llama3_directory(tmp_path)
    path = C.convert(d, tmp_path / "llama3.gguf")
    import gguf
    assert "rope_freqs.weight" in {t.name for t in gguf.GGUFReader(path).tensors}
    read, ours = qkv.load(path), qkv.load(d)
    assert read.config.rope_scaling["rope_type"] == "longrope" and ours.config.rope_scaling["rope_type"] == "llama3"
    np.testing.assert_allclose(rope_inv_freq(8, read.config.rope_theta, read.config.rope_scaling),
                               rope_inv_freq(8, ours.config.rope_theta, ours.config.rope_scaling), rtol=2e-7)
    ids = np.array([[5, 17, 3, 99, 42, 7, 11, 250, 64, 8] * 6])                  # 60 tokens: past the 32 original
    a, b = read.forward(ids).logits, ours.forward(ids).logits
    assert np.abs(a - b).max() <= TOL_LOGITS
    plain = qkv.load(MODELS / "llama_gqa").forward(ids).logits
    assert np.abs(plain - b).max() > 1e-3                                         # the scaling is not a no-op here
    assert np.array_equal(read.generate(ids[:, :12], max_new_tokens=40, stop_at_eos=False),
                          ours.generate(ids[:, :12], max_new_tokens=40, stop_at_eos=False))
