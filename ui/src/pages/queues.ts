// queues.ts - the cluster's queues (GET /v1/queues): quota, usage and what is borrowed above the
// quota per slot type, borrowing and lending limits, pending and admitted jobs, weight, cohort
// projects and preemption policy; the default queue of each project the caller sees (GET /v1/projects), where its
// jobs that name no queue go; for cluster admins a form to create, edit (PATCH) and delete
// queues. The queue being looked at or edited and an open "new queue" form live in the URL
// (#/queues?name=nlp, #/queues?new=1).
import { api, ApiError, get, whoami } from '../api';
import { clear, h } from '../dom';
import { setParams, type Cleanup } from '../main';
import type { Project, Queue, QueuePreemption, SlotCounts } from '../types';

const REFRESH_MS = 5000;
const TYPES: (keyof SlotCounts)[] = ['cpu', 'gpu'];
// the values of a queue's preemption policy, the default first (openapi.yaml, QueuePreemption)
const WITHIN: QueuePreemption['within_queue'][] = ['lower_priority', 'never'];
const RECLAIM: QueuePreemption['reclaim_within_cohort'][] = ['any', 'lower_priority', 'never'];

// "within queue: lower_priority; reclaim: any"
function policy(p: QueuePreemption | undefined): string {
  return `within queue: ${p?.within_queue ?? WITHIN[0]}; reclaim: ${p?.reclaim_within_cohort ?? RECLAIM[0]}`;
}

// "cpu 8, gpu 0"; `none` when the object names no slot type.
function counts(c: SlotCounts | null | undefined, none: string): string {
  const parts = TYPES.filter((t) => c && c[t] !== undefined).map((t) => `${t} ${c![t]}`);
  return parts.length ? parts.join(', ') : none;
}

function borrowed(q: Queue): string {
  if (!q.quota) return '—';
  const b = TYPES.map((t) => [t, Math.max(0, (q.usage[t] || 0) - (q.quota![t] || 0))] as const).filter(([, n]) => n > 0);
  return b.length ? b.map(([t, n]) => `${t} ${n}`).join(', ') : '0';
}

