"""The interactive viewer: one self-contained HTML file (inline JS, CSS and data; no network).

Three views of a trace's attention, drawn on canvas so 512 tokens stay smooth:
a head view (queries and keys in two columns, one line per pair weighted by attention,
a colour per head; hover a token to isolate its lines), a matrix view (the heatmap,
a cell's weight on hover) and a model view (layers × heads thumbnails; click one to
open it); a generation with logits adds a next-token view (each generated token's top
candidates, with a temperature slider; see `payload` for how it re-normalises).
Panels add views beyond attention weights (`panels` declares each one): a logit
lens (layers × positions, the final prediction's probability or rank, a cell's top tokens on
hover), rollout (raw attention, attention rollout and attention flow side by side),
patching (effect tables as heatmaps centred at 0), input attribution (the input tokens as text,
coloured by their scores), causal tracing (tokens × layers, a map per kind of restored state), an SAE's
features and a mixture of experts' router.
An encoder–decoder's trace adds a selector of the kind of attention — encoder, decoder, cross
(target tokens, labelled by the token each row wrote, against source tokens) — and every view
draws the kind selected (`viz.seq2seq`).
The data travels compactly (see `payload`: one byte per weight, ±0.002, as a `wire` array).
Every view exports what it shows (export.js: PNG, SVG, its numbers as JSON).
The script is assets inlined in order: wire.js (the arrays' decoder, every page's), export.js, viewer.js
(the attention views, mount), viewer_next.js (the next-token view), then the panels' renderers, each asset once
(`panels.scripts`): viewer_panels.js (the lens, rollout, patching and router views, which register on viewer.js's
`QKV.panels`, and the heatmap they share), viewer_causes.js (the attribution and causal-tracing views) and
viewer_features.js (an SAE's latents on each token, `qkv sae show`).

    save_viewer(trace, "attention.html")     # a file to open or share (named after trace.model)
    save_viewer(trace, "lens.html", sections={"lens": lens_payload(model, trace)}, view="lens")
    View(trace)                                                   # shows itself in Jupyter / VS Code
"""

from __future__ import annotations

import html
import itertools
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

from ..runtime.errors import QkvError
from ..runtime.io import write_text
from ..core.trace import Trace
from . import hangul, panels
from .payload import script_json, trace_payload

# No request may leave the page: scripts and styles are inline, nothing else is allowed.
_CSP_VIEWER = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
               "font-src data:")             # the page's own subset of a Hangul font (viz/hangul.py)


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    """The text of a file in qkv/viz/assets (the viewer's JS and CSS)."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def viewer_js() -> str:
    """The viewer's JavaScript as one script: the arrays' decoder, export, the core, the next-token view, then the
    assets that register the panels' renderers on it (`panels.scripts`)."""
    names = ("wire.js", "export.js", "viewer.js", "viewer_next.js") + panels.scripts()
    return "\n".join(asset(name) for name in names)


def pipeline_js() -> str:
    """The pipeline page's JavaScript after wire.js and export.js: its toolkit (templates, the sampling distribution,
    heatmaps, bars, tables), its attention diagram, a scan's or linear attention's steps, then the page."""
    return "\n".join(asset(name) for name in ("pipeline_kit.js", "pipeline_diagram.js", "pipeline_mixer.js",
                                               "pipeline.js"))


def page(title: str, body: str, scripts: Sequence[str], csp: str = _CSP_VIEWER, face: str | None = None) -> str:
    """A complete HTML document: the viewer's CSS, BODY (trusted markup), then SCRIPTS inline.
    face: the @font-face of the Hangul font (viz/hangul.py); None: a subset of just the glyphs the document
    holds, embedded (so Korean shows on a machine without a Korean font)."""
    inline = "".join(f"<script>{s}</script>\n" for s in scripts)
    if face is None:
        face = hangul.face_css(title + body + inline)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n"
        f"<title>{html.escape(title)}</title>\n<style>\n{face}{asset('viewer.css')}</style>\n</head>\n<body>\n"
        f"{body}\n{inline}</body>\n</html>\n"
    )


