"""`qkv bench patch` without torch: the report from made-up numbers, the command, the missing stack.

The timing against TransformerLens runs only with the reference stack (`qkv bench patch`).
"""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from qkv.bench import patching as pb
from qkv.cli.bench import bench, patch_command_line
from qkv.runtime.errors import QkvError


def fake_result() -> dict:
    """What `measure` returns, with made-up numbers."""
    return {
        "qkv_s": [24.0, 22.5], "tl_s": [410.0, 398.0], "ratio": 398.0 / 22.5, "max_diff": 2.4e-5, "tol": pb.TOL,
        "shape": [30, 9], "tokens": 14, "metric": [6.12, -5.485], "tl_metric": [6.12, -5.485],
        "qkv": {"passes": 21, "runs": 189, "skipped": 81}, "tl": {"passes": 272},
        "top": [{"layer": 23, "head": 3, "qkv": 0.58, "tl": 0.5801}, {"layer": 29, "head": 1, "qkv": 0.27, "tl": 0.27},
                {"layer": 24, "head": 4, "qkv": -0.25, "tl": -0.2501}],
        "model": "SmolLM2-135M-Instruct",
        "machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11.7", "numpy": "2.4.6", "vector": ["avx2", "fma"],
                    "blas": {"internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell",
                             "num_threads": 2},
                    "env": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None},
                    "torch": {"version": "2.13.0+cpu", "threads": 2, "capability": "AVX2"},
                    "transformers": "5.24.0", "transformer_lens": "4.3.0"},
        "others_cores": 0.1, "repeats": 2, "settle_s": 1.0,
    }


def test_the_report_renders_the_times_the_ratio_the_agreement_and_the_machine():
    text = pb.markdown(fake_result(), command="qkv bench patch --out docs/benchmarks.md")
    assert text.startswith("## Activation patching\n")
    assert "on SmolLM2-135M-Instruct (30 layers × 9 heads, 14 tokens)" in text
    assert "(6.120 clean, -5.485 corrupted)" in text
    assert ("| qkv `analysis.patch` | 24.0 / 22.5 | 21 batched, over blocks l..29 (189 patched copies, 81 skipped) |"
            in text)
    assert ("| TransformerLens `get_act_patch_attn_head_out_all_pos` | 410.0 / 398.0 | 272 whole (30 × 9 patched, "
            "clean cache, corrupted baseline) |") in text
    assert "TransformerLens ÷ qkv (the faster run of each): **17.7×**." in text
    assert "agree within 2.4e-05 (tolerance 0.001)" in text
    assert "L23.H3 +0.580 / +0.580, L29.H1 +0.270 / +0.270, L24.H4 -0.250 / -0.250" in text
    assert "Test CPU, 2 cores, vector extensions avx2, fma" in text and "kernel Haswell, 2 threads" in text
    assert "torch 2.13.0+cpu (2 threads, AVX2 kernels), transformers 5.24.0, transformer-lens 4.3.0" in text
    assert "OPENBLAS_CORETYPE=unset" in text and "Other processes kept 0.10 cores busy" in text
    assert "2 run(s) each, 1 s of sleep before each" in text
    assert "```sh\nqkv bench patch --out docs/benchmarks.md\n```" in text


def test_the_report_names_the_prompts_of_docs_patching():
    text = pb.markdown(fake_result())
    assert f'clean "{pb.CLEAN}", corrupted "{pb.CORRUPTED}"' in text
    assert pb.CLEAN.endswith("John gave a drink to") and pb.CORRUPTED.endswith("Mary gave a drink to")
    assert text.endswith(f"```sh\n{pb.COMMAND}\n```")


def test_the_documented_command_reproduces_the_options():
    assert patch_command_line(pb.REPEATS, None, "docs/benchmarks.md") == pb.COMMAND
    assert patch_command_line(1, 2, None) == "qkv bench patch --repeats 1 --threads 2"


@pytest.mark.parametrize("missing", ["torch", "transformer_lens"])
def test_without_the_reference_stack_the_command_says_how_to_get_it(monkeypatch, missing):
    import types
    for present in {"torch", "transformers", "transformer_lens"} - {missing}:   # the others importable, even
        monkeypatch.setitem(sys.modules, present, types.ModuleType(present))    # where make test has no torch
    monkeypatch.setitem(sys.modules, missing, None)          # `import MISSING` now raises ImportError
    r = CliRunner().invoke(bench, ["patch", "--repeats", "1"])
    assert isinstance(r.exception, QkvError)
    message = str(r.exception)
    assert "\n" not in message and "patching benchmark" in message and f"({missing} is missing)" in message
    assert "pip install torch==2.13.0 transformers transformer-lens==4.3.0" in message
