// The operator view (the plugin's "Operator" view; Ops): per operator name (and input
// shape), its calls and host and device times, self and total, and its Tensor Core share.

import { view } from '../api.js';
import { fig, fmt, h, section, table } from '../ui.js';
import { barList, note, picker, toolbar, topIndexes } from './rank_util.js';

const GROUPS = [['OPS_GROUP_BY_NAME', 'operator'], ['OPS_GROUP_BY_NAME_AND_SHAPES', 'operator and input shape']];

export async function render(root, ctx) {
  const groupBy = GROUPS.some((g) => g[0] === ctx.params.group_by) ? ctx.params.group_by : GROUPS[0][0];
  const r = await view(ctx.run, 'ops', { rank: ctx.rank, group_by: groupBy });
  const shapes = groupBy === 'OPS_GROUP_BY_NAME_AND_SHAPES';
  const time = (key, label) => ({ key, label, num: true, fmt: (v) => fmt.nsAsUs(v) });
  const rows = r.rows || [];
  const top = (key, title) => barList('ops-top-' + key, title, topIndexes(rows, 10, (x) => x[key]).map((i) => ({
    label: rows[i].name + (shapes && rows[i].input_shape ? ' ' + rows[i].input_shape : ''),
    value: Number(rows[i][key]),
    figure: fig('ops:rows[' + i + '].' + key, rows[i][key], fmt.nsAsUs(rows[i][key])),
  })));
  root.append(toolbar(picker('Group by', GROUPS, groupBy, (v) => ctx.href({ group_by: v }), { 'data-kp-option': 'group_by' })),
    rows.length ? section('Top operators', h('div', { class: 'kp-barlists' },
      top('device_self_ns', 'Device self time, top 10'), top('host_self_ns', 'Host self time, top 10'))) : null,
    section('Operators (' + rows.length + ')',
      rows.length === 0 ? note('No operator on this rank: the trace has no cpu_op events.') : null,
      table({
        id: 'ops:rows',
        columns: [
          { key: 'name', label: 'operator' },
          shapes ? { key: 'input_shape', label: 'input shape' } : null,
          { key: 'calls', label: 'calls', num: true, fmt: (v) => fmt.count(v) },
          time('device_self_ns', 'device self'),
          time('device_total_ns', 'device total'),
          time('host_self_ns', 'host self'),
          time('host_total_ns', 'host total'),
          { key: 'tc_eligible', label: 'TC eligible', fmt: (v) => (v ? 'yes' : 'no') },
          time('tc_self_ns', 'TC self'),
          time('tc_total_ns', 'TC total'),
        ].filter(Boolean),
        rows,
        pageSize: 50,
      }),
      note('Self: the time in the operator itself, without the operators it called; total: with them. ' +
        'Device times are the GPU time of the kernels, memcpys and memsets the operator launched; TC: of those, ' +
        'the kernels that used Tensor Cores. Rows come in the plugin\'s order (device self time, then host self time); ' +
        'click a column to sort.')));
}
