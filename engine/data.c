/* data.c - training data: byte-level text, llm.c token shards (validated), the batch sampler
 * that hands each data-parallel rank its shard of every global batch, and the synthetic
 * classification set the MLP trains on. It does no tokenisation beyond bytes. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "rank/rank.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256

int eng_tokens_load(const char *path, eng_data_kind_t kind, eng_tokens_t *out, kiln_err_t *err)
{
    FILE *f = NULL;
    uint8_t *raw = NULL;
    memset(out, 0, sizeof(*out));
    int confined = rank_path_confine(path, "data.train", err); /* KILN_DATA_ROOTS, when set */
    if (confined)
        return confined;
    f = fopen(path, "rb");
    if (!f) {
        int st = errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO;
        return kiln_err_set(err, st, "data.train", "could not open data file \"%s\": %s", path,
                            strerror(errno));
    }
    /* the file it opened, where it really is: a link changed since the check is caught here */
    if ((confined = rank_file_confine(fileno(f), path, "data.train", err))) {
        fclose(f);
        return confined;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return kiln_err_set(err, KILN_EIO, "data.train", "data file \"%s\" is not a regular file",
                            path);
    }
    size_t size = (size_t)sb.st_size;
    int rc = KILN_OK;
    if (kind == ENG_DATA_TOKENS) {
        int32_t hdr[SHARD_HEADER_INTS];
        if (size < sizeof(hdr) || fread(hdr, sizeof(hdr), 1, f) != 1) {
            rc = kiln_err_set(err, KILN_EFORMAT, "data.train",
                              "token shard \"%s\" is too short for its 1024-byte header", path);
            goto done;
        }
        if (hdr[0] != SHARD_MAGIC) {
            rc = kiln_err_set(err, KILN_EFORMAT, "data.train",
                              "\"%s\" is not an llm.c token shard (its header does not start "
                              "with the shard magic number %d)", path, SHARD_MAGIC);
            goto done;
        }
        if (hdr[1] != SHARD_VERSION) {
            rc = kiln_err_set(err, KILN_EFORMAT, "data.train",
                              "token shard \"%s\" is not version %d of the format", path,
                              SHARD_VERSION);
            goto done;
        }
        size_t ntok = (size_t)(uint32_t)hdr[2];
        if (size != sizeof(hdr) + 2 * ntok) {
            rc = kiln_err_set(err, KILN_EFORMAT, "data.train",
                              "token shard \"%s\" is truncated or padded: its size does not match "
                              "the token count in its header", path);
            goto done;
        }
        uint16_t *u = malloc(2 * ntok + 2);
        out->tok = malloc(sizeof(int32_t) * (ntok + 1));
        if (!u || !out->tok) {
            free(u);
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory loading \"%s\"", path);
            goto done;
        }
        if (ntok && fread(u, 2, ntok, f) != ntok) {
            free(u);
            rc = kiln_err_set(err, KILN_EIO, "data.train", "could not read \"%s\"", path);
            goto done;
        }
        out->max_token = 0;
        for (size_t i = 0; i < ntok; i++) {
            out->tok[i] = u[i];
            if (u[i] > out->max_token) out->max_token = u[i];
        }
        out->n = ntok;
        free(u);
    } else {
        raw = malloc(size + 1);
        out->tok = malloc(sizeof(int32_t) * (size + 1));
        if (!raw || !out->tok) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory loading \"%s\"", path);
            goto done;
        }
        if (size && fread(raw, 1, size, f) != size) {
            rc = kiln_err_set(err, KILN_EIO, "data.train", "could not read \"%s\"", path);
            goto done;
        }
        out->max_token = 0;
        for (size_t i = 0; i < size; i++) {
            out->tok[i] = raw[i];
            if (raw[i] > out->max_token) out->max_token = raw[i];
        }
        out->n = size;
    }
done:
    free(raw);
    fclose(f);
    if (rc != KILN_OK) eng_tokens_deinit(out);
    return rc;
}

void eng_tokens_deinit(eng_tokens_t *t)
{
    if (!t) return;
    free(t->tok);
    memset(t, 0, sizeof(*t));
}

int eng_tokens_split_tail(eng_tokens_t *all, double frac, eng_tokens_t *tail, kiln_err_t *err)
{
    memset(tail, 0, sizeof(*tail));
    size_t nv = (size_t)floor((double)all->n * frac);
    tail->tok = malloc(sizeof(int32_t) * (nv + 1));
    if (!tail->tok) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    memcpy(tail->tok, all->tok + (all->n - nv), nv * sizeof(int32_t));
    tail->n = nv;
    tail->max_token = all->max_token;
    all->n -= nv;
    return KILN_OK;
}

int eng_tokens_write_shard(const char *path, const uint16_t *tok, size_t n, kiln_err_t *err)
{
    size_t bytes = SHARD_HEADER_INTS * 4 + 2 * n;
    uint8_t *buf = calloc(1, bytes);
    if (!buf) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int32_t *hdr = (int32_t *)buf;
    hdr[0] = SHARD_MAGIC;
    hdr[1] = SHARD_VERSION;
    hdr[2] = (int32_t)n;
    memcpy(buf + SHARD_HEADER_INTS * 4, tok, 2 * n);
    int rc = kiln_file_write_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}

