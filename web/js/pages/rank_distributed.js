// The distributed view (the plugin's "Distributed" view, spec tbplugin-views §9): this rank's
// computation/communication overlap per step (Breakdown's steps), the time every rank spent
// waiting at collectives against moving data (Distributed), and this rank's collectives.

import { view } from '../api.js';
import { PALETTE, stackedBars } from '../charts.js';
import { fig, fmt, h, kv, section, table } from '../ui.js';
import { note } from './rank_util.js';

const OVERLAP = [['Computation only', '#4e79a7'], ['Overlapping', '#59a14f'], ['Communication only', '#76b7b2'], ['Other', '#9c9c9c']];

export async function render(root, ctx) {
  const [b, d] = await Promise.all([
    view(ctx.run, 'breakdown', { rank: ctx.rank }),
    view(ctx.run, 'distributed', {}),
  ]);
  const steps = b.steps || [];
  const ov = section('Computation and communication per step (rank ' + ctx.rank + ')');
  root.append(ov);
  if (!b.has_communication) {
    ov.append(note('This rank\'s trace has no communication (no NCCL or Gloo kernels and no collective ops): ' +
      'there is nothing to overlap.'));
  }
  if (steps.length) {
    const parts = steps.map((s) => {
      const step = Number(s.end_ns) - Number(s.start_ns);
      const comp = Number(s.computation_ns);
      const comm = Number(s.communication_ns);
      const over = Number(s.overlap_ns);
      return [comp - over, over, comm - over, Math.max(0, step - (comp + comm - over))];
    });
    stackedBars(ov, 'steps-overlap', {
      title: 'Computation, overlap and communication per step (µs)',
      labels: steps.map((s) => s.name),
      series: OVERLAP.map(([label, color], k) => ({ label, color, values: parts.map((p) => p[k] / 1000) })),
      fmt: (v) => fmt.us(v, v >= 100 ? 0 : 1),
      xLabel: 'step',
    });
    ov.append(table({
      id: 'breakdown:steps',
      columns: [
        { key: 'name', label: 'step' },
        { key: 'computation_ns', label: 'computation', num: true, fmt: (v) => fmt.nsAsUs(v) },
        { key: 'communication_ns', label: 'communication', num: true, fmt: (v) => fmt.nsAsUs(v) },
        { key: 'overlap_ns', label: 'overlap', num: true, fmt: (v) => fmt.nsAsUs(v) },
        {
          key: 'calc:overlap_pct', label: 'communication overlapped', num: true,
          value: (s) => (Number(s.communication_ns) ? (100 * Number(s.overlap_ns)) / Number(s.communication_ns) : null),
          fmt: (v) => (v === null ? '–' : fmt.pct(v)),
        },
      ],
      rows: steps,
      pageSize: 25,
    }),
    note('Computation: the time some compute kernel, memcpy or memset ran; communication: the time some communication ' +
      'kernel ran; overlap: both at once (before the breakdown\'s priority masking). Communication that overlaps ' +
      'computation is hidden; the rest adds to the step time.'));
  }

  const ds = section('Collectives across the run');
  root.append(ds);
  if (!d.enabled) {
    ds.append(h('div', { class: 'kp-empty', 'data-kp-empty': 'distributed' },
      'The distributed view is off for this run: ', fig('distributed:reason', d.reason)));
    return;
  }
  const ranks = d.ranks || [];
  stackedBars(ds, 'ranks-wait', {
    title: 'Mean time per step in collectives, per rank: moving data and waiting for peers (µs)',
    labels: ranks.map((r) => r.rank),
    series: [
      { label: 'data transfer', color: PALETTE[3], values: ranks.map((r) => Number(r.wait_all_transfer_us)) },
      { label: 'synchronizing (waiting for peers)', color: PALETTE[2], values: ranks.map((r) => Number(r.wait_all_sync_us)) },
    ],
    fmt: (v) => fmt.us(v, 0),
    xLabel: 'rank',
    onClick: (i) => { location.hash = '#/runs/' + ctx.run + '/ranks/' + ranks[i].rank + '?tab=distributed'; },
  });
  ds.append(note('A rank that synchronizes much longer than it transfers waits for slower peers: the fast ranks wait, ' +
    'the straggler does not. Click a bar to see that rank.'),
  table({
    id: 'distributed:ranks',
    columns: [
      { key: 'rank', label: 'rank', num: true },
      { key: 'comm_node_count', label: 'collective ops', num: true, fmt: (v) => fmt.count(v) },
      { key: 'wait_all_transfer_us', label: 'transfer / step', num: true, fmt: (v) => fmt.us(v, 0) },
      { key: 'wait_all_sync_us', label: 'synchronizing / step', num: true, fmt: (v) => fmt.us(v, 0) },
    ],
    rows: ranks,
    pageSize: 16,
    rowHref: (r) => '#/runs/' + ctx.run + '/ranks/' + r.rank + '?tab=distributed',
  }));

  const i = ranks.findIndex((r) => r.rank === ctx.rank);
  const mine = section('This rank\'s collectives');
  root.append(mine);
  if (i < 0) {
    mine.append(note('Rank ' + ctx.rank + ' has no entry in the distributed view.'));
    return;
  }
  const me = ranks[i];
  mine.append(kv([
    ['Collective ops', fig('distributed:ranks[' + i + '].comm_node_count', me.comm_node_count, fmt.count(me.comm_node_count))],
    ['Transfer per step (mean)', fig('distributed:ranks[' + i + '].wait_all_transfer_us', me.wait_all_transfer_us, fmt.us(me.wait_all_transfer_us, 0))],
    ['Synchronizing per step (mean)', fig('distributed:ranks[' + i + '].wait_all_sync_us', me.wait_all_sync_us, fmt.us(me.wait_all_sync_us, 0))],
  ]),
  h('div', { class: 'kp-subtable' }, h('h3', {}, 'Per step'), table({
    id: 'distributed:ranks[' + i + '].wait',
    columns: [
      { key: 'step_name', label: 'step', fmt: (v) => v || '(in no step)' },
      { key: 'latency_ns', label: 'in collectives', num: true, fmt: (v) => fmt.nsAsUs(v) },
      { key: 'transfer_ns', label: 'transfer', num: true, fmt: (v) => fmt.nsAsUs(v) },
      { key: 'calc:sync_ns', label: 'synchronizing', num: true, value: (w) => Number(w.latency_ns) - Number(w.transfer_ns), fmt: (v) => fmt.nsAsUs(v) },
    ],
    rows: me.wait || [],
    pageSize: 25,
  })),
  h('div', { class: 'kp-subtable' }, h('h3', {}, 'Collective operations'), table({
    id: 'distributed:ranks[' + i + '].ops',
    columns: [
      { key: 'name', label: 'operation' },
      { key: 'calls', label: 'calls', num: true, fmt: (v) => fmt.count(v) },
      { key: 'total_bytes', label: 'total size', num: true, fmt: (v) => fmt.bytes(v) },
      { key: 'calc:avg_bytes', label: 'mean size', num: true, value: (o) => (Number(o.calls) ? Math.round(Number(o.total_bytes) / Number(o.calls)) : null), fmt: (v) => fmt.bytes(v) },
      { key: 'latency_ns', label: 'total latency', num: true, fmt: (v) => fmt.nsAsUs(v) },
      { key: 'transfer_ns', label: 'data transfer', num: true, fmt: (v) => fmt.nsAsUs(v) },
    ],
    rows: me.ops || [],
    pageSize: 25,
  })),
  note('In collectives: the union of the step\'s collective ops on the host; transfer: the union of their kernels on ' +
    'the GPU; the difference is time spent waiting for the other ranks.'));
}
