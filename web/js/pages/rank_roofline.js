// The roofline (Roofline view, analyzer/roofline.h): each kernel (or op) at its arithmetic
// intensity (FLOP/byte) and achieved FLOP/s on log-log axes, under its device's ceilings: the
// memory bandwidth's slope and one roof per peak (fp32, tf32, fp16, fp8). On a canvas of its
// own: uPlot's scatter mode would need its own data layout for little gain.

import { view } from '../api.js';
import { PALETTE, legend } from '../charts.js';
import { fig, fmt, h, section, table } from '../ui.js';
import { fmtSi, note, picker, toolbar } from './rank_util.js';

const GROUPS = [['ROOFLINE_GROUP_BY_KERNEL', 'kernel'], ['ROOFLINE_GROUP_BY_OP', 'op and direction']];
const PEAKS = [['fp32', 'peak_fp32_flop_per_s', '#4e79a7'], ['tf32', 'peak_tf32_flop_per_s', '#76b7b2'],
  ['fp16', 'peak_fp16_flop_per_s', '#e15759'], ['fp8', 'peak_fp8_flop_per_s', '#b07aa1']];
const POINT_COLOUR = { fp32: '#4e79a7', tf32: '#76b7b2', fp16: '#e15759', fp8: '#b07aa1', mixed: '#f28e2b', '-': '#9c9c9c' };

export async function render(root, ctx) {
  const groupBy = GROUPS.some((g) => g[0] === ctx.params.group_by) ? ctx.params.group_by : GROUPS[0][0];
  const r = await view(ctx.run, 'roofline', { rank: ctx.rank, group_by: groupBy });
  const devices = r.devices || [];
  const rows = r.rows || [];
  const plotted = rows.map((x, i) => ({ x, i })).filter(({ x }) => x.intensity_defined && x.flop_per_s_defined &&
    Number(x.intensity) > 0 && Number(x.flop_per_s) > 0);
  const devIds = [...new Set(rows.map((x) => x.device))].sort((a, b) => a - b);
  const dev = ctx.params.device !== undefined && devIds.includes(Number(ctx.params.device)) ? Number(ctx.params.device)
    : devIds.length ? devIds[0] : null;
  root.append(toolbar(
    picker('Group by', GROUPS, groupBy, (v) => ctx.href({ group_by: v, device: ctx.params.device }), { 'data-kp-option': 'group_by' }),
    devIds.length > 1 ? picker('Device', devIds.map((d) => [String(d), 'GPU ' + d]), String(dev),
      (v) => ctx.href({ group_by: groupBy, device: v }), { 'data-kp-option': 'device' }) : null));

  const chart = section('Roofline' + (dev !== null ? ' of GPU ' + dev : ''));
  root.append(chart);
  const di = devices.findIndex((d) => d.id === dev);
  const mine = plotted.filter(({ x }) => x.device === dev);
  if (rows.length === 0) {
    chart.append(note('No kernel on this rank.'));
  } else if (mine.length === 0) {
    chart.append(h('div', { class: 'kp-empty', 'data-kp-empty': 'roofline' },
      'No ' + (groupBy === 'ROOFLINE_GROUP_BY_OP' ? 'op' : 'kernel') + ' of this device has both FLOPs and bytes: kprof derives them ' +
      'from the ops\' shapes (record_shapes=True in torch.profiler) for the ops of its table (docs/specs/flops-bytes.md), ' +
      'or takes them from hardware counters (the Counters tab).'));
  } else {
    drawRoofline(chart, di >= 0 ? devices[di] : null, mine);
  }
  if (di >= 0) {
    const d = devices[di];
    const p = 'roofline:devices[' + di + '].';
    chart.append(h('p', { class: 'kp-note' }, 'Ceilings of ', fig(p + 'name', d.name), ': ',
      PEAKS.filter(([, key]) => Number(d[key]) > 0).map(([label, key]) => [label + ' ', fig(p + key, d[key], fmtSi(d[key], 'FLOP/s')), ', ']),
      'memory bandwidth ', fig(p + 'bandwidth_bytes_per_s', d.bandwidth_bytes_per_s,
        Number(d.bandwidth_bytes_per_s) > 0 ? fmt.bytes(d.bandwidth_bytes_per_s) + '/s' : 'unknown'),
      '. Why these: ', fig(p + 'source', d.source), '.'));
  }

  root.append(section((groupBy === 'ROOFLINE_GROUP_BY_OP' ? 'Ops' : 'Kernels') + ' (' + rows.length + ')', table({
    id: 'roofline:rows',
    columns: [
      { key: 'name', label: groupBy === 'ROOFLINE_GROUP_BY_OP' ? 'op' : 'kernel' },
      groupBy === 'ROOFLINE_GROUP_BY_OP' ? { key: 'dir', label: 'direction' } : null,
      { key: 'device', label: 'GPU', num: true },
      { key: 'peak', label: 'peak used' },
      { key: 'kernels', label: 'kernels', num: true, fmt: (v) => fmt.count(v) },
      { key: 'time_ns', label: 'time', num: true, fmt: (v) => fmt.nsAsUs(v) },
      { key: 'flops', label: 'FLOPs', num: true, fmt: (v, x) => (x.flops_known ? fmtSi(v, '') : '–') },
      { key: 'bytes', label: 'bytes', num: true, fmt: (v, x) => (x.bytes_known ? fmt.bytes(v) : '–') },
      { key: 'intensity', label: 'FLOP/byte', num: true, fmt: (v, x) => (x.intensity_defined ? fmt.num(v, 2) : '–') },
      { key: 'flop_per_s', label: 'FLOP/s', num: true, fmt: (v, x) => (x.flop_per_s_defined ? fmtSi(v, '') : '–') },
      { key: 'compute_fraction', label: '% of peak', num: true, fmt: (v, x) => (x.compute_fraction_defined ? fmt.fracAsPct(v) : '–') },
      { key: 'bytes_per_s', label: 'bytes/s', num: true, fmt: (v, x) => (x.bytes_per_s_defined ? fmt.bytes(v) + '/s' : '–') },
      { key: 'bandwidth_fraction', label: '% of bandwidth', num: true, fmt: (v, x) => (x.bandwidth_fraction_defined ? fmt.fracAsPct(v) : '–') },
      { key: 'above_peak', label: 'above peak', fmt: (v) => v || '' },
    ].filter(Boolean),
    rows,
    pageSize: 50,
  }), note('A figure above 100 % of its peak ("above peak") means the FLOP or byte model, or the peak, is wrong for ' +
    'that kernel: read it as a bound, not a measurement.')));
}

