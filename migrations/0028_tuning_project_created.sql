-- 0028_tuning_project_created.sql - the tuning job list's keyset (created_at, id, newest first)
-- within a project, as jobs_project_created_idx serves the job list: a member's page of
-- GET /v1/tuning-jobs is one index walk over its projects' rows, not over every project's.
CREATE INDEX tuning_jobs_project_created_idx ON tuning_jobs (project, created_at DESC, id DESC);
