/* ckpt.c - checkpoints: kiln's own (model + optimizer state + step + data position + RNG state,
 * written atomically, keep_last rotation, newest-first discovery) and llm.c's GPT-2 parameter
 * format for moving weights between tools. It does not decide when to checkpoint (train.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "rank/rank.h"

#define CKPT_MAGIC "KILNCKPT"
#define CKPT_VERSION 1
#define LLMC_MAGIC 20240326

/* On-disk header: fixed-size little-endian fields (x86-64 native layout, no pointers). */
typedef struct ckpt_header {
    char magic[8];
    uint32_t version, header_bytes;
    int64_t step;
    uint64_t n_params, model_hash;
    uint64_t sampler_pos, sampler_epoch, sampler_rng[4];
    uint64_t sample_rng[4];
    uint64_t checksum[3]; /* of params, m, v */
    uint64_t reserved[8];
} ckpt_header_t;

/* A cheap 64-bit checksum over the buffer's words: catches truncation and corruption. */
static uint64_t checksum(const float *x, size_t n)
{
    const uint32_t *w = (const uint32_t *)x;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    return h;
}

/* Streams n floats of (device) memory to f in 16 MiB pieces through a host buffer. */
static int write_floats(FILE *f, const eng_backend_t *be, const float *src, size_t n, float *tmp,
                        size_t tmpn, uint64_t *sum)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i += tmpn) {
        size_t k = n - i < tmpn ? n - i : tmpn;
        be->to_host(tmp, src + i, k * sizeof(float));
        if (fwrite(tmp, sizeof(float), k, f) != k) return -1;
        h = h * 31 + checksum(tmp, k);
    }
    *sum = h;
    return 0;
}

static int read_floats(FILE *f, const eng_backend_t *be, float *dst, size_t n, float *tmp,
                       size_t tmpn, uint64_t *sum)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i += tmpn) {
        size_t k = n - i < tmpn ? n - i : tmpn;
        if (fread(tmp, sizeof(float), k, f) != k) return -1;
        h = h * 31 + checksum(tmp, k);
        be->to_device(dst + i, tmp, k * sizeof(float));
    }
    *sum = h;
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int parse_ckpt_name(const char *name, int64_t *step)
{
    long long s;
    char tail[8];
    if (sscanf(name, "ckpt_%lld.bi%1s", &s, tail) != 2 || strcmp(tail, "n") != 0) return 0;
    size_t len = strlen(name);
    if (len < 9 || strcmp(name + len - 4, ".bin") != 0) return 0;
    *step = s;
    return 1;
}

/* Deletes all but the newest keep checkpoints in dir. */
static void rotate(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d || keep <= 0) {
        if (d) closedir(d);
        return;
    }
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        int64_t s;
        if (parse_ckpt_name(e->d_name, &s)) steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) /* insertion sort, newest first */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j]; steps[j] = steps[j - 1]; steps[j - 1] = t;
        }
    char path[4096];
    for (int i = keep; i < n; i++) {
        snprintf(path, sizeof(path), "%s/ckpt_%08lld.bin", dir, (long long)steps[i]);
        unlink(path);
    }
}

