// Small DOM helpers. Everything shown comes from clients (ClientIds, topics, payloads), so text
// is always set as text, never parsed as HTML.

/** An element: `h("td", {class: "n", dataset: {testid: "x"}}, "text", child, ...)`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "value") el.value = value;
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, value);
  }
  append(el, children);
  return el;
}

/** Replace `el`'s children (null, undefined and false ones are left out). */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** A table with a header row; `rows` are arrays of cells (text or elements). */
export function table(headers, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, headers.map((text) => h("th", {}, text)))),
    h("tbody", {}, rows),
  );
}

/** Unix seconds as a local date and time (and how long ago). */
export function when(seconds) {
  if (!seconds) return "-";
  const date = new Date(seconds * 1000);
  return `${date.toLocaleString()} (${ago(Date.now() / 1000 - seconds)})`;
}

export function ago(seconds) {
  if (seconds < 60) return `${Math.max(0, Math.round(seconds))} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h ago`;
  return `${(seconds / 86400).toFixed(1)} days ago`;
}

export function bytes(count) {
  if (count < 1024) return `${count} B`;
  if (count < 1024 * 1024) return `${(count / 1024).toFixed(1)} KiB`;
  return `${(count / 1024 / 1024).toFixed(1)} MiB`;
}

/** A message line: `kind` is "error" or "ok". */
export function notice(kind, text, testid) {
  return h("p", { class: kind, role: kind === "error" ? "alert" : "status", dataset: testid ? { testid } : {} }, text);
}

/** A labelled input (`attrs` go to the input). */
export function field(label, attrs) {
  const input = h("input", { type: "text", autocomplete: "off", spellcheck: "false", ...attrs });
  return [h("label", {}, label, input), input];
}
