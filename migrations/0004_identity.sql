-- 0004_identity.sql - who may do what: users and their API tokens (stored only as hashes),
-- projects (the tenant boundary; a job's `project`) with per-project roles, the credentials
-- agents carry, and who caused each job event.

CREATE TABLE users (
    name           text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    cluster_admin  boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    created_by     text NOT NULL DEFAULT ''
);

-- An API token: `hash` is BLAKE2b-256 of the secret (the secret itself is shown once and never
-- stored). Revoked and expired tokens stay listed until their user is gone.
CREATE TABLE tokens (
    id            text PRIMARY KEY,
    user_name     text NOT NULL REFERENCES users (name) ON DELETE CASCADE,
    hash          bytea NOT NULL UNIQUE,
    description   text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    revoked_at    timestamptz,
    last_used_at  timestamptz
);
CREATE INDEX tokens_user_idx ON tokens (user_name, created_at);

CREATE TABLE projects (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL DEFAULT ''
);
-- Every job so far ran in "default" (or a project its spec named): those projects exist.
INSERT INTO projects (name, created_by)
    SELECT DISTINCT project, 'migration' FROM jobs
    WHERE project ~ '^[a-z0-9][a-z0-9._-]{0,62}$'
    ON CONFLICT DO NOTHING;
INSERT INTO projects (name, created_by) VALUES ('default', 'migration') ON CONFLICT DO NOTHING;

CREATE TABLE project_members (
    project    text NOT NULL REFERENCES projects (name) ON DELETE CASCADE,
    user_name  text NOT NULL REFERENCES users (name) ON DELETE CASCADE,
    role       text NOT NULL CHECK (role IN ('viewer', 'editor', 'admin')),
    PRIMARY KEY (project, user_name)
);
CREATE INDEX project_members_user_idx ON project_members (user_name);

-- An agent's credential (BLAKE2b-256 of the secret kilnd issued at its last registration) and
-- the directories its jobs may read.
ALTER TABLE workers ADD COLUMN credential_hash bytea UNIQUE;
ALTER TABLE workers ADD COLUMN data_roots jsonb NOT NULL DEFAULT '[]';

ALTER TABLE jobs ADD COLUMN submitted_by text NOT NULL DEFAULT '';
-- The files the job reads and its checkpoint directory: the scheduler places it only on workers
-- whose data roots hold them all.
ALTER TABLE jobs ADD COLUMN data_paths jsonb NOT NULL DEFAULT '[]';
CREATE INDEX jobs_project_created_idx ON jobs (project, created_at DESC, id DESC);
ALTER TABLE job_events ADD COLUMN actor text NOT NULL DEFAULT '';
