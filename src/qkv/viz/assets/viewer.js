/* qkv attention viewer: head, matrix and model views of one trace, drawn on canvas.
 *
 * Input: the JSON payload of qkv/viz/payload.py (tokens + attention as one byte per weight, a wire
 * array that wire.js, loaded first, decodes; for a generation, each generated token's candidates:
 * the next-token view and its temperature slider, drawn by viewer_next.js, which registers QKV.views.next).
 * Attention is n_q × n_k: rows = queries ("tokens"), columns = keys ("key_tokens", or the same
 * tokens in self-attention). An encoder–decoder's payload holds one such payload per kind of
 * attention ("kinds": encoder, decoder, cross); a selector switches between them, and every view
 * (head, matrix, model) draws the kind selected. The cross kind's rows are labelled by the token
 * each row wrote ("labels"), with the token it read beside them ("read_labels").
 * Colours follow qkv/viz/palette.py: brighter = more attention (viridis, as the figures), cells
 * the causal mask removed grey, roles as "role_colours".
 * Tokens reach the page only through textContent, attributes and canvas fillText:
 * never parsed as HTML. No network: everything is in wire.js, this file, viewer_next.js, viewer_panels.js,
 * viewer_causes.js, viewer_features.js and the payload.
 *
 *   QKV.mount(root, payload, state?) → Promise<Viewer>   draw a payload into an element
 *   QKV.boot()   mount every [data-qkv-root] on the JSON script element that follows it
 *
 * Every root keeps its own state and DOM (no ids), so several viewers share a page.
 * The root's data-* attributes (view, layer, head, hover, cell, ready; with a next-token view
 * also temperature and step; with kinds, kind; with a lens, lensMode) say what is shown.
 *
 * Panels add views beyond attention weights: the payload's "panels" lists them, in tab order, as
 * qkv/viz/panels.py declares them ({id, title, renderer, layer}; this file keeps no list of its own), and
 * each one present holds its section under its id: "lens" (the logit lens), "rollout" (raw attention,
 * rollout and flow), "patch" (activation patching), "attribute" (input attribution), "causal_trace"
 * (causal tracing), "features" (an SAE's latents on each token), "router" (mixtures of experts); "view"
 * opens one first. Their renderers live in the assets panels.py names (viewer_panels.js, viewer_causes.js,
 * viewer_features.js), loaded after this file: they register QKV.panels[renderer] = {decode?, meta, build}
 * and use the helpers this file shares as QKV.util (the interface is described at the top of
 * viewer_panels.js). A payload with a section whose renderer is not registered fails with a clear message.
 *
 * An image model's payload ("image": a ViT's tokens are [CLS] and the image's patches) adds, above the
 * views, the image with the attention of one query token (default [CLS]; root data-query) for the layer and
 * head shown laid over it, its predicted labels, and a strip of the patches as tiles: clicking a patch on
 * the image or a tile selects that query. The overlay canvas carries its cells' bytes in data-values.
 */
