// compare.ts - jobs side by side (#/compare?ids=A,B&metrics=val_loss,lr&x=hp.lr&y=val_loss):
// a chart for each chosen metric with every job's curve, a scatter of one hyperparameter against
// a metric's last value (one point per job), and the hyperparameters, model and resources in a
// table that shows only the rows that differ unless asked for all (rows=all); differing rows are
// marked (a "≠" and a highlight, not colour alone), with each job's latest metric values.
import { ApiError, get } from '../api';
import { MetricChart, ScatterChart, type SeriesData } from '../chart';
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

const list = (v: string | null) => (v || '').split(',').map((s) => s.trim()).filter(Boolean);

export function comparePage(main: HTMLElement, params: URLSearchParams): Cleanup {
  const ids = list(params.get('ids'));
  // metrics=a,b (metric=a: links from before several metrics could be chosen)
  let chosen = list(params.get('metrics') || params.get('metric'));
  let alive = true;
  const charts = new Map<string, MetricChart>();
  let scatter: ScatterChart | null = null;
  let jobs: Job[] = [];
  let labels: string[] = [];
  const cache = new Map<string, SeriesData>();

  const pick = h('fieldset', { class: 'metric-pick', id: 'compare-metrics' }, h('legend', null, 'Metrics'));
  const chartBox = h('div', { class: 'charts', id: 'compare-charts' });
  const xSel = h('select', { id: 'scatter-x' });
  const ySel = h('select', { id: 'scatter-y' });
  const scatterBox = h('div', { class: 'charts one', id: 'compare-scatter' });
  const onlyDiff = h('input', { id: 'only-diff', type: 'checkbox', checked: params.get('rows') !== 'all' });
  const table = h('table', { class: 'compare', id: 'compare-table', 'aria-label': 'Jobs compared' });
  main.append(h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, 'Jobs'), ' / compare'),
    h('h1', null, `Compare ${ids.length} jobs`),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, pick), chartBox),
    h('section', { class: 'card', 'aria-labelledby': 'scatter-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'scatter-title' }, 'Hyperparameter against metric'),
        h('div', { class: 'scatter-pick' }, h('label', { for: 'scatter-x' }, 'x'), xSel, h('label', { for: 'scatter-y' }, 'y (last value)'), ySel)),
      scatterBox),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'Settings'),
      h('label', { class: 'check' }, onlyDiff, ' Only rows that differ')), h('div', { class: 'table-wrap' }, table)));

  if (ids.length < 1) {
    main.append(h('p', null, 'Select jobs on the jobs page, then Compare.'));
    return () => {};
  }

  function saveParams(): void {
    const p = new URLSearchParams(params);
    p.delete('metric');
    p.set('metrics', chosen.join(','));
    if (onlyDiff.checked) p.delete('rows'); else p.set('rows', 'all');
    if (xSel.value) p.set('x', xSel.value); else p.delete('x');
    if (ySel.value) p.set('y', ySel.value); else p.delete('y');
    setParams(p);
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

  // One chart a chosen metric, in the order chosen; charts of metrics no longer chosen go.
  async function drawCharts(): Promise<void> {
    for (const [m, c] of charts) if (!chosen.includes(m)) { c.destroy(); charts.delete(m); }
    await Promise.all(chosen.map(async (metric) => {
      if (charts.has(metric)) return;
      const all = await Promise.all(jobs.map((j) => series(j, metric)));
      if (!alive || !chosen.includes(metric) || charts.has(metric)) return;
      const chart = new MetricChart(chartBox, metric, labels, (c, range) => {
        if (!range) { c.resetZoom(); return; }
        Promise.all(jobs.map((j) => get<{ metrics: MetricSeries[] }>(metricsUrl(j.id, { name: metric, max_points: MAX_POINTS, start_step: Math.max(1, range[0]), end_step: Math.max(1, range[1]) }))))
          .then((rs) => c.setDetail(rs.map((r, i) => ({ ...toSeries(r.metrics[0] || { name: metric, points: [] }), name: labels[i] }))))
          .catch(() => {});
      }, 'compare');
      chart.setFull(all.map((s, i) => ({ ...s, name: labels[i] })));
      charts.set(metric, chart);
    }));
    // keep the charts in the order the metrics were chosen
    for (const m of chosen) { const c = charts.get(m); if (c) chartBox.append(c.el); }
  }

  // The settings of every job, flattened: field -> one value a job (undefined where it has none).
  function settings(): Map<string, unknown[]> {
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
    return rows;
  }

  function drawScatter(): void {
    scatter?.destroy();
    scatter = null;
    clear(scatterBox);
    const x = xSel.value;
    const y = ySel.value;
    if (!x || !y) {
      scatterBox.append(h('p', { class: 'muted empty' }, 'No numeric hyperparameter differs between these jobs.'));
      return;
    }
    const xs = settings().get(x) || [];
    const points = jobs.flatMap((j, i) => {
      const xv = xs[i];
      const yv = j.metrics?.[y];
      return typeof xv === 'number' && typeof yv === 'number' ? [{ label: labels[i], x: xv, y: yv }] : [];
    });
    scatter = new ScatterChart(scatterBox, `${y} against ${x}`, x, y, points);
  }

  function drawTable(): void {
    clear(table);
    const rows = settings();
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
      const isMetric = k.startsWith('metrics.');
      const differs = !isMetric && new Set(texts).size > 1;
      if (differs) ndiff++;
      // "only rows that differ" keeps the metrics: they are what the settings are compared by
      if (onlyDiff.checked && !differs && !isMetric) continue;
      body.append(h('tr', { class: differs ? 'diff' : null, 'data-field': k },
        h('th', { scope: 'row' }, differs ? h('span', { class: 'diff-mark', title: 'differs' }, '≠ ') : null, k,
          differs ? h('span', { class: 'visually-hidden' }, ' (differs)') : null),
        ...texts.map((t) => h('td', null, t === '' ? '—' : t))));
    }
    table.append(h('thead', null, head), body);
    table.dataset.differing = String(ndiff);
  }

  onlyDiff.addEventListener('change', () => { saveParams(); drawTable(); });
  xSel.addEventListener('change', () => { saveParams(); drawScatter(); });
  ySel.addEventListener('change', () => { saveParams(); drawScatter(); });

  (async () => {
    try {
      jobs = await Promise.all(ids.map((id) => get<Job>(`/v1/jobs/${encodeURIComponent(id)}`)));
    } catch (e) {
      main.append(h('p', { class: 'error', role: 'alert' }, e instanceof ApiError ? e.message : String(e)));
      return;
    }
    if (!alive) return;
    labels = jobs.map((j, i) => `${j.name || j.id.slice(0, 8)} (${j.id.slice(0, 8)})${jobs.filter((x) => x.name === j.name).length > 1 ? ` #${i + 1}` : ''}`);
    const names = [...new Set(jobs.flatMap((j) => Object.keys(j.metrics || {})))].sort();
    if (!chosen.length) chosen = ['train_loss', 'val_loss'].filter((n) => names.includes(n));
    if (!chosen.length && names.length) chosen = [names[0]];
    for (const n of [...chosen.filter((m) => !names.includes(m)), ...names]) {
      const box = h('input', { type: 'checkbox', value: n, id: `metric-${n}`, checked: chosen.includes(n) });
      box.addEventListener('change', () => {
        chosen = box.checked ? [...chosen, n] : chosen.filter((m) => m !== n);
        saveParams();
        drawCharts();
      });
      pick.append(h('label', { class: 'check', for: `metric-${n}` }, box, ` ${n}`));
    }
    // the scatter's axes: hyperparameters that are numbers in every job and differ, against a metric
    const rows = settings();
    const numeric = [...rows.entries()].filter(([k, v]) => k.startsWith('hp.') && v.every((x) => typeof x === 'number') &&
      new Set(v).size > 1).map(([k]) => k).sort();
    for (const k of numeric) xSel.append(h('option', { value: k }, k));
    for (const n of names) ySel.append(h('option', { value: n }, n));
    const wantX = params.get('x') || '';
    const wantY = params.get('y') || '';
    xSel.value = numeric.includes(wantX) ? wantX : numeric[0] || '';
    ySel.value = names.includes(wantY) ? wantY : chosen.find((m) => names.includes(m)) || names[0] || '';
    drawTable();
    drawScatter();
    await drawCharts();
    if (!alive) return;
    main.dataset.ready = 'true';
  })();

  return () => {
    alive = false;
    for (const c of charts.values()) c.destroy();
    scatter?.destroy();
  };
}
