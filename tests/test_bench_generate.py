"""qkv bench generate: bandwidth share, KV-cache bytes, token agreement, the docs section (no torch)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qkv import QkvError
from qkv.bench import generate as gb
from qkv.cli import bench as bench_cli
from qkv.core.config import ModelConfig

GPT2_SMALL = ModelConfig(family="gpt2", vocab_size=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                         max_positions=1024, causal=True)


def test_bandwidth_share_is_bytes_streamed_over_copy_bandwidth():
    # 500 MB read per token at 30 tokens/s = 15 GB/s, against a 20 GB/s copy: 75 %
    assert gb.bandwidth_share(500_000_000, 30.0, 20e9) == pytest.approx(0.75)


def test_copy_and_gemv_bandwidths_are_positive_rates():
    assert 1e8 < gb.copy_bandwidth(nbytes=8 << 20, repeats=1) < 1e13
    assert 1e8 < gb.gemv_bandwidth(nbytes=8 << 20, repeats=1) < 1e13


def test_kv_cache_bytes_and_the_saving_of_grouped_heads():
    rows = gb.kv_cache_rows(GPT2_SMALL)
    assert rows[0]["bytes_per_token"] == 2 * 12 * 12 * 64 * 4 == 73_728      # K and V, L, H, d_k, float32
    assert (rows[1]["n_heads"], rows[1]["n_kv_heads"]) == (12, 4)
    assert rows[1]["bytes_per_token"] == 24_576 and rows[1]["saving"] == pytest.approx(3.0)


def test_first_difference():
    a = np.array([1, 2, 3, 4])
    assert gb.first_difference(a, a.copy()) is None
    assert gb.first_difference(a, np.array([1, 2, 9, 4])) == 2
    assert gb.first_difference(a, a[:3]) == 3                       # one is a prefix of the other


def test_without_transformers_it_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)         # import transformers → ImportError
    with pytest.raises(QkvError, match="pip install"):
        gb.measure(new_tokens=2, no_cache_tokens=1, repeats=1)


def fake_result(same: bool = True) -> dict:
    tps = {"qkv_cache": 30.0, "qkv_no_cache": 3.0, "transformers": 10.0}
    return {"model": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
                      "parameters": 124_000_000},
            "machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11", "numpy": "2.0",
                        "blas": {"internal_api": "openblas", "version": "0.3", "architecture": "Haswell",
                                 "num_threads": 2},
                        "env": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": None},
                        "torch": {"version": "2.13", "threads": 2}, "transformers": "5.0"},
            "prompt": 16, "new_tokens": 128, "no_cache_tokens": 32, "repeats": 3, "tokens_per_s": tps,
            "speedup": 3.0, "weight_bytes": 500_000_000, "copy_bytes_per_s": 20e9,
            "copy_bytes_per_s_runs": [19e9, 21e9], "bandwidth_limit_tokens_per_s": 40.0,
            "gemv_bytes_per_s": 16e9, "gemv_share": gb.bandwidth_share(500_000_000, 30.0, 16e9),
            "share": {k: gb.bandwidth_share(500_000_000, v, 20e9) for k, v in tps.items()},
            "same_tokens": same, "first_difference": None if same else 57, "same_without_cache": True,
            "kv_cache": gb.kv_cache_rows(GPT2_SMALL)}


def test_markdown_section():
    text = gb.markdown(fake_result(), command="qkv bench generate --repeats 5")
    assert text.startswith("## Generation")
    assert "| qkv, KV cache | 128 | 30.0 | 3.00× | 75 % |" in text
    assert "| qkv, no cache | 32 | 3.0 | 0.30× | 8 % |" in text
    assert "(here 3.00×: met)" in text and "(here 75 %: not met)" in text and "**40.0 tokens/s**" in text
    assert "19.0, 21.0 GB/s" in text and "the same 128 greedy tokens" in text
    assert "streams 16.0 GB/s: measured against that, qkv's steps reach 94 %" in text
    assert "| 73,728 (72 KiB) | 1× |" in text and "| 24,576 (24 KiB) | 3× |" in text
    assert "OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=unset" in text and "qkv bench generate --repeats 5" in text
    assert "at new token 57" in gb.markdown(fake_result(same=False))


def test_command_line_names_only_changed_options():
    assert bench_cli.generate_command_line(gb.NEW_TOKENS, gb.NO_CACHE_TOKENS, gb.REPEATS, None) == "qkv bench generate"
    assert bench_cli.generate_command_line(64, 8, 5, "docs/benchmarks.md") == \
        "qkv bench generate --new-tokens 64 --no-cache-tokens 8 --repeats 5 --out docs/benchmarks.md"


# ── qkv bench generate --model smollm2 (bench/llm.py) ───────────────────────────

from qkv.bench import llm  # noqa: E402


def fake_llm_result(reference: bool = True, llama: bool = True) -> dict:
    tps = {"qkv": 40.0, "qkv_1": 25.0, "qkv_2": 40.5}
    if reference:
        tps["transformers"] = 20.0
    if llama:
        tps["llama.cpp"] = 80.0
    return {"model": {"name": "SmolLM2-135M-Instruct", "source": "smollm2", "n_layers": 30, "d_model": 576,
                      "n_heads": 9, "n_kv_heads": 3, "d_ff": 1536, "vocab_size": 49152, "parameters": 134_515_008},
            "machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11", "numpy": "2.0", "vector": ["avx2", "fma"],
                        "blas": {"internal_api": "openblas", "version": "0.3", "architecture": "Haswell",
                                 "num_threads": 2},
                        "env": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None},
                        **({"torch": {"version": "2.13", "threads": 2, "capability": "AVX2"}, "transformers": "5.0"}
                           if reference else {})},
            "missing": None if reference else "torch", "prompt": 40, "question": llm.QUESTION, "new_tokens": 64,
            "repeats": 3, "pinned_threads": None, "tokens_per_s": tps,
            "prefill_seconds": {"128": {"qkv": 0.2, **({"transformers": 0.25} if reference else {})},
                                "512": {"qkv": 0.9, **({"transformers": 0.8} if reference else {})}},
            "step_tokens_per_s": {"qkv": 45.0, **({"transformers": 22.5} if reference else {}),
                                  **({"llama.cpp": 90.0} if llama else {})},
            "step_share": {"qkv": gb.bandwidth_share(538_060_032, 45.0, 25e9),
                           **({"transformers": gb.bandwidth_share(538_060_032, 22.5, 25e9)} if reference else {})},
            "weight_bytes": 538_060_032, "copy_bytes_per_s": 25e9, "copy_bytes_per_s_runs": [24e9, 26e9],
            "bandwidth_limit_tokens_per_s": 25e9 / 538_060_032,
            "share": {k: gb.bandwidth_share(538_060_032, v, 25e9) for k, v in tps.items() if k != "llama.cpp"},
            "first_difference": {k: None for k in tps if k not in ("qkv", "llama.cpp")},
            "others_cores": {"decode": 0.1, "prefill": 0.2},
            "llama_cpp": ({"version": "0.3", "threads": 2, "weights": "4-bit", "weight_bytes": 98_000_000,
                           "decode_s": 0.8, "prefill_s": {"128": 0.05, "512": 0.2}, "first_difference": 12}
                          if llama else None)}


def test_llm_markdown_with_every_generator():
    text = llm.markdown(fake_llm_result(), command="qkv bench generate --model smollm2")
    assert text.startswith("## Generation: SmolLM2-135M-Instruct")
    assert "| qkv, as shipped (BLAS threads of one-token steps chosen by timing them) | 40.0 | 2.00× | 86 % |" in text
    assert "| qkv, one-token steps on 2 BLAS threads (`QKV_DECODE_THREADS=2`) | 40.5 | 2.02× |" in text
    assert "| transformers (torch, its threads) | 20.0 | 1.00× | 43 % |" in text
    assert "| llama.cpp 0.3 (4-bit weights, 2 threads, 98 MB read per step) | 80.0 | 4.00× | — | 90.0 | 4.00× |" in text
    assert "| 86 % | 45.0 | 2.00× | 97 % |" in text and "after the prompt: the steps alone, 63 ÷" in text
    assert "| qkv, one-token steps on 1 BLAS thread (`QKV_DECODE_THREADS=1`) | 25.0 | 1.25× | 54 % | — | — | — |" in text
    assert "the same 64 tokens" in text and "(here 2.00×: met)" in text and "(here 86 %: met)" in text
    assert "| 128 | 200 | 250 | 0.80× | 50 |" in text and "| 512 | 900 | 800 | 1.12× | 200 |" in text
    assert "leave qkv's at new token 12" in text and "98 MB against 538 MB" in text
    assert "vector extensions avx2, fma" in text and "kernel Haswell" in text and "AVX2 kernels" in text


def test_llm_markdown_without_transformers_says_what_it_cannot_compare():
    text = llm.markdown(fake_llm_result(reference=False, llama=False), command="qkv bench generate --model smollm2")
    assert "transformers is not installed (torch is missing)" in text
    assert "| qkv, as shipped (BLAS threads of one-token steps chosen by timing them) | 40.0 | — | 86 % |" in text
    assert "| 128 | 200 | — | — |" in text and "llama.cpp" not in text


def test_llm_command_line():
    assert bench_cli.llm_command_line("smollm2", llm.NEW_TOKENS, llm.REPEATS, False, "docs/benchmarks.md") == \
        "qkv bench generate --model smollm2 --out docs/benchmarks.md"
    assert bench_cli.llm_command_line("smollm2", 32, 5, True, None) == \
        "qkv bench generate --model smollm2 --new-tokens 32 --repeats 5 --llama-python PATH/TO/python"


def test_vector_extensions_are_known_names():
    assert set(llm.vector_extensions()) <= set(llm.VECTOR_FLAGS)


def test_llm_bench_runs_without_torch(monkeypatch):
    """No torch: qkv's figures alone, and the report says what it could not compare (SmolLM2, short run)."""
    monkeypatch.setitem(sys.modules, "torch", None)                  # import torch → ImportError
    monkeypatch.setattr(gb, "COPY_BYTES", 8 << 20)
    monkeypatch.setattr(llm, "copy_bandwidth", lambda: gb.copy_bandwidth(nbytes=8 << 20, repeats=1))
    result = llm.measure("smollm2", new_tokens=3, prefill=(8,), repeats=1)
    assert result["missing"] == "torch" and set(result["tokens_per_s"]) == {"qkv", "qkv_1", "qkv_2", "qkv_stored"}
    assert result["first_difference"] == {"qkv_1": None, "qkv_2": None,      # the thread count never changes tokens,
                                          "qkv_stored": None}               # nor do the stored blocks (3 tokens)
    assert result["weight_bytes"] == 4 * result["model"]["parameters"]
    assert result["stored_bytes"] < result["weight_bytes"] / 4 and "qkv_stored" in result["prefill_seconds"]["8"]
    text = llm.markdown(result, "qkv bench generate --model smollm2")
    assert "transformers is not installed" in text and "weights as the file stores them" in text
    assert "| prompt tokens | qkv ms | transformers ms | qkv / transformers | qkv stored ms |" in text


