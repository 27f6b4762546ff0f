// tuning.ts - one tuning job (#/tuning/ID?order_by=objective asc): its state and reason, objective
// and strategy, the best trial so far, the objective against trial number and against the steps
// the trials consumed (with the best so far), a parallel-coordinates view of the hyperparameters
// against the objective, the trials table (a column a parameter; sortable, the order in the URL;
// Compare of the selected or the best trials) and the events. Stop for those who may. Live: read
// again every few seconds until it ends.
import { api, ApiError, canEdit, get } from '../api';
import { ObjectiveChart, ParallelChart, type ParallelAxis } from '../chart';
import { announce, clear, compareCells, fmtAge, fmtNum, fmtTime, h, parseOrder, sortHeader, stateBadge, TERMINAL,
         shownText, timelineItem, TUNING_ENDED } from '../dom';
import { go, setParams, type Cleanup } from '../main';
import type { TuningJob, TuningTrial } from '../types';
import { objectiveText, trialsDone } from './tunings';

const POLL_MS = 2000;
const DEFAULT_ORDER = 'trial asc';
const TOP_K = 5;

type Value = number | string | boolean | null | undefined;

// The parameters' names: the request's, in its order, then any a trial has beyond them.
function paramNames(t: TuningJob): string[] {
  const names = Object.keys(t.spec?.parameters || {});
  for (const tr of t.trials || []) for (const k of Object.keys(tr.parameters || {})) if (!names.includes(k)) names.push(k);
  return names;
}

// The trials with an objective, best first.
function ranked(t: TuningJob): TuningTrial[] {
  const max = t.objective?.goal === 'maximize';
  return (t.trials || []).filter((x) => typeof x.objective === 'number' && x.state !== 'FAILED')
    .sort((a, b) => (max ? b.objective! - a.objective! : a.objective! - b.objective!));
}

// The parallel-coordinates axes: each parameter over its range (the request's, else the values
// seen), then the objective over the values seen, better up.
function parallelAxes(t: TuningJob, names: string[]): ParallelAxis[] {
  const trials = t.trials || [];
  const axes: ParallelAxis[] = names.map((n) => {
    const p = t.spec?.parameters?.[n];
    if (p?.type === 'categorical' && p.values) return { name: n, min: 0, max: 1, values: p.values };
    const seen = trials.map((x) => x.parameters?.[n]);
    if (!p && seen.some((v) => v !== undefined && typeof v !== 'number')) {
      return { name: n, min: 0, max: 1, values: [...new Set(seen.filter((v): v is number | string | boolean => v !== undefined))] };
    }
    const nums = seen.filter((v): v is number => typeof v === 'number');
    return { name: n, min: p?.min ?? Math.min(...nums, 0), max: p?.max ?? Math.max(...nums, 1), scaling: p?.scaling };
  });
  const objs = trials.map((x) => x.objective).filter((v): v is number => typeof v === 'number');
  let lo = objs.length ? Math.min(...objs) : 0, hi = objs.length ? Math.max(...objs) : 1;
  if (hi <= lo) { lo -= 0.5; hi += 0.5; }
  axes.push({ name: t.objective?.metric || 'objective', min: lo, max: hi, invert: t.objective?.goal !== 'maximize' });
  return axes;
}

