// HTA's per-rank analyses (Hta view, analyzer/hta.h, docs/specs/hta-analyses.md §2-§7, §11),
// one tab per analysis (?analysis=HTA_IDLE): temporal breakdown, idle time, comm/comp
// overlap, kernel breakdown, kernel launch statistics, queue length, memory bandwidth.
// HTA's own choices (rounding to µs, dropping the last step) are on by default, as in HTA,
// and can be turned off.

import { get, view } from '../api.js';
import { PALETTE, legend, stackedBars } from '../charts.js';
import { crumbs, fig, fmt, h, kv, link, section, table, tabs } from '../ui.js';
import { card, cards, finite, note, picker, shareBar, toggle, toolbar } from './rank_util.js';

const ANALYSES = [
  ['HTA_TEMPORAL', 'Temporal breakdown', temporal],
  ['HTA_IDLE', 'Idle time', idle],
  ['HTA_OVERLAP', 'Comm/comp overlap', overlap],
  ['HTA_KERNELS', 'Kernel breakdown', kernels],
  ['HTA_LAUNCH', 'Kernel launches', launches],
  ['HTA_QUEUE', 'Queue length', queue],
  ['HTA_MEMBW', 'Memory bandwidth', membw],
];

function href(run, q) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v !== undefined && v !== null && v !== '') s.set(k, String(v));
  }
  return '#/runs/' + run + '/hta?' + s.toString();
}

export async function render(root, params) {
  const run = params.run;
  const info = await get('/runs/' + run, undefined, 'run');
  const ranks = info.ranks || [];
  if (params.rank !== undefined && !/^\d{1,10}$/.test(params.rank)) {
    throw new Error('rank "' + params.rank + '" is not a rank number: #/runs/' + run + '/hta?rank=N');
  }
  const rank = params.rank !== undefined ? Number(params.rank) : ranks.length ? ranks[0] : 0;
  if (ranks.length && !ranks.includes(rank)) {
    throw new Error('run ' + run + ' has no rank ' + rank + ': its ranks are ' + ranks.join(', '));
  }
  const analysis = params.analysis || 'HTA_TEMPORAL';
  const entry = ANALYSES.find((a) => a[0] === analysis);
  if (!entry) {
    throw new Error('no HTA analysis "' + analysis + '": the analyses are ' + ANALYSES.map((a) => a[0]).join(', '));
  }
  const opts = { rank, analysis, exact: params.exact, last: params.last, delay_us: params.delay_us };
  const go = (q) => href(run, Object.assign({}, opts, q));
  crumbs([['runs', '#/runs'], ['run ' + run, '#/runs/' + run], ['rank ' + rank, '#/runs/' + run + '/ranks/' + rank], ['HTA', null]]);

  const delay = params.delay_us !== undefined && params.delay_us !== '' ? Number(params.delay_us) : null;
  if (delay !== null && !(Number.isFinite(delay) && delay >= 0 && delay <= 1e9)) {
    throw new Error('delay_us must be a number of µs from 0 to 1e9, not "' + params.delay_us + '"');
  }
  const delayInput = h('input', { type: 'number', min: 0, step: 1, value: delay !== null ? delay : 30, class: 'kp-num-input', 'aria-label': 'consecutive kernel delay in µs' });
  const delayForm = h('form', { class: 'kp-picker' }, 'kernel_wait below ', delayInput, ' µs ', h('button', { type: 'submit' }, 'apply'));
  delayForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = go({ delay_us: delayInput.value });
  });
  root.append(h('div', { class: 'kp-hta' },
    h('h1', {}, 'HTA analyses: run ' + run + (info.job ? ' (' + info.job + ')' : '') + ', rank ' + rank),
    h('nav', { class: 'kp-rank-nav' },
      link('#/runs/' + run + '/ranks/' + rank, 'this rank\'s views'),
      link('#/runs/' + run, 'the run across ranks'),
      link('#/runs/' + run + '/trace?rank=' + rank, 'trace (download, Perfetto)')),
    toolbar(
      ranks.length > 1 ? picker('Rank', ranks.map((r) => [String(r), String(r)]), String(rank), (v) => go({ rank: v }), { 'data-kp-option': 'rank' }) : null,
      toggle('exact ns (HTA rounds to µs)', params.exact === '1', (on) => go({ exact: on ? '1' : null }), { 'data-kp-option': 'exact_ns' }),
      toggle('keep the last step (HTA drops it)', params.last === '1', (on) => go({ last: on ? '1' : null }), { 'data-kp-option': 'include_last_step' }),
      analysis === 'HTA_IDLE' ? delayForm : null),
    tabs(analysis, ANALYSES.map(([id, label]) => ({ id, label, href: go({ analysis: id }) })))));
  const r = await view(run, 'hta', {
    rank, analysis,
    exact_ns: params.exact === '1' ? 'true' : undefined,
    include_last_step: params.last === '1' ? 'true' : undefined,
    has_consecutive_kernel_delay_ns: delay !== null ? 'true' : undefined,
    consecutive_kernel_delay_ns: delay !== null ? Math.round(delay * 1000) : undefined,
  });
  const body = h('div', { class: 'kp-hta', 'data-kp-tab-body': analysis });
  root.append(body);
  entry[2](body, r, { run, rank });
  body.append(note('As HTA computes it' + (r.rounded_to_us ? ', times rounded to whole µs' : ', times in exact ns') +
    (r.last_step_dropped ? ', the last ProfilerStep dropped' : ', every step kept') + ' (docs/specs/hta-analyses.md).'));
}

