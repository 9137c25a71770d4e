"""The README's Python in a real Jupyter kernel (nbclient): a figure as a cell's last line shows as a
picture, and the viewer of a generation has its Next token tab with no tokenizer= passed."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from conftest import MODELS, PATIENCE


def run_cells(*sources: str) -> list:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    # Each wait of the client bounded by PATIENCE only: the kernel starting (nbclient's default: 60 s), a cell, and
    # a cell's output arriving after its reply (default: 4 s, then the output is dropped with a mere warning).
    NotebookClient(nb, timeout=PATIENCE, startup_timeout=PATIENCE, iopub_timeout=PATIENCE,
                   raise_on_iopub_timeout=True, kernel_name="python3").execute()
    return [cell.outputs for cell in nb.cells]


def test_figures_and_the_viewer_show_inline():
    outs = run_cells(
        f"import qkv\nfrom qkv.viz.figures import head_heatmap\nfrom qkv.viz.html import View\n"
        f"model = qkv.load({str(MODELS / 'gpt2')!r})\ntrace = model.run('The cat sat on the mat')",
        "head_heatmap(trace, 0, 2)",
        "View(model.generate('The cat', 3, temperature=0, trace=True))",
    )
    figure = outs[1][-1]
    assert figure["output_type"] == "execute_result" and "image/png" in figure["data"], figure
    assert figure["data"]["image/png"]                              # a PNG, not "<Figure size … with 2 Axes>"
    view = outs[2][-1]["data"]["text/html"]
    assert "<iframe" in view and "&quot;next&quot;:{" in view        # the Next token tab's candidates
