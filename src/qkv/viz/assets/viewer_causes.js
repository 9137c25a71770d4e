/* qkv viewer panels of what caused an output: input attribution (the input tokens as running text, each
 * on its score's colour) and causal tracing (Meng et al. 2022: tokens × layers, one map per kind of
 * restored state, as ROME's Figure 1). The optional sections "attribute" and "causal_trace" of viewer.js.
 *
 * Input: the sections of the payload (qkv/viz/payload.py, interpret_payload.py), each with its colour
 * stops (qkv/viz/palette.py: the figures' maps, so page and figure agree). Tokens and texts reach the
 * page only through textContent and canvas fillText: never parsed as HTML. No network.
 *
 * Load this file after viewer_panels.js (the page inlines wire.js, viewer.js, viewer_panels.js, then
 * this file). It registers QKV.panels.attribute and QKV.panels.causal_trace (the interface is described
 * at the top of viewer_panels.js) and draws with that file's QKV.draw.
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_causes.js");
  const {el, clamp, shown, fmtP} = QKV.util;
  const {Heat, ramp, legend, signed, about} = QKV.draw;

  // ── input attribution: the input tokens as running text, each coloured by its signed score ──
  const METHODS = {"saliency": "saliency ‖∂z/∂e_i‖", "grad-x-input": "gradient × input e_i · ∂z/∂e_i",
                   "ig": "integrated gradients (e_i − b_i) · ∫₀¹ ∂z/∂e_i(b + α(e − b)) dα",
                   "occlusion": "occlusion z(x) − z(x with token i at the baseline), forward passes only",
                   "shapley": "Shapley values over the tokens (or spans), forward passes only"};
  function buildAttribute(v) {
    const A = v.p.attribute, panel = v.panels.attribute, m = A.max;
    const colour = (s) => ramp(A.colours, m > 0 ? 0.5 + 0.5 * s / m : 0.5);       // 0 → white, ±max → the ends
    const lines = [["attributed ", `${A.output || "z"} = ${A.logit.toFixed(4)}`],
                   ["method ", METHODS[A.method] || A.method]];
    if (A.steps != null) {
      const gap = A.baseline_logit == null ? null : A.logit - A.baseline_logit;
      lines.push(["path ", `baseline ${A.baseline}, ${A.steps} steps: Σ scores = ${A.sum.toFixed(4)}` +
                  (gap == null ? "" : `, z(e) − z(b) = ${gap.toFixed(4)}`) +
                  (A.completeness_error == null ? "" : ` (${(100 * A.completeness_error).toFixed(2)} % apart)`)]);
    } else if (A.method === "shapley" && A.baseline_logit != null) {
      lines.push(["sum ", `baseline ${A.baseline}: Σ scores = ${A.sum.toFixed(4)}, ` +
                  `z(x) − z(b) = ${(A.logit - A.baseline_logit).toFixed(4)} (efficiency)`]);
    } else if (A.method === "occlusion" && A.baseline) {
      lines.push(["sum ", `baseline ${A.baseline}: Σ scores = ${A.sum.toFixed(4)}`]);
    } else lines.push(["sum ", `Σ scores = ${A.sum.toFixed(4)}`]);
    const readout = el("p", "qkv-readout", "hover or focus a token for its score");
    readout.setAttribute("aria-live", "polite");
    const tip = el("div", "qkv-tip");
    tip.hidden = true;
    const text = el("div", "qkv-attr-text");
    const sides = A.sides ? [["source", "source (encoder)"], ["target", "target (decoder, so far)"]] : [[null, null]];
    // a score as the payload holds it (6 significant digits), with its sign
    const score = (x) => x > 0 ? "+" + String(x) : x < 0 ? "−" + String(-x) : "0";
    const say = (i) => `“${shown(A.tokens[i], 32)}” (token ${i}${A.sides ? ", " + A.sides[i] : ""}): ` +
                       `score ${score(A.scores[i])} · id ${A.ids[i]}`;
    const show = (i, tok) => {
      readout.textContent = say(i);
      tip.textContent = `${score(A.scores[i])} · id ${A.ids[i]}`;
      tip.hidden = false;
      tip.style.left = tok.offsetLeft + "px";                   // under the text (never over another row)
      tip.style.top = (text.offsetTop + text.offsetHeight + 2) + "px";
      for (const t of text.querySelectorAll(".qkv-attr-on")) t.classList.remove("qkv-attr-on");
      tok.classList.add("qkv-attr-on");
      v.root.dataset.token = i;
    };
    const hide = (tok) => {
      tip.hidden = true;
      tok.classList.remove("qkv-attr-on");
      delete v.root.dataset.token;
    };
    for (const [side, name] of sides) {
      const row = el("div", "qkv-attr-row");
      if (name) { row.dataset.side = side; row.append(el("span", "qkv-attr-side", name)); }
      const words = el("span", "qkv-attr-words");
      A.tokens.forEach((t, i) => {
        if (side && A.sides[i] !== side) return;
        const tok = el("span", "qkv-attr-tok", shown(t, 32)), rgb = colour(A.scores[i]);
        tok.tabIndex = 0;
        tok.style.background = `rgb(${rgb})`;
        if (m > 0 && Math.abs(A.scores[i]) > 0.6 * m) tok.style.color = "#fff";      // as the figure writes it
        Object.assign(tok.dataset, {i, score: String(A.scores[i]), id: A.ids[i]});
        tok.setAttribute("aria-label", say(i));
        tok.addEventListener("mouseenter", () => show(i, tok));
        tok.addEventListener("focus", () => show(i, tok));
        tok.addEventListener("mouseleave", () => { if (document.activeElement !== tok) hide(tok); });
        tok.addEventListener("blur", () => hide(tok));
        words.append(tok);
      });
      row.append(words);
      text.append(row);
    }
    const wrap = el("div", "qkv-attr-wrap");
    wrap.append(text, tip);
    const top = m > 0 ? m.toPrecision(3) : "0";
    panel.append(about(lines), wrap, readout,
                 legend(t => ramp(A.colours, t), ["−" + top, "0", "+" + top],
                        "score: red raises z, blue lowers it, white is 0 (symmetric at max |score|)"),
                 el("p", "qkv-note", "Each token's score is how much its embedding e_i (the table's row, before " +
                    "positions) moved z, from the gradient ∂z/∂e_i of the engine's own backward pass" +
                    (A.method === "saliency" ? "; saliency is a norm, never below 0." : ".") +
                    " Tab through the tokens to read each one's exact score and id."));
    return {draw() {}};
  }

  // ── causal tracing (Meng et al. 2022): P(answer) with one clean state restored into the corrupted run ──
  // Tokens as rows (the subject's marked *), layers as columns, one map per kind of state, colour = the
  // indirect effect p − p_corrupted from 0 to the section's top (ROME's Figure 1).
  function buildCausal(v) {
    const C = v.p.causal_trace, panel = v.panels.causal_trace, n = C.tokens.length, L = C.layers;
    const [s0, s1] = C.subject_span, subject = (t) => t >= s0 && t < s1;
    const w = C.window == null ? "" : `a window of ${C.window} layers around l`;
    const names = {hidden: "hidden state", ffn: "FFN output", attn: "attention output"};
    const titles = {hidden: "hidden state · block l's output", ffn: `FFN output · ${w || "layer l"}`,
                    attn: `attention output · ${w || "layer l"}`};
    const kinds = ["hidden", "ffn", "attn"].filter(k => C.tables[k]);
    const corrupted = [`P = ${fmtP(C.p_corrupted)}`, C.noise == null ? null : `noise ${Number(C.noise).toPrecision(3)}`,
                       C.draws == null ? null : `${C.draws} draws`, C.seed == null ? null : `seed ${C.seed}`]
      .filter(x => x).join(" · ");
    panel.append(about([["answer ", `“${C.answer_token}” (id ${C.answer})`],
                        ["text ", `“${C.text}” · subject “${C.subject}” (tokens ${s0}..${s1 - 1}, marked *)`],
                        ["clean ", `P = ${fmtP(C.p_clean)}`],
                        ["corrupted ", corrupted + " (the subject's embeddings noised)"],
                        ["window ", C.window == null ? "—" : `${C.window} layers (FFN and attention maps)`]]));
    const figs = el("div", "qkv-figs"), maps = {}, readout = el("p", "qkv-readout", "hover or focus a cell");
    readout.setAttribute("aria-live", "polite");
    const rowLabels = C.tokens.map((t, i) => shown(t, 11) + (subject(i) ? "*" : ""));
    const width = (v.root.clientWidth || 1100) - 24;
    // side by side (ROME's layout) while a cell keeps 6px; else stacked, each map as wide as the panel
    const beside = Math.floor((width - kinds.length * 150) / (kinds.length * L));
    const unit = clamp(beside >= 6 ? beside : Math.floor((width - 150) / L), 3, 28);
    const step = [1, 2, 5, 10, 20].find(k => k * unit >= 18) || 50;               // a layer number every k columns
    const p = (kind, t, l) => C.tables[kind][l][t];
    const say = (kind, t, l) => `layer ${l}, token ${t}: P(answer) = ${fmtP(p(kind, t, l))}, ` +
                                `indirect effect = ${signed(p(kind, t, l) - C.p_corrupted, 4)}`;
    for (const kind of kinds) {
      const top = C.top[kind], stops = C.colours[kind];
      const h = new Heat({name: "causal-" + kind, rows: n, cols: L, width: unit * L, height: Math.min(20 * n, 640),
                          rowLabels, colLabels: [...Array(L).keys()].map(String), colStep: step, keys: true,
                          title: titles[kind],
                          onCell: (c, e) => {
                            if (c) h.showTip(e, say(kind, c.r, c.c), c);
                            const s = v.state.cell;
                            if (!c ? s && s.t === kind : !s || s.t !== kind || s.i !== c.r || s.j !== c.c)
                              v.set({cell: c && {i: c.r, j: c.c, t: kind}});
                          }});
      h.paint((t, l) => ramp(stops, (p(kind, t, l) - C.p_corrupted) / top));
      const fig = el("div", "qkv-causal-map");
      fig.dataset.kind = kind;
      fig.append(h.box, legend(x => ramp(stops, x), ["0", (top / 2).toFixed(3), top.toFixed(3)],
                               "indirect effect p − p_corrupted", true));
      figs.append(fig);
      maps[kind] = h;
    }
    panel.append(figs, readout,
                 el("p", "qkv-note", "Causal tracing (Meng et al. 2022): the subject's token embeddings are noised " +
                    "(the corrupted run), then one state of the clean run is put back — row t, column l: a token's " +
                    "hidden state after block l, or its FFN or attention outputs over a window of layers around l — " +
                    "and P(answer) is read again. Dark cells bring the answer back. Tab to a map and use the arrow keys."));

    function draw() {
      const s = v.state;
      for (const kind in maps) maps[kind].draw(s.cell && s.cell.t === kind ? {r: s.cell.i, c: s.cell.j} : null);
      if (!s.cell || !maps[s.cell.t]) { readout.textContent = "hover or focus a cell"; return; }
      const {i, j, t} = s.cell;
      readout.textContent = `${names[t]} · layer ${j}, token ${i} “${shown(C.tokens[i], 24)}”${subject(i) ? "*" : ""}: ` +
                            `P(answer) = ${fmtP(p(t, i, j))}, indirect effect = ${signed(p(t, i, j) - C.p_corrupted, 4)}`;
    }
    return {draw};
  }

  // ── registration: one renderer per panel (qkv/viz/panels.py names them and gives the tab order) ──
  QKV.panels.attribute = {
    build: buildAttribute,
    meta: (v) => ["input attribution: " + (v.p.attribute.output || v.p.attribute.method)],
  };
  QKV.panels.causal_trace = {
    build: buildCausal,
    meta: (v) => [`causal tracing: “${v.p.causal_trace.answer_token}”`],
  };
})(window);
