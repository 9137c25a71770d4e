/* qkv pipeline page: a layer without softmax drawn as its own steps — a selective scan (Mamba, Mamba-2, Falcon-H1's
 * mixer beside its attention: x̃, Δ, B and C) or a linear attention (Qwen3-Next's gated delta rule, MiniMax's
 * lightning: q, k, v, the gate and decay) — then the token-to-token matrix it implies and that matrix times the
 * values, the layer's output (Ali et al. 2024), every number the engine's (qkv/viz/pipeline_mixer.py).
 *
 *   QKV_PIPELINE_MIXER.decode(enc) → Promise<mixers>   the payload's "mixers" decoded, by layer
 *   QKV_PIPELINE_MIXER.boxes(view, layer) → [[id, title]]   the mixer's boxes of LAYER in the flow's order ([]: none)
 *   QKV_PIPELINE_MIXER.thumb(view, id) → canvas | null      the small drawing in a box
 *   QKV_PIPELINE_MIXER.detail(view, out, id)                the open box, drawn into OUT
 *
 * VIEW is the page (pipeline.js): its state s {layer, head, token, mix}, words t(key, values), arrays d.mixers.
 * A layer holds M matrices (a Mamba layer's channels, a Mamba-2 mixer's heads, the delta rule's value heads,
 * lightning's heads); s.mix picks one (default: the first of the chosen head's share). The only sums made here
 * are the output box's Σₛ M[t, s]·v_s, worked out in float64 from the engine's float32 matrix and values and set
 * beside the engine's own output (data-sum, data-engine: for tests). Every label is set with textContent.
 */
