// jobs.ts - the jobs page: a live table (state, name, project, progress with ETA, chosen
// hyperparameters and metric summaries, age, duration), the filter language in a search box
// with kilnd's error shown at its caret, sorting by any column, and multi-select -> compare.
// The search, the sort and the columns live in the URL (#/jobs?filter=...&order_by=...&columns=...);
// kilnd filters, orders and pages (GET /v1/jobs with filter, order_by, columns, page_token) and
// returns the columns' values and the named metrics' summaries with each job.
import { ApiError, get } from '../api';
import { columnSuggestions, columnValue, durationS } from '../columns';
import { announce, clear, fmtAge, fmtDuration, fmtNum, h, parseOrder, sortHeader, stateBadge, TERMINAL } from '../dom';
import { go, setParams, type Cleanup } from '../main';
import type { Job, JobPage } from '../types';

const PAGE = 100;
const REFRESH_MS = 3000;
const DEFAULT_COLUMNS = 'hp.lr,metrics.train_loss.last';

interface Col { key: string; label: string; sortField: string | null; cell: (j: Job) => Node | string }

function progressCell(j: Job): Node | string {
  const p = j.progress;
  if (!p || !p.total_steps) return '';
  const step = p.step || 0;
  const pct = Math.min(100, Math.floor((100 * step) / p.total_steps));
  const eta = !TERMINAL.has(j.state) && p.eta_s ? ` · ETA ${fmtDuration(p.eta_s)}` : '';
  return h('div', { class: 'prog' },
    h('progress', { max: p.total_steps, value: step, 'aria-label': `step ${step} of ${p.total_steps}` }),
    h('span', { class: 'prog-text' }, `${step}/${p.total_steps} (${pct}%)${eta}`));
}

// Where the caret of kilnd's error detail points in the query, or -1. The detail is the query
// (or a window of it, "..." marking what was cut) and under it a line of carets.
export function caretPosition(detail: string, query: string): number {
  const lines = detail.split('\n');
  for (let i = 1; i < lines.length; i++) {
    const m = /^( *)\^+\s*$/.exec(lines[i]);
    if (!m) continue;
    const shown = lines[i - 1];
    const cut = shown.startsWith('...') ? 3 : 0;
    const body = shown.slice(cut).replace(/\.\.\.$/, '');
    const start = cut ? Math.max(0, query.indexOf(body.slice(0, 16))) : 0;
    return Math.max(0, Math.min(query.length, start + m[1].length - cut));
  }
  return -1;
}

