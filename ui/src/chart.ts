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
      axes: [
        { label: 'step', values: (_u, ticks) => ticks.map((t) => fmtNum(t)) },
        { values: (_u, ticks) => ticks.map((t) => fmtNum(t)), size: 64 },
      ],
      series: [
        { label: 'step', value: (_u, v) => (v === null || v === undefined ? '' : fmtNum(v)) },
        ...this.names.map((n, i) => ({
          label: n, stroke: COLORS[i % COLORS.length], width: 1.5, dash: DASHES[i % DASHES.length],
          spanGaps: true, points: { show: false },
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
