"""core/capabilities.py: each layer's kind read from the config, what each kind supports, `require`'s one line; and
every command walked on the models whose layers are not (only) plain softmax attention: each runs (exit 0) or
refuses in one line (exit 2), never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.checkpoints.families import config_of
from qkv.core.capabilities import KIND_NAMES, NEEDS, SUPPORTS, kind_of, lacking, layer_kinds, layers_with, require, \
    supports
from qkv.runtime.errors import QkvError

KINDS = {                                     # fixture → its layers' kinds (tests/fixtures/make_fixtures.py's configs)
    "mamba": ("mamba", "mamba"),
    "mamba2": ("mamba2", "mamba2"),
    "jamba": ("mamba", "attention", "mamba", "attention"),
    "qwen3_next": ("delta", "gated", "delta"),
    "minimax": ("lightning", "minimax", "lightning"),
    "granitemoehybrid": ("mamba2", "attention", "mamba2"),
    "falcon_h1": ("parallel", "parallel"),
    "deepseek_v3": ("latent", "latent", "latent"),
    "gpt_oss": ("sinks", "sinks", "sinks"),
    "llama4_text": ("attention", "attention", "attention"),
    "gpt2": ("attention", "attention"),
}
WALKED = [name for name in KINDS if name != "gpt2"]


def config(name: str):
    """The fixture's config, read as loading reads it (no weights)."""
    return config_of(json.loads((MODELS / name / "config.json").read_text()))


@pytest.mark.parametrize("name", KINDS)
def test_each_layers_kind_is_read_from_the_config(name):
    cfg = config(name)
    assert layer_kinds(cfg) == KINDS[name]
    assert all(kind_of(cfg, i) in KIND_NAMES for i in range(cfg.n_layers))


def test_the_table_of_what_each_kind_supports():
    """Every kind and need is named; plain softmax attention supports every need but the FFN's; the others lack
    exactly what makes them other (a sink: rows below 1; a latent: no X·W_K; a gate: Z_h is not A·V)."""
    assert set(SUPPORTS) == set(KIND_NAMES)
    assert all(s <= set(NEEDS) for s in SUPPORTS.values())
    assert SUPPORTS["attention"] == set(NEEDS) - {"dense_ffn"}
    assert SUPPORTS["attention"] - SUPPORTS["sinks"] == {"plain_softmax"}
    assert SUPPORTS["attention"] - SUPPORTS["latent"] == {"qkv_heads"}
    assert SUPPORTS["attention"] - SUPPORTS["gated"] == {"plain_heads", "plain_block"}
    for kind in ("mamba", "mamba2", "delta", "lightning"):              # only the pipeline page, which draws their
        assert SUPPORTS[kind] == {"pipeline"}                           # own steps (viz/pipeline_mixer.py)
    assert "backward" not in SUPPORTS["parallel"] and "qkv_heads" in SUPPORTS["parallel"]


def test_the_ffn_need_reads_the_ffn_not_the_kind():
    """dense_ffn: a pure Mamba stack has no FFN, a routed layer none of d_ff neurons; Jamba's attention and Mamba
    layers alike may have one."""
    assert not any(supports(config("mamba"), i, "dense_ffn") for i in range(2))
    llama4 = config("llama4_text")
    assert [supports(llama4, i, "dense_ffn") for i in range(3)] == [not llama4.moe_layer(i) for i in range(3)]
    assert supports(config("gpt2"), 0, "dense_ffn")
    with pytest.raises(ValueError, match="unknown need"):
        supports(config("gpt2"), 0, "wings")