def test_llama_python_needs_a_model():
    from click.testing import CliRunner

    out = CliRunner().invoke(bench_cli.generate_command, ["--llama-python", sys.executable])
    assert out.exit_code != 0 and "--llama-python needs --model" in str(out.exception or out.output)


# ── every sentence from the run ──────────────────────────────────────────────────

def test_the_report_says_what_its_own_run_measured():
    result = fake_result()
    result["new_tokens"], result["tokens_per_s"]["qkv_cache"] = 64, 20.0
    result["others_cores"] = 0.25
    result["rounds_seconds"] = {"qkv_cache": [3.2, 3.3, 4.0], "qkv_no_cache": [10.0, 10.0, 10.0],
                                "transformers": [6.0, 6.6, 6.3]}
    text = gb.markdown(result)
    assert "the same 64 greedy tokens" in text and "128" not in text.split("Same tokens")[1].split(".")[0]
    assert "a step took 50.0 ms, the whole call ÷ 64 tokens; reading the weights at that rate takes 31.2 ms" in text
    assert "Other processes kept 0.25 cores busy" in text
    assert "moved by 25 % (qkv, KV cache), 0 % (qkv, no cache), 10 % (transformers (cache))" in text
    for fixed in ("15 %", "20 %", "73 smaller", "2.5 ms"):
        assert fixed not in text
    assert "*Background, not measured in this run:* the rest of a step" in text


