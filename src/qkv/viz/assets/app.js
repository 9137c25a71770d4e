/* qkv serve: the page's two modes, above one viewer (viewer.js).
 *
 *   Attention  type text, pick a model, see its attention.
 *   Chat       talk with a chat model (a decoder with a chat template, e.g. smollm2): the reply
 *              streams in, then the viewer shows what every token of the conversation attended to
 *              (and, when it comes, the logit lens: computed after the reply, which it never delays).
 *   Pipeline   the whole model as its data flow (pipeline.js): fetched only when asked for;
 *              "next token" asks the engine for one more token and redraws the longer text.
 *   Graph      an attribution graph's JSON (`qkv graph … --json`), opened from a file or dropped on the
 *              page, drawn by graph.js in English or Korean; read in the page, never sent to the server.
 *              A server started with transcoders (graph_compute) also computes the graph of a typed prompt.
 *
 * Config: the JSON script element of class qkv-app-config ({models, model, max_chars, text,
 * pipeline_tokens, chat_model, chat_ready, max_message, max_new_tokens, graph_words: {en, ko}, graph_bytes,
 * graph_compute, graph_tokens}).
 * POST api/attention answers the viewer's payload, or {"error": ...} with a 4xx/5xx status.
 * POST api/chat {messages, model, max_new_tokens} answers one JSON object per line:
 * {prompt, dropped}, then {piece} as the reply is written, then {done, reply, stopped, payload} as it ends
 * (Send works again from here), then for a decoder {lens: the payload's lens section, or null and note};
 * or {"error": ...} (a 4xx/5xx status before the reply, or a last line if it breaks mid-way).
 * The server keeps no conversation: the page sends every turn so far with each message.
 * POST api/pipeline {text, model, lang, layer?} answers the pipeline payload; POST api/pipeline/next
 * {text, model, lang, temperature, top_k, top_p} answers {id, token, text, payload}. POST api/graph {text}
 * answers a graph's JSON (only when cfg.graph_compute).
 * Every text from the user or the model is shown with textContent, never as HTML.
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
  function picker(cls, value) {
    const s = el("select", cls);
    s.name = "model";
    s.setAttribute("aria-label", "model");
    for (const m of cfg.models) { const o = el("option", null, m); o.value = m; s.append(o); }
    s.value = value;
    return s;
  }

  // ── the modes ──────────────────────────────────────────────────────────────────
  const modes = el("div", "qkv-modes");
  const modeButtons = {};
  for (const [name, label] of [["attention", "Attention"], ["chat", "Chat"], ["pipeline", "Pipeline"], ["graph", "Graph"]]) {
    const b = el("button", "qkv-mode", label);
    b.type = "button";
    b.dataset.mode = name;
    b.addEventListener("click", () => setMode(name));
    modeButtons[name] = b;
    modes.append(b);
  }

  // ── attention: a text, a model, the views ──────────────────────────────────────
  const form = el("form", "qkv-form");
  const text = el("textarea");
  text.name = "text";
  text.value = cfg.text;
  text.setAttribute("aria-label", "text to look at");
  text.spellcheck = false;
  const side = el("div", "qkv-side");
  const model = picker("qkv-model-picker", cfg.model);
  const go = el("button", null, "Show attention");
  go.type = "submit";
  side.append(model, go);
  form.append(text, side);

  // ── chat: the transcript, a message box ────────────────────────────────────────
  const chat = el("div", "qkv-chat");
  const log = el("div", "qkv-chat-log");
  log.setAttribute("aria-live", "polite");
  const hint = el("p", "qkv-chat-hint",
    "Ask the model something. Its reply streams in; then the views below show what every token " +
    "of the conversation attended to (the reply's tokens are marked as generated).");
  log.append(hint);
  const chatForm = el("form", "qkv-form qkv-chat-form");
  const message = el("textarea");
  message.name = "message";
  message.maxLength = cfg.max_message;
  message.placeholder = "Your message · Enter to send, Shift+Enter for a new line";
  message.setAttribute("aria-label", "message");
  const chatSide = el("div", "qkv-side");
  const chatModel = picker("qkv-chat-model", cfg.chat_model);
  const send = el("button", null, "Send");
  send.type = "submit";
  const fresh = el("button", "qkv-new-chat", "New chat");
  fresh.type = "button";
  chatSide.append(chatModel, send, fresh);
  chatForm.append(message, chatSide);
  chat.append(log, chatForm);

  // ── pipeline: a text, a model, a language, the flow (its own root) ────────────
  const pipe = el("div", "qkv-pipe");
  const pipeForm = el("form", "qkv-form qkv-pipe-form");
  const pipeText = el("textarea");
  pipeText.name = "pipeline-text";
  pipeText.value = cfg.text;
  pipeText.setAttribute("aria-label", "text to follow through the model");
  pipeText.spellcheck = false;
  const pipeSide = el("div", "qkv-side");
  const pipeModel = picker("qkv-pipe-model", cfg.model);
  const pipeLang = el("select", "qkv-pipe-lang");
  pipeLang.setAttribute("aria-label", "language");
  for (const [v, l] of [["en", "English"], ["ko", "한국어"]]) { const o = el("option", null, l); o.value = v; pipeLang.append(o); }
  const pipeGo = el("button", null, "Show pipeline");
  pipeGo.type = "submit";
  pipeSide.append(pipeModel, pipeLang, pipeGo);
  pipeForm.append(pipeText, pipeSide);
  const pipeRoot = el("div");
  pipeRoot.setAttribute("data-qkv-pipeline", "");
  pipe.append(pipeForm, pipeRoot);

  // ── graph: a graph's JSON from a file or a drop, drawn by graph.js (its own root) ─
  const graphTab = el("div", "qkv-graph-tab");
  const graphForm = el("div", "qkv-form qkv-graph-open");
  const graphLang = el("select", "qkv-graph-lang");
  graphLang.setAttribute("aria-label", "language");
  for (const [v, l] of [["en", "English"], ["ko", "한국어"]]) { const o = el("option", null, l); o.value = v; graphLang.append(o); }
  const graphFile = el("input", "qkv-graph-file");
  graphFile.type = "file";
  graphFile.accept = ".json,application/json";
  const graphHint = el("span", "qkv-graph-hint");
  graphForm.append(graphHint, graphFile, graphLang);
  const graphAsk = el("form", "qkv-form qkv-graph-ask");                // a prompt's graph, computed by the server
  const graphText = el("textarea");
  graphText.name = "graph-text";
  graphText.value = cfg.text;
  graphText.setAttribute("aria-label", "prompt whose attribution graph to compute");
  const graphGo = el("button");
  graphGo.type = "submit";
  graphAsk.append(graphText, graphGo);
  graphAsk.hidden = !cfg.graph_compute;
  const graphRoot = el("div", "qkv");
  graphRoot.setAttribute("data-qkv-graph", "");
  graphTab.append(graphAsk, graphForm, graphRoot);
  const graphWords = () => cfg.graph_words[graphLang.value] || cfg.graph_words.en;
  const paintGraphHint = () => { graphHint.textContent = graphWords().open; graphGo.textContent = graphWords().compute; };
  graphLang.addEventListener("change", paintGraphHint);
  paintGraphHint();

  const status = el("p", "qkv-status");
  status.setAttribute("role", "status");
  const error = el("div", "qkv-error");
  error.setAttribute("role", "alert");
  error.hidden = true;
  for (const part of [modes, form, chat, pipe, graphTab, status, error]) app.insertBefore(part, root);

  let viewer = null, viewOf = null;                   // the view below, and the mode that made it
  function fail(messageText) {
    error.textContent = messageText;
    error.hidden = false;
    root.classList.add("qkv-stale");                 // the views below belong to the previous answer
    app.dataset.state = "error";
  }
  async function show(payload, mode) {
    error.hidden = true;
    root.classList.remove("qkv-stale");
    viewOf = mode;
    root.hidden = app.dataset.mode !== mode;
    viewer = await QKV.mount(root, payload, viewer ? viewer.saved() : undefined);
  }

  function setMode(name) {
    app.dataset.mode = name;
    form.hidden = name !== "attention";
    chat.hidden = name !== "chat";
    pipe.hidden = name !== "pipeline";
    graphTab.hidden = name !== "graph";
    root.hidden = name === "pipeline" || name === "graph" || viewOf !== name;   // a view shows under its mode
    for (const [m, b] of Object.entries(modeButtons)) b.setAttribute("aria-pressed", String(m === name));
    if (name === "attention") count();
    else if (name === "chat") status.textContent = chatCount();
    else if (name === "pipeline") { status.textContent = `up to ${cfg.pipeline_tokens} tokens · Ctrl+Enter to show`; if (!pipeShown) pipeForm.requestSubmit(); }
    else status.textContent = "";
    ({attention: text, chat: message, pipeline: pipeText, graph: graphFile})[name].focus();
  }

  // ── attention ──────────────────────────────────────────────────────────────────
  const count = () => { status.textContent = `${text.value.length.toLocaleString("en")} / ${cfg.max_chars.toLocaleString("en")} characters · Ctrl+Enter to show`; };
  text.addEventListener("input", count);
  text.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit(); });

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
      await show(body, "attention");
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

  // ── chat ───────────────────────────────────────────────────────────────────────
  let turns = [];                                     // [{role, content}] the conversation so far
  const chatCount = () => `${turns.length} message${turns.length === 1 ? "" : "s"} · ` +
    `${message.value.length.toLocaleString("en")} / ${cfg.max_message.toLocaleString("en")} characters`;
  message.addEventListener("input", () => { status.textContent = chatCount(); });
  message.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); chatForm.requestSubmit(); }
  });
  function bubble(role, content) {
    hint.hidden = true;
    const b = el("div", `qkv-msg qkv-msg-${role}`);
    b.append(el("span", "qkv-msg-who", role === "user" ? "you" : chatModel.value), el("span", "qkv-msg-text", content));
    log.append(b);
    log.scrollTop = log.scrollHeight;
    return b.querySelector(".qkv-msg-text");
  }
  fresh.addEventListener("click", () => {
    turns = [];
    for (const b of log.querySelectorAll(".qkv-msg")) b.remove();
    hint.hidden = false;
    error.hidden = true;
    status.textContent = chatCount();
    message.focus();
  });
  chatModel.addEventListener("change", () => fresh.click());   // another model: another conversation

  // The response body, one JSON object per line, as the lines arrive.
  async function* lines(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), {stream: !done});
      let i;
      while ((i = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, i);
        buffer = buffer.slice(i + 1);
        if (line.trim()) yield JSON.parse(line);
      }
      if (done) return;
    }
  }

  let replies = 0;                                    // replies asked for: a late logit lens joins only its own
  async function talk() {
    const said = message.value;
    if (!said.trim()) return;
    const no = ++replies;
    delete app.dataset.lens;
    send.disabled = fresh.disabled = chatModel.disabled = true;
    error.hidden = true;
    app.dataset.state = "writing";
    const asked = turns.concat([{role: "user", content: said}]);
    const mine = bubble("user", said).parentNode;
    const reply = bubble("assistant", "");
    reply.parentNode.classList.add("qkv-writing");
    root.hidden = true;                               // the view below is the previous answer's, not this reply's
    message.value = "";
    status.textContent = "reading the conversation…";
    const t0 = performance.now();
    let written = "", done = null;
    const undo = (why) => {                           // nothing was answered: take the question back
      root.hidden = viewOf !== "chat";
      mine.remove();
      reply.parentNode.remove();
      if (!turns.length) hint.hidden = false;
      message.value = said;
      fail(why);
    };
    try {
      let r;
      try {
        r = await fetch("api/chat", {method: "POST", headers: {"Content-Type": "application/json"},
          body: JSON.stringify({messages: asked, model: chatModel.value, max_new_tokens: cfg.max_new_tokens})});
      } catch (e) {
        return undo(`cannot reach the qkv server (${e.message}); is \`qkv serve\` still running?`);
      }
      if (!r.ok) {
        let body;
        try { body = await r.json(); } catch (e) { body = {}; }
        return undo(body.error || `the server answered ${r.status}`);
      }
      for await (const event of lines(r)) {
        if (done) { await extra(event, done.payload, no); continue; }   // the reply is shown: what follows it
        if (event.error) return undo(event.error);
        if (event.prompt !== undefined) {
          status.textContent = `writing… (the conversation is ${event.prompt} tokens` +
            (event.dropped ? `; the ${event.dropped} oldest turn${event.dropped > 1 ? "s" : ""} left out to fit` : "") + ")";
        } else if (event.piece !== undefined) {
          written += event.piece;
          reply.textContent = written;
          log.scrollTop = log.scrollHeight;
        } else if (event.done) {
          done = event;                               // the reply's own time: to its end, not to its extras
          const ms = Math.round(performance.now() - t0);
          reply.textContent = done.reply;
          reply.parentNode.classList.remove("qkv-writing");
          turns = asked.concat([{role: "assistant", content: done.reply}]);
          const p = done.payload;
          status.textContent = `${p.model}: a reply of ${p.tokens.length - p.prompt_length} tokens ` +
            `(${done.stopped}) in ${ms} ms; below, what each of the ${p.tokens.length} tokens attended to`;
          try {
            await show(p, "chat");
          } finally {
            send.disabled = fresh.disabled = chatModel.disabled = false;   // the server's writer is free too
          }
          app.dataset.state = "shown";
        }
      }
      if (!done) return undo("the reply broke off; send the message again");
    } catch (e) {
      if (!done) return undo("cannot show this reply: " + e.message);
      if (no === replies) fail("cannot show this reply's views: " + e.message);
    } finally {
      if (!done) send.disabled = fresh.disabled = chatModel.disabled = false;
    }
  }

  // What follows a shown reply: its logit lens (computed after it), joining its view if that is still shown.
  async function extra(event, payload, no) {
    if (no !== replies || viewOf !== "chat") return;          // another reply's, or another mode's view by now
    const say = (more) => { if (app.dataset.mode === "chat") status.textContent += more; };
    if (event.lens) {
      payload.lens = event.lens;
      await show(payload, "chat");
      say("; the Logit lens tab is added");
      app.dataset.lens = "shown";
    } else if (event.note) {
      say(`; ${event.note}`);
    } else if (event.error) {
      say(`; no logit lens (${event.error})`);
    }
  }
  chatForm.addEventListener("submit", (e) => { e.preventDefault(); talk(); });

  // ── pipeline ───────────────────────────────────────────────────────────────────
  let pipeShown = false, pipeView = null;
  async function postJSON(path, body) {
    let r, answer;
    try {
      r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    } catch (e) {
      throw new Error(`cannot reach the qkv server (${e.message}); is \`qkv serve\` still running?`);
    }
    try { answer = await r.json(); } catch (e) { answer = {error: `the server answered ${r.status} without JSON`}; }
    if (!r.ok || answer.error) throw new Error(answer.error || `the server answered ${r.status}`);
    return answer;
  }
  async function showPipeline(payload) {
    error.hidden = true;
    // the previous page's choices stay, but its language is the one this payload was asked in
    const state = pipeView ? Object.assign({}, pipeView.s, {lang: payload.lang}) : null;
    pipeView = await QKV_PIPELINE.mount(pipeRoot, payload, {onNext: nextToken, onLayer: runPipeline, state});
    pipeShown = true;
    app.dataset.state = "shown";
  }
  // layer: the one whose whole q, k, v the page should hold for its attention diagram (absent: the first)
  async function runPipeline(layer) {
    pipeGo.disabled = true;
    status.textContent = "running the model…";
    const t0 = performance.now();
    try {
      const ask = {text: pipeText.value, model: pipeModel.value, lang: pipeLang.value};
      if (Number.isInteger(layer)) { ask.layer = layer; pipeLang.value = ask.lang = pipeView.s.lang; }
      await showPipeline(await postJSON("api/pipeline", ask));
      status.textContent = `${pipeModel.value}: every box of one pass, in ${Math.round(performance.now() - t0)} ms`;
    } catch (e) {
      fail(e.message);
    } finally {
      pipeGo.disabled = false;
    }
  }
  async function nextToken(settings) {
    const button = pipeRoot.querySelector(".qkv-p-next");
    if (button) button.disabled = true;
    status.textContent = "writing one token…";
    try {
      if (pipeView) pipeLang.value = pipeView.s.lang;   // the page's own language button counts too
      const answer = await postJSON("api/pipeline/next", Object.assign({text: pipeText.value, model: pipeModel.value,
                                                                          lang: pipeLang.value, layer: pipeView.s.layer}, settings));
      pipeText.value = answer.text;
      await showPipeline(answer.payload);
      status.textContent = `${pipeModel.value} wrote “${answer.token}” (id ${answer.id})`;
    } catch (e) {
      fail(e.message);
      if (button) button.disabled = false;
    }
  }
  pipeForm.addEventListener("submit", (e) => { e.preventDefault(); runPipeline(null); });
  pipeText.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) pipeForm.requestSubmit(); });

  // ── graph ──────────────────────────────────────────────────────────────────────
  async function drawGraph(graph, name) {
    await QKV_GRAPH.fontsReady();
    try {
      QKV_GRAPH.mount(graphRoot, graph, {words: cfg.graph_words, lang: graphLang.value});
    } catch (e) {
      graphRoot.textContent = "";
      return fail(graphWords().bad_file.replace("{why}", e.message));
    }
    status.textContent = `${name}: ${graph.nodes.length.toLocaleString("en")} nodes, ${graph.links.length.toLocaleString("en")} links`;
    app.dataset.state = "shown";
  }
  async function openGraph(file) {
    error.hidden = true;
    const bad = (why) => fail(graphWords().bad_file.replace("{why}", why));
    if (!file) return;
    if (file.size > cfg.graph_bytes) return bad(`${file.size.toLocaleString("en")} bytes, more than ${cfg.graph_bytes.toLocaleString("en")}`);
    let graph;
    try { graph = JSON.parse(await file.text()); } catch (e) { return bad(e.message); }
    await drawGraph(graph, file.name);
  }
  async function computeGraph() {
    error.hidden = true;
    graphGo.disabled = true;
    status.textContent = graphWords().computing;
    const t0 = performance.now();
    try {
      const graph = await postJSON("api/graph", {text: graphText.value});
      await drawGraph(graph, `${graph.model}, in ${Math.round(performance.now() - t0)} ms`);
    } catch (e) {
      fail(e.message);
    } finally {
      graphGo.disabled = false;
    }
  }
  graphAsk.addEventListener("submit", (e) => { e.preventDefault(); computeGraph(); });
  graphFile.addEventListener("change", () => openGraph(graphFile.files[0]));
  graphTab.addEventListener("dragover", (e) => { e.preventDefault(); graphTab.classList.add("qkv-drop"); });
  graphTab.addEventListener("dragleave", () => graphTab.classList.remove("qkv-drop"));
  graphTab.addEventListener("drop", (e) => {
    e.preventDefault();
    graphTab.classList.remove("qkv-drop");
    if (e.dataTransfer && e.dataTransfer.files.length) openGraph(e.dataTransfer.files[0]);
  });

  if (cfg.chat_ready) {
    setMode("chat");                                  // the server's model can chat: start there
  } else {
    setMode("attention");
    run();                                            // the example, at once
  }
})();
