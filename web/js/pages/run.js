// One run across its ranks (#/runs/:run?late_pct=&excess_pct=&step_pct=&step=): the run's
// facts (GET /api/v1/runs/{run}) and the Compare view (Analyzer.Compare, analyzer/compare.h):
// the straggler verdict with its evidence, each rank's average step split, rank x step heat
// maps of step time and of lateness at the collectives, the steps and the ranks. One compare
// call answers everything; charts are canvas and tables paged, so 1024 ranks stay fast.

import { ApiError, get, view } from '../api.js';
import { stackedBars, heatmap } from '../charts.js';
import { crumbs, fig, fmt, h, kv, link, section, table } from '../ui.js';
import { enumWord, some } from './runs.js';

// The API's doubles: numbers, or "NaN" / "Infinity" strings (docs/web-api.md); int64 beyond
// 2^53 as decimal strings.
export function num(v) {
  return typeof v === 'number' ? v : v === null || v === undefined ? NaN : Number(v);
}

// ns as ms, "–" for NaN.
export function ms(v, digits = 2) {
  const x = num(v);
  return Number.isFinite(x) ? fmt.nsAsMs(x, digits) : '–';
}

// A signed ns delta: in µs under a millisecond (no "-0.000 ms"), else in ms.
export function dms(v, digits = 3) {
  const x = num(v);
  if (!Number.isFinite(x)) return '–';
  if (x === 0) return '0';
  return (x > 0 ? '+' : '') + (Math.abs(x) < 1e6 ? fmt.nsAsUs(x, 1) : fmt.nsAsMs(x, digits));
}

// A fraction as a signed percentage.
function spct(v) {
  const x = num(v);
  if (!Number.isFinite(x)) return '–';
  return (x > 0 ? '+' : '') + fmt.fracAsPct(x, 1);
}

// Ranks as ranges: [1, 3, 5, 6, 7] -> "1, 3, 5..7".
export function ranges(list) {
  const out = [];
  const a = (list || []).map(Number);
  for (let i = 0; i < a.length;) {
    let j = i;
    while (j + 1 < a.length && a[j + 1] === a[j] + 1) j++;
    out.push(j > i + 1 ? a[i] + '..' + a[j] : j === i + 1 ? a[i] + ', ' + a[j] : String(a[i]));
    i = j + 1;
  }
  return out.join(', ');
}

const CAUSES = {
  COMPARE_CAUSE_COMPUTE: 'compute (kernels other than collectives)',
  COMPARE_CAUSE_HOST: 'host (data loading)',
  COMPARE_CAUSE_LAUNCH: 'launch (CUDA runtime calls)',
  COMPARE_CAUSE_UNSPECIFIED: '–',
};

const SPLIT = [
  ['compute_ns', 'compute', '#4e79a7'],
  ['collective_ns', 'collective', '#76b7b2'],
  ['host_ns', 'host (data loading)', '#edc948'],
  ['launch_ns', 'launch', '#59a14f'],
  ['other_ns', 'other (copies, memsets)', '#9c9c9c'],
];

// The compare thresholds as the page's query names them, and the view's defaults
// (CompareRequest: absent thresholds are 2, 5, 50 %).
const THRESHOLDS = [
  ['late_pct', 'late %', 'a rank is late in a step when it arrives this much of the step after the median rank'],
  ['excess_pct', 'excess %', 'a late rank is a straggler when one cause takes this much of a step more than the median rank\'s'],
  ['step_pct', 'late steps %', 'a rank is a straggler only when late in at least this share of the steps'],
];

const rankHref = (run, rank) => '#/runs/' + run + '/ranks/' + rank;