def test_a_report_without_the_new_fields_still_renders():
    text = gb.markdown(fake_result())                               # a result saved before rounds were kept
    assert "moved by" not in text and "Other processes" not in text


def test_the_decoding_helpers_are_shared_not_copied():
    from qkv.bench import decoding

    assert llm.copy_bandwidth is decoding.copy_bandwidth is gb.copy_bandwidth
    assert llm.first_difference is decoding.first_difference
    assert decoding.spread([2.0, 3.0, 2.5]) == pytest.approx(0.5)


def test_llm_report_checks_the_prefill_target_and_uses_the_runs_settle():
    result = fake_llm_result()
    result["settle_s"] = 0.5
    text = llm.markdown(result, command="qkv bench generate --model smollm2")
    assert "here at worst 1.12× its time: not met" in text and "0.5 s of sleep before each run" in text
    result["prefill_seconds"]["512"]["qkv"] = 0.6                    # 0.75× transformers; 128 tokens: 0.80×
    assert "here at worst 0.80× its time: met" in llm.markdown(result, command="x")


def test_llama_cpp_reads_the_weight_types_from_the_file():
    from qkv.bench.llama_cpp import gguf_weights
    from qkv.checkpoints import smollm2_file

    path = smollm2_file()
    kinds, nbytes = gguf_weights(path)
    assert kinds == "Q4_1 + Q8_0 + F32"                              # SmolLM2's file: most bytes first
    assert 0.9 * path.stat().st_size < nbytes < path.stat().st_size  # the tensors, without the metadata
