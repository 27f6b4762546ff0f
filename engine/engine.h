/* engine.h - kiln's training engine, public interface: the model interface (a table of
 * functions each model implements) and its two models (GPT, MLP) as sequences of blocks over flat
 * parameter/gradient buffers, data loading, checkpoints and the training loop. Ops live behind
 * engine/backend.h; collectives (engine/comm/) and parallel schedules build on the per-block
 * entry points and the trainer hooks declared here; what each model and backend can do is
 * spec.h's capability table. It is not a general framework: models written out by hand, llm.c
 * style. */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/backend.h"

/* ============================================================================================
 * Flat parameter buffers
 * ============================================================================================ */

/* One named tensor inside a model's flat parameter buffer. */
typedef struct eng_tensor {
    const char *name; /* static storage: "wte", "qkvw", ... */
    size_t off, n;    /* element offset and count in the flat buffer */
    bool decay;       /* 2-D weight: AdamW weight decay applies */
} eng_tensor_t;

/* A contiguous element range of the flat buffer. */
typedef struct eng_range {
    size_t off, n;
} eng_range_t;

#define ENG_MAX_TENSORS 40

/* A growing list of flat-buffer ranges (heap). Zero-initialise; release with eng_ranges_deinit. */
typedef struct eng_ranges {
    eng_range_t *r; /* (n) owned */
    int n, cap;
} eng_ranges_t;

/* Appends [off, off + n) (n > 0; empty ranges are skipped). Returns 0 or KILN_ENOMEM. */
int eng_ranges_add(eng_ranges_t *l, size_t off, size_t n);
void eng_ranges_clear(eng_ranges_t *l); /* n = 0; keeps the memory */
void eng_ranges_deinit(eng_ranges_t *l);

/* Parameters and gradients of one model: two slabs of n floats each (device memory), with the
 * tensor table describing their common layout. Optimizer state lives in the trainer. */
typedef struct eng_params {
    size_t n;          /* total parameters */
    float *params;     /* (n) device; owned */
    float *grads;      /* (n) device; owned */
    int n_tensors;
    eng_tensor_t tensors[ENG_MAX_TENSORS];
} eng_params_t;

/* Called during backward when gradients are final for this microbatch set (the data-parallel
 * layer starts all-reducing them): the first `ranges` of `block`'s ranges (as the model's
 * block_ranges lists them: a GPT layer half lists its parameters in the order backward finishes
 * them, so its output projection's gradient can travel while the rest of the half is computed),
 * and ENG_RANGES_ALL once the whole block is done. Blocks come last to first. */
#define ENG_RANGES_ALL 0x7fffffff
typedef void (*eng_grads_ready_fn)(void *ctx, int block, int ranges);

/* ============================================================================================
 * Models: each is one table of functions (eng_model_ops_t), what the training loop, the
 * data-parallel layer, the pipeline and the checkpoints need of it, so none of them asks which
 * model it holds. GPT-2 (gpt.c) and the MLP classifier (mlp.c) implement it. The models are the
 * rows of the spec's capability table (spec.h's SPEC_MODEL_MAP: model.type name is implemented
 * by eng_<name>_model), whose row also says which optional groups below a model offers.
 * ============================================================================================ */

struct spec_model;
struct eng_rng;
typedef struct eng_model_ops eng_model_ops_t;

/* One microbatch's data, host memory. */
typedef struct eng_batch {
    int B;                  /* sequences (examples) */
    const int32_t *tokens;  /* (B, T) input tokens; NULL for feature data */
    const float *x;         /* (B, n_inputs) features; NULL for token data */
    const int32_t *targets; /* (B, T) next tokens or (B) labels; NULL: no loss */
} eng_batch_t;

/* How a model is built, besides its spec section. */
typedef struct eng_model_opts {
    int B;           /* the largest microbatch, in sequences (examples) */
    int head_blocks; /* blocks a pipeline cuts the head into (1: whole) */
    bool recompute;  /* activation checkpointing (the RECOMPUTE capability) */
    bool bf16;       /* mixed precision (the BF16 capability) */
} eng_model_opts_t;

/* A model as its users hold it (the loop's storage; ops->create fills it). */
typedef struct eng_model {
    const eng_model_ops_t *ops;
    void *impl;            /* the model's own state (eng_gpt_t *, eng_mlp_t *); owned */
    eng_params_t *p;       /* its parameters and gradients; borrowed from impl */
    int n_blocks;          /* the blocks of backward's grads_ready and of block_ranges */
    uint64_t hash;         /* configuration fingerprint: a checkpoint of another is refused */
    double flops_per_item; /* training FLOPs per token (sequence models) or example: MFU */
} eng_model_t;

/* Mixed precision (BF16): a bf16 copy of the weights beside the fp32 masters. */
typedef struct eng_model_bf16 {
    uint16_t *(*weights)(void *impl);                    /* (n) flat layout; borrowed */
    void (*refresh)(void *impl, size_t off, size_t n);  /* rounds params [off, off+n) into it */
} eng_model_bf16_t;

/* Model files (INIT_FILE, INIT_JOB): the format model.init_from names and the final model is. */
typedef struct eng_model_file {
    const char *name;   /* the final model's file name in the output directory */
    const char *format; /* what the log calls the format ("llm.c") */
    /* Loads the held ranges of the parameters from the file at path after checking it holds a
     * model of this configuration. fetched: a copy kiln-agent put in place (not confined to the
     * data roots). 0, KILN_EINVAL (another configuration), or the reader's status. */
    int (*load)(eng_model_t *m, const char *path, bool fetched, const eng_range_t *held, int n_held,
                kiln_err_t *err);
    /* Writes the whole model to path (atomically). */
    int (*write)(const eng_model_t *m, const char *path, kiln_err_t *err);
} eng_model_file_t;

/* What a pipeline stage does with a model cut into blocks (PIPELINE). acts is an activation set
 * of ops->acts_create. Block b writes boundary(b), which block b+1 reads; the first block reads
 * the batch's tokens, the last writes the losses. From head_first on, the blocks hold the head,
 * cut into opts.head_blocks; each holds rows head_rows(j) of the tied tensor, which block 0
 * holds too (the embedding and the LM head share it). */