const ns = (v) => fmt.nsAsUs(v);

function temporal(root, r) {
  const t = r.temporal;
  if (!t) {
    root.append(note('No temporal breakdown: the rank has no kernels.'));
    return;
  }
  root.append(section('Temporal breakdown',
    cards(
      card('Idle', fig('hta:temporal.idle_ns', t.idle_ns, fmt.nsAsMs(t.idle_ns, 3)), fig('hta:temporal.idle_pct', t.idle_pct, fmt.pct(t.idle_pct))),
      card('Compute', fig('hta:temporal.compute_ns', t.compute_ns, fmt.nsAsMs(t.compute_ns, 3)), fig('hta:temporal.compute_pct', t.compute_pct, fmt.pct(t.compute_pct))),
      card('Non-compute', fig('hta:temporal.non_compute_ns', t.non_compute_ns, fmt.nsAsMs(t.non_compute_ns, 3)), fig('hta:temporal.non_compute_pct', t.non_compute_pct, fmt.pct(t.non_compute_pct))),
      card('Window (first kernel start to last kernel end)', fig('hta:temporal.kernel_ns', t.kernel_ns, fmt.nsAsMs(t.kernel_ns, 3)))),
    shareWithLegend('hta-temporal', [
      { label: 'idle', value: Number(t.idle_ns), color: '#d0d0d0' },
      { label: 'compute', value: Number(t.compute_ns), color: PALETTE[0] },
      { label: 'non-compute', value: Number(t.non_compute_ns), color: PALETTE[1] },
    ]),
    note('Of the GPU\'s time in the steps: idle (no kernel runs), compute (a computation kernel runs) and non-compute ' +
      '(only communication or memory kernels run).')));
}

function idle(root, r) {
  const streams = r.idle || [];
  if (streams.length === 0) {
    root.append(note('No idle time: the rank has no kernel streams.'));
    return;
  }
  const cats = ['host_wait', 'kernel_wait', 'other'];
  const colours = { host_wait: PALETTE[2], kernel_wait: PALETTE[1], other: '#9c9c9c' };
  const s = section('Idle time per stream');
  root.append(s);
  stackedBars(s, 'hta-idle', {
    title: 'Idle time per stream by cause (ms)',
    labels: streams.map((x) => x.stream),
    series: cats.map((c) => ({
      label: c, color: colours[c],
      values: streams.map((x) => { const k = x.categories.find((y) => y.category === c); return k ? Number(k.idle_ns) / 1e6 : 0; }),
    })),
    fmt: (v) => fmt.num(v, 2) + ' ms',
    xLabel: 'stream',
  });
  s.append(kv([['consecutive kernel delay', fig('hta:consecutive_kernel_delay_ns', r.consecutive_kernel_delay_ns, ns(r.consecutive_kernel_delay_ns))]]),
    note('host_wait: the GPU waits for the CPU to launch work; kernel_wait: a short gap between two kernels ' +
      '(below the consecutive kernel delay); other: anything else, e.g. waiting on another stream or an event.'));
  streams.forEach((x, i) => {
    s.append(h('div', { class: 'kp-subtable' }, h('h3', {}, 'Stream ', fig('hta:idle[' + i + '].stream', x.stream)), table({
      id: 'hta:idle[' + i + '].categories',
      columns: [
        { key: 'category', label: 'cause' },
        { key: 'idle_ns', label: 'idle', num: true, fmt: ns },
        { key: 'ratio', label: 'share of idle', num: true, fmt: (v) => (finite(v) === null ? '–' : fmt.fracAsPct(v)) },
        { key: 'interval_stats.count', label: 'gaps', num: true, value: (c) => c.interval_stats.count, fmt: (v) => fmt.count(v) },
        { key: 'interval_stats.mean', label: 'mean gap', num: true, value: (c) => c.interval_stats.mean, fmt: stat },
        { key: 'interval_stats.q50', label: 'median gap', num: true, value: (c) => c.interval_stats.q50, fmt: stat },
        { key: 'interval_stats.max', label: 'max gap', num: true, value: (c) => c.interval_stats.max, fmt: stat },
      ],
      rows: x.categories,
      pageSize: 10,
    })));
  });
}

