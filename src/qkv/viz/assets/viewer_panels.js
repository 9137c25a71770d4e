/* qkv viewer panels: the optional sections of viewer.js, beyond attention weights — the logit lens
 * (layers × positions, the final prediction's probability or rank, a cell's top tokens on hover),
 * rollout (raw attention, attention rollout and attention flow side by side) and activation
 * patching (effect tables as heatmaps centred at 0), drawn as labelled heatmaps on canvas, and a
 * mixture of experts' router (each token's experts and their weights, a table per layer). The
 * attribution and causal-tracing panels are in viewer_causes.js, drawn with this file's QKV.draw.
 *
 * Input: the sections of the payload (qkv/viz/payload.py, interpret_payload.py). Tokens reach the
 * page only through textContent and canvas fillText: never parsed as HTML. No network.
 * Colours: the patching panel's RDBU below is palette.py's DIVERGING_STOPS (a test compares them).
 *
 * Load this file after viewer.js (the page inlines both, in that order). The interface:
 *   QKV.util    the core's helpers: el, clamp, shown, fmt, fmtP, sizeCanvas, LUT, MASKED (arrays: wire.js)
 *   QKV.panels[renderer] = {decode?, meta, build}  one per panel of qkv/viz/panels.py, which declares its id,
 *                       its tab's title, whether it follows the Layer selector, this renderer's name and the
 *                       asset that registers it ("lens", "rollout", "patch", "router" here; viewer_causes.js:
 *                       "attribute", "causal_trace"; viewer_features.js: "features"):
 *     decode(section) → Promise<extra>   the section's arrays decoded (viewer.js mount; absent: {})
 *     meta(v)         → [string]  what the meta line says in this view
 *     build(v)        → {draw()}  builds the view into v.panels[id]; draw() runs on every render
 * v is the Viewer. A panel reads only: v.p (the payload; its section: v.p[id]), v.extra[id] (its decoded arrays),
 * v.state (view, layer, cell, pin, lensMode), v.set(patch) (update the state and redraw),
 * v.panels[id] (its element), v.root, v.tokens, v.n, v.H, v.A(l, h), v.masked(i, j), v.causal —
 * always through v at call time, as another kind of attention rebuilds the views.
 *   QKV.draw = {Heat, ramp, legend, signed, about, colourBar, RDBU, diverging, viridis}   the drawing
 *                                                                        helpers, for the other panels' files
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.panels) throw new Error("qkv viewer: load viewer.js before viewer_panels.js");
  const {el, clamp, shown, fmt, fmtP, sizeCanvas, LUT, MASKED} = QKV.util;
  const {decode} = QKV_WIRE;

  // ── a labelled heatmap: the lens, rollout and patching panels ──────────────
  // matplotlib "RdBu_r" (ColorBrewer RdBu, reversed): blue (negative) → white (0) → red (positive)
  const RDBU = [[5, 48, 97], [33, 102, 172], [67, 147, 195], [146, 197, 222], [209, 229, 240], [247, 247, 247],
                [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43], [103, 0, 31]];
  function ramp(stops, t) {                                      // t in [0, 1] → [r, g, b]
    const x = clamp(t, 0, 1) * (stops.length - 1), k = Math.min(Math.floor(x), stops.length - 2), f = x - k;
    return [0, 1, 2].map(c => Math.round(stops[k][c] * (1 - f) + stops[k + 1][c] * f));
  }
  const viridis = (t) => { const q = 3 * Math.round(clamp(t, 0, 1) * 255); return [LUT[q], LUT[q + 1], LUT[q + 2]]; };
  const diverging = (v, m) => ramp(RDBU, m > 0 ? 0.5 + 0.5 * v / m : 0.5);       // 0 → white
  // An effect as text: sign and 3 decimals (the payload keeps 5).
  function fmtE(v) {
    const sign = v > 0 ? "+" : v < 0 ? "−" : "";
    return sign + (v !== 0 && Math.abs(v) < 0.0005 ? "<0.001" : Math.abs(v).toFixed(3));
  }

  // rows × cols cells; colour(r, c) → [r, g, b] or null (masked: grey). flip: data row 0 at the bottom
  // (layers, as the figures draw them). onCell(cell | null, event | null) on hover (or, with keys, as
  // the arrow keys move a focused map's cell: event null), onPick(cell) on click. colStep: column labels
  // upright, every colStep-th (layer numbers), instead of every one at 45° when the cells are wide enough.
  // The canvas's data-* (cw, ch, padL, padT, rows, cols, flip) say where the cells are, for tests.
  class Heat {
    constructor(o) {
      this.o = o;
      this.canvas = el("canvas", "qkv-heat qkv-heat-" + o.name);
      this.tip = el("div", "qkv-tip");
      this.tip.hidden = true;
      const wrap = el("div", "qkv-heatwrap");
      wrap.append(this.canvas, this.tip);
      this.title = el("figcaption", "qkv-figcap", o.title || "");
      this.box = el("figure", "qkv-fig");
      this.box.append(this.title, wrap);
      const cw = this.cw = clamp(Math.floor(o.width / o.cols), 3, 28);
      const ch = this.ch = clamp(Math.floor(o.height / o.rows), 3, 22);
      this.font = `${clamp(Math.min(cw, 14) - 3, 9, 12)}px system-ui, "qkv Hangul", sans-serif`;
      const ctx0 = this.canvas.getContext("2d");
      ctx0.font = this.font;
      const width = (labels) => Math.max(0, ...labels.map(t => ctx0.measureText(shown(t, 12)).width));
      this.cols = !o.colStep && cw >= 9;                                 // room for a label per column
      const below = this.cols && o.colLabels ? Math.ceil(width(o.colLabels) * 0.71) : 0;  // labels at 45°
      const above = this.cols && o.topLabels ? Math.ceil(width(o.topLabels) * 0.71) : 0;
      this.padL = Math.ceil(Math.max(width(o.rowLabels) + 10, below - cw / 2 + 4));   // room for the first one
      this.padB = o.colStep ? 18 : below ? below + 12 : 8;
      this.padT = above ? above + 12 : 4;
      this.padR = above ? Math.ceil(Math.max(6, above - cw / 2 + 4)) : 6;
      this.W = this.padL + o.cols * cw + this.padR;
      this.Hpx = this.padT + o.rows * ch + this.padB;
      this.ctx = sizeCanvas(this.canvas, this.W, this.Hpx);
      Object.assign(this.canvas.dataset, {cw, ch, padL: this.padL, padT: this.padT, rows: o.rows, cols: o.cols,
                                          flip: o.flip ? 1 : 0});
      this.canvas.addEventListener("mousemove", (e) => o.onCell(this.at(e), e, this));
      this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; o.onCell(null, null, this); });
      if (o.onPick) this.canvas.addEventListener("click", (e) => { const c = this.at(e); if (c) o.onPick(c); });
      if (o.keys) this.keys();
    }
    // keyboard: Tab reaches the map, the arrow keys (Home, End) move its cell, onCell(cell, null) says which
    keys() {
      const o = this.o, cv = this.canvas;
      cv.tabIndex = 0;
      cv.setAttribute("role", "img");
      cv.setAttribute("aria-label", (o.title || o.name) + " · arrow keys: read a cell");
      this.cursor = null;
      cv.addEventListener("mousemove", (e) => { const c = this.at(e); if (c) this.cursor = c; });
      cv.addEventListener("focus", () => { this.cursor = this.cursor || {r: 0, c: 0}; o.onCell(this.cursor, null, this); });
      cv.addEventListener("blur", () => { this.tip.hidden = true; o.onCell(null, null, this); });
      cv.addEventListener("keydown", (e) => {
        const d = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[e.key];
        if (!d && e.key !== "Home" && e.key !== "End") return;
        e.preventDefault();
        const c = this.cursor || {r: 0, c: 0}, down = o.flip ? -1 : 1;       // a drawn row down: data row ∓ 1
        this.cursor = e.key === "Home" ? {r: c.r, c: 0} : e.key === "End" ? {r: c.r, c: o.cols - 1}
          : {r: clamp(c.r + down * d[0], 0, o.rows - 1), c: clamp(c.c + d[1], 0, o.cols - 1)};
        o.onCell(this.cursor, null, this);
      });
    }
    y(r) { return this.o.flip ? this.o.rows - 1 - r : r; }                // data row → drawn row
    at(e) {
      const c = Math.floor((e.offsetX - this.padL) / this.cw), y = Math.floor((e.offsetY - this.padT) / this.ch);
      if (c < 0 || y < 0 || c >= this.o.cols || y >= this.o.rows) return null;
      return {r: this.y(y), c};
    }
    paint(colour) {
      const {rows, cols} = this.o, off = document.createElement("canvas");
      off.width = cols;
      off.height = rows;
      const g = off.getContext("2d"), img = g.createImageData(cols, rows), px = img.data;
      for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) {
        const rgb = colour(r, c) || MASKED, p = 4 * (this.y(r) * cols + c);
        px[p] = rgb[0]; px[p + 1] = rgb[1]; px[p + 2] = rgb[2]; px[p + 3] = 255;
      }
      g.putImageData(img, 0, 0);
      this.image = off;
    }
    draw(sel) {
      const ctx = this.ctx, o = this.o, {cw, ch, padL, padT} = this;
      ctx.clearRect(0, 0, this.W, this.Hpx);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(this.image, padL, padT, o.cols * cw, o.rows * ch);
      ctx.font = this.font;
      ctx.fillStyle = "#333";
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      const every = Math.max(1, Math.ceil(12 / ch));
      for (let r = 0; r < o.rows; r += every) ctx.fillText(o.rowLabels[r], padL - 5, padT + (this.y(r) + 0.5) * ch);
      const side = (labels, y0, dir) => {
        for (let c = 0; c < o.cols; c++) {
          ctx.save();
          ctx.translate(padL + (c + 0.5) * cw, y0);
          ctx.rotate(-Math.PI / 4);
          ctx.textAlign = dir > 0 ? "right" : "left";
          ctx.fillStyle = sel && sel.c === c ? "#08306b" : "#333";
          ctx.fillText(shown(labels[c], 12), 0, 0);
          ctx.restore();
        }
      };
      if (this.cols && o.colLabels) side(o.colLabels, padT + o.rows * ch + 6, 1);
      if (o.colStep && o.colLabels) {
        ctx.textAlign = "center";
        ctx.textBaseline = "top";
        for (let c = 0; c < o.cols; c += o.colStep) ctx.fillText(o.colLabels[c], padL + (c + 0.5) * cw, padT + o.rows * ch + 4);
      }
      if (this.cols && o.topLabels) side(o.topLabels, padT - 5, -1);
      if (sel) {
        ctx.strokeStyle = "#d62728";
        ctx.lineWidth = 1.5;
        ctx.strokeRect(padL + sel.c * cw - 0.5, padT + this.y(sel.r) * ch - 0.5, cw + 1, ch + 1);
      }
    }
    // the tooltip beside the mouse (E), or beside CELL (the keyboard's)
    showTip(e, text, cell) {
      this.tip.textContent = text;
      this.tip.hidden = false;
      const x = e ? e.offsetX : this.padL + (cell.c + 1) * this.cw, y = e ? e.offsetY : this.padT + (this.y(cell.r) + 1) * this.ch;
      this.tip.style.left = (x + 14) + "px";
      this.tip.style.top = (y + 12) + "px";
    }
  }
  // a colour bar: LO … HI under a ramp, with a note
  function colourBar(colour, lo, hi, note) {
    const bar = el("canvas", "qkv-colourbar"), scale = el("div", "qkv-scale");
    const ctx = sizeCanvas(bar, 160, 10);
    for (let x = 0; x < 160; x++) { const c = colour(x / 159); ctx.fillStyle = `rgb(${c})`; ctx.fillRect(x, 0, 1, 10); }
    scale.append(el("span", null, lo), bar, el("span", null, hi + "   " + note));
    return scale;
  }


  // ── logit lens: rows 0..L × positions, P(final prediction) or its rank; a cell's top tokens ──
  function buildLens(v) {
    const lz = v.p.lens, panel = v.panels.lens, n = v.n;
    const spell = new Map(lz.spelling.ids.map((id, k) => [id, lz.spelling.tokens[k]]));
    const word = (id) => spell.has(id) ? spell.get(id) : "#" + id;
    const modes = el("div", "qkv-modes");
    modes.setAttribute("role", "group");
    modes.setAttribute("aria-label", "colour by");
    const buttons = {};
    for (const [m, label] of [["prob", "probability"], ["rank", "rank"]]) {
      const b = el("button", "qkv-mode", label);
      b.type = "button";
      b.dataset.mode = m;
      b.addEventListener("click", () => v.set({lensMode: m}));
      modes.append(b);
      buttons[m] = b;
    }
    // a tuned lens beside (lz.tuned: the same arrays, each row read through its translator): a logit/tuned switch
    let kind = "logit";
    const kinds = el("div", "qkv-modes"), kindButtons = {};
    kinds.setAttribute("role", "group");
    kinds.setAttribute("aria-label", "lens");
    for (const [m, label] of lz.tuned ? [["logit", "logit lens"], ["tuned", "tuned lens"]] : []) {
      const b = el("button", "qkv-mode", label);
      b.type = "button";
      b.dataset.lens = m;
      b.addEventListener("click", () => { kind = m; mode = null; v.set({}); });
      kinds.append(b);
      kindButtons[m] = b;
    }
    const cur = () => kind === "tuned" ? v.extra.lens.tuned : v.extra.lens;   // the shown lens's decoded arrays
    const rowLabels = [...Array(lz.rows).keys()].map(l => l === 0 ? "emb" : String(l));
    const heat = new Heat({name: "lens", rows: lz.rows, cols: n, width: 900, height: 420, flip: true,
                           rowLabels, colLabels: v.tokens, topLabels: lz.predicted.map(word),
                           title: "layer (row l: the residual stream after l blocks) × position; top: the final prediction",
                           onCell: (c, e) => {
                             if (c) heat.showTip(e, text(c, true));
                             const s = v.state.cell;
                             if (!c ? s : !s || s.i !== c.r || s.j !== c.c) v.set({cell: c && {i: c.r, j: c.c}});
                           },
                           onPick: (c) => v.set({pin: {i: c.r, j: c.c}})});
    const readout = el("p", "qkv-readout"), table = el("table", "qkv-cands"), head = el("tr"), body = el("tbody");
    for (const h of ["rank", "token", "", "P"]) head.append(el("th", null, h));
    const thead = el("thead");
    thead.append(head);
    table.append(thead, body);
    const scale = el("div", "qkv-lens-scale");
    panel.append(modes, ...(lz.tuned ? [kinds] : []), heat.box, scale, readout, table,
                 el("p", "qkv-note", "Row l reads the residual stream after l blocks through the final norm and W_vocab " +
                    `(emb: the embeddings; the top row is the model's own logits). Colour: the probability that row gives ` +
                    `the token the model finally predicts at that position, or its rank among all ${lz.vocab} tokens ` +
                    `(log scale, brightest = 1). Hover a cell for its top ${lz.k} tokens; click to keep it.` +
                    (lz.tuned ? " The tuned lens reads h + h·A_l + b_l instead of h (a translator per layer, trained " +
                                "to match the final distribution)." : "")));
    let mode = null;

    // the cell (row l, position j): its numbers, as the readout and the tooltip say them
    function text(c, short) {
      const X = cur(), k = c.r * v.n + c.c;
      const row = c.r === 0 ? "emb" : `layer ${c.r}`, pred = word(lz.predicted[c.c]);
      const p = fmtP(X.prob[k] / lz.prob.scale), rank = X.rank[k];
      if (short) return `${row} · “${shown(v.tokens[c.c], 16)}” → “${shown(pred, 16)}”: P ${p}, rank ${rank}`;
      return `${row} · position ${c.c} “${shown(v.tokens[c.c], 24)}” · final prediction “${shown(pred, 24)}”: ` +
             `P = ${p}, rank ${rank}`;
    }

    function draw() {
      const X = cur(), s = v.state, n = v.n;
      if (mode !== s.lensMode) {
        panel.dataset.lens = kind;
        for (const m in kindButtons) kindButtons[m].setAttribute("aria-pressed", String(m === kind));
        mode = s.lensMode;
        const logV = Math.log(lz.vocab);
        heat.paint(s.lensMode === "prob" ? (r, c) => viridis(X.prob[r * n + c] / lz.prob.scale)
                                         : (r, c) => viridis(1 - Math.log(X.rank[r * n + c]) / logV));
        scale.textContent = "";
        scale.append(s.lensMode === "prob" ? colourBar(viridis, "0", "1", "P(final prediction)")
                                           : colourBar(t => viridis(1 - t), "1", String(lz.vocab), "rank (log scale)"));
        for (const m in buttons) buttons[m].setAttribute("aria-pressed", String(m === s.lensMode));
      }
      const cell = s.cell && s.view === "lens" ? s.cell : s.pin || {i: lz.rows - 1, j: n - 1};
      heat.draw({r: cell.i, c: cell.j});
      readout.textContent = text({r: cell.i, c: cell.j}, false);
      body.textContent = "";
      const k0 = (cell.i * n + cell.j) * lz.k;
      for (let t = 0; t < lz.k; t++) {
        const id = X.topIds[k0 + t], p = X.topProb[k0 + t] / lz.top_prob.scale;
        const tr = el("tr", id === lz.predicted[cell.j] ? "qkv-chosen" : ""), bar = el("span", "qkv-pbar");
        const pc = el("td", "qkv-pcell");
        bar.style.width = (100 * p).toFixed(2) + "%";
        pc.append(bar);
        tr.append(el("td", "qkv-rank", String(t + 1)), el("td", "qkv-ctok", word(id)), pc, el("td", "qkv-p", fmtP(p)));
        Object.assign(tr.dataset, {id, p: String(p)});
        body.append(tr);
      }
    }
    return {draw};
  }

  // ── rollout: raw attention (mean of heads), rollout R_l and attention flow, side by side ──
  function buildRollout(v) {
    const ro = v.p.rollout, panel = v.panels.rollout, n = v.n, flow = !!v.extra.rollout.flow;
    const figs = el("div", "qkv-figs"), size = clamp(Math.floor(880 / (flow ? 3 : 2)), 160, 420);
    const make = (name) => {
      const h = new Heat({name, rows: n, cols: n, width: size - 60, height: size - 60, rowLabels: v.tokens,
                          colLabels: v.tokens, title: name,
                          onCell: (c, e) => {
                            if (c) h.showTip(e, text(c, true));
                            const s = v.state.cell;
                            if (!c ? s : !s || s.i !== c.r || s.j !== c.c) v.set({cell: c && {i: c.r, j: c.c}});
                          }});
      figs.append(h.box);
      return h;
    };
    const maps = {raw: make("raw"), rollout: make("rollout")};
    if (flow) maps.flow = make("flow");
    const readout = el("p", "qkv-readout", "hover a cell");
    panel.append(figs, readout, colourBar(viridis, "0", "1", "share (±0.002), brighter = more" +
                                          (v.causal ? " · grey: masked (key after query)" : "")),
                 el("p", "qkv-note", "Rows: positions, columns: input tokens. raw: the layer's attention, mean of its heads. " +
                    "rollout (Abnar & Zuidema 2020): Â = ½·mean_h A + ½·I, " + (v.sinkBytes
                      ? "not renormalised (attention sinks: the sinks' share of each row reaches no token), "
                      : "rows renormalised, ") + "multiplied through " +
                    "layers 0..l — how much each input token reaches each position. flow: the maximum flow " +
                    "through every layer's Â as capacities (after all layers). Choose the layer above."));
    if (!flow) panel.append(el("p", "qkv-note", ro.flow_note || "no attention flow in this payload"));
    let key = null, values = {};

    // raw / rollout / flow at the selected layer: bytes n×n (q = round(x·255))
    function layerValues() {
      const l = v.state.layer, n = v.n, nn = n * n, X = v.extra.rollout;
      const sum = new Float32Array(nn), raw = new Uint8Array(nn);
      for (let h = 0; h < v.H; h++) { const a = v.A(l, h); for (let p = 0; p < nn; p++) sum[p] += a[p]; }
      for (let p = 0; p < nn; p++) raw[p] = Math.round(sum[p] / v.H);
      const rows = v.p.rollout.rollout.shape[0], at = Math.min(v.p.layers[l], rows - 1);
      const out = {raw, rollout: X.R.subarray(at * nn, (at + 1) * nn), at};
      if (X.flow) out.flow = X.flow;
      return out;
    }

    function text(c, short) {
      const k = c.r * v.n + c.c, masked = v.masked(c.r, c.c);
      const parts = Object.keys(maps).map(m => `${m} ${masked ? "masked" : fmt(values[m][k])}`);
      if (short) return parts.join(" · ");
      return `position ${c.r} “${shown(v.tokens[c.r], 24)}” ← token ${c.c} “${shown(v.tokens[c.c], 24)}”: ` +
             parts.join(" · ");
    }

    function draw() {
      const s = v.state, L = v.p.rollout.rollout.shape[0];
      if (key !== s.layer) {
        key = s.layer;
        values = layerValues();
        const layer = v.p.layers[s.layer];
        const titles = {raw: `raw attention · layer ${layer}, mean of ${v.H} heads`,
                        rollout: `rollout · layers 0..${values.at}`, flow: `flow · all ${L} layers`};
        for (const m in maps) {
          const a = values[m];
          maps[m].title.textContent = titles[m];
          maps[m].paint((r, c) => v.masked(r, c) ? null : viridis(a[r * v.n + c] / 255));
        }
      }
      const sel = s.cell && !s.cell.t ? {r: s.cell.i, c: s.cell.j} : null;
      for (const m in maps) maps[m].draw(sel);
      readout.textContent = sel ? text(sel, false) : "hover a cell";
    }
    return {draw};
  }

  // ── patching: effect tables per (layer, head) and (layer, position), centred at 0 ──
  function buildPatch(v) {
    const P = v.p.patch, panel = v.panels.patch;
    const what = P.normalised ? "effect: 0 = corrupted, 1 = clean" : "m(patched) − m(corrupted)";
    const about = el("div", "qkv-patch-about");
    const line = (label, text) => { const p = el("p", "qkv-patch-line"); p.append(el("b", null, label), el("span", null, text)); about.append(p); };
    line("metric ", `${P.metric} · ${what}`);
    if (P.method) line("estimate ", `${P.method}: (a_clean − a_corrupted) · ∂m/∂a, from two forwards and one backward`);
    if (P.estimate) line("beside ", `each map's estimate by ${P.estimate.method}`);
    line("clean ", `“${P.clean}” → ${P.metric_clean.toFixed(3)}`);
    line("corrupted ", `“${P.corrupted}” → ${P.metric_corrupted.toFixed(3)}`);
    const figs = el("div", "qkv-figs");
    const titles = {heads: "heads (Z at every position)", residual: "residual stream", attn_out: "attention output",
                    ffn_out: "FFN output", cross: "cross-attention heads (Z)"};
    const maps = {}, readout = el("p", "qkv-readout", "hover a cell");
    // each table, and an estimate's beside it: its own map, named "heads-est", ...
    const tables = Object.assign({}, P.tables);
    const names = ["heads", "cross", "residual", "attn_out", "ffn_out"].filter(name => P.tables[name]).flatMap(name => {
      if (!P.estimate || !P.estimate.tables[name]) return [name];
      tables[name + "-est"] = P.estimate.tables[name];
      titles[name + "-est"] = `${titles[name]} · ${P.estimate.method}`;
      return [name, name + "-est"];
    });
    // one cell width for all maps, so that they fit side by side (each map also needs ~90px of labels)
    const columns = names.reduce((a, name) => a + tables[name][0].length, 0);
    const unit = clamp(Math.floor(((v.root.clientWidth || 1100) - 24 - 90 * names.length) / columns), 3, 24);
    for (const name of names) {
      const t = tables[name], base = name.replace("-est", "");
      const rows = t.length, cols = t[0].length, m = Math.max(0, ...t.map(r => Math.max(...r.map(Math.abs))));
      const h = new Heat({name, rows, cols, width: unit * cols, height: 300, flip: true,
                          rowLabels: [...Array(rows).keys()].map(String),
                          colLabels: base === "heads" || base === "cross" ? [...Array(cols).keys()].map(String) : P.labels,
                          title: `${titles[name]} · ±${m.toFixed(3)}`,
                          onCell: (c, e) => {
                            if (c) h.showTip(e, fmtE(t[c.r][c.c]));
                            const s = v.state.cell;
                            if (!c ? s && s.t === name : !s || s.t !== name || s.i !== c.r || s.j !== c.c)
                              v.set({cell: c && {i: c.r, j: c.c, t: name}});
                          }});
      h.paint((r, c) => diverging(t[r][c], m));
      figs.append(h.box);
      maps[name] = h;
    }
    panel.append(about, figs, readout,
                 colourBar(t => diverging(2 * t - 1, 1), "−max", "+max", "blue lowers the metric, red restores it; " +
                           "each map has its own symmetric scale"),
                 el("p", "qkv-note", (P.method ? "Each cell estimates, to first order, " : "Each cell: ") +
                    "the corrupted run with that one activation copied from the clean run " +
                    "(a head's Z at every position; a position of the residual stream entering the layer, of its " +
                    "attention output or of its FFN output), and how much of the metric comes back."));

    function draw() {
      const s = v.state;
      for (const name in maps) maps[name].draw(s.cell && s.cell.t === name ? {r: s.cell.i, c: s.cell.j} : null);
      if (!s.cell || !s.cell.t) { readout.textContent = "hover a cell"; return; }
      const {i, j, t} = s.cell, value = tables[t][i][j], base = t.replace("-est", "");
      const where = base === "heads" || base === "cross" ? `head ${j}` : `position ${j} “${shown(P.labels[j], 24)}”`;
      const other = t !== base ? ` (exact ${fmtE(tables[base][i][j])})` : tables[t + "-est"] ? ` (estimate ${fmtE(tables[t + "-est"][i][j])})` : "";
      readout.textContent = `${titles[t]} · layer ${i} · ${where}: ${fmtE(value)}${other}`;
    }
    return {draw};
  }

  // a legend: a ramp with the numbers of its ends and middle under it (TICKS: three strings), then a note
  // beside it (under it when STACKED)
  function legend(colour, ticks, note, stacked) {
    const scale = el("div", "qkv-scale qkv-legend" + (stacked ? " qkv-legend-stacked" : ""));
    const box = el("div", "qkv-legend-box"), nums = el("div", "qkv-legend-ticks");
    const bar = el("canvas", "qkv-colourbar"), ctx = sizeCanvas(bar, 180, 10);
    for (let x = 0; x < 180; x++) { const c = colour(x / 179); ctx.fillStyle = `rgb(${c})`; ctx.fillRect(x, 0, 1, 10); }
    for (const t of ticks) nums.append(el("span", null, t));
    box.append(bar, nums);
    scale.append(box, el("span", "qkv-legend-note", note));
    return scale;
  }
  // a number with its sign and D decimals, never a misleading 0 (fmtE, in general)
  function signed(v, d) {
    const sign = v > 0 ? "+" : v < 0 ? "−" : "", small = 0.5 * 10 ** -d;
    return sign + (v !== 0 && Math.abs(v) < small ? "<" + (2 * small).toFixed(d) : Math.abs(v).toFixed(d));
  }
  // a section's header: lines of "key value", the value as text
  function about(lines) {
    const box = el("div", "qkv-about");
    for (const [key, value] of lines) {
      const p = el("p", "qkv-about-line");
      p.append(el("span", "qkv-about-key", key), el("span", null, value));
      box.append(p);
    }
    return box;
  }

  // ── the router (mixtures of experts): which experts each token went to, with their weights ──
  // One table per MoE layer (the Layer selector's): a row per token, a column per expert shaded by the
  // router's probability p; the k chosen cells carry the weight their output is summed with.
  function buildRouter(v) {
    const R = v.p.router, panel = v.panels.router, probs = v.extra.router.probs, E = R.experts, n = R.positions;
    const note = el("p", "qkv-note");
    const readout = el("p", "qkv-readout", "hover a cell");
    const wrap = el("div", "qkv-router-wrap");
    panel.append(note, wrap, readout,
                 el("p", "qkv-note", `Each token goes to the ${R.k} experts its router ranks highest (p = softmax of ` +
                    "x·W_router over the experts, shaded); the chosen cells show the weight that expert's output " +
                    "gets in the FFN's sum. The choice is the model's own, token by token."));
    let shownLayer = null;

    function table(li) {
      const t = el("table", "qkv-router-table");
      const head = el("tr");
      head.append(el("th", null, "token"), el("th", null, "experts → weights"));
      for (let e = 0; e < E; e++) head.append(el("th", "qkv-router-e", String(e)));
      t.append(head);
      for (let i = 0; i < n; i++) {
        const row = el("tr"), chosen = R.chosen[li][i], weights = R.weights[li][i];
        row.append(el("td", "qkv-router-tok", shown(v.tokens[i], 16)),
                   el("td", "qkv-router-list", chosen.map((e, j) => `${e}: ${weights[j].toFixed(2)}`).join(" · ")));
        for (let e = 0; e < E; e++) {
          const q = probs[(li * n + i) * E + e], j = chosen.indexOf(e);
          const cell = el("td", j >= 0 ? "qkv-router-cell qkv-router-chosen" : "qkv-router-cell",
                          j >= 0 ? weights[j].toFixed(2) : "");
          cell.style.background = `rgba(9, 105, 218, ${(q / 255).toFixed(3)})`;
          if (q > 150) cell.style.color = "#fff";
          cell.dataset.token = i; cell.dataset.expert = e;
          cell.addEventListener("mouseenter", () => {
            readout.textContent = `“${shown(v.tokens[i], 24)}” (position ${i}) · expert ${e}: p ${fmt(q)}` +
              (j >= 0 ? ` · chosen (#${j + 1}), weight ${weights[j].toFixed(4)}` : " · not chosen");
          });
          row.append(cell);
        }
        t.append(row);
      }
      return t;
    }

    function draw() {
      const layer = v.p.layers[v.state.layer], li = R.layers.indexOf(layer);
      if (layer === shownLayer) return;
      shownLayer = layer;
      wrap.replaceChildren();
      readout.textContent = "hover a cell";
      if (li < 0) {
        note.textContent = `layer ${layer} has a dense FFN: no router. The routed layers: ${R.layers.join(", ")}.`;
        return;
      }
      note.textContent = `layer ${layer} · ${E} experts, ${R.k} per token`;
      wrap.append(table(li));
    }
    return {draw};
  }

  // ── registration: one renderer per panel (qkv/viz/panels.py names them) ──
  QKV.panels.lens = {
    build: buildLens,
    decode: async function decodeLens(lz) {
      const X = {prob: await decode(lz.prob), rank: await decode(lz.rank),
                 topIds: await decode(lz.top_ids), topProb: await decode(lz.top_prob)};
      if (lz.tuned) X.tuned = await decodeLens(lz.tuned);                       // the tuned lens's cells
      return X;
    },
    meta: (v) => [`logit lens: ${v.p.lens.rows} rows × ${v.n} positions`],
  };
  QKV.panels.rollout = {
    build: buildRollout,
    decode: async (ro) => ({R: await decode(ro.rollout), flow: ro.flow ? await decode(ro.flow) : null}),
    meta: (v) => [`layer ${v.p.layers[v.state.layer]}`, "mean of heads"],
  };
  QKV.panels.patch = {
    build: buildPatch,
    meta: (v) => ["activation patching: " + v.p.patch.metric],
  };
  QKV.panels.router = {
    build: buildRouter,
    decode: async (r) => ({probs: await decode(r.probs)}),
    meta: (v) => [`layer ${v.p.layers[v.state.layer]}`, "the router's choice"],
  };

  // the drawing helpers, for the panels of viewer_causes.js (loaded after this file)
  QKV.draw = {Heat, ramp, legend, signed, about, colourBar, RDBU, diverging, viridis};
})(window);
