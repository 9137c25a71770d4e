"""The pipeline page's scan and linear-attention layers (issue 47) on random checkpoints of other knob values than the
committed fixtures: every case of the families' own live tests (Mamba, Mamba-2, Jamba, Granite 4, Falcon-H1,
Qwen3-Next, MiniMax: other heads, groups, state sizes, conv taps, block sizes, activations, layer orders), built by
transformers, saved, loaded by qkv in float64: in every layer with a mixer, every implied matrix the trace keeps
(trace.MIXER) times its values is the layer's output to 1e-9 (relative to its scale), 0 above the diagonal, and the
page's payload carries every such layer."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import test_live_falcon_h1
import test_live_granitemoehybrid
import test_live_jamba
import test_live_mamba
import test_live_mamba2
import test_live_minimax
import test_live_qwen3_next
from live_helpers import perturb_, save
from transformers import AutoModelForCausalLM

import qkv
from qkv.core.capabilities import layer_kinds
from qkv.viz.pipeline import PIPELINE_KEEP, pipeline_payload
from qkv.viz.pipeline_mixer import MIXING, layer_arrays

pytestmark = pytest.mark.live

MODULES = {"mamba": test_live_mamba, "mamba2": test_live_mamba2, "jamba": test_live_jamba,
           "granitemoehybrid": test_live_granitemoehybrid, "falcon_h1": test_live_falcon_h1,
           "qwen3_next": test_live_qwen3_next, "minimax": test_live_minimax}
CASES = [pytest.param(case.values[0], id=f"{family}-{case.id}") for family, module in MODULES.items()
         for case in module.CASES]


@pytest.mark.parametrize("config", CASES)
def test_the_implied_matrices_reproduce_each_layers_output(config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    perturb_(model, seed + 1)
    ours = qkv.load(save(model.float().eval(), tmp_path / "hf"), dtype=np.float64)
    ids = np.random.default_rng(seed).integers(3, config.vocab_size, 12).tolist()
    trace = ours.run(ids, keep=PIPELINE_KEEP)                     # (no tokenizer: pipeline_trace takes a text)
    kinds = layer_kinds(ours.config)
    mixed = [i for i, kind in enumerate(kinds) if kind in MIXING]
    for i in mixed:
        a = layer_arrays(trace.layers[i])
        n = a["matrix"].shape[-1]
        assert np.all(a["matrix"][:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)
        scale = np.abs(a["out"]).max()
        assert np.abs(a["matrix"] @ a["v"] - a["out"]).max() <= 1e-9 * scale, (request.node.callspec.id, i)
    p = pipeline_payload(ours, trace)
    assert sorted((p.get("mixers") or {}), key=int) == [str(i) for i in mixed]

