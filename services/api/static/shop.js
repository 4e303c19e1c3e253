// The shop: a catalogue, a basket, checkout with a test payment token, and the order live.
"use strict";

const basket = new Map();  // sku -> {item, quantity}
let catalogue = null;
let following = null;      // AbortController of the order's stream

function notice(where, text, isError) {
  document.getElementById(where).replaceChildren(
    text ? el("div", { class: "notice" + (isError ? " error" : "") }, text) : "");
}

async function start() {
  const login = document.getElementById("login");
  if (!Api.token()) {
    login.classList.remove("hidden");
    tokenForm(login, start, "a shop's token");
    return;
  }
  try {
    catalogue = (await Api.call("GET", "/catalogue")).data;
  } catch (error) {
    login.classList.remove("hidden");
    tokenForm(login, start, "a shop's token");
    login.append(el("p", { class: "error" }, error.message));
    return;
  }
  login.classList.add("hidden");
  document.getElementById("shop").classList.remove("hidden");
  const rows = catalogue.items.map(item => el("tr", {},
    el("td", {}, item.name),
    el("td", {}, money(item.unit_price_cents, catalogue.currency)),
    el("td", {}, el("button", { class: "secondary", "data-sku": item.sku, onclick: () => add(item) }, "Add"))));
  document.querySelector("#catalogue tbody").replaceChildren(...rows);
  const payment = document.getElementById("payment");
  payment.replaceChildren(...Object.entries(catalogue.test_payment_tokens).map(
    ([token, what]) => el("option", { value: token }, token + " (" + what + ")")));
  document.getElementById("checkout-form").addEventListener("submit", place);
  document.getElementById("cancel").addEventListener("click", cancel);
  drawBasket();
}

function add(item) {
  const line = basket.get(item.sku) || { item, quantity: 0 };
  line.quantity += 1;
  basket.set(item.sku, line);
  drawBasket();
}

function drawBasket() {
  let total = 0;
  const rows = [...basket.values()].map(({ item, quantity }) => {
    total += item.unit_price_cents * quantity;
    return el("tr", {},
      el("td", {}, item.name), el("td", {}, quantity),
      el("td", {}, money(item.unit_price_cents * quantity, catalogue.currency)),
      el("td", {}, el("button", { class: "secondary", onclick: () => { basket.delete(item.sku); drawBasket(); } }, "Remove")));
  });
  document.querySelector("#basket tbody").replaceChildren(...rows);
  document.getElementById("total").textContent = money(total, catalogue.currency);
  document.getElementById("place").disabled = basket.size === 0;
}

function newOrderId() {
  return "o-" + Date.now().toString(36) + "-" + Math.floor(Math.random() * 1e6).toString(36);
}

async function place(event) {
  event.preventDefault();
  const value = id => document.getElementById(id).value.trim();
  const order = {
    order_id: newOrderId(),
    customer_id: value("customer"),
    lines: [...basket.values()].map(({ item, quantity }) => (
      { sku: item.sku, quantity, unit_price_cents: item.unit_price_cents })),
    currency: catalogue.currency,
    payment_token: value("payment"),
    shipping_address: {
      name: value("name"), line1: value("line1"), city: value("city"),
      postal_code: value("postal"), country: value("country").toUpperCase(),
    },
  };
  document.getElementById("place").disabled = true;
  notice("checkout-message", "Placing your order…");
  try {
    const { data } = await Api.call("POST", "/orders", order);
    notice("checkout-message", "Order " + data.order_id + " placed.");
    basket.clear();
    drawBasket();
    follow(data.order_id, data.order);
  } catch (error) {
    notice("checkout-message", "Not placed: " + error.message, true);
    document.getElementById("place").disabled = basket.size === 0;
  }
}

function show(order) {
  document.getElementById("order-status").replaceChildren(badge(order.status));
  document.getElementById("order-next").textContent = "Next: " + order.next;
  document.getElementById("order-steps").replaceChildren(...order.steps.map(step => el("li", {},
    step.name + " ", badge(step.status), step.attempts > 1 ? " (" + step.attempts + " attempts)" : "",
    step.error ? el("span", { class: "muted" }, " " + step.error) : "")));
  document.getElementById("order-error").textContent = order.error || "";
  document.getElementById("cancel").classList.toggle("hidden", !order.cancellable);
}

function follow(orderId, first) {
  if (following) following.abort();
  following = new AbortController();
  const panel = document.getElementById("order");
  panel.classList.remove("hidden");
  panel.dataset.orderId = orderId;
  document.getElementById("order-id").textContent = orderId;
  document.getElementById("order-status").replaceChildren(badge("Received"));
  notice("order-message", "");
  if (first) show(first);
  const signal = following.signal;
  const run = async () => {
    // Until the order stops (final, or Failed: an operator's turn): a stream that ends before
    // (its time is up, a restart) is opened again.
    for (let tries = 0; tries < 100 && !signal.aborted; tries++) {
      let final = false;
      try {
        await Api.stream("/orders/" + encodeURIComponent(orderId) + "/events", (name, order) => {
          show(order);
          final = ["Completed", "Compensated", "Cancelled", "Failed"].includes(order.status);
        }, signal);
      } catch (error) {
        if (signal.aborted) return;
        if (error.message.includes("HTTP 404")) { /* not recorded yet */ }
        else notice("order-message", "Following the order: " + error.message, true);
      }
      if (final) return;
      await new Promise(resolve => setTimeout(resolve, 1000));
    }
  };
  run();
}

async function cancel() {
  const orderId = document.getElementById("order").dataset.orderId;
  document.getElementById("cancel").disabled = true;
  try {
    const { data } = await Api.call("POST", "/orders/" + encodeURIComponent(orderId) + "/cancel");
    // Followed again: a Failed order's stream had ended, and it moves now.
    if (data.outcome !== "Cancelled") follow(orderId, data.order);
    notice("order-message", data.outcome === "Cancelled" ? "Cancelled." : "Cancelling: what was done is being undone.");
    show(data.order);
  } catch (error) {
    notice("order-message", "Not cancelled: " + error.message, true);
  } finally {
    document.getElementById("cancel").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", start);
