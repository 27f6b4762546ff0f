-- 0007_control.sql - the control plane keeps its promises under faults: an idempotency key
-- remembers the request it was used for.

-- BLAKE2b-256 of the normalised spec of the request that created the job: the same
-- Idempotency-Key with another spec is refused (HTTP 422) instead of answered with this job.
ALTER TABLE jobs ADD COLUMN request_hash bytea;

-- Log sequence numbers are handed out by the database, in the transaction that stores a batch
-- (several kilnd may ingest lines of one job): the row lock orders the batches of a job, so a
-- line's seq also orders commits, and a follower that has seen seq N has every line up to N.
CREATE TABLE log_seqs (
    job_id    uuid PRIMARY KEY,
    last_seq  bigint NOT NULL CHECK (last_seq >= 0)
);
INSERT INTO log_seqs (job_id, last_seq) SELECT job_id, max(seq) FROM logs GROUP BY job_id;

-- Exactly-once ingestion: an agent numbers the log and metric batches it sends for a job from
-- one stream (one agent process, one attempt) 1, 2, 3, ... in order; a batch whose number is not
-- above the last one stored is a re-sent copy (its reply was lost) and is stored no second time.
-- Recorded in the same transaction as the batch itself.
CREATE TABLE ingest_batches (
    job_id      uuid NOT NULL,
    stream_id   bigint NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('logs', 'metrics')),
    last_seq    bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, stream_id, kind)
);
CREATE INDEX ingest_batches_updated_idx ON ingest_batches (updated_at);