/* ---- sampler --------------------------------------------------------------------------------- */

int eng_sampler_init(eng_sampler_t *s, const eng_tokens_t *data, int T, int global_batch,
                     int rank, int world, bool random, uint64_t seed, kiln_err_t *err)
{
    memset(s, 0, sizeof(*s));
    if (data->n < (size_t)T + 1)
        return kiln_err_set(err, KILN_EINVAL, "data", "data set has %zu tokens, fewer than one "
                            "sequence of seq_len+1 = %d", data->n, T + 1);
    if (world < 1 || rank < 0 || rank >= world || global_batch % world != 0)
        return kiln_err_set(err, KILN_EINVAL, "hyperparameters.global_batch_size",
                            "global batch %d does not split over %d ranks", global_batch, world);
    s->data = data;
    s->T = T;
    s->global_batch = global_batch;
    s->rank = rank;
    s->world = world;
    s->random = random;
    eng_rng_seed(&s->st.rng, seed ^ 0x5eed0fda7aULL);
    s->starts = calloc((size_t)global_batch, sizeof(uint64_t));
    if (!s->starts) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return KILN_OK;
}

void eng_sampler_deinit(eng_sampler_t *s)
{
    if (!s) return;
    free(s->starts);
    s->starts = NULL;
}

void eng_sampler_next_step(eng_sampler_t *s)
{
    uint64_t span = s->data->n - (uint64_t)s->T; /* valid starts: [0, span) */
    for (int i = 0; i < s->global_batch; i++) {
        if (s->random) {
            s->starts[i] = eng_rng_below(&s->st.rng, span);
        } else {
            if (s->st.pos >= span) {
                s->st.pos = 0;
                s->st.epoch++;
            }
            s->starts[i] = s->st.pos;
            s->st.pos += (uint64_t)s->T;
        }
    }
}

void eng_sampler_micro(const eng_sampler_t *s, int micro, int B, int32_t *tokens,
                       int32_t *targets)
{
    int per_rank = s->global_batch / s->world;
    int T = s->T;
    for (int b = 0; b < B; b++) {
        int idx = s->rank * per_rank + micro * B + b;
        const int32_t *src = s->data->tok + s->starts[idx];
        memcpy(tokens + (size_t)b * T, src, sizeof(int32_t) * T);
        memcpy(targets + (size_t)b * T, src + 1, sizeof(int32_t) * T);
    }
}

/* ---- synthetic classification ------------------------------------------------------------------ */

#define SYNTH_HIDDEN 32

int eng_synth_init(eng_synth_t *s, int n_in, int n_classes, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    s->n_in = n_in;
    s->n_classes = n_classes;
    s->hidden = SYNTH_HIDDEN;
    s->seed = seed;
    s->w1 = malloc(sizeof(float) * SYNTH_HIDDEN * n_in);
    s->w2 = malloc(sizeof(float) * n_classes * SYNTH_HIDDEN);
    if (!s->w1 || !s->w2) {
        eng_synth_deinit(s);
        return KILN_ENOMEM;
    }
    eng_rng_t r;
    eng_rng_seed(&r, seed * 31 + 7);
    for (int i = 0; i < SYNTH_HIDDEN * n_in; i++) s->w1[i] = (float)(eng_rng_normal(&r) / sqrt(n_in));
    for (int i = 0; i < n_classes * SYNTH_HIDDEN; i++)
        s->w2[i] = (float)(eng_rng_normal(&r) / sqrt(SYNTH_HIDDEN));
    return KILN_OK;
}

void eng_synth_deinit(eng_synth_t *s)
{
    if (!s) return;
    free(s->w1);
    free(s->w2);
    s->w1 = s->w2 = NULL;
}

void eng_synth_example(const eng_synth_t *s, uint64_t index, float *x, int32_t *label)
{
    eng_rng_t r;
    eng_rng_seed(&r, s->seed ^ (index * 0x9e3779b97f4a7c15ULL + 0x1234567ULL));
    for (int i = 0; i < s->n_in; i++) x[i] = (float)eng_rng_normal(&r);
    float h[SYNTH_HIDDEN];
    for (int j = 0; j < s->hidden; j++) {
        double a = 0;
        for (int i = 0; i < s->n_in; i++) a += (double)s->w1[j * s->n_in + i] * x[i];
        h[j] = a > 0 ? (float)a : 0.0f;
    }
    int best = 0;
    double bestv = -1e300;
    for (int c = 0; c < s->n_classes; c++) {
        double a = 0;
        for (int j = 0; j < s->hidden; j++) a += (double)s->w2[c * s->hidden + j] * h[j];
        if (a > bestv) { bestv = a; best = c; }
    }
    *label = best;
}
