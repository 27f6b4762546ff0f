/* test_data.c - data and checkpoint formats: byte text, llm.c token shards (valid and every kind
 * of broken), the sampler's per-rank shards, kiln checkpoints (round trip, rotation, corruption,
 * wrong model) and llm.c GPT-2 checkpoints (round trip, bad header, wrong size). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/common/harness.h"

static char g_dir[64];

static void mkdir_tmp(void)
{
    strcpy(g_dir, "/tmp/kiln-eng-data-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void rm_tmp(void)
{
    if (!th_rm_tree(g_dir))
        fprintf(stderr, "could not remove %s\n", g_dir);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

TestSuite(data, .init = mkdir_tmp, .fini = rm_tmp);

Test(data, text_bytes_and_split)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/t.txt", g_dir);
    write_file(path, "hello, world\xff", 13);
    eng_tokens_t t, v;
    kiln_err_t err;
    cr_assert_eq(eng_tokens_load(path, ENG_DATA_TEXT, &t, &err), 0);
    cr_assert_eq(t.n, 13);
    cr_assert_eq(t.tok[0], 'h');
    cr_assert_eq(t.tok[12], 255);
    cr_assert_eq(t.max_token, 255);
    cr_assert_eq(eng_tokens_split_tail(&t, 0.25, &v, &err), 0);
    cr_assert_eq(v.n, 3); /* floor(13 * 0.25): the last 3 bytes */
    cr_assert_eq(t.n, 10);
    cr_assert_eq(v.tok[0], 'l');
    cr_assert_eq(v.tok[2], 255);
    eng_tokens_deinit(&t);
    eng_tokens_deinit(&v);
}

Test(data, missing_and_unreadable_files)
{
    eng_tokens_t t;
    kiln_err_t err;
    cr_assert_eq(eng_tokens_load("/nonexistent/x.txt", ENG_DATA_TEXT, &t, &err), KILN_ENOTFOUND);
    cr_assert(strstr(err.message, "/nonexistent/x.txt"), "%s", err.message);
    cr_assert_str_eq(err.field, "data.train");
    cr_assert_eq(eng_tokens_load(g_dir, ENG_DATA_TEXT, &t, &err), KILN_EIO);
    cr_assert(strstr(err.message, "not a regular file"), "%s", err.message);
    if (geteuid() != 0) { /* root reads anything */
        char path[128];
        snprintf(path, sizeof(path), "%s/locked.txt", g_dir);
        write_file(path, "abc", 3);
        chmod(path, 0);
        cr_assert_eq(eng_tokens_load(path, ENG_DATA_TEXT, &t, &err), KILN_EIO);
    }
}

Test(data, token_shards)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/s.bin", g_dir);
    uint16_t toks[5] = {1, 50256, 7, 0, 300};
    kiln_err_t err;
    eng_tokens_t t;
    cr_assert_eq(eng_tokens_write_shard(path, toks, 5, &err), 0);
    cr_assert_eq(eng_tokens_load(path, ENG_DATA_TOKENS, &t, &err), 0, "%s", err.message);
    cr_assert_eq(t.n, 5);
    cr_assert_eq(t.tok[1], 50256);
    cr_assert_eq(t.max_token, 50256);
    eng_tokens_deinit(&t);

    unsigned char buf[1024 + 10];
    FILE *f = fopen(path, "rb");
    cr_assert_eq(fread(buf, 1, sizeof(buf), f), sizeof(buf));
    fclose(f);
    int32_t *h = (int32_t *)buf;
    struct { const char *what; int field; int32_t value; size_t len; const char *msg; } cases[] = {
        {"bad magic", 0, 12345, sizeof(buf), "is not an llm.c token shard"},
        {"bad version", 1, 7, sizeof(buf), "is not version 1"},
        {"count too large", 2, 6, sizeof(buf), "does not match the token count"},
        {"truncated payload", 2, 5, sizeof(buf) - 3, "does not match the token count"},
        {"truncated header", 2, 5, 100, "too short"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char bad[sizeof(buf)];
        memcpy(bad, buf, sizeof(buf));
        ((int32_t *)bad)[cases[i].field] = cases[i].value;
        write_file(path, bad, cases[i].len);
        kiln_err_clear(&err);
        cr_assert_eq(eng_tokens_load(path, ENG_DATA_TOKENS, &t, &err), KILN_EFORMAT, "%s",
                     cases[i].what);
        cr_assert(strstr(err.message, cases[i].msg), "%s: message \"%s\"", cases[i].what,
                  err.message);
        cr_assert(strstr(err.message, path), "message names the file: %s", err.message);
        /* the file's own bytes never appear in a message (a spec could point at any file) */
        cr_assert(!strstr(err.message, "12345") && !strstr(err.detail, "12345"), "%s", err.message);
    }
    (void)h;
}

