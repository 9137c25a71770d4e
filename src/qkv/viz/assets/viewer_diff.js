/* qkv viewer panel of model diffing (`qkv diff`, qkv/analysis/diff.py): how far model B reads the text
 * differently from model A — each head's attention-pattern JS divergence (layers × heads, bits), and per
 * layer × position the logit lens's KL(A‖B) (nats) and the residual stream's 1 − cos. The optional
 * section "diff" of viewer.js (qkv/viz/diff_figures.py: diff_section documents it).
 *
 * Tokens and names reach the page only through textContent and canvas fillText: never parsed as HTML.
 * No network. Load after viewer_panels.js: it registers QKV.panels.diff (the interface is at the top of
 * viewer_panels.js) and draws with that file's QKV.draw.
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_diff.js");
  const {el, clamp, shown} = QKV.util;
  const {Heat, ramp, about, colourBar} = QKV.draw;

  const fmt = (x) => x === 0 ? "0" : Math.abs(x) < 1e-3 ? x.toExponential(2) : x.toPrecision(4);

  function buildDiff(v) {
    const D = v.p.diff, panel = v.panels.diff;
    const colour = (x, m) => ramp(D.colours, m > 0 ? x / m : 0);             // 0 → light, the map's max → dark
    const far = D.cosine.map(r => r.map(c => 1 - c));                         // (L+1) × n
    const maps = {}, readout = el("p", "qkv-readout", "hover or focus a cell");
    readout.setAttribute("aria-live", "polite");
    const top = D.top_heads.slice(0, 5).map(t => `L${t.layer}.H${t.head} ${fmt(t.js)}`).join(", ");
    panel.append(about([["A ", D.model_a], ["B ", D.model_b],
                        ["moved most ", top ? `${top} (attention JS, bits)` : "—"]]));
    const figs = el("div", "qkv-figs");
    const tables = {js: D.js, kl: D.lens_kl, far};
    const titles = {js: "attention JS (bits) · layer × head", kl: "logit lens KL(A‖B) (nats) · stream row × token",
                    far: "residual stream 1 − cos · stream row × token"};
    const unit = clamp(Math.floor(((v.root.clientWidth || 1100) - 300) / (D.js[0].length + 2 * D.tokens.length)), 4, 24);
    for (const name of ["js", "kl", "far"]) {
      const t = tables[name];
      if (!t) continue;
      const rows = t.length, cols = t[0].length, m = Math.max(0, ...t.map(r => Math.max(...r)));
      const h = new Heat({name: "diff-" + name, rows, cols, width: unit * cols, height: 300, flip: true, keys: true,
                          rowLabels: [...Array(rows).keys()].map(String),
                          colLabels: name === "js" ? [...Array(cols).keys()].map(String) : D.tokens.map(s => shown(s, 10)),
                          title: `${titles[name]} · max ${fmt(m)}`,
                          onCell: (c, e) => {
                            if (c && e) h.showTip(e, fmt(t[c.r][c.c]));
                            v.set({cell: c && {i: c.r, j: c.c, t: name}});
                          }});
      h.paint((r, c) => colour(t[r][c], m));
      figs.append(h.box);
      maps[name] = h;
    }
    panel.append(figs, readout, colourBar(x => ramp(D.colours, x), "0", "max",
                 "each map on its own scale: light = unchanged, dark = moved most"),
                 el("p", "qkv-note", "Each head's JS is the mean over query rows of JS(A_a[q] ‖ A_b[q]); stream row l " +
                    "is the residual stream after l blocks (0: the embeddings; the last: what the final norm reads), " +
                    "its lens row read through each model's own final norm and W_vocab (the last row: the logits)."));

    function draw() {
      const s = v.state;
      for (const name in maps) maps[name].draw(s.cell && s.cell.t === name ? {r: s.cell.i, c: s.cell.j} : null);
      if (!s.cell || !maps[s.cell.t]) { readout.textContent = "hover or focus a cell"; return; }
      const {i, j, t} = s.cell;
      if (t === "js") { readout.textContent = `layer ${i}, head ${j}: JS ${fmt(D.js[i][j])} bits`; return; }
      readout.textContent = `stream row ${i}, token ${j} “${shown(D.tokens[j], 24)}”: lens KL ` +
        (D.lens_kl ? fmt(D.lens_kl[i][j]) + " nats" : "—") + `, cos ${D.cosine[i][j]}, ‖B‖/‖A‖ ${D.norm_ratio[i][j]}`;
    }
    return {draw};
  }

  QKV.panels.diff = {
    build: buildDiff,
    meta: (v) => [`model diff: ${v.p.diff.model_a} vs ${v.p.diff.model_b}`],
  };
})(window);
