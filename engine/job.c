/* job.c - eng_job_run: the parallel layer a job needs, around the one training loop. */
#include "engine/job.h"

#include <stdio.h>
#include <string.h>

#include "rank/rank.h"
#include "spec/spec.h"

void eng_job_info_deinit(eng_job_info_t *info)
{
    if (info)
        pipe_train_info_deinit(&info->pipe);
}

/* What eng_job_run acquired, released on every path. */
static void release(pipe_layer_t *ps, dp_t *d, comm_t *c, const comm_t *world)
{
    pipe_layer_destroy(ps);
    dp_destroy(d);
    if (!world)
        comm_destroy(c);
}

int eng_job_run(const spec_t *s, const eng_train_opts_t *opts, comm_t *world, eng_train_result_t *res,
                eng_job_info_t *info, kiln_err_t *err)
{
    comm_t *c = world;
    dp_t *d = NULL;
    pipe_layer_t *ps = NULL;
    eng_parallel_t par;
    eng_train_opts_t o = *opts;
    dp_opts_t dpo;
    int rc;
    if (res)
        memset(res, 0, sizeof(*res));
    if (info) {
        memset(info, 0, sizeof(*info));
        info->layout = "single";
    }
    bool pipelined = s->dist.mp_partitions > 1;
    if (!c && !pipelined && o.world <= 1) {
        o.parallel = NULL;
        return eng_train_run(s, &o, res, err);
    }
    if (!c) {
        comm_config_t cc;
        comm_config_init(&cc);
        comm_settings_apply(&cc, o.settings ? o.settings->comm : NULL);
        if ((rc = comm_create_from_env(&cc, &c, err)))
            return rc;
    }
    o.rank = comm_rank(c);
    o.world = comm_size(c);
    dp_opts_init(&dpo, s);
    dp_settings_apply(&dpo, o.settings);
    /* the watchdog is the rank contract's (the operator's, through the agent): device
     * collectives wait as long as comm's */
    rank_env_t re;
    if ((rc = rank_env_parse(NULL, &re, err)))
        goto fail;
    if (re.comm_watchdog_s > 0)
        dpo.watchdog_s = re.comm_watchdog_s;
    if (pipelined) {
        if ((rc = pipe_layer_create(c, s, &o, &dpo, &ps, err)))
            goto fail;
        pipe_parallel(ps, &par);
    } else {
        if ((rc = dp_create(c, &dpo, &d, err)))
            goto fail;
        dp_parallel(d, &par);
    }
    o.parallel = &par;
    rc = eng_train_run(s, &o, res, err);
    if (info) {
        info->layout = par.name;
        if (d)
            dp_get_stats(d, &info->dp);
        if (ps) {
            pipe_layer_dp_stats(ps, &info->dp);
            if (rc == 0)
                rc = pipe_layer_info(ps, &info->pipe, err);
        }
    }
    if (rc == 0 && d && o.rank == 0) {
        dp_stats_t st;
        dp_get_stats(d, &st);
        printf("dp: %lld steps on %d ranks, %lld buckets launched during backward, %.2f s waiting for gradients, "
               "%.2f s in collectives after the update, %.2f s waiting for all-gathered parameters\n",
               (long long)st.steps, o.world, (long long)st.early_launches, st.finish_wait_s, st.comm_s,
               st.params_wait_s);
        fflush(stdout);
    }
    release(ps, d, c, world);
    return rc;
fail:
    release(ps, d, c, world);
    return rc;
}
