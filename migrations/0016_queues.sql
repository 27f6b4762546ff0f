-- 0016_queues.sql - queues with quotas (issue 28). A job names its queue (jobs.queue); a queue has
-- a nominal quota per slot type ({"cpu": 8, "gpu": 0}; NULL: no limit), an optional cohort whose
-- queues lend each other their unused quota within borrowing and lending limits ({} or a missing
-- slot type: unlimited), a fair-sharing weight between queues, the projects that may submit to it
-- (["*"]: every project) and whether it orders its jobs by their project's recent usage. The
-- queue `default` (no limit, no cohort, every project, fair between projects) is what a cluster
-- nobody configured uses.
CREATE TABLE queues (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    cohort          text CHECK (cohort ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    quota           jsonb CHECK (quota IS NULL OR jsonb_typeof(quota) = 'object'),
    borrowing_limit jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(borrowing_limit) = 'object'),
    lending_limit   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(lending_limit) = 'object'),
    weight          double precision NOT NULL DEFAULT 1 CHECK (weight > 0),
    projects        jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(projects) = 'array'),
    fair_sharing    boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL DEFAULT '',
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO queues (name, quota, projects, fair_sharing) VALUES ('default', NULL, '["*"]', true);
-- A queue's usage: its jobs that hold slots, by queue.
CREATE INDEX jobs_queue_active_idx ON jobs (queue)
    WHERE state IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING');
