/* qkv pipeline page's toolkit: what the page (pipeline.js) and its attention diagram (pipeline_diagram.js) draw
 * and compute with, none of it about one box of the flow.
 *
 *   el(tag, cls, text)              an element; its text through textContent only, never parsed as HTML
 *   format(template, values)        a str.format-like template of the page's words ({name}, {name:.3f}, {name:.1e},
 *                                   {name:g}; qkv/viz/words/en.py writes them), num(x, d) and pct(p): numbers as text
 *   distribution(z, T, topk, topp)  the output end: softmax(filter(z / T)) over the whole vocabulary, in float64,
 *                                   exactly qkv.writing.sampling.distribution → {probs, kept}
 *   viridisRGB(t), viridis(t)       the colour of t in [0, 1], as every other view of qkv draws weights
 *   heatmap(...), bars(...), table(head, rows)   a labelled heatmap canvas, one bar per item, a table of text
 *
 * Load this file before pipeline.js (`html.pipeline_js` inlines it first). No network.
 */
(function (global) {
  "use strict";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  // ── words: str.format-like templates ({name}, {name:.3f}, {name:.1e}, {name:g}) ──
  function format(template, values) {
    return template.replace(/\{(\w+)(?::([^}]*))?\}/g, (all, name, spec) => {
      if (!(name in values)) return all;
      const v = values[name];
      if (typeof v !== "number" || !spec) return String(v);
      const m = /^\.(\d+)([fe])$/.exec(spec);
      if (m) return m[2] === "f" ? v.toFixed(+m[1]) : v.toExponential(+m[1]);
      if (spec === "g") return String(+v.toPrecision(6));
      return String(v);
    });
  }
  const num = (x, d = 4) => (x === -Infinity ? "−∞" : Number.isFinite(x) ? x.toFixed(d) : String(x));
  // a probability as a percent that never reads 0 when it is not: 2 decimals from 1 %, else 2 significant digits
  // ("0.0031%", "3.9e-5%": a random model spreads its mass over 256k tokens, each far below 0.01 %)
  const pct = (p) => { const x = 100 * p;
    return (x >= 1 ? x.toFixed(2) : x >= 1e-4 ? x.toPrecision(2) : x.toExponential(1)) + "%"; };

  // ── the output end: exactly qkv.writing.sampling.distribution ──────────────
  // softmax(filter(z / T)) in float64: top-k keeps logits ≥ the k-th largest (ties kept), top-p sorts
  // ascending (stable), drops tokens whose cumulative probability is ≤ 1 − p, always keeps the top one.
  function softmax(x) {
    let m = -Infinity;
    for (let i = 0; i < x.length; i++) if (x[i] > m) m = x[i];
    if (!Number.isFinite(m)) m = 0;
    const e = new Float64Array(x.length);
    let s = 0;
    for (let i = 0; i < x.length; i++) { e[i] = Math.exp(x[i] - m); s += e[i]; }
    if (s > 0) for (let i = 0; i < x.length; i++) e[i] /= s;
    return e;
  }
  function distribution(z, T, topk, topp) {
    const V = z.length;
    if (T === 0) {                                     // greedy: one-hot on the (first) argmax
      let best = 0;
      for (let i = 1; i < V; i++) if (z[i] > z[best]) best = i;
      const p = new Float64Array(V);
      p[best] = 1;
      return {probs: p, kept: 1};
    }
    const x = new Float64Array(V);
    for (let i = 0; i < V; i++) x[i] = z[i] / T;
    if (topk && topk < V) {
      const sorted = Float64Array.from(x).sort();
      const kth = sorted[V - topk];
      for (let i = 0; i < V; i++) if (x[i] < kth) x[i] = -Infinity;
    }
    if (topp !== null && topp < 1) {
      const order = Array.from({length: V}, (_, i) => i).sort((a, b) => (x[a] - x[b]) || (a - b));
      const sorted = new Float64Array(V);
      for (let r = 0; r < V; r++) sorted[r] = x[order[r]];
      const probs = softmax(sorted);
      let cum = 0;
      for (let r = 0; r < V - 1; r++) {                // the last (the top token) is always kept
        cum += probs[r];
        if (cum <= 1 - topp) x[order[r]] = -Infinity;
      }
    }
    let kept = 0;
    for (let i = 0; i < V; i++) if (x[i] !== -Infinity) kept += 1;
    return {probs: softmax(x), kept};            // kept: the tokens the filters leave (finite logits)
  }

  // ── drawing ──────────────────────────────────────────────────────────────────
  // viridis, as every other view of qkv draws weights (matplotlib's map, sampled at 9 stops)
  const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
                   [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  function viridisRGB(t) {                         // [r, g, b] of t in [0, 1]
    const x = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1), i = Math.min(VIRIDIS.length - 2, Math.floor(x)), f = x - i;
    const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
    return [0, 1, 2].map((k) => Math.round(a[k] + f * (b[k] - a[k])));
  }
  function viridis(t) { return `rgb(${viridisRGB(t).join(",")})`; }
  const LABEL_FONT = '11px ui-monospace, SFMono-Regular, Menlo, "qkv Hangul", monospace';
  // values in [0, 1], row-major; NaN = masked; rowLabels / colLabels: the tokens along each side (optional)
  function heatmap(values, rows, cols, hiRow, label, rowLabels, colLabels) {
    const cw = Math.max(2, Math.min(28, Math.floor(512 / cols)));
    const ch = rows === cols ? cw : Math.max(2, Math.min(28, Math.floor(240 / rows)));
    const c = el("canvas", "qkv-p-heat");
    const measure = c.getContext("2d");
    measure.font = LABEL_FONT;
    const room = (labels, cell) => labels && cell >= 9 ? Math.min(96, 6 + Math.max(...labels.map((x) => measure.measureText(x).width))) : 0;
    const left = room(rowLabels, ch), top = room(colLabels, cw);
    c.width = left + cols * cw;
    c.height = top + rows * ch;
    c.setAttribute("role", "img");
    c.setAttribute("aria-label", label);
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, c.width, c.height);
    for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
      const v = values[i * cols + j];
      ctx.fillStyle = Number.isNaN(v) ? "#eaeef2" : viridis(v);
      ctx.fillRect(left + j * cw, top + i * ch, cw, ch);
    }
    ctx.font = LABEL_FONT;
    ctx.fillStyle = "#1f2328";
    const cut = (x) => (x.length > 12 ? x.slice(0, 11) + "…" : x);
    if (left) {
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      rowLabels.forEach((x, i) => ctx.fillText(cut(x), left - 4, top + (i + 0.5) * ch));
    }
    if (top) {
      ctx.save(); ctx.textAlign = "left"; ctx.textBaseline = "middle";
      colLabels.forEach((x, j) => { ctx.save(); ctx.translate(left + (j + 0.5) * cw, top - 4); ctx.rotate(-Math.PI / 2);
                                    ctx.fillText(cut(x), 0, 0); ctx.restore(); });
      ctx.restore();
    }
    if (hiRow !== null && hiRow !== undefined) {
      ctx.strokeStyle = "#cf222e";
      ctx.lineWidth = 2;
      ctx.strokeRect(left + 1, top + hiRow * ch + 1, cols * cw - 2, ch - 2);
    }
    c.qkvData = {label, rows, cols, values: Array.from(values, (v) => (Number.isNaN(v) ? null : v)),   // export.js
                 row_labels: rowLabels || null, col_labels: colLabels || null, highlighted_row: hiRow == null ? null : hiRow};
    c.dataset.rows = rows;
    c.dataset.cols = cols;
    c.dataset.labels = String(Boolean(left || top));
    return c;
  }
  // one bar per item: [{label, value, text, hot, off}]; bars scaled to the largest |value|, or to FULL (a
  // probability's bar: FULL = 1, its length the probability itself, as its number says)
  function bars(items, cls, full) {
    const box = el("div", "qkv-p-bars " + (cls || ""));
    let top = full || 0;
    if (!full) for (const it of items) if (Number.isFinite(it.value)) top = Math.max(top, Math.abs(it.value));
    for (const it of items) {
      const row = el("div", "qkv-p-bar" + (it.hot ? " qkv-p-hot" : "") + (it.off ? " qkv-p-off" : ""));
      const name = el("span", "qkv-p-bar-label", it.label);
      const track = el("span", "qkv-p-bar-track");
      const fill = el("span", "qkv-p-bar-fill" + (it.value < 0 ? " qkv-p-neg" : ""));
      fill.style.width = Number.isFinite(it.value) && top > 0 ? `${(100 * Math.abs(it.value) / top).toFixed(1)}%` : "0%";
      track.append(fill);
      row.append(name, track, el("span", "qkv-p-bar-value", it.text));
      if (it.data) for (const [k, v] of Object.entries(it.data)) row.dataset[k] = v;
      box.append(row);
    }
    return box;
  }
  function table(head, rows) {
    const t = el("table", "qkv-p-table");
    const tr = el("tr");
    for (const h of head) tr.append(el("th", null, h));
    t.append(tr);
    for (const r of rows) {
      const row = el("tr");
      for (const v of r) row.append(el("td", null, v));
      t.append(row);
    }
    return t;
  }

  global.QKV_PIPELINE_KIT = {el, format, num, pct, softmax, distribution, viridisRGB, viridis, heatmap, bars, table};
})(window);
