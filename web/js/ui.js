// DOM helpers shared by the pages: an element builder (never innerHTML: every string the API
// gives is text), figures the browser test reads back, number formats, paged tables.

// h('div', {class: 'x', 'data-kp-figure': 'f', onclick: fn}, child, ...): children are nodes,
// strings (text), arrays (flattened), or null/undefined/false (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// A figure: text for the reader, and in data-kp-value the API's value as it came (the browser
// test compares it with the API's answer), under a name (data-kp-figure) the test looks up.
export function fig(name, value, text) {
  return h('span', { class: 'kp-fig', 'data-kp-figure': name, 'data-kp-value': raw(value) },
    text === undefined ? raw(value) : text);
}

function raw(v) {
  if (v === undefined || v === null) return '';
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

const group = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

function num(v, digits) {
  if (v === null || v === undefined || v === '' || Number.isNaN(Number(v))) return '–';
  return Number(v).toLocaleString('en-US', {
    minimumFractionDigits: digits, maximumFractionDigits: digits,
  });
}

// Formats, with the units kprofctl prints (docs/cli.md): times in µs (the API's *_ns / 1000,
// its *_us as they are), percentages of 0..100, bytes in binary units.
export const fmt = {
  num,
  count: (v) => (v === null || v === undefined ? '–' : group.format(Number(v))),
  us: (v, digits = 1) => num(v, digits) + ' µs',
  nsAsUs: (v, digits = 1) => (v === null || v === undefined ? '–' : num(Number(v) / 1000, digits) + ' µs'),
  nsAsMs: (v, digits = 2) => (v === null || v === undefined ? '–' : num(Number(v) / 1e6, digits) + ' ms'),
  pct: (v, digits = 1) => num(v, digits) + ' %',
  fracAsPct: (v, digits = 1) => (v === null || v === undefined ? '–' : num(Number(v) * 100, digits) + ' %'),
  bytes: (v) => {
    if (v === null || v === undefined) return '–';
    let x = Number(v);
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(x) >= 1024 && i < units.length - 1) {
      x /= 1024;
      i++;
    }
    return num(x, i === 0 ? 0 : 1) + ' ' + units[i];
  },
  time: (ns) => (ns ? new Date(Number(ns) / 1e6).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') : '–'),
};

export function section(title, ...children) {
  return h('section', { class: 'kp-section' }, h('h2', {}, title), children);
}

// Label/value pairs, values being nodes (fig) or strings.
export function kv(pairs) {
  return h('dl', { class: 'kp-kv' }, pairs.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

export function link(href, text, attrs) {
  return h('a', Object.assign({ href }, attrs || {}), text);
}

export function loading(text) {
  return h('div', { class: 'kp-loading', role: 'status' }, text || 'loading…');
}

// An API refusal or a page's own error, with what to do.
export function errorBox(err) {
  const status = err && err.status ? 'HTTP ' + err.status + (err.code ? ' ' + err.code : '') : '';
  return h('div', { class: 'kp-error', role: 'alert', 'data-kp-error': err && err.status ? err.status : 'page' },
    h('strong', {}, 'This page could not be shown'), status ? h('div', {}, status) : null,
    h('div', {}, err && err.message ? err.message : String(err)));
}

// Tabs: items [{id, label, href}], the current one marked.
export function tabs(current, items) {
  return h('nav', { class: 'kp-tabs' }, items.map((t) => h('a', {
    href: t.href, class: t.id === current ? 'kp-tab kp-tab-on' : 'kp-tab',
    'aria-current': t.id === current ? 'page' : null, 'data-kp-tab': t.id,
  }, t.label)));
}

// A sortable, filterable, paged table (1000s of rows stay fast: only a page is in the DOM).
//   id: data-kp-table, the name the browser test finds it by
//   columns: [{key, label, num: bool, fmt: (value, row) => string, value: (row) => raw}]
//   rows: objects; a cell's raw value is column.value(row) or row[key], kept in data-kp-value
//   sort: {key, desc} the initial order (default: as given); pageSize: rows a page (50)
//   rowHref: (row) => link of the row's first cell, or null
export function table({ id, columns, rows, sort, pageSize = 50, rowHref }) {
  const state = { key: sort ? sort.key : null, desc: sort ? !!sort.desc : false, page: 0, filter: '' };
  const valueOf = (c, r) => (c.value ? c.value(r) : r[c.key]);
  const indexed = rows.map((r, i) => ({ r, i }));
  const wrap = h('div', { class: 'kp-table', 'data-kp-table': id, 'data-kp-rows': rows.length });
  const filter = h('input', { type: 'search', placeholder: 'filter by name', class: 'kp-filter', 'aria-label': 'filter rows' });
  const info = h('span', { class: 'kp-table-info' });
  const prev = h('button', { type: 'button' }, '‹ prev');
  const next = h('button', { type: 'button' }, 'next ›');
  const tbody = h('tbody');
  const head = h('tr', {}, columns.map((c) => h('th', {
    class: c.num ? 'kp-num' : null, 'data-kp-key': c.key, title: 'sort by ' + c.label,
    onclick: () => {
      state.desc = state.key === c.key ? !state.desc : !!c.num;
      state.key = c.key;
      state.page = 0;
      draw();
    },
  }, c.label)));
  wrap.append(h('div', { class: 'kp-table-bar' }, filter, info, prev, next),
    h('table', {}, h('thead', {}, head), tbody));
  filter.addEventListener('input', () => {
    state.filter = filter.value.toLowerCase();
    state.page = 0;
    draw();
  });
  prev.addEventListener('click', () => { state.page--; draw(); });
  next.addEventListener('click', () => { state.page++; draw(); });

  function draw() {
    let list = indexed;
    if (state.filter) {
      list = list.filter(({ r }) => columns.some((c) => !c.num && String(valueOf(c, r) ?? '').toLowerCase().includes(state.filter)));
    }
    if (state.key !== null) {
      const c = columns.find((x) => x.key === state.key);
      list = list.slice().sort((a, b) => {
        const x = valueOf(c, a.r);
        const y = valueOf(c, b.r);
        const d = c.num ? Number(x) - Number(y) : String(x).localeCompare(String(y));
        return (state.desc ? -d : d) || a.i - b.i;
      });
    }
    const pages = Math.max(1, Math.ceil(list.length / pageSize));
    state.page = Math.min(Math.max(state.page, 0), pages - 1);
    const from = state.page * pageSize;
    const shown = list.slice(from, from + pageSize);
    tbody.replaceChildren(...shown.map(({ r, i }) => h('tr', { 'data-kp-row': i }, columns.map((c, ci) => {
      const v = valueOf(c, r);
      const text = c.fmt ? c.fmt(v, r) : v === undefined || v === null ? '' : String(v);
      const href = ci === 0 && rowHref ? rowHref(r) : null;
      return h('td', { class: c.num ? 'kp-num' : null, 'data-kp-key': c.key, 'data-kp-value': raw(v) },
        href ? link(href, text) : text);
    }))));
    for (const th of head.children) {
      th.classList.toggle('kp-sorted', th.dataset.kpKey === state.key);
      th.classList.toggle('kp-desc', th.dataset.kpKey === state.key && state.desc);
    }
    info.textContent = list.length === 0 ? 'no rows'
      : 'rows ' + (from + 1) + '–' + (from + shown.length) + ' of ' + list.length;
    prev.disabled = state.page === 0;
    next.disabled = state.page >= pages - 1;
  }
  draw();
  return wrap;
}

// Sets the breadcrumbs of the header: [[text, href|null], ...].
export function crumbs(items) {
  const nav = document.getElementById('kp-crumbs');
  if (!nav) return;
  nav.replaceChildren(...items.map(([text, href]) => (href ? link(href, text) : h('span', {}, text))));
}
