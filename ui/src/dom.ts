// dom.ts - a small element builder and the formatting every page shares. No framework: pages
// build their DOM with h() and update the parts that change.

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | null | undefined | EventListener>;

// h('a', {href: '#/jobs', class: 'x', onclick: fn}, 'text', child...): attributes set as
// attributes (never as HTML), on* keys as listeners, false/null/undefined attributes left out.
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs?: Attrs | null,
                                                        ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') {
        el.addEventListener(k.slice(2), v as EventListener);
      } else if (k === 'value' && 'value' in el) {
        (el as HTMLInputElement).value = String(v);
      } else if (k === 'checked' && 'checked' in el) {
        (el as HTMLInputElement).checked = Boolean(v);
      } else {
        el.setAttribute(k, v === true ? '' : String(v));
      }
    }
  }
  append(el, ...children);
  return el;
}

export function append(el: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
}

export function clear(el: Node): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

// Announces text to screen readers (the page's polite live region).
export function announce(text: string): void {
  const el = document.getElementById('announce');
  if (el) el.textContent = text;
}

// ---- formatting ----------------------------------------------------------------------------

export function fmtDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds) || seconds < 0) return '';
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function parseTime(t: string | null | undefined): number | null {
  if (!t) return null;
  const ms = Date.parse(t);
  return isNaN(ms) ? null : ms;
}

export function fmtAge(t: string | null | undefined, now = Date.now()): string {
  const ms = parseTime(t);
  if (ms === null) return '';
  const d = fmtDuration(Math.max(0, (now - ms) / 1000));
  return d ? `${d} ago` : '';
}

export function fmtTime(t: string | null | undefined): string {
  const ms = parseTime(t);
  if (ms === null) return '';
  const d = new Date(ms);
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function fmtNum(v: unknown): string {
  if (v === null || v === undefined) return '';
  if (typeof v === 'number') {
    if (!isFinite(v)) return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(Number(v.toPrecision(5)));
  }
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

export function fmtBytes(n: number): string {
  if (!isFinite(n)) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

// A state badge: text and a shape, so colour is never the only signal.
const STATE_MARK: Record<string, string> = {
  QUEUED: '○', SCHEDULED: '◔', STARTING: '◑', RUNNING: '▶', STOPPING: '◼', RESTARTING: '↻',
  COMPLETED: '✓', FAILED: '✗', STOPPED: '■', PREEMPTED: '⇣', PAUSED: '⏸', ALIVE: '●', DEAD: '✗', DRAINING: '◐', PENDING: '◌',
};
export function stateBadge(state: string): HTMLElement {
  const s = state || 'UNKNOWN';
  return h('span', { class: `badge st-${s.toLowerCase()}` }, h('span', { 'aria-hidden': 'true' }, STATE_MARK[s] || '?'), ' ', s);
}

export const TERMINAL = new Set(['COMPLETED', 'FAILED', 'STOPPED']);
// The states a tuning job ends in (base/tuning_states.h's kind ENDED), a list of its own.
export const TUNING_ENDED = new Set(['COMPLETED', 'FAILED', 'STOPPED']);
export const LIVE_STATES = ['QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING', 'RESTARTING', 'PREEMPTED', 'PAUSED'];

// Others' text (a job's log line, a reason that quotes a rank's stderr) as kiln's CLI prints it
// (cli/term.c, base/text.c's kiln_text_control): C0 and C1 control characters, DEL and the
// bidirectional overrides (U+202A to U+202E, U+2066 to U+2069) as \uXXXX, newline and tab
// excepted, so that a line can neither reorder the text after it (a file name that reads
// "exe.txt") nor carry an escape sequence.
const CONTROLS = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;
export function shownText(s: string): string {
  return s.replace(CONTROLS, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

// One entry of an events timeline (a job's or a tuning job's): when, from -> to, the attempt
// where there is one, the reason and who acted.
export interface TimelineEvent { time: string; from_state: string | null; to_state: string; reason: string; attempt?: number; actor?: string | null }
export function timelineItem(e: TimelineEvent): HTMLElement {
  return h('li', null,
    h('time', { datetime: e.time }, fmtTime(e.time)), ' ',
    // an event that leaves the job where it is (a head preempting others) shows its state once
    e.from_state && e.from_state !== e.to_state ? h('span', null, stateBadge(e.from_state), ' → ') : null,
    stateBadge(e.to_state),
    e.attempt !== undefined ? h('span', { class: 'muted' }, ` attempt ${e.attempt}`) : null,
    e.reason ? h('div', { class: 'ev-reason' }, shownText(e.reason)) : null,
    e.actor ? h('div', { class: 'muted small' }, `by ${e.actor}`) : null);
}

// ---- sortable tables ------------------------------------------------------------------------

export interface SortOrder { field: string; desc: boolean }

// "field desc" (an order_by as the URL keeps it) -> {field, desc}; null for none.
export function parseOrder(orderBy: string): SortOrder | null {
  const m = /^\s*([^\s,]+)(?:\s+(asc|desc))?/i.exec(orderBy);
  return m ? { field: m[1], desc: (m[2] || 'asc').toLowerCase() === 'desc' } : null;
}

// A sortable column's header cell: a button that sorts by field (again: the other way round),
// aria-sort saying how the table is sorted now. firstDesc: the first click sorts descending.
export function sortHeader(label: string, field: string, order: SortOrder | null, firstDesc: boolean,
                           onSort: (o: SortOrder) => void): HTMLTableCellElement {
  const active = !!order && order.field === field;
  const btn = h('button', { type: 'button', class: 'sort', onclick: () => onSort({ field, desc: active ? !order!.desc : firstDesc }) },
    label, h('span', { class: 'sort-mark', 'aria-hidden': 'true' }, active ? (order!.desc ? ' ▼' : ' ▲') : ''));
  return h('th', { scope: 'col', 'aria-sort': active ? (order!.desc ? 'descending' : 'ascending') : null }, btn);
}

// Orders two cell values: numbers by value, the rest as text (numeric-aware); missing values last
// whichever the direction.
export function compareCells(a: unknown, b: unknown, desc: boolean): number {
  const none = (v: unknown) => v === null || v === undefined || v === '';
  if (none(a) || none(b)) return none(a) === none(b) ? 0 : none(a) ? 1 : -1;
  const d = typeof a === 'number' && typeof b === 'number' ? a - b
    : String(a).localeCompare(String(b), undefined, { numeric: true });
  return desc ? -d : d;
}
