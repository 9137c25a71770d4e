"""Families as data (issue 44): each family module's one tensor table (qkv.checkpoints.table) read both ways, and
families found by their module, not listed: a new family with existing knobs is one new file. The README's table of
families (issue 47) is the modules' own rows (ABOUT), and what each kind runs is run here."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Callable, NamedTuple

import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv
from conftest import FIXTURES, MODELS, reference, run_main
from qkv.checkpoints import families, gguf_archs, weights_from_tensors
from qkv.checkpoints.common import ignorable
from qkv.checkpoints.families import FAMILIES, GGUF_ARCHS, MACHINERY, about, family_of
from qkv.checkpoints.table import COMMANDS, KINDS
from qkv.cli.families import families_markdown

# A family qkv has never seen, written as a developer would add one: this file alone (its config reader, its
# tensor table, its llama.cpp architecture), with knobs qkv has (pre-norm LayerNorm, learned positions, a fused
# [Q; K; V] Linear with biases, GELU, an untied head).
TOY = '''
"""Toy: a made-up family for tests."""

from qkv.checkpoints.common import HF_ACTIVATIONS, activation, need, reads_back
from qkv.checkpoints.table import LINEAR, Arch, Head, Row, layer_norm, linear, read_table, write_table
from qkv.core.config import ModelConfig

MODEL_TYPES = ("toy_lm",)
IGNORED = {}

ROWS = [
    Row("tok_embed", "tokens.weight", "V d"),
    Row("pos_embed", "positions.weight", "P d"),
    *layer_norm("block.attn_norm", "blocks.{i}.norm1"),
    Row(("block.attn.W_Q", "block.attn.W_K", "block.attn.W_V"), "blocks.{i}.qkv.weight", "d q+kv+kv", LINEAR,
        parts="q kv kv"),
    Row(("block.attn.b_Q", "block.attn.b_K", "block.attn.b_V"), "blocks.{i}.qkv.bias", "q+kv+kv", parts="q kv kv"),
    *linear("block.attn.W_O", "blocks.{i}.out", "q d", "block.attn.b_O"),
    *layer_norm("block.ffn_norm", "blocks.{i}.norm2"),
    *linear("block.ffn.W_in", "blocks.{i}.up", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "blocks.{i}.down", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "norm"),
    Row("W_vocab", "head.weight", "d V", Head(), root=True),
]

GGUF = {"toy": Arch("toy_lm", "ToyForCausalLM", {"attn_qkv": "qkv"}, {"token_embd": "tokens"}, norm="layer")}


def config(hf):
    return ModelConfig(family="toy_lm", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "width"),
                       n_layers=need(hf, "depth"), n_heads=need(hf, "heads"), d_ff=need(hf, "ffn"),
                       max_positions=need(hf, "positions"), causal=True, norm="layer", norm_place="pre",
                       position="learned", activation=activation(hf.get("act", "gelu")),
                       tied_embeddings=False, final_norm=True, lm_head=True)


def hf_config(cfg):
    return reads_back(cfg, {"model_type": "toy_lm", "vocab_size": cfg.vocab_size, "width": cfg.d_model,
                            "depth": cfg.n_layers, "heads": cfg.n_heads, "ffn": cfg.d_ff,
                            "positions": cfg.max_positions, "act": HF_ACTIVATIONS[cfg.activation]}, config)


def weights(store, cfg, dtype):
    return read_table(ROWS, store, cfg, dtype)


def tensors(weights, cfg):
    return write_table(ROWS, weights, cfg, "model.")
'''

TOY_CONFIG = {"model_type": "toy_lm", "vocab_size": 50, "width": 16, "depth": 2, "heads": 2, "ffn": 24,
              "positions": 12}


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family's one file in a folder of its own, found as qkv finds its families; unregistered after."""
    folder = tmp_path / "toy_families"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "toy_lm.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    before, archs = dict(FAMILIES), dict(GGUF_ARCHS)
    yield families.discover(folder, "toy_families")
    FAMILIES.clear(), FAMILIES.update(before)
    GGUF_ARCHS.clear(), GGUF_ARCHS.update(archs)


