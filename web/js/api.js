// The JSON API of kprof-analyzer (docs/web-api.md) as the pages use it: same origin, the
// session cookie (or nothing, on an --allow-anonymous loopback analyzer).

const PREFIX = '/api/v1';

// A refusal of the API: status is the HTTP status, code the JSON error's status
// ("NOT_FOUND", ...), message the server's sentence, which says what to do.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

// The URL of an API path ("/runs/3/views/ops") with a query from params; undefined, null
// and "" values are left out (the view's default), arrays become comma lists.
export function url(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v === undefined || v === null || v === '') continue;
    q.set(k, Array.isArray(v) ? v.join(',') : String(v));
  }
  const s = q.toString();
  return PREFIX + path + (s ? '?' + s : '');
}

async function call(method, path, params, body) {
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(url(path, params), init);
  } catch (e) {
    throw new ApiError(0, 'UNAVAILABLE',
      'the analyzer did not answer (' + e.message + '): check that kprof-analyzer runs');
  }
  let json = null;
  try {
    json = await r.json();
  } catch (e) {
    json = null;
  }
  if (!r.ok) {
    const e = json && json.error ? json.error : { status: '', message: r.status + ' ' + r.statusText };
    throw new ApiError(r.status, e.status, e.message);
  }
  return json;
}

// What the page on screen read, alias -> URL: figures and tables name their value as
// "alias:path" (ui.fig, ui.table), so the browser test fetches the same URL and checks that
// the page shows what the API answered. main.js empties it before each page.
export const sources = {};

// GET an API path; resolves to the JSON answer, rejects with an ApiError. alias: the name
// the page's figures use for this answer (recorded in sources).
export function get(path, params, alias) {
  if (alias) sources[alias] = url(path, params);
  return call('GET', path, params);
}

// A view of a run (breakdown, ops, kernels, prof, roofline, counters, compare, hta, memory,
// distributed, diff): params are the request's fields, as in docs/web-api.md; alias as for
// get, the view's name by default.
export function view(run, name, params, alias = name) {
  return get('/runs/' + encodeURIComponent(run) + '/views/' + name, params, alias);
}

// Opens a browser session with a token (the cookie is HttpOnly: the page never holds it).
export function login(token) {
  return call('POST', '/session', undefined, { token });
}

export function logout() {
  return call('DELETE', '/session');
}
