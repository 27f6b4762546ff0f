-- 0027_queue_preemption.sql - a queue's preemption policy (as Kueue's ClusterQueue
-- spec.preemption): which running jobs a job of this queue within its nominal quota may preempt.
-- preempt_within_queue: its own queue's jobs of lower priority (lower_priority) or none (never);
-- reclaim_within_cohort: the jobs of queues of its cohort that borrow beyond their quota, any of
-- them (any), those of lower priority (lower_priority) or none (never). The defaults are the rule
-- every queue had before: a queue that sets nothing behaves as it did.
ALTER TABLE queues
    ADD COLUMN preempt_within_queue text NOT NULL DEFAULT 'lower_priority'
        CHECK (preempt_within_queue IN ('lower_priority', 'never')),
    ADD COLUMN reclaim_within_cohort text NOT NULL DEFAULT 'any'
        CHECK (reclaim_within_cohort IN ('any', 'lower_priority', 'never'));
