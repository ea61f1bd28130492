// Overview: the cluster's totals, its nodes, and live charts of messages in/out per second and
// of the store latency, from GET /api/v1/stats every few seconds. Rates come from the change of
// the (cumulative) counters between two answers.

import { get } from "./api.js";
import { lineChart } from "./chart.js";
import { h, notice, table } from "./dom.js";

export const REFRESH_SECONDS = 3;
const SPAN_SECONDS = 180;
const samples = []; // kept while the tab lives, so coming back to the page keeps the history

export function render(root) {
  const status = h("div", { class: "status" });
  const cards = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const nodes = h("div");
  root.replaceChildren(
    h("h1", {}, "Overview"),
    status,
    cards,
    charts,
    h("h2", {}, "Nodes"),
    nodes,
  );
  let stopped = false;
  let timer = null;
  let refreshes = 0;

  async function refresh() {
    try {
      const stats = await get("/stats");
      if (stopped) return;
      record(stats);
      show(stats);
      refreshes += 1;
      root.dataset.loaded = "true";
      root.dataset.refreshes = String(refreshes);
    } catch (exc) {
      if (!stopped) status.replaceChildren(notice("error", exc.message));
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_SECONDS * 1000);
  }

  function show(stats) {
    const totals = stats.totals;
    const alive = stats.nodes.filter((n) => n.alive).length;
    status.replaceChildren(
      stats.complete
        ? h("p", { class: "quiet" }, `Updated ${new Date(stats.time * 1000).toLocaleTimeString()}, `
            + `every ${REFRESH_SECONDS} s.`)
        : notice("error", "Some nodes did not answer: the totals leave them out (see Nodes)."),
    );
    cards.replaceChildren(
      card("Nodes alive", `${alive} / ${stats.nodes.length}`, "nodes-alive"),
      card("Connections", totals.connections, "connections"),
      card("Sessions", totals.sessions, "sessions"),
      card("Subscriptions", totals.subscriptions, "subscriptions"),
      card("Retained messages", totals.retained, "retained"),
      card("In flight", totals.inflight, "inflight"),
    );
    charts.replaceChildren(
      lineChart({
        title: "Messages per second",
        unit: "msg/s",
        span: SPAN_SECONDS,
        testid: "chart-messages",
        series: [
          { label: "in", cls: "in", points: rates("in") },
          { label: "out", cls: "out", points: rates("out") },
        ],
      }),
      lineChart({
        title: "Store latency (mean of QoS 1/2 stores)",
        unit: "ms",
        span: SPAN_SECONDS,
        testid: "chart-latency",
        series: [{ label: "latency", cls: "latency", points: latencies() }],
      }),
    );
    nodes.replaceChildren(
      table(
        ["Node", "State", "Connections", "Sessions", "Subscriptions", "Retained", "Msgs in",
          "Msgs out"],
        stats.nodes.map((n) => nodeRow(n)),
        { class: "grid-table" },
      ),
    );
  }

  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function card(label, value, testid) {
  return h(
    "div",
    { class: "card" },
    h("span", { class: "label" }, label),
    h("span", { class: "value", dataset: { testid } }, String(value)),
  );
}

function nodeRow(node) {
  const s = node.stats || {};
  const state = !node.alive ? "dead" : node.error ? `alive, not answering: ${node.error}` : "alive";
  const cell = (value) => h("td", { class: "n" }, value === undefined ? "-" : String(value));
  return h(
    "tr",
    { dataset: { testid: "node-row", node: node.id } },
    h("td", {}, node.id, node.self ? h("span", { class: "tag" }, "this node") : null),
    h("td", { class: node.alive && !node.error ? "ok" : "error" }, state),
    cell(s.connections),
    cell(s.sessions),
    cell(s.subscriptions),
    cell(s.retained),
    cell(s.messages_in),
    cell(s.messages_out),
  );
}

function record(stats) {
  const t = stats.totals;
  samples.push({
    time: stats.time,
    in: t.messages_in,
    out: t.messages_out,
    latencyCount: t.store_latency_count,
    latencySum: t.store_latency_sum,
    nodes: stats.nodes.map((n) => `${n.id}:${n.stats ? 1 : 0}`).join(","),
  });
  const oldest = stats.time - SPAN_SECONDS - 2 * REFRESH_SECONDS;
  while (samples.length && samples[0].time < oldest) samples.shift();
}

/** Pairs of consecutive samples over the same answering nodes (counters are comparable). */
function steps() {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const [a, b] = [samples[i - 1], samples[i]];
    const seconds = b.time - a.time;
    out.push([a, b, seconds > 0 && a.nodes === b.nodes ? seconds : null]);
  }
  return out;
}

function rates(key) {
  return steps().map(([a, b, seconds]) => {
    const delta = b[key] - a[key];
    return [b.time, seconds === null || delta < 0 ? null : delta / seconds];
  });
}

function latencies() {
  return steps().map(([a, b, seconds]) => {
    const count = b.latencyCount - a.latencyCount;
    if (seconds === null || count <= 0) return [b.time, null];
    return [b.time, ((b.latencySum - a.latencySum) / count) * 1000];
  });
}
