-- 0007_control.sql - the control plane keeps its promises under faults: an idempotency key
-- remembers the request it was used for.

-- BLAKE2b-256 of the normalised spec of the request that created the job: the same
-- Idempotency-Key with another spec is refused (HTTP 422) instead of answered with this job.
ALTER TABLE jobs ADD COLUMN request_hash bytea;
