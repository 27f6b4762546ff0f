// workers.ts - the cluster's agents: host, slot type, slots and free slots, state (alive,
// draining, dead, or pending: waiting for a cluster admin's approval, with an Approve button for
// cluster admins), last heartbeat, and the jobs running on each (from the live jobs' workers).
import { api, ApiError, get, whoami } from '../api';
import { clear, fmtAge, h, LIVE_STATES, stateBadge } from '../dom';
import type { Cleanup } from '../main';
import type { Job, JobPage, Worker } from '../types';

const REFRESH_MS = 5000;

export function workersPage(main: HTMLElement, params: URLSearchParams): Cleanup {
  const focus = params.get('id') || '';
  let alive = true;
  let timer = 0;
  const body = h('tbody');
  const status = h('p', { class: 'muted', 'aria-live': 'polite' });
  main.append(h('h1', null, 'Workers'), status,
    h('div', { class: 'table-wrap' }, h('table', { class: 'workers', 'aria-label': 'Workers' },
      h('thead', null, h('tr', null, ...['Host', 'Worker', 'Slot type', 'Slots', 'Free', 'State', 'Last heartbeat', 'Jobs']
        .map((c) => h('th', { scope: 'col' }, c)))), body)));

  async function load(): Promise<void> {
    try {
      const [w, live] = await Promise.all([
        get<{ workers: Worker[] }>('/v1/workers'),
        get<JobPage>(`/v1/jobs?status=${LIVE_STATES.filter((s) => s !== 'QUEUED').join(',')}&page_size=500`),
      ]);
      if (!alive) return;
      const on = new Map<string, Job[]>();
      for (const j of live.jobs) for (const wid of j.workers || []) {
        if (!on.has(wid)) on.set(wid, []);
        on.get(wid)!.push(j);
      }
      clear(body);
      for (const x of w.workers) {
        const pending = x.state === 'ALIVE' && x.approval === 'PENDING';
        const state = x.state === 'ALIVE' && x.draining ? 'DRAINING' : pending ? 'PENDING' : x.state;
        const approve = pending && whoami()?.cluster_admin
          ? h('button', { type: 'button', class: 'approve', title: `Data roots: ${(x.data_roots || []).join(', ') || 'none'}` },
            'Approve')
          : null;
        approve?.addEventListener('click', async () => {
          try {
            await api('POST', `/v1/workers/${encodeURIComponent(x.id)}:approve`, {});
            clearTimeout(timer);
            load();
          } catch (e) {
            status.textContent = e instanceof ApiError ? e.message : String(e);
          }
        });
        const jobs = on.get(x.id) || [];
        body.append(h('tr', { 'data-id': x.id, class: x.id === focus ? 'selected' : null },
          h('td', null, x.hostname), h('td', null, h('code', { class: 'small' }, x.id)), h('td', null, x.slot_type),
          h('td', null, String(x.slots)), h('td', null, String(x.slots_free)), h('td', null, stateBadge(state), ...(approve ? [' ', approve] : [])),
          h('td', { title: x.last_heartbeat || '' }, fmtAge(x.last_heartbeat)),
          h('td', null, ...(jobs.length ? jobs.flatMap((j, i) => [i ? ', ' : '', h('a', { href: `#/jobs/${j.id}` }, j.name || j.id.slice(0, 8))]) : ['—']))));
      }
      if (!w.workers.length) body.append(h('tr', null, h('td', { colspan: 8, class: 'muted' }, 'No workers registered: start kiln-agent.')));
      const aliveN = w.workers.filter((x) => x.state === 'ALIVE').length;
      status.textContent = `${w.workers.length} workers, ${aliveN} alive, ${w.workers.reduce((a, x) => a + (x.state === 'ALIVE' ? x.slots_free : 0), 0)} free slots`;
      main.dataset.loaded = 'true';
    } catch (e) {
      status.textContent = e instanceof ApiError ? e.message : String(e);
    }
    if (alive) timer = window.setTimeout(load, REFRESH_MS);
  }
  load();
  return () => { alive = false; clearTimeout(timer); };
}
