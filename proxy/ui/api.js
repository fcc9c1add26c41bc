// The read API, called with the key the user signed in with (sessionStorage only: this tab).
const KEY = "context-proxy.key";

export const auth = {
  key: () => sessionStorage.getItem(KEY),
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// A URL on this origin: path segments are encoded by the caller (seg), query values here.
export function url(path, params = {}) {
  const u = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") u.searchParams.set(name, String(value));
  }
  return u.pathname + u.search;
}

export const seg = (value) => encodeURIComponent(value);

async function call(path, params) {
  const headers = { Authorization: `Bearer ${auth.key() || ""}` };
  const response = await fetch(url(path, params), { headers, credentials: "omit", cache: "no-store" });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error && typeof body.error.message === "string") message = body.error.message;
    } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, message);
  }
  return response;
}

export const getJson = async (path, params) => (await call(path, params)).json();
export const getText = async (path, params) => (await call(path, params)).text();
