"""Steering vectors that are not SAE features (`qkv.analysis.steering`, `qkv.checkpoints.control_vector`,
`qkv steer make`, `--steer FILE@LAYER:SCALE`, `--ablate-direction FILE`).

Every check is an identity that can fail:
  - the steering hook equals adding the vector by hand: the stream leaving block L plus scale·v, run through the
    rest of the model by `Model.from_layer` (no hook involved), gives the steered pass's logits (float64, 1e-10);
  - directional ablation leaves the direction's component of the stream 0 (≤ 1e-12 of the stream, float64) at
    every point it is applied, at every layer, and changes the logits;
  - the control vector round-trips bit for bit, and its metadata and tensor names are llama.cpp's exactly;
  - the commands write what model.generate with the same hooks writes, and refuse mistakes in one line (exit 2).
The fixtures are the committed tiny models, computing in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.analysis.steering import (ablation_hooks, contrast, contrastive_vector, parse_vector_spec, steering_hooks)
from qkv.checkpoints.control_vector import read_control_vector, write_control_vector
from qkv.runtime.errors import QkvError

TEXT = "the cat sat on the mat and the dog ran"
POSITIVE = ["the cat sat on the mat", "a dog ran to the park", "the bird sang"]
NEGATIVE = ["on the mat it rained", "in the park nobody came", "the end"]
FAMILIES = ["gpt2", "llama_gqa", "gemma2", "phi", "olmo2", "mixtral"]       # pre-norm, soft-caps, parallel, MoE


def load64(name: str):
    return qkv.load(MODELS / name, dtype=np.float64)


@pytest.fixture(scope="module")
def gpt2():
    return load64("gpt2")


@pytest.mark.parametrize("family", FAMILIES)
def test_steering_equals_adding_the_vector_by_hand(family):
    model = load64(family)
    L = model.config.n_layers
    layer = max(1, L - 2)
    v = contrastive_vector(model, POSITIVE, NEGATIVE, [layer])[layer]                # (d_model,)
    assert v.shape == (model.config.d_model,) and np.linalg.norm(v) > 0
    steered = model.run(TEXT, hooks=steering_hooks({layer: v}, scale=3.5)).logits     # (n, V)
    x = model.run(TEXT, keep=("residual_out",)).layer(layer).residual_out + 3.5 * v   # (n, d_model)
    _, by_hand = model.from_layer(x[None], layer + 1)                                  # (1, 1, V), no hook
    assert np.abs(steered[-1] - by_hand[0, -1]).max() <= 1e-10 * max(1.0, np.abs(by_hand).max())
    assert np.abs(steered - model.run(TEXT).logits).max() > 1e-3                     # the vector is felt


def test_the_difference_of_means_is_the_two_means_subtracted(gpt2):
    sides = contrast(gpt2, POSITIVE, NEGATIVE, [1], position="mean")
    want = np.mean([gpt2.run(t, keep=("residual_out",)).layer(1).residual_out[1:].mean(0) for t in POSITIVE], 0) \
        - np.mean([gpt2.run(t, keep=("residual_out",)).layer(1).residual_out[1:].mean(0) for t in NEGATIVE], 0)
    assert np.abs(sides.vectors[1] - want).max() <= 1e-12
    last = contrastive_vector(gpt2, POSITIVE, NEGATIVE, [1])[1]
    want = np.mean([gpt2.run(t, keep=("residual_out",)).layer(1).residual_out[-1] for t in POSITIVE], 0) \
        - np.mean([gpt2.run(t, keep=("residual_out",)).layer(1).residual_out[-1] for t in NEGATIVE], 0)
    assert np.abs(last - want).max() <= 1e-12
    row = sides.summary()[0]
    assert abs(row["positive_projection"] - row["negative_projection"] - row["norm"]) <= 1e-9 * row["norm"]


@pytest.mark.parametrize("family", FAMILIES)
def test_directional_ablation_leaves_no_component_anywhere(family):
    model = load64(family)
    r = np.random.default_rng(1).standard_normal(model.config.d_model)               # (d_model,)
    r_hat = r / np.linalg.norm(r)
    trace = model.run(TEXT, hooks=ablation_hooks(r, model.config), keep=("residual", "residual_mid", "residual_out"))
    plain = model.run(TEXT, keep=("residual",))
    assert np.abs(plain.layer(0).residual @ r_hat).max() > 1e-3                        # there was one to remove
    points = ("residual", "residual_out") + (() if model.config.parallel_residual else ("residual_mid",))
    for layer in range(model.config.n_layers):
        for point in points:
            x = getattr(trace.layer(layer), point)                                     # (n, d_model)
            assert np.abs(x @ r_hat).max() <= 1e-12 * max(1.0, np.abs(x).max()), (layer, point)
    assert np.abs(trace.logits - model.run(TEXT).logits).max() > 1e-6


def test_ablating_two_directions_removes_their_span(gpt2):
    rng = np.random.default_rng(2)
    rs = rng.standard_normal((2, gpt2.config.d_model))                                # (2, d_model)
    trace = gpt2.run(TEXT, hooks=ablation_hooks(rs, gpt2.config), keep=("residual_out",))
    for layer in range(gpt2.config.n_layers):
        x = trace.layer(layer).residual_out
        assert np.abs(x @ rs.T).max() <= 1e-12 * np.abs(x).max() * np.abs(rs).max() * 10
    with pytest.raises(QkvError, match="span of the others"):
        ablation_hooks(np.stack([rs[0], 2 * rs[0]]), gpt2.config)
    with pytest.raises(QkvError, match="span of the others"):
        ablation_hooks(np.zeros(gpt2.config.d_model), gpt2.config)


def test_generation_with_the_cache_equals_generation_without_it(gpt2):
    v = contrastive_vector(gpt2, POSITIVE, NEGATIVE, [1])[1]
    hooks = {**ablation_hooks(np.ones(gpt2.config.d_model), gpt2.config), **steering_hooks({1: v}, 4.0)}
    ids, _ = gpt2.encode("the cat sat on")
    cached = gpt2.generate(ids[None, :], 8, temperature=0, hooks=hooks)
    whole = gpt2.generate(ids[None, :], 8, temperature=0, hooks=hooks, use_cache=False)
    assert np.array_equal(cached, whole)


# ── the file: llama.cpp's control vector ─────────────────────────────────────────────────────────────────

def test_the_control_vector_round_trips_bit_equal_with_llama_cpps_names(tmp_path):
    import gguf

    rng = np.random.default_rng(0)
    vectors = {1: rng.standard_normal(48).astype(np.float32), 7: rng.standard_normal(48).astype(np.float32) * 1e-3}
    path = write_control_vector(tmp_path / "v.gguf", vectors, model_hint="llama")
    back = read_control_vector(path)
    assert list(back.directions) == [1, 7] and back.model_hint == "llama"
    for n, v in vectors.items():
        assert back.directions[n].dtype == np.float32 and back.directions[n].tobytes() == v.tobytes()
    reader = gguf.GGUFReader(path)                                  # the package itself, as llama.cpp would see it
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert sorted(fields) == ["controlvector.layer_count", "controlvector.model_hint", "general.architecture"]
    assert fields["general.architecture"].contents() == "controlvector"
    assert fields["controlvector.model_hint"].contents() == "llama"
    assert fields["controlvector.layer_count"].contents() == 2
    assert fields["controlvector.layer_count"].types == [gguf.GGUFValueType.INT32]     # as llama.cpp writes it
    assert [t.name for t in reader.tensors] == ["direction.1", "direction.7"]
    for t in reader.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32 and list(t.shape) == [48]


def test_a_file_llama_cpps_writer_made_is_read(tmp_path):
    """Written by the gguf package as llama.cpp's cvector-generator does (two tensors of one layer add up)."""
    import gguf

    a, b = np.arange(6, dtype=np.float32), np.ones(6, dtype=np.float32)
    writer = gguf.GGUFWriter(tmp_path / "cv.gguf", "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_int32("controlvector.layer_count", 2)
    writer.add_tensor("direction.3", a)
    writer.add_tensor("direction.2", b)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    back = read_control_vector(tmp_path / "cv.gguf")
    assert list(back.directions) == [2, 3] and np.array_equal(back.directions[3], a)


@pytest.mark.parametrize(("tensors", "arch", "message"), [
    ({"direction.0": np.ones(4, np.float32)}, "controlvector", "not direction.N with N ≥ 1"),
    ({"blk.0.attn_q.weight": np.ones(4, np.float32)}, "controlvector", "not direction.N"),
    ({"direction.1": np.ones((2, 2), np.float32)}, "controlvector", "2 dimensions"),
    ({"direction.1": np.ones(4, np.float16)}, "controlvector", "not F32"),
    ({"direction.1": np.ones(4, np.float32), "direction.2": np.ones(5, np.float32)}, "controlvector",
     "different widths"),
    ({"direction.1": np.ones(4, np.float32)}, "llama", "not a control vector"),
    ({}, "controlvector", "no direction tensor"),
])
def test_a_bad_control_vector_is_one_error(tmp_path, tensors, arch, message):
    import gguf

    writer = gguf.GGUFWriter(tmp_path / "bad.gguf", arch)
    for name, v in tensors.items():
        writer.add_tensor(name, v)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(QkvError, match=message):
        read_control_vector(tmp_path / "bad.gguf")


def test_writing_refuses_what_llama_cpp_cannot_load(tmp_path):
    with pytest.raises(QkvError, match="from 1 on"):
        write_control_vector(tmp_path / "v.gguf", {0: np.ones(4)})
    with pytest.raises(QkvError, match="different widths"):
        write_control_vector(tmp_path / "v.gguf", {1: np.ones(4), 2: np.ones(5)})
    with pytest.raises(QkvError, match="is a directory"):
        write_control_vector(tmp_path, {1: np.ones(4)})
    assert not list(tmp_path.iterdir())
    link = tmp_path / "link.gguf"
    target = tmp_path / "target"
    target.write_text("keep")
    link.symlink_to(target)
    write_control_vector(link, {1: np.ones(4)})                     # the link is replaced, never followed
    assert target.read_text() == "keep" and not link.is_symlink()


def test_parse_vector_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v.gguf").write_bytes(b"")
    (tmp_path / "a@b:c.gguf").write_bytes(b"")
    assert parse_vector_spec("v.gguf") == ("v.gguf", None, 1.0)
    assert parse_vector_spec("v.gguf@12:4") == ("v.gguf", 12, 4.0)
    assert parse_vector_spec("v.gguf:-2.5") == ("v.gguf", None, -2.5)
    assert parse_vector_spec("v.gguf@-1") == ("v.gguf", -1, 1.0)
    assert parse_vector_spec("a@b:c.gguf") == ("a@b:c.gguf", None, 1.0)          # an existing name wins
    assert parse_vector_spec("a@b:c.gguf@3:2") == ("a@b:c.gguf", 3, 2.0)
    for bad in ("w.gguf@1:2", "v.gguf@x:2", "v.gguf:inf", "3:8"):
        with pytest.raises(QkvError):
            parse_vector_spec(bad)


# ── the commands ─────────────────────────────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def vector_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("vec") / "v.gguf"
    code = _main("steer", "make", "--model", str(MODELS / "gpt2"), "--positive", POSITIVE[0], "--positive",
                 POSITIVE[1], "--negative", NEGATIVE[0], "--negative", NEGATIVE[1], "--layer", "1", "--out", str(out))
    assert code == 0
    return out


def _main(*args: str) -> int:
    from click.testing import CliRunner

    from qkv.cli.app import cli

    return CliRunner().invoke(cli, list(args)).exit_code


def test_steer_make_writes_the_difference_of_means(tmp_path, monkeypatch, capsys):
    model = qkv.load(MODELS / "gpt2")
    pos = tmp_path / "pos.txt"
    pos.write_text("\n".join(POSITIVE) + "\n\n")
    code, out, err = run_main(monkeypatch, capsys, "steer", "make", "--model", str(MODELS / "gpt2"), "--positive",
                              str(pos), "--negative", NEGATIVE[0], "--negative", NEGATIVE[1], "--negative",
                              NEGATIVE[2], "--layer", "all", "--position", "mean", "--out", str(tmp_path / "v.gguf"),
                              "--json", str(tmp_path / "v.json"))
    assert code == 0, err
    back = read_control_vector(tmp_path / "v.gguf")
    want = contrastive_vector(model, POSITIVE, NEGATIVE, [1], position="mean")[1]
    assert list(back.directions) == [1] and back.model_hint == "gpt2"
    assert np.abs(back.directions[1] - want).max() <= 1e-6 * np.abs(want).max()
    import json

    data = json.loads((tmp_path / "v.json").read_text())
    assert data["layers"][0]["layer"] == 1 and abs(data["layers"][0]["norm"] - np.linalg.norm(want)) < 1e-4


def test_generate_steers_as_model_generate(monkeypatch, capsys, vector_file):
    model = qkv.load(MODELS / "gpt2")
    v = read_control_vector(vector_file).directions[1]
    args = ["generate", "the cat", "--model", str(MODELS / "gpt2"), "-t", "0", "-n", "8"]
    code, plain, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    code, out, err = run_main(monkeypatch, capsys, *args, "--steer", f"{vector_file}@1:3")
    assert code == 0, err
    want = model.generate("the cat", 8, temperature=0, hooks=steering_hooks({1: v}, 3.0))
    assert out == "the cat" + want + "\n" and out != plain
    code, both, err = run_main(monkeypatch, capsys, *args, "--steer", f"{vector_file}:1", "--steer",
                               f"{vector_file}:2")
    assert code == 0 and both == out, err                           # two files add up: 1 + 2 = 3
    code, out, err = run_main(monkeypatch, capsys, *args, "--ablate-direction", str(vector_file))
    want = model.generate("the cat", 8, temperature=0, hooks=ablation_hooks(v, model.config))
    assert code == 0 and out == "the cat" + want + "\n", err


def test_chat_and_show_take_the_vector(monkeypatch, capsys, tmp_path, vector_file):
    import json
    import shutil

    directory = tmp_path / "m"
    shutil.copytree(MODELS / "gpt2", directory)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template,
                                                                 "eos_token": "<|endoftext|>"}))
    model = qkv.load(directory)
    v = read_control_vector(vector_file).directions[1]
    code, out, err = run_main(monkeypatch, capsys, "chat", "the cat", "--model", str(directory), "-n", "4",
                              "--steer", f"{vector_file}@1:3")
    assert code == 0, err
    assert out == model.with_hooks(steering_hooks({1: v}, 3.0)).chat("the cat", 4) + "\n"
    code, out, err = run_main(monkeypatch, capsys, "show", "the cat sat", "--model", str(MODELS / "gpt2"),
                              "--layer", "1", "--steer", f"{vector_file}@1:3")
    assert code == 0 and "tokens" in out, err


