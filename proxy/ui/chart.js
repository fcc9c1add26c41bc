// Per request: the tokens the client's request needs (its prompt plus the output it reserves with
// max_tokens) against the tokens forwarded, as SVG built here. Both series have a point per request
// (each point's title and data attributes carry both numbers); the "sent" line is drawn dashed and
// wider beneath the forwarded one, so it shows where the two are equal. Each compaction event is
// marked at the first request it applied to, each overflow recovery (the provider refused, the
// proxy compacted and sent again) at its request, failed requests with a larger red point.
export const SENT_MEANS = "what the client's request needs: its prompt plus the output it reserves (max_tokens)";
const NS = "http://www.w3.org/2000/svg";
const W = 900, H = 260, PAD = { left: 64, right: 16, top: 16, bottom: 28 };

function svg(tag, attrs = {}, title) {
  const node = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (title) {
    const t = document.createElementNS(NS, "title");
    t.textContent = title;
    node.append(t);
  }
  return node;
}

export function tokensChart(requests, events) {
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", id: "tokens-chart",
    "aria-label": "Tokens the client's request needs (prompt + reserved output) and tokens forwarded, per request" });
  const n = requests.length;
  const top = requests.reduce((m, r) => Math.max(m, r.tokens_client || 0, r.tokens_forwarded || 0), 1);  // no spread: a long session has more requests than a call takes arguments
  const x = (i) => PAD.left + (n <= 1 ? 0 : (i * (W - PAD.left - PAD.right)) / (n - 1));
  const y = (v) => H - PAD.bottom - ((v || 0) * (H - PAD.top - PAD.bottom)) / top;
  for (const f of [0, 0.5, 1]) {
    const v = Math.round(top * f);
    root.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: "grid" }));
    const label = svg("text", { x: PAD.left - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" });
    label.textContent = v.toLocaleString("en-US");
    root.append(label);
  }
  const first = new Map();
  requests.forEach((r, i) => (r.event_ids || []).forEach((id) => { if (!first.has(id)) first.set(id, i); }));
  for (const e of events) {
    if (!first.has(e.id)) continue;
    const i = first.get(e.id);
    const mark = svg("g", { class: `event-mark kind-${String(e.kind).replace(/[^a-z_]/gi, "")}`, "data-event": e.id },
      `${e.kind} at request ${i + 1}: ${e.tokens_before} → ${e.tokens_after} tokens`);
    mark.append(svg("line", { x1: x(i), x2: x(i), y1: PAD.top, y2: H - PAD.bottom }));
    root.append(mark);
  }
  const line = (key, cls) => svg("polyline", { class: cls, points: requests.map((r, i) => `${x(i)},${y(r[key])}`).join(" ") });
  root.append(line("tokens_client", "sent"), line("tokens_forwarded", "forwarded"));
  requests.forEach((r, i) => {
    if (!r.overflow_retries) return;
    const mark = svg("g", { class: "overflow-mark", "data-request": i },
      `request ${i + 1}: the provider's overflow, recovered by compacting and sending again (${r.overflow_retries}×)`);
    mark.append(svg("path", { d: `M${x(i)},${PAD.top + 10} l-6,-10 h12 z` }));
    mark.append(svg("line", { x1: x(i), x2: x(i), y1: PAD.top + 10, y2: H - PAD.bottom }));
    root.append(mark);
  });
  requests.forEach((r, i) => {
    const failed = r.status >= 400;
    const title = `request ${i + 1} (${r.model || "?"}, status ${r.status}): sent ${r.tokens_client ?? "?"} ` +
      `(prompt + reserved output), forwarded ${r.tokens_forwarded ?? "?"}; ` +
      `defenses: ${(r.defenses || []).join(", ") || "none"}`;
    const numbers = { "data-request": i, "data-tokens-client": r.tokens_client ?? "", "data-tokens-forwarded": r.tokens_forwarded ?? "" };
    root.append(svg("circle", { cx: x(i), cy: y(r.tokens_client), r: 4, class: "point sent", ...numbers }, title));
    root.append(svg("circle", { cx: x(i), cy: y(r.tokens_forwarded), r: failed ? 4 : 2.5,
      class: failed ? "point forwarded failed" : "point forwarded", ...numbers }, title));
  });
  const label = svg("text", { x: PAD.left, y: H - 8, class: "axis" });
  label.textContent = `requests 1–${n}`;
  root.append(label);
  return root;
}
