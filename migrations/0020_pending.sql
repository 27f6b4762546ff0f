-- 0020_pending.sql - a waiting job's pending reason in machine-readable form (issue 28 item 5):
-- {"position", "missing", "blocking_jobs", "estimated_start"}, written by the scheduler's pass
-- only when it changes, and cleared when the job leaves the waiting states (store_job_transition).
ALTER TABLE jobs ADD COLUMN pending jsonb CHECK (pending IS NULL OR jsonb_typeof(pending) = 'object');
