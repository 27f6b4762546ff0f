// ui.test.mjs - kiln's web UI in a real browser (Debian's Chromium through playwright-core)
// against a real kilnd, two real agents and PostgreSQL (cluster.mjs), with real training jobs.
// Every test saves a screenshot into the test output directory. Run by tests/run.sh as
// `node --test tests/ui/`; no test skips: a skipped one counts as failed there.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { BIN, browser as newBrowser, Cluster, OUT, ROOT, sleep } from './cluster.mjs';

let c;
let adminCtx;
const contexts = new Set();

// Every browser a test opens is closed at the end, also when the test fails half-way.
async function browser() {
  const ctx = await newBrowser();
  contexts.add(ctx);
  return ctx;
}

before(async () => { c = await new Cluster().start({ agents: 2, slots: 2 }); });
after(async () => {
  for (const ctx of contexts) await ctx.close().catch(() => {});
  if (c) { await c.stop(); c.cleanup(process.exitCode); }
});

async function shot(page, name) {
  await page.screenshot({ path: path.join(OUT, `${name}.png`), fullPage: true });
}

// A browser already logged in with token (pasting it on the login page, as a user would).
async function loggedIn(token) {
  const ctx = await browser();
  const page = ctx.pages()[0] || await ctx.newPage();
  page.on('pageerror', (e) => console.error(`page error: ${e.message}`));
  page.on('dialog', (d) => d.accept());
  await page.goto(`${c.url}/`);
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.waitForSelector('main[data-loaded="true"] table.jobs');
  return { ctx, page };
}

// A job that trains long enough to watch (about 10 ms a step), stopped by the test.
const slowSpec = (name, extra = {}) => c.spec(name, { steps: 200000, model: { n_embd: 64, seq_len: 64 }, ...extra });

