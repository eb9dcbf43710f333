// kprof's pages in Debian's headless Chromium, driven by playwright-core (no browser of its
// own: /usr/bin/chromium). tests/it/test_web_ui.py starts the services, imports the runs and
// writes the spec this reads (argv[2], JSON):
//   {base, token, bad_token, artifacts, chromium, pages: [{name, hash, allow?, serve?,
//    expect?, no_figures?}], no_session: [hash], perfetto: [...]}
// First, without a session: the API answers 401 to the page and a page sends the browser to
// the sign-in page. The sign-in page refuses bad_token with a visible message and takes token
// (once: the session's cookie serves every page after). For each page: open it in a fresh
// tab, wait for body[data-kp-state] to leave "loading" ("error" fails with the page's error
// text); any console error or warning, uncaught exception, failed request, HTTP status >= 400
// (but the page's `allow` substrings) or CSP violation fails the page, and so does a document
// served without the Content-Security-Policy that makes the CSP check mean something. Then
// every figure ([data-kp-figure="ALIAS:PATH"]) and every displayed table cell
// ([data-kp-table="ALIAS:PATH"] rows, data-kp-row the index in the array, data-kp-key a field
// or dotted path of the row, "calc:..." for a column the page computes) is compared with the
// API's answer at window.kpSources[ALIAS] (web/js/main.js's convention), fetched again in the
// page with its session: the page must show exactly what the API said (String(value)); a
// page that checks no figure and no cell fails, and so does a table that shows rows but
// checks no cell (a broken convention cannot pass). A full-page screenshot of each page goes
// to artifacts/NAME.png.
// A page with `expect` (the harness's own trials: `serve` replaces files of the UI with
// planted faults) passes when every expected text is among its problems. `no_figures` (why)
// waives the zero-figure rule for a page that shows an empty state ([data-kp-empty]) of a
// known gap of the page, and only that rule.
// Prints one JSON report on stdout: {pages: [{name, hash, state, figures_checked,
// cells_checked, figures: {name: value}, problems: [...]}], login: {...}, ...} and a
// readable summary on stderr; exits 1 on any unexpected problem, 2 when it could not run.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const TIMEOUT_MS = Number(spec.timeout_ms || 120000);
const ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-dev-shm-usage'];

// "ranks[3].step_ns" -> ['ranks', 3, 'step_ns']
function parsePath(p) {
  const out = [];
  for (const part of p.split('.')) {
    const m = part.match(/^([^[\]]*)((?:\[\d+\])*)$/);
    if (!m) throw new Error('bad figure path ' + p);
    if (m[1] !== '') out.push(m[1]);
    for (const idx of m[2].matchAll(/\[(\d+)\]/g)) out.push(Number(idx[1]));
  }
  return out;
}

function resolve(obj, p) {
  let v = obj;
  for (const k of parsePath(p)) {
    if (v === null || v === undefined || typeof v !== 'object' || !(k in v)) return undefined;
    v = v[k];
  }
  return v;
}

// the page's ui.js raw(): String(v), objects as JSON
function raw(v) {
  if (v === undefined || v === null) return '';
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

function watch(page, problems, allowed) {
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') {
      const text = m.text();
      if (!allowed.some((a) => text.includes(a))) problems.push('console ' + m.type() + ': ' + text);
    }
  });
  page.on('pageerror', (e) => problems.push('uncaught exception: ' + e.message));
  page.on('requestfailed', (r) => problems.push('request failed: ' + r.url() + ' ' + (r.failure() || {}).errorText));
  page.on('response', (r) => {
    const u = r.url();
    if (r.status() >= 400 && !allowed.some((a) => u.includes(a))) problems.push('HTTP ' + r.status() + ' ' + u);
  });
}

