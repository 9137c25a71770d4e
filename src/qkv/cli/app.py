"""`qkv ...`: the command line. User mistakes print one line and exit with code 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .heads import heads as heads_cmd
from .bench import bench as bench_cmd
from .causal import trace_fact_cmd
from .eap import eap_cmd
from .common import (ARITHS, MODEL_HELP, WEIGHTS, check_writable, choose_quiet, choose_weights, head_pairs,
                     new_console, removed_if_failed, run, status, warn_unknown)
from .explain import explain_cmd, next_cmd
from .attribution import attribute_cmd, dla_cmd, patch_cmd
from .atp import atp_cmd
from .interpret import circuits_cmd, lens_cmd, rollout_cmd
from .neurons import neurons_cmd
from .path_patch import path_patch_cmd
from .diff import diff_cmd
from .options import READER, model_option, prefix_option, text_argument
from .sae import sae_cmd
from .sae_views import check_steer_flags, features_cmd, show_cmd, steer_options, steered
from .steering import probe_cmd, steer_cmd
from .transcoders import transcoders_cmd
from .tuned_lens import tuned_lens_cmd
from .graph_page import graph_page_cmd
from .graph import graph_cmd
from .activations import activations_cmd
from .write import chat_cmd, generate, translate_cmd
from ..runtime.errors import QkvError
from .tables import head_matrix, heads_table, print_cross
from .train import train as train_cmd
from .transcribe import transcribe_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qkv")
@click.option("--weights", type=click.Choice(WEIGHTS), default=None,
              help="How the model holds its weights: 'stored' (as the file has them: a GGUF file's 4/8-bit blocks, "
                   "a checkpoint's 16-bit floats), float32, bfloat16 or float16. Default: stored for a GGUF file, "
                   "float32 for the rest. Activations are float32 whatever the choice.")
@click.option("--arith", type=click.Choice(ARITHS), default=None,
              help="How the model computes. 'exact' (the default, and what analyses are checked against): float32 "
                   "activations, each product the one with the exactly dequantised weights. 'llama.cpp': a GGUF "
                   "file's stored Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 blocks multiplied as llama.cpp does, its activations "
                   "quantised to 8 bits per block of 32, and RMSNorm and RoPE as ggml computes them: equal to "
                   "llama.cpp's logits on the tested files. Other weights are refused.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or status lines on stderr (they show only on a terminal).")
def cli(weights: str | None, arith: str | None, quiet: bool) -> None:
    """qkv: see inside transformer language models."""
    choose_weights(weights, arith)
    choose_quiet(quiet)


@cli.command()
@text_argument()
@model_option(READER)
@click.option("--layer", type=int, default=None,
              help="Layer to show (negative counts from the end).  [default: 0; an encoder–decoder: the decoder's "
                   "last layer; an image model: the last layer, whose [CLS] the classifier reads]")
@click.option("--head", type=int, default=None,
              help="Show this head's whole attention matrix instead (with --out: draw its heatmap); negative counts "
                   "from the end.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write figures (PNG, SVG) and the interactive viewer (HTML) into this directory.")
@click.option("--ablate", multiple=True, metavar="[STACK.]LAYER.HEAD",
              help="Knock out heads (zero-ablation: their Z = A·V set to 0 before W_O): repeat or give a comma "
                   "list, e.g. --ablate 3.2,5.1 or 3.heads.2 (negative numbers count from the end); an "
                   "encoder–decoder's encoder.0.heads.1, cross.0.heads.1, decoder.0.heads.1 (= 0.heads.1).")
@prefix_option("Default: the model's own greedy translation of TEXT (Whisper: the transcript to read).",
               was="--target")
@click.option("--max-tokens", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Refuse texts longer than this (past 1024 tokens --out keeps each query row's largest weights).")
@click.option("--budget-mb", type=float, default=None,
              help="Attention bytes the viewer holds before it keeps each row's largest weights only  [default: 80].")
@click.option("--texts", default=None, metavar="TEXT,TEXT,…",
              help="An image–text pair (CLIP, SigLIP): score the image against these comma-separated texts "
                   "(the similarity row: logits and probabilities).")
@click.option("--global-tokens", "global_tokens", default=None, metavar="I,J,…",
              help="Longformer: the positions (from 0) that attend globally, reading every key with their own Q, K, V "
                   "(transformers' global_attention_mask)  [default: none, as LongformerForMaskedLM].")
@steer_options
def show(text: str, source: str, layer: int | None, head: int | None, out_dir: str | None,
         ablate: tuple[str, ...], prefix: str | None, max_tokens: int, budget_mb: float | None,
         texts: str | None = None, sae_dir: str | None = None, steer: tuple[str, ...] = (),
         ablate_direction: tuple[str, ...] = (), global_tokens: str | None = None) -> None:
    """Print the tokens of TEXT and where each head of a layer looks.

    With --steer FILE@LAYER:SCALE (a control vector; --sae DIR --steer FEATURE:ALPHA, an SAE's features) or
    --ablate-direction FILE, the model reads TEXT steered (cli/steering.py).

    With --out DIR, also write into DIR: the heatmap of one head (--head, or the layer's
    most focused head), the layer's heads side by side, every layer × head, and
    attention.html, a viewer to open in a browser, with attention rollout (and attention flow
    on short texts) beside raw attention, and for a decoder the logit lens; and pipeline.html,
    the whole model as its data flow, every box opening to its real arrays (up to 256 tokens).
    Past 1024 tokens (up to --max-tokens), --out writes the viewer with each query row's largest weights
    (as many as --budget-mb holds) and the chosen layer's figures; rollout, the lens and the pipeline page
    are left out there.

    On an encoder–decoder (Marian, BART, mBART, Pegasus, T5, mT5, ko-en-tiny): translate TEXT (or read --prefix),
    print where each target token looks most in the source (cross-attention of a decoder
    layer), and with --out write cross-attention heatmaps, both stacks' self-attention and
    the viewer with its encoder / decoder / cross views.

    On an image model (digits-vit, a ViT directory): TEXT is the path of an image; print its top labels and
    where each head's [CLS] looks most among the patches (of the last layer by default: the one the
    classifier reads), and with --out draw that over the image (each head, every layer, attention rollout)
    and write the viewer in its image mode (click a patch to see where it looks).

    On Whisper: TEXT is an .npy file of one sound's log-mel features (mels × frames) or a sound file (WAV, FLAC,
    OGG) and --prefix its transcript; print where each word looks in time (cross-attention of a decoder layer) and
    with --out draw it. Without --prefix Whisper writes the transcript itself: each word is printed with its span
    (word timestamps by DTW over the alignment heads), and --out draws the spectrogram with each word's attention
    over time under it (words.png) and writes words.html, where clicking a word plays it.

    On a CLIP or SigLIP pair: TEXT is an image, shown by its image tower; --texts "a cat,a dog" prints its
    similarity to each text (CLIP: e^s·cos and the softmax over the texts; SigLIP: e^s·cos + b and each σ).
    """
    from .common import load_model as load, with_global_tokens
    from ..models.audio_model import AudioModel
    from ..models.contrastive import PairModel
    from ..models.image_model import ImageModel
    from ..models.seq2seq import Seq2SeqModel

    steering = check_steer_flags(sae_dir, steer, ablate_direction)              # --steer: files read before loading
    model = load(source, pairs=True)
    if steering is not None and isinstance(model, (ImageModel, AudioModel, Seq2SeqModel, PairModel)):
        raise QkvError(f"--steer and --ablate-direction act on a single stack's stream of text; {model.name} is "
                       f"{model.config.family}: drop them")
    model = steered(model, sae_dir, steering)
    if global_tokens is not None:
        model = with_global_tokens(model, global_tokens)
    if texts is not None or isinstance(model, PairModel):           # CLIP, SigLIP: the image, then its texts
        from .show_image import show_pair

        return show_pair(model, text, texts, layer, head, out_dir, ablate, prefix, budget_mb)
    if isinstance(model, ImageModel):
        from .show_image import show_image

        return show_image(model, text, layer, head, out_dir, ablate, prefix, budget_mb)
    if isinstance(model, AudioModel):
        from .show_audio import show_audio

        return show_audio(model, text, prefix, layer, head, out_dir, ablate)
    if isinstance(model, Seq2SeqModel):
        return _show_seq2seq(model, text, prefix, layer, head, out_dir, ablate)
    if prefix is not None:
        raise QkvError(f"--prefix is the target text of an encoder–decoder; {model.name} is a single stack "
                       f"({model.config.family}): drop --prefix")
    from ..inputs.images import SUFFIXES

    if Path(text).suffix.lower() in SUFFIXES and os.path.isfile(text):     # read as text, as asked; say so
        click.echo(f"note: {model.name} reads text: {text!r} is read as text, not as an image; give an image model "
                   "(--model digits-vit, a ViT directory) to look at the image", err=True)
    layer = model.check_layer(0 if layer is None else layer)
    if head is not None:
        head = model.check_head(head)
    knocked_out = head_pairs(ablate)
    model.ablation(knocked_out)                                     # bad heads fail before DIR is touched
    existed = out_dir is not None and os.path.isdir(out_dir)
    ids, _ = model.encode(text)                                     # a bad text fails before DIR is touched
    if len(ids) > max_tokens:
        raise QkvError(f"the text has {len(ids):,} tokens, more than --max-tokens {max_tokens:,}; shorten it or "
                       "raise --max-tokens")
    from ..viz.payload import LONG_TOKENS, check_budget
    long = out_dir is not None and len(ids) > LONG_TOKENS
    check_budget(budget_mb, "--budget-mb")                          # before the model runs or DIR is touched
    check_attention_memory(model, len(ids), n_layers=model.config.n_layers if out_dir and not long else 1)
    if out_dir is not None:
        check_writable(out_dir)
    if long:
        with removed_if_failed(out_dir):
            return _show_long(model, text, layer, head, out_dir, knocked_out, budget_mb)
    try:
        from ..analysis.sections import sections_keep
        from ..core.trace import DISENTANGLED, INTERMEDIATES, MIXER, OPT_IN, ROUTER

        keep = sections_keep(model, len(ids), lens_limit=None) if out_dir is not None else ("attentions",)
        if out_dir is not None and len(ids) <= PIPELINE_TOKENS:                # the pipeline page shows them all,
            keep = (*(n for n in INTERMEDIATES if n not in OPT_IN), *MIXER)     # a scan's own steps too
        if out_dir is not None:                                             # a MoE model's Experts panel,
            keep = (*keep, *ROUTER, *DISENTANGLED)                              # DeBERTa's Disentangled panel
        with status(f"running {model.name} …"):
            trace = model.run(text, layers=None if out_dir else [layer], ablate=knocked_out, keep=keep)
        if knocked_out:
            click.echo(f"heads knocked out (their output A·V set to 0 in every pass): "
                       f"{', '.join(f'L{l}.H{h}' for l, h in knocked_out)}")
        _print_layer(trace, model, layer, head)
        if getattr(model.weights, "W_contact", None) is not None:     # ESM: its contact map and the heads that draw it
            from .show_protein import print_contacts

            print_contacts(model, text)
        if out_dir is not None:
            from ..viz.figures import focused_head

            picked = focused_head(trace, layer) if head is None else head
            with status(f"writing figures, the viewer and the pipeline page to {out_dir} …"):
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
        click.echo(f"open {files[0]} in a browser to explore every layer and head{_pipeline_note(files)}")
    else:
        click.echo(OUT_HINT)


def _show_long(model, text: str, layer: int, head: int | None, out_dir: str, ablate, budget_mb: float | None) -> None:
    """`show --out` past LONG_TOKENS: one pass keeping each query row's largest weights in every layer (the
    viewer's), one keeping LAYER's whole attention (the table and its figures)."""
    from ..runtime.io import FileBatch
    from ..core.trace import ROUTER
    from ..viz.figures import focused_head, save_figures
    from ..viz.html import viewer_html
    from ..viz.payload import LONG_TOKENS, MAX_TOP

    trace = model.run(text, ablate=ablate, keep=("attention_top", *ROUTER), top=MAX_TOP)
    one = model.run(text, layers=[layer], ablate=ablate, keep=("attentions",))
    _print_layer(one, model, layer, head)
    picked = focused_head(one, layer) if head is None else head
    out = Path(out_dir)
    try:
        with FileBatch(out) as files:
            files.write_text("attention.html", viewer_html(trace, budget_mb=budget_mb))
            save_figures(one, files, layer=layer, head=picked)
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror or e}; choose a writable directory") from None
    click.echo(f"wrote {len(files.paths)} files to {out_dir} ({len(trace.ids):,} tokens: the viewer keeps each "
               f"query row's largest weights; the figures are layer {layer}'s, head {picked}; rollout, the lens and "
               f"the pipeline page are left out past {LONG_TOKENS:,} tokens):")
    for f in files.paths:
        click.echo(f"  {f}")


def _pipeline_note(files: list[Path]) -> str:
    """", and pipeline.html …" when show wrote the pipeline page (texts up to PIPELINE_TOKENS tokens)."""
    page = next((f for f in files if Path(f).name == "pipeline.html"), None)
    return "" if page is None else f"; {page}: the whole model, box by box"


def memory_bound() -> int:
    """Bytes of attention weights one command may hold: half the machine's memory, at most 8 GiB."""
    from ..runtime.tuning import physical_memory

    return min(physical_memory() // 2, 8 << 30)


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
    sinks = np.maximum(1 - attn.sum(axis=-1, dtype=np.float64), 0) if trace.sinks else None   # (H, n) gpt-oss
    labels = trace.labels
    console = new_console()
    console.print(Text(f"{model.name}: {len(labels)} tokens, {model.config.n_layers} layers × "
                       f"{model.config.n_heads} heads"))
    console.print(Text("tokens: ") + Text(" ".join(f"{i}:{t}" for i, t in enumerate(labels))))
    if head is not None:
        console.print(head_matrix(labels, attn, layer, head, sinks=sinks))
        if len(labels) > 32:
            console.print(Text(f"(first 32 of {len(labels)} tokens shown)"))
        return
    H = model.config.n_heads
    per_table = max(1, (console.width - 16) // 12)
    for start in range(0, H, per_table):
        console.print(heads_table(labels, attn, layer, list(range(start, min(H, start + per_table))), sinks=sinks))


def _show_seq2seq(model, text: str, target: str | None, layer: int | None, head: int | None, out_dir: str | None,
                  ablate: tuple[str, ...]) -> None:
    """`qkv show` on an encoder–decoder: the translation (or --prefix), the cross-attention table of
    a decoder layer, and with OUT_DIR the figures and the viewer of all three kinds of attention."""
    from ..viz.figures import focused_head
    from ..viz.seq2seq import cross_written
    from ..writing.seq2seq_generate import translation_trace

    if ablate:                                                                # every pass below runs ablated
        model = model.ablate(head_pairs(ablate))                              # bad heads fail before DIR is touched
    layer = model.check_layer(-1 if layer is None else layer)                 # a decoder layer
    if head is not None:
        head = model.check_head(head)
    ids, _ = model.encode(text)                                               # bad input fails before DIR is touched
    forced = None if target is None else model.encode(target)[0]
    warn_unknown(model, text)
    c = model.config
    check_attention_memory(model, max(len(ids), c.max_positions), n_layers=c.n_layers + 2 * c.n_decoder_layers)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        trace = translation_trace(model, text, forced)
        cross = cross_written(trace, model.tokenizer)                         # rows: the token each row wrote
        print_cross(trace, cross, model, layer, head, translated=target is None)
        if out_dir is not None:
            picked = focused_head(cross, layer) if head is None else head
            files = _save_seq2seq_views(trace, out_dir, model, layer, picked)
    if out_dir is not None:
        why = "" if head is not None else f", the most focused of decoder layer {layer}; choose another with --head"
        click.echo(f"wrote {len(files)} files to {out_dir} (cross-attention heatmap of head {picked}{why}):")
        for f in files:
            click.echo(f"  {f}")
        click.echo(f"open {files[0]} in a browser: encoder, decoder and cross-attention, every layer and head"
                   f"{_pipeline_note(files)}")
    else:
        click.echo(OUT_HINT)


def _save_seq2seq_views(trace, out_dir: str, model, layer: int, head: int) -> list[Path]:
    """The viewer (encoder / decoder / cross views) and the figures into OUT_DIR, all or nothing."""
    from ..runtime.io import FileBatch
    from ..viz.html import viewer_html
    from ..viz.pipeline import pipeline_html
    from ..viz.seq2seq import save_seq2seq_figures

    out = Path(out_dir)
    try:
        with FileBatch(out) as files:
            files.write_text("attention.html", viewer_html(trace, tokenizer=model.tokenizer))
            if max(len(trace.tokens), len(trace.encoder.tokens)) <= PIPELINE_TOKENS:
                full = model.run(trace.encoder.ids.tolist(), [int(i) for i in trace.ids])    # every intermediate
                full.encoder.text = trace.encoder.text
                files.write_text("pipeline.html", pipeline_html(model, full, layer=layer, head=head or 0))
            save_seq2seq_figures(trace, files, layer=layer, head=head, tokenizer=model.tokenizer)
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths


OUT_HINT = "(--out DIR writes the heatmaps, the interactive viewer of every layer and head, and the pipeline page)"
PIPELINE_TOKENS = 256      # `show --out` writes pipeline.html up to this many tokens (its S and A: L·H·n² bytes each)


def _save_views(trace, out_dir: str, model, layer: int, head: int) -> list[Path]:
    """The viewer (with rollout, and a decoder's logit lens), the pipeline page (up to PIPELINE_TOKENS
    tokens, from a trace that kept every intermediate) and the figures into OUT_DIR, all or nothing
    (`io.FileBatch`)."""
    from ..analysis.sections import viewer_sections
    from ..core.capabilities import lacking
    from ..runtime.io import FileBatch
    from ..viz.figures import save_figures
    from ..viz.html import viewer_html
    from ..viz.pipeline import pipeline_html
    from .show_protein import first_view

    out = Path(out_dir)
    sections = viewer_sections(model, trace, lens_limit=None)
    try:
        with FileBatch(out) as files:
            files.write_text("attention.html", viewer_html(trace, sections=sections,        # the trace knows its
                                                           view=first_view(sections)))      # model; ESM: Contacts
            if (len(trace.tokens) <= PIPELINE_TOKENS                  # every layer's steps drawn (a scan's, a
                    and lacking(model.config, {"pipeline"}) is None):     # linear attention's too)
                files.write_text("pipeline.html", pipeline_html(model, trace, layer=layer, head=head or 0))
            save_figures(trace, files, layer=layer, head=head)
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths


@cli.command()
@click.option("--families", is_flag=True, help="Instead, the families qkv runs: every model_type, the models, what it "
                                               "brings to the engine, what it runs as (the commands that work), its "
                                               "GGUF architectures.")
@click.option("--markdown", is_flag=True, help="With --families: the whole table in markdown, as the README holds it.")
def models(families: bool = False, markdown: bool = False) -> None:
    """List the models that can be loaded on this machine (--families: the families qkv runs)."""
    if markdown and not families:
        raise QkvError("--markdown prints the table of families: give --families --markdown")
    if families:
        from .families import families_markdown, families_terminal

        if markdown:
            click.echo(families_markdown(), nl=False)
            return
        for part in families_terminal():
            new_console().print(part)
        return
    from ..checkpoints import available

    table = Table(show_edge=False, pad_edge=False)
    table.add_column("source", style="bold")
    table.add_column("what")
    for source, what in available():
        table.add_row(Text(source), Text(what))
    new_console().print(table)
    from ..checkpoints.families import FAMILIES

    new_console().print(Text(f"Any local directory with config.json + model.safetensors works too (model_type "
                             f"{', '.join(sorted(FAMILIES))}), and a .gguf file: --model PATH"))


@cli.command()
@model_option(READER, MODEL_HELP + " The page also offers every model `qkv models` lists.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 127.0.0.1 keeps the page on this machine.")
@click.option("--transcoders", "transcoders_dir", default=None, metavar="DIR",
              help="The model's per-layer transcoders: the Graph tab then also computes the attribution graph of a "
                   "typed prompt (without: it draws graph JSON files only).")
@steer_options
def serve(source: str, port: int, host: str, transcoders_dir: str | None = None, sae_dir: str | None = None,
          steer: tuple[str, ...] = (), ablate_direction: tuple[str, ...] = ()) -> None:
    """A local web page: type text, pick model, layer and head, and see the attention.

    With --steer FILE@LAYER:SCALE (or --sae DIR --steer FEATURE:ALPHA) or --ablate-direction FILE, the --model's
    every pass (attention, pipeline, chat) runs steered; the other models of the page do not."""
    from ..web.app import make_server
    from ..web.server import exposure_warning

    steering = check_steer_flags(sae_dir, steer, ablate_direction)
    if steering is not None and transcoders_dir is not None:
        raise QkvError("--transcoders computes attribution graphs of the model as it is; drop --steer and "
                       "--ablate-direction, or --transcoders")
    server = make_server(source, host, port, transcoders=transcoders_dir,
                         steer=None if steering is None else lambda model: steered(model, sae_dir, steering))
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


cli.add_command(heads_cmd)        # `qkv heads`: what each head does (cli/heads.py)
cli.add_command(bench_cmd)        # `qkv bench`: timings against transformers (cli/bench.py)
cli.add_command(train_cmd)        # `qkv train`: train a small model in NumPy (cli/train.py)
for command in (generate, translate_cmd, chat_cmd):
    cli.add_command(command)      # writing text: generate, translate, chat (cli/write.py)
for command in (explain_cmd, next_cmd):
    cli.add_command(command)      # the walkthrough, its lessons, the next token (cli/explain.py)
for command in (lens_cmd, rollout_cmd, dla_cmd, attribute_cmd, patch_cmd, circuits_cmd, trace_fact_cmd):
    cli.add_command(command)      # beyond attention weights (cli/interpret.py, cli/attribution.py, cli/causal.py)
cli.add_command(transcribe_cmd)   # Whisper writes what it hears (cli/transcribe.py)
cli.add_command(neurons_cmd)      # FFN neurons as key–value memories (cli/neurons.py)
cli.add_command(activations_cmd)  # a layer's activations over a corpus, stored in shards (cli/activations.py)
cli.add_command(sae_cmd)          # sparse autoencoders: qkv sae train|eval (cli/sae.py)
for command in (features_cmd, show_cmd):
    sae_cmd.add_command(command)  # qkv sae features|show: feature pages, features on a text (cli/sae_views.py)
cli.add_command(transcoders_cmd)  # per-layer transcoders: qkv transcoders train|eval (cli/transcoders.py)
cli.add_command(tuned_lens_cmd)   # the tuned lens: qkv tuned-lens train|eval (cli/tuned_lens.py)
cli.add_command(graph_page_cmd)   # an attribution graph's JSON as a page (cli/graph_page.py)
cli.add_command(graph_cmd)        # attribution graphs over transcoders (cli/graph.py)
cli.add_command(eap_cmd)          # edge attribution patching → a circuit (cli/eap.py)
cli.add_command(atp_cmd)          # attribution patching, AtP and AtP* (cli/atp.py)
cli.add_command(path_patch_cmd)   # path patching: senders → receivers' q, k, v (cli/path_patch.py)
cli.add_command(diff_cmd)         # model diffing, quantisation diffing (cli/diff.py)
for command in (steer_cmd, probe_cmd):
    cli.add_command(command)      # steering vectors (llama.cpp control vectors) and linear probes (cli/steering.py)


def main() -> None:
    """Entry point: a QkvError becomes one line on stderr and exit code 2 (`cli_common.run`)."""
    run(cli, prog_name="qkv")
