-- 0018_preemption.sql - preemption and backfill (issue 28). A job stopped to make room for another
-- goes to the waiting state PREEMPTED (the scheduler admits from it as from QUEUED): preempted_by
-- names the job it makes room for while it stops, last_preempted_by the last job that preempted it
-- (which it never preempts back), preemptions counts how often it was preempted (those attempts
-- do not count against retry.max_attempts). step_time_s is the job's measured
-- seconds per step (kept across attempts: the scheduler predicts run times from it), and
-- backfill_end the end the scheduler predicted when it admitted the job by backfill (NULL when not).
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING',
    'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED', 'PREEMPTED'));
ALTER TABLE job_events DROP CONSTRAINT job_events_from_state_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_from_state_check CHECK (from_state IN ('QUEUED', 'SCHEDULED',
    'STARTING', 'RUNNING', 'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED', 'PREEMPTED'));
ALTER TABLE job_events DROP CONSTRAINT job_events_to_state_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_to_state_check CHECK (to_state IN ('QUEUED', 'SCHEDULED',
    'STARTING', 'RUNNING', 'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED', 'PREEMPTED'));

ALTER TABLE jobs ADD COLUMN preemptions integer NOT NULL DEFAULT 0 CHECK (preemptions >= 0);
ALTER TABLE jobs ADD COLUMN preempted_by uuid;
ALTER TABLE jobs ADD COLUMN last_preempted_by uuid;
ALTER TABLE jobs ADD COLUMN step_time_s double precision CHECK (step_time_s > 0);
ALTER TABLE jobs ADD COLUMN backfill_end timestamptz;

DROP INDEX jobs_pending_idx;
CREATE INDEX jobs_pending_idx ON jobs (priority DESC, created_at, id)
    WHERE state IN ('QUEUED', 'RESTARTING', 'PREEMPTED');
-- Run-time predictions for jobs that never ran: the step times of jobs of the same model and resources.
CREATE INDEX jobs_step_time_idx ON jobs ((spec->'model'), (spec->'resources')) WHERE step_time_s IS NOT NULL;