def test_require_names_the_model_the_first_layer_its_kind_and_the_way_out():
    jamba = config("jamba")
    with pytest.raises(QkvError) as e:
        require(jamba, "my-jamba", "the thing", {"qkv_heads"}, instead="use the other thing")
    message = str(e.value)
    assert message == ("the thing needs heads with W_Q, W_K, W_V and W_O, and layer 0 of my-jamba is a Mamba layer "
                       "(a selective scan: no q, k, v, no softmax); use the other thing")
    require(jamba, "my-jamba", "the thing", {"qkv_heads"}, layer=1)          # an attention layer: no error
    require(jamba, "my-jamba", "the thing", {"qkv_heads"}, layer=-1)         # negative: from the end (layer 3)
    with pytest.raises(QkvError, match="layer 0 of my-jamba is a Mamba layer"):   # gradients: every layer, always
        require(jamba, "my-jamba", "training", {"backward"}, layer=1)
    assert lacking(jamba, {"plain_softmax", "qkv_heads"}, layer=2) == (2, "qkv_heads")   # needs in NEEDS' order
    assert layers_with(jamba, {"qkv_heads"}) == [1, 3]
    assert lacking(config("gpt2"), set(NEEDS)) is None
    with pytest.raises(QkvError, match="layer 1 of m routes its FFN among experts"):
        require(config("llama4_text"), "m", "neurons", {"dense_ffn"})
    with pytest.raises(QkvError, match="layer 0 of m is softmax attention with attention sinks"):
        require(config("gpt_oss"), "m", "rows", {"plain_softmax"}, layer=0)


def test_copying_scores_leave_the_layers_without_heads_out():
    """Jamba: its attention layers' copying scores as the one head asks; its Mamba layers NaN (no W_V·W_O)."""
    from qkv.analysis.circuits import copying_score, copying_scores

    model = qkv.load(MODELS / "jamba")
    S = copying_scores(model)                                               # (L, H)
    assert np.isnan(S[[0, 2]]).all() and np.isfinite(S[[1, 3]]).all()
    assert S[1, 0] == pytest.approx(copying_score(model, 1, 0), rel=1e-9)
    with pytest.raises(QkvError, match="layer 2 of .* is a Mamba layer"):
        copying_score(model, 2, 0)


def test_the_pipeline_page_draws_falcon_h1s_attention_and_its_mixer():
    """Falcon-H1's layers have q, k, v (attention beside a Mamba-2 mixer) and the mixer's own steps: the page carries
    both (tests/test_pipeline_scan.py checks the mixer's numbers)."""
    from qkv.viz.pipeline import pipeline_payload, pipeline_trace

    model = qkv.load(MODELS / "falcon_h1")
    p = pipeline_payload(model, pipeline_trace(model, "the cat sat"))
    assert p["arch"]["layer_kinds"] == ["parallel", "parallel"] and sorted(p["mixers"]) == ["0", "1"]
    assert p["heads"]["q"]["norm"]["shape"][:2] == [2, model.config.n_heads]


# ── every command on every layer kind ─────────────────────────────────────────────────────────────────────────

def commands(m: str, tmp) -> dict[str, list[str]]:
    """Each command with the arguments it needs, on model directory M; the files it reads (`inputs`) or writes
    under TMP."""
    corpus, data = tmp / "corpus.txt", tmp / "animals.tsv"
    pair, score = ["a b c d", "a b c e"], ["--token", " b", "--other", " c"]
    return {
        "next": ["next", "a b c"], "generate": ["generate", "a b c", "--max-new-tokens", "2"],
        "show": ["show", "a b c", "--layer", "0"], "show-out": ["show", "a b c", "--out", str(tmp / "views")],
        "heads": ["heads", "a b c d"], "heads-file": ["heads", "--file", str(corpus)],
        "rollout": ["rollout", "a b c"], "lens": ["lens", "a b c"],
        "dla": ["dla", "a b c", "--token", " b"], "attribute": ["attribute", "a b c"],
        "circuits": ["circuits", "--layer", "0", "--head", "0"], "eap": ["eap", *pair, *score],
        "atp": ["atp", *pair, *score], "patch": ["patch", *pair, *score],
        "path-patch": ["path-patch", *pair, "--receivers", "1.0", *score],
        "trace-fact": ["trace-fact", "a b c d", "--subject", "b"], "diff": ["diff", "a b c", "--model-b", m],
        "diff-requantized": ["diff", "a b c", "--requantize-b", "Q8_0"],
        "neurons": ["neurons", "a b c", "--layer", "0"], "chat": ["chat", "hi", "--max-new-tokens", "2"],
        "steer": ["steer", "make", "--positive", "the cat", "--negative", "the dog", "--layer", "1", "--out",
                  str(tmp / "v.gguf")],
        "activations": ["activations", "--layer", "1", "--site", "resid", "--file", str(corpus), "--tokens", "32",
                        "--shard-tokens", "32", "--out", str(tmp / "acts")],
        "probe": ["probe", "--data", str(data), "--layer", "all"],
        "tuned-lens": ["tuned-lens", "train", "--file", str(corpus), "--tokens", "64", "--batch", "16", "--context",
                       "16", "--out", str(tmp / "lens")],
        **{f"explain-{topic}": ["explain", topic, "a b c d"] for topic in
           ("attention", "positions", "kv-cache", "gqa", "linear", "sparse", "flash", "ffn")},
        "explain-patching": ["explain", "patching", "a b c d | a b c e"],
        "explain-html": ["explain", "attention", "a b c", "--html", str(tmp / "p.html")],
    }


