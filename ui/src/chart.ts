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

export interface ObjectivePoint { x: number; y: number }

// The best of ys so far, point by point (the lowest when minimizing, the highest when maximizing).
export function bestSoFar(ys: (number | null)[], maximize: boolean): (number | null)[] {
  let best: number | null = null;
  return ys.map((y) => {
    if (y !== null && (best === null || (maximize ? y > best : y < best))) best = y;
    return best;
  });
}

// A search's objective against x (trial number, steps consumed): one dot a trial, and the best so
// far as a stepped line. x need not be unique: dots at one x keep the best of them.
export class ObjectiveChart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  private ro: ResizeObserver;

  constructor(parent: HTMLElement, readonly title: string, private xLabel: string, private yLabel: string,
              private maximize: boolean, id: string, private integerX = false) {
    this.el = h('figure', { class: 'chart objective', id, 'data-points': '0' }, h('figcaption', null, title));
    parent.append(this.el);
    this.ro = new ResizeObserver(() => this.plot?.setSize({ width: Math.max(240, this.el.clientWidth - 4), height: 220 }));
    this.ro.observe(this.el);
  }

  setPoints(points: ObjectivePoint[]): void {
    const at = new Map<number, number>();
    for (const p of points) {
      const cur = at.get(p.x);
      if (cur === undefined || (this.maximize ? p.y > cur : p.y < cur)) at.set(p.x, p.y);
    }
    const xs = [...at.keys()].sort((a, b) => a - b);
    const ys = xs.map((x) => at.get(x)!);
    const data = [xs, ys, bestSoFar(ys, this.maximize)] as uPlot.AlignedData;
    this.el.dataset.points = String(xs.length);
    if (!this.plot) {
      const fmt = (_u: uPlot, v: number | null) => (v === null || v === undefined ? '—' : fmtNum(v));
      const ax = axes(this.xLabel, this.yLabel);
      this.plot = new uPlot({
        width: Math.max(240, this.el.clientWidth - 4),
        height: 220,
        // room above and below the dots, so the worst and best are not cut at the edge
        scales: { x: { time: false }, y: { range: (_u, lo, hi) => uPlot.rangeNum(lo, hi, 0.1, true) } },
        axes: this.integerX ? [{ ...ax[0], incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, ax[1]] : ax,
        series: [
          { label: this.xLabel, value: fmt },
          { label: this.yLabel, stroke: COLORS[0], fill: COLORS[0], paths: () => null, points: { show: true, size: 7, fill: COLORS[0] }, value: fmt },
          { label: `best so far (${this.maximize ? 'highest' : 'lowest'})`, stroke: COLORS[1], width: 2, dash: DASHES[1],
            paths: uPlot.paths.stepped!({ align: 1 }), points: { show: false }, value: fmt },
        ],
        legend: { live: true },
      }, data, this.el);
      this.plot.over.setAttribute('aria-label', `${this.title}: one dot a trial, the line the best so far`);
    } else {
      this.plot.setData(data);
    }
    this.el.dataset.ready = 'true';
  }

  destroy(): void {
    this.ro.disconnect();
    this.plot?.destroy();
    this.el.remove();
  }
}

// An axis of a parallel-coordinates view: a numeric range (log: drawn on a log scale; reverse_log:
// on a log scale of 1 - v, so values near 1 spread out) or categorical values at even spacing.
export interface ParallelAxis {
  name: string;
  min: number; max: number;
  scaling?: 'linear' | 'log' | 'reverse_log';
  values?: (number | string | boolean)[]; // categorical
  invert?: boolean; // the top of the axis is its min (an objective minimized: better is up)
}
export interface ParallelLine { label: string; values: (number | string | boolean | null | undefined)[]; shade: number | null }

// Where v sits on axis a, 0 (bottom) to 1 (top); null when it has no place there.
export function axisPosition(a: ParallelAxis, v: number | string | boolean | null | undefined): number | null {
  if (v === null || v === undefined) return null;
  let t: number;
  if (a.values) {
    const i = a.values.findIndex((x) => x === v);
    if (i < 0) return null;
    t = a.values.length > 1 ? i / (a.values.length - 1) : 0.5;
  } else {
    if (typeof v !== 'number' || !isFinite(v)) return null;
    const f = a.scaling === 'log' && a.min > 0 ? Math.log : a.scaling === 'reverse_log' && a.max < 1 ? (x: number) => -Math.log(1 - x) : (x: number) => x;
    const lo = f(a.min), hi = f(a.max);
    t = hi > lo ? (f(Math.min(a.max, Math.max(a.min, v))) - lo) / (hi - lo) : 0.5;
  }
  return a.invert ? 1 - t : t;
}