(function (global) {
  "use strict";

  // ── colours ────────────────────────────────────────────────────────────────
  const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                        "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#3949ab", "#ad494a"];
  // spares for role names palette.py does not know (its ROLE_COLOURS come in the payload)
  const SPARE_ROLE_COLOURS = ["#e6550d", "#31a354", "#756bb1", "#c51b8a", "#3182bd", "#8c6d31",
                              "#d6616b", "#636363"];
  // matplotlib "viridis" at 17 evenly spaced points (palette.CMAP): dark violet (0) → bright yellow (1)
  const VIRIDIS = [[68, 1, 84], [72, 24, 106], [71, 45, 123], [66, 64, 134], [59, 82, 139], [51, 99, 141],
                   [44, 114, 142], [38, 130, 142], [33, 145, 140], [31, 160, 136], [40, 174, 128],
                   [63, 188, 115], [94, 201, 98], [132, 212, 75], [173, 220, 48], [216, 226, 25], [253, 231, 37]];
  const MASKED = [212, 212, 212];                                 // palette.MASKED, #d4d4d4
  const LUT = (function () {                                      // q = 0..255 → rgb; q = 256 (masked) → grey
    const lut = new Uint8Array(257 * 3);
    for (let q = 0; q < 256; q++) {
      const x = q / 255 * (VIRIDIS.length - 1), k = Math.min(Math.floor(x), VIRIDIS.length - 2), t = x - k;
      for (let c = 0; c < 3; c++) lut[q * 3 + c] = Math.round(VIRIDIS[k][c] * (1 - t) + VIRIDIS[k + 1][c] * t);
    }
    lut.set(MASKED, 256 * 3);
    return lut;
  })();
  const MASK = 256;                                              // a cell value meaning "masked"
  const HEAD_PIXELS = 1.5e6;   // the head view's canvas at most: its long lines are rasterised without a GPU

  function headColour(h, H) {
    return H <= HEAD_COLOURS.length ? HEAD_COLOURS[h] : `hsl(${Math.round(h * 137.508) % 360},62%,44%)`;
  }

  // ── small helpers ──────────────────────────────────────────────────────────
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;           // text, never HTML
    return e;
  }
  const clamp = (x, lo, hi) => Math.max(lo, Math.min(hi, x));
  // Tokens as shown: visible stand-ins for whitespace-only tokens, capped length.
  function shown(tok, max) {
    let s = tok.replace(/\n/g, "↵").replace(/\t/g, "⇥");
    if (s.trim() === "") s = s.length ? "␣".repeat(Math.min(s.length, 3)) : "∅";
    return max && s.length > max ? s.slice(0, max - 1) + "…" : s;
  }
  // A weight as text, honest about the one-byte precision (±0.002).
  function fmt(q) {
    if (q === 0) return "0.00";
    const v = q / 255;
    return v < 0.01 ? "<0.01" : v.toFixed(2);
  }
  // A probability as text: 4 decimals, never a misleading 0 for a tiny non-zero value.
  function fmtP(p) { return p >= 0.00005 ? p.toFixed(4) : p > 0 ? "<0.0001" : "0"; }
  // A canvas of w × h CSS pixels, its backing store at least twice as fine (sharp on any screen and in an
  // exported PNG: export.js draws panels at 2×), at most 4 M pixels (a long head view's lines, rasterised
  // without a GPU, took 4 s to paint at 12 M) and 32000 a side.
  function sizeCanvas(canvas, w, h, most = 4e6) {
    const ratio = Math.min(Math.max(global.devicePixelRatio || 1, 2), 32000 / Math.max(w, h), Math.sqrt(most / Math.max(1, w * h)));
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(h * ratio);
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return ctx;
  }
  // w×h values 0..255 or MASK (row-major) → a w×h canvas coloured by the LUT, to be drawn scaled.
  function heatmapImage(bytes, w, h, gamma) {
    const off = document.createElement("canvas");
    off.width = w;
    off.height = h;
    const ctx = off.getContext("2d");
    const img = ctx.createImageData(w, h), px = img.data;
    for (let p = 0; p < w * h; p++) {
      const q = bytes[p] === MASK ? MASK : gamma ? gamma[bytes[p]] : bytes[p];
      px[4 * p] = LUT[3 * q]; px[4 * p + 1] = LUT[3 * q + 1]; px[4 * p + 2] = LUT[3 * q + 2]; px[4 * p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    return off;
  }

  // ── the viewer ─────────────────────────────────────────────────────────────
  const PANELS = {};                 // the panels' renderers by name: viewer_panels.js and the others register them
  const VIEWS = {};                  // views that are not panels, by name: viewer_next.js registers "next"
  const KIND_WHAT = {encoder: "encoder self-attention", decoder: "decoder self-attention", cross: "cross-attention"};

  class Viewer {
    // bytes: the decoded attention of the payload, or of each of its "kinds" (an encoder–decoder)
    // extra: the decoded arrays of the optional sections ({lens: {...}, rollout: {...}})
    constructor(root, payload, bytes, state, extra) {
      this.root = root;
      this.extra = extra || {};
      this.top = payload;
      this.kinds = payload.kinds || null;
      this.allBytes = bytes;
      const s = state || {}, want = s.kind || payload.kind;
      this.load(this.kinds ? Math.max(0, this.kinds.findIndex(p => p.kind === want)) : -1, s);
      this.build();
    }

    // what the views draw: the payload itself, or its kind k (the top's fields, then the kind's own)
    load(k, s) {
      const payload = k < 0 ? this.top : Object.assign({}, this.top, this.kinds[k]);
      this.kind = k < 0 ? null : payload.kind;
      this.p = payload;
      this.bytes = k < 0 ? this.allBytes : this.allBytes[k];
      this.top = Boolean(this.bytes && this.bytes.top);                 // each row's K largest weights only
      this.spread = null;
      [this.L, this.H, this.n, this.nk] = payload.attention.shape;     // n queries, nk keys
      this.tokens = payload.labels || payload.tokens;                   // as a reader sees them: "␣capital"
      this.spelled = payload.tokens;                                    // as the tokenizer spells them: "Ġcapital"
      this.self = !payload.key_tokens;                                  // self-attention: keys are the tokens
      this.keys = this.self ? this.tokens : payload.key_labels || payload.key_tokens;
      this.keysSpelled = this.self ? this.spelled : payload.key_tokens;
      this.read = payload.read_labels || null;                          // cross: the token each row read
      this.sinkBytes = payload.sinkBytes || null;                       // attention sinks: each row's share (L·H·n)
      this.causal = payload.causal === true;
      this.gen = payload.prompt_length == null ? this.n : payload.prompt_length;  // first generated token
      this.next = payload.next && payload.next.steps.length ? payload.next : null;
      // the panels shown: those of the payload's list (panels.py) whose section it holds, in its order
      this.shownPanels = {};
      for (const p of payload.panels || []) if (payload[p.id] && this.extra[p.id]) this.shownPanels[p.id] = p;
      this.views = ["head", "matrix", "model"].concat(this.next ? ["next"] : [], Object.keys(this.shownPanels));
      const li = payload.layers.indexOf(s.layer);
      // temperature: an index on the slider, 0 = greedy, k = next.temperatures[k - 1]; starts at T = 1
      const temps = this.next ? this.next.temperatures : [];
      const ti = temps.indexOf(s.temperature >= 0 ? s.temperature : 1);
      const view = s.view || payload.view;
      this.state = {view: this.views.includes(view) ? view : "head", lensMode: "prob", pin: null,
                    layer: li >= 0 ? li : 0, head: s.head >= 0 && s.head < this.H ? s.head : -1,
                    hover: null, cell: null, temp: s.temperature === 0 ? 0 : ti >= 0 ? ti + 1 : temps.length,
                    step: 0, query: s.query >= 0 && s.query < this.n ? s.query : 0};
      this.roleColour = {};
      const roles = [...new Set((payload.roles || []).flat().filter(r => r))].sort();
      const known = payload.role_colours || {};
      roles.filter(r => !(r in known)).forEach((r, k) => { this.roleColour[r] = SPARE_ROLE_COLOURS[k % SPARE_ROLE_COLOURS.length]; });
      roles.filter(r => r in known).forEach(r => { this.roleColour[r] = known[r]; });
    }

    // another kind of attention: the same view, layer number (or the nearest) and head where they exist
    switchKind(kind) {
      const s = this.saved(), k = this.kinds.findIndex(p => p.kind === kind);
      const layers = this.kinds[k].layers;
      if (!layers.includes(s.layer)) s.layer = layers[Math.min(this.state.layer, layers.length - 1)];
      this.load(k, Object.assign(s, {kind}));
      this.build();
      this.render();
    }

    // attention of (kept layer l, head h): an n×nk view of the bytes, rows = queries; a long input's page
    // keeps each row's K largest weights only (this.top): the head is spread out on demand (the last few kept)
    A(l, h) {
      const nn = this.n * this.nk;
      if (!this.top) return this.bytes.subarray((l * this.H + h) * nn, (l * this.H + h + 1) * nn);
      const key = l * this.H + h, cache = this.spread || (this.spread = new Map());
      if (cache.has(key)) return cache.get(key);
      const a = new Uint8Array(nn);
      this.each(l, h, (i, j, q) => { a[i * this.nk + j] = q; });
      if (cache.size >= 12) cache.delete(cache.keys().next().value);
      cache.set(key, a);
      return a;
    }
    // fn(i, j, q) for every non-zero weight of (l, h): the kept ones of a long input's page
    each(l, h, fn) {
      const n = this.n, nk = this.nk;
      if (!this.top) {
        const a = this.A(l, h);
        for (let i = 0, o = 0; i < n; i++, o += nk) for (let j = 0; j < nk; j++) if (a[o + j]) fn(i, j, a[o + j]);
        return;
      }
      const {K, index, weight} = this.bytes, base = (l * this.H + h) * n * K;   // a row's keys: ascending, as steps
      for (let i = 0; i < n; i++) {
        for (let r = 0, o = base + i * K, j = 0; r < K; r++) { j += index[o + r]; if (weight[o + r]) fn(i, j, weight[o + r]); }
      }
    }
    // the weight (bytes) each row of (l, h) leaves out of the page: 0 when every weight is there
    rest(l, h, i) { return this.top ? this.bytes.rest[(l * this.H + h) * this.n + i] : 0; }
    masked(i, j) { return this.causal && j > i; }                 // key after query: the causal mask removed it
    heads() { return this.state.head < 0 ? [...Array(this.H).keys()] : [this.state.head]; }
    role(l, h) { return this.p.roles ? this.p.roles[l][h] : null; }
    headName(l, h) { const r = this.role(l, h); return `head ${h}` + (r ? ` (${r})` : ""); }
    // The matrix of the selected head, or the mean of all heads (bytes, same scale).
    selected() {
      const l = this.state.layer;
      if (this.state.head >= 0) return this.A(l, this.state.head);
      const nn = this.n * this.nk, nk = this.nk, sum = new Float32Array(nn), out = new Uint8Array(nn);
      if (this.top) for (let h = 0; h < this.H; h++) this.each(l, h, (i, j, q) => { sum[i * nk + j] += q; });
      else for (let h = 0; h < this.H; h++) { const a = this.A(l, h); for (let p = 0; p < nn; p++) sum[p] += a[p]; }
      for (let p = 0; p < nn; p++) out[p] = Math.round(sum[p] / this.H);
      return out;
    }

    // the sink's share of each row of the selected head (bytes, n), or the heads' mean; null without sinks
    sinkRow() {
      if (!this.sinkBytes) return null;
      const l = this.state.layer, n = this.n, H = this.H;
      if (this.state.head >= 0) return this.sinkBytes.subarray((l * H + this.state.head) * n, (l * H + this.state.head + 1) * n);
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i++) { let sum = 0; for (let h = 0; h < H; h++) sum += this.sinkBytes[(l * H + h) * n + i]; out[i] = Math.round(sum / H); }
      return out;
    }

    set(patch) {
      Object.assign(this.state, patch);
      this.render();
    }

    build() {
      const root = this.root, H = this.H;
      root.textContent = "";
      root.classList.add("qkv");
      const bar = el("div", "qkv-bar");
      this.tabs = {};
      const tabs = el("div", "qkv-tabs");
      const names = {head: "Head view", matrix: "Matrix", model: "Model view", next: "Next token"};
      for (const [v, label] of this.views.map(v => [v, this.shownPanels[v] ? this.shownPanels[v].title : names[v]])) {
        const b = el("button", "qkv-tab", label);
        b.type = "button";
        b.dataset.view = v;
        b.addEventListener("click", () => this.set({view: v, hover: null, cell: null}));
        tabs.append(b);
        this.tabs[v] = b;
      }
      this.layerSel = el("select", "qkv-layer");
      this.p.layers.forEach((layer, k) => { const o = el("option", null, String(layer)); o.value = k; this.layerSel.append(o); });
      this.layerSel.addEventListener("change", () => this.set({layer: +this.layerSel.value, cell: null}));
      this.headSel = el("select", "qkv-head");
      const all = el("option", null, "all"); all.value = -1; this.headSel.append(all);
      for (let h = 0; h < H; h++) { const o = el("option", null, String(h)); o.value = h; this.headSel.append(o); }
      this.headSel.addEventListener("change", () => this.set({head: +this.headSel.value, cell: null}));
      const lab = (text, sel) => { const l = el("label", "qkv-field", text); l.append(sel); return l; };
      this.meta = el("span", "qkv-meta");
      this.fields = [lab("Layer ", this.layerSel), lab("Head ", this.headSel)];   // no use in the next-token view
      bar.append(tabs, ...this.fields, this.meta);
      if (global.QKV_EXPORT)                               // export.js: the view shown, as PNG, SVG or JSON
        bar.append(global.QKV_EXPORT.bar(() => this.panels[this.state.view], () => this.exportName(),
                                         () => this.exportData()));
      if (this.kinds) {                                     // encoder / decoder / cross
        const kinds = el("div", "qkv-kinds");
        kinds.setAttribute("role", "group");
        kinds.setAttribute("aria-label", "kind of attention");
        for (const p of this.kinds) {
          const b = el("button", "qkv-kind", p.name);
          b.type = "button";
          b.dataset.kind = p.kind;
          b.title = KIND_WHAT[p.kind] || p.kind;
          b.setAttribute("aria-pressed", String(p.kind === this.kind));
          b.addEventListener("click", () => { if (p.kind !== this.kind) this.switchKind(p.kind); });
          kinds.append(b);
        }
        bar.prepend(kinds);
      }

      this.chips = el("div", "qkv-chips");
      this.chips.append(el("span", "qkv-hint", "heads:"));
      this.chipEls = [];
      for (let h = 0; h < H; h++) {
        const c = el("button", "qkv-chip", String(h));
        c.type = "button";
        c.style.setProperty("--c", headColour(h, H));
        c.addEventListener("click", () => this.set({head: this.state.head === h ? -1 : h, cell: null}));
        this.chips.append(c);
        this.chipEls.push(c);
      }
      this.hint = el("span", "qkv-hint");
      this.chips.append(this.hint);

      this.panels = {head: el("div", "qkv-panel qkv-headview"), matrix: el("div", "qkv-panel qkv-matrix"),
                     model: el("div", "qkv-panel qkv-model")};
      if (this.next) this.panels.next = el("div", "qkv-panel qkv-next");
      for (const v in this.shownPanels) this.panels[v] = el("div", "qkv-panel qkv-" + v);
      this.caption = el("p", "qkv-caption");
      this.caption.hidden = !this.kinds;
      // a long input's page: what it keeps of each row, said where the reader looks
      this.rule = el("p", "qkv-note qkv-rule", this.top ? "This page holds " + this.bytes.rule + "." : "");
      this.rule.hidden = !this.top;
      root.append(bar, this.caption, this.rule, this.chips);
      if (this.p.image) root.append(this.buildImage());
      root.append(...this.views.map(v => this.panels[v]));
      this.built = {};
    }

    render() {
      const s = this.state, root = this.root;
      // a long page still inflating its other layers: a view that needs one not yet in waits for them
      const b = this.bytes;
      if (this.top && b.complete && b.decoded.size < this.L) {
        const draws = s.view === "model" || ((s.view === "head" || s.view === "matrix") && !b.decoded.has(s.layer));
        if (draws) {
          root.dataset.waiting = "1";
          b.complete().then(() => { delete root.dataset.waiting; this.render(); });
          return;
        }
      }
      for (const v in this.tabs) {
        this.tabs[v].setAttribute("aria-pressed", String(v === s.view));
        this.panels[v].hidden = v !== s.view;
      }
      this.layerSel.value = s.layer;
      this.headSel.value = s.head;
      this.chipEls.forEach((c, h) => {
        c.setAttribute("aria-pressed", String(s.head < 0 || s.head === h));
        c.title = this.headName(s.layer, h) + (s.head === h ? " · click again for all heads" : " · click to show it alone");
      });
      const attention = s.view === "head" || s.view === "matrix";     // the views that draw one head (or all)
      const shipped = this.shownPanels[s.view];                                 // a panel's view, or the next-token view
      const panel = shipped ? PANELS[shipped.renderer] : VIEWS[s.view] || null;
      this.chips.hidden = !attention;
      this.fields[0].hidden = !(attention || s.view === "model" || (shipped && shipped.layer));
      this.fields[1].hidden = !(attention || s.view === "model");
      const who = s.head < 0 ? "all heads" : this.headName(s.layer, s.head);
      const where = panel ? panel.meta(this) : [`layer ${this.p.layers[s.layer]}`, who];
      const size = this.self ? `${this.n} tokens` : `${this.n} × ${this.nk} tokens`;
      this.meta.textContent = [this.p.model, KIND_WHAT[this.kind], size, ...where]
        .filter(x => x).join(" · ");
      const left = this.top && s.hover && s.hover.side === "q" && s.head >= 0 && s.view === "head"
        ? ` · keys not drawn hold ${fmt(this.rest(s.layer, s.head, s.hover.i))} of this row` : "";
      this.hint.textContent = {head: "hover a token to isolate its lines" + left,
                               matrix: s.head < 0 ? "mean of all heads · hover a cell for its weight" : "hover a cell for its weight",
                               model: "", next: ""}[s.view] || "";
      const t0 = performance.now();
      if (!this.built[s.view]) this.built[s.view] = panel ? panel.build(this) : (this["build_" + s.view](), true);
      if (panel) this.built[s.view].draw(); else this["draw_" + s.view]();
      root.dataset.drawMs = (performance.now() - t0).toFixed(1);     // for tests and curious users
      Object.assign(root.dataset, {view: s.view, layer: this.p.layers[s.layer], head: s.head < 0 ? "all" : s.head,
                                   hover: s.hover ? s.hover.side + s.hover.i : "",
                                   cell: s.cell ? s.cell.i + "," + s.cell.j : ""});
      if (s.cell && s.cell.t) root.dataset.cell += "," + s.cell.t;             // patching: which table
      if (this.p.image) { this.drawImage(); root.dataset.query = s.query; }
      if (this.p.lens) root.dataset.lensMode = s.lensMode;
      if (this.next) Object.assign(root.dataset, {temperature: VIEWS.next.temperature(this), step: this.next.steps[s.step].position});
      else { delete root.dataset.temperature; delete root.dataset.step; }     // another kind may have set them
      if (this.kinds) {
        root.dataset.kind = this.kind;
        this.caption.textContent = this.p.caption + this.example();
        this.caption.hidden = s.view === "next";                        // the caption is about attention
      }
    }

    // cross: "when the decoder writes “I” it looks at “나는”", for the first target token, the layer and head(s) shown
    example() {
      if (!this.read || !this.n || this.state.view === "next") return "";
      const a = this.selected();
      let j = 0;
      for (let k = 1; k < this.nk; k++) if (a[k] > a[j]) j = k;
      const who = this.state.head < 0 ? "the mean of its heads" : `head ${this.state.head}`;
      return ` Here, layer ${this.p.layers[this.state.layer]} (${who}): when the decoder writes “${shown(this.tokens[0], 24)}” ` +
             `it looks most at “${shown(this.keys[j], 24)}” (${fmt(a[j])}).`;
    }

    // ── an image model's image: a query's attention over the patches, the labels, the patches as tiles ──
    buildImage() {
      const im = this.p.image, box = el("div", "qkv-image");
      const scale = Math.max(1, Math.floor(256 / Math.max(im.width, im.height)));   // screen pixels per image pixel
      const w = im.width * scale, h = im.height * scale, [ph, pw] = im.patch;
      const stage = el("div", "qkv-image-stage"), pic = el("img", "qkv-image-pic");
      stage.style.width = w + "px";
      stage.style.height = h + "px";
      pic.src = im.png;                                            // a data: URI, as the page's CSP allows
      pic.alt = "the image the model read";
      pic.width = w;
      pic.height = h;
      const canvas = el("canvas", "qkv-image-overlay"), ctx = sizeCanvas(canvas, w, h);
      canvas.title = "click a patch: where it looks";
      canvas.addEventListener("click", (e) => {                     // the patch under the pointer becomes the query
        const b = canvas.getBoundingClientRect();
        const r = Math.floor((e.clientY - b.top) / scale / ph), c = Math.floor((e.clientX - b.left) / scale / pw);
        if (r >= 0 && r < im.rows && c >= 0 && c < im.cols) this.set({query: im.first + r * im.cols + c});
      });
      stage.append(pic, canvas);
      const side = el("div", "qkv-image-side");
      const top = im.predicted.map(x => `${x.label} (${x.p.toFixed(3)})`).join(" · ");
      side.append(el("p", "qkv-image-predicted", top ? "predicted: " + top : "no classifier"),
                  el("p", "qkv-image-readout"));
      const strip = el("div", "qkv-image-strip"), tiles = [], crops = [], T = 24, k = T / pw;  // a patch: T px wide
      for (let i = 0; i < this.n; i++) {
        const t = el("button", "qkv-image-tile", i < im.first ? shown(this.tokens[i], 6) : undefined);
        t.type = "button";
        t.dataset.i = i;
        if (i >= im.first) {                                       // the patch itself, cut from the image below
          const crop = el("canvas");
          crops.push([sizeCanvas(crop, T, ph * k), Math.floor((i - im.first) / im.cols), (i - im.first) % im.cols]);
          t.append(crop);
        }
        t.addEventListener("click", () => this.set({query: i}));
        strip.append(t);
        tiles.push(t);
      }
      pic.decode().then(() => crops.forEach(([cx, r, c]) => {      // pixels stay pixels: no smoothing
        cx.imageSmoothingEnabled = false;
        cx.drawImage(pic, c * pw, r * ph, pw, ph, 0, 0, T, ph * k);
      })).catch(() => null);
      box.append(stage, side, strip);
      this.im = {canvas, ctx, w, h, scale, readout: side.lastChild, tiles};
      return box;
    }

    // the query's row of the layer and head shown (all heads: their mean), each patch's weight as a cell over
    // its pixels; colours on 0 .. the row's largest patch weight, so a spread-out row still shows its shape
    drawImage() {
      const im = this.p.image, g = this.im, s = this.state, q = s.query, [ph, pw] = im.patch, k = g.scale;
      const row = this.selected().subarray(q * this.nk, (q + 1) * this.nk);          // bytes, nk keys
      const cells = Array.from(row.subarray(im.first, im.first + im.rows * im.cols)); // patch (r, c) at r·cols + c
      const top = Math.max(1, ...cells);
      g.ctx.clearRect(0, 0, g.w, g.h);
      cells.forEach((v, p) => {
        const c = LUT.subarray(3 * Math.round(v / top * 255), 3 * Math.round(v / top * 255) + 3);
        g.ctx.fillStyle = `rgba(${c[0]},${c[1]},${c[2]},${(0.2 + 0.65 * v / top).toFixed(3)})`;   // the image shows through low weights
        g.ctx.fillRect((p % im.cols) * pw * k, Math.floor(p / im.cols) * ph * k, pw * k, ph * k);
      });
      if (q >= im.first) {                                         // the query patch, outlined
        g.ctx.strokeStyle = "#fff";
        g.ctx.lineWidth = 2;
        g.ctx.strokeRect(((q - im.first) % im.cols) * pw * k + 1, Math.floor((q - im.first) / im.cols) * ph * k + 1,
                         pw * k - 2, ph * k - 2);
      }
      Object.assign(g.canvas.dataset, {values: cells.join(","), query: q, top});
      let best = im.first;
      for (let j = im.first; j < this.nk; j++) if (row[j] > row[best]) best = j;
      const who = s.head < 0 ? "mean of all heads" : `head ${s.head}`;
      g.readout.textContent = `query ${shown(this.tokens[q], 24)}, layer ${this.p.layers[s.layer]}, ${who}: ` +
        `looks most at ${shown(this.keys[best], 24)} (${fmt(row[best])}); at [CLS] ${fmt(row[0])} · ` +
        `colours 0 … ${fmt(top)} · click a patch or a tile to choose the query`;
      g.tiles.forEach((t, i) => {
        t.setAttribute("aria-pressed", String(i === q));
        t.title = `${this.tokens[i]}: ${fmt(row[i])} of ${this.tokens[q]}'s attention`;
        t.style.setProperty("--w", (row[i] / 255).toFixed(3));
      });
    }

    // ── head view: two token columns, one line per (query, key), alpha = weight ──
    build_head() {
      const n = Math.max(this.n, this.nk), panel = this.panels.head;
      const rowH = n <= 48 ? 22 : n <= 160 ? 17 : 14;
      this.hv = {rowH, W: n <= 48 ? 260 : 220};
      panel.style.setProperty("--row", rowH + "px");
      panel.classList.add(n <= 48 ? "qkv-big" : n <= 160 ? "qkv-mid" : "qkv-small");
      const column = (side) => {
        const col = el("div", "qkv-col qkv-col-" + side), rows = [];
        const labels = side === "q" ? this.tokens : this.keys, spell = side === "q" ? this.spelled : this.keysSpelled;
        for (let i = 0; i < labels.length; i++) {
          const gen = (side === "q" || this.self) && i >= this.gen;
          const spelled = spell[i] !== labels[i] ? ` (spelled ${spell[i]})` : "";
          const t = el("div", "qkv-tok" + (gen ? " qkv-gen" : ""), shown(labels[i]));
          t.dataset.i = i;
          t.tabIndex = 0;
          t.title = `${side === "q" ? "query" : "key"} ${i}: ${labels[i]}${spelled}` + (gen ? " (generated)" : "") +
                    (side === "q" && this.read ? ` · written by the query reading “${this.read[i]}”` : "");
          col.append(t);
          rows.push(t);
        }
        const enter = (e) => {
          const t = e.target.closest(".qkv-tok");
          if (t && (!this.state.hover || this.state.hover.side !== side || this.state.hover.i !== +t.dataset.i))
            this.set({hover: {side, i: +t.dataset.i}});
        };
        const leave = () => { if (this.state.hover) this.set({hover: null}); };
        col.addEventListener("mouseover", enter);
        col.addEventListener("focusin", enter);
        col.addEventListener("mouseleave", leave);
        col.addEventListener("focusout", leave);
        return [col, rows];
      };
      const [left, lrows] = column("q"), [right, rrows] = column("k");
      this.hv.rows = {q: lrows, k: rrows};
      this.hv.canvas = el("canvas", "qkv-lines");
      this.hv.ctx = sizeCanvas(this.hv.canvas, this.hv.W, n * rowH, HEAD_PIXELS);
      const head = el("div", "qkv-heads-row");
      head.append(el("span", "qkv-axis", this.read ? "target token written (its query looks from)" : "query (looks from)"),
                  el("span"), el("span", "qkv-axis", this.read ? "source token (key, looked at)" : "key (looks at)"));
      const grid = el("div", "qkv-headgrid");
      grid.append(left, this.hv.canvas, right);
      panel.append(head, grid);
      if (this.gen < this.n) panel.append(el("p", "qkv-note", `tokens from ${this.gen} on (underlined) were generated`));
    }

    draw_head() {
      const {ctx, W, rowH, rows} = this.hv, n = this.n, nk = this.nk, s = this.state, hover = s.hover;
      ctx.clearRect(0, 0, W, Math.max(n, nk) * rowH);
      const heads = this.heads();
      const minQ = hover || n <= 64 ? 1 : n <= 160 ? 4 : 8;   // long inputs: skip lines too faint to see (a < 0.03)
      const shade = new Float32Array(Math.max(n, nk));
      ctx.lineWidth = heads.length === 1 ? 2 : n > 100 ? 1 : 1.5;
      for (const h of heads) {
        const a = this.top && !hover ? null : this.A(s.layer, h);
        // several heads: each ends at its own height within a row, so their lines stay apart
        const dy = heads.length > 1 ? ((h + 0.5) / this.H - 0.5) * rowH * 0.6 : 0;
        const y = (i) => (i + 0.5) * rowH + dy;
        const paths = [];                                   // one path per alpha level: ≤ 16 strokes per head
        const line = (i, j, q) => {
          const b = q >> 4;
          (paths[b] || (paths[b] = new Path2D())).moveTo(0, y(i));
          paths[b].lineTo(W, y(j));
        };
        if (!hover) {
          if (this.top) this.each(s.layer, h, (i, j, q) => { if (q >= minQ) line(i, j, q); });
          else for (let i = 0; i < n; i++) for (let j = 0, o = i * nk; j < nk; j++) { if (a[o + j] >= minQ) line(i, j, a[o + j]); }
        } else if (hover.side === "q") {
          const i = hover.i;
          for (let j = 0; j < nk; j++) { const q = a[i * nk + j]; if (q) { line(i, j, q); shade[j] = Math.max(shade[j], q); } }
        } else {
          const j = hover.i;
          for (let i = 0; i < n; i++) { const q = a[i * nk + j]; if (q) { line(i, j, q); shade[i] = Math.max(shade[i], q); } }
        }
        ctx.strokeStyle = headColour(h, this.H);
        paths.forEach((p, b) => { if (p) { ctx.globalAlpha = Math.min(1, (16 * b + 12) / 255); ctx.stroke(p); } });
      }
      ctx.globalAlpha = 1;
      // the hovered token, and how much each token on the other side gets (or gives)
      for (const side of ["q", "k"]) {
        rows[side].forEach((t, i) => {
          const mine = !!hover && hover.side === side && hover.i === i;
          const other = hover && hover.side !== side && shade[i] > 0;
          const bg = other ? `rgba(33,113,181,${(0.08 + 0.6 * shade[i] / 255).toFixed(2)})` : "";
          if (mine !== t.classList.contains("qkv-hot")) t.classList.toggle("qkv-hot", mine);
          if (bg !== (t._bg || "")) { t.style.background = bg; t._bg = bg; }   // touch only what changed
        });
      }
    }

    // ── matrix view: the n×nk heatmap, a cell's weight on hover ───────────────
    build_matrix() {
      const panel = this.panels.matrix;
      this.mx = {canvas: el("canvas", "qkv-heat"), tip: el("div", "qkv-tip"), readout: el("p", "qkv-readout")};
      this.mx.tip.hidden = true;
      const wrap = el("div", "qkv-heatwrap");
      wrap.append(this.mx.canvas, this.mx.tip);
      const bar = el("canvas", "qkv-colourbar"), scale = el("div", "qkv-scale");
      const bctx = sizeCanvas(bar, 160, 10);
      const ramp = new Uint8Array(256).map((_, q) => q);
      bctx.imageSmoothingEnabled = true;
      bctx.drawImage(heatmapImage(ramp, 256, 1), 0, 0, 160, 10);
      scale.append(el("span", null, "0"), bar, el("span", null, "1   attention weight (±0.002), brighter = more" +
                                                  (this.causal ? " · grey: masked (key after query)" : "") +
                                                  (this.sinkBytes ? " · last column: the share of each row its head's " +
                                                   "sink took (attention sinks)" : "")));
      this.mx.zoom = el("p", "qkv-note qkv-zoom");
      panel.append(wrap, this.mx.readout, this.mx.zoom, scale,
                   el("p", "qkv-note", "wheel or + / − zooms, drag or the arrow keys pan, double-click or 0 fits the whole matrix"));
      this.mx.readout.textContent = "hover a cell";
      const c = this.mx.canvas;
      c.tabIndex = 0;
      c.setAttribute("aria-label", "attention matrix: + and − zoom, arrow keys pan, 0 fits");
      c.addEventListener("mousemove", (e) => {
        const d = this.mx.drag;
        if (d && (e.buttons & 1)) {
          const w = this.mx.win;
          if (Math.abs(e.offsetX - d.x) + Math.abs(e.offsetY - d.y) > 3)
            this.matrixWindow({i0: d.i0 - (e.offsetY - d.y) / w.scale, j0: d.j0 - (e.offsetX - d.x) / w.scale});
        } else this.matrixHover(e);
      });
      c.addEventListener("mousedown", (e) => { const w = this.mx.win; this.mx.drag = {x: e.offsetX, y: e.offsetY, i0: w.i0, j0: w.j0}; });
      c.addEventListener("mouseup", () => { this.mx.drag = null; });
      c.addEventListener("mouseleave", () => { this.mx.drag = null; this.mx.tip.hidden = true; this.set({cell: null}); });
      c.addEventListener("wheel", (e) => { e.preventDefault(); this.matrixZoom(e.deltaY < 0 ? 1.25 : 0.8, e.offsetX, e.offsetY); },
                         {passive: false});
      c.addEventListener("dblclick", () => this.matrixWindow({scale: this.matrixBase(), i0: 0, j0: 0}));
      c.addEventListener("keydown", (e) => {
        const w = this.mx.win, g = this.mx.geo, step = Math.max(1, Math.round(g.vh / w.scale / 4));
        const act = {"+": () => this.matrixZoom(1.25), "=": () => this.matrixZoom(1.25), "-": () => this.matrixZoom(0.8),
                     "0": () => this.matrixWindow({scale: this.matrixBase(), i0: 0, j0: 0}),
                     ArrowUp: () => this.matrixWindow({i0: w.i0 - step}), ArrowDown: () => this.matrixWindow({i0: w.i0 + step}),
                     ArrowLeft: () => this.matrixWindow({j0: w.j0 - step}), ArrowRight: () => this.matrixWindow({j0: w.j0 + step})}[e.key];
        if (act) { e.preventDefault(); act(); }
      });
    }

    // The matrix is drawn through a window: rows i0.., columns j0.., `scale` CSS pixels a cell. It opens with the
    // whole matrix in at most 560 px (cells of 1–44 px; past 560 tokens, less than a pixel a cell: each pixel
    // then shows the largest weight of the cells under it, so a thin diagonal stays visible); the wheel or
    // + / − zooms (labels from 10 px a cell; every k-th where a label a line high would touch the next), dragging or the arrow keys pan, a double click or 0 fits it again.
    matrixBase() { return Math.max(this.n, this.nk) <= 560 ? clamp(Math.floor(560 / Math.max(this.n, this.nk)), 1, 44)
                                                           : 560 / Math.max(this.n, this.nk); }
    matrixWindow(patch) {
      const mx = this.mx, base = this.matrixBase(), w = Object.assign({}, mx.win, patch);
      w.scale = clamp(w.scale, base, 44);
      const rows = Math.ceil(this.n * base / w.scale), cols = Math.ceil(this.nk * base / w.scale);
      w.i0 = clamp(Math.round(w.i0), 0, Math.max(0, this.n - rows));
      w.j0 = clamp(Math.round(w.j0), 0, Math.max(0, this.nk - cols));
      mx.win = w;
      this.draw_matrix();
    }
    matrixZoom(factor, x, y) {                          // keep the cell under (x, y) (canvas pixels) in place
      const g = this.mx.geo, w = this.mx.win, scale = clamp(w.scale * factor, this.matrixBase(), 44);
      const fx = x === undefined ? g.vw / 2 : x - g.padL, fy = y === undefined ? g.vh / 2 : y - g.padT;
      this.matrixWindow({scale, i0: w.i0 + fy / w.scale - fy / scale, j0: w.j0 + fx / w.scale - fx / scale});
    }

    draw_matrix() {
      const n = this.n, nk = this.nk, mx = this.mx, s = this.state, base = this.matrixBase();
      const key = s.layer + ":" + s.head;
      if (mx.key !== key) { mx.key = key; mx.values = this.selected(); mx.images = {}; }
      if (!mx.win || mx.win.base !== base) mx.win = {base, scale: base, i0: 0, j0: 0};
      const {scale, i0, j0} = mx.win;
      const vw = Math.ceil(nk * base), vh = Math.ceil(n * base);                 // the window's pixels
      const rows = Math.min(n - i0, Math.ceil(vh / scale)), cols = Math.min(nk - j0, Math.ceil(vw / scale));
      const cell = scale, labels = cell >= 10;
      const font = `${clamp(Math.floor(cell) - 4, 9, 13)}px system-ui, "qkv Hangul", sans-serif`;
      let lw = 0, rowStep = 1, colStep = 1;
      if (labels) {
        const c = mx.canvas.getContext("2d");
        c.font = font;
        // Labels a line high (the font's box, about 1.2 × its size) that would touch their neighbours are thinned
        // to every k-th: rows are `cell` apart, the columns' 45° labels cell·sin 45° apart across their lines.
        const m = c.measureText("Mg"), line = (m.fontBoundingBoxAscent + m.fontBoundingBoxDescent) || 1.25 * parseFloat(font);
        rowStep = Math.ceil(line / cell);
        colStep = Math.ceil(line / (cell * Math.SQRT1_2));
        for (let i = i0; i < i0 + rows; i++) lw = Math.max(lw, c.measureText(shown(this.tokens[i], 14)).width);
        for (let j = j0; j < j0 + cols; j++) lw = Math.max(lw, c.measureText(shown(this.keys[j], 14)).width);
      }
      const padL = labels ? Math.ceil(lw) + 12 : 40, padT = labels ? Math.ceil(lw * 0.71) + 14 : 22;
      // attention sinks: one more column after a gap, each row's share its sink took (drawn at least 8 px wide)
      const sink = this.sinkRow(), sinkGap = sink ? Math.max(4, Math.round(cell / 2)) : 0, sinkW = sink ? Math.max(8, cell) : 0;
      const padR = (labels ? Math.ceil(lw * 0.71) : 8) + (sink ? sinkGap + sinkW + 24 : 0);
      if (!mx.geo || mx.geo.vw !== vw || mx.geo.vh !== vh || mx.geo.padL !== padL || mx.geo.padT !== padT) {
        mx.ctx = sizeCanvas(mx.canvas, padL + vw + padR, padT + vh + 6);
      }
      mx.geo = {cell, vw, vh, padL, padT, padR, size: cols * cell, height: rows * cell,
                sinkX: padL + Math.min(vw, cols * cell) + sinkGap, sinkW};
      Object.assign(mx.canvas.dataset, {cell, padL, padT, i0, j0, rows, cols, rowStep, colStep});   // for tests
      const drawn = mx.canvas.qkvLabels = {font, rows: [], cols: []};   // each label's text and anchor (CSS px), for tests
      const ctx = mx.ctx;
      ctx.clearRect(0, 0, padL + vw + padR, padT + vh + 6);
      ctx.imageSmoothingEnabled = false;
      const img = this.matrixImage(i0, j0, rows, cols, scale);
      ctx.drawImage(img, padL, padT, Math.min(vw, cols * cell), Math.min(vh, rows * cell));
      if (sink) this.drawSink(ctx, sink, i0, rows, scale, font);
      ctx.fillStyle = "#333";
      ctx.font = font;
      if (labels) {
        ctx.textBaseline = "middle";
        ctx.textAlign = "right";
        for (let i = i0; i < i0 + rows && (i - i0) * cell < vh; i++) {
          if (i % rowStep) continue;                     // every k-th token, the same ones as the window pans
          const text = shown(this.tokens[i], 14), y = padT + (i - i0 + 0.5) * cell;
          ctx.fillStyle = i >= this.gen ? "#b45309" : s.cell && s.cell.i === i ? "#08306b" : "#333";
          ctx.fillText(text, padL - 6, y);
          drawn.rows.push({i, text, x: padL - 6, y});
        }
        ctx.textAlign = "left";
        for (let j = j0; j < j0 + cols && (j - j0) * cell < vw; j++) {
          if (j % colStep) continue;
          const text = shown(this.keys[j], 14), x = padL + (j - j0 + 0.5) * cell;
          ctx.save();
          ctx.translate(x, padT - 5);
          ctx.rotate(-Math.PI / 4);
          ctx.fillStyle = this.self && j >= this.gen ? "#b45309" : s.cell && s.cell.j === j ? "#08306b" : "#333";
          ctx.fillText(text, 0, 0);
          ctx.restore();
          drawn.cols.push({j, text, x, y: padT - 5});
        }
      } else {
        const whole = scale === base && i0 === 0 && j0 === 0;
        ctx.textBaseline = "alphabetic";
        ctx.textAlign = "left";
        ctx.fillText(whole ? "key →" : `keys ${j0}–${j0 + cols - 1} →`, padL, padT - 6);
        ctx.save();
        ctx.translate(padL - 8, padT);
        ctx.rotate(Math.PI / 2);
        ctx.fillText(whole ? "query →" : `queries ${i0}–${i0 + rows - 1} →`, 0, 0);
        ctx.restore();
      }
      if (s.cell && s.cell.i >= i0 && s.cell.i < i0 + rows && s.cell.j >= j0 && s.cell.j < j0 + cols) {
        ctx.strokeStyle = "#d62728";
        ctx.lineWidth = 1.5;
        const c = Math.max(cell, 2);
        ctx.strokeRect(padL + (s.cell.j - j0) * cell - 0.5, padT + (s.cell.i - i0) * cell - 0.5, c + 1, c + 1);
      }
      if (mx.zoom) mx.zoom.textContent = scale === base && base >= 1 ? "" :
        `rows ${i0}–${i0 + rows - 1}, columns ${j0}–${j0 + cols - 1}` + (scale < 1
          ? ` · each pixel the largest of ${(1 / scale).toFixed(1)} × ${(1 / scale).toFixed(1)} cells`
          : ` · ${scale.toFixed(1)} px a cell`);
    }

    // the sink column: the window's rows' sink shares (past a pixel a row, the largest under each pixel), "sink" above
    drawSink(ctx, sink, i0, rows, scale, font) {
      const g = this.mx.geo, f = scale < 1 ? 1 / scale : 1, bh = Math.max(1, Math.ceil(rows / f));
      const col = new Uint16Array(bh);
      for (let i = 0; i < rows; i++) { const p = Math.min(bh - 1, Math.floor(i / f)); col[p] = Math.max(col[p], sink[i0 + i]); }
      ctx.drawImage(heatmapImage(col, 1, bh), g.sinkX, g.padT, g.sinkW, Math.min(g.vh, rows * g.cell));
      ctx.save();
      ctx.fillStyle = "#7a0177";
      ctx.font = font;
      ctx.textBaseline = "alphabetic";
      ctx.textAlign = "left";
      ctx.translate(g.sinkX + g.sinkW / 2, g.padT - 5);
      ctx.rotate(-Math.PI / 4);
      ctx.fillText("sink", 0, 0);
      ctx.restore();
      this.mx.canvas.qkvLabels.sink = {text: "sink", x: g.sinkX, width: g.sinkW};   // for tests
    }

    // the window's cells as an image: a pixel a cell, or past a pixel a cell each pixel the largest weight under it
    matrixImage(i0, j0, rows, cols, scale) {
      const mx = this.mx, key = [i0, j0, rows, cols, scale < 1 ? scale : 1].join(":");
      if (mx.images[key]) return mx.images[key];
      const nk = this.nk, a = mx.values, f = scale < 1 ? 1 / scale : 1;
      const bw = Math.max(1, Math.ceil(cols / f)), bh = Math.max(1, Math.ceil(rows / f));
      const out = new Uint16Array(bw * bh).fill(this.causal ? MASK : 0);
      for (let i = 0; i < rows; i++) {
        const r = Math.min(bh - 1, Math.floor(i / f)) * bw, o = (i0 + i) * nk + j0;
        const last = this.causal ? Math.min(cols, i0 + i + 1 - j0) : cols;      // the keys this query sees
        for (let j = 0; j < last; j++) {
          const p = r + Math.min(bw - 1, Math.floor(j / f)), q = a[o + j];
          if (out[p] === MASK || q > out[p]) out[p] = q;
        }
      }
      mx.images = {[key]: heatmapImage(out, bw, bh)};
      return mx.images[key];
    }

    matrixHover(e) {
      const g = this.mx.geo, n = this.n, nk = this.nk, win = this.mx.win;
      const x = e.offsetX - g.padL, y = e.offsetY - g.padT;
      const j = win.j0 + Math.floor(x / g.cell), i = win.i0 + Math.floor(y / g.cell);
      const sink = this.sinkRow(), sx = e.offsetX - g.sinkX;
      if (sink && sx >= 0 && sx < g.sinkW && y >= 0 && y < Math.min(g.vh, g.height) && i < n) {
        const w = `${fmt(sink[i])} (the share of the row its sink took: no value, so the weights sum to 1 − it)`;
        this.mx.readout.textContent = `“${shown(this.tokens[i], 24)}” (query ${i}) → sink: ${w}`;
        Object.assign(this.mx.tip, {textContent: fmt(sink[i]) + "  " + shown(this.tokens[i], 16) + " → sink", hidden: false});
        this.mx.tip.style.left = (e.offsetX + 14) + "px";
        this.mx.tip.style.top = (e.offsetY + 12) + "px";
        return;
      }
      if (x < 0 || y < 0 || x >= Math.min(g.vw, g.size) || y >= Math.min(g.vh, g.height) || i >= n || j >= nk) {
        this.mx.tip.hidden = true;
        if (this.state.cell) this.set({cell: null});
        return;
      }
      const q = this.mx.values[i * nk + j];
      const w = this.masked(i, j) ? "masked"
        : this.top && !q ? (this.state.head >= 0 ? `not among the row's ${this.bytes.K} largest (the row's other keys hold ` +
                                                   `${fmt(this.rest(this.state.layer, this.state.head, i))} together)`
                                                 : `not among any head's ${this.bytes.K} largest`)
        : fmt(q);
      const text = this.read                                      // cross: the row is named by what it wrote
        ? `writing “${shown(this.tokens[i], 24)}” (query ${i}, reading “${shown(this.read[i], 24)}”) → ` +
          `“${shown(this.keys[j], 24)}” (key ${j}): ${w}`
        : `“${shown(this.tokens[i], 24)}” (query ${i}) → “${shown(this.keys[j], 24)}” (key ${j}): ${w}`;
      this.mx.readout.textContent = text;
      const tip = this.mx.tip;
      tip.textContent = (this.top && !q && !this.masked(i, j) ? "not kept" : w) + "  " + shown(this.tokens[i], 16) + " → " + shown(this.keys[j], 16);
      tip.hidden = false;
      tip.style.left = (e.offsetX + 14) + "px";
      tip.style.top = (e.offsetY + 12) + "px";
      if (!this.state.cell || this.state.cell.i !== i || this.state.cell.j !== j) this.set({cell: {i, j}});
    }

    // ── model view: layers × heads thumbnails; click one to open it ───────────
    build_model() {
      const panel = this.panels.model, H = this.H, n = this.n, nk = this.nk;
      const width = (this.root.clientWidth || 900) - 24 - 64;   // minus padding and the row labels
      const t = clamp(Math.floor(width / H) - 10, 30, 84);        // a thumb's button adds 6px, the gap 4px
      const grid = el("div", "qkv-grid");
      grid.style.gridTemplateColumns = `auto repeat(${H}, ${t + 6}px)`;
      grid.append(el("span"));
      for (let h = 0; h < H; h++) grid.append(el("span", "qkv-axis qkv-colhead", String(h)));
      this.thumbs = [];
      const px = Math.round(t * Math.min(global.devicePixelRatio || 1, 2));
      const bq = Math.min(n, px), bk = Math.min(nk, px);                 // bins of queries, of keys
      const mapQ = new Int32Array(n).map((_, k) => Math.floor(k * bq / n));
      const mapK = new Int32Array(nk).map((_, k) => Math.floor(k * bk / nk));
      const gamma = new Uint8Array(256).map((_, q) => Math.round(255 * Math.sqrt(q / 255)));
      const tw = nk >= n ? t : Math.max(4, Math.round(t * nk / n)), th = n >= nk ? t : Math.max(4, Math.round(t * n / nk));
      for (let l = 0; l < this.L; l++) {
        grid.append(el("span", "qkv-axis qkv-rowhead", "layer " + this.p.layers[l]));
        for (let h = 0; h < H; h++) {
          const b = el("button", "qkv-thumb"), c = el("canvas");
          b.type = "button";
          b.title = `layer ${this.p.layers[l]} · ${this.headName(l, h)} · click to open`;
          b.dataset.layer = this.p.layers[l];
          b.dataset.head = h;
          const role = this.role(l, h);
          if (role) { b.style.borderColor = this.roleColour[role]; b.classList.add("qkv-hasrole"); }
          // max-pool the n×nk matrix to bq×bk bins so thin diagonals stay visible; a bin of
          // masked cells only stays MASK (grey)
          const pooled = new Uint16Array(bq * bk).fill(this.causal ? MASK : 0);
          if (!this.top) {
            const a = this.A(l, h);
            for (let i = 0; i < n; i++) {
              const r = mapQ[i] * bk, o = i * nk, last = this.causal ? Math.min(i + 1, nk) : nk;
              for (let j = 0; j < last; j++) {
                const p = r + mapK[j], q = a[o + j];
                if (pooled[p] === MASK || q > pooled[p]) pooled[p] = q;
              }
            }
          } else {                                           // the kept weights; a bin with a visible cell is not grey
            if (this.causal) for (let i = 0; i < n; i++) pooled.fill(0, mapQ[i] * bk, mapQ[i] * bk + mapK[Math.min(i, nk - 1)] + 1);
            this.each(l, h, (i, j, q) => { const p = mapQ[i] * bk + mapK[j]; if (q > pooled[p]) pooled[p] = q; });
          }
          const ctx = sizeCanvas(c, tw, th);                                // n × nk: the matrix's own shape
          ctx.imageSmoothingEnabled = Math.max(bq, bk) > t;
          ctx.drawImage(heatmapImage(pooled, bk, bq, gamma), 0, 0, tw, th);
          b.append(c);
          if (role) { const r = el("span", "qkv-thumb-role", role); r.style.color = this.roleColour[role]; r.style.width = t + "px"; b.append(r); }
          b.addEventListener("click", () => this.set({view: "head", layer: l, head: h, hover: null}));
          grid.append(b);
          this.thumbs.push(b);
        }
      }
      panel.append(grid);
      const axes = this.read ? "rows = target tokens written, columns = source tokens" : "rows = queries, columns = keys";
      const legend = el("p", "qkv-note", `Each square is one head's ${KIND_WHAT[this.kind] || "attention"} (${axes}; ` +
                        "brighter = more, √ colour scale, max-pooled on long inputs" +
                        (this.causal ? "; grey: masked" : "") + "). Click one to open it in the head view.");
      panel.append(legend);
      const roles = Object.keys(this.roleColour);
      if (roles.length) {
        const keyRow = el("div", "qkv-roles");
        keyRow.append(el("span", "qkv-hint", "roles:"));
        for (const r of roles) { const k = el("span", "qkv-role", r); k.style.setProperty("--c", this.roleColour[r]); keyRow.append(k); }
        panel.append(keyRow);
      }
    }

    draw_model() {
      const s = this.state;
      this.thumbs.forEach((b, k) => {
        const l = Math.floor(k / this.H), h = k % this.H;
        b.classList.toggle("qkv-current", l === s.layer && (s.head < 0 || s.head === h));
      });
    }

    // ── export (export.js): the file name and the numbers of the view shown ──
    exportName() {
      const s = this.state, slug = (x) => String(x).replace(/[^A-Za-z0-9._-]+/g, "-").replace(/^-+|-+$/g, "") || "qkv";
      const parts = [slug(this.p.model), this.kind, s.view];
      if (s.view === "head" || s.view === "matrix")
        parts.push("layer" + this.p.layers[s.layer], s.head < 0 ? "all-heads" : "head" + s.head);
      else if (VIEWS[s.view]) parts.push(...VIEWS[s.view].exportName(this));
      else if (this.shownPanels[s.view] && this.shownPanels[s.view].layer) parts.push("layer" + this.p.layers[s.layer]);
      return parts.filter(x => x).join("-");
    }
    exportData() {
      const s = this.state, v = s.view, weights = (a) => {                 // n × nk rows of q / 255, as shown
        const rows = [];
        for (let i = 0; i < this.n; i++) rows.push(Array.from(a.subarray(i * this.nk, (i + 1) * this.nk), q => Math.round(q / 255 * 1000) / 1000));
        return rows;
      };
      const out = {model: this.p.model, view: v, kind: this.kind, tokens: this.tokens, text: this.p.text || null};
      if (v === "head" || v === "matrix") {
        Object.assign(out, {layer: this.p.layers[s.layer], head: s.head < 0 ? "mean of all heads" : s.head,
          keys: this.keys, causal: this.causal, precision: "±0.002 (one byte a weight)"});
        if (!this.top) return Object.assign(out, {attention: weights(this.selected())});
        // a long input's page: each query row's kept [key, weight] pairs, and what the row's other keys hold
        const rows = Array.from({length: this.n}, () => []), w = (q) => Math.round(q / 255 * 1000) / 1000;
        if (s.head >= 0) this.each(s.layer, s.head, (i, j, q) => rows[i].push([j, w(q)]));
        else { const a = this.selected(); for (let i = 0; i < this.n; i++) for (let j = 0; j < this.nk; j++) if (a[i * this.nk + j]) rows[i].push([j, w(a[i * this.nk + j])]); }
        return Object.assign(out, {kept: this.bytes.rule, attention_top: rows,
          rest: s.head >= 0 ? Array.from({length: this.n}, (_, i) => w(this.rest(s.layer, s.head, i))) : null});
      }
      if (v === "model") {
        const size = this.L * this.H * this.n * this.nk, all = size <= 4000000;
        return Object.assign(out, {layers: this.p.layers, heads: this.H, roles: this.p.roles || null, keys: this.keys,
          attention: all ? this.p.layers.map((_, l) => [...Array(this.H).keys()].map(h => weights(this.A(l, h)))) : null,
          note: all ? "attention[layer][head][query][key], ±0.002" : `${size} weights: too many to copy; save the trace (Trace.save) for them`});
      }
      if (VIEWS[v]) return Object.assign(out, VIEWS[v].exportData(this));
      return Object.assign(out, {layer: this.shownPanels[v].layer ? this.p.layers[s.layer] : null, section: this.p[v],
                                 arrays: this.extra[v]});
    }

    // what a fresh viewer needs to show the same layer, head and view
    saved() {
      const out = {view: this.state.view, layer: this.p.layers[this.state.layer], head: this.state.head};
      if (this.next) out.temperature = VIEWS.next.temperature(this);
      if (this.kinds) out.kind = this.kind;
      if (this.p.image) out.query = this.state.query;
      return out;
    }
  }

  // "attention" as the payload holds it: every weight (bytes, L·H·n·nk), or each row's K largest ("top":
  // {top: true, K, index (L·H·n·K keys), weight (bytes), rest (bytes, L·H·n)}, payload.py). A "top" payload
  // comes one array per layer: layer FIRST is inflated now, the others by rest() after the first paint
  // (decoded: the layers in place; complete(): a promise of all of them, starting the work if not started).
  async function decodeAttention(enc, first) {
    if (enc.format !== "top") return QKV_WIRE.decode(enc);
    const L = enc.shape[0];
    const out = {top: true, K: enc.k, rule: enc.rule, index: null, weight: null, rest: null, decoded: new Set()};
    const fill = async (l) => {
      const [ix, w, r] = [await QKV_WIRE.decode(enc.index[l]), await QKV_WIRE.decode(enc.weight[l]),
                          await QKV_WIRE.decode(enc.rest[l])];
      if (!out.index) {
        out.index = new ix.constructor(ix.length * L);
        out.weight = new Uint8Array(w.length * L);
        out.rest = new Uint8Array(r.length * L);
      }
      out.index.set(ix, l * ix.length);
      out.weight.set(w, l * w.length);
      out.rest.set(r, l * r.length);
      out.decoded.add(l);
    };
    await fill(Math.max(0, Math.min(L - 1, first || 0)));
    let all = null;
    out.complete = () => all || (all = (async () => { for (let l = 0; l < L; l++) if (!out.decoded.has(l)) await fill(l); })());
    return out;
  }

  function fail(root, err) {
    root.textContent = "";
    root.classList.add("qkv");
    root.append(el("div", "qkv-error", "qkv viewer: " + (err && err.message ? err.message : String(err))));
    root.dataset.ready = "error";
  }

  async function mount(root, payload, state) {
    const t0 = performance.now();
    root.dataset.mountAt = t0.toFixed(0);
    try {
      const parts = payload.kinds || [payload];            // an encoder–decoder: one attention per kind
      const decoded = [];
      for (const p of parts) {                             // bytes q = round(a·255); a long page: the layer shown
        decoded.push(await decodeAttention(p.attention, Math.max(0, p.layers.indexOf((state || {}).layer))));
        if (p.sinks) p.sinkBytes = await QKV_WIRE.decode(p.sinks);    // attention sinks: each row's share
      }
      const bytes = payload.kinds ? decoded : decoded[0];
      const extra = {};                                    // each section's arrays, decoded by its panel's renderer
      for (const p of payload.panels || []) {
        if (!payload[p.id]) continue;
        const panel = PANELS[p.renderer];
        if (!panel) throw new Error(`this page lacks the renderer "${p.renderer}" of the "${p.id}" view: ` +
                                    "load the script that registers it (qkv/viz/panels.py names it) after viewer.js");
        extra[p.id] = panel.decode ? await panel.decode(payload[p.id]) : {};
      }
      if (payload.next && payload.next.steps.length && !VIEWS.next)
        throw new Error("this page lacks the next-token view: load viewer_next.js after viewer.js");
      // canvases draw text once: the page's Hangul face (if it has one) must be loaded before
      if (document.fonts && document.fonts.load) await document.fonts.load('13px "qkv Hangul"', "\uD55C").catch(() => null);
      const t1 = performance.now();
      const viewer = new Viewer(root, payload, bytes, state, extra);
      viewer.render();
      root.dataset.decodeMs = (t1 - t0).toFixed(1);
      root.dataset.renderMs = (performance.now() - t1).toFixed(1);
      root.dataset.readyAt = performance.now().toFixed(0);           // ms since the page began loading
      root.dataset.ready = "1";
      const later = decoded.filter((b) => b && b.complete);          // a long page: its other layers, once painted
      // once the frame with the first view is painted (a task after its animation frame): say when, then inflate
      // a long page's other layers
      requestAnimationFrame(() => setTimeout(() => {
        root.dataset.paintedAt = performance.now().toFixed(0);       // ms since the page began loading
        Promise.all(later.map((b) => b.complete()))
          .then(() => { root.dataset.decoded = "all"; })
          .catch((err) => fail(root, err));
      }, 0));
      return viewer;
    } catch (err) {
      fail(root, err);
      throw err;
    }
  }

  // In a notebook's iframe (View): tell the page around it how tall the viewer is, so the frame fits it
  // (the page's listener is View's own script; without one the frame keeps its estimated height).
  function reportHeight() {
    if (global.parent === global || typeof ResizeObserver === "undefined") return;
    const post = () => {
      const body = document.body, margin = parseFloat(getComputedStyle(body).marginBottom) || 0;
      global.parent.postMessage({qkvHeight: Math.ceil(body.getBoundingClientRect().bottom + margin)}, "*");
    };
    new ResizeObserver(post).observe(document.body);
  }

  function boot() {
    reportHeight();
    for (const root of document.querySelectorAll("[data-qkv-root]")) {
      const script = root.nextElementSibling;
      let payload;
      try { payload = JSON.parse(script.textContent); } catch (err) { fail(root, err); continue; }
      mount(root, payload).catch((err) => console.error("qkv viewer:", err));
    }
  }

  // the interface of the panels' renderers (viewer_panels.js) and of the next-token view (viewer_next.js): the
  // helpers they share, and PANELS and VIEWS for them to fill
  const util = {el, clamp, shown, fmt, fmtP, sizeCanvas, LUT, MASKED};
  global.QKV = {mount, boot, util, panels: PANELS, views: VIEWS};
})(window);