/* Each rank's microbatches are its own slice of the step's global batch; together they are
 * exactly the single-rank batch. */
Test(data, sampler_shards_by_rank)
{
    eng_tokens_t t = {0};
    t.n = 10000;
    t.tok = malloc(sizeof(int32_t) * t.n);
    for (size_t i = 0; i < t.n; i++) t.tok[i] = (int32_t)(i % 251);
    int T = 8, G = 8;
    kiln_err_t err;
    eng_sampler_t one, r0, r1;
    cr_assert_eq(eng_sampler_init(&one, &t, T, G, 0, 1, true, 42, &err), 0);
    cr_assert_eq(eng_sampler_init(&r0, &t, T, G, 0, 2, true, 42, &err), 0);
    cr_assert_eq(eng_sampler_init(&r1, &t, T, G, 1, 2, true, 42, &err), 0);
    int32_t all_tok[64], all_tgt[64], tok[32], tgt[32];
    for (int step = 0; step < 3; step++) {
        eng_sampler_next_step(&one);
        eng_sampler_next_step(&r0);
        eng_sampler_next_step(&r1);
        eng_sampler_micro(&one, 0, 8, all_tok, all_tgt); /* B=8: the whole global batch */
        for (int m = 0; m < 2; m++) { /* each rank: 2 microbatches of 2 */
            eng_sampler_micro(&r0, m, 2, tok, tgt);
            cr_assert(memcmp(tok, all_tok + m * 2 * T, 2 * T * 4) == 0);
            eng_sampler_micro(&r1, m, 2, tok, tgt);
            cr_assert(memcmp(tok, all_tok + (4 + m * 2) * T, 2 * T * 4) == 0);
            cr_assert(memcmp(tgt, all_tgt + (4 + m * 2) * T, 2 * T * 4) == 0);
        }
        for (int i = 0; i < 8 * T; i++) cr_assert_eq(all_tgt[i], (all_tok[i] + 1) % 251);
    }
    /* sequential mode walks the data and wraps into the next epoch */
    eng_sampler_t seq;
    cr_assert_eq(eng_sampler_init(&seq, &t, T, G, 0, 1, false, 0, &err), 0);
    for (int i = 0; i < 200; i++) eng_sampler_next_step(&seq);
    cr_assert_eq(seq.st.epoch, 1);
    eng_sampler_deinit(&seq);
    cr_assert_neq(eng_sampler_init(&seq, &t, 20000, G, 0, 1, false, 0, &err), 0);
    cr_assert(strstr(err.message, "fewer than one sequence"), "%s", err.message);
    eng_sampler_deinit(&one);
    eng_sampler_deinit(&r0);
    eng_sampler_deinit(&r1);
    eng_sampler_deinit(&seq);
    eng_tokens_deinit(&t);
}

