// api.ts - kilnd's REST API from the browser: the bearer token (kept in localStorage, sent only
// in the Authorization header, never in a URL), JSON calls with kilnd's error shape, Server-Sent
// Events read through fetch (EventSource cannot send a header).

export interface ApiErrorBody { code?: string; message?: string; detail?: string; hint?: string; field?: string }

export class ApiError extends Error {
  status: number;
  body: ApiErrorBody;
  constructor(status: number, body: ApiErrorBody) {
    super(body.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

const TOKEN_KEY = 'kiln.token';
const TOKEN_ID_KEY = 'kiln.token_id';
const SESSION_KEY = 'kiln.session'; // "link": the token came from a login link; revoke at log out

export const auth = {
  token(): string | null { return localStorage.getItem(TOKEN_KEY); },
  set(token: string, tokenId: string, fromLink: boolean): void {
    localStorage.setItem(TOKEN_KEY, token);
    localStorage.setItem(TOKEN_ID_KEY, tokenId);
    if (fromLink) localStorage.setItem(SESSION_KEY, 'link'); else localStorage.removeItem(SESSION_KEY);
  },
  clear(): void {
    localStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_ID_KEY);
    localStorage.removeItem(SESSION_KEY);
  },
  tokenId(): string | null { return localStorage.getItem(TOKEN_ID_KEY); },
  fromLink(): boolean { return localStorage.getItem(SESSION_KEY) === 'link'; },
};

let onUnauthenticated: (msg: string) => void = () => {};
export function setUnauthenticatedHandler(fn: (msg: string) => void): void { onUnauthenticated = fn; }

function headers(extra?: Record<string, string>): Record<string, string> {
  const hd: Record<string, string> = { Accept: 'application/json', ...extra };
  const t = auth.token();
  if (t) hd.Authorization = `Bearer ${t}`;
  return hd;
}

async function errorOf(res: Response): Promise<ApiError> {
  let body: ApiErrorBody = {};
  try { body = await res.json(); } catch { body = { message: `HTTP ${res.status} ${res.statusText}` }; }
  return new ApiError(res.status, body);
}

// One JSON request. Throws ApiError; a 401 also tells the app to show the login page (except
// for the calls that log in, which pass quiet401).
export async function api<T>(method: string, path: string, body?: unknown,
                             opts: { quiet401?: boolean; token?: string; signal?: AbortSignal } = {}): Promise<T> {
  const hd = headers(body !== undefined ? { 'Content-Type': 'application/json' } : undefined);
  if (opts.token) hd.Authorization = `Bearer ${opts.token}`;
  const res = await fetch(path, {
    method, headers: hd, body: body !== undefined ? JSON.stringify(body) : undefined,
    cache: 'no-store', credentials: 'omit', signal: opts.signal,
  });
  if (!res.ok) {
    const e = await errorOf(res);
    if (res.status === 401 && !opts.quiet401) onUnauthenticated(e.message);
    throw e;
  }
  if (res.status === 204) return {} as T;
  return (await res.json()) as T;
}

export const get = <T>(path: string, signal?: AbortSignal) => api<T>('GET', path, undefined, { signal });

// Downloads path (with the token) and hands it to the browser as a file named name.
export async function download(path: string, name: string): Promise<void> {
  const res = await fetch(path, { headers: headers({ Accept: '*/*' }), cache: 'no-store', credentials: 'omit' });
  if (!res.ok) throw await errorOf(res);
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// ---- Server-Sent Events over fetch ------------------------------------------------------------

export interface SseEvent { event: string; data: string; id?: string }

// Reads path as an event stream until it ends, `event: end` arrives, or signal aborts. On a
// dropped connection it reconnects (after 1 s, then up to 10 s) with Last-Event-ID, so nothing
// is missed or repeated. Resolves when the stream has ended for good.
export async function stream(path: string, onEvent: (e: SseEvent) => void, signal: AbortSignal,
                             onState?: (s: 'open' | 'retrying') => void): Promise<void> {
  let lastId = '';
  let delay = 1000;
  while (!signal.aborted) {
    let ended = false;
    try {
      const hd = headers({ Accept: 'text/event-stream' });
      if (lastId) hd['Last-Event-ID'] = lastId;
      const res = await fetch(path, { headers: hd, cache: 'no-store', credentials: 'omit', signal });
      if (res.status === 204) return; // the stream ended earlier: nothing more will come
      if (!res.ok || !res.body) {
        const e = await errorOf(res);
        if (res.status === 401) onUnauthenticated(e.message);
        throw e;
      }
      onState?.('open');
      delay = 1000;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      let ev: SseEvent = { event: 'message', data: '' };
      let hasData = false;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let nl: number;
        while ((nl = buf.search(/\r\n|\n|\r/)) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
          if (line === '') {
            if (hasData) {
              if (ev.id !== undefined) lastId = ev.id;
              onEvent(ev);
              if (ev.event === 'end') ended = true;
            }
            ev = { event: 'message', data: '' };
            hasData = false;
            continue;
          }
          if (line.startsWith(':')) continue;
          const c = line.indexOf(':');
          const field = c < 0 ? line : line.slice(0, c);
          let val = c < 0 ? '' : line.slice(c + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'event') ev.event = val;
          else if (field === 'data') { ev.data = hasData ? `${ev.data}\n${val}` : val; hasData = true; }
          else if (field === 'id') ev.id = val;
        }
        if (ended) { reader.cancel().catch(() => {}); return; }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && e.status >= 400 && e.status < 500) throw e;
    }
    if (ended || signal.aborted) return;
    onState?.('retrying');
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

// ---- who is signed in ---------------------------------------------------------------------------

export interface WhoAmI {
  user: string;
  cluster_admin: boolean;
  projects: { project: string; role: string }[];
  token_id: string;
  token_expires_at: string;
}

let me: WhoAmI | null = null;
export function whoami(): WhoAmI | null { return me; }
export function setWhoami(w: WhoAmI | null): void { me = w; }

const RANK: Record<string, number> = { viewer: 1, editor: 2, admin: 3 };
// Whether the signed-in user may submit and stop jobs of project.
export function canEdit(project: string): boolean {
  if (!me) return false;
  if (me.cluster_admin) return true;
  const p = me.projects.find((x) => x.project === project);
  return !!p && (RANK[p.role] || 0) >= RANK.editor;
}