function compareParams(params) {
  const p = {};
  if (THRESHOLDS.some(([k]) => params[k] !== undefined && params[k] !== '')) {
    // the view takes the three together (an absent one would be 0)
    const dflt = { late_pct: 2, excess_pct: 5, step_pct: 50 };
    for (const [k] of THRESHOLDS) {
      const v = params[k] !== undefined && params[k] !== '' ? params[k] : dflt[k];
      p['thresholds.' + k] = v;
    }
  }
  if (params.step !== undefined && params.step !== '') {
    p.has_step = true;
    p.step = params.step;
  }
  return p;
}

function facts(run, info, cmp) {
  const present = info.ranks || [];
  const world = num(info.world_size);
  const missing = cmp ? cmp.missing_ranks || [] : [];
  let missingFig;
  if (cmp) {
    missingFig = missing.length === 0 ? h('span', {}, fig('compare:missing_ranks', missing, 'none'))
      : h('span', { class: 'kp-bad-text' }, fig('calc:missing_count', missing.length, String(missing.length)),
        ' of ', fig('compare:world_size', cmp.world_size, fmt.count(cmp.world_size)), ': ',
        fig('compare:missing_ranks', missing, ranges(missing)));
  } else {
    // without a comparison (no ranks yet): what the run's own facts say
    const have = new Set(present.map(Number));
    const miss = [];
    for (let r = 0; r < world && miss.length <= 100000; r++) if (!have.has(r)) miss.push(r);
    missingFig = miss.length === 0 ? 'none' : h('span', { class: 'kp-bad-text' }, fig('calc:missing_ranks', miss, miss.length + ': ' + ranges(miss)));
  }
  return section('Run ' + run,
    kv([
      ['job', h('span', {}, fig('run:job', info.job), ' ', link('#/runs?job=' + encodeURIComponent(info.job), 'other runs of this job', { class: 'kp-small' }))],
      ['name', fig('run:name', info.name, info.name || '–')],
      ['state', fig('run:state', info.state, enumWord(info.state, 'RUN_STATE_'))],
      ['source', fig('run:source', info.source, enumWord(info.source, 'RUN_SOURCE_'))],
      ['created', fig('run:created_ns', info.created_ns, fmt.time(info.created_ns))],
      ['ended', fig('run:ended_ns', info.ended_ns, info.ended_ns === null || info.ended_ns === undefined ? 'open' : fmt.time(info.ended_ns))],
      ['batches', fig('run:batches', info.batches, fmt.count(info.batches))],
      ['ranks present', h('span', {}, fig('calc:ranks_present', present.length, fmt.count(present.length)), ' of world size ',
        fig('run:world_size', info.world_size, fmt.count(info.world_size)),
        present.length > 0 && ranges(present).length <= 200 ? [' (', fig('run:ranks', present, ranges(present)), ')'] : null)],
      ['missing ranks', missingFig],
      ['hosts', (info.hosts || []).length === 0 ? fig('run:hosts', info.hosts, 'unknown (not recorded)')
        : h('span', {}, fig('calc:hosts', info.hosts.length, String(info.hosts.length)), ': ', fig('run:hosts', info.hosts, some(info.hosts, 8)))],
    ]),
    h('p', { class: 'kp-links' },
      link('#/runs/' + run + '/hta', 'HTA analyses'), ' · ',
      link('#/runs/' + run + '/trace', 'trace (export, Perfetto)'), ' · ',
      link('#/diff?a=' + run + (present.length ? '&ra=' + present[0] : ''), 'diff with…'),
      present.length ? [' · ', link(rankHref(run, present[0]), 'rank ' + present[0])] : null));
}

