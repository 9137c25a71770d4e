/* qkv pipeline page: attention drawn as its diagram, Q × Kᵀ = S → softmax → A, A × V = Z, every array a small
 * heatmap of the engine's own numbers, and the arithmetic of any cell of S, A or Z worked out beside it.
 *
 *   QKV_PIPELINE_DIAGRAM.draw(out, view, which, matrix) → element   draw into OUT for the Pipeline VIEW
 *       (pipeline.js) its chosen layer, head and token; WHICH: "self" or "cross" (an encoder–decoder's decoder);
 *       MATRIX: the cell first worked out, "S", "A" or "Z"
 *   QKV_PIPELINE_DIAGRAM.decode(enc) → Promise<arith>   the payload's "arithmetic" (pipeline_payload.py) decoded
 *
 * options.onLayer(layer) (qkv serve): a layer whose arrays the payload lacks gets a button that asks for them.
 * Hover a cell, or focus a matrix and move with the arrow keys (Home/End: first/last column): the panel below
 * shows, for S[i, j], the d_k products q_i[d]·k_j[d], their sum, × the scale (soft-cap, + position bias where the
 * model has them); for A[i, j], exp(S[i, j'] − max) of the row, its sum and the division; for Z[i, c], the
 * products A[i, j]·v_j[c] and their sum — each recomputed here in float64 from the engine's float32 q, k, v, S,
 * A and set beside the engine's own value. The products light up one after another with the running sum (not
 * with prefers-reduced-motion). The panel's dataset {matrix, i, j, result, engine} and each product's data-term
 * are for tests and scripts.
 */
