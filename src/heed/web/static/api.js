// api.js: the HTTP client. Every URL and JSON shape the UI uses is spelled here, nowhere else.

export class ApiError extends Error {
  constructor(status, detail, { retryAfter = null, body = null } = {}) {
    super(status ? `${status}: ${detail}` : detail);
    this.status = status; // 0: the network, not the server
    this.detail = detail;
    this.retryAfter = retryAfter; // seconds, from Retry-After (409, 503)
    this.body = body;
  }
}

function detailOf(body, response) {
  if (body && typeof body === "object") {
    const d = body.detail;
    if (typeof d === "string") return d;
    if (Array.isArray(d)) return d.map((e) => e.msg || JSON.stringify(e)).join("; ");
    if (d && typeof d === "object") return d.message || JSON.stringify(d);
  }
  return response.statusText || "request failed";
}

// --- the UI session: the CSRF header of unsafe requests, and who hears about a 401 ---

const UNSAFE_METHODS = new Set(["POST", "PUT", "PATCH", "DELETE"]);
const CSRF_COOKIE = "heed_csrf";
let csrfToken = null;
let unauthorized = () => {};

/** The token to send as X-Heed-CSRF (auth.js sets it; the heed_csrf cookie is the fallback). */
export function setCsrfToken(token) {
  csrfToken = token || null;
}

function currentCsrfToken() {
  if (csrfToken) return csrfToken;
  const pair = document.cookie.split("; ").find((p) => p.startsWith(`${CSRF_COOKIE}=`));
  return pair ? decodeURIComponent(pair.slice(CSRF_COOKIE.length + 1)) : null;
}

/** headers, plus X-Heed-CSRF when *method* changes something and a token is known. */
function withCsrf(method, headers) {
  const token = UNSAFE_METHODS.has(method) ? currentCsrfToken() : null;
  if (token) headers["X-Heed-CSRF"] = token;
  return headers;
}

/** fn(error) hears every 401 (the UI session ended), except the auth endpoints' own. */
export function onUnauthorized(fn) {
  unauthorized = fn;
}

/** The ApiError a non-2xx response stands for (reads its JSON body when it has one). */
export async function errorFrom(response, { report401 = true } = {}) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const header = response.headers.get("Retry-After");
  const retryAfter = header !== null && header !== "" ? Number(header) : body?.retry_after ?? null;
  const error = new ApiError(response.status, detailOf(body, response), { retryAfter, body });
  if (error.status === 401 && report401) unauthorized(error);
  return error;
}

export async function request(method, path, body = undefined, { signal, report401 = true } = {}) {
  const headers = withCsrf(method, { Accept: "application/json" });
  const init = { method, signal, headers, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error?.name === "AbortError") throw error;
    throw new ApiError(0, "network lost");
  }
  if (!response.ok) throw await errorFrom(response, { report401 });
  if (response.status === 204) return null;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

const enc = encodeURIComponent;
const bankPath = (bankId) => `/v1/default/banks/${enc(bankId)}`;

// --- the UI login (auth.js): their 401s are answers, not a session ending ---

export const auth = {
  session: () => request("GET", "/v1/auth/session", undefined, { report401: false }),
  login: (key) => request("POST", "/v1/auth/login", { key }, { report401: false }),
  logout: () => request("POST", "/v1/auth/logout", undefined, { report401: false }),
};

// --- sessions and runs (issue 5) ---

export const sessions = {
  list: () => request("GET", "/v1/sessions"),
  create: ({ title, bank_id }) => request("POST", "/v1/sessions", { title, bank_id }),
  get: (id) => request("GET", `/v1/sessions/${enc(id)}`),
  rename: (id, title) => request("PATCH", `/v1/sessions/${enc(id)}`, { title }),
  remove: (id) => request("DELETE", `/v1/sessions/${enc(id)}`),
  status: (id, { signal } = {}) => request("GET", `/v1/sessions/${enc(id)}/status`, undefined, { signal }),
  startTurn: (id, content, multitask_strategy = "reject") =>
    request("POST", `/v1/sessions/${enc(id)}/turns`, { content, multitask_strategy }),
  eventsUrl: (id) => `/v1/sessions/${enc(id)}/events`,
};

export const runs = {
  get: (id) => request("GET", `/v1/runs/${enc(id)}`),
  /** Runs not yet terminal (any kind), oldest first: how a page finds work it did not start. */
  active: ({ limit = 100 } = {}) => request("GET", `/v1/runs?active=true&limit=${limit}`),
  cancel: (id) => request("POST", `/v1/runs/${enc(id)}/cancel`),
  streamUrl: (id, after) => `/v1/runs/${enc(id)}/stream?after=${after || 0}`,
};