def inputs(tmp: Path) -> None:
    """The corpus and the labelled texts `commands` reads, written into TMP."""
    (tmp / "corpus.txt").write_text("the cat sat on the mat.\n" * 40)
    (tmp / "animals.tsv").write_text("".join(f"the {a} sat on the {b}\t{a}\n" for a in ("cat", "dog")
                                             for b in ("mat", "hill", "bed")))


def run(monkeypatch, capsys, tmp: Path, name: str, command: list[str] | str) -> tuple[int, str, str]:
    """`qkv -q COMMAND --model` the fixture NAME (COMMAND a name of `commands` or a list of arguments)."""
    m = str(MODELS / name)
    inputs(tmp)
    args = commands(m, tmp)[command] if isinstance(command, str) else command
    return run_main(monkeypatch, capsys, "-q", *args, "--model", m)


COMMANDS = list(commands("m", Path(".")))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", WALKED)
def test_every_command_runs_or_refuses_in_one_line(monkeypatch, capsys, tmp_path, name, command):
    code, _, err = run(monkeypatch, capsys, tmp_path, name, command)
    assert "Traceback" not in err, err
    assert code == 0 or (code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("qkv: error:")), \
        (code, err)


@pytest.mark.parametrize("name, command, words", [
    ("mamba", "circuits", "layer 0 of .* is a Mamba layer"),            # was an AttributeError (W_Q)
    ("mamba", "eap", "layer 0 of .* is a Mamba layer"),                 # was an AttributeError (b_O)
    ("qwen3_next", "circuits", "gated delta \\(linear-attention\\) layer"),
    ("falcon_h1", "explain-attention", "side by side"),                 # was a failed check (RoPE(Q) differs)
    ("deepseek_v3", "circuits", "multi-head latent attention"),
    ("gpt_oss", "explain-flash", "attention sinks"),
    ("mamba", "diff-requantized", "compare two checkpoints"),           # was an AttributeError (W_QKV)
])
def test_the_refusals_name_the_layer_kind(monkeypatch, capsys, tmp_path, name, command, words):
    code, _, err = run(monkeypatch, capsys, tmp_path, name, command)
    assert code == 2 and re.search(words, err) and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name, command", [("jamba", "explain-flash"), ("minimax", "explain-flash"),
                                           ("minimax", "explain-gqa"),           # its softmax layer's K/V heads
                                           ("deepseek_v3", "explain-flash"), ("falcon_h1", "explain-sparse"),
                                           ("mamba", "diff"), ("jamba", "circuits-attention")])
def test_what_a_layer_kind_supports_still_runs(monkeypatch, capsys, tmp_path, name, command):
    """The lessons and analyses pick or accept the layers that can do it (Jamba's attention layer 1, MiniMax's
    softmax layer, DeepSeek's recorded q and k), rather than refusing the whole model."""
    args = ["circuits", "--layer", "1", "--head", "0"] if command == "circuits-attention" else command
    code, out, err = run(monkeypatch, capsys, tmp_path, name, args)
    assert code == 0 and out, err
