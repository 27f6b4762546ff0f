// logs.ts - a job's live log panel: the stream (GET /v1/jobs/{id}/logs?follow=true, read through
// fetch), a rank filter, follow / pause (scrolling up pauses, the bottom resumes), and a search
// that shows only the matching lines with the match marked. The page keeps the last 20,000 lines
// and shows at most 5,000 at a time.
import { ApiError, stream } from '../api';
import { clear, fmtTime, h, shownText } from '../dom';
import type { LogLine } from '../types';

const KEEP = 20000;
const SHOW = 5000;

export function logPanel(jobId: string, worldSize: number): { el: HTMLElement; destroy: () => void } {
  let lines: LogLine[] = [];
  let pending: LogLine[] = [];
  let rank = -1;
  let search = '';
  let follow = true;
  let unseen = 0;
  let frame = 0;
  let ctl = new AbortController();
  let searchTimer = 0;
  let autoTop = -1; // where following last scrolled to: a scroll event above it is the user's

  const rankSel = h('select', { id: 'log-rank' }, h('option', { value: '-1' }, 'All ranks'));
  for (let r = 0; r < Math.max(1, worldSize); r++) rankSel.append(h('option', { value: String(r) }, `Rank ${r}`));
  const followBox = h('input', { id: 'log-follow', type: 'checkbox', checked: true });
  const searchIn = h('input', { id: 'log-search', type: 'search', placeholder: 'text in the lines', autocomplete: 'off' });
  const count = h('span', { class: 'muted small', 'aria-live': 'off' });
  const state = h('span', { class: 'muted small', role: 'status' });
  const jump = h('button', { type: 'button', class: 'secondary small', onclick: () => setFollow(true) }, '');
  jump.hidden = true;
  const box = h('div', { class: 'logs', role: 'log', tabindex: '0', 'aria-label': 'Log lines', 'aria-live': 'off' });
  const el = h('section', { class: 'card', 'aria-labelledby': 'logs-title' },
    h('h2', { id: 'logs-title' }, 'Logs'),
    h('div', { class: 'toolbar' },
      h('label', { for: 'log-rank' }, 'Rank '), rankSel,
      h('label', { class: 'check' }, followBox, ' Follow'),
      h('label', { for: 'log-search' }, 'Search '), searchIn, count, state, jump),
    box);

  // what is searched is what shows
  function matches(l: LogLine): boolean {
    return !search || shownText(l.line).toLowerCase().includes(search);
  }

  function lineEl(l: LogLine): HTMLElement {
    const text = h('span', { class: 'text' });
    const line = shownText(l.line);
    if (search) {
      const low = line.toLowerCase();
      let i = 0, j: number;
      while ((j = low.indexOf(search, i)) >= 0) {
        text.append(line.slice(i, j), h('mark', null, line.slice(j, j + search.length)));
        i = j + search.length;
      }
      text.append(line.slice(i));
    } else {
      text.textContent = line;
    }
    return h('div', { class: `line${l.stream === 'stderr' ? ' stderr' : ''}`, 'data-seq': l.seq },
      h('span', { class: 'meta' }, `${fmtTime(l.time).slice(11)} r${l.rank}${l.stream === 'stderr' ? ' err' : ''} `), text);
  }

  function toBottom(): void {
    box.scrollTop = box.scrollHeight;
    autoTop = box.scrollTop;
  }

  function updateCount(): void {
    const shown = box.querySelectorAll('.line').length;
    count.textContent = search ? `${shown} matching of ${lines.length} lines` : `${lines.length} lines`;
    box.dataset.lines = String(lines.length);
    jump.hidden = follow || unseen === 0;
    jump.textContent = `${unseen} new line${unseen === 1 ? '' : 's'} below: follow`;
  }

  function rebuild(): void {
    clear(box);
    const shown = lines.filter(matches).slice(-SHOW);
    const frag = document.createDocumentFragment();
    for (const l of shown) frag.append(lineEl(l));
    box.append(frag);
    if (follow) toBottom();
    updateCount();
  }

  function flush(): void {
    frame = 0;
    const batch = pending;
    pending = [];
    lines = lines.concat(batch);
    if (lines.length > KEEP) lines = lines.slice(lines.length - KEEP);
    const frag = document.createDocumentFragment();
    let added = 0;
    for (const l of batch) if (matches(l)) { frag.append(lineEl(l)); added++; }
    box.append(frag);
    let extra = box.childElementCount - SHOW;
    while (extra-- > 0 && box.firstChild) box.removeChild(box.firstChild);
    if (follow) toBottom(); else unseen += added;
    updateCount();
  }

  function note(text: string): void {
    box.append(h('div', { class: 'line note' }, text));
    if (follow) toBottom();
  }

  function setFollow(on: boolean): void {
    follow = on;
    followBox.checked = on;
    if (on) { unseen = 0; toBottom(); }
    updateCount();
  }

  async function start(): Promise<void> {
    ctl.abort();
    ctl = new AbortController();
    const my = ctl;
    lines = [];
    pending = [];
    clear(box);
    updateCount();
    const q = new URLSearchParams({ follow: 'true' });
    if (rank >= 0) q.set('rank', String(rank));
    try {
      await stream(`/v1/jobs/${encodeURIComponent(jobId)}/logs?${q}`, (ev) => {
        if (ev.event === 'log') {
          try { pending.push(JSON.parse(ev.data) as LogLine); } catch { return; }
          if (!frame) frame = requestAnimationFrame(flush);
        } else if (ev.event === 'end') {
          if (frame) { cancelAnimationFrame(frame); flush(); }
          let info: { state?: string; reason?: string } = {};
          try { info = JSON.parse(ev.data); } catch { /* keep it empty */ }
          note(`— the job ended: ${info.state || ''}${info.reason ? `: ${shownText(info.reason)}` : ''} —`);
          box.dataset.ended = 'true';
        }
      }, my.signal, (s) => { state.textContent = s === 'open' ? 'live' : 'reconnecting…'; });
      if (!my.signal.aborted) state.textContent = 'ended';
    } catch (e) {
      if (!my.signal.aborted) state.textContent = e instanceof ApiError ? `logs: ${e.message}` : 'logs unavailable';
    }
  }

  rankSel.addEventListener('change', () => { rank = Number(rankSel.value); start(); });
  followBox.addEventListener('change', () => setFollow(followBox.checked));
  searchIn.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = window.setTimeout(() => { search = searchIn.value.toLowerCase(); rebuild(); }, 150);
  });
  box.addEventListener('scroll', () => {
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 8;
    if (follow && !atBottom && box.scrollTop < autoTop - 2) setFollow(false);
    else if (!follow && atBottom && unseen > 0) setFollow(true);
  });
  start();
  return { el, destroy: () => { ctl.abort(); if (frame) cancelAnimationFrame(frame); clearTimeout(searchTimer); } };
}
