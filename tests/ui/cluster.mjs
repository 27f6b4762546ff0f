// cluster.mjs - what the browser tests and benchmarks of the web UI run against: a real kilnd
// (TLS, tokens) on a fresh database in the PostgreSQL cluster tests/run.sh started, two real
// kiln-agent processes (mutual TLS, the join token, data roots), a REST client, and headless
// Debian Chromium driven by playwright-core (never a downloaded browser). Test-only code.
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = process.env.KILN_ROOT || path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const BIN = process.env.KILN_BIN_DIR || path.join(ROOT, 'build/bin');
const require = createRequire(path.join(ROOT, 'ui/package.json'));
export const { chromium } = require('playwright-core');
export const CHROMIUM = process.env.KILN_CHROMIUM || '/usr/bin/chromium';

// Where screenshots go: the test output directory (tests/run.sh's log directory).
export const OUT = process.env.KILN_TEST_OUT
  ? path.join(process.env.KILN_TEST_OUT, 'ui')
  : path.join(ROOT, process.env.BUILD || 'build', 'test-output', 'ui');
mkdirSync(OUT, { recursive: true });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

function psql() {
  for (const d of ['/usr/lib/postgresql']) {
    if (!existsSync(d)) continue;
    for (const v of execFileSync('ls', [d]).toString().trim().split('\n').sort().reverse()) {
      const p = path.join(d, v, 'bin/psql');
      if (existsSync(p)) return p;
    }
  }
  return 'psql';
}

let dbCounter = 0;
function createDb() {
  const host = process.env.KILN_PG_HOST, port = process.env.KILN_PG_PORT || '5432';
  if (!host) throw new Error('no test PostgreSQL: run through tests/run.sh, or `source scripts/pg.sh && pg_start` first');
  const name = `ui_${process.pid}_${++dbCounter}`;
  execFileSync(psql(), ['-q', '-h', host, '-p', port, '-U', 'postgres', '-d', 'postgres', '-c', `CREATE DATABASE "${name}"`]);
  return { url: `host=${host} port=${port} user=postgres dbname=${name}`, name, host, port };
}

export class Cluster {
  constructor() {
    this.procs = [];
    this.dir = mkdtempSync(path.join(os.tmpdir(), 'kiln-ui-'));
  }

  // Starts kilnd and `agents` agents (slots each), waits until every worker is ALIVE.
  async start({ agents = 2, slots = 2 } = {}) {
    this.db = createDb();
    this.tls = process.env.KILN_TEST_TLS_DIR;
    if (!this.tls) {
      this.tls = path.join(this.dir, 'tls');
      execFileSync('bash', [path.join(ROOT, 'scripts/make-certs.sh'), this.tls], { stdio: 'ignore' });
    }
    this.ca = readFileSync(path.join(this.tls, 'ca.pem'));
    this.httpPort = await freePort();
    this.grpcPort = await freePort();
    this.url = `https://127.0.0.1:${this.httpPort}`;
    const boot = path.join(this.dir, 'admin.token');
    this.joinFile = path.join(this.dir, 'join.token');
    this.spawn('kilnd', [path.join(BIN, 'kilnd'), '--database-url', this.db.url,
      '--http-addr', `127.0.0.1:${this.httpPort}`, '--grpc-addr', `127.0.0.1:${this.grpcPort}`,
      '--tls-cert', path.join(this.tls, 'server.pem'), '--tls-key', path.join(this.tls, 'server.key'),
      '--tls-ca', path.join(this.tls, 'ca.pem'), '--bootstrap-token-file', boot, '--join-token-file', this.joinFile,
      '--artifact-dir', path.join(this.dir, 'artifacts')]);
    for (let i = 0; ; i++) {
      try { if ((await this.request('GET', '/readyz', null, null)).status === 200) break; } catch { /* not yet */ }
      if (i > 150) throw new Error(`kilnd did not become ready:\n${this.tail('kilnd')}`);
      await sleep(100);
    }
    this.adminToken = readFileSync(boot, 'utf8').trim();
    for (let i = 0; i < agents; i++) {
      const work = path.join(this.dir, `w${i}`);
      mkdirSync(work);
      this.spawn(`agent${i}`, [path.join(BIN, 'kiln-agent'), '--server', `127.0.0.1:${this.grpcPort}`,
        '--slots', String(slots), '--slot-type', 'cpu', '--work-dir', work, '--data-root', path.join(ROOT, 'data'),
        '--join-token-file', this.joinFile, '--tls-ca', path.join(this.tls, 'ca.pem'),
        '--tls-cert', path.join(this.tls, 'agent.pem'), '--tls-key', path.join(this.tls, 'agent.key'),
        // script jobs' Python: Debian's, which the agents' sandbox shows ranks
        '--cores', String(slots), '--python', '/usr/bin/python3']);
    }
    for (let i = 0; ; i++) {
      const w = await this.api('GET', '/v1/workers');
      if (w.body.workers.filter((x) => x.state === 'ALIVE').length === agents) break;
      if (i > 300) throw new Error(`agents did not register:\n${this.tail('agent0')}`);
      await sleep(100);
    }
    return this;
  }

