/* qkv pipeline page: the model drawn as its data flow, each box opening to its real arrays.
 *
 *   QKV_PIPELINE.mount(root, payload, options?) → Promise<Pipeline>   draw a payload into an element
 *   QKV_PIPELINE.boot()   mount every [data-qkv-pipeline] on the JSON script element that follows it
 *
 * The payload (qkv/viz/pipeline_payload.py) holds every array the boxes show, compressed (wire
 * arrays: wire.js, loaded before this file, decodes them); the page decodes them once and computes nothing the engine computed, except the output end:
 * softmax(logits / T), top-k and top-p over the whole vocabulary, in float64, as qkv.writing.sampling.
 * Its toolkit (templates, that distribution, heatmaps, bars, tables) is pipeline_kit.js, loaded before this file.
 * options.onNext(settings) (qkv serve): adds a "generate next token" button; options.onLayer(layer) (qkv serve):
 * asks for a layer whose whole q, k, v the attention diagram lacks (pipeline_diagram.js); options.state: a previous
 * page's choices (layer, head, box, language, sampling) to keep; the token is the last.
 * Every token and text from the payload is shown with textContent, never as HTML.
 * An encoder–decoder's payload has two stacks (a toggle): the encoder's, and the decoder's with
 * cross-attention boxes (Q from the decoder, K, V from the encoder's output M).
 * State for tests and scripts: root.dataset {ready, box, token, layer, head, lang, stack, T, topk, topp, remain}.
 */
