"""`qkv steer make` (a contrastive steering vector, saved as a llama.cpp control vector), `qkv probe` (linear probes
per layer with a control task), and the control-vector form of `--steer` / `--ablate-direction` on generate, chat
and show. Computes with qkv.analysis.steering and .probes; the file format is qkv.checkpoints.control_vector.

    qkv steer make --model smollm2 --positive happy.txt --negative sad.txt --layer 12 --out happy.gguf
    qkv generate "I think that" --steer happy.gguf@12:4          # FILE[@LAYER][:SCALE], repeatable
    qkv chat "Tell me about your day" --ablate-direction happy.gguf
    qkv probe --model smollm2 --data sentiment.tsv --layer all --out probes/

One grammar for --steer: with --sae SAE_DIR its values are the SAE's FEATURE:ALPHA[,…] (cli/sae_views.py, as
before); without it each value is a control-vector file FILE[@LAYER][:SCALE]: all the file's layers (no @LAYER),
or its direction at LAYER (a one-direction file's direction moved to LAYER), times SCALE (default 1), added to the
stream leaving that block, where llama.cpp adds it (`llama-cli --control-vector-scaled FILE SCALE`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from .common import (MODEL_HELP, check_json_file, check_writable, load_model, new_console, progress_bar,
                     removed_if_failed, status)
from .options import WRITER, model_option
from ..runtime.errors import QkvError

PROBE_POINTS = ("residual", "attn_in", "attn_out", "residual_mid", "ffn_in", "ffn_pre", "neurons", "ffn_out",
                "residual_out")                 # analysis.probes.POINTS (not imported: loading the CLI stays light)
STEER_HELP = ("Steer while writing. Without --sae: a control-vector file FILE[@LAYER][:SCALE] (`qkv steer make`, or "
              "llama.cpp's): its directions (or the one at LAYER) × SCALE [1] added to the stream leaving that "
              "block, at every position; repeatable, they add up. With --sae: FEATURE:ALPHA[,…], the SAE's "
              "features (e.g. 12:8,40:-4).")
ABLATE_HELP = ("Directional ablation (Arditi et al. 2024): remove this control-vector file's direction (FILE[@LAYER]: "
               "the one at LAYER, or its only one) from the stream at every layer and position; repeatable.")


# ── --steer FILE@LAYER:SCALE and --ablate-direction FILE on generate, chat, show ────────────────────────────

@dataclass
class VectorSteering:
    """What --steer (control-vector files) and --ablate-direction asked for, the files already read and checked."""
    steer: tuple[str, ...]
    ablate: tuple[str, ...]

    def hooks(self, model) -> dict:
        """The hooks on MODEL: the ablated directions first, then the added vectors (so a vector survives at its
        own layer; the later layers' ablation still removes its part along an ablated direction)."""
        from ..analysis.steering import load_ablation, load_steering

        hooks = load_ablation(model, self.ablate) if self.ablate else {}
        if self.steer:
            hooks.update(load_steering(model, self.steer))
        return hooks


def vector_request(steer: tuple[str, ...], ablate: tuple[str, ...]) -> VectorSteering:
    """--steer values read as control-vector files (no --sae), and --ablate-direction: parsed and their files read
    now, before the model loads, so a mistake is one line at once. A value that is an SAE's FEATURE:ALPHA and no
    file says to give --sae."""
    from ..analysis.steering import parse_vector_spec
    from ..checkpoints.control_vector import read_control_vector
    from ..features.steer import parse_steer

    for spec in steer:
        try:
            path, _, _ = parse_vector_spec(spec)
        except QkvError as no_file:
            try:
                parse_steer(spec)
            except QkvError:
                raise no_file from None
            raise QkvError(f"--steer {spec} reads as FEATURE:ALPHA, an SAE feature's direction; give --sae SAE_DIR "
                           "too (or a control-vector file: --steer FILE@LAYER:SCALE)") from None
        read_control_vector(path)
    for spec in ablate:
        read_control_vector(parse_vector_spec(spec, "--ablate-direction", scaled=False)[0])
    return VectorSteering(tuple(steer), tuple(ablate))


def ablate_direction_option(command):
    """--ablate-direction FILE[@LAYER] (the parameter `ablate_direction`), repeatable."""
    return click.option("--ablate-direction", "ablate_direction", multiple=True, metavar="FILE[@LAYER]",
                        help=ABLATE_HELP)(command)


# ── qkv steer make ────────────────────────────────────────────────────────────────────────────────────────

@click.group(name="steer")
def steer_cmd() -> None:
    """Steering vectors that are not SAE features: `qkv steer make` writes a llama.cpp control vector, which
    generate, chat and show apply with --steer FILE@LAYER:SCALE (and llama.cpp with --control-vector-scaled)."""


def texts_of(values: tuple[str, ...], flag: str) -> list[str]:
    """Each value of FLAG: an existing file's lines (UTF-8, one text a line, blank lines skipped), else the text."""
    from ..runtime.io import open_regular

    texts: list[str] = []
    for value in values:
        path = Path(value)
        if path.is_file():
            try:
                with open_regular(path, 64 << 20) as f:
                    lines = f.read().decode("utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as e:
                why = getattr(e, "strerror", None) or "it is not UTF-8 text"
                raise QkvError(f"{flag} {value}: cannot read it ({why}); give a UTF-8 file, one text a line") from None
            texts += [line.strip() for line in lines if line.strip()]
        elif value.strip():
            texts.append(value.strip())
    if not texts:
        raise QkvError(f"{flag} gave no text; give texts or files of them (one a line)")
    return texts


def layer_list(value: str, n_layers: int, first: int = 0) -> list[int]:
    """--layer "12", "10,12,-1" or "all" (FIRST..L−1) → layers, or one error."""
    if value.strip().lower() == "all":
        return list(range(first, n_layers))
    try:
        return [int(p) for p in value.split(",")]
    except ValueError:
        raise QkvError(f"--layer {value!r} is not a layer, a comma list of layers or 'all'; give e.g. --layer 12, "
                       "--layer 10,12 or --layer all") from None


@steer_cmd.command(name="make")
@model_option(WRITER)
@click.option("--positive", multiple=True, required=True, metavar="TEXT|FILE",
              help="Texts of the behaviour to add (repeatable; a file: one text a line).")
@click.option("--negative", multiple=True, required=True, metavar="TEXT|FILE",
              help="Texts of its opposite (repeatable; a file: one text a line).")
@click.option("--layer", "layer", required=True, metavar="L|L1,L2|all",
              help="The block(s) whose output the vector is read at and added to (1..L−1: llama.cpp's direction.L).")
@click.option("--position", type=click.Choice(["last", "mean"]), default="last", show_default=True,
              help="Read each text at its last token, or its mean over every token but the first (attention sink).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), metavar="FILE.gguf",
              help="The control vector to write (llama.cpp's layout: direction.L tensors).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write the per-layer summary as JSON.")
def make_cmd(source: str, positive: tuple[str, ...], negative: tuple[str, ...], layer: str, position: str,
             out_path: str, json_path: str | None) -> None:
    """Contrastive activation addition (Rimsky et al. 2023): the mean of the positive texts' stream minus the
    negative texts', at each --layer, written as a llama.cpp control vector. Prints each layer's ‖v‖ beside the
    texts' mean stream norm ‖x‖ (scale 1 moves the stream by ‖v‖) and where each side lies along v̂."""
    from ..analysis.steering import contrast
    from ..checkpoints.control_vector import write_control_vector

    for path, flag in ((out_path, "--out"), (json_path, "--json")):
        if path is not None and Path(path).is_dir():
            raise QkvError(f"{flag} {path} is a directory; give a file name")
    plus, minus = texts_of(positive, "--positive"), texts_of(negative, "--negative")
    model = load_model(source)
    layers = layer_list(layer, model.config.n_layers, first=1)
    with status(f"reading {len(plus) + len(minus)} texts with {model.name} …"):
        sides = contrast(model, plus, minus, layers, position)
    summary = sides.summary()
    written = write_control_vector(out_path, sides.vectors, model_hint=model.config.family)
    data = {"model": model.name, "position": position, "positive": len(plus), "negative": len(minus),
            "file": str(written), "layers": summary}
    if json_path is not None:
        from ..runtime.io import write_text

        write_text(json_path, json.dumps(data, indent=1))
    _print_make(data)


def _print_make(data: dict) -> None:
    console = new_console()
    table = Table(show_edge=False, pad_edge=False, title=f"{data['model']}: {data['positive']} positive, "
                  f"{data['negative']} negative texts ({data['position']} token)", title_justify="left")
    for name in ("layer", "‖v‖", "mean ‖x‖", "positive·v̂", "negative·v̂", "every text apart"):
        table.add_column(name, justify="right")
    for r in data["layers"]:
        table.add_row(str(r["layer"]), f"{r['norm']:.3f}", f"{r['stream_norm']:.3f}",
                      f"{r['positive_projection']:+.3f}", f"{r['negative_projection']:+.3f}",
                      "yes" if r["separated"] else "no")
    console.print(table)
    layers = [r["layer"] for r in data["layers"]]
    f = data["file"]
    how = (f"--steer {f}:4 (llama.cpp: --control-vector-scaled {f} 4)" if len(layers) == 1 else
           f"--steer {f}@{layers[len(layers) // 2]}:4, one of its {len(layers)} layers (llama.cpp: "
           f"--control-vector-scaled {f} 4 --control-vector-layer-range {layers[len(layers) // 2]} "
           f"{layers[len(layers) // 2]})")
    console.print(Text(f"wrote {f}: steer with qkv generate TEXT {how}"))


# ── qkv probe ─────────────────────────────────────────────────────────────────────────────────────────────

@click.command(name="probe")
@model_option(WRITER, MODEL_HELP)
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="Labelled texts: TEXT<TAB>LABEL lines, or JSON lines {\"text\": …, \"label\": …} (.jsonl).")
@click.option("--layer", "layer", default="all", show_default=True, metavar="L|L1,L2|all",
              help="The blocks whose output stream is probed.")
@click.option("--position", type=click.Choice(["last", "mean"]), default="last", show_default=True,
              help="Read each text at its last token, or its mean over every token but the first.")
@click.option("--point", type=click.Choice(PROBE_POINTS), default="residual_out", show_default=True,
              help="The activation probed at each layer (qkv.core.trace's names): the stream leaving the block by "
                   "default, the one a control vector is added to.")
@click.option("--test-share", type=click.FloatRange(0.05, 0.95), default=0.25, show_default=True,
              help="The share of each label's texts held out to score the probe on.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the per-layer results as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write probes.json, the figure (probes.png, .svg), the viewer of the first text's attention with "
                   "the probe panel open (probe.html) and, for two labels (and --point residual_out), "
                   "directions.gguf: each layer's probe direction (unit, towards the second label) as a llama.cpp "
                   "control vector.")
def probe_cmd(source: str, data_path: str, layer: str, position: str, point: str, test_share: float,
              json_path: str | None, out_dir: str | None) -> None:
    """Linear probes: logistic regression on each layer's stream for the labels of --data, scored on held-out
    texts, beside Hewitt & Liang's control task (one random label per word type); selectivity = accuracy −
    control accuracy. A probe's direction is a steering vector (--out: directions.gguf)."""
    from ..analysis.probes import probe_layers, read_probe_data

    check_json_file(json_path, "probes.json")
    texts, labels = read_probe_data(data_path)
    model = load_model(source)
    layers = layer_list(layer, model.config.n_layers)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with progress_bar("read", "texts") as progress:
            report = probe_layers(model, texts, labels, layers, position=position, point=point,
                                  test_fraction=test_share, progress=progress)
        data = report.as_json()
        if json_path is not None:
            from ..runtime.io import write_text

            write_text(json_path, json.dumps(data, indent=1))
        _print_probe(data)
        if out_dir is not None:
            _write_probe(report, data, out_dir, model, texts[0])


def _print_probe(data: dict) -> None:
    console = new_console()
    labels = " / ".join(map(str, data["labels"]))
    table = Table(show_edge=False, pad_edge=False, title_justify="left",
                  title=f"{data['model']}: probing {labels} ({data['n_train']} texts to train, {data['n_test']} "
                        f"held out, {data['position']} token; majority label {data['majority']:.2f})")
    for name in ("layer", "accuracy", "control", "selectivity", "train"):
        table.add_column(name, justify="right")
    for r in data["layers"]:
        table.add_row(str(r["layer"]), f"{r['accuracy']:.3f}", f"{r['control_accuracy']:.3f}",
                      f"{r['selectivity']:+.3f}", f"{r['train_accuracy']:.3f}")
    console.print(table)


def _write_probe(report, data: dict, out_dir: str, model, text: str) -> None:
    """OUT_DIR/probes.json, probes.png/.svg, probe.html (the viewer of TEXT's attention, the probe panel open) and
    directions.gguf for a two-label probe, all or none."""
    from ..analysis.probes import probe_directions
    from ..checkpoints.control_vector import write_control_vector
    from ..runtime.io import FileBatch
    from ..viz.drawing import save_all
    from ..viz.html import viewer_html
    from ..viz.probe_figures import probe_figure
    from ..viz.probe_panel import probe_section

    directions = probe_directions(report) if len(report.labels) == 2 and report.point == "residual_out" else {}
    trace = model.run(text, keep=("attentions",))
    page = viewer_html(trace, view="probe", sections={"probe": probe_section(data, text=text,
                                                                             positions=len(trace.labels))})
    try:
        with FileBatch(out_dir) as files:
            files.write_text("probes.json", json.dumps(data, indent=1))
            save_all(files, [("probes", lambda: probe_figure(data))], ["png", "svg"])
            files.write_text("probe.html", page)
        if directions:
            write_control_vector(Path(out_dir) / "directions.gguf", directions, model_hint=model.config.family)
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    for path in [*files.paths, *([Path(out_dir) / "directions.gguf"] if directions else [])]:
        click.echo(f"wrote {path}", err=True)
