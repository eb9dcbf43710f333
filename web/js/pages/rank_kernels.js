// The kernel view (the plugin's "Kernel" view; Kernels): per kernel name (or per kernel and
// the operator that launched it, with its launch shape), calls, times, Tensor Cores,
// blocks per SM and occupancy; and the Tensor Core share per GPU.

import { view } from '../api.js';
import { fig, fmt, h, kv, section, table } from '../ui.js';
import { barList, card, cards, note, picker, toolbar, topIndexes } from './rank_util.js';

const GROUPS = [['KERNELS_GROUP_BY_NAME', 'kernel'], ['KERNELS_GROUP_BY_NAME_AND_OP', 'kernel and operator']];

export async function render(root, ctx) {
  const groupBy = GROUPS.some((g) => g[0] === ctx.params.group_by) ? ctx.params.group_by : GROUPS[0][0];
  const r = await view(ctx.run, 'kernels', { rank: ctx.rank, group_by: groupBy });
  const byOp = groupBy === 'KERNELS_GROUP_BY_NAME_AND_OP';
  const rows = r.rows || [];
  const tc = r.tensor_cores || { gpus: [] };
  const time = (key, label) => ({ key, label, num: true, fmt: (v) => fmt.nsAsUs(v) });
  root.append(toolbar(picker('Group by', GROUPS, groupBy, (v) => ctx.href({ group_by: v }), { 'data-kp-option': 'group_by' })));
  root.append(section('Tensor Cores',
    tc.tc_ratio_defined
      ? cards((tc.gpus || []).map((g, i) => card(h('span', {}, 'GPU ', fig('kernels:tensor_cores.gpus[' + i + '].gpu_id', g.gpu_id), ': kernel time on Tensor Cores'),
        fig('kernels:tensor_cores.gpus[' + i + '].tc_ratio', g.tc_ratio, fmt.fracAsPct(g.tc_ratio)))),
      card('Kernel time launched by TC-eligible operators',
        fig('kernels:tensor_cores.eligible_ops_kernel_ratio', tc.eligible_ops_kernel_ratio, fmt.fracAsPct(tc.eligible_ops_kernel_ratio))))
      : note('No operator launched a kernel on this rank: there is no Tensor Core share to give.'),
    note('The share is of the kernel time of kernels launched by operators; a kernel uses Tensor Cores when its name ' +
      'is one of the plugin\'s Tensor Core kernel patterns.')));
  if (rows.length) {
    root.append(section('Top kernels', barList('kernels-top', 'Total time, top 10', topIndexes(rows, 10, (x) => x.total_ns).map((i) => ({
      label: rows[i].name + (byOp ? ' (' + rows[i].op_name + ')' : ''),
      value: Number(rows[i].total_ns),
      figure: fig('kernels:rows[' + i + '].total_ns', rows[i].total_ns, fmt.nsAsUs(rows[i].total_ns)),
    })))));
  }
  root.append(section('Kernels (' + rows.length + ')',
    rows.length === 0 ? note('No kernel on this rank: the trace has no GPU kernels.') : null,
    table({
      id: 'kernels:rows',
      columns: [
        { key: 'name', label: 'kernel' },
        byOp ? { key: 'op_name', label: 'operator' } : null,
        byOp ? { key: 'grid', label: 'grid' } : null,
        byOp ? { key: 'block', label: 'block' } : null,
        byOp ? { key: 'registers', label: 'registers / thread', num: true, fmt: (v) => fmt.count(v) } : null,
        byOp ? { key: 'shared_memory', label: 'shared memory', num: true, fmt: (v) => fmt.bytes(v) } : null,
        { key: 'calls', label: 'calls', num: true, fmt: (v) => fmt.count(v) },
        time('total_ns', 'total'),
        { key: 'calc:mean_ns', label: 'mean', num: true, value: (k) => (Number(k.calls) ? Number(k.total_ns) / Number(k.calls) : null), fmt: (v) => fmt.nsAsUs(v) },
        time('max_ns', 'max'),
        time('min_ns', 'min'),
        { key: 'tc_used', label: 'uses TC', fmt: (v) => (v ? 'yes' : 'no') },
        byOp ? { key: 'op_tc_eligible', label: 'op TC eligible', fmt: (v) => (v ? 'yes' : 'no') } : null,
        { key: 'mean_blocks_per_sm', label: 'mean blocks / SM', num: true, fmt: (v) => fmt.num(v, 2) },
        { key: 'mean_est_achieved_occupancy', label: 'mean est. occupancy', num: true, fmt: (v) => fmt.pct(v, 2) },
      ].filter(Boolean),
      rows,
      pageSize: 50,
    }),
    note('Times per kernel launch: total, mean (total / calls), max and min. Blocks per SM and occupancy are means ' +
      'weighted by kernel time, a kernel without the figure counting as 0 (as the plugin does).')));
  if (rows.length) {
    const total = rows.reduce((s, k) => s + Number(k.total_ns), 0);
    root.append(section('In all', kv([
      ['Kernel time', fig('calc:kernel_total_ns', total, fmt.nsAsMs(total, 3))],
      ['Kernel launches', fig('calc:kernel_calls', rows.reduce((s, k) => s + Number(k.calls), 0), fmt.count(rows.reduce((s, k) => s + Number(k.calls), 0)))],
    ])));
  }
}
