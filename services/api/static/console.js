// The operator console: live counts, orders, an order's timeline and actions, failure groups
// with a bulk resubmission (dry run first, then its progress), dead letters and alerts.
"use strict";

const STATES = ["Pending", "Processing", "Processed", "Error", "Compensating", "Compensated",
                "Cancelled", "CompensationFailed"];
const KINDS = ["transient", "permanent", "deadline", "budget-exhausted", "recovery-limit", "conflict",
               "unknown-workflow", "compensation", "cancelled"];
let view = "overview";
let timer = null;
let cursor = null;
let detailId = null;
let group = null;

const $ = id => document.getElementById(id);
function message(where, text, isError) {
  $(where).replaceChildren(text ? el("div", { class: "notice" + (isError ? " error" : "") }, text) : "");
}
function q(params) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) s.append(k, v);
  return s.toString();
}

async function start() {
  if (!Api.token()) return askToken();
  try { await Api.call("GET", "/ops/processes"); }
  catch (error) { return askToken(error.message); }
  $("login").classList.add("hidden");
  $("nav").classList.remove("hidden");
  for (const a of document.querySelectorAll("nav a")) a.addEventListener("click", () => show(a.dataset.view));
  $("f-state").append(...STATES.map(s => el("option", { value: s }, s)));
  $("f-kind").append(...KINDS.map(k => el("option", { value: k }, k)));
  $("order-filter").addEventListener("submit", e => { e.preventDefault(); cursor = null; loadOrders(); });
  $("f-open").addEventListener("click", () => openOrder($("f-id").value.trim()));
  $("orders-more").addEventListener("click", () => loadOrders(true));
  $("d-resubmit").addEventListener("click", () => act("resubmit", {}));
  $("d-compensate").addEventListener("click", () => act("compensate"));
  $("d-cancel").addEventListener("click", () => act("cancel"));
  $("bulk-confirm").addEventListener("click", confirmBulk);
  $("bulk-close").addEventListener("click", () => $("bulk").classList.add("hidden"));
  show(location.hash.slice(1) || "overview");
}

function askToken(error) {
  $("login").classList.remove("hidden");
  tokenForm($("login"), start, "a viewer's or an operator's token");
  if (error) $("login").append(el("p", { class: "error" }, error));
}

function show(name) {
  view = name;
  location.hash = name;
  for (const v of document.querySelectorAll(".view")) v.classList.toggle("hidden", v.id !== "view-" + name);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name);
  clearInterval(timer);
  const refresh = { overview: loadStats, orders: () => loadOrders(false, true), failures: loadGroups,
                    "dead-letters": loadLetters, alerts: loadAlerts }[name];
  refresh();
  timer = setInterval(refresh, 2000);  // live: what the console shows is at most 2 s old
}

async function loadStats() {
  const { data } = await Api.call("GET", "/ops/stats");
  $("stats-at").textContent = "at " + new Date(data.at).toLocaleTimeString();
  $("counts").replaceChildren(...STATES.map(s => el("div", { class: "count", "data-state": s },
    el("b", {}, data.by_state[s] || 0), badge(s))));
  $("leader").textContent = data.leader || "none";
  $("breakers").textContent = data.open_breakers.length ? data.open_breakers.join(", ") : "none";
  $("processes").tBodies[0].replaceChildren(...data.processes.map(p => el("tr", {},
    el("td", {}, p.name), el("td", {}, p.kind), el("td", {}, p.seen),
    el("td", {}, (p.data.open_breakers || []).join(", ")))));
  $("queues").tBodies[0].replaceChildren(...Object.entries(data.queues).map(([name, n]) => el("tr", {},
    el("td", {}, name), el("td", {}, n === null ? "not declared" : n))));
}

async function loadOrders(more, quietly) {
  if (quietly && cursor) return;  // a page further on stays as it is
  const params = { state: $("f-state").value, error_kind: $("f-kind").value,
                   older_than: $("f-older").value.trim(), step: $("f-step").value.trim(), limit: 50,
                   cursor: more ? cursor : "" };
  let data;
  try { data = (await Api.call("GET", "/ops/orders?" + q(params))).data; }
  catch (error) { return message("d-message", error.message, true); }
  const rows = data.orders.map(o => el("tr", { "data-order": o.order_id },
    el("td", {}, el("a", { href: "#orders", onclick: () => openOrder(o.order_id) }, o.order_id)),
    el("td", {}, badge(o.state)), el("td", {}, o.step || "-"), el("td", {}, o.attempt),
    el("td", {}, o.failures), el("td", {}, o.error ? o.error.kind + ": " + o.error.message : ""),
    el("td", {}, ago(o.updated_at))));
  if (more) $("orders").tBodies[0].append(...rows); else $("orders").tBodies[0].replaceChildren(...rows);
  cursor = data.next;
  $("orders-more").classList.toggle("hidden", !data.next);
  if (detailId) openOrder(detailId, true);
}

