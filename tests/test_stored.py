"""Weights kept as a GGUF file stores them (runtime.stored, `qkv.load(gguf, dtype="stored")`): every product
equals the `gguf` package's dequantisation followed by a float32 matmul, and a stored SmolLM2 answers as
the float32 one."""

from __future__ import annotations

import json
import shutil
import sys

import gguf
import numpy as np
import pytest

import qkv
from qkv.runtime import stored
from qkv.runtime.stored import KINDS, StoredMatrix
from conftest import FIXTURES, MODELS


# where a K-quant block keeps its float16 scales (gguf quantises no K-quant: their other bytes are random)
K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def quantised(kind: str, rows: int = 96, cols: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(the file's bytes (rows, cols/block · bytes), what gguf dequantises them to (rows, cols))."""
    rng = np.random.default_rng(seed)
    kind_ = getattr(gguf.GGMLQuantizationType, kind)
    if kind in K_SCALES:
        per, size = KINDS[kind]
        blocks = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
        for at in K_SCALES[kind]:
            scale = rng.uniform(-0.05, 0.05, blocks.shape[:2]).astype("<f2")
            blocks[:, :, at:at + 2] = scale[..., None].view(np.uint8)
        raw = blocks.reshape(rows, -1)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), kind_)
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)          # F16: float16 (rows, cols)
    return raw, gguf.quants.dequantize(raw, kind_).astype(np.float32).reshape(rows, cols)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_a_product_equals_dequantising_then_multiplying(kind, rows):
    raw, T = quantised(kind)
    W = StoredMatrix(kind, raw, 512)
    x = np.random.default_rng(1).standard_normal((2, rows, 512)).astype(np.float32)   # (B, n, d_in)
    want = x @ T.T
    got = x @ W
    assert got.shape == (2, rows, 96) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_joins_tables_and_reading_as_an_array(kind):
    raw, T = quantised(kind)
    W = StoredMatrix(kind, raw, 512)
    assert np.array_equal(W.dequantized(), T.T) and np.array_equal(np.asarray(W), T.T)
    order = np.arange(96)[::-1]
    assert np.array_equal(W.rows(order).dequantized(), T[order].T)
    both = StoredMatrix.joined([W.rows(slice(0, 10)), W.rows(slice(50, 60))])
    assert np.array_equal(both.dequantized(), np.concatenate([T[:10], T[50:60]]).T)
    ids = np.array([[3, 5], [95, 0]])
    assert np.array_equal(W.T[ids], T[ids])                                # an embedding table's rows
    assert np.array_equal(W[2:4], T.T[2:4]) and np.array_equal(W * 2, T.T * 2)   # other reads: the array
    assert np.array_equal(W.astype(np.float64), T.T.astype(np.float64))


@pytest.mark.parametrize("kind", ["Q4_1", "Q6_K"])
def test_without_numba_the_products_are_the_same(monkeypatch, kind):
    raw, T = quantised(kind)
    x = np.random.default_rng(2).standard_normal((1, 512)).astype(np.float32)
    monkeypatch.setattr(stored, "numba", None)
    W = StoredMatrix(kind, raw, 512)
    assert np.abs(x @ W - x @ T.T).max() <= 1e-5 * np.abs(x @ T.T).max()
    assert np.array_equal(W.dequantized(), T.T)