  // Runs SQL on the cluster's database (tests that need time to have passed, say).
  sql(q) {
    return execFileSync(psql(), ['-qAt', '-h', this.db.host, '-p', this.db.port, '-U', 'postgres', '-d', this.db.name, '-c', q]).toString();
  }

  spawn(name, argv) {
    const log = path.join(this.dir, `${name}.log`);
    const fd = openSync(log, 'w');
    const p = spawn(argv[0], argv.slice(1), { stdio: ['ignore', fd, fd], env: { ...process.env, KILN_TOKEN: '' } });
    p.logName = name;
    this.procs.push(p);
    return p;
  }

  tail(name, n = 30) {
    try { return readFileSync(path.join(this.dir, `${name}.log`), 'utf8').split('\n').slice(-n).join('\n'); } catch { return ''; }
  }

  // One HTTPS request; token null sends none. Resolves {status, headers, body (parsed JSON or text)}.
  request(method, p, body, token = this.adminToken, extraHeaders = {}) {
    return new Promise((resolve, reject) => {
      const data = body === null || body === undefined ? null : typeof body === 'string' ? body : JSON.stringify(body);
      const headers = { Accept: 'application/json', ...extraHeaders };
      if (data !== null) headers['Content-Type'] = 'application/json';
      if (token) headers.Authorization = `Bearer ${token}`;
      const req = https.request(`${this.url}${p}`, { method, headers, ca: this.ca, timeout: 30000 }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          let parsed = text;
          try { parsed = JSON.parse(text); } catch { /* not JSON */ }
          resolve({ status: res.statusCode, headers: res.headers, body: parsed });
        });
      });
      req.on('error', reject);
      req.on('timeout', () => req.destroy(new Error(`${method} ${p} timed out`)));
      if (data !== null) req.write(data);
      req.end();
    });
  }

  async api(method, p, body = null, token = this.adminToken) {
    const r = await this.request(method, p, body, token);
    if (r.status >= 300) throw new Error(`${method} ${p} -> ${r.status} ${JSON.stringify(r.body)}`);
    return r;
  }

  // A user with a role in project "default" and a token of its own.
  async user(name, role) {
    await this.api('POST', '/v1/users', { name });
    if (role) await this.api('PUT', `/v1/projects/default/members/${name}`, { role });
    return (await this.api('POST', `/v1/users/${name}/tokens`, { description: 'ui test' })).body.token;
  }

  spec(name, { steps = 200, model = {}, nodes = 1, slots = 1, batch = 8, hp = {} } = {}) {
    return {
      name,
      model: { type: 'gpt', n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab: 'bytes', ...model },
      data: { train: path.join(ROOT, 'data/tinyshakespeare.txt'), val_fraction: 0.1 },
      hyperparameters: { lr: 3e-3, global_batch_size: batch, max_steps: steps, warmup_steps: 2, seed: 7,
                         eval_every: 0, sample_every: 0, ...hp },
      resources: { nodes, slots_per_node: slots, slot_type: 'cpu' },
      tags: { suite: 'ui' },
    };
  }

  async submit(spec, token = this.adminToken) {
    return (await this.api('POST', '/v1/jobs', spec, token)).body;
  }

  async waitJob(id, pred, ms = 120000) {
    const end = Date.now() + ms;
    for (;;) {
      const j = (await this.api('GET', `/v1/jobs/${id}`)).body;
      if (pred(j)) return j;
      if (Date.now() > end) throw new Error(`job ${id} did not get there: ${JSON.stringify({ state: j.state, reason: j.reason, progress: j.progress })}`);
      await sleep(200);
    }
  }

  async stop() {
    for (const p of this.procs.reverse()) {
      if (p.exitCode === null) {
        p.kill('SIGTERM');
        await Promise.race([new Promise((r) => p.once('exit', r)), sleep(10000)]);
        if (p.exitCode === null) p.kill('SIGKILL');
      }
    }
    this.procs = [];
  }

  cleanup(keep) {
    if (!keep) rmSync(this.dir, { recursive: true, force: true });
  }
}

// A fresh headless Chromium: Debian's, no sandbox (root), no GPU, no background traffic, its own
// profile directory. Pages trust the test CA's kilnd (the certificate is for 127.0.0.1).
export async function browser() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} is missing: scripts/install-deps.sh installs Debian's chromium`);
  }
  const profile = mkdtempSync(path.join(os.tmpdir(), 'kiln-chromium-'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
    ignoreHTTPSErrors: true,
    viewport: { width: 1400, height: 1000 },
    acceptDownloads: true,
  });
  ctx.profileDir = profile;
  const close = ctx.close.bind(ctx);
  ctx.close = async () => { await close(); rmSync(profile, { recursive: true, force: true }); };
  return ctx;
}

export { sleep };
