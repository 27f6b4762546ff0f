// chart.ts - a uPlot line chart of metric series by step: several series on one x axis (steps
// merged, gaps spanned), a legend, cursors synchronised across the page's charts, drag to zoom
// (the page fetches the zoomed range in detail), double-click to zoom out. Series differ by
// colour and by dash pattern, so colour is not the only signal.
import uPlot from 'uplot';
import { fmtNum, h } from './dom';

const COLORS = ['#1f6feb', '#d9480f', '#2f9e44', '#ae3ec9', '#e67700', '#0c8599', '#c2255c', '#5c940d'];
const DASHES: (number[] | undefined)[] = [undefined, [6, 4], [2, 3], [10, 3, 2, 3]];

export interface SeriesData { name: string; steps: number[]; values: (number | null)[] }

// Merges series with their own steps onto one sorted x axis (null where a series has no point).
export function alignSeries(series: SeriesData[]): uPlot.AlignedData {
  const xs = new Set<number>();
  for (const s of series) for (const x of s.steps) xs.add(x);
  const x = Float64Array.from(xs).sort();
  const index = new Map<number, number>();
  x.forEach((v, i) => index.set(v, i));
  const ys = series.map((s) => {
    const y: (number | null)[] = new Array(x.length).fill(null);
    s.steps.forEach((st, i) => { y[index.get(st)!] = s.values[i]; });
    return y;
  });
  return [Array.from(x), ...ys] as uPlot.AlignedData;
}

// The page's colours for axes and grid lines (style.css's variables: light or dark, as the
// browser prefers).
function themed(): { fg: string; grid: string } {
  const css = getComputedStyle(document.documentElement);
  return { fg: css.getPropertyValue('--fg').trim() || '#1b1f24', grid: css.getPropertyValue('--grid').trim() || '#eaeef2' };
}

function axes(xLabel: string, yLabel?: string): uPlot.Axis[] {
  const t = themed();
  const common = { stroke: t.fg, grid: { stroke: t.grid, width: 1 }, ticks: { stroke: t.grid, width: 1 } };
  return [
    { ...common, label: xLabel, values: (_u, ticks) => ticks.map((v) => fmtNum(v)) },
    { ...common, label: yLabel, values: (_u, ticks) => ticks.map((v) => fmtNum(v)), size: 64 },
  ];
}

