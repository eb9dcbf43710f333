// Charts shared by the pages: line charts on uPlot (vendor/uplot, MIT), and on plain canvas
// what uPlot does not draw well at 1024 ranks: stacked bars and heat maps. Every chart sits in
// a .kp-chart element with data-kp-chart=NAME, and its tooltip is text (never HTML).

import uPlot from '../vendor/uplot/uPlot.esm.js';
import { h } from './ui.js';

// The step breakdown's categories, in the plugin's order, with one colour each everywhere.
export const CATEGORIES = [
  ['kernel', 'Kernel', '#4e79a7'],
  ['memcpy', 'Memcpy', '#f28e2b'],
  ['memset', 'Memset', '#e15759'],
  ['communication', 'Communication', '#76b7b2'],
  ['runtime', 'Runtime', '#59a14f'],
  ['dataloader', 'DataLoader', '#edc948'],
  ['cpu_exec', 'CPU Exec', '#b07aa1'],
  ['other', 'Other', '#9c9c9c'],
];

export const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948',
  '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

function frame(name, title) {
  const el = h('figure', { class: 'kp-chart', 'data-kp-chart': name });
  if (title) el.append(h('figcaption', {}, title));
  return el;
}

function widthOf(parent) {
  return Math.max(320, Math.min(1400, (parent && parent.clientWidth) || 900) - 24);
}

// A line chart: x values and series [{label, values, color}] of equal length; axes labelled.
// Appends itself to parent (which must be in the document) and returns the figure element.
export function lineChart(parent, name, { title, x, series, xLabel, yLabel, height = 260, yFmt }) {
  const el = frame(name, title);
  parent.append(el);
  const opts = {
    width: widthOf(parent),
    height,
    scales: { x: { time: false } },
    axes: [{ label: xLabel }, { label: yLabel, size: 70, values: yFmt ? (u, vals) => vals.map(yFmt) : undefined }],
    series: [{ label: xLabel }].concat(series.map((s, i) => ({
      label: s.label, stroke: s.color || PALETTE[i % PALETTE.length], width: 1.5,
      fill: s.fill, points: { show: x.length < 60 },
    }))),
  };
  el.append(h('div', { class: 'kp-chart-body' }));
  new uPlot(opts, [x].concat(series.map((s) => s.values)), el.lastChild);
  return el;
}

// A canvas with a tooltip that follows the pointer; hit(x, y) gives the tooltip's text or null
// and click(x, y) is called on a click. Returns {el, canvas, ctx, width, height}.
function canvasChart(parent, name, title, width, height, hit, click) {
  const el = frame(name, title);
  const dpr = window.devicePixelRatio || 1;
  const canvas = h('canvas', { width: Math.round(width * dpr), height: Math.round(height * dpr) });
  canvas.style.width = width + 'px';
  canvas.style.height = height + 'px';
  const tip = h('div', { class: 'kp-tip', hidden: true });
  el.append(h('div', { class: 'kp-chart-body kp-canvas-wrap' }, canvas, tip));
  parent.append(el);
  const ctx = canvas.getContext('2d');
  ctx.scale(dpr, dpr);
  canvas.addEventListener('mousemove', (ev) => {
    const r = canvas.getBoundingClientRect();
    const text = hit(ev.clientX - r.left, ev.clientY - r.top);
    tip.hidden = !text;
    if (text) {
      tip.textContent = text;
      tip.style.left = Math.min(ev.clientX - r.left + 12, width - 200) + 'px';
      tip.style.top = ev.clientY - r.top + 12 + 'px';
    }
  });
  canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
  if (click) {
    canvas.style.cursor = 'pointer';
    canvas.addEventListener('click', (ev) => {
      const r = canvas.getBoundingClientRect();
      click(ev.clientX - r.left, ev.clientY - r.top);
    });
  }
  return { el, ctx, width, height };
}