typedef struct eng_model_pipe {
    int (*head_first)(const void *impl);
    /* the tied tensor (index in p->tensors) and its row length; rows [*r0, *r1) for head block j */
    int tied_tensor;
    size_t (*tied_row)(const void *impl);
    void (*head_rows)(const void *impl, int j, int *r0, int *r1);
    void (*set_batch)(void *impl, void *acts, const eng_batch_t *b);
    void (*block_forward)(void *impl, void *acts, int block, bool has_targets);
    /* dout: the gradient of the block's output (NULL for the last); din (overwritten; may be
     * NULL for block 0) receives its input's; din must not alias dout */
    void (*block_backward)(void *impl, void *acts, int block, const float *dout, float *din,
                           float dloss);
    float *(*boundary)(void *impl, void *acts, int i);
    size_t (*boundary_floats)(const void *impl, int B, int T, int i); /* sent forward */
    size_t (*grad_floats)(const void *impl, int B, int T, int i);     /* sent back */
    size_t (*max_boundary_floats)(const void *impl, int B, int T);
    /* two scratch buffers of max_boundary_floats (k = 0, 1) for the gradients between blocks */
    float *(*grad_scratch)(void *impl, int k);
    /* the mean of the last block's losses */
    double (*loss)(void *impl, void *acts);
    /* memory for measurements: an activation set's, and the model's workspace (bytes) */
    void (*acts_memory)(const void *impl, const void *acts, const void **start, size_t *bytes);
    void (*work_memory)(const void *impl, const void **start, size_t *bytes);
} eng_model_pipe_t;

struct eng_model_ops {
    const char *name; /* model.type */
    /* Builds the model of spec section sm on be with o (parameters uninitialised) into *out.
     * Returns 0, KILN_EINVAL (a configuration it cannot build), KILN_ENOMEM. */
    int (*create)(const struct spec_model *sm, const eng_backend_t *be, const eng_model_opts_t *o,
                  eng_model_t *out, kiln_err_t *err);
    void (*destroy)(eng_model_t *m); /* accepts a model create did not fill */
    /* Initialises the parameters of ranges from seed: each value is the same whichever ranges
     * are asked, so ranks holding parts of the model agree with a whole one. */
    int (*init)(eng_model_t *m, uint64_t seed, const eng_range_t *ranges, int n, kiln_err_t *err);
    /* The block's parameter ranges (OUT, up to ENG_MAX_TENSORS), in the order its backward
     * finishes them; returns the count. */
    int (*block_ranges)(const void *impl, int block, eng_range_t *out);
    /* An activation set for microbatches of up to B (<= opts.B). Caller owns *out
     * (acts_destroy). */
    int (*acts_create)(eng_model_t *m, int B, void **out, kiln_err_t *err);
    void (*acts_destroy)(eng_model_t *m, void *acts); /* accepts NULL */
    /* Forward of batch b; block_start (may be NULL) is called before a block's parameters are
     * read (-1: all of them, once). Returns the mean loss. */
    float (*forward)(eng_model_t *m, void *acts, const eng_batch_t *b,
                     void (*block_start)(void *ctx, int block), void *ctx);
    /* Backward of the last forward on acts; parameter gradients accumulate; ready (may be NULL)
     * reports final gradients, blocks last to first. dloss: d(objective)/d(one item's loss). */
    void (*backward)(eng_model_t *m, void *acts, float dloss, eng_grads_ready_fn ready, void *ctx);
    /* Optional (NULL when the model has none): the fraction of the last forward's examples
     * classified right (reported with the validation loss). */
    double (*accuracy)(eng_model_t *m, void *acts);
    /* Optional: n tokens of text after prompt (sequence models of a byte vocabulary), as
     * eng_gpt_sample. */
    int (*sample)(eng_model_t *m, const int32_t *prompt, int n_prompt, int n, double temperature,
                  int top_k, struct eng_rng *rng, int32_t *out_tokens, kiln_err_t *err);
    /* Optional groups, present exactly when the capability table's row says so (tested). */
    const eng_model_bf16_t *bf16;
    const eng_model_file_t *file;
    const eng_model_pipe_t *pipe;
};

/* The model of model.type name (the capability table's rows), or NULL. Static storage. */
const eng_model_ops_t *eng_model_find(const char *name);

/* ============================================================================================
 * GPT-2
 * ============================================================================================ */

typedef struct eng_gpt_config {
    int max_seq_len;       /* T: context length (wpe rows) */
    int vocab_size;        /* V: real vocabulary */
    int padded_vocab_size; /* Vp >= V: rows of wte (padding rows never receive gradient) */
    int n_layer;           /* L */
    int n_head;            /* NH */
    int n_embd;            /* C */
} eng_gpt_config_t;

/* Views of the 16 GPT-2 tensors into a flat buffer, in llm.c's order. */
typedef struct eng_gpt_weights {
    float *wte;      /* (Vp, C) token embedding, tied to the LM head */
    float *wpe;      /* (T, C) */
    float *ln1w;     /* (L, C) */
    float *ln1b;     /* (L, C) */
    float *qkvw;     /* (L, 3C, C) */
    float *qkvb;     /* (L, 3C) */
    float *attprojw; /* (L, C, C) */
    float *attprojb; /* (L, C) */
    float *ln2w;     /* (L, C) */
    float *ln2b;     /* (L, C) */
    float *fcw;      /* (L, 4C, C) */
    float *fcb;      /* (L, 4C) */
    float *fcprojw;  /* (L, C, 4C) */
    float *fcprojb;  /* (L, C) */
    float *lnfw;     /* (C) */
    float *lnfb;     /* (C) */
} eng_gpt_weights_t;
#define ENG_GPT_NTENSORS 16

/* Saved activations of one microbatch (B sequences of T tokens). A pipeline keeps one of these
 * per microbatch in flight; a single process needs one. All device memory, one slab. */