export class MetricChart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  private names: string[];
  private zoomTimer = 0;
  private full: SeriesData[] = [];
  private zoomed: [number, number] | null = null;
  private ro: ResizeObserver;

  constructor(parent: HTMLElement, readonly title: string, names: string[],
              private onZoom: (chart: MetricChart, range: [number, number] | null) => void,
              private syncKey = 'kiln') {
    this.names = names;
    this.el = h('figure', { class: 'chart', 'data-metrics': names.join(','), 'data-points': '0' },
      h('figcaption', null, title));
    parent.append(this.el);
    this.ro = new ResizeObserver(() => this.resize());
    this.ro.observe(this.el);
  }

  get metrics(): string[] { return this.names; }
  get zoomRange(): [number, number] | null { return this.zoomed; }

  private width(): number { return Math.max(240, this.el.clientWidth - 4); }

  private build(data: uPlot.AlignedData): void {
    const opts: uPlot.Options = {
      width: this.width(),
      height: 220,
      scales: { x: { time: false } },
      axes: axes('step'),
      series: [
        { label: 'step', value: (_u, v) => (v === null || v === undefined ? '' : fmtNum(v)) },
        ...this.names.map((n, i) => ({
          label: n, stroke: COLORS[i % COLORS.length], width: 1.5, dash: DASHES[i % DASHES.length],
          // points drawn only where they are sparse (uPlot's rule): a metric logged once is a dot
          spanGaps: true,
          value: (_u: uPlot, v: number | null) => (v === null || v === undefined ? '—' : fmtNum(v)),
        })),
      ],
      cursor: { sync: { key: this.syncKey, setSeries: true }, drag: { x: true, y: false, setScale: true } },
      legend: { live: true },
      hooks: { setSelect: [(u) => this.selected(u)] },
    };
    this.plot = new uPlot(opts, data, this.el);
    this.plot.over.addEventListener('dblclick', () => this.resetZoom());
    this.plot.over.setAttribute('aria-label', `${this.title} chart: drag across to zoom in, double-click to zoom out`);
  }

  private resize(): void {
    if (this.plot) this.plot.setSize({ width: this.width(), height: 220 });
  }

  // The full (downsampled) history; shown unless the chart is zoomed.
  setFull(series: SeriesData[]): void {
    this.full = series;
    if (!this.zoomed) this.show(series, true);
  }

  // Detail of the zoomed range, keeping the zoom.
  setDetail(series: SeriesData[]): void {
    if (this.zoomed) this.show(series, false);
  }

  private show(series: SeriesData[], resetScales: boolean): void {
    const data = alignSeries(this.names.map((n) => series.find((s) => s.name === n) || { name: n, steps: [], values: [] }));
    let points = 0;
    for (let i = 1; i < data.length; i++) for (const v of data[i] as (number | null)[]) if (v !== null) points++;
    this.el.dataset.points = String(points);
    const xs = data[0] as number[];
    this.el.dataset.lastStep = String(xs.length ? xs[xs.length - 1] : 0);
    if (!this.plot) this.build(data);
    else this.plot.setData(data, resetScales);
    if (!resetScales && this.zoomed && this.plot) this.plot.setScale('x', { min: this.zoomed[0], max: this.zoomed[1] });
    this.el.dataset.ready = 'true';
  }

  // A drag across the chart: uPlot zooms the x scale to it; the page fetches the range in detail.
  private selected(u: uPlot): void {
    if (u.select.width <= 0) return;
    const lo = u.posToVal(u.select.left, 'x');
    const hi = u.posToVal(u.select.left + u.select.width, 'x');
    if (!isFinite(lo) || !isFinite(hi) || hi <= lo) return;
    const range: [number, number] = [Math.floor(lo), Math.ceil(hi)];
    this.zoomed = range;
    this.el.dataset.zoomed = `${range[0]}-${range[1]}`;
    clearTimeout(this.zoomTimer);
    this.zoomTimer = window.setTimeout(() => this.onZoom(this, range), 50);
  }

  resetZoom(): void {
    this.zoomed = null;
    this.el.dataset.zoomed = '';
    this.show(this.full, true);
  }

  destroy(): void {
    clearTimeout(this.zoomTimer);
    this.ro.disconnect();
    this.plot?.destroy();
    this.el.remove();
  }
}

export interface ScatterPoint { label: string; x: number; y: number }

// One point per job: a hyperparameter (x) against a metric (y). Each job is its own series, so the
// legend names it in the colour and shape the compare page's line charts give it.
export class ScatterChart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  private ro: ResizeObserver;

  constructor(parent: HTMLElement, title: string, private xLabel: string, private yLabel: string, points: ScatterPoint[]) {
    this.el = h('figure', { class: 'chart scatter', 'data-points': String(points.length) }, h('figcaption', null, title));
    parent.append(this.el);
    const xs = [...new Set(points.map((p) => p.x))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const ys = points.map((p) => {
      const y: (number | null)[] = new Array(xs.length).fill(null);
      y[at.get(p.x)!] = p.y;
      return y;
    });
    const opts: uPlot.Options = {
      width: Math.max(240, this.el.clientWidth - 4),
      height: 240,
      scales: { x: { time: false } },
      axes: axes(this.xLabel, this.yLabel),
      series: [
        { label: this.xLabel, value: (_u, v) => (v === null || v === undefined ? '' : fmtNum(v)) },
        ...points.map((p, i) => ({
          label: p.label, stroke: COLORS[i % COLORS.length], fill: COLORS[i % COLORS.length],
          paths: () => null, points: { show: true, size: 9 + 2 * (i % DASHES.length), width: 2 },
          value: (_u: uPlot, v: number | null) => (v === null || v === undefined ? '—' : fmtNum(v)),
        })),
      ],
      legend: { live: true },
    };
    this.plot = new uPlot(opts, [xs, ...ys] as uPlot.AlignedData, this.el);
    this.plot.over.setAttribute('aria-label', `${title}: one point per job`);
    this.ro = new ResizeObserver(() => this.plot?.setSize({ width: Math.max(240, this.el.clientWidth - 4), height: 240 }));
    this.ro.observe(this.el);
    this.el.dataset.ready = 'true';
  }

  destroy(): void {
    this.ro.disconnect();
    this.plot?.destroy();
    this.el.remove();
  }
}
