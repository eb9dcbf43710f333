// The runs (#/runs?job=NAME&limit=N): GET /api/v1/runs, newest first, an exact job filter
// through the API and the table's own filter on what came back.

import { get } from '../api.js';
import { crumbs, fmt, h, section, table } from '../ui.js';

const LIMITS = [50, 100, 200, 500, 1000];

// "RUN_STATE_ENDED" -> "ended", "RUN_SOURCE_IMPORT" -> "import".
export function enumWord(v, prefix) {
  return String(v || '').replace(prefix, '').toLowerCase().replace(/_/g, ' ') || '–';
}

// Up to `max` items of a list, then how many more.
export function some(list, max = 3) {
  const a = list || [];
  return a.length <= max ? a.join(', ') : a.slice(0, max).join(', ') + ' … (' + a.length + ')';
}

// A time in ns as "2026-11-26 22:15:52" (the column says UTC).
function utc(ns) {
  return fmt.time(ns).replace(/ UTC$/, '');
}

export async function render(root, params) {
  const job = params.job || '';
  const limit = LIMITS.includes(Number(params.limit)) ? Number(params.limit) : 100;
  crumbs([['runs', job ? '#/runs' : null]].concat(job ? [['job ' + job, null]] : []));
  const reply = await get('/runs', { job, limit }, 'runs');
  const runs = reply.runs || [];

  const input = h('input', {
    type: 'search', name: 'job', value: job, placeholder: 'job name (exact)', list: 'kp-jobs',
    class: 'kp-filter', 'aria-label': 'job',
  });
  const jobs = [...new Set(runs.map((r) => r.job))].sort();
  const sel = h('select', { name: 'limit', 'aria-label': 'runs at most' },
    LIMITS.map((n) => h('option', { value: n, selected: n === limit }, String(n))));
  const form = h('form', { class: 'kp-toolbar kp-runs-search', role: 'search' },
    h('label', { for: 'kp-job' }, 'Job'), input,
    h('datalist', { id: 'kp-jobs' }, jobs.map((j) => h('option', { value: j }))),
    h('label', {}, 'at most ', sel, ' runs'),
    h('button', { type: 'submit' }, 'search'),
    job ? h('a', { href: '#/runs?limit=' + limit }, 'all jobs') : null);
  input.id = 'kp-job';
  const go = (ev) => {
    if (ev) ev.preventDefault();
    const q = new URLSearchParams();
    if (input.value.trim()) q.set('job', input.value.trim());
    q.set('limit', sel.value);
    location.hash = '#/runs?' + q.toString();
  };
  form.addEventListener('submit', go);
  sel.addEventListener('change', go);

  const note = runs.length >= limit
    ? h('p', { class: 'kp-muted' }, 'The newest ' + limit + ' runs' + (job ? ' of job ' + job : '') +
      '; pick a larger limit or search a job for older ones.')
    : null;
  const body = runs.length === 0
    ? h('p', { class: 'kp-muted' }, job
      ? 'No run of job "' + job + '" (the job filter is an exact name).'
      : 'No runs yet: `kprofctl import` a trace, or profile a job with kprof-run.')
    : table({
      id: 'runs:runs',
      rows: runs,
      sort: { key: 'id', desc: true },
      pageSize: 50,
      rowHref: (r) => '#/runs/' + r.id,
      columns: [
        { key: 'id', label: 'run', num: true },
        { key: 'job', label: 'job' },
        { key: 'name', label: 'name' },
        { key: 'state', label: 'state', fmt: (v) => enumWord(v, 'RUN_STATE_') },
        { key: 'source', label: 'source', fmt: (v) => enumWord(v, 'RUN_SOURCE_') },
        { key: 'world_size', label: 'world size', num: true, fmt: fmt.count },
        {
          key: 'ranks', label: 'ranks present',
          fmt: (v, r) => (v || []).length + ' / ' + (r.world_size || '?') +
            ((v || []).length < r.world_size ? ' (missing ' + (r.world_size - (v || []).length) + ')' : ''),
        },
        { key: 'hosts', label: 'hosts', fmt: (v) => some(v) },
        { key: 'created_ns', label: 'created (UTC)', num: true, fmt: utc },
        { key: 'ended_ns', label: 'ended (UTC)', num: true, fmt: (v) => (v === null || v === undefined ? 'open' : utc(v)) },
        { key: 'batches', label: 'batches', num: true, fmt: fmt.count },
      ],
    });
  root.append(h('h1', {}, job ? 'Runs of job ' + job : 'Runs'), form,
    section('Runs, newest first', note, body));
}