typedef struct eng_gpt_acts {
    int B, T;
    int32_t *tokens;   /* (B,T) */
    int32_t *targets;  /* (B,T) */
    float *resid;      /* (L+1, B,T,C): resid[0] = embedding output, resid[l] = layer l output */
    float *ln1;        /* (L, B,T,C) */
    float *ln1_mean;   /* (L, B,T) */
    float *ln1_rstd;   /* (L, B,T) */
    float *qkv;        /* (L, B,T,3C) */
    float *att;        /* (L, B,NH,T,T) softmax probabilities */
    float *atty;       /* (L, B,T,C) attention output before the projection */
    float *resid2;     /* (L, B,T,C) residual stream after the attention branch */
    float *ln2;        /* (L, B,T,C) */
    float *ln2_mean;   /* (L, B,T) */
    float *ln2_rstd;   /* (L, B,T) */
    float *fch;        /* (L, B,T,4C) */
    float *fch_gelu;   /* (L, B,T,4C) */
    float *lnf;        /* (B,T,C), followed by hstats */
    float *hstats;     /* (4, B,T) a split head's running softmax statistics (backend.h) */
    float *lnf_mean;   /* (B,T) */
    float *lnf_rstd;   /* (B,T) */
    float *probs;      /* (B,T,Vp) logits, then softmax, then (after backward) dlogits */
    float *losses;     /* (B,T) per-token loss */
    float *slab;       /* owned */
    size_t bytes;
    float *host_losses; /* (B,T) host copy; owned */
} eng_gpt_acts_t;

typedef struct eng_gpt {
    eng_gpt_config_t cfg;
    const eng_backend_t *be;  /* borrowed */
    eng_params_t p;
    eng_gpt_weights_t w;      /* views into p.params */
    eng_gpt_weights_t g;      /* views into p.grads */
    int head_blocks;          /* blocks the head is split into (1 unless set; pipelines) */
    /* set by eng_gpt_backward while it runs: told when part of a block's gradients is final */
    void (*part_ready)(void *ctx, int block, int ranges);
    void *part_ctx;
    /* set by the training loop around its forward passes: told before eng_gpt_forward runs a
     * block (the head's blocks included), so parameters still arriving can be waited for */
    void (*block_start)(void *ctx, int block);
    void *block_ctx;
    bool recompute;           /* activation checkpointing (eng_gpt_set_recompute) */
    float *work;              /* owned, with recompute: one block's activations (below) */
    size_t work_bytes;
    const eng_gpt_acts_t *work_acts[3]; /* what the workspace's regions were computed for */
    int work_block[3];
    bool bf16;                /* bf16 GEMMs (eng_gpt_set_bf16) */
    uint16_t *wbf;            /* (n) owned, with bf16: the weights in bf16, flat layout */
    uint16_t *xbf;            /* (B,T,max(4C,...)) owned: a GEMM input in bf16 */
    uint16_t *dbf;            /* (B,T,max(4C,Vp)) owned: a GEMM output gradient in bf16 */
    int scratch_B, scratch_T; /* batch the backward scratch is sized for */
    float *scratch;           /* owned slab: */
    float *d_a, *d_b;         /* boundary gradients (eng_gpt_max_boundary_floats), ping-pong */
    float *d_bt;              /* (B,T,C) */
    float *d_qkv;             /* (B,T,3C) */
    float *d_fch;             /* (B,T,4C) */
    float *d_att;             /* (B,NH,T,T) */
} eng_gpt_t;

/* Parameter count for a config. */
size_t eng_gpt_num_params(const eng_gpt_config_t *cfg);
/* Model FLOPs per token for training (forward + backward): 6N + 6*L*C*T (N excludes wpe,
 * per the PaLM appendix convention used by llm.c's MFU; the attention term counts T). */
double eng_gpt_flops_per_token(const eng_gpt_config_t *cfg);

/* Creates a GPT on backend be: plans and allocates parameters, gradients and backward scratch
 * for microbatches of up to B sequences of cfg->max_seq_len tokens. Parameters start at zero;
 * call eng_gpt_init_weights or load them. Caller owns *out; free with eng_gpt_destroy().
 * Returns KILN_EINVAL (bad config, in err) or KILN_ENOMEM. */
int eng_gpt_create(const eng_gpt_config_t *cfg, const eng_backend_t *be, int B, eng_gpt_t **out,
                   kiln_err_t *err);
void eng_gpt_destroy(eng_gpt_t *m);
/* GPT-2 initialisation from seed: weights N(0, 0.02), residual projections (attprojw, fcprojw)
 * N(0, 0.02/sqrt(2L)), LayerNorm weights 1, biases 0, padded wte rows 0. */
void eng_gpt_init_weights(eng_gpt_t *m, uint64_t seed);
/* The same initialisation of the given ranges of the flat buffer only (n ranges, any order):
 * every parameter in them gets the value eng_gpt_init_weights gives it (the random stream is
 * drawn in full and the values outside the ranges are dropped) and nothing outside them is
 * written, so a rank holding part of the model never holds the rest. Returns 0 or KILN_ENOMEM. */
int eng_gpt_init_weights_ranges(eng_gpt_t *m, uint64_t seed, const eng_range_t *ranges, int n,
                                kiln_err_t *err);
/* Fingerprint of a GPT configuration: checkpoints carry it and resuming refuses another. */
uint64_t eng_gpt_config_hash(const eng_gpt_config_t *cfg);

/* Activation checkpointing: with on, activation sets keep only the blocks' boundaries (the
 * residual stream after every half layer, the final LayerNorm's output with the head's
 * statistics, the losses); a block's other activations live in one workspace of the model and
 * each block recomputes them from its input at the start of its backward. The same ops on the
 * same inputs give the same bits, so gradients equal a run without it exactly, for the cost of
 * a second forward. Call before creating activation sets. Returns 0 or KILN_ENOMEM. */
int eng_gpt_set_recompute(eng_gpt_t *m, bool on, kiln_err_t *err);
/* Mixed precision: with on, every GEMM (the projections, the MLP, the LM head) runs through the
 * backend's bf16 group: inputs rounded to bf16, fp32 accumulation and outputs; parameters,
 * gradients and all other activations stay fp32. The bf16 copy of the weights (wbf) must be
 * refreshed whenever the fp32 parameters change (eng_gpt_bf16_refresh, or the bf16 group's
 * adamw_update). Returns 0, KILN_EINVAL (the backend has no bf16 group: the capability table's
 * refusal), KILN_EUNSUPP (the machine has no bf16 compute, with the reason) or KILN_ENOMEM. */
