-- 0003_worker_draining.sql - a worker whose agent is shutting down (preemption, maintenance)
-- keeps heartbeating while its ranks stop, but takes no new placements. Registering again
-- clears the flag.
ALTER TABLE workers ADD COLUMN draining boolean NOT NULL DEFAULT false;
