"""`qkv explain` (the walkthrough of docs/guide.md and its topics, `qkv explain TOPIC`) and `qkv next` (the
next-token distribution at several temperatures). Registered by cli/app.py."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import MODEL_HELP, check_writable, head_pairs, new_console, removed_if_failed, write_figure
from ..core.capabilities import require
from ..runtime.errors import QkvError
from ..lessons import Topic, explain_help, register
from .options import READER, WRITER, global_tokens_option, model_option, prefix_option, text_argument

register("circuits", Topic("qkv.graphs.lesson", "one small attribution graph: a transcoder (the FFN box rewritten), "
                                                "an edge, error nodes, the scores (--transcoders DIR)"))


@click.command(name="explain", help=explain_help())
@click.argument("args", nargs=-1, metavar="[TOPIC] [TEXT]")
@model_option(None, MODEL_HELP + f"  [default: the topic's own; attention: {READER}]")
@click.option("--layer", type=int, default=None, help="attention, flash, ffn, vit: the layer to follow (negative counts from the "
                                                      "end).  [default: 0; flash: the one whose max grows most; ffn: the "
                                                      "middle layer]")
@click.option("--head", type=int, default=None, help="attention, flash: the head to follow (negative counts from the "
                                                     "end) [attention's default: 2, or 0 if the model has fewer heads].")
@click.option("--lang", default="en", show_default=True, help="en (English) or ko (Korean, docs/guide.ko.md's words).")
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="Also write the topic's figures (PNG + SVG) into DIR.")
@click.option("--html", "html_file", default=None, metavar="FILE",
              help="attention: also write the walkthrough as the pipeline page, one offline HTML file (every box "
                   "of the model, opened at --layer and --head, in --lang with an English/Korean toggle).")
@click.option("--transcoders", "transcoders_dir", default=None, metavar="DIR",
              help="circuits: one transcoder per layer of the model (any layout qkv graph reads).")
@global_tokens_option()
def explain_cmd(args: tuple[str, ...], source: str | None, layer: int | None, head: int | None, lang: str,
                out_dir: str | None, html_file: str | None, transcoders_dir: str | None) -> None:
    """`qkv explain [TOPIC] [TEXT]`: the help text is lessons.explain_help (it lists the topics)."""
    from .common import load_model as load, status
    from ..lessons import attention_figures, check_lang, lesson_module, parse

    topic, text = parse(args)
    check_lang(lang)
    if topic == "ffn" and head is not None:
        raise QkvError("--head chooses a head of the attention walkthrough (or of flash); ffn follows one layer's FFN, "
                       "which has no heads: drop --head (--layer chooses the layer)")
    if topic == "vit" and head is not None:
        raise QkvError("--head chooses the head of the attention walkthrough (or of flash); vit shows every head of "
                       "its layer: drop --head (--layer chooses the layer)")
    if topic == "circuits":
        _circuits_options(transcoders_dir, head, out_dir, html_file)
    elif transcoders_dir is not None:
        raise QkvError(f"--transcoders is read by qkv explain circuits; {topic} does not take it")
    if topic not in ("attention", "flash", "ffn", "vit", "circuits", "patching") and (layer is not None or
                                                                                     head is not None):
        raise QkvError(f"--layer and --head choose the head of the attention walkthrough (or of flash), --layer the "
                       f"layer of ffn and vit; {topic} does not take them")
    if html_file is not None and topic != "attention":
        raise QkvError(f"--html writes the attention walkthrough as the pipeline page; {topic} does not take it")
    console = new_console()
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)                          # before the work; removed again if it fails
        if topic == "attention":
            from ..lessons.attention import DEFAULT_TEXT, walkthrough
            from ..lessons.attention_render import render

            model, text = _follows(load(source or READER), topic), DEFAULT_TEXT if text is None else text
            with status(f"computing the walkthrough on {model.name} …"):
                steps = walkthrough(model, text, layer or 0, head)
            for part in render(steps, lang):
                console.print(part)
            with status(f"writing figures to {out_dir} …"):
                written = [] if out_dir is None else attention_figures(model, text, steps.layer, steps.head, out_dir)
            if html_file is not None:
                from ..viz.pipeline import save_pipeline

                written.append(save_pipeline(model, text, html_file, lang=lang, layer=steps.layer, head=steps.head,
                                             box="attn"))
        else:
            lesson = lesson_module(topic)
            name = source or lesson.DEFAULT_MODEL
            options = ({"layer": layer, "head": head} if topic in ("flash", "patching") else
                       {"layer": layer} if topic in ("ffn", "vit") else {})
            if topic == "circuits":
                from ..features.dictionaries import load_transcoders

                options = {"layer": layer, "transcoders": load_transcoders(transcoders_dir)}
            model = None if name is None else _follows(load(name), topic)
            if topic == "sparse" and model is not None:      # every layer's q, k, v and heads through the kernels
                require(model.config, model.name, "the sparse lesson (every layer's softmax(q·kᵀ)·V in the sparse "
                        "kernels)", {"plain_softmax", "plain_heads"}, instead="use --model smollm2 or --model minilm")
            with status(f"computing the {topic} lesson{'' if model is None else f' on {model.name}'} …"):
                built = lesson.build(model, text, **options)
            for part in lesson.render(built, lang):
                console.print(part)
            with status(f"writing figures to {out_dir} …"):
                written = [] if out_dir is None else lesson.figures(built, Path(out_dir), lang)
    for path in written:
        click.echo(f"wrote {path}")


def _circuits_options(transcoders_dir: str | None, head: int | None, out_dir: str | None,
                      html_file: str | None) -> None:
    """One line for what qkv explain circuits cannot take (before any model is loaded)."""
    if transcoders_dir is None:
        from ..graphs.lesson import MISSING

        raise QkvError(MISSING)
    if head is not None:
        raise QkvError("qkv explain circuits follows one layer's FFN, which has no heads: drop --head")
    if out_dir is not None or html_file is not None:
        raise QkvError("qkv explain circuits draws no figures; for the graph's page run: qkv graph TEXT "
                       "--transcoders DIR --page graph.html")


def _follows(model, topic: str):
    """MODEL, if lesson TOPIC can follow it: the lessons read text, but vit, which reads an image; an image model
    given to a text lesson (or a speech model to any) is one line naming the lesson that reads its input,
    instead of a walkthrough of its patches as if they were tokens of id 0."""
    from ..models.audio_model import AudioModel
    from ..models.image_model import ImageModel

    if isinstance(model, ImageModel) and topic != "vit":
        raise QkvError(f"{model.name} is an image model and qkv explain {topic} follows a text; for its patches "
                       f"run: qkv explain vit IMAGE --model {model.name}")
    if isinstance(model, AudioModel):
        raise QkvError(f"{model.name} reads speech (log-mel features) and qkv explain {topic} follows "
                       f"{'an image' if topic == 'vit' else 'a text'}; look at it with: qkv show FEATURES.npy "
                       f"--model {model.name}")
    return model


def _temperatures(values: tuple[str, ...]) -> list[float]:
    """-t 0.5 -t 1 or -t 0.5,1,2 → [0.5, 1.0, 2.0] (repeats dropped), or one clear error."""
    from ..writing.sampling import check_sampling

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


@click.command(name="next")
@text_argument()
@model_option(WRITER, "A decoder: 'smollm2', a .gguf file, or a local Hugging Face directory.")
@click.option("--temperature", "-t", "temperatures", multiple=True, default=("0.5,1,2",), show_default=True,
              help="Temperatures T: a comma list or repeated -t (0 = greedy).")
@click.option("--top-k", type=click.IntRange(1), default=10, show_default=True, help="How many tokens to list.")
@click.option("--chat", is_flag=True, help="Wrap TEXT as one user turn of the model's chat template.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the bar chart (next_token.png, .svg) into this directory.")
@click.option("--ablate", multiple=True, metavar="LAYER.HEAD",
              help="Knock out heads (zero-ablation: their Z = A·V set to 0 before W_O): "
                   "repeat or give a comma list, e.g. --ablate 3.2,5.1 (negative numbers count from the end).")
@prefix_option("Default: none, so the translation's first token.", was="--target")
@global_tokens_option()
def next_cmd(text: str, source: str, temperatures: tuple[str, ...], top_k: int, chat: bool,
             out_dir: str | None, ablate: tuple[str, ...], prefix: str | None) -> None:
    """The next token after TEXT: the top k of P = softmax(logits / T) at each temperature T,
    and the entropy H = −Σ P·log₂ P of the whole distribution, in bits.

    On an encoder–decoder, TEXT is the source: the next target token after it (and --prefix). On a
    masked-LM encoder (RoBERTa, DistilBERT, ELECTRA's generator): the token at TEXT's first mask token."""
    from functools import partial

    from .common import load_model as load
    from ..writing.nexttoken import (distribution, entropy, masked_token_logits, next_token_logits, token_text,
                                     top_tokens)
    from ..models.seq2seq import Seq2SeqModel

    temps = _temperatures(temperatures)
    model = load(source)
    knocked_out = head_pairs(ablate)
    if isinstance(model, Seq2SeqModel):
        z, what = _next_target_token(model, text, prefix, chat, knocked_out)  # (V,)
    else:
        if prefix is not None:
            raise QkvError(f"--prefix is the target so far of an encoder–decoder; {model.name} is a single stack "
                           f"({model.config.family}): drop --prefix")
        if chat:                                                               # one user turn, then the reply begins
            ids = np.asarray(model.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                                 add_generation_prompt=True), dtype=np.int64)
        else:
            ids, _ = model.encode(text)
        if not model.config.causal and model.weights.W_vocab is not None:     # a masked-LM encoder
            z, at = masked_token_logits(model, ids, ablate=knocked_out)         # (V,) at its mask token
            what = f"the masked token at position {at} of {len(ids)}"
        else:
            z = next_token_logits(model, ids, ablate=knocked_out)              # (V,)
            what = f"the next token after {len(ids)} tokens"
    P = {T: distribution(z, T) for T in temps}                                 # T → (V,)
    top, _ = top_tokens(distribution(z, 1.0), top_k)                           # the same order at every T > 0
    label = partial(token_text, model.tokenizer)                               # id → its text, whitespace visible
    console = new_console()
    console.print(Text(f"{model.name}: {what}, P = softmax(logits / T)"
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
        from ..viz.distribution import next_token_figure

        write_figure(next_token_figure(z, temps, label, k=top_k, model_name=model.name, text=text), out_dir,
                      "next_token")


def _next_target_token(model, text: str, target: str | None, chat: bool, knocked_out) -> tuple[np.ndarray, str]:
    """An encoder–decoder's next-token logits (V,): the decoder after the source TEXT, its start token
    and the TARGET written so far; and what they are, in words."""
    if chat or knocked_out:
        raise QkvError(f"{'--chat' if chat else '--ablate'} works on single-stack models; {model.name} is an "
                       "encoder–decoder: give the source text alone")
    ids, _ = model.encode(text)                                                # (n_src,)
    prefix = [] if target is None else model.tokenizer.encode(target, add_special_tokens=False)[0].tolist()
    dec = np.array([[model.start_token, *prefix]], dtype=np.int64)             # (1, 1 + prefix)
    z = model.forward(ids[None], decoder_input_ids=dec, attentions=False).logits[0, -1]   # (V,)
    after = f"the target {target!r}" if prefix else "the start token (the translation's first token)"
    return z, f"the next target token after the {len(ids)} source tokens and {after}"
