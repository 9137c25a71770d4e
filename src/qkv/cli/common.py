"""What every command shares (`qkv`, `qkv heads`, `qkv bench`): the console, the --model help,
the early check of an output directory, and `run`, which turns a user's mistake (QkvError)
into one line on stderr and exit code 2.

Every module of cli/ imports this one; it imports none of them.
"""

from __future__ import annotations


import errno
import os
import sys
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator

import click
from rich.console import Console

from ..runtime.errors import QkvError

MODEL_HELP = "Model: 'minilm', 'smollm2', 'ko-en-tiny', a .gguf file, a local Hugging Face directory, or a cached repo id."


SEED = click.IntRange(0, 2**32 - 1)     # every --seed: what numpy's generators take, a bad one one line (exit 2)

WEIGHTS = ("stored", "float32", "bfloat16", "float16")     # `qkv --weights`: how a command's model holds its weights
ARITHS = ("exact", "llama.cpp")                            # `qkv --arith`: how its passes compute (runtime.stored)
_weights: dict[str, str | None] = {"dtype": None, "arith": None}


def choose_weights(dtype: str | None, arith: str | None = None) -> None:
    """`qkv --weights DTYPE --arith ARITH`: what every model this command loads holds its weights as (None: each file's
    own default: a GGUF file's blocks as stored, anything else float32) and computes with (None: exact)."""
    _weights["dtype"], _weights["arith"] = dtype, arith


def load_model(source, default: str | None = None, pairs: bool = False, arith: str | None = None):
    """qkv.load(SOURCE) with the weights `qkv --weights` chose (else DEFAULT: the trainers' "float32", since a GGUF
    file's quantised blocks read in place made SmolLM2's pass 2.5× slower and one-threaded, 35 s against 14 s for
    4096 tokens, measured, while dequantised once the same weights give the same numbers up to rounding) and the
    arithmetic ARITH, else `qkv --arith`'s, else exact, saying so while it loads (`status`). An image–text pair
    (CLIP, SigLIP) only where the command reads one (PAIRS)."""
    from ..models.contrastive import PairModel
    from ..models.loading import load

    with status(f"loading {source} …"):
        model = load(source, dtype=_weights["dtype"] or default, arith=arith or _weights["arith"] or "exact")
    if isinstance(model, PairModel) and not pairs:
        raise QkvError(f"{source} is an image–text pair ({model.config.family}): qkv show IMAGE --model {source} "
                       "--texts \"a cat,a dog\" scores it; the other commands read one tower (a CLIPVisionModel, "
                       "CLIPTextModel, … checkpoint; from Python: model.vision, model.text)")
    ctx = click.get_current_context(silent=True)              # --global-tokens (options.global_tokens_option)
    given = None if ctx is None else ctx.meta.get(GLOBAL_TOKENS)
    return model if given is None else with_global_tokens(model, given)


GLOBAL_TOKENS = "qkv.global_tokens"   # where --global-tokens waits in the command's click context for load_model


def with_global_tokens(model, given: str):
    """MODEL attending globally from the positions GIVEN ("0,5"; Longformer's global_attention_mask): one QkvError
    for a list that is not of whole numbers ≥ 0, or a model without global projections."""
    try:
        tokens = tuple(int(t) for t in given.split(",") if t.strip())
    except ValueError:
        tokens = ()
    if not tokens or min(tokens) < 0:
        raise QkvError(f"--global-tokens {given!r:.40} must be positions ≥ 0 separated by commas, e.g. 0,5")
    blocks = getattr(getattr(model, "weights", None), "blocks", None) or [None]
    if getattr(getattr(blocks[0], "attn", None), "W_Qg", None) is None:
        raise QkvError(f"--global-tokens needs a model with global attention (Longformer); {model.name} has none: "
                       "drop the flag")
    return model.with_config(global_tokens=tokens)


_quiet = {"on": False}


def choose_quiet(quiet: bool) -> None:
    """`qkv --quiet`: no progress and no status lines on stderr (errors and warnings still print)."""
    _quiet["on"] = quiet


def _stderr_terminal() -> Console | None:
    """A console on stderr when it is a terminal and --quiet was not given, else None (a log or pipe stays clean)."""
    if _quiet["on"]:
        return None
    err = Console(stderr=True)
    return err if err.is_terminal else None