def test_damaged_blocks_are_one_line():
    raw, _ = quantised("Q8_0")
    with pytest.raises(qkv.QkvError, match="needs rows of 544 bytes"):
        StoredMatrix("Q8_0", raw[:, :-1], 512)
    with pytest.raises(qkv.QkvError, match="needs a multiple of 256 columns"):
        StoredMatrix("Q4_K", raw, 576)
    with pytest.raises(qkv.QkvError, match="is not kept stored"):
        StoredMatrix("Q3_K", raw, 512)
    bad = raw.copy()
    bad[0, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # the first block's scale
    with pytest.raises(qkv.QkvError, match="NaN or infinite scales"):
        StoredMatrix("Q8_0", bad, 512)


@pytest.fixture(scope="module")
def smollm2_pair():
    return qkv.load("smollm2"), qkv.load("smollm2", dtype="float32")      # stored: the default for GGUF


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


def sixteen_bit_copy(src, out, kind: str):
    """SRC's checkpoint with every matrix (2-D tensor) written as KIND ("BF16"/"F16") bytes, the rest float32."""
    from qkv.checkpoints.tensors import TensorStore

    store = TensorStore(src)
    header, chunks, at = {}, [], 0
    for name in store.names():
        info = store._where[name][1]
        w = store.get(name, tuple(info["shape"]))
        data = stored.half_bytes(w, kind).tobytes() if w.ndim == 2 else np.ascontiguousarray(w, "<f4").tobytes()
        header[name] = {"dtype": kind if w.ndim == 2 else "F32", "shape": list(w.shape),
                        "data_offsets": [at, at + len(data)]}
        chunks.append(data)
        at += len(data)
    out.mkdir()
    raw = json.dumps(header).encode()
    (out / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(chunks))
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(src / f, out / f)
    return out


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "bert"])
@pytest.mark.parametrize("kind", ["BF16", "F16"])
def test_sixteen_bit_checkpoints_are_kept_as_they_are(tmp_path, family, kind):
    """A 16-bit checkpoint loaded "stored" holds its matrices as the file's bytes and computes what float32
    computes on the same (widened) numbers; a float32 checkpoint asked for bfloat16/float16 rounds once,
    to the same numbers; vectors stay float32."""
    half = sixteen_bit_copy(MODELS / family, tmp_path / "half", kind)
    kept, widened = qkv.load(half, dtype="stored"), qkv.load(half)
    rounded = qkv.load(MODELS / family, dtype={"BF16": "bfloat16", "F16": "float16"}[kind])
    ids = np.array([[1, 5, 9, 2, 7, 3]])
    want = widened.forward(ids).hidden
    for m in (kept, rounded):
        attn = m.weights.blocks[0].attn
        assert isinstance(attn.W_O, StoredMatrix) and attn.W_O.kind == kind
        assert isinstance(m.weights.blocks[0].attn_norm.weight, np.ndarray)
        assert np.abs(m.forward(ids).hidden - want).max() <= 1e-5 * np.abs(want).max()
    assert kept.weights.nbytes() < 0.6 * qkv.load(MODELS / family).weights.nbytes()


def test_storage_names_are_checked():
    with pytest.raises(qkv.QkvError, match='"bfloat16", "float16" or "stored"'):
        qkv.load(MODELS / "llama_gqa", dtype="int8")


def test_sixteen_bit_floats_subnormals_signs_and_rounding():
    edge = np.array([0.0, -0.0, 6e-8, -6e-8, 3e-5, 65504.0, -2.5, 1.0], np.float16)        # subnormals too
    T = np.tile(edge, (16, 64))                                                            # (16, 512)
    W = StoredMatrix("F16", T.view(np.uint8), 512)
    x = np.random.default_rng(3).standard_normal((1, 512)).astype(np.float32)
    want = x.astype(np.float64) @ T.T.astype(np.float64)
    assert np.array_equal(W.dequantized(), T.T.astype(np.float32))
    assert np.abs(x @ W - want).max() <= 1e-5 * np.abs(want).max()
    F = np.random.default_rng(4).standard_normal((7, 300)).astype(np.float32)              # any width, odd rows
    raw = stored.half_bytes(F, "BF16")
    assert np.array_equal(raw, np.ascontiguousarray(gguf.quants.quantize(F, gguf.GGMLQuantizationType.BF16)).view(np.uint8))
    B = StoredMatrix("BF16", raw, 300)
    assert np.abs(F.T - B.dequantized()).max() <= 2 ** -8 * np.abs(F).max()
    assert np.abs(x[:, :300] @ B - x[:, :300] @ B.dequantized()).max() <= 1e-5 * np.abs(x[:, :300] @ F.T).max()
    inf = raw.copy()
    inf[3, 10:12] = np.frombuffer(np.uint16(0x7F80).tobytes(), np.uint8)
    with pytest.raises(qkv.QkvError, match="NaN or infinite values"):
        StoredMatrix("BF16", inf, 300)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"])
