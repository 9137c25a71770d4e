/* qkv export: a panel of a page as it is on screen, as SVG or PNG, and its data as JSON.
 *
 *   QKV_EXPORT.svg(node)           → string   the node as drawn: every box's background and borders, every
 *                                             text as SVG text (in its font, Korean with the page's own Hangul
 *                                             subset), every canvas as an image of its pixels; clipped where
 *                                             the page clips (scrolled lists show what is scrolled into view)
 *   QKV_EXPORT.png(node, scale?)   → Promise<Blob>   that SVG drawn at `scale` (2: sharp on paper)
 *   QKV_EXPORT.rasterise(text, w, h, k, what)  → Promise<Blob>   any SVG text of w × h drawn at k× as PNG (the
 *                                             graph page's); WHAT names it in the errors ("panel", "graph")
 *   QKV_EXPORT.dataOf(node)        → object   what a DOM panel shows: its headings, formulas, tables, rows with
 *                                             a data-value, and the numbers behind its heatmaps (canvas.qkvData)
 *   QKV_EXPORT.bar(target, name, data)  → element   the buttons "PNG", "SVG", "Copy JSON": target() the node
 *                                             to draw, name() the file name without extension, data() the JSON
 *
 * Elements marked data-qkv-export="skip" (the bar itself) are left out. Files are saved through a link with
 * a download name; nothing leaves the page. Tokens are written as XML text (escaped), never as markup.
 */