int eng_gpt_set_bf16(eng_gpt_t *m, bool on, kiln_err_t *err);
/* The bf16 copy of the weights (n, flat layout), or NULL without bf16. Borrowed. */
uint16_t *eng_gpt_bf16_weights(eng_gpt_t *m);
/* Rounds parameters [off, off + n) into the bf16 copy. */
void eng_gpt_bf16_refresh(eng_gpt_t *m, size_t off, size_t n);

/* Activations for B x T (T <= max_seq_len). Caller owns *out; free with eng_gpt_acts_destroy. */
int eng_gpt_acts_create(const eng_gpt_t *m, int B, int T, eng_gpt_acts_t **out, kiln_err_t *err);
void eng_gpt_acts_destroy(eng_gpt_t *m, eng_gpt_acts_t *a);
/* Copies host tokens (B*T) and targets (B*T, may be NULL) into a. */
void eng_gpt_acts_set_batch(const eng_gpt_t *m, eng_gpt_acts_t *a, const int32_t *tokens,
                            const int32_t *targets);

/* Blocks, the units a pipeline cuts the model into: 0 = embedding; 2l+1 = layer l's attention
 * half (ln1, qkv, attention, projection, residual) and 2l+2 = its MLP half (ln2, fc, GELU,
 * projection, residual), for l in 0..L-1; then the head, head_blocks blocks from
 * eng_gpt_head_first() = 2L+1 on. With one head block (the default) it is the final LayerNorm,
 * the tied LM head and the fused cross-entropy. Split into J > 1 (eng_gpt_set_head_blocks), head
 * block j holds vocabulary rows eng_gpt_head_rows(j) of wte and folds its slice's logits into
 * running softmax statistics; block 0 of the head also holds the final LayerNorm and the last
 * turns the statistics into the loss. A slow 50k-way head can so be spread over stages.
 * Block b writes eng_gpt_boundary(a, b), which block b+1 reads: (B,T,C) residual streams, and
 * between head blocks lnf followed by the statistics (eng_gpt_boundary_floats(b) floats in
 * all). Block 0 reads a->tokens; the last block writes a->losses (when targets are set). A
 * pipeline stage receives its input into eng_gpt_boundary(a, first_block - 1) and sends
 * eng_gpt_boundary(a, last_block). */
int eng_gpt_num_blocks(const eng_gpt_t *m);
int eng_gpt_head_first(const eng_gpt_t *m);
/* Splits the head into J blocks (1 <= J <= Vp); KILN_EUNSUPP when the backend has no
 * xent_chunk ops. Whole-model passes (eng_gpt_forward/backward) always run the one fused head. */
int eng_gpt_set_head_blocks(eng_gpt_t *m, int J, kiln_err_t *err);
/* Vocabulary rows [*r0, *r1) of head block j (0..head_blocks-1). */
void eng_gpt_head_rows(const eng_gpt_t *m, int j, int *r0, int *r1);
float *eng_gpt_boundary(const eng_gpt_t *m, eng_gpt_acts_t *a, int i);
/* Floats of the activation block i sends forward (B,T,C, plus 4 x B,T statistics inside the
 * head), of the gradient that comes back for it (B,T,C, plus B,T log-sum-exp inside the head),
 * and the largest of either. */
size_t eng_gpt_boundary_floats(const eng_gpt_t *m, int B, int T, int i);
size_t eng_gpt_grad_floats(const eng_gpt_t *m, int B, int T, int i);
size_t eng_gpt_max_boundary_floats(const eng_gpt_t *m, int B, int T);
void eng_gpt_block_forward(eng_gpt_t *m, eng_gpt_acts_t *a, int block, bool has_targets);
/* Backward of one block: dout is the gradient of the block's output (eng_gpt_grad_floats;
 * NULL for the last block, whose output is the loss: dloss is d(objective)/d(each token's
 * loss), e.g. 1/(B*T*accum_steps)); din receives the gradient of the block's input
 * (overwritten; unused for block 0, may be NULL). din must not alias dout. Parameter gradients
 * accumulate. The head turns a->probs into dlogits, so each acts is back-propagated once.
 * Tied embedding: wte's gradient receives the LM head's part from the head blocks and the
 * lookup part from block 0; it is final only after block 0. (A pipeline holding them on
 * different stages must sum the stages' wte gradients before the update.) */
void eng_gpt_block_backward(eng_gpt_t *m, eng_gpt_acts_t *a, int block, const float *dout,
                            float *din, float dloss);
/* The block's parameter ranges in the flat buffers (OUT: up to ENG_MAX_TENSORS); returns the
 * count. Head blocks list their rows of wte (tied, shared with block 0; the whole of wte for a
 * single head block), the first of them lnfw and lnfb too. Layer halves list their parameters
 * in the order backward finishes them: attprojw/b, qkvw/b, ln1w/b; fcprojw/b, fcw/b, ln2w/b. */
int eng_gpt_block_ranges(const eng_gpt_t *m, int block, eng_range_t *out);

/* eng_gpt_block_ranges with the model as a void pointer (eng_train_state_t.block_ranges). */
int eng_gpt_block_ranges_of(const void *model, int block, eng_range_t *out);

/* Whole forward over all blocks; returns the mean loss over B*T (0 without targets). */
float eng_gpt_forward(eng_gpt_t *m, eng_gpt_acts_t *a, bool has_targets);
/* Whole backward (last block to block 0) with the given dloss; ready (may be NULL) is called
 * after each block. Requires scratch sized for a->B (B <= the B given to eng_gpt_create). */
void eng_gpt_backward(eng_gpt_t *m, eng_gpt_acts_t *a, float dloss, eng_grads_ready_fn ready,
                      void *ctx);

/* llm.c GPT-2 checkpoint (magic 20240326, version 3): header of 256 int32 then float32
 * parameters in llm.c order (with padded vocab rows). Read fills *cfg (OUT); params_out, when
 * non-NULL, receives a malloc'd host array of eng_gpt_num_params(cfg) floats (caller frees).
 * The path is a spec's (model.init_from), so it is confined to KILN_DATA_ROOTS when that is set
 * and kept out of other projects' areas (KILN_EPERM; rank_path_confine before the open,
 * rank_file_confine after it). Returns KILN_ENOTFOUND/KILN_EIO/KILN_EFORMAT with the reason in err. */