// Stacked bars: one bar per label, segments from series [{label, values, color}] (values >= 0,
// in the unit of fmt). 1024 bars fit: a bar is at least one pixel, labels thin out.
export function stackedBars(parent, name, { title, labels, series, fmt, height = 280, xLabel, onClick }) {
  const width = widthOf(parent);
  const left = 70;
  const bottom = 36;
  const plotW = width - left - 10;
  const plotH = height - bottom - 10;
  const n = labels.length;
  const totals = labels.map((_, i) => series.reduce((s, se) => s + Math.max(0, se.values[i] || 0), 0));
  const max = Math.max(1e-9, ...totals);
  const bw = plotW / Math.max(1, n);
  const at = (x) => Math.floor((x - left) / bw);
  const c = canvasChart(parent, name, title, width, height,
    (x, y) => {
      const i = at(x);
      if (i < 0 || i >= n || y > 10 + plotH) return null;
      return xLabel + ' ' + labels[i] + ': ' + fmt(totals[i]) + '\n' +
        series.map((se) => se.label + ' ' + fmt(se.values[i] || 0)).join('\n');
    },
    onClick ? (x) => { const i = at(x); if (i >= 0 && i < n) onClick(i); } : null);
  const { ctx } = c;
  ctx.font = '11px sans-serif';
  ctx.fillStyle = '#444';
  ctx.strokeStyle = '#ddd';
  for (let k = 0; k <= 4; k++) {
    const y = 10 + plotH - (plotH * k) / 4;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(left + plotW, y);
    ctx.stroke();
    ctx.textAlign = 'right';
    ctx.fillText(fmt((max * k) / 4), left - 4, y + 4);
  }
  for (let i = 0; i < n; i++) {
    let y = 10 + plotH;
    for (const se of series) {
      const v = Math.max(0, se.values[i] || 0);
      const hgt = (v / max) * plotH;
      ctx.fillStyle = se.color;
      ctx.fillRect(left + i * bw + (bw > 4 ? 1 : 0), y - hgt, Math.max(1, bw - (bw > 4 ? 2 : 0)), hgt);
      y -= hgt;
    }
  }
  ctx.fillStyle = '#444';
  ctx.textAlign = 'center';
  const every = Math.ceil(n / Math.max(1, Math.floor(plotW / 40)));
  for (let i = 0; i < n; i += every) ctx.fillText(String(labels[i]), left + (i + 0.5) * bw, 10 + plotH + 14);
  ctx.fillText(xLabel, left + plotW / 2, height - 4);
  c.el.append(legend(series));
  return c.el;
}

// A heat map of rows x cols cells (1024 x 600 stay one canvas): value(r, c) a number or null
// (absent, drawn hatched grey); colours from white (lo) to dark red (hi), lo/hi given or the
// data's range. rowLabel/colLabel name a row and column in the tooltip; fmt a value.
export function heatmap(parent, name, { title, rows, cols, value, rowLabel, colLabel, fmt, lo, hi, height, onClick }) {
  const width = widthOf(parent);
  const left = 70;
  const top = 6;
  const plotW = width - left - 10;
  const cellH = Math.max(1, Math.min(18, Math.floor(480 / Math.max(1, rows))));
  const plotH = cellH * rows;
  const H = height || plotH + top + 40;
  const cw = plotW / Math.max(1, cols);
  let min = Infinity;
  let max = -Infinity;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const v = value(r, c);
      if (v === null || v === undefined || Number.isNaN(v)) continue;
      if (v < min) min = v;
      if (v > max) max = v;
    }
  }
  const a = lo !== undefined ? lo : min;
  const b = hi !== undefined ? hi : max;
  const cell = (x, y) => [Math.floor((y - top) / cellH), Math.floor((x - left) / cw)];
  const ch = canvasChart(parent, name, title, width, H,
    (x, y) => {
      const [r, c] = cell(x, y);
      if (r < 0 || r >= rows || c < 0 || c >= cols) return null;
      const v = value(r, c);
      return rowLabel(r) + ', ' + colLabel(c) + ': ' + (v === null || v === undefined || Number.isNaN(v) ? 'absent' : fmt(v));
    },
    onClick ? (x, y) => { const [r, c] = cell(x, y); if (r >= 0 && r < rows && c >= 0 && c < cols) onClick(r, c); } : null);
  const { ctx } = ch;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const v = value(r, c);
      ctx.fillStyle = v === null || v === undefined || Number.isNaN(v) ? '#d0d0d0' : heat(b > a ? (v - a) / (b - a) : 0);
      ctx.fillRect(left + c * cw, top + r * cellH, Math.ceil(cw), cellH);
    }
  }
  ctx.font = '11px sans-serif';
  ctx.fillStyle = '#444';
  ctx.textAlign = 'right';
  const everyR = Math.ceil(rows / Math.max(1, Math.floor(plotH / 14)));
  for (let r = 0; r < rows; r += everyR) ctx.fillText(rowLabel(r), left - 4, top + r * cellH + Math.min(cellH, 12));
  ctx.textAlign = 'center';
  const everyC = Math.ceil(cols / Math.max(1, Math.floor(plotW / 50)));
  for (let c = 0; c < cols; c += everyC) ctx.fillText(colLabel(c), left + (c + 0.5) * cw, top + plotH + 14);
  ch.el.append(h('div', { class: 'kp-scale' }, fmt(a), h('span', { class: 'kp-scale-bar' }), fmt(b)));
  return ch.el;
}

// White (0) through orange to dark red (1).
export function heat(t) {
  const x = Math.min(1, Math.max(0, t));
  const r = Math.round(255 - 90 * Math.max(0, x - 0.5) * 2);
  const g = Math.round(255 - 235 * x);
  const b = Math.round(255 - 245 * Math.min(1, x * 1.6));
  return 'rgb(' + r + ',' + g + ',' + b + ')';
}

export function legend(series) {
  // colours through the CSSOM: a style attribute would need CSP's 'unsafe-inline'
  return h('div', { class: 'kp-legend' }, series.map((s) => {
    const sw = h('span', { class: 'kp-swatch' });
    sw.style.background = s.color;
    return h('span', { class: 'kp-legend-item' }, sw, s.label);
  }));
}
