// columns.ts - the value of a filter-language field for one job, as the jobs table and the
// compare page show it: kilnd's own columns when a search returned them ("hp.lr",
// "metrics.val_loss.min"), else read from the job itself (its spec, its metric summaries).
import type { Job } from './types';

function dig(o: unknown, path: string[]): unknown {
  let cur: unknown = o;
  for (const k of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[k];
  }
  return cur;
}

export function columnValue(job: Job, col: string): unknown {
  if (job.columns && col in job.columns) return job.columns[col];
  const parts = col.split('.');
  switch (parts[0]) {
    case 'hp': return dig(job.spec?.hyperparameters, parts.slice(1));
    case 'model': case 'resources': case 'data': case 'distribution': case 'checkpoint':
      return dig(job.spec, parts);
    case 'tags': return dig(job.tags ?? job.spec?.tags, parts.slice(1));
    case 'metrics': {
      const [, name, stat = 'last'] = parts;
      const s = job.summaries?.[name] as Record<string, number | null> | undefined;
      if (s && stat in s) return s[stat];
      return stat === 'last' ? job.metrics?.[name] ?? undefined : undefined;
    }
    case 'progress': return job.progress?.total_steps ? (job.progress.step || 0) / job.progress.total_steps : undefined;
    case 'duration': return durationS(job);
    case 'created': return job.created_at;
    case 'started': return job.started_at;
    case 'ended': return job.ended_at;
    default: return (job as unknown as Record<string, unknown>)[col];
  }
}

// The job's wall time, as the search field `duration` and the CLI count it: from its first start to
// its end, or to now until it ends, the waits between attempts (after a preemption or a lost
// attempt) included.
export function durationS(job: Job, now = Date.now()): number | undefined {
  if (!job.started_at) return undefined;
  const s = Date.parse(job.started_at);
  const e = job.ended_at ? Date.parse(job.ended_at) : now;
  return isNaN(s) || isNaN(e) ? undefined : Math.max(0, (e - s) / 1000);
}

// What the job page says after the wall time, as `kiln describe` does: where it counts from, and
// that the waits between attempts count too.
export function wallTimeNote(job: Job): string {
  const waits = ['QUEUED', 'RESTARTING', 'PREEMPTED', 'PAUSED'].includes(job.state);
  return (job.ended_at ? ' from its first start to its end' : ' since its first start')
    + (waits || (job.attempt ?? 0) > 1 ? ', waits between attempts included' : '')
    + (waits ? ' (it waits now)' : '');
}

// Every hyperparameter and metric name seen in jobs, for the column chooser's suggestions.
export function columnSuggestions(jobs: Job[]): string[] {
  const out = new Set<string>();
  for (const j of jobs) {
    for (const k of Object.keys(j.spec?.hyperparameters || {})) out.add(`hp.${k}`);
    for (const k of Object.keys({ ...j.metrics, ...j.summaries })) for (const s of ['last', 'min', 'max']) out.add(`metrics.${k}.${s}`);
  }
  return [...out].sort();
}
