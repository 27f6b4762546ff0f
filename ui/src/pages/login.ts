// login.ts - the login page: paste an API token (checked with GET /v1/whoami before it is kept),
// or use `kiln ui`, which opens this page with a one-time link (main.ts redeems it).
import { api, ApiError, auth, WhoAmI } from '../api';
import { h } from '../dom';
import type { Cleanup } from '../main';

export function loginPage(main: HTMLElement, message: string,
                          done: (me: WhoAmI, next: string) => void): Cleanup | void {
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off',
                             spellcheck: 'false', required: true, 'aria-describedby': 'token-help' });
  const err = h('p', { class: 'error', role: 'alert', id: 'login-error' }, message || '');
  if (!message) err.hidden = true;
  const button = h('button', { type: 'submit' }, 'Log in');
  const form = h('form', { class: 'login card', 'aria-labelledby': 'login-title' },
    h('h1', { id: 'login-title' }, 'Log in to kiln'),
    h('label', { for: 'token' }, 'API token'),
    input,
    h('p', { id: 'token-help', class: 'muted' },
      'Paste a token (', h('code', null, 'kiln tokens create USER'), ', or the cluster admin\'s token file), or run ',
      h('code', null, 'kiln ui'), ' to open this page already logged in with a one-time link. ',
      'The token stays in this browser until you log out.'),
    button, err);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    button.disabled = true;
    err.hidden = true;
    try {
      const me = await api<WhoAmI>('GET', '/v1/whoami', undefined, { token, quiet401: true });
      auth.set(token, me.token_id, false);
      input.value = '';
      const next = sessionStorage.getItem('kiln.next') || '#/jobs';
      sessionStorage.removeItem('kiln.next');
      done(me, next);
    } catch (e) {
      err.textContent = e instanceof ApiError ? e.message : `kilnd did not answer: ${String(e)}`;
      err.hidden = false;
      button.disabled = false;
      input.focus();
    }
  });
  main.append(form);
  input.focus();
}
