"""The commands that write text: `qkv generate` (continue a prompt), `qkv translate` (an
encoder–decoder's target) and `qkv chat` (one question or a conversation with an LLM), each with
--trace DIR for what the written tokens attended to; generate and chat steer with SAE features
(--sae DIR --steer FEATURE:ALPHA, cli/sae_views.py) or control vectors (--steer FILE@LAYER:SCALE,
--ablate-direction FILE, cli/steering.py). Registered by cli/app.py."""

from __future__ import annotations

import contextlib
import itertools
import sys

import click

from .common import MODEL_HELP, SEED, check_writable, error_line, removed_if_failed, status, warn_unknown
from .options import TRANSLATOR, WRITER, model_option, text_argument
from .sae_views import check_steer_flags, steer_options, steered
from ..runtime.errors import QkvError


lens_option = click.option(
    "--lens", is_flag=True, help="Add the Logit lens tab to --trace's viewer: every layer's top tokens at every "
                                 "position, (L+1)·n·V multiply-adds (on SmolLM2 about as long again as the "
                                 "generation itself).")


@click.command(name="generate")
@text_argument()
@model_option(WRITER, MODEL_HELP + " Must be a decoder, or an encoder–decoder (then TEXT is translated, as by "
                                   "qkv translate).")
@click.option("--max-new-tokens", "-n", type=int, default=None,
              help="How many tokens to add.  [default: 40; an encoder–decoder: at most its target positions]")
@click.option("--temperature", "-t", type=float, default=None,
              help="0 = greedy.  [default: 1.0; an encoder–decoder: 0, as qkv translate]")
@click.option("--top-k", type=int, default=None, help="Sample only among the k most likely tokens.")
@click.option("--top-p", type=float, default=None, help="Sample only from the smallest set with probability ≥ p.")
@click.option("--seed", type=SEED, default=None, help="Make sampling repeatable.")
@click.option("--stop", multiple=True, help="Stop at this string (repeatable).")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Save what every token attended to into this directory.")
@lens_option
@steer_options
def generate(text: str, source: str, max_new_tokens: int | None, temperature: float | None, top_k: int | None,
             top_p: float | None, seed: int | None, stop: tuple[str, ...], trace_dir: str | None, lens: bool,
             sae_dir: str | None, steer: tuple[str, ...], ablate_direction: tuple[str, ...] = ()) -> None:
    """Continue TEXT with a decoder model, streaming the text as it is written.

    With --sae and --steer, add SAE features' directions to the stream while writing (qkv.features.steer); with
    --steer FILE@LAYER:SCALE a control vector's (qkv steer make, llama.cpp's), with --ablate-direction FILE its
    direction removed at every layer (qkv.analysis.steering). With an encoder–decoder, translate TEXT instead (qkv translate).

    After the prompt, each new token runs every decoder layer as one compiled call (core/step_compiled.py: Llama,
    Mistral, Qwen2, Phi-3, Gemma and their GGUF files, in both --arith); --trace, --steer and --ablate-direction
    record or change the pass, so they take the readable NumPy step, as do the layers the compiled step does not
    cover. Both give the same tokens (tested). QKV_STEP=readable takes the readable step everywhere."""
    from dataclasses import replace

    from .common import load_model as load
    from ..writing.generate import TextStream
    from ..writing.sampling import Sampling
    from ..models.seq2seq import Seq2SeqModel

    sampling = Sampling(temperature=1.0 if temperature is None else temperature, top_k=top_k, top_p=top_p,
                        seed=seed)                                                # checked before loading
    check_lens_flag(lens, trace_dir)
    features = check_steer_flags(sae_dir, steer, ablate_direction)
    model = load(source)
    if isinstance(model, Seq2SeqModel):
        if features is not None:
            raise QkvError("--steer adds a feature to a decoder's stream; a translator's two stacks take none")
        if lens:
            raise QkvError("--lens adds a decoder's Logit lens tab; a translation's viewer shows its three kinds "
                           "of attention (qkv lens TEXT --model ... reads a translator's decoder)")
        sampling = replace(sampling, temperature=0.0) if temperature is None else sampling
        return _translate(model, text, max_new_tokens, sampling, stop, trace_dir)
    model = steered(model, sae_dir, features)
    stream = TextStream(model, text, 40 if max_new_tokens is None else max_new_tokens, sampling,
                        stop=list(stop) or None, record=trace_dir is not None)
    with removed_if_failed(trace_dir):
        if trace_dir is not None:
            check_writable(trace_dir)
        click.echo(text, nl=False)
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()
        if trace_dir is not None:
            _save_generation(stream, trace_dir, "generated", lens)


@click.command(name="translate")
@text_argument()
@model_option(TRANSLATOR, "An encoder–decoder: 'ko-en-tiny' (Korean → English, trained by qkv) or a local Hugging Face "
                   "directory (Marian, BART, mBART, Pegasus, T5, mT5).")
@click.option("--max-new-tokens", "-n", type=int, default=None,
              help="At most this many target tokens.  [default: 40, or what the target positions allow]")
