// One session: counts, the tokens chart with compactions marked, the requests, the events, the
// branch switcher and the messages of one branch, paged from the server.
import { getJson, seg } from "./api.js";
import { SENT_MEANS, tokensChart } from "./chart.js";
import { el, fmt, loadMore, route } from "./dom.js";
import { compactionView, messageView } from "./messages.js";

const MESSAGE_PAGE = 100;
const REQUEST_PAGE = 500;
const ARTIFACT_PAGE = 100;

function stats(s) {
  const saved = (s.tokens_client_total || 0) - (s.tokens_forwarded_total || 0);
  const items = [["messages", "message_count"], ["requests", "request_count"], ["compactions", "event_count"],
    ["branches", "branch_count"], ["tokens sent", "tokens_client_total"], ["tokens forwarded", "tokens_forwarded_total"]];
  const stat = (label, text, key) => el("div", {}, el("dt", { text: label, title: key === "tokens_client_total" ? SENT_MEANS : null }),
    el("dd", { dataset: { stat: key }, text }));
  return el("dl", { class: "stats", id: "session-stats" },
    items.map(([label, key]) => stat(label, fmt.int(s[key]), key)),
    stat("tokens saved", fmt.int(saved), "tokens_saved"), stat("model", s.last_model || "–", "last_model"),
    stat("api", s.api, "api"));
}

function requestRow(r, i) {
  return el("tr", { class: "request-row", dataset: { request: r.id } },
    el("td", { class: "num", text: i + 1 }), el("td", { text: fmt.time(r.created_at) }),
    el("td", { text: r.model || "–" }), el("td", { class: "num", text: r.status }),
    el("td", { class: "num sent", text: fmt.int(r.tokens_client) }),
    el("td", { class: "num forwarded", text: fmt.int(r.tokens_forwarded) }),
    el("td", { text: (r.defenses || []).join(", ") || "–" }),
    el("td", { text: (r.event_ids || []).length }),
    el("td", { class: "num overflow", text: r.overflow_retries || 0 }), el("td", { text: r.finish_reason || "–" }),
    el("td", { text: r.error || "" }));
}

async function branchSwitcher(id, params) {
  const page = await getJson(`/sessions/${seg(id)}/branches`, { limit: 100, tenant: params.get("tenant") });
  const current = params.get("leaf");
  const select = el("select", { id: "branch", "aria-label": "Branch" },
    page.data.map((b, i) => el("option", { value: b.leaf, selected: current ? b.leaf === current : b.newest,
      text: `branch ${i + 1}${b.newest ? " (newest)" : ""} · ${b.message_count} messages · ${fmt.time(b.last_activity)}` })));
  select.addEventListener("change", () => {
    window.location.hash = route(["session", id], { leaf: select.value, tenant: params.get("tenant") });
  });
  return el("label", { class: "branches" }, `Branch (${page.data.length}${page.has_more ? "+" : ""}): `, select);
}

async function requestsSection(base, tenant, events) {
  const requests = [];
  let after = null;
  const chartBox = el("div", { id: "chart" });
  const body = el("tbody", { id: "requests" });
  const recoveries = el("span", { id: "overflow-recoveries", class: "muted" });
  async function load() {
    const page = await getJson(`${base}/requests`, { limit: REQUEST_PAGE, after, tenant });
    page.data.forEach((r) => { body.append(requestRow(r, requests.length)); requests.push(r); });
    const recovered = requests.filter((r) => r.overflow_retries > 0).length;
    recoveries.textContent = `${recovered} of ${requests.length} requests recovered from an overflow`;
    after = page.last_id;
    more.button.hidden = !page.has_more;
    chartBox.replaceChildren(requests.length ? tokensChart(requests, events) : el("p", { class: "muted", text: "No requests logged." }));
  }
  const more = loadMore("more-requests", "Load more requests", load);
  await load();
  const head = el("tr", {}, ["#", "time (UTC)", "model", "status", "tokens sent", "tokens forwarded", "defenses",
    "events", "overflow retries", "finish", "error"].map((t) => el("th", { text: t, title: t === "tokens sent" ? SENT_MEANS : null })));
  return el("section", {},
    el("h2", { text: "Tokens per request" }),
    el("p", { class: "legend" }, el("span", { class: "key sent", text: "sent: the prompt + reserved output (max_tokens)" }),
      el("span", { class: "key forwarded", text: "forwarded to the provider" }),
      el("span", { class: "key event", text: "compaction" }),
      el("span", { class: "key overflow", text: "overflow recovered" }), recoveries),
    chartBox, more.controls,
    el("details", { class: "requests" }, el("summary", { text: "Requests" }), el("table", { class: "list" }, el("thead", {}, head), body)));
}

