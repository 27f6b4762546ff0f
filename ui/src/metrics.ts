// metrics.ts - a job's metric history for its charts: downsampled on the server to about as many
// points as a chart has pixels, extended with only the new steps while the job runs, re-fetched
// whole when the appended tail grows long, and fetched in detail for a zoomed step range.
import { get } from './api';
import type { SeriesData } from './chart';
import type { MetricSeries } from './types';

export const MAX_POINTS = 1000;

// One value per step: kilnd keeps only the latest attempt's points of a retried step (every
// request here asks for attempt=latest); of several ranks' (or several points at one step), the
// lowest rank's first (rank 0 writes the job's own metrics).
export function toSeries(m: MetricSeries): SeriesData {
  const best = new Map<number, { v: number | null; rank: number }>();
  for (const p of m.points) {
    const rank = p.rank ?? 0;
    const cur = best.get(p.step);
    if (!cur || rank < cur.rank) best.set(p.step, { v: p.value, rank });
  }
  const steps = [...best.keys()].sort((a, b) => a - b);
  return { name: m.name, steps, values: steps.map((s) => best.get(s)!.v) };
}

// The run as a chart shows it: per step the points of the latest attempt that reached it.
export function metricsUrl(jobId: string, q: Record<string, string | number>): string {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) p.set(k, String(v));
  p.set('attempt', 'latest');
  return `/v1/jobs/${encodeURIComponent(jobId)}/metrics?${p}`;
}

async function fetchSeries(jobId: string, q: Record<string, string | number>): Promise<SeriesData[]> {
  const r = await get<{ metrics: MetricSeries[] }>(metricsUrl(jobId, q));
  return r.metrics.map(toSeries);
}

export class JobMetrics {
  series = new Map<string, SeriesData>();
  lastStep = 0;
  private tail = 0; // points appended since the last whole fetch
  private loaded = new Set<string>(); // the metrics whose whole history was fetched

  constructor(private jobId: string) {}

  names(): string[] { return [...this.series.keys()].sort(); }

  // The whole (downsampled) history of the named metrics (every metric when names is empty),
  // one request per metric, in parallel: the server downsamples each on its own.
  async loadAll(names: string[] = []): Promise<void> {
    const all = names.length
      ? (await Promise.all(names.map((name) => fetchSeries(this.jobId, { name, max_points: MAX_POINTS })))).flat()
      : await fetchSeries(this.jobId, { max_points: MAX_POINTS });
    if (!names.length) this.series.clear();
    for (const s of all) this.series.set(s.name, s);
    this.loaded = new Set(names.length ? [...this.loaded, ...names] : all.map((s) => s.name));
    this.tail = 0;
    this.lastStep = 0;
    for (const s of this.series.values()) if (s.steps.length) this.lastStep = Math.max(this.lastStep, s.steps[s.steps.length - 1]);
  }

  // Fetches one more metric's history (a chart added on request).
  async load(name: string): Promise<void> {
    const [s] = await fetchSeries(this.jobId, { name, max_points: MAX_POINTS });
    if (s) this.series.set(name, s);
    this.loaded.add(name);
  }

  // New steps since the last fetch. Returns whether anything changed.
  async extend(): Promise<boolean> {
    if (this.tail > 2 * MAX_POINTS || this.series.size === 0) {
      const before = this.lastStep;
      await this.loadAll(this.series.size ? [...this.loaded] : []);
      return this.lastStep !== before || this.series.size > 0;
    }
    const fresh = await fetchSeries(this.jobId, { start_step: this.lastStep + 1, max_points: MAX_POINTS });
    let changed = false;
    for (const f of fresh) {
      if (!f.steps.length) continue;
      const s = this.series.get(f.name);
      if (!s) { this.series.set(f.name, f); changed = true; continue; }
      for (let i = 0; i < f.steps.length; i++) {
        if (s.steps.length && f.steps[i] <= s.steps[s.steps.length - 1]) continue;
        s.steps.push(f.steps[i]);
        s.values.push(f.values[i]);
        this.tail++;
        changed = true;
      }
      this.lastStep = Math.max(this.lastStep, f.steps[f.steps.length - 1]);
    }
    return changed;
  }

  // The named metrics in [lo, hi] in detail (about MAX_POINTS each).
  async range(names: string[], lo: number, hi: number): Promise<SeriesData[]> {
    const out: SeriesData[] = [];
    for (const name of names) {
      if (!this.series.has(name)) continue;
      out.push(...await fetchSeries(this.jobId, { name, start_step: Math.max(1, lo), end_step: Math.max(1, hi), max_points: MAX_POINTS }));
    }
    return out;
  }
}