@click.option("--temperature", "-t", type=float, default=0.0, show_default=True,
              help="0 = greedy: the same text, the same translation.")
@click.option("--top-k", type=int, default=None, help="Sample only among the k most likely tokens.")
@click.option("--top-p", type=float, default=None, help="Sample only from the smallest set with probability ≥ p.")
@click.option("--seed", type=SEED, default=None, help="Make sampling repeatable.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Save what every target token looked at in the source (cross-attention), and both stacks' "
                   "self-attention, into this directory, with attention.html to open in a browser.")
def translate_cmd(text: str, source: str, max_new_tokens: int | None, temperature: float, top_k: int | None,
                  top_p: float | None, seed: int | None, trace_dir: str | None) -> None:
    """Translate TEXT with an encoder–decoder, streaming the target as it is written.

    The encoder reads TEXT once; the decoder writes the target a token at a time, reading
    the source through cross-attention (Q from the decoder, K and V from the encoder's output).
    """
    from .common import load_model as load
    from ..writing.sampling import Sampling
    from ..models.seq2seq import Seq2SeqModel

    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)   # checked before loading
    model = load(source)
    if not isinstance(model, Seq2SeqModel):
        raise QkvError(f"{model.name} is not an encoder–decoder ({model.config.family}): it has no source to "
                       "translate from; continue a text with `qkv generate` instead")
    _translate(model, text, max_new_tokens, sampling, (), trace_dir)


def _translate(model, text: str, max_new_tokens: int | None, sampling, stop: tuple[str, ...],
               trace_dir: str | None) -> None:
    """`qkv translate`'s work (and `qkv generate`'s on an encoder–decoder): the target streamed, then --trace."""
    from ..models.audio_model import AudioModel
    from ..writing.seq2seq_generate import TargetStream

    if isinstance(model, AudioModel):                   # before warn_unknown: its source is sound, not TEXT
        raise QkvError(f"{model.name} is Whisper: it reads sound, not text; write what a sound file says with "
                       f"`qkv transcribe FILE --model {model.name}`, or see where a transcript looks in time with "
                       f"`qkv show FEATURES.npy --model {model.name} --prefix TEXT`")
    if max_new_tokens is None:
        max_new_tokens = min(40, model.config.max_positions - 1)
    stream = TargetStream(model, text, max_new_tokens, sampling, stop=list(stop) or None)   # bad input fails here
    warn_unknown(model, text)
    with removed_if_failed(trace_dir):
        if trace_dir is not None:
            check_writable(trace_dir, ("encoder", "cross"))
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()
        if trace_dir is not None:
            _save_translation(stream, trace_dir)


def _save_translation(stream, trace_dir: str) -> None:
    """--trace DIR of a translation: the decoder's trace.npz + trace.json, the encoder's in DIR/encoder
    and the cross-attention's in DIR/cross (each reloads with Trace.load), and attention.html."""
    from ..viz.html import save_viewer

    trace = stream.trace()
    out = trace.save(trace_dir)
    trace.encoder.save(out / "encoder")
    trace.cross.save(out / "cross")
    viewer = save_viewer(trace, out / "attention.html", tokenizer=stream.model.tokenizer)
    n_tgt, n_src = trace.cross.attentions.shape[-2:]
    click.echo(f"attention of {n_tgt} target tokens ({len(stream.new_ids)} written) over {n_src} source tokens "
               f"(encoder, decoder, cross) saved in {out}; open {viewer} in a browser", err=True)


CHAT_HELP = "/reset clears the conversation, /help shows this, /quit or Ctrl-D quits, Ctrl-C stops a reply"


@click.command(name="chat")
@text_argument(required=False)
@model_option(WRITER, "A chat model: 'smollm2', a .gguf file, or a Hugging Face directory with a chat template.")
@click.option("--system", default=None, help="A system message to begin the conversation with.")
@click.option("--max-new-tokens", "-n", type=int, default=256, show_default=True, help="At most this many tokens a reply.")
@click.option("--temperature", "-t", type=float, default=0.0, show_default=True,
              help="0 = greedy: the same question, the same answer.")
@click.option("--top-k", type=int, default=None, help="Sample only among the k most likely tokens.")
@click.option("--top-p", type=float, default=None, help="Sample only from the smallest set with probability ≥ p.")
@click.option("--seed", type=SEED, default=None, help="Make sampling repeatable.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Save what every token of the conversation and reply attended to into this directory "
                   "(in a conversation: after each reply).")
