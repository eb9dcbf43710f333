// Hardware counters per kernel (Counters view, analyzer/counters.h, spec hta-analyses §10):
// one row per CUPTI counter range with its kernel, the ops around it, its duration, each
// metric's value and the FLOPs derived from them. Most traces have none: the view's message
// then says why, and how to record them.

import { view } from '../api.js';
import { fig, fmt, h, section, table } from '../ui.js';
import { finite, fmtSi, note } from './rank_util.js';

export async function render(root, ctx) {
  const c = await view(ctx.run, 'counters', { rank: ctx.rank });
  const metrics = c.metrics || [];
  const rows = c.rows || [];
  if (rows.length === 0) {
    root.append(section('Hardware counters', h('div', { class: 'kp-empty', 'data-kp-empty': 'counters' },
      h('p', {}, fig('counters:message', c.message, c.message || 'No counters in this run.')),
      h('p', {}, 'kprof\'s own capture does not record counters yet: they come from imported traces. Profile the job ' +
        'with torch.profiler and Kineto\'s CUPTI range profiler (its ', h('code', {}, 'cuda_profiler_range'),
        ' events, with the metrics you want, e.g. ', h('code', {}, 'dram__bytes_read.sum'), '), then ',
        h('code', {}, 'kprofctl import --job NAME TRACE'), ': kprof maps each range to its kernel and the ops above it.'))));
    return;
  }
  const num = (v) => (finite(v) === null ? '–' : fmt.num(v, Math.abs(Number(v)) >= 100 ? 0 : 2));
  root.append(section('Hardware counters per kernel (' + fmt.count(rows.length) + ')',
    c.message ? note(c.message, 'kp-warn-note') : null,
    h('p', { class: 'kp-note' }, 'Metrics recorded: ', metrics.map((m, j) => [j ? ', ' : '', fig('counters:metrics[' + j + ']', m, m)])),
    h('div', { class: 'kp-counters' }, table({
      id: 'counters:rows',
      columns: [
        { key: 'kernel', label: 'kernel', fmt: (v) => v || '(unknown)' },
        { key: 'idx', label: 'idx', num: true },
        { key: 'op_stack', label: 'ops (outermost first)', fmt: (v) => (v && v.length ? v.join(' › ') : '–') },
        { key: 'device', label: 'GPU', num: true, fmt: (v) => (Number(v) < 0 ? '–' : String(v)) },
        { key: 'dur_ns', label: 'duration', num: true, fmt: (v) => (Number(v) < 0 ? '–' : fmt.nsAsUs(v, 3)) },
      ].concat(metrics.map((m, j) => ({ key: 'values.' + j, label: m, num: true, value: (r) => r.values[j], fmt: num })), [
        { key: 'flops', label: 'FLOPs', num: true, fmt: (v) => (finite(v) === null ? '–' : fmtSi(v, '')) },
        { key: 'flops_per_s', label: 'FLOP/s', num: true, fmt: (v) => (finite(v) === null ? '–' : fmtSi(v, '')) },
        { key: 'correlation', label: 'correlation', num: true, fmt: (v) => (Number(v) < 0 ? '–' : String(v)) },
      ]),
      rows,
      pageSize: 50,
    })),
    note('"–": the counter was not recorded for that kernel, or the FLOPs cannot be derived from the metrics recorded ' +
      '(never 0). FLOPs come from the sass instruction counters (fp64, fp32, fp16, FMA counted twice).')));
}
