// tunings.ts - the tuning jobs page (#/tuning?order_by=created desc): the searches of the projects
// the user can see (GET /v1/tuning-jobs) with their state, strategy, trials finished of the most
// and running, best objective so far and age, sortable by any column, the order kept in the URL.
// A refresh reads the whole list, following next_page_token to its end: the page sorts and counts
// in the browser, which is right only over every search (a "Load more" as on the jobs page, whose
// order kilnd applies, would sort and count the first page alone); searches are few (each is many
// jobs), a page holds 500, and each carries its trial counts and best.
import { ApiError, get } from '../api';
import { clear, compareCells, fmtAge, fmtNum, h, parseOrder, sortHeader, stateBadge, TERMINAL } from '../dom';
import { setParams, type Cleanup } from '../main';
import type { TuningJob, TuningJobPage } from '../types';

const REFRESH_MS = 3000;
const PAGE = 500; // the most kilnd gives a page
const DEFAULT_ORDER = 'created desc';

// A tuning job's trials that ended (COMPLETED, FAILED, STOPPED): the list's count, or its own
// trials' (a warm start's parents' are history); undefined when neither came.
export function trialsDone(t: TuningJob): number | undefined {
  if (t.trials_done !== undefined) return t.trials_done;
  return t.trials ? t.trials.filter((x) => !x.parent && TERMINAL.has(x.state)).length : undefined;
}

export function objectiveText(t: TuningJob): string {
  return `${t.objective?.metric || ''} (${t.objective?.goal === 'maximize' ? 'maximize' : 'minimize'})`;
}

interface Col { field: string; label: string; firstDesc: boolean; value: (t: TuningJob) => unknown; cell: (t: TuningJob) => Node | string }

const COLS: Col[] = [
  { field: 'name', label: 'Name', firstDesc: false, value: (t) => t.name,
    cell: (t) => h('a', { href: `#/tuning/${t.id}`, title: t.id }, t.name || t.id.slice(0, 8)) },
  { field: 'state', label: 'State', firstDesc: false, value: (t) => t.state, cell: (t) => stateBadge(t.state) },
  { field: 'project', label: 'Project', firstDesc: false, value: (t) => t.project, cell: (t) => t.project },
  { field: 'strategy', label: 'Strategy', firstDesc: false, value: (t) => t.strategy, cell: (t) => t.strategy },
  { field: 'trials', label: 'Trials done / max', firstDesc: true, value: (t) => trialsDone(t),
    cell: (t) => `${trialsDone(t) ?? '…'} / ${t.max_jobs}${t.trials_running ? ` (${t.trials_running} active)` : ''}` },
  { field: 'objective', label: 'Objective', firstDesc: false, value: (t) => t.objective?.metric, cell: objectiveText },
  { field: 'best', label: 'Best', firstDesc: false, value: (t) => t.best?.objective,
    cell: (t) => (t.best ? h('a', { href: `#/jobs/${t.best.job_id}`, title: 'the best trial\'s job' }, fmtNum(t.best.objective)) : '—') },
  { field: 'created', label: 'Created', firstDesc: true, value: (t) => t.created_at, cell: (t) => fmtAge(t.created_at) },
];

export function tuningsPage(main: HTMLElement, params: URLSearchParams): Cleanup {
  let orderBy = params.get('order_by') || DEFAULT_ORDER;
  let alive = true;
  let timer = 0;
  let list: TuningJob[] = [];
  let loaded = false;
  const status = h('span', { class: 'muted', 'aria-live': 'polite' });
  const errBox = h('p', { class: 'error', role: 'alert' });
  errBox.hidden = true;
  const thead = h('thead');
  const tbody = h('tbody');
  main.append(h('h1', null, 'Tuning jobs'),
    h('p', { class: 'muted small' }, 'Searches over hyperparameters whose trials are jobs. Start one with kiln tune submit FILE.'),
    errBox, h('div', { class: 'toolbar' }, status),
    h('div', { class: 'table-wrap' }, h('table', { class: 'tunings', 'aria-label': 'Tuning jobs' }, thead, tbody)));

  let shown = '';
  function render(): void {
    const order = parseOrder(orderBy);
    const key = JSON.stringify([loaded, orderBy, list]);
    if (key === shown) return; // nothing new: the table (and the focus in it) stays
    shown = key;
    clear(thead);
    thead.append(h('tr', null, ...COLS.map((c) => sortHeader(c.label, c.field, order, c.firstDesc, (o) => {
      orderBy = `${o.field} ${o.desc ? 'desc' : 'asc'}`;
      setParams(new URLSearchParams(orderBy === DEFAULT_ORDER ? '' : `order_by=${encodeURIComponent(orderBy)}`));
      render();
    }))));
    const rows = [...list];
    const col = COLS.find((c) => c.field === order?.field);
    if (col) rows.sort((a, b) => compareCells(col.value(a), col.value(b), order!.desc));
    clear(tbody);
    for (const t of rows) {
      tbody.append(h('tr', { 'data-id': t.id, 'data-state': t.state }, ...COLS.map((c) => h('td', { class: `c-${c.field}` }, c.cell(t)))));
    }
    if (!rows.length) {
      tbody.append(h('tr', null, h('td', { colspan: COLS.length, class: 'muted empty' },
        loaded ? 'No tuning jobs yet. Start one with kiln tune submit FILE.' : 'Loading…')));
    }
    status.textContent = `${rows.length} tuning job${rows.length === 1 ? '' : 's'}`;
  }

  // Every page, newest first; a search created while reading is on the first page only (the pages
  // go by created_at then id), so none comes twice, but one is kept once by its id all the same.
  async function readAll(): Promise<TuningJob[]> {
    const all: TuningJob[] = [];
    const seen = new Set<string>();
    let token = '';
    do {
      const p = new URLSearchParams({ page_size: String(PAGE) });
      if (token) p.set('page_token', token);
      const page = await get<TuningJobPage>(`/v1/tuning-jobs?${p}`);
      if (!alive) break;
      for (const t of page.tuning_jobs) if (!seen.has(t.id)) { seen.add(t.id); all.push(t); }
      token = page.next_page_token || '';
    } while (token);
    return all;
  }

  async function load(): Promise<void> {
    try {
      list = await readAll();
      if (!alive) return;
      loaded = true;
      errBox.hidden = true;
      render();
      main.dataset.loaded = 'true';
    } catch (e) {
      if (!alive) return;
      errBox.textContent = e instanceof ApiError ? e.message : `kilnd did not answer: ${String(e)}`;
      errBox.hidden = false;
    }
  }

  // Live: read again every few seconds while the tab is visible.
  async function refresh(): Promise<void> {
    if (!alive) return;
    if (document.visibilityState === 'visible') await load();
    if (alive) timer = window.setTimeout(refresh, REFRESH_MS);
  }

  render();
  (async () => {
    await load();
    if (alive) timer = window.setTimeout(refresh, REFRESH_MS);
  })();
  return () => { alive = false; clearTimeout(timer); };
}