export function queuesPage(main: HTMLElement, params: URLSearchParams): Cleanup {
  let alive = true;
  let timer = 0;
  let queues: Queue[] = [];
  let projects: Project[] = [];
  let selected = params.get('name') || '';
  let creating = params.get('new') === '1';
  const admin = !!whoami()?.cluster_admin;
  const body = h('tbody');
  const projectBody = h('tbody');
  const status = h('p', { class: 'muted', 'aria-live': 'polite' });
  // what the admin's last save or delete did (kilnd's refusal, with its hint): the refresh
  // rewrites status every few seconds, so it has a line of its own
  const notice = h('p', { id: 'queue-notice', role: 'status' });
  const formSlot = h('div');
  const newBtn = admin ? h('button', { type: 'button', id: 'queue-new', onclick: () => { selected = ''; creating = true; sync(); } }, 'New queue') : null;
  const cols = ['Name', 'Cohort', 'Quota', 'Usage', 'Borrowed', 'Borrowing limit', 'Lending limit', 'Pending', 'Admitted',
                'Weight', 'Fair sharing', 'Preemption', 'Projects', ...(admin ? ['Actions'] : [])];
  main.append(h('div', { class: 'title-row' }, h('h1', null, 'Queues'), newBtn), status, notice, formSlot,
    h('div', { class: 'table-wrap' }, h('table', { class: 'queues', 'aria-label': 'Queues' },
      h('thead', null, h('tr', null, ...cols.map((c) => h('th', { scope: 'col' }, c)))), body)),
    h('section', { class: 'default-queues', 'aria-labelledby': 'default-queues-title' },
      h('h2', { id: 'default-queues-title' }, 'Default queues of projects'),
      h('p', { class: 'muted small' }, 'A job that names no queue waits in its project\'s default queue: default, unless a project admin sets another (kiln projects update PROJECT --default-queue QUEUE). While a queue is a project\'s default, or holds its jobs, it cannot be deleted or leave that project out of its projects.'),
      h('div', { class: 'table-wrap' }, h('table', { class: 'projects', 'aria-labelledby': 'default-queues-title' },
        h('thead', null, h('tr', null, h('th', { scope: 'col' }, 'Project'), h('th', { scope: 'col' }, 'Default queue'))), projectBody))));

  // The URL says which queue is selected and whether the new-queue form is open.
  function sync(): void {
    const p = new URLSearchParams();
    if (selected) p.set('name', selected);
    if (creating) p.set('new', '1');
    setParams(p);
    renderTable();
    renderForm();
  }

  function renderTable(): void {
    clear(body);
    for (const q of queues) {
      const actions = admin ? h('td', null,
        h('button', { type: 'button', class: 'secondary edit', 'aria-label': `Edit queue ${q.name}`, onclick: () => { selected = q.name; creating = false; sync(); } }, 'Edit'), ' ',
        q.name === 'default' ? null : h('button', { type: 'button', class: 'danger delete', 'aria-label': `Delete queue ${q.name}`, onclick: () => remove(q) }, 'Delete')) : null;
      body.append(h('tr', { 'data-name': q.name, class: q.name === selected ? 'selected' : null },
        h('th', { scope: 'row' }, h('a', { href: `#/queues?name=${encodeURIComponent(q.name)}` }, q.name)),
        h('td', null, q.cohort || '—'),
        h('td', { class: 'quota' }, q.quota ? counts(q.quota, '0') : 'no limit'),
        h('td', { class: 'usage' }, counts(q.usage, '0')),
        h('td', { class: 'borrowed' }, borrowed(q)),
        h('td', null, q.cohort ? counts(q.borrowing_limit, 'unlimited') : '—'),
        h('td', null, q.cohort ? counts(q.lending_limit, 'unlimited') : '—'),
        h('td', { class: 'pending' }, h('a', { href: `#/jobs?filter=${encodeURIComponent(`queue = "${q.name}" AND state = QUEUED`)}` }, String(q.pending))),
        h('td', { class: 'admitted' }, String(q.admitted ?? '')),
        h('td', { class: 'weight' }, String(q.weight)),
        h('td', null, q.fair_sharing ? 'between projects' : 'no'),
        h('td', { class: 'preemption' }, policy(q.preemption)),
        // kilnd names a non-admin only its own projects of the queue's (and "*")
        h('td', { class: 'projects' }, q.projects.length ? q.projects.join(', ') : admin ? 'none' : 'none of yours'),
        actions));
    }
    if (!queues.length) body.append(h('tr', null, h('td', { colspan: cols.length, class: 'muted' }, 'No queues.')));
    clear(projectBody);
    for (const p of projects) {
      projectBody.append(h('tr', { 'data-project': p.name },
        h('th', { scope: 'row' }, p.name),
        h('td', { class: 'default-queue' }, h('a', { href: `#/queues?name=${encodeURIComponent(p.default_queue)}` }, p.default_queue))));
    }
    if (!projects.length) projectBody.append(h('tr', null, h('td', { colspan: 2, class: 'muted' }, 'No projects.')));
  }

  async function remove(q: Queue): Promise<void> {
    if (!confirm(`Delete queue ${q.name}? Jobs can no longer be submitted to it.`)) return;
    try {
      await api('DELETE', `/v1/queues/${encodeURIComponent(q.name)}`);
      // the URL first, then the table: once the row is gone, nothing names the queue
      if (selected === q.name) selected = '';
      queues = queues.filter((x) => x.name !== q.name);
      sync();
      notice.textContent = `Queue ${q.name} deleted.`;
      await load();
    } catch (e) {
      notice.textContent = e instanceof ApiError ? `${e.message}${e.body.hint ? ` (${e.body.hint})` : ''}` : String(e);
    }
  }

  // The create or edit form (cluster admins): a queue's fields, sent whole.
  function renderForm(): void {
    clear(formSlot);
    const q = queues.find((x) => x.name === selected);
    if (!admin || (!creating && !q)) return;
    const num = (id: string, label: string, v: number | undefined, hint: string) => h('div', { class: 'field' },
      h('label', { for: id }, label), h('input', { id, type: 'number', min: 0, step: 1, value: v === undefined ? '' : String(v), placeholder: hint }));
    const select = (id: string, label: string, values: string[], v: string | undefined) => h('div', { class: 'field' },
      h('label', { for: id }, label),
      h('select', { id }, ...values.map((x) => h('option', { value: x, selected: x === (v ?? values[0]) }, x))));
    const fields = h('div', { class: 'queue-fields' },
      h('div', { class: 'field' }, h('label', { for: 'q-name' }, 'Name'),
        h('input', { id: 'q-name', type: 'text', value: q?.name || '', disabled: !!q, required: true, autocomplete: 'off' })),
      h('div', { class: 'field' }, h('label', { for: 'q-cohort' }, 'Cohort'),
        h('input', { id: 'q-cohort', type: 'text', value: q?.cohort || '', placeholder: 'none', autocomplete: 'off' })),
      ...TYPES.map((t) => num(`q-quota-${t}`, `Quota ${t}`, q?.quota ? q.quota[t] : undefined, 'no limit')),
      ...TYPES.map((t) => num(`q-borrow-${t}`, `Borrowing limit ${t}`, q?.borrowing_limit[t], 'unlimited')),
      ...TYPES.map((t) => num(`q-lend-${t}`, `Lending limit ${t}`, q?.lending_limit[t], 'unlimited')),
      h('div', { class: 'field' }, h('label', { for: 'q-weight' }, 'Weight'),
        h('input', { id: 'q-weight', type: 'number', min: 0, step: 'any', value: String(q?.weight ?? 1) })),
      h('div', { class: 'field' }, h('label', { for: 'q-projects' }, 'Projects'),
        h('input', { id: 'q-projects', type: 'text', value: (q?.projects || ['*']).join(', '), autocomplete: 'off' })),
      h('div', { class: 'field' }, h('label', null, h('input', { id: 'q-fair', type: 'checkbox', checked: !!q?.fair_sharing }), ' Fair sharing between projects')),
      select('q-within', 'Preempt within queue', WITHIN, q?.preemption?.within_queue),
      select('q-reclaim', 'Reclaim within cohort', RECLAIM, q?.preemption?.reclaim_within_cohort));
    const errBox = h('div', { id: 'queue-error', class: 'error', role: 'alert' });
    errBox.hidden = true;
    const val = (id: string) => (formSlot.querySelector(`#${id}`) as HTMLInputElement).value.trim();
    const slots = (prefix: string): SlotCounts => {
      const o: SlotCounts = {};
      for (const t of TYPES) if (val(`${prefix}-${t}`) !== '') o[t] = Number(val(`${prefix}-${t}`));
      return o;
    };
    async function save(ev: Event): Promise<void> {
      ev.preventDefault();
      errBox.hidden = true;
      const quota = slots('q-quota');
      const cohort = val('q-cohort');
      const out: Record<string, unknown> = {
        cohort: cohort || null,
        quota: Object.keys(quota).length ? quota : null,
        borrowing_limit: cohort ? slots('q-borrow') : null,
        lending_limit: cohort ? slots('q-lend') : null,
        weight: Number(val('q-weight') || '1'),
        projects: val('q-projects').split(',').map((s) => s.trim()).filter(Boolean),
        fair_sharing: (formSlot.querySelector('#q-fair') as HTMLInputElement).checked,
        preemption: {
          within_queue: (formSlot.querySelector('#q-within') as HTMLSelectElement).value,
          reclaim_within_cohort: (formSlot.querySelector('#q-reclaim') as HTMLSelectElement).value,
        },
      };
      try {
        let saved: Queue;
        if (q) {
          saved = await api<Queue>('PATCH', `/v1/queues/${encodeURIComponent(q.name)}`, out);
        } else {
          saved = await api<Queue>('POST', '/v1/queues', { name: val('q-name'), ...out });
        }
        notice.textContent = `Queue ${saved.name} ${q ? 'saved' : 'created'}.`;
        selected = saved.name;
        creating = false;
        await load();
        sync();
      } catch (e) {
        clear(errBox);
        if (e instanceof ApiError) {
          const b = e.body;
          errBox.append(h('p', { class: 'msg' }, h('strong', null, 'kilnd refused the queue: '), `${b.field ? `${b.field}: ` : ''}${b.message || `HTTP ${e.status}`}`));
          if (b.hint) errBox.append(h('p', { class: 'hint' }, b.hint));
        } else {
          errBox.append(h('p', null, String(e)));
        }
        errBox.hidden = false;
      }
    }
    formSlot.append(h('section', { class: 'card', id: 'queue-form', 'aria-labelledby': 'queue-form-title' },
      h('h2', { id: 'queue-form-title' }, q ? `Edit queue ${q.name}` : 'New queue'),
      h('form', { onsubmit: (ev: Event) => { save(ev); } }, fields,
        h('p', { class: 'muted small' }, 'An empty quota is no limit (only without a cohort); an empty borrowing or lending limit is unlimited within the cohort; projects "*" lets every project in.'),
        errBox,
        h('div', { class: 'actions' }, h('button', { type: 'submit', id: 'queue-save' }, q ? 'Save' : 'Create'),
          h('button', { type: 'button', class: 'secondary', id: 'queue-cancel', onclick: () => { creating = false; selected = ''; sync(); } }, 'Cancel')))));
  }

  async function load(): Promise<void> {
    const [r, pr] = await Promise.all([get<{ queues: Queue[] }>('/v1/queues'), get<{ projects: Project[] }>('/v1/projects')]);
    if (!alive) return;
    queues = r.queues;
    projects = pr.projects;
    renderTable();
    status.textContent = `${queues.length} queue${queues.length === 1 ? '' : 's'}, ${queues.reduce((a, q) => a + q.pending, 0)} jobs waiting`;
    main.dataset.loaded = 'true';
  }

  let first = true;
  async function poll(): Promise<void> {
    try {
      await load();
      if (first && alive) { first = false; renderForm(); }
    } catch (e) {
      status.textContent = e instanceof ApiError ? e.message : String(e);
    }
    if (alive) timer = window.setTimeout(poll, REFRESH_MS);
  }
  poll();
  return () => { alive = false; clearTimeout(timer); };
}
