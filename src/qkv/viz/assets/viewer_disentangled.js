/* qkv viewer panel of DeBERTa's disentangled attention (qkv/core/disentangled.py): the scores of one layer and
 * head as their three tables side by side — c2c (content → content, Q·Kᵀ·s), c2p (the query's content against the
 * key's relative position), p2c (the key's content against the query's relative position) — and their sum
 * S = c2c + c2p + p2c, what the softmax reads, each an n × n map on one diverging scale (blue < 0 < red). The
 * Layer selector picks the layer, a head button (or the head view's) the head; no head: the mean of the heads.
 * The optional section "disentangled" of viewer.js (qkv/viz/disentangled_panel.py documents it).
 *
 * Tokens reach the page only through textContent and canvas fillText: never parsed as HTML. No network. Load
 * after viewer_panels.js: it registers QKV.panels.disentangled (the interface is at the top of viewer_panels.js).
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_disentangled.js");
  const {el, clamp, shown} = QKV.util;
  const {Heat, ramp, legend, signed, RDBU, diverging} = QKV.draw;
  const {decode} = QKV_WIRE;

  const NAMES = {c2c: "c2c · content → content", c2p: "c2p · content → position", p2c: "p2c · position → content",
                 S: "S = the sum (what the softmax reads)"};

  function buildDisentangled(v) {
    const D = v.p.disentangled, panel = v.panels.disentangled, n = D.positions, nn = n * n, H = D.heads;
    const maps = [...D.terms, "S"];
    const figs = el("div", "qkv-figs"), size = clamp(Math.floor(880 / maps.length), 150, 300);
    const readout = el("p", "qkv-readout", "hover a cell");
    readout.setAttribute("aria-live", "polite");
    const note = el("p", "qkv-note");
    const heat = {};
    for (const m of maps) {
      heat[m] = new Heat({name: "disentangled-" + m, rows: n, cols: n, width: size - 50, height: size - 50,
                          rowLabels: v.tokens, colLabels: v.tokens, title: NAMES[m], keys: true,
                          onCell: (c, e, h) => {
                            if (!c) { readout.textContent = "hover a cell"; return; }
                            const t = text(c);
                            h.showTip(e, t, c);
                            readout.textContent = t;
                          }});
      figs.append(heat[m].box);
    }
    const scale = el("div");
    panel.append(note, figs, readout, scale,
                 el("p", "qkv-note", "Rows: queries, columns: keys. DeBERTa scores each pair three ways and adds them: " +
                    "c2c = Q_i·K_j·s, c2p = Q_i·K^r of δ(i, j), p2c = K_j·Q^r of δ(j, i), s = 1/√(d_k·(1 + terms)), " +
                    "δ the bucketed relative distance; S is their sum before the mask (the trace's scores, to the " +
                    "bit). One colour scale for the four maps of this layer and head."));
    let key = null, values = {};

    // this layer's (and head's, or the heads' mean) n × n values of each term, and of their sum
    function layerValues(li, head) {
      const out = {}, X = v.extra.disentangled;
      for (const t of D.terms) {
        const a = new Float64Array(nn), heads = head >= 0 ? [head] : [...Array(H).keys()];
        for (const h of heads) {
          const off = (li * H + h) * nn, src = X[t];
          for (let p = 0; p < nn; p++) a[p] += src[off + p] / heads.length;
        }
        out[t] = a;
      }
      out.S = new Float64Array(nn);
      for (const t of D.terms) for (let p = 0; p < nn; p++) out.S[p] += out[t][p];
      return out;
    }

    function text(c) {
      const k = c.r * n + c.c;
      return `query ${c.r} “${shown(v.tokens[c.r], 20)}” → key ${c.c} “${shown(v.tokens[c.c], 20)}”: ` +
        maps.map(m => `${m} ${signed(values[m][k], 3)}`).join(" · ");
    }

    function draw() {
      const s = v.state, layer = v.p.layers[s.layer], li = D.layers.indexOf(layer), head = s.head;
      if (key === `${layer}/${head}`) return;
      key = `${layer}/${head}`;
      if (li < 0) {
        note.textContent = `layer ${layer}'s tables were not kept; the kept layers: ${D.layers.join(", ")}.`;
        figs.hidden = true;
        return;
      }
      figs.hidden = false;
      values = layerValues(li, head);
      let top = 0;
      for (const m of maps) for (const x of values[m]) top = Math.max(top, Math.abs(x));
      note.textContent = `layer ${layer} · ${head >= 0 ? "head " + head : "the mean of its " + H + " heads"} · ` +
        `|score| up to ${top.toFixed(3)}`;
      for (const m of maps) {
        const a = values[m];
        heat[m].paint((r, c) => diverging(a[r * n + c], top));
        heat[m].draw(null);
      }
      scale.replaceChildren(legend((t) => ramp(RDBU, t), ["−" + top.toFixed(2), "0", "+" + top.toFixed(2)],
                                   "score (one scale for the four maps)"));
    }
    return {draw};
  }

  QKV.panels.disentangled = {
    build: buildDisentangled,
    decode: async (D) => {
      const out = {};
      for (const t of D.terms) out[t] = await decode(D.tables[t]);
      return out;
    },
    meta: (v) => [`layer ${v.p.layers[v.state.layer]}`, v.state.head >= 0 ? `head ${v.state.head}` : "mean of heads",
                  "c2c + c2p + p2c"],
  };
})(window);
