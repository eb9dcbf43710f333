// One rank of a run: what the PyTorch Profiler TensorBoard plugin showed (overview, operators,
// kernels, memory, distributed) and kprof's own views of it (PyProf's table, the roofline,
// hardware counters), one tab each (?tab=...). Each tab lives in a module of its own
// (rank_NAME.js, loaded when shown) exporting `async function render(root, ctx)`, ctx being
// {run, rank, params, href(query)}: href gives this page's link with other query values.

import { get } from '../api.js';
import { crumbs, h, link, tabs } from '../ui.js';

const TABS = [
  ['overview', 'Overview', 'rank_overview.js'],
  ['operators', 'Operators', 'rank_ops.js'],
  ['kernels', 'Kernels', 'rank_kernels.js'],
  ['memory', 'Memory', 'rank_memory.js'],
  ['distributed', 'Distributed', 'rank_distributed.js'],
  ['pyprof', 'PyProf', 'rank_pyprof.js'],
  ['roofline', 'Roofline', 'rank_roofline.js'],
  ['counters', 'Counters', 'rank_counters.js'],
];

// This page's link with query q (values left empty or null are dropped).
export function rankHref(run, rank, q) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(q || {})) {
    if (v !== undefined && v !== null && v !== '') s.set(k, String(v));
  }
  const qs = s.toString();
  return '#/runs/' + run + '/ranks/' + rank + (qs ? '?' + qs : '');
}

export async function render(root, params) {
  const { run, rank } = params;
  const tab = params.tab || 'overview';
  const entry = TABS.find((t) => t[0] === tab);
  if (!entry) {
    throw new Error('no tab "' + tab + '" on a rank\'s page: the tabs are ' + TABS.map((t) => t[0]).join(', '));
  }
  const info = await get('/runs/' + run, undefined, 'run');
  const ranks = info.ranks || [];
  if (ranks.length && !ranks.includes(rank)) {
    throw new Error('run ' + run + ' has no rank ' + rank + ': its ranks are ' + ranks.join(', '));
  }
  crumbs([['runs', '#/runs'], ['run ' + run, '#/runs/' + run], ['rank ' + rank, null]]);
  const at = ranks.indexOf(rank);
  const prev = at > 0 ? ranks[at - 1] : null;
  const next = at >= 0 && at + 1 < ranks.length ? ranks[at + 1] : null;
  const keep = Object.assign({}, params);
  delete keep.run;
  delete keep.rank;
  delete keep.curve; // the memory curve reads a whole trace: only on its own link
  root.append(
    h('div', { class: 'kp-rank-head' },
      h('h1', {}, 'Run ' + run + (info.job ? ' (' + info.job + ')' : '') + ', rank ' + rank),
      h('nav', { class: 'kp-rank-nav', 'aria-label': 'this rank\'s neighbours and other pages' },
        prev !== null ? link(rankHref(run, prev, keep), '‹ rank ' + prev, { 'data-kp-nav': 'prev' })
          : h('span', { class: 'kp-muted' }, '‹ first rank'),
        next !== null ? link(rankHref(run, next, keep), 'rank ' + next + ' ›', { 'data-kp-nav': 'next' })
          : h('span', { class: 'kp-muted' }, 'last rank ›'),
        link('#/runs/' + run, 'the run across ranks'),
        link('#/runs/' + run + '/hta?rank=' + rank, 'HTA analyses'),
        link('#/runs/' + run + '/trace?rank=' + rank, 'trace (download, Perfetto)'))),
    tabs(tab, TABS.map(([id, label]) => ({ id, label, href: rankHref(run, rank, { tab: id }) }))));
  const body = h('div', { class: 'kp-rank-body', 'data-kp-tab-body': tab });
  root.append(body);
  const mod = await import('./' + entry[2]);
  await mod.render(body, {
    run, rank, params, info,
    href: (q) => rankHref(run, rank, Object.assign({ tab }, q)),
  });
}