(function (global) {
  "use strict";

  // the page's own helpers (pipeline.js, loaded after this file: read when drawing)
  const el = (tag, cls, text) => global.QKV_PIPELINE.util.el(tag, cls, text);
  const viridis = (t) => global.QKV_PIPELINE.util.viridisRGB(t);
  const fix = (x, d = 4) => (x === -Infinity ? "−∞" : Number.isFinite(x) ? x.toFixed(d) : String(x));
  const sci = (x) => (x === 0 ? "0" : Math.abs(x) >= 1e-3 && Math.abs(x) < 1e4 ? x.toFixed(5) : x.toExponential(4));
  const MAX_TERMS = 256;          // terms drawn one by one; past it the largest 64 and the rest as one sum
  const SHOWN_TERMS = 64;

  async function decode(enc) {
    if (!enc) return null;
    const out = {layers: enc.layers};
    for (const k of ["q", "k", "v", "z", "scores", "weights", "bias", "sinks"]) {
      out[k] = enc[k] ? {shape: enc[k].shape, data: await QKV_WIRE.decode(enc[k])} : null;
    }
    return out;
  }

  // colours as [r, g, b]: signed arrays blue–white–red by |x| / max |x|; weights and scores by viridis (pipeline.js's)
  function diverging(t) {
    const a = Math.min(1, Math.abs(t)), w = Math.round(255 * (1 - a));
    return t >= 0 ? [255, w, w] : [w, w, 255];
  }
  const MASKED = [234, 238, 242];

  // one array of the diagram: rows × cols values at(r, c), drawn once; outline(rects) redraws it with boxes
  class Grid {
    constructor(name, shape, rows, cols, at, kind, aria) {
      Object.assign(this, {name, rows, cols, at, kind});
      this.cw = Math.max(2, Math.min(16, Math.floor(208 / cols)));
      this.ch = Math.max(2, Math.min(16, Math.floor(208 / rows)));
      const c = this.canvas = el("canvas", "qkv-p-grid");
      c.width = cols * this.cw + 2;
      c.height = rows * this.ch + 2;
      c.dataset.matrix = name;
      c.setAttribute("role", "img");
      c.setAttribute("aria-label", aria);
      let lo = Infinity, hi = -Infinity, big = 0;
      for (let r = 0; r < rows; r++) for (let k = 0; k < cols; k++) {
        const v = at(r, k);
        if (!Number.isFinite(v)) continue;
        lo = Math.min(lo, v); hi = Math.max(hi, v); big = Math.max(big, Math.abs(v));
      }
      // the pixels written directly (one ImageData, not a fillRect a cell: 128 tokens are 64k cells)
      const ctx = c.getContext("2d"), img = ctx.createImageData(c.width, c.height), px = img.data, W = c.width;
      px.fill(255);
      const values = new Array(rows * cols);
      for (let r = 0; r < rows; r++) for (let k = 0; k < cols; k++) {
        const v = at(r, k);
        values[r * cols + k] = Number.isFinite(v) ? v : null;
        const rgb = !Number.isFinite(v) ? MASKED : kind === "signed" ? diverging(big ? v / big : 0)
          : viridis(kind === "weights" ? (hi > 0 ? v / hi : 0) : (hi > lo ? (v - lo) / (hi - lo) : 0.5));
        for (let y = 1 + r * this.ch; y < 1 + (r + 1) * this.ch; y++) {
          for (let x = 1 + k * this.cw, o = (y * W + x) * 4; x < 1 + (k + 1) * this.cw; x++, o += 4) {
            px[o] = rgb[0]; px[o + 1] = rgb[1]; px[o + 2] = rgb[2];
          }
        }
      }
      ctx.putImageData(img, 0, 0);
      this.base = img;
      c.qkvData = {label: name, rows, cols, values};                    // export.js: the numbers behind it
      const box = el("figure", "qkv-p-fig");
      box.append(c, el("figcaption", null, `${name} ${shape}`));
      this.node = box;
    }
    cellAt(ev) {
      const r = this.canvas.getBoundingClientRect();
      const x = (ev.clientX - r.left) * this.canvas.width / r.width - 1, y = (ev.clientY - r.top) * this.canvas.height / r.height - 1;
      const i = Math.floor(y / this.ch), j = Math.floor(x / this.cw);
      return i >= 0 && j >= 0 && i < this.rows && j < this.cols ? [i, j] : null;
    }
    // rects: [{r0, c0, r1, c1, color}] in cells, ends exclusive
    outline(rects) {
      const ctx = this.canvas.getContext("2d");
      ctx.putImageData(this.base, 0, 0);
      for (const q of rects) {
        ctx.strokeStyle = q.color || "#cf222e";
        ctx.lineWidth = 2;
        ctx.strokeRect(q.c0 * this.cw + 1, q.r0 * this.ch + 1, (q.c1 - q.c0) * this.cw, (q.r1 - q.r0) * this.ch);
      }
    }
  }

  function draw(out, view, which, matrix) {
    const p = view.p, s = view.s, a = p.arch, t = (k, v) => view.t(k, v);
    const cross = which === "cross";
    const ar = cross ? view.d.cross.arith : view.d.arith;
    const box = el("section", "qkv-p-diagram");
    box.append(el("h4", "qkv-p-diagram-title", t("p_ar_title")));
    out.append(box);
    const li = ar ? ar.layers.indexOf(s.layer) : -1;
    if (li < 0) {
      const held = ar ? ar.layers : [];
      const span = held.length ? `${held[0]}–${held[held.length - 1]}` : "—";
      box.append(el("p", "qkv-p-ar-missing", t("p_ar_missing", {layers: span, layer: s.layer})));
      if (view.options.onLayer) {                    // qkv serve: ask the engine for this layer's
        const get = el("button", "qkv-p-ar-load", t("p_ar_load", {layer: s.layer}));
        get.type = "button";
        get.addEventListener("click", () => { get.disabled = true; view.options.onLayer(s.layer); });
        box.append(get);
      }
      return box;
    }
    const [, H, n, dk] = ar.q.shape, [, Hkv, m] = ar.k.shape, G = H / Hkv;
    const h = s.head, kv = Math.floor(h / G);
    const keys = cross ? p.cross.source_labels : p.labels, queries = p.labels;
    const scale = a.scale !== null && a.scale !== undefined ? a.scale : 1 / Math.sqrt(dk);
    const cap = cross ? null : a.attn_softcap;
    const qOf = (i) => ar.q.data.subarray(((li * H + h) * n + i) * dk, ((li * H + h) * n + i + 1) * dk);
    const kOf = (j) => ar.k.data.subarray(((li * Hkv + kv) * m + j) * dk, ((li * Hkv + kv) * m + j + 1) * dk);
    const vOf = (j) => ar.v.data.subarray(((li * Hkv + kv) * m + j) * dk, ((li * Hkv + kv) * m + j + 1) * dk);
    const zOf = (i) => ar.z.data.subarray(((li * H + h) * n + i) * dk, ((li * H + h) * n + i + 1) * dk);
    const nm = (arr, i, j) => arr.data[((li * H + h) * n + i) * m + j];
    const S = (i, j) => nm(ar.scores, i, j), A = (i, j) => nm(ar.weights, i, j);
    box.append(el("p", "qkv-p-note", t("p_ar_hint", {head: h, kv})));

    const grids = {
      Q: new Grid("Q", `(n, d_k) = (${n}, ${dk})`, n, dk, (i, d) => qOf(i)[d], "signed", "Q"),
      K: new Grid("Kᵀ", `(d_k, m) = (${dk}, ${m})`, dk, m, (d, j) => kOf(j)[d], "signed", "K transposed"),
      S: new Grid("S", `(n, m) = (${n}, ${m})`, n, m, S, "scores", "S"),
      A: new Grid("A", `(n, m) = (${n}, ${m})`, n, m, A, "weights", "A"),
      V: new Grid("V", `(m, d_k) = (${m}, ${dk})`, m, dk, (j, c) => vOf(j)[c], "signed", "V"),
      Z: new Grid("Z", `(n, d_k) = (${n}, ${dk})`, n, dk, (i, c) => zOf(i)[c], "signed", "Z"),
    };
    const op = (text) => el("span", "qkv-p-op", text);
    const scores = el("div", "qkv-p-dflow"), mix = el("div", "qkv-p-dflow");      // two rows: S and A, then Z
    scores.append(grids.Q.node, op("×"), grids.K.node, op(`× ${fix(scale, 4)} =`), grids.S.node, op("softmax →"), grids.A.node);
    mix.append(op("A ×"), grids.V.node, op("="), grids.Z.node);
    box.append(scores, mix);
    const panel = el("div", "qkv-p-arith");
    panel.setAttribute("aria-live", "polite");
    box.append(panel);

    // the cell worked out: kept across renders while the box's matrix, the layer, the head and the token stay
    const keep = view.cell && view.cell.which === which && view.cell.layer === s.layer && view.cell.head === h &&
      view.cell.m === matrix ? view.cell : null;
    let argmax = 0;
    for (let j = 1; j < m; j++) if (A(s.token, j) > A(s.token, argmax)) argmax = j;
    let cell = keep && keep.i === s.token ? {m: keep.m, i: keep.i, j: keep.j}
      : {m: matrix, i: s.token, j: matrix === "Z" ? 0 : argmax};
    let timer = null;
    const reduced = global.matchMedia && global.matchMedia("(prefers-reduced-motion: reduce)").matches;

    // terms: [{text, value}] lit one by one with the running sum in RUNNING
    function animate(chips, values, running, label) {
      if (timer) clearInterval(timer);
      if (reduced || !chips.length) { running.textContent = ""; return; }
      let k = 0, sum = 0;
      const step = Math.max(8, Math.min(60, 1500 / chips.length));
      timer = setInterval(() => {
        if (k > 0) chips[k - 1].classList.remove("qkv-p-now");
        if (k >= chips.length) { clearInterval(timer); timer = null; running.textContent = ""; return; }
        chips[k].classList.add("qkv-p-lit", "qkv-p-now");
        sum += values[k];
        running.textContent = `${label} ${k + 1}/${chips.length}: ${sci(sum)}`;
        k += 1;
      }, step);
    }
    // the products of a sum as chips (all of them up to MAX_TERMS, else the largest and the rest as one)
    function terms(list) {
      const wrap = el("div", "qkv-p-terms");
      let shown = list.map((x, k) => [x, k]);
      let rest = null;
      if (list.length > MAX_TERMS) {
        shown = shown.slice().sort((u, v) => Math.abs(v[0].value) - Math.abs(u[0].value) || u[1] - v[1]).slice(0, SHOWN_TERMS)
          .sort((u, v) => u[1] - v[1]);
        const used = new Set(shown.map(([, k]) => k));
        let r = 0;
        list.forEach((x, k) => { if (!used.has(k)) r += x.value; });
        rest = {text: t("p_ar_rest", {k: list.length - SHOWN_TERMS}) + ` = ${sci(r)}`, value: r};
      }
      const chips = [], values = [];
      for (const [x] of shown) {
        const c = el("span", "qkv-p-term" + (x.off ? " qkv-p-off" : ""), x.text);
        c.dataset.term = String(x.value);
        wrap.append(c); chips.push(c); values.push(x.value);
      }
      if (rest) {
        const c = el("span", "qkv-p-term qkv-p-rest", rest.text);
        c.dataset.term = String(rest.value);
        wrap.append(c); chips.push(c); values.push(rest.value);
      }
      return {wrap, chips, values};
    }
    const line = (text, cls) => panel.append(el("p", "qkv-p-ar-line " + (cls || ""), text));
    function result(name, value, engine) {
      const r = el("p", "qkv-p-ar-result");
      r.append(el("strong", null, `${name} = ${sci(value)}`),
               el("span", "qkv-p-ar-engine", `  ·  ${t("p_ar_engine")}: ${sci(engine)}  (|Δ| ${Math.abs(value - engine).toExponential(1)})`));
      panel.append(r);
      Object.assign(panel.dataset, {result: String(value), engine: String(engine)});
    }

    function show() {
      const {i, j} = cell;
      view.cell = {which, layer: s.layer, head: h, m: cell.m, i, j};
      panel.textContent = "";
      Object.assign(panel.dataset, {matrix: cell.m, i, j});
      const running = el("p", "qkv-p-running");
      const qi = `“${queries[i]}”`, kj = `“${keys[Math.min(j, m - 1)]}”`;
      if (cell.m === "S") {
        const q = qOf(i), k = kOf(j);
        panel.append(el("p", "qkv-p-ar-head", t("p_ar_S", {i, j, q: qi, k: kj, d: dk, scale: fix(scale, 5), head: h, kv})));
        const list = [];
        let dot = 0;
        for (let d = 0; d < dk; d++) {
          const x = q[d] * k[d];
          dot += x;
          list.push({text: `${fix(q[d], 3)}×${fix(k[d], 3)}`, value: x});
        }
        const {wrap, chips, values} = terms(list);
        panel.append(wrap, running);
        let v = dot * scale;
        line(`Σ = ${sci(dot)}   × ${fix(scale, 5)} = ${sci(v)}`);
        if (cap) { v = cap * Math.tanh(v / cap); line(t("p_ar_cap", {c: cap}) + ` = ${sci(v)}`); }
        const engine = S(i, j);
        if (ar.bias) {
          const b = ar.bias.data[((li * H + h) * n + i) * m + j];
          v += b;
          line(t(a.alibi ? "p_ar_alibi" : "p_ar_bias") + ` ${sci(b)} = ${sci(v)}`);
        }
        if (engine === -Infinity) {
          line(t("p_ar_masked", {i, j}), "qkv-p-ar-masked");
          v = -Infinity;
        }
        result(`S[${i}, ${j}]`, v, engine);
        grids.Q.outline([{r0: i, c0: 0, r1: i + 1, c1: dk}]);
        grids.K.outline([{r0: 0, c0: j, r1: dk, c1: j + 1}]);
        grids.S.outline([{r0: i, c0: j, r1: i + 1, c1: j + 1}]);
        grids.A.outline([]); grids.V.outline([]); grids.Z.outline([]);
        animate(chips, values, running, "Σ");
      } else if (cell.m === "A") {
        let max = -Infinity;
        for (let jj = 0; jj < m; jj++) max = Math.max(max, S(i, jj));
        const sink = ar.sinks ? ar.sinks.data[li * H + h] : null;      // gpt-oss: the sink's logit, in the sum only
        if (sink !== null) max = Math.max(max, sink);
        panel.append(el("p", "qkv-p-ar-head", t("p_ar_A", {i, j, q: qi, k: kj})));
        const list = [];
        let sum = 0;
        const e = new Float64Array(m);
        for (let jj = 0; jj < m; jj++) {
          const x = S(i, jj);
          e[jj] = x === -Infinity ? 0 : Math.exp(x - max);
          sum += e[jj];
          list.push({text: `${jj}: exp(${fix(x, 3)} − ${fix(max, 3)}) = ${sci(e[jj])}`, value: e[jj], off: x === -Infinity});
        }
        if (sink !== null) {                                            // one more term of the sum, with no value
          const x = Math.exp(sink - max);
          sum += x;
          list.push({text: `sink: exp(${fix(sink, 3)} − ${fix(max, 3)}) = ${sci(x)}`, value: x});
        }
        const {wrap, chips, values} = terms(list);
        panel.append(wrap, running);
        line(t("p_ar_max", {max: fix(max, 4)}) + `   Σ exp = ${sci(sum)}`);
        const v = sum > 0 ? e[j] / sum : 0;
        line(`A[${i}, ${j}] = ${sci(e[j])} / ${sci(sum)}`);
        result(`A[${i}, ${j}]`, v, A(i, j));
        grids.S.outline([{r0: i, c0: 0, r1: i + 1, c1: m}]);
        grids.A.outline([{r0: i, c0: j, r1: i + 1, c1: j + 1}]);
        grids.Q.outline([]); grids.K.outline([]); grids.V.outline([]); grids.Z.outline([]);
        animate(chips, values, running, "Σ exp");
      } else {
        const c = j;
        panel.append(el("p", "qkv-p-ar-head", t("p_ar_Z", {i, c, q: qi, m, head: h, kv})));
        const list = [];
        let sum = 0;
        for (let jj = 0; jj < m; jj++) {
          const x = A(i, jj) * vOf(jj)[c];
          sum += x;
          list.push({text: `${fix(A(i, jj), 3)}×${fix(vOf(jj)[c], 3)}`, value: x, off: A(i, jj) === 0});
        }
        const {wrap, chips, values} = terms(list);
        panel.append(wrap, running);
        result(`Z[${i}, ${c}]`, sum, zOf(i)[c]);
        grids.A.outline([{r0: i, c0: 0, r1: i + 1, c1: m}]);
        grids.V.outline([{r0: 0, c0: c, r1: m, c1: c + 1}]);
        grids.Z.outline([{r0: i, c0: c, r1: i + 1, c1: c + 1}]);
        grids.Q.outline([]); grids.K.outline([]); grids.S.outline([]);
        animate(chips, values, running, "Σ");
      }
      const again = el("button", "qkv-p-replay", "↻ " + t("p_ar_replay"));
      again.type = "button";
      again.dataset.qkvExport = "skip";
      again.addEventListener("click", () => show());
      panel.append(again);
    }

    // S, A and Z answer the pointer and the keyboard; Q, Kᵀ and V show what the cell reads
    for (const name of ["S", "A", "Z"]) {
      const g = grids[name], c = g.canvas;
      c.tabIndex = 0;
      c.setAttribute("aria-label", t("p_ar_aria", {matrix: name}));
      c.addEventListener("mousemove", (ev) => {
        const at = g.cellAt(ev);
        if (!at || (cell.m === name && cell.i === at[0] && cell.j === at[1])) return;
        cell = {m: name, i: at[0], j: at[1]};
        show();
      });
      c.addEventListener("click", (ev) => { const at = g.cellAt(ev); if (at) { cell = {m: name, i: at[0], j: at[1]}; show(); } });
      c.addEventListener("focus", () => { if (cell.m !== name) { cell = {m: name, i: cell.i, j: Math.min(cell.j, g.cols - 1)}; show(); } });
      c.addEventListener("keydown", (ev) => {
        const moves = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]};
        let {i, j} = cell;
        if (ev.key in moves) { i += moves[ev.key][0]; j += moves[ev.key][1]; }
        else if (ev.key === "Home") j = 0;
        else if (ev.key === "End") j = g.cols - 1;
        else return;
        ev.preventDefault();
        cell = {m: name, i: Math.max(0, Math.min(g.rows - 1, i)), j: Math.max(0, Math.min(g.cols - 1, j))};
        show();
      });
    }
    show();
    return box;
  }

  global.QKV_PIPELINE_DIAGRAM = {draw, decode};
})(window);
