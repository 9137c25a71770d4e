"""`qkv bench train` without torch: qkv's training step, its activation memory, the report, the command.

The timing against torch runs only on a machine with the reference stack (`qkv bench train`);
here the qkv side is exercised for real and the report is rendered from made-up numbers.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from click.testing import CliRunner

from qkv.bench import train as tb
from qkv.cli.bench import bench, train_command_line
from qkv.runtime.errors import QkvError

TINY = {
    "attention-only": tb.Spec("tiny attention-only GPT-2", {"model_type": "gpt2", "vocab_size": 32, "n_embd": 32,
                                                           "n_layer": 2, "n_head": 4, "n_inner": 0,
                                                           "n_positions": 64}, batch=4, tokens=16),
    "gpt2": tb.Spec("tiny GPT-2", {"model_type": "gpt2", "vocab_size": 32, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                   "n_inner": 64, "n_positions": 64}, batch=4, tokens=16),
    "llama": tb.Spec("tiny Llama", {"model_type": "llama", "vocab_size": 32, "hidden_size": 32,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "intermediate_size": 48, "max_position_embeddings": 64,
                                    "tie_word_embeddings": False}, batch=4, tokens=16),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_the_qkv_step_learns_a_fixed_batch_and_updates_the_params_in_place(family):
    spec = TINY[family]
    cfg, params = tb.qkv_model(spec, seed=0)
    before = {k: v.copy() for k, v in params.items()}
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(spec.batch, spec.tokens))   # (B, n)
    step = tb.qkv_step(params, cfg, ids, dict(tb.OPTIM, lr=1e-2))
    losses = [step() for _ in range(6)]
    assert losses[0] == pytest.approx(np.log(cfg.vocab_size), abs=0.1)      # a fresh model guesses uniformly
    assert all(b < a for a, b in zip(losses, losses[1:])), losses            # the same batch: every step helps
    assert losses[-1] < losses[0] - 0.3
    moved = {k for k in params if not np.array_equal(params[k], before[k])}
    matrices = {k for k in params if params[k].ndim == 2 and params[k].size}
    assert matrices <= moved and any(params[k].ndim == 1 for k in moved)    # AdamW wrote into the dict itself


def test_the_benchmarked_models_are_fresh_qkv_models_of_their_specs():
    cfg, params = tb.qkv_model(tb.MODELS["induction"])
    assert (cfg.family, cfg.d_ff, cfg.n_layers, cfg.d_model) == ("llama", 0, 2, 64)    # as qkv train --task induction
    assert params["model.layers.0.mlp.up_proj.weight"].shape == (0, 64)       # attention-only
    cfg, params = tb.qkv_model(tb.MODELS["llama"])
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.gated_ffn) == (8, 2, 688, True)
    assert params["model.layers.0.self_attn.k_proj.weight"].shape == (64, 256)
    assert "lm_head.weight" in params


def test_kept_floats_counts_each_tape_entry():
    cfg, _ = tb.qkv_model(TINY["llama"])                                      # d 32, H 4, Hkv 2, d_k 8, d_ff 48
    got = tb.kept_floats(cfg, B=2, n=10)
    assert got == {"blocks": 2 * 2 * 10 * (4 * 32 + 2 * 32 + 2 * 16), "A": 2 * 2 * 4 * 10 * 10,
                   "ffn": 2 * 2 * 10 * 48 * 3, "top": 2 * 10 * (2 * 32 + 32)}


def test_activation_memory_grows_with_n_and_matches_the_formula():
    spec = TINY["gpt2"]
    cfg, params = tb.qkv_model(spec)
    rows = tb.activation_memory(cfg, params, batch=8, tokens=(16, 32, 64))
    kept = [r["kept_bytes"] for r in rows]
    assert kept[0] < kept[1] < kept[2]
    for r in rows:
        assert 0.95 < r["kept_bytes"] / r["formula_bytes"] < 1.1, r          # the tape is what the formula says
        assert r["peak_bytes"] > r["kept_bytes"]                              # the backward adds gradients
    assert rows[2]["A_bytes"] == 16 * rows[0]["A_bytes"]                      # B·H·n²: 4× n, 16× bytes


def test_activation_memory_refuses_a_length_beyond_the_context():
    cfg, params = tb.qkv_model(TINY["gpt2"])
    with pytest.raises(QkvError, match="outside 2..64"):
        tb.activation_memory(cfg, params, batch=1, tokens=(128,))


def fake_result() -> dict:
    """What `measure` returns, with made-up numbers."""
    def row(name, qkv_s, torch_s, params):
        spec = tb.MODELS[name]
        tokens = spec.batch * spec.tokens
        return {"model": name, "label": spec.label, "config": spec.hf, "batch": spec.batch, "tokens": spec.tokens,
                "parameters": params, "qkv_s": qkv_s, "torch_s": torch_s, "qkv_tokens_per_s": tokens / qkv_s,
                "torch_tokens_per_s": tokens / torch_s, "ratio": torch_s / qkv_s, "losses": [(4.2, 4.2)] * 2,
                "max_loss_diff": 3e-7}

    return {
        "rows": [row("induction", 0.040, 0.030, 406_016), row("gpt2", 0.500, 0.600, 3_418_112),
                 row("llama", 0.800, 0.400, 3_478_784)],
        "memory": [{"tokens": 64, "batch": 16, "kept_bytes": 80 * 2**20, "peak_bytes": 100 * 2**20,
                    "formula_bytes": 79 * 2**20, "A_bytes": 4 * 2**20, "torch_saved_bytes": 120 * 2**20},
                   {"tokens": 128, "batch": 16, "kept_bytes": 168 * 2**20, "peak_bytes": 210 * 2**20,
                    "formula_bytes": 168 * 2**20, "A_bytes": 16 * 2**20, "torch_saved_bytes": None}],
        "memory_model": "gpt2", "optim": tb.OPTIM,
        "machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11.7", "numpy": "2.4.6", "vector": ["avx2", "fma"],
                    "blas": {"internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell",
                             "num_threads": 2},
                    "env": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": None},
                    "torch": {"version": "2.13.0+cpu", "threads": 2, "capability": "AVX2"},
                    "transformers": "5.24.0"},
        "others_cores": 0.05, "repeats": 7, "warmup": 1, "settle_s": 0.3, "seed": 0,
    }


def test_the_report_renders_the_table_the_target_the_memory_and_the_machine():
    text = tb.markdown(fake_result(), command="qkv bench train --out docs/benchmarks.md")
    assert text.startswith("## Training\n")
    assert ("| induction: attention-only Llama (d_ff 0), as qkv train --task induction | L 2, d 64, H 4, d_ff 0, V 64 "
            "| 0.41M | 32 × 65 | 40 | 30 | 52,000 | 69,333 | 0.75× |") in text
    assert "| small Llama (GQA, SwiGLU) | L 4, d 256, H 8 / 2 K/V, d_ff 688, V 512 | 3.48M | 16 × 128 | 800 | 400 " \
           "| 2,560 | 5,120 | 0.50× |" in text
    assert "(here at worst 0.50× on llama: not met)" in text
    assert "within 3.0e-07 (tolerance 0.0001)" in text
    assert "| 64 | 80 | 79 | 1.01 | 4 |  | 100 | 120 |" in text
    assert "| 128 | 168 | 168 | 1.00 | 16 | 2.10× | 210 | — |" in text
    assert "grow 2.1× for 2× the tokens" in text
    assert "Test CPU, 2 cores, vector extensions avx2, fma" in text and "kernel Haswell, 2 threads" in text
    assert "torch 2.13.0+cpu (2 threads, AVX2 kernels)" in text
    assert "OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=unset" in text
    assert "Other processes kept 0.05 cores busy" in text
    assert "```sh\nqkv bench train --out docs/benchmarks.md\n```" in text


def test_the_report_without_memory_has_no_memory_table():
    result = fake_result()
    result["memory"] = None
    text = tb.markdown(result)
    assert "**Memory**" not in text and "| n | kept MB" not in text


def test_the_documented_command_reproduces_the_options():
    defaults = (tuple(tb.MODELS), tb.REPEATS, tb.MEMORY_TOKENS, True, None)
    assert train_command_line(*defaults, "docs/benchmarks.md") == tb.COMMAND
    assert train_command_line(("gpt2",), 3, (64, 128), False, 1, None) == \
        "qkv bench train --model gpt2 --repeats 3 --memory-tokens 64 --memory-tokens 128 --no-memory --threads 1"


def test_without_torch_the_command_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` now raises ImportError
    r = CliRunner().invoke(bench, ["train", "--model", "gpt2"])
    assert isinstance(r.exception, QkvError)
    message = str(r.exception)
    assert "\n" not in message and "train benchmark" in message and "pip install torch==2.13.0 transformers" in message


def test_a_memory_length_beyond_the_context_is_refused_before_any_timing(monkeypatch):
    monkeypatch.setattr(tb, "reference_stack", lambda: (None, None))   # get past the import check
    with pytest.raises(QkvError, match="--memory-tokens 1024 is outside 2..512"):
        tb.measure(models=("gpt2",), memory_tokens=(64, 1024))
    with pytest.raises(QkvError, match="unknown model 'gpt3'"):
        tb.measure(models=("gpt3",))
