"""The 1B-shaped GGUF benchmark (issue 49, part 4): benchmarks/make_llama_1b_gguf.py's writer on a tiny shape,
files that mix quantised kinds (llama.cpp's Q4_K_M) loaded stored, and `qkv bench generate --stored`'s rows on a
tiny GGUF (no llama-cpp-python here: its rows are the documented run's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv.bench import llm_stored
from qkv.checkpoints import smollm2_file
from qkv.cli import bench as bench_cli
from qkv.runtime.errors import QkvError
from conftest import FIXTURES

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "make_llama_1b_gguf.py"
TINY_SHAPE = {"n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "d_head": 16, "d_ff": 128,
              "vocab_size": 49152 + 40, "rope_theta": 500000.0, "rms_eps": 1e-5, "context": 256}
TINY_Q4_0 = FIXTURES / "gguf" / "tiny-llama-q4_0.gguf"


def script():
    spec = importlib.util.spec_from_file_location("make_llama_1b_gguf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vocab() -> dict:
    return script().read_vocab(smollm2_file())


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory, vocab) -> Path:
    """The script's writer on a tiny shape, with SmolLM2's vocabulary padded by 40 unused tokens."""
    path = tmp_path_factory.mktemp("f16") / "tiny-f16.gguf"
    script().write_f16(path, vocab, TINY_SHAPE)
    return path


def test_the_writer_makes_a_llama_file_of_the_shape_that_qkv_loads(tiny_f16):
    model = qkv.load(tiny_f16, dtype="stored")
    c, s = model.config, TINY_SHAPE
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff, c.vocab_size) == (
        s["n_layers"], s["d_model"], s["n_heads"], s["n_kv_heads"], s["d_head"], s["d_ff"], s["vocab_size"])
    assert c.rope_theta == 500000.0 and c.norm_eps == pytest.approx(1e-5) and c.tied_embeddings
    assert c.max_positions == 256
    ids = np.array([[1, 2, 3]])
    out = model.generate(ids, 4, temperature=0, stop_at_eos=False)
    assert out.shape == (1, 7)
    # the same numbers read back: the embedding is the file's float16 table, σ 0.02; the norms are 1
    tensors = {t.name: t for t in gguf.GGUFReader(str(tiny_f16)).tensors}
    table = np.asarray(tensors["token_embd.weight"].data)
    assert table.dtype == np.float16 and table.shape == (s["vocab_size"], s["d_model"])
    assert abs(float(table.astype(np.float64).std()) - 0.02) < 1e-3
    f32 = qkv.load(tiny_f16, dtype=np.float32)
    np.testing.assert_array_equal(f32.weights.tok_embed, table.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(tensors["blk.1.ffn_norm.weight"].data), np.ones(s["d_model"], np.float32))


def test_the_vocabulary_is_smollm2s_padded_with_unused_tokens(tiny_f16):
    ours, theirs = qkv.load(tiny_f16, dtype="stored"), qkv.load("smollm2")
    text = "Explain how a language model predicts the next word."
    np.testing.assert_array_equal(ours.encode(text)[0], theirs.encode(text)[0])
    reader = gguf.GGUFReader(str(tiny_f16))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    kinds = reader.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == TINY_SHAPE["vocab_size"] and tokens[49152] == "<|unused_49152|>" and kinds[-1] == 5
    assert "tokenizer.chat_template" in reader.fields


def test_the_writer_is_repeatable_and_refuses_a_vocabulary_larger_than_the_shape(tiny_f16, vocab, tmp_path):
    m = script()
    again = tmp_path / "again.gguf"
    m.write_f16(again, vocab, TINY_SHAPE)
    assert again.read_bytes() == tiny_f16.read_bytes()
    with pytest.raises(SystemExit, match="more than the 100"):
        m.fitted(vocab, 100)


def test_stored_matrices_of_different_kinds_in_one_layer_load_unjoined_and_compute_the_same(tmp_path):
    """llama.cpp's Q4_K_M gives some layers' W_V (Q6_K) another kind than W_Q, W_K (Q4_K): [W_Q | W_K | W_V]
    cannot be one stored matrix there, so those are multiplied one by one, equal to the dequantised product."""
    sys.path.insert(0, str(FIXTURES))
    import make_gguf_fixtures as F

    def mixed(meta, tensors):
        data, raw = tensors["blk.0.attn_v.weight"]
        w = gguf.quants.dequantize(data, raw)                          # (H_kv·d_k, d_model) float32
        tensors["blk.0.attn_v.weight"] = F.encode(w, "Q8_0")
    path = F.make(tmp_path / "mixed.gguf", "llama", "Q4_0", edit=mixed)
    stored, plain = qkv.load(path, dtype="stored"), qkv.load(path, dtype=np.float32)
    b0, b1 = stored.weights.blocks[0].attn, stored.weights.blocks[1].attn
    assert b0.W_QKV is None and (b0.W_Q.kind, b0.W_V.kind) == ("Q4_0", "Q8_0")
    assert b1.W_QKV is not None                                        # one kind: still fused
    ids = np.array([[1, 5, 9, 14, 3]])
    np.testing.assert_allclose(stored.forward(ids).logits, plain.forward(ids).logits, rtol=0, atol=1e-4)
    np.testing.assert_array_equal(stored.generate(ids, 6, temperature=0, stop_at_eos=False),
                                  plain.generate(ids, 6, temperature=0, stop_at_eos=False))
    llama = qkv.load(path, arith="llama.cpp")
    assert llama.weights.blocks[0].attn.W_V.arith == "llama.cpp"
    assert llama.generate(ids, 3, temperature=0, stop_at_eos=False).shape == (1, 8)


def test_timed_stream_writes_what_generate_writes():
    model = qkv.load(TINY_Q4_0, dtype="stored")
    prompt = np.array([[1, 5, 9]])
    ids, gaps = llm_stored.timed_stream(model, prompt, 5)
    np.testing.assert_array_equal(ids, model.generate(prompt, 5, temperature=0, stop_at_eos=False)[0, 3:])
    assert len(gaps) == 5 and all(g > 0 for g in gaps)


def test_step_spread():
    sp = llm_stored.step_spread([0.01, 0.02, 0.03, 0.04, 0.10])
    assert sp["median"] == 0.03 and sp["max"] == 0.10 and sp["max_over_median"] == pytest.approx(10 / 3)
    assert sp["p90"] == pytest.approx(float(np.percentile([0.01, 0.02, 0.03, 0.04, 0.10], 90)))
    assert llm_stored.step_spread([]) == {}


def test_the_stored_benchmark_rows_on_a_tiny_gguf():
    result = llm_stored.measure([str(TINY_Q4_0)], new_tokens=4, prefill=(6,), repeats=1,
                                copy_bytes=8 << 20)
    f = result["files"][0]
    assert set(f["tokens_per_s"]) == {"exact", "llama_arith"}              # no llama.cpp asked
    for k in ("exact", "llama_arith"):
        assert f["tokens_per_s"][k] == pytest.approx(4 / f["decode_s"][k])
        assert f["limit_tokens_per_s"][k] == pytest.approx(result["copy_bytes_per_s"] / f["bytes"][k])
        assert f["share"][k] == pytest.approx(f["bytes"][k] * f["tokens_per_s"][k] / result["copy_bytes_per_s"])
        assert f["steady"][k] and f["spread"][k]["max"] >= f["spread"][k]["median"] > 0
        assert f["prefill_s"]["6"][k] > 0
    assert f["bytes"]["exact"] == qkv.load(TINY_Q4_0, dtype="stored").weights.nbytes()
    assert list(f["first_difference"]) == ["exact|llama_arith"] and f["unjoined_layers"] == 0
    text = llm_stored.markdown(result, bench_cli.stored_command_line((str(TINY_Q4_0),), 4, 1, True, "docs/b.md"))
    assert "| tiny-llama-q4_0.gguf | qkv stored, exact arithmetic |" in text
    assert str(FIXTURES) not in text and "--model PATH/TO/tiny-llama-q4_0.gguf" in text
    assert "--llama-python PATH/TO/python" in text
    assert llm_stored.section_name(result) == "generate-" + "-".join(
        "".join(c if c.isalnum() else " " for c in f["name"].lower()).split())


def test_stored_refuses_what_is_not_a_gguf_file_in_one_line(tmp_path):
    not_gguf = tmp_path / "model.safetensors"
    not_gguf.write_bytes(b"")
    with pytest.raises(QkvError, match="is not one"):
        llm_stored.measure([str(not_gguf)], new_tokens=2, prefill=(), repeats=1)
    out = CliRunner().invoke(bench_cli.generate_command, ["--stored"])
    assert out.exit_code != 0 and "give them with --model FILE.gguf" in str(out.exception or out.output)
    out = CliRunner().invoke(bench_cli.generate_command, ["--model", "a.gguf", "--model", "b.gguf"])
    assert out.exit_code != 0 and "except with --stored" in str(out.exception or out.output)
