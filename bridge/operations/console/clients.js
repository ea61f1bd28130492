// Clients: search every node's clients by ClientId prefix, user name or address; a client's page
// (#/clients/<ClientId>) with its connection, subscriptions, queues and metering, and Kick.

import { api, get, segment } from "./api.js";
import { bytes, field, h, notice, table, when } from "./dom.js";

let lastSearch = { q: "", by: "clientid" };

export function clientLink(clientId) {
  return h("a", { href: `#/clients/${segment(clientId)}`, class: "mono" }, clientId);
}

export function renderSearch(root) {
  const [label, input] = field("Search", {
    dataset: { testid: "client-search" },
    placeholder: "ClientId prefix, user name or address",
    value: lastSearch.q,
  });
  const by = h(
    "select",
    { dataset: { testid: "search-by" }, "aria-label": "search by" },
    h("option", { value: "clientid" }, "ClientId prefix"),
    h("option", { value: "username" }, "user name"),
    h("option", { value: "address" }, "address (IP[:port] prefix)"),
  );
  by.value = lastSearch.by;
  const results = h("div", { dataset: { testid: "client-results" } });
  const go = async () => {
    lastSearch = { q: input.value.trim(), by: by.value };
    results.replaceChildren(h("p", { class: "quiet" }, "Searching..."));
    try {
      const data = await get("/search/clients", { ...lastSearch, limit: 200 });
      results.replaceChildren(...searchResults(data));
    } catch (exc) {
      results.replaceChildren(notice("error", exc.message, "search-error"));
    }
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") go();
  });
  root.replaceChildren(
    h("h1", {}, "Clients"),
    h("div", { class: "toolbar" }, label, by,
      h("button", { type: "button", onclick: go, dataset: { testid: "search-go" } }, "Search")),
    results,
  );
  go();
}

function searchResults(data) {
  const out = [];
  for (const failure of data.errors) {
    out.push(notice("error", `node ${failure.node}: ${failure.error}`));
  }
  if (!data.items.length) {
    out.push(h("p", { class: "quiet", dataset: { testid: "no-clients" } }, "No client matches."));
    return out;
  }
  out.push(
    table(
      ["ClientId", "Node", "State", "User", "Address", "Since", "Subscriptions"],
      data.items.map((c) =>
        h(
          "tr",
          { dataset: { testid: "client-row", clientid: c.client_id } },
          h("td", {}, clientLink(c.client_id)),
          h("td", {}, c.node),
          h("td", { class: c.connected ? "ok" : "quiet" }, c.connected ? "connected" : "offline"),
          h("td", {}, c.username ?? "-"),
          h("td", { class: "mono" }, c.peer ?? "-"),
          h("td", {}, when(c.connected_at)),
          h("td", { class: "n" }, String(c.subscriptions)),
        ),
      ),
      { class: "grid-table" },
    ),
  );
  if (data.truncated) out.push(h("p", { class: "quiet" }, "More match: narrow the search."));
  return out;
}

export function renderClient(root, clientId) {
  const body = h("div", {}, h("p", { class: "quiet" }, "Loading..."));
  const message = h("div");
  root.replaceChildren(
    h("p", {}, h("a", { href: "#/clients" }, "\u2190 Clients")),
    h("h1", {}, "Client ", h("span", { class: "mono", dataset: { testid: "client-id" } }, clientId)),
    message,
    body,
  );
  const load = async () => {
    let client;
    try {
      client = await get(`/clients/${segment(clientId)}`);
    } catch (exc) {
      body.replaceChildren(notice("error", exc.message, "client-error"));
      return;
    }
    let metering = null;
    try {
      metering = await get(`/metering/clients/${segment(clientId)}`);
    } catch (exc) {
      metering = { error: exc.message };
    }
    body.replaceChildren(...details(client, metering, kick));
    root.dataset.loaded = "true";
  };
  const kick = (button) => {
    const confirm = h("button", { type: "button", class: "danger", dataset: { testid: "kick-confirm" } },
      `Really disconnect ${clientId}?`);
    confirm.addEventListener("click", async () => {
      confirm.disabled = true;
      try {
        const answer = await api("DELETE", `/clients/${segment(clientId)}`);
        message.replaceChildren(
          notice("ok", `Kicked from node ${answer.node}: its will (if any) is published.`, "kick-result"));
      } catch (exc) {
        message.replaceChildren(notice("error", exc.message, "kick-result"));
      }
      load();
    });
    button.replaceWith(confirm);
  };
  load();
}

function details(c, metering, kick) {
  const kickButton = h("button", { type: "button", class: "danger", dataset: { testid: "kick" } }, "Kick");
  kickButton.addEventListener("click", () => kick(kickButton));
  const rows = [
    ["State", h("span", { class: c.connected ? "ok" : "quiet", dataset: { testid: "client-state" } },
      c.connected ? "connected" : "offline")],
    ["Node", c.node],
    ["Address", c.peer ?? "-"],
    ["Connected since", when(c.connected_at)],
    ["Disconnected at", when(c.disconnected_at)],
    ["User name", c.username ?? "-"],
    ["Protocol", c.protocol ?? "-"],
    ["Keep alive", c.keepalive === null ? "-" : `${c.keepalive} s`],
    ["Session", c.persistent ? "persistent (clean session 0)" : "clean"],
    ["Queued", h("span", { dataset: { testid: "client-queued" } }, String(c.queued))],
    ["In flight", h("span", { dataset: { testid: "client-inflight" } }, String(c.inflight))],
    ["Dropped (queue full / retention)", `${c.dropped_queue_full} / ${c.dropped_retention}`],
  ];
  const facts = h("dl", { class: "facts" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  const subs = Object.entries(c.subscriptions).sort(([a], [b]) => (a < b ? -1 : 1));
  const subscriptions = subs.length
    ? table(["Filter", "QoS"], subs.map(([f, q]) =>
        h("tr", { dataset: { testid: "client-subscription" } }, h("td", { class: "mono" }, f),
          h("td", { class: "n" }, String(q)))), { class: "grid-table" })
    : h("p", { class: "quiet" }, "No subscriptions.");
  const meter = metering.error
    ? h("p", { class: "quiet", dataset: { testid: "metering" } }, metering.error)
    : table(["", "Messages", "Payload"], [
        h("tr", {}, h("td", {}, "in"), h("td", { class: "n" }, String(metering.msgs_in)),
          h("td", { class: "n" }, bytes(metering.bytes_in))),
        h("tr", {}, h("td", {}, "out"), h("td", { class: "n" }, String(metering.msgs_out)),
          h("td", { class: "n" }, bytes(metering.bytes_out))),
      ], { class: "grid-table", dataset: { testid: "metering" } });
  return [
    h("div", { class: "toolbar" }, c.connected ? kickButton : null),
    facts,
    h("h2", {}, "Subscriptions"),
    subscriptions,
    h("h2", {}, `Traffic metering${metering.source ? ` (${metering.source})` : ""}`),
    meter,
  ];
}