int eng_ckpt_write(const char *dir, const eng_ckpt_meta_t *meta, const eng_backend_t *be,
                   const float *params, const float *m, const float *v, size_t n, int keep_last,
                   kiln_err_t *err)
{
    char path[4096], tmp[4200];
    FILE *f = NULL;
    float *buf = NULL;
    int rc = kiln_mkdirs(dir, err);
    if (rc) return rc;
    snprintf(path, sizeof(path), "%s/ckpt_%08lld.bin", dir, (long long)meta->step);
    snprintf(tmp, sizeof(tmp), "%s/.ckpt_%08lld.bin.tmp.%d", dir, (long long)meta->step,
             (int)getpid());
    size_t tmpn = (size_t)4 << 20;
    buf = malloc(tmpn * sizeof(float));
    f = fopen(tmp, "wb");
    if (!buf || !f) {
        rc = kiln_err_set(err, KILN_EIO, "checkpoint", "could not create checkpoint \"%s\": %s",
                          tmp, strerror(errno));
        goto fail;
    }
    ckpt_header_t h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.header_bytes = sizeof(h);
    h.step = meta->step;
    h.n_params = n;
    h.model_hash = meta->model_hash;
    h.sampler_pos = meta->train.pos;
    h.sampler_epoch = meta->train.epoch;
    memcpy(h.sampler_rng, meta->train.rng.s, sizeof(h.sampler_rng));
    memcpy(h.sample_rng, meta->sample_rng.s, sizeof(h.sample_rng));
    /* header first (checksums patched after the payload) */
    if (fwrite(&h, sizeof(h), 1, f) != 1 ||
        write_floats(f, be, params, n, buf, tmpn, &h.checksum[0]) ||
        write_floats(f, be, m, n, buf, tmpn, &h.checksum[1]) ||
        write_floats(f, be, v, n, buf, tmpn, &h.checksum[2]) || fseek(f, 0, SEEK_SET) != 0 ||
        fwrite(&h, sizeof(h), 1, f) != 1 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = kiln_err_set(err, KILN_EIO, "checkpoint", "could not write checkpoint \"%s\": %s",
                          tmp, strerror(errno));
        goto fail;
    }
    if (fclose(f) != 0) {
        f = NULL;
        rc = kiln_err_set(err, KILN_EIO, "checkpoint", "could not close \"%s\": %s", tmp,
                          strerror(errno));
        goto fail;
    }
    f = NULL;
    if (rename(tmp, path) != 0) {
        rc = kiln_err_set(err, KILN_EIO, "checkpoint", "could not rename \"%s\": %s", tmp,
                          strerror(errno));
        goto fail;
    }
    fsync_dir(dir);
    free(buf);
    rotate(dir, keep_last);
    return KILN_OK;
fail:
    if (f) fclose(f);
    unlink(tmp);
    free(buf);
    return rc;
}

int eng_ckpt_find_latest(const char *dir, char *path, size_t n)
{
    DIR *d = opendir(dir);
    if (!d) return KILN_ENOTFOUND;
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s;
        if (parse_ckpt_name(e->d_name, &s) && s > best) best = s;
    }
    closedir(d);
    if (best < 0) return KILN_ENOTFOUND;
    snprintf(path, n, "%s/ckpt_%08lld.bin", dir, (long long)best);
    return KILN_OK;
}

int eng_ckpt_read(const char *path, eng_ckpt_meta_t *meta, const eng_backend_t *be,
                  float *params, float *m, float *v, size_t n, kiln_err_t *err)
{
    FILE *f = fopen(path, "rb");
    float *buf = NULL;
    int rc = KILN_OK;
    if (!f)
        return kiln_err_set(err, errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "checkpoint",
                            "could not open checkpoint \"%s\": %s", path, strerror(errno));
    ckpt_header_t h;
    if (fread(&h, sizeof(h), 1, f) != 1 || memcmp(h.magic, CKPT_MAGIC, 8) != 0 ||
        h.version != CKPT_VERSION || h.header_bytes != sizeof(h)) {
        rc = kiln_err_set(err, KILN_EFORMAT, "checkpoint",
                          "\"%s\" is not a kiln checkpoint (bad header)", path);
        goto done;
    }
    if (h.n_params != n || (meta->model_hash && h.model_hash != meta->model_hash)) {
        rc = kiln_err_set(err, KILN_EFORMAT, "checkpoint",
                          "checkpoint \"%s\" is for a different model (%llu parameters, expected "
                          "%zu)", path, (unsigned long long)h.n_params, n);
        kiln_err_hint(err, "use an empty checkpoint directory for a new model");
        goto done;
    }
    size_t tmpn = (size_t)4 << 20;
    buf = malloc(tmpn * sizeof(float));
    uint64_t s0, s1, s2;
    if (!buf || read_floats(f, be, params, n, buf, tmpn, &s0) ||
        read_floats(f, be, m, n, buf, tmpn, &s1) || read_floats(f, be, v, n, buf, tmpn, &s2)) {
        rc = kiln_err_set(err, KILN_EFORMAT, "checkpoint", "checkpoint \"%s\" is truncated", path);
        goto done;
    }
    if (s0 != h.checksum[0] || s1 != h.checksum[1] || s2 != h.checksum[2]) {
        rc = kiln_err_set(err, KILN_EFORMAT, "checkpoint",
                          "checkpoint \"%s\" is corrupt (checksum mismatch)", path);
        goto done;
    }
    meta->step = h.step;
    meta->n_params = h.n_params;
    meta->model_hash = h.model_hash;
    meta->train.pos = h.sampler_pos;
    meta->train.epoch = h.sampler_epoch;
    memcpy(meta->train.rng.s, h.sampler_rng, sizeof(h.sampler_rng));
    memcpy(meta->sample_rng.s, h.sample_rng, sizeof(h.sample_rng));
done:
    free(buf);
    fclose(f);
    return rc;
}

