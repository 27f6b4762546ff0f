// types.ts - the shapes of kilnd's REST replies the UI reads (docs/contracts.md, api/openapi.yaml).
/* eslint-disable @typescript-eslint/no-explicit-any */

export interface Progress { step?: number; total_steps?: number; eta_s?: number | null }

export interface Job {
  id: string;
  name: string;
  state: string;
  reason: string;
  attempt: number;
  project?: string;
  queue?: string;
  priority?: number;
  tags?: Record<string, string>;
  world_size?: number;
  submitted_by?: string;
  created_at?: string;
  updated_at?: string;
  started_at?: string | null;
  ended_at?: string | null;
  progress?: Progress;
  // latest value per metric
  metrics?: Record<string, number | null>;
  // the columns a search asked for ("hp.lr", "metrics.val_loss.min"; null: the job has none)
  columns?: Record<string, number | null>;
  // per metric: GET /v1/jobs/{id} gives every one, a search those its columns name
  summaries?: Record<string, MetricSummary>;
  workers?: string[];
  // while the job waits to be placed (docs/contracts.md)
  pending?: Pending;
  spec?: any;
}

export interface Pending { position: number; missing: string; blocking_jobs: string[]; estimated_start?: string }

// A queue as GET /v1/queues answers (null quota: no limit; limits: a missing slot type is unlimited).
export interface SlotCounts { cpu?: number; gpu?: number }
export interface Queue {
  name: string;
  cohort: string | null;
  quota: SlotCounts | null;
  borrowing_limit: SlotCounts;
  lending_limit: SlotCounts;
  weight: number;
  projects: string[]; // "*": every project; to a non-admin only its own projects (and "*")
  fair_sharing: boolean;
  // which running jobs a job of the queue within its quota may preempt (answers carry both)
  preemption: QueuePreemption;
  usage: SlotCounts;
  pending: number;
  admitted: number;
  created_at?: string;
  created_by?: string;
  updated_at?: string;
}

export interface QueuePreemption {
  within_queue: 'lower_priority' | 'never';
  reclaim_within_cohort: 'any' | 'lower_priority' | 'never';
}

// A project as GET /v1/projects answers (role "": a cluster admin's listing of every project).
export interface Project { name: string; role: string; created_at: string; created_by: string; default_queue: string }

export interface JobPage { jobs: Job[]; next_page_token?: string }

// One metric of one job over the lowest rank that reported it (null while count is 0).
export interface MetricSummary {
  count: number;
  min: number | null; max: number | null; last: number | null;
  min_step: number | null; max_step: number | null; last_step: number | null;
  rank: number; attempt: number;
}

export interface JobEvent {
  seq: number;
  from_state: string | null;
  to_state: string;
  reason: string;
  time: string;
  attempt: number;
  actor?: string;
}

export interface LogLine { seq: number; rank: number; stream: string; time: string; line: string; attempt?: number }

export interface MetricPoint { step: number; value: number | null; time?: string; time_us?: number; rank?: number; attempt?: number }
export interface MetricSeries { name: string; points: MetricPoint[] }

export interface Worker {
  id: string;
  hostname: string;
  address?: string;
  slots: number;
  slots_free: number;
  slot_type: string;
  state: string;
  draining?: boolean;
  last_heartbeat?: string;
  registered_at?: string;
  cpu_cores?: number;
  version?: string;
  approval?: string;
  join_token?: string;
  cert_sha256?: string;
  registered_from?: string;
  data_roots?: string[];
}

export interface Artifact { name: string; size: number; sha256: string; created_at: string; attempt: number; worker_id?: string }

// Tuning jobs (GET /v1/tuning-jobs, GET /v1/tuning-jobs/{id}): a search whose trials are jobs.
export interface TuningParameter { type: 'integer' | 'continuous' | 'categorical'; min?: number; max?: number;
                                   scaling?: 'linear' | 'log' | 'reverse_log'; values?: (number | string | boolean)[] }
export interface TuningObjective { metric: string; goal?: 'minimize' | 'maximize' }
export interface TuningTrial {
  trial: number;
  job_id: string;
  parameters: Record<string, number | string | boolean>;
  objective: number | null; // the trial's latest value of the objective metric
  steps: number;
  rung: number;
  state: string; // its job's state
  rungs?: { rung: number; steps: number; objective: number }[]; // hyperband: the rungs it finished
  parent?: string; // warm start: the parent tuning job whose trial this is (history), absent for its own
}
export interface TuningWarmStart { parents: string[]; type: 'identical_data_and_algorithm' | 'transfer_learning' }
// A tuning job's states (base/tuning_states.h's list; tests/service/test_state.c checks this copy).
export type TuningState = 'RUNNING' | 'STOPPING' | 'COMPLETED' | 'FAILED' | 'STOPPED';
export interface TuningJob {
  id: string;
  name: string;
  project: string;
  state: TuningState;
  reason: string;
  strategy: string;
  objective: TuningObjective;
  max_jobs: number;
  max_parallel_jobs?: number;
  seed?: number;
  // the request as kilnd normalised it (scalings resolved): GET /v1/tuning-jobs/{id} only
  spec?: { parameters?: Record<string, TuningParameter>; hyperband?: { min_resource: number; max_resource: number; reduction_factor: number; brackets?: number; max_rungs?: number; sampler?: string }; [k: string]: any };
  trials?: TuningTrial[];
  // the list's best has job_id and objective only; parent: the warm start parent whose trial it is
  best?: { job_id: string; objective: number; parameters?: Record<string, number | string | boolean>; parent?: string | null } | null;
  warm_start?: TuningWarmStart | null;
  trials_done?: number; // the list's: trials whose jobs ended
  trials_running?: number; // the list's: trials whose jobs have not ended (not paused at a rung)
  events?: (Omit<JobEvent, 'attempt'> & { attempt?: number })[];
  trial_count?: number; // the list's: how many trials it has submitted
  submitted_by: string;
  created_at: string;
  updated_at: string;
  ended_at?: string | null;
}
export interface TuningJobPage { tuning_jobs: TuningJob[]; next_page_token?: string }
