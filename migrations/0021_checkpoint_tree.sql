-- 0019_checkpoint_tree.sql - a job's checkpoint directory is synced as a tree (scripts write
-- subdirectories such as checkpoint-500/): a checkpoint file's name is its path relative to the
-- directory, up to 16 names joined by '/', each an artifact name (kiln_artifact_path_ok).
ALTER TABLE checkpoint_files DROP CONSTRAINT checkpoint_files_name_check;
ALTER TABLE checkpoint_files ADD CONSTRAINT checkpoint_files_name_check CHECK (
    length(name) <= 512
    AND name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,15}$');