function verdict(run, cmp) {
  const str = cmp.stragglers || [];
  const ok = str.length === 0 && num(cmp.waited_for) < 0;
  const parts = [h('p', { class: 'kp-verdict-line' }, fig('compare:verdict', cmp.verdict))];
  str.forEach((s, i) => {
    const p = 'compare:stragglers[' + i + ']';
    const steps = s.steps || [];
    parts.push(h('div', { class: 'kp-straggler', 'data-kp-straggler': s.rank },
      h('h3', {}, 'Straggler ',
        link(rankHref(run, s.rank), ['rank ', fig(p + '.rank', s.rank)]), ': ',
        fig(p + '.cause', s.cause, CAUSES[s.cause] || enumWord(s.cause, 'COMPARE_CAUSE_'))),
      kv([
        ['late by (mean over its late steps)', fig(p + '.late_ns', s.late_ns, ms(s.late_ns, 3))],
        ['most at one collective', fig(p + '.max_late_ns', s.max_late_ns, ms(s.max_late_ns, 3))],
        ['late steps', h('span', {}, fig('calc:' + i + '.late_steps', steps.length, String(steps.length)), ': ',
          fig(p + '.steps', steps, steps.length > 40 ? steps.slice(0, 40).join(', ') + ' …' : steps.join(', ')))],
      ]),
      table({
        id: p + '.evidence',
        rows: s.evidence || [],
        pageSize: 10,
        columns: [
          { key: 'cause', label: 'cause (per step, its late steps)', fmt: (v) => CAUSES[v] || v },
          { key: 'own_ns', label: 'rank ' + s.rank, num: true, fmt: (v) => ms(v, 3) },
          { key: 'median_ns', label: 'median rank', num: true, fmt: (v) => ms(v, 3) },
          { key: 'excess_ns', label: 'excess', num: true, fmt: (v) => dms(v, 3) },
        ],
      }),
      h('p', { class: 'kp-links' }, link(rankHref(run, s.rank), 'rank ' + s.rank + '\'s breakdown'), ' · ',
        link('#/diff?a=' + run + '&ra=' + s.rank + '&b=' + run + '&rb=' + medianRank(cmp, s.rank), 'diff against the median rank'))));
  });
  if (num(cmp.waited_for) >= 0) {
    parts.push(h('p', {}, 'The others wait for ', link(rankHref(run, cmp.waited_for), ['rank ', fig('compare:waited_for', cmp.waited_for)]),
      ' at the collectives.'));
  }
  if (num(cmp.hta_rank) >= 0) {
    parts.push(h('p', { class: 'kp-muted' }, 'HTA\'s straggler metric names ',
      link(rankHref(run, cmp.hta_rank), ['rank ', fig('compare:hta_rank', cmp.hta_rank)]), ' in ',
      fig('compare:hta_rank_steps', cmp.hta_rank_steps), num(cmp.hta_rank_steps) === 1 ? ' step (' : ' steps (', link('#/runs/' + run + '/hta', 'HTA'), ').'));
  }
  return h('section', { class: 'kp-section kp-verdict' + (ok ? ' kp-ok' : ''), 'data-kp-verdict': ok ? 'ok' : 'flagged' },
    h('h2', {}, (cmp.ranks || []).length < 2 ? 'Verdict' : ok ? 'No straggler' : str.length === 1 ? 'One straggler' : str.length ? str.length + ' stragglers' : 'A late rank'),
    parts);
}

// The rank closest to the median step time (not `not`), the diff's natural counterpart.
function medianRank(cmp, not) {
  let best = null;
  for (const r of cmp.ranks || []) {
    if (r.rank === not || r.straggler || r.late) continue;
    const d = Math.abs(num(r.vs_median));
    if (best === null || d < best.d) best = { d, rank: r.rank };
  }
  return best ? best.rank : not;
}

