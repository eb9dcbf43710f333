// Small pieces shared by the rank, HTA and trace pages: option pickers that change the URL
// (the router renders the page again), cards of figures, and the API's NaN strings.

import { h } from '../ui.js';

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
