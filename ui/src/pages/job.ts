// job.ts - one job: state with its reason, attempt, progress and ETA, what it runs (kiln's model,
// or a script job's entry point, source and channels), resources and workers; live charts (loss,
// learning rate, throughput, MFU, and any other metric on request); live logs; the events
// timeline; hyperparameters and the full spec; artifacts; Stop and "Clone and edit" for those who
// may; for a tuning job's trial, a link back to the search.
import { api, ApiError, canEdit, download, get } from '../api';
import { MetricChart } from '../chart';
import { announce, clear, fmtAge, fmtBytes, fmtDuration, fmtNum, fmtTime, h, shownText, stateBadge, TERMINAL, timelineItem } from '../dom';
import type { Cleanup } from '../main';
import { JobMetrics } from '../metrics';
import { durationS, wallTimeNote } from '../columns';
import type { Artifact, Job, JobEvent, TuningJob } from '../types';
import { clonePanel } from './clone';
import { logPanel } from './logs';

const POLL_MS = 2000;
const CHARTS: { title: string; metrics: string[] }[] = [
  { title: 'Loss', metrics: ['train_loss', 'val_loss'] },
  { title: 'Learning rate', metrics: ['lr'] },
  { title: 'Throughput (tokens/s)', metrics: ['tokens_per_s'] },
  { title: 'MFU', metrics: ['mfu'] },
];

// A waiting job's reason is "what it waits for: the details", and its pending box says the details
// again, line by line: the heading keeps what it waits for (kiln describe does the same).
function headReason(j: Job): string {
  const r = shownText(j.reason || '');
  const colon = r.indexOf(':');
  return j.pending && colon > 0 ? r.slice(0, colon) : r;
}

// While the job waits: its place in its queue, what it lacks, the jobs it waits for (links) and
// when it should start (docs/contracts.md, "pending").
function pendingBox(j: Job): HTMLElement {
  const p = j.pending!;
  const dl = h('dl', { class: 'summary', id: 'pending', 'aria-label': 'Why it waits' });
  const row = (k: string, ...v: (Node | string | null)[]) => dl.append(h('dt', null, k), h('dd', null, ...v));
  row('Position', `${p.position} in queue `, h('a', { href: `#/queues?name=${encodeURIComponent(j.queue || 'default')}` }, j.queue || 'default'));
  row('Missing', h('span', { id: 'pending-missing' }, p.missing));
  const b = p.blocking_jobs || [];
  row('Waits for', ...(b.length ? b.flatMap((id, i) => [i ? ', ' : '', h('a', { href: `#/jobs/${encodeURIComponent(id)}`, class: 'blocking' }, id.slice(0, 8))]) : ['no job: see what is missing']));
  row('Estimated start', p.estimated_start
    ? h('time', { id: 'pending-start', datetime: p.estimated_start }, fmtTime(p.estimated_start))
    : h('span', { class: 'muted', id: 'pending-start' }, 'unknown (what it waits for has no predicted end yet)'));
  return h('section', { class: 'card pending', 'aria-labelledby': 'pending-title' }, h('h2', { id: 'pending-title' }, 'Why it waits'), dl);
}