def test_a_gguf_file_of_each_type_loads_stored_as_its_float32_copy(tmp_path, qtype):
    """A tiny llama file of QTYPE (written by the gguf package; K-quants as random blocks, which it cannot
    quantise): the default load keeps its matrices as the file's bytes and computes what the float32
    conversion of the same file computes."""
    sys.path.insert(0, str(FIXTURES))
    import make_gguf_fixtures as F

    path = F.make(tmp_path / f"{qtype}.gguf", "llama", qtype)
    kept, f32 = qkv.load(path), qkv.load(path, dtype="float32")
    W = kept.weights.blocks[0].attn.W_QKV
    assert isinstance(W, StoredMatrix) and W.kind == qtype and isinstance(f32.weights.blocks[0].attn.W_QKV, np.ndarray)
    ids = np.array([[3, 17, 5, 40, 2, 9]])
    a, b = kept.forward(ids).logits, f32.forward(ids).logits
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    assert np.array_equal(kept.generate([3, 17, 5], 6, temperature=0), f32.generate([3, 17, 5], 6, temperature=0))


def test_weights_option_of_the_command_line(monkeypatch, capsys):
    from conftest import run_main

    code, out, err = run_main(monkeypatch, capsys, "--weights", "bfloat16", "generate", "The capital of France is",
                              "--model", "smollm2", "-n", "4", "-t", "0")
    assert code == 0, err
    code, _, err = run_main(monkeypatch, capsys, "--weights", "int3", "generate", "x")
    assert code == 2 and "'int3' is not one of" in err


def test_memory_benchmark_measures_loads_in_their_own_processes():
    from qkv.bench import memory

    result = memory.measure("smollm2", with_transformers=False)
    stored, f32 = result["rows"]
    assert (stored["how"], f32["how"]) == ("stored", "float32") and result["gguf"]
    held = lambda r: r["held"] - r["base"]
    assert 0 < held(stored) < 0.4 * held(f32) and stored["peak"] >= stored["held"]
    text = memory.markdown(result)
    assert "## Loading smollm2" in text and "qkv (stored)" in text and "Target: a stored load holds" in text


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("d_out", [1, 7])
def test_products_with_fewer_rows_than_the_threads_or_an_odd_count(kind, d_out):
    """Each chunk of output rows a numba thread takes may be empty or odd; every row is written once."""
    raw, T = quantised(kind, rows=d_out)
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    got, want = x @ StoredMatrix(kind, raw, 512), x @ T.T
    assert got.shape == (5, d_out) and np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_sixteen_lanes_convert_bytes_exactly_and_add_up():
    """runtime.simd: the byte conversions the kernels use equal NumPy's, and vsum / vfma are the sums."""
    from numba import njit
    from qkv.runtime.simd import bits32, field, int8s, vfma, vload, vstore, vsum

    @njit
    def lanes(u8, i8, h, x, out):
        vstore(field(u8, 0, 15), out[0]); vstore(field(u8, 4, 15), out[1]); vstore(field(u8, 3, 1), out[2])
        vstore(field(u8, 6, 3), out[3]); vstore(int8s(i8), out[4]); vstore(bits32(h, 0), out[5])
        vstore(bits32(h, 16), out[6]); vstore(vfma(vload(x), vload(x), vload(x)), out[7])
        return vsum(vload(x))

    rng = np.random.default_rng(4)
    u8 = rng.integers(0, 256, 16, dtype=np.uint8)
    i8 = rng.integers(-128, 128, 16, dtype=np.int8)
    h = np.uint32(rng.integers(0, 2**32, dtype=np.uint64))
    x = rng.standard_normal(16).astype(np.float32)
    out = np.zeros((8, 16), np.float32)
    total = lanes(u8, i8, h, x, out)
    bits = (int(h) >> np.arange(32)) & 1
    want = [u8 & 15, u8 >> 4, (u8 >> 3) & 1, (u8 >> 6) & 3, i8, bits[:16], bits[16:]]
    for row, w in zip(out, want):
        assert np.array_equal(row, np.asarray(w, np.float32))
    np.testing.assert_allclose(out[7], x * x + x, rtol=1e-6)
    assert abs(total - x.astype(np.float64).sum()) <= 1e-5
