-- 0014_ckpt_project_areas.sql - a job's checkpoints under checkpoint.path go to its project's
-- area, <checkpoint.path>/.kiln/<project>/<job id>, which no job of another project may read.
-- A job that has not ended when this runs keeps the directory it started with,
-- <checkpoint.path>/<job id>, for the rest of its life: its next attempt resumes from what the
-- last one wrote there (kilnd's assignment names that directory while ckpt_flat_dir is true).
ALTER TABLE jobs ADD COLUMN ckpt_flat_dir boolean NOT NULL DEFAULT false;
UPDATE jobs SET ckpt_flat_dir = true
 WHERE state NOT IN ('COMPLETED', 'FAILED', 'STOPPED') AND spec->'checkpoint' ? 'path';