async function messagesSection(base, params, events) {
  const byAnchor = new Map();
  for (const e of events) {
    if (!byAnchor.has(e.anchor_hash)) byAnchor.set(e.anchor_hash, []);
    byAnchor.get(e.anchor_hash).push(e);
  }
  const list = el("div", { id: "messages" });
  const count = el("p", { id: "messages-status", class: "muted" });
  let after = null;
  let shown = 0;
  async function load() {
    const page = await getJson(`${base}/messages`, { limit: MESSAGE_PAGE, after, leaf: params.get("leaf"), tenant: params.get("tenant") });
    for (const m of page.data) {
      list.append(messageView(m));
      for (const e of byAnchor.get(m.id) || []) list.append(compactionView(e));
    }
    shown += page.data.length;
    after = page.last_id;
    more.button.hidden = !page.has_more;
    count.textContent = `${shown} messages shown${page.has_more ? ", more to load" : ""}`;
  }
  const more = loadMore("more-messages", "Load more messages", load);
  await load();
  return el("section", {}, el("h2", { text: "Messages" }), list, count, more.controls);
}

async function artifactsSection(base, tenant) {
  const body = el("tbody", { id: "artifacts" });
  const heading = el("h2", {});
  let after = null;
  let count = 0;
  async function load() {
    const page = await getJson(`${base}/artifacts`, { limit: ARTIFACT_PAGE, after, tenant });
    for (const a of page.data) {
      body.append(el("tr", { class: "artifact-row", dataset: { id: a.id } },
        el("td", {}, el("a", { class: "artifact-link", href: route(["artifact", a.id]), text: a.id })),
        el("td", { text: a.kind }), el("td", { class: "num bytes", text: fmt.int(a.bytes) }),
        el("td", { class: "num lines", text: fmt.int(a.lines) }),
        el("td", { class: "mono", title: a.message || "", text: a.message ? fmt.short(a.message) : "–" }),
        el("td", { text: fmt.time(a.created_at) })));
    }
    count += page.data.length;
    after = page.last_id;
    more.button.hidden = !page.has_more;
    heading.textContent = `Artifacts (${count}${page.has_more ? "+" : ""})`;
  }
  const more = loadMore("more-artifacts", "Load more artifacts", load);
  await load();
  const head = el("tr", {}, ["artifact", "kind", "bytes", "lines", "from message", "created (UTC)"].map((t) => el("th", { text: t })));
  return el("section", { id: "artifacts-section" }, heading,
    count ? el("table", { class: "list" }, el("thead", {}, head), body) : el("p", { class: "muted", text: "Nothing offloaded." }), more.controls);
}

export async function showSession(root, id, params) {
  const tenant = params.get("tenant");
  const base = `/sessions/${seg(id)}`;
  const s = await getJson(base, { tenant });
  const events = (await getJson(`${base}/events`, { tenant })).data;
  root.append(...[
    el("p", {}, el("a", { href: "#/", text: "← Sessions" })),
    el("h1", { id: "session-title", text: s.id }),
    s.tenant ? el("p", { class: "tenant mono", text: `tenant ${s.tenant}` }) : null,
    stats(s),
    el("p", { class: "actions" }, el("a", { id: "archive-link", href: route(["archive", id], { leaf: params.get("leaf"), tenant }),
      text: "Archive (the whole log as a document)" }), " ", await branchSwitcher(id, params)),
    await requestsSection(base, tenant, events),
    el("section", { id: "events" }, el("h2", { text: `Compaction events (${events.length})` }), events.map(compactionView)),
    await artifactsSection(base, tenant),
    await messagesSection(base, params, events)].filter(Boolean));
}