export function tuningPage(main: HTMLElement, params: URLSearchParams, path: string[]): Cleanup {
  const id = path[1];
  let alive = true;
  let timer = 0;
  let tj: TuningJob | null = null;
  let history: TuningTrial[] = []; // a warm start's parents' trials
  let orderBy = params.get('order_by') || DEFAULT_ORDER;
  let chartsKey = '';
  let trialsKey = '';
  let eventsKey = '';
  const selected = new Set<string>();
  let byTrial: ObjectiveChart | null = null;
  let bySteps: ObjectiveChart | null = null;
  let parallel: ParallelChart | null = null;

  const head = h('div', { class: 'job-head' });
  const summary = h('dl', { class: 'summary', id: 'tuning-summary' });
  const best = h('section', { class: 'card', id: 'best', 'aria-labelledby': 'best-title' });
  const chartGrid = h('div', { class: 'charts', id: 'tuning-charts' });
  const parallelBox = h('div', { class: 'charts one', id: 'parallel-box' });
  const compareSel = h('button', { type: 'button', id: 'compare-selected', disabled: true,
    onclick: () => compare([...selected]) }, 'Compare selected');
  const compareTop = h('button', { type: 'button', class: 'secondary', id: 'compare-top',
    onclick: () => { if (tj) compare(ranked(tj).slice(0, TOP_K).map((x) => x.job_id)); } }, `Compare the best ${TOP_K}`);
  const trialsTable = h('table', { class: 'trials', id: 'trials', 'aria-label': 'Trials' });
  const events = h('ol', { class: 'timeline', id: 'events' });
  main.append(head, summary, best,
    h('section', { class: 'card', 'aria-labelledby': 'obj-title' }, h('div', { class: 'card-head' }, h('h2', { id: 'obj-title' }, 'Objective')), chartGrid),
    h('section', { class: 'card', 'aria-labelledby': 'par-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'par-title' }, 'Hyperparameters against the objective'),
        h('span', { class: 'muted small' }, 'One line a trial; orange is better, blue worse, grey dashed has no objective yet.')),
      parallelBox),
    h('section', { class: 'card', 'aria-labelledby': 'trials-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'trials-title' }, 'Trials'), h('div', { class: 'toolbar' }, compareSel, compareTop)),
      h('div', { class: 'table-wrap' }, trialsTable)),
    h('section', { class: 'card', 'aria-labelledby': 'events-title' }, h('h2', { id: 'events-title' }, 'Events'), events));

  function compare(ids: string[]): void {
    if (ids.length < 1 || !tj) return;
    go(`#/compare?ids=${ids.join(',')}&metrics=${encodeURIComponent(tj.objective?.metric || '')}`);
  }

  function renderHead(t: TuningJob): void {
    clear(head);
    const actions = h('div', { class: 'actions' });
    // Offered only to those who may: editors and admins of its project.
    if (canEdit(t.project) && t.state === 'RUNNING') {
      actions.append(h('button', { type: 'button', class: 'danger', id: 'stop', onclick: () => stop(t) }, 'Stop tuning job'));
    }
    head.append(
      h('p', { class: 'crumbs' }, h('a', { href: '#/tuning' }, 'Tuning'), ' / ', h('code', null, t.id)),
      h('div', { class: 'title-row' }, h('h1', null, t.name || t.id), stateBadge(t.state), actions),
      h('p', { class: 'reason', id: 'reason' }, shownText(t.reason || '')));
  }

  function renderSummary(t: TuningJob): void {
    clear(summary);
    const row = (k: string, ...v: (Node | string | null)[]) => summary.append(h('dt', null, k), h('dd', null, ...v));
    const trials = t.trials || [];
    row('Objective', h('span', { id: 'objective' }, objectiveText(t)));
    const hb = t.spec?.hyperband;
    row('Strategy', t.strategy, hb ? h('span', { class: 'muted' }, ` (rungs from ${hb.min_resource} to ${hb.max_resource} steps, reduction factor ${hb.reduction_factor}${hb.max_rungs ? `, at most ${hb.max_rungs} rungs` : ''}${hb.sampler === 'tpe' ? '; new trials drawn by TPE' : ''})`) : null);
    const active = trials.filter((x) => !TERMINAL.has(x.state)).length;
    row('Trials', h('span', { id: 'trial-count' }, `${trialsDone(t) ?? 0} done, ${active} active, of at most ${t.max_jobs}`),
      h('span', { class: 'muted' }, ` (${t.max_parallel_jobs ?? 1} at once)`));
    row('Steps consumed', fmtNum(trials.reduce((a, x) => a + (x.steps || 0), 0)));
    if (t.warm_start) {
      row('Warm start', `${t.warm_start.type.replace(/_/g, ' ')} from `, ...t.warm_start.parents.flatMap((p, i) => [
        i ? ', ' : '', h('a', { href: `#/tuning/${p}`, class: 'warm-parent' }, p.slice(0, 8)),
        h('span', { class: 'muted' }, ` (${history.filter((x) => x.parent === p).length} trials)`)]));
    }
    if (t.seed !== undefined) row('Seed', String(t.seed));
    row('Project', t.project);
    if (t.submitted_by) row('Submitted by', t.submitted_by);
    row('Created', fmtTime(t.created_at), h('span', { class: 'muted' }, ` (${fmtAge(t.created_at)})`));
    if (t.ended_at) row('Ended', fmtTime(t.ended_at));
  }

  function renderBest(t: TuningJob): void {
    clear(best);
    best.append(h('h2', { id: 'best-title' }, 'Best trial so far'));
    const b = t.best;
    if (!b) {
      best.append(h('p', { class: 'muted' }, `No trial has reported ${t.objective?.metric || 'the objective'} yet.`));
      return;
    }
    const tr = (t.trials || []).find((x) => x.job_id === b.job_id);
    best.append(h('p', null,
      h('a', { href: `#/jobs/${b.job_id}`, id: 'best-link' }, tr ? `Trial ${tr.trial}` : b.job_id.slice(0, 8)),
      `: ${t.objective?.metric || 'objective'} `, h('strong', { id: 'best-objective' }, fmtNum(b.objective)),
      tr ? h('span', { class: 'muted' }, ` after ${fmtNum(tr.steps)} steps`) : null,
      b.parent ? h('span', { class: 'muted', id: 'best-parent' }, ` (a trial of warm start parent ${b.parent.slice(0, 8)})`) : null),
      h('table', { class: 'kv', 'aria-label': 'The best trial\'s parameters' },
        h('tbody', null, ...Object.entries(b.parameters || {}).map(([k, v]) => h('tr', null, h('th', { scope: 'row' }, k), h('td', null, fmtNum(v)))))));
  }

  function renderTrials(t: TuningJob): void {
    // drawn again only when something in it changed (a poll that brings nothing new keeps focus)
    const key = JSON.stringify([t.trials, t.best?.job_id, orderBy]);
    if (key === trialsKey) { updateSelection(); return; }
    trialsKey = key;
    const names = paramNames(t);
    const order = parseOrder(orderBy);
    const cols: { field: string; label: string; firstDesc: boolean; value: (x: TuningTrial) => Value; cell: (x: TuningTrial) => Node | string }[] = [
      { field: 'trial', label: 'Trial', firstDesc: false, value: (x) => x.trial,
        cell: (x) => h('a', { href: `#/jobs/${x.job_id}`, title: `the trial's job ${x.job_id}` }, String(x.trial)) },
      ...names.map((n) => ({ field: `param.${n}`, label: n, firstDesc: false, value: (x: TuningTrial) => x.parameters?.[n],
                             cell: (x: TuningTrial) => fmtNum(x.parameters?.[n]) })),
      { field: 'objective', label: t.objective?.metric || 'objective', firstDesc: t.objective?.goal === 'maximize',
        value: (x) => x.objective, cell: (x) => fmtNum(x.objective) },
      { field: 'steps', label: 'Steps', firstDesc: true, value: (x) => x.steps, cell: (x) => fmtNum(x.steps) },
      { field: 'rung', label: 'Rung', firstDesc: true, value: (x) => x.rung, cell: (x) => fmtNum(x.rung) },
      { field: 'state', label: 'State', firstDesc: false, value: (x) => x.state, cell: (x) => stateBadge(x.state) },
      { field: 'job', label: 'Job', firstDesc: false, value: (x) => x.job_id,
        cell: (x) => h('a', { href: `#/jobs/${x.job_id}`, class: 'trial-job' }, h('code', null, x.job_id.slice(0, 8))) },
    ];
    const trials = [...(t.trials || [])];
    const col = cols.find((c) => c.field === order?.field);
    if (col) trials.sort((a, b) => compareCells(col.value(a), col.value(b), order!.desc) || a.trial - b.trial);
    const sorted = (o: { field: string; desc: boolean }) => {
      orderBy = `${o.field} ${o.desc ? 'desc' : 'asc'}`;
      setParams(new URLSearchParams(orderBy === DEFAULT_ORDER ? '' : `order_by=${encodeURIComponent(orderBy)}`));
      renderTrials(t);
    };
    const focusedBox = (document.activeElement as HTMLElement | null)?.dataset?.job;
    clear(trialsTable);
    trialsTable.append(h('thead', null, h('tr', null, h('th', { scope: 'col', class: 'sel' }, h('span', { class: 'visually-hidden' }, 'Select')),
      ...cols.map((c) => sortHeader(c.label, c.field, order, c.firstDesc, sorted)))));
    const body = h('tbody');
    for (const x of trials) {
      const isBest = t.best?.job_id === x.job_id;
      const box = h('input', { type: 'checkbox', 'aria-label': `Select trial ${x.trial}`, 'data-job': x.job_id, checked: selected.has(x.job_id),
        onchange: (ev: Event) => {
          if ((ev.target as HTMLInputElement).checked) selected.add(x.job_id); else selected.delete(x.job_id);
          updateSelection();
        } });
      body.append(h('tr', { 'data-trial': x.trial, 'data-job': x.job_id, 'data-state': x.state, class: isBest ? 'best' : selected.has(x.job_id) ? 'selected' : null },
        h('td', { class: 'sel' }, box),
        ...cols.map((c, i) => h('td', { class: `c-${c.field.replace(/\W/g, '_')}` }, c.cell(x),
          i === 0 && isBest ? h('span', { class: 'best-mark', title: 'the best trial so far' }, ' ★', h('span', { class: 'visually-hidden' }, ' (best)')) : null))));
      if (focusedBox === x.job_id) queueMicrotask(() => box.focus());
    }
    if (!trials.length) body.append(h('tr', null, h('td', { colspan: cols.length + 1, class: 'muted empty' }, 'No trials yet.')));
    trialsTable.append(body);
    updateSelection();
  }

  function updateSelection(): void {
    const live = new Set((tj?.trials || []).map((x) => x.job_id));
    for (const j of [...selected]) if (!live.has(j)) selected.delete(j);
    compareSel.disabled = selected.size < 2;
    compareSel.textContent = selected.size ? `Compare selected (${selected.size})` : 'Compare selected';
    compareTop.disabled = !tj || ranked(tj).length < 1;
    for (const tr of trialsTable.querySelectorAll<HTMLTableRowElement>('tbody tr[data-job]')) {
      if (!tr.classList.contains('best')) tr.classList.toggle('selected', selected.has(tr.dataset.job!));
    }
  }

  function renderCharts(t: TuningJob): void {
    const trials = [...(t.trials || [])].sort((a, b) => a.trial - b.trial);
    const key = JSON.stringify(trials.map((x) => [x.trial, x.objective, x.steps, x.state]));
    if (key === chartsKey) return;
    chartsKey = key;
    const max = t.objective?.goal === 'maximize';
    const metric = t.objective?.metric || 'objective';
    if (!byTrial) {
      byTrial = new ObjectiveChart(chartGrid, `${metric} by trial`, 'trial', metric, max, 'chart-by-trial', true);
      bySteps = new ObjectiveChart(chartGrid, `${metric} against steps consumed`, 'steps consumed (all trials)', metric, max, 'chart-by-steps');
    }
    byTrial.setPoints(trials.filter((x) => typeof x.objective === 'number').map((x) => ({ x: x.trial, y: x.objective! })));
    // the steps every trial so far consumed, in the order the trials were started
    let sum = 0;
    const cum = trials.map((x) => { sum += x.steps || 0; return { x: sum, y: x.objective }; });
    bySteps!.setPoints(cum.filter((p): p is { x: number; y: number } => typeof p.y === 'number'));
    const names = paramNames(t);
    parallel?.destroy();
    parallel = null;
    clear(parallelBox);
    if (!trials.length) {
      parallelBox.append(h('p', { class: 'muted empty' }, 'No trials yet.'));
      return;
    }
    const axes = parallelAxes(t, names);
    const objAxis = axes[axes.length - 1];
    parallel = new ParallelChart(parallelBox, `${names.join(', ')} against ${metric}`, axes, trials.map((x) => {
      const shade = typeof x.objective === 'number' ? 1 - (x.objective - objAxis.min) / (objAxis.max - objAxis.min) : null;
      return {
        label: `trial ${x.trial} (${x.state}): ${names.map((n) => `${n} ${fmtNum(x.parameters?.[n])}`).join(', ')} → ${metric} ${fmtNum(x.objective) || '—'}`,
        values: [...names.map((n) => x.parameters?.[n]), x.objective],
        shade: shade === null ? null : max ? 1 - shade : shade,
      };
    }), 'parallel');
  }

  function renderEvents(t: TuningJob): void {
    const evs = t.events || [];
    const key = `${evs.length}/${evs[evs.length - 1]?.seq ?? ''}`;
    if (key === eventsKey) return;
    eventsKey = key;
    clear(events);
    for (const e of evs) events.append(timelineItem(e));
    if (!evs.length) events.append(h('li', { class: 'muted' }, 'No events.'));
  }

  async function stop(t: TuningJob): Promise<void> {
    if (!confirm(`Stop tuning job ${t.name || t.id}? Its running trials are stopped and no new ones start.`)) return;
    try {
      const r = await api<TuningJob>('POST', `/v1/tuning-jobs/${encodeURIComponent(t.id)}:stop`, {});
      announce(`Tuning job is ${r.state}`);
      update(r);
      schedule();
    } catch (e) {
      alert(e instanceof ApiError ? `${e.message}${e.body.hint ? `\n${e.body.hint}` : ''}` : String(e));
    }
  }

  function update(t: TuningJob): void {
    // a warm start's parents' trials are history: counted in the summary, not this search's own
    history = (t.trials || []).filter((x) => x.parent);
    t = { ...t, trials: (t.trials || []).filter((x) => !x.parent) };
    tj = t;
    main.dataset.state = t.state;
    renderHead(t);
    renderSummary(t);
    renderBest(t);
    renderTrials(t);
    renderCharts(t);
    renderEvents(t);
    main.dataset.ready = 'true';
  }

  function notFound(msg: string): void {
    clear(main);
    main.append(h('h1', null, 'Tuning job not found'), h('p', null, msg), h('a', { href: '#/tuning' }, 'All tuning jobs'));
  }

  function schedule(): void {
    clearTimeout(timer);
    if (alive && tj && !TUNING_ENDED.has(tj.state)) timer = window.setTimeout(poll, POLL_MS);
  }

  async function poll(): Promise<void> {
    if (!alive) return;
    try {
      const t = await get<TuningJob>(`/v1/tuning-jobs/${encodeURIComponent(id)}`);
      if (!alive) return;
      update(t);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) { notFound(e.message); return; }
    }
    // a round that saw the end is the last: nothing changes any more
    if (alive && !(tj && TUNING_ENDED.has(tj.state))) timer = window.setTimeout(poll, POLL_MS);
  }

  (async () => {
    try {
      const t = await get<TuningJob>(`/v1/tuning-jobs/${encodeURIComponent(id)}`);
      if (!alive) return;
      document.title = `${t.name || t.id} · kiln`;
      update(t);
      schedule();
    } catch (e) {
      notFound(e instanceof Error ? e.message : String(e));
    }
  })();

  return () => {
    alive = false;
    clearTimeout(timer);
    byTrial?.destroy();
    bySteps?.destroy();
    parallel?.destroy();
    document.title = 'kiln';
  };
}