/* ---- llm.c GPT-2 format --------------------------------------------------------------------- */

static int llmc_read(const char *path, bool confined, eng_gpt_config_t *cfg, float **params_out,
                     kiln_err_t *err);

int eng_gpt_llmc_read(const char *path, eng_gpt_config_t *cfg, float **params_out,
                      kiln_err_t *err)
{
    int confined = rank_path_confine(path, "model.init_from", err); /* KILN_DATA_ROOTS, when set */
    if (confined)
        return confined;
    return llmc_read(path, true, cfg, params_out, err);
}

int eng_gpt_llmc_read_fetched(const char *path, eng_gpt_config_t *cfg, float **params_out,
                              kiln_err_t *err)
{
    return llmc_read(path, false, cfg, params_out, err);
}

/* confined: the file a spec names, checked again once open (rank_file_confine) */
static int llmc_read(const char *path, bool confined, eng_gpt_config_t *cfg, float **params_out,
                     kiln_err_t *err)
{
    FILE *f = fopen(path, "rb");
    int rc = KILN_OK;
    if (params_out) *params_out = NULL;
    if (!f)
        return kiln_err_set(err, errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "model.init_from",
                            "could not open \"%s\": %s", path, strerror(errno));
    if (confined && (rc = rank_file_confine(fileno(f), path, "model.init_from", err)))
        goto done;
    int32_t hdr[256];
    if (fread(hdr, sizeof(hdr), 1, f) != 1) {
        rc = kiln_err_set(err, KILN_EFORMAT, "model.init_from",
                          "\"%s\" is too short for an llm.c checkpoint header", path);
        goto done;
    }
    if (hdr[0] != LLMC_MAGIC) {
        rc = kiln_err_set(err, KILN_EFORMAT, "model.init_from",
                          "\"%s\" is not an llm.c checkpoint (its header does not start with "
                          "the magic number %d)", path, LLMC_MAGIC);
        goto done;
    }
    if (hdr[1] != 3 && hdr[1] != 2) {
        rc = kiln_err_set(err, KILN_EFORMAT, "model.init_from",
                          "\"%s\" is not version 2 or 3 of the llm.c format", path);
        goto done;
    }
    cfg->max_seq_len = hdr[2];
    cfg->vocab_size = hdr[3];
    cfg->n_layer = hdr[4];
    cfg->n_head = hdr[5];
    cfg->n_embd = hdr[6];
    cfg->padded_vocab_size = hdr[1] == 3 ? hdr[7] : hdr[3];
    if (cfg->max_seq_len < 1 || cfg->vocab_size < 1 || cfg->n_layer < 1 || cfg->n_head < 1 ||
        cfg->n_embd < 1 || cfg->padded_vocab_size < cfg->vocab_size ||
        cfg->n_embd % cfg->n_head) {
        rc = kiln_err_set(err, KILN_EFORMAT, "model.init_from",
                          "\"%s\" has an invalid model shape in its header", path);
        goto done;
    }
    size_t n = eng_gpt_num_params(cfg);
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || (size_t)sb.st_size != sizeof(hdr) + n * sizeof(float)) {
        rc = kiln_err_set(err, KILN_EFORMAT, "model.init_from",
                          "\"%s\" is truncated or padded: its size does not match the model "
                          "shape in its header", path);
        goto done;
    }
    if (params_out) {
        float *p = malloc(n * sizeof(float));
        if (!p) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto done;
        }
        if (fread(p, sizeof(float), n, f) != n) {
            free(p);
            rc = kiln_err_set(err, KILN_EIO, "model.init_from", "could not read \"%s\"", path);
            goto done;
        }
        *params_out = p;
    }
done:
    fclose(f);
    return rc;
}

int eng_gpt_llmc_write(const eng_gpt_t *m, const char *path, kiln_err_t *err)
{
    size_t n = m->p.n, bytes = 1024 + n * sizeof(float);
    uint8_t *buf = calloc(1, bytes);
    if (!buf) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int32_t *hdr = (int32_t *)buf;
    hdr[0] = LLMC_MAGIC;
    hdr[1] = 3;
    hdr[2] = m->cfg.max_seq_len;
    hdr[3] = m->cfg.vocab_size;
    hdr[4] = m->cfg.n_layer;
    hdr[5] = m->cfg.n_head;
    hdr[6] = m->cfg.n_embd;
    hdr[7] = m->cfg.padded_vocab_size;
    m->be->to_host(buf + 1024, m->p.params, n * sizeof(float));
    int rc = kiln_file_write_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}
