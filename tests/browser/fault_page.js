// The browser test's own trials (tests/it/test_web_ui.py): a page with one planted fault,
// which ui_test.mjs serves in place of a page of the UI (its `serve`) and must report. It
// reads the runs like a real page and shows them through the figure convention, then plants
// the fault that #/diff?fault=NAME names. Never part of the UI: it lives here, not in web/.

import { get } from '../api.js';
import { fig, h, table } from '../ui.js';

const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

export async function render(root, params) {
  const fault = params.fault;
  const runs = (await get('/runs', undefined, 'runs')).runs;
  const r0 = runs[0];
  let id = fig('runs:runs[0].id', r0.id);
  let rows = runs;
  let idKey = 'id';
  if (fault === 'figure') {
    id = fig('runs:runs[0].id', r0.id + 1); // a figure that is not the API's
  } else if (fault === 'cell') {
    rows = runs.map((r, i) => (i === 0 ? Object.assign({}, r, { job: r.job + '-x' }) : r));
  } else if (fault === 'key') {
    idKey = 'run_id'; // a column that is no field of the API's rows
  } else if (fault === 'alias') {
    id = fig('nosuch:runs[0].id', r0.id);
  } else if (fault === 'console') {
    console.error('planted console error');
  } else if (fault === 'warning') {
    console.warn('planted console warning');
  } else if (fault === 'http') {
    await fetch('/api/v1/runs/999999', { credentials: 'same-origin' });
  } else if (fault === 'request') {
    const ctl = new AbortController();
    const p = fetch('/api/v1/runs', { signal: ctl.signal }).catch(() => null);
    ctl.abort();
    await p;
  } else if (fault === 'csp') {
    root.append(h('div', { style: 'color: red' }, 'an inline style'));
  } else if (fault === 'uncaught') {
    setTimeout(() => { throw new Error('planted uncaught error'); }, 0);
    await sleep(50);
  } else if (fault === 'throw') {
    throw new Error('planted page error');
  }
  if (fault === 'nothing') {
    root.append(h('p', {}, 'no figure here'));
    return;
  }
  root.append(h('p', {}, 'newest run: ', id), table({
    id: 'runs:runs',
    columns: [{ key: idKey, label: 'run', num: true, value: (r) => r[idKey] }, { key: 'job', label: 'job' }],
    rows,
  }));
}