@contextmanager
def status(what: str) -> Iterator[None]:
    """WHAT ("loading smollm2 …", "computing the logit lens …") with a spinner on stderr's terminal while the
    block runs, gone when it ends; nothing off a terminal or with --quiet. Work that counts its steps shows a
    bar instead (`progress_bar`)."""
    err = _stderr_terminal()
    if err is None:
        yield
        return
    with err.status(what, spinner="dots"):
        yield


def new_console() -> Console:
    """A console on stdout; off a terminal rich assumes 80 columns, and a table of 12 heads needs more."""
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def check_json_file(json_path: str | None, example: str) -> None:
    """--json names a file: one line, before any work, when it names a directory (EXAMPLE: a file name to offer)."""
    if json_path is not None and os.path.isdir(json_path):
        raise QkvError(f"--json {json_path} is a directory; give a file name such as {example}")


def check_writable(directory: str | os.PathLike, subs: tuple[str, ...] = ()) -> None:
    """Fail before the work, not after it, when an output directory cannot be written, or it or a sub-folder
    SUBS the command will write in is a link (`io.real_directory`)."""
    from ..runtime.io import real_directory

    try:
        real_directory(directory, subs)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise QkvError(f"cannot write to {directory}: {e.strerror}; choose a writable directory") from None


@contextmanager
def removed_if_failed(directory: str | os.PathLike | None) -> Iterator[None]:
    """Around a command's work: if it fails, a DIRECTORY it created and left empty is removed."""
    existed = directory is None or os.path.lexists(directory)
    try:
        yield
    except BaseException:
        if not existed and os.path.isdir(directory) and not os.listdir(directory):
            os.rmdir(directory)
        raise


