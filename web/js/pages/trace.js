// A rank's trace: download it (the export, Chrome trace JSON as Kineto writes it, plain or
// gzip) or open it in the Perfetto UI through Perfetto's documented postMessage handoff
// (https://perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui): this page opens
// ui.perfetto.dev in a new tab, sends 'PING' every 50 ms until that tab answers 'PONG', then
// posts {perfetto: {buffer, title, fileName}}. The trace goes from the user's browser to that
// tab only; kprof's server never talks to Perfetto.
//
// Testing without network: stub window.open to return a fake window ({closed: false,
// postMessage(msg, origin) {...}}), click [data-kp-action=perfetto], see 'PING' posted to
// PERFETTO_ORIGIN, dispatch `new MessageEvent('message', {data: 'PONG', origin:
// PERFETTO_ORIGIN})` on window, and the fake window receives the trace; the status element
// [data-kp-perfetto] says opening, fetching, waiting, sent or failed.

import { get, url } from '../api.js';
import { crumbs, fig, fmt, h, kv, link, section } from '../ui.js';
import { hostList, note, picker, toolbar } from './rank_util.js';

export const PERFETTO_ORIGIN = 'https://ui.perfetto.dev';
const PING_MS = 50;
const PONG_TIMEOUT_MS = 60000;

export async function render(root, params) {
  const run = params.run;
  const info = await get('/runs/' + run, undefined, 'run');
  const ranks = info.ranks || [];
  if (params.rank !== undefined && !/^\d{1,10}$/.test(params.rank)) {
    throw new Error('rank "' + params.rank + '" is not a rank number: #/runs/' + run + '/trace?rank=N');
  }
  const rank = params.rank !== undefined ? Number(params.rank) : ranks.length ? ranks[0] : 0;
  if (ranks.length && !ranks.includes(rank)) {
    throw new Error('run ' + run + ' has no rank ' + rank + ': its ranks are ' + ranks.join(', '));
  }
  crumbs([['runs', '#/runs'], ['run ' + run, '#/runs/' + run], ['rank ' + rank, '#/runs/' + run + '/ranks/' + rank], ['trace', null]]);
  const fileBase = 'kprof-run' + run + '-rank' + rank + '.json';
  const gzUrl = url('/runs/' + run + '/export', { rank, format: 'json.gz' });
  const jsonUrl = url('/runs/' + run + '/export', { rank, format: 'json' });

  const status = h('div', { class: 'kp-trace-status', role: 'status', 'data-kp-perfetto': 'idle' });
  const button = h('button', { type: 'button', 'data-kp-action': 'perfetto' }, 'Open in Perfetto');
  let cached = null; // the gzip export, once read: a second click sends it again
  button.addEventListener('click', () => {
    let over = false; // sent or failed: the read's later progress must not overwrite that
    const say = (state, text) => {
      if (over) return;
      over = state === 'sent' || state === 'failed';
      status.dataset.kpPerfetto = state;
      status.classList.toggle('kp-bad', state === 'failed');
      status.textContent = text;
    };
    // window.open first, in the click itself: browsers block a tab opened after an await
    const win = window.open(PERFETTO_ORIGIN);
    if (!win) {
      say('failed', 'The browser blocked the new tab: allow pop-ups for this page, or download the trace and open it at ' + PERFETTO_ORIGIN + '.');
      return;
    }
    say('opening', 'Opening ' + PERFETTO_ORIGIN + '…');
    button.disabled = true;
    const buffer = cached ? Promise.resolve(cached) : readTrace(gzUrl, (n) => say('fetching', 'Reading the trace from kprof: ' + fmt.bytes(n) + '…'));
    buffer.then((b) => {
      cached = b;
      size.textContent = fmt.bytes(b.byteLength) + ' (gzip)';
      say('waiting', 'Read ' + fmt.bytes(b.byteLength) + '; waiting for the Perfetto tab to be ready…');
    }, () => {});
    handOff(win, buffer, {
      title: 'kprof run ' + run + ' rank ' + rank + (info.job ? ' (' + info.job + ')' : ''),
      fileName: fileBase + '.gz',
    }).then((b) => say('sent', 'Sent ' + fmt.bytes(b.byteLength) + ' to the Perfetto tab: switch to it.'),
      (e) => say('failed', e.message))
      .finally(() => { button.disabled = false; });
  });
  const size = h('span', { 'data-kp-trace-size': '' }, 'known once read (the export is streamed)');

  root.append(h('h1', {}, 'Trace: run ' + run + (info.job ? ' (' + info.job + ')' : '') + ', rank ' + rank),
    h('nav', { class: 'kp-rank-nav' },
      link('#/runs/' + run + '/ranks/' + rank, 'this rank\'s views'),
      link('#/runs/' + run + '/hta?rank=' + rank, 'HTA analyses'),
      link('#/runs/' + run, 'the run across ranks')),
    ranks.length > 1 ? toolbar(picker('Rank', ranks.map((r) => [String(r), String(r)]), String(rank),
      (v) => '#/runs/' + run + '/trace?rank=' + v, { 'data-kp-option': 'rank' })) : null,
    section('Download',
      h('div', { class: 'kp-trace-actions' },
        h('a', { href: gzUrl, download: fileBase + '.gz', class: 'kp-button', 'data-kp-download': 'json.gz' }, 'Download ' + fileBase + '.gz'),
        h('a', { href: jsonUrl, download: fileBase, 'data-kp-download': 'json' }, 'or uncompressed ' + fileBase)),
      note('The rank\'s whole trace as Chrome trace JSON in Kineto\'s dialect (kprofctl export): it opens in Perfetto, ' +
        'chrome://tracing, HTA and the TensorBoard plugin, and kprofctl import reads it back. Run ' + run + ' has ' +
        (ranks.length || '?') + ' rank' + (ranks.length === 1 ? '' : 's') + '; each rank is one file.'),
      kv([
        ['Run', fig('run:id', info.id)],
        ['World size', fig('run:world_size', info.world_size, fmt.count(info.world_size))],
        ['Hosts', fig('run:hosts', info.hosts, hostList(info.hosts || []))],
        ['Compressed size', size],
      ])),
    section('Open in Perfetto',
      h('div', { class: 'kp-trace-actions' }, button, status),
      note('This opens ' + PERFETTO_ORIGIN + ' in a new tab, reads the trace from kprof in this browser, and hands it to ' +
        'that tab with postMessage, as Perfetto documents. The trace goes from your browser straight to the Perfetto ' +
        'page, which loads it locally; kprof sends nothing to Perfetto, and nothing else leaves this page. Your browser ' +
        'must reach ' + PERFETTO_ORIGIN + ' (if it cannot, download the trace and open it in a Perfetto UI you can reach).')));
}

