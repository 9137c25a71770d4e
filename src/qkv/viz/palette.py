"""The colours of every view, in one place: figures, the terminal and the HTML viewer agree.

Attention weights: brighter = more attention (the usual convention), on matplotlib's
"viridis" (perceptually uniform, readable in grey): 0 is dark violet, 1 bright yellow.
The figures (`viz.figures`), the viewer's matrix and model views (`assets/viewer.js`, its
VIRIDIS stops are this map sampled at 17 points) and the terminal's tables (`cli`: dim grey
to bright white) all use this direction. Cells the mask removed are grey (MASKED), never
the colour of a weight of 0. (The viewer's head view draws lines instead: more ink = more.)

Signed effects (direct logit attribution, patching, input attribution, a head's OV circuit):
DIVERGING, blue below 0, white at 0, red above, each map on a scale symmetric about 0
(`viz.interpret_figures`). matplotlib's map is linear between the 11 DIVERGING_STOPS, so a page
that interpolates them draws the figures' colours: the viewer's attribution panel gets them in its
payload, the patching panel holds the same stops (`assets/viewer_panels.js`; tests compare all three).

Causal tracing (Meng et al. 2022, `viz.causal_figures` and the viewer's causal panel): one
sequential map per kind of restored state, as ROME draws them — CAUSAL_CMAPS, purple for hidden
states, green for FFN outputs, red for attention outputs, white at no effect — with their stops in
CAUSAL_STOPS (matplotlib's maps are linear between them too; the page gets them in its payload).

Head roles (`qkv.analysis.roles`): one colour each, ROLE_COLOURS, used by the roles map
(`viz.head_maps`), the terminal's table (`cli.heads`, as rich colours) and the viewer's
model view (sent in its payload); roles the palette does not know get the viewer's spares.
"""

from __future__ import annotations

CMAP = "viridis"          # attention weight → colour: bright = high
MASKED = "#d4d4d4"        # cells the mask removed
HATCH = "#8a8a8a"         # the hatching over them in figures
DIVERGING = "RdBu_r"      # a signed effect → colour: red adds, blue takes away, white is 0
# ColorBrewer's RdBu reversed, as (r, g, b): the colours at -1, -0.8, ..., +1 of a symmetric scale
DIVERGING_STOPS = ((5, 48, 97), (33, 102, 172), (67, 147, 195), (146, 197, 222), (209, 229, 240), (247, 247, 247),
                   (253, 219, 199), (244, 165, 130), (214, 96, 77), (178, 24, 43), (103, 0, 31))

# causal tracing: the kind of restored state → a sequential map, 0 (white) .. the largest effect (dark)
CAUSAL_CMAPS = {"hidden": "Purples", "ffn": "Greens", "attn": "Reds"}
CAUSAL_STOPS = {          # ColorBrewer's 9-class Purples, Greens, Reds, light to dark
    "hidden": ((252, 251, 253), (239, 237, 245), (218, 218, 235), (188, 189, 220), (158, 154, 200),
               (128, 125, 186), (106, 81, 163), (84, 39, 143), (63, 0, 125)),
    "ffn": ((247, 252, 245), (229, 245, 224), (199, 233, 192), (161, 217, 155), (116, 196, 118),
            (65, 171, 93), (35, 139, 69), (0, 109, 44), (0, 68, 27)),
    "attn": ((255, 245, 240), (254, 224, 210), (252, 187, 161), (252, 146, 114), (251, 106, 74),
             (239, 59, 44), (203, 24, 29), (165, 15, 21), (103, 0, 13)),
}

# One colour per role of qkv.analysis.roles.ROLES (tab10's hues; "mixed" a quiet grey).
ROLE_COLOURS = {
    "previous": "#1f77b4", "next": "#17becf", "self": "#9467bd", "[CLS]": "#d62728", "[SEP]": "#ff7f0e",
    "punctuation": "#8c564b", "first": "#e377c2", "induction": "#2ca02c", "broad": "#bcbd22",
    "mixed": "#8c8c8c",
}


def role_colours(roles) -> dict[str, str]:
    """The palette's colour of each role name in ROLES (L × H names, None = no role) that it knows."""
    names = {r for row in roles for r in row if r is not None} if roles is not None else set()
    return {r: ROLE_COLOURS[r] for r in sorted(names) if r in ROLE_COLOURS}
