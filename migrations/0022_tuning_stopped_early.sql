-- 0022_tuning_stopped_early.sql - early_stopping "auto" (the median stopping rule, issue 29): a
-- trial the tuning controller stops early keeps why in stop_reason (its job ends STOPPED with the
-- generic "stopped on request" reason; the tuning job's trials show this one). NULL: not stopped
-- early.
ALTER TABLE tuning_trials ADD COLUMN stop_reason text;