export function jobPage(main: HTMLElement, _params: URLSearchParams, path: string[]): Cleanup {
  const id = path[1];
  let alive = true;
  let timer = 0;
  let job: Job | null = null;
  let lastEventsKey = '';
  let tuningName: string | null = null; // of the tuning job whose trial this is ('' while read)
  let logs: { el: HTMLElement; destroy: () => void } | null = null;
  const metrics = new JobMetrics(id);
  const charts: MetricChart[] = [];

  const head = h('div', { class: 'job-head' });
  const cloneSlot = h('div');
  const summary = h('dl', { class: 'summary' });
  const chartGrid = h('div', { class: 'charts', id: 'charts' });
  const extraSel = h('select', { id: 'extra-metric' }, h('option', { value: '' }, 'Add a chart…'));
  const chartsCard = h('section', { class: 'card', 'aria-labelledby': 'charts-title' },
    h('div', { class: 'card-head' }, h('h2', { id: 'charts-title' }, 'Metrics'),
      h('label', { for: 'extra-metric', class: 'visually-hidden' }, 'Add a chart of another metric'), extraSel,
      h('span', { class: 'muted small' }, 'Drag across a chart to zoom in; double-click to zoom out.')),
    chartGrid);
  const logsSlot = h('div');
  const events = h('ol', { class: 'timeline', id: 'events' });
  const hp = h('table', { class: 'kv', 'aria-label': 'Hyperparameters' });
  const spec = h('pre', { class: 'spec' });
  const artifacts = h('div', { id: 'artifacts' }, h('p', { class: 'muted' }, 'Loading…'));
  main.append(head, cloneSlot, summary, chartsCard, logsSlot,
    h('section', { class: 'card', 'aria-labelledby': 'events-title' }, h('h2', { id: 'events-title' }, 'Events'), events),
    h('div', { class: 'two' },
      h('section', { class: 'card', 'aria-labelledby': 'hp-title' }, h('h2', { id: 'hp-title' }, 'Hyperparameters'), hp),
      h('section', { class: 'card', 'aria-labelledby': 'art-title' }, h('h2', { id: 'art-title' }, 'Artifacts'), artifacts)),
    h('section', { class: 'card' }, h('details', null, h('summary', null, 'Full spec'), spec)));

  function onZoom(chart: MetricChart, range: [number, number] | null): void {
    if (!range) { chart.resetZoom(); return; }
    metrics.range(chart.metrics, range[0], range[1]).then((s) => {
      if (alive && chart.zoomRange && chart.zoomRange[0] === range[0] && chart.zoomRange[1] === range[1]) chart.setDetail(s);
    }).catch(() => {});
  }

  function addChart(title: string, names: string[]): MetricChart {
    const c = new MetricChart(chartGrid, title, names, onZoom);
    charts.push(c);
    return c;
  }

  function drawCharts(): void {
    const names = metrics.names();
    for (const def of CHARTS) {
      if (!def.metrics.some((m) => metrics.series.has(m))) continue;
      if (!charts.some((c) => c.title === def.title)) addChart(def.title, def.metrics);
    }
    const shown = new Set(charts.flatMap((c) => c.metrics));
    const others = names.filter((n) => !shown.has(n));
    const have = new Set([...extraSel.options].map((o) => o.value));
    for (const n of others) if (!have.has(n)) extraSel.append(h('option', { value: n }, n));
    for (const c of charts) c.setFull(c.metrics.map((m) => metrics.series.get(m)!).filter(Boolean));
    if (!charts.length) {
      if (!chartGrid.querySelector('.empty')) chartGrid.append(h('p', { class: 'muted empty' }, 'No metric points yet.'));
    } else {
      chartGrid.querySelector('.empty')?.remove();
    }
    // when the charts were first drawn, in ms since navigation (tests/ui/bench.mjs reads it)
    if (!chartGrid.dataset.ready) chartGrid.dataset.renderedMs = String(Math.round(performance.now()));
    chartGrid.dataset.ready = 'true';
  }
  extraSel.addEventListener('change', async () => {
    const n = extraSel.value;
    if (!n) return;
    extraSel.querySelector(`option[value="${CSS.escape(n)}"]`)?.remove();
    extraSel.value = '';
    addChart(n, [n]);
    if (!metrics.series.has(n)) await metrics.load(n).catch(() => {});
    if (alive) drawCharts();
  });

  function renderHead(j: Job): void {
    clear(head);
    const actions = h('div', { class: 'actions' });
    // Offered only to those who may: editors and admins of the job's project.
    if (canEdit(j.project || 'default') && !TERMINAL.has(j.state) && j.state !== 'STOPPING') {
      actions.append(h('button', { type: 'button', class: 'danger', id: 'stop', onclick: () => stop(j) }, 'Stop job'));
    }
    // A copy is submitted to the job's project: offered to those who may submit there.
    if (canEdit(j.project || 'default')) {
      actions.append(' ', h('button', { type: 'button', class: 'secondary', id: 'clone-open', 'aria-expanded': cloneSlot.hasChildNodes() ? 'true' : 'false',
                                        'aria-controls': 'clone', onclick: () => openClone(j) }, 'Clone and edit'));
    }
    head.append(
      h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, 'Jobs'), ' / ', h('code', null, j.id)),
      h('div', { class: 'title-row' }, h('h1', null, j.name || j.id), stateBadge(j.state), actions),
      h('p', { class: 'reason', id: 'reason' }, headReason(j)));
    const tuning = j.tags?.tuning_job;
    if (tuning) {
      head.append(h('p', { id: 'trial-of' }, `Trial ${j.tags?.tuning_trial ?? '?'} of tuning job `,
        h('a', { href: `#/tuning/${encodeURIComponent(tuning)}` }, tuningName || tuning.slice(0, 8))));
      if (tuningName === null) {
        tuningName = '';
        get<TuningJob>(`/v1/tuning-jobs/${encodeURIComponent(tuning)}`)
          .then((t) => { tuningName = t.name; if (alive && job) renderHead(job); }).catch(() => {});
      }
    }
    if (j.pending) head.append(pendingBox(j));
  }

  function openClone(j: Job): void {
    clear(cloneSlot);
    const panel = clonePanel(j, () => { clear(cloneSlot); renderHead(j); });
    cloneSlot.append(panel.el);
    renderHead(j);
    panel.focus();
  }

  function renderSummary(j: Job): void {
    clear(summary);
    const p = j.progress || {};
    const r = j.spec?.resources || {};
    const row = (k: string, ...v: (Node | string | null)[]) => summary.append(h('dt', null, k), h('dd', null, ...v));
    if (p.total_steps) {
      row('Progress', h('progress', { max: p.total_steps, value: p.step || 0, 'aria-label': `step ${p.step || 0} of ${p.total_steps}` }),
        ` step ${p.step || 0} of ${p.total_steps} (${Math.floor((100 * (p.step || 0)) / p.total_steps)}%)`);
    }
    if (!TERMINAL.has(j.state) && p.eta_s) row('ETA', fmtDuration(p.eta_s));
    // what the job runs: kiln's model, or a script job's code (docs/contracts.md)
    const sp = j.spec || {};
    if (sp.entry_point) {
      row('Entry point', h('code', { id: 'entry-point' }, String(sp.entry_point)),
        sp.python ? h('span', { class: 'muted' }, ` with ${sp.python}`) : null);
      const src = String(sp.source || '');
      const digest = /^code:sha256:([0-9a-f]{64})$/.exec(src);
      row('Source', digest ? h('code', { id: 'source', title: src }, `code:sha256:${digest[1].slice(0, 12)}…`) : h('code', { id: 'source' }, src),
        digest ? h('span', { class: 'muted' }, ' (uploaded code)') : h('span', { class: 'muted' }, ' (a directory in the data roots)'));
      const chans = Object.entries((sp.data?.channels || {}) as Record<string, string>);
      if (chans.length) row('Channels', ...chans.flatMap(([k, v], i) => [i ? ', ' : '', `${k} `, h('code', null, v)]));
      const td = sp.distribution?.torch_distributed;
      if (td?.enabled) row('Distribution', `torchrun, ${td.nproc_per_node ?? 1} process${td.nproc_per_node === 1 ? '' : 'es'} per node`);
      const env = Object.keys(sp.environment || {});
      if (env.length) row('Environment', env.sort().join(', '));
    } else if (sp.model) {
      const m = sp.model;
      const shape = ['n_layer', 'n_head', 'n_embd', 'seq_len'].filter((k) => m[k] !== undefined).map((k) => `${k} ${m[k]}`).join(', ');
      row('Model', h('code', { id: 'model' }, String(m.type || '')), shape ? h('span', { class: 'muted' }, ` (${shape})`) : null);
    }
    row('Attempt', String(j.attempt ?? ''));
    row('Project', j.project || '');
    if (j.submitted_by) row('Submitted by', j.submitted_by);
    row('Created', fmtTime(j.created_at), h('span', { class: 'muted' }, ` (${fmtAge(j.created_at)})`));
    if (j.started_at) row('Started', fmtTime(j.started_at));
    if (j.ended_at) row('Ended', fmtTime(j.ended_at));
    const d = durationS(j);
    if (d !== undefined) row('Wall time', fmtDuration(d), h('span', { class: 'muted' }, wallTimeNote(j)));
    row('Resources', `${r.nodes ?? '?'} node${r.nodes === 1 ? '' : 's'} × ${r.slots_per_node ?? '?'} ${r.slot_type || ''} slot${r.slots_per_node === 1 ? '' : 's'}`,
      j.world_size ? ` (${j.world_size} ranks)` : '');
    const ws = j.workers || [];
    row('Workers', ...(ws.length ? ws.flatMap((w, i) => [i ? ', ' : '', h('a', { href: `#/workers?id=${encodeURIComponent(w)}` }, w)]) : ['none now']));
    if (j.tags && Object.keys(j.tags).length) row('Tags', Object.entries(j.tags).map(([k, v]) => `${k}=${v}`).join(', '));
    const latest = Object.entries(j.metrics || {}).filter(([, v]) => typeof v === 'number');
    if (latest.length) row('Latest', latest.map(([k, v]) => `${k} ${fmtNum(v)}`).join(' · '));
  }

  function renderSpec(j: Job): void {
    clear(hp);
    const hps = j.spec?.hyperparameters || {};
    hp.append(h('tbody', null, ...Object.keys(hps).sort().map((k) => h('tr', null, h('th', { scope: 'row' }, k), h('td', null, fmtNum(hps[k]))))));
    spec.textContent = JSON.stringify(j.spec ?? {}, null, 2);
  }

  async function loadEvents(): Promise<void> {
    const r = await get<{ events: JobEvent[] }>(`/v1/jobs/${encodeURIComponent(id)}/events`);
    clear(events);
    for (const e of r.events) events.append(timelineItem(e));
  }

  async function loadArtifacts(): Promise<void> {
    try {
      const list = (await get<{ artifacts: Artifact[] }>(`/v1/jobs/${encodeURIComponent(id)}/artifacts`)).artifacts;
      clear(artifacts);
      if (!list.length) { artifacts.append(h('p', { class: 'muted' }, 'No artifacts (yet): the output of rank 0 is kept when the job ends.')); return; }
      const tb = h('tbody');
      for (const a of list) {
        const btn = h('button', { type: 'button', class: 'link', 'data-artifact': a.name, onclick: async () => {
          btn.disabled = true;
          try { await download(`/v1/jobs/${encodeURIComponent(id)}/artifacts/${encodeURIComponent(a.name)}`, a.name.split('/').pop() || a.name); }
          catch (e) { announce(`Download failed: ${e instanceof Error ? e.message : String(e)}`); }
          finally { btn.disabled = false; }
        } }, `Download ${a.name}`);
        tb.append(h('tr', null, h('td', null, btn), h('td', null, fmtBytes(a.size)),
          h('td', null, h('code', { class: 'small', title: a.sha256 }, a.sha256.slice(0, 16))),
          h('td', null, String(a.attempt)), h('td', null, fmtAge(a.created_at))));
      }
      artifacts.append(h('table', { class: 'kv' },
        h('thead', null, h('tr', null, ...['Name', 'Size', 'SHA-256', 'Attempt', 'Created'].map((t) => h('th', { scope: 'col' }, t)))), tb),
        h('p', { class: 'muted small' }, 'Downloads are checked by kilnd against each file\'s SHA-256 (its ETag).'));
    } catch (e) {
      clear(artifacts);
      artifacts.append(h('p', { class: 'muted' }, `Artifacts unavailable: ${e instanceof Error ? e.message : String(e)}`));
    }
  }

  async function stop(j: Job): Promise<void> {
    if (!confirm(`Stop job ${j.name || j.id}? Its ranks get SIGTERM, checkpoint and exit.`)) return;
    try {
      job = await api<Job>('POST', `/v1/jobs/${encodeURIComponent(j.id)}:stop`, { reason: 'stopped from the web UI' });
      announce(`Job is ${job.state}`);
      update(job);
    } catch (e) {
      alert(e instanceof ApiError ? `${e.message}${e.body.hint ? `\n${e.body.hint}` : ''}` : String(e));
    }
  }

  function update(j: Job): void {
    const prev = job;
    job = j;
    main.dataset.state = j.state;
    renderHead(j);
    renderSummary(j);
    if (!prev) renderSpec(j);
    const key = `${j.state}/${j.attempt}`;
    if (key !== lastEventsKey) {
      lastEventsKey = key;
      loadEvents().catch(() => {});
      if (!prev || TERMINAL.has(j.state)) loadArtifacts();
    }
    if (!logs && chartGrid.dataset.ready) startLogs(j);
  }

  // The log panel starts once the charts are drawn: a running job's log stream begins with its
  // whole history (tens of thousands of lines), which would otherwise hold up the first chart.
  function startLogs(j: Job): void {
    logs = logPanel(id, j.world_size || (j.spec?.resources?.nodes || 1) * (j.spec?.resources?.slots_per_node || 1));
    logsSlot.append(logs.el);
  }

  async function poll(): Promise<void> {
    if (!alive) return;
    try {
      const j = await get<Job>(`/v1/jobs/${encodeURIComponent(id)}`);
      if (!alive) return;
      update(j);
      if (await metrics.extend()) drawCharts();
      if (TERMINAL.has(j.state)) return; // this round saw the end: nothing changes any more
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        clear(main);
        main.append(h('h1', null, 'Job not found'), h('p', null, e.message), h('a', { href: '#/jobs' }, 'All jobs'));
        return;
      }
    }
    if (alive) timer = window.setTimeout(poll, POLL_MS);
  }

  (async () => {
    try {
      // The charted metrics' histories are asked for at once, beside the job itself.
      const histories = metrics.loadAll(CHARTS.flatMap((c) => c.metrics));
      histories.catch(() => {});
      const j = await get<Job>(`/v1/jobs/${encodeURIComponent(id)}`);
      if (!alive) return;
      update(j);
      document.title = `${j.name || j.id} · kiln`;
      await histories;
      if (!alive) return;
      chartGrid.dataset.dataMs = String(Math.round(performance.now())); // the histories are here
      // metrics without a chart of their own can get one on request
      const charted = new Set(CHARTS.flatMap((c) => c.metrics));
      for (const n of Object.keys(j.metrics || {}).sort()) if (!charted.has(n)) extraSel.append(h('option', { value: n }, n));
      drawCharts();
      if (!logs) startLogs(j);
      if (!TERMINAL.has(j.state)) timer = window.setTimeout(poll, POLL_MS);
    } catch (e) {
      clear(main);
      main.append(h('h1', null, 'Job not found'), h('p', null, e instanceof Error ? e.message : String(e)), h('a', { href: '#/jobs' }, 'All jobs'));
    }
  })();

  return () => {
    alive = false;
    clearTimeout(timer);
    logs?.destroy();
    for (const c of charts) c.destroy();
    document.title = 'kiln';
  };
}
