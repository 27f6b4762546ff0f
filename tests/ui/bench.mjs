// bench.mjs - how fast the web UI is with a lot of data, measured in the browser tests' harness
// (cluster.mjs: a real kilnd with TLS and tokens, Debian's Chromium): the jobs page with 10,000
// jobs in the database, a job page whose metrics have 100,000 points each, and a running job's
// page (50,000 points a metric and 50,000 log lines, the page following both). Each is measured
// against a baseline in the same run (an empty database / a job with no points). Times are
// the page's own performance.now() when the table or the charts were first on screen, i.e.
// milliseconds since the navigation started. Run by bench/ui_bench.sh.
import { browser, Cluster } from './cluster.mjs';

const JOBS = Number(process.env.JOBS || 10000);
const POINTS = Number(process.env.POINTS || 100000);
const ROUNDS = Number(process.env.ROUNDS || 5);
const RUNNING_POINTS = Number(process.env.RUNNING_POINTS || 50000);
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };

async function measure(ctx, url, selector, attr, also) {
  const out = [];
  for (let i = 0; i < ROUNDS; i++) {
    const page = await ctx.newPage();
    await page.goto(url);
    await page.waitForSelector(selector, { timeout: 60000 });
    out.push(Number(await page.getAttribute(selector, attr)));
    if (also) also.push(Number(await page.getAttribute(selector, 'data-data-ms')));
    await page.close();
  }
  return out;
}

async function submitMany(c, n) {
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < n; i = next++) {
      const spec = c.spec(`bench-${i}`, { steps: 1000 + (i % 7) * 100, hp: { lr: 1e-4 * (1 + (i % 50)), seed: i } });
      spec.tags = { team: i % 3 ? 'nlp' : 'vision' };
      await c.api('POST', '/v1/jobs', spec);
    }
  };
  await Promise.all(Array.from({ length: 8 }, worker));
}

// 100,000 points for each of seven metrics of one job, written straight into the store in
// 1,000-point chunks (what ingestion writes), with a loss curve, a schedule and noise.
function fillPoints(c, jobId, n) {
  c.sql(`INSERT INTO metric_chunks (job_id, name, rank, attempt, first_step, last_step, n, steps, vals, times_us)
    SELECT '${jobId}'::uuid, m.name, 0, 1, k * 1000 + 1, k * 1000 + 1000, 1000,
      array(SELECT s FROM generate_series(k * 1000 + 1, k * 1000 + 1000) s),
      array(SELECT CASE m.name
          WHEN 'train_loss' THEN 1.5 + 3.5 * exp(-s / 15000.0) + 0.1 * random()
          WHEN 'val_loss' THEN 1.6 + 3.4 * exp(-s / 15000.0) + 0.02 * random()
          WHEN 'lr' THEN 3e-4 * least(1.0, s / 1000.0) * (0.1 + 0.9 * 0.5 * (1 + cos(pi() * s / ${n})))
          WHEN 'tokens_per_s' THEN 50000 + 5000 * random()
          WHEN 'mfu' THEN 0.4 + 0.05 * random()
          WHEN 'grad_norm' THEN 1 + random()
          ELSE 400 + 50 * random() END
        FROM generate_series(k * 1000 + 1, k * 1000 + 1000) s),
      array(SELECT 1795000000000000 + s::bigint * 400000 FROM generate_series(k * 1000 + 1, k * 1000 + 1000) s)
    FROM unnest(ARRAY['train_loss', 'val_loss', 'lr', 'tokens_per_s', 'mfu', 'grad_norm', 'step_time_ms']) m(name),
         generate_series(0, ${n / 1000 - 1}) k`);
}

// n log lines of rank 0, attempt 1, as a training run writes them (a step line each).
function fillLogs(c, jobId, n) {
  c.sql(`INSERT INTO logs (job_id, seq, attempt, rank, stream, time_us, line)
    SELECT '${jobId}'::uuid, s, 1, 0, 'stdout', 1795000000000000 + s::bigint * 400000,
      format('step %s/%s | loss %s | lr 3.0e-04 | 51234 tok/s', s, ${n * 2}, round((1.5 + 3.5 * exp(-s / 15000.0))::numeric, 4))
    FROM generate_series(1, ${n}) s;
    INSERT INTO log_seqs (job_id, last_seq) VALUES ('${jobId}'::uuid, ${n})`);
}