int eng_gpt_llmc_read(const char *path, eng_gpt_config_t *cfg, float **params_out,
                      kiln_err_t *err);
/* The same for a file kiln put in place itself rather than one a spec names: the copy of another
 * job's model that kiln-agent fetched and checked (KILN_INIT_MODEL). Not confined. */
int eng_gpt_llmc_read_fetched(const char *path, eng_gpt_config_t *cfg, float **params_out,
                              kiln_err_t *err);
/* Writes the model's parameters in llm.c's format (atomically). */
int eng_gpt_llmc_write(const eng_gpt_t *m, const char *path, kiln_err_t *err);

/* ============================================================================================
 * MLP classifier: x (B, n_in) -> [Linear -> act] x hidden -> Linear -> softmax cross-entropy.
 * Blocks are the linear layers 0..n_layers-1 (each with its activation).
 * ============================================================================================ */

#define ENG_MLP_MAX_LAYERS 17

typedef struct eng_mlp_config {
    int n_inputs, n_classes;
    int n_hidden;
    int hidden[ENG_MLP_MAX_LAYERS - 1];
    bool gelu; /* GELU instead of ReLU */
} eng_mlp_config_t;

typedef struct eng_mlp {
    eng_mlp_config_t cfg;
    const eng_backend_t *be;
    eng_params_t p;
    int n_layers;                       /* n_hidden + 1 */
    int dims[ENG_MLP_MAX_LAYERS + 1];   /* dims[0] = n_inputs ... dims[n_layers] = n_classes */
    float *w[ENG_MLP_MAX_LAYERS];       /* (dims[i+1], dims[i]) views into params */
    float *b[ENG_MLP_MAX_LAYERS];       /* (dims[i+1]) */
    float *gw[ENG_MLP_MAX_LAYERS];      /* views into grads */
    float *gb[ENG_MLP_MAX_LAYERS];
    int B;                               /* batch the activations are sized for */
    float *acts;                         /* owned slab: */
    float *x;                            /* (B, n_in) input */
    int32_t *y;                          /* (B) labels */
    float *pre[ENG_MLP_MAX_LAYERS];      /* (B, dims[i+1]) pre-activation; last = logits/probs */
    float *post[ENG_MLP_MAX_LAYERS];     /* (B, dims[i+1]) post-activation (hidden layers) */
    float *losses;                       /* (B) */
    float *d_a, *d_b;                    /* (B, max dim) backward ping-pong */
    float *host_losses;                  /* (B) host */
} eng_mlp_t;

int eng_mlp_create(const eng_mlp_config_t *cfg, const eng_backend_t *be, int B, eng_mlp_t **out,
                   kiln_err_t *err);
void eng_mlp_destroy(eng_mlp_t *m);
/* Kaiming-uniform-like init: w ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from seed, biases 0. */
void eng_mlp_init_weights(eng_mlp_t *m, uint64_t seed);
/* x (B, n_in) host floats, y (B) host labels; B <= the created B. Returns the mean loss. */
float eng_mlp_forward(eng_mlp_t *m, const float *x, const int32_t *y, int B);
/* Backward after eng_mlp_forward with the same B; dloss per example. */
void eng_mlp_backward(eng_mlp_t *m, int B, float dloss, eng_grads_ready_fn ready, void *ctx);
/* Block (linear layer) `block`'s ranges: its weight and bias (OUT, 2); returns the count. */
int eng_mlp_block_ranges_of(const void *model, int block, eng_range_t *out);
/* Fraction of the B examples of the last forward whose argmax equals the label. */
double eng_mlp_accuracy(eng_mlp_t *m, int B);

/* ============================================================================================
 * Random numbers: a small deterministic generator (splitmix64 seeding + xoshiro256**), whose
 * whole state fits in a checkpoint.
 * ============================================================================================ */
typedef struct eng_rng {
    uint64_t s[4];
} eng_rng_t;

void eng_rng_seed(eng_rng_t *r, uint64_t seed);
uint64_t eng_rng_next(eng_rng_t *r);
double eng_rng_uniform(eng_rng_t *r);  /* [0, 1) */
double eng_rng_normal(eng_rng_t *r);   /* N(0, 1) */
uint64_t eng_rng_below(eng_rng_t *r, uint64_t n); /* [0, n) */

/* ============================================================================================
 * Data
 * ============================================================================================ */

typedef enum { ENG_DATA_TEXT = 0, ENG_DATA_TOKENS, ENG_DATA_SYNTHETIC } eng_data_kind_t;

/* A token stream (text bytes or llm.c shard tokens) for training or validation. */
typedef struct eng_tokens {
    int32_t *tok;  /* (n) owned */
    size_t n;
    int max_token; /* largest token id present */
} eng_tokens_t;

/* Loads a text file as bytes (vocab 256) or an llm.c token shard (magic 20240520, version 1:
 * header and size are checked). The path is a spec's: with KILN_DATA_ROOTS set it is confined to
 * them and kept out of other projects' areas, before the open and again once open (KILN_EPERM).
 * Caller owns *out (eng_tokens_deinit). Returns KILN_ENOTFOUND, KILN_EIO or KILN_EFORMAT with the
 * file and reason in err. */
int eng_tokens_load(const char *path, eng_data_kind_t kind, eng_tokens_t *out, kiln_err_t *err);
void eng_tokens_deinit(eng_tokens_t *t);
/* Moves the last floor(frac * n) tokens of all into tail (OUT, owned); all keeps the rest. */
int eng_tokens_split_tail(eng_tokens_t *all, double frac, eng_tokens_t *tail, kiln_err_t *err);
/* Writes an llm.c token shard (for tests and tools). */
int eng_tokens_write_shard(const char *path, const uint16_t *tok, size_t n, kiln_err_t *err);

/* Sampler state that a checkpoint stores. */
typedef struct eng_sampler_state {
    uint64_t pos;     /* sequential: next sequence start */
    eng_rng_t rng;    /* random: offsets */
    uint64_t epoch;
} eng_sampler_state_t;

/* Batch sampler over a token stream: each optimizer step draws the G = global batch sequences
 * of T+1 tokens (random offsets, or sequentially); rank r of `world` ranks takes sequences
 * [r*G/world, (r+1)*G/world) and splits them into microbatches, so every rank reads its own
 * shard and the union over ranks is exactly the single-rank global batch. */
