// main.ts - the web UI's entry: hash routes (#/jobs?filter=..., #/jobs/ID, #/compare?ids=A,B,
// #/tuning, #/tuning/ID, #/workers, #/queues?name=Q, #/login) so every view is a shareable link,
// the login state, the header, and the one-time login link of `kiln ui` (#login=CODE, redeemed once and removed from the URL and the
// browser history before anything else runs).
import 'uplot/dist/uPlot.min.css';
import './style.css';
import { api, ApiError, auth, setUnauthenticatedHandler, setWhoami, whoami, WhoAmI } from './api';
import { clear, h } from './dom';
import { jobsPage } from './pages/jobs';
import { jobPage } from './pages/job';
import { comparePage } from './pages/compare';
import { workersPage } from './pages/workers';
import { queuesPage } from './pages/queues';
import { tuningsPage } from './pages/tunings';
import { tuningPage } from './pages/tuning';
import { loginPage } from './pages/login';

export type Cleanup = () => void;
export type Page = (main: HTMLElement, params: URLSearchParams, path: string[]) => Cleanup | void;

let cleanup: Cleanup | null = null;
let loginMessage = '';

// The current route: "#/jobs/ID?x=1" -> path ["jobs", "ID"], params x=1.
function route(): { path: string[]; params: URLSearchParams } {
  const hash = location.hash.replace(/^#\/?/, '');
  const q = hash.indexOf('?');
  const p = q < 0 ? hash : hash.slice(0, q);
  return {
    path: p.split('/').filter(Boolean).map(decodeURIComponent),
    params: new URLSearchParams(q < 0 ? '' : hash.slice(q + 1)),
  };
}

// Replaces the query part of the current route without adding a history entry (a page
// recording its state, such as the search, in the URL).
export function setParams(params: URLSearchParams): void {
  const hash = location.hash.replace(/^#\/?/, '');
  const q = hash.indexOf('?');
  const p = q < 0 ? hash : hash.slice(0, q);
  const s = params.toString();
  history.replaceState(null, '', `#/${p}${s ? `?${s}` : ''}`);
}

export function go(hash: string): void {
  if (location.hash === hash) render(); else location.hash = hash;
}

function renderHeader(): void {
  const nav = document.getElementById('nav')!;
  const who = document.getElementById('who')!;
  clear(nav);
  clear(who);
  const me = whoami();
  if (!me) return;
  const cur = route().path[0] || 'jobs';
  const link = (href: string, label: string, key: string) =>
    h('a', { href, 'aria-current': cur === key ? 'page' : null }, label);
  nav.append(link('#/jobs', 'Jobs', 'jobs'), link('#/tuning', 'Tuning', 'tuning'), link('#/workers', 'Workers', 'workers'),
             link('#/queues', 'Queues', 'queues'));
  const roles = me.cluster_admin ? 'cluster admin'
    : me.projects.map((p) => `${p.project}: ${p.role}`).join(', ') || 'no projects';
  who.append(h('span', { title: roles }, me.user, h('span', { class: 'muted' }, ` (${roles})`)));
  if (auth.token()) who.append(h('button', { type: 'button', class: 'link', onclick: logout }, 'Log out'));
}

async function logout(): Promise<void> {
  // A token a login link made is this browser's own: revoke it. A pasted one is the user's.
  const id = auth.tokenId();
  if (auth.fromLink() && id) {
    try { await api('DELETE', `/v1/tokens/${encodeURIComponent(id)}`, undefined, { quiet401: true }); } catch { /* gone already */ }
  }
  auth.clear();
  setWhoami(null);
  loginMessage = 'Logged out.';
  go('#/login');
}

export function render(): void {
  const main = document.getElementById('main')!;
  if (cleanup) { cleanup(); cleanup = null; }
  clear(main);
  const { path, params } = route();
  const me = whoami();
  renderHeader();
  if (!me || path[0] === 'login') {
    if (me && path[0] === 'login') { go('#/jobs'); return; }
    cleanup = loginPage(main, loginMessage, signedIn) || null;
    loginMessage = '';
    return;
  }
  let page: Page;
  switch (path[0] || 'jobs') {
    case 'jobs': page = path[1] ? jobPage : jobsPage; break;
    case 'compare': page = comparePage; break;
    case 'workers': page = workersPage; break;
    case 'queues': page = queuesPage; break;
    case 'tuning': page = path[1] ? tuningPage : tuningsPage; break;
    default:
      main.append(h('h1', null, 'Not found'), h('p', null, 'No page here. ', h('a', { href: '#/jobs' }, 'Jobs')));
      return;
  }
  cleanup = page(main, params, path) || null;
}

// After a successful login: remember who, go where the user was headed.
function signedIn(me: WhoAmI, next: string): void {
  setWhoami(me);
  go(next && !next.startsWith('#/login') ? next : '#/jobs');
}

setUnauthenticatedHandler((msg) => {
  if (!whoami()) return;
  auth.clear();
  setWhoami(null);
  loginMessage = `Signed out: ${msg}`;
  const here = location.hash;
  if (!here.startsWith('#/login')) sessionStorage.setItem('kiln.next', here);
  go('#/login');
});

async function redeemLink(code: string): Promise<void> {
  try {
    const r = await api<{ id: string; token: string; user: string }>('POST', '/v1/login-links:redeem', { code }, { quiet401: true });
    auth.set(r.token, r.id, true);
  } catch (e) {
    loginMessage = e instanceof ApiError ? `${e.message}${e.body.hint ? ` (${e.body.hint})` : ''}` : String(e);
  }
}

async function boot(): Promise<void> {
  // `kiln ui` opens https://kilnd/#login=CODE. Take the code out of the URL, and out of this
  // history entry, before anything else, then trade it for a token of this browser's own.
  const m = /^#login=([A-Za-z0-9_-]+)/.exec(location.hash);
  if (m) {
    history.replaceState(null, '', `${location.pathname}#/jobs`);
    await redeemLink(m[1]);
  }
  try {
    // With a token: who it is. Without one: a kilnd running without authentication answers too.
    setWhoami(await api<WhoAmI>('GET', '/v1/whoami', undefined, { quiet401: true }));
  } catch (e) {
    if (e instanceof ApiError && e.status === 401 && auth.token()) {
      loginMessage = loginMessage || `Your saved token was refused: ${e.message}`;
      auth.clear();
    } else if (!(e instanceof ApiError)) {
      loginMessage = `kilnd did not answer: ${String(e)}`;
    }
    if (!location.hash.startsWith('#/login') && location.hash) sessionStorage.setItem('kiln.next', location.hash);
  }
  window.addEventListener('hashchange', render);
  // "/" focuses the page's filter (the jobs search), as on GitHub and Grafana; typed into a
  // field it is a slash.
  document.addEventListener('keydown', (ev) => {
    if (ev.key !== '/' || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const t = ev.target as HTMLElement | null;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) return;
    const filter = document.getElementById('filter') as HTMLInputElement | null;
    if (!filter) return;
    ev.preventDefault();
    filter.focus();
    filter.select();
  });
  // Another tab logged out (or in): follow it.
  window.addEventListener('storage', (ev) => {
    if (ev.key === 'kiln.token' && !ev.newValue && whoami()) { setWhoami(null); go('#/login'); }
  });
  render();
}

boot();