def test_a_new_family_is_one_file(toy_family, tmp_path):
    """Discovered from its file: loadable, savable, initialisable, its GGUF architecture known; what is saved
    reads back as the same model, number for number, under the table's names."""
    (module,) = toy_family
    assert family_of("toy_lm") is module and gguf_archs.arch_of("toy").family == "toy_lm"
    model = qkv.init(TOY_CONFIG, seed=3)
    model.save(tmp_path / "saved")
    stored = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert "model.blocks.1.qkv.weight" in stored and "head.weight" in stored
    assert stored["model.blocks.0.qkv.weight"].shape == (48, 16)                      # [Q; K; V] rows, (out, in)
    np.testing.assert_array_equal(stored["model.blocks.0.qkv.weight"][16:32].T, model.weights.blocks[0].attn.W_K)
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["model_type"] == "toy_lm"
    back = qkv.load(tmp_path / "saved")
    ids = np.array([[1, 5, 7, 9, 2]])
    np.testing.assert_array_equal(back.forward(ids).logits, model.forward(ids).logits)
    t = module.tensors(model.weights, model.config)                               # read back: views of the fused one
    attn = weights_from_tensors(t, model.config).blocks[0].attn
    assert all(np.shares_memory(W, t["model.blocks.0.qkv.weight"]) for W in (attn.W_Q, attn.W_K, attn.W_V))


def test_every_family_module_is_registered_by_discovery():
    """No list by hand: every module of the folder that declares MODEL_TYPES is a family, and only those."""
    from pathlib import Path
    import pkgutil

    import qkv.checkpoints as package

    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - MACHINERY
    assert {m.__name__.rsplit(".", 1)[1] for m in FAMILIES.values()} == modules
    assert all(a.family in FAMILIES for a in GGUF_ARCHS.values())
    assert "from . import" not in Path(families.__file__).read_text()          # no family imported by name


def _tabled():
    """The fixtures of the families whose tensors are a table (ROWS)."""
    names = []
    for path in sorted(MODELS.iterdir()):
        if (path / "config.json").is_file():
            kind = json.loads((path / "config.json").read_text())["model_type"]
            if hasattr(FAMILIES.get(kind), "ROWS"):
                names.append(path.name)
    return names


@pytest.mark.parametrize("name", _tabled())
def test_the_table_writes_back_the_checkpoint_it_read(name):
    """Read by the table, written by the same table: every tensor of the fixture comes back bit for bit under
    its own name (the task model's prefix aside), but those the family IGNOREs. (Gemma's γ, held as 1 + w,
    comes back as (1 + w) − 1: w to float32's rounding of 1 + w.)"""
    model = qkv.load(MODELS / name)
    family = family_of(model.config.family)
    written = family.tensors(model.weights, model.config)
    stored = load_file(str(MODELS / name / "model.safetensors"))

    def bare(n: str) -> str:
        for prefix in ("model.", "transformer.", "gpt_neox.", "roberta.", "electra.", "distilbert.", "vit."):
            if n.startswith(prefix):
                return n[len(prefix):]
        return n

    mine, theirs = {bare(k): v for k, v in written.items()}, {bare(k): v for k, v in stored.items()}
    for key, value in theirs.items():
        if key not in mine:
            assert ignorable(key, family.IGNORED), key
            continue
        assert mine[key].shape == value.shape, key
        plus_one = model.config.family in ("gemma", "gemma2", "gemma3_text", "qwen3_next") and "norm" in key
        np.testing.assert_allclose(mine[key], value.astype(mine[key].dtype), rtol=0, atol=1e-7 if plus_one else 0,
                                   err_msg=key)
    assert set(mine) <= set(theirs)


# ── the README's table of families (issue 47): every model_type in one row, made from the family modules ───

README = FIXTURES.parents[1] / "README.md"