(function (global) {
  "use strict";

  const kit = () => global.QKV_PIPELINE_KIT;
  const SCAN = ["mamba", "mamba2", "parallel"];
  // a number as the boxes print it: 4 decimals, or 3 significant digits below 0.001 (a scan's numbers can be tiny)
  const fmt = (x) => (!Number.isFinite(x) || x === 0 || Math.abs(x) >= 1e-3 ? kit().num(x, 4) : x.toExponential(2));
  // what matrix J of layer M is, in the page's language: a channel, a Mamba head, a value head, a head
  const what = (view, m, j) => view.t("p_mix_what_" + (m.kind === "parallel" ? "mamba2" : m.kind), {i: m.index[j]});

  async function decode(enc) {
    if (!enc) return null;
    const arr = async (x) => (x ? {shape: x.shape, data: await QKV_WIRE.decode(x)} : null);
    const sum = async (s) => ({norm: await arr(s.norm), first: await arr(s.first)});
    const out = {};
    for (const [layer, e] of Object.entries(enc)) {
      out[layer] = {kind: e.kind, M: e.M, labels: e.labels, index: e.index, d_s: e.d_s, d_v: e.d_v, skip: e.skip,
                    q: await sum(e.q), k: await sum(e.k), v: await sum(e.v), out: await sum(e.out),
                    gate: await arr(e.gate), decay: await arr(e.decay),
                    matrix: {lo: e.matrix.lo[0], step: e.matrix.step[0], codes: (await arr(e.matrix.data)).data},
                    whole: e.whole ? {matrix: await arr(e.whole.matrix), v: await arr(e.whole.v),
                                      out: await arr(e.whole.out)} : null};
    }
    return out;
  }

  const of = (view) => (view.d.mixers ? view.d.mixers[view.s.layer] : null) || null;
  // the matrix shown: the one picked, else the first of the chosen head's share of the M
  function pick(view, m) {
    const s = view.s;
    if (Number.isInteger(s.mix) && s.mix >= 0 && s.mix < m.M) return s.mix;
    return Math.min(m.M - 1, Math.floor(s.head * m.M / view.p.arch.H));
  }
  // matrix J's entry (t, s) as the page holds it (one byte, within step/2 of the engine's); NaN above the diagonal
  function entry(m, n, j, t, s) {
    const c = m.matrix.codes[(j * n + t) * n + s];
    return c === 0 ? NaN : m.matrix.lo[j] + (c - 1) * m.matrix.step[j];
  }

  function boxes(view, layer) {
    const m = view.d.mixers ? view.d.mixers[layer] : null;
    if (!m) return [];
    const t = (k) => view.t(k);
    const tail = [["mix_matrix", t("p_mix_matrix")], ["mix_out", t("p_mix_out")]];
    if (SCAN.includes(m.kind)) {
      return [["mix_x", t("p_mix_x")], ["mix_dt", t("p_mix_dt_scan")], ["mix_bc", t("p_mix_bc")], ...tail];
    }
    const decay = m.kind === "delta" ? "p_mix_dt_delta" : "p_mix_dt_lightning";
    return [["mix_qkv", t("p_mix_qkv")], ["mix_dt", t(decay)], ...tail];
  }

  function thumb(view, id) {
    const m = of(view);
    if (!m) return null;
    const n = view.n, j = pick(view, m);
    if (id === "mix_matrix") {
      let big = 0;
      for (let t = 0; t < n; t++) for (let s = 0; s <= t; s++) big = Math.max(big, Math.abs(entry(m, n, j, t, s)));
      return view.mini(n, n, (t, s) => (s > t ? NaN : big > 0 ? Math.abs(entry(m, n, j, t, s)) / big : 0));
    }
    const sum = {mix_x: m.v, mix_qkv: m.v, mix_bc: m.q, mix_out: m.out}[id];
    if (!sum) return null;
    const vals = Array.from(sum.norm.data.subarray(j * n, j * n + n));
    const hi = Math.max(...vals), lo = Math.min(...vals);
    return view.mini(1, n, (r, c) => (hi > lo ? (vals[c] - lo) / (hi - lo) : 0.5));
  }

  // the chooser of the matrix shown (s.mix)
  function chooser(view, m, j) {
    const {el} = kit();
    const lab = el("label", "qkv-field", view.t("p_mix_pick") + " ");
    const sel = el("select", "qkv-p-mix");
    for (let k = 0; k < m.M; k++) { const o = el("option", null, what(view, m, k)); o.value = k; sel.append(o); }
    sel.value = j;
    sel.addEventListener("change", () => { view.s.mix = +sel.value; view.render(); });
    lab.append(sel);
    return lab;
  }
  // a table of vectors of matrix J at the chosen token: [[name, summary]]
  function vectors(view, out, rows, j) {
    const {table} = kit(), n = view.n, i = view.s.token;
    const row = ([name, sum]) => {
      const D = sum.first.shape[sum.first.shape.length - 1], at = j * n + i;
      const first = Array.from(sum.first.data.slice(at * D, at * D + D), fmt);
      return [name, fmt(sum.norm.data[at]), first.join(", ")];
    };
    out.append(table(["", view.t("p_length"), view.t("p_first", {k: view.p.head_dims})], rows.map(row)));
  }
  // bars over the tokens of (M, n) values VALS of matrix J
  function tokenBars(view, out, vals, j, cls, caption) {
    const {el, bars} = kit(), n = view.n;
    out.append(el("p", "qkv-p-caption", caption + ":"));
    const items = [];
    for (let s = 0; s < n; s++) {
      const x = vals[j * n + s];
      items.push({label: view.label(s), value: x, text: fmt(x), hot: s === view.s.token, data: {value: String(x)}});
    }
    out.append(bars(items, cls));
  }

  function detail(view, out, id) {
    const m = of(view);
    const {el, num, heatmap, bars} = kit();
    if (!m) return;
    const a = view.p.arch, z = a.mixer || {}, s = view.s, n = view.n, i = s.token, L = s.layer;
    const t = (k, v) => view.t(k, v), formula = (text) => out.append(el("pre", "qkv-p-formula", text));
    const j = pick(view, m), scan = SCAN.includes(m.kind);
    out.dataset.mix = j;
    out.append(el("p", "qkv-p-mixer-kind", t("p_mix_" + m.kind, {layer: L})));
    out.append(chooser(view, m, j));
    switch (id) {
      case "mix_x": {
        formula(z.scan === "mamba" ? t("p_mix_x_mamba_f", {k: z.conv, E: z.E})
                                   : t("p_mix_x_mamba2_f", {k: z.conv, H: z.H, P: z.P}));
        vectors(view, out, [[`x̃ · ${what(view, m, j)}`, m.v]], j);
        tokenBars(view, out, m.v.norm.data, j, "qkv-p-mix-norms", t("p_length"));
        break;
      }
      case "mix_qkv": {
        formula(m.kind === "delta" ? t("p_mix_qkv_delta_f", {k: z.conv}) : t("p_mix_qkv_lightning_f"));
        const hat = m.kind === "delta" ? "̂" : "";            // the delta rule's q̂, k̂: of unit length
        vectors(view, out, [["q" + hat, m.q], ["k" + hat, m.k], ["v", m.v]], j);
        tokenBars(view, out, m.v.norm.data, j, "qkv-p-mix-norms", "|v|");
        break;
      }
      case "mix_dt": {
        const f = {mamba: "p_mix_dt_mamba_f", mamba2: "p_mix_dt_mamba2_f", parallel: "p_mix_dt_mamba2_f",
                   delta: "p_mix_dt_delta_f", lightning: "p_mix_dt_lightning_f"}[m.kind];
        formula(t(f));
        if (m.gate) tokenBars(view, out, m.gate.data, j, "qkv-p-mix-gate", scan ? "Δ" : "β");
        const dec = m.decay, N = dec.shape.length === 3 ? dec.shape[2] : 0;
        if (N) {                                       // Mamba: a decay per state, Δₜ·A[c, :]
          const at = (j * n + i) * N;
          out.append(el("p", "qkv-p-caption", `${t("p_mix_decay")} (${view.label(i)}): ` +
                        Array.from(dec.data.slice(at, at + Math.min(N, 8)), fmt).join(", ")));
        } else if (m.kind === "lightning") {            // one decay a head, the same at every token
          const r = dec.data[j * n];
          out.append(el("pre", "qkv-p-formula qkv-p-mix-lambda", `λ = exp(${fmt(r)}) = ${fmt(Math.exp(r))}`));
        } else tokenBars(view, out, dec.data, j, "qkv-p-mix-decay", t("p_mix_decay"));
        break;
      }
      case "mix_bc": {
        formula(t("p_mix_bc_f", {N: m.d_s}));
        vectors(view, out, [["B", m.k], ["C", m.q]], j);
        break;
      }
      case "mix_matrix": {
        formula(t(scan ? "p_mix_matrix_scan_f" : `p_mix_matrix_${m.kind}_f`));
        out.append(el("p", "qkv-p-note", t("p_mix_matrix_what", {what: what(view, m, j)})));
        let big = 0;
        for (let r = 0; r < n; r++) for (let c = 0; c <= r; c++) big = Math.max(big, Math.abs(entry(m, n, j, r, c)));
        const vals = new Float64Array(n * n);
        for (let r = 0; r < n; r++) for (let c = 0; c < n; c++) {
          const x = entry(m, n, j, r, c);
          vals[r * n + c] = Number.isNaN(x) ? NaN : big > 0 ? (x / big + 1) / 2 : 0.5;   // 0 in the middle
        }
        out.append(el("p", "qkv-p-shape", `${t("p_shape")} (M, n, n) = (${m.M}, ${n}, ${n}) · ` +
                      t("p_row", {token: view.label(i)})));
        out.append(heatmap(vals, n, n, i, "implied matrix", view.p.labels, view.p.labels));
        const row = [];
        for (let c = 0; c < n; c++) row.push(entry(m, n, j, i, c));
        out.append(bars(row.map((x, c) => ({label: view.label(c), value: Number.isNaN(x) ? 0 : x,
                                             text: Number.isNaN(x) ? "" : fmt(x), off: Number.isNaN(x), hot: c === i,
                                             data: {value: String(x)}})), "qkv-p-mix-row"));
        out.append(el("p", "qkv-p-note", t("p_s_quant", {step: (m.matrix.step[j] / 2).toPrecision(2)})));
        break;
      }
      case "mix_out": {
        formula(t(scan ? "p_mix_out_scan_f" : "p_mix_out_linear_f"));
        if (m.skip) out.append(el("p", "qkv-p-note", t("p_mix_skip", {d: num(m.skip[j], 4)})));
        vectors(view, out, [[`${scan ? "y" : "o"} · ${what(view, m, j)}`, m.out]], j);
        if (!m.whole) { out.append(el("p", "qkv-p-note", t("p_mix_whole", {layer: L}))); break; }
        const W = m.whole.matrix.data, V = m.whole.v.data, O = m.whole.out.data, dv = m.d_v;
        for (let c = 0; c < Math.min(dv, view.p.head_dims); c++) {
          let total = 0;                                   // float64: Σₛ M[i, s]·v_s[c] over the keys s ≤ i
          for (let k = 0; k <= i; k++) total += W[(j * n + i) * n + k] * V[(j * n + k) * dv + c];
          const engine = O[(j * n + i) * dv + c];
          const six = (x) => (Math.abs(x) >= 1e-3 || x === 0 ? num(x, 6) : x.toExponential(5));
          const line = el("p", "qkv-p-mix-sum", t("p_mix_sum", {t: i, c, sum: six(total), engine: six(engine)}));
          Object.assign(line.dataset, {c: String(c), sum: String(total), engine: String(engine)});
          out.append(line);
        }
        break;
      }
      default: break;
    }
  }

  global.QKV_PIPELINE_MIXER = {decode, boxes, thumb, detail};
})(window);
