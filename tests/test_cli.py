"""The command line: what a user sees, and one line + exit code 2 for each mistake."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from qkv.cli.app import cli
from qkv.core.trace import Trace
from conftest import MODELS, PATIENCE, run_main


def qkv_cmd(*args: str) -> subprocess.CompletedProcess:
    """`python -m qkv ARGS`, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "qkv", *args], capture_output=True, text=True,
                          timeout=PATIENCE)


def test_show_default_model_finds_the_previous_token_head():
    r = CliRunner().invoke(cli, ["show", "The cat sat on the mat"])
    assert r.exit_code == 0, r.output
    assert "0:[CLS] 1:the 2:cat 3:sat 4:on 5:the 6:mat 7:[SEP]" in r.output
    rows = {line.split("│")[1].strip(): line for line in r.output.splitlines() if line.count("│") > 5}
    cells = [rows[tok].split("│")[4].split()[0] for tok in ("cat", "sat", "on", "mat")]   # head 2's column
    assert cells == ["the", "cat", "sat", "the"]                                      # each token's previous one


def test_show_one_head_prints_its_matrix():
    r = CliRunner().invoke(cli, ["show", "The cat sat on the mat", "--layer", "0", "--head", "2"])
    assert r.exit_code == 0, r.output
    sat = next(line for line in r.output.splitlines() if line.startswith("sat"))
    assert sat.split("│")[3].strip() == "1.00"                                          # sat → cat


def test_show_a_decoder_directory():
    r = CliRunner().invoke(cli, ["show", "the cat sat", "--model", str(MODELS / "gpt2"), "--layer", "-1"])
    assert r.exit_code == 0, r.output
    assert "layer 1" in r.output


def test_models_lists_the_default():
    r = CliRunner().invoke(cli, ["models"])
    assert r.exit_code == 0 and "minilm" in r.output


@pytest.mark.parametrize("args, message", [
    (["show", ""], "the text is empty"),
    (["show", "hi", "--model", "no-such-model"], "no model 'no-such-model'"),
    (["show", "hi", "--layer", "6"], "layer 6 does not exist"),
    (["show", "hi", "--head", "12"], "head 12 does not exist"),
    (["show", "word " * 600], "at most 512"),
    (["show", "hi", "--model", str(MODELS / "llama_mqa")], "no tokenizer.json"),
])
def test_mistakes_give_one_line_and_exit_2(args, message):
    r = qkv_cmd(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


@pytest.mark.parametrize("args, message", [
    (["show"], "qkv: error: Missing argument 'TEXT'; see qkv show --help"),
    (["show", "hi", "--layer", "x"], "qkv: error: Invalid value for '--layer': 'x' is not a valid integer; see qkv show --help"),
    (["bogus"], "qkv: error: No such command 'bogus'; see qkv --help"),
    (["sae", "train"], "qkv: error: Missing option '--acts'; see qkv sae train --help"),
])
def test_usage_mistakes_are_one_line_too(monkeypatch, capsys, args, message):
    """Not click's four lines (usage, try, blank, error): the error and where help is, exit 2."""
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 2 and out == "" and err == message + "\n"


def test_help_everywhere():
    for args in (["--help"], ["show", "--help"], ["models", "--help"]):
        assert CliRunner().invoke(cli, args).exit_code == 0


def test_generate_defaults_to_the_shipped_llm():
    r = qkv_cmd("generate", "Once upon a time", "-n", "4", "--temperature", "0")
    assert r.returncode == 0 and r.stdout.startswith("Once upon a time") and len(r.stdout) > len("Once upon a time")


def test_generate_streams_and_saves_a_trace(tmp_path):
    gpt2 = str(MODELS / "gpt2")
    r = qkv_cmd("generate", "the cat", "--model", gpt2, "-n", "6", "--seed", "4", "--trace", str(tmp_path / "t"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("the cat") and len(r.stdout) > len("the cat\n")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["attention.html", "trace.json", "trace.npz"]
    page = (tmp_path / "t" / "attention.html").read_text()
    data = json.loads(re.search(r'class="qkv-data">(.*?)</script>', page, re.S).group(1))
    saved = Trace.load(tmp_path / "t")
    assert data["tokens"] == saved.tokens and data["prompt_length"] == saved.prompt_length
    steps = data["next"]["steps"]                    # one candidate list per generated token
    assert [s["position"] for s in steps] == list(range(saved.prompt_length, len(saved.tokens)))
    assert [s["chosen"] for s in steps] == saved.ids[saved.prompt_length:].tolist()
    again = qkv_cmd("generate", "the cat", "--model", gpt2, "-n", "6", "--seed", "4")
    assert again.stdout == r.stdout                                   # same seed, same text


@pytest.mark.parametrize("args, message", [
    (["generate", "The cat", "--model", "minilm"], "is an encoder (bert): it reads the whole text at once and cannot "
                                                   "generate; use a decoder: --model smollm2 (shipped with qkv)"),
    (["generate", "x", "--model", str(MODELS / "gpt2"), "--top-p", "2"], "top_p"),
    (["generate", "x", "--model", str(MODELS / "gpt2"), "-n", "0"], "max_new_tokens"),
    (["generate", "x", "--model", str(MODELS / "gpt2"), "-n", "500"], "context of 128"),
    (["generate", "x", "--model", str(MODELS / "gpt2"), "--temperature", "-1"], "temperature"),
    (["generate", "x", "--model", str(MODELS / "gpt2"), "--stop", "\udcff"],      # the byte 0xff on a command line
     "a stop string is not valid UTF-8 (byte 0xff at character 0)"),
])
def test_generate_mistakes_give_one_line_and_exit_2(args, message):
    r = qkv_cmd(*args)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_generate_refuses_an_unwritable_trace_dir_before_working(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = qkv_cmd("generate", "x", "--model", str(MODELS / "gpt2"), "--trace", str(blocker / "sub"))
    assert r.returncode == 2 and "cannot write" in r.stderr and r.stdout == ""


def test_no_option_states_two_defaults():
    """Each --model help names the models, and the one default is click's [default: …] (circuits said
    "'minilm' (default)" and "[default: smollm2]")."""
    import click

    for name, command in cli.commands.items():
        for option in command.params:
            if isinstance(option, click.Option) and option.help and "--model" in option.opts:
                assert "(default)" not in option.help, name
    r = CliRunner().invoke(cli, ["circuits", "--help"])
    assert r.output.count("default") == r.output.count("[default:"), r.output


def test_the_small_words_a_newcomer_reads():
    from qkv.checkpoints.families import FAMILIES

    r = CliRunner().invoke(cli, ["models"])
    footer = " ".join(r.output.split())                          # the table may wrap it
    assert all(f in footer for f in FAMILIES) and ".gguf" in footer
    r = CliRunner().invoke(cli, ["show", "The cat sat on the mat", "--model", str(MODELS / "gpt2")])
    assert r.exit_code == 0 and "--out DIR writes the heatmaps" in r.output
    r = CliRunner().invoke(cli, ["circuits", "--model", str(MODELS / "gpt2"), "--layer", "0", "--head", "0"])
    assert r.exit_code == 0 and "text (the default; give another as TEXT): When Mary" in r.output
    r = CliRunner().invoke(cli, ["heads", "The cat sat on the mat. The cat sat on the mat.", "--model",
                                 str(MODELS / "gpt2")])
    assert r.exit_code == 0 and "first: the first position" in " ".join(r.output.split())
