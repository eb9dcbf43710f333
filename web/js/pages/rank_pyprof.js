// PyProf's table (Prof view, analyzer/pyprof.h): one row per kernel launch in launch order,
// with the op and module that launched it, its direction, its silicon time, Tensor Cores,
// launch shape, and the FLOPs and bytes kprof derives from the op's arguments. A rank can
// have 200,000 kernels: the view has no paging of its own, so the whole answer is read once
// and ui.table keeps one page in the DOM.

import { view } from '../api.js';
import { fig, fmt, kv, section, table } from '../ui.js';
import { fmtSi, note } from './rank_util.js';

export async function render(root, ctx) {
  const r = await view(ctx.run, 'prof', { rank: ctx.rank });
  const rows = r.rows || [];
  if (rows.length === 0) {
    root.append(section('PyProf', note('No kernel on this rank: PyProf\'s table lists kernel launches.')));
    return;
  }
  let sil = 0;
  let flops = 0;
  let bytes = 0;
  let known = 0;
  for (const x of rows) {
    sil += Number(x.sil_ns);
    if (x.flops_known) {
      flops += Number(x.flops);
      known++;
    }
    if (x.bytes_known) bytes += Number(x.bytes);
  }
  root.append(section('In all', kv([
    ['Kernel launches', fig('calc:prof_rows', rows.length, fmt.count(rows.length))],
    ['Silicon time', fig('calc:prof_sil_ns', sil, fmt.nsAsMs(sil, 3))],
    ['Launches with known FLOPs', fig('calc:prof_flops_known', known, fmt.count(known) + ' (' + fmt.pct(rows.length ? (100 * known) / rows.length : 0) + ')')],
    ['FLOPs (known)', fig('calc:prof_flops', flops, fmtSi(flops, 'FLOP'))],
    ['Bytes (known)', fig('calc:prof_bytes', bytes, fmt.bytes(bytes))],
  ])));
  root.append(section('Kernels in launch order (' + fmt.count(rows.length) + ')',
    table({
      id: 'prof:rows',
      columns: [
        { key: 'kernel', label: 'kernel' },
        { key: 'idx', label: 'idx', num: true },
        { key: 'op', label: 'op' },
        { key: 'mod', label: 'module' },
        { key: 'bprop', label: 'direction', fmt: (v) => (v ? 'bprop' : 'fprop') },
        { key: 'sub', label: 'sub', num: true },
        { key: 'seq', label: 'seq', num: true, fmt: (v) => (Number(v) < 0 ? '–' : String(v)) },
        { key: 'layer', label: 'layer' },
        { key: 'params', label: 'params' },
        { key: 'sil_ns', label: 'silicon time', num: true, fmt: (v) => fmt.nsAsUs(v, 3) },
        { key: 'tc', label: 'TC' },
        { key: 'flops', label: 'FLOPs', num: true, fmt: (v, x) => (x.flops_known ? fmtSi(v, '') : '–') },
        { key: 'bytes', label: 'bytes', num: true, fmt: (v, x) => (x.bytes_known ? fmt.bytes(v) : '–') },
        { key: 'device', label: 'device', num: true, fmt: (v) => (Number(v) < 0 ? '–' : String(v)) },
        { key: 'stream', label: 'stream', num: true, fmt: (v) => (Number(v) < 0 ? '–' : String(v)) },
        { key: 'grid', label: 'grid' },
        { key: 'block', label: 'block' },
        { key: 'tid', label: 'thread', num: true },
      ],
      rows,
      pageSize: 100,
    }),
    note('PyProf\'s columns: the kernel\'s short name, the op and module that launched it, fprop or bprop, the autograd ' +
      'sequence number, the silicon time (the kernel\'s duration), TC whether it used Tensor Cores ("-": not a ' +
      'Tensor Core op, "na": unknown), and the FLOPs and bytes of the op\'s formula (docs/specs/flops-bytes.md; "–" ' +
      'where the op has none). The filter matches kernel, op, module, layer, params, grid and block.')));
}
