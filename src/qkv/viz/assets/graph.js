/* qkv attribution graph: one graph of `qkv graph … --json` drawn as an SVG (graphs/page.py's page, `qkv serve`'s
 * Graph tab). The graph's JSON is the schema of graphs/page.py's doc ("qkv_graph": 1): nodes (embedding, feature,
 * error, logit), links (source → target, the direct effect "weight"), scores, thresholds and, optionally, features'
 * annotations ({"layer:feature": {promotes, suppresses, contexts}}).
 *
 *   QKV_GRAPH.mount(root, graph, {words: {en, ko}, lang})  → view     draws GRAPH into ROOT (throws an Error
 *                                                                     saying why when GRAPH is not a graph)
 *   QKV_GRAPH.check(graph)                                  → graph    the same check alone
 *   QKV_GRAPH.boot()                                        mounts every [data-qkv-graph] of the page from its
 *                                                           script.qkv-graph-data ({graph, words, lang}), once
 *                                                           the Hangul face is ready (QKV_GRAPH.fontsReady())
 *
 * Layout: a row per layer (the embeddings at the bottom, layer 0 … L−1, the logits at the top) and a column per
 * position, as wide as its fullest row; a cell's nodes side by side, the most influential first. An edge is a
 * curve from its source up to its target, its width ∝ |weight| (on the largest |weight| drawn), red when the
 * weight is positive, blue when negative (the palette's DIVERGING stops at ±0.6), the strongest drawn last.
 *
 * What a reader does: hover a node (its card: what it is, its activation and influence, the tokens a feature
 * promotes and suppresses, its top contexts, its strongest inputs and outputs); in "Keep sub-graph" mode click a
 * node to keep its ancestors and descendants (the background: everything again); in "Select" mode (or Shift+click
 * in any mode) select nodes, name them and Group them into a supernode (drawn at their mean place, the edges to and
 * from its members summed, the edges among them left out); in "Pin path" mode click a node to pin the strongest
 * path through it (each step down its strongest incoming edge, each step up its strongest outgoing one). Export:
 * the SVG as drawn (computed styles inlined, the page's Hangul face inside), a PNG of it (export.js, which every
 * page holding this script inlines first), and the graph as JSON
 * with the reader's "supernodes" and "pinned" path (a page opening it restores them).
 *
 * Every word comes from the words' GRAPH table (viz/words: en, ko). Every text from the graph (tokens, the prompt,
 * names, contexts) is set as textContent, never as markup. The root's data-* say what is shown (tests read them):
 * data-ready, data-lang, data-mode, data-kept, data-hover.
 */
