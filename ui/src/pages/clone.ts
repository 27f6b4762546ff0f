// clone.ts - the job page's "Clone and edit" panel: the job's spec (as kilnd stored it, defaults
// filled in) in an editor; "Submit copy" posts the edited text as a new job and opens it. Bad JSON
// is shown here; a spec kilnd refuses shows kilnd's message, field and hint, and stays editable.
import { api, ApiError } from '../api';
import { clear, h } from '../dom';
import { go } from '../main';
import type { Job } from '../types';

// The panel for job j; onClose is called by Cancel. The caller appends el where it is shown.
export function clonePanel(j: Job, onClose: () => void): { el: HTMLElement; focus: () => void } {
  const spec = { ...(j.spec ?? {}) };
  const text = h('textarea', { id: 'clone-spec', class: 'spec-edit', spellcheck: 'false', autocomplete: 'off',
                               rows: 24, 'aria-describedby': 'clone-help clone-error' });
  text.value = JSON.stringify(spec, null, 2);
  const errBox = h('div', { id: 'clone-error', class: 'error', role: 'alert' });
  errBox.hidden = true;
  const submit = h('button', { type: 'submit', id: 'clone-submit' }, 'Submit copy');

  function showError(title: string, message: string, detail?: string, hint?: string): void {
    clear(errBox);
    errBox.append(h('p', { class: 'msg' }, h('strong', null, `${title}: `), message));
    if (detail) errBox.append(h('pre', { class: 'caret' }, detail));
    if (hint) errBox.append(h('p', { class: 'hint' }, hint));
    errBox.hidden = false;
    text.setAttribute('aria-invalid', 'true');
  }

  async function onSubmit(ev: Event): Promise<void> {
    ev.preventDefault();
    errBox.hidden = true;
    text.removeAttribute('aria-invalid');
    let edited: unknown;
    try {
      edited = JSON.parse(text.value);
    } catch (e) {
      showError('Not JSON', e instanceof Error ? e.message : String(e), undefined, 'The spec is a JSON object: check quotes, commas and brackets.');
      return;
    }
    submit.disabled = true;
    try {
      const created = await api<Job>('POST', '/v1/jobs', edited);
      go(`#/jobs/${encodeURIComponent(created.id)}`);
    } catch (e) {
      if (e instanceof ApiError) {
        const b = e.body;
        showError('kilnd refused the spec', `${b.field && !(b.message || '').startsWith(b.field) ? `${b.field}: ` : ''}${b.message || `HTTP ${e.status}`}`, b.detail, b.hint);
      } else {
        showError('kilnd did not answer', String(e));
      }
    } finally {
      submit.disabled = false;
    }
  }

  const el = h('section', { class: 'card clone', id: 'clone', 'aria-labelledby': 'clone-title' },
    h('div', { class: 'card-head' }, h('h2', { id: 'clone-title' }, `Clone and edit ${j.name || j.id}`)),
    h('form', { onsubmit: (ev: Event) => { onSubmit(ev); } },
      h('label', { for: 'clone-spec', class: 'visually-hidden' }, 'Job spec (JSON)'),
      text,
      h('p', { id: 'clone-help', class: 'muted small' },
        'The spec as kilnd stored it, defaults filled in. Edit it (a new name helps tell the copy apart) and submit: ',
        'the copy is a new job; this one is unchanged.'),
      errBox,
      h('div', { class: 'actions' }, submit,
        h('button', { type: 'button', class: 'secondary', id: 'clone-cancel', onclick: onClose }, 'Cancel'))));
  return { el, focus: () => text.focus() };
}