function thresholdsForm(run, cmp, params) {
  const t = cmp.thresholds || {};
  const inputs = THRESHOLDS.map(([k, label, title]) => {
    const el = h('input', { type: 'number', name: k, min: 0, max: k === 'step_pct' ? 100 : 10000, step: 'any', value: num(t[k]), title, class: 'kp-num-in' });
    return [h('label', { title }, label, ' ', el), el];
  });
  const step = h('input', { type: 'number', name: 'step', min: 0, step: 1, value: params.step || '', placeholder: 'all', class: 'kp-num-in' });
  const form = h('form', { class: 'kp-toolbar' }, h('strong', {}, 'Thresholds'), inputs.map((x) => x[0]),
    h('label', { title: 'compare only this step (the N of ProfilerStep#N)' }, 'only step ', step),
    h('button', { type: 'submit' }, 'compare'),
    link('#/runs/' + run, 'defaults'),
    h('span', { class: 'kp-muted' }, 'applied: late ', fig('compare:thresholds.late_pct', t.late_pct), ' %, excess ',
      fig('compare:thresholds.excess_pct', t.excess_pct), ' %, steps ', fig('compare:thresholds.step_pct', t.step_pct), ' %'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [, el] of inputs) q.set(el.name, el.value);
    if (step.value !== '') q.set('step', step.value);
    location.hash = '#/runs/' + run + '?' + q.toString();
  });
  return form;
}

function charts(run, cmp, body, params) {
  const ranks = cmp.ranks || [];
  const steps = cmp.steps || [];
  const labels = ranks.map((r) => r.rank);
  const split = section((params.step !== undefined && params.step !== '' ? 'Step ' + params.step + ' per rank' : 'Average step per rank') + ' (click a bar for the rank)');
  body.append(split);
  // a few ranks: bars of a readable width, not the page's
  const box = h('div');
  box.style.maxWidth = Math.max(480, 110 + ranks.length * 56) + 'px';
  split.append(box);
  stackedBars(box, 'compare:ranks.split', {
    labels,
    xLabel: 'rank',
    fmt: (v) => fmt.nsAsMs(v, 2),
    series: SPLIT.map(([k, label, color]) => ({ label, color, values: ranks.map((r) => num(r[k]) || 0) })),
    height: 300,
    onClick: (i) => { location.hash = rankHref(run, ranks[i].rank); },
  });
  if (steps.length === 0) return;
  const maps = section('Ranks × steps');
  body.append(maps);
  const order = h('select', { 'aria-label': 'order of the rows' },
    h('option', { value: 'rank' }, 'by rank'),
    h('option', { value: 'late' }, 'latest first (mean lateness)'),
    h('option', { value: 'step' }, 'slowest first (step time)'));
  const mode = h('select', { 'aria-label': 'step time colour' },
    h('option', { value: 'abs' }, 'step time'),
    h('option', { value: 'rel' }, 'against the step\'s median'));
  const holder = h('div', { class: 'kp-maps' });
  maps.append(h('div', { class: 'kp-toolbar' }, h('label', {}, 'rows ', order), h('label', {}, 'step-time colour ', mode),
    h('span', { class: 'kp-muted' }, 'Grey: the rank has no such step. Click a row for the rank.')), holder);
  const time = ranks.map((r) => (r.step_time_ns || []).map(num));
  const late = ranks.map((r) => (r.step_late_ns || []).map(num));
  const median = steps.map((st) => num(st.step_median_ns));
  const cell = (rows, r, c) => (c < rows[r].length ? rows[r][c] : NaN);
  const draw = () => {
    const idx = ranks.map((_, i) => i);
    if (order.value === 'late') idx.sort((x, y) => num(ranks[y].late_ns) - num(ranks[x].late_ns) || x - y);
    if (order.value === 'step') idx.sort((x, y) => num(ranks[y].step_ns) - num(ranks[x].step_ns) || x - y);
    const rel = mode.value === 'rel';
    const stepLabel = (c) => 'step ' + steps[c].step;
    const rankLabel = (r) => 'rank ' + ranks[idx[r]].rank;
    const go = (r) => { location.hash = rankHref(run, ranks[idx[r]].rank); };
    // side by side where the page is wide enough (run.css .kp-maps)
    const left = h('div', { class: 'kp-map' });
    const right = h('div', { class: 'kp-map' });
    holder.replaceChildren(left, right);
    if (time.some((row) => row.length > 0)) {
      heatmap(left, 'compare:ranks.step_time_ns', {
        title: rel ? 'Step time against the step\'s median rank' : 'Step time',
        rows: ranks.length, cols: steps.length,
        value: rel ? (r, c) => cell(time, idx[r], c) / median[c] - 1 : (r, c) => cell(time, idx[r], c),
        rowLabel: rankLabel, colLabel: stepLabel,
        fmt: rel ? (v) => (v > 0 ? '+' : '') + fmt.fracAsPct(v, 2) : (v) => fmt.nsAsMs(v, 2),
        onClick: go,
      });
    }
    heatmap(right, 'compare:ranks.step_late_ns', {
      title: 'Lateness at the collectives (after the median rank, a step\'s sum)',
      rows: ranks.length, cols: steps.length, lo: 0,
      value: (r, c) => cell(late, idx[r], c),
      rowLabel: rankLabel, colLabel: stepLabel, fmt: (v) => fmt.nsAsMs(v, 3),
      onClick: go,
    });
  };
  // ?rows=late|step and ?colour=rel pick them in a link
  if (['late', 'step'].includes(params.rows)) order.value = params.rows;
  if (params.colour === 'rel') mode.value = 'rel';
  order.addEventListener('change', draw);
  mode.addEventListener('change', draw);
  draw();
}

