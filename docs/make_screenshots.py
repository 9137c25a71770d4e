"""Screenshots of the viewer and the web app for the README, made by qkv's own code.

    .venv/bin/python docs/make_screenshots.py        # writes docs/images/*.png

Runs the default model on "The cat sat on the mat", writes the viewer with
`qkv.viz.html.save_viewer`, serves the app with `qkv.web.server`, asks SmolLM2 a question
for the viewer's Next token tab, writes SmolLM2's pipeline page (`qkv.viz.pipeline`) and the
viewer's Patching panel on the indirect-object prompt (`qkv.analysis.patch`), and photographs
them in the system's Chromium (QKV_CHROMIUM, default /usr/bin/chromium) through Playwright.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import qkv
import qkv.writing.chat
from qkv.web.server import make_server
from qkv.viz.html import save_viewer

CHROMIUM = os.environ.get("QKV_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
OUT = Path(__file__).parent / "images"
TEXT = "The cat sat on the mat"
QUESTION = "What is the capital of France?"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"
READY = "[data-qkv-root][data-ready='1']"


def roles_of(text: str):
    """What each head does on TEXT (qkv.analysis), to label the model view; None if unavailable."""
    try:
        from qkv.analysis import analyse

        return analyse("minilm", [text]).roles
    except Exception as e:                      # the screenshots still work without roles
        print(f"no roles ({e})")
        return None


def shoot(page, name: str, selector: str = "[data-qkv-root]") -> None:
    path = OUT / f"{name}.png"
    page.locator(selector).first.screenshot(path=str(path), animations="disabled")
    print(f"{path}  {path.stat().st_size / 1024:.0f} KB")


def main() -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    model = qkv.load("minilm")
    trace = model.run(TEXT, keep=("attentions",))
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        viewer = save_viewer(trace, Path(tmp) / "cat.html", roles=roles_of(TEXT))
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 920, "height": 700}, device_scale_factor=1)
        page.goto(viewer.as_uri())
        page.wait_for_selector(READY)

        page.click(".qkv-chip >> nth=2")                         # layer 0, head 2: the previous-token head
        shoot(page, "head_view")

        page.click(".qkv-tab >> text=Matrix")
        canvas = page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
        cell = float(canvas["cell"])
        x = canvas["box"]["x"] + float(canvas["padL"]) + 2.5 * cell   # key 2 "cat"
        y = canvas["box"]["y"] + float(canvas["padT"]) + 3.5 * cell   # query 3 "sat"
        page.mouse.move(x, y)
        shoot(page, "matrix_view")

        page.mouse.move(0, 0)
        page.click(".qkv-tab >> text=Model view")
        shoot(page, "model_view")

        server = make_server("minilm", port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        page.goto(server.url)
        page.wait_for_selector(READY)
        page.fill("textarea", "The animal didn't cross the street because it was too tired.")
        page.click("button[type=submit]")
        page.wait_for_function("() => document.querySelectorAll('.qkv-col-q .qkv-tok').length > 10")
        page.select_option(".qkv-layer", "2")
        page.hover(".qkv-col-q .qkv-tok >> nth=10")             # "it"
        shoot(page, "web_app", ".qkv-app")
        server.shutdown()
        server.server_close()
        next_token_view(browser, Path(tmp))
        pipeline_view(browser, Path(tmp))
        patching_view(browser, Path(tmp))
        browser.close()


def next_token_view(browser, tmp: Path) -> None:
    """SmolLM2's answer to a question, in the viewer's Next token tab, on the token " Paris"."""
    model = qkv.load("smollm2")
    stream = qkv.writing.chat.chat_stream(model, QUESTION)
    for _ in stream:                                            # write the answer (greedy)
        pass
    viewer = save_viewer(stream.trace(), tmp / "chat.html", tokenizer=model.tokenizer)
    page = browser.new_page(viewport={"width": 920, "height": 560}, device_scale_factor=1)
    page.goto(viewer.as_uri())
    page.wait_for_selector(READY)
    page.click(".qkv-tab >> text=Next token")
    page.click(".qkv-step >> text=␣Paris")
    shoot(page, "next_token_view")


def pipeline_view(browser, tmp: Path) -> None:
    """SmolLM2's pipeline page on TEXT, layer 3, head 4, its softmax box open (the whole page)."""
    from qkv.viz.pipeline import save_pipeline

    page_path = save_pipeline(qkv.load("smollm2"), TEXT, tmp / "pipeline.html")
    page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    page.goto(page_path.as_uri())
    page.wait_for_selector("[data-qkv-pipeline][data-ready='1']", timeout=30000)
    page.select_option(".qkv-p-layer", "3")
    page.select_option(".qkv-p-head-pick", "4")
    page.click(".qkv-p-box[data-box='attn']")
    path = OUT / "pipeline.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"{path}  {path.stat().st_size / 1024:.0f} KB")


def patching_view(browser, tmp: Path) -> None:
    """The viewer's Patching panel on SmolLM2's indirect-object prompt, hovering L23.H3."""
    from qkv.analysis.patch import patch
    from qkv.analysis.sections import patch_payload

    model = qkv.load("smollm2")
    result = patch(model, CLEAN, CORRUPTED, (" Mary", " John"))
    viewer = save_viewer(model.run(CLEAN, keep=("attentions",)), tmp / "patch.html",
                         sections={"patch": patch_payload(result)}, view="patch")
    page = browser.new_page(viewport={"width": 1100, "height": 760}, device_scale_factor=2)
    page.goto(viewer.as_uri())
    page.wait_for_selector(READY, timeout=30000)
    canvas = ".qkv-heat-heads"
    box = page.locator(canvas).bounding_box()
    d = page.eval_on_selector(canvas, "e => Object.assign({}, e.dataset)")
    row = int(d["rows"]) - 1 - 23 if d["flip"] == "1" else 23                 # layer 23 (drawn bottom-up)
    page.mouse.move(box["x"] + int(d["padL"]) + 3.5 * int(d["cw"]), box["y"] + int(d["padT"]) + (row + 0.5) * int(d["ch"]))
    shoot(page, "viewer-patch")


if __name__ == "__main__":
    main()