def test_every_model_type_is_in_exactly_one_row_of_its_own_module():
    """Each family module declares its README rows (ABOUT): every model_type it reads in one row, of its own module
    (a family added without its row fails here, by name)."""
    rows, missing, foreign = about(), {}, {}
    for module in dict.fromkeys(FAMILIES.values()):
        name = module.__name__.rsplit(".", 1)[1]
        declared = [t for row in getattr(module, "ABOUT", ()) for t in row.types]
        if unrowed := [t for t in module.MODEL_TYPES if t not in declared]:
            missing[name] = unrowed
        if unread := [t for t in declared if t not in module.MODEL_TYPES]:
            foreign[name] = unread
    assert not missing, "\n".join(
        f"checkpoints/{name}.py reads model_type {', '.join(types)} but no row of its ABOUT names it: add an About row "
        "(table.About: types, models, brings, kind) to its ABOUT = (…), then regenerate the README's table with "
        "`qkv models --families --markdown`" for name, types in missing.items())
    assert not foreign, f"an ABOUT names model_types its module does not read (MODEL_TYPES): {foreign}"
    listed = [t for row in rows for t in row.about.types]
    assert sorted(listed) == sorted(FAMILIES), "a model_type is in two rows of the table of families"


def test_the_gguf_column_is_the_modules_gguf_table():
    """A row's GGUF architectures are those of its module's GGUF table that load as one of its model_types (its
    family, or one its `also` names: olmo2 files with a window are OLMo 3): every architecture qkv reads is in one
    row by its family, none is typed twice."""
    rows = about()
    for row in rows:
        assert set(row.gguf) == {name for name, arch in GGUF_ARCHS.items()
                                 if arch.family in row.about.types or set(arch.also) & set(row.about.types)}
    rowed = {t for row in rows for t in row.about.types}            # (a family without its row: the test above)
    assert sorted(a for row in rows for a in row.gguf if GGUF_ARCHS[a].family in row.about.types) == \
        sorted(n for n, a in GGUF_ARCHS.items() if a.family in rowed)
    assert next(r for r in rows if "olmo3" in r.about.types).gguf == ("olmo2",)
    llama = next(r for r in rows if "llama" in r.about.types)
    assert llama.gguf == ("llama", "qwen2", "qwen3") and llama.module == "llama"


def test_the_markdown_table_has_one_line_per_row_and_five_cells():
    """`qkv models --families --markdown`: a header, one line per row with five cells (a | of the text escaped:
    ModernBERT's |i − j|), then what each kind runs, a line per kind."""
    text = families_markdown()
    table, lead, kinds, note = text.split("\n\n")
    lines = table.splitlines()
    assert len(lines) == 2 + len(about())
    for line in lines:
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        assert len(cells) == 5, line
    assert "\\|i − j\\| ≤" in table
    opt = next(line for line in lines if line.startswith("| `opt` |"))
    assert opt.endswith("| decoder, no `dla` when post-LN (OPT-350m) | — |")
    assert "| `llama` with `expert_count`, `qwen2moe`, `qwen3moe`, `olmoe` |" in table
    assert lead.startswith("What each kind runs") and len(kinds.splitlines()) == 2 + len(KINDS)
    assert note.startswith("A checkpoint without the head") and text.endswith("in one line.\n")
    assert "| audio | `show` | — | — | — |" in kinds


def test_the_readme_holds_the_table(monkeypatch, capsys):
    """README.md's table of families is the command's output, word for word (regenerate it with
    `qkv models --families --markdown`)."""
    code, out, err = run_main(monkeypatch, capsys, "models", "--families", "--markdown")
    assert code == 0, err
    assert out == families_markdown()
    assert out in README.read_text(encoding="utf-8"), ("README.md's table of families differs from "
                                                       "`qkv models --families --markdown`: paste its output there")


