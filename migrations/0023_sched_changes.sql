-- 0023_sched_changes.sql - what the scheduler's pass needs to read only the waiting jobs that
-- changed since its last pass (store_job_pending_changes): sched_xid is the transaction that last
-- wrote a column the pass reads of a job (set on insert, and by the trigger on any update that
-- sets one of them); a row is new to a pass when its sched_xid was not visible in the previous
-- pass's snapshot (pg_visible_in_snapshot), whatever order transactions committed in.
-- job_forget.xid is the last transaction that deleted jobs: one the previous snapshot did not see
-- makes the pass read every waiting job again. Rows from before this migration have no sched_xid;
-- a pass's first read is always a full one.
ALTER TABLE jobs ADD COLUMN sched_xid xid8;
ALTER TABLE jobs ALTER COLUMN sched_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX jobs_sched_xid_idx ON jobs (sched_xid);

CREATE FUNCTION jobs_sched_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.sched_xid := pg_current_xact_id();
    RETURN NEW;
END $$;
CREATE TRIGGER jobs_sched_touch BEFORE UPDATE OF id, state, slot_type, attempt, max_attempts, priority, nodes,
    slots_per_node, world_size, stop_requested, total_steps, ckpt_flat_dir, queue, project, preemptions,
    preempted_by, last_preempted_by, created_at, data_paths, sched_xid ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_sched_touch();

CREATE TABLE job_forget (one boolean PRIMARY KEY DEFAULT true CHECK (one), xid xid8 NOT NULL);
INSERT INTO job_forget (xid) VALUES (pg_current_xact_id());
CREATE FUNCTION jobs_sched_forget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_forget SET xid = pg_current_xact_id();
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_sched_forget AFTER DELETE OR TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_sched_forget();
