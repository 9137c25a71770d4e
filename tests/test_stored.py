"""Weights kept as a GGUF file stores them (engine.stored, `qkv.load(gguf, dtype="stored")`): every product
equals the `gguf` package's dequantisation followed by a float32 matmul, and a stored SmolLM2 answers as
the float32 one."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import qkv
from qkv.engine import stored
from qkv.engine.stored import KINDS, StoredMatrix
from conftest import MODELS


def quantised(kind: str, rows: int = 96, cols: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(the file's bytes (rows, cols/32 · block), what gguf dequantises them to (rows, cols))."""
    T = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    kind_ = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(T, kind_)
    return raw, gguf.quants.dequantize(raw, kind_).astype(np.float32).reshape(rows, cols)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_a_product_equals_dequantising_then_multiplying(kind, rows):
    raw, T = quantised(kind)
    W = StoredMatrix(kind, raw, 256)
    x = np.random.default_rng(1).standard_normal((2, rows, 256)).astype(np.float32)   # (B, n, d_in)
    want = x @ T.T
    got = x @ W
    assert got.shape == (2, rows, 96) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_joins_tables_and_reading_as_an_array(kind):
    raw, T = quantised(kind)
    W = StoredMatrix(kind, raw, 256)
    assert np.array_equal(W.dequantized(), T.T) and np.array_equal(np.asarray(W), T.T)
    order = np.arange(96)[::-1]
    assert np.array_equal(W.rows(order).dequantized(), T[order].T)
    both = StoredMatrix.joined([W.rows(slice(0, 10)), W.rows(slice(50, 60))])
    assert np.array_equal(both.dequantized(), np.concatenate([T[:10], T[50:60]]).T)
    ids = np.array([[3, 5], [95, 0]])
    assert np.array_equal(W.T[ids], T[ids])                                # an embedding table's rows
    assert np.array_equal(W[2:4], T.T[2:4]) and np.array_equal(W * 2, T.T * 2)   # other reads: the array
    assert np.array_equal(W.astype(np.float64), T.T.astype(np.float64))


def test_without_numba_the_products_are_the_same(monkeypatch):
    raw, T = quantised("Q4_1")
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    monkeypatch.setattr(stored, "numba", None)
    W = StoredMatrix("Q4_1", raw, 256)
    assert np.abs(x @ W - x @ T.T).max() <= 1e-5 * np.abs(x @ T.T).max()
    assert np.array_equal(W.dequantized(), T.T)


def test_damaged_blocks_are_one_line():
    raw, _ = quantised("Q8_0")
    with pytest.raises(qkv.QkvError, match="needs rows of 272 bytes"):
        StoredMatrix("Q8_0", raw[:, :-1], 256)
    with pytest.raises(qkv.QkvError, match="is not kept stored"):
        StoredMatrix("Q3_K", raw, 256)
    bad = raw.copy()
    bad[0, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # the first block's scale
    with pytest.raises(qkv.QkvError, match="NaN or infinite scales"):
        StoredMatrix("Q8_0", bad, 256)


@pytest.fixture(scope="module")
def smollm2_pair():
    return qkv.load("smollm2", dtype="stored"), qkv.load("smollm2")


def test_stored_smollm2_computes_as_the_float32_one_and_holds_its_file_size(smollm2_pair):
    from qkv.checkpoints import smollm2_file

    s, f = smollm2_pair
    assert isinstance(s.weights.blocks[0].attn.W_QKV, StoredMatrix) and isinstance(s.weights.W_vocab, StoredMatrix)
    ids = f.encode("The capital of France is")[0][None]
    a, b = s.forward(ids).logits, f.forward(ids).logits
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    assert s.chat("What is the capital of France?") == f.chat("What is the capital of France?")
    prompt = "The history of the transformer architecture begins"
    assert s.generate(prompt, 24, temperature=0, stop_at_eos=False) == f.generate(prompt, 24, temperature=0,
                                                                                 stop_at_eos=False)
    assert s.weights.nbytes() <= 1.2 * smollm2_file().stat().st_size < 0.25 * f.weights.nbytes()


def test_what_reads_weights_reads_a_stored_model_as_numbers(smollm2_pair):
    from qkv.analysis import logit_lens

    s, f = smollm2_pair
    text = "When Mary and John went to the store, John gave a drink to"
    assert np.abs(logit_lens(s, text) - logit_lens(f, text)).max() <= 1e-3
    double = s.astype("float64")
    assert isinstance(double.weights.blocks[0].attn.W_QKV, np.ndarray) and double.dtype == np.float64
    ids = f.encode("Hi")[0][None]
    assert np.abs(double.forward(ids).logits - f.forward(ids).logits).max() <= 1e-3


def test_stored_needs_a_gguf_file():
    with pytest.raises(qkv.QkvError, match='dtype="stored" keeps a GGUF file'):
        qkv.load(MODELS / "llama_gqa", dtype="stored")
