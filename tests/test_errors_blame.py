"""A user's mistake is one line that names its real cause: the CLI exits 2 with exactly one stderr line, and an
error never blames the checkpoint or the chat template for what the user gave.

  - every --seed takes 0..2³²−1 (one shared click type, cli.common.SEED), a bad one refused before any work;
  - inf or NaN the user hands a pass (a hook's value, a stream for from_layer, causal tracing's noise) is said
    to be the input's, not the weights'; a finite value that overflows later names the hooks in the pass;
  - a chat message longer than the model's context says so in tokens, not as an untrusted template;
  - `circuits` with its default text and Whisper's generate/translate fail in one line, not two;
  - the CLI's printer keeps any QkvError on one line, and no QkvError literal in the source holds a newline.
"""

from __future__ import annotations

import ast
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS, run_main
from test_show_audio import whisper  # noqa: F401 (the fixture: the whisper fixture with a tokenizer.json)
from qkv.cli.app import cli
from qkv.runtime.errors import QkvError

GPT2 = str(MODELS / "gpt2")
SRC = Path(qkv.__file__).parent


def one_error_line(code: int, err: str) -> str:
    """The one stderr line of a refused command (exit 2), or a failed assertion."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("qkv: error: "), (code, err)
    return lines[0]


# ── --seed ────────────────────────────────────────────────────────────────────────

SEED_COMMANDS = {
    "trace-fact": ["trace-fact", "The Eiffel Tower is in", "--subject", "Eiffel", "--model", GPT2],
    "generate": ["generate", "the cat", "--model", GPT2, "-n", "2"],
    "translate": ["translate", "안녕"],
    "chat": ["chat", "hi", "--model", GPT2],
    "train": ["train", "--task", "induction", "--steps", "1"],
}


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
@pytest.mark.parametrize("command", list(SEED_COMMANDS))
def test_a_seed_outside_0_to_2_32_is_one_line(monkeypatch, capsys, tmp_path, command, seed):
    args = SEED_COMMANDS[command] + (["--out", str(tmp_path / "run")] if command == "train" else [])
    code, out, err = run_main(monkeypatch, capsys, *args, "--seed", seed)
    line = one_error_line(code, err)
    assert "--seed" in line and seed in line and "4294967295" in line
    assert not (tmp_path / "run").exists()                                  # refused before any work


def seed_options(group: click.Group, path: str = "qkv"):
    """(command path, option) of every --seed in the command tree."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from seed_options(command, f"{path} {name}")
        for param in command.params:
            if "--seed" in getattr(param, "opts", ()):
                yield f"{path} {name}", param


def test_every_seed_option_takes_0_to_2_32_minus_1():
    """One type for every --seed."""
    found = {path: p.type for path, p in seed_options(cli)}
    assert set(found) >= {"qkv trace-fact", "qkv generate", "qkv translate", "qkv chat", "qkv train", "qkv sae train"}
    for path, kind in found.items():
        assert isinstance(kind, click.IntRange) and (kind.min, kind.max) == (0, 2**32 - 1), path


def test_trace_fact_refuses_a_negative_seed_from_python():
    from qkv.analysis.causal_trace import trace_fact

    with pytest.raises(QkvError, match="--seed must be a whole number from 0 to 4294967295, got -1"):
        trace_fact(qkv.load(GPT2), "The Eiffel Tower is in", "Eiffel", seed=-1)


# ── non-finite input is the input's fault ───────────────────────────────────────────

@pytest.fixture(scope="module")
def gpt2():
    return qkv.load(GPT2)


@pytest.mark.parametrize("point, value, fix", [
    ("0.residual", lambda v: v * np.nan, "finite numbers"),
    ("1.attn_out", lambda v: v + np.inf, "finite numbers"),
    ("0.ffn_out", lambda v: v.astype(np.float64) * 1e300, "finite numbers"),         # beyond float32 once cast
    ("1.heads.2", lambda v: np.full_like(v, np.nan), "finite numbers"),
    ("0.scores", lambda v: v * np.nan, "-inf to hide a key"),
])
def test_a_hook_writing_inf_or_nan_is_named_not_the_checkpoint(gpt2, point, value, fix):
    with pytest.raises(QkvError) as e:
        gpt2.run("the cat sat on the mat", hooks={point: lambda v, layer: value(v)})
    message = str(e.value)
    assert message.startswith(f"the hook on {point} returned inf or NaN") and fix in message
    assert "checkpoint" not in message


def test_a_finite_hook_value_that_overflows_names_the_hooks(gpt2):
    with pytest.raises(QkvError) as e:
        gpt2.run("the cat sat", hooks={"0.residual": lambda v, layer: v * np.float32(3e38)})
    message = str(e.value)
    assert "is not finite" in message and "hooks in the pass (0.residual)" in message and "checkpoint" not in message


