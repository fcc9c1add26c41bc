// DOM building from untrusted data: createElement and textContent only, never innerHTML.
// Links are made only by this code, to this app's own #/ routes.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "href") node.setAttribute("href", internalHref(value));
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// A "Load more" button for a paged list: disabled while a page loads; a failed page says so beside
// it and the button stays, to try again. ``load`` fetches the next page and sets ``button.hidden``.
export function loadMore(id, text, load) {
  const button = el("button", { id, type: "button", text, hidden: true });
  const status = el("span", { class: "error load-error", role: "status" });
  button.addEventListener("click", async () => {
    button.disabled = true;
    status.textContent = "";
    try {
      await load();
    } catch (err) {
      status.textContent = `Could not load more: ${err.message}`;
      button.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  return { button, controls: el("div", { class: "more" }, button, status) };
}

// Only "#/..." routes of this app: anything else (javascript:, data:, http:) becomes "#/".
export function internalHref(value) {
  return typeof value === "string" && value.startsWith("#/") ? value : "#/";
}

export function route(path, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(name, String(value));
  }
  const tail = query.toString();
  return "#/" + path.map(encodeURIComponent).join("/") + (tail ? "?" + tail : "");
}

const ARTIFACT = /art_[0-9a-f]{32}/g;

// Text with artifact ids turned into links to their document view; the rest stays text.
export function linkedText(text) {
  const parts = [];
  let last = 0;
  for (const match of String(text).matchAll(ARTIFACT)) {
    if (match.index > last) parts.push(document.createTextNode(text.slice(last, match.index)));
    parts.push(el("a", { class: "artifact-link", href: route(["artifact", match[0]]), text: match[0] }));
    last = match.index + match[0].length;
  }
  if (last < text.length) parts.push(document.createTextNode(text.slice(last)));
  return parts;
}

export const fmt = {
  int: (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US")),
  time: (s) => (s ? new Date(s * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "–"),
  short: (hash) => (hash ? String(hash).slice(0, 12) : "–"),
};

export function clear(node) {
  while (node.firstChild) node.firstChild.remove();
  return node;
}

export function message(kind, text) {
  return el("p", { class: kind, role: kind === "error" ? "alert" : null, text });
}
