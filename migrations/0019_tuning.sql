-- 0019_tuning.sql - tuning jobs (issue 29): a search over a base job spec's parameters toward an
-- objective metric, whose trials are ordinary jobs (tags.tuning_job = the tuning job's id). The
-- tuning job keeps its request as normalised (spec), its state and reason, how many trials it has
-- drawn (next_trial: trial numbers are never reused, even when a trial's job is deleted) and its
-- events; tuning_trials maps each trial to its job, its parameters, the rung it runs toward and
-- the objective it had at each rung it finished.
CREATE TABLE tuning_jobs (
    id              uuid PRIMARY KEY,
    name            text NOT NULL,
    project         text NOT NULL,
    spec            jsonb NOT NULL,
    state           text NOT NULL CHECK (state IN ('RUNNING', 'STOPPING', 'COMPLETED', 'FAILED', 'STOPPED')),
    reason          text NOT NULL DEFAULT '',
    next_trial      integer NOT NULL DEFAULT 0 CHECK (next_trial >= 0),
    failed_trials   integer NOT NULL DEFAULT 0 CHECK (failed_trials >= 0),
    submitted_by    text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);
CREATE INDEX tuning_jobs_created_idx ON tuning_jobs (created_at DESC, id DESC);
CREATE INDEX tuning_jobs_active_idx ON tuning_jobs (state) WHERE state IN ('RUNNING', 'STOPPING');

CREATE TABLE tuning_events (
    tuning_id   uuid NOT NULL REFERENCES tuning_jobs (id) ON DELETE CASCADE,
    seq         integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    from_state  text,
    to_state    text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    actor       text,
    PRIMARY KEY (tuning_id, seq)
);

CREATE TABLE tuning_trials (
    tuning_id   uuid NOT NULL REFERENCES tuning_jobs (id) ON DELETE CASCADE,
    trial       integer NOT NULL CHECK (trial >= 0),
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    parameters  jsonb NOT NULL CHECK (jsonb_typeof(parameters) = 'object'),
    rung        integer NOT NULL DEFAULT 0 CHECK (rung >= 0),   -- hyperband: the rung it runs toward
    rung_objectives jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(rung_objectives) = 'array'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tuning_id, trial)
);
CREATE UNIQUE INDEX tuning_trials_job_idx ON tuning_trials (job_id);

-- A job paused at its stopping.max_steps (a hyperband trial at a rung): its checkpoint is kept and
-- its slots are free; it resumes (RESTARTING) when its stopping.max_steps is raised.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING',
    'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED', 'PREEMPTED', 'PAUSED'));
ALTER TABLE job_events DROP CONSTRAINT job_events_from_state_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_from_state_check CHECK (from_state IN ('QUEUED', 'SCHEDULED',
    'STARTING', 'RUNNING', 'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED', 'PREEMPTED', 'PAUSED'));
ALTER TABLE job_events DROP CONSTRAINT job_events_to_state_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_to_state_check CHECK (to_state IN ('QUEUED', 'SCHEDULED',
    'STARTING', 'RUNNING', 'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED', 'PREEMPTED', 'PAUSED'));
