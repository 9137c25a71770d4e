"""Commands say what they are doing on a terminal: a status line on stderr while a model loads or a result is
computed ("loading …", "computing the logit lens …"), gone when it ends; nothing on stderr off a terminal (a log,
a pipe) or with `qkv --quiet`. The terminal is a real pseudo-terminal: stderr is a tty as a user's is."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from conftest import MODELS

QKV = [sys.executable, "-m", "qkv"]


def run_with_terminal_stderr(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, what the terminal on stderr received) of `qkv ARGS`."""
    main, side = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen([*QKV, *args], stdout=subprocess.PIPE, stderr=side, stdin=subprocess.DEVNULL, env=env)
    os.close(side)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:                                   # the child closed the terminal: it has ended
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode()
    proc.wait()
    os.close(main)
    return proc.returncode, out, seen.decode(errors="replace")


def test_a_terminal_sees_what_is_loading_and_computing():
    rc, out, err = run_with_terminal_stderr("lens", "The cat sat on the", "--model", str(MODELS / "gpt2"))
    assert rc == 0 and "the logit lens" in out
    assert "loading" in err and "computing the logit lens" in err
    assert "loading" not in out                              # stdout carries the result only


def test_quiet_and_pipes_see_nothing():
    rc, out, err = run_with_terminal_stderr("--quiet", "lens", "The cat sat on the", "--model", str(MODELS / "gpt2"))
    assert rc == 0 and "the logit lens" in out and err.strip() == ""
    piped = subprocess.run([*QKV, "lens", "The cat sat on the", "--model", str(MODELS / "gpt2")],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert piped.returncode == 0 and piped.stderr == ""


def test_chat_says_loading_before_its_first_token_and_notes_a_cut_reply():
    rc, out, err = run_with_terminal_stderr("chat", "What is the capital of France?", "-n", "3")
    assert rc == 0 and out.strip()
    assert "loading smollm2" in err and "reading the conversation" in err
    assert "the reply stopped at -n 3 tokens" in err                       # cut by -n, and it says so
    rc, out, err = run_with_terminal_stderr("--quiet", "chat", "Say only: yes", "-n", "200")   # "Yes.", in ~1 s
    assert rc == 0 and out.strip() and "stopped at -n" not in err           # the model ended it: no note
