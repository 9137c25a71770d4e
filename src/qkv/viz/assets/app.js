/* qkv serve: the page's form. Type text, pick a model, see the viewer (viewer.js) update.
 *
 * Config: the JSON script element of class qkv-app-config ({models, model, max_chars, text}).
 * The server answers POST api/attention with the viewer's payload, or {"error": ...}
 * with a 4xx/5xx status; the error is shown as text above the views.
 */
(function () {
  "use strict";
  const cfg = JSON.parse(document.querySelector("script.qkv-app-config").textContent);
  const app = document.querySelector(".qkv-app");
  const root = app.querySelector("[data-qkv-root]");

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const form = el("form", "qkv-form");
  const text = el("textarea");
  text.name = "text";
  text.value = cfg.text;
  text.setAttribute("aria-label", "text to look at");
  text.spellcheck = false;
  const side = el("div", "qkv-side");
  const model = el("select", "qkv-model-picker");
  model.name = "model";
  model.setAttribute("aria-label", "model");
  for (const m of cfg.models) { const o = el("option", null, m); o.value = m; model.append(o); }
  model.value = cfg.model;
  const go = el("button", null, "Show attention");
  go.type = "submit";
  side.append(model, go);
  form.append(text, side);
  const status = el("p", "qkv-status");
  status.setAttribute("role", "status");
  const error = el("div", "qkv-error");
  error.setAttribute("role", "alert");
  error.hidden = true;
  app.insertBefore(form, root);
  app.insertBefore(status, root);
  app.insertBefore(error, root);

  const count = () => { status.textContent = `${text.value.length.toLocaleString("en")} / ${cfg.max_chars.toLocaleString("en")} characters · Ctrl+Enter to show`; };
  text.addEventListener("input", count);
  text.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit(); });

  let viewer = null;
  function fail(message) {
    error.textContent = message;
    error.hidden = false;
    root.classList.add("qkv-stale");                 // the views below belong to the previous text
    app.dataset.state = "error";
  }
  async function run() {
    go.disabled = true;
    status.textContent = "running the model…";
    const t0 = performance.now();
    try {
      let r, body;
      try {
        r = await fetch("api/attention", {method: "POST", headers: {"Content-Type": "application/json"},
                                          body: JSON.stringify({text: text.value, model: model.value})});
      } catch (e) {
        return fail(`cannot reach the qkv server (${e.message}); is \`qkv serve\` still running?`);
      }
      try { body = await r.json(); } catch (e) { body = {error: `the server answered ${r.status} without JSON`}; }
      if (!r.ok || body.error) { count(); return fail(body.error || `the server answered ${r.status}`); }
      error.hidden = true;
      root.classList.remove("qkv-stale");
      viewer = await QKV.mount(root, body, viewer ? viewer.saved() : undefined);
      status.textContent = `${body.model}: ${body.tokens.length} tokens, ${body.layers.length} layers × ` +
        `${body.heads} heads, in ${Math.round(performance.now() - t0)} ms`;
      app.dataset.state = "shown";
    } catch (e) {
      fail("cannot show this answer: " + e.message);
    } finally {
      go.disabled = false;
    }
  }
  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  run();
})();