(function (global) {
  "use strict";

  const {el, format, num, pct, distribution, viridis, viridisRGB, heatmap, bars, table} = global.QKV_PIPELINE_KIT;

  // ── data ─────────────────────────────────────────────────────────────────────
  // a wire array (wire.js, loaded first) → {shape, data: Float32Array | Float64Array (f16) | Uint8Array}
  async function array(enc) { return {shape: enc.shape, data: await QKV_WIRE.decode(enc)}; }
  async function summary(s) { return {norm: await array(s.norm), first: await array(s.first)}; }

  const SCORE_CODES = 254;                             // S travels as codes 1..255 (pipeline_payload.py), 0 = masked

  // ── the page ─────────────────────────────────────────────────────────────────
  class Pipeline {
    constructor(root, p, d, options) {
      this.root = root;
      this.top = p;                                    // the payload; an encoder–decoder's has two stacks
      this.all = d;                                    // the decoded arrays (of each stack)
      this.options = options || {};
      const start = p.start || {};
      this.s = {token: 0, layer: start.layer || 0, head: start.head || 0, stack: "decoder",
                box: start.box || (p.arch.encoder ? "pooled" : "probs"), lang: p.lang || "en", T: 1, topk: 0, topp: 1};
      const keep = this.options.state;
      const kept = ["layer", "head", "box", "lang", "T", "topk", "topp", "stack", "mix"];   // mix: a scan's matrix
      if (keep) for (const k of kept) if (k in keep) this.s[k] = keep[k];
      this.use(this.s.stack);
      this.s.token = this.n - 1;
    }
    // the stack shown: p and d are the payload's and the arrays' of one stack (the payload itself if one)
    use(stack) {
      const top = this.top;
      if (!top.seq2seq) { this.p = top; this.d = this.all; }
      else {
        const part = top.stacks[stack], enc = stack === "encoder";
        this.p = Object.assign({}, top, part, {arch: Object.assign({}, top.arch, {
          L: part.L, causal: part.causal, encoder: enc,
          final_norm: enc ? top.arch.encoder_final_norm : top.arch.final_norm})});
        this.d = Object.assign({}, this.all[stack], {logits: this.all.logits});
      }
      this.s.stack = stack;
      this.n = this.p.tokens.length;
      this.s.token = Math.min(this.s.token, this.n - 1);
      if (this.s.layer >= this.p.arch.L) this.s.layer = 0;
      if (this.s.head >= this.p.arch.H) this.s.head = 0;
    }
    t(key, values) {
      const words = this.p["text_" + this.s.lang] || this.p.text_en;
      return format(words[key] !== undefined ? words[key] : this.p.text_en[key] || key, values || {});
    }
    label(i) { return this.p.labels[i]; }

    // the boxes of the flow, in order: [id, title] (block boxes belong to the chosen layer)
    boxes() {
      const a = this.p.arch, t = (k, v) => this.t(k, v);
      const pre = a.norm_place !== "post";
      const out = [["tokens", t("s_tokens")], ["embed", t("p_embed")], ["stream", t("p_stream")]];
      const blk = [];
      if (pre) blk.push(["norm1", t("p_norm")]);
      blk.push(["qkv", t("s_qkv")]);
      if (a.qk_norm) blk.push(["qknorm", t("p_qknorm")]);                 // Qwen3, OLMo 2, Gemma 3, Phi …
      if (a.position === "rope" && !this.top.seq2seq) blk.push(["rope", t("p_rope")]);
      if (a.H_kv !== a.H) blk.push(["gqa", t("s_gqa", {H: a.H, H_kv: a.H_kv})]);
      blk.push(["scores", t("s_s")]);
      if (a.alibi) blk.push(["alibi", t("p_alibi")]);                       // BLOOM, Falcon-RW, MPT
      if (a.attn_softcap) blk.push(["softcap", t("p_softcap")]);           // Gemma 2
      blk.push(["mask", t("p_mask")], ["attn", t("s_softmax")],
               ["z", t("s_z")], ["out", t("s_out", {last: a.H - 1})], ["res1", t("p_res")]);
      if (this.p.cross) {                             // a decoder block of an encoder–decoder
        if (pre) blk.push(["xnorm", t("p_xnorm")]);
        blk.push(["xqkv", t("p_xqkv")], ["xattn", t("p_xattn")], ["xz", t("p_xz")], ["xout", t("p_xout")],
                 ["xres", t("p_xres")]);
      }
      if (pre) blk.push(["norm2", t("p_norm2")]);
      if (a.moe && this.d.router) blk.push(["router", t("p_router")]);     // a mixture of experts
      blk.push(["ffn", t("p_ffn")], ["res2", t("p_res2")]);
      this.mixerBoxes(blk);
      const end = [];
      if (a.final_norm) end.push(["final", t("p_final")]);
      if (a.seq2seq && a.encoder) end.push(["hidden", t("p_memory_box")]);
      else if (a.encoder) end.push(["hidden", t("p_hidden")], ["pooled", t("p_pooled")]);
      else end.push(["logits", t("p_logits")], ["probs", t("p_probs")]);
      // the page's own numbering, in the order of the flow (the side box, the stream, has none)
      let k = 0;
      for (const list of [out, blk, end]) for (const b of list) if (b[0] !== "stream") b[1] = `${++k}. ${b[1]}`;
      return {start: out, block: blk, end};
    }

    // the kind of the chosen layer (core/capabilities.py): "attention", "mamba", "delta", "parallel", …
    kind() { const k = this.p.arch.layer_kinds; return (k && k[this.s.layer]) || "attention"; }
    // a layer without softmax (Mamba, Mamba-2, the delta rule, lightning): its own steps in attention's place,
    // and no FFN's boxes where the block has none (a Mamba stack); Falcon-H1's mixer: its steps before W_O
    mixerBoxes(blk) {
      const M = global.QKV_PIPELINE_MIXER, kind = this.kind();
      const own = M ? M.boxes(this, this.s.layer) : [];
      if (!own.length) return;
      const at = (id) => blk.findIndex((b) => b[0] === id);
      if (kind === "parallel") { blk.splice(at("out"), 0, ...own); return; }
      const attention = ["qkv", "qknorm", "rope", "gqa", "scores", "alibi", "softcap", "mask", "attn", "z"];
      const noFFN = this.p.arch.d_ff === 0 ? ["norm2", "ffn", "res2"] : [];       // a Mamba stack: no FFN
      const kept = blk.filter((b) => !attention.includes(b[0]) && !noFFN.includes(b[0]));
      blk.length = 0;
      blk.push(...kept.map((b) => (b[0] === "out" ? ["out", this.t("p_mix_outproj")] : b)));
      blk.splice(at("norm1") + 1, 0, ...own);
    }

    render() {
      const r = this.root, p = this.p, a = p.arch, s = this.s;
      r.textContent = "";
      r.classList.add("qkv", "qkv-pipeline");
      r.lang = s.lang;
      const head = el("div", "qkv-p-head");
      head.append(el("h2", "qkv-p-title", this.t("p_title", {model: p.model})));
      const lang = el("button", "qkv-p-lang", this.t("p_lang"));
      lang.type = "button";
      lang.addEventListener("click", () => { s.lang = s.lang === "en" ? "ko" : "en"; this.render(); });
      head.append(lang);
      r.append(head);
      r.append(el("p", "qkv-p-intro", this.t("p_intro")));
      if (p.text) r.append(el("p", "qkv-p-text", p.text + (p.target ? "  →  " + p.target : "")));
      if (this.top.seq2seq) {
        const stacks = el("div", "qkv-p-stacks");
        stacks.append(el("span", "qkv-field", this.t("p_stack") + ":"));
        for (const name of ["encoder", "decoder"]) {
          const b = el("button", "qkv-p-stack", this.t("p_" + name));
          b.type = "button";
          b.dataset.stack = name;
          b.setAttribute("aria-pressed", String(name === s.stack));
          b.addEventListener("click", () => { this.use(name); this.render(); });
          stacks.append(b);
        }
        r.append(stacks);
      }

      // choosers: token chips, layer, head
      const bar = el("div", "qkv-p-bar-controls");
      const pick = (key, count, cls) => {
        const lab = el("label", "qkv-field", this.t("p_" + key) + " ");
        const sel = el("select", cls);
        for (let i = 0; i < count; i++) { const o = el("option", null, i); o.value = i; sel.append(o); }
        sel.value = s[key];
        sel.addEventListener("change", () => { s[key] = +sel.value; this.render(); });
        lab.append(sel);
        return lab;
      };
      bar.append(pick("layer", a.L, "qkv-p-layer"), pick("head", a.H, "qkv-p-head-pick"));
      bar.append(el("span", "qkv-p-meta", `${p.model} · n = ${this.n} · d_model = ${a.d_model} · L = ${a.L} · ` +
        `H = ${a.H}` + (a.H_kv !== a.H ? ` · H_kv = ${a.H_kv}` : "") + ` · d_k = ${a.d_k}`));
      r.append(bar);
      const chips = el("div", "qkv-p-tokens");
      chips.append(el("span", "qkv-field", this.t("p_token") + ":"));
      p.labels.forEach((lbl, i) => {
        const b = el("button", "qkv-p-tok", lbl);
        b.type = "button";
        b.title = `${i} · id ${p.ids[i]}`;
        b.dataset.i = i;
        b.setAttribute("aria-pressed", String(i === s.token));
        b.addEventListener("click", () => { s.token = i; this.render(); });
        chips.append(b);
      });
      r.append(chips);

      // the flow and the open box
      const main = el("div", "qkv-p-main");
      const flow = el("div", "qkv-p-flow");
      const {start, block, end} = this.boxes();
      if (![...start, ...block, ...end].some(([id]) => id === s.box)) s.box = end[end.length - 1][0];
      const box = (id, title, cls) => {
        const b = el("button", "qkv-p-box " + (cls || ""));
        b.append(el("span", "qkv-p-box-title", title));
        const thumb = this.thumb(id);
        if (thumb) b.append(thumb);
        b.type = "button";
        b.dataset.box = id;
        b.setAttribute("aria-pressed", String(id === s.box));
        b.addEventListener("click", () => { s.box = id; this.render(); });
        return b;
      };
      const arrow = () => el("div", "qkv-p-arrow", "↓");
      for (const [id, title] of start) { if (id !== "stream") flow.append(box(id, title), arrow()); }
      const group = el("div", "qkv-p-block");
      group.append(el("div", "qkv-p-block-title", this.t("p_block", {layer: s.layer, L: a.L}) + " · ×" + a.L));
      block.forEach(([id, title], k) => { group.append(box(id, title, "qkv-p-inner")); if (k < block.length - 1) group.append(arrow()); });
      flow.append(group, arrow());
      end.forEach(([id, title], k) => { flow.append(box(id, title)); if (k < end.length - 1) flow.append(arrow()); });
      flow.append(el("div", "qkv-p-gap"), box("stream", this.t("p_stream"), "qkv-p-side"));
      const detail = el("section", "qkv-p-detail");
      detail.setAttribute("aria-live", "polite");
      this.detail(detail);
      if (global.QKV_EXPORT) {                          // export.js: each panel as PNG, SVG, its numbers as JSON
        const name = (what) => [p.model, this.top.seq2seq ? s.stack : "", what, "token" + s.token, "layer" + s.layer,
                                "head" + s.head].filter((x) => x !== "").join("-").replace(/[^A-Za-z0-9._-]+/g, "-");
        flow.prepend(global.QKV_EXPORT.bar(() => flow, () => name("flow"), () => ({model: p.model, layer: s.layer,
          boxes: [...start, ...block, ...end].map(([id, title]) => ({id, title, open: id === s.box}))})));
        detail.prepend(global.QKV_EXPORT.bar(() => detail, () => name(s.box), () => Object.assign(
          {model: p.model, box: s.box, token: s.token, token_label: this.label(s.token), layer: s.layer, head: s.head,
           language: s.lang}, global.QKV_EXPORT.dataOf(detail))));
      }
      main.append(flow, detail);
      r.append(main);
      Object.assign(r.dataset, {box: s.box, token: s.token, layer: s.layer, head: s.head, lang: s.lang,
                                kind: this.kind(),                      // the layer's kind (core/capabilities.py)
                                T: s.T, topk: s.topk, topp: s.topp, stack: this.top.seq2seq ? s.stack : ""});
    }

    // the array a box of the flow holds, drawn small in the box: every token's |x| as a strip (vectors), the
    // head's n × n scores or weights, the mask; null for boxes without one array of this token's layer and head
    thumb(id) {
      const p = this.p, a = p.arch, d = this.d, s = this.s, n = this.n, L = s.layer, h = s.head;
      if (id.startsWith("mix_")) return global.QKV_PIPELINE_MIXER ? global.QKV_PIPELINE_MIXER.thumb(this, id) : null;
      const strip = (sum, base) => {
        const vals = Array.from(sum.norm.data.subarray(base, base + n));
        const hi = Math.max(...vals), lo = Math.min(...vals);
        return this.mini(1, n, (i, j) => (hi > lo ? (vals[j] - lo) / (hi - lo) : 0.5));
      };
      const square = (at) => this.mini(n, n, at);
      const w = a.layer_windows ? a.layer_windows[L] : null;
      const c = a.layer_chunks ? a.layer_chunks[L] : null;            // Llama 4's chunked layers: own chunk only
      const masked = (i, j) => a.causal && (j > i || (w && j <= i - w) || (c && Math.floor(i / c) !== Math.floor(j / c)));
      const vec = {embed: [d.stream, 0], norm1: [d.blocks.attn_in, L * n], out: [d.blocks.attn_out, L * n],
                   res1: [d.blocks.mid, L * n], norm2: [d.blocks.ffn_in, L * n], ffn: [d.blocks.ffn_out, L * n],
                   res2: [d.stream, (L + 1) * n], final: [d.final, 0], hidden: [d.final, 0], stream: [d.stream, L * n],
                   qkv: [d.heads.q, (L * a.H + h) * n], rope: [d.heads.q, (L * a.H + h) * n],
                   z: [d.heads.z, (L * a.H + h) * n]}[id];
      if (vec && vec[0]) return strip(vec[0], vec[1]);
      if (id === "attn") {
        const base = (L * a.H + h) * n * n;
        return square((i, j) => (masked(i, j) ? NaN : d.attention[base + i * n + j] / 255));
      }
      if (id === "scores") {
        const base = (L * a.H + h) * n * n, codes = d.scores;
        return square((i, j) => (codes[base + i * n + j] === 0 ? NaN : (codes[base + i * n + j] - 1) / SCORE_CODES));
      }
      if (id === "mask") return square((i, j) => (masked(i, j) ? NaN : 0.15));
      return null;
    }
    // a thumbnail: ROWS × COLS values in [0, 1] (NaN: masked) at(i, j), 96 × 6 px (a strip) or 36 × 36 px
    mini(rows, cols, at) {
      const c = el("canvas", "qkv-p-thumb");
      c.width = rows === 1 ? 96 : 36;
      c.height = rows === 1 ? 6 : 36;
      c.setAttribute("aria-hidden", "true");
      const ctx = c.getContext("2d"), cw = c.width / cols, ch = c.height / rows;
      const step = Math.max(1, Math.ceil(Math.max(rows, cols) / 96));   // long texts: every step-th row and column
      for (let i = 0; i < rows; i += step) for (let j = 0; j < cols; j += step) {
        const v = at(i, j);
        ctx.fillStyle = Number.isNaN(v) ? "#eaeef2" : viridis(v);
        ctx.fillRect(j * cw, i * ch, Math.max(1, cw * step), Math.max(1, ch * step));
      }
      return c;
    }
    // one d_model vector of a summary {norm (…, n), first (…, n, D)} at flat row `row`
    vector(sum, row) {
      const D = sum.first.shape[sum.first.shape.length - 1];
      return {norm: sum.norm.data[row], first: Array.from(sum.first.data.slice(row * D, row * D + D))};
    }
    // the standard view of a (…, n, d) array: shape, |x| of every token (bars), the chosen token's numbers
    vectorView(out, sum, base, shape) {
      const s = this.s, n = this.n;
      out.append(el("p", "qkv-p-shape", `${this.t("p_shape")} ${shape}`));
      const v = this.vector(sum, base + s.token);
      out.append(table([this.t("p_row", {token: this.label(s.token)}), this.t("p_length"),
                        this.t("p_first", {k: v.first.length})],
                       [[`${s.token}`, num(v.norm), v.first.map((x) => num(x)).join(", ")]]));
      const items = [];
      for (let i = 0; i < n; i++) {
        const x = sum.norm.data[base + i];
        items.push({label: this.label(i), value: x, text: num(x, 2), hot: i === s.token, data: {value: String(x)}});
      }
      out.append(el("p", "qkv-p-caption", this.t("p_length") + ":"));
      out.append(bars(items, "qkv-p-norms"));
      return v;
    }

    detail(out) {
      const p = this.p, a = p.arch, s = this.s, d = this.d, t = (k, v) => this.t(k, v), n = this.n;
      const L = s.layer, h = s.head, i = s.token;
      const formula = (text) => out.append(el("pre", "qkv-p-formula", text));
      const title = this.boxTitle(s.box);
      out.append(el("h3", "qkv-p-detail-title", title));
      const kv = Math.floor(h / a.G);
      const headRow = (name, count, head) => ((L * count + head) * n);
      switch (s.box) {
        case "tokens": {
          out.append(el("p", null, t("tokens", {n})));
          out.append(table(["#", t("p_token"), "id"],
                           p.labels.map((lbl, k) => [String(k), lbl, String(p.ids[k])])));
          break;
        }
        case "embed": {
          formula(a.position === "rope" ? "X = E[ids]" : t("p_embed_f"));
          if (a.multipliers && a.multipliers.embedding !== 1) out.append(el("p", "qkv-p-note", t("p_embed_mult", {m: num(a.multipliers.embedding, 4)})));
          if (a.position === "rope") out.append(el("p", null, t("p_embed_rope")));
          this.vectorView(out, d.stream, 0, `(n, d_model) = (${n}, ${a.d_model})`);
          break;
        }
        case "norm1": case "norm2": {
          formula(t(a.norm === "rms" ? "p_norm_rms_f" : "p_norm_layer_f") + `,  ε = ${Number(a.eps.toPrecision(6))}`);
          this.vectorView(out, d.blocks[s.box === "norm1" ? "attn_in" : "ffn_in"], L * n, `(${n}, ${a.d_model})`);
          break;
        }
        case "qkv": {
          formula(t("p_qkv_f"));
          const rows = [];
          for (const [name, sum, count, hh] of [["q", d.heads.q, a.H, h], ["k", d.heads.k, a.H_kv, kv],
                                                 ["v", d.heads.v, a.H_kv, kv]]) {
            const v = this.vector(sum, headRow(name, count, hh) + i);
            rows.push([`${name} (head ${hh})`, `(${count}, ${n}, ${a.d_k})`, num(v.norm), v.first.map((x) => num(x, 3)).join(", ")]);
          }
          out.append(table(["", t("p_shape"), t("p_length"), t("p_first", {k: p.head_dims})], rows));
          out.append(el("p", "qkv-p-note", t("library")));
          break;
        }
        case "rope": {
          const kind = a.rope_kinds ? a.rope_kinds[L] : "global";
          if (kind === null) { out.append(el("p", "qkv-p-rope-none", t("p_rope_none", {layer: L}))); break; }
          formula(t("p_rope_f"));
          if (kind === "local") out.append(el("p", "qkv-p-note", t("p_rope_local", {layer: L, theta: a.local_rope_theta, base: a.rope_theta})));
          out.append(el("p", null, t("p_rope_what")));
          if (a.latent) out.append(el("p", "qkv-p-note", t("p_rope_latent", {r: a.rotary_dim, d_k: a.d_k, ...a.latent})));
          else if (a.rotary_dim && a.rotary_dim < a.d_k) out.append(el("p", "qkv-p-note", t("p_rope_partial", {r: a.rotary_dim, d_k: a.d_k})));
          if (a.rope_interleaved) out.append(el("p", "qkv-p-note", t("p_rope_pairs")));
          const rows = [];
          for (const [name, sum, count, hh] of [["q", d.heads.q, a.H, h], ["k", d.heads.k, a.H_kv, kv]]) {
            const v = this.vector(sum, headRow(name, count, hh) + i);
            rows.push([`${name}' (head ${hh})`, num(v.norm), v.first.map((x) => num(x, 3)).join(", ")]);
          }
          out.append(table(["", t("p_length"), t("p_first", {k: p.head_dims})], rows));
          break;
        }
        case "gqa": {
          out.append(el("p", "qkv-p-gqa", t("p_gqa", {head: h, kv, G: a.G, H: a.H, H_kv: a.H_kv})));
          const groups = el("div", "qkv-p-groups");
          for (let g = 0; g < a.H_kv; g++) {
            const grp = el("span", "qkv-p-group" + (g === kv ? " qkv-p-hot" : ""), `K/V ${g} ← Q ${g * a.G}…${(g + 1) * a.G - 1}`);
            grp.dataset.kv = g;
            groups.append(grp);
          }
          out.append(groups);
          out.append(el("p", "qkv-p-note", t("p_gqa_what", {G: a.G, H: a.H, H_kv: a.H_kv})));
          break;
        }
        case "qknorm": {
          formula(t(a.qk_norm === "all" ? "p_qknorm_all_f" : "p_qknorm_head_f"));
          out.append(el("p", null, t("p_qknorm_what")));
          break;
        }
        case "alibi": {
          formula(t("p_alibi_f", {slope: num(a.alibi[h], 5), head: h}));
          out.append(el("p", null, t("p_alibi_what")));
          break;
        }
        case "softcap": {
          formula(t("p_softcap_f", {c: a.attn_softcap}));
          out.append(el("p", null, t("p_softcap_what")));
          break;
        }
        case "router": {
          const r = this.d.router[L], m = a.moe;
          formula(t(m.score === "sigmoid" ? "p_router_f_sigmoid" : "p_router_f", {E: m.experts, k: m.k}));
          if (m.shared) out.append(el("p", "qkv-p-note", t(m.shared_gated === false ? "p_router_shared_plain" : "p_router_shared")));
          if (m.choice_bias) out.append(el("p", "qkv-p-note", t("p_router_bias")));
          if (m.groups > 1) out.append(el("p", "qkv-p-note", t("p_router_groups", {G: m.groups, kept: m.groups_kept})));
          if (m.scale !== undefined && m.scale !== 1) out.append(el("p", "qkv-p-note", t("p_router_scale", {c: m.scale})));
          if (!r) { out.append(el("p", "qkv-p-router-dense", t("p_router_dense", {layer: L}))); break; }
          out.append(el("p", null, t("p_router_token", {token: this.label(i)})));
          out.append(table([t("p_expert"), t("p_weight")], r.experts[i].map((e, k) => [String(e), num(r.weights[i][k], 4)])));
          break;
        }
        case "scores": {
          formula(a.scale !== null && a.scale !== undefined ? t("p_s_scaled_f", {scale: num(a.scale, 4)}) : t("p_s_f"));
          out.append(el("p", "qkv-p-note", t("s_scale")));
          this.diagram(out, "self", "S");
          const row = this.scoreRow(L, h, i);
          out.append(el("p", "qkv-p-shape", `${t("p_shape")} (H, n, n) = (${a.H}, ${n}, ${n}) · ` +
                        t("p_row", {token: this.label(i)})));
          // the keys with the highest scores, and the weight softmax gives them (A: the page's bytes)
          const base = (L * a.H + h) * n * n + i * n;
          const top = row.map((x, j) => j).filter((j) => row[j] > -Infinity).sort((u, v) => row[v] - row[u]).slice(0, 3);
          out.append(table([t("col_key"), "S", "A"], top.map((j) => [`${j} · ${this.label(j)}`, num(row[j], 3),
                                                                     num(d.attention[base + j] / 255, 3)])));
          out.append(bars(row.map((x, j) => ({label: this.label(j), value: x, text: num(x, 2), off: x === -Infinity,
                                              hot: j === i, data: {value: String(x)}})), "qkv-p-scores"));
          out.append(el("p", "qkv-p-note", t("p_s_quant", {step: (p.scores.step[L][h] / 2).toPrecision(2)})));
          break;
        }
        case "mask": {
          if (!a.causal) { out.append(el("p", null, t(a.seq2seq ? "p_mask_enc" : "p_mask_none", {model: p.model}))); break; }
          const w = a.layer_windows ? a.layer_windows[L] : null;          // this layer's sliding window, if any
          const c = a.layer_chunks ? a.layer_chunks[L] : null;            // its chunk (Llama 4), if any
          formula(c ? t("p_mask_chunk_f", {c, layer: L}) : w ? t("p_mask_window_f", {w, layer: L}) : t("p_mask_f"));
          const m = new Float64Array(n * n);
          const hidden = (q, k) => k > q || (w && k <= q - w) || (c && Math.floor(q / c) !== Math.floor(k / c));
          for (let q = 0; q < n; q++) for (let k = 0; k < n; k++) m[q * n + k] = hidden(q, k) ? NaN : 0.15;
          out.append(el("p", null, t("mask", {masked: n * (n - 1) / 2, total: n * n})));
          out.append(heatmap(m, n, n, i, "mask", p.labels, p.labels));
          break;
        }
        case "attn": {
          formula(t("p_a_f"));
          this.diagram(out, "self", "A");
          const base = (L * a.H + h) * n * n;
          const A = d.attention.subarray(base, base + n * n);
          const vals = new Float64Array(n * n);
          for (let k = 0; k < n * n; k++) vals[k] = A[k] / 255;
          const w = a.layer_windows ? a.layer_windows[L] : null;
          const c = a.layer_chunks ? a.layer_chunks[L] : null;
          if (a.causal) for (let q = 0; q < n; q++) for (let k = 0; k < n; k++) {
            if (k > q || (w && k <= q - w) || (c && Math.floor(q / c) !== Math.floor(k / c))) vals[q * n + k] = NaN;
          }
          out.append(el("p", "qkv-p-shape", `${t("p_shape")} (H, n, n) = (${a.H}, ${n}, ${n})`));
          out.append(heatmap(vals, n, n, i, "A", p.labels, p.labels));
          const row = Array.from(A.subarray(i * n, i * n + n), (x) => x / 255);
          let j = 0;
          row.forEach((x, k) => { if (x > row[j]) j = k; });
          out.append(el("p", null, t("looks_most", {token: this.label(i), target: this.label(j), j, w: row[j]})));
          out.append(bars(row.map((x, k) => ({label: this.label(k), value: x, text: num(x, 3), hot: k === i,
                                               data: {value: String(x)}})), "qkv-p-weights"));
          out.append(el("p", "qkv-p-note", t("p_a_quant")));
          break;
        }
        case "z": {
          formula(t("p_z_f"));
          out.append(el("p", "qkv-p-note", t("z_seed")));
          if (this.kind() === "gated") out.append(el("p", "qkv-p-note qkv-p-gated", t("p_z_gated")));   // Qwen3-Next
          else this.diagram(out, "self", "Z");                 // (a gated Z is not A·V: no cell to work out)
          this.vectorView(out, d.heads.z, headRow("z", a.H, h), `(H, n, d_k) = (${a.H}, ${n}, ${a.d_k})`);
          break;
        }
        case "out": case "res1": case "ffn": case "res2": {
          const pre = a.norm_place !== "post";
          const f = {out: t("p_out_f", {last: a.H - 1}), res1: t(pre ? "p_res_pre_f" : "p_res_post_f"),
                     ffn: t(a.gated ? "p_ffn_gated_f" : "p_ffn_f", {d_ff: a.d_ff}),
                     res2: t(pre ? "p_res2_pre_f" : "p_res2_post_f")};
          const kind = this.kind(), mx = a.mixer || {};
          if (kind === "minimax" || kind === "lightning") {          // MiniMax: α·Norm(x) + β·Box(Norm(x))
            const [alpha, beta] = s.box === "res2" ? mx.ffn_factors : mx.factors[L];
            f.res1 = t("p_res_minimax_f", {alpha: num(alpha, 3), beta: num(beta, 3)});
            f.res2 = t("p_res2_minimax_f", {alpha: num(alpha, 3), beta: num(beta, 3)});
          } else if (["mamba", "mamba2", "delta"].includes(kind)) f.res1 = t("p_res_mixer_f");
          if (["mamba", "mamba2", "delta", "lightning"].includes(kind)) {
            f.out = t(kind === "mamba" || kind === "mamba2" ? "p_mix_out_scan_f" : "p_mix_out_linear_f");
          } else if (kind === "parallel") {                           // Falcon-H1: both boxes' outputs, scaled
            const b = mx.beside;
            f.out = t("p_out_beside_f", {a_in: num(b.attn_in, 3), a_out: num(b.attn_out, 3), ssm: num(b.ssm_out, 3)});
          }
          if (kind === "gated" && s.box === "out") out.append(el("p", "qkv-p-note qkv-p-gated", t("p_z_gated")));
          formula(a.parallel && s.box === "res2" ? t("p_res_parallel_f") : f[s.box]);
          if (s.box === "out" && a.out_norms) out.append(el("p", "qkv-p-note", t("p_out_norm")));
          const shape = `(n, d_model) = (${n}, ${a.d_model})`;
          if (s.box === "res2") this.vectorView(out, d.stream, (L + 1) * n, shape);
          else this.vectorView(out, d.blocks[{out: "attn_out", res1: "mid", ffn: "ffn_out"}[s.box]], L * n, shape);
          break;
        }
        case "stream": {
          out.append(el("p", null, t("p_stream_what", {L: a.L})));
          // colour by log |x|: a few tokens (often the first) carry lengths 100× the rest
          const rows = a.L + 1, vals = new Float64Array(rows * n), logs = Array.from(d.stream.norm.data, (x) => Math.log(x + 1e-30));
          const lo = Math.min(...logs), hi = Math.max(...logs);
          for (let k = 0; k < rows * n; k++) vals[k] = hi > lo ? (logs[k] - lo) / (hi - lo) : 0.5;
          out.append(heatmap(vals, rows, n, s.layer, "residual stream"));
          this.vectorView(out, d.stream, s.layer * n, `(L + 1, n, d_model) = (${rows}, ${n}, ${a.d_model})`);
          break;
        }
        case "final": case "hidden": {
          formula(s.box === "final" ? t("p_final_f", {last: a.L - 1}) : "Z (n, d_model)");
          this.vectorView(out, d.final, 0, `(n, d_model) = (${n}, ${a.d_model})`);
          if (s.box === "hidden") out.append(el("p", "qkv-p-encoder", t(a.seq2seq ? "p_memory" : "p_encoder_end", {model: p.model})));
          break;
        }
        case "pooled": {
          formula(t("p_pooled_f"));
          out.append(el("p", "qkv-p-encoder", t("p_encoder_end", {model: p.model})));
          const pl = p.pooled;
          out.append(table(["", t("p_length"), t("p_first", {k: pl.first.length})],
                           [["mean_i(H_i)", num(pl.norm), pl.first.map((x) => num(x)).join(", ")],
                            ["e", "1.0000", (pl.unit_first || []).map((x) => num(x)).join(", ")]]));
          break;
        }
        case "logits": {
          formula(t("p_logits_f"));
          if (a.multipliers && a.multipliers.logits !== 1) out.append(el("p", "qkv-p-note", t("p_logit_scale", {s: num(a.multipliers.logits, 4)})));
          if (a.final_softcap) out.append(el("p", "qkv-p-note", t("p_final_softcap", {c: a.final_softcap})));
          out.append(el("p", null, t("p_logits_what", {V: a.V})));
          const o = p.output, z = d.logits;
          out.append(el("p", "qkv-p-shape", `${t("p_shape")} (n, V) = (${n}, ${a.V}) · ` +
                        t("p_row", {token: this.label(o.position)})));
          out.append(bars(o.top_ids.slice(0, 15).map((id, k) => ({label: o.top_labels[k], value: z[id],
            text: num(z[id], 3), data: {id: String(id), value: String(z[id])}})), "qkv-p-logits"));
          break;
        }
        case "xnorm": case "xout": case "xres": {
          const f = {xnorm: t(a.norm === "rms" ? "p_norm_rms_f" : "p_norm_layer_f"), xout: t("p_out_f", {last: a.H - 1}),
                     xres: t(a.norm_place !== "post" ? "p_xres_pre_f" : "p_xres_post_f")}[s.box];
          formula(f);
          this.vectorView(out, d.blocks[{xnorm: "cross_in", xout: "cross_out", xres: "mid2"}[s.box]], L * n,
                          `(n, d_model) = (${n}, ${a.d_model})`);
          break;
        }
        case "xqkv": case "xattn": {
          const x = d.cross, m = p.cross.source_labels.length, src = p.cross.source_labels;
          const base = (L * a.H + h) * n * m;
          const row = Array.from(x.attention.subarray(base + i * m, base + i * m + m), (w) => w / 255);
          let j = 0;
          row.forEach((w, k) => { if (w > row[j]) j = k; });
          if (s.box === "xqkv") {
            formula(t("p_xqkv_f"));
            const q = this.vector(x.heads.q, (L * a.H + h) * n + i);
            const k = this.vector(x.heads.k, (L * a.H + h) * m + j), v = this.vector(x.heads.v, (L * a.H + h) * m + j);
            out.append(table(["", t("p_shape"), t("p_length"), t("p_first", {k: p.head_dims})], [
              [`q (head ${h}) · ${this.label(i)}`, `(${a.H}, ${n}, ${a.d_k})`, num(q.norm), q.first.map((z) => num(z, 3)).join(", ")],
              [`k · ${src[j]}`, `(${a.H}, ${m}, ${a.d_k})`, num(k.norm), k.first.map((z) => num(z, 3)).join(", ")],
              [`v · ${src[j]}`, `(${a.H}, ${m}, ${a.d_k})`, num(v.norm), v.first.map((z) => num(z, 3)).join(", ")]]));
            out.append(el("p", "qkv-p-note", t("p_reads", {token: src[j]})));
            break;
          }
          out.append(el("p", null, t("p_xattn_what", {n, m})));
          this.diagram(out, "cross", "A");
          const vals = Float64Array.from(x.attention.subarray(base, base + n * m), (w) => w / 255);
          out.append(heatmap(vals, n, m, i, "cross A", p.labels, src));
          out.append(el("p", null, t("looks_most", {token: this.label(i), target: src[j], j, w: row[j]})));
          out.append(bars(row.map((w, k) => ({label: src[k], value: w, text: num(w, 3), data: {value: String(w)}})),
                          "qkv-p-xweights"));
          out.append(el("p", "qkv-p-caption", t("p_s_f") + ":"));
          const sc = this.scoreRow(L, h, i, p.cross.scores, x.scores, m);
          out.append(bars(sc.map((z, k) => ({label: src[k], value: z, text: num(z, 2), off: z === -Infinity,
                                              data: {value: String(z)}})), "qkv-p-xscores"));
          out.append(el("p", "qkv-p-note", t("p_a_quant")));
          break;
        }
        case "xz": {
          formula(t("p_z_f"));
          this.diagram(out, "cross", "Z");
          this.vectorView(out, d.cross.heads.z, headRow("z", a.H, h), `(H, n, d_k) = (${a.H}, ${n}, ${a.d_k})`);
          break;
        }
        case "probs": this.probs(out); break;
        default:                                          // a scan's or linear attention's own steps
          if (s.box.startsWith("mix_") && global.QKV_PIPELINE_MIXER) global.QKV_PIPELINE_MIXER.detail(this, out, s.box);
          break;
      }
    }
    // attention as its diagram with the arithmetic of a cell (pipeline_diagram.js, loaded before this file)
    diagram(out, which, matrix) {
      if (global.QKV_PIPELINE_DIAGRAM) global.QKV_PIPELINE_DIAGRAM.draw(out, this, which, matrix);
    }
    boxTitle(id) {
      const all = this.boxes();
      for (const [k, title] of [...all.start, ...all.block, ...all.end]) if (k === id) return title;
      return id;
    }
    // row i of S (layer L, head h): enc {lo, step}, codes (L, H, n, m) (self-attention: m = n)
    scoreRow(L, h, i, enc, codes, m) {
      const p = this.p, n = this.n;
      enc = enc || p.scores;
      codes = codes || this.d.scores;
      m = m || n;
      const base = ((L * p.arch.H + h) * n + i) * m, lo = enc.lo[L][h], step = enc.step[L][h];
      return Array.from(codes.subarray(base, base + m), (c) => (c === 0 ? -Infinity : lo + (c - 1) * step));
    }

    probs(out) {
      const p = this.p, s = this.s, t = (k, v) => this.t(k, v), o = p.output, z = this.d.logits, V = z.length;
      out.append(el("pre", "qkv-p-formula", t("p_probs_f")));
      const controls = el("div", "qkv-p-sampling");
      const slider = (cls, key, min, max, step, value, show) => {
        const lab = el("label", "qkv-field", t(key) + " ");
        const input = el("input", cls);
        Object.assign(input, {type: "range", min, max, step});
        input.value = value;
        const shown = el("span", "qkv-p-value", show(value));
        lab.append(input, shown);
        return [lab, input, shown];
      };
      const [tl, temp, tv] = slider("qkv-p-temp", "p_temp", 0, 2, 0.05, s.T, (v) => (+v).toFixed(2));
      const [pl, topp, pv] = slider("qkv-p-topp", "p_topp", 0.05, 1, 0.05, s.topp, (v) => (+v >= 1 ? t("p_off") : (+v).toFixed(2)));
      const kl = el("label", "qkv-field", t("p_topk") + " ");
      const topk = el("input", "qkv-p-topk");
      Object.assign(topk, {type: "number", min: 0, max: V, step: 1});
      topk.value = s.topk;
      kl.append(topk, el("span", "qkv-p-value", s.topk ? "" : t("p_off")));
      controls.append(tl, kl, pl);
      if (this.options.onNext && !this.top.seq2seq) {      // an encoder–decoder: the engine writes no single next token here
        const go = el("button", "qkv-p-next", t("p_next") + " →");
        go.type = "button";
        go.addEventListener("click", () => this.options.onNext({temperature: s.T, top_k: s.topk || null,
                                                                 top_p: s.topp >= 1 ? null : s.topp}));
        controls.append(go);
      }
      out.append(controls);
      const list = el("div", "qkv-p-probs");
      const summaryLine = el("p", "qkv-p-remain");
      out.append(summaryLine, list);
      const update = () => {
        const {probs: P, kept: remain} = distribution(z, s.T, s.topk, s.topp >= 1 ? null : s.topp);
        let best = 0;
        for (let v = 1; v < V; v++) if (P[v] > P[best]) best = v;
        const k = o.top_ids.indexOf(best);
        summaryLine.textContent = (s.T === 0 ? t("p_greedy") + " " : "") + t("p_remain", {k: remain, V}) + " " +
          t("p_next") + ": “" + (k >= 0 ? o.top_labels[k] : String(best)) + "” (" + pct(P[best]) + ")";
        list.textContent = "";
        const rows = o.top_ids.slice(0, 20).map((id, k) => ({
          label: o.top_labels[k], value: P[id], text: P[id] > 0 ? pct(P[id]) : t("p_removed"),
          off: !(P[id] > 0), hot: k === 0, data: {id: String(id), p: String(P[id])}}));
        list.append(el("p", "qkv-p-note", t("p_bar_scale")), bars(rows, "qkv-p-prob-bars", 1));
        Object.assign(this.root.dataset, {T: s.T, topk: s.topk, topp: s.topp, remain});
      };
      temp.addEventListener("input", () => { s.T = +temp.value; tv.textContent = s.T.toFixed(2); update(); });
      topp.addEventListener("input", () => { s.topp = +topp.value; pv.textContent = s.topp >= 1 ? t("p_off") : s.topp.toFixed(2); update(); });
      topk.addEventListener("input", () => {
        const k = Math.floor(+topk.value);
        s.topk = Number.isFinite(k) && k >= 1 ? Math.min(k, V) : 0;
        kl.lastChild.textContent = s.topk ? "" : t("p_off");
        update();
      });
      update();
    }
  }

  function fail(root, err) {
    root.textContent = "";
    root.classList.add("qkv");
    root.append(el("div", "qkv-error", "qkv pipeline: " + (err && err.message ? err.message : String(err))));
    root.dataset.ready = "error";
  }

  // one stack's arrays: stream, final, blocks, heads, A (bytes), S (codes), and its cross-attention's
  async function decodeStack(part) {
    const d = {stream: await summary(part.stream), final: await summary(part.final), blocks: {}, heads: {}};
    for (const k of Object.keys(part.blocks)) d.blocks[k] = await summary(part.blocks[k]);
    for (const k of Object.keys(part.heads)) d.heads[k] = await summary(part.heads[k]);
    d.attention = (await array(part.attention)).data;
    d.scores = (await array(part.scores.data)).data;
    d.router = part.router || null;
    d.mixers = global.QKV_PIPELINE_MIXER ? await global.QKV_PIPELINE_MIXER.decode(part.mixers) : null;   // by layer
    d.arith = global.QKV_PIPELINE_DIAGRAM ? await global.QKV_PIPELINE_DIAGRAM.decode(part.arithmetic) : null;                      // a mixture of experts: per layer {experts, weights} or null
    if (part.cross) {
      const x = part.cross;
      d.cross = {heads: {}, attention: (await array(x.attention)).data, scores: (await array(x.scores.data)).data};
      for (const k of Object.keys(x.heads)) d.cross.heads[k] = await summary(x.heads[k]);
      d.cross.arith = global.QKV_PIPELINE_DIAGRAM ? await global.QKV_PIPELINE_DIAGRAM.decode(x.arithmetic) : null;
    }
    return d;
  }

  async function mount(root, payload, options) {
    const t0 = performance.now();
    try {
      if (payload.kind !== "pipeline") throw new Error("this is not a pipeline payload");
      let d;
      if (payload.seq2seq) {
        d = {encoder: await decodeStack(payload.stacks.encoder), decoder: await decodeStack(payload.stacks.decoder)};
      } else d = await decodeStack(payload);
      d.logits = payload.output ? (await array(payload.output.logits)).data : null;
      // text laid out before the page's Hangul face is ready may keep the missing-glyph box: wait for it
      if (document.fonts && document.fonts.load) await document.fonts.load('13px "qkv Hangul"', "\uD55C").catch(() => null);
      const view = new Pipeline(root, payload, d, options);
      view.render();
      root.dataset.decodeMs = (performance.now() - t0).toFixed(1);
      root.dataset.ready = "1";
      return view;
    } catch (err) {
      fail(root, err);
      throw err;
    }
  }

  function boot() {
    for (const root of document.querySelectorAll("[data-qkv-pipeline]")) {
      let payload;
      try { payload = JSON.parse(root.nextElementSibling.textContent); } catch (err) { fail(root, err); continue; }
      mount(root, payload).catch((err) => console.error("qkv pipeline:", err));
    }
  }

  // util: what pipeline_diagram.js draws with (pipeline_kit.js's; the diagram reads these when it draws)
  global.QKV_PIPELINE = {mount, boot, distribution, format, util: {el, viridisRGB}};
})(window);
