"""The training loop (qkv.train.loop): the loss goes down, checkpoints rotate, and a run killed with
SIGKILL (or stopped with Ctrl-C) and started again ends with the same bytes as one never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from qkv.cli.app import cli
from qkv.runtime.errors import QkvError
from qkv.train.loop import KEEP, _flatten, _unflatten, open_run, read_log
from qkv.runtime.threads import blas_threads
from conftest import PATIENCE

# A tiny induction model: one step takes a few milliseconds.
TINY = ["--layers", "1", "--heads", "2", "--d-model", "16", "--vocab", "8", "--half", "4", "--min-half", "3",
        "--batch", "4"]


def train(out: Path, *args: str):
    """`qkv train --task induction --out OUT TINY ARGS` in this process."""
    r = CliRunner().invoke(cli, ["train", "--task", "induction", "--out", str(out), *TINY, *args])
    assert r.exit_code == 0, r.output
    return r


def tiny_text(path: Path) -> Path:
    path.write_text("abcd efg " * 300, encoding="utf-8")
    return path


def test_loss_goes_down_on_a_tiny_task(tmp_path):
    """A short, repetitive text: 80 steps take the loss from about ln V to a small fraction of it."""
    given = dict(text=str(tiny_text(tmp_path / "t.txt")), steps=80, layers=1, heads=2, d_model=32, context=16,
                 lr=1e-2, every=40, checkpoint_every=80, batch=8)
    run = open_run(tmp_path / "run", "text", given)
    with blas_threads(1):
        run.train()
    losses = [e["loss"] for e in run.log if "loss" in e]
    V = run.config.vocab_size
    assert len(losses) == 80
    assert abs(losses[0] - np.log(V)) < 0.3                         # a fresh model guesses about uniformly
    assert np.mean(losses[-10:]) < 0.3 * losses[0]
    val = [e["val_loss"] for e in run.log if "val_loss" in e]
    assert len(val) == 3 and val[-1] < 0.3 * val[0]                 # held-out text too (steps 0, 40, 80)


def test_a_buffer_neither_learns_nor_decays(tmp_path):
    """Marian's final_logits_bias (1, V) is a buffer, not a parameter (torch's AdamW never sees it): with weight
    decay on, two steps leave it exactly as it was."""
    given = dict(steps=2, batch=4, every=2, checkpoint_every=2, layers=1, heads=2, d_model=16, weight_decay=0.5)
    run = open_run(tmp_path / "run", "translate-ko-en", given)
    bias = run.params["final_logits_bias"]
    bias[:] = np.linspace(-1, 1, bias.size).reshape(bias.shape)
    before = bias.copy()
    decayed = next(k for k, v in run.params.items() if v.ndim == 2 and k != "final_logits_bias")
    w = run.params[decayed].copy()
    with blas_threads(1):
        run.train()
    assert np.array_equal(run.params["final_logits_bias"], before)
    assert not np.array_equal(run.params[decayed], w)


def test_checkpoints_rotate_and_hold_the_state(tmp_path):
    out = tmp_path / "run"
    train(out, "--steps", "30", "--every", "10", "--checkpoint-every", "5")
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["step-00000025.npz", "step-00000030.npz"] and KEEP == 2
    with np.load(out / "checkpoints" / kept[-1], allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]))
        names = set(z.files)
    assert meta["step"] == 30 and meta["settings"]["steps"] == 30 and meta["settings"]["d_model"] == 16
    assert {"optim/step", "param/model.embed_tokens.weight", "optim/m.model.embed_tokens.weight",
            "optim/v.model.embed_tokens.weight"} <= names


def test_state_flattens_and_back():
    state = {"step": np.array([3]), "m.a": np.ones((2, 2), np.float32), "nested": {"x": [1.5, np.zeros(2)]}}
    arrays, rest = _flatten(state, "optim")
    json.dumps(rest)                                                # what is not an array is JSON
    back = _unflatten(arrays, rest)
    assert back["step"] is state["step"] and back["m.a"] is state["m.a"]
    assert back["nested"]["x"][0] == 1.5 and back["nested"]["x"][1] is state["nested"]["x"][1]


# `qkv train` in a new process, as a user would start it, held at its first checkpoint until a signal comes: the
# test kills or interrupts it there, waiting on the child's word, never on a clock (a run can end before a test
# that polls gets the CPU back on a busy machine).
HELD = "held at the checkpoint of step"
HELD_RUN = textwrap.dedent(f"""
    import signal, sys, time
    from qkv.cli.app import main
    from qkv.train.loop import Run

    save = Run.save_checkpoint

    def held(self):
        path = save(self)
        if not held.said:                           # the first checkpoint is on disk: say so, then wait for a signal
            held.said, came, ctrl_c = True, [], signal.getsignal(signal.SIGINT)       # ctrl_c: the loop's handler

            def noted(signum, frame):
                came.append(signum)
                ctrl_c(signum, frame)               # a Ctrl-C as it reaches the run: noted, the step finishes, it stops

            signal.signal(signal.SIGINT, noted)
            print({HELD!r}, self.step, flush=True)
            while not came:                         # SIGKILL ends the process here
                time.sleep(0.01)
            signal.signal(signal.SIGINT, ctrl_c)
        return path

    held.said = False
    Run.save_checkpoint = held
    sys.argv = ["qkv", *sys.argv[1:]]
    main()
