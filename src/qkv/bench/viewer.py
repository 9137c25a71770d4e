"""The viewer at length: how big the page `qkv show --out` writes is, and how fast it opens, at 512 to 4,096 tokens.

    SmolLM2-135M-Instruct reads the first N tokens of Shakespeare (the `shakespeare` corpus) as `qkv show --out`
    does: every weight of every layer up to LONG_TOKENS tokens, each query row's largest weights past it
    (model.run(keep=("attention_top",))), as many as the page's budget holds (viz.payload.BUDGET_MB).
    The page is opened in Chromium (headless, no GPU, the network blocked) with a 1100 × 800 window:
      first paint   navigation start → the frame holding the page's first view is painted (the viewer stamps
                    data-painted-at in a task after that frame's animation frame; a long page inflates its
                    other layers only then: `decoded` is when they are all in)
      hover         mouseover of a query token in the head view (one head) → the next frame drawn
      matrix, model view   a click on the tab → the next frame drawn
    The median of `repeats` page loads; the trace is made once per length (its time is reported too).

The targets (issue 28): 4,096 tokens in a page of at most 60 MB with a first paint within 3 s on 2 cores;
1,024 tokens in at most 25 MB.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from typing import Callable

from ..runtime.errors import QkvError
from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores

MODEL = "smollm2"
TOKENS = (512, 1024, 4096)
REPEATS = 3
TARGETS = {4096: (60.0, 3.0), 1024: (25.0, None)}       # tokens: (MB, first paint s)
CHROMIUM = os.environ.get("QKV_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]   # the browser tests' too
READY = "[data-qkv-root][data-ready='1']"                  # the viewer has drawn its first view
# ms from a click or mouseover of SEL to two frames later (in-page: the pages forbid eval by CSP)
TIMED = """async ([sel, kind]) => { const el = document.querySelector(sel); const t = performance.now();
  if (kind === 'click') el.click(); else el.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return performance.now() - t; }"""


def text_ids(tokenizer, n: int) -> list[int]:
    """The first N token ids of the Shakespeare corpus (its texts in order, then cut)."""
    from ..features.corpora import named_texts

    text = ""
    for _, _, part in named_texts("shakespeare").texts(0):
        text += part + "\n"
        if len(text) >= 2 * n:                                    # a token is more than 2 characters here
            ids, _ = tokenizer.encode(text[:12 * n])
            if len(ids) >= n:
                return list(ids[:n])
    raise QkvError(f"the corpus has fewer than {n} tokens")


def page_for(model, ids: list[int], budget_mb: float | None = None) -> tuple[str, float]:
    """(the viewer's HTML for IDS as `qkv show --out` writes it, seconds to make the trace and the page)."""
    from ..viz.html import viewer_html
    from ..viz.payload import LONG_TOKENS, MAX_TOP

    start = time.perf_counter()
    keep = ("attentions",) if len(ids) <= LONG_TOKENS else ("attention_top",)
    trace = model.run(ids, keep=keep, top=MAX_TOP)
    return viewer_html(trace, budget_mb=budget_mb), time.perf_counter() - start


def open_page(browser, path: str) -> dict:
    """One load of the page at PATH: first paint (s) and what a hover and two tabs take (ms)."""
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:")) else r.abort())
    try:
        page.goto("file://" + path, timeout=300_000)
        page.wait_for_selector(READY, timeout=300_000)
        page.wait_for_selector("[data-qkv-root][data-painted-at]", timeout=300_000)
        first = float(page.get_attribute("[data-qkv-root]", "data-painted-at")) / 1000     # the viewer's own stamp
        page.wait_for_selector("[data-qkv-root][data-decoded='all']", timeout=300_000)   # then the other layers
        page.select_option(".qkv-head", "0")
        n = page.locator(".qkv-col-q .qkv-tok").count()
        row = f".qkv-col-q .qkv-tok:nth-child({max(1, n - 10)})"
        got = {"first_paint_s": first,
               "hover_ms": page.evaluate(TIMED, [row, "mouseover"]),
               "matrix_ms": page.evaluate(TIMED, [".qkv-tab[data-view=matrix]", "click"]),
               "model_ms": page.evaluate(TIMED, [".qkv-tab[data-view=model]", "click"])}
    finally:
        page.close()
    if errors:
        raise QkvError(f"the page failed in Chromium: {errors[0]}")
    return got


def measure(tokens=TOKENS, repeats: int = REPEATS, model_source: str = MODEL, budget_mb: float | None = None,
            log: Callable[[str], None] = lambda m: None) -> dict:
    """{"rows": [{"tokens", "format", "k", "mb", "trace_s", "first_paint_s", "hover_ms", "matrix_ms",
    "model_ms"}], "model", "layers", "heads", "machine", ...}, medians of REPEATS page loads."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise QkvError("the viewer benchmark drives Chromium through playwright; pip install playwright "
                       "(make setup installs it) and apt-get install chromium") from None
    if not os.path.isfile(CHROMIUM):
        raise QkvError(f"Chromium is missing at {CHROMIUM}: apt-get install chromium, or set QKV_CHROMIUM")
    import re

    from ..models.loading import load

    model = load(model_source)
    rows, before = [], cpu_snapshot()
    with sync_playwright() as p, tempfile.TemporaryDirectory() as d:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for n in tokens:
                ids = text_ids(model.tokenizer, n)
                html, took = page_for(model, ids, budget_mb)
                path = os.path.join(d, f"viewer-{n}.html")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(html)
                shape = re.search(r'"attention":\s*(\{"format":\s*"top".{0,80}?"k":\s*(\d+))?', html)
                k = int(shape.group(2)) if shape and shape.group(2) else None
                log(f"{n} tokens: trace and page {took:.1f} s, {len(html.encode()) / 1e6:.1f} MB "
                    f"({'each row' + chr(39) + f's {k} largest' if k else 'every weight'}); {repeats} load(s)")
                loads = [open_page(browser, path) for _ in range(repeats)]
                median = {key: sorted(x[key] for x in loads)[len(loads) // 2] for key in loads[0]}
                rows.append({"tokens": n, "format": "top" if k else "dense", "k": k,
                             "mb": os.path.getsize(path) / 1e6, "trace_s": took, **median, "loads": loads})
        finally:
            browser.close()
    try:
        chromium = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        chromium = ""
    return {"rows": rows, "model": model.name, "layers": model.config.n_layers, "heads": model.config.n_heads,
            "repeats": repeats, "chromium": chromium or "Chromium",
            "others_cores": others_cores(before, cpu_snapshot()), "machine": machine_facts()}


def markdown(result: dict, command: str) -> str:
    """The 'bench:viewer' section of docs/benchmarks.md."""
    rows = []
    for r in result["rows"]:
        kept = f"each row's {r['k']} largest" if r["k"] else "every weight"
        paints = [x["first_paint_s"] for x in r.get("loads", [])] or [r["first_paint_s"]]
        spread = f" ({min(paints):.2f}–{max(paints):.2f})" if len(paints) > 1 else ""
        rows.append([f"{r['tokens']:,}", kept, f"{r['mb']:.1f}", f"{r['first_paint_s']:.2f}{spread}", f"{r['hover_ms']:.0f}",
                     f"{r['matrix_ms']:.0f}", f"{r['model_ms']:.0f}", f"{r['trace_s']:.0f}"])
    verdicts = []
    for r in result["rows"]:
        mb, paint = TARGETS.get(r["tokens"], (None, None))
        if mb is not None:
            ok = r["mb"] <= mb and (paint is None or r["first_paint_s"] <= paint)
            want = f"≤ {mb:g} MB" + (f", first paint ≤ {paint:g} s" if paint else "")
            verdicts.append(f"{r['tokens']:,} tokens: {want} — {md.MET[ok]}")
    mach = result["machine"]
    return md.join(
        "## The viewer at length",
        f"What `qkv show TEXT --out DIR` writes for {result['model']} ({result['layers']} layers × "
        f"{result['heads']} heads) reading the first N tokens of Shakespeare, opened in {result['chromium']} "
        "(headless, no GPU, 1100 × 800, the network blocked); the median of "
        f"{result['repeats']} page loads. Up to 1,024 tokens the page holds every weight of every layer when they "
        "fit its 80 MB budget, past it each query row's largest weights (exact, ±0.002) and the rest of the row.",
        md.table(["tokens", "page holds", "MB", "first paint s (range)", "hover ms", "matrix ms", "model view ms",
                  "trace + page s"], rows, "rlrrrrrr"),
        "First paint: navigation start to the frame that holds the first view, painted (the page's own clock: "
        "its data-painted-at, stamped in a task after that frame). A page of each row's largest weights carries "
        "them one array per layer and inflates only the layer it shows before that paint, the others after it "
        "(a view that needs one not yet in waits for it). Hover: a query token of the head view, one head. "
        "Matrix, model view: a click on the tab to the next frame (after every layer is in).",
        "Targets (issue 28): " + "; ".join(verdicts) + ".",
        f"Machine: {md.cpu(mach)}; {md.numpy_blas(mach)}. {md.busy(result['others_cores'])}",
        md.reproduce(command),
    )