// --- memory banks (issue 3, the hindsight wire format) ---

export const memory = {
  listBanks: () => request("GET", "/v1/default/banks"),
  getBank: (bankId) => request("GET", bankPath(bankId)),
  stats: (bankId) => request("GET", `${bankPath(bankId)}/stats`),
  createBank: (bankId, body = {}) => request("PUT", bankPath(bankId), body),
  deleteBank: (bankId) => request("DELETE", bankPath(bankId)),
  retain: (bankId, content, extra = {}) =>
    request("POST", `${bankPath(bankId)}/memories`, { items: [{ content, ...extra }] }),
  list: (bankId, { limit = 50, offset = 0, q = "" } = {}) => {
    const params = new URLSearchParams({ limit: String(limit), offset: String(offset) });
    if (q) params.set("q", q);
    return request("GET", `${bankPath(bankId)}/memories/list?${params}`);
  },
  recall: (bankId, query, { budget = "mid", max_tokens = 4096 } = {}) =>
    request("POST", `${bankPath(bankId)}/memories/recall`, {
      query,
      budget,
      max_tokens,
      trace: true,
    }),
  reflect: (bankId, query, { budget = "low" } = {}) =>
    request("POST", `${bankPath(bankId)}/reflect`, {
      query,
      budget,
      include: { facts: {} },
    }),
  /** Streamed reflect: resolves to the SSE Response (read it with stream.js readSse). */
  reflectStream: async (bankId, query, { budget = "low", signal } = {}) => {
    let response;
    try {
      response = await fetch(`${bankPath(bankId)}/reflect`, {
        method: "POST",
        signal,
        cache: "no-store",
        headers: withCsrf("POST", { "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify({ query, budget, include: { facts: {} }, stream: true }),
      });
    } catch (error) {
      if (error?.name === "AbortError") throw error;
      throw new ApiError(0, "network lost");
    }
    if (!response.ok) throw await errorFrom(response);
    return response;
  },
};

// --- what a bank learns (issue 31): observations, mental models, directives ---

const query = (params) => {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  return search.toString();
};

export const observations = {
  list: (bankId, { limit = 50, offset = 0 } = {}) =>
    request("GET", `${bankPath(bankId)}/memories/list?${query({ type: "observation", limit, offset })}`),
  /** One memory unit (an observation's source). */
  memory: (bankId, memoryId) => request("GET", `${bankPath(bankId)}/memories/${enc(memoryId)}`),
  history: (bankId, memoryId) => request("GET", `${bankPath(bankId)}/memories/${enc(memoryId)}/history`),
  /** Start a consolidation: {operation_id ("" when none started), deduplicated}. */
  consolidate: (bankId) => request("POST", `${bankPath(bankId)}/consolidate`),
  clear: (bankId) => request("DELETE", `${bankPath(bankId)}/observations`),
};

export const mentalModels = {
  list: (bankId, { limit = 100, offset = 0 } = {}) =>
    request("GET", `${bankPath(bankId)}/mental-models?${query({ detail: "content", limit, offset })}`),
  get: (bankId, id) => request("GET", `${bankPath(bankId)}/mental-models/${enc(id)}?detail=content`),
  /** Create one: {mental_model_id, operation_id} (its first refresh is that run). */
  create: (bankId, { name, source_query }) =>
    request("POST", `${bankPath(bankId)}/mental-models`, { name, source_query }),
  /** Start a refresh: {operation_id, status, deduplicated} (409 sooner than its interval). */
  refresh: (bankId, id) => request("POST", `${bankPath(bankId)}/mental-models/${enc(id)}/refresh`),
  history: (bankId, id) => request("GET", `${bankPath(bankId)}/mental-models/${enc(id)}/history`),
  remove: (bankId, id) => request("DELETE", `${bankPath(bankId)}/mental-models/${enc(id)}`),
};

export const directives = {
  /** Every directive, inactive ones too, in the order they are said (priority first). */
  list: (bankId, { limit = 100, offset = 0 } = {}) =>
    request("GET", `${bankPath(bankId)}/directives?${query({ active_only: false, limit, offset })}`),
  create: (bankId, { name, content, priority = 0, is_active = true, tags = null }) =>
    request("POST", `${bankPath(bankId)}/directives`, { name, content, priority, is_active, tags }),
  update: (bankId, id, patch) => request("PATCH", `${bankPath(bankId)}/directives/${enc(id)}`, patch),
  remove: (bankId, id) => request("DELETE", `${bankPath(bankId)}/directives/${enc(id)}`),
};

export const system = {
  health: () => request("GET", "/health"),
};
