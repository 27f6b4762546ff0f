-- 0013_agent_trust.sql - what an agent is trusted with and how it earns it: join tokens managed
-- by cluster admins (limited uses, an expiry), what each registration was made with (the join
-- token, the client certificate, the source address), an approval state, and bans that keep a
-- removed worker's id and certificate from registering again.

-- A join token: `hash` is BLAKE2b-256 of the secret (shown once, never stored). A registration
-- consumes one use (uses_left), in one UPDATE, so replicas never hand out more than `uses`.
CREATE TABLE join_tokens (
    id             text PRIMARY KEY,
    hash           bytea NOT NULL UNIQUE,
    description    text NOT NULL DEFAULT '',
    uses           integer NOT NULL CHECK (uses >= 1),
    uses_left      integer NOT NULL CHECK (uses_left >= 0 AND uses_left <= uses),
    registrations  integer NOT NULL DEFAULT 0 CHECK (registrations >= 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    created_by     text NOT NULL DEFAULT '',
    expires_at     timestamptz NOT NULL,
    revoked_at     timestamptz,
    last_used_at   timestamptz
);
CREATE INDEX join_tokens_created_idx ON join_tokens (created_at, id);

-- How a worker registered: the join token (its id, "file" for kilnd's --join-token-file, "" with
-- authentication off), the SHA-256 of the client certificate it presented (lower-case hex of the
-- DER; NULL without mutual TLS) to which every later call of the worker is bound, and the address
-- the registration came from. approval: PENDING workers (kilnd --agent-approval) get no work
-- until a cluster admin approves them. removed_at: a cluster admin removed it (it is DEAD, its
-- credential is gone and it is no longer listed).
ALTER TABLE workers ADD COLUMN join_token text NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN cert_sha256 text CHECK (cert_sha256 ~ '^[0-9a-f]{64}$');
ALTER TABLE workers ADD COLUMN registered_from text NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN approval text NOT NULL DEFAULT 'APPROVED'
    CHECK (approval IN ('PENDING', 'APPROVED'));
ALTER TABLE workers ADD COLUMN approved_by text NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN approved_at timestamptz;
ALTER TABLE workers ADD COLUMN removed_at timestamptz;
ALTER TABLE workers ADD COLUMN removed_by text NOT NULL DEFAULT '';
CREATE INDEX workers_cert_idx ON workers (cert_sha256) WHERE cert_sha256 IS NOT NULL;

-- A ban: a worker id, a certificate, or both, that may not register.
CREATE TABLE worker_bans (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker_id     text,
    cert_sha256   text CHECK (cert_sha256 ~ '^[0-9a-f]{64}$'),
    reason        text NOT NULL DEFAULT '',
    banned_by     text NOT NULL DEFAULT '',
    banned_at     timestamptz NOT NULL DEFAULT now(),
    CHECK (worker_id IS NOT NULL OR cert_sha256 IS NOT NULL)
);
CREATE INDEX worker_bans_worker_idx ON worker_bans (worker_id) WHERE worker_id IS NOT NULL;
CREATE INDEX worker_bans_cert_idx ON worker_bans (cert_sha256) WHERE cert_sha256 IS NOT NULL;

-- Provenance of artifacts is the artifacts' worker_id (0006): the worker whose credential
-- uploaded the file.
