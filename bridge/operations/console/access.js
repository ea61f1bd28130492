// Access: the users (password file, the cluster's Redis) and the ACL rules in force, and
// "explain this decision" for a client and a topic.

import { get } from "./api.js";
import { field, fill, h, notice, table } from "./dom.js";

export function render(root) {
  const users = h("div", {}, h("p", { class: "quiet" }, "Loading..."));
  const rules = h("div", {}, h("p", { class: "quiet" }, "Loading..."));
  root.replaceChildren(
    h("h1", {}, "Access"),
    h("h2", {}, "Explain a decision"),
    explainer(),
    h("h2", {}, "ACL rules"),
    rules,
    h("h2", {}, "Users"),
    users,
  );
  loadRules(rules);
  loadUsers(users);
}

async function loadRules(box) {
  try {
    const data = await get("/access/rules");
    const sources = [data.acl_file && `file ${data.acl_file}`, data.redis_rules && `Redis list ${data.redis_rules}`]
      .filter(Boolean).join(" and ");
    fill(
      box,
      data.enabled
        ? h("p", { class: "quiet" }, `${data.items.length} rule(s) from ${sources}, checked top to bottom; `
            + "the first that applies decides, none denies.")
        : h("p", { dataset: { testid: "acl-off" } }, "ACL off: every client may publish and subscribe to every topic."),
      data.items.length ? ruleTable(data.items) : null,
    );
  } catch (exc) {
    box.replaceChildren(notice("error", exc.message));
  }
}

function ruleTable(items) {
  return table(["#", "Decision", "Who", "Action", "Filter", "Source"],
    items.map((r) => h("tr", { dataset: { testid: "rule-row" } },
      h("td", { class: "n" }, String(r.index + 1)), h("td", { class: r.decision === "allow" ? "ok" : "error" }, r.decision),
      h("td", {}, r.who), h("td", {}, r.action), h("td", { class: "mono" }, r.filter), h("td", { class: "quiet" }, r.source ?? "-"))),
    { class: "grid-table" });
}

async function loadUsers(box) {
  try {
    const data = await get("/access/users", { limit: 1000 });
    const where = [data.password_file && `password file ${data.password_file}`, data.redis_users && `Redis hash ${data.redis_users}`]
      .filter(Boolean).join(" and ");
    fill(
      box,
      h("p", { class: "quiet" }, data.authenticating
        ? `Users from ${where || "client certificates only"}; anonymous clients ${data.allow_anonymous ? "allowed" : "refused"}.`
        : "Authentication off: any client may connect."),
      data.items.length
        ? table(["User name", "Defined in", "SCRAM-SHA-256"], data.items.map((u) =>
            h("tr", { dataset: { testid: "user-row" } }, h("td", { class: "mono" }, u.username),
              h("td", {}, u.sources.join(", ")), h("td", {}, u.scram ? "yes" : "no"))), { class: "grid-table" })
        : null,
      data.next ? h("p", { class: "quiet" }, "More users than shown (first 1000).") : null,
    );
  } catch (exc) {
    box.replaceChildren(notice("error", exc.message));
  }
}

function explainer() {
  const [clientLabel, clientId] = field("ClientId", { dataset: { testid: "explain-client" } });
  const [userLabel, username] = field("User name", { dataset: { testid: "explain-user" }, placeholder: "(anonymous)" });
  const [topicLabel, topic] = field("Topic or filter", { dataset: { testid: "explain-topic" } });
  const action = h("select", { dataset: { testid: "explain-action" }, "aria-label": "action" },
    h("option", { value: "publish" }, "publish"), h("option", { value: "subscribe" }, "subscribe"));
  const result = h("div", { dataset: { testid: "explain-result" } });
  const go = async () => {
    try {
      const data = await get("/access/explain", {
        clientid: clientId.value, username: username.value || null, topic: topic.value, action: action.value,
      });
      result.replaceChildren(...explanation(data));
    } catch (exc) {
      result.replaceChildren(notice("error", exc.message, "explain-verdict"));
    }
  };
  for (const input of [clientId, username, topic]) {
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") go();
    });
  }
  return h("div", {}, h("div", { class: "toolbar" }, clientLabel, userLabel, topicLabel, action,
    h("button", { type: "button", onclick: go, dataset: { testid: "explain-go" } }, "Explain")), result);
}

function explanation(data) {
  const out = [h("p", { class: `verdict ${data.allowed ? "ok" : "error"}`, dataset: { testid: "explain-verdict" } },
    `${data.allowed ? "ALLOWED" : "DENIED"}: ${data.reason}`)];
  if (data.checked !== data.topic) {
    out.push(h("p", { class: "quiet" }, `Checked as ${data.checked} (the filter of the shared subscription).`));
  }
  if (data.may_filter_deliveries.length) {
    out.push(h("p", {}, "Granted, but deliveries are checked topic by topic: deny rule(s) "
      + data.may_filter_deliveries.map((i) => `#${i + 1}`).join(", ") + " may leave some messages out."));
  }
  if (data.steps.length) {
    out.push(table(["#", "Rule", "As applied", "Outcome"], data.steps.map((s) =>
      h("tr", { class: s.index === data.deciding_rule ? "deciding" : "", dataset: { testid: "explain-step" } },
        h("td", { class: "n" }, String(s.index + 1)), h("td", { class: "mono" }, s.rule),
        h("td", { class: "mono" }, s.pattern ?? "-"), h("td", {}, s.outcome))), { class: "grid-table" }));
  }
  return out;
}
