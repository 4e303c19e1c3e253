// Shared by the shop and the console: the token, calls to the API, and a stream reader.
"use strict";

const Api = {
  key: "orderflow-token",
  token() { return sessionStorage.getItem(Api.key) || ""; },
  setToken(value) { sessionStorage.setItem(Api.key, value.trim()); },
  async call(method, path, body) {
    const headers = { "Authorization": "Bearer " + Api.token() };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      let detail = data && data.detail;
      if (Array.isArray(detail)) detail = detail.map(d => (d.loc || []).slice(1).join(".") + ": " + d.msg).join("; ");
      const error = new Error(detail || ("HTTP " + response.status));
      error.status = response.status;
      throw error;
    }
    return { status: response.status, data };
  },
  // Server-sent events over fetch (EventSource cannot send a token): calls onEvent(name, data)
  // for each event until the stream ends or signal aborts it.
  async stream(path, onEvent, signal) {
    const response = await fetch(path, { headers: { "Authorization": "Bearer " + Api.token() }, signal });
    if (!response.ok || !response.body) throw new Error("stream refused: HTTP " + response.status);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const chunk = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message", data = "";
        for (const line of chunk.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) onEvent(name, JSON.parse(data));
      }
    }
  },
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(text) { return el("span", { class: "badge " + text, "data-status": text }, text); }
function money(cents, currency) { return (cents / 100).toFixed(2) + " " + (currency || "EUR"); }
function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function tokenForm(where, onSet, roles) {
  const input = el("input", { type: "password", id: "token", placeholder: "API token", size: 40 });
  const form = el("form", { id: "token-form" },
    el("label", { for: "token" }, "API token (" + roles + ")"), input, " ",
    el("button", { type: "submit" }, "Use token"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    Api.setToken(input.value);
    onSet();
  });
  where.replaceChildren(form);
}
