-- 0017_checkpoint_sync.sql - a job's checkpoint directory kept in kilnd's artifact store while
-- it runs (a job with no checkpoint.path, whose checkpoints are in its agent's work dir), so that
-- its next attempt finds it restored on whichever agent it lands. Each content is stored once per
-- job, by SHA-256 (checkpoint_blobs; bytes in DIR/jobs/<job>/checkpoints/<sha256>); the files of
-- the directory name contents (checkpoint_files): the SYNCED rows are the last state kilnd holds
-- whole, the PENDING rows the state an agent is uploading, which replaces the SYNCED rows all at
-- once when every content it names is whole.
CREATE TABLE checkpoint_blobs (
    job_id        uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    sha256        text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size          bigint NOT NULL CHECK (size >= 0),
    received      bigint NOT NULL DEFAULT 0,
    complete      boolean NOT NULL DEFAULT false,
    store_id      text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, sha256),
    CHECK (received >= 0 AND received <= size),
    CHECK (NOT complete OR received = size)
);

CREATE TABLE checkpoint_files (
    job_id        uuid NOT NULL,
    state         text NOT NULL CHECK (state IN ('PENDING', 'SYNCED')),
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    sha256        text NOT NULL,
    size          bigint NOT NULL CHECK (size >= 0),
    attempt       integer NOT NULL CHECK (attempt >= 1),
    worker_id     text NOT NULL,
    synced_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, state, name),
    FOREIGN KEY (job_id, sha256) REFERENCES checkpoint_blobs (job_id, sha256) ON DELETE CASCADE
);
