-- 0030_tune_restart_step.sql - the step a job under kilnd's --tune-promoted-restart had reached when
-- its promotion restarted it from step 0 (its checkpoints up to there stay in its directories): a
-- later attempt that follows one lost or preempted before it trained back to that step trains
-- from step 0 too, instead of resuming from a checkpoint the restart set aside.
ALTER TABLE jobs ADD COLUMN restart_step bigint NOT NULL DEFAULT 0 CHECK (restart_step >= 0);
