-- 0024_project_default_queue.sql - a project's default queue (issue 28): the queue a job of the
-- project goes to when its spec names none. 'default' (the queue every cluster starts with, which
-- cannot be deleted) is what a project nobody configured uses, as before this migration. The
-- reference keeps a queue that is some project's default from being deleted (kilnd refuses that
-- with a 409 naming the project before the database would).
ALTER TABLE projects ADD COLUMN default_queue text NOT NULL DEFAULT 'default' REFERENCES queues (name);
CREATE INDEX projects_default_queue_idx ON projects (default_queue);