function stat(v) {
  return finite(v) === null ? '–' : fmt.nsAsUs(v);
}

function overlap(root, r) {
  const o = r.overlap;
  if (!o) {
    root.append(note('No overlap figure for this rank.'));
    return;
  }
  root.append(section('Communication/computation overlap', cards(
    card('Communication time', fig('hta:overlap.comm_ns', o.comm_ns, fmt.nsAsMs(o.comm_ns, 3))),
    card('Of it, overlapped by computation', fig('hta:overlap.overlap_ns', o.overlap_ns, fmt.nsAsMs(o.overlap_ns, 3))),
    card('Overlap', fig('hta:overlap.pct', o.pct, finite(o.pct) === null ? 'no communication' : fmt.pct(o.pct)))),
  note('The share of the time communication kernels run during which a computation kernel runs too: higher is ' +
    'better, communication then hides behind compute.')));
}

function kernels(root, r) {
  const types = r.kernel_types || [];
  const s = section('Kernel types');
  root.append(s);
  const total = types.reduce((a, t) => a + Number(t.sum_ns), 0);
  s.append(shareWithLegend('hta-kernel-types', types.map((t, i) => ({ label: t.kernel_type, value: Number(t.sum_ns), color: PALETTE[i % PALETTE.length] }))),
    table({
      id: 'hta:kernel_types',
      columns: [
        { key: 'kernel_type', label: 'kernel type' },
        { key: 'sum_ns', label: 'time', num: true, fmt: ns },
        { key: 'calc:pct', label: 'share', num: true, value: (t) => (total ? (100 * Number(t.sum_ns)) / total : 0), fmt: (v) => fmt.pct(v) },
      ],
      rows: types,
      pageSize: 20,
    }));
  root.append(section('Top kernels per type', table({
    id: 'hta:kernels',
    columns: [
      { key: 'name', label: 'kernel' },
      { key: 'kernel_type', label: 'type' },
      { key: 'sum_ns', label: 'total', num: true, fmt: stat },
      { key: 'mean_ns', label: 'mean', num: true, fmt: stat },
      { key: 'max_ns', label: 'max', num: true, fmt: stat },
      { key: 'min_ns', label: 'min', num: true, fmt: stat },
      { key: 'std_ns', label: 'std', num: true, fmt: stat },
    ],
    rows: r.kernels || [],
    pageSize: 50,
  }), note('HTA keeps the kernels that make up most of each type\'s time and sums the rest as "others".')));
}

