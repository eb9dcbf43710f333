// kprof's pages in Debian's headless Chromium, driven by playwright-core (no browser of its
// own: /usr/bin/chromium). tests/it/test_web_ui.py starts the services, imports the runs and
// writes the spec this reads (argv[2], JSON):
//   {base, token, bad_token, artifacts, chromium, pages: [{name, hash}]}
// For each page: sign-in (once, through the sign-in page), open it in a fresh tab, wait for
// body[data-kp-state] to leave "loading"; any console error or warning, uncaught exception,
// failed request, HTTP status >= 400 or CSP violation fails the page. Then every figure
// ([data-kp-figure="ALIAS:PATH"]) and every table cell ([data-kp-table="ALIAS:PATH"] rows)
// is compared with the API's answer at window.kpSources[ALIAS] (web/js/main.js's convention):
// the page must show exactly what the API said, and a page that shows no checked figure
// fails (a broken convention cannot pass). A full-page screenshot of each goes to artifacts.
// Prints one JSON report on stdout: {pages: [{name, hash, state, figures_checked,
// cells_checked, figures: {name: value}, problems: [...]}], login: {...}}; exits 1 on any
// problem.

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

async function signIn(context, token, expectOk) {
  const page = await context.newPage();
  const problems = [];
  watch(page, problems, expectOk ? [] : ['/api/v1/session', '401']);
  await page.goto(spec.base + '/#/login', { waitUntil: 'load' });
  await page.waitForFunction(() => document.body.dataset.kpState !== 'loading', null, { timeout: TIMEOUT_MS });
  await page.fill('#kp-token', token);
  await page.click('form.kp-login button[type=submit]');
  let message = '';
  if (expectOk) {
    await page.waitForFunction(() => !location.hash.startsWith('#/login'), null, { timeout: TIMEOUT_MS });
  } else {
    await page.waitForFunction(() => document.querySelector('.kp-login-msg').textContent !== '', null, { timeout: TIMEOUT_MS });
    message = await page.textContent('.kp-login-msg');
    await page.screenshot({ path: path.join(spec.artifacts, 'login-refused.png') });
  }
  await page.close();
  return { problems, message };
}

async function checkPage(context, p) {
  const page = await context.newPage();
  const problems = [];
  watch(page, problems, p.allow || []);
  await page.addInitScript(() => {
    window.kpCsp = [];
    document.addEventListener('securitypolicyviolation', (e) => window.kpCsp.push(e.violatedDirective + ' ' + e.blockedURI));
  });
  const t0 = Date.now();
  await page.goto(spec.base + '/' + p.hash, { waitUntil: 'load' });
  try {
    await page.waitForFunction(() => document.body.dataset.kpState !== 'loading', null, { timeout: TIMEOUT_MS });
  } catch (e) {
    problems.push('the page did not finish loading in ' + TIMEOUT_MS + ' ms');
  }
  const ms = Date.now() - t0;
  const state = await page.evaluate(() => document.body.dataset.kpState);
  if (state !== 'ready') {
    const err = await page.evaluate(() => (document.querySelector('.kp-error') || document.body).innerText);
    problems.push('state ' + state + ': ' + err.slice(0, 500));
  }
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
      rows: [...t.querySelectorAll('tbody tr[data-kp-row]')].map((tr) => ({
        row: Number(tr.dataset.kpRow),
        cells: [...tr.querySelectorAll('td[data-kp-key]')].map((td) => ({ key: td.dataset.kpKey, value: td.dataset.kpValue })),
      })),
    }));
    return { sources, answers, figures, tables, csp: window.kpCsp };
  });
  for (const c of shown.csp) problems.push('CSP violation: ' + c);
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
  for (const t of shown.tables) {
    const colon = t.id.indexOf(':');
    const alias = t.id.slice(0, colon);
    if (alias === 'calc') continue;
    const ans = shown.answers[alias];
    const arr = ans ? resolve(ans.body, t.id.slice(colon + 1)) : undefined;
    if (!Array.isArray(arr)) {
      problems.push('table ' + t.id + ': the API answer has no such array');
      continue;
    }
    for (const r of t.rows) {
      const row = arr[r.row];
      if (row === undefined) {
        problems.push('table ' + t.id + ' row ' + r.row + ': not in the API answer (' + arr.length + ' rows)');
        continue;
      }
      for (const c of r.cells) {
        const want = typeof row === 'object' && row !== null ? resolve(row, c.key) : undefined;
        if (want === undefined) continue; // a column the page computes (not a field of the row)
        if (raw(want) !== c.value) {
          problems.push('table ' + t.id + ' row ' + r.row + ' ' + c.key + ': the page shows ' + c.value + ', the API says ' + raw(want));
        } else {
          cellsChecked++;
        }
      }
    }
  }
  if (figuresChecked + cellsChecked === 0) problems.push('no figure or table cell of the API was checked on this page');
  const shot = path.join(spec.artifacts, p.name + '.png');
  await page.screenshot({ path: shot, fullPage: true });
  if (p.view) {
    // the top of the page as a reader first sees it (docs/img's pictures come from these)
    await page.setViewportSize({ width: 1440, height: p.view });
    await page.screenshot({ path: path.join(spec.artifacts, p.name + '-top.png') });
  }
  await page.close();
  return { name: p.name, hash: p.hash, state, ms, figures_checked: figuresChecked, cells_checked: cellsChecked, figures, screenshot: shot, problems };
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
  const report = { pages: [] };
  try {
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
  const bad = report.login.problems.length + report.login_refused.problems.length +
    report.pages.reduce((n, p) => n + p.problems.length, 0) +
    report.perfetto.reduce((n, p) => n + p.problems.length, 0);
  process.exit(bad === 0 ? 0 : 1);
}

main().catch((e) => {
  process.stderr.write('ui_test: ' + (e.stack || e) + '\n');
  process.exit(2);
});