export function jobsPage(main: HTMLElement, params: URLSearchParams): Cleanup {
  let filter = params.get('filter') || '';
  let orderBy = params.get('order_by') || '';
  let columns = (params.get('columns') ?? DEFAULT_COLUMNS).split(',').map((s) => s.trim()).filter(Boolean);
  let jobs: Job[] = [];
  let nextToken = '';
  let timer = 0;
  let alive = true;
  let loading = false;
  const selected = new Set<string>();
  const rows = new Map<string, { tr: HTMLTableRowElement; sig: string }>();

  // ---- controls ----
  const q = h('input', { id: 'filter', type: 'search', value: filter, spellcheck: 'false', autocomplete: 'off',
                         placeholder: 'hp.lr < 1e-3 AND (metrics.val_loss.min < 1.6 OR tags.team = "nlp")',
                         'aria-describedby': 'filter-help filter-error', 'aria-keyshortcuts': '/' });
  const colsIn = h('input', { id: 'columns', type: 'text', value: columns.join(','), spellcheck: 'false',
                              autocomplete: 'off', list: 'column-names' });
  const colList = h('datalist', { id: 'column-names' });
  const errBox = h('div', { id: 'filter-error', class: 'error', role: 'alert' });
  errBox.hidden = true;
  const help = h('p', { id: 'filter-help', class: 'muted small' },
    'Fields: name, state, project, tags.KEY, hp.NAME, metrics.NAME.min|max|last|count, created, duration… ',
    'Operators: = != < <= > >= ~ IN EXISTS, with AND, OR, NOT and parentheses. Enter searches.');
  const form = h('form', { class: 'search', role: 'search' },
    h('div', { class: 'field grow' }, h('label', { for: 'filter' }, 'Filter'), q),
    h('div', { class: 'field' }, h('label', { for: 'columns' }, 'Columns'), colsIn, colList),
    h('button', { type: 'submit' }, 'Search'));
  const compareBtn = h('button', { type: 'button', disabled: true, onclick: () => {
    go(`#/compare?ids=${[...selected].join(',')}`);
  } }, 'Compare selected');
  const status = h('span', { class: 'muted', 'aria-live': 'polite' });
  const more = h('button', { type: 'button', class: 'secondary', onclick: () => load(false) }, 'Load more');
  more.hidden = true;
  const table = h('table', { class: 'jobs', 'aria-label': 'Jobs' });
  const thead = h('thead');
  const tbody = h('tbody');
  table.append(thead, tbody);

  main.append(h('h1', null, 'Jobs'), form, help, errBox,
    h('div', { class: 'toolbar' }, compareBtn, status),
    h('div', { class: 'table-wrap' }, table), more);

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    filter = q.value.trim();
    columns = colsIn.value.split(',').map((s) => s.trim()).filter(Boolean);
    saveUrl();
    load(true);
  });

  function saveUrl(): void {
    const p = new URLSearchParams();
    if (filter) p.set('filter', filter);
    if (orderBy) p.set('order_by', orderBy);
    if (columns.join(',') !== DEFAULT_COLUMNS) p.set('columns', columns.join(','));
    setParams(p);
  }

  function cols(): Col[] {
    const base: Col[] = [
      { key: 'state', label: 'State', sortField: 'state', cell: (j) => stateBadge(j.state) },
      { key: 'name', label: 'Name', sortField: 'name',
        cell: (j) => h('a', { href: `#/jobs/${j.id}`, title: j.id }, j.name || j.id.slice(0, 8)) },
      { key: 'project', label: 'Project', sortField: 'project', cell: (j) => j.project || '' },
      { key: 'progress', label: 'Progress', sortField: 'progress', cell: progressCell },
    ];
    for (const c of columns) base.push({ key: c, label: c, sortField: c, cell: (j) => fmtNum(columnValue(j, c)) });
    base.push({ key: 'age', label: 'Age', sortField: 'created', cell: (j) => fmtAge(j.created_at) },
              { key: 'duration', label: 'Wall time', sortField: 'duration', cell: (j) => fmtDuration(durationS(j)) });
    return base;
  }


  function renderHead(): void {
    clear(thead);
    const s = parseOrder(orderBy);
    const all = h('input', { type: 'checkbox', 'aria-label': 'Select every job shown', onchange: (ev: Event) => {
      const on = (ev.target as HTMLInputElement).checked;
      for (const j of jobs) { if (on) selected.add(j.id); else selected.delete(j.id); }
      renderRows(true);
    } });
    const tr = h('tr', null, h('th', { scope: 'col', class: 'sel' }, all));
    for (const c of cols()) {
      tr.append(sortHeader(c.label, c.sortField!, s, c.key === 'age' ? false : c.key !== 'name', (o) => {
        orderBy = `${o.field} ${o.desc ? 'desc' : 'asc'}`;
        saveUrl();
        load(true);
      }));
    }
    thead.append(tr);
  }

  function renderRows(force = false): void {
    const cs = cols();
    const list = jobs; // in kilnd's order
    const seen = new Set<string>();
    list.forEach((j, i) => {
      seen.add(j.id);
      const sig = JSON.stringify([j.state, j.name, j.progress, j.metrics, j.columns, j.started_at, j.ended_at,
                                  selected.has(j.id), Math.floor(Date.now() / 10000), cs.length]);
      let row = rows.get(j.id);
      if (!row || row.sig !== sig || force) {
        const box = h('input', { type: 'checkbox', 'aria-label': `Select ${j.name || j.id}`, checked: selected.has(j.id),
          onchange: (ev: Event) => {
            if ((ev.target as HTMLInputElement).checked) selected.add(j.id); else selected.delete(j.id);
            updateSelection();
          } });
        const tr = h('tr', { 'data-id': j.id, 'data-state': j.state, class: selected.has(j.id) ? 'selected' : null },
          h('td', { class: 'sel' }, box), ...cs.map((c) => h('td', { class: `c-${c.key.replace(/\W/g, '_')}` }, c.cell(j))));
        const hadFocus = row && row.tr.contains(document.activeElement);
        const focusIdx = hadFocus ? [...row!.tr.querySelectorAll('a,input,button')].indexOf(document.activeElement as Element) : -1;
        if (row) row.tr.replaceWith(tr);
        if (focusIdx >= 0) (tr.querySelectorAll('a,input,button')[focusIdx] as HTMLElement | undefined)?.focus();
        row = { tr, sig };
        rows.set(j.id, row);
      }
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] || null);
    });
    for (const [id, r] of rows) if (!seen.has(id)) { r.tr.remove(); rows.delete(id); }
    if (!list.length) {
      clear(tbody);
      rows.clear();
      tbody.append(h('tr', null, h('td', { colspan: cs.length + 1, class: 'muted empty' },
        filter ? 'No job matches this filter.' : 'No jobs yet. Submit one with kiln submit SPEC.json.')));
    } else {
      tbody.querySelector('td.empty')?.parentElement?.remove();
    }
    updateSelection();
  }

  function updateSelection(): void {
    compareBtn.disabled = selected.size < 2;
    compareBtn.textContent = selected.size ? `Compare selected (${selected.size})` : 'Compare selected';
    for (const [id, r] of rows) r.tr.classList.toggle('selected', selected.has(id));
  }

  function showError(e: unknown): void {
    clear(errBox);
    q.removeAttribute('aria-invalid');
    if (!(e instanceof ApiError)) {
      errBox.append(h('p', null, `kilnd did not answer: ${String(e)}`));
      errBox.hidden = false;
      return;
    }
    const b = e.body;
    errBox.append(h('p', { class: 'msg' }, h('strong', null, 'Search error: '), b.message || `HTTP ${e.status}`));
    if (b.detail) errBox.append(h('pre', { class: 'caret' }, b.detail));
    if (b.hint) errBox.append(h('p', { class: 'hint' }, b.hint));
    errBox.hidden = false;
    if (!b.field || b.field === 'filter') {
      q.setAttribute('aria-invalid', 'true');
      const pos = caretPosition(b.detail || '', filter);
      if (pos >= 0) { q.focus(); q.setSelectionRange(pos, pos); }
    }
    announce(`Search error: ${b.message || ''}`);
  }

  function query(pageToken: string, size: number): string {
    const p = new URLSearchParams();
    p.set('page_size', String(size));
    if (pageToken) p.set('page_token', pageToken);
    if (filter) p.set('filter', filter);
    if (orderBy) p.set('order_by', orderBy);
    const wanted = columns.filter((c) => c.startsWith('hp.') || c.startsWith('metrics.'));
    if (wanted.length) p.set('columns', wanted.join(','));
    return `/v1/jobs?${p}`;
  }

  async function load(reset: boolean): Promise<void> {
    if (loading) return;
    loading = true;
    try {
      const page = await get<JobPage>(query(reset ? '' : nextToken, PAGE));
      if (!alive) return;
      errBox.hidden = true;
      q.removeAttribute('aria-invalid');
      jobs = reset ? page.jobs : jobs.concat(page.jobs.filter((j) => !jobs.some((x) => x.id === j.id)));
      nextToken = page.next_page_token || '';
      if (reset) { rows.clear(); clear(tbody); renderHead(); }
      renderRows();
      more.hidden = !nextToken;
      status.textContent = `${jobs.length}${nextToken ? '+' : ''} job${jobs.length === 1 ? '' : 's'}`;
      // when the first page was on screen, in ms since navigation (tests/ui/bench.mjs reads it)
      if (!main.dataset.loaded) main.dataset.renderedMs = String(Math.round(performance.now()));
      main.dataset.loaded = 'true';
      const sugg = columnSuggestions(jobs);
      clear(colList);
      for (const s of sugg) colList.append(h('option', { value: s }));
    } catch (e) {
      if (alive) showError(e);
    } finally {
      loading = false;
    }
  }

  // Live: the jobs shown are fetched again every few seconds while the tab is visible.
  async function refresh(): Promise<void> {
    if (!alive) return;
    if (document.visibilityState === 'visible' && !loading) {
      try {
        const page = await get<JobPage>(query('', Math.min(500, Math.max(PAGE, jobs.length))));
        if (!alive) return;
        const fresh = new Map(page.jobs.map((j) => [j.id, j]));
        // The first page as it is now, then the rest already loaded (updated where seen again).
        const rest = jobs.filter((j) => !fresh.has(j.id)).slice(0, Math.max(0, jobs.length - page.jobs.length));
        jobs = page.jobs.concat(rest);
        if (!nextToken) nextToken = page.next_page_token || '';
        renderRows();
      } catch { /* the next round tries again; errors of the search itself show on submit */ }
    }
    if (alive) timer = window.setTimeout(refresh, REFRESH_MS);
  }

  (async () => {
    await load(true);
    timer = window.setTimeout(refresh, REFRESH_MS);
  })();

  return () => { alive = false; clearTimeout(timer); };
}