function launches(root, r) {
  const l = r.launch_summary;
  if (!l) {
    root.append(note('No kernel launches on this rank.'));
    return;
  }
  const p = 'hta:launch_summary.';
  root.append(section('Kernel launch statistics',
    cards(
      card('Launches', fig(p + 'n', l.n, fmt.count(l.n))),
      card('Mean CPU launch time', fig(p + 'cpu_mean_ns', l.cpu_mean_ns, stat(l.cpu_mean_ns))),
      card('Mean GPU kernel time', fig(p + 'gpu_mean_ns', l.gpu_mean_ns, stat(l.gpu_mean_ns))),
      card('Mean launch delay', fig(p + 'delay_mean_ns', l.delay_mean_ns, stat(l.delay_mean_ns))),
      card('Median launch delay', fig(p + 'delay_p50_ns', l.delay_p50_ns, stat(l.delay_p50_ns))),
      card('Max launch delay', fig(p + 'delay_max_ns', l.delay_max_ns, stat(l.delay_max_ns)))),
    kv([
      [h('span', {}, 'Kernels shorter than their launch (runtime ≤ ', fig(p + 'runtime_cutoff_ns', l.runtime_cutoff_ns, ns(l.runtime_cutoff_ns)), ')'),
        fig(p + 'n_gpu_shorter', l.n_gpu_shorter, fmt.count(l.n_gpu_shorter))],
      ['Launches slower than the runtime cutoff', fig(p + 'n_runtime_outliers', l.n_runtime_outliers, fmt.count(l.n_runtime_outliers))],
      [h('span', {}, 'Launch delays above ', fig(p + 'launch_delay_cutoff_ns', l.launch_delay_cutoff_ns, ns(l.launch_delay_cutoff_ns))),
        fig(p + 'n_delay_outliers', l.n_delay_outliers, fmt.count(l.n_delay_outliers))],
    ]),
    note('CPU: the cudaLaunchKernel call\'s duration; GPU: the kernel\'s; delay: from the end of the launch to the kernel\'s ' +
      'start. Many kernels shorter than their launch mean the GPU starves: fuse kernels or use CUDA graphs.')));
  root.append(section('Launches', table({
    id: 'hta:launches',
    columns: [
      { key: 'correlation', label: 'correlation', num: true },
      { key: 'cpu_ns', label: 'CPU launch', num: true, fmt: ns },
      { key: 'gpu_ns', label: 'GPU kernel', num: true, fmt: ns },
      { key: 'delay_ns', label: 'launch delay', num: true, fmt: ns },
    ],
    rows: r.launches || [],
    pageSize: 50,
  })));
}

function queue(root, r) {
  const q = r.queue || [];
  root.append(section('Queue length per stream',
    kv([['Queue limit (blocked at this length)', fig('hta:max_queue_length', r.max_queue_length, fmt.count(r.max_queue_length))]]),
    q.length === 0 ? note('No stream on this rank.') : table({
      id: 'hta:queue',
      columns: [
        { key: 'stream', label: 'stream', num: true },
        { key: 'queue_length.count', label: 'changes', num: true, value: (x) => x.queue_length.count, fmt: (v) => fmt.count(v) },
        { key: 'queue_length.mean', label: 'mean length', num: true, value: (x) => x.queue_length.mean, fmt: (v) => fmt.num(v, 2) },
        { key: 'queue_length.q50', label: 'median', num: true, value: (x) => x.queue_length.q50, fmt: (v) => fmt.num(v, 1) },
        { key: 'queue_length.q75', label: 'p75', num: true, value: (x) => x.queue_length.q75, fmt: (v) => fmt.num(v, 1) },
        { key: 'queue_length.max', label: 'max', num: true, value: (x) => x.queue_length.max, fmt: (v) => fmt.num(v, 0) },
        { key: 'blocked_ns', label: 'time blocked on a full queue', num: true, fmt: ns },
        { key: 'blocked_rel', label: 'share of the trace', num: true, fmt: (v) => fmt.fracAsPct(v, 2) },
      ],
      rows: q,
      pageSize: 25,
    }),
    note('The number of kernels launched on a stream and not yet finished. A long queue keeps the GPU fed; time at ' +
      'the limit means the CPU blocked in the launch.')));
}

function membw(root, r) {
  const m = r.membw || [];
  root.append(section('Memory bandwidth',
    m.length === 0 ? note('No memcpy or memset on this rank.') : table({
      id: 'hta:membw',
      columns: [
        { key: 'name', label: 'operation' },
        { key: 'events', label: 'events', num: true, fmt: (v) => fmt.count(v) },
        { key: 'computed', label: 'bandwidth computed (bytes / time)', num: true, fmt: (v) => fmt.count(v) },
        { key: 'memory_bw_gbps.mean', label: 'mean GB/s', num: true, value: (x) => x.memory_bw_gbps.mean, fmt: gbps },
        { key: 'memory_bw_gbps.q50', label: 'median GB/s', num: true, value: (x) => x.memory_bw_gbps.q50, fmt: gbps },
        { key: 'memory_bw_gbps.max', label: 'max GB/s', num: true, value: (x) => x.memory_bw_gbps.max, fmt: gbps },
      ],
      rows: m,
      pageSize: 25,
    }),
    note('The summed bandwidth of each kind of memory operation at its change points, in GB/s (10⁹ bytes), from the ' +
      'trace\'s own "memory bandwidth (GB/s)" where it has one.')));
}

function gbps(v) {
  return finite(v) === null ? '–' : fmt.num(v, 2);
}

function shareWithLegend(name, parts) {
  return h('div', {}, shareBar(name, parts), legend(parts));
}
