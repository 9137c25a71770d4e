/* qkv edge attribution: the circuit page of `qkv eap --out` (viz/eap_figures.py's circuit_page; its data there).
 *
 *   QKV_EAP.boot()    draws every [data-qkv-eap] of the page from its script.qkv-eap-data
 *
 * Layout: a row per layer (the embedding at the bottom, the logits at the top), across it the layer's heads then
 * its FFN (split into q, k, v, a head's three inputs enter it at its left, middle and right). An edge
 * sender → receiver is a curve, red when its score is positive (patching it moves the metric up),
 * blue when negative, its width ∝ |score| (on the largest shown); the strongest are drawn last. The slider sets how
 * many of the top edges are drawn; hovering an edge or a component shows its numbers. The faithfulness curve (the
 * metric recovered by real edge patching as the top k edges are kept) is drawn below, a point's numbers on hover.
 * Every text from the data (prompts, names, the metric) is set as textContent, never as markup. The root's data-*
 * say what is shown (tests read them): data-ready, data-shown, data-hover.
 */
(function (global) {
  "use strict";

  // SVG's namespace: a name, never fetched; written in parts so that no page of qkv holds a URL at all
  const NS = ["http" + ":", "", "www.w3.org", "2000", "svg"].join("/");
  const RED = "#b2182b", BLUE = "#2166ac", GREY = "#9a9a9a";

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }

  function fmt(x) {
    return (x >= 0 ? "+" : "") + Number(x).toPrecision(4);
  }

  function mount(root, data) {
    const L = data.n_layers, H = data.n_heads;
    const edges = data.edges || [];
    const col = 46, row = 44, pad = 30;
    const width = pad * 2 + col * (H + 1) + 50, height = pad * 2 + row * (L + 1);   // + 50: the FFN column's bows

    // where each component sits: "embed" at the bottom, "Ll.Hh" / "Ll.FFN" in row l, "logits" on top
    function place(name) {
      if (name === "embed") return [pad + col * (H + 1) / 2, height - pad];
      if (name === "logits") return [pad + col * (H + 1) / 2, pad];
      const m = /^L(\d+)\.(?:H(\d+)(?:\.([qkv]))?|FFN)$/.exec(name);
      const l = Number(m[1]), slot = m[2] === undefined ? H : Number(m[2]);
      const part = {q: -8, k: 0, v: 8}[m[3]] || 0;                // a head's q, k, v inputs: its left, middle, right
      return [pad + col * slot + col / 2 + part, height - pad - row * (l + 1)];
    }

    root.textContent = "";
    const head = el("div", {class: "qkv-eap-head"});
    head.append(el("h2", {}, "Edge attribution · " + (data.model || "")),
                el("p", {}, "clean: " + (data.clean || "")),
                el("p", {}, "corrupt: " + (data.corrupted || "")),
                el("p", {}, data.method.toUpperCase() + (data.steps ? " (" + data.steps + " steps)" : "") + " of " +
                   data.metric + ": " + Number(data.metric_clean).toFixed(3) + " clean, " +
                   Number(data.metric_corrupted).toFixed(3) + " corrupt; " + data.n_edges + " edges"));
    const controls = el("div", {class: "qkv-eap-controls"});
    const slider = el("input", {type: "range", min: "1", max: String(Math.max(1, edges.length)),
                                value: String(Math.min(50, edges.length || 1))});
    const count = el("span", {});
    controls.append(el("label", {}, "edges shown "), slider, count);
    const info = el("p", {class: "qkv-eap-info"}, "hover an edge or a component");
    const board = svg("svg", {width: String(width), height: String(height), viewBox: "0 0 " + width + " " + height,
                              class: "qkv-eap-circuit"});
    const curve = svg("svg", {width: "520", height: "240", viewBox: "0 0 520 240", class: "qkv-eap-curve"});
    root.append(head, controls, info, board, el("h3", {}, "Faithfulness by edge patching"), curve);

    function say(text, what) {
      info.textContent = text;
      root.dataset.hover = what || "";
    }

    function components(shown) {
      const g = svg("g", {});
      const used = new Set(shown.flatMap((e) => [e[0], e[1].replace(/\.[qkv]$/, "")]));   // the circuit's, outlined
      const names = ["embed", "logits"];
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) names.push("L" + l + ".H" + h);
        names.push("L" + l + ".FFN");
      }
      for (const name of names) {
        const [x, y] = place(name);
        const ffn = name.endsWith("FFN"), end = name === "embed" || name === "logits";
        const shape = ffn || end ? svg("rect", {x: x - 9, y: y - 7, width: 18, height: 14, rx: 2})
                                 : svg("circle", {cx: x, cy: y, r: 7});
        shape.setAttribute("fill", end ? "#444" : ffn ? "#d9d9d9" : "#f4f4f4");
        shape.setAttribute("stroke", used.has(name) ? "#111" : "#aaa");
        shape.setAttribute("stroke-width", used.has(name) ? "2" : "1");
        shape.addEventListener("mouseenter", () => {
          const k = Number(slider.value);
          let into = 0, out = 0, nin = 0, nout = 0;
          for (const [s, r, v] of edges.slice(0, k)) {
            if (r === name || r.startsWith(name + ".")) { into += v; nin++; }   // a head's q, k, v inputs too
            if (s === name) { out += v; nout++; }
          }
          say(name + ": " + nin + " edges in (Σ " + fmt(into) + "), " + nout + " out (Σ " + fmt(out) + ")", name);
        });
        g.append(shape);
        if (end) {
          const t = svg("text", {x: x + 14, y: y + 4, "font-size": "11", fill: "#444"});
          t.textContent = name;
          g.append(t);
        }
      }
      for (let l = 0; l < L; l += Math.max(1, Math.ceil(L / 15))) {
        const t = svg("text", {x: 2, y: height - pad - row * (l + 1) + 4, "font-size": "10", fill: "#666"});
        t.textContent = "L" + l;
        g.append(t);
      }
      return g;
    }

    function draw() {
      const k = Number(slider.value);
      count.textContent = " " + k + " of " + edges.length + " (top by |score|)";
      board.textContent = "";
      const shown = edges.slice(0, k);
      const top = Math.max(1e-30, ...shown.map((e) => Math.abs(e[2])));
      const lines = svg("g", {fill: "none"});
      for (const [s, r, v] of shown.slice().reverse()) {           // the strongest drawn last, on top
        const [x1, y1] = place(s), [x2, y2] = place(r);
        const bend = y1 === y2 ? -row * 0.6 : 0;                     // within a layer: arched above it
        const side = x1 === x2 ? Math.min(45, 12 + 0.12 * Math.abs(y1 - y2)) : 0;   // within a column: bowed right
        const mid = (y1 + y2) / 2 + bend;
        const path = svg("path", {d: "M" + x1 + "," + y1 + " C" + (x1 + side) + "," + mid + " " + (x2 + side) + "," +
                                     mid + " " + x2 + "," + y2,
                                  stroke: v >= 0 ? RED : BLUE, "stroke-width": String(0.6 + 5 * Math.abs(v) / top),
                                  "stroke-opacity": "0.75"});
        path.addEventListener("mouseenter", () => say(s + " → " + r + ": score " + fmt(v), s + "->" + r));
        lines.append(path);
      }
      board.append(lines, components(shown));
      root.dataset.shown = String(k);
    }

    function drawCurve() {
      const pts = data.curve || [];
      if (!pts.length) return;
      const w = 520, h = 240, m = 40;
      const X = (k) => m + (w - 2 * m) * Math.log10(1 + k) / Math.log10(1 + Math.max(1, data.n_edges));
      const lo = Math.min(0, ...pts.map((p) => p[1])), hi = Math.max(1, ...pts.map((p) => p[1]));
      const Y = (f) => h - m - (h - 2 * m) * (f - lo) / (hi - lo || 1);
      for (const f of [0, 1]) {
        curve.append(svg("line", {x1: m, x2: w - m, y1: Y(f), y2: Y(f), stroke: GREY, "stroke-dasharray": "4 3"}));
        const t = svg("text", {x: 4, y: Y(f) + 4, "font-size": "10", fill: "#666"});
        t.textContent = String(f);
        curve.append(t);
      }
      curve.append(svg("polyline", {points: pts.map((p) => X(p[0]) + "," + Y(p[1])).join(" "), fill: "none",
                                    stroke: RED, "stroke-width": "2"}));
      for (const [k, f, mval] of pts) {
        const dot = svg("circle", {cx: X(k), cy: Y(f), r: 4, fill: RED});
        dot.addEventListener("mouseenter", () =>
          say(k + " edges kept: faithfulness " + Number(f).toFixed(4) +
              (mval === undefined ? "" : ", metric " + Number(mval).toFixed(4)), "curve:" + k));
        curve.append(dot);
        const label = svg("text", {x: X(k) - 6, y: h - m + 14, "font-size": "9", fill: "#666"});
        label.textContent = String(k);
        curve.append(label);
      }
      const t = svg("text", {x: w / 2 - 80, y: h - 4, "font-size": "11", fill: "#444"});
      t.textContent = "edges kept (log scale)";
      curve.append(t);
    }

    slider.addEventListener("input", draw);
    draw();
    drawCurve();
    root.dataset.ready = "1";
  }

  function boot() {
    for (const root of document.querySelectorAll("[data-qkv-eap]")) {
      const script = root.parentNode.querySelector("script.qkv-eap-data");
      mount(root, JSON.parse(script.textContent));
    }
  }

  global.QKV_EAP = {mount: mount, boot: boot};
})(window);
