// Subscriptions and topics: who subscribes to a filter (or would receive a topic), retained
// messages with a preview of their payloads, and publishing a test message.

import { api, get } from "./api.js";
import { bytes, field, h, notice, table, when } from "./dom.js";
import { clientLink } from "./clients.js";

const PREVIEW_BYTES = 256;

export function render(root) {
  root.replaceChildren(
    h("h1", {}, "Subscriptions & topics"),
    h("h2", {}, "Who subscribes"),
    subscribers(),
    h("h2", {}, "Retained messages"),
    retained(),
    h("h2", {}, "Publish a test message"),
    publisher(),
  );
}

function subscribers() {
  const [label, input] = field("Filter or topic", {
    dataset: { testid: "sub-filter" },
    placeholder: "e.g. sensors/+/temp",
  });
  const mode = h(
    "select",
    { dataset: { testid: "sub-mode" }, "aria-label": "match" },
    h("option", { value: "filter" }, "subscribed with exactly this filter"),
    h("option", { value: "topic" }, "would receive this topic"),
  );
  const results = h("div", { dataset: { testid: "sub-results" } });
  const go = async () => {
    if (!input.value) return;
    try {
      const data = await get("/search/subscriptions", { [mode.value]: input.value, limit: 500 });
      const out = data.errors.map((e) => notice("error", `node ${e.node}: ${e.error}`));
      out.push(
        data.items.length
          ? table(["ClientId", "Node", "Filter", "QoS", "Share group", "State"],
              data.items.map((s) =>
                h("tr", { dataset: { testid: "sub-row", clientid: s.client_id } },
                  h("td", {}, clientLink(s.client_id)), h("td", {}, s.node),
                  h("td", { class: "mono" }, s.filter), h("td", { class: "n" }, String(s.qos)),
                  h("td", {}, s.share_group ?? "-"),
                  h("td", { class: s.connected ? "ok" : "quiet" }, s.connected ? "connected" : "offline"))),
              { class: "grid-table" })
          : h("p", { class: "quiet", dataset: { testid: "no-subscribers" } }, "Nobody."),
      );
      if (data.truncated) out.push(h("p", { class: "quiet" }, "More subscribers than shown."));
      results.replaceChildren(...out);
    } catch (exc) {
      results.replaceChildren(notice("error", exc.message, "sub-error"));
    }
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") go();
  });
  return h("div", {}, h("div", { class: "toolbar" }, label, mode,
    h("button", { type: "button", onclick: go, dataset: { testid: "sub-go" } }, "Find")), results);
}

function retained() {
  const [label, input] = field("Topic filter", { dataset: { testid: "retained-filter" }, value: "#" });
  const results = h("div", { dataset: { testid: "retained-results" } });
  let after = null;
  const load = async (more) => {
    try {
      const data = await get("/search/retained", {
        filter: input.value || "#", limit: 50, preview: PREVIEW_BYTES, after: more ? after : null,
      });
      after = data.next;
      const rows = data.items.map((m) =>
        h("tr", { dataset: { testid: "retained-row", topic: m.topic } },
          h("td", { class: "mono" }, m.topic), h("td", { class: "n" }, String(m.qos)),
          h("td", { class: "n" }, bytes(m.size)), h("td", {}, when(m.published_at)),
          h("td", {}, m.publisher ?? "-"),
          h("td", {}, h("pre", { class: "preview", dataset: { testid: "retained-preview" } },
            m.preview_encoding === "base64" ? `base64: ${m.preview}` : m.preview,
            m.truncated ? h("span", { class: "quiet" }, ` \u2026 (${m.size - PREVIEW_BYTES} more bytes)`) : null))));
      const existing = more ? results.querySelector("tbody") : null;
      if (existing) {
        existing.append(...rows);
      } else {
        results.replaceChildren(
          h("p", { class: "quiet" }, `${data.total} retained topic(s) match.`),
          data.items.length
            ? table(["Topic", "QoS", "Size", "Published", "Publisher", `Payload (first ${PREVIEW_BYTES} bytes)`],
                rows, { class: "grid-table" })
            : h("p", { class: "quiet" }, "None."),
        );
      }
      results.querySelector("[data-testid=retained-more]")?.remove();
      if (after) {
        results.append(h("button", { type: "button", dataset: { testid: "retained-more" },
          onclick: () => load(true) }, "More"));
      }
    } catch (exc) {
      results.replaceChildren(notice("error", exc.message, "retained-error"));
    }
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") load(false);
  });
  load(false);
  return h("div", {}, h("div", { class: "toolbar" }, label,
    h("button", { type: "button", onclick: () => load(false) }, "List")), results);
}

function publisher() {
  const [topicLabel, topic] = field("Topic", { dataset: { testid: "publish-topic" } });
  const payload = h("textarea", { rows: 3, dataset: { testid: "publish-payload" }, "aria-label": "payload" });
  const qos = h("select", { dataset: { testid: "publish-qos" }, "aria-label": "QoS" },
    [0, 1, 2].map((q) => h("option", { value: String(q) }, `QoS ${q}`)));
  const retain = h("input", { type: "checkbox", dataset: { testid: "publish-retain" } });
  const result = h("div");
  const send = async () => {
    try {
      const answer = await api("POST", "/publish", {
        body: { topic: topic.value, payload: payload.value, qos: Number(qos.value), retain: retain.checked },
      });
      result.replaceChildren(notice("ok", `Published (id ${answer.id}).`, "publish-result"));
    } catch (exc) {
      result.replaceChildren(notice("error", exc.message, "publish-result"));
    }
  };
  return h("div", { class: "publish" },
    h("div", { class: "toolbar" }, topicLabel, qos, h("label", {}, retain, " retain")),
    h("label", { class: "block" }, "Payload (UTF-8)", payload),
    h("div", { class: "toolbar" },
      h("button", { type: "button", onclick: send, dataset: { testid: "publish-send" } }, "Publish")),
    result);
}