typedef struct eng_sampler {
    const eng_tokens_t *data; /* borrowed */
    int T;
    int global_batch;
    int rank, world;
    bool random;
    eng_sampler_state_t st;
    uint64_t *starts;         /* (global_batch) offsets of the current step; owned */
} eng_sampler_t;

int eng_sampler_init(eng_sampler_t *s, const eng_tokens_t *data, int T, int global_batch,
                     int rank, int world, bool random, uint64_t seed, kiln_err_t *err);
void eng_sampler_deinit(eng_sampler_t *s);
/* Draws the next step's global batch (advances the state). */
void eng_sampler_next_step(eng_sampler_t *s);
/* This rank's microbatch `micro` of size B: tokens and targets (B*T each, host, OUT). */
void eng_sampler_micro(const eng_sampler_t *s, int micro, int B, int32_t *tokens,
                       int32_t *targets);

/* Synthetic classification data for the MLP: x ~ N(0,1)^n_in for example index i (from seed
 * and i), label = argmax of a fixed random two-layer teacher network. Deterministic. */
typedef struct eng_synth {
    int n_in, n_classes, hidden;
    float *w1, *w2; /* teacher (hidden, n_in), (n_classes, hidden); owned */
    uint64_t seed;
} eng_synth_t;
int eng_synth_init(eng_synth_t *s, int n_in, int n_classes, uint64_t seed);
void eng_synth_deinit(eng_synth_t *s);
/* Example `index` (OUT x (n_in), *label). */
void eng_synth_example(const eng_synth_t *s, uint64_t index, float *x, int32_t *label);

/* ============================================================================================
 * Checkpoints
 * ============================================================================================ */

/* What a checkpoint holds besides the flat buffers. */
typedef struct eng_ckpt_meta {
    int64_t step;               /* optimizer steps completed */
    eng_sampler_state_t train;  /* training sampler */
    eng_rng_t sample_rng;       /* text sampling RNG */
    uint64_t model_hash;        /* config fingerprint; resume refuses a different model */
    uint64_t n_params;
} eng_ckpt_meta_t;

/* Writes <dir>/ckpt_<step 8 digits>.bin atomically (temp file, fsync, rename, fsync dir):
 * meta, then params, m and v (n floats each, host or device via be). Then deletes all but the
 * newest keep_last checkpoints (keep_last <= 0 keeps all). Returns 0 or KILN_EIO. */
int eng_ckpt_write(const char *dir, const eng_ckpt_meta_t *meta, const eng_backend_t *be,
                   const float *params, const float *m, const float *v, size_t n, int keep_last,
                   kiln_err_t *err);
/* Finds the newest complete checkpoint in dir (OUT path, size n). KILN_ENOTFOUND when none. */
int eng_ckpt_find_latest(const char *dir, char *path, size_t n);
/* Reads a checkpoint written by eng_ckpt_write into meta and the three n-float buffers.
 * KILN_EFORMAT when the file is corrupt or n/model_hash differ (meta->model_hash and
 * meta->n_params hold the expected values on input). */
int eng_ckpt_read(const char *path, eng_ckpt_meta_t *meta, const eng_backend_t *be,
                  float *params, float *m, float *v, size_t n, kiln_err_t *err);

/* ============================================================================================
 * Training: one loop (eng_train_run) for every layout. Data parallelism and the pipeline plug
 * into it through eng_parallel_t; without one it trains a single process.
 * ============================================================================================ */

/* What one rank does with the flat buffers. The loop fills it with the whole model (one range
 * each); a parallel layer's attach narrows it. */
typedef struct eng_share {
    eng_ranges_t held;   /* parameters and gradients this rank computes with; pages outside them
                          * may be given back to the system (backend discard) */
    eng_ranges_t update; /* ranges this rank applies AdamW to; m and v are only touched here */
    eng_ranges_t norm;   /* ranges whose squared gradients this rank adds to the global norm;
                          * over all ranks they count every parameter exactly once */
} eng_share_t;

/* The loop's state as a parallel layer sees it (borrowed; valid until eng_train_run returns). */
typedef struct eng_train_state {
    const eng_backend_t *be;
    /* the model: its parameters and gradients (model->p, layout in p->tensors), its blocks as
     * passed to grads_ready, and their parameter ranges (ops->block_ranges; a range listed by
     * several blocks, the GPT's tied wte, is final after the lowest of them) */
    eng_model_t *model;
    float *m, *v;          /* (n) AdamW moments in the flat layout */
    int B, T;              /* sequences per microbatch (activation batch), sequence length */
    int passes;            /* passes of micro_batch_size sequences per step (accumulation) */
    float dloss;           /* d(objective)/d(one token's loss): 1 / (tokens per replica-step) */
    eng_share_t *share;    /* the rank's share (OUT: attach may narrow it) */
} eng_train_state_t;

/* How a rank takes part in a job of several ranks: its place, the collectives the loop needs,
 * and hooks that replace or extend the loop's steps. Fields a layer leaves NULL keep the loop's
 * single-process behaviour. Every hook returns 0 or a KILN_E* status with err filled, which
 * aborts training. Hooks run on the training thread; the collective ones must be called by
 * every rank in the same order. */