// A colour from worse (0: blue) to better (1: orange); grey for a line with no objective.
function shadeColor(s: number | null): string {
  if (s === null) return '#8c959f';
  const a = [0x1f, 0x6f, 0xeb], b = [0xe8, 0x59, 0x0c];
  const c = a.map((x, i) => Math.round(x + (b[i] - x) * Math.max(0, Math.min(1, s))));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// Parallel coordinates: one vertical axis each (hyperparameters, then the objective), one line a
// trial across them, coloured by its objective. Drawn by uPlot: x is the axis index, each trial a
// series over its values placed on [0, 1]; each axis's ends (or categories) are written beside it.
// Hovering a line names it below the chart.
export class ParallelChart {
  readonly el: HTMLElement;
  private plot: uPlot;
  private ro: ResizeObserver;
  private hover: HTMLElement;

  constructor(parent: HTMLElement, title: string, private axesDef: ParallelAxis[], private lines: ParallelLine[], id: string) {
    this.hover = h('p', { class: 'muted small parallel-hover', 'aria-live': 'off' }, 'Hover a line to see its trial.');
    this.el = h('figure', { class: 'chart parallel', id, 'data-lines': String(lines.length), 'data-axes': axesDef.map((a) => a.name).join(',') },
      h('figcaption', null, title));
    parent.append(this.el);
    const n = axesDef.length;
    const xs = axesDef.map((_a, i) => i);
    const ys = lines.map((l) => axesDef.map((a, i) => axisPosition(a, l.values[i])));
    const t = themed();
    const opts: uPlot.Options = {
      width: Math.max(240, this.el.clientWidth - 4),
      height: 280,
      padding: [18, 40, 0, 40],
      scales: { x: { time: false, range: [0, Math.max(1, n - 1)] }, y: { range: [0, 1] } },
      axes: [
        { stroke: t.fg, grid: { show: false }, ticks: { show: false }, splits: () => xs, gap: 16, size: 44,
          values: (_u, ticks) => ticks.map((v) => axesDef[v]?.name ?? '') },
        { show: false },
      ],
      series: [
        { label: 'axis' },
        ...lines.map((l) => ({ label: l.label, stroke: shadeColor(l.shade), width: 1.5, dash: l.shade === null ? DASHES[1] : undefined,
                               points: { show: false } })),
      ],
      legend: { show: false },
      cursor: { points: { show: false }, drag: { x: false, y: false }, focus: { prox: 12 } },
      focus: { alpha: 0.2 },
      hooks: {
        draw: [(u) => this.drawAxes(u)],
        setSeries: [(_u, i) => { this.hover.textContent = i ? this.lines[i - 1].label : 'Hover a line to see its trial.'; }],
      },
    };
    this.plot = new uPlot(opts, [xs, ...ys] as uPlot.AlignedData, this.el);
    this.plot.over.setAttribute('aria-label', `${title}: one line a trial across ${axesDef.map((a) => a.name).join(', ')}`);
    this.el.append(this.hover);
    this.ro = new ResizeObserver(() => this.plot.setSize({ width: Math.max(240, this.el.clientWidth - 4), height: 280 }));
    this.ro.observe(this.el);
    this.el.dataset.ready = 'true';
  }

  // Each axis as a vertical line with its ends (or its categories) written beside it.
  private drawAxes(u: uPlot): void {
    const ctx = u.ctx;
    const t = themed();
    const px = devicePixelRatio || 1;
    ctx.save();
    ctx.strokeStyle = t.fg;
    ctx.fillStyle = t.fg;
    ctx.lineWidth = px;
    ctx.font = `${11 * px}px system-ui, sans-serif`;
    const top = u.valToPos(1, 'y', true), bottom = u.valToPos(0, 'y', true);
    this.axesDef.forEach((a, i) => {
      const x = u.valToPos(i, 'x', true);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, bottom);
      ctx.stroke();
      ctx.textAlign = i === 0 ? 'left' : i === this.axesDef.length - 1 ? 'right' : 'center';
      const label = (v: number | string | boolean, y: number, base: CanvasTextBaseline) => {
        ctx.textBaseline = base;
        ctx.fillText(typeof v === 'number' ? fmtNum(v) : String(v), x + (i === 0 ? 3 * px : i === this.axesDef.length - 1 ? -3 * px : 0), y);
      };
      if (a.values) {
        a.values.forEach((v) => {
          const p = axisPosition(a, v);
          if (p !== null) label(v, u.valToPos(p, 'y', true), 'middle');
        });
      } else {
        const hi = a.invert ? a.min : a.max, lo = a.invert ? a.max : a.min;
        label(hi, top - 2 * px, 'bottom');
        label(lo, bottom + 2 * px, 'top');
        if (a.scaling && a.scaling !== 'linear') {
          ctx.textBaseline = 'middle';
          ctx.fillText(a.scaling === 'log' ? 'log' : '1−v log', x + (i === this.axesDef.length - 1 ? -3 * px : 3 * px), (top + bottom) / 2);
        }
      }
    });
    ctx.restore();
  }

  destroy(): void {
    this.ro.disconnect();
    this.plot.destroy();
    this.el.remove();
  }
}
