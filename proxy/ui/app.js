// The viewer's entry: sign-in, then hash routes to the views.
//   #/                        sessions list
//   #/session/<id>?leaf=&tenant=      one session
//   #/archive/<id>?leaf=&tenant=&line=  its archive as a document
//   #/artifact/<id>?line=             one artifact as a document
import { ApiError, auth, getJson } from "./api.js";
import { clear, el, message } from "./dom.js";
import { showArchive, showArtifact } from "./document.js";
import { showSession } from "./session.js";
import { showSessions } from "./sessions.js";

const main = () => document.getElementById("main");

function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?", 2);
  const parts = path.split("/").filter(Boolean).map((p) => {
    try { return decodeURIComponent(p); } catch (_) { return p; }
  });
  return { parts, params: new URLSearchParams(query || "") };
}

function signIn(reason) {
  const root = clear(main());
  const input = el("input", { id: "key", type: "password", autocomplete: "off", required: true,
    placeholder: "API key", "aria-label": "API key" });
  const form = el("form", { id: "signin", class: "card" },
    el("h1", { text: "Sign in" }),
    el("p", { class: "muted", text: "The key you use for the read API. It stays in this tab (session storage) and is sent only to this proxy." }),
    input, el("button", { type: "submit", text: "Sign in" }),
    reason ? message("error", reason) : null);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    auth.set(input.value.trim());
    try {
      await getJson("/sessions", { limit: 1 });
      render();
    } catch (error) {
      auth.clear();
      signIn(error instanceof ApiError && error.status === 401 ? "That key is not accepted here." : String(error.message));
    }
  });
  root.append(form);
  input.focus();
  document.getElementById("signout").hidden = true;
}

async function render() {
  if (!auth.key()) return signIn();
  document.getElementById("signout").hidden = false;
  const { parts, params } = parseHash();
  const root = el("div", { class: "view" });  // a fresh node: a slower earlier view writes into a detached one
  clear(main()).append(root);
  const [view, id] = parts;
  try {
    if (view === "session" && id) await showSession(root, id, params);
    else if (view === "archive" && id) await showArchive(root, id, params);
    else if (view === "artifact" && id) await showArtifact(root, id, params);
    else await showSessions(root, params);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) { auth.clear(); return signIn("The key was refused."); }
    root.append(message("error", error instanceof ApiError && error.status === 404 ? `Not found: ${error.message}` : String(error.message)));
  }
}

document.getElementById("signout").addEventListener("click", () => {
  auth.clear();
  document.getElementById("who").textContent = "";
  window.location.hash = "#/";
  signIn();
});
window.addEventListener("hashchange", render);
render();