(function (global) {
  "use strict";

  // SVG's namespace: a name, never fetched; written in parts so that no page of qkv holds a URL at all
  const NS = ["http" + ":", "", "www.w3.org", "2000", "svg"].join("/");
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]))
    .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]/g, "");          // not allowed in XML at all
  const n2 = (x) => String(Math.round(x * 100) / 100);

  function paint(c) {                              // a computed colour, or null when nothing is painted
    if (!c || c === "transparent") return null;
    const m = /rgba\(([^)]+)\)/.exec(c);
    if (m && +m[1].split(",")[3] === 0) return null;
    return c;
  }
  function meet(a, b) {                            // the intersection of two rectangles {x0, y0, x1, y1}
    return {x0: Math.max(a.x0, b.x0), y0: Math.max(a.y0, b.y0), x1: Math.min(a.x1, b.x1), y1: Math.min(a.y1, b.y1)};
  }
  const empty = (r) => r.x1 - r.x0 <= 0.5 || r.y1 - r.y0 <= 0.5;
  const box = (r) => ({x0: r.left, y0: r.top, x1: r.right, y1: r.bottom});

  let measurer = null;
  function metrics(font) {                         // the font's ascent and descent, as canvas measures them
    measurer = measurer || document.createElement("canvas").getContext("2d");
    measurer.font = font;
    const m = measurer.measureText("Mg가");
    return {ascent: m.fontBoundingBoxAscent || m.actualBoundingBoxAscent, descent: m.fontBoundingBoxDescent || m.actualBoundingBoxDescent};
  }

  function fontFaces() {                           // the page's @font-face rules (the Hangul subset), for the SVG
    const rules = [];
    for (const sheet of document.styleSheets) {
      let list;
      try { list = sheet.cssRules; } catch (e) { continue; }
      for (const r of list) if (r.type === CSSRule.FONT_FACE_RULE) rules.push(r.cssText);
    }
    return rules.join("\n");
  }

  function svg(node) {
    const origin = node.getBoundingClientRect(), ox = origin.left, oy = origin.top;
    const W = Math.max(1, Math.ceil(origin.width));
    const H = Math.max(1, Math.ceil(origin.height));
    const out = [];
    const ink = {x0: Infinity, y0: Infinity, x1: -Infinity, y1: -Infinity};    // what is drawn: the file's box
    const inked = (r) => { ink.x0 = Math.min(ink.x0, r.x0); ink.y0 = Math.min(ink.y0, r.y0); ink.x1 = Math.max(ink.x1, r.x1); ink.y1 = Math.max(ink.y1, r.y1); };
    const rect = (r, attrs) => inked(r) || out.push(`<rect x="${n2(r.x0 - ox)}" y="${n2(r.y0 - oy)}" width="${n2(r.x1 - r.x0)}" ` +
                                        `height="${n2(r.y1 - r.y0)}" ${attrs}/>`);

    function text(node, clip) {
      const parent = node.parentElement, cs = getComputedStyle(parent);
      const value = node.nodeValue;
      if (!value || !value.trim() || cs.visibility === "hidden") return;
      const range = document.createRange();
      range.selectNodeContents(node);
      const rects = [...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0);
      if (!rects.length) return;
      const font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
      const {ascent, descent} = metrics(font);
      const style = `font-family:${esc(cs.fontFamily)};font-size:${cs.fontSize};font-weight:${cs.fontWeight};` +
                    `font-style:${cs.fontStyle}` + (cs.letterSpacing !== "normal" ? `;letter-spacing:${cs.letterSpacing}` : "");
      const fill = paint(cs.color) || "#000";
      // one <text> per line box: a wrapped text node is cut where its words go to the next line
      const lines = [];
      if (rects.length === 1) lines.push({r: rects[0], s: value});
      else {
        const words = value.split(/(\s+)/);
        let at = 0;
        for (const w of words) {
          if (w) {
            range.setStart(node, at); range.setEnd(node, at + w.length);
            const r = range.getBoundingClientRect();
            const last = lines[lines.length - 1];
            if (last && Math.abs(last.r.top - r.top) < 2) { last.s += w; last.r = {left: last.r.left, top: last.r.top, right: Math.max(last.r.right, r.right), bottom: last.r.bottom, width: 0, height: last.r.height}; }
            else if (w.trim() && r.width > 0) lines.push({r, s: w});
          }
          at += w.length;
        }
      }
      for (const {r, s} of lines) {
        const b = meet(box(r), clip);
        if (b.x1 - b.x0 < (r.right - r.left) * 0.5 || b.y1 - b.y0 < (r.bottom - r.top) * 0.5) continue;   // scrolled away
        const base = r.top + (r.bottom - r.top - (ascent + descent)) / 2 + ascent;
        inked(b);
        out.push(`<text x="${n2(r.left - ox)}" y="${n2(base - oy)}" fill="${fill}" style="${style}" ` +
                 `xml:space="preserve">${esc(s.replace(/\n/g, " "))}<\/text>`);
      }
    }

    function element(e, clip) {
      if (e.dataset && e.dataset.qkvExport === "skip") return;
      const cs = getComputedStyle(e);
      if (cs.display === "none" || e.hidden) return;
      const r = box(e.getBoundingClientRect());
      const seen = meet(r, clip);
      const shown = cs.visibility !== "hidden" && +cs.opacity > 0;
      if (shown && !empty(seen)) {
        const bg = paint(cs.backgroundColor);
        const radius = parseFloat(cs.borderTopLeftRadius) || 0;
        if (bg) rect(seen, `fill="${bg}"` + (radius && seen.x0 === r.x0 && seen.y1 === r.y1 ? ` rx="${n2(radius)}"` : ""));
        for (const [side, w, c, st] of [["top", cs.borderTopWidth, cs.borderTopColor, cs.borderTopStyle],
                                        ["right", cs.borderRightWidth, cs.borderRightColor, cs.borderRightStyle],
                                        ["bottom", cs.borderBottomWidth, cs.borderBottomColor, cs.borderBottomStyle],
                                        ["left", cs.borderLeftWidth, cs.borderLeftColor, cs.borderLeftStyle]]) {
          const px = parseFloat(w), colour = paint(c);
          if (!px || !colour || st === "none" || st === "hidden") continue;
          const strip = side === "top" ? {x0: r.x0, y0: r.y0, x1: r.x1, y1: r.y0 + px}
            : side === "bottom" ? {x0: r.x0, y0: r.y1 - px, x1: r.x1, y1: r.y1}
            : side === "left" ? {x0: r.x0, y0: r.y0, x1: r.x0 + px, y1: r.y1} : {x0: r.x1 - px, y0: r.y0, x1: r.x1, y1: r.y1};
          const part = meet(strip, clip);
          if (!empty(part)) rect(part, `fill="${colour}"` + (st === "dashed" || st === "dotted" ? ` fill-opacity="0.7"` : ""));
        }
        if (e.tagName === "CANVAS" && e.width && e.height) {
          let url = "";
          try { url = e.toDataURL("image/png"); } catch (err) { url = ""; }
          if (url) {                                   // an inner <svg> viewport: the part of it on screen
            inked(seen);
            out.push(`<svg x="${n2(seen.x0 - ox)}" y="${n2(seen.y0 - oy)}" width="${n2(seen.x1 - seen.x0)}" ` +
                     `height="${n2(seen.y1 - seen.y0)}"><image x="${n2(r.x0 - seen.x0)}" y="${n2(r.y0 - seen.y0)}" ` +
                     `width="${n2(r.x1 - r.x0)}" height="${n2(r.y1 - r.y0)}" preserveAspectRatio="none" href="${url}"/><\/svg>`);
          }
        } else if (e.tagName === "SELECT") {
          const o = e.options[e.selectedIndex];
          if (o) {
            inked(seen);
            const {ascent, descent} = metrics(`${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`);
            const base = r.y0 + (r.y1 - r.y0 - (ascent + descent)) / 2 + ascent;
            out.push(`<text x="${n2(r.x0 - ox + 4)}" y="${n2(base - oy)}" fill="${paint(cs.color) || "#000"}" ` +
                     `style="font-family:${esc(cs.fontFamily)};font-size:${cs.fontSize}">${esc(o.textContent)} ▾<\/text>`);
          }
          return;
        } else if (e.tagName === "INPUT" && e.type === "range") {
          const lo = +e.min || 0, hi = e.max === "" ? 100 : +e.max, t = hi > lo ? (+e.value - lo) / (hi - lo) : 0;
          const y = (r.y0 + r.y1) / 2 - oy, x = r.x0 - ox + 6 + t * (r.x1 - r.x0 - 12);
          inked(seen);
          out.push(`<line x1="${n2(r.x0 - ox + 6)}" y1="${n2(y)}" x2="${n2(r.x1 - ox - 6)}" y2="${n2(y)}" stroke="#8c959f" stroke-width="3"/>`,
                   `<circle cx="${n2(x)}" cy="${n2(y)}" r="6" fill="#0969da"/>`);
          return;
        } else if (e.tagName === "INPUT" && e.value !== undefined && e.type !== "checkbox" && e.type !== "radio") {
          const {ascent, descent} = metrics(`${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`);
          const base = r.y0 + (r.y1 - r.y0 - (ascent + descent)) / 2 + ascent;
          inked(seen);
          out.push(`<text x="${n2(r.x0 - ox + 4)}" y="${n2(base - oy)}" fill="${paint(cs.color) || "#000"}" ` +
                   `style="font-family:${esc(cs.fontFamily)};font-size:${cs.fontSize}">${esc(e.value)}<\/text>`);
          return;
        }
      }
      const inner = cs.overflowX !== "visible" || cs.overflowY !== "visible" ? seen : clip;
      if (empty(inner) && cs.overflowX !== "visible") return;
      for (const child of e.childNodes) {
        if (child.nodeType === 3 && shown) text(child, inner);
        else if (child.nodeType === 1) element(child, inner);
      }
    }

    element(node, box(origin));
    // the file's box: what was drawn and a margin of 8 px, within the panel (its empty space left out)
    let [x, y, w, h] = [0, 0, W, H];
    if (ink.x1 > ink.x0) {
      x = Math.max(0, Math.floor(ink.x0 - ox - 8)); y = Math.max(0, Math.floor(ink.y0 - oy - 8));
      w = Math.min(W, Math.ceil(ink.x1 - ox + 8)) - x; h = Math.min(H, Math.ceil(ink.y1 - oy + 8)) - y;
    }
    const faces = fontFaces();
    return `<svg xmlns="${NS}" width="${w}" height="${h}" viewBox="${x} ${y} ${w} ${h}">` +
           (faces ? `<style>${faces}<\/style>` : "") +
           `<rect x="${x}" y="${y}" width="${w}" height="${h}" fill="#fff"/>` + out.join("\n") + "<\/svg>\n";
  }

  function png(node, scale) {
    const text = svg(node);
    const [, w, h] = /width="(\d+)" height="(\d+)"/.exec(text);
    // at most 32000 pixels a side and 100 M in all (a browser's canvas limits): a long head view comes out finer
    const k = Math.min(scale || 2, 32000 / Math.max(w, h), Math.sqrt(1e8 / Math.max(1, w * h)));
    return rasterise(text, w, h, k, "panel");
  }

  // an SVG text of w × h CSS pixels drawn on a canvas at k× (the caller keeps k within the canvas's limits)
  function rasterise(text, w, h, k, what) {
    return new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => {
        const c = document.createElement("canvas");
        c.width = Math.round(w * k);
        c.height = Math.round(h * k);
        const ctx = c.getContext("2d");
        ctx.scale(k, k);
        ctx.drawImage(img, 0, 0);
        c.toBlob((b) => (b ? resolve(b) : reject(new Error(`the ${what} could not be drawn as PNG`))), "image/png");
      };
      img.onerror = () => reject(new Error(`the ${what}'s SVG could not be drawn`));
      img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text);
    });
  }

  // what a DOM panel shows, as data: headings, formulas, tables, valued rows and the heatmaps' numbers
  function dataOf(node) {
    const skip = (e) => e.closest('[data-qkv-export="skip"]') || e.closest("[hidden]");
    const out = {title: null, formulas: [], tables: [], values: [], heatmaps: []};
    const h = node.querySelector("h1, h2, h3");
    if (h) out.title = h.textContent;
    for (const f of node.querySelectorAll("pre")) if (!skip(f)) out.formulas.push(f.textContent);
    for (const t of node.querySelectorAll("table")) {
      if (skip(t)) continue;
      out.tables.push([...t.rows].map((row) => [...row.cells].map((c) => c.textContent)));
    }
    for (const r of node.querySelectorAll("[data-value]")) {
      if (skip(r)) continue;
      const label = r.firstElementChild ? r.firstElementChild.textContent : r.textContent;
      out.values.push({label, value: Number(r.dataset.value)});
    }
    for (const c of node.querySelectorAll("canvas")) if (c.qkvData && !skip(c)) out.heatmaps.push(c.qkvData);
    return out;
  }

  function save(blob, name) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    a.dataset.qkvExport = "skip";
    document.body.append(a);
    a.click();
    setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }

  // JSON with typed arrays as plain arrays
  const json = (value) => JSON.stringify(value, (k, v) => (ArrayBuffer.isView(v) ? Array.from(v) : v), 1);

  async function copy(text) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch (e) {                                   // no clipboard permission (a file:// page in some browsers)
      const area = document.createElement("textarea");
      area.value = text;
      area.dataset.qkvExport = "skip";
      area.style.position = "fixed"; area.style.opacity = "0";
      document.body.append(area);
      area.select();
      const ok = document.execCommand && document.execCommand("copy");
      area.remove();
      return Boolean(ok);
    }
  }

  function bar(target, name, data) {
    const b = document.createElement("span");
    b.className = "qkv-export";
    b.dataset.qkvExport = "skip";
    b.setAttribute("role", "group");
    b.setAttribute("aria-label", "export this view");
    const note = document.createElement("span");
    note.className = "qkv-export-note";
    note.setAttribute("aria-live", "polite");
    const button = (label, title, act) => {
      const x = document.createElement("button");
      x.type = "button";
      x.className = "qkv-export-btn";
      x.textContent = label;
      x.title = title;
      x.dataset.export = label.toLowerCase().split(" ").pop();
      x.addEventListener("click", async () => {
        try { note.textContent = await act(); } catch (e) { note.textContent = String(e.message || e); }
      });
      return x;
    };
    b.append(
      button("PNG", "save what this view shows as a PNG image", async () => {
        save(await png(target(), 2), name() + ".png"); return "saved " + name() + ".png"; }),
      button("SVG", "save what this view shows as an SVG drawing", async () => {
        save(new Blob([svg(target())], {type: "image/svg+xml"}), name() + ".svg"); return "saved " + name() + ".svg"; }),
      button("Copy JSON", "copy the numbers this view shows as JSON", async () =>
        ((await copy(json(data()))) ? "copied" : "could not copy: the browser refused")),
      note);
    return b;
  }

  global.QKV_EXPORT = {svg, png, rasterise, dataOf, bar, json};
})(typeof window !== "undefined" ? window : this);