function stepsTable(cmp) {
  return section('Steps',
    table({
      id: 'compare:steps',
      rows: cmp.steps || [],
      pageSize: 25,
      columns: [
        { key: 'step', label: 'step', num: true },
        { key: 'ranks', label: 'ranks', num: true, fmt: fmt.count },
        { key: 'collectives', label: 'collectives', num: true, fmt: fmt.count },
        { key: 'step_median_ns', label: 'step median', num: true, fmt: (v) => ms(v) },
        { key: 'step_max_ns', label: 'step max', num: true, fmt: (v) => ms(v) },
        { key: 'step_ratio', label: 'max / median', num: true, fmt: (v) => (num(v) ? fmt.num(num(v), 3) : '–') },
        { key: 'collective_median_ns', label: 'collective median', num: true, fmt: (v) => ms(v) },
        { key: 'collective_max_ns', label: 'collective max', num: true, fmt: (v) => ms(v) },
        { key: 'collective_ratio', label: 'max / median', num: true, fmt: (v) => (num(v) ? fmt.num(num(v), 3) : '–') },
        { key: 'last_rank', label: 'last rank', num: true, fmt: (v) => (num(v) < 0 ? '–' : String(v)) },
        { key: 'hta_rank', label: 'HTA\'s rank', num: true, fmt: (v) => (num(v) < 0 ? '–' : String(v)) },
      ],
    }));
}

function ranksTable(run, cmp) {
  const flag = (word) => (v) => (v ? word : '');
  return section('Ranks',
    h('p', { class: 'kp-muted' }, 'Per rank, the median over its steps (lateness: the mean); vs median: its step time against the median rank\'s (',
      fig('compare:step_median_ns', cmp.step_median_ns, ms(cmp.step_median_ns)), ').'),
    table({
      id: 'compare:ranks',
      rows: cmp.ranks || [],
      sort: { key: 'late_ns', desc: true },
      pageSize: 50,
      rowHref: (r) => rankHref(run, r.rank),
      columns: [
        { key: 'rank', label: 'rank', num: true },
        { key: 'host', label: 'host', fmt: (v) => v || '–' },
        { key: 'node', label: 'node', num: true, fmt: (v) => (num(v) < 0 ? '–' : String(v)) },
        { key: 'local_rank', label: 'local rank', num: true, fmt: (v) => (num(v) < 0 ? '–' : String(v)) },
        { key: 'step_ns', label: 'step', num: true, fmt: (v) => ms(v) },
        { key: 'vs_median', label: 'vs median', num: true, fmt: spct },
        { key: 'collective_ns', label: 'collective', num: true, fmt: (v) => ms(v) },
        { key: 'late_ns', label: 'late', num: true, fmt: (v) => ms(v, 3) },
        { key: 'compute_ns', label: 'compute', num: true, fmt: (v) => ms(v) },
        { key: 'host_ns', label: 'host', num: true, fmt: (v) => ms(v) },
        { key: 'launch_ns', label: 'launch', num: true, fmt: (v) => ms(v) },
        { key: 'other_ns', label: 'other', num: true, fmt: (v) => ms(v) },
        { key: 'late_steps', label: 'late steps', num: true, fmt: fmt.count },
        { key: 'straggler', label: 'straggler', num: true, fmt: flag('straggler') },
        { key: 'late', label: 'late', num: true, fmt: flag('late') },
        { key: 'waits', label: 'waits', num: true, fmt: flag('waits') },
      ],
    }));
}