describe('web UI', { concurrency: false }, () => {
  test('assets: served at / with their type, ETag, gzip, caching and a strict CSP', async () => {
    const r = await c.request('GET', '/', null, null, { 'Accept-Encoding': 'gzip' });
    assert.equal(r.status, 200);
    assert.match(r.headers['content-type'], /^text\/html/);
    assert.equal(r.headers['content-encoding'], 'gzip');
    assert.equal(r.headers['cache-control'], 'no-cache');
    const csp = r.headers['content-security-policy'];
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /script-src 'self'(;|$)/);
    assert.doesNotMatch(csp, /unsafe/);
    assert.equal(r.headers['x-content-type-options'], 'nosniff');
    const again = await c.request('GET', '/', null, null, { 'Accept-Encoding': 'gzip', 'If-None-Match': r.headers.etag });
    assert.equal(again.status, 304);
    const plain = await c.request('GET', '/', null, null);
    assert.equal(plain.headers['content-encoding'], undefined);
    const js = /src="\/ui\/(app-[A-Z0-9]+\.js)"/.exec(plain.body);
    assert.ok(js, 'index.html names the script');
    const a = await c.request('GET', `/ui/${js[1]}`, null, null);
    assert.equal(a.status, 200);
    assert.match(a.headers['content-type'], /^text\/javascript/);
    assert.match(a.headers['cache-control'], /immutable/);
    const missing = await c.request('GET', '/ui/nope.js', null, null);
    assert.equal(missing.status, 404);
    assert.equal(missing.body.code, 'not_found');
    const ctx = await browser();
    const page = await ctx.newPage();
    const violations = [];
    page.on('console', (m) => { if (/Content Security Policy/.test(m.text())) violations.push(m.text()); });
    await page.goto(`${c.url}/`);
    await page.waitForSelector('#token');
    await shot(page, 'assets-login-page');
    assert.deepEqual(violations, [], 'the page breaks its own CSP');
    await ctx.close();
  });

  test('log in: a bad token is refused on the page, a good one opens the jobs', async () => {
    const ctx = await browser();
    const page = await ctx.newPage();
    await page.goto(`${c.url}/#/workers`);
    await page.getByLabel('API token').fill('kiln_not-a-real-token');
    await page.getByRole('button', { name: 'Log in' }).click();
    await page.waitForSelector('#login-error:not([hidden])');
    assert.match(await page.textContent('#login-error'), /not valid/);
    await page.getByLabel('API token').fill(c.adminToken);
    await page.getByRole('button', { name: 'Log in' }).click();
    // back where the user was headed, and the header says who is logged in
    await page.waitForSelector('main[data-loaded="true"] table.workers');
    assert.match(await page.textContent('#who'), /admin/);
    assert.doesNotMatch(page.url(), /kiln_/);
    await shot(page, 'login-workers');
    // a reload stays logged in; Log out forgets the token
    await page.reload();
    await page.waitForSelector('table.workers');
    await page.getByRole('button', { name: 'Log out' }).click();
    await page.waitForSelector('#token');
    assert.equal(await page.evaluate(() => localStorage.getItem('kiln.token')), null);
    adminCtx = (await loggedIn(c.adminToken)).ctx;
    await ctx.close();
  });

  test('kiln ui: a one-time link opens logged in, leaves no code in the URL or history, works once', async () => {
    // the CLI makes the link (--print: no browser to open here)
    const url = execFileSync(path.join(BIN, 'kiln'), ['ui', '--print'], { env: { ...process.env,
      KILN_URL: c.url, KILN_TOKEN: c.adminToken, KILN_TLS_CA: path.join(c.tls, 'ca.pem'), XDG_CONFIG_HOME: c.dir,
      DISPLAY: '' } }).toString().trim();
    const m = /^https:\/\/127\.0\.0\.1:\d+\/#login=(kiln_login_[A-Za-z0-9_-]+)$/.exec(url);
    assert.ok(m, 'kiln ui --print prints the link');
    const link = { code: m[1] };
    const ctx = await browser();
    const page = await ctx.newPage();
    await page.goto(url);
    await page.waitForSelector('main[data-loaded="true"] table.jobs');
    assert.doesNotMatch(page.url(), /login=/);
    // the entry the link made holds no code any more: back (the blank page) and forward again
    await page.goBack();
    await page.goForward();
    assert.doesNotMatch(page.url(), /login=/);
    await page.waitForSelector('main[data-loaded="true"] table.jobs');
    const token = await page.evaluate(() => localStorage.getItem('kiln.token'));
    assert.ok(token && token !== c.adminToken, 'the browser got a token of its own');
    await shot(page, 'login-link');
    // the same link again: refused, saying why
    const again = await c.request('POST', '/v1/login-links:redeem', { code: link.code }, null);
    assert.equal(again.status, 401);
    assert.match(again.body.message, /already used/);
    // the browser's token is listed as the user's and dies at log out
    const id = await page.evaluate(() => localStorage.getItem('kiln.token_id'));
    await page.getByRole('button', { name: 'Log out' }).click();
    await page.waitForSelector('#token');
    const toks = (await c.api('GET', '/v1/users/admin/tokens')).body.tokens;
    assert.ok(toks.find((t) => t.id === id)?.revoked_at, 'log out revokes the link\'s token');
    // an expired link, and one whose asking token was revoked, are refused too
    const late = (await c.api('POST', '/v1/login-links', {})).body;
    c.sql("UPDATE login_links SET expires_at = now() - interval '1 second' WHERE used_at IS NULL");
    const r2 = await c.request('POST', '/v1/login-links:redeem', { code: late.code }, null);
    assert.equal(r2.status, 401);
    assert.match(r2.body.message, /expired/);
    const t = (await c.api('POST', '/v1/users/admin/tokens', { description: 'short' })).body;
    const l3 = (await c.api('POST', '/v1/login-links', {}, t.token)).body;
    await c.api('DELETE', `/v1/tokens/${t.id}`);
    const r3 = await c.request('POST', '/v1/login-links:redeem', { code: l3.code }, null);
    assert.equal(r3.status, 401);
    assert.match(r3.body.message, /revoked or has expired/);
    const bad = await c.request('POST', '/v1/login-links:redeem', { code: 'kiln_login_guess' }, null);
    assert.equal(bad.status, 401);
    assert.equal((await c.request('POST', '/v1/login-links', { ttl: 5 })).status, 400);
    await ctx.close();
  });

  test('live job: the chart gains points and the logs follow; events, spec and resources show', async () => {
    const job = await c.submit(slowSpec('ui-live'));
    await c.waitJob(job.id, (j) => j.state === 'RUNNING' && (j.progress?.step || 0) > 5);
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    await page.waitForSelector('figure.chart[data-ready="true"]');
    const loss = page.locator('figure.chart[data-metrics="train_loss,val_loss"]');
    const step0 = Number(await loss.getAttribute('data-last-step'));
    await page.waitForFunction((s) => Number(document.querySelector('figure.chart[data-metrics="train_loss,val_loss"]').dataset.lastStep) > s + 20, step0, { timeout: 30000 });
    const points = Number(await loss.getAttribute('data-points'));
    assert.ok(points > 20, `the loss chart has ${points} points`);
    for (const m of ['lr', 'tokens_per_s', 'mfu']) assert.equal(await page.locator(`figure.chart[data-metrics="${m}"]`).count(), 1, `a ${m} chart`);
    // the logs follow: lines keep arriving and the newest is in view
    const logs = page.locator('.logs');
    const n0 = Number(await logs.getAttribute('data-lines'));
    await page.waitForFunction((n) => Number(document.querySelector('.logs').dataset.lines) > n + 20, n0, { timeout: 30000 });
    assert.ok(await page.isChecked('#log-follow'));
    const atBottom = await page.evaluate(() => { const b = document.querySelector('.logs'); return b.scrollHeight - b.scrollTop - b.clientHeight < 40; });
    assert.ok(atBottom, 'following keeps the newest line in view');
    // pause, then search the lines
    await page.uncheck('#log-follow');
    await page.fill('#log-search', 'step 3/');
    await page.waitForFunction(() => document.querySelectorAll('.logs .line mark').length >= 1);
    // rank filter: rank 0 only (the job has one rank)
    await page.selectOption('#log-rank', '0');
    await page.fill('#log-search', '');
    await page.waitForFunction(() => Number(document.querySelector('.logs').dataset.lines) > 0);
    assert.match(await page.textContent('#events'), /RUNNING/);
    assert.match(await page.textContent('dl.summary'), /1 node × 1 cpu slot/);
    assert.match(await page.textContent('pre.spec'), /"max_steps": 200000/);
    assert.match(await page.textContent('table.kv'), /warmup_steps/);
    await shot(page, 'live-job');
    await c.api('POST', `/v1/jobs/${job.id}:stop`, {});
    await page.waitForSelector('main[data-state="STOPPED"]', { timeout: 60000 });
    await page.waitForSelector('.logs[data-ended="true"]', { timeout: 30000 });
    await page.close();
  });

  test('zoom: dragging across a chart fetches the range in detail', async () => {
    const job = await c.submit(c.spec('ui-zoom', { steps: 1500 }));
    await c.waitJob(job.id, (j) => j.state === 'COMPLETED');
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    const chart = page.locator('figure.chart[data-metrics="lr"]');
    await page.waitForSelector('figure.chart[data-metrics="lr"][data-ready="true"]');
    const full = Number(await chart.getAttribute('data-points'));
    assert.ok(full <= 1000 && full > 500, `the whole history is downsampled (${full} points)`);
    const box = await chart.locator('.u-over').boundingBox();
    const fetched = page.waitForResponse((r) => /\/metrics\?name=lr&start_step=\d+&end_step=\d+/.test(r.url()));
    await page.mouse.move(box.x + box.width * 0.4, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 5 });
    await page.mouse.up();
    assert.equal((await fetched).status(), 200);
    await page.waitForFunction(() => {
      const el = document.querySelector('figure.chart[data-metrics="lr"]');
      const [lo, hi] = (el.dataset.zoomed || '0-0').split('-').map(Number);
      return hi > lo && Number(el.dataset.points) >= hi - lo - 1;
    });
    await shot(page, 'zoom');
    await chart.locator('.u-over').dblclick();
    await page.waitForFunction((n) => document.querySelector('figure.chart[data-metrics="lr"]').dataset.points === String(n), full);
    await page.close();
  });

  test('search: a bad filter shows the error at its caret, a good one finds the job', async () => {
    const a = await c.submit(c.spec('ui-search-small', { steps: 5, hp: { lr: 1e-4 } }));
    await c.submit(c.spec('ui-search-big', { steps: 5, hp: { lr: 5e-3 } }));
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs`);
    await page.waitForSelector('main[data-loaded="true"]');
    await page.fill('#filter', 'hp.lr < AND name ~ "ui-search"');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.waitForSelector('#filter-error:not([hidden]) pre.caret');
    assert.match(await page.textContent('#filter-error pre.caret'), /\^/);
    assert.equal(await page.getAttribute('#filter', 'aria-invalid'), 'true');
    const caret = await page.evaluate(() => document.getElementById('filter').selectionStart);
    assert.ok(caret >= 7 && caret <= 9, `the caret is put where the error is (at ${caret})`);
    await shot(page, 'search-error');
    await page.fill('#filter', 'hp.lr < 1e-3 AND name ~ "ui-search"');
    await page.fill('#columns', 'hp.lr');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.waitForFunction(() => document.getElementById('filter-error').hidden);
    await page.waitForFunction((id) => {
      const rows = [...document.querySelectorAll('table.jobs tbody tr[data-id]')];
      return rows.length === 1 && rows[0].dataset.id === id;
    }, a.id);
    assert.match(page.url(), /filter=hp\.lr/, 'the search is in the URL');
    await shot(page, 'search-good');
    await page.close();
  });

  test('compare: two jobs selected in the table, a chart per chosen metric, a scatter, only differing settings', async () => {
    const a = await c.submit(c.spec('ui-cmp-a', { steps: 40, hp: { lr: 2e-3 } }));
    const b = await c.submit(c.spec('ui-cmp-b', { steps: 40, hp: { lr: 4e-3 } }));
    const done = await c.waitJob(a.id, (j) => j.state === 'COMPLETED');
    await c.waitJob(b.id, (j) => j.state === 'COMPLETED');
    const losses = ['train_loss', 'val_loss'].filter((n) => n in done.metrics);
    assert.ok(losses.includes('train_loss'));
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs`);
    await page.waitForSelector(`tr[data-id="${b.id}"]`);
    await page.getByLabel('Select ui-cmp-a').check();
    await page.getByLabel('Select ui-cmp-b').check();
    await page.getByRole('button', { name: /Compare selected \(2\)/ }).click();
    await page.waitForSelector('main[data-ready="true"]');
    assert.match(page.url(), new RegExp(`ids=(${a.id},${b.id}|${b.id},${a.id})`));
    // the losses are charted by default, one chart each, both jobs in each
    const captions = () => page.$$eval('#compare-charts figure.chart figcaption', (els) => els.map((e) => e.textContent));
    assert.deepEqual(await captions(), losses);
    assert.match(await page.textContent('#compare-charts'), /ui-cmp-a[\s\S]*ui-cmp-b|ui-cmp-b[\s\S]*ui-cmp-a/);
    // a second metric: a second chart beside the first, kept in the URL
    await page.check('#metric-lr');
    await page.waitForFunction((n) => document.querySelectorAll('#compare-charts figure.chart[data-ready="true"]').length === n, losses.length + 1);
    assert.deepEqual(await captions(), [...losses, 'lr']);
    await page.waitForFunction((want) => new URLSearchParams(location.hash.split('?')[1]).get('metrics') === want, [...losses, 'lr'].join(','));
    // only the settings that differ, by default; the metrics stay
    assert.equal(await page.isChecked('#only-diff'), true);
    assert.equal(await page.locator('tr.diff[data-field="hp.lr"]').count(), 1);
    assert.match(await page.textContent('tr[data-field="hp.lr"] th'), /≠/);
    assert.equal(await page.locator('tr[data-field="hp.seed"]').count(), 0);
    assert.equal(await page.locator('tr[data-field="metrics.train_loss.last"]').count(), 1);
    await page.uncheck('#only-diff');
    assert.equal(await page.locator('tr[data-field="hp.seed"]').count(), 1);
    await page.waitForFunction(() => /rows=all/.test(location.hash));
    // the scatter: the one hyperparameter that differs against the loss, a point a job
    assert.equal(await page.inputValue('#scatter-x'), 'hp.lr');
    assert.equal(await page.locator('#compare-scatter figure.scatter[data-points="2"]').count(), 1);
    await shot(page, 'compare');
    // the URL brings the same view back
    const again = await adminCtx.newPage();
    await again.goto(page.url());
    await again.waitForSelector('main[data-ready="true"]');
    assert.deepEqual(await again.$$eval('#compare-charts figure.chart figcaption', (els) => els.map((e) => e.textContent)), [...losses, 'lr']);
    assert.equal(await again.isChecked('#only-diff'), false);
    await again.close();
    await page.close();
  });

  test('dark mode follows the browser; at 390 px the filter and actions stay reachable; "/" focuses the filter', async () => {
    const page = await adminCtx.newPage();
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.goto(`${c.url}/#/jobs`);
    await page.waitForSelector('main[data-loaded="true"] table.jobs tbody tr[data-id]');
    const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    assert.equal(await bg(), 'rgb(13, 17, 23)');
    await shot(page, 'jobs-dark');
    await page.emulateMedia({ colorScheme: 'light' });
    assert.equal(await bg(), 'rgb(246, 248, 250)');
    // a phone's width: no page-wide sideways scroll; the table scrolls in its card
    await page.setViewportSize({ width: 390, height: 844 });
    await page.reload();
    await page.waitForSelector('main[data-loaded="true"] table.jobs tbody tr[data-id]');
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390),
      `the page is wider than the screen: ${await page.evaluate(() => document.documentElement.scrollWidth)} px`);
    for (const sel of ['#filter', 'button[type="submit"]', '.toolbar button']) {
      const box = await page.locator(sel).first().boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `${sel} is off screen at 390 px: ${JSON.stringify(box)}`);
    }
    const wrap = page.locator('main .table-wrap').first();
    assert.ok(await wrap.evaluate((el) => el.scrollWidth > el.clientWidth && getComputedStyle(el).overflowX === 'auto'),
      'the jobs table should scroll inside its card');
    await shot(page, 'jobs-390px');
    // "/" from anywhere but a field focuses the filter
    await page.locator('h1').first().click();
    await page.keyboard.press('/');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'filter');
    assert.equal(await page.inputValue('#filter'), '', 'the "/" that focuses the filter is not typed into it');
    await page.close();
  });

  test('stop: an editor stops a running job from its page', async () => {
    const token = await c.user('eddie', 'editor');
    const job = await c.submit(slowSpec('ui-stop'), token);
    await c.waitJob(job.id, (j) => j.state === 'RUNNING');
    const { ctx, page } = await loggedIn(token);
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    await page.getByRole('button', { name: 'Stop job' }).click();
    await page.waitForSelector('main[data-state="STOPPING"], main[data-state="STOPPED"]');
    const j = await c.waitJob(job.id, (x) => x.state === 'STOPPED', 60000);
    assert.equal(j.state, 'STOPPED');
    await page.waitForSelector('main[data-state="STOPPED"]', { timeout: 30000 });
    assert.equal(await page.locator('#stop').count(), 0, 'no Stop for a stopped job');
    const ev = (await c.api('GET', `/v1/jobs/${job.id}/events`)).body.events;
    assert.ok(ev.some((e) => e.actor === 'eddie'), 'the stop is recorded as the editor\'s');
    await shot(page, 'stop-editor');
    await ctx.close();
  });

  test('viewer: the job page offers no Stop', async () => {
    const token = await c.user('vera', 'viewer');
    const job = await c.submit(slowSpec('ui-viewer'));
    await c.waitJob(job.id, (j) => j.state === 'RUNNING');
    const { ctx, page } = await loggedIn(token);
    assert.match(await page.textContent('#who'), /vera.*default: viewer/);
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    await page.waitForSelector('main[data-state="RUNNING"] figure.chart[data-ready="true"]');
    assert.equal(await page.locator('#stop').count(), 0);
    assert.equal(await page.getByRole('button', { name: /stop/i }).count(), 0);
    assert.equal(await page.locator('#clone-open').count(), 0, 'a viewer may not submit: no Clone and edit');
    await shot(page, 'viewer-no-stop');
    await c.api('POST', `/v1/jobs/${job.id}:stop`, {});
    await ctx.close();
  });

  test('script job: its page shows the entry point, the source digest, channels and hyperparameters; its log shows control characters escaped', async () => {
    const dir = mkdtempSync(path.join(c.dir, 'code-'));
    // a line that would read "invoice exe.txt done" reordered by its override and clear the screen
    writeFileSync(path.join(dir, 'train.py'), 'print("hello from a script job")\nprint("invoice \\u202etxt.exe \\x1b[2J done")\n');
    const out = execFileSync(path.join(BIN, 'kiln'), ['code', 'push', dir], { env: { ...process.env,
      KILN_URL: c.url, KILN_TOKEN: c.adminToken, KILN_TLS_CA: path.join(c.tls, 'ca.pem'), XDG_CONFIG_HOME: c.dir } }).toString();
    const source = /code:sha256:[0-9a-f]{64}/.exec(out)?.[0];
    assert.ok(source, `kiln code push printed the source: ${out}`);
    const data = path.join(ROOT, 'data');
    const r = await c.api('POST', '/v1/jobs', { name: 'ui-script', entry_point: 'train.py', source,
      hyperparameters: { epochs: 3, 'batch-size': 64, model: { depth: 4 } },
      data: { channels: { train: data, validation: data } },
      resources: { nodes: 1, slots_per_node: 1, slot_type: 'cpu' }, tags: { suite: 'ui' } });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    const job = r.body;
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    await page.waitForSelector('#entry-point');
    assert.equal(await page.textContent('#entry-point'), 'train.py');
    assert.equal(await page.textContent('#source'), `${source.slice(0, 'code:sha256:'.length + 12)}…`);
    assert.equal(await page.getAttribute('#source', 'title'), source, 'the whole digest on hover');
    const summary = await page.textContent('dl.summary');
    assert.match(summary, /uploaded code/);
    assert.match(summary, /Channels\s*train .*validation /);
    assert.equal(await page.locator('#model').count(), 0);
    const hp = await page.textContent('table.kv[aria-label="Hyperparameters"]');
    assert.match(hp, /batch-size\s*64/);
    assert.match(hp, /epochs\s*3/);
    assert.match(hp, /model\s*\{"depth":4\}/);
    await shot(page, 'script-job');
    // an engine job says which model it trains
    const engine = await c.submit(c.spec('ui-engine-kind', { steps: 3 }));
    await page.goto(`${c.url}/#/jobs/${engine.id}`);
    await page.waitForSelector('#model');
    assert.equal(await page.textContent('#model'), 'gpt');
    assert.equal(await page.locator('#entry-point').count(), 0);
    // its log, once it has ended: the override and the escape sequence show as the CLI prints them
    await c.waitJob(job.id, (j) => ['COMPLETED', 'FAILED', 'STOPPED'].includes(j.state));
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    await page.waitForSelector('.logs[data-ended="true"]', { timeout: 30000 });
    const shown = await page.textContent('.logs');
    assert.ok(shown.includes('invoice \\u202etxt.exe \\u001b[2J done'), shown);
    assert.ok(!/[\u001b\u202e]/.test(shown), 'no control character reaches the page');
    await page.close();
  });

  test('clone and edit: the spec opens in an editor; bad edits are explained, a good one is a new job', async () => {
    const job = await c.submit(c.spec('ui-clone-src', { steps: 5 }));
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    await page.getByRole('button', { name: 'Clone and edit' }).click();
    const area = page.locator('#clone-spec');
    await area.waitFor();
    assert.ok(await area.evaluate((el) => el === document.activeElement), 'the editor has the focus');
    const spec = JSON.parse(await area.inputValue());
    assert.equal(spec.name, 'ui-clone-src');
    assert.equal(spec.hyperparameters.max_steps, 5);
    const jobsBefore = (await c.api('GET', '/v1/jobs?page_size=500')).body.jobs.length;
    // not JSON: said here, nothing sent
    await area.fill('{"name": ');
    await page.getByRole('button', { name: 'Submit copy' }).click();
    await page.waitForSelector('#clone-error:not([hidden])');
    assert.match(await page.textContent('#clone-error'), /Not JSON/);
    // refused by kilnd: its message names the field, and the text stays as edited
    spec.hyperparameters.lr = -1;
    await area.fill(JSON.stringify(spec, null, 2));
    await page.getByRole('button', { name: 'Submit copy' }).click();
    await page.waitForFunction(() => /kilnd refused the spec.*hyperparameters\.lr/s.test(document.getElementById('clone-error').textContent));
    assert.equal(await page.getAttribute('#clone-spec', 'aria-invalid'), 'true');
    assert.equal(JSON.parse(await area.inputValue()).hyperparameters.lr, -1);
    assert.equal((await c.api('GET', '/v1/jobs?page_size=500')).body.jobs.length, jobsBefore, 'nothing was submitted');
    await shot(page, 'clone-refused');
    // a good edit: a new job with the edits, and the page opens it
    spec.hyperparameters.lr = 1e-3;
    spec.hyperparameters.max_steps = 7;
    spec.name = 'ui-clone-copy';
    await area.fill(JSON.stringify(spec, null, 2));
    await page.getByRole('button', { name: 'Submit copy' }).click();
    await page.waitForFunction((id) => /^#\/jobs\/[0-9a-f-]{36}$/.test(location.hash) && !location.hash.includes(id), job.id);
    const copyId = page.url().split('/').pop();
    await page.waitForFunction(() => document.querySelector('h1')?.textContent === 'ui-clone-copy');
    const copy = (await c.api('GET', `/v1/jobs/${copyId}`)).body;
    assert.equal(copy.name, 'ui-clone-copy');
    assert.equal(copy.spec.hyperparameters.lr, 1e-3);
    assert.equal(copy.spec.hyperparameters.max_steps, 7);
    const orig = (await c.api('GET', `/v1/jobs/${job.id}`)).body;
    assert.deepEqual(copy.spec.model, orig.spec.model);
    assert.equal(orig.spec.hyperparameters.max_steps, 5, 'the original is unchanged');
    await shot(page, 'clone-submitted');
    await page.close();
  });

  test('workers: hosts, slots, state and the jobs on each', async () => {
    const job = await c.submit(slowSpec('ui-on-worker'));
    const running = await c.waitJob(job.id, (j) => j.state === 'RUNNING' && (j.workers || []).length === 1);
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/workers`);
    await page.waitForSelector('main[data-loaded="true"]');
    assert.equal(await page.locator('table.workers tbody tr[data-id]').count(), 2);
    const row = page.locator(`tr[data-id="${running.workers[0]}"]`);
    await page.waitForFunction((id) => /ui-on-worker/.test(document.querySelector(`tr[data-id="${id}"]`)?.textContent || ''), running.workers[0]);
    assert.match(await row.textContent(), /ALIVE/);
    assert.match(await row.textContent(), /cpu/);
    await shot(page, 'workers');
    await c.api('POST', `/v1/jobs/${job.id}:stop`, {});
    await page.close();
  });

  test('queues: an admin creates, edits and deletes a queue; a viewer sees them without edit controls; each project\'s default queue is shown', async () => {
    const page = await adminCtx.newPage();
    page.on('dialog', (d) => d.accept());
    await page.goto(`${c.url}/#/queues`);
    await page.waitForSelector('main[data-loaded="true"] table.queues tr[data-name="default"]');
    assert.match(await page.textContent('tr[data-name="default"] td.quota'), /no limit/);
    // create: the form's fields become the queue; the URL names it
    await page.getByRole('button', { name: 'New queue' }).click();
    await page.waitForFunction(() => /new=1/.test(location.hash));
    await page.fill('#q-name', 'ui-team');
    await page.fill('#q-cohort', 'ui-cohort');
    await page.fill('#q-quota-cpu', '3');
    await page.fill('#q-borrow-cpu', '1');
    await page.getByRole('button', { name: 'Create' }).click();
    await page.waitForSelector('tr[data-name="ui-team"].selected');
    await page.waitForFunction(() => /name=ui-team/.test(location.hash) && !/new=1/.test(location.hash));
    let q = (await c.api('GET', '/v1/queues/ui-team')).body;
    assert.equal(q.cohort, 'ui-cohort');
    assert.deepEqual(q.quota, { cpu: 3, gpu: 0 });
    assert.deepEqual(q.borrowing_limit, { cpu: 1 });
    assert.deepEqual(q.projects, ['*']);
    const row = page.locator('tr[data-name="ui-team"]');
    assert.match(await row.locator('td.quota').textContent(), /cpu 3, gpu 0/);
    assert.equal(await row.locator('td.pending').textContent(), '0');
    // a refusal is shown with kilnd's message and field; nothing changes
    await page.fill('#q-weight', '0');
    await page.getByRole('button', { name: 'Save' }).click();
    await page.waitForSelector('#queue-error:not([hidden])');
    assert.match(await page.textContent('#queue-error'), /weight: weight must be a number above 0/);
    // edit: the weight and the quota change
    await page.fill('#q-weight', '2.5');
    await page.fill('#q-quota-cpu', '4');
    await page.getByRole('button', { name: 'Save' }).click();
    await page.waitForFunction(() => document.querySelector('tr[data-name="ui-team"] td.weight')?.textContent === '2.5');
    q = (await c.api('GET', '/v1/queues/ui-team')).body;
    assert.equal(q.weight, 2.5);
    assert.equal(q.quota.cpu, 4);
    assert.equal(q.cohort, 'ui-cohort', 'what the form did not change stays');
    // the preemption policy: shown in the table (the defaults), changed with the form's selects
    assert.match(await row.locator('td.preemption').textContent(), /within queue: lower_priority; reclaim: any/);
    await page.selectOption('#q-within', 'never');
    await page.selectOption('#q-reclaim', 'lower_priority');
    await page.getByRole('button', { name: 'Save' }).click();
    await page.waitForFunction(() => /within queue: never; reclaim: lower_priority/.test(document.querySelector('tr[data-name="ui-team"] td.preemption')?.textContent || ''));
    q = (await c.api('GET', '/v1/queues/ui-team')).body;
    assert.deepEqual(q.preemption, { within_queue: 'never', reclaim_within_cohort: 'lower_priority' });
    assert.equal(await page.inputValue('#q-within'), 'never', 'the form shows what was saved');
    // a project whose jobs that name no queue go to ui-team
    assert.equal((await c.api('POST', '/v1/projects', { name: 'ui-dq', default_queue: 'ui-team' })).status, 201);
    // the selection survives a reload (it is in the URL) and opens the edit form again
    await page.reload();
    await page.waitForSelector('#queue-form h2');
    assert.equal(await page.textContent('#queue-form h2'), 'Edit queue ui-team');
    assert.equal(await page.inputValue('#q-quota-cpu'), '4');
    // the projects' default queues: an admin sees every project's
    await page.waitForSelector('table.projects tr[data-project="ui-dq"]');
    assert.equal(await page.textContent('tr[data-project="ui-dq"] td.default-queue'), 'ui-team');
    assert.equal(await page.textContent('tr[data-project="default"] td.default-queue'), 'default');
    assert.match(await page.getAttribute('tr[data-project="ui-dq"] td.default-queue a', 'href'), /#\/queues\?name=ui-team$/);
    await shot(page, 'queues-admin');
    // a queue open only to a project the viewer below is not a member of
    assert.equal((await c.api('POST', '/v1/queues', { name: 'ui-closed', quota: { cpu: 1 }, projects: ['ui-dq'] })).status, 201);
    // a viewer reads the queues and gets no edit controls
    const token = await c.user('quinn', 'viewer');
    const v = await loggedIn(token);
    await v.page.goto(`${c.url}/#/queues?name=ui-team`);
    await v.page.waitForSelector('main[data-loaded="true"] tr[data-name="ui-team"]');
    assert.equal(await v.page.locator('#queue-new').count(), 0);
    assert.equal(await v.page.locator('table.queues button').count(), 0);
    assert.equal(await v.page.locator('#queue-form').count(), 0);
    // a viewer sees the default queues of its own projects only
    await v.page.waitForSelector('table.projects tr[data-project="default"]');
    assert.equal(await v.page.textContent('tr[data-project="default"] td.default-queue'), 'default');
    assert.equal(await v.page.locator('tr[data-project="ui-dq"]').count(), 0);
    // and of a queue's projects only its own: kilnd leaves the others out
    assert.equal(await v.page.textContent('tr[data-name="ui-closed"] td.projects'), 'none of yours');
    assert.equal(await v.page.textContent('tr[data-name="ui-team"] td.projects'), '*');
    await shot(v.page, 'queues-viewer');
    await v.ctx.close();
    assert.equal((await c.api('DELETE', '/v1/queues/ui-closed')).status, 200);
    // a project's default queue stays: the refusal says which project and what to do
    await page.getByRole('button', { name: 'Delete queue ui-team' }).click();
    await page.waitForFunction(() => /is the default queue of project "ui-dq"/.test(document.querySelector('#queue-notice')?.textContent || ''));
    assert.match(await page.textContent('#queue-notice'), /kiln projects update ui-dq --default-queue QUEUE/);
    assert.equal(await page.locator('tr[data-name="ui-team"]').count(), 1);
    assert.equal((await c.api('PATCH', '/v1/projects/ui-dq', { default_queue: null })).body.default_queue, 'default');
    // delete (confirmed): gone from the table and from kilnd
    await page.getByRole('button', { name: 'Delete queue ui-team' }).click();
    await page.waitForFunction(() => !document.querySelector('tr[data-name="ui-team"]'));
    assert.equal(await page.textContent('#queue-notice'), 'Queue ui-team deleted.');
    assert.equal((await c.request('GET', '/v1/queues/ui-team')).status, 404);
    assert.doesNotMatch(page.url(), /name=ui-team/);
    await page.close();
  });

  test('pending: a job waiting for its queue\'s quota says why on its page, and stops saying once placed', async () => {
    assert.equal((await c.api('POST', '/v1/queues', { name: 'ui-one', quota: { cpu: 1 } })).status, 201);
    const first = await c.submit({ ...slowSpec('ui-first'), queue: 'ui-one' });
    await c.waitJob(first.id, (j) => j.state === 'RUNNING');
    const second = await c.submit({ ...c.spec('ui-second', { steps: 5 }), queue: 'ui-one' });
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs/${second.id}`);
    await page.waitForSelector('#pending');
    assert.match(await page.textContent('#pending-missing'), /needs 1 cpu slot\(s\) on 1 worker\(s\); queue ui-one: quota 1, used 1/);
    // the heading says what it waits for; the details are the box's, not said twice
    assert.equal(await page.textContent('#reason'), 'waiting for quota');
    const text = await page.textContent('#pending');
    assert.match(text, /Position\s*1 in queue ui-one/);
    assert.equal(await page.getAttribute('#pending a.blocking', 'href'), `#/jobs/${first.id}`);
    assert.match(await page.textContent('#pending-start'), /unknown|\d{4}-\d\d-\d\d/);
    await shot(page, 'pending');
    // the first job stops: the second is placed and the box goes away
    await c.api('POST', `/v1/jobs/${first.id}:stop`, {});
    await page.waitForSelector('#pending', { state: 'detached', timeout: 60000 });
    await c.waitJob(second.id, (j) => j.state === 'COMPLETED' || j.state === 'FAILED' || j.state === 'RUNNING');
    await page.close();
  });

  test('artifacts: a finished job\'s file downloads from its page', async () => {
    const job = await c.submit(c.spec('ui-artifact', { steps: 10 }));
    await c.waitJob(job.id, (j) => j.state === 'COMPLETED');
    // the agent uploads rank 0's output before it reports the exit: a COMPLETED job has them
    const list = (await c.api('GET', `/v1/jobs/${job.id}/artifacts`)).body.artifacts;
    assert.ok(list.length > 0, 'the job has artifacts');
    const name = list[0].name;
    const page = await adminCtx.newPage();
    await page.goto(`${c.url}/#/jobs/${job.id}`);
    const btn = page.locator(`button[data-artifact="${name}"]`);
    await btn.waitFor();
    const [dl] = await Promise.all([page.waitForEvent('download'), btn.click()]);
    const file = await dl.path();
    const want = await c.request('GET', `/v1/jobs/${job.id}/artifacts/${encodeURIComponent(name)}`);
    assert.equal(readFileSync(file).length, list[0].size);
    if (typeof want.body === 'string') assert.equal(readFileSync(file, 'utf8'), want.body);
    await shot(page, 'artifact');
    await page.close();
  });

  test('tuning: the list, a search\'s page (best trial, trials, charts, parallel coordinates), Stop for editors only', async () => {
    const errors = [];
    const watch = (page) => {
      page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
      page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
    };
    const search = (name, job, extra = {}) => ({
      name, job, objective: { metric: 'val_loss', goal: 'minimize' }, strategy: 'random', seed: 5,
      parameters: { lr: { type: 'continuous', min: 1e-3, max: 1e-2, scaling: 'log' },
                    warmup_steps: { type: 'integer', min: 0, max: 5 } },
      ...extra,
    });
    // a search of three tiny trials, watched live from its page while it runs
    const sweep = (await c.api('POST', '/v1/tuning-jobs', search('ui-sweep', c.spec('ui-trial', { steps: 20 }),
      { max_jobs: 3, max_parallel_jobs: 3 }))).body;
    // and one whose only trial trains until stopped: Stop is offered while it runs
    const slow = (await c.api('POST', '/v1/tuning-jobs', search('ui-slow-search', slowSpec('ui-slow-trial'),
      { max_jobs: 1, max_parallel_jobs: 1 }))).body;
    const { ctx, page } = await loggedIn(c.adminToken);
    watch(page);
    await page.goto(`${c.url}/#/tuning/${sweep.id}`);
    await page.waitForSelector('main[data-ready="true"] #trials');
    await page.waitForSelector('main[data-state="COMPLETED"]', { timeout: 120000 });
    const done = (await c.api('GET', `/v1/tuning-jobs/${sweep.id}`)).body;
    assert.equal(done.trials.length, 3);
    assert.ok(done.best, 'the search has a best trial');
    // the trials table: a column a parameter, a row a trial linked to its job, the best marked
    await page.waitForFunction(() => document.querySelectorAll('#trials tbody tr[data-state="COMPLETED"]').length === 3);
    const headers = await page.$$eval('#trials thead th', (els) => els.map((e) => e.textContent.replace(/[▲▼]/g, '').trim()));
    for (const hd of ['Trial', 'lr', 'warmup_steps', 'val_loss', 'Steps', 'Rung', 'State', 'Job']) assert.ok(headers.includes(hd), `no ${hd} column: ${headers}`);
    for (const tr of done.trials) {
      assert.equal(await page.locator(`#trials tr[data-job="${tr.job_id}"] a[href="#/jobs/${tr.job_id}"]`).count(), 2, 'a trial links to its job');
    }
    assert.equal(await page.getAttribute('#trials tr.best', 'data-job'), done.best.job_id);
    // the best trial so far, linked to its job, with its objective and parameters
    assert.equal(await page.getAttribute('#best-link', 'href'), `#/jobs/${done.best.job_id}`);
    assert.equal(Number(await page.textContent('#best-objective')), Number(done.best.objective.toPrecision(5)));
    assert.match(await page.textContent('#best'), /lr[\s\S]*warmup_steps/);
    // both objective charts (a dot a trial) and the parallel coordinates (a line a trial)
    await page.waitForSelector('#chart-by-trial[data-ready="true"][data-points="3"]');
    await page.waitForSelector('#chart-by-steps[data-ready="true"][data-points="3"]');
    await page.waitForSelector('#parallel[data-ready="true"][data-lines="3"]');
    assert.equal(await page.getAttribute('#parallel', 'data-axes'), 'lr,warmup_steps,val_loss');
    assert.equal(await page.locator('#parallel canvas').count(), 1);
    // hovering a line names its trial: down the middle axis until the pointer is on one
    const over = await page.locator('#parallel .u-over').boundingBox();
    let named = '';
    for (let y = over.y + 1; y < over.y + over.height && !named; y += 4) {
      await page.mouse.move(over.x + over.width / 2, y);
      const text = await page.textContent('#parallel .parallel-hover');
      if (/^trial \d+ \(COMPLETED\): lr .*warmup_steps .*→ val_loss \d/.test(text)) named = text;
    }
    assert.ok(named, 'hovering the parallel coordinates names no trial');
    await page.mouse.move(0, 0);
    assert.match(await page.textContent('#events'), /RUNNING[\s\S]*COMPLETED/);
    await shot(page, 'tuning-page');
    // sorting by the objective: kept in the URL, the best trial first
    await page.locator('#trials thead button', { hasText: 'val_loss' }).click();
    await page.waitForFunction(() => /order_by=objective/.test(location.hash));
    assert.equal(await page.getAttribute('#trials tbody tr:first-child', 'data-job'), done.best.job_id);
    // the trials selected, then the best ones, open side by side on the compare page
    const compared = async () => {
      await page.waitForFunction(() => location.hash.startsWith('#/compare?ids='));
      await page.waitForSelector('main[data-ready="true"] #compare-table');
      return new URL(`http://x/${page.url().split('#/')[1]}`).searchParams.get('ids').split(',').sort();
    };
    const two = done.trials.filter((t) => t.job_id !== done.best.job_id).map((t) => t.job_id);
    assert.ok(await page.isDisabled('#compare-selected'), 'Compare selected needs two trials');
    for (const j of two) await page.check(`#trials input[data-job="${j}"]`);
    await page.click('#compare-selected');
    assert.deepEqual(await compared(), two.sort());
    await page.goBack();
    await page.waitForSelector('main[data-ready="true"] #trials tbody tr[data-job]');
    await page.locator('#compare-top').click();
    assert.deepEqual(await compared(), done.trials.map((t) => t.job_id).sort());
    // a trial's job page says whose trial it is and links back
    await page.goto(`${c.url}/#/jobs/${done.best.job_id}`);
    await page.waitForSelector('#trial-of a');
    await page.waitForFunction(() => /Trial \d+ of tuning job ui-sweep/.test(document.getElementById('trial-of').textContent));
    assert.equal(await page.getAttribute('#trial-of a', 'href'), `#/tuning/${sweep.id}`);
    // the list: both searches, with their trials done and the best objective, read a search a page
    // (the page's requests rewritten to page_size=1, against the real kilnd): it follows
    // next_page_token to the end, so the sort and the count are over every search
    const listReads = [];
    const isList = (u) => u.pathname === '/v1/tuning-jobs';
    await page.route(isList, (route) => {
      const u = new URL(route.request().url());
      u.searchParams.set('page_size', '1');
      listReads.push(u.searchParams.get('page_token') || '');
      return route.continue({ url: u.toString() });
    });
    await page.locator('nav a', { hasText: 'Tuning' }).click();
    await page.waitForSelector(`main[data-loaded="true"] table.tunings tr[data-id="${sweep.id}"]`);
    const row = page.locator(`table.tunings tr[data-id="${sweep.id}"]`);
    assert.match(await row.textContent(), /ui-sweep.*COMPLETED.*random.*3 \/ 3.*val_loss \(minimize\)/);
    assert.equal(await row.locator('td.c-best a').getAttribute('href'), `#/jobs/${done.best.job_id}`);
    assert.equal(await page.locator(`table.tunings tr[data-id="${slow.id}"][data-state="RUNNING"]`).count(), 1);
    await page.locator('table.tunings thead button', { hasText: 'Name' }).click();
    await page.waitForFunction(() => /order_by=name(\+|%20)asc/.test(location.hash));
    assert.deepEqual(await page.$$eval('table.tunings tbody tr', (trs) => trs.map((t) => t.querySelector('.c-name').textContent)),
      ['ui-slow-search', 'ui-sweep']);
    assert.equal(await page.textContent('main .toolbar'), '2 tuning jobs');
    assert.ok(listReads.filter((t) => t).length >= 1, `the list read no page past the first: ${JSON.stringify(listReads)}`);
    await page.unroute(isList);
    await shot(page, 'tuning-list');
    // dark mode and a phone's width
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.goto(`${c.url}/#/tuning/${sweep.id}`);
    await page.waitForSelector('#parallel[data-ready="true"]');
    assert.equal(await page.evaluate(() => getComputedStyle(document.body).backgroundColor), 'rgb(13, 17, 23)');
    await shot(page, 'tuning-dark');
    await page.setViewportSize({ width: 390, height: 844 });
    await page.reload();
    await page.waitForSelector('#parallel[data-ready="true"]');
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390),
      `the page is wider than the screen: ${await page.evaluate(() => document.documentElement.scrollWidth)} px`);
    await shot(page, 'tuning-390px');
    await page.emulateMedia({ colorScheme: 'light' });
    await page.setViewportSize({ width: 1400, height: 1000 });
    // a viewer sees the running search without Stop; an admin stops it from its page
    const token = await c.user('tilly', 'viewer');
    const v = await loggedIn(token);
    watch(v.page);
    await v.page.goto(`${c.url}/#/tuning/${slow.id}`);
    await v.page.waitForSelector('main[data-ready="true"][data-state="RUNNING"] #trials');
    assert.equal(await v.page.locator('#stop').count(), 0);
    assert.equal(await v.page.getByRole('button', { name: /stop/i }).count(), 0);
    await shot(v.page, 'tuning-viewer');
    await v.ctx.close();
    await page.goto(`${c.url}/#/tuning/${slow.id}`);
    await page.getByRole('button', { name: 'Stop tuning job' }).click();
    await page.waitForSelector('main[data-state="STOPPED"]', { timeout: 60000 });
    assert.equal(await page.locator('#stop').count(), 0, 'no Stop for a stopped search');
    assert.deepEqual(errors, []);
    await ctx.close();
  });
});
