// compare.ts - jobs side by side (#/compare?ids=A,B&metric=val_loss): one metric's curves
// overlaid, and the hyperparameters, model and resources in a table whose differing rows are
// marked (a "≠" and a highlight, not colour alone), with each job's latest metric values.
import { ApiError, get } from '../api';
import { MetricChart, type SeriesData } from '../chart';
import { clear, fmtNum, h, stateBadge } from '../dom';
import { setParams, type Cleanup } from '../main';
import { MAX_POINTS, metricsUrl, toSeries } from '../metrics';
import type { Job, MetricSeries } from '../types';

function flatten(prefix: string, o: unknown, out: Map<string, unknown>): void {
  if (o && typeof o === 'object' && !Array.isArray(o)) {
    for (const [k, v] of Object.entries(o as Record<string, unknown>)) flatten(prefix ? `${prefix}.${k}` : k, v, out);
  } else if (prefix) {
    out.set(prefix, o);
  }
}

export function comparePage(main: HTMLElement, params: URLSearchParams): Cleanup {
  const ids = (params.get('ids') || '').split(',').map((s) => s.trim()).filter(Boolean);
  let metric = params.get('metric') || '';
  let alive = true;
  let chart: MetricChart | null = null;
  let jobs: Job[] = [];
  const cache = new Map<string, SeriesData>();

  const sel = h('select', { id: 'compare-metric' });
  const chartBox = h('div', { class: 'charts one', id: 'compare-chart' });
  const onlyDiff = h('input', { id: 'only-diff', type: 'checkbox' });
  const table = h('table', { class: 'compare', id: 'compare-table', 'aria-label': 'Jobs compared' });
  main.append(h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, 'Jobs'), ' / compare'),
    h('h1', null, `Compare ${ids.length} jobs`),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('label', { for: 'compare-metric' }, 'Metric '), sel), chartBox),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'Settings'),
      h('label', { class: 'check' }, onlyDiff, ' Only rows that differ')), h('div', { class: 'table-wrap' }, table)));

  if (ids.length < 1) {
    main.append(h('p', null, 'Select jobs on the jobs page, then Compare.'));
    return () => {};
  }

  async function series(job: Job, name: string): Promise<SeriesData> {
    const key = `${job.id}/${name}`;
    let s = cache.get(key);
    if (!s) {
      const r = await get<{ metrics: MetricSeries[] }>(metricsUrl(job.id, { name, max_points: MAX_POINTS }));
      const m = r.metrics.find((x) => x.name === name);
      s = m ? toSeries(m) : { name, steps: [], values: [] };
      cache.set(key, s);
    }
    return s;
  }

  async function drawChart(): Promise<void> {
    if (!metric) return;
    const all = await Promise.all(jobs.map((j) => series(j, metric)));
    if (!alive) return;
    const labels = jobs.map((j, i) => `${j.name || j.id.slice(0, 8)} (${j.id.slice(0, 8)})${jobs.filter((x) => x.name === j.name).length > 1 ? ` #${i + 1}` : ''}`);
    if (chart) chart.destroy();
    chart = new MetricChart(chartBox, metric, labels, (c, range) => {
      if (!range) { c.resetZoom(); return; }
      Promise.all(jobs.map((j) => get<{ metrics: MetricSeries[] }>(metricsUrl(j.id, { name: metric, max_points: MAX_POINTS, start_step: Math.max(1, range[0]), end_step: Math.max(1, range[1]) }))))
        .then((rs) => c.setDetail(rs.map((r, i) => ({ ...toSeries(r.metrics[0] || { name: metric, points: [] }), name: labels[i] }))))
        .catch(() => {});
    }, 'compare');
    chart.setFull(all.map((s, i) => ({ ...s, name: labels[i] })));
  }

  function drawTable(): void {
    clear(table);
    const rows = new Map<string, unknown[]>();
    const add = (key: string, i: number, v: unknown) => {
      if (!rows.has(key)) rows.set(key, new Array(jobs.length).fill(undefined));
      rows.get(key)![i] = v;
    };
    jobs.forEach((j, i) => {
      const flat = new Map<string, unknown>();
      flatten('hp', j.spec?.hyperparameters, flat);
      flatten('model', j.spec?.model, flat);
      flatten('resources', j.spec?.resources, flat);
      flatten('distribution', j.spec?.distribution, flat);
      flatten('tags', j.tags, flat);
      for (const [k, v] of flat) add(k, i, v);
      for (const [k, v] of Object.entries(j.metrics || {})) add(`metrics.${k}.last`, i, v);
      for (const [k, s] of Object.entries(j.summaries || {})) {
        add(`metrics.${k}.min`, i, s.min);
        add(`metrics.${k}.max`, i, s.max);
        add(`metrics.${k}.last`, i, s.last);
      }
      add('attempt', i, j.attempt);
    });
    const head = h('tr', null, h('th', { scope: 'col' }, 'Field'),
      ...jobs.map((j) => h('th', { scope: 'col' }, h('a', { href: `#/jobs/${j.id}` }, j.name || j.id.slice(0, 8)), h('br'), stateBadge(j.state))));
    const body = h('tbody');
    const keys = [...rows.keys()].sort((a, b) => {
      const rank = (k: string) => (k.startsWith('hp.') ? 0 : k.startsWith('metrics.') ? 1 : 2);
      return rank(a) - rank(b) || a.localeCompare(b);
    });
    let ndiff = 0;
    for (const k of keys) {
      const vals = rows.get(k)!;
      const texts = vals.map((v) => fmtNum(v));
      const differs = !k.startsWith('metrics.') && new Set(texts).size > 1;
      if (differs) ndiff++;
      if (onlyDiff.checked && !differs) continue;
      body.append(h('tr', { class: differs ? 'diff' : null, 'data-field': k },
        h('th', { scope: 'row' }, differs ? h('span', { class: 'diff-mark', title: 'differs' }, '≠ ') : null, k,
          differs ? h('span', { class: 'visually-hidden' }, ' (differs)') : null),
        ...texts.map((t) => h('td', null, t === '' ? '—' : t))));
    }
    table.append(h('thead', null, head), body);
    table.dataset.differing = String(ndiff);
  }

  onlyDiff.addEventListener('change', drawTable);
  sel.addEventListener('change', () => {
    metric = sel.value;
    const p = new URLSearchParams(params);
    p.set('metric', metric);
    setParams(p);
    drawChart();
  });

  (async () => {
    try {
      jobs = await Promise.all(ids.map((id) => get<Job>(`/v1/jobs/${encodeURIComponent(id)}`)));
    } catch (e) {
      main.append(h('p', { class: 'error', role: 'alert' }, e instanceof ApiError ? e.message : String(e)));
      return;
    }
    if (!alive) return;
    const names = [...new Set(jobs.flatMap((j) => Object.keys(j.metrics || {})))].sort();
    if (!metric) metric = names.includes('val_loss') ? 'val_loss' : names.includes('train_loss') ? 'train_loss' : names[0] || '';
    if (metric && !names.includes(metric)) names.unshift(metric);
    for (const n of names) sel.append(h('option', { value: n, selected: n === metric }, n));
    sel.value = metric;
    drawTable();
    await drawChart();
    main.dataset.ready = 'true';
  })();

  return () => { alive = false; chart?.destroy(); };
}
