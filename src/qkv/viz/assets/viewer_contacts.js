/* qkv viewer panel of a protein's contact map (ESM-2's contact head, qkv/analysis/contacts.py; Rao et al. 2020):
 * the map P the contact head predicts from every head (residue × residue, σ of a regression over the heads'
 * symmetrised, APC-corrected maps), beside the chosen head's own map F (the regression's input: A + Aᵀ, APC) and its
 * raw attention over the residues (the bytes the other views draw, <cls> and <eos> left out). The Layer selector
 * picks the layer, the head view's head (or a head of the list, or a cell of the r grid) the head; no head chosen:
 * the layer's best-matching one. Hover a cell: the residue pair, P, F and the attention.
 * The optional section "contacts" of viewer.js (qkv/viz/contact_panel.py documents it).
 *
 * Residues reach the page only through textContent and canvas fillText: never parsed as HTML. No network. Load
 * after viewer_panels.js: it registers QKV.panels.contacts (the interface is at the top of viewer_panels.js).
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_contacts.js");
  const {el, shown} = QKV.util;
  const {Heat, ramp, legend, signed, about, RDBU, diverging, viridis} = QKV.draw;
  const {decode} = QKV_WIRE;

  function buildContacts(v) {
    const C = v.p.contacts, panel = v.panels.contacts, m = C.residues.length, H = C.heads, X = v.extra.contacts;
    const names = C.residues.map((r, i) => `${i + 1} ${shown(r, 6)}`);           // "12 K": number and residue
    const shipped = new Map(C.maps.heads.map(([l, h], k) => [l * H + h, k]));  // (layer, head) → its map
    const size = 280;                                                            // each map's box, px
    const readout = el("p", "qkv-readout", "hover a cell");
    readout.setAttribute("aria-live", "polite");
    const note = el("p", "qkv-note qkv-contacts-head");
    let cell = null, drawn = null;                                  // the hovered cell; the head drawn {l, h, li}
    const hover = (c, e, heat) => {
      cell = c;
      if (c) { const t = text(c); heat.showTip(e, t, c); readout.textContent = t; }
      else readout.textContent = "hover a cell";
      for (const h of maps) h.draw(c);
    };
    const map = (name, title) => new Heat({name: "contacts-" + name, rows: m, cols: m, width: size - 40,
                                           height: size - 40, rowLabels: names, colLabels: names, title, keys: true,
                                           onCell: hover});
    const P = map("predicted", "P · the contact head's prediction"), F = map("head", "the head's map F"),
          A = map("attention", "the head's attention");
    const maps = [P, F, A];
    P.paint((r, c) => viridis(X.predicted[r * m + c]));
    const figs = el("div", "qkv-figs");
    figs.append(P.box, F.box, A.box);

    // the best heads, as buttons; every head's r as an L × H grid (click a cell to show that head)
    const list = el("div", "qkv-modes qkv-contacts-best");
    list.setAttribute("role", "group");
    list.setAttribute("aria-label", "heads whose map best matches P");
    const pick = (l, h) => {
      const li = v.p.layers.indexOf(l);
      if (li >= 0) v.set({layer: li, head: h, cell: null});
    };
    for (const b of C.best) {
      const button = el("button", "qkv-mode qkv-contact-head", `L${b.layer}.H${b.head} r ${signed(b.r, 2)}`);
      button.type = "button";
      Object.assign(button.dataset, {layer: b.layer, head: b.head});
      button.addEventListener("click", () => pick(b.layer, b.head));
      list.append(button);
    }
    const top = Math.max(1e-12, ...C.scores.flat().map(Math.abs));
    const grid = new Heat({name: "contacts-r", rows: C.layers, cols: H, width: Math.min(420, 28 * H),
                           height: 22 * C.layers, rowLabels: [...Array(C.layers).keys()].map(l => "layer " + l),
                           colLabels: [...Array(H).keys()].map(String), title: "each head's r with P (columns: heads)",
                           onCell: (c, e, heat) => {
                             if (c) heat.showTip(e, `L${c.r}.H${c.c}: r ${signed(C.scores[c.r][c.c], 3)}`, c);
                           },
                           onPick: (c) => pick(c.r, c.c)});
    grid.paint((r, c) => ramp(RDBU, 0.5 + 0.5 * C.scores[r][c] / top));
    const sure = C.top.map(t => `${names[t.i]} – ${names[t.j]} ${t.p.toFixed(2)}`).join(", ");
    const scale = el("div");
    panel.append(about([["residues ", `${m}`], ["surest pairs ", sure || "—"]]), note, figs, readout, scale,
                 el("p", "qkv-note", `Heads whose map best matches P (Pearson's r over the pairs |i − j| ≥ ` +
                    `${C.separation}; neighbours along the chain touch trivially):`), list, grid.box,
                 el("p", "qkv-note", "P[i, j] = σ(Σ_c w_c·F_c[i, j] + b): ESM's contact head, a logistic regression " +
                    "over every head's map F_c = APC(A_c + A_cᵀ), A_c the head's attention over the residues " +
                    "(<cls> and <eos> left out) and APC(X) = X − (X·1)(1ᵀ·X)/(1ᵀ·X·1) the average product " +
                    "correction. The third map is the head's attention itself, rows the residue that looks."));

    // the head shown: the chosen one, or the layer's best-matching one when all heads are
    function chosen() {
      const s = v.state, l = v.p.layers[s.layer];
      if (s.head >= 0) return {l, h: s.head, li: s.layer, best: false};
      const row = C.scores[l] || [];
      let h = 0;
      row.forEach((r, k) => { if (r > row[h]) h = k; });
      return {l, h, li: s.layer, best: true};
    }
    const mapOf = (d) => {                                          // F of the head shown, or null (not shipped)
      const k = shipped.get(d.l * H + d.h);
      return k === undefined ? null : X.maps.subarray(k * m * m, (k + 1) * m * m);
    };
    const attention = (d, i, j) => v.A(d.li, d.h)[(i + C.first) * v.nk + (j + C.first)] / 255;

    function text(c) {
      const d = drawn, f = mapOf(d), k = c.r * m + c.c;
      return `residues ${names[c.r]} – ${names[c.c]}: P ${X.predicted[k].toFixed(4)} · ` +
        `L${d.l}.H${d.h} F ${f ? signed(f[k], 4) : "not in the page"} · attention ${attention(d, c.r, c.c).toFixed(3)}`;
    }

    function draw() {
      const d = chosen(), key = `${d.l}/${d.h}`;
      for (const b of list.children)
        b.setAttribute("aria-pressed", String(`${b.dataset.layer}/${b.dataset.head}` === key));
      if (drawn && `${drawn.l}/${drawn.h}` === key) return;
      drawn = d;
      panel.dataset.layer = d.l;
      panel.dataset.head = d.h;
      const f = mapOf(d), r = (C.scores[d.l] || [])[d.h];
      note.textContent = `layer ${d.l}, head ${d.h}` +
        `${d.best ? " (the layer's best-matching: choose a head below)" : ""} · r with P ` +
        `${r === undefined ? "—" : signed(r, 3)}`;
      let most = 0;
      if (f) for (const x of f) most = Math.max(most, Math.abs(x));
      F.title.textContent = f ? `L${d.l}.H${d.h}'s map F = APC(A + Aᵀ)`
                              : `L${d.l}.H${d.h}'s map is not in this page (only the best-matching heads' are)`;
      F.paint((r_, c) => f ? diverging(f[r_ * m + c], most) : null);
      F.canvas.dataset.top = String(most);
      A.title.textContent = `L${d.l}.H${d.h}'s attention (row looks at column)`;
      A.paint((r_, c) => viridis(attention(d, r_, c)));
      for (const h of maps) h.draw(cell);
      grid.draw({r: d.l, c: d.h});
      scale.replaceChildren(legend(viridis, ["0", "0.5", "1"], "P and attention"),
                            legend((t) => ramp(RDBU, t), ["−" + most.toFixed(3), "0", "+" + most.toFixed(3)], "F"));
      if (cell) readout.textContent = text(cell);
    }
    return {draw};
  }

  QKV.panels.contacts = {
    build: buildContacts,
    decode: async (C) => ({predicted: await decode(C.predicted), maps: await decode(C.maps.values)}),
    meta: (v) => [`${v.p.contacts.residues.length} residues`, `layer ${v.p.layers[v.state.layer]}`,
                  v.state.head >= 0 ? `head ${v.state.head}` : "the layer's best head"],
  };
})(window);