(function (global) {
  "use strict";

  // SVG's namespace: a name, never fetched; written in parts so that no page of qkv holds a URL at all
  const NS = ["http" + ":", "", "www.w3.org", "2000", "svg"].join("/");
  const COLOURS = {embedding: "#a6dba0", feature: "#fdb863", error: "#d9d9d9", logit: "#c2a5cf", super: "#e08214"};
  const POSITIVE = "rgb(214,96,77)", NEGATIVE = "rgb(67,147,195)";
  const ROW = 36, STEP = 15, MIN_COL = 46, LEFT = 64, TOP = 86, BOTTOM = 96, R = 5;
  const MODES = ["subgraph", "select", "path"];
  const LIST = 5;                                          // inputs / outputs listed on a card

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svgEl(tag, attrs) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  const fill = (template, values) => String(template).replace(/\{(\w+)\}/g, (m, k) => (k in values ? String(values[k]) : m));
  const num = (x, digits) => (typeof x === "number" && Number.isFinite(x) ? String(+x.toPrecision(digits || 3)) : "—");
  const short = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

  // ── the graph's JSON, checked ──────────────────────────────────────────────────
  function check(graph) {
    const fail = (why) => { throw new Error(why); };
    if (!graph || typeof graph !== "object" || Array.isArray(graph)) fail("it is not a JSON object");
    if (graph.qkv_graph !== 1) fail("it has no \"qkv_graph\": 1 (make it with qkv graph … --json)");
    if (!Array.isArray(graph.nodes) || !Array.isArray(graph.links)) fail("it has no \"nodes\" and \"links\" lists");
    if (!Array.isArray(graph.tokens) || !Number.isInteger(graph.layers)) fail("it has no \"tokens\" or \"layers\"");
    const ids = new Set();
    for (const [i, n] of graph.nodes.entries()) {
      if (!n || typeof n.id !== "string" || !["embedding", "feature", "error", "logit"].includes(n.kind) ||
          !Number.isInteger(n.layer) || !Number.isInteger(n.position)) fail(`node ${i} is not a node of the schema`);
      if (ids.has(n.id)) fail(`node ${n.id} is listed twice`);
      ids.add(n.id);
    }
    for (const [i, l] of graph.links.entries()) {
      if (!l || !ids.has(l.source) || !ids.has(l.target) || typeof l.weight !== "number")
        fail(`link ${i} does not join two nodes with a weight`);
    }
    return graph;
  }

  // ── where each node goes ───────────────────────────────────────────────────────
  function layout(graph) {
    const L = graph.layers, n = Math.max(graph.tokens.length, 1 + Math.max(0, ...graph.nodes.map((d) => d.position)));
    const order = {embedding: 0, feature: 1, error: 2, logit: 3};
    const cells = new Map();                                 // "row|position" → [node]
    for (const d of graph.nodes) {
      const key = `${d.layer + 1}|${d.position}`;
      if (!cells.has(key)) cells.set(key, []);
      cells.get(key).push(d);
    }
    const widths = new Array(n).fill(MIN_COL);
    for (const [key, list] of cells) {
      list.sort((a, b) => order[a.kind] - order[b.kind] || (b.influence || 0) - (a.influence || 0) || (a.id < b.id ? -1 : 1));
      const p = +key.split("|")[1];
      widths[p] = Math.max(widths[p], list.length * STEP + 16);
    }
    const left = [];
    let x = LEFT;
    for (const w of widths) { left.push(x); x += w; }
    const rowY = (layer) => TOP + (L - layer) * ROW;         // layer L (logits) at the top, −1 at the bottom
    const at = new Map();
    for (const [key, list] of cells) {
      const [row, p] = key.split("|").map(Number);
      const x0 = left[p] + widths[p] / 2 - ((list.length - 1) * STEP) / 2;
      list.forEach((d, i) => at.set(d.id, {x: x0 + i * STEP, y: rowY(row - 1)}));
    }
    return {at, left, widths, rowY, width: x + 24, height: rowY(-1) + BOTTOM, positions: n};
  }

  // ── the view ───────────────────────────────────────────────────────────────────
  class GraphView {
    constructor(root, graph, opts) {
      this.root = root;
      this.graph = check(graph);
      this.words = (opts && opts.words) || {};
      this.lang = opts && opts.lang && this.words[opts.lang] ? opts.lang : "en";
      this.byId = new Map(graph.nodes.map((d) => [d.id, d]));
      this.base = layout(graph);
      this.mode = "subgraph";
      this.groups = [];                                      // [{id, name, members: [node id]}]
      this.serial = 0;
      this.selected = new Set();
      this.kept = null;
      this.pinned = [];
      for (const g of Array.isArray(graph.supernodes) ? graph.supernodes : []) {   // a saved view's groups
        const members = (Array.isArray(g.members) ? g.members : []).filter((id) => this.byId.has(id) && !this.memberOf(id));
        if (members.length >= 2) this.groups.push({id: `S:${++this.serial}`, name: String(g.name || ""), members});
      }
      this.rebuild();
      if (Array.isArray(graph.pinned)) this.pinned = graph.pinned.filter((id) => this.shown.nodes.has(id));
      this.draw();
      root.dataset.ready = "1";
    }

    t(key, values) {
      const table = this.words[this.lang] || {};
      const template = key in table ? table[key] : (this.words.en || {})[key];
      return template === undefined ? key : fill(template, values || {});
    }

    memberOf(id) { return this.groups.find((g) => g.members.includes(id)) || null; }

    // the nodes and links shown: supernodes in place of their members, links between the shown nodes summed
    rebuild() {
      const rep = new Map();
      for (const g of this.groups) for (const m of g.members) rep.set(m, g.id);
      const nodes = new Map();
      for (const d of this.graph.nodes) if (!rep.has(d.id)) nodes.set(d.id, {id: d.id, kind: d.kind, node: d, ...this.base.at.get(d.id)});
      for (const g of this.groups) {
        const ps = g.members.map((m) => this.base.at.get(m));
        nodes.set(g.id, {id: g.id, kind: "super", group: g, x: ps.reduce((s, p) => s + p.x, 0) / ps.length,
                         y: ps.reduce((s, p) => s + p.y, 0) / ps.length});
      }
      const sums = new Map();
      for (const l of this.graph.links) {
        const s = rep.get(l.source) || l.source, t = rep.get(l.target) || l.target;
        if (s === t) continue;
        const key = s + "\u0000" + t;
        const link = sums.get(key) || {source: s, target: t, weight: 0};
        link.weight += l.weight;
        sums.set(key, link);
      }
      const links = [...sums.values()].sort((a, b) => Math.abs(a.weight) - Math.abs(b.weight));
      const into = new Map(), out = new Map();
      for (const l of links) {
        (into.get(l.target) || into.set(l.target, []).get(l.target)).push(l);
        (out.get(l.source) || out.set(l.source, []).get(l.source)).push(l);
      }
      this.shown = {nodes, links, into, out, top: Math.max(1e-30, ...links.map((l) => Math.abs(l.weight)))};
    }

    label(id) {                                             // a shown node's, or a supernode member's
      const v = this.shown.nodes.get(id);
      if (v && v.kind === "super") return v.group.name;
      const d = v ? v.node : this.byId.get(id);
      if (!d) return id;
      if (d.kind === "embedding" || d.kind === "logit") return d.token === undefined ? id : String(d.token);
      if (d.kind === "feature") return `L${d.layer} #${d.feature}`;
      return `${this.t("kind_error")} L${d.layer}@${d.position}`;
    }
    token(p) { const t = this.graph.tokens[p]; return t === undefined ? "?" : String(t); }

    // ── the page around the drawing ─────────────────────────────────────────────
    draw() {
      const g = this.graph, root = this.root;
      root.textContent = "";
      root.classList.add("qkv-graph");
      root.dataset.lang = this.lang;
      root.dataset.mode = this.mode;
      root.dataset.kept = this.kept || "";
      root.dataset.hover = "";
      root.lang = this.lang;

      const head = el("div", "qkv-g-head");
      head.append(el("h1", "qkv-g-title", this.t("title", {model: g.model || "?"})));
      const lang = el("button", "qkv-g-lang", this.t("lang"));
      lang.type = "button";
      lang.hidden = Object.keys(this.words).length < 2;
      lang.addEventListener("click", () => { this.lang = this.lang === "en" ? "ko" : "en"; this.draw(); });
      head.append(lang);
      const prompt = el("p", "qkv-g-prompt");
      prompt.append(el("b", null, this.t("prompt") + ": "), el("span", "qkv-g-text", String(g.prompt || "")));
      const target = g.target && g.target.token !== undefined ? String(g.target.token) : this.t("none");
      prompt.append(el("b", null, "  ·  " + this.t("target") + ": "), el("span", "qkv-g-target", target));

      const bar = el("div", "qkv-g-bar");
      const modes = el("span", "qkv-g-modes");
      for (const m of MODES) {
        const b = el("button", "qkv-g-mode", this.t("mode_" + m));
        b.type = "button";
        b.dataset.mode = m;
        b.setAttribute("aria-pressed", String(m === this.mode));
        b.addEventListener("click", () => { this.mode = m; root.dataset.mode = m; this.paintModes(); });
        modes.append(b);
      }
      this.modeButtons = modes;
      const all = el("button", "qkv-g-all", this.t("show_all"));
      all.type = "button";
      all.addEventListener("click", () => this.keep(null));
      this.name = el("input", "qkv-g-name");
      this.name.type = "text";
      this.name.maxLength = 60;
      this.name.placeholder = this.t("group_name");
      this.name.setAttribute("aria-label", this.t("group_name"));
      const group = el("button", "qkv-g-group", this.t("group"));
      group.type = "button";
      group.addEventListener("click", () => this.group());
      this.count = el("span", "qkv-g-count qkv-field");
      const exp = el("span", "qkv-export");
      exp.dataset.qkvExport = "skip";
      for (const kind of ["png", "svg", "json"]) {
        const b = el("button", "qkv-export-btn", kind.toUpperCase());
        b.type = "button";
        b.dataset.export = kind;
        b.title = this.t("export") + " " + kind.toUpperCase();
        b.addEventListener("click", () => this.export(kind).catch((e) => { this.note.textContent = String(e.message || e); }));
        exp.append(b);
      }
      this.note = el("span", "qkv-export-note");
      this.note.setAttribute("aria-live", "polite");
      exp.append(this.note);
      bar.append(modes, all, this.name, group, this.count, exp);
      this.hint = el("p", "qkv-caption qkv-g-hint");

      const main = el("div", "qkv-g-main");
      this.wrap = el("div", "qkv-g-wrap");
      const side = el("div", "qkv-g-side");
      this.card = el("div", "qkv-g-card");
      this.card.setAttribute("aria-live", "polite");
      this.scores = el("div", "qkv-g-scores");
      this.supers = el("div", "qkv-g-supers");
      this.path = el("div", "qkv-g-path");
      side.append(this.card, this.scores, this.supers, this.path);
      main.append(this.wrap, side);
      const kinds = el("p", "qkv-note qkv-g-kinds");
      for (const kind of ["embedding", "feature", "error", "logit", "super"]) {
        const swatch = el("span", "qkv-g-swatch");
        swatch.style.background = COLOURS[kind];
        kinds.append(swatch, el("span", null, this.t("kind_" + kind) + "   "));
      }
      root.append(head, prompt, bar, this.hint, main, kinds, el("p", "qkv-note qkv-g-legend", this.t("legend")));
      this.paintModes();
      this.drawScores();
      this.render();
    }

    paintModes() {
      for (const b of this.modeButtons.children) b.setAttribute("aria-pressed", String(b.dataset.mode === this.mode));
      this.hint.textContent = this.t("hint_" + this.mode);
    }

    drawScores() {
      const g = this.graph, s = g.scores || {}, box = this.scores;
      box.textContent = "";
      box.append(el("h3", null, this.t("scores")));
      const table = el("table", "qkv-g-table");
      const head = table.insertRow();
      for (const h of ["", this.t("unpruned"), this.t("pruned")]) head.append(el("th", null, h));
      for (const k of ["replacement", "completeness"]) {
        const row = table.insertRow();
        row.dataset.score = k;
        row.append(el("th", null, this.t(k)));
        for (const v of [s[k], s[k + "_pruned"]]) row.insertCell().textContent = typeof v === "number" ? num(v, 3) : this.t("not_computed");
      }
      box.append(table);
      if (g.thresholds) box.append(el("p", "qkv-field", this.t("thresholds", {node: num(g.thresholds.node), edge: num(g.thresholds.edge)})));
      const kinds = {feature: 0, error: 0, logit: 0};
      for (const d of g.nodes) if (d.kind in kinds) kinds[d.kind]++;
      box.append(el("p", "qkv-field qkv-g-counts", this.t("counts", {nodes: g.nodes.length, features: kinds.feature,
        errors: kinds.error, logits: kinds.logit, links: g.links.length})));
      if (Number.isInteger(g.links_total) && g.links_total > g.links.length)
        box.append(el("p", "qkv-field", this.t("dropped", {shown: g.links.length, total: g.links_total})));
    }

    // ── the drawing ─────────────────────────────────────────────────────────────
    render() {
      const b = this.base, sh = this.shown, g = this.graph;
      const svg = svgEl("svg", {class: "qkv-g-svg", width: b.width, height: b.height, viewBox: `0 0 ${b.width} ${b.height}`,
                                role: "img", "aria-label": this.t("title", {model: g.model || "?"})});
      svg.append(svgEl("rect", {class: "qkv-g-bg", x: 0, y: 0, width: b.width, height: b.height, fill: "#fff"}));
      const axes = svgEl("g", {class: "qkv-g-axes"});
      for (let layer = -1; layer <= g.layers; layer++) {
        const y = b.rowY(layer);
        axes.append(svgEl("line", {x1: LEFT - 6, x2: b.width - 24, y1: y, y2: y, stroke: "#eaeef2"}));
        const text = svgEl("text", {x: LEFT - 10, y: y + 4, "text-anchor": "end", class: "qkv-g-rowlabel"});
        text.textContent = layer < 0 ? this.t("row_embedding") : layer === g.layers ? this.t("row_logit") : String(layer);
        axes.append(text);
      }
      const title = svgEl("text", {x: 8, y: TOP - 40, class: "qkv-g-rowlabel"});
      title.textContent = this.t("layer");
      axes.append(title);
      for (let p = 0; p < b.positions; p++) {
        const x = b.left[p] + b.widths[p] / 2, y = b.rowY(-1) + 18;
        const text = svgEl("text", {x, y, "text-anchor": "end", transform: `rotate(-40 ${x} ${y})`, class: "qkv-g-token"});
        text.textContent = short(this.token(p), 14);
        axes.append(text);
      }
      svg.append(axes);

      const edges = svgEl("g", {class: "qkv-g-links", fill: "none"});
      this.linkEls = new Map();                              // node id → its links' paths
      for (const l of sh.links) {
        const s = sh.nodes.get(l.source), t = sh.nodes.get(l.target);
        const ym = (s.y + t.y) / 2;
        const path = svgEl("path", {class: "qkv-g-link", d: `M${s.x.toFixed(1)} ${s.y.toFixed(1)}C${s.x.toFixed(1)} ${ym.toFixed(1)} ` +
          `${t.x.toFixed(1)} ${ym.toFixed(1)} ${t.x.toFixed(1)} ${t.y.toFixed(1)}`,
          stroke: l.weight >= 0 ? POSITIVE : NEGATIVE, "stroke-width": (0.3 + 3.7 * Math.abs(l.weight) / sh.top).toFixed(2)});
        path.qkvLink = l;
        for (const id of [l.source, l.target]) (this.linkEls.get(id) || this.linkEls.set(id, []).get(id)).push(path);
        edges.append(path);
      }
      svg.append(edges);

      const nodes = svgEl("g", {class: "qkv-g-nodes"});
      this.nodeEls = new Map();
      for (const v of sh.nodes.values()) {
        const e = svgEl("g", {class: "qkv-g-node", "data-id": v.id, "data-kind": v.kind, tabindex: 0,
                              transform: `translate(${v.x.toFixed(1)} ${v.y.toFixed(1)})`});
        const colour = COLOURS[v.kind];
        if (v.kind === "embedding") e.append(svgEl("rect", {x: -R, y: -R, width: 2 * R, height: 2 * R, fill: colour, stroke: "#444"}));
        else if (v.kind === "error") e.append(svgEl("path", {d: `M0 ${-R - 1}L${R + 1} 0L0 ${R + 1}L${-R - 1} 0Z`, fill: colour, stroke: "#666"}));
        else if (v.kind === "logit") e.append(svgEl("rect", {x: -R - 1, y: -R, width: 2 * R + 2, height: 2 * R, rx: 3, fill: colour, stroke: "#444"}));
        else if (v.kind === "super") e.append(svgEl("rect", {x: -R - 4, y: -R - 2, width: 2 * R + 8, height: 2 * R + 4, rx: 6, fill: colour, stroke: "#7f3b08"}));
        else e.append(svgEl("circle", {r: R, fill: colour, stroke: "#8c510a"}));
        if (v.kind === "logit" || v.kind === "super") {
          const text = svgEl("text", {x: 2, y: -R - 5, transform: "rotate(-35 2 " + (-R - 5) + ")", class: "qkv-g-nodelabel"});
          text.textContent = short(this.label(v.id), 18);
          e.append(text);
        }
        this.nodeEls.set(v.id, e);
        nodes.append(e);
      }
      svg.append(nodes);

      svg.addEventListener("mouseover", (ev) => { const n = ev.target.closest(".qkv-g-node"); if (n) this.hover(n.dataset.id); });
      svg.addEventListener("focusin", (ev) => { const n = ev.target.closest(".qkv-g-node"); if (n) this.hover(n.dataset.id); });
      svg.addEventListener("mouseout", (ev) => { const n = ev.target.closest(".qkv-g-node"); if (n && !n.contains(ev.relatedTarget)) this.hover(null); });
      svg.addEventListener("click", (ev) => this.click(ev.target.closest(".qkv-g-node"), ev.shiftKey));
      svg.addEventListener("keydown", (ev) => {
        const n = ev.target.closest(".qkv-g-node");
        if (n && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); this.click(n, ev.shiftKey); }
      });
      this.wrap.textContent = "";
      this.wrap.append(svg);
      this.svg = svg;
      this.paint();
      this.drawCard(null);
      this.drawSupers();
      this.drawPath();
    }

    // classes from the state: off (outside the kept sub-graph), sel (selected), pin (on the pinned path)
    paint() {
      const sh = this.shown;
      let keepNodes = null, keepLink = null;
      if (this.kept && sh.nodes.has(this.kept)) {
        const up = this.reach(this.kept, sh.into, "source"), down = this.reach(this.kept, sh.out, "target");
        keepNodes = new Set([...up, ...down]);
        keepLink = (l) => (up.has(l.source) && up.has(l.target)) || (down.has(l.source) && down.has(l.target));
      }
      const onPath = new Set(this.pinned), pathLinks = new Set();
      for (let i = 1; i < this.pinned.length; i++) pathLinks.add(this.pinned[i - 1] + "\u0000" + this.pinned[i]);
      for (const [id, e] of this.nodeEls) {
        e.classList.toggle("qkv-g-off", keepNodes !== null && !keepNodes.has(id));
        e.classList.toggle("qkv-g-sel", this.selected.has(id));
        e.classList.toggle("qkv-g-pin", onPath.has(id));
      }
      for (const p of this.svg.querySelectorAll(".qkv-g-link")) {
        const l = p.qkvLink;
        p.classList.toggle("qkv-g-off", keepLink !== null && !keepLink(l));
        p.classList.toggle("qkv-g-pin", pathLinks.has(l.source + "\u0000" + l.target));
      }
      this.root.dataset.kept = this.kept || "";
      const total = sh.nodes.size;
      this.count.textContent = (keepNodes ? this.t("kept", {count: keepNodes.size, total}) + " · " : "") +
        this.t("selected", {count: this.selected.size});
    }

    reach(start, adjacency, end) {                            // START and every node reached along ADJACENCY
      const seen = new Set([start]), stack = [start];
      while (stack.length) {
        for (const l of adjacency.get(stack.pop()) || []) {
          if (!seen.has(l[end])) { seen.add(l[end]); stack.push(l[end]); }
        }
      }
      return seen;
    }

    hover(id) {
      this.root.dataset.hover = id || "";
      for (const p of this.svg.querySelectorAll(".qkv-g-hot")) p.classList.remove("qkv-g-hot");
      if (id) for (const p of this.linkEls.get(id) || []) p.classList.add("qkv-g-hot");
      this.drawCard(id);
    }

    click(nodeEl, shift) {
      if (!nodeEl) {                                          // the background
        if (this.mode === "subgraph") this.keep(null);
        return;
      }
      const id = nodeEl.dataset.id;
      if (shift || this.mode === "select") {
        if (this.selected.has(id)) this.selected.delete(id); else this.selected.add(id);
        this.paint();
      } else if (this.mode === "subgraph") {
        this.keep(this.kept === id ? null : id);
      } else {
        this.pin(id);
      }
    }

    keep(id) { this.kept = id; this.paint(); }

    pin(id) {
      const sh = this.shown, path = [id], seen = new Set([id]);
      const strongest = (list) => list.reduce((a, l) => (!a || Math.abs(l.weight) > Math.abs(a.weight) ? l : a), null);
      for (let cur = id; ;) {                                 // down: the strongest incoming edge, step by step
        const l = strongest((sh.into.get(cur) || []).filter((x) => !seen.has(x.source)));
        if (!l) break;
        path.unshift(cur = l.source);
        seen.add(cur);
      }
      for (let cur = id; ;) {                                 // up: the strongest outgoing edge
        const l = strongest((sh.out.get(cur) || []).filter((x) => !seen.has(x.target)));
        if (!l) break;
        path.push(cur = l.target);
        seen.add(cur);
      }
      this.pinned = path;
      this.paint();
      this.drawPath();
    }

    group() {
      const members = [];
      for (const id of this.selected) {
        const v = this.shown.nodes.get(id);
        if (!v) continue;
        if (v.kind === "super") { members.push(...v.group.members); this.groups = this.groups.filter((x) => x !== v.group); }
        else members.push(id);
      }
      if (members.length < 2) { this.count.textContent = this.t("need_two"); return; }
      const name = this.name.value.trim() || this.t("default_group", {n: this.groups.length + 1});
      this.groups.push({id: `S:${++this.serial}`, name, members});
      this.name.value = "";
      this.regroup();
    }

    ungroup(g) { this.groups = this.groups.filter((x) => x !== g); this.regroup(); }

    regroup() {                                               // ids change: the selection, kept node and path go
      this.selected.clear();
      this.kept = null;
      this.pinned = [];
      this.rebuild();
      this.render();
    }

    drawSupers() {
      const box = this.supers;
      box.textContent = "";
      box.append(el("h3", null, this.t("supernodes")));
      const list = el("ul", "qkv-g-list");
      for (const g of this.groups) {
        const item = el("li", "qkv-g-super");
        item.dataset.id = g.id;
        item.append(el("span", "qkv-g-supername", g.name), el("span", "qkv-field", ` (${g.members.length}) `));
        const b = el("button", "qkv-g-ungroup", this.t("ungroup"));
        b.type = "button";
        b.addEventListener("click", () => this.ungroup(g));
        item.append(b);
        list.append(item);
      }
      box.append(list);
    }

    drawPath() {
      const box = this.path;
      box.textContent = "";
      box.append(el("h3", null, this.t("path")));
      if (!this.pinned.length) { box.append(el("p", "qkv-field", this.t("no_path"))); return; }
      const list = el("ol", "qkv-g-list qkv-g-steps");
      this.pinned.forEach((id, i) => {
        const item = el("li", null, this.label(id));
        item.dataset.id = id;
        if (i > 0) {
          const l = (this.shown.into.get(id) || []).find((x) => x.source === this.pinned[i - 1]);
          item.append(el("span", "qkv-field", `  ← ${num(l ? l.weight : NaN)}`));
        }
        list.append(item);
      });
      const clear = el("button", "qkv-g-clear", this.t("clear_path"));
      clear.type = "button";
      clear.addEventListener("click", () => { this.pinned = []; this.paint(); this.drawPath(); });
      box.append(list, clear);
    }

    // ── the card of the node under the pointer ───────────────────────────────────
    drawCard(id) {
      const card = this.card;
      card.textContent = "";
      const v = id ? this.shown.nodes.get(id) : null;
      if (!v) { card.append(el("p", "qkv-field", this.t("card_empty"))); return; }
      card.dataset.id = id;
      const rows = el("dl", "qkv-g-facts");
      const fact = (key, value) => { rows.append(el("dt", null, this.t(key)), el("dd", null, value)); };
      if (v.kind === "super") {
        card.append(el("h3", null, this.t("card_super", {name: v.group.name, count: v.group.members.length})));
        card.append(el("p", "qkv-field qkv-g-members", v.group.members.map((m) => this.label(m)).join(", ")));
      } else {
        const d = v.node;
        const title = d.kind === "feature" ? this.t("card_feature", {feature: d.feature, layer: d.layer, position: d.position, token: this.token(d.position)})
          : d.kind === "embedding" ? this.t("card_embedding", {token: d.token === undefined ? this.token(d.position) : String(d.token), position: d.position})
          : d.kind === "error" ? this.t("card_error", {layer: d.layer, position: d.position, token: this.token(d.position)})
          : this.t("card_logit", {token: String(d.token), id: d.token_id, p: num(d.probability)});
        card.append(el("h3", null, title));
        if (d.kind === "feature") fact("activation", num(d.activation, 4));
        if (d.kind === "error") fact("norm", num(d.norm, 4));
        if (d.kind === "logit") fact("logit", num(d.logit, 4));
        fact("influence", num(d.influence, 3));
        card.append(rows);
        if (d.kind === "feature") this.annotation(card, d);
      }
      for (const [key, list, end] of [["inputs", this.shown.into.get(id), "source"], ["outputs", this.shown.out.get(id), "target"]]) {
        if (!list || !list.length) continue;
        const top = [...list].sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, LIST);
        card.append(el("h4", null, this.t(key)));
        const ul = el("ul", "qkv-g-list");
        for (const l of top) {
          const li = el("li", null, this.label(l[end]) + "  ");
          li.append(el("span", l.weight >= 0 ? "qkv-g-up" : "qkv-g-down", (l.weight >= 0 ? "+" : "") + num(l.weight)));
          ul.append(li);
        }
        card.append(ul);
      }
    }

    annotation(card, d) {
      const a = (this.graph.features || {})[`${d.layer}:${d.feature}`];
      if (!a) { card.append(el("p", "qkv-note", this.t("no_annotation"))); return; }
      for (const [key, cls] of [["promotes", "qkv-g-up"], ["suppresses", "qkv-g-down"]]) {
        const items = Array.isArray(a[key]) ? a[key] : [];
        if (!items.length) continue;
        const p = el("p", "qkv-g-tokens");
        p.dataset.list = key;
        p.append(el("b", null, this.t(key) + ": "));
        for (const [tok, value] of items) {
          const s = el("span", "qkv-g-tok " + cls, String(tok));
          s.title = num(value);
          p.append(s, document.createTextNode(" "));
        }
        card.append(p);
      }
      const contexts = Array.isArray(a.contexts) ? a.contexts : [];
      if (!contexts.length) return;
      card.append(el("h4", null, this.t("contexts")));
      for (const c of contexts) {
        const tokens = Array.isArray(c.tokens) ? c.tokens : [], values = Array.isArray(c.values) ? c.values : [];
        const top = Math.max(1e-30, ...values.map((x) => (typeof x === "number" ? x : 0)));
        const line = el("p", "qkv-g-context");
        tokens.forEach((tok, i) => {
          const z = typeof values[i] === "number" ? values[i] : 0;
          const s = el("span", "qkv-g-ctok", String(tok));
          if (z > 0) s.style.background = `rgba(214,96,77,${(0.15 + 0.85 * z / top).toFixed(3)})`;
          if (z === top) s.classList.add("qkv-g-peak");
          s.title = num(z);
          line.append(s);
        });
        card.append(line);
      }
    }

    // ── export ───────────────────────────────────────────────────────────────────
    fileName(ext) { return String(this.graph.model || "graph").replace(/[^\w.-]+/g, "_") + "-graph." + ext; }

    svgText() {                                               // the drawing with its computed styles inlined
      const copy = this.svg.cloneNode(true), from = this.svg.querySelectorAll("*"), to = copy.querySelectorAll("*");
      const props = ["fill", "stroke", "stroke-width", "opacity", "font-family", "font-size", "font-weight", "display"];
      from.forEach((e, i) => {
        const cs = getComputedStyle(e);
        to[i].setAttribute("style", props.map((p) => `${p}:${cs.getPropertyValue(p)}`).join(";"));
        to[i].removeAttribute("class");
        to[i].removeAttribute("tabindex");
      });
      copy.setAttribute("xmlns", NS);
      copy.removeAttribute("class");
      const faces = [];
      for (const sheet of document.styleSheets) {
        let rules;
        try { rules = sheet.cssRules; } catch (e) { continue; }
        for (const r of rules) if (r.type === CSSRule.FONT_FACE_RULE) faces.push(r.cssText);
      }
      if (faces.length) { const st = document.createElementNS(NS, "style"); st.textContent = faces.join("\n"); copy.prepend(st); }
      return new XMLSerializer().serializeToString(copy) + "\n";
    }

    png() {
      const text = this.svgText(), w = this.base.width, h = this.base.height;
      const k = Math.min(2, 16000 / Math.max(w, h), Math.sqrt(1e8 / (w * h)));
      return global.QKV_EXPORT.rasterise(text, w, h, k, "graph");       // export.js, inlined before this script
    }

    json() {                                                  // the graph and the reader's view of it
      const out = Object.assign({}, this.graph);
      out.supernodes = this.groups.map((g) => ({name: g.name, members: g.members.slice()}));
      out.pinned = this.pinned.slice();
      return JSON.stringify(out, null, 1);
    }

    async export(kind) {
      const blob = kind === "png" ? await this.png()
        : new Blob([kind === "svg" ? this.svgText() : this.json()], {type: kind === "svg" ? "image/svg+xml" : "application/json"});
      const name = this.fileName(kind), a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = name;
      a.hidden = true;
      document.body.append(a);
      a.click();
      setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
      this.note.textContent = this.t("saved", {name});
    }
  }

  function mount(root, graph, opts) { return new GraphView(root, graph, opts); }

  // text laid out before the page's Hangul face is ready may keep the missing-glyph box: wait for it first
  function fontsReady() {
    return document.fonts && document.fonts.load ? document.fonts.load('13px "qkv Hangul"', "\uD55C").catch(() => null)
      : Promise.resolve(null);
  }

  async function boot() {
    await fontsReady();
    for (const root of document.querySelectorAll("[data-qkv-graph]")) {
      const data = root.parentNode.querySelector("script.qkv-graph-data");
      const payload = JSON.parse(data.textContent);
      root.qkvGraph = mount(root, payload.graph, {words: payload.words, lang: payload.lang});
    }
  }

  global.QKV_GRAPH = {mount, check, boot, layout, fontsReady};
})(typeof window !== "undefined" ? window : this);