// The export as an ArrayBuffer, reporting the bytes read so far.
async function readTrace(u, progress) {
  const r = await fetch(u, { credentials: 'same-origin' });
  if (!r.ok) {
    let msg = 'the export failed: ' + r.status + ' ' + r.statusText;
    try {
      const j = await r.json();
      if (j && j.error) msg = 'the export failed: ' + j.error.message;
    } catch (e) {
      // not JSON: keep the status line
    }
    throw new Error(msg);
  }
  if (!r.body || !r.body.getReader) return r.arrayBuffer();
  const reader = r.body.getReader();
  const parts = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    n += value.byteLength;
    progress(n);
  }
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out.buffer;
}

// Perfetto's handshake with the window win opened on PERFETTO_ORIGIN: 'PING' every 50 ms
// until a 'PONG' from that origin, then the trace (when buffer has resolved). Resolves to
// the buffer sent; rejects when the tab is closed, never answers, or the trace fails.
export function handOff(win, buffer, { title, fileName }) {
  return new Promise((resolve, reject) => {
    let ready = false;
    let trace = null;
    let finished = false;
    const started = Date.now();
    const finish = (err) => {
      if (finished) return;
      finished = true;
      clearInterval(timer);
      window.removeEventListener('message', onMessage);
      if (err) reject(err);
      else resolve(trace);
    };
    const send = () => {
      if (!ready || !trace || finished) return;
      win.postMessage({ perfetto: { buffer: trace, title, fileName } }, PERFETTO_ORIGIN);
      finish(null);
    };
    function onMessage(ev) {
      // only the Perfetto tab's answer (a real one always has its window as source)
      if (ev.origin !== PERFETTO_ORIGIN || ev.data !== 'PONG' || (ev.source && ev.source !== win)) return;
      ready = true;
      clearInterval(timer);
      send();
    }
    window.addEventListener('message', onMessage);
    const timer = setInterval(() => {
      if (win.closed) {
        finish(new Error('The Perfetto tab was closed (or this page cannot reach it) before it got the trace: ' +
          'open it again, or download the trace.'));
      } else if (Date.now() - started > PONG_TIMEOUT_MS) {
        finish(new Error(PERFETTO_ORIGIN + ' did not answer in ' + PONG_TIMEOUT_MS / 1000 + ' s: can this browser reach it? ' +
          'Download the trace and open it there instead.'));
      } else {
        win.postMessage('PING', PERFETTO_ORIGIN);
      }
    }, PING_MS);
    buffer.then((b) => {
      trace = b;
      send();
    }, (e) => finish(e));
  });
}