export async function render(root, params) {
  const run = params.run;
  crumbs([['runs', '#/runs'], ['run ' + run, null]]);
  const info = await get('/runs/' + run, {}, 'run');
  crumbs([['runs', '#/runs'], [info.job || 'job', '#/runs?job=' + encodeURIComponent(info.job)], ['run ' + run, null]]);
  const present = info.ranks || [];
  root.append(h('h1', {}, 'Run ' + run + (info.name ? ' · ' + info.name : '') + ' ', h('span', { class: 'kp-muted' }, info.job)));
  if (present.length === 0) {
    root.append(facts(run, info, null),
      section('Ranks', h('p', { class: 'kp-muted' }, 'No rank has sent anything to this run yet: nothing to compare.')));
    return;
  }
  let cmp;
  try {
    cmp = await view(run, 'compare', compareParams(params));
  } catch (e) {
    if (!(e instanceof ApiError) || e.status === 401) throw e;
    // the run's facts still tell something (bad thresholds, a run without steps)
    root.append(h('div', { class: 'kp-error kp-compare-error', role: 'alert', 'data-kp-error': e.status },
      h('strong', {}, 'The ranks could not be compared'), h('div', {}, 'HTTP ' + e.status + ' ' + (e.code || '')), h('div', {}, e.message)),
    facts(run, info, null),
      h('p', {}, link('#/runs/' + run, 'Compare with the default thresholds'), ' · ',
        link(rankHref(run, present[0]), 'rank ' + present[0] + '\'s page')));
    return;
  }
  root.append(verdict(run, cmp), facts(run, info, cmp));
  const body = h('div', { class: 'kp-compare' });
  root.append(body);
  if ((cmp.ranks || []).length < 2) {
    const only = (cmp.ranks || [])[0];
    body.append(section('One rank',
      h('p', {}, 'The run has one rank: there is nothing to compare across ranks. ',
        only ? link(rankHref(run, only.rank), ['Rank ', fig('compare:ranks[0].rank', only.rank), '\'s page']) : null,
        ' has its step breakdown, operators, kernels and memory.'),
      only ? kv([
        ['step (median over its steps)', fig('compare:ranks[0].step_ns', only.step_ns, ms(only.step_ns))],
        ['steps', fig('calc:steps', (cmp.steps || []).length, String((cmp.steps || []).length))],
      ]) : null), stepsTable(cmp));
    return;
  }
  body.append(thresholdsForm(run, cmp, params));
  charts(run, cmp, body, params);
  body.append(ranksTable(run, cmp), stepsTable(cmp));
  body.append(h('p', { class: 'kp-muted' }, 'Compared: ', fig('compare:collectives', cmp.collectives, fmt.count(cmp.collectives)),
    ' collectives (', fig('compare:p2p_collectives', cmp.p2p_collectives, fmt.count(cmp.p2p_collectives)), ' point-to-point); clock offsets from ',
    fig('compare:offset_collectives', cmp.offset_collectives, fmt.count(cmp.offset_collectives)), ' collectives, ',
    fig('compare:ranks_without_offset', cmp.ranks_without_offset, fmt.count(cmp.ranks_without_offset)), ' ranks without one',
    cmp.cached ? ' (from the analyzer\'s cache)' : '', '.'));
}
