-- 0026_idempotency_key_per_project.sql - an idempotency key is its project's. It was unique across
-- the cluster: a team's retry key that another team's job already held refused the team's job
-- (422) and told it that some other project had used the key. Two projects may now each hold the
-- same key; within one project a key still names one job.
ALTER TABLE jobs DROP CONSTRAINT jobs_idempotency_key_key;
ALTER TABLE jobs ADD CONSTRAINT jobs_project_idempotency_key_key UNIQUE (project, idempotency_key);