const c = await new Cluster().start({ agents: 0 });
const ctx = await browser();
try {
  const page = await ctx.newPage();
  await page.goto(`${c.url}/`);
  await page.getByLabel('API token').fill(c.adminToken);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.waitForSelector('main[data-loaded="true"]');
  await page.close();
  const results = {};

  // jobs page: empty database, then JOBS jobs
  results.jobs_empty = await measure(ctx, `${c.url}/#/jobs`, 'main[data-loaded="true"]', 'data-rendered-ms');
  let t = Date.now();
  await submitMany(c, JOBS);
  const submitS = (Date.now() - t) / 1000;
  results.jobs_full = await measure(ctx, `${c.url}/#/jobs`, 'main[data-loaded="true"]', 'data-rendered-ms');
  // a click on a column header after load: until the re-sorted table is there
  const p2 = await ctx.newPage();
  await p2.goto(`${c.url}/#/jobs`);
  await p2.waitForSelector('main[data-loaded="true"]');
  const rows = await p2.locator('table.jobs tbody tr[data-id]').count();
  t = Date.now();
  await p2.getByRole('button', { name: 'hp.lr' }).click();
  await p2.waitForSelector('th[aria-sort] >> text=hp.lr');
  const sortMs = Date.now() - t;
  await p2.close();

  // job page: a job with no points, then one with POINTS points per metric
  const empty = (await c.api('POST', '/v1/jobs', c.spec('bench-no-points'))).body;
  const big = (await c.api('POST', '/v1/jobs', c.spec('bench-100k', { steps: POINTS }))).body;
  t = Date.now();
  fillPoints(c, big.id, POINTS);
  const fillS = (Date.now() - t) / 1000;
  results.points_empty = await measure(ctx, `${c.url}/#/jobs/${empty.id}`, '#charts[data-ready="true"]', 'data-rendered-ms');
  const dataMs = [];
  results.points_full = await measure(ctx, `${c.url}/#/jobs/${big.id}`, '#charts[data-ready="true"]', 'data-rendered-ms', dataMs);
  // the browser's own part: from the last history's arrival to the charts on screen
  results.points_draw = results.points_full.map((v, i) => v - dataMs[i]);
  // a running job: its page also follows the logs and polls for new points
  const running = (await c.api('POST', '/v1/jobs', c.spec('bench-running', { steps: RUNNING_POINTS * 2 }))).body;
  fillPoints(c, running.id, RUNNING_POINTS);
  fillLogs(c, running.id, RUNNING_POINTS);
  c.sql(`UPDATE jobs SET state = 'RUNNING', attempt = 1, started_at = now(), progress_step = ${RUNNING_POINTS}
    WHERE id = '${running.id}'`);
  results.running = await measure(ctx, `${c.url}/#/jobs/${running.id}`, '#charts[data-ready="true"]', 'data-rendered-ms');
  // the metrics request alone (all seven series, downsampled to 1,000 points each)
  const apiMs = [];
  for (let i = 0; i < ROUNDS; i++) {
    t = Date.now();
    await c.api('GET', `/v1/jobs/${big.id}/metrics?max_points=1000`);
    apiMs.push(Date.now() - t);
  }
  console.log(JSON.stringify({ jobs: JOBS, points: POINTS, rounds: ROUNDS, submit_s: submitS, fill_s: fillS,
                               rows_shown: rows, sort_click_ms: sortMs, metrics_api_ms: apiMs, ...results }, null, 1));
  console.log(`jobs page, ${JOBS} jobs: median ${median(results.jobs_full)} ms (empty database: ${median(results.jobs_empty)} ms); ` +
              `sort click ${sortMs} ms`);
  console.log(`job page, ${POINTS} points x 7 metrics: charts drawn at median ${median(results.points_full)} ms ` +
              `(no points: ${median(results.points_empty)} ms), of which drawing ${median(results.points_draw)} ms ` +
              `after the data arrived; metrics API (all 7 series in one request) median ${median(apiMs)} ms`);
  console.log(`running job, ${RUNNING_POINTS} points x 7 metrics and ${RUNNING_POINTS} log lines: first chart at median ` +
              `${median(results.running)} ms`);
} finally {
  await ctx.close();
  await c.stop();
  c.cleanup(false);
}
