/* qkv viewer panel of path patching (`qkv path-patch`, qkv/analysis/path_patch.py): each sender's effect on
 * the receiver heads' q, k or v input only — a layers × heads map, a column of the layers' FFNs and the
 * embeddings' cell, on one scale symmetric about 0 (blue: corrupting the path lowers the metric); grey: no
 * path (the sender is not before a receiver) or not a sender. The optional section "path_patch" of viewer.js
 * (qkv/viz/path_patch_panel.py: path_patch_section documents it).
 *
 * Texts and names reach the page only through textContent and canvas fillText: never parsed as HTML.
 * No network. Load after viewer_panels.js: it registers QKV.panels.path_patch (the interface is at the top of
 * viewer_panels.js) and draws with that file's QKV.draw.
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_path_patch.js");
  const {el, clamp} = QKV.util;
  const {Heat, ramp, about, colourBar, signed} = QKV.draw;

  const fmt = (x) => x === null ? "no path" : signed(x, 4);

  function buildPathPatch(v) {
    const P = v.p.path_patch, panel = v.panels.path_patch, L = P.heads.length, H = L ? P.heads[0].length : 0;
    const colour = (x) => x === null ? null : ramp(P.colours, P.max > 0 ? 0.5 + 0.5 * x / P.max : 0.5);  // 0 → white
    const tables = {heads: P.heads, ffn: P.ffn.map(x => [x]), embed: [[P.embed]]};
    const name = {heads: (i, j) => `${i}.${j}`, ffn: (i) => `${i}.ffn`, embed: () => "embed"};
    const where = `${P.receivers} (${P.channel === "all" ? "q, k and v" : P.channel})`;
    const what = P.normalised ? "−1: the path carries the whole clean − corrupted difference; 0: nothing"
                              : "m(patched) − m(clean)";
    const lines = [["receivers ", where], ["metric ", `${P.metric} · ${what}`],
                   ["clean ", `“${P.clean}” → ${P.metric_clean.toFixed(3)}`],
                   ["corrupted ", `“${P.corrupted}” → ${P.metric_corrupted.toFixed(3)}`],
                   ["positions ", P.positions ? P.positions.join(", ") : "all"]];
    if (P.set) lines.push(["senders ", `${P.set.senders.join(",")} together: ${fmt(P.set.effect)}`]);
    lines.push(["largest ", P.top.slice(0, 5).map(t => `${t.sender} ${fmt(t.effect)}`).join(", ") || "—"]);
    const readout = el("p", "qkv-readout", "hover or focus a cell");
    readout.setAttribute("aria-live", "polite");
    const figs = el("div", "qkv-figs"), maps = {};
    const unit = clamp(Math.floor(((v.root.clientWidth || 1100) - 320) / (H + 2)), 10, 28);
    const layers = [...Array(L).keys()].map(String);
    const shapes = {heads: [L, H, layers, [...Array(H).keys()].map(String), `senders → ${where} · layer × head`],
                    ffn: [L, 1, layers, ["FFN"], "FFN"], embed: [1, 1, ["emb"], ["emb"], "embeddings"]};
    for (const key of ["heads", "ffn", "embed"]) {
      const [rows, cols, rowLabels, colLabels, title] = shapes[key], t = tables[key];
      const h = new Heat({name: "path-" + key, rows, cols, width: unit * cols, height: key === "embed" ? unit : 300,
                          flip: true, keys: true, rowLabels, colLabels, title,
                          onCell: (c, e) => {
                            if (c && e) h.showTip(e, fmt(t[c.r][c.c]));
                            v.set({cell: c && {i: c.r, j: c.c, t: key}});
                          }});
      h.paint((r, c) => colour(t[r][c]));
      figs.append(h.box);
      maps[key] = h;
    }
    panel.append(about(lines), figs, readout,
                 colourBar(x => ramp(P.colours, x), `−${P.max.toFixed(3)}`, `+${P.max.toFixed(3)}`,
                           "blue: corrupting the path lowers the metric · grey: no path"),
                 el("p", "qkv-note", "Each cell: the clean run with that one sender's output taken from the corrupted " +
                    "run, reaching the receivers' " + (P.channel === "all" ? "queries, keys and values" :
                    {q: "queries", k: "keys", v: "values"}[P.channel]) + " only (every other component clean, " +
                    "everything after the receivers recomputed). A sender reaches receivers of later layers only."));

    function draw() {
      const s = v.state, cell = s.cell && maps[s.cell.t] ? s.cell : null;
      for (const key in maps) maps[key].draw(cell && cell.t === key ? {r: cell.i, c: cell.j} : null);
      if (!cell) { readout.textContent = "hover or focus a cell"; return; }
      const x = tables[cell.t][cell.i][cell.j];
      readout.textContent = `sender ${name[cell.t](cell.i, cell.j)} → ${where}: ` +
        (x === null ? "no path (not a sender, or not before a receiver)" : fmt(x));
    }
    return {draw};
  }

  QKV.panels.path_patch = {
    build: buildPathPatch,
    meta: (v) => [`path patching → ${v.p.path_patch.receivers} (${v.p.path_patch.channel})`],
  };
})(window);