""")


def _start_held(out: Path, steps: int) -> tuple[subprocess.Popen, int]:
    """`qkv train …` in a new process, held at its first checkpoint: (the process, that checkpoint's step)."""
    proc = subprocess.Popen([sys.executable, "-c", HELD_RUN, "train", "--task", "induction", "--out", str(out), *TINY,
                             "--steps", str(steps), "--every", "10", "--checkpoint-every", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:                                        # ends (and fails below) if the run dies first
        if line.startswith(HELD):
            return proc, int(line.split()[-1])
    proc.wait()
    raise AssertionError(f"the run ended (exit {proc.returncode}) before a checkpoint: {proc.stderr.read()[-2000:]}")


def _same_run(a: Path, b: Path) -> None:
    """Two finished runs hold the same weights and optimiser state, bit for bit, and the same losses."""
    assert (a / "model" / "model.safetensors").read_bytes() == (b / "model" / "model.safetensors").read_bytes()
    last_a, last_b = (sorted((d / "checkpoints").iterdir())[-1] for d in (a, b))
    assert last_a.name == last_b.name
    with np.load(last_a, allow_pickle=False) as za, np.load(last_b, allow_pickle=False) as zb:
        assert set(za.files) == set(zb.files)
        for name in za.files:
            if name != "meta":
                assert np.array_equal(za[name], zb[name]), name
    losses = [[(e["step"], e.get("loss"), e.get("induction")) for e in read_log(d / "log.jsonl")] for d in (a, b)]
    assert losses[0] == losses[1]


def test_a_run_killed_with_sigkill_resumes_bit_for_bit(tmp_path):
    steps = 60
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    train(whole, "--steps", str(steps), "--every", "10", "--checkpoint-every", "10")
    proc, held = _start_held(killed, steps)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "model").exists()                          # no model before the end
    saved = max(int(p.stem[5:]) for p in (killed / "checkpoints").glob("step-*.npz"))
    assert saved == held == 10 < steps                              # it was killed mid-run
    r = train(killed, "--steps", str(steps), "--every", "10", "--checkpoint-every", "10")
    assert f"resuming from step {saved} of {steps}" in r.output
    _same_run(whole, killed)


def test_ctrl_c_saves_a_checkpoint_and_the_same_command_continues(tmp_path):
    steps = 60
    out = tmp_path / "run"
    proc, held = _start_held(out, steps)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=PATIENCE)                     # a hang guard only
    assert proc.returncode == 130
    line = err.strip().splitlines()[-1]
    assert line.startswith("qkv: interrupted at step") and "run the same command again" in line
    stopped = int(line.split("step ")[1].split(";")[0])
    assert stopped == held                                          # the step in progress finished, then it stopped
    assert (out / "checkpoints" / f"step-{stopped:08d}.npz").is_file() and not (out / "model").exists()
    r = train(out, "--steps", str(steps))                           # options left out come from the run
    assert f"resuming from step {stopped} of {steps}" in r.output
    whole = tmp_path / "whole"
    train(whole, "--steps", str(steps), "--every", "10", "--checkpoint-every", "10")
    _same_run(whole, out)


def test_a_finished_run_says_so_and_keeps_its_model(tmp_path):
    out = tmp_path / "run"
    train(out, "--steps", "10", "--every", "5")
    before = (out / "model" / "model.safetensors").read_bytes()
    r = train(out)
    assert "resuming from step 10 of 10 (complete)" in r.output
    assert (out / "model" / "model.safetensors").read_bytes() == before


def test_a_torn_log_line_is_dropped_on_resume(tmp_path):
    out = tmp_path / "run"
    train(out, "--steps", "10", "--every", "5", "--checkpoint-every", "5")
    lines = (out / "log.jsonl").read_text().splitlines()
    os.remove(out / "checkpoints" / "step-00000010.npz")           # as if killed after step 8's line
    (out / "checkpoints" / ".step-00000010.npz.abc123.tmp").write_bytes(b"half a checkpoint")
    (out / "log.jsonl").write_text("\n".join(lines[:9]) + '\n{"step": 9, "lo')
    train(out, "--steps", "10")
    steps = [e["step"] for e in read_log(out / "log.jsonl")]
    assert steps == list(range(11))                                 # 0 (the record before training) … 10
    assert not list((out / "checkpoints").glob(".*"))                # the killed write's leftover is gone


def test_a_learning_rate_that_blows_up_stops_in_one_line_and_logs_no_nan(tmp_path):
    """lr 1e30: the first update makes the weights huge; the next measurement (training or validation loss)
    stops the run naming the step and the fix, and log.jsonl stays valid JSON (no NaN)."""
    given = dict(text=str(tiny_text(tmp_path / "t.txt")), steps=6, layers=1, heads=2, d_model=32, context=16,
                 lr=1e30, every=1, checkpoint_every=6, batch=4)
    run = open_run(tmp_path / "run", "text", given)
    with blas_threads(1), pytest.raises(QkvError, match=r"(became (nan|inf|-inf) at|overflowed by) step \d(;| \(.*\);) "
                                                         r"lower --lr \(now 1e\+30\)"):
        run.train()
    for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines():
        entry = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in log.jsonl"))
        assert all(np.isfinite(v) for v in entry.values() if isinstance(v, float))


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "{", "[1, 2]"])
def test_a_damaged_run_file_is_one_line(tmp_path, text):
    """run.json nested past Python's recursion limit, cut short or not an object: not a run qkv made, one line
    (the nested one was a RecursionError traceback)."""
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(QkvError, match="holds other files, not a qkv training run"):
        open_run(tmp_path, "induction", {})
