// Run against run, or rank against rank (#/diff?a=RUN&ra=RANK&b=RUN&rb=RANK): the Diff view
// (Analyzer.Diff, analyzer/view_diff.c, `kprofctl diff`). Side a is the base, b the other;
// deltas are b - a. The form lists the runs of GET /api/v1/runs and their ranks.

import { ApiError, get, view } from '../api.js';
import { CATEGORIES, stackedBars } from '../charts.js';
import { crumbs, fig, fmt, h, kv, link, section, table } from '../ui.js';
import { dms, ms, num } from './run.js';

const STATUS = { DIFF_STATUS_BOTH: 'both', DIFF_STATUS_NEW: 'new', DIFF_STATUS_VANISHED: 'vanished' };

function ratio(v, r) {
  return r.ratio_defined ? fmt.num(num(v), 3) + '×' : '–';
}

function signed(v) {
  const x = num(v);
  return (x > 0 ? '+' : '') + fmt.count(x);
}

function runLabel(r) {
  return r.id + ' · ' + r.job + (r.name ? ' · ' + r.name : '') + ' (' + (r.ranks || []).length + ' ranks)';
}

// The two sides: as the query says. Without a: the second newest run with data. Without b: the
// newest other run of a's job, else another rank of a, else the newest other run.
function pick(params, runs) {
  const byId = new Map(runs.map((r) => [String(r.id), r]));
  const some = runs.filter((r) => (r.ranks || []).length > 0); // defaults: runs with data
  let a = params.a !== undefined ? String(params.a) : some.length > 1 ? String(some[1].id) : some.length ? String(some[0].id) : '';
  let b = params.b !== undefined ? String(params.b) : '';
  if (b === '' && a !== '') {
    const base = byId.get(a);
    // the newest other run of its job; else another rank of it; else the newest other run
    const other = some.find((r) => String(r.id) !== a && base && r.job === base.job) ||
      (base && (base.ranks || []).length > 1 ? base : some.find((r) => String(r.id) !== a));
    b = other ? String(other.id) : a;
  }
  const ra = byId.get(a);
  const rb = byId.get(b);
  const rankA = params.ra !== undefined ? String(params.ra) : ra && ra.ranks && ra.ranks.length ? String(ra.ranks[0]) : '';
  let rankB = params.rb !== undefined ? String(params.rb) : undefined;
  if (rankB === undefined) {
    const ranks = rb ? (rb.ranks || []).map(String) : [];
    rankB = b !== a && ranks.includes(rankA) ? rankA : ranks.find((x) => x !== rankA || b !== a) || rankA;
  }
  if (a === '') b = '';
  return { a, b, ra: rankA, rb: rankB, byId, asked: params.a !== undefined };
}

function form(sel, runs) {
  const runSel = (name, value) => h('select', { name, 'aria-label': name === 'a' ? 'base run' : 'other run' },
    runs.map((r) => h('option', { value: r.id, selected: String(r.id) === value }, runLabel(r))),
    sel.byId.has(value) || value === '' ? null : h('option', { value, selected: true }, 'run ' + value));
  const rankSel = (name, run, value) => {
    const r = sel.byId.get(run);
    const ranks = r ? (r.ranks || []).map(String) : [];
    if (value !== '' && !ranks.includes(value)) ranks.push(value);
    return h('select', { name, 'aria-label': name === 'ra' ? 'base rank' : 'other rank' },
      ranks.map((x) => h('option', { value: x, selected: x === value }, 'rank ' + x)));
  };
  const f = h('form', { class: 'kp-toolbar kp-diff-form' },
    h('label', {}, 'base run ', runSel('a', sel.a)), h('label', {}, 'rank ', rankSel('ra', sel.a, sel.ra)),
    h('span', {}, 'against'),
    h('label', {}, 'other run ', runSel('b', sel.b)), h('label', {}, 'rank ', rankSel('rb', sel.b, sel.rb)),
    h('button', { type: 'submit' }, 'diff'));
  const go = (keepRanks) => {
    const q = new URLSearchParams();
    for (const k of ['a', 'ra', 'b', 'rb']) {
      if (!keepRanks && (k === 'ra' || k === 'rb')) continue;
      q.set(k, f.elements[k].value);
    }
    location.hash = '#/diff?' + q.toString();
  };
  // a run picked: its ranks are other ranks, let the page pick defaults again
  f.elements.a.addEventListener('change', () => go(false));
  f.elements.b.addEventListener('change', () => {
    const q = new URLSearchParams({ a: f.elements.a.value, ra: f.elements.ra.value, b: f.elements.b.value });
    location.hash = '#/diff?' + q.toString();
  });
  f.addEventListener('submit', (ev) => { ev.preventDefault(); go(true); });
  return f;
}

