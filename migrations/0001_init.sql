-- 0001_init.sql - kiln's first schema: jobs and their events, workers, placements (assignments)
-- and rank exits, and the two high-volume tables, logs and metrics.
-- Applied by kilnd at start-up (store/migrate.c) inside one transaction.

-- Jobs. `spec` is the normalised spec (defaults filled); the scheduling fields are copied out of
-- it into columns so the scheduler never parses JSON. `attempt` is 0 while the job has never been
-- placed and is incremented each time the scheduler places it (1 for the first run).
CREATE TABLE jobs (
    id              uuid PRIMARY KEY,
    name            text NOT NULL,
    project         text NOT NULL DEFAULT 'default',
    spec            jsonb NOT NULL,
    state           text NOT NULL CHECK (state IN ('QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING',
                        'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED')),
    reason          text NOT NULL DEFAULT '',
    attempt         integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts    integer NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    priority        integer NOT NULL DEFAULT 0,
    queue           text NOT NULL DEFAULT 'default',
    nodes           integer NOT NULL CHECK (nodes >= 1),
    slots_per_node  integer NOT NULL CHECK (slots_per_node >= 1),
    slot_type       text NOT NULL,
    world_size      integer NOT NULL CHECK (world_size >= 1),
    idempotency_key text UNIQUE,
    tags            jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    ended_at        timestamptz,
    progress_step   bigint NOT NULL DEFAULT 0,
    total_steps     bigint NOT NULL DEFAULT 0,
    eta_s           double precision,
    metrics         jsonb NOT NULL DEFAULT '{}',   -- latest value of each metric
    stop_requested  boolean NOT NULL DEFAULT false,
    event_seq       integer NOT NULL DEFAULT 0     -- last job_events.seq written for this job
);
-- Listing is newest first with keyset paging on (created_at, id).
CREATE INDEX jobs_created_idx ON jobs (created_at DESC, id DESC);
CREATE INDEX jobs_state_created_idx ON jobs (state, created_at DESC, id DESC);
-- The scheduler's queue: priority, then first come first served.
CREATE INDEX jobs_pending_idx ON jobs (priority DESC, created_at, id)
    WHERE state IN ('QUEUED', 'RESTARTING');
CREATE INDEX jobs_active_idx ON jobs (state)
    WHERE state IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING');
CREATE INDEX jobs_tags_idx ON jobs USING gin (tags jsonb_path_ops);

-- Every state change of a job, with its reason. seq is per job, from 1.
CREATE TABLE job_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES jobs (id),
    seq         integer NOT NULL,
    from_state  text CHECK (from_state IN ('QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING',
                    'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED')),
    to_state    text NOT NULL CHECK (to_state IN ('QUEUED', 'SCHEDULED', 'STARTING', 'RUNNING',
                    'STOPPING', 'RESTARTING', 'COMPLETED', 'FAILED', 'STOPPED')),
    reason      text NOT NULL DEFAULT '',
    attempt     integer NOT NULL,
    time        timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (job_id, seq)
);

-- Agents. A worker keeps its id across restarts of the agent (it may re-register with it).
CREATE TABLE workers (
    id              text PRIMARY KEY,
    hostname        text NOT NULL DEFAULT '',
    address         text NOT NULL DEFAULT '',
    slots           integer NOT NULL CHECK (slots >= 0),
    slot_type       text NOT NULL CHECK (slot_type IN ('cpu', 'gpu')),
    gpus            jsonb NOT NULL DEFAULT '[]',
    version         text NOT NULL DEFAULT '',
    cpu_cores       integer NOT NULL DEFAULT 0,
    state           text NOT NULL CHECK (state IN ('ALIVE', 'DEAD')),
    state_reason    text NOT NULL DEFAULT '',
    last_heartbeat  timestamptz NOT NULL DEFAULT now(),
    registered_at   timestamptz NOT NULL DEFAULT now()
);

-- Placement: which worker runs which ranks of which attempt of a job. A row holds its slots
-- until it is released (all its ranks exited, its worker died, or it was never delivered).
CREATE TABLE assignments (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        uuid NOT NULL REFERENCES jobs (id),
    attempt       integer NOT NULL,
    worker_id     text NOT NULL REFERENCES workers (id),
    node_rank     integer NOT NULL,
    nodes         integer NOT NULL,
    ranks         integer[] NOT NULL,        -- global ranks in local-rank order
    world_size    integer NOT NULL,
    master_addr   text NOT NULL,
    master_port   integer NOT NULL,
    delivered     boolean NOT NULL DEFAULT false,
    delivered_at  timestamptz,
    started       boolean NOT NULL DEFAULT false,
    stop          boolean NOT NULL DEFAULT false,   -- the worker must stop these ranks
    stop_reason   text NOT NULL DEFAULT '',
    stop_sent     boolean NOT NULL DEFAULT false,
    stop_sent_at  timestamptz,
    released      boolean NOT NULL DEFAULT false,
    released_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, attempt, worker_id)
);
CREATE INDEX assignments_worker_active_idx ON assignments (worker_id) WHERE NOT released;
CREATE INDEX assignments_job_idx ON assignments (job_id, attempt);

CREATE TABLE rank_exits (
    job_id     uuid NOT NULL REFERENCES jobs (id),
    attempt    integer NOT NULL,
    rank       integer NOT NULL,
    worker_id  text NOT NULL,
    exit_code  integer NOT NULL,
    signal     integer NOT NULL DEFAULT 0,
    reason     text NOT NULL DEFAULT '',
    time       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt, rank)
);

-- Log lines, written only by COPY in batches. seq is assigned by kilnd and increases per job, so
-- (job_id, seq) is the key and followers resume by seq. Times are Unix microseconds: cheap to
-- write in bulk and to compare. No foreign key: kilnd checks the job once per batch, not per row.
CREATE TABLE logs (
    job_id   uuid NOT NULL,
    seq      bigint NOT NULL,
    attempt  integer NOT NULL,
    rank     integer NOT NULL,
    stream   text NOT NULL,
    time_us  bigint NOT NULL,
    line     text NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE INDEX logs_job_rank_seq_idx ON logs (job_id, rank, seq);
CREATE INDEX logs_job_time_idx ON logs (job_id, time_us);

-- Metric points, written only by COPY in batches; read by job and name in step order.
CREATE TABLE metrics (
    job_id   uuid NOT NULL,
    name     text NOT NULL,
    step     bigint NOT NULL,
    value    double precision NOT NULL,
    rank     integer NOT NULL,
    attempt  integer NOT NULL,
    time_us  bigint NOT NULL
);
CREATE INDEX metrics_job_name_step_idx ON metrics (job_id, name, step);
