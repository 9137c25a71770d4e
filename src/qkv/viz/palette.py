"""The colours of every view, in one place: figures, the terminal and the HTML viewer agree.

Attention weights: brighter = more attention (the usual convention), on matplotlib's
"viridis" (perceptually uniform, readable in grey): 0 is dark violet, 1 bright yellow.
The figures (`viz.figures`), the viewer's matrix and model views (`assets/viewer.js`, its
VIRIDIS stops are this map sampled at 17 points) and the terminal's tables (`cli`: dim grey
to bright white) all use this direction. Cells the mask removed are grey (MASKED), never
the colour of a weight of 0. (The viewer's head view draws lines instead: more ink = more.)

Signed effects (direct logit attribution, patching, a head's OV circuit): DIVERGING, blue
below 0, white at 0, red above, each map on a scale symmetric about 0 (`viz.interpret_figures`;
the viewer's patching panel samples the same map, `assets/viewer_panels.js`).

Head roles (`qkv.analysis.roles`): one colour each, ROLE_COLOURS, used by the roles map
(`viz.head_maps`), the terminal's table (`cli.heads`, as rich colours) and the viewer's
model view (sent in its payload); roles the palette does not know get the viewer's spares.
"""

from __future__ import annotations

CMAP = "viridis"          # attention weight → colour: bright = high
MASKED = "#d4d4d4"        # cells the mask removed
HATCH = "#8a8a8a"         # the hatching over them in figures
DIVERGING = "RdBu_r"      # a signed effect → colour: red adds, blue takes away, white is 0

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