@lens_option
@steer_options
def chat_cmd(text: str | None, source: str, system: str | None, max_new_tokens: int, temperature: float,
             top_k: int | None, top_p: float | None, seed: int | None, trace_dir: str | None, lens: bool,
             sae_dir: str | None, steer: tuple[str, ...], ablate_direction: tuple[str, ...] = ()) -> None:
    """Ask a chat model TEXT (a question) and stream its answer.

    Without TEXT, talk with it: the conversation is kept from turn to turn (when it
    outgrows the model's context, the oldest turns are dropped, with a note); /reset clears
    it, /help lists the commands, Ctrl-C stops a reply, Ctrl-D quits; what you type while a reply streams is
    neither shown nor kept. With --sae and --steer, every
    reply is written with SAE features' directions added to the stream (qkv.features.steer).

    Each new token runs every decoder layer as one compiled call where it can (as qkv generate); --trace,
    --steer and --ablate-direction take the readable NumPy step (QKV_STEP=readable: always).
    """
    from ..writing.chat import Conversation
    from .common import load_model as load
    from ..writing.sampling import Sampling

    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)   # checked before loading
    check_lens_flag(lens, trace_dir)
    features = check_steer_flags(sae_dir, steer, ablate_direction)
    conversation = Conversation(steered(load(source), sae_dir, features), system, max_new_tokens, sampling,
                                record=trace_dir is not None)
    if text is not None:
        with removed_if_failed(trace_dir):
            if trace_dir is not None:
                check_writable(trace_dir)
            _chat_turn(conversation, text, trace_dir, lens)
        return
    if trace_dir is not None:
        check_writable(trace_dir)
    if sys.stdin.isatty():
        import readline  # noqa: F401  (line editing and history for input())
    click.echo(f"chatting with {conversation.model.name}: {CHAT_HELP}")
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            click.echo()
            return
        if line in ("/quit", "/exit"):
            return
        if line == "/reset":
            conversation.reset()
            click.echo("(the conversation is cleared)")
        elif line == "/help":
            click.echo(CHAT_HELP)
        elif line.startswith("/"):
            click.echo(f"unknown command {line.split()[0]}: {CHAT_HELP}")
        elif line:
            try:
                with typing_hidden():
                    _chat_turn(conversation, line, trace_dir, lens)
            except QkvError as e:                                   # this turn fails, the chat goes on
                click.echo(error_line(e), err=True)


@contextlib.contextmanager
def typing_hidden():
    """While a reply streams in the chat loop, what the user types is not echoed into it (the terminal's ECHO
    off) and is discarded when the block ends (tcflush of the unread input): the next prompt starts empty, never
    sending half a line typed blind. Ctrl-C still stops the reply (signals stay on).
    Nothing changes when stdin is not a terminal (a pipe's lines are the next questions)."""
    try:
        import termios
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd) if sys.stdin.isatty() else None
    except (ImportError, OSError, ValueError, AttributeError):     # no termios (Windows), no real stdin
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO                                       # lflag: keystrokes no longer echoed
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcflush(fd, termios.TCIFLUSH)                       # what was typed meanwhile: discarded
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _chat_turn(conversation, text: str, trace_dir: str | None, lens: bool = False) -> None:
    """One question and its streamed answer (Ctrl-C stops the answer), then the trace if asked."""
    dropped = conversation.dropped
    pieces = conversation.reply(text)
    if conversation.dropped > dropped:
        click.echo(f"(dropped the {conversation.dropped - dropped} oldest turns to fit the context of "
                   f"{conversation.model.config.max_positions} tokens)", err=True)
    try:
        with status(f"{conversation.model.name} is reading the conversation …"):
            first = next(pieces, None)                   # the prompt's pass: the wait before the first token
        for piece in ([] if first is None else itertools.chain([first], pieces)):
            click.echo(piece, nl=False)
    except KeyboardInterrupt:
        pieces.close()
        click.echo(" [stopped]", nl=False)
    click.echo()
    stream = conversation.last
    if stream is not None and len(stream.new_ids) >= conversation.max_new_tokens and not _ended(stream):
        click.echo(f"(the reply stopped at -n {conversation.max_new_tokens} tokens, maybe mid-sentence; "
                   "raise -n for a longer one)", err=True)
    if trace_dir is not None:
        _save_generation(conversation.last, trace_dir, "in the reply", lens)


def _ended(stream) -> bool:
    """Whether a finished stream's last token was one of its stop tokens (the model ended its reply), not the
    -n limit."""
    from ..writing.generate import stop_ids

    ends = stop_ids(stream.model, stream.sampling.stop_at_eos, stream.stop_tokens)
    return bool(stream.new_ids) and int(stream.new_ids[-1]) in set(ends.tolist())


def check_lens_flag(lens: bool, trace_dir: str | None) -> None:
    if lens and trace_dir is None:
        raise QkvError("--lens adds a tab to the viewer --trace writes; give --trace DIR too")


def _save_generation(stream, trace_dir: str, what: str, lens: bool = False) -> None:
    """--trace DIR of a generation (analysis.sections.save_generation), and where it went."""
    from ..analysis.sections import save_generation

    trace, out, viewer = save_generation(stream, trace_dir, lens)
    hint = "" if lens else " (--lens adds the Logit lens tab)"
    click.echo(f"attention of {len(trace.tokens)} tokens ({len(stream.new_ids)} {what}) saved in {out}; "
               f"open {viewer} in a browser{hint}", err=True)
