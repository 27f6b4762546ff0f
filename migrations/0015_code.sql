-- 0015_code.sql - code archives uploaded for script jobs (POST /v1/code, TrainingService.UploadCode).
-- An archive's bytes are kept once in kilnd's artifact store (DIR/code/<digest>.tgz), named by
-- their SHA-256 (code_blobs: which store holds them); a project may use an archive only once it
-- uploaded those bytes itself (code_sources), so a digest another project uploaded is, to it, an
-- archive that does not exist. Jobs name archives in their spec ("source": "code:sha256:...").
CREATE TABLE code_blobs (
    digest      text PRIMARY KEY CHECK (digest ~ '^[0-9a-f]{64}$'),
    size        bigint NOT NULL CHECK (size > 0),
    files       int NOT NULL CHECK (files > 0),
    store_id    text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE code_sources (
    project     text NOT NULL REFERENCES projects (name) ON DELETE CASCADE,
    digest      text NOT NULL REFERENCES code_blobs (digest),
    uploaded_by text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project, digest)
);
CREATE INDEX code_sources_digest_idx ON code_sources (digest);
