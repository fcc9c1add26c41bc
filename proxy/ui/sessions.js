// The sessions list: newest first, paged from the server (limit/after), filtered there by model and time.
import { getJson } from "./api.js";
import { SENT_MEANS } from "./chart.js";
import { el, fmt, route } from "./dom.js";

const PAGE = 50;
const SINCE = { any: 0, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400 };

export function saved(s) {
  return (s.tokens_client_total || 0) - (s.tokens_forwarded_total || 0);
}

function row(s, admin) {
  const percent = s.tokens_client_total ? Math.round((100 * saved(s)) / s.tokens_client_total) : 0;
  const params = admin && s.tenant ? { tenant: s.tenant } : {};
  return el("tr", { class: "session-row", dataset: { id: s.id } },
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
  const models = el("datalist", { id: "models" });
  const model = el("input", { id: "filter-model", type: "search", list: "models", placeholder: "model (exact name)",
    "aria-label": "Filter by model" });
  const since = el("select", { id: "filter-since", "aria-label": "Updated within" },
    ...Object.keys(SINCE).map((k) => el("option", { value: k, text: k === "any" ? "any time" : `last ${k}` })));
  const body = el("tbody", { id: "sessions" });
  const more = el("button", { id: "more-sessions", type: "button", text: "Load more sessions", hidden: true });
  const status = el("p", { id: "sessions-status", class: "muted" });
  const head = el("thead");
  const form = el("form", { class: "filters", id: "filters" }, model, models, since,
    el("button", { type: "submit", text: "Filter" }));
  root.append(el("h1", { text: "Sessions" }), form, el("table", { class: "list" }, head, body), more, status);

  let after = null;
  let admin = false;
  let shown = 0;
  let generation = 0;  // a newer filter's answer wins over an older one still arriving
  const seen = new Set();

  function header() {
    head.replaceChildren(el("tr", {}, ...["session", admin ? "tenant" : null, "model", "updated (UTC)", "messages",
      "requests", "compactions", "branches", "tokens sent", "tokens forwarded", "tokens saved"]
      .filter(Boolean).map((t) => el("th", { text: t, title: t === "tokens sent" ? SENT_MEANS : null }))));
  }

  async function load(fresh) {
    const mine = fresh ? ++generation : generation;
    if (fresh) after = null;
    more.disabled = true;
    const span = SINCE[since.value];
    const page = await getJson("/sessions", { limit: PAGE, after, model: model.value.trim() || null,
      updated_after: span ? Math.floor(Date.now() / 1000) - span : null });
    if (mine !== generation) return;
    if (fresh) { body.replaceChildren(); shown = 0; }
    if (page.data.some((s) => "tenant" in s)) admin = true;
    document.getElementById("who").textContent = admin ? "admin key: every tenant's sessions" : "";
    header();
    for (const s of page.data) {
      body.append(row(s, admin));
      if (s.last_model && !seen.has(s.last_model)) { seen.add(s.last_model); models.append(el("option", { value: s.last_model })); }
    }
    shown += page.data.length;
    after = page.last_id;
    more.hidden = !page.has_more;
    more.disabled = false;
    status.textContent = shown ? `${shown} session${shown === 1 ? "" : "s"}${page.has_more ? ", more to load" : ""}` : "No sessions.";
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); load(true); });
  since.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));
  await load(true);
}
