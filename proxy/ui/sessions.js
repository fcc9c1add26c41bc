// The sessions list: newest first, paged from the server (limit/after), filtered by model and time.
import { getJson } from "./api.js";
import { el, fmt, route } from "./dom.js";

const PAGE = 50;
const SINCE = { any: 0, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400 };

export function saved(s) {
  return (s.tokens_client_total || 0) - (s.tokens_forwarded_total || 0);
}

function row(s, admin) {
  const percent = s.tokens_client_total ? Math.round((100 * saved(s)) / s.tokens_client_total) : 0;
  const params = admin && s.tenant ? { tenant: s.tenant } : {};
  return el("tr", { class: "session-row", dataset: { id: s.id, model: s.last_model || "", updated: s.updated_at } },
    el("td", {}, el("a", { class: "session-link", href: route(["session", s.id], params), text: s.id })),
    admin ? el("td", { class: "tenant mono", text: s.tenant || "" }) : null,
    el("td", { text: s.last_model || "–" }),
    el("td", { text: fmt.time(s.updated_at) }),
    el("td", { class: "num", text: fmt.int(s.message_count) }),
    el("td", { class: "num", text: fmt.int(s.request_count) }),
    el("td", { class: "num", text: fmt.int(s.event_count) }),
    el("td", { class: "num", text: fmt.int(s.branch_count) }),
    el("td", { class: "num", text: fmt.int(s.tokens_client_total) }),
    el("td", { class: "num", text: fmt.int(s.tokens_forwarded_total) }),
    el("td", { class: "num saved", text: `${fmt.int(saved(s))} (${percent}%)` }));
}

export async function showSessions(root) {
  const model = el("input", { id: "filter-model", type: "search", placeholder: "model contains…", "aria-label": "Filter by model" });
  const since = el("select", { id: "filter-since", "aria-label": "Updated within" },
    ...Object.keys(SINCE).map((k) => el("option", { value: k, text: k === "any" ? "any time" : `last ${k}` })));
  const body = el("tbody", { id: "sessions" });
  const more = el("button", { id: "more-sessions", type: "button", text: "Load more sessions", hidden: true });
  const status = el("p", { id: "sessions-status", class: "muted" });
  const head = el("thead");
  const table = el("table", { class: "list" }, head, body);
  root.append(el("h1", { text: "Sessions" }),
    el("div", { class: "filters" }, model, since,
      el("span", { class: "muted", text: "Filters apply to the sessions loaded so far (newest first)." })),
    table, more, status);

  const rows = [];
  let after = null;
  let admin = false;

  function apply() {
    const text = model.value.trim().toLowerCase();
    const floor = SINCE[since.value] ? Date.now() / 1000 - SINCE[since.value] : 0;
    let shown = 0;
    for (const tr of body.children) {
      const visible = (!text || tr.dataset.model.toLowerCase().includes(text)) && Number(tr.dataset.updated) >= floor;
      tr.hidden = !visible;
      shown += visible ? 1 : 0;
    }
    status.textContent = rows.length ? `${shown} of ${rows.length} loaded sessions shown` : "No sessions yet.";
  }

  function header() {
    head.replaceChildren(el("tr", {}, ...["session", admin ? "tenant" : null, "model", "updated (UTC)", "messages",
      "requests", "compactions", "branches", "tokens sent", "tokens forwarded", "tokens saved"]
      .filter(Boolean).map((t) => el("th", { text: t }))));
  }

  async function load() {
    more.disabled = true;
    const page = await getJson("/sessions", { limit: PAGE, after });
    if (page.data.some((s) => "tenant" in s)) admin = true;
    document.getElementById("who").textContent = admin ? "admin key: every tenant's sessions" : "";
    header();
    for (const s of page.data) {
      rows.push(s);
      body.append(row(s, admin));
    }
    after = page.last_id;
    more.hidden = !page.has_more;
    more.disabled = false;
    apply();
  }

  model.addEventListener("input", apply);
  since.addEventListener("change", apply);
  more.addEventListener("click", load);
  await load();
}
