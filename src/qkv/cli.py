"""`qkv ...`: the command line. User mistakes print one line and exit with code 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .analysis.cli import heads as heads_cmd
from .bench.cli import bench as bench_cmd
from .cli_common import MODEL_HELP, check_writable, new_console, removed_if_failed, run
from .errors import QkvError
from .tokenizer import shorten as _label


def _shade(weight: float) -> str:
    """A colour for an attention weight: brighter = more attention (as every view, `viz.palette`)."""
    level = int(round(min(max(weight, 0.0), 1.0) * 5))
    return ["grey35", "grey50", "cyan", "bright_cyan", "bold bright_cyan", "bold bright_white"][level]


def heads_table(tokens: list[str], attn: np.ndarray, layer: int, heads: list[int]) -> Table:
    """For each token (row) and head (column): the token it attends to most, and how much."""
    table = Table(title=f"layer {layer}: where each token looks most (argmax of its attention row)",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="grey50")
    table.add_column("token", style="bold")
    for h in heads:
        table.add_column(f"h{h}", no_wrap=True)
    for i, tok in enumerate(tokens):
        row = [Text(str(i)), Text(_label(tok, 10))]
        for h in heads:
            j = int(np.argmax(attn[h, i]))
            weight = float(attn[h, i, j])
            row.append(Text(f"{_label(tokens[j], 7)} {weight:.2f}".replace("0.", ".", 1), style=_shade(weight)))
        table.add_row(*row)
    return table


def head_matrix(tokens: list[str], attn: np.ndarray, layer: int, head: int, limit: int = 32) -> Table:
    """One head's full attention matrix A (rows: queries, columns: keys), as numbers."""
    n = min(len(tokens), limit)
    table = Table(title=f"layer {layer}, head {head}: attention weights A (row = query, column = key)",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("query", style="bold")
    for j in range(n):
        table.add_column(Text(_label(tokens[j], 6)), justify="right", no_wrap=True)
    for i in range(n):
        cells = [Text(f"{attn[head, i, j]:.2f}", style=_shade(float(attn[head, i, j]))) for j in range(n)]
        table.add_row(Text(_label(tokens[i], 10)), *cells)
    return table


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qkv")
def cli() -> None:
    """qkv: see inside transformer language models."""


@cli.command()
@click.argument("text")
@click.option("--model", "source", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--layer", type=int, default=0, show_default=True, help="Layer to show (negative counts from the end).")
@click.option("--head", type=int, default=None,
              help="Show this head's whole attention matrix instead (with --out: draw its heatmap).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write figures (PNG, SVG) and the interactive viewer (HTML) into this directory.")
@click.option("--ablate", multiple=True, metavar="LAYER.HEAD",
              help="Knock out heads (zero-ablation: their Z = A·V set to 0 before W_O): "
                   "repeat or give a comma list, e.g. --ablate 3.2,5.1.")
def show(text: str, source: str, layer: int, head: int | None, out_dir: str | None,
         ablate: tuple[str, ...]) -> None:
    """Print the tokens of TEXT and where each head of a layer looks.

    With --out DIR, also write into DIR: the heatmap of one head (--head, or the layer's
    most focused head), the layer's heads side by side, every layer × head, and
    attention.html, a viewer to open in a browser.
    """
    from .checkpoints import load

    model = load(source)
    layer = model.check_layer(layer)
    if head is not None:
        head = model.check_head(head)
    knocked_out = _head_pairs(ablate)
    model.ablation(knocked_out)                                     # bad heads fail before DIR is touched
    existed = out_dir is not None and os.path.isdir(out_dir)
    ids, _ = model.encode(text)                                     # a bad text fails before DIR is touched
    check_attention_memory(model, len(ids), n_layers=model.config.n_layers if out_dir else 1)
    if out_dir is not None:
        check_writable(out_dir)
    try:
        trace = model.run(text, layers=None if out_dir else [layer], keep=("attentions",), ablate=knocked_out)
        _print_layer(trace, model, layer, head)
        if out_dir is not None:
            from .viz.figures import focused_head

            picked = focused_head(trace, layer) if head is None else head
            files = _save_views(trace, out_dir, model, layer, picked)
    except BaseException:
        if out_dir is not None and not existed and os.path.isdir(out_dir) and not os.listdir(out_dir):
            os.rmdir(out_dir)                                       # leave no trace of a failed run
        raise
    if out_dir is not None:
        why = "" if head is not None else f", the most focused of layer {layer}; choose another with --head"
        click.echo(f"wrote {len(files)} files to {out_dir} (heatmap of head {picked}{why}):")
        for f in files:
            click.echo(f"  {f}")
        click.echo(f"open {files[0]} in a browser to explore every layer and head")


def memory_bound() -> int:
    """Bytes of attention weights one command may hold: half the machine's memory, at most 8 GiB."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        physical = 8 << 30
    return min(physical // 2, 8 << 30)


def check_attention_memory(model, n: int, n_layers: int) -> None:
    """Refuse, before allocating, a run whose kept attention weights (n_layers·H·n² numbers, plus
    one layer's scores and weights while it is computed) would not fit `memory_bound()`."""
    H, size = model.config.n_heads, np.dtype(model.dtype).itemsize
    need = (n_layers + 2) * H * n * n * size
    bound = memory_bound()
    if need <= bound:
        return
    fits = int((bound / ((n_layers + 2) * H * size)) ** 0.5)
    how = ("drop --out to keep one layer (--layer), or " if n_layers > 1 else "") + f"give at most {fits:,} tokens"
    raise QkvError(f"the attention of {n:,} tokens over {n_layers} layer(s) × {H} heads needs about "
                   f"{need / 2**30:.1f} GiB, more than the {bound / 2**30:.1f} GiB allowed here; {how}")


def _print_layer(trace, model, layer: int, head: int | None) -> None:
    """The terminal part of `show`: tokens (as a reader sees them), then one head's matrix or every head's argmax."""
    attn = trace.layer(layer).attentions                              # (H, n, n)
    labels = trace.labels
    console = new_console()
    console.print(Text(f"{model.name}: {len(labels)} tokens, {model.config.n_layers} layers × "
                       f"{model.config.n_heads} heads"))
    console.print(Text("tokens: ") + Text(" ".join(f"{i}:{t}" for i, t in enumerate(labels))))
    if head is not None:
        console.print(head_matrix(labels, attn, layer, head))
        if len(labels) > 32:
            console.print(Text(f"(first 32 of {len(labels)} tokens shown)"))
        return
    H = model.config.n_heads
    per_table = max(1, (console.width - 16) // 12)
    for start in range(0, H, per_table):
        console.print(heads_table(labels, attn, layer, list(range(start, min(H, start + per_table)))))


def _save_views(trace, out_dir: str, model, layer: int, head: int) -> list[Path]:
    """The viewer and the figures into OUT_DIR, all or nothing (`io.FileBatch`)."""
    from .io import FileBatch
    from .viz.figures import save_figures
    from .viz.html import viewer_html

    out = Path(out_dir)
    try:
        with FileBatch(out) as files:
            files.write_text("attention.html", viewer_html(trace))              # the trace knows its model
            save_figures(trace, files, layer=layer, head=head)
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths


@cli.command()
@click.argument("prompt")
@click.option("--model", "source", default="minilm", show_default=True, help=MODEL_HELP + " Must be a decoder.")
@click.option("--max-new-tokens", "-n", type=int, default=40, show_default=True, help="How many tokens to add.")
@click.option("--temperature", "-t", type=float, default=1.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=None, help="Sample only among the k most likely tokens.")
@click.option("--top-p", type=float, default=None, help="Sample only from the smallest set with probability ≥ p.")
@click.option("--seed", type=int, default=None, help="Make sampling repeatable.")
@click.option("--stop", multiple=True, help="Stop at this string (repeatable).")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Save what every token attended to into this directory.")
def generate(prompt: str, source: str, max_new_tokens: int, temperature: float, top_k: int | None,
             top_p: float | None, seed: int | None, stop: tuple[str, ...], trace_dir: str | None) -> None:
    """Continue PROMPT with a decoder model, streaming the text as it is written."""
    from .checkpoints import load
    from .generate import TextStream
    from .sampling import Sampling

    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)   # checked before loading
    model = load(source)
    stream = TextStream(model, prompt, max_new_tokens, sampling, stop=list(stop) or None)
    with removed_if_failed(trace_dir):
        if trace_dir is not None:
            check_writable(trace_dir)
        click.echo(prompt, nl=False)
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()
        if trace_dir is not None:
            _save_generation(stream, trace_dir, "generated")


CHAT_HELP = "/reset clears the conversation, /help shows this, /quit or Ctrl-D quits, Ctrl-C stops a reply"


@cli.command(name="chat")
@click.argument("question", required=False)
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A chat model: 'smollm2', a .gguf file, or a Hugging Face directory with a chat template.")
@click.option("--system", default=None, help="A system message to begin the conversation with.")
@click.option("--max-new-tokens", "-n", type=int, default=256, show_default=True, help="At most this many tokens a reply.")
@click.option("--temperature", "-t", type=float, default=0.0, show_default=True,
              help="0 = greedy: the same question, the same answer.")
@click.option("--top-k", type=int, default=None, help="Sample only among the k most likely tokens.")
@click.option("--top-p", type=float, default=None, help="Sample only from the smallest set with probability ≥ p.")
@click.option("--seed", type=int, default=None, help="Make sampling repeatable.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Save what every token of the conversation and reply attended to into this directory "
                   "(in a conversation: after each reply).")
def chat_cmd(question: str | None, source: str, system: str | None, max_new_tokens: int, temperature: float,
             top_k: int | None, top_p: float | None, seed: int | None, trace_dir: str | None) -> None:
    """Ask a chat model QUESTION and stream its answer.

    Without QUESTION, talk with it: the conversation is kept from turn to turn (when it
    outgrows the model's context, the oldest turns are dropped, with a note); /reset clears
    it, /help lists the commands, Ctrl-C stops a reply, Ctrl-D quits.
    """
    from .chat import Conversation
    from .checkpoints import load
    from .sampling import Sampling

    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)   # checked before loading
    conversation = Conversation(load(source), system, max_new_tokens, sampling)
    if question is not None:
        with removed_if_failed(trace_dir):
            if trace_dir is not None:
                check_writable(trace_dir)
            _chat_turn(conversation, question, trace_dir)
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
                _chat_turn(conversation, line, trace_dir)
            except QkvError as e:                                   # this turn fails, the chat goes on
                click.echo(f"qkv: error: {e}", err=True)


def _chat_turn(conversation, text: str, trace_dir: str | None) -> None:
    """One question and its streamed answer (Ctrl-C stops the answer), then the trace if asked."""
    dropped = conversation.dropped
    pieces = conversation.reply(text)
    if conversation.dropped > dropped:
        click.echo(f"(dropped the {conversation.dropped - dropped} oldest turns to fit the context of "
                   f"{conversation.model.config.max_positions} tokens)", err=True)
    try:
        for piece in pieces:
            click.echo(piece, nl=False)
    except KeyboardInterrupt:
        pieces.close()
        click.echo(" [stopped]", nl=False)
    click.echo()
    if trace_dir is not None:
        _save_generation(conversation.last, trace_dir, "in the reply")


def _save_generation(stream, trace_dir: str, what: str) -> None:
    """--trace DIR of a generation: trace.npz + trace.json (reload with Trace.load) and
    attention.html, the viewer of what each token attended to and of each generated token's
    candidates at any temperature."""
    from .viz.html import save_viewer

    model = stream.model
    trace = stream.trace()
    out = trace.save(trace_dir)
    viewer = save_viewer(trace, out / "attention.html", tokenizer=model.tokenizer)
    click.echo(f"attention of {len(trace.tokens)} tokens ({len(stream.new_ids)} {what}) saved in {out}; "
               f"open {viewer} in a browser", err=True)


@cli.command(name="explain")
@click.argument("text", required=False, default="The cat sat on the mat")
@click.option("--model", "source", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--layer", type=int, default=0, show_default=True, help="Layer to follow (negative counts from the end).")
@click.option("--head", type=int, default=None, help="Head to follow [default: 2, or 0 if the model has fewer heads].")
@click.option("--lang", default="en", show_default=True, help="en (English) or ko (Korean, the seeds' language).")
def explain_cmd(text: str, source: str, layer: int, head: int | None, lang: str) -> None:
    """Walk one head of the real model through the seeds' steps, with shapes and numbers:
    X → Q, K, V → S = Q·Kᵀ → /√d_k → softmax → A·V → Concat·W_O, then why √d_k matters.
    On a decoder (--model smollm2) also RMSNorm, RoPE, GQA and the causal mask.

    TEXT defaults to "The cat sat on the mat"."""
    from .checkpoints import load
    from .explain import check_lang, walkthrough
    from .explain_render import render

    check_lang(lang)
    steps = walkthrough(load(source), text, layer, head)
    console = new_console()
    for part in render(steps, lang):
        console.print(part)


def _head_pairs(values: tuple[str, ...]) -> list[tuple[int, int]]:
    """--ablate 3.2 --ablate 5.1 or --ablate 3.2,5.1 → [(3, 2), (5, 1)], or one clear error
    (the model checks that the layers and heads exist)."""
    pairs = []
    for item in (i.strip() for i in ",".join(values).split(",") if i.strip()):
        layer, dot, head = item.partition(".")
        try:
            pairs.append((int(layer), int(head)))
        except ValueError:
            raise QkvError(f"--ablate {item!r} is not LAYER.HEAD; give e.g. --ablate 3.2 (layer 3, head 2)") from None
    return pairs


def _temperatures(values: tuple[str, ...]) -> list[float]:
    """-t 0.5 -t 1 or -t 0.5,1,2 → [0.5, 1.0, 2.0] (repeats dropped), or one clear error."""
    from .sampling import check_sampling

    temps: list[float] = []
    for item in ",".join(values).split(","):
        try:
            T = float(item)
        except ValueError:
            raise QkvError(f"temperature {item.strip()!r} is not a number; "
                           "give numbers ≥ 0, e.g. -t 0.5,1,2") from None
        check_sampling(T, None, None)
        if T not in temps:
            temps.append(T)
    return temps


@cli.command(name="next")
@click.argument("text")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A decoder: 'smollm2' (default), a .gguf file, or a local Hugging Face directory.")
@click.option("--temperature", "-t", "temperatures", multiple=True, default=("0.5,1,2",), show_default=True,
              help="Temperatures T: a comma list or repeated -t (0 = greedy).")
@click.option("--top-k", type=click.IntRange(1), default=10, show_default=True, help="How many tokens to list.")
@click.option("--chat", is_flag=True, help="Wrap TEXT as one user turn of the model's chat template.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the bar chart (next_token.png, .svg) into this directory.")
@click.option("--ablate", multiple=True, metavar="LAYER.HEAD",
              help="Knock out heads (zero-ablation: their Z = A·V set to 0 before W_O): "
                   "repeat or give a comma list, e.g. --ablate 3.2,5.1.")
def next_cmd(text: str, source: str, temperatures: tuple[str, ...], top_k: int, chat: bool,
             out_dir: str | None, ablate: tuple[str, ...]) -> None:
    """The next token after TEXT: the top k of P = softmax(logits / T) at each temperature T,
    and the entropy H = −Σ P·log₂ P of the whole distribution, in bits."""
    from functools import partial

    from .checkpoints import load
    from .nexttoken import distribution, entropy, next_token_logits, token_text, top_tokens

    temps = _temperatures(temperatures)
    model = load(source)
    if chat:                                                                   # one user turn, then the reply begins
        ids = np.asarray(model.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                             add_generation_prompt=True), dtype=np.int64)
    else:
        ids, _ = model.encode(text)
    knocked_out = _head_pairs(ablate)
    z = next_token_logits(model, ids, ablate=knocked_out)                      # (V,)
    P = {T: distribution(z, T) for T in temps}                                 # T → (V,)
    top, _ = top_tokens(distribution(z, 1.0), top_k)                           # the same order at every T > 0
    label = partial(token_text, model.tokenizer)                               # id → its text, whitespace visible
    console = new_console()
    console.print(Text(f"{model.name}: the next token after {len(ids)} tokens, P = softmax(logits / T)"
                       + (f", heads {', '.join(ablate)} zero-ablated" if knocked_out else "")))
    table = Table(show_edge=False, pad_edge=False)
    for name in ("#", "token", "id", *(f"T={T:g}" for T in temps)):
        table.add_column(name, justify="left" if name == "token" else "right", no_wrap=True)
    for r, i in enumerate(top):
        table.add_row(str(r + 1), Text(label(i)), str(int(i)), *(f"{P[T][i]:.4f}" for T in temps))
    table.add_section()
    table.add_row("", Text(f"other {len(z) - len(top)} tokens"), "",
                  *(f"{max(0.0, 1 - P[T][top].sum()):.4f}" for T in temps))
    table.add_row("", Text("entropy (bits)"), "", *(f"{float(entropy(P[T])):.3f}" for T in temps))
    console.print(table)
    if out_dir is not None:
        from .viz.distribution import next_token_figure

        _write_figure(next_token_figure(z, temps, label, k=top_k, model_name=model.name, text=text), out_dir,
                      "next_token")


def _write_figure(fig, out_dir: str, name: str) -> None:
    """OUT_DIR/NAME.png and .svg, written together (viz.figures.save_figure), and say so."""
    from .viz.figures import save_figure

    for f in save_figure(fig, out_dir, name):
        click.echo(f"wrote {f}")


@cli.command(name="lens")
@click.argument("text")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A decoder: 'smollm2' (default), a .gguf file, or a local Hugging Face directory.")
@click.option("--top", type=click.IntRange(1, 20), default=3, show_default=True,
              help="How many tokens to list per layer.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the layers × positions map (lens.png, .svg) into this directory.")
def lens_cmd(text: str, source: str, top: int, out_dir: str | None) -> None:
    """The logit lens: what each layer would predict after TEXT, reading the residual stream
    after l blocks through the final norm and W_vocab (layer 0: the embeddings)."""
    from .analysis.lens import check_lens
    from .checkpoints import load

    model = load(source)
    check_lens(model)
    model.encode(text)                                                        # a bad text fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        _lens(model, text, top, out_dir)


def _lens(model, text: str, top: int, out_dir: str | None) -> None:
    """`qkv lens`'s work: the table of the last position, and with OUT_DIR the map."""
    from .analysis.lens import KEEP, final_prediction, lens_of_trace
    from .nexttoken import distribution, top_tokens

    trace = model.run(text, keep=KEEP)
    lens = lens_of_trace(model, trace)                                        # (L+1, n, V)
    ids, probs = final_prediction(lens)                                       # (n,), (L+1, n)
    label = model.tokenizer.label
    console = new_console()
    console.print(Text(f"{model.name}: the logit lens at the last position ({trace.labels[-1]}), "
                       f"final prediction {label(int(ids[-1]))}"))
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("layer", justify="right", style="grey50")
    for r in range(top):
        table.add_column(f"top {r + 1}", no_wrap=True)
    table.add_column("P(final)", justify="right")
    for l, z in enumerate(lens[:, -1]):
        best, p = top_tokens(distribution(z, 1.0), top)
        table.add_row("emb" if l == 0 else str(l), *(Text(f"{label(int(i))} {q:.2f}") for i, q in zip(best, p)),
                      f"{probs[l, -1]:.3f}")
    console.print(table)
    if out_dir is not None:
        from .analysis.lens import lens_figure

        _write_figure(lens_figure(probs, trace.labels, [label(int(i)) for i in ids], model_name=model.name),
                      out_dir, "lens")


@cli.command(name="dla")
@click.argument("text")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A decoder: 'smollm2' (default), a .gguf file, or a local Hugging Face directory.")
@click.option("--target", required=True, help="The token whose logit to explain, one token (e.g. ' Mary').")
@click.option("--other", default=None, help="Explain the logit difference target − other (one token).")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True,
              help="How many heads to list (largest |contribution| first).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the layers × heads map (dla.png, .svg) into this directory.")
def dla_cmd(text: str, source: str, target: str, other: str | None, top: int, out_dir: str | None) -> None:
    """Direct logit attribution: each head's and FFN's direct part of TARGET's logit (or of
    target − other) after TEXT, the final norm's scale frozen (as TransformerLens does)."""
    from .analysis.attribution import (KEEP, attribution_figure, attribution_of_trace, check_attribution,
                                       token_id)
    from .checkpoints import load

    model = load(source)
    check_attribution(model)
    model.encode(text)                                                        # bad input fails before DIR is touched
    t, o = token_id(model, target), None if other is None else token_id(model, other)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        a = attribution_of_trace(model, model.run(text, keep=KEEP), t, o)
        label = model.tokenizer.label
        what = f"logit({label(t)})" + ("" if o is None else f" − logit({label(o)})")
        console = new_console()
        console.print(Text(f"{model.name}: direct logit attribution of {what} = {a.logit:.3f} at the last position"))
        table = Table(show_edge=False, pad_edge=False)
        for name in ("#", "head", "contribution"):
            table.add_column(name, justify="right")
        for r, (layer, head, c) in enumerate(a.top(top)):
            table.add_row(str(r + 1), f"L{layer}.H{head}", f"{c:+.3f}")
        console.print(table)
        best = np.argsort(-np.abs(a.ffns))[:3]
        console.print(Text(f"heads {a.heads.sum():+.3f}, FFNs {a.ffns.sum():+.3f} (largest: "
                           + ", ".join(f"L{int(l)} {a.ffns[l]:+.3f}" for l in best) + "), "
                           + ", ".join(f"{k} {v:+.3f}" for k, v in a.rest.items() if v) + f"; sum {a.total():.3f}"))
        if out_dir is not None:
            _write_figure(attribution_figure(a.heads, model_name=model.name, what=what), out_dir, "dla")


@cli.command()
def models() -> None:
    """List the models that can be loaded on this machine."""
    from .checkpoints import available

    table = Table(show_edge=False, pad_edge=False)
    table.add_column("source", style="bold")
    table.add_column("what")
    for source, what in available():
        table.add_row(Text(source), Text(what))
    new_console().print(table)
    new_console().print(Text("Any local directory with config.json + model.safetensors (bert, gpt2, llama, mistral, "
                          "qwen2) works too: --model PATH"))


@cli.command()
@click.option("--model", "source", default="minilm", show_default=True,
              help=MODEL_HELP + " The page also offers every model `qkv models` lists.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 127.0.0.1 keeps the page on this machine.")
def serve(source: str, port: int, host: str) -> None:
    """A local web page: type text, pick model, layer and head, and see the attention."""
    from .server import exposure_warning, make_server

    server = make_server(source, host, port)
    click.echo(f"qkv: serving {server.app.default} at {server.url}  (Ctrl+C to stop)")
    warning = exposure_warning(host)
    if warning:
        click.echo(warning, err=True)
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


cli.add_command(heads_cmd)        # `qkv heads`: what each head does (analysis/cli.py)
cli.add_command(bench_cmd)        # `qkv bench`: timings against transformers (bench/cli.py)


def main() -> None:
    """Entry point: a QkvError becomes one line on stderr and exit code 2 (`cli_common.run`)."""
    run(cli)