def viewer_html(trace: Trace, *, model_name: str | None = None, roles: Sequence[Sequence[str | None]] | None = None,
                title: str | None = None, tokenizer=None, sections: Mapping[str, dict | None] | None = None,
                view: str | None = None, budget_mb: float | None = None) -> str:
    """One complete, self-contained HTML document showing TRACE's attention.

    model_name: instead of the trace's own `model`; roles: optional kept-layers × heads
    names ("previous", "[SEP]", ...) that colour the model view (`palette.ROLE_COLOURS`);
    title: the page title (default: model name and text); tokenizer: the
    model's (default: the trace's own, which Trace.load's lack), to add a "Next token" view to a generation
    trace that kept its logits
    (each generated token's top candidates, with a temperature slider); sections: {panel id: section}
    (`panels`: "lens" | "rollout" | "patch" | "attribute" | "causal_trace" | "features"), each a view; view: the
    view shown first; budget_mb: the attention bytes the page holds (`payload.BUDGET_MB`): past it, each query
    row's largest weights (a trace of a long input keeps only those: model.run(keep=("attention_top",))).
    """
    payload = trace_payload(trace, model_name=model_name, roles=roles, title=title, tokenizer=tokenizer,
                            sections=sections, view=view, budget_mb=budget_mb)
    body = (f"<div data-qkv-root></div>\n"
            f"<script type=\"application/json\" class=\"qkv-data\">{script_json(payload)}</script>")
    return page(payload["title"], body, [viewer_js(), "QKV.boot();"])


def save_viewer(trace: Trace, path: str | os.PathLike, *, model_name: str | None = None,
                roles: Sequence[Sequence[str | None]] | None = None, title: str | None = None,
                tokenizer=None, sections: Mapping[str, dict | None] | None = None, view: str | None = None,
                budget_mb: float | None = None) -> Path:
    """Write the viewer of TRACE to PATH atomically (never a half-written file)."""
    return write_html(viewer_html(trace, model_name=model_name, roles=roles, title=title, tokenizer=tokenizer,
                                  sections=sections, view=view, budget_mb=budget_mb), path)


def write_html(document: str, path: str | os.PathLike) -> Path:
    """Write DOCUMENT through a temporary file renamed into place; a clear error if PATH is not writable."""
    out = Path(path)
    if out.is_dir():
        raise QkvError(f"{out} is a directory; give a file name such as {out / 'attention.html'}")
    try:
        write_text(out, document)
    except OSError as e:
        raise QkvError(f"cannot write {out}: {e.strerror}; choose a writable path") from None
    return out


_FRAMES = itertools.count()          # each View's iframe has an id of its own in a notebook's page
MAX_FRAME = 4000                     # px: a viewer taller than this scrolls inside its frame


class View:
    """The viewer of a trace, for notebooks: the last expression of a cell shows it.

    Each view is an <iframe srcdoc> with scripts sandboxed to themselves, so several
    views in one notebook never clash, and nothing is loaded from the network.
    """

    def __init__(self, trace: Trace, *, model_name: str | None = None,
                 roles: Sequence[Sequence[str | None]] | None = None, title: str | None = None,
                 height: int | None = None, tokenizer=None, sections: Mapping[str, dict | None] | None = None,
                 view: str | None = None):
        self.html = viewer_html(trace, model_name=model_name, roles=roles, title=title, tokenizer=tokenizer,
                                sections=sections, view=view)
        n, L = len(trace.labels), len(trace.layer_ids)
        # tall enough for the head view's tokens and the model view's rows, then it scrolls inside
        self.height = height or min(900, max(420, 130 + 22 * n, 150 + 90 * L))

    def _repr_html_(self) -> str:
        """The iframe at its estimated height, and a script that fits it to the viewer's own height as the viewer
        reports it (postMessage from inside the sandbox; only this frame's messages are read)."""
        frame = f"qkv-view-{next(_FRAMES)}-{os.getpid()}"
        return (f"<iframe id=\"{frame}\" class=\"qkv-view\" srcdoc=\"{html.escape(self.html, quote=True)}\" "
                f"sandbox=\"allow-scripts\" title=\"qkv attention viewer\" "
                f"style=\"width: 100%; height: {int(self.height)}px; border: 1px solid #d0d7de; border-radius: 6px;\">"
                "</iframe>"
                f"<script>(() => {{ const f = document.getElementById(\"{frame}\"); if (!f) return;"
                " window.addEventListener(\"message\", (e) => { const h = e.data && e.data.qkvHeight;"
                " if (e.source === f.contentWindow && Number.isFinite(h))"
                f" f.style.height = Math.min(Math.max(h + 2, 120), {MAX_FRAME}) + \"px\"; }}); }})();</script>")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the viewer to PATH as a standalone HTML file."""
        return write_html(self.html, path)
