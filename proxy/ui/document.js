// The archive and an artifact as documents: a page of numbered lines (numbered from 0, as the
// read API's ?offset= and the read tool count them), paging, go-to-line and search.
import { getJson, getText, seg } from "./api.js";
import { el, fmt, linkedText, route } from "./dom.js";

export const PAGE_LINES = 500;
// The line breaks Python's str.splitlines knows: how GET /artifacts/{id} counts lines.
const LINE_BREAK = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/;

function linesTable(lines, first, marked) {
  return el("table", { class: "doc", id: "doc-lines" }, el("tbody", {}, lines.map((text, i) => {
    const n = first + i;
    return el("tr", { id: `L${n}`, class: n === marked ? "marked" : null },
      el("td", { class: "ln", text: n }), el("td", { class: "code" }, linkedText(text)));
  })));
}

// The document frame: title, pager, search. load(offset) -> {lines, hasMore, total?};
// search(q, regex) -> the search API's answer; go(line) navigates to a line.
async function documentView(root, { title, back, load, search, go, line }) {
  const offset = Math.max(0, Math.floor(Math.max(0, line) / PAGE_LINES) * PAGE_LINES);
  const page = await load(offset);
  const last = offset + page.lines.length - 1;
  const results = el("ol", { id: "search-results", class: "results" });
  const q = el("input", { id: "search-q", type: "search", placeholder: "search (the read tool's search)", "aria-label": "Search" });
  const regex = el("input", { id: "search-regex", type: "checkbox" });
  const status = el("p", { id: "search-status", class: "muted" });
  const form = el("form", { id: "search", class: "filters" }, q, el("label", {}, regex, " regex"),
    el("button", { type: "submit", text: "Search" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    results.replaceChildren();
    status.textContent = "Searching…";
    try {
      const found = await search(q.value, regex.checked);
      status.textContent = `${found.total} matching lines${found.stopped ? " (stopped: the search took too long)" : ""}` +
        (found.data.length < found.total ? `, best ${found.data.length} shown` : "");
      results.append(...found.data.map((m) => el("li", {},
        el("a", { class: "hit", href: go(m.line), dataset: { line: m.line }, text: `line ${m.line}` }), " ",
        el("span", { class: "mono", text: m.text }))));
    } catch (error) {
      status.textContent = String(error.message);
    }
  });
  const goto = el("input", { id: "goto", type: "number", min: 0, placeholder: "line", "aria-label": "Go to line" });
  const gotoForm = el("form", { class: "inline" }, goto, el("button", { type: "submit", text: "Go" }));
  gotoForm.addEventListener("submit", (event) => { event.preventDefault(); window.location.hash = go(Number(goto.value) || 0); });
  const total = page.total !== undefined ? ` of ${fmt.int(page.total)}` : "";
  const backBar = el("p", {}, el("a", { href: back.href, text: back.text }), back.history && window.history.length > 1
    ? [" · ", el("a", { id: "back", href: "#/", text: "← Back", onclick: (event) => { event.preventDefault(); window.history.back(); } })]
    : null);
  root.append(backBar, el("h1", { id: "doc-title", text: title }),
    form, status, results,
    el("nav", { class: "pager", id: "pager" },
      offset > 0 ? el("a", { id: "prev-page", href: go(Math.max(0, offset - PAGE_LINES)), text: "← previous lines" }) : null,
      el("span", { id: "doc-range", text: page.lines.length ? ` lines ${offset}–${last}${total} ` : " no lines here " }),
      page.hasMore ? el("a", { id: "next-page", href: go(offset + PAGE_LINES), text: "next lines →" }) : null,
      gotoForm),
    linesTable(page.lines, offset, line));
  const marked = document.getElementById(`L${line}`);
  if (marked && line > 0) marked.scrollIntoView({ block: "center" });
}

export async function showArchive(root, id, params) {
  const leaf = params.get("leaf"), tenant = params.get("tenant");
  const base = `/sessions/${seg(id)}/archive`;
  await documentView(root, {
    title: `Archive of ${id}`,
    back: { href: route(["session", id], { leaf, tenant }), text: "← Session" },
    line: params.has("line") ? Number(params.get("line")) || 0 : -1,
    go: (n) => route(["archive", id], { leaf, tenant, line: n }),
    load: async (offset) => {
      // one line more than shown: whether another page follows
      const text = await getText(base, { offset, limit: PAGE_LINES + 1, leaf, tenant });
      const lines = text.split("\n");
      if (lines[lines.length - 1] === "") lines.pop();
      return { lines: lines.slice(0, PAGE_LINES), hasMore: lines.length > PAGE_LINES };
    },
    search: (q, regex) => getJson(`${base}/search`, { q, regex: regex || null, limit: 50, leaf, tenant }),
  });
}

export async function showArtifact(root, id, params) {
  const base = `/artifacts/${seg(id)}`;
  await documentView(root, {
    title: `Artifact ${id}`,
    back: { href: "#/", text: "← Sessions", history: true },
    line: params.has("line") ? Number(params.get("line")) || 0 : -1,
    go: (n) => route(["artifact", id], { line: n }),
    load: async (offset) => {
      const a = await getJson(base, { offset, limit: PAGE_LINES });
      const lines = a.content.split(LINE_BREAK);
      if (lines[lines.length - 1] === "") lines.pop();
      return { lines, hasMore: a.has_more, total: a.line_count };
    },
    search: (q, regex) => getJson(`${base}/search`, { q, regex: regex || null, limit: 50 }),
  });
}
