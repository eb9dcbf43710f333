// Small pieces shared by the rank, HTA and trace pages: option pickers that change the URL
// (the router renders the page again), cards of figures, and the API's NaN strings.

import { fmt, h } from '../ui.js';

// A labelled <select> whose change goes to href(value): options [[value, text], ...].
export function picker(label, options, current, href, attrs) {
  const sel = h('select', Object.assign({ 'aria-label': label }, attrs || {}),
    options.map(([v, t]) => h('option', { value: v, selected: v === current }, t)));
  sel.addEventListener('change', () => { location.hash = href(sel.value); });
  return h('label', { class: 'kp-picker' }, label + ' ', sel);
}

// A checkbox that goes to href(checked) when toggled.
export function toggle(label, on, href, attrs) {
  const box = h('input', Object.assign({ type: 'checkbox', checked: on }, attrs || {}));
  box.addEventListener('change', () => { location.hash = href(box.checked); });
  return h('label', { class: 'kp-picker' }, box, ' ' + label);
}

export function toolbar(...items) {
  return h('div', { class: 'kp-toolbar' }, items);
}

// A card: a label over a figure (a ui.fig node), with an optional note under it.
export function card(label, figure, note) {
  return h('div', { class: 'kp-card' }, h('div', { class: 'kp-label' }, label), figure,
    note ? h('div', { class: 'kp-card-note kp-muted' }, note) : null);
}

export function cards(...items) {
  return h('div', { class: 'kp-cards' }, items);
}

// The API writes NaN and the infinities as strings: a number, or null when not finite.
export function finite(v) {
  if (v === null || v === undefined || v === '') return null;
  const x = Number(v);
  return Number.isFinite(x) ? x : null;
}

// A paragraph of explanation (what a figure means, why a table is empty).
export function note(text, cls) {
  return h('p', { class: 'kp-note' + (cls ? ' ' + cls : '') }, text);
}

// A horizontal bar of shares: parts [{label, value, color}], widths through the CSSOM (CSP).
export function shareBar(name, parts) {
  const total = parts.reduce((s, p) => s + Math.max(0, p.value || 0), 0);
  return h('div', { class: 'kp-sharebar', 'data-kp-chart': name }, parts.map((p) => {
    const seg = h('span', { class: 'kp-sharebar-seg', title: p.label });
    seg.style.width = (total > 0 ? (100 * Math.max(0, p.value || 0)) / total : 0) + '%';
    seg.style.background = p.color;
    return seg;
  }));
}

// The top rows of an answer as horizontal bars (the plugin's pie charts, readable with long
// names): rows [{label, value, figure}], figure the ui.fig node of the value.
export function barList(name, title, items) {
  const max = Math.max(1e-9, ...items.map((x) => Number(x.value) || 0));
  return h('figure', { class: 'kp-chart kp-barlist', 'data-kp-chart': name }, h('figcaption', {}, title),
    items.map((x) => {
      const bar = h('span', { class: 'kp-barlist-bar' });
      bar.style.width = Math.max(0.5, (100 * (Number(x.value) || 0)) / max) + '%';
      return h('div', { class: 'kp-barlist-row' }, h('span', { class: 'kp-barlist-label', title: x.label }, x.label),
        h('span', { class: 'kp-barlist-track' }, bar), h('span', { class: 'kp-barlist-value' }, x.figure));
    }));
}

// The indexes of the n rows with the largest value(row), largest first.
export function topIndexes(rows, n, value) {
  return rows.map((r, i) => i).filter((i) => Number(value(rows[i])) > 0)
    .sort((a, b) => Number(value(rows[b])) - Number(value(rows[a])) || a - b).slice(0, n);
}

// 1.2 GFLOP style: SI prefixes with one decimal.
export function fmtSi(v, unit) {
  const x = Number(v);
  if (!Number.isFinite(x)) return '–';
  const p = [[1e15, 'P'], [1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']].find(([s]) => Math.abs(x) >= s);
  return p ? fmt.num(x / p[0], 1) + ' ' + p[1] + unit : fmt.num(x, 0) + (unit ? ' ' + unit : '');
}

// The first hosts by name, and how many more (a 1024-rank run has hundreds).
export function hostList(hosts) {
  if (hosts.length === 0) return '–';
  return hosts.slice(0, 8).join(', ') + (hosts.length > 8 ? ' and ' + (hosts.length - 8) + ' more' : '');
}
