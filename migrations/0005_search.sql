-- 0005_search.sql - experiment search: hyperparameters as typed rows, a summary per job and
-- metric kept up to date by ingestion (so no search scans raw points), the indexes the filter
-- language's queries use (store/search.c compiles them), and narrow job rows.

-- Each numeric hyperparameter of a job's spec as one row: range searches and ordering on any of
-- them use (key, num, job_id). Written with the job (store_job_insert); the spec never changes.
-- One partition per hyperparameter kiln knows (the others share a default one), so that the
-- planner has each one's own statistics: "hp.lr > 1" is then known to match nothing, rather
-- than judged by a histogram of every hyperparameter's values together.
CREATE TABLE job_hparams (
    job_id  uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    key     text NOT NULL,
    num     double precision NOT NULL,
    PRIMARY KEY (job_id, key)
) PARTITION BY LIST (key);
CREATE INDEX job_hparams_key_num_idx ON job_hparams (key, num, job_id);
DO $$
DECLARE k text;
BEGIN
    FOREACH k IN ARRAY ARRAY['lr', 'global_batch_size', 'micro_batch_size', 'max_steps', 'warmup_steps',
                             'weight_decay', 'grad_clip', 'seed', 'beta1', 'beta2', 'eps', 'min_lr_fraction',
                             'eval_every', 'eval_batches', 'sample_every', 'sample_tokens', 'temperature', 'top_k']
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF job_hparams FOR VALUES IN (%L)', 'job_hparams_' || k, k);
    END LOOP;
END $$;
CREATE TABLE job_hparams_other PARTITION OF job_hparams DEFAULT;
INSERT INTO job_hparams (job_id, key, num)
    SELECT j.id, h.key, (h.value #>> '{}')::double precision
    FROM jobs j, jsonb_each(j.spec -> 'hyperparameters') h
    WHERE jsonb_typeof(h.value) = 'number';

-- The summary of one metric of one job. It describes one rank's series: the lowest rank that
-- reported the metric (rank 0 writes a job's metrics; a metric only other ranks report is
-- summarised from the lowest of them). Each step counts once, with the value of the latest
-- attempt that reported it (a retried step replaces the earlier attempt's value; within one
-- attempt the later point wins). Non-finite values (NaN, +-Infinity) stay in the history but not
-- in min/max/last/n. lo_step and hi_step bound every step seen, finite or not: a batch that lies
-- wholly outside them merges in place (store_metric_summaries_update); one that overlaps them
-- (a retry, or batches out of order) makes the row be rebuilt from the chunks.
CREATE TABLE metric_summaries (
    job_id     uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name       text NOT NULL,
    rank       integer NOT NULL,
    n          bigint NOT NULL,            -- steps with a finite value
    min        double precision,           -- NULL while n = 0
    max        double precision,
    last       double precision,           -- the value at last_step
    min_step   bigint,                     -- first step holding min
    max_step   bigint,                     -- first step holding max
    last_step  bigint,                     -- highest step with a finite value
    lo_step    bigint NOT NULL,
    hi_step    bigint NOT NULL,
    attempt    integer NOT NULL,           -- highest attempt seen
    dirty      boolean NOT NULL DEFAULT false,  -- set by a merge that needs a rebuild (same transaction)
    PRIMARY KEY (job_id, name)
) PARTITION BY LIST (name);
-- As for hyperparameters: the standard metrics (docs/contracts.md) each in a partition of their
-- own, with their own statistics; metrics a job defines itself share the default partition.
DO $$
DECLARE m text;
BEGIN
    FOREACH m IN ARRAY ARRAY['train_loss', 'val_loss', 'lr', 'grad_norm', 'step_time_ms', 'tokens_per_s', 'mfu',
                             'peak_mem_mb', 'gpu_mem_mb', 'gpu_mem_peak_mb']
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF metric_summaries FOR VALUES IN (%L)', 'metric_summaries_' || m, m);
    END LOOP;
END $$;
CREATE TABLE metric_summaries_other PARTITION OF metric_summaries DEFAULT;
CREATE INDEX metric_summaries_min_idx ON metric_summaries (name, min, job_id);
CREATE INDEX metric_summaries_max_idx ON metric_summaries (name, max, job_id);
CREATE INDEX metric_summaries_last_idx ON metric_summaries (name, last, job_id);

-- Rebuilds the summary of (job, name) from its chunks; the one definition of what a summary
-- is (the merge in store/ingest.c is its incremental form).
CREATE FUNCTION metric_summary_rebuild(p_job uuid, p_name text) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM metric_summaries WHERE job_id = p_job AND name = p_name;
    WITH r AS (SELECT min(rank) AS rank FROM metric_chunks WHERE job_id = p_job AND name = p_name),
    pts AS (
        SELECT u.step, u.val, c.attempt, c.id, u.ord
        FROM metric_chunks c JOIN r ON c.rank = r.rank,
             unnest(c.steps, c.vals) WITH ORDINALITY AS u(step, val, ord)
        WHERE c.job_id = p_job AND c.name = p_name),
    latest AS (
        SELECT DISTINCT ON (step) step, val FROM pts ORDER BY step, attempt DESC, id DESC, ord DESC),
    fin AS (
        SELECT step, val FROM latest
        WHERE val NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8))
    INSERT INTO metric_summaries (job_id, name, rank, n, min, max, last, min_step, max_step, last_step,
                                  lo_step, hi_step, attempt)
    SELECT p_job, p_name, r.rank,
           (SELECT count(*) FROM fin),
           (SELECT min(val) FROM fin),
           (SELECT max(val) FROM fin),
           (SELECT val FROM fin ORDER BY step DESC LIMIT 1),
           (SELECT step FROM fin ORDER BY val, step LIMIT 1),
           (SELECT step FROM fin ORDER BY val DESC, step LIMIT 1),
           (SELECT max(step) FROM fin),
           (SELECT min(step) FROM latest),
           (SELECT max(step) FROM latest),
           (SELECT max(attempt) FROM pts)
    FROM r WHERE r.rank IS NOT NULL;
$$;

SELECT metric_summary_rebuild(k.job_id, k.name)
FROM (SELECT DISTINCT job_id, name FROM metric_chunks) k
WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = k.job_id);

-- Job rows stay narrow so that a search which must look at every job reads little: the spec
-- (kilobytes of JSON) moves out of line, compressed, as soon as a row passes 256 bytes.
ALTER TABLE jobs SET (toast_tuple_target = 256);
ALTER TABLE jobs ALTER COLUMN spec SET STORAGE EXTENDED;

-- Substring search on names (name ~ "shake") uses a trigram index where the pg_trgm extension
-- can be created (it is a trusted extension: the database owner may); without it such searches
-- scan, which is correct, only slower.
DO $$
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS pg_trgm;
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'pg_trgm is not available (%): name searches will scan', SQLERRM;
    END;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm') THEN
        EXECUTE 'CREATE INDEX jobs_name_trgm_idx ON jobs USING gin (name gin_trgm_ops)';
    END IF;
END $$;