async function openOrder(orderId, quietly) {
  if (!orderId) return;
  detailId = orderId;
  let order, history;
  try {
    order = (await Api.call("GET", "/ops/order?" + q({ order_id: orderId }))).data;
    history = (await Api.call("GET", "/ops/order/history?" + q({ order_id: orderId }))).data;
  } catch (error) {
    if (!quietly) message("d-message", error.message, true);
    return;
  }
  $("order-detail").classList.remove("hidden");
  const state = order.state || {};
  $("d-id").textContent = orderId;
  $("d-state").replaceChildren(badge(state.process_state || "unknown"));
  $("d-next").textContent = state.next || "";
  $("d-error").textContent = state.error ? state.error.kind + ": " + state.error.message : "";
  $("d-steps").tBodies[0].replaceChildren(...(state.steps || []).map(s => el("tr", {},
    el("td", {}, s.step), el("td", {}, badge(s.status)), el("td", {}, s.attempts),
    el("td", {}, s.error ? s.error.kind + ": " + s.error.message : ""))));
  $("d-timeline").tBodies[0].replaceChildren(...history.events.map(e => el("tr", {},
    el("td", {}, e.since_start_s.toFixed(3)), el("td", {}, e.event), el("td", {}, e.attempt ?? ""),
    el("td", {}, e.step || ""), el("td", { class: "muted details" }, JSON.stringify(e.data)))));
}

async function act(action, body) {
  try {
    const { data } = await Api.call("POST", "/ops/order/" + action + "?" + q({ order_id: detailId }), body);
    message("d-message", detailId + ": " + data.outcome);
  } catch (error) {
    message("d-message", error.message, true);
  }
  openOrder(detailId, true);
}

async function loadGroups() {
  const { data } = await Api.call("GET", "/ops/failures");
  $("groups").tBodies[0].replaceChildren(...data.groups.map(g => el("tr", {},
    el("td", {}, g.count), el("td", {}, g.error_kind), el("td", {}, g.fingerprint),
    el("td", {}, Object.entries(g.states).map(([s, n]) => n + " " + s).join(", ")),
    el("td", {}, ago(g.newest_change)),
    el("td", {}, g.states.Error ? el("button", { class: "secondary", onclick: () => dryRun(g) }, "Resubmit…") : ""))));
}

async function dryRun(g) {
  group = { error_kind: g.error_kind, fingerprint: g.fingerprint };
  $("bulk").classList.remove("hidden");
  $("bulk-progress").classList.add("hidden");
  $("bulk-confirm").disabled = true;
  $("bulk-what").textContent = "Orders in Error with " + g.error_kind + ": " + g.fingerprint;
  const { data } = await Api.call("POST", "/ops/resubmit", { ...group, dry_run: true });
  group.selected = data.selected;  // the confirmation acts on exactly these, as shown
  $("bulk-dry").replaceChildren(
    el("p", {}, "Dry run: " + data.changed + " would be resubmitted, " + data.refused + " refused."),
    el("table", { id: "bulk-outcomes" }, el("tbody", {}, ...data.outcomes.slice(0, 50).map(o =>
      el("tr", {}, el("td", {}, o.order_id), el("td", {}, o.outcome))))));
  $("bulk-confirm").disabled = data.changed === 0;
}

async function confirmBulk() {
  $("bulk-confirm").disabled = true;
  const { data } = await Api.call("POST", "/ops/resubmit", { ...group, dry_run: false, rate: 20 });
  $("bulk-progress").classList.remove("hidden");
  const poll = async () => {
    const job = (await Api.call("GET", "/ops/jobs/" + data.job_id)).data;
    $("bulk-bar").max = Math.max(1, job.total);
    $("bulk-bar").value = job.done;
    $("bulk-status").textContent = job.done + " of " + job.total + " done; " + job.changed + " resubmitted, "
      + job.refused + " refused" + (job.finished ? " — finished" : "…") + (job.error ? " (" + job.error + ")" : "");
    if (!job.finished) setTimeout(poll, 500);
  };
  poll();
}

async function loadLetters() {
  const { data } = await Api.call("GET", "/ops/dead-letters");
  $("letters").tBodies[0].replaceChildren(...data.messages.map(m => el("tr", {},
    el("td", {}, m.queue), el("td", {}, m.message_id), el("td", {}, m.type || ""),
    el("td", {}, m.reason || ""), el("td", {}, m.error || ""), el("td", {}, m.age || ""),
    el("td", {}, el("button", { class: "secondary", onclick: () => showLetter(m) }, "Show"), " ",
      el("button", { onclick: () => replay(m) }, "Replay")))));
}

async function showLetter(m) {
  const { data } = await Api.call("GET", "/ops/dead-letter?" + q({ message_id: m.message_id }));
  $("letter-body").classList.remove("hidden");
  $("letter-body").textContent = data.messages.map(x => x.body).join("\n\n");
}

async function replay(m) {
  try {
    const { data } = await Api.call("POST", "/ops/dead-letters/replay", { message_ids: [m.message_id] });
    message("letters-message", data.replayed.length + " replayed, " + data.unsealed.length + " left (unsealed)");
  } catch (error) { message("letters-message", error.message, true); }
  loadLetters();
}

async function loadAlerts() {
  const { data } = await Api.call("GET", "/ops/alerts?limit=200");
  $("alerts").tBodies[0].replaceChildren(...data.alerts.map(a => el("tr", {},
    el("td", {}, ago(a.at)), el("td", {}, a.kind), el("td", {}, a.severity), el("td", {}, a.order_id || ""),
    el("td", {}, a.message), el("td", {}, a.source))));
}

document.addEventListener("DOMContentLoaded", start);