def test_from_layer_with_a_nan_stream_blames_the_stream(gpt2):
    x = np.full((1, 3, gpt2.config.d_model), np.nan, np.float32)
    with pytest.raises(QkvError, match=r"the residual stream given to the pass \(from_layer's x\) holds inf or NaN"):
        gpt2.from_layer(x, 1)


def test_causal_tracing_with_nan_noise_blames_the_noise(gpt2):
    from qkv.analysis.causal_trace import trace_tokens

    noise = np.full((1, 2, gpt2.weights.tok_embed.shape[1]), np.nan)
    with pytest.raises(QkvError) as e:
        trace_tokens(gpt2, [5, 6, 7, 8], (0, 2), noise)
    assert str(e.value).startswith("noise holds inf or NaN") and "checkpoint" not in str(e.value)


def test_steering_past_float32_names_the_steering_hook(monkeypatch, capsys, gpt2, tmp_path):
    """--steer F:1e40 is a finite α whose direction passes float32: one line naming the steering vector (refused
    before the pass, with no NumPy overflow warning on stderr)."""
    from qkv.features.sae import SAEConfig, init_sae
    from qkv.features.saelens import save_saelens

    x = gpt2.run("the cat sat on the mat", layers=[1], keep=("residual",)).layer(1).residual      # (n, d_model)
    save_saelens(init_sae(SAEConfig(d_in=gpt2.config.d_model, d_sae=32, k=4, model=GPT2, layer=1, site="resid"),
                          x, seed=3), tmp_path / "sae")
    code, out, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", GPT2, "-n", "2",
                              "--sae", str(tmp_path / "sae"), "--steer", "3:1e40")
    line = one_error_line(code, err)
    assert "the steering vector Σ α·W_dec reaches" in line and "beyond float32" in line and "checkpoint" not in line
    assert "RuntimeWarning" not in err


# ── a long chat message is the message's fault ─────────────────────────────────────

@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


def test_a_chat_message_longer_than_the_context_says_so_in_tokens(smollm2):
    with pytest.raises(QkvError) as e:
        smollm2.chat("hello " * 20000, 4)
    assert str(e.value) == ("the message has 20,001 tokens, more than SmolLM2-135M-Instruct's context of 8,192; "
                            "shorten it")


def test_a_1_mb_chat_message_is_not_blamed_on_the_template(smollm2):
    with pytest.raises(QkvError) as e:
        smollm2.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello " * 170000}], 4)
    message = str(e.value)
    assert message.startswith("the user message has 1,020,000 characters (its first 1,000,000 alone are ")
    assert "tokens), more than SmolLM2-135M-Instruct's context of 8,192" in message and "template" not in message


def test_cli_chat_a_1_mb_message_is_one_line_naming_its_size():
    r = CliRunner().invoke(cli, ["chat", "-n", "4"], input="hello " * 170000 + "\n/quit\n")
    assert r.exit_code == 0, r.output                                     # the turn fails, the chat goes on
    errors = [line for line in r.output.splitlines() if "qkv: error:" in line]
    assert len(errors) == 1 and "the message has 1,019,999 characters" in errors[0], errors
    assert "context of 8,192" in errors[0] and "template" not in errors[0]


# ── two-line errors ──────────────────────────────────────────────────────────────

def test_circuits_with_its_default_text_fails_in_one_line(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "circuits", "--model", GPT2, "--layer", "99", "--head", "0")
    assert "layer 99 does not exist" in one_error_line(code, err)


@pytest.mark.parametrize("command", ["generate", "translate"])
@pytest.mark.parametrize("text", ["hello", "w5 w6"])
def test_whisper_generate_and_translate_are_one_line(monkeypatch, capsys, whisper, tmp_path, command, text):
    code, out, err = run_main(monkeypatch, capsys, command, text, "--model", str(whisper[0]),
                              "--trace", str(tmp_path / "t"))
    line = one_error_line(code, err)
    assert "is Whisper: it reads sound" in line and "qkv show FEATURES.npy" in line
    assert out == "" and not (tmp_path / "t").exists()


def test_the_cli_prints_a_qkv_error_on_one_line(monkeypatch, capsys):
    from qkv.cli.common import run

    monkeypatch.setattr("sys.argv", ["qkv"])

    @click.command()
    def broken() -> None:
        raise QkvError("the value 'a\nb' is wrong\r\n; give another")

    with pytest.raises(SystemExit) as e:
        run(broken, prog_name="qkv")
    assert one_error_line(e.value.code, capsys.readouterr().err) == "qkv: error: the value 'a b' is wrong ; give another"


def test_no_qkv_error_message_in_the_source_holds_a_newline():
    """Guard: every QkvError(...) / NotFinite(...) string literal in src/qkv is one line."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("QkvError", "NotFinite"):
                found += [f"{path.relative_to(SRC)}:{node.lineno}" for part in ast.walk(node)
                          if isinstance(part, ast.Constant) and isinstance(part.value, str)
                          and ("\n" in part.value or "\r" in part.value)]
    assert found == []
