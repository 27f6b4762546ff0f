-- 0002_metric_chunks.sql - metrics stored as chunks: one row per (job, metric name, rank) per
-- ingested batch, holding that batch's points as parallel arrays sorted by step. A row per point
-- spent most of its time on tuple and index overhead (~60 bytes of header and an index entry
-- per point); chunks keep COPY ingestion far above 200k points/s on 2 cores, and the index on
-- (job_id, name, first_step) still serves "metric X of job J by step". Reads unnest the arrays.
DROP TABLE IF EXISTS metrics;

CREATE TABLE metric_chunks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL,
    name        text NOT NULL,
    rank        integer NOT NULL,
    attempt     integer NOT NULL,
    first_step  bigint NOT NULL,
    last_step   bigint NOT NULL,
    n           integer NOT NULL CHECK (n >= 1),
    steps       bigint[] NOT NULL,             -- sorted ascending
    vals        double precision[] NOT NULL,
    times_us    bigint[] NOT NULL,             -- Unix microseconds
    CHECK (cardinality(steps) = n AND cardinality(vals) = n AND cardinality(times_us) = n)
);
CREATE INDEX metric_chunks_job_name_step_idx ON metric_chunks (job_id, name, first_step);
