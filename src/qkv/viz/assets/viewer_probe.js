/* qkv viewer panel of linear probes (`qkv probe`, qkv/analysis/probes.py): per probed layer, the probe's
 * held-out accuracy, the control task's (Hewitt & Liang 2019: one random label per word type) and their
 * difference, the selectivity — a table of bars, a row per layer, its numbers on hover. The optional section
 * "probe" of viewer.js (qkv/viz/probe_panel.py: probe_section documents it).
 *
 * Labels and texts reach the page only through textContent: never parsed as HTML. No network. Load after
 * viewer_panels.js: it registers QKV.panels.probe (the interface is at the top of viewer_panels.js).
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_probe.js");
  const {el} = QKV.util;
  const {about, signed} = QKV.draw;

  const COLOURS = {accuracy: "#2c7fb8", control_accuracy: "#8c8c8c", selectivity: "#1a9850", negative: "#d73027"};

  function buildProbe(v) {
    const P = v.p.probe, panel = v.panels.probe;
    const readout = el("p", "qkv-readout", "hover or focus a layer");
    readout.setAttribute("aria-live", "polite");
    const table = el("table", "qkv-cands qkv-probe-table"), head = el("tr"), body = el("tbody");
    for (const h of ["layer", "accuracy", "control", "selectivity", "train"]) head.append(el("th", null, h));
    const thead = el("thead");
    thead.append(head);
    table.append(thead, body);
    const bar = (x, key) => {                                   // x in [−1, 1]: a bar of |x|, red below 0
      const td = el("td", "qkv-pcell"), b = el("span", "qkv-pbar");
      td.style.width = "140px";
      b.style.width = (100 * Math.min(1, Math.abs(x))).toFixed(2) + "%";
      b.style.background = x < 0 ? COLOURS.negative : COLOURS[key];
      b.title = key;
      td.append(b);
      return td;
    };
    const line = (k) => `layer ${P.layers[k]}: accuracy ${P.accuracy[k].toFixed(3)} · control ` +
      `${P.control_accuracy[k].toFixed(3)} · selectivity ${signed(P.selectivity[k], 3)} · train ` +
      `${P.train_accuracy[k].toFixed(3)}`;
    P.layers.forEach((layer, k) => {
      const tr = el("tr", "qkv-probe-row");
      tr.dataset.layer = String(layer);
      tr.tabIndex = 0;
      const num = (text) => el("td", "qkv-p", text);
      tr.append(num(String(layer)));
      for (const key of ["accuracy", "control_accuracy", "selectivity"]) {
        const cell = bar(P[key][k], key);
        cell.prepend(el("span", "qkv-p", key === "selectivity" ? signed(P[key][k], 3) : P[key][k].toFixed(3)));
        tr.append(cell);
      }
      tr.append(num(P.train_accuracy[k].toFixed(3)));
      const show = () => { v.set({cell: {i: k, j: 0, t: "probe"}}); };
      tr.addEventListener("mouseenter", show);
      tr.addEventListener("focus", show);
      body.append(tr);
    });
    panel.append(about([["model ", P.model], ["labels ", P.labels.join(" / ")],
                        ["texts ", `${P.n_train} to train, ${P.n_test} held out; read at the ${P.position} token, ` +
                                   `${P.point} of each layer`],
                        ["majority ", `${P.majority.toFixed(3)} (always the most common training label)`],
                        ["control ", P.control], ["attention ", `the other tabs show “${P.text}”`]]),
                 table, readout,
                 el("p", "qkv-note", "Logistic regression on each layer's activations, scored on texts it never saw. " +
                    "Selectivity = accuracy − control accuracy: high when the layer encodes the label, low when the " +
                    "probe could be memorising word types."));

    function draw() {
      const s = v.state, k = s.cell && s.cell.t === "probe" ? s.cell.i : null;
      for (const tr of body.children) tr.classList.toggle("qkv-chosen", k !== null && tr === body.children[k]);
      readout.textContent = k === null ? "hover or focus a layer" : line(k);
    }
    return {draw};
  }

  QKV.panels.probe = {
    build: buildProbe,
    meta: (v) => [`probes: ${v.p.probe.layers.length} layers`],
  };
})(window);
