/* job.h - kiln-train's one entry into the training loop: eng_job_run picks the parallel layer a
 * job's spec and world call for (none, data parallelism, or the pipeline with data-parallel
 * replicas in each stage) and runs eng_train_run with it. It is not the loop (engine/train.c)
 * nor the layers (engine/dp/, engine/pipe/). */
#ifndef KILN_ENGINE_JOB_H
#define KILN_ENGINE_JOB_H

#include "engine/comm/comm.h"
#include "engine/dp/dp.h"
#include "engine/engine.h"
#include "engine/pipe/pipe.h"

/* What a run measured besides eng_train_result_t. */
typedef struct eng_job_info {
    const char *layout;      /* "single", "data parallel", "pipeline" (static storage) */
    dp_stats_t dp;           /* the data-parallel layer's counters (the stage's, in a pipeline) */
    pipe_train_info_t pipe;  /* a pipelined run's figures; release with eng_job_info_deinit */
} eng_job_info_t;

void eng_job_info_deinit(eng_job_info_t *info); /* accepts NULL */

struct spec;
/* Runs spec s as one rank of its job. world is the job's group (borrowed); NULL joins the ranks
 * from the rank contract's environment when the job has more than one (comm_create_from_env)
 * and leaves them before returning. distribution.model_parallel.partitions > 1 trains as a
 * pipeline; otherwise a world of more than one rank trains data-parallel (options from the spec,
 * then opts->settings: dp_settings_apply); one rank trains alone. opts->rank and opts->world
 * are taken from the group. res as eng_train_run's; info (may be NULL) OUT. Returns
 * eng_train_run's statuses, or the group's (KILN_ECOMM naming a dead rank, KILN_ETIMEDOUT). */
int eng_job_run(const struct spec *s, const eng_train_opts_t *opts, comm_t *world,
                eng_train_result_t *res, eng_job_info_t *info, kiln_err_t *err);

#endif /* KILN_ENGINE_JOB_H */
