// The rank's overview, the TensorBoard plugin's "Overview" (Breakdown view, spec
// tbplugin-views): the step time split by category per step and on average, each GPU's
// utilization, est. SM efficiency and est. achieved occupancy, and the recommendations.

import { view } from '../api.js';
import { CATEGORIES, stackedBars } from '../charts.js';
import { fig, fmt, h, kv, section, table } from '../ui.js';
import { card, cards, hostList, note, shareBar, toggle, toolbar } from './rank_util.js';

export async function render(root, ctx) {
  const compat = ctx.params.compat === '1';
  const b = await view(ctx.run, 'breakdown', { rank: ctx.rank, plugin_compat: compat ? 'true' : undefined });
  root.append(toolbar(toggle('the plugin\'s figures (plugin_compat: its double-counting of ' +
    'overlapping categories, as torch-tb-profiler showed them)', compat,
  (on) => ctx.href({ compat: on ? '1' : null }), { 'data-kp-option': 'plugin_compat' })));

  const avg = b.average || {};
  const total = Number(avg.total_ns) || 0;
  const steps = b.steps || [];
  const avgSection = section('Average step time',
    steps.length === 0 ? note('This rank has no ProfilerStep: the figures cover the whole trace as one step "0".') : null,
    cards(card('Step time (mean of ' + steps.length + ' steps)', fig('breakdown:average.total_ns', avg.total_ns, fmt.nsAsMs(avg.total_ns, 3))),
      CATEGORIES.map(([key, label, color]) => {
        const v = avg[key + '_ns'];
        const c = card(label, fig('breakdown:average.' + key + '_ns', v, fmt.nsAsUs(v)),
          fig('calc:average_' + key + '_pct', total ? (100 * v) / total : 0, fmt.pct(total ? (100 * v) / total : 0)));
        c.classList.add('kp-cat-card');
        c.firstChild.prepend(swatch(color));
        return c;
      })),
    shareBar('average-breakdown', CATEGORIES.map(([key, label, color]) => ({ label, color, value: Number(avg[key + '_ns']) || 0 }))),
    note('Each moment of a step counts once, in the first category that is busy then, in this order: ' +
      CATEGORIES.map((c) => c[1]).join(' > ') + '. The categories add up to the step time' +
      (compat ? ', except in the plugin\'s figures: it counted a moment under several categories.' : '.')));
  root.append(avgSection);

  if (steps.length) {
    const per = section('Step time breakdown per step');
    root.append(per);
    stackedBars(per, 'steps-breakdown', {
      title: 'Time per step by category (µs)',
      labels: steps.map((s) => s.name),
      series: CATEGORIES.map(([key, label, color]) => ({ label, color, values: steps.map((s) => Number(s.cost[key + '_ns']) / 1000) })),
      fmt: (v) => fmt.us(v, v >= 100 ? 0 : 1),
      xLabel: 'step',
    });
    per.append(table({
      id: 'breakdown:steps',
      columns: [
        { key: 'name', label: 'step' },
        { key: 'calc:step_ns', label: 'step time', num: true, value: (s) => Number(s.end_ns) - Number(s.start_ns), fmt: (v) => fmt.nsAsUs(v) },
      ].concat(CATEGORIES.map(([key, label]) => ({
        key: 'cost.' + key + '_ns', label, num: true, value: (s) => s.cost[key + '_ns'], fmt: (v) => fmt.nsAsUs(v),
      }))),
      rows: steps,
      pageSize: 25,
    }));
  }

  const gpus = b.gpus || [];
  const gsec = section('GPUs');
  root.append(gsec);
  if (gpus.length === 0) {
    gsec.append(note('No GPU activity on this rank: utilization, SM efficiency and occupancy need kernels.'));
  } else {
    gsec.append(cards(gpus.map((g, i) => h('div', { class: 'kp-card kp-gpu-card' },
      h('div', { class: 'kp-label' }, 'GPU ', fig('breakdown:gpus[' + i + '].gpu_id', g.gpu_id),
        g.device_known ? [' · ', fig('breakdown:gpus[' + i + '].name', g.name)] : null),
      kv([
        ['GPU utilization', fig('breakdown:gpus[' + i + '].utilization', g.utilization, fmt.fracAsPct(g.utilization))],
        ['Est. SM efficiency', g.est_sm_efficiency_defined
          ? fig('breakdown:gpus[' + i + '].est_sm_efficiency', g.est_sm_efficiency, fmt.fracAsPct(g.est_sm_efficiency))
          : h('span', { class: 'kp-muted' }, 'no kernel carries it')],
        ['Est. achieved occupancy', g.est_achieved_occupancy_defined
          ? fig('breakdown:gpus[' + i + '].est_achieved_occupancy', g.est_achieved_occupancy, fmt.pct(g.est_achieved_occupancy))
          : h('span', { class: 'kp-muted' }, 'no kernel carries it')],
        g.device_known ? ['Memory', fig('breakdown:gpus[' + i + '].memory_bytes', g.memory_bytes, fmt.bytes(g.memory_bytes))] : null,
        g.device_known ? ['Compute capability', [fig('breakdown:gpus[' + i + '].compute_major', g.compute_major), '.',
          fig('breakdown:gpus[' + i + '].compute_minor', g.compute_minor)]] : null,
        g.device_known ? ['SMs', fig('breakdown:gpus[' + i + '].sm_count', g.sm_count)] : null,
      ].filter(Boolean))))),
    note('GPU utilization: the share of the steps\' window [first step start, last step end] in which the GPU ran a ' +
      'kernel. Est. SM efficiency: how much of the SMs the kernels kept busy (blocks per SM, capped at 1), ' +
      'weighted by kernel time. Est. achieved occupancy: the kernels\' occupancy weighted by time. Both estimates ' +
      'come from the trace\'s per-kernel figures, as the plugin computed them.'));
  }

  const recs = b.recommendations || [];
  root.append(section('Performance recommendations',
    recs.length === 0 ? note('None: no rule of the plugin\'s fires for this rank.')
      : h('ul', { class: 'kp-recs' }, recs.map((t, i) => h('li', {}, fig('breakdown:recommendations[' + i + ']', t, t))))));

  const run = ctx.info;
  const state = String(run.state || '').replace(/^RUN_STATE_/, '').toLowerCase();
  const source = String(run.source || '').replace(/^RUN_SOURCE_/, '').toLowerCase();
  root.append(section('The run and the trace', kv([
    ['Job', fig('run:job', run.job)],
    ['Run state, source', [fig('run:state', run.state, state), ', ', fig('run:source', run.source, source)]],
    ['World size', fig('run:world_size', run.world_size, fmt.count(run.world_size))],
    ['Ranks with data', fig('run:ranks', run.ranks, String((run.ranks || []).length))],
    ['Hosts', fig('run:hosts', run.hosts, hostList(run.hosts || []))],
    ['Created', fig('run:created_ns', run.created_ns, fmt.time(run.created_ns))],
    ['Kernels', fig('breakdown:has_kernel', b.has_kernel, b.has_kernel ? 'yes' : 'no')],
    ['Memcpy or memset', fig('breakdown:has_memcpy_or_memset', b.has_memcpy_or_memset, b.has_memcpy_or_memset ? 'yes' : 'no')],
    ['CUDA runtime calls', fig('breakdown:has_runtime', b.has_runtime, b.has_runtime ? 'yes' : 'no')],
    ['Communication', fig('breakdown:has_communication', b.has_communication, b.has_communication ? 'yes' : 'no')],
    ['Communication ops', fig('breakdown:comm_node_count', b.comm_node_count, fmt.count(b.comm_node_count))],
  ])));
}

function swatch(color) {
  const s = h('span', { class: 'kp-swatch' });
  s.style.background = color;
  return s;
}

