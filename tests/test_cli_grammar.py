"""One grammar for the command line (qkv.cli.options): TEXT first, one default model per kind of command,
--token / --other for the token explained, --prefix for an encoder–decoder's target so far, one --backend;
the names used before stay one release as hidden aliases that work and say their new name on stderr."""

from __future__ import annotations

import click
from click.testing import CliRunner
import pytest

from qkv.cli.app import cli
from qkv.cli.options import READER, TRANSLATOR, WRITER
from conftest import MODELS, run_main

GPT2 = str(MODELS / "gpt2")


def commands(group: click.Group = cli, path: tuple[str, ...] = ()):
    """(path, command) of every command of `qkv`, sub-commands of groups included."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def option(command: click.Command, flag: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and flag in p.opts + p.secondary_opts),
                None)


# defaults ---------------------------------------------------------------------------

def test_the_two_defaults_are_the_bundled_models():
    assert (READER, WRITER, TRANSLATOR) == ("minilm", "smollm2", "ko-en-tiny")


WRITES = ("generate", "chat", "next", "lens", "dla", "attribute", "patch", "circuits", "trace-fact", "neurons",
          "activations")
READS = ("show", "heads", "rollout", "serve")


@pytest.mark.parametrize("name", WRITES + READS)
def test_each_command_takes_its_kinds_default(name):
    assert option(cli.commands[name], "--model").default == (WRITER if name in WRITES else READER)


def test_generate_writes_with_the_bundled_llm_when_no_model_is_named(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "generate", "The cat", "-n", "2", "-t", "0")
    assert code == 0, err
    assert out.startswith("The cat") and len(out.strip()) > len("The cat")


# TEXT first -------------------------------------------------------------------------

NO_TEXT = {("models",), ("serve",), ("train",), ("activations",),   # a server, a list, a file or corpus to learn
           ("graph-page",),                                          # a graph's JSON, drawn
           ("probe",), ("steer", "make"),                            # labelled texts, two sets of texts
           ("transcribe",)}                                          # a sound file


READING = [(p, c) for p, c in commands()
           if p not in NO_TEXT and p[0] not in ("bench", "sae", "transcoders", "tuned-lens")
           or p == ("sae", "show")]                                  # transcoders, tuned-lens: a corpus to learn


@pytest.mark.parametrize("path, command", READING, ids=[" ".join(p) for p, _ in READING])
def test_every_command_that_reads_a_text_takes_it_first(path, command):
    first = next(p for p in command.params if isinstance(p, click.Argument))
    shown = first.make_metavar(click.Context(command))
    if path == ("explain",):                                 # [TOPIC] [TEXT]: a text alone is read first too
        from qkv.lessons import parse

        assert parse(("The cat sat",)) == ("attention", "The cat sat")
        return
    assert shown in ("TEXT", "[TEXT]", "[TEXT]..."), (path, shown)


@pytest.mark.parametrize("args", [("circuits", "the cat sat", "--layer", "0", "--head", "0", "--model", GPT2),
                                  ("neurons", "the cat", "--layer", "0", "--model", GPT2, "--top", "1")])
def test_a_text_given_first_is_read(monkeypatch, capsys, tmp_path, args):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran\n", encoding="utf-8")
    extra = ("--file", str(corpus)) if args[0] == "neurons" else ()
    code, out, err = run_main(monkeypatch, capsys, *args, *extra)
    assert code == 0, err
    assert "the default" not in err


# the same names everywhere ---------------------------------------------------------

@pytest.mark.parametrize("name", ["dla", "attribute", "patch", "trace-fact"])
def test_the_token_explained_is_token(name):
    assert option(cli.commands[name], "--token") is not None


@pytest.mark.parametrize("name", ["show", "next", "lens", "dla", "attribute", "patch"])
def test_the_target_so_far_is_prefix(name):
    assert option(cli.commands[name], "--prefix") is not None


@pytest.mark.parametrize("command", [cli.commands["heads"], cli.commands["activations"],
                                     cli.commands["bench"].commands["heads"]], ids=["heads", "activations", "bench heads"])
def test_ray_is_one_backend_option(command):
    assert option(command, "--backend").type.choices == ("local", "ray")


OLD = ("--target", "--answer", "--wrong", "--ray", "--no-ray")


@pytest.mark.parametrize("path, command", list(commands()), ids=[" ".join(p) for p, _ in commands()])
def test_help_hides_the_old_names(path, command):
    r = CliRunner().invoke(cli, [*path, "--help"])
    assert r.exit_code == 0, r.output
    shown = [o for p in command.params if isinstance(p, click.Option) and not p.hidden for o in p.opts + p.secondary_opts]
    assert not set(shown) & set(OLD), path
    for p in command.params:
        if isinstance(p, click.Option) and p.hidden:
            assert not any(f"{o} " in r.output or f"{o}\n" in r.output for o in p.opts + p.secondary_opts), (path, p.opts)


# the old names: hidden aliases that work and name the new one -------------------

ALIASES = [
    (("dla", "the cat sat", "--model", GPT2, "--target", " the"), "--target is now --token", "logit(␣the)"),
    (("attribute", "the cat sat", "--model", GPT2, "--target", " the"), "--target is now --token", "logit(␣the)"),
    (("patch", "the cat sat", "the dog sat", "--model", GPT2, "--answer", " the", "--other", " a"),
     "--answer is now --token", "logit(␣the) − logit(␣a)"),
    (("patch", "the cat sat", "the dog sat", "--model", GPT2, "--token", " the", "--wrong", " a"),
     "--wrong is now --other", "logit(␣the) − logit(␣a)"),
    (("trace-fact", "the cat sat on the", "--subject", "cat", "--model", GPT2, "--answer", " the", "--draws", "1"),
     "--answer is now --token", "P(␣the)"),
    (("circuits", "--layer", "0", "--head", "0", "--model", GPT2, "--text", "the cat sat"),
     "--text is now TEXT, the first argument", "OV copying score"),
]


@pytest.mark.parametrize("args, note, result", ALIASES, ids=[a[0][0] + " " + a[1].split()[0] for a in ALIASES])
def test_an_old_name_still_works_and_says_the_new_one(monkeypatch, capsys, args, note, result):
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    assert result in out
    assert note in err and note not in out                            # piped output stays clean
    assert sum(1 for line in err.splitlines() if "is now" in line) == 1


def test_neurons_text_alias(monkeypatch, capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran\n", encoding="utf-8")
    code, out, err = run_main(monkeypatch, capsys, "neurons", "--layer", "0", "--model", GPT2, "--file", str(corpus),
                              "--top", "1", "--text", "the cat")
    assert code == 0, err
    assert "activation on TEXT" in out and "--text is now TEXT" in err


@pytest.mark.parametrize("name, message", [
    ("show", "--prefix is the target text of an encoder–decoder"),
    ("next", "--prefix is the target so far of an encoder–decoder"),
])
def test_target_is_now_prefix(monkeypatch, capsys, name, message):
    code, _, err = run_main(monkeypatch, capsys, name, "the cat", "--model", GPT2, "--target", "x")
    assert code == 2
    note, error = err.splitlines()
    assert note == "qkv: --target is now --prefix; the old name goes in a later release"
    assert error.startswith(f"qkv: error: {message}") and error.endswith("drop --prefix")


@pytest.mark.parametrize("flag, backend", [("--ray", True), ("--no-ray", False)])
def test_bench_heads_ray_is_backend(monkeypatch, capsys, flag, backend):
    from qkv.bench import heads as hb

    seen = {}

    def measure(sentences, workers, ray):
        seen["ray"] = ray
        raise SystemExit(0)

    monkeypatch.setattr(hb, "measure", measure)
    code, _, err = run_main(monkeypatch, capsys, "bench", "heads", flag)
    assert code == 0 and seen == {"ray": backend}
    assert f"{flag} is now --backend {'ray' if backend else 'local'}" in err


def test_an_old_and_a_new_name_together_are_one_error(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "dla", "the cat", "--model", GPT2, "--token", " the",
                            "--target", " a")
    assert code == 2 and err.strip() == "qkv: error: --target is the old name of --token; give --token alone"


def test_dla_without_a_token_is_one_line(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "dla", "the cat", "--model", GPT2)
    assert code == 2 and err.strip().startswith("qkv: error: give --token")
