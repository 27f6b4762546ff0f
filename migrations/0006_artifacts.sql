-- 0006_artifacts.sql - what a job leaves behind and how it goes away: artifacts (the files of
-- rank 0's output directory, uploaded by its agent into kilnd's artifact store), the store
-- directories whose files wait to be removed after their job was deleted, and when the log
-- retention dropped a job's logs.

-- One file of a job: its name (no '/', see base/artifact.c), size and SHA-256 as the agent
-- declared them, how much of it the store holds durably (received, fsynced), and which store
-- (a kilnd --artifact-dir, identified by the id in its .kiln-store-id file) holds the bytes.
-- A job's artifacts are those of its latest uploading attempt.
CREATE TABLE artifacts (
    job_id        uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    attempt       integer NOT NULL CHECK (attempt >= 1),
    worker_id     text NOT NULL,
    size          bigint NOT NULL CHECK (size >= 0),
    sha256        text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    state         text NOT NULL CHECK (state IN ('UPLOADING', 'COMPLETE')),
    received      bigint NOT NULL DEFAULT 0,
    store_id      text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    PRIMARY KEY (job_id, name),
    CHECK (received >= 0 AND received <= size),
    CHECK (state = 'UPLOADING' OR (received = size AND completed_at IS NOT NULL))
);

-- Directories in an artifact store waiting to be removed: a deleted job's (attempt 0: all of
-- it) or an attempt's whose artifacts a later attempt replaced. A kilnd removes those of its own
-- store: at once when it can, else on its next clean-up pass (kilnd --janitor-interval-s), so a
-- replica with another --artifact-dir never leaves them behind for good.
CREATE TABLE artifact_trash (
    store_id   text NOT NULL,
    job_id     uuid NOT NULL,
    attempt    integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    queued_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, job_id, attempt)
);

-- The log retention (kilnd --log-retention-days) sets this once it has dropped a job's logs, so
-- no later pass looks at the job again.
ALTER TABLE jobs ADD COLUMN logs_expired_at timestamptz;
CREATE INDEX jobs_logs_retention_idx ON jobs (ended_at)
    WHERE ended_at IS NOT NULL AND logs_expired_at IS NULL;