def test_serve_steers_its_model(vector_file):
    from qkv.cli.steering import vector_request
    from qkv.web.app import make_server

    request = vector_request((f"{vector_file}@1:3",), ())
    server = make_server(str(MODELS / "gpt2"), "127.0.0.1", 0, steer=lambda m: m.with_hooks(request.hooks(m)))
    try:
        served = server.app.model(str(MODELS / "gpt2"))
        model = qkv.load(MODELS / "gpt2")
        v = read_control_vector(vector_file).directions[1]
        assert np.array_equal(served.run(TEXT).logits, model.run(TEXT, hooks=steering_hooks({1: v}, 3.0)).logits)
    finally:
        server.server_close()


@pytest.mark.parametrize(("args", "message"), [
    (["--steer", "3:8"], "give --sae SAE_DIR too"),
    (["--steer", "no/such.gguf@1:2"], "no control-vector file"),
    (["--steer", "VEC@0:2"], "layer 0 cannot carry a control vector"),
    (["--steer", "VEC@9:2"], "layer 9 cannot carry a control vector"),
    (["--steer", "VEC:nan"], "not a finite number"),
    (["--steer", "NARROW@1:2"], "is 8 wide"),
    (["--ablate-direction", "VEC:2"], "no control-vector file"),
    (["--sae", "x", "--steer", "3:8", "--ablate-direction", "VEC"], "give one of them"),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_commands_refuse_bad_vectors_in_one_line(monkeypatch, capsys, tmp_path, vector_file, args, message, command):
    write_control_vector(tmp_path / "narrow.gguf", {1: np.ones(8)})
    args = [a.replace("VEC", str(vector_file)).replace("NARROW", str(tmp_path / "narrow.gguf")) for a in args]
    code, out, err = run_main(monkeypatch, capsys, command, "hello", "--model", str(MODELS / "gpt2"), "-n", "2", *args)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("args", "message"), [
    (["--layer", "0"], "layer 0 cannot carry a control vector"),
    (["--layer", "x"], "is not a layer"),
    (["--negative", "  "], "--negative gave no text"),
])
def test_steer_make_refuses_in_one_line(monkeypatch, capsys, tmp_path, args, message):
    base = {"--layer": "1", "--negative": "the end"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    code, out, err = run_main(monkeypatch, capsys, "steer", "make", "--model", str(MODELS / "gpt2"), "--positive",
                              "the cat", "--out", str(tmp_path / "v.gguf"), *[x for kv in base.items() for x in kv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "v.gguf").exists()


def test_which_directions_a_spec_applies():
    from qkv.analysis.steering import pick_directions
    from qkv.checkpoints.control_vector import ControlVector

    a, b = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
    two = ControlVector({2: a, 5: b}, "llama", "v.gguf")
    assert list(pick_directions(two, None)) == [2, 5]                   # FILE: all its layers
    assert list(pick_directions(two, 5)) == [5] and pick_directions(two, 5)[5] is b
    with pytest.raises(QkvError, match="holds directions for layers 2, 5, not 3"):
        pick_directions(two, 3)
    one = ControlVector({2: a}, "llama", "v.gguf")
    assert list(pick_directions(one, 7)) == [7] and pick_directions(one, 7)[7] is a   # moved to another layer


@pytest.mark.parametrize(("args", "message"), [
    (["--steer", "3:8"], "give --sae SAE_DIR too"),
    (["--steer", "VEC@1:2", "--transcoders", "DIR"], "drop --steer"),
])
def test_serve_refuses_bad_steering_before_serving(monkeypatch, capsys, vector_file, args, message):
    args = [a.replace("VEC", str(vector_file)) for a in args]
    code, out, err = run_main(monkeypatch, capsys, "serve", "--model", str(MODELS / "gpt2"), "--port", "0", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