function sides(d) {
  const side = (s, key, word) => [word, h('span', {},
    link('#/runs/' + s.run_id, ['run ', fig('diff:' + key + '.run_id', s.run_id)]), ' ',
    link('#/runs/' + s.run_id + '/ranks/' + s.rank, ['rank ', fig('diff:' + key + '.rank', s.rank)]), ': ',
    fig('diff:' + key + '.step_avg_ns', s.step_avg_ns, ms(s.step_avg_ns, 3)), ' a step over ',
    fig('diff:' + key + '.n_steps', s.n_steps, fmt.count(s.n_steps)), ' steps')];
  return kv([side(d.base_side, 'base_side', 'base (a)'), side(d.other_side, 'other_side', 'other (b)')]);
}

function stepsPart(d) {
  const steps = d.steps || [];
  const s = section('Step time per category (average per step; delta: b − a)');
  const cats = steps.filter((c) => c.category !== 'total');
  const colour = Object.fromEntries(CATEGORIES.map(([k, , c]) => [k, c]));
  const label = Object.fromEntries(CATEGORIES.map(([k, l]) => [k, l]));
  const body = h('div', { class: 'kp-diff-steps' });
  s.append(body);
  stackedBars(body, 'diff:steps.chart', {
    labels: ['a', 'b'],
    xLabel: 'side',
    fmt: (v) => fmt.nsAsMs(v, 2),
    height: 240,
    series: cats.map((c) => ({ label: label[c.category] || c.category, color: colour[c.category] || '#9c9c9c', values: [num(c.base_avg_ns), num(c.other_avg_ns)] })),
  });
  s.append(table({
    id: 'diff:steps',
    rows: steps,
    pageSize: 20,
    columns: [
      { key: 'category', label: 'category', fmt: (v) => (v === 'total' ? 'step time (total)' : label[v] || v) },
      { key: 'base_avg_ns', label: 'a avg', num: true, fmt: (v) => ms(v, 3) },
      { key: 'other_avg_ns', label: 'b avg', num: true, fmt: (v) => ms(v, 3) },
      { key: 'delta_avg_ns', label: 'delta', num: true, fmt: (v) => dms(v, 3) },
      { key: 'ratio', label: 'b / a', num: true, fmt: ratio },
      { key: 'base_total_ns', label: 'a over its steps', num: true, fmt: (v) => ms(v, 2) },
      { key: 'other_total_ns', label: 'b over its steps', num: true, fmt: (v) => ms(v, 2) },
    ],
  }));
  return s;
}

function namesPart(d, key, title, what) {
  const rows = d[key] || [];
  const t = d[key + '_totals'] || {};
  const p = 'diff:' + key + '_totals';
  const listed = (status) => {
    const idx = [];
    rows.forEach((r, i) => { if (r.status === status) idx.push(i); });
    if (idx.length === 0) return h('span', { class: 'kp-muted' }, 'none');
    return h('ul', { class: 'kp-names' }, idx.slice(0, 30).map((i) => h('li', {},
      fig('diff:' + key + '[' + i + '].name', rows[i].name), ' ',
      h('span', { class: 'kp-muted' }, dms(rows[i].delta_ns, 3), ', ', fmt.count(num(rows[i].delta_calls)), ' calls'))),
    idx.length > 30 ? h('li', { class: 'kp-muted' }, '… ' + (idx.length - 30) + ' more (table above, filter "' + STATUS[status] + '")') : null);
  };
  return section(title,
    h('p', {}, fig(p + '.rows', t.rows, fmt.count(t.rows)), ' ' + what + ' by name: ',
      fig(p + '.n_both', t.n_both, fmt.count(t.n_both)), ' on both sides, ',
      fig(p + '.n_new', t.n_new, fmt.count(t.n_new)), ' new, ',
      fig(p + '.n_vanished', t.n_vanished, fmt.count(t.n_vanished)), ' vanished; total ',
      fig(p + '.base_figures.total_ns', t.base_figures && t.base_figures.total_ns, ms(t.base_figures && t.base_figures.total_ns)), ' → ',
      fig(p + '.other_figures.total_ns', t.other_figures && t.other_figures.total_ns, ms(t.other_figures && t.other_figures.total_ns)), ' (',
      fig(p + '.delta_ns', t.delta_ns, dms(t.delta_ns, 3)), ')',
      num(t.shown) < num(t.rows) ? [' · ', fig(p + '.shown', t.shown), ' shown'] : null, '.'),
    table({
      id: 'diff:' + key,
      rows,
      pageSize: 25,
      columns: [
        { key: 'name', label: 'name' },
        { key: 'status', label: 'status', fmt: (v) => STATUS[v] || v },
        { key: 'base_figures.calls', label: 'a calls', num: true, value: (r) => r.base_figures && r.base_figures.calls, fmt: fmt.count },
        { key: 'other_figures.calls', label: 'b calls', num: true, value: (r) => r.other_figures && r.other_figures.calls, fmt: fmt.count },
        { key: 'delta_calls', label: 'Δ calls', num: true, fmt: signed },
        { key: 'base_figures.total_ns', label: 'a total', num: true, value: (r) => r.base_figures && r.base_figures.total_ns, fmt: (v) => ms(v, 3) },
        { key: 'other_figures.total_ns', label: 'b total', num: true, value: (r) => r.other_figures && r.other_figures.total_ns, fmt: (v) => ms(v, 3) },
        { key: 'delta_ns', label: 'Δ time', num: true, fmt: (v) => dms(v, 3) },
        { key: 'base_figures.mean_ns', label: 'a mean', num: true, value: (r) => r.base_figures && r.base_figures.mean_ns, fmt: (v) => fmt.nsAsUs(num(v), 1) },
        { key: 'other_figures.mean_ns', label: 'b mean', num: true, value: (r) => r.other_figures && r.other_figures.mean_ns, fmt: (v) => fmt.nsAsUs(num(v), 1) },
        { key: 'ratio', label: 'b / a', num: true, fmt: ratio },
      ],
    }),
    h('div', { class: 'kp-diff-lists' },
      h('div', {}, h('h3', {}, 'New in b'), listed('DIFF_STATUS_NEW')),
      h('div', {}, h('h3', {}, 'Vanished from a'), listed('DIFF_STATUS_VANISHED'))));
}

