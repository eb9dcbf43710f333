// The memory view (the plugin's "Memory" view; Memory, spec tbplugin-views §10): per operator
// name and device, the memory it allocated (self and with its callees); and, on request, the
// memory curve per device, which the Memory view does not carry: drawn here from the rank's
// own trace (the export), its [memory] records' "Total Allocated" and "Total Reserved".

import { url, view } from '../api.js';
import { lineChart } from '../charts.js';
import { fig, fmt, h, link, section, table } from '../ui.js';
import { card, cards, note } from './rank_util.js';

export async function render(root, ctx) {
  const m = await view(ctx.run, 'memory', { rank: ctx.rank });
  const devices = m.devices || [];
  const rows = m.rows || [];
  if (devices.length === 0) {
    root.append(section('Memory', h('div', { class: 'kp-empty', 'data-kp-empty': 'memory' },
      'No memory records on this rank (devices with records: ', fig('memory:devices', devices, 'none'),
      '): the trace has no [memory] events. Capture them with ',
      h('code', {}, 'profile_memory=True'), ' in torch.profiler (kprof-run and the agent\'s capture record them when asked to).')));
    return;
  }
  const perDevice = devices.map((d) => rows.filter((r) => r.device === d));
  root.append(section('Devices',
    cards(devices.map((d, i) => {
      const own = perDevice[i];
      const alloc = own.reduce((s, r) => s + Number(r.self_alloc_bytes), 0);
      return card(h('span', {}, fig('memory:devices[' + i + ']', d), ': allocated by operators (self)'),
        fig('calc:self_alloc_bytes_' + d, alloc, fmt.bytes(alloc)), own.length + ' operators');
    }))));

  const curve = section('Memory curve');
  root.append(curve);
  curve.append(note('The Memory view gives allocations per operator; the curve over time is read from the rank\'s trace ' +
    '(its export, the same file as the trace page\'s download), which can be large: it is fetched only when you ask.'));
  if (ctx.params.curve !== '1') {
    curve.append(h('div', { class: 'kp-trace-actions' },
      link(ctx.href({ curve: '1' }), 'Draw the memory curve from the trace', { class: 'kp-button', 'data-kp-action': 'memory-curve' })));
  } else {
    const status = h('div', { class: 'kp-trace-status', role: 'status' }, 'reading the trace…');
    const out = h('div', { class: 'kp-memory-curves' });
    curve.append(status, out);
    try {
      const { events, bytes } = await memoryRecords(url('/runs/' + ctx.run + '/export', { rank: ctx.rank, format: 'json' }),
        (n) => { status.textContent = 'reading the trace: ' + fmt.bytes(n) + '…'; });
      status.textContent = 'read ' + fmt.bytes(bytes) + ' of trace JSON, ' + fmt.count(events.length) + ' memory records';
      drawCurves(out, events);
    } catch (e) {
      status.classList.add('kp-bad');
      status.textContent = 'the curve could not be drawn: ' + e.message;
    }
  }

  root.append(section('Allocations per operator (' + rows.length + ')',
    table({
      id: 'memory:rows',
      columns: [
        { key: 'name', label: 'operator' },
        { key: 'device', label: 'device' },
        { key: 'calls', label: 'calls', num: true, fmt: (v) => fmt.count(v) },
        { key: 'self_increase_bytes', label: 'self increase', num: true, fmt: (v) => fmt.bytes(v) },
        { key: 'self_alloc_count', label: 'self allocations', num: true, fmt: (v) => fmt.count(v) },
        { key: 'self_alloc_bytes', label: 'self allocated', num: true, fmt: (v) => fmt.bytes(v) },
        { key: 'increase_bytes', label: 'increase', num: true, fmt: (v) => fmt.bytes(v) },
        { key: 'alloc_count', label: 'allocations', num: true, fmt: (v) => fmt.count(v) },
        { key: 'alloc_bytes', label: 'allocated', num: true, fmt: (v) => fmt.bytes(v) },
      ],
      rows,
      pageSize: 50,
    }),
    note('Self: records inside the operator itself; the others add its callees. Increase: allocations minus frees. ' +
      'Type a device (GPU0, CPU) in the filter to see one device.')));
}

