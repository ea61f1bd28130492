// The admin API as the console uses it: every call sends the token as a bearer header; the token
// lives in sessionStorage (this tab, until it closes), never in a URL or in localStorage.

const TOKEN_KEY = "mqtt-bridge.admin-token";
const PREFIX = "/api/v1";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let onUnauthorized = () => {};

/** Called when the API refuses the token (401): the console asks for it again. */
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export function savedToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function saveToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** GET/POST/DELETE `path` (under /api/v1; `query` an object of parameters); the JSON answer,
 * or an ApiError carrying the API's `error` message. */
export async function api(method, path, { query, body, token } = {}) {
  const headers = { Authorization: `Bearer ${token ?? savedToken() ?? ""}` };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let url = PREFIX + path;
  if (query) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value !== undefined && value !== null) params.set(name, value);
    }
    const text = params.toString();
    if (text) url += `?${text}`;
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (exc) {
    throw new ApiError(0, `the node did not answer (${exc.message})`);
  }
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    if (response.status === 401 && token === undefined) onUnauthorized();
    throw new ApiError(response.status, data.error || response.statusText);
  }
  return data;
}

export const get = (path, query) => api("GET", path, { query });

/** A path segment (a ClientId may hold '/', spaces, '#'). */
export const segment = (text) => encodeURIComponent(text);