Test(data, checkpoint_round_trip_rotation_corruption)
{
    size_t n = 1000;
    float *p = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    float *p2 = malloc(n * 4), *m2 = malloc(n * 4), *v2 = malloc(n * 4);
    for (size_t i = 0; i < n; i++) { p[i] = (float)i * 0.5f; m[i] = -(float)i; v[i] = (float)i * i; }
    eng_ckpt_meta_t meta = {0};
    meta.model_hash = 99;
    meta.n_params = n;
    eng_rng_seed(&meta.train.rng, 5);
    meta.train.pos = 1234;
    eng_rng_seed(&meta.sample_rng, 6);
    kiln_err_t err;
    for (int s = 1; s <= 4; s++) {
        meta.step = s * 10;
        cr_assert_eq(eng_ckpt_write(g_dir, &meta, &eng_cpu_backend, p, m, v, n, 2, &err), 0,
                     "%s", err.message);
    }
    char path[256];
    cr_assert_eq(eng_ckpt_find_latest(g_dir, path, sizeof(path)), 0);
    cr_assert(strstr(path, "ckpt_00000040.bin"), "%s", path);
    char old[256];
    snprintf(old, sizeof(old), "%s/ckpt_00000020.bin", g_dir);
    cr_assert_neq(access(old, F_OK), 0, "keep_last 2 should have removed step 20");
    snprintf(old, sizeof(old), "%s/ckpt_00000030.bin", g_dir);
    cr_assert_eq(access(old, F_OK), 0);

    eng_ckpt_meta_t got = {0};
    got.model_hash = 99;
    cr_assert_eq(eng_ckpt_read(path, &got, &eng_cpu_backend, p2, m2, v2, n, &err), 0, "%s",
                 err.message);
    cr_assert_eq(got.step, 40);
    cr_assert_eq(got.train.pos, 1234);
    cr_assert(memcmp(&got.train.rng, &meta.train.rng, sizeof(eng_rng_t)) == 0);
    cr_assert(memcmp(&got.sample_rng, &meta.sample_rng, sizeof(eng_rng_t)) == 0);
    cr_assert(memcmp(p, p2, n * 4) == 0 && memcmp(m, m2, n * 4) == 0 && memcmp(v, v2, n * 4) == 0);

    /* a different model */
    got.model_hash = 98;
    cr_assert_eq(eng_ckpt_read(path, &got, &eng_cpu_backend, p2, m2, v2, n, &err), KILN_EFORMAT);
    cr_assert(strstr(err.message, "different model"), "%s", err.message);
    got.model_hash = 99;
    cr_assert_eq(eng_ckpt_read(path, &got, &eng_cpu_backend, p2, m2, v2, n - 1, &err),
                 KILN_EFORMAT);
    /* a flipped byte in the payload */
    FILE *f = fopen(path, "r+b");
    fseek(f, 600, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    cr_assert_eq(eng_ckpt_read(path, &got, &eng_cpu_backend, p2, m2, v2, n, &err), KILN_EFORMAT);
    cr_assert(strstr(err.message, "corrupt"), "%s", err.message);
    /* truncated */
    cr_assert_eq(truncate(path, 4000), 0);
    cr_assert_eq(eng_ckpt_read(path, &got, &eng_cpu_backend, p2, m2, v2, n, &err), KILN_EFORMAT);
    cr_assert(strstr(err.message, "truncated"), "%s", err.message);
    /* no temporary files left behind */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "ls -a %s | grep -q tmp", g_dir);
    cr_assert_neq(system(cmd), 0, "temporary checkpoint file left behind");
    free(p); free(m); free(v); free(p2); free(m2); free(v2);
}

Test(data, llmc_checkpoint_round_trip)
{
    eng_gpt_config_t cfg = {16, 60, 64, 2, 2, 16};
    eng_gpt_t *m = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, 1, &m, &err), 0);
    eng_gpt_init_weights(m, 3);
    char path[128];
    snprintf(path, sizeof(path), "%s/gpt2.bin", g_dir);
    cr_assert_eq(eng_gpt_llmc_write(m, path, &err), 0, "%s", err.message);
    /* header as llm.c writes it */
    int32_t hdr[256];
    FILE *f = fopen(path, "rb");
    cr_assert_eq(fread(hdr, 4, 256, f), 256);
    fclose(f);
    cr_assert_eq(hdr[0], 20240326);
    cr_assert_eq(hdr[1], 3);
    cr_assert_eq(hdr[2], 16);
    cr_assert_eq(hdr[3], 60);
    cr_assert_eq(hdr[4], 2);
    cr_assert_eq(hdr[5], 2);
    cr_assert_eq(hdr[6], 16);
    cr_assert_eq(hdr[7], 64);
    eng_gpt_config_t got;
    float *params = NULL;
    cr_assert_eq(eng_gpt_llmc_read(path, &got, &params, &err), 0, "%s", err.message);
    cr_assert(memcmp(&got, &cfg, sizeof(cfg)) == 0);
    cr_assert(memcmp(params, m->p.params, m->p.n * 4) == 0);
    free(params);
    /* wrong size */
    cr_assert_eq(truncate(path, 1024 + 100), 0);
    cr_assert_eq(eng_gpt_llmc_read(path, &got, NULL, &err), KILN_EFORMAT);
    cr_assert(strstr(err.message, "does not match the model shape"), "%s", err.message);
    /* bad magic */
    hdr[0] = 1;
    write_file(path, hdr, sizeof(hdr));
    cr_assert_eq(eng_gpt_llmc_read(path, &got, NULL, &err), KILN_EFORMAT);
    cr_assert(strstr(err.message, "is not an llm.c checkpoint"), "%s", err.message);
    eng_gpt_destroy(m);
}