typedef struct eng_parallel {
    const char *name;      /* "data parallel", "pipeline" */
    void *ctx;
    int replica, replicas; /* this rank's data shard: the sampler's rank and world */
    int microbatches;      /* microbatches a pass of micro_batch_size sequences is cut into */

    /* Collectives over every rank of the job (required). allgather: each rank fills slot
     * `rank` of `slots` (world x slot_bytes); afterwards every slot holds that rank's bytes.
     * bcast: root's bytes (host memory) into buf on every rank. */
    int (*allgather)(void *ctx, void *slots, size_t slot_bytes, kiln_err_t *err);
    int (*bcast)(void *ctx, void *buf, size_t bytes, int root, kiln_err_t *err);

    /* Setup. prepare: before the model is built, knowing which rank holds the checkpoint the
     * job resumes from (-1: none); sets *head_blocks (the blocks the GPT head is cut into).
     * attach: after the model is built, before its parameters are initialised or loaded (only
     * the held ranges are); narrows st->share. */
    int (*prepare)(void *ctx, int resume_src, int *head_blocks, kiln_err_t *err);
    int (*attach)(void *ctx, eng_train_state_t *st, kiln_err_t *err);
    /* The loop is about to release the model (after the run, or a failure): release what
     * attach made from it. */
    void (*detach)(void *ctx);

    /* Every step. run_passes replaces the loop's forward (and, when train, backward) of the
     * step's `passes` passes over sampler s; it adds this rank's sum of microbatch mean losses
     * to *loss_sum and their number to *loss_count. grads_ready: a block's gradients are final
     * (last microbatch of the step, blocks last to first). grads_finish: after backward; the
     * gradients of the update and norm ranges must then hold the global average. after_update:
     * after AdamW. step_metrics: extra metric values of the step (OUT, up to max; *n set). */
    int (*run_passes)(void *ctx, eng_sampler_t *s, int passes, bool train, double *loss_sum,
                      double *loss_count, kiln_err_t *err);
    eng_grads_ready_fn grads_ready;
    int (*grads_finish)(void *ctx, kiln_err_t *err);
    int (*after_update)(void *ctx, int64_t step, kiln_err_t *err);
    /* params_wait: forward is about to read block's parameters (-1: the loop is about to read
     * them all: evaluation, samples, checkpoints, the model). A layer whose update delivers
     * parameters late (ZeRO's all-gather, left running into the next forward) waits for them
     * here. Returns 0 or the layer's failure (also reported by the next grads_finish). */
    int (*params_wait)(void *ctx, int block, kiln_err_t *err);
    /* update: runs the rank's update: calls apply(actx, off, n) on ranges that together are
     * st->share->update, once each, in the layer's order, and may move updated parameters on
     * between calls (ZeRO's all-gather starts bucket by bucket). NULL: the loop applies the
     * update ranges itself. */
    int (*update)(void *ctx, void (*apply)(void *actx, size_t off, size_t n), void *actx,
                  kiln_err_t *err);
    int (*step_metrics)(void *ctx, const char **names, double *vals, int max, int *n,
                        kiln_err_t *err);

    /* State for rank 0: gather makes rank 0's copy of buf (params, m or v; n floats in the flat
     * layout) complete with the ranges other ranks own. checkpoint_extra: rank 0 writes what
     * the layer keeps beside a checkpoint in dir. */
    int (*gather)(void *ctx, float *buf, kiln_err_t *err);
    int (*checkpoint_extra)(void *ctx, const char *dir, kiln_err_t *err);
} eng_parallel_t;

/* Options of one run, from the spec and the command line. */
/* The engine's own settings in kiln-train's table (cmd/kiln_train.c: the KILN_DP_*, KILN_COMM_*
 * and KILN_PIPE_TRACE variables): what is set overrides the spec's choice or the default.
 * ENG_SETTINGS_INIT leaves everything to the spec. */
struct comm_settings;
typedef struct eng_settings {
    bool dp_check;                 /* compare the ranks' parameters after every step */
    bool dp_overlap;               /* launch each bucket as backward finishes it (default true) */
    const char *dp_zero;           /* "1" | "0": shard the optimizer state; NULL: the spec's */
    double dp_bucket_mb;           /* > 0: the bucket size; 0: the spec's, else chosen */
    const char *dp_gradient_dtype; /* "fp32" | "bf16"; NULL: the spec's */
    int64_t dp_inject_rank;        /* fault injection (tests): this rank perturbs a parameter after */
    int64_t dp_inject_step;        /* step dp_inject_step; rank -1: never */
    bool pipe_trace;               /* print the last pass's per-action timings of each stage */
    const struct comm_settings *comm; /* NULL: comm's defaults */
} eng_settings_t;
#define ENG_SETTINGS_INIT {false, true, NULL, 0, NULL, -1, 0, false, NULL}

typedef struct eng_train_opts {
    const char *checkpoint_dir;  /* "" or NULL: no checkpoints */
    const char *resume_from;     /* "" or NULL: none; else a checkpoint directory whose newest
                                  * checkpoint the run resumes from when it is newer than any in
                                  * checkpoint_dir (a job started from another's checkpoints) */
    bool fresh_start;            /* train from step 0, resuming from neither directory (a tuning
                                  * trial promoted under kilnd's --tune-promoted-restart) */
    const char *output_dir;      /* "" or NULL: no samples.txt */
    int64_t max_steps_override;  /* > 0 replaces hyperparameters.max_steps */
    int threads;                 /* <= 0: leave */
    double peak_gflops;          /* <= 0: measure at start */
    int metrics_fd;              /* < 0: none */
    int rank, world;
    const char *sample_prompt;   /* NULL: "\n" */
    const char *spec_dir;        /* directory of the spec file, for relative data paths */
    const char *init_model;      /* model.init_from "job:<id>": the local copy of that job's model
                                    (KILN_INIT_MODEL, set by kiln-agent); NULL otherwise */
    volatile int *stop_flag;     /* set asynchronously (SIGTERM): checkpoint and stop */
    int64_t stop_after_step;     /* > 0: behave as if stop_flag were set after this step */
    bool quiet;                  /* no per-step stdout lines */
    bool step_marks;             /* write a step mark (rank_step_mark_write) on stdout and stderr
                                  * once resumed and before each step's lines: the agent reads
                                  * them (KILN_STEP_MARKS) and the job has metric definitions */
    const eng_parallel_t *parallel; /* borrowed; NULL: a single process */
    const eng_settings_t *settings; /* borrowed; NULL: ENG_SETTINGS_INIT's */
} eng_train_opts_t;

/* The outcome of eng_train_run. */
typedef struct eng_train_result {
    int64_t steps_done;     /* optimizer steps completed in total (including resumed ones) */
    int64_t start_step;     /* 0, or the step resumed from */
    bool stopped;           /* stopped early by stop_flag (a checkpoint was written) */
    bool paused;            /* stopped at stopping.max_steps with a checkpoint (exits 0) */
    float last_train_loss;
    float last_val_loss;    /* NAN when never evaluated */
    double peak_mem_mb;
    float *losses;          /* (steps run in this call) train loss per step; owned (free()) */
    int64_t n_losses;
} eng_train_result_t;

