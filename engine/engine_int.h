/* engine_int.h - what the training loop's files share (train.c, train_setup.c, train_state.c):
 * the run's state and the steps each file provides. Nothing outside engine/ includes it. */
#ifndef KILN_ENGINE_INT_H
#define KILN_ENGINE_INT_H

#include <stdio.h>

#include "engine/engine.h"
#include "spec/spec.h"

/* One run of eng_train_run. */
typedef struct eng_run {
    const spec_t *spec;          /* borrowed */
    const eng_train_opts_t *o;   /* borrowed */
    const eng_parallel_t *par;   /* borrowed; NULL: a single process */
    const eng_backend_t *be;
    bool tokens;                 /* token sequences (text, llm.c shards); else synthetic examples */
    bool bf16;                   /* mixed precision: bf16 GEMMs, fp32 master weights */
    eng_geometry_t geo;
    int rank, world;
    eng_model_t model;           /* the model (model.ops NULL until built) */
    void *acts;                  /* the loop's activations (geo.B sequences); NULL when the
                                  * parallel layer runs the passes */
    eng_params_t *p;             /* borrowed from the model */
    float *m, *v;                /* (n) AdamW moments in the flat layout; owned */
    float dloss;
    eng_share_t share;
    eng_tokens_t train, val;
    eng_sampler_t ts;            /* training sampler */
    eng_synth_t synth;           /* synthetic examples */
    int32_t *tok, *tgt;          /* (B*T) host tokens and targets, or (B) labels */
    float *xbuf;                 /* (B, n_in) host features (synthetic examples) */
    eng_rng_t sample_rng;
    FILE *samples;
    bool checkpoints;            /* rank 0 has a checkpoint directory */
    bool writes_model;           /* rank 0 has an output directory */
    bool metrics_broken;         /* a metric record could not be written (said once) */
    /* the checkpoint the job resumes from: the rank holding it and its step (-1, 0: none) */
    int resume_src;
    int64_t resume_step;
    char resume_path[SPEC_PATH + 64];
} eng_run_t;

/* ---- train_setup.c ---- */
/* Resolves a data path (absolute, the working directory, the spec's directory and its parent,
 * $KILN_ROOT) into out (size n). */
void eng_resolve_path(const char *in, const char *spec_dir, char *out, size_t n);
/* Builds the model (initialised over the rank's held ranges, or loaded from init_from), the
 * optimizer state and, for the loop's own passes, activations. */
int eng_run_setup_model(eng_run_t *r, int head_blocks, kiln_err_t *err);
/* Loads the data and the training sampler (this replica's shard). */
int eng_run_setup_data(eng_run_t *r, kiln_err_t *err);
/* The model's parameters over the rank's held ranges, from model.init_from or the seed. */
int eng_run_init_params(eng_run_t *r, kiln_err_t *err);
void eng_run_deinit(eng_run_t *r);
/* The whole model as the rank's share (one range each), before a parallel layer narrows it. */
int eng_run_share_all(eng_run_t *r, kiln_err_t *err);

/* ---- train_state.c ---- */
/* Finds the newest checkpoint of every rank's directory: sets resume_src and resume_step, and
 * from rank 0's options checkpoints and writes_model (collective). */
int eng_run_find_resume(eng_run_t *r, kiln_err_t *err);
/* Loads the resume checkpoint on resume_src and hands it to every rank (collective). */
int eng_run_load_resume(eng_run_t *r, int64_t *start, kiln_err_t *err);
/* Writes a checkpoint of step (collective: the parallel layer gathers to rank 0). */
int eng_run_checkpoint(eng_run_t *r, int64_t step, kiln_err_t *err);
/* Rank 0 samples text (collective: the parameters are gathered first). */
void eng_run_sample(eng_run_t *r, int64_t step);
/* Rank 0 writes output_dir/model_llmc.bin (collective). */
int eng_run_write_model(eng_run_t *r, kiln_err_t *err);
/* Gives back the pages of params and grads outside the held ranges, and of m and v outside the
 * update ranges. */
void eng_run_release(eng_run_t *r);
/* Element-wise sum of x (n doubles) over every rank, added in rank order: the same bits on
 * every rank (collective; a single process keeps x). */
int eng_run_sum(eng_run_t *r, double *x, int n, kiln_err_t *err);
/* Writes a metric record to the metrics fd (rank 0). */
void eng_run_metric(eng_run_t *r, int64_t step, const char *const *names, const double *vals,
                    int n);

#endif /* KILN_ENGINE_INT_H */
