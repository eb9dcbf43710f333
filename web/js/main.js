// The router of kprof's pages: the URL's fragment names a page and its parameters
// (#/runs/3/ranks/0?tab=ops), main.js loads the page's module and lets it render.
//
// A page module (js/pages/NAME.js) exports `async function render(root, params)`: root is an
// empty element already in the document (charts can measure it), params the route's
// parameters (run and rank as numbers) and the fragment's query (strings). It throws an
// ApiError or Error to show an error; body[data-kp-state] is then "error", else "ready" once
// render resolves (the browser test waits for it), "loading" before.
//
// Figures the browser test checks (tests/browser): every number a page takes from the API is
// shown through ui.fig(name, value) with name "ALIAS:PATH" (ALIAS a key of api.sources, the
// answer it came from; PATH a JSON path in it, "average.kernel_ns", "ranks[3].step_ns"), and
// every table of API rows through ui.table({id: "ALIAS:PATH"}) (PATH the array; a row's
// data-kp-row its index there, a cell's data-kp-key its field). Figures a page computes
// itself (a sum, a ratio) are named "calc:NAME" and not looked up, and so are table columns it
// computes (key "calc:NAME"); any other column must be a field of the API's rows.

import { ApiError, logout, sources } from './api.js';
import { crumbs, errorBox, h, loading } from './ui.js';

const ROUTES = [
  [/^\/runs$/, 'runs', []],
  [/^\/runs\/(\d{1,10})$/, 'run', ['run']],
  [/^\/runs\/(\d{1,10})\/ranks\/(\d{1,10})$/, 'rank', ['run', 'rank']],
  [/^\/runs\/(\d{1,10})\/hta$/, 'hta', ['run']],
  [/^\/runs\/(\d{1,10})\/trace$/, 'trace', ['run']],
  [/^\/diff$/, 'diff', []],
  [/^\/login$/, 'login', []],
];

let generation = 0;

function parse(hash) {
  const s = hash.replace(/^#/, '') || '/runs';
  const q = s.indexOf('?');
  const path = (q < 0 ? s : s.slice(0, q)).replace(/\/+$/, '') || '/runs';
  const params = Object.fromEntries(new URLSearchParams(q < 0 ? '' : s.slice(q + 1)));
  for (const [re, name, keys] of ROUTES) {
    const m = path.match(re);
    if (m) {
      keys.forEach((k, i) => { params[k] = Number(m[i + 1]); });
      return { name, params };
    }
  }
  return { name: null, params, path };
}

async function show() {
  const gen = ++generation;
  const main = document.getElementById('kp-main');
  const route = parse(location.hash);
  document.body.dataset.kpState = 'loading';
  for (const k of Object.keys(sources)) delete sources[k];
  window.kpSources = sources;
  crumbs([]);
  document.getElementById('kp-logout').hidden = route.name === 'login';
  if (route.name === null) {
    main.replaceChildren(errorBox(new Error('no page at ' + route.path + ': the runs are at #/runs')));
    document.body.dataset.kpState = 'error';
    return;
  }
  const root = h('div', { class: 'kp-page', 'data-kp-page': route.name });
  main.replaceChildren(loading(), root);
  try {
    const mod = await import('./pages/' + route.name + '.js');
    await mod.render(root, route.params);
    if (gen !== generation) return;
    main.firstChild.remove();
    document.body.dataset.kpState = 'ready';
  } catch (e) {
    if (gen !== generation) return;
    if (e instanceof ApiError && e.status === 401 && route.name !== 'login') {
      location.hash = '#/login?next=' + encodeURIComponent(location.hash || '#/runs');
      return;
    }
    main.replaceChildren(errorBox(e));
    document.body.dataset.kpState = 'error';
  }
}

document.getElementById('kp-logout').addEventListener('click', async () => {
  try {
    await logout();
  } finally {
    location.hash = '#/login';
  }
});
window.addEventListener('hashchange', show);
show();
