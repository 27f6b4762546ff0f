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
export const LIVE_STATES = ['QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING', 'RESTARTING', 'PREEMPTED', 'PAUSED'];