const log10 = (v) => Math.log10(v);

// Log-log axes from the points and the device's ceilings; points sized by their time.
function drawRoofline(parent, device, points) {
  const width = Math.max(420, Math.min(1100, (parent.clientWidth || 900) - 24));
  const height = 420;
  const left = 80;
  const right = 16;
  const top = 14;
  const bottom = 46;
  const pw = width - left - right;
  const ph = height - top - bottom;
  const peaks = device ? PEAKS.filter(([, key]) => Number(device[key]) > 0).map(([l, key, c]) => [l, Number(device[key]), c]) : [];
  const bw = device ? Number(device.bandwidth_bytes_per_s) : 0;
  const xs = points.map(({ x }) => Number(x.intensity));
  const ys = points.map(({ x }) => Number(x.flop_per_s));
  const topPeak = peaks.reduce((m, p) => Math.max(m, p[1]), 0);
  let x0 = Math.floor(log10(Math.min(...xs)) - 0.3);
  let x1 = Math.ceil(log10(Math.max(...xs)) + 0.3);
  if (bw > 0 && topPeak > 0) {
    const ridge = topPeak / bw;
    x0 = Math.min(x0, Math.floor(log10(ridge) - 1));
    x1 = Math.max(x1, Math.ceil(log10(ridge) + 1));
  }
  const y1 = Math.ceil(log10(Math.max(topPeak, ...ys)) + 0.2);
  let y0 = Math.floor(log10(Math.min(...ys)) - 0.3);
  if (bw > 0) y0 = Math.min(y0, Math.floor(log10(bw * 10 ** x0)));
  y0 = Math.max(y0, y1 - 9);
  const X = (v) => left + ((log10(v) - x0) / (x1 - x0)) * pw;
  const Y = (v) => top + ph - ((log10(v) - y0) / (y1 - y0)) * ph;

  const el = h('figure', { class: 'kp-chart', 'data-kp-chart': 'roofline' },
    h('figcaption', {}, 'Achieved FLOP/s against arithmetic intensity (log-log); a dot\'s area is its time'));
  const dpr = window.devicePixelRatio || 1;
  const canvas = h('canvas', { width: Math.round(width * dpr), height: Math.round(height * dpr) });
  canvas.style.width = width + 'px';
  canvas.style.height = height + 'px';
  const tip = h('div', { class: 'kp-tip', hidden: true });
  el.append(h('div', { class: 'kp-chart-body kp-canvas-wrap' }, canvas, tip));
  parent.append(el);
  const ctx = canvas.getContext('2d');
  ctx.scale(dpr, dpr);
  ctx.font = '11px sans-serif';
  ctx.strokeStyle = '#e4e7ec';
  ctx.fillStyle = '#444';
  for (let e = x0; e <= x1; e++) {
    const x = X(10 ** e);
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + ph);
    ctx.stroke();
    ctx.textAlign = 'center';
    ctx.fillText(fmtPow(e), x, top + ph + 14);
  }
  for (let e = y0; e <= y1; e++) {
    const y = Y(10 ** e);
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(left + pw, y);
    ctx.stroke();
    ctx.textAlign = 'right';
    ctx.fillText(fmtSi(10 ** e, ''), left - 6, y + 4);
  }
  ctx.textAlign = 'center';
  ctx.fillText('arithmetic intensity (FLOP/byte)', left + pw / 2, height - 6);
  ctx.save();
  ctx.translate(14, top + ph / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText('achieved FLOP/s', 0, 0);
  ctx.restore();
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, pw, ph);
  ctx.clip();
  ctx.lineWidth = 2;
  for (const [label, peak, colour] of peaks) {
    // the roof: bandwidth-bound up to the ridge point, then flat at the peak
    ctx.strokeStyle = colour;
    ctx.beginPath();
    if (bw > 0) {
      ctx.moveTo(X(10 ** x0), Y(bw * 10 ** x0));
      ctx.lineTo(X(peak / bw), Y(peak));
    } else {
      ctx.moveTo(X(10 ** x0), Y(peak));
    }
    ctx.lineTo(X(10 ** x1), Y(peak));
    ctx.stroke();
    ctx.fillStyle = colour;
    ctx.textAlign = 'right';
    ctx.fillText(label + ' peak ' + fmtSi(peak, 'FLOP/s'), left + pw - 4, Y(peak) - 4);
  }
  if (bw > 0) {
    ctx.fillStyle = '#444';
    ctx.textAlign = 'left';
    const xi = 10 ** (x0 + 0.3);
    ctx.fillText('memory ' + fmt.bytes(bw) + '/s', X(xi) + 4, Y(bw * xi) - 6);
  }
  const total = points.reduce((s, { x }) => s + Number(x.time_ns), 0) || 1;
  const drawn = points.map(({ x, i }) => ({
    x, i, cx: X(Number(x.intensity)), cy: Y(Number(x.flop_per_s)),
    r: Math.max(2.5, Math.min(18, Math.sqrt(Number(x.time_ns) / total) * 30)),
  })).sort((a, b) => b.r - a.r);
  ctx.lineWidth = 1;
  for (const d of drawn) {
    ctx.globalAlpha = 0.65;
    ctx.fillStyle = POINT_COLOUR[d.x.peak] || PALETTE[6];
    ctx.beginPath();
    ctx.arc(d.cx, d.cy, d.r, 0, 2 * Math.PI);
    ctx.fill();
    ctx.globalAlpha = 1;
    ctx.strokeStyle = d.x.above_peak ? '#b3261e' : '#fff';
    ctx.stroke();
  }
  ctx.restore();
  canvas.addEventListener('mousemove', (ev) => {
    const b = canvas.getBoundingClientRect();
    const mx = ev.clientX - b.left;
    const my = ev.clientY - b.top;
    let best = null;
    for (const d of drawn) {
      const dist = Math.hypot(d.cx - mx, d.cy - my);
      if (dist <= Math.max(d.r, 5) && (!best || dist < best.dist)) best = { d, dist };
    }
    tip.hidden = !best;
    if (best) {
      const x = best.d.x;
      tip.textContent = x.name + (x.dir ? ' (' + x.dir + ')' : '') + '\n' + fmt.num(x.intensity, 2) + ' FLOP/byte, ' +
        fmtSi(x.flop_per_s, 'FLOP/s') + (x.compute_fraction_defined ? ' (' + fmt.fracAsPct(x.compute_fraction) + ' of ' + x.peak + ' peak)' : '') +
        '\n' + fmt.count(x.kernels) + ' kernels, ' + fmt.nsAsUs(x.time_ns) + (x.above_peak ? '\nabove peak: ' + x.above_peak : '');
      tip.style.left = Math.min(mx + 12, width - 260) + 'px';
      tip.style.top = my + 12 + 'px';
    }
  });
  canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
  const used = [...new Set(points.map(({ x }) => x.peak))];
  el.append(legend(used.map((p) => ({ label: 'peak ' + p, color: POINT_COLOUR[p] || PALETTE[6] }))));
}

function fmtPow(e) {
  return e >= -2 && e <= 4 ? String(10 ** e >= 1 ? 10 ** e : Number((10 ** e).toFixed(-e))) : '1e' + e;
}
