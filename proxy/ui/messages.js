// One logged message as DOM: role, time, content (text with artifact links), tool calls and
// results collapsible. Chat and Anthropic Messages shapes; anything else shown as JSON text.
import { el, fmt, linkedText } from "./dom.js";

const asText = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));

function textBlock(text) {
  return el("pre", { class: "text" }, linkedText(asText(text)));
}

function fold(label, cls, body, open = false) {
  return el("details", { class: cls, open }, el("summary", { text: label }), body);
}

function part(block) {
  if (typeof block === "string") return textBlock(block);
  if (!block || typeof block !== "object") return textBlock(asText(block));
  switch (block.type) {
    case "text": return textBlock(block.text ?? "");
    case "thinking": return fold("thinking", "thinking", textBlock(block.thinking ?? ""));
    case "redacted_thinking": return el("p", { class: "muted", text: "[redacted thinking]" });
    case "tool_use":
      return fold(`tool call: ${block.name} (${block.id})`, "tool-call", textBlock(block.input ?? {}));
    case "tool_result":
      return fold(`tool result (${block.tool_use_id})${block.is_error ? " · error" : ""}`, "tool-result",
        content(block.content));
    case "image_url": case "image": case "input_audio": case "file": case "document":
      return el("p", { class: "muted", text: `[${block.type}: not shown]` });
    default: return textBlock(block);
  }
}

function content(value) {
  if (value === undefined || value === null || value === "") return null;
  if (Array.isArray(value)) return el("div", { class: "parts" }, value.map(part));
  return part(value);
}

export function messageView(m) {
  const role = String(m.role || "?");
  const head = el("header", {},
    el("span", { class: "seq", text: `#${m.seq}` }),
    el("span", { class: "role", text: role }),
    m.name ? el("span", { class: "muted", text: String(m.name) }) : null,
    m.internal ? el("span", { class: "badge internal", text: "read-tool round (internal)" }) : null,
    el("time", { class: "muted", text: fmt.time(m.created_at) }));
  const body = [];
  if (role === "tool") {
    body.push(fold(`tool result (${m.tool_call_id ?? "?"})`, "tool-result", content(m.content)));
  } else {
    body.push(content(m.content));
  }
  for (const call of m.tool_calls || []) {
    const fn = call.function || {};
    body.push(fold(`tool call: ${fn.name ?? "?"} (${call.id ?? "?"})`, "tool-call", textBlock(fn.arguments ?? "")));
  }
  return el("article", { class: `message role-${role.replace(/[^a-z_]/gi, "")}`, id: `m-${m.id}`,
    dataset: { seq: m.seq, id: m.id } }, head, body);
}

export function compactionView(e) {
  const summary = e.payload && typeof e.payload.summary === "string" ? e.payload.summary : null;
  const count = e.payload && Number.isInteger(e.payload.message_count) ? e.payload.message_count : null;
  return el("section", { class: "compaction", dataset: { event: e.id } },
    el("h3", { text: `Compaction (${e.kind})` }),
    el("p", {},
      el("span", { class: "tokens-before", text: fmt.int(e.tokens_before) }), " → ",
      el("span", { class: "tokens-after", text: fmt.int(e.tokens_after) }), " tokens",
      count !== null ? ` · ${count} messages summarized` : "", ` · ${fmt.time(e.created_at)}`),
    summary !== null ? fold("The summary the model was given", "summary", textBlock(summary)) : null);
}
