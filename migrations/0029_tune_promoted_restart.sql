-- 0029_tune_promoted_restart.sql - what kilnd's --tune-promoted-restart (a benchmark's baseline:
-- a promoted hyperband trial trains again from step 0 instead of resuming) needs: the attempt that
-- starts from step 0 (the assignment's fresh_start), and the steps the job trained before it
-- restarted, which its progress_step (the current attempt's) no longer counts.
ALTER TABLE jobs ADD COLUMN fresh_attempt integer CHECK (fresh_attempt IS NULL OR fresh_attempt >= 1);
ALTER TABLE jobs ADD COLUMN retrained_steps bigint NOT NULL DEFAULT 0 CHECK (retrained_steps >= 0);