def test_models_families_prints_every_model_type(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")
    code, out, err = run_main(monkeypatch, capsys, "models", "--families")
    assert code == 0, err
    assert all(t in out for row in about() for t in row.about.types) and "masked-LM encoder" in out
    assert "qkv.train.gradients" in out
    code, out, err = run_main(monkeypatch, capsys, "models", "--markdown")
    assert code == 2 and "give --families --markdown" in err and len(err.strip().splitlines()) == 1


# What each kind runs, proved on one committed fixture of it (tiny inputs): every command its kind names runs,
# every other is refused in one line (exit 2); training (qkv.train.gradients) runs or is refused (QkvError); the
# experts: the trace records the router's choice, or holds none.

class KindCase(NamedTuple):
    source: str                                  # the model
    args: dict[str, list[str]]                   # each command's arguments (a command not named: [args["show"][0]])
    train: Callable                              # model → qkv.train.gradients(model, …)
    run: Callable                                # model → its trace


def _whisper(tmp_path) -> tuple[str, str]:
    """The whisper fixture with a word-level tokenizer.json (w4 … w59), and a log-mel features file."""
    import shutil
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = tmp_path / "whisper"
    shutil.copytree(MODELS / "whisper", out)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<start>": 3} | {f"w{i}": i for i in range(4, 60)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    np.save(tmp_path / "sound.npy", reference("whisper")["input_features"][0])
    return str(out), str(tmp_path / "sound.npy")


def _text_case(source: str, text: str, other: str, token: str, labels: bool) -> KindCase:
    """A text model: TEXT for every command, OTHER as patching's corrupted text (decoders: TOKEN its answer)."""
    from qkv.train import gradients

    answers = ["--token", token, "--other", " on"] if not labels else []
    args = {"show": [text], "patch": [text, other, *answers], "dla": [text, "--token", token],
            "generate": [text, "--max-new-tokens", "2"]}
    def train(m):
        ids = m.encode(text)[0]
        return gradients(m, ids, labels=ids if labels else None)
    return KindCase(source, args, train, lambda m: m.run(text))


def _kind_case(kind: str, tmp_path) -> KindCase:
    """The fixture of KIND and how each command reads it."""
    from qkv.checkpoints import digits_dir
    from qkv.train import gradients

    if kind in ("decoder", "MoE decoder"):
        return _text_case(str(MODELS / ("llama_gqa" if kind == "decoder" else "mixtral")), "the cat sat on",
                          "the mat sat on", " the", labels=False)
    if kind == "encoder":                                  # no LM head: attribution explains a cosine
        case = _text_case(str(MODELS / "bert"), "the cat sat on the mat", "the dog sat on the mat", "the", labels=True)
        return case._replace(args=case.args | {"attribute": ["the cat sat on the mat", "--compare", "the dog sat"]})
    if kind == "masked-LM encoder":
        return _text_case(str(MODELS / "roberta"), "the cat <mask> on the mat", "the dog <mask> on the mat", " the",
                          labels=True)
    if kind == "encoder–decoder":                          # the source, and the target so far (--prefix)
        text, prefix = "나는 학교에 간다", ["--prefix", "I"]
        args = {c: [text, *prefix] for c in ("show", "lens", "attribute", "next")} | {
            "patch": [text, "너는 학교에 간다", "--token", "I", "--other", "you"],
            "dla": [text, *prefix, "--token", "go"], "generate": [text, "--max-new-tokens", "2"]}
        return KindCase("ko-en-tiny", args, lambda m: gradients(m, m.encode(text)[0][None], labels=np.array([[5, 6]])),
                        lambda m: m.run(text, "I"))
    if kind == "image":
        three, five = str(digits_dir() / "digit-3.png"), str(digits_dir() / "digit-5.png")
        args = {"show": [three], "patch": [three, five], "dla": [three, "--token", "3"],
                "generate": [three, "--max-new-tokens", "2"]}
        def train(m):
            return gradients(m, m.pixel_values(three)[1][None], labels=np.array([1]))
        return KindCase(str(MODELS / "vit"), args, train, lambda m: m.run(three))
    source, features = _whisper(tmp_path)                 # audio: log-mel features, and the transcript (--prefix)
    args = {c: [features, "--prefix", "w5 w9"] for c in ("show", "lens", "attribute", "next")} | {
        "patch": [features, features, "--prefix", "w5 w9", "--token", "w11", "--other", "w12"],
        "dla": [features, "--prefix", "w5 w9", "--token", "w11"], "generate": [features, "--max-new-tokens", "2"]}
    feats = np.load(features)[None]
    return KindCase(source, args, lambda m: gradients(m, feats, labels=np.array([[5, 9]])),
                    lambda m: m.run(feats[0], [5, 9]))


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_runs_the_commands_the_table_names(kind, monkeypatch, capsys, tmp_path):
    case = _kind_case(kind, tmp_path)
    model = qkv.load(case.source)
    supported = set(KINDS[kind])
    for command in (c for group in COMMANDS.values() for c in group):
        if command == "gradients":
            try:
                ran = case.train(model) is not None
            except qkv.QkvError:
                ran = False
            assert ran == (command in supported), f"{kind}: training {'refused' if command in supported else 'ran'}"
        elif command == "experts":
            trace = case.run(model)
            stacks = [trace] + [s for s in (getattr(trace, "encoder", None),) if s is not None]
            routed = any(layer.experts is not None for s in stacks for layer in s.layers.values())
            assert routed == (command in supported), f"{kind}: experts {'recorded' if routed else 'not recorded'}"
        else:
            given = case.args.get(command, case.args["show"][:1])
            code, out, err = run_main(monkeypatch, capsys, command, "--model", case.source, *given)
            if command in supported:
                assert code == 0, f"{kind}: qkv {command} {given} failed: {err}"
            else:
                assert code == 2 and len(err.strip().splitlines()) == 1, f"{kind}: qkv {command} {given}: {code} {err}"


def _text_fixtures() -> list[str]:
    """The committed fixtures of every text family (decoders, encoders) whose row is in the table, but those without
    the head their kind reads (the test below)."""
    kinds = {t: row.about.kind for row in about() for t in row.about.types}
    names = [p.name for p in sorted(MODELS.iterdir()) if (p / "config.json").is_file()]
    kind = {n: kinds.get(json.loads((MODELS / n / "config.json").read_text())["model_type"]) for n in names}
    return [n for n in names if kind[n] in ("decoder", "MoE decoder", "encoder", "masked-LM encoder")
            and n not in ("electra_discriminator", "modernbert_local")]


@pytest.mark.parametrize("name", _text_fixtures())
def test_dla_and_training_run_on_every_text_fixture_whose_row_says_so(name):
    """Direct logit attribution and training, the commands a row most often refuses (OLMo 2/3's and Gemma 2/3's
    normalised box outputs, post-LN OPT — the committed OPT fixture is post-LN — for DLA): each runs on every
    committed fixture of a text family iff its row says so, and is refused in one QkvError otherwise."""
    from qkv.analysis.attribution import direct_logit_attribution
    from qkv.train import gradients

    model = qkv.load(MODELS / name)
    row = next(r.about for r in about() if model.config.family in r.about.types)
    ids = np.array([[1, 2, 3, 4]])
    calls = {"dla": lambda: direct_logit_attribution(model, ids[0], 5),
             "gradients": lambda: gradients(model, ids, labels=None if model.config.causal else ids)}
    for command, call in calls.items():
        try:
            call()
            ran = True
        except qkv.QkvError:
            ran = False
        assert ran == (command in row.supports()), f"{name}: {command} {'ran' if ran else 'refused'}; its row: " \
                                                    f"{row.kind}, refusing {row.refuses}"


@pytest.mark.parametrize("name", ["electra_discriminator", "modernbert_local", "vit_base"])
def test_a_checkpoint_without_its_head_refuses_what_needs_it(name):
    """The table's note: ELECTRA's discriminator and ModernBertModel (no masked-LM head) refuse the lens and
    training, ViTModel (no classifier) training, each in one QkvError."""
    from qkv.analysis.lens import logit_lens
    from qkv.train import gradients

    model = qkv.load(MODELS / name)
    ids = np.array([[1, 2, 3, 4]])
    if name == "vit_base":
        pixels = np.zeros((1, model.config.num_channels, *model.config.image_size), np.float32)
        with pytest.raises(qkv.QkvError, match="classifier"):
            gradients(model, pixels, labels=np.array([0]))
        return
    with pytest.raises(qkv.QkvError, match="no LM head"):
        logit_lens(model, ids[0])
    with pytest.raises(qkv.QkvError, match="masked-LM encoder"):
        gradients(model, ids, labels=ids)
    assert "(ELECTRA's discriminator, `ModernBertModel`, `ViTModel`)" in families_markdown()
