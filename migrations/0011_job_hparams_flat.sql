-- 0011_job_hparams_flat.sql - job_hparams becomes one table, without partitions and without its
-- foreign key. A job's creation writes a row per numeric hyperparameter (kiln's 18 and the job's
-- own), and into 19 partitions that cost PostgreSQL more than the rest of the creation together:
-- each partition a relation to open and lock with its two indexes, each row a foreign key check
-- (bench/RESULTS.md, "Two kilnd replicas"). Rows go with their job in store_job_delete, which
-- empties every table with a job_id column; nothing else deletes jobs.
-- The planner loses the per-key statistics the partitions gave it ("hp.lr > 1" now looks like it
-- matches a third of the jobs); store/search.c counts the rows of each hyperparameter condition
-- through the index before it writes the search instead (hp_plan). The multivariate statistics
-- keep the estimates of frequent (key, value) pairs, such as a batch size shared by many jobs.
CREATE TABLE job_hparams_flat (
    job_id  uuid NOT NULL,
    key     text NOT NULL,
    num     double precision NOT NULL,
    PRIMARY KEY (job_id, key)
);
INSERT INTO job_hparams_flat (job_id, key, num) SELECT job_id, key, num FROM job_hparams;
DROP TABLE job_hparams;
ALTER TABLE job_hparams_flat RENAME TO job_hparams;
ALTER INDEX job_hparams_flat_pkey RENAME TO job_hparams_pkey;
CREATE INDEX job_hparams_key_num_idx ON job_hparams (key, num, job_id);
CREATE STATISTICS job_hparams_key_num (mcv) ON key, num FROM job_hparams;
ANALYZE job_hparams;