// The [memory] records of the rank's export, read as a stream: kprof's export writes one
// event a line (analyzer/export_int.h), so only those lines are parsed and a trace of 1 M
// events never sits in memory whole. Resolves to {events, bytes}.
async function memoryRecords(u, progress) {
  const r = await fetch(u, { credentials: 'same-origin' });
  if (!r.ok) {
    let msg = r.status + ' ' + r.statusText;
    try {
      const j = await r.json();
      if (j && j.error) msg = j.error.message;
    } catch (e) {
      // the body was not JSON: keep the status line
    }
    throw new Error(msg);
  }
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  const events = [];
  let rest = '';
  let bytes = 0;
  let last = 0;
  const take = (line) => {
    if (line.indexOf('"[memory]"') < 0) return;
    const j = line.replace(/^[\s,]+/, '').replace(/[\s,]+$/, '');
    try {
      events.push(JSON.parse(j));
    } catch (e) {
      // not one whole event on this line: not kprof's export layout; skip it
    }
  };
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.byteLength;
    if (bytes - last > (4 << 20)) {
      last = bytes;
      progress(bytes);
    }
    const text = rest + dec.decode(value, { stream: true });
    const lines = text.split('\n');
    rest = lines.pop();
    for (const line of lines) take(line);
  }
  take(rest + dec.decode());
  return { events, bytes };
}

// One chart per device: total allocated and reserved (MiB) over the trace's time (ms).
function drawCurves(out, events) {
  const byDev = new Map();
  for (const e of events) {
    if (e.name !== '[memory]' || !e.args) continue;
    const a = e.args;
    const type = Number(a['Device Type']);
    if (type !== 0 && type !== 1) continue;
    const alloc = Number(a['Total Allocated']);
    const resv = Number(a['Total Reserved']);
    if (!Number.isFinite(alloc) || !Number.isFinite(resv) || a.Addr === undefined) continue;
    const dev = type === 0 ? 'CPU' : 'GPU' + Number(a['Device Id']);
    if (!byDev.has(dev)) byDev.set(dev, []);
    byDev.get(dev).push([Number(e.ts), alloc, resv, Number(a.Bytes) || 0]);
  }
  out.replaceChildren();
  if (byDev.size === 0) {
    out.append(note('The trace has no [memory] records with totals.'));
    return;
  }
  const names = [...byDev.keys()].sort((x, y) => (x === 'CPU' ? -1 : y === 'CPU' ? 1 : x.localeCompare(y, 'en', { numeric: true })));
  const t0 = Math.min(...[...byDev.values()].map((p) => p.reduce((s, x) => Math.min(s, x[0]), Infinity)));
  for (const dev of names) {
    const all = byDev.get(dev).sort((p, q) => p[0] - q[0]);
    let summed = false;
    if (all.every((p) => p[1] === 0 && p[2] === 0) && all.some((p) => p[3] !== 0)) {
      // Older torch.profiler traces carry no totals (the export then writes 0): sum the
      // records' bytes instead, from 0 at the trace's first record.
      out.append(note(dev + ': the trace\'s memory records carry no "Total Allocated" (a trace of an older ' +
        'PyTorch): the curve shows the sum of the records\' bytes since the first record instead, and no reserved memory.', 'kp-warn-note'));
      summed = true;
      let sum = 0;
      for (const p of all) {
        sum += p[3];
        p[1] = sum;
      }
    }
    const pts = thin(all, 4000);
    const peak = byDev.get(dev).reduce((s, p) => Math.max(s, p[1]), 0);
    out.append(h('div', { class: 'kp-kv-line' }, dev + ': peak allocated ', fig('calc:peak_allocated_' + dev, peak, fmt.bytes(peak)),
      ' (' + byDev.get(dev).length + ' records)'));
    lineChart(out, 'memory-curve-' + dev, {
      title: dev + ': memory in use (MiB)',
      x: pts.map((p) => (p[0] - t0) / 1000),
      series: [{ label: summed ? 'sum of bytes' : 'allocated', values: pts.map((p) => p[1] / 1048576), color: '#4e79a7' }]
        .concat(summed ? [] : [{ label: 'reserved', values: pts.map((p) => p[2] / 1048576), color: '#f28e2b' }]),
      xLabel: 'time (ms)',
      yLabel: 'MiB',
      height: 220,
    });
  }
}

// At most n points: each of n/2 buckets keeps its lowest and highest allocation, in time
// order, so peaks and troughs survive the thinning.
function thin(pts, n) {
  if (pts.length <= n) return pts;
  const out = [];
  const buckets = Math.floor(n / 2);
  const per = pts.length / buckets;
  for (let b = 0; b < buckets; b++) {
    let lo = null;
    let hi = null;
    for (let i = Math.floor(b * per); i < Math.min(pts.length, Math.floor((b + 1) * per)); i++) {
      if (!lo || pts[i][1] < lo[1]) lo = pts[i];
      if (!hi || pts[i][1] > hi[1]) hi = pts[i];
    }
    if (!lo) continue;
    if (lo === hi) out.push(lo);
    else if (lo[0] <= hi[0]) out.push(lo, hi);
    else out.push(hi, lo);
  }
  return out;
}