// The page's CSP violations land in window.kpCsp (read by cspOf).
function recordCsp(page) {
  return page.addInitScript(() => {
    window.kpCsp = [];
    document.addEventListener('securitypolicyviolation', (e) => window.kpCsp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline')));
  });
}

async function cspOf(page) {
  return (await page.evaluate(() => window.kpCsp || [])).map((c) => 'CSP violation: ' + c);
}

// The document's own answer must carry the policy, or a violation could never be reported.
function checkPolicy(resp, problems) {
  const csp = resp ? resp.headers()['content-security-policy'] || '' : '';
  if (!csp.includes("default-src 'self'")) problems.push('the page came without its Content-Security-Policy (got "' + csp + '")');
}

// Without a session: the API is 401 to the page's own fetch, and a page that reads the API
// sends the browser to the sign-in page with the page to come back to.
async function noSession(context, hash) {
  const page = await context.newPage();
  const problems = [];
  watch(page, problems, ['/api/v1/', 'status of 401']);
  await recordCsp(page);
  checkPolicy(await page.goto(spec.base + '/' + hash, { waitUntil: 'load' }), problems);
  let landed = '';
  try {
    await page.waitForFunction(() => location.hash.startsWith('#/login') && document.body.dataset.kpState === 'ready' &&
      document.getElementById('kp-token') !== null, null, { timeout: TIMEOUT_MS });
  } catch (e) {
    problems.push('without a session ' + hash + ' did not end on the sign-in page');
  }
  landed = await page.evaluate(() => location.hash);
  const status = await page.evaluate(async () => (await fetch('/api/v1/runs', { credentials: 'same-origin' })).status);
  if (status !== 401) problems.push('without a session GET /api/v1/runs answered ' + status + ', not 401');
  problems.push(...await cspOf(page));
  await page.close();
  return { hash, landed, api_status: status, problems };
}

async function signIn(context, token, expectOk) {
  const page = await context.newPage();
  const problems = [];
  watch(page, problems, expectOk ? [] : ['/api/v1/session', 'status of 401']);
  await recordCsp(page);
  checkPolicy(await page.goto(spec.base + '/#/login', { waitUntil: 'load' }), problems);
  await page.waitForFunction(() => document.body.dataset.kpState !== 'loading', null, { timeout: TIMEOUT_MS });
  await page.fill('#kp-token', token);
  await page.click('form.kp-login button[type=submit]');
  let message = '';
  if (expectOk) {
    await page.waitForFunction(() => !location.hash.startsWith('#/login'), null, { timeout: TIMEOUT_MS });
  } else {
    await page.waitForFunction(() => document.querySelector('.kp-login-msg').textContent !== '', null, { timeout: TIMEOUT_MS });
    message = await page.textContent('.kp-login-msg');
    if (!await page.isVisible('.kp-login-msg')) problems.push('the refusal "' + message + '" is not visible');
    if (!(await page.evaluate(() => location.hash)).startsWith('#/login')) problems.push('a wrong token left the sign-in page');
    await page.screenshot({ path: path.join(spec.artifacts, 'login-refused.png') });
  }
  problems.push(...await cspOf(page));
  await page.close();
  return { problems, message };
}

async function checkPage(context, p) {
  const page = await context.newPage();
  const problems = [];
  watch(page, problems, p.allow || []);
  await recordCsp(page);
  for (const [file, local] of Object.entries(p.serve || {})) {
    const body = fs.readFileSync(local);
    const type = local.endsWith('.html') ? 'text/html' : 'text/javascript';
    await page.route(spec.base + file, (route) => route.fulfill({ status: 200, contentType: type, body }));
  }
  const t0 = Date.now();
  checkPolicy(await page.goto(spec.base + '/' + p.hash, { waitUntil: 'load' }), problems);
  try {
    await page.waitForFunction(() => document.body.dataset.kpState !== 'loading', null, { timeout: TIMEOUT_MS });
  } catch (e) {
    problems.push('the page did not finish loading in ' + TIMEOUT_MS + ' ms');
  }
  const ms = Date.now() - t0;
  const state = await page.evaluate(() => document.body.dataset.kpState);
  if (state !== 'ready') {
    const err = await page.evaluate(() => (document.querySelector('.kp-error') || document.body).innerText.replace(/\s+/g, ' '));
    problems.push('state ' + state + ': ' + err.slice(0, 500));
  }
  // the page's slowest API call while it loaded (before the checks below read the API again)
  const slowest = await page.evaluate(() => performance.getEntriesByType('resource')
    .filter((e) => e.name.includes('/api/v1/'))
    .reduce((m, e) => (e.duration > m.ms ? { ms: Math.round(e.duration), url: e.name.replace(location.origin, '') } : m), { ms: 0, url: '' }));
  // what the page shows, and the API's answers it came from (fetched in the page: its session)
  const shown = await page.evaluate(async () => {
    const sources = Object.assign({}, window.kpSources || {});
    const answers = {};
    for (const [alias, url] of Object.entries(sources)) {
      const r = await fetch(url, { credentials: 'same-origin' });
      answers[alias] = { status: r.status, body: await r.json() };
    }
    const figures = [...document.querySelectorAll('[data-kp-figure]')].map((e) => ({
      name: e.dataset.kpFigure, value: e.dataset.kpValue, text: e.textContent,
    }));
    const tables = [...document.querySelectorAll('[data-kp-table]')].map((t) => ({
      id: t.dataset.kpTable,
      shown_rows: t.querySelectorAll('tbody tr').length,
      rows: [...t.querySelectorAll('tbody tr[data-kp-row]')].map((tr) => ({
        row: Number(tr.dataset.kpRow),
        cells: [...tr.querySelectorAll('td[data-kp-key]')].map((td) => ({ key: td.dataset.kpKey, value: td.dataset.kpValue })),
      })),
    }));
    const empty = [...document.querySelectorAll('[data-kp-empty]')].map((e) => e.dataset.kpEmpty);
    return { sources, answers, figures, tables, empty, csp: window.kpCsp };
  });
  let figuresChecked = 0;
  let cellsChecked = 0;
  const figures = {};
  for (const f of shown.figures) {
    figures[f.name] = f.value;
    const colon = f.name.indexOf(':');
    const alias = colon < 0 ? null : f.name.slice(0, colon);
    if (alias === 'calc') continue;
    const ans = alias === null ? undefined : shown.answers[alias];
    if (!ans) {
      problems.push('figure ' + f.name + ': no API answer named ' + alias + ' (kpSources has ' + Object.keys(shown.answers).join(', ') + ')');
      continue;
    }
    const want = resolve(ans.body, f.name.slice(colon + 1));
    if (want === undefined) {
      problems.push('figure ' + f.name + ': the API answer has no such field');
    } else if (raw(want) !== f.value) {
      problems.push('figure ' + f.name + ': the page shows ' + f.value + ' (' + f.text.trim() + '), the API says ' + raw(want));
    } else {
      figuresChecked++;
    }
  }
  let cellsComputed = 0;
  for (const t of shown.tables) {
    const colon = t.id.indexOf(':');
    const alias = colon < 0 ? null : t.id.slice(0, colon);
    if (alias === 'calc') continue;
    const ans = alias === null ? undefined : shown.answers[alias];
    const arr = ans ? resolve(ans.body, t.id.slice(colon + 1)) : undefined;
    if (!Array.isArray(arr)) {
      problems.push('table ' + t.id + ': ' + (ans ? 'the API answer has no such array' : 'no API answer named ' + alias +
        ' (kpSources has ' + Object.keys(shown.answers).join(', ') + ')'));
      continue;
    }
    if (t.rows.length !== t.shown_rows) problems.push('table ' + t.id + ': ' + (t.shown_rows - t.rows.length) + ' rows without data-kp-row');
    let checked = 0;
    for (const r of t.rows) {
      const row = arr[r.row];
      if (row === undefined) {
        problems.push('table ' + t.id + ' row ' + r.row + ': not in the API answer (' + arr.length + ' rows)');
        continue;
      }
      for (const c of r.cells) {
        if (c.key.startsWith('calc:')) {
          cellsComputed++; // a column the page computes itself
          continue;
        }
        const want = typeof row === 'object' && row !== null ? resolve(row, c.key) : undefined;
        if (want === undefined) {
          problems.push('table ' + t.id + ' row ' + r.row + ' ' + c.key + ': the API\'s row has no such field (a computed column is named "calc:...")');
        } else if (raw(want) !== c.value) {
          problems.push('table ' + t.id + ' row ' + r.row + ' ' + c.key + ': the page shows ' + c.value + ', the API says ' + raw(want));
        } else {
          checked++;
        }
      }
    }
    if (t.rows.length > 0 && checked === 0) problems.push('table ' + t.id + ': shows ' + t.rows.length + ' rows but no cell of the API was checked');
    cellsChecked += checked;
  }
  problems.push(...shown.csp.map((c) => 'CSP violation: ' + c));
  let waived = null;
  if (figuresChecked + cellsChecked === 0) {
    // A known empty state that shows no figure yet (spec's no_figures says why): waived only
    // where the page does show an empty state ([data-kp-empty]); every other check stands.
    if (p.no_figures && shown.empty.length > 0) waived = p.no_figures + ' (empty state: ' + shown.empty.join(', ') + ')';
    else problems.push('no figure or table cell of the API was checked on this page');
  }
  const shot = path.join(spec.artifacts, p.name + '.png');
  await page.screenshot({ path: shot, fullPage: true });
  if (p.view) {
    // the top of the page as a reader first sees it (docs/img's pictures come from these)
    await page.setViewportSize({ width: 1440, height: p.view });
    await page.screenshot({ path: path.join(spec.artifacts, p.name + '-top.png') });
  }
  await page.close();
  const res = { name: p.name, hash: p.hash, state, ms, slowest_api: slowest, figures_checked: figuresChecked, cells_checked: cellsChecked, cells_computed: cellsComputed, waived, figures, screenshot: shot, problems };
  if (p.expect) {
    // a planted fault: the problems it must cause, and nothing else counts against it
    res.expected = problems;
    res.missed = p.expect.filter((x) => !problems.some((q) => q.includes(x)));
    res.problems = res.missed.map((x) => 'the planted fault was not caught: no problem says "' + x + '"');
  }
  return res;
}

// Perfetto's side of its postMessage handoff, played by a page served in place of
// https://ui.perfetto.dev (the test has no network): it answers 'PING' with 'PONG' as the
// Perfetto UI does, then reads the trace it is given (gunzipped if it is gzip) and puts what
// it got in its title.
const PERFETTO_STUB = `<!doctype html><title>waiting</title><script>
window.addEventListener('message', async (e) => {
  if (e.data === 'PING') { e.source.postMessage('PONG', e.origin); return; }
  if (!e.data || !e.data.perfetto) return;
  const p = e.data.perfetto;
  let bytes = new Uint8Array(p.buffer);
  if (bytes[0] === 0x1f && bytes[1] === 0x8b) {
    bytes = new Uint8Array(await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).arrayBuffer());
  }
  const trace = JSON.parse(new TextDecoder().decode(bytes));
  document.title = JSON.stringify({ events: trace.traceEvents.length, fileName: p.fileName, title: p.title, from: e.origin });
});
</script>`;

// Clicks the trace page's "Open in Perfetto" and checks that the (stub) Perfetto tab got the
// rank's whole trace: as many events as the export has.
async function checkPerfetto(context, p) {
  const problems = [];
  await context.route('https://ui.perfetto.dev/**', (route) => route.fulfill({ status: 200, contentType: 'text/html', body: PERFETTO_STUB }));
  const page = await context.newPage();
  watch(page, problems, []);
  await page.goto(spec.base + '/' + p.hash, { waitUntil: 'load' });
  await page.waitForFunction(() => document.body.dataset.kpState !== 'loading', null, { timeout: TIMEOUT_MS });
  const [tab] = await Promise.all([context.waitForEvent('page'), page.click('[data-kp-action=perfetto]')]);
  await tab.waitForFunction(() => document.title.startsWith('{'), null, { timeout: TIMEOUT_MS });
  const got = JSON.parse(await tab.title());
  const state = await page.evaluate(() => document.querySelector('[data-kp-perfetto]').dataset.kpPerfetto);
  const want = await page.evaluate(async (u) => (await (await fetch(u, { credentials: 'same-origin' })).json()).traceEvents.length, p.export_url);
  if (state !== 'sent') problems.push('the Perfetto status is ' + state + ', not sent');
  if (got.events !== want) problems.push('the Perfetto tab got ' + got.events + ' events, the export has ' + want);
  if (got.from !== new URL(spec.base).origin) problems.push('the trace came from ' + got.from);
  await page.screenshot({ path: path.join(spec.artifacts, p.name + '-perfetto.png'), fullPage: true });
  await tab.close();
  await page.close();
  await context.unroute('https://ui.perfetto.dev/**');
  return { name: p.name + '-perfetto', hash: p.hash, state, got, export_events: want, problems };
}

async function main() {
  fs.mkdirSync(spec.artifacts, { recursive: true });
  const userDir = fs.mkdtempSync(path.join(os.tmpdir(), 'kp-chromium-'));
  const context = await chromium.launchPersistentContext(userDir, {
    executablePath: spec.chromium || '/usr/bin/chromium', headless: true, args: ARGS,
    viewport: { width: 1440, height: 1000 }, ignoreHTTPSErrors: false,
  });
  const report = { pages: [], no_session: [] };
  try {
    for (const hash of spec.no_session || []) report.no_session.push(await noSession(context, hash));
    report.login_refused = await signIn(context, spec.bad_token, false);
    report.login = await signIn(context, spec.token, true);
    for (const p of spec.pages) report.pages.push(await checkPage(context, p));
    report.perfetto = [];
    for (const p of spec.perfetto || []) report.perfetto.push(await checkPerfetto(context, p));
  } finally {
    await context.close();
    fs.rmSync(userDir, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(report) + '\n');
  const bad = [];
  for (const n of report.no_session) bad.push(...n.problems.map((x) => 'no session ' + n.hash + ': ' + x));
  bad.push(...report.login_refused.problems.map((x) => 'sign-in, wrong token: ' + x));
  bad.push(...report.login.problems.map((x) => 'sign-in: ' + x));
  for (const p of report.pages) {
    process.stderr.write(p.name.padEnd(34) + ' ' + String(p.state).padEnd(6) + String(p.ms).padStart(6) + ' ms ' +
      String(p.figures_checked).padStart(5) + ' figures ' + String(p.cells_checked).padStart(6) + ' cells checked' +
      (p.expect ? '  (planted fault: ' + (p.missed.length ? 'MISSED' : 'caught') + ')' : '') +
      (p.waived ? '  (no figure: waived, ' + p.waived + ')' : '') + '\n');
    bad.push(...p.problems.map((x) => p.name + ' (' + p.hash + '): ' + x));
  }
  for (const p of report.perfetto) bad.push(...p.problems.map((x) => p.name + ': ' + x));
  if (bad.length) process.stderr.write('ui_test: ' + bad.length + ' problems:\n  ' + bad.join('\n  ') + '\n');
  process.exit(bad.length === 0 ? 0 : 1);
}

main().catch((e) => {
  process.stderr.write('ui_test: ' + (e.stack || e) + '\n');
  process.exit(2);
});