struct spec;
/* The training loop. Builds the model and data, resumes from the newest checkpoint that any
 * rank finds in its opts->checkpoint_dir or opts->resume_from (that rank reads it and hands it
 * to the others; none with opts->fresh_start), trains
 * to max_steps (logging to stdout on rank 0, metrics to metrics_fd), checkpoints every
 * checkpoint.every_steps and when stop_flag is set on any rank, evaluates, samples, and writes
 * the final model. A checkpoint holds the whole model in the flat layout whatever the layout of
 * the run, so single-rank, data-parallel and pipelined runs resume each other's checkpoints.
 * Checks the backend's status once per step. Returns 0 (res->stopped says whether it stopped
 * early), KILN_EINVAL (spec/model, or what spec.h's capability table refuses the model or this
 * run's backend: spec_caps_check, its message), KILN_ENOTFOUND/KILN_EIO/KILN_EFORMAT (data,
 * checkpoint), KILN_EUNSUPP (world > 1 without a parallel layer, or what this machine cannot
 * run: a CPU without bf16), KILN_EDEVICE, or a parallel layer's status. res may be NULL; otherwise free res->losses. */
int eng_train_run(const struct spec *spec, const eng_train_opts_t *opts, eng_train_result_t *res,
                  kiln_err_t *err);

/* Batch geometry of a run: each optimizer step takes global_batch_size sequences, split over
 * `replicas` data-parallel replicas; each replica takes `passes` passes of micro sequences
 * (hyperparameters.micro_batch_size, default all of its share), each pass cut into
 * `microbatches` microbatches of B sequences (a pipeline's microbatches; 1 otherwise). */
typedef struct eng_geometry {
    int global, replicas, per_replica, micro, passes, microbatches, B, T;
    bool microbatches_chosen; /* a pipeline's microbatches not set: eng_microbatches_choose's */
} eng_geometry_t;
/* Fills *g (OUT). microbatches <= 0 with more than one partition: chosen from the job
 * (eng_microbatches_choose); otherwise <= 0 means 1. Returns 0 or KILN_EINVAL naming the field
 * whose value does not divide. */
int eng_geometry_init(eng_geometry_t *g, const struct spec *s, int replicas, int microbatches,
                      kiln_err_t *err);
/* A pipeline's microbatches when distribution.model_parallel.microbatches is not set: the most,
 * up to ENG_MICROBATCHES_PER_STAGE a stage, that split the `micro` sequences of a pass evenly.
 * The bubble is (stages - 1) / (microbatches + stages - 1): under a fifth at 4 a stage (GPipe's
 * rule), while each microbatch keeps at least one sequence. Pure. */
#define ENG_MICROBATCHES_PER_STAGE 4
int eng_microbatches_choose(int micro, int stages);

/* Learning rate at 1-based step: linear warm-up to lr over warmup steps, then cosine decay to
 * min_lr_fraction*lr at max_steps. */
double eng_lr_at(int64_t step, double lr, int warmup, int64_t max_steps, double min_frac);

/* Samples n tokens after prompt (bytes) from a trained byte-level GPT: temperature, top-k
 * (0 = all). Writes the text (prompt included) into out (NUL-terminated, size cap). Uses a B=1
 * activation set; deterministic given rng. */
int eng_gpt_sample(eng_gpt_t *m, const int32_t *prompt, int n_prompt, int n, double temperature,
                   int top_k, eng_rng_t *rng, int32_t *out_tokens, kiln_err_t *err);

/* Peak fp32 GFLOP/s of this process's threads, measured with an AVX-512/AVX FMA loop timed in
 * each thread's CPU time (so other load on the machine does not lower it; ~0.15 s). MFU's
 * denominator unless overridden. */
double eng_measure_peak_gflops(void);
/* Sets the environment the CPU backend runs best with, where the caller has not chosen:
 * GOMP_SPINCOUNT=5000 (waiting threads spin ~0.1 ms, then sleep: fast on a quiet machine, and
 * no collapse on shared cores as with libgomp's default 300,000) unless OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT is set, and, on AMD family 19h, OPENBLAS_CORETYPE=Zen (~5% faster GEMMs).
 * Both are read once when the libraries load, so a main() that gets true back should re-exec
 * itself (execv("/proc/self/exe", argv)) before doing anything else. Not thread-safe. */
bool eng_cpu_tune_env(void);
/* Whether OPENBLAS_CORETYPE's value coretype holds OpenBLAS to kernels without AVX-512 on a CPU
 * whose AVX-512 (avx512) they would run faster: any core type but SkylakeX, Cooperlake and
 * SapphireRapids, except on AMD family 19h (amd_19h), where eng_cpu_tune_env picks the AVX2 "Zen"
 * kernels itself. On an AMD Zen 5 Haswell's kernels made the fp32 step of the small
 * configuration 1.65x slower (bench/RESULTS.md). NULL or "" (unset) never holds back. */
bool eng_coretype_holds_back(const char *coretype, bool avx512, bool amd_19h);
/* The same for this process's OPENBLAS_CORETYPE and CPU (kiln-train says so at start). The CPU
 * backend then runs its fp32 GEMMs on oneDNN's AVX-512 kernels where oneDNN has them. */
bool eng_cpu_coretype_holds_back(void);
/* What runs the CPU backend's fp32 GEMMs: "OpenBLAS", or "oneDNN <its kernels>" (when
 * OPENBLAS_CORETYPE holds OpenBLAS back, or eng_cpu_settings_set's sgemm says). Static. */
const char *eng_cpu_sgemm_name(void);
/* The CPU backend's settings (kiln-train's --cpu-sgemm and, in test builds, --cpu-bf16), for the
 * whole process: sgemm "onednn" | "openblas" decides what runs the fp32 GEMMs (NULL: OpenBLAS, or
 * oneDNN's AVX-512 kernels where OPENBLAS_CORETYPE holds OpenBLAS back); bf16 false makes the CPU
 * look as if it had no bf16 instructions. Call before the first GEMM; sgemm is borrowed for the
 * process's lifetime. Not thread-safe. */
void eng_cpu_settings_set(const char *sgemm, bool bf16);
/* Peak resident memory of the process in MiB (getrusage). */
double eng_peak_mem_mb(void);

#endif /* KILN_ENGINE_H */