export async function render(root, params) {
  crumbs([['runs', '#/runs'], ['diff', null]]);
  const { runs = [] } = await get('/runs', { limit: 1000 }, 'runs');
  const sel = pick(params, runs);
  root.append(h('h1', {}, 'Diff'), form(sel, runs));
  if (runs.length === 0) {
    root.append(h('p', { class: 'kp-muted' }, 'No runs yet: nothing to diff.'));
    return;
  }
  if (sel.a === '' || sel.b === '' || sel.ra === '' || sel.rb === '') {
    root.append(h('p', { class: 'kp-muted' }, 'Pick the two runs and their ranks.'));
    return;
  }
  if (!sel.asked) {
    root.append(h('p', { class: 'kp-muted' }, 'Pick the base run (a) and the other run (b), a rank of each, and press diff: ' +
      'b against a, per step, per kernel and per operator (as kprofctl diff). Two ranks of one run compare too. ' +
      'Or pick a base run below: it is put against the newest other run of its job.'),
    section('Runs', table({
      id: 'runs:runs',
      rows: runs,
      pageSize: 15,
      rowHref: (r) => '#/diff?a=' + r.id,
      columns: [
        { key: 'id', label: 'base run', num: true },
        { key: 'job', label: 'job' },
        { key: 'name', label: 'name' },
        { key: 'world_size', label: 'world size', num: true, fmt: fmt.count },
        { key: 'created_ns', label: 'created (UTC)', num: true, fmt: (v) => fmt.time(v).replace(/ UTC$/, '') },
      ],
    })));
    return;
  }
  if (sel.a === sel.b && sel.ra === sel.rb) {
    root.append(h('p', { class: 'kp-muted' }, 'Both sides are rank ' + sel.ra + ' of run ' + sel.a +
      ': nothing to compare. Pick another run or another rank.'));
    return;
  }
  crumbs([['runs', '#/runs'], ['run ' + sel.a, '#/runs/' + sel.a], ['diff with run ' + sel.b, null]]);
  let d;
  try {
    d = await view(sel.a, 'diff', { rank: sel.ra, other_run_id: sel.b, other_rank: sel.rb });
  } catch (e) {
    if (!(e instanceof ApiError) || e.status === 401) throw e;
    // keep the form: the reader picks other sides
    root.append(h('div', { class: 'kp-error', role: 'alert', 'data-kp-error': e.status },
      h('strong', {}, 'The diff could not be made'), h('div', {}, 'HTTP ' + e.status + ' ' + (e.code || '')), h('div', {}, e.message)));
    return;
  }
  root.append(
    h('section', { class: 'kp-section kp-verdict kp-diff-verdict' }, h('h2', {}, 'Verdict'),
      h('p', { class: 'kp-verdict-line' }, fig('diff:verdict', d.verdict)), sides(d)),
    d.has_steps ? stepsPart(d) : null,
    d.has_kernels ? namesPart(d, 'kernels', 'Kernels', 'kernels') : null,
    d.has_ops ? namesPart(d, 'ops', 'Operators (host total; totals nest)', 'ops') : null);
}
