/* qkv viewer panel of an SAE's features on a text (`qkv sae show --out`): the optional section "features"
 * of viewer.js. The tokens as running text; hovering or focusing a token lists the latents that fire on it
 * (its top ones, the largest activation first); clicking a latent (or pressing Enter on it) colours every
 * token by that latent's activation there (white where it does not fire, red at its largest on the text).
 *
 * Input: the section of the payload (qkv/viz/payload.py, interpret_payload.features_section), with its
 * colour stops (palette.DIVERGING_STOPS, the figures' map). Tokens reach the page only through textContent:
 * never parsed as HTML. No network.
 *
 * Load this file after viewer_causes.js (the page inlines wire.js, viewer.js, viewer_panels.js,
 * viewer_causes.js, then this file). It registers QKV.panels.features (the interface is described at the
 * top of viewer_panels.js). The root's data-token (the token shown) and data-feature (the latent picked)
 * say what is shown.
 */
(function (global) {
  "use strict";

  const QKV = global.QKV;
  if (!QKV || !QKV.draw) throw new Error("qkv viewer: load viewer_panels.js before viewer_features.js");
  const {el, shown} = QKV.util;
  const {ramp, legend, about} = QKV.draw;
  const SITES = {resid: "residual stream entering block", attn_out: "attention output of block",
                 ffn_out: "FFN output of block"};

  function buildFeatures(v) {
    const F = v.p.features, panel = v.panels.features, n = F.tokens.length;
    const skipped = new Set(F.skipped);
    // act[t][j]: latent j's activation on token t (0 where it does not fire)
    const act = F.features.map((row, t) => new Map(row.map((j, r) => [j, F.acts[t][r]])));
    const fmtZ = (z) => String(z);                                      // as the payload holds it (5 digits)
    let picked = null, token = null;
    panel.append(about([["SAE ", `${F.sae || "—"}: ${F.d_sae} latents${F.k == null ? "" : ", k " + F.k}`],
                        ["reads ", `the ${SITES[F.site] || F.site} ${F.layer}`]]));
    const text = el("div", "qkv-attr-words qkv-feat-text"), toks = [];
    F.tokens.forEach((t, i) => {
      const tok = el("span", "qkv-attr-tok qkv-feat-tok", shown(t, 32));
      tok.tabIndex = 0;
      Object.assign(tok.dataset, {i, id: F.ids[i], fires: F.features[i].length});
      if (skipped.has(i)) tok.classList.add("qkv-feat-skipped");
      tok.addEventListener("mouseenter", () => showToken(i));
      tok.addEventListener("focus", () => showToken(i));
      text.append(tok);
      toks.push(tok);
    });
    const readout = el("p", "qkv-readout", "hover or focus a token for the features that fire on it");
    readout.setAttribute("aria-live", "polite");
    const list = el("ol", "qkv-feat-list");
    const picking = el("p", "qkv-readout qkv-feat-picked", "click a feature to colour the tokens where it fires");
    const clear = el("button", "qkv-feat-clear", "clear");
    clear.type = "button";
    clear.hidden = true;
    clear.addEventListener("click", () => pick(null));
    const side = el("div", "qkv-feat-side");
    side.append(readout, list);
    panel.append(text, side, el("div", "qkv-feat-pickline"), legend(x => ramp(F.colours, 0.5 + 0.5 * x), ["0", "max"],
                 "the picked feature's activation z on each token (white: it does not fire)"),
                 el("p", "qkv-note", "Each token's stream at the SAE's site, encoded: z = TopK((x − b_dec)·W_enc + " +
                    "b_enc), at most k latents non-zero. " + (F.skipped.length ? "Tokens in grey are not read: a " +
                    "decoder's first position (the attention sink) lies outside what the SAE was trained on. " : "") +
                    "Tab through the tokens; Enter on a feature picks it."));
    panel.querySelector(".qkv-feat-pickline").append(picking, clear);

    function showToken(i) {
      token = i;
      v.root.dataset.token = i;
      for (const t of toks) t.classList.toggle("qkv-attr-on", t === toks[i]);
      const fs = F.features[i], top = fs.slice(0, F.top);
      readout.textContent = skipped.has(i) ? `“${shown(F.tokens[i], 32)}” (token ${i}): not read by the SAE`
        : `“${shown(F.tokens[i], 32)}” (token ${i}): ${fs.length} features fire` +
          (fs.length > top.length ? `, the top ${top.length}:` : fs.length ? ":" : "");
      list.replaceChildren();
      top.forEach((j, r) => {
        const b = el("button", "qkv-feat-btn", `#${j}  z = ${fmtZ(F.acts[i][r])}`);
        b.type = "button";
        b.dataset.feature = j;
        b.setAttribute("aria-pressed", String(picked === j));
        b.addEventListener("click", () => pick(j));
        const li = el("li");
        li.append(b);
        list.append(li);
      });
    }

    function pick(j) {
      picked = j;
      if (j == null) delete v.root.dataset.feature; else v.root.dataset.feature = j;
      clear.hidden = j == null;
      for (const b of list.querySelectorAll(".qkv-feat-btn"))
        b.setAttribute("aria-pressed", String(+b.dataset.feature === j));
      let m = 0, count = 0;
      if (j != null) for (const a of act) if (a.has(j)) { m = Math.max(m, a.get(j)); count++; }
      toks.forEach((tok, t) => {
        const z = j == null ? 0 : act[t].get(j) || 0;
        tok.dataset.z = String(z);
        const rgb = ramp(F.colours, m > 0 ? 0.5 + 0.5 * z / m : 0.5);
        tok.style.background = j == null ? "" : `rgb(${rgb})`;
        tok.style.color = m > 0 && z > 0.6 * m ? "#fff" : "";
        tok.title = j == null ? "" : `feature ${j}: z = ${fmtZ(z)}`;
      });
      picking.textContent = j == null ? "click a feature to colour the tokens where it fires"
        : `feature ${j} fires on ${count} of ${n} tokens, at most z = ${fmtZ(m)}`;
    }

    return {draw() {}};
  }

  QKV.panels.features = {
    build: buildFeatures,
    meta: (v) => [`SAE features: layer ${v.p.features.layer} ${v.p.features.site}`],
  };
})(window);
