// lmpress view: the page over the JSON API of lmpress/view/app.py (docs/looking-at-results.md).
// Hand-written, no framework, nothing from the network. Every piece of text a row holds reaches
// the DOM as a text node (textContent, append(string)); Markdown is parsed here into elements
// built one by one, never through innerHTML, so a row's HTML or <script> shows as text.
'use strict';
(() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const SVG = 'http://www.w3.org/2000/svg';
  const CUT = 10000; // characters of a long text shown before "show all"
  const PLAIN_OVER = 200000; // a text this long is shown plain, without Markdown
  const ROW_H = 28; // px, one table row (app.css: .row height)
  const PAGE = 100; // rows per /api/rows request
  // Browsers cap an element's height (Chromium near 33.5M px, Firefox near 17.9M): past this
  // the scrollbar maps onto the rows proportionally, so a million rows still scroll end to end.
  const MAX_PX = 15e6;
  const FILTERS = ['q', 'status', 'error_kind', 'model', 'step', 'finish_reason', 'column', 'value'];
  const INPUTS = {
    q: '#search', status: '#filter-status', error_kind: '#filter-error-kind',
    model: '#filter-model', step: '#filter-step', finish_reason: '#filter-finish-reason',
    column: '#filter-column', value: '#filter-value',
  };

  // ---- DOM helpers: attributes are ours; content goes in as text nodes ----
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children.flat()) if (child != null && child !== false) node.append(child);
    return node;
  }
  function svgEl(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    for (const child of children) if (child != null) node.append(child);
    return node;
  }
  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key === 'text') node.textContent = String(value);
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
  }
  const fmtInt = (n) => (n == null ? '–' : Number(n).toLocaleString('en-US'));
  const fmtNum = (x, digits = 2) =>
    x == null ? '–' : Number(x).toLocaleString('en-US', { maximumFractionDigits: digits });
  const fmtCost = (x) => (x == null ? '–' : `$${Number(x).toFixed(x < 0.01 && x > 0 ? 6 : 4)}`);
  const fmtSeconds = (x) => (x == null ? '–' : x > 0 && x < 0.01 ? '<0.01s' : `${fmtNum(x)}s`);
  function fmtDuration(s) {
    if (s == null || !isFinite(s)) return '–';
    s = Math.round(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`;
    return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, '0')}m`;
  }

  // ---- the API ----
  // With `lmpress view --api-key KEY` the page is opened once as /?key=KEY: the viewer answers
  // with a cookie that these same-origin requests carry.
  async function api(path, query) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query || {})) if (v != null && v !== '') qs.set(k, v);
    const res = await fetch(`/api/${path}?${qs}`);
    const body = await res.json().catch(() => null);
    if (!res.ok) throw new Error(body?.error?.message || `${res.status} ${res.statusText}`);
    return body;
  }
  function showError(err) {
    const box = $('#message');
    box.textContent = String(err?.message || err);
    box.hidden = false;
  }
  const clearError = () => ($('#message').hidden = true);

  // ---- long text: cut, with a button that shows the rest ----
  function longText(text, render = (t, into) => into.append(t), limit = CUT) {
    const box = el('span', { class: 'long' });
    if (text.length <= limit) {
      render(text, box);
      return box;
    }
    render(text.slice(0, limit), box);
    const more = el('button', {
      type: 'button', class: 'show-all',
      text: `show all (${fmtInt(text.length)} characters)`,
      onclick: () => { box.replaceChildren(); render(text, box); },
    });
    box.append('…', more);
    return box;
  }

  // ---- Markdown: a small renderer over text, building elements; content only as text nodes ----
  const LIST = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const TABLE_RULE = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;
  const isBlockStart = (line) =>
    FENCE.test(line) || LIST.test(line) || /^ {0,3}(#{1,6}\s|>)/.test(line);
  // Each alternative stops at the next delimiter character, so a line is scanned in linear time.
  const INLINE = new RegExp([
    '`([^`\\n]+)`', // 1 code
    '\\*\\*([^*\\n]+?)\\*\\*', // 2 strong
    '(?<![\\w])__([^_\\n]+?)__(?![\\w])', // 3 strong
    '~~([^~\\n]+?)~~', // 4 strikethrough
    '\\*([^*\\s](?:[^*\\n]*?[^*\\s])?)\\*', // 5 emphasis
    '(?<![\\w])_([^_\\s](?:[^_\\n]*?[^_\\s])?)_(?![\\w])', // 6 emphasis
    '\\[([^\\]\\n]+)\\]\\(([^()\\s]+)\\)', // 7, 8 link
  ].join('|'), 'g');

  function markdown(text, limit = CUT) {
    const box = el('div', { class: 'md' });
    const render = (t, into) => {
      if (t.length > PLAIN_OVER) into.append(el('div', { class: 'plain', text: t }));
      else mdBlocks(t.replace(/\r\n?/g, '\n').split('\n'), into);
    };
    box.append(longText(String(text ?? ''), render, limit));
    return box;
  }

  function mdBlocks(lines, parent) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (!line.trim()) { i++; continue; }
      if ((m = FENCE.exec(line))) {
        const close = new RegExp(`^ {0,3}${m[1][0] === '`' ? '`' : '~'}{${m[1].length},}\\s*$`);
        const body = [];
        for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
        i++;
        parent.append(el('pre', { class: 'code', 'data-lang': m[2] || null },
          el('code', { text: body.join('\n') })));
      } else if ((m = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line))) {
        const h = el(`h${Math.min(6, m[1].length + 2)}`);
        mdInline(m[2], h);
        parent.append(h);
        i++;
      } else if (/^ {0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
        parent.append(el('hr'));
        i++;
      } else if (/^ {0,3}>/.test(line)) {
        const quoted = [];
        for (; i < lines.length && /^ {0,3}>/.test(lines[i]); i++) {
          quoted.push(lines[i].replace(/^ {0,3}> ?/, ''));
        }
        const q = el('blockquote');
        mdBlocks(quoted, q);
        parent.append(q);
      } else if (LIST.test(line)) {
        i = mdList(lines, i, parent);
      } else if (line.includes('|') && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
        i = mdTable(lines, i, parent);
      } else {
        const para = [line];
        for (i++; i < lines.length && lines[i].trim() && !isBlockStart(lines[i]); i++) {
          para.push(lines[i]);
        }
        const p = el('p');
        mdInline(para.join('\n'), p);
        parent.append(p);
      }
    }
  }

  function mdList(lines, i, parent) {
    const first = LIST.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const list = el(ordered ? 'ol' : 'ul');
    if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
    let item = null;
    let text = [];
    const flush = () => {
      if (item && text.length) {
        const span = el('span');
        mdInline(text.join('\n'), span);
        item.append(span);
      }
      text = [];
    };
    while (i < lines.length) {
      const line = lines[i];
      const m = LIST.exec(line);
      if (m && m[1].length === indent && /\d/.test(m[2]) !== ordered) break; // another kind of list
      if (m && m[1].length === indent) {
        flush();
        item = list.appendChild(el('li'));
        text = [m[3]];
        i++;
      } else if (m && m[1].length > indent && item) {
        flush();
        i = mdList(lines, i, item);
      } else if (line.trim() && /^\s/.test(line) && item && !m) {
        text.push(line.trim());
        i++;
      } else if (!line.trim()) {
        const next = i + 1 < lines.length ? LIST.exec(lines[i + 1]) : null;
        if (!next || next[1].length < indent) break;
        i++;
      } else {
        break;
      }
    }
    flush();
    parent.append(list);
    return i;
  }

  function mdTable(lines, i, parent) {
    const cells = (line) => line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|');
    const row = (line, tag) => {
      const tr = el('tr');
      for (const cell of cells(line)) {
        const td = el(tag);
        mdInline(cell.trim(), td);
        tr.append(td);
      }
      return tr;
    };
    const table = el('table', { class: 'md-table' }, el('thead', {}, row(lines[i], 'th')));
    const body = table.appendChild(el('tbody'));
    for (i += 2; i < lines.length && lines[i].includes('|') && lines[i].trim(); i++) {
      body.append(row(lines[i], 'td'));
    }
    parent.append(table);
    return i;
  }

  function mdInline(text, parent) {
    let last = 0;
    for (const m of text.matchAll(INLINE)) {
      if (m.index > last) parent.append(text.slice(last, m.index));
      last = m.index + m[0].length;
      if (m[1] != null) parent.append(el('code', { text: m[1] }));
      else if (m[2] != null || m[3] != null) mdInline(m[2] ?? m[3], parent.appendChild(el('strong')));
      else if (m[4] != null) mdInline(m[4], parent.appendChild(el('del')));
      else if (m[5] != null || m[6] != null) mdInline(m[5] ?? m[6], parent.appendChild(el('em')));
      else {
        // A link is followed only when clicked, and only to the web or mail; other schemes
        // (javascript:, data:) stay text.
        const href = /^(https?:|mailto:)/i.test(m[8]) ? m[8] : null;
        const a = href
          ? el('a', { href, target: '_blank', rel: 'noopener noreferrer', title: href })
          : el('span');
        mdInline(m[7], a);
        parent.append(a);
        if (!href) parent.append(` (${m[8]})`);
      }
    }
    if (last < text.length) parent.append(text.slice(last));
  }

  // ---- JSON as a collapsible tree; children are built when a node is first opened ----
  function jsonTree(value, key = null, depth = 0) {
    const label = key == null ? null : el('span', { class: 'jt-key', text: `${key}: ` });
    if (value === null || typeof value !== 'object') {
      const kind = value === null ? 'null' : typeof value;
      const shown = typeof value === 'string' ? JSON.stringify(value) : String(value);
      return el('div', { class: 'jt-leaf' }, label,
        el('span', { class: `jt-${kind}` }, longText(shown, undefined, 2000)));
    }
    const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
    const meta = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
    const node = el('details', { class: 'jt' },
      el('summary', {}, label, el('span', { class: 'jt-meta', text: meta })));
    let built = false;
    const build = () => {
      if (built) return;
      built = true;
      for (const [k, v] of entries.slice(0, 500)) node.append(jsonTree(v, k, depth + 1));
      if (entries.length > 500) node.append(el('div', { class: 'muted', text: `… ${entries.length - 500} more` }));
    };
    node.addEventListener('toggle', build);
    if (depth < 2 && entries.length <= 50) {
      node.open = true;
      build();
    }
    return node;
  }

  // ---- plots: inline SVG from the API's bins ----
  const W = 360, H = 150, M = { l: 40, r: 8, t: 8, b: 24 };
  const compact = new Intl.NumberFormat('en-US', { notation: 'compact', maximumFractionDigits: 1 });
  const short = (x) => (Math.abs(x) >= 10000 ? compact.format(x) : fmtNum(x, Math.abs(x) < 10 ? 2 : 1));

  // Axes from 0 to yTop, the largest value labelled where it stands.
  function plotFrame(yTop, yMax = yTop) {
    const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
    const y = H - M.b - (yMax / yTop) * (H - M.t - M.b);
    svg.append(
      svgEl('line', { class: 'grid', x1: M.l, y1: y, x2: W - M.r, y2: y }),
      svgEl('line', { class: 'axis', x1: M.l, y1: H - M.b, x2: W - M.r, y2: H - M.b }),
      svgEl('line', { class: 'axis', x1: M.l, y1: M.t, x2: M.l, y2: H - M.b }),
      svgEl('text', { class: 'tick', x: M.l - 4, y: y + 4, 'text-anchor': 'end' }, short(yMax)),
      svgEl('text', { class: 'tick', x: M.l - 4, y: H - M.b, 'text-anchor': 'end' }, '0'),
    );
    return svg;
  }
  function noData(figure, why) {
    figure.append(el('div', { class: 'no-data muted', text: why }));
  }
  function resetFigure(figure) {
    figure.replaceChildren(figure.querySelector('figcaption'));
  }

  function histogram(figure, data) {
    resetFigure(figure);
    const counts = data?.counts || [];
    const edges = data?.edges || [];
    if (!counts.length) return noData(figure, 'no rows yet');
    const yMax = Math.max(1, ...counts);
    const svg = plotFrame(yMax);
    const plotW = W - M.l - M.r, plotH = H - M.t - M.b, bw = plotW / counts.length;
    counts.forEach((count, i) => {
      const h = (count / yMax) * plotH;
      const range = `${short(edges[i])}–${short(edges[i + 1])}`;
      svg.append(svgEl('rect', {
        class: 'bar', x: M.l + i * bw + 0.5, y: H - M.b - h, width: Math.max(1, bw - 1), height: h,
        'data-count': count,
      }, svgEl('title', {}, `${range}: ${fmtInt(count)} rows`)));
    });
    const ticks = counts.length > 1 ? [0, Math.floor(counts.length / 2), counts.length] : [0, 1];
    for (const i of ticks) {
      if (edges[i] == null) continue;
      svg.append(svgEl('text', {
        class: 'tick', x: M.l + i * bw, y: H - M.b + 14,
        'text-anchor': i === 0 ? 'start' : i === counts.length ? 'end' : 'middle',
      }, short(edges[i])));
    }
    figure.append(svg);
  }

  function throughput(figure, data, indexing) {
    resetFigure(figure);
    const t = data?.t || [], y = data?.rows_per_s || [];
    if (indexing) return noData(figure, 'drawn once every row is indexed');
    if (t.length < 2) return noData(figure, 'not enough rows with times');
    const t0 = t[0], span = t[t.length - 1] - t0 || 1, yMax = Math.max(1e-9, ...y) * 1.2;
    const svg = plotFrame(yMax, yMax / 1.2);
    const plotW = W - M.l - M.r, plotH = H - M.t - M.b;
    const points = t.map((x, i) =>
      `${(M.l + ((x - t0) / span) * plotW).toFixed(1)},${(H - M.b - (y[i] / yMax) * plotH).toFixed(1)}`);
    const base = `${M.l + plotW},${H - M.b} ${M.l},${H - M.b}`;
    svg.append(
      svgEl('polygon', { class: 'area', points: `${points.join(' ')} ${base}` }),
      svgEl('polyline', { class: 'line', points: points.join(' ') }),
      svgEl('text', { class: 'tick', x: M.l, y: H - M.b + 14 }, fmtDuration(t0)),
      svgEl('text', { class: 'tick', x: W - M.r, y: H - M.b + 14, 'text-anchor': 'end' }, fmtDuration(t[t.length - 1])),
    );
    figure.append(svg);
  }

  function costByPart(figure, data) {
    resetFigure(figure);
    const names = data?.names || [], cost = data?.cost_usd || [];
    figure.hidden = !cost.some((c) => c > 0); // without prices there is nothing to draw
    if (figure.hidden) return;
    const xMax = Math.max(1e-12, ...cost.map((c) => c || 0));
    const rowH = Math.min(24, (H - M.t - 10) / names.length), labelW = 110;
    const height = Math.max(H, M.t + names.length * rowH + 10);
    const svg = svgEl('svg', { viewBox: `0 0 ${W} ${height}`, role: 'img' });
    names.forEach((name, i) => {
      const y = M.t + i * rowH, w = ((cost[i] || 0) / xMax) * (W - labelW - 70);
      const label = String(name).length > 16 ? `${String(name).slice(0, 15)}…` : String(name);
      svg.append(
        svgEl('text', { class: 'tick', x: labelW - 6, y: y + rowH * 0.65, 'text-anchor': 'end' }, label),
        svgEl('rect', { class: 'bar', x: labelW, y: y + 2, width: w, height: Math.max(1, rowH - 4) },
          svgEl('title', {}, `${name}: ${fmtCost(cost[i])}`)),
        svgEl('text', { class: 'tick', x: labelW + w + 4, y: y + rowH * 0.65 }, fmtCost(cost[i])),
      );
    });
    figure.append(svg);
  }

  // ---- a virtual list: only the rows in view are in the DOM; pages are fetched as they scroll in ----
  class VirtualList {
    constructor(scroller, { fetchPage, renderRow, onTotal, onFirstPage = () => {} }) {
      Object.assign(this, { scroller, fetchPage, renderRow, onTotal, onFirstPage });
      this.spacer = el('div', { class: 'vspacer' });
      this.win = el('div', { class: 'vwin' });
      scroller.append(this.spacer, this.win);
      this.pages = new Map();
      this.stale = new Map(); // pages from before a refresh
      this.pending = new Set();
      this.nodes = new Map(); // row number -> {key, node} on screen
      this.total = null;
      this.gen = 0;
      this.query = null;
      scroller.addEventListener('scroll', () => this.schedule());
      window.addEventListener('resize', () => this.schedule());
    }
    reset(query) {
      this.query = query;
      this.gen++;
      this.pages.clear();
      this.stale = new Map();
      this.pending.clear();
      this.total = null;
      this.scroller.scrollTop = 0;
      this.win.replaceChildren();
      this.fetch(0);
    }
    refresh() { // the same query over more rows: keep the place, fetch again what is in view
      this.gen++;
      this.stale = this.pages; // shown until their new versions come
      this.pages = new Map();
      this.pending.clear();
      this.fetch(Math.floor(this.firstInView() / PAGE));
    }
    schedule() {
      if (!this.raf) this.raf = requestAnimationFrame(() => { this.raf = 0; this.render(); });
    }
    geometry() {
      const h = this.scroller.clientHeight, full = (this.total || 0) * ROW_H;
      const virt = Math.min(full, MAX_PX), top = this.scroller.scrollTop;
      const pos = virt > h ? (top * (full - h)) / (virt - h) : 0;
      return { h, virt, top, pos };
    }
    firstInView() {
      return Math.max(0, Math.floor(this.geometry().pos / ROW_H));
    }
    render() {
      const { h, virt, top, pos } = this.geometry();
      this.spacer.style.height = `${virt}px`;
      if (!h || !this.total) return;
      const first = Math.max(0, Math.floor(pos / ROW_H));
      const count = Math.min(this.total - first, Math.ceil(h / ROW_H) + 1);
      this.win.style.transform = `translateY(${top - (pos - first * ROW_H)}px)`;
      // A row already on screen keeps its element unless its data changed, so a click that
      // lands while pages arrive (or a live job grows) still reaches the row it was aimed at.
      const nodes = new Map();
      for (let i = first; i < first + count; i++) {
        const page = this.pages.get(Math.floor(i / PAGE)) ?? this.stale.get(Math.floor(i / PAGE));
        if (!this.pages.has(Math.floor(i / PAGE))) this.fetch(Math.floor(i / PAGE));
        const item = page ? page[i % PAGE] : undefined;
        const key = item === undefined ? '' : JSON.stringify(item);
        const old = this.nodes.get(i);
        nodes.set(i, old && old.key === key ? old : { key, node: this.renderRow(item, i) });
      }
      const wanted = [...nodes.values()].map((entry) => entry.node);
      const shown = this.win.children;
      if (wanted.length !== shown.length || wanted.some((node, k) => node !== shown[k])) {
        this.win.replaceChildren(...wanted);
      }
      this.nodes = nodes;
    }
    redraw() {
      this.nodes = new Map();
      this.render();
    }
    async fetch(p) {
      if (this.pending.has(p) || this.pages.has(p)) return;
      this.pending.add(p);
      const gen = this.gen;
      try {
        const body = await this.fetchPage(this.query, p * PAGE, PAGE);
        if (gen !== this.gen) return;
        this.pages.set(p, body.rows || []);
        if (this.pages.size > 60) this.pages.delete(this.pages.keys().next().value);
        if (body.total !== this.total) {
          this.total = body.total;
          this.onTotal(body.total);
        }
        clearError();
        this.render();
        if (p === 0) this.onFirstPage(body.rows || []);
      } catch (err) {
        if (gen === this.gen) showError(err);
      } finally {
        if (gen === this.gen) this.pending.delete(p);
      }
    }
  }

  // ---- state and routing: the hash holds the tab and its query (#rows?status=failed) ----
  const state = {
    sources: [], source: 'a', tab: null, overview: null, overviewStale: true,
    rowsKey: null, compareKey: null, row: null, liveRows: null, indexed: null, indexing: null,
    lastHash: {},
  };
  const sourceInfo = (id = state.source) => state.sources.find((s) => s.id === id);
  // A source's parts are its steps (a pipeline, an eval's tasks) or its models; with one part
  // there is nothing to filter or compare by.
  function partKind(id = state.source) {
    const info = sourceInfo(id);
    if (!info || (info.parts || []).length < 2) return null;
    return ['pipeline', 'eval'].includes(info.kind) ? 'step' : 'model';
  }
  function parseHash() {
    const [tab, query] = location.hash.slice(1).split('?');
    return { tab: tab || 'overview', q: new URLSearchParams(query || '') };
  }
  function go(tab, query = {}, replace = false) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v != null && v !== '') qs.set(k, v);
    const hash = `#${tab}${qs.toString() ? `?${qs}` : ''}`;
    if (replace && location.hash === hash) return;
    if (replace) {
      history.replaceState(null, '', hash);
      route();
    } else if (location.hash !== hash) location.hash = hash;
    else route();
  }

  function route() {
    const { tab, q } = parseHash();
    const known = ['overview', 'rows', 'row', 'compare'].includes(tab) ? tab : 'overview';
    const source = q.get('source') || state.source;
    if (source !== state.source && sourceInfo(source)) selectSource(source);
    state.tab = known;
    state.lastHash[known] = location.hash;
    $('#source').classList.toggle('off', known === 'compare'); // compare names its own two
    for (const name of ['overview', 'rows', 'row', 'compare']) {
      const tabButton = $(`#tab-${name}`);
      tabButton.setAttribute('aria-selected', String(name === known));
      $(name === 'row' ? '#row-view' : `#${name}`).hidden = name !== known;
    }
    if (known === 'overview') showOverview();
    else if (known === 'rows') showRows(q);
    else if (known === 'row') showRow(Number(q.get('n')));
    else showCompare(q);
  }

  function selectSource(id) {
    state.source = id;
    $('#source').value = id;
    state.overviewStale = true;
    state.rowsKey = null;
    state.liveRows = null;
    state.indexed = null;
    fillParts(id);
  }
  // The model or step filter's choices (kept where still there: they are read again once a
  // file's facts are all read).
  function fillParts(id) {
    const info = sourceInfo(id);
    const problems = info && info.problems.length ? ` (${info.problems.join('; ')})` : '';
    $('#source-path').textContent = info ? `${info.path} (${info.kind})${problems}` : '';
    const kind = partKind(id);
    const parts = info?.parts || [];
    for (const [label, select] of [['model', '#filter-model'], ['step', '#filter-step']]) {
      const options = kind === label ? parts.map((p) => p.name) : [];
      const chosen = $(select).value;
      $(select).replaceChildren(el('option', { value: '', text: 'any' }),
        ...options.map((name) => el('option', { value: name, text: name })));
      if (options.includes(chosen)) $(select).value = chosen;
      $(select).closest('label').hidden = !options.length;
    }
    $('#rows').classList.toggle('with-parts', Boolean(kind));
  }

  // ---- Overview ----
  async function showOverview() {
    if (!state.overviewStale && state.overview) return;
    try {
      const ov = await api('overview', { source: state.source });
      state.overview = ov;
      state.overviewStale = false;
      renderOverview(ov);
      clearError();
    } catch (err) {
      showError(err);
    }
  }

  // While a file's facts are read behind the page, what rests on them counts the rows read so
  // far: said in so many words, and redrawn as more are read.
  const indexedText = (ix) => `${fmtInt(ix.indexed)} of ${fmtInt(ix.rows)} rows indexed`;
  function renderOverview(ov) {
    const set = (id, text) => ($(id).textContent = text);
    $('#overview-partial').hidden = !ov.indexing;
    if (ov.indexing) {
      set('#overview-partial', `Counted over the ${indexedText(ov.indexing)} so far; `
        + 'the page updates as the rest are read.');
    }
    set('#count-ok', fmtInt(ov.rows.ok));
    set('#count-failed', fmtInt(ov.rows.failed));
    set('#count-cached', fmtInt(ov.rows.cached));
    set('#count-left', ov.rows.left == null ? '–' : fmtInt(ov.rows.left));
    set('#count-total', fmtInt(ov.rows.total));
    set('#tokens-prompt', fmtInt(ov.tokens?.prompt));
    set('#tokens-completion', fmtInt(ov.tokens?.completion));
    set('#cost', ov.cost_usd == null ? 'no prices' : fmtCost(ov.cost_usd));
    set('#speed-rows', fmtNum(ov.speed?.rows_per_s));
    set('#speed-tokens', fmtNum(ov.speed?.tokens_per_s, 1));
    $('#count-failed').classList.toggle('bad', ov.rows.failed > 0);

    const kinds = ov.errors_by_kind || [];
    $('#errors-by-kind tbody').replaceChildren(...(kinds.length ? kinds.map((e) =>
      el('tr', {},
        el('td', {}, el('a', {
          href: `#rows?${new URLSearchParams({ source: state.source, status: 'failed', error_kind: e.kind })}`,
          text: e.kind,
        })),
        el('td', { class: 'num', text: fmtInt(e.count) })))
      : [el('tr', {}, el('td', { colspan: 2, class: 'muted', text: 'no failed rows' }))]));
    $('#filter-error-kind').replaceChildren(el('option', { value: '', text: 'any' }),
      ...kinds.map((e) => el('option', { value: e.kind, text: e.kind })));
    const wanted = parseHash().q.get('error_kind');
    if (wanted) $('#filter-error-kind').value = wanted;

    const parts = ov.by_part || [];
    $('#by-part-box').hidden = !parts.length;
    const key = partKind();
    $('#by-part tbody').replaceChildren(...parts.map((p) => el('tr', {},
      el('td', {}, key
        ? el('a', { href: `#rows?${new URLSearchParams({ source: state.source, [key]: p.name })}`, text: p.name })
        : p.name),
      el('td', { class: 'num', text: fmtInt(p.ok) }),
      el('td', { class: 'num', text: fmtInt(p.failed) }),
      el('td', { class: 'num', text: fmtInt(p.tokens) }),
      el('td', { class: 'num', text: fmtCost(p.cost_usd) }))));

    const plots = ov.plots || {};
    histogram($('#plot-prompt_tokens'), plots.prompt_tokens);
    histogram($('#plot-completion_tokens'), plots.completion_tokens);
    histogram($('#plot-latency_s'), plots.latency_s);
    throughput($('#plot-throughput'), plots.throughput, ov.indexing);
    costByPart($('#plot-cost_by_part'), plots.cost_by_part);
  }

  // ---- Rows ----
  const rowsList = new VirtualList($('#rows-scroll'), {
    fetchPage: async (query, offset, limit) => {
      const body = await api('rows', { ...query, offset, limit });
      showPartial('#rows-partial', body.partial);
      return body;
    },
    onTotal: (total) => {
      $('#rows-total').textContent = fmtInt(total);
      $('#rows-total').dataset.total = total;
      $('#rows-scroll').classList.toggle('empty', total === 0);
    },
    renderRow: (row, i) => {
      if (!row) return el('div', { class: 'row-pending row-grid', text: `${fmtInt(i)} …` });
      const part = row.model || row.step || '';
      return el('div', {
        class: `row row-grid ${row.status === 'failed' ? 'failed' : ''}`, 'data-n': row.n,
        tabindex: 0, role: 'row', title: `row ${row.n}: open`,
        onclick: () => go('row', { source: state.source, n: row.n }),
        onkeydown: (e) => e.key === 'Enter' && go('row', { source: state.source, n: row.n }),
      },
      el('span', { class: 'muted', text: row.n }),
      el('span', { class: 'id', text: row.id ?? '' }),
      el('span', {}, el('span', { class: `badge status-${row.status}`, text: row.status }),
        row.cached ? el('span', { class: 'badge cached', text: 'cached' }) : null),
      el('span', { class: 'col-part', text: part }),
      el('span', { text: row.finish_reason ?? '' }),
      el('span', { class: 'num', text: fmtInt(row.prompt_tokens) }),
      el('span', { class: 'num', text: fmtInt(row.completion_tokens) }),
      el('span', { class: 'num', text: fmtSeconds(row.latency_s) }),
      el('span', { class: 'preview', text: row.preview ?? '' }));
    },
  });

  function showPartial(id, partial) {
    const ix = state.indexing ?? sourceInfo()?.indexing;
    $(id).hidden = !partial;
    $(id).textContent = partial ? `so far (${ix ? indexedText(ix) : 'indexing'})` : '';
  }

  // A column filter needs both its name and its value: half of one is not sent.
  function complete(query) {
    if (!query.column || !query.value) delete query.column, delete query.value;
    return query;
  }
  function filtersFromInputs() {
    const query = { source: state.source };
    for (const key of FILTERS) {
      const v = $(INPUTS[key]).value.trim();
      if (v) query[key] = v;
    }
    return complete(query);
  }
  function showRows(q) {
    const query = { source: state.source };
    for (const key of FILTERS) {
      const v = q.get(key) || '';
      if ($(INPUTS[key]).value !== v && document.activeElement !== $(INPUTS[key])) $(INPUTS[key]).value = v;
      if (v) query[key] = v;
    }
    const key = JSON.stringify(complete(query));
    if (key !== state.rowsKey) {
      state.rowsKey = key;
      $('#rows-total').textContent = '…';
      rowsList.reset(query);
    }
    rowsList.schedule();
  }
  let searchTimer = 0;
  function applyFilters(delay = 0) {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => state.tab === 'rows' && go('rows', filtersFromInputs(), true), delay);
  }
  // Text boxes apply as they are typed in (Enter at once), the lists when chosen; a text box's
  // change event (on leaving it) would only repeat that.
  $('#filters').addEventListener('submit', (e) => { e.preventDefault(); applyFilters(); });
  $('#filters').addEventListener('keydown', (e) => e.key === 'Enter' && e.target.tagName === 'INPUT' && applyFilters());
  $('#filters').addEventListener('change', (e) => e.target.tagName === 'SELECT' && applyFilters());
  $('#filters').addEventListener('reset', () => setTimeout(() => applyFilters()));
  $('#filters').addEventListener('input', (e) => e.target.tagName === 'INPUT' && applyFilters(300));

  // ---- one row ----
  async function showRow(n) {
    const view = $('#row-view');
    if (!Number.isInteger(n)) {
      view.replaceChildren(el('p', { class: 'muted', text: 'Choose a row in the Rows tab.' }));
      return;
    }
    $('#tab-row').disabled = false;
    if (state.row && state.row.n === n && state.row.source === state.source) return;
    try {
      const row = await api('row', { source: state.source, n });
      state.row = { n, source: state.source };
      view.replaceChildren(...renderRow(row, n));
      clearError();
    } catch (err) {
      view.replaceChildren(el('p', { class: 'muted', text: `Row ${n}: ${err.message}` }));
    }
  }

  function renderRow(row, n) {
    const nav = el('div', { class: 'toolbar' },
      el('button', { type: 'button', text: '← rows', onclick: () => backToRows() }),
      el('button', { type: 'button', text: '‹ previous', disabled: n <= 0, onclick: () => go('row', { source: state.source, n: n - 1 }) }),
      el('button', { type: 'button', text: 'next ›', onclick: () => go('row', { source: state.source, n: n + 1 }) }),
      el('h2', {}, `Row ${n} `, el('span', { class: 'id', text: row.id ?? '' }), ' ',
        el('span', { class: `badge status-${row.status}`, text: row.status ?? '' })));
    const out = [nav];
    if (row.error) out.push(errorBox(row.error));
    if (row.judge) out.push(judgeBox(row.judge));
    const chat = el('div', { class: 'chat' });
    const messages = row.messages || [];
    const bubbles = messages.map(message);
    chat.append(...bubbles);
    // The output's messages end with the reply when it succeeded: its details join that bubble.
    const reply = row.reply;
    const last = messages[messages.length - 1];
    if (reply && last && last.role === 'assistant' && last.content === reply.text) {
      replyDetails(bubbles[bubbles.length - 1], reply, true);
    } else if (reply && ['text', 'reasoning', 'tool_calls', 'structured', 'logprobs'].some((k) => reply[k] != null)) {
      const bubble = el('div', { class: 'msg role-assistant' }, el('div', { class: 'msg-role', text: 'assistant · reply' }));
      chat.append(replyDetails(bubble, reply, false));
    }
    out.push(chat);
    const response = row.response;
    const usage = response?.usage || {};
    const prompt = row.prompt_tokens ?? usage.prompt_tokens, completion = row.completion_tokens ?? usage.completion_tokens;
    const facts = [
      (row.finish_reason ?? reply?.finish_reason) && `finish: ${row.finish_reason ?? reply.finish_reason}`,
      (prompt != null || completion != null) && `tokens: ${fmtInt(prompt)} in, ${fmtInt(completion)} out`,
      (row.latency_s ?? response?.latency_s) != null && `latency: ${fmtSeconds(row.latency_s ?? response.latency_s)}`,
      (row.model || response?.model) && `model: ${row.model || response.model}`,
      row.step && `step: ${row.step}`,
      response?.engine && `engine: ${response.engine}`,
      (row.cached || response?.cached) && 'cached (from the response cache)',
    ].filter(Boolean);
    if (facts.length) out.push(el('p', { class: 'facts muted', text: facts.join(' · ') }));
    if (response) out.push(el('details', { class: 'section' }, el('summary', { text: 'Response record' }), jsonTree(response)));
    if (row.raw != null) {
      out.push(el('details', { class: 'section' }, el('summary', { text: `Raw line (${fmtInt(row.raw.length)} characters)` }),
        el('pre', { class: 'raw' }, longText(row.raw, undefined, 5000))));
    }
    return out;
  }

  function backToRows() {
    if (state.lastHash.rows) location.hash = state.lastHash.rows;
    else go('rows', { source: state.source });
  }

  function errorBox(error) {
    return el('div', { class: 'error-box' },
      el('div', { class: 'error-head' },
        el('strong', { text: error.kind || 'error' }),
        error.line != null ? el('span', { class: 'muted', text: ` · input line ${error.line}` }) : null),
      el('div', { class: 'error-message' }, longText(String(error.message ?? ''))));
  }

  function judgeBox(judge) {
    return el('div', { class: 'judge' },
      el('span', { class: 'judge-score', text: judge.score == null ? '–' : String(judge.score) }),
      el('div', {}, el('strong', { text: 'Judge' }), judge.explanation ? markdown(judge.explanation) : null));
  }

  function message(m) {
    const role = String(m.role || 'message');
    const bubble = el('div', { class: `msg role-${role.replace(/[^a-z_]/gi, '')}` },
      el('div', { class: 'msg-role', text: m.name ? `${role} (${m.name})` : role }));
    if (m.tool_call_id) bubble.append(el('div', { class: 'muted', text: `answers tool call ${m.tool_call_id}` }));
    bubble.append(content(m.content));
    if (m.reasoning_content || m.reasoning) bubble.firstChild.after(reasoning(m.reasoning_content || m.reasoning));
    if (Array.isArray(m.tool_calls)) bubble.append(...m.tool_calls.map(toolCall));
    return bubble;
  }

  function content(c) {
    if (c == null) return el('span');
    if (typeof c === 'string') return markdown(c);
    if (!Array.isArray(c)) return jsonTree(c);
    const box = el('div', { class: 'parts' });
    for (const part of c) {
      if (typeof part === 'string') box.append(markdown(part));
      else if (part && (part.type === 'text' || part.type === 'input_text')) box.append(markdown(part.text));
      else if (part && /image/.test(part.type || '')) box.append(image(part));
      else box.append(jsonTree(part));
    }
    return box;
  }

  // Images come inline as data: URLs, or from the viewer itself; any other URL is named, not fetched.
  function image(part) {
    const raw = part.image_url?.url ?? part.image_url ?? part.url ?? part.source?.data ?? '';
    const url = String(raw);
    if (/^data:image\/[\w.+-]+[;,]/i.test(url) || /^\/(api|static)\//.test(url)) {
      return el('img', { class: 'inline-image', src: url, alt: 'image in the row', loading: 'lazy' });
    }
    return el('div', { class: 'muted', text: `[image not fetched: ${url.slice(0, 200)}]` });
  }

  function reasoning(text) {
    return el('details', { class: 'reasoning' },
      el('summary', { text: `Reasoning (${fmtInt(String(text).length)} characters)` }), markdown(text));
  }

  function toolCall(call) {
    const fn = call.function || call;
    let args = fn.arguments ?? fn.input ?? call.arguments;
    if (typeof args === 'string') {
      try { args = JSON.parse(args); } catch { /* shown as the text it is */ }
    }
    return el('div', { class: 'tool-call' },
      el('div', {}, el('span', { class: 'muted', text: 'tool call ' }), el('code', { text: fn.name ?? '?' }),
        call.id ? el('span', { class: 'muted', text: ` (${call.id})` }) : null),
      typeof args === 'string' ? el('pre', {}, longText(args)) : jsonTree(args ?? null));
  }

  function replyDetails(bubble, reply, textShown) {
    if (reply.reasoning) bubble.querySelector('.msg-role').after(reasoning(reply.reasoning));
    if (!textShown && reply.text != null) bubble.append(markdown(reply.text));
    if (Array.isArray(reply.tool_calls) && !bubble.querySelector('.tool-call')) bubble.append(...reply.tool_calls.map(toolCall));
    if (reply.structured != null) {
      bubble.append(el('div', { class: 'structured' }, el('div', { class: 'muted', text: 'structured output' }), jsonTree(reply.structured)));
    }
    if (Array.isArray(reply.logprobs) && reply.logprobs.length) bubble.append(logprobStrip(reply.logprobs));
    return bubble;
  }

  // Each token shaded by how unlikely it was: white at p = 1, deep red as p falls to 0.
  function logprobStrip(items) {
    const strip = el('div', { class: 'logprobs' }, el('div', { class: 'muted', text: 'logprobs (darker: less likely; hover for values)' }));
    const line = strip.appendChild(el('div', { class: 'lp-line' }));
    const render = (list) => {
      line.replaceChildren();
      for (const item of list) {
        const p = Math.exp(item.logprob ?? 0);
        const span = el('span', { class: 'lp', text: item.token ?? '', title: `${JSON.stringify(item.token)}  logprob ${fmtNum(item.logprob, 3)}  p ${fmtNum(p, 3)}` });
        span.style.backgroundColor = `rgba(220, 38, 38, ${(0.7 * (1 - p)).toFixed(3)})`;
        line.append(span);
      }
    };
    render(items.slice(0, 2000));
    if (items.length > 2000) {
      strip.append(el('button', { type: 'button', class: 'show-all', text: `show all ${fmtInt(items.length)} tokens`, onclick: (e) => { render(items); e.target.remove(); } }));
    }
    return strip;
  }

  // ---- Compare ----
  const compareList = new VirtualList($('#compare-scroll'), {
    fetchPage: async (query, offset, limit) => {
      const body = await api('compare', { ...query, offset, limit });
      showPartial('#compare-partial', body.partial);
      return body;
    },
    onTotal: (total) => {
      $('#compare-total').textContent = fmtInt(total);
      $('#compare-scroll').classList.toggle('empty', total === 0);
    },
    // The first row of a comparison opens by itself, so its marked words show at once.
    onFirstPage: (rows) => {
      const { tab, q } = parseHash();
      if (rows.length && tab === 'compare' && !q.get('id')) go('compare', { ...compareQuery(), id: rows[0].id }, true);
    },
    renderRow: (row, i) => {
      if (!row) return el('div', { class: 'row-pending compare-grid', text: `${fmtInt(i)} …` });
      const side = (s) => el('span', { class: s ? 'preview' : 'preview muted', text: s ? (s.text ?? '').slice(0, 300) : '(not in this output)' });
      const open = () => go('compare', { ...compareQuery(), id: row.id }, true);
      return el('div', {
        class: `compare-row compare-grid ${row.same ? 'same' : 'differs'} ${String(row.id) === parseHash().q.get('id') ? 'selected' : ''}`,
        'data-id': row.id, tabindex: 0, onclick: open, onkeydown: (e) => e.key === 'Enter' && open(),
      }, el('span', { class: 'id', text: row.id ?? '' }), side(row.a), side(row.b));
    },
  });

  function compareChoices() {
    const choices = [];
    for (const s of state.sources) {
      choices.push({ value: s.id, label: `${s.id}: ${s.path}` });
      if (partKind(s.id) === 'model') for (const p of s.parts || []) choices.push({ value: `${s.id}:${p.name}`, label: `${s.id}: model ${p.name}` });
    }
    return choices;
  }
  function compareDefaults() {
    const b = sourceInfo('b');
    if (b) return { a: 'a', b: 'b' };
    const parts = partKind('a') === 'model' ? sourceInfo('a').parts : [];
    if (parts.length >= 2) return { a: `a:${parts[0].name}`, b: `a:${parts[1].name}` };
    return null;
  }
  function compareQuery() {
    return { a: $('#compare-a').value, b: $('#compare-b').value, only: $('#compare-only').value };
  }

  function showCompare(q) {
    const defaults = compareDefaults();
    if (!defaults) {
      $('#compare-detail').replaceChildren(el('p', { class: 'muted', text: 'Compare needs two outputs (lmpress view A B) or a multi-model output.' }));
      $('#compare-total').textContent = '0';
      return;
    }
    $('#compare-a').value = q.get('a') || defaults.a;
    $('#compare-b').value = q.get('b') || defaults.b;
    $('#compare-only').value = q.get('only') || 'differs';
    const query = compareQuery();
    const key = JSON.stringify(query);
    if (key !== state.compareKey) {
      state.compareKey = key;
      $('#compare-total').textContent = '…';
      compareList.reset(query);
    }
    compareList.schedule();
    const id = q.get('id');
    if (id != null) showCompareRow(query, id);
    else {
      compareShown = null;
      $('#compare-detail').replaceChildren();
    }
  }
  $('#compare-filters').addEventListener('change', () => go('compare', compareQuery(), true));

  let compareShown = null;
  async function showCompareRow(query, id) {
    const key = JSON.stringify([query.a, query.b, id]);
    if (compareShown === key) return;
    compareShown = key;
    compareList.redraw();
    try {
      const body = await api('compare_row', { a: query.a, b: query.b, id });
      if (compareShown !== key) return;
      $('#compare-detail').replaceChildren(compareDetail(body, query));
    } catch (err) {
      showError(err);
    }
  }

  function compareDetail(body, query) {
    const colA = el('div', { class: 'diff-side' }), colB = el('div', { class: 'diff-side' });
    const textA = el('div', { class: 'diff-text' }), textB = el('div', { class: 'diff-text' });
    // The runs keep their whitespace (lmpress/view/compare.py): put end to end they are the texts.
    const put = (into, text, cls) => {
      if (text) into.append(cls ? el(cls === 'diff-del' ? 'del' : 'ins', { class: cls, text }) : text);
    };
    for (const op of body.diff || []) {
      if (op.op === 'equal') { put(textA, op.a); put(textB, op.b ?? op.a); }
      if (op.op === 'delete' || op.op === 'replace') put(textA, op.a, 'diff-del');
      if (op.op === 'insert' || op.op === 'replace') put(textB, op.b, 'diff-ins');
    }
    const head = (name, row) => el('div', { class: 'diff-head' },
      el('strong', { text: name }),
      row ? el('a', { href: `#row?${new URLSearchParams({ source: name.split(':')[0], n: row.n })}`, text: ` row ${row.n}` }) : el('span', { class: 'muted', text: ' (not in this output)' }),
      row?.status ? el('span', { class: `badge status-${row.status}`, text: row.status }) : null,
      row?.reply?.finish_reason ? el('span', { class: 'muted', text: ` finish: ${row.reply.finish_reason}` }) : null);
    colA.append(head(query.a, body.a), ...(body.a?.error ? [errorBox(body.a.error)] : []), textA);
    colB.append(head(query.b, body.b), ...(body.b?.error ? [errorBox(body.b.error)] : []), textB);
    return el('div', {},
      el('h2', {}, 'Row ', el('span', { class: 'id', text: body.id ?? '' })),
      el('div', { class: 'diff' }, colA, colB));
  }

  // ---- live: follow a running job ----
  async function poll() {
    try {
      const since = state.liveRows ?? '';
      const live = await api('live', { source: state.source, since });
      const badge = $('#live-badge');
      badge.hidden = !live.running;
      badge.classList.remove('lost');
      if (live.running) {
        const rate = live.rate_rows_per_s == null ? '' : ` · ${fmtNum(live.rate_rows_per_s)} rows/s`;
        const eta = live.eta_s == null ? '' : ` · ETA ${fmtDuration(live.eta_s)}`;
        badge.textContent = `● live · ${fmtInt(live.rows)} rows${rate}${eta}`;
      }
      const indexing = $('#indexing-badge');
      indexing.hidden = !live.indexing;
      if (live.indexing) indexing.textContent = `indexing ${fmtInt(live.indexing.indexed)} of ${fmtInt(live.indexing.rows)} rows`;
      state.indexing = live.indexing;
      const indexed = live.indexing ? live.indexing.indexed : null;
      const more = state.liveRows != null && (live.rows !== state.liveRows || indexed !== state.indexed);
      state.liveRows = live.rows;
      state.indexed = indexed;
      // The sources' parts (models, steps) were counted over the rows indexed then.
      if (!live.indexing && state.sources.some((s) => s.indexing)) await reloadSources();
      if (more) grew();
    } catch {
      const badge = $('#live-badge');
      badge.hidden = false;
      badge.classList.add('lost');
      badge.textContent = 'viewer not answering';
    }
    setTimeout(poll, 1000);
  }
  function grew() {
    state.overviewStale = true;
    if (state.tab === 'overview') showOverview();
    if (state.rowsKey) rowsList.refresh();
    if (state.compareKey) compareList.refresh();
  }

  // ---- start ----
  async function reloadSources() {
    state.sources = (await api('sources')).sources || [];
    fillParts(state.source);
    for (const id of ['#compare-a', '#compare-b']) {
      const chosen = $(id).value;
      $(id).replaceChildren(...compareChoices().map((c) => el('option', { value: c.value, text: c.label })));
      if (chosen) $(id).value = chosen;
    }
    $('#tab-compare').disabled = !compareDefaults();
  }

  async function start() {
    for (const button of document.querySelectorAll('[data-tab]')) {
      button.addEventListener('click', () => {
        const tab = button.dataset.tab;
        if (state.lastHash[tab]) location.hash = state.lastHash[tab];
        else go(tab, tab === 'compare' ? {} : { source: state.source });
      });
    }
    $('#source').addEventListener('change', () => {
      selectSource($('#source').value);
      go(state.tab === 'compare' ? 'overview' : state.tab === 'row' ? 'rows' : state.tab, { source: state.source });
    });
    try {
      state.sources = (await api('sources')).sources || [];
    } catch (err) {
      showError(err);
      return;
    }
    const select = $('#source');
    select.replaceChildren(...state.sources.map((s) => el('option', { value: s.id, text: `${s.id}: ${s.path}` })));
    select.hidden = state.sources.length < 2;
    $('#source-path').hidden = state.sources.length >= 2;
    for (const id of ['#compare-a', '#compare-b']) {
      $(id).replaceChildren(...compareChoices().map((c) => el('option', { value: c.value, text: c.label })));
    }
    $('#tab-compare').disabled = !compareDefaults();
    selectSource(parseHash().q.get('source') || state.sources[0]?.id || 'a');
    window.addEventListener('hashchange', route);
    route();
    poll();
  }

  start();
})();
