-- 0025_gin_pending_list.sql - a small pending list for the GIN indexes of jobs. Every write of a
-- job's row (an admission, a state an agent reports) adds its tags and its name's trigrams to
-- these indexes' pending list, and the statement that finds the list full merges it into the
-- index while it waits. At PostgreSQL's default limit (4 MB) that merge took ~45 ms in one
-- statement on the scheduler benchmark's 10,000 jobs (24 ms for 2.2 MB, measured with
-- gin_clean_pending_list), stalling whichever write met it and taking a CPU from the others; at
-- 256 kB each merge is ~3 ms for the same work in total, and searches by name scan a shorter list.
ALTER INDEX jobs_tags_idx SET (gin_pending_list_limit = 256);
ALTER INDEX IF EXISTS jobs_name_trgm_idx SET (gin_pending_list_limit = 256);