def run(command: click.Command, prog_name: str | None = None) -> None:
    """Run a click command as `qkv` does: a QkvError is one line on stderr and exit code 2.

    Also the entry of the scripts in benchmarks/, which run one `qkv bench` command each.
    """
    try:
        command.main(prog_name=prog_name, standalone_mode=False)
        sys.stdout.flush()                            # a full disk or a closed pipe shows here, not at exit
    except QkvError as e:
        click.echo(error_line(e), err=True)
        sys.exit(2)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EPIPE, errno.EDQUOT, errno.EIO, errno.EFBIG):
            raise
        _abandon_stdout()
        if e.errno != errno.EPIPE:                    # a reader that left (| head) wants no message
            click.echo(f"qkv: error: cannot write the output ({e.strerror}); free some space or write elsewhere",
                       err=True)
        sys.exit(2 if e.errno != errno.EPIPE else 141)
    except click.exceptions.Abort:
        click.echo("qkv: aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:                     # one line, not click's four: what is wrong, where help is
        where = f"; see {e.ctx.command_path} --help" if e.ctx is not None else ""
        click.echo(f"qkv: error: {e.format_message().replace(chr(10), ' ').rstrip('.')}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"qkv: error: {e.format_message().replace(chr(10), ' ')}", err=True)
        sys.exit(e.exit_code)


def error_line(e: QkvError) -> str:
    """"qkv: error: …" on one line whatever the message holds (a value it quotes may hold a newline)."""
    return "qkv: error: " + " ".join(str(e).splitlines()).strip()


def _abandon_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail a second time
    (and print "Exception ignored … OSError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def write_figure(fig, out_dir: str, name: str) -> None:
    """OUT_DIR/NAME.png and .svg, written together (viz.drawing.save_figure), and say so."""
    from ..viz.drawing import save_figure

    for f in save_figure(fig, out_dir, name):
        click.echo(f"wrote {f}")


def head_pairs(values: tuple[str, ...]) -> list[tuple]:
    """--ablate 3.2 --ablate 5.1, --ablate 3.2,5.1 or --ablate 3.heads.2,encoder.0.heads.1 → [(3, 2), (5, 1)] or
    [(3, 2), ("encoder", 0, 1)]: keys of the one hook and ablation grammar naming heads (qkv.core.hooks.parse_key),
    or one clear error (the model checks that the stacks, layers and heads exist)."""
    from ..core.hooks import head_key

    keys = [head_key(item, "--ablate") for item in (i.strip() for i in ",".join(values).split(",") if i.strip())]
    return [(k.layer, k.head) if k.stack is None else (k.stack, k.layer, k.head) for k in keys]


def as_decoder(model, prefix: str | None, default: str | None = ""):
    """MODEL as the decoder its analyses read: an encoder–decoder becomes its DecoderView writing
    PREFIX (None: DEFAULT; "" the start token alone, None its own translation); a decoder stays, and
    refuses --prefix in one line."""
    from ..runtime.errors import QkvError
    from ..models.seq2seq import DecoderView, Seq2SeqModel

    if isinstance(model, Seq2SeqModel):
        return DecoderView(model, default if prefix is None else prefix)
    if prefix is not None:
        raise QkvError(f"--prefix is for encoder–decoders (the target written so far); {model.name} reads TEXT alone")
    return model


def warn_unknown(model, text: str) -> None:
    """One line on stderr when words of TEXT are not in the model's vocabulary (each read as the unknown
    token, so what the model makes of them means nothing), with what the vocabulary does hold."""
    tok = model.tokenizer
    unknown = [] if tok is None else tok.unknown_words(text)
    if not unknown:
        return
    pieces = tok.encode(text, add_special_tokens=False)[0]
    count, examples = tok.known_words(unknown[0])
    shown = ", ".join(unknown[:6]) + (", …" if len(unknown) > 6 else "")
    knows = (f"; its vocabulary has {count} words like these, e.g. {', '.join(examples)}"
             f"{', …' if count > len(examples) else ''}" if count else "")
    click.echo(f"warning: {len(unknown)} of {len(pieces)} source tokens are unknown to {model.name} (read as "
               f"{tok.id_to_token(tok.unk_id)}: {shown}), so its output says nothing about them{knows}", err=True)


@contextmanager
def progress_bar(verb: str, things: str) -> Iterator:
    """A progress(done, total) callback for the block: a bar on stderr's terminal, else `ProgressLines`
    (`restored 120/801 states (15%), 12 s`); the bar goes when the block ends."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if _quiet["on"]:
        yield lambda done, total: None
        return
    err = Console(stderr=True)
    columns = (TextColumn(f"{verb} {things}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(verb, total=None)
        lines = ProgressLines(verb, things)                     # off a terminal the bar is not drawn

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if not err.is_terminal:
                lines(done, total)
        yield progress


def train_under_bar(run, start: int, more: Callable[[dict], str]) -> None:
    """run.train (an SAE's or transcoders' run, from step START) under a bar of step, FVU, L0 and dead latents,
    with a line of them and MORE(entry) printed every tenth of the run (at most every checkpoint) and at the last
    step: on a terminal above the bar, else plain lines on stdout and the bar on stderr; `qkv --quiet`: no bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("step"), BarColumn(), MofNCompleteColumn(), TextColumn("FVU {task.fields[fvu]}"),
               TextColumn("L0 {task.fields[l0]}"), TextColumn("dead {task.fields[dead]}"), TimeRemainingColumn())
    shared = sys.stdout.isatty()
    s = run.settings
    every = min(s.checkpoint_every, max(1, s.steps // 10))

    def line(e: dict) -> str:
        return f"step {e['step']:>7}  FVU {e['fvu']:.4f}  L0 {e['l0']:.1f}  dead {e['dead']:.1%}  {more(e)}"

    with Progress(*columns, console=Console(stderr=not shared), transient=True, disable=_quiet["on"]) as bar:
        job = bar.add_task("train", total=s.steps, completed=start, fvu="…", l0="…", dead="…")

        def on_step(e: dict) -> None:
            bar.update(job, completed=e["step"], fvu=f"{e['fvu']:.3f}", l0=f"{e['l0']:.1f}", dead=f"{e['dead']:.1%}")
            if e["step"] % every == 0 or e["step"] == s.steps:
                if shared:
                    bar.console.print(line(e), markup=False, highlight=False)
                else:
                    click.echo(line(e))

        run.train(on_step)


class ProgressLines:
    """Progress as plain lines on stderr, for when it is not a terminal (a log, a pipe): a line at the first
    call, then at most one every EVERY seconds, and one at the end (`patched 120/716 copies (17%), 12 s`)."""

    EVERY = 5.0

    def __init__(self, verb: str, things: str):
        import time

        self.verb, self.things, self.clock = verb, things, time.perf_counter
        self.start = self.last = None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self.start is None:
            self.start = now
        elif done < total and now - self.last < self.EVERY:
            return
        self.last = now
        click.echo(f"{self.verb} {done:,}/{total:,} {self.things} ({done / max(total, 1):.0%}), "
                   f"{now - self.start:.0f} s", err=True)
