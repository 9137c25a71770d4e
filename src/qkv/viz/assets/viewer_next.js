/* qkv viewer: the next-token view of a generation — each generated token's top candidates and their
 * probabilities P = softmax(logits / T), a temperature slider, and the generated tokens as chips (the orange
 * line under each: its probability at this T).
 *
 * Input: the payload's "next" (qkv/viz/payload.py). It holds, per generated token, the top K logits z (plus the
 * chosen token's when it ranks lower) and, per temperature T of a grid, rest(T) = log Σ exp(z_v / T) over all the
 * other tokens of the vocabulary. So P_v(T) = exp(z_v/T) / (Σ_kept exp(z_u/T) + exp(rest(T))) is the probability
 * over the whole vocabulary, not a renormalisation over the K shown. Tokens reach the page only through
 * textContent and attributes: never parsed as HTML. No network.
 *
 * Load this file after viewer.js (the page inlines both, in that order: `html.viewer_js`). It registers
 * QKV.views.next, which viewer.js reads as it reads a panel's renderer (viewer_panels.js describes that interface):
 *   temperature(v)  → T                 the slider's temperature (0: greedy)
 *   probs(v, step)  → {p, other, H}     P of step.ids, the mass of every token not kept, the entropy in bits
 *   meta(v)         → [string]          what the meta line says in this view
 *   build(v)        → {draw()}          builds the view into v.panels.next; draw() runs on every render
 *   exportName(v)   → [string]          the parts of an export's file name (export.js)
 *   exportData(v)   → {...}             the numbers of the view shown, for the JSON export
 * v is the Viewer. The view reads only: v.next (the payload's "next"), v.state (temp: an index on the slider,
 * 0 = greedy, k = next.temperatures[k − 1]; step: the generated token shown), v.set(patch), v.panels.next,
 * v.n and v.gen (the first generated token).
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.views) throw new Error("qkv viewer: load viewer.js before viewer_next.js");
  const {el, shown, fmtP} = QKV.util;

  function temperature(v) { const k = v.state.temp; return k === 0 ? 0 : v.next.temperatures[k - 1]; }

  // {p: probabilities of step.ids, other: mass of every token not kept, H: entropy in bits}
  function probs(v, step) {
    const k = v.state.temp, z = step.logits;
    if (k === 0) return {p: z.map((_, i) => (i === 0 ? 1 : 0)), other: 0, H: 0};   // greedy: the argmax, ids[0]
    const T = v.next.temperatures[k - 1];
    const rest = step.rest[k - 1] == null ? -Infinity : step.rest[k - 1];
    const m = Math.max(rest, ...z.map(x => x / T));                   // subtract the max: no overflow
    const e = z.map(x => Math.exp(x / T - m)), er = Math.exp(rest - m);
    const Z = e.reduce((a, b) => a + b, 0) + er;
    return {p: e.map(x => x / Z), other: er / Z, H: step.entropy[k - 1]};
  }

  function chosenText(step) { return step.tokens[step.ids.indexOf(step.chosen)]; }

  function build(v) {
    const panel = v.panels.next, nx = v.next;
    const ctl = el("div", "qkv-temp");
    const slider = el("input", "qkv-temp-slider");
    Object.assign(slider, {type: "range", min: 0, max: nx.temperatures.length, step: 1, value: v.state.temp});
    slider.setAttribute("aria-label", "temperature T");
    slider.addEventListener("input", () => v.set({temp: +slider.value}));
    const tval = el("span", "qkv-temp-value");
    ctl.append(el("span", "qkv-hint", "temperature"), slider, tval,
               el("span", "qkv-hint", "0 = greedy · 1 = the model's own distribution · higher = flatter"));
    const strip = el("div", "qkv-steps");
    strip.append(el("span", "qkv-hint", "generated:"));
    const chips = nx.steps.map((st, k) => {
      const b = el("button", "qkv-step", shown(chosenText(st), 16));
      b.type = "button";
      b.dataset.k = k;
      b.addEventListener("click", () => v.set({step: k}));
      strip.append(b);
      return b;
    });
    const table = el("table", "qkv-cands"), head = el("tr");
    for (const h of ["rank", "token", "", "P"]) head.append(el("th", null, h));
    const thead = el("thead");
    thead.append(head);
    const body = el("tbody");
    table.append(thead, body);
    const readout = el("p", "qkv-readout");
    panel.append(ctl, strip, readout, table,
                 el("p", "qkv-note", `P = softmax(logits / T) over all ${nx.vocab} tokens (exact: the page holds the ` +
                    `top ${nx.k} logits and, per T, the log-sum-exp of the rest). Top-k / top-p filters of the ` +
                    "generation are not applied. The orange line under each generated token: its probability at this T."));
    const nt = {slider, tval, chips, body, readout};
    return {draw: () => draw(v, nt)};
  }

  function draw(v, nt) {
    const s = v.state, nx = v.next, T = temperature(v);
    nt.slider.value = s.temp;
    nt.tval.textContent = `T = ${T.toFixed(1)}` + (T === 0 ? " (greedy)" : "");
    nt.chips.forEach((b, k) => {                                         // how likely each drawn token was
      const st = nx.steps[k], p = probs(v, st).p[st.ids.indexOf(st.chosen)];
      b.style.setProperty("--p", (100 * p).toFixed(1) + "%");
      b.title = `token ${st.position}: P = ${fmtP(p)} at T = ${T}, rank ${st.rank} at T > 0`;
      b.setAttribute("aria-pressed", String(k === s.step));
    });
    const st = nx.steps[s.step], {p, other, H} = probs(v, st);
    nt.body.textContent = "";
    const row = (rank, i, cls) => {
      const tr = el("tr", cls), bar = el("span", "qkv-pbar"), cell = el("td", "qkv-pcell");
      bar.style.width = (100 * p[i]).toFixed(2) + "%";
      cell.append(bar);
      tr.append(el("td", "qkv-rank", String(rank)), el("td", "qkv-ctok", st.tokens[i]), cell,
                el("td", "qkv-p", fmtP(p[i])));
      Object.assign(tr.dataset, {id: st.ids[i], p: String(p[i])});
      tr.title = `id ${st.ids[i]}` + (st.ids[i] === st.chosen ? " · the token generated here" : "");
      nt.body.append(tr);
    };
    const K = Math.min(nx.k, st.ids.length);
    for (let i = 0; i < K; i++) row(i + 1, i, st.ids[i] === st.chosen ? "qkv-chosen" : "");
    if (st.ids.length > K) {                                             // the chosen token ranked below the top K
      const gap = el("tr", "qkv-gap");
      gap.append(el("td", null, "…"));
      nt.body.append(gap);
      row(st.rank, K, "qkv-chosen");
    }
    const rest = el("tr", "qkv-other");
    rest.dataset.p = String(other);
    rest.append(el("td"), el("td", "qkv-ctok", `other ${nx.vocab - st.ids.length} tokens`), el("td"),
                el("td", "qkv-p", fmtP(other)));
    nt.body.append(rest);
    const chosen = p[st.ids.indexOf(st.chosen)];
    nt.readout.textContent = `token ${st.position} “${shown(chosenText(st), 24)}” was drawn from ` +
      `P = softmax(logits[${st.position - 1}] / T) · T = ${T.toFixed(1)} · its P = ${fmtP(chosen)} · ` +
      `entropy H = ${H.toFixed(2)} bits`;
  }

  // ── export (export.js): the token shown at the temperature shown, its candidates and their P ──
  function exportName(v) { return ["token" + v.next.steps[v.state.step].position, "T" + temperature(v)]; }
  function exportData(v) {
    const st = v.next.steps[v.state.step], {p, other, H} = probs(v, st);
    return {position: st.position, temperature: temperature(v), vocab: v.next.vocab,
            candidates: st.ids.map((id, i) => ({id, token: st.tokens[i], logit: st.logits[i], p: p[i]})),
            other_tokens_p: other, entropy_bits: H, chosen: st.chosen};
  }

  QKV.views.next = {temperature, probs, meta: (v) => [`${v.n - v.gen} generated`], build, exportName, exportData};
})(window);
