/* pipe_bench.c - pipeline-parallelism figures for bench/RESULTS.md: measured bubble against
 * (p-1)/(m+p-1), activation memory per stage (simple vs interleaved), balance of the automatic
 * partition on the GPT configurations, and a model that only fits a per-rank memory limit when
 * partitioned. Ranks are forked processes talking over libfabric shm, like a real job's ranks.
 *   build-x/bench/pipe_bench [--part all|synthetic|gpt|balance|limit] [--steps 6]
 * Prints human-readable tables on stdout. Not a test: it asserts nothing. */
#include "engine/job.h"
#include "engine/pipe/pipe.h"
#include "spec/spec.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXR 8
#define MAXM 16

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static void *shared(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(p, 0, n);
    return p;
}

typedef int (*rank_fn)(comm_t *c, int rank, void *arg);

/* Forks `world` ranks that join one comm group over shm and run fn. Returns 0 if all succeeded. */
static int run_ranks(int world, rank_fn fn, void *arg)
{
    int port = free_port();
    pid_t pids[MAXR];
    fflush(stdout); /* or the children flush the parent's buffered lines again */
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            if (!getenv("PIPE_BENCH_VERBOSE") && !freopen("/dev/null", "w", stdout))
                _exit(2);
            comm_config_t cc;
            comm_config_init(&cc);
            cc.rank = r;
            cc.world_size = world;
            cc.master_port = port;
            cc.provider = "shm";
            cc.timeout_s = 60;
            kiln_err_t err;
            comm_t *c = NULL;
            if (comm_create(&cc, &c, &err)) {
                fprintf(stderr, "rank %d: %s\n", r, err.message);
                _exit(2);
            }
            int rc = fn(c, r, arg);
            comm_destroy(c);
            _exit(rc ? 1 : 0);
        }
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st);
    }
    return bad;
}

/* ---- 1. synthetic stages: the schedule and transport alone ------------------------------------
 * FORWARD sleeps f ms and BACKWARD 2f ms (sleeping, so 4 stages on 2 cores do not compete for
 * CPU); activations and gradients of 256 KiB really travel over shm. */

typedef struct syn_arg {
    pipe_sched_kind_t kind;
    int p;
    double f_ms;
    int reps;
    /* out, per m (1..16), per rank, per rep: busy, t0, t1 */
    double (*res)[MAXR][5][3];
} syn_arg_t;

typedef struct syn_ctx {
    comm_t *c;
    int stage, p;
    double f_ms;
    float *buf[MAXM], *gbuf;
    comm_req_t *req[2 * MAXM];
    int nreq;
    size_t bytes;
} syn_ctx_t;

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

static int s_fwd(void *x, int mb, int slot, kiln_err_t *e) { (void)mb; (void)slot; (void)e; sleep_ms(((syn_ctx_t *)x)->f_ms); return 0; }
static int s_bwd(void *x, int mb, int slot, kiln_err_t *e) { (void)mb; (void)slot; (void)e; sleep_ms(2 * ((syn_ctx_t *)x)->f_ms); return 0; }
static int s_sa(void *x, int mb, int slot, kiln_err_t *e)
{
    syn_ctx_t *c = x;
    return comm_send_start(c->c, c->buf[slot], c->bytes, c->stage + 1, 1000 + mb, &c->req[c->nreq++], e);
}
static int s_ra(void *x, int mb, int slot, kiln_err_t *e)
{
    syn_ctx_t *c = x;
    return comm_recv(c->c, c->buf[slot], c->bytes, c->stage - 1, 1000 + mb, NULL, e);
}
static int s_sg(void *x, int mb, int slot, kiln_err_t *e)
{
    syn_ctx_t *c = x;
    (void)slot;
    return comm_send_start(c->c, c->gbuf, c->bytes, c->stage - 1, 2000 + mb, &c->req[c->nreq++], e);
}
static int s_rg(void *x, int mb, int slot, kiln_err_t *e)
{
    syn_ctx_t *c = x;
    (void)slot;
    return comm_recv(c->c, c->gbuf, c->bytes, c->stage + 1, 2000 + mb, NULL, e);
}
static int s_fin(void *x, kiln_err_t *e)
{
    syn_ctx_t *c = x;
    int rc = 0;
    for (int i = 0; i < c->nreq; i++) {
        int r = comm_wait(c->req[i], e);
        rc = rc ? rc : r;
    }
    c->nreq = 0;
    return rc;
}

static int syn_rank(comm_t *c, int rank, void *a_)
{
    syn_arg_t *a = a_;
    syn_ctx_t x = {.c = c, .stage = rank, .p = a->p, .f_ms = a->f_ms, .bytes = 256 * 1024};
    for (int i = 0; i < MAXM; i++)
        x.buf[i] = calloc(x.bytes, 1);
    x.gbuf = calloc(x.bytes, 1);
    pipe_hooks_t h = {s_fwd, s_bwd, s_sa, s_ra, s_sg, s_rg, s_fin};
    kiln_err_t err;
    for (int m = 1; m <= MAXM; m++) {
        pipe_sched_t s;
        if (pipe_sched_build(a->kind, rank, a->p, m, &s, &err))
            return 1;
        pipe_trace_entry_t *tr = calloc((size_t)s.n, sizeof(*tr));
        for (int rep = 0; rep < a->reps; rep++) {
            comm_barrier(c, &err);
            if (pipe_run(&s, &h, &x, tr, &err)) {
                fprintf(stderr, "stage %d: %s\n", rank, err.message);
                return 1;
            }
            double busy = 0;
            for (int i = 0; i < s.n; i++)
                if (tr[i].kind == PIPE_FORWARD || tr[i].kind == PIPE_BACKWARD)
                    busy += tr[i].t1 - tr[i].t0;
            a->res[m - 1][rank][rep][0] = busy;
            a->res[m - 1][rank][rep][1] = tr[0].t0;
            a->res[m - 1][rank][rep][2] = tr[s.n - 1].t1;
        }
        free(tr);
        pipe_sched_deinit(&s);
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void part_synthetic(void)
{
    printf("\n## measured bubble, synthetic stages (F = 4 ms, B = 8 ms of sleep; 256 KiB messages over shm)\n");
    printf("p | m | theory | simple measured | interleaved measured\n");
    for (int p = 2; p <= 4; p += 2) {
        double meas[2][MAXM];
        for (int k = 0; k < 2; k++) {
            syn_arg_t a = {.kind = (pipe_sched_kind_t)k, .p = p, .f_ms = 4.0, .reps = 5};
            a.res = shared(sizeof(double[MAXM][MAXR][5][3]));
            if (run_ranks(p, syn_rank, &a))
                fprintf(stderr, "synthetic p=%d failed\n", p);
            for (int m = 1; m <= MAXM; m++) {
                double b[5];
                for (int rep = 0; rep < a.reps; rep++) {
                    double busy = 0, t0 = INFINITY, t1 = -INFINITY;
                    for (int r = 0; r < p; r++) {
                        busy += a.res[m - 1][r][rep][0];
                        t0 = fmin(t0, a.res[m - 1][r][rep][1]);
                        t1 = fmax(t1, a.res[m - 1][r][rep][2]);
                    }
                    b[rep] = 1.0 - busy / (p * (t1 - t0));
                }
                qsort(b, (size_t)a.reps, sizeof(double), cmp_double);
                meas[k][m - 1] = b[a.reps / 2];
            }
            munmap(a.res, sizeof(double[MAXM][MAXR][5][3]));
        }
        for (int m = 1; m <= MAXM; m++)
            printf("%d | %d | %.3f | %.3f | %.3f\n", p, m, pipe_bubble_theory(p, m), meas[0][m - 1], meas[1][m - 1]);
        fflush(stdout);
    }
}

/* ---- 2. real GPT pipelines -------------------------------------------------------------------- */

static char g_data[128];

static void make_data(void)
{
    snprintf(g_data, sizeof(g_data), "/tmp/kiln-pipe-bench-%d.txt", (int)getpid());
    FILE *f = fopen(g_data, "w");
    const char *src = getenv("KILN_ROOT");
    char path[512];
    snprintf(path, sizeof(path), "%s/data/tinyshakespeare.txt", src ? src : ".");
    FILE *in = fopen(path, "r");
    if (in) {
        char b[65536];
        size_t n;
        while ((n = fread(b, 1, sizeof(b), in)) > 0)
            fwrite(b, 1, n, f);
        fclose(in);
    } else {
        uint64_t x = 1;
        for (int i = 0; i < 400000; i++) {
            x = x * 6364136223846793005ull + 1;
            fputc("etaoin shrdlu\n"[(x >> 40) % 14], f);
        }
    }
    fclose(f);
}

typedef struct gpt_run {
    char spec[4096];
    int threads;
    /* out */
    int rc[MAXR];
    char msg[MAXR][256];
    double bubble, step_ms, loss, sim_bubble;
    int peak_live[MAXR];
    double act_res[MAXR], act_plan[MAXR], state_res[MAXR], pred_mb[MAXR], peak_rss[MAXR];
    int first[MAXR], last[MAXR];
} gpt_run_t;

static int gpt_rank(comm_t *c, int rank, void *a_)
{
    gpt_run_t *g = a_;
    spec_t s;
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = spec_parse_string(g->spec, &s, &err);
    eng_train_result_t res = {0};
    eng_job_info_t job;
    memset(&job, 0, sizeof(job));
    pipe_train_info_t info = {0};
    if (!rc) {
        eng_train_opts_t o = {.metrics_fd = -1, .rank = rank, .world = comm_size(c), .threads = g->threads,
                              .peak_gflops = 100, .quiet = true};
        rc = eng_job_run(&s, &o, c, &res, &job, &err);
        info = job.pipe;
        spec_deinit(&s);
    }
    g->rc[rank] = rc;
    snprintf(g->msg[rank], sizeof(g->msg[rank]), "%s", err.message);
    if (!rc) {
        if (rank == 0) {
            g->bubble = info.bubble_measured;
            g->sim_bubble = info.plan.predicted_bubble;
            g->step_ms = info.step_ms_mean;
            g->loss = res.last_train_loss;
        }
        g->peak_live[rank] = info.peak_live;
        g->act_res[rank] = info.act_resident_bytes;
        g->act_plan[rank] = info.act_bytes_per_set * info.peak_live;
        g->state_res[rank] = info.state_resident_bytes;
        g->pred_mb[rank] = info.plan.stages[info.stage].predicted_mem_mb;
        g->peak_rss[rank] = res.peak_mem_mb;
        g->first[rank] = info.plan.stages[info.stage].first;
        g->last[rank] = info.plan.stages[info.stage].last;
    }
    free(res.losses);
    pipe_train_info_deinit(&info);
    return rc;
}

static gpt_run_t *gpt_run(int world, int parts, int m, int B, const char *sched, int n_layer, int n_embd, int T,
                          int steps, long mem_limit_mb, int threads, bool recompute)
{
    gpt_run_t *g = shared(sizeof(*g));
    g->threads = threads;
    snprintf(g->spec, sizeof(g->spec),
             "{\"name\": \"pipe-bench\", \"model\": {\"type\": \"gpt\", \"n_layer\": %d, \"n_head\": 4, \"n_embd\": %d,"
             " \"seq_len\": %d}, \"data\": {\"train\": \"%s\"},"
             " \"hyperparameters\": {\"lr\": 1e-3, \"global_batch_size\": %d, \"max_steps\": %d, \"eval_every\": 0,"
             " \"eval_batches\": 1, \"sample_tokens\": 0},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": %d, \"threads_per_rank\": %d, \"memory_limit_mb\": %ld},"
             " \"distribution\": {\"model_parallel\": {\"partitions\": %d, \"microbatches\": %d, \"pipeline\": \"%s\"},"
             " \"activation_checkpointing\": %s}}",
             n_layer, n_embd, T, g_data, B * m * (world / parts), steps, world, threads, mem_limit_mb, parts, m, sched,
             recompute ? "true" : "false");
    if (run_ranks(world, gpt_rank, g))
        for (int r = 0; r < world; r++)
            if (g->rc[r])
                fprintf(stderr, "gpt run (p=%d m=%d %s): rank %d: %s\n", parts, m, sched, r, g->msg[r]);
    return g;
}

static void part_gpt(int steps)
{
    printf("\n## measured bubble and activation memory, real GPT stages (6 layers, C=128, T=128, microbatch 2, "
           "1 thread per rank)\n");
    printf("p | m | theory | simulated with profiled stage costs (simple / interleaved) | simple bubble | "
           "interleaved bubble | simple step ms | interleaved step ms | "
           "stage-0 act MiB simple (sets) | interleaved (sets) | last-stage act MiB simple | interleaved\n");
    static const int ms[] = {1, 2, 4, 8, 16};
    for (int p = 2; p <= 4; p += 2)
        for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
            int m = ms[i];
            gpt_run_t *s = gpt_run(p, p, m, 2, "simple", 6, 128, 128, steps, 0, 1, false);
            gpt_run_t *in = gpt_run(p, p, m, 2, "interleaved", 6, 128, 128, steps, 0, 1, false);
            printf("%d | %d | %.3f | %.3f / %.3f | %.3f | %.3f | %.1f | %.1f | %.1f (%d) | %.1f (%d) | %.1f | %.1f\n", p,
                   m, pipe_bubble_theory(p, m), s->sim_bubble, in->sim_bubble, s->bubble, in->bubble, s->step_ms, in->step_ms, s->act_res[0] / 1048576.0,
                   s->peak_live[0], in->act_res[0] / 1048576.0, in->peak_live[0], s->act_res[p - 1] / 1048576.0,
                   in->act_res[p - 1] / 1048576.0);
            fflush(stdout);
            munmap(s, sizeof(*s));
            munmap(in, sizeof(*in));
        }
}

/* ---- 3. balance of the automatic partition ---------------------------------------------------- */

typedef struct gcfg {
    const char *name;
    int L, NH, C, V, Vp, T, B;
} gcfg_t;

/* Partitions prof (nb blocks) over p stages for 8 microbatches; prints one table row. */
static void balance_row(const char *name, const char *blocks, const pipe_block_profile_t *prof, int nb, int p)
{
    pipe_partition_opts_t o = {.n_stages = p, .microbatches = 8, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_INTERLEAVED};
    pipe_plan_t plan;
    kiln_err_t err;
    if (p > nb || pipe_partition(prof, nb, &o, &plan, &err)) {
        printf("%s | %s | %d | — (%d blocks) | | \n", name, blocks, p, nb);
        return;
    }
    char st[512] = "", ms[512] = "";
    size_t a = 0, b = 0;
    for (int k = 0; k < p; k++) {
        a += (size_t)snprintf(st + a, sizeof(st) - a, "%s[%d,%d]", k ? " " : "", plan.stages[k].first,
                              plan.stages[k].last);
        b += (size_t)snprintf(ms + b, sizeof(ms) - b, "%s%.2f", k ? " " : "", plan.stages[k].predicted_ms / 8);
    }
    printf("%s | %s | %d | %.3f | %s | %s\n", name, blocks, p, plan.balance, st, ms);
    pipe_plan_deinit(&plan);
}

/* Each configuration is profiled once with the head whole, then (when the head is dear) again
 * with the head cut as the pipeline layer cuts it. Partitioned at two granularities from the same
 * run: "layers" merges each layer's attention and MLP halves and keeps the head whole (kiln's
 * blocks before they were split), "halves + slices" is what the pipeline uses now. */
static void part_balance(void)
{
    static const gcfg_t cfgs[] = {
        {"gpt-tiny (examples)", 2, 4, 64, 256, 256, 64, 4},
        {"gpt-shakespeare (examples)", 4, 4, 128, 256, 256, 128, 4},
        {"small (engine_bench)", 4, 4, 256, 256, 256, 128, 8},
        {"6L C=384 T=256 (DESIGN.md)", 6, 6, 384, 256, 256, 256, 4},
        {"124m (GPT-2, T=64)", 12, 12, 768, 50257, 50304, 64, 4},
    };
    printf("\n## balance of the automatic partition (optimize: speed; profiled with 1 thread on this machine)\n");
    printf("config | blocks | p | slowest/mean | stages (blocks) | predicted stage ms (per microbatch)\n");
    eng_cpu_set_threads(1);
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        const gcfg_t *c = &cfgs[i];
        eng_gpt_config_t cfg = {c->T, c->V, c->Vp, c->L, c->NH, c->C};
        int L = c->L, n1 = 2 * L + 2;
        pipe_block_profile_t prof[2 * 12 + 1 + PIPE_MAX_HEAD_BLOCKS], coarse[12 + 2];
        kiln_err_t err;
        if (pipe_profile_gpt(&cfg, &eng_cpu_backend, c->B, c->T, 1, false, 2, 5, prof, NULL, &err)) {
            fprintf(stderr, "%s: %s\n", c->name, err.message);
            continue;
        }
        /* whole layers and the whole head, from the same profile */
        coarse[0] = prof[0];
        for (int l = 0; l < L; l++) {
            const pipe_block_profile_t *x = &prof[1 + 2 * l], *y = &prof[2 + 2 * l];
            coarse[1 + l] = (pipe_block_profile_t){x->fwd_ms + y->fwd_ms, x->bwd_ms + y->bwd_ms,
                                                   x->param_bytes + y->param_bytes, x->opt_bytes + y->opt_bytes,
                                                   x->act_bytes_per_mb + y->act_bytes_per_mb};
        }
        coarse[L + 1] = prof[n1 - 1];
        double attn = prof[1].fwd_ms + prof[1].bwd_ms, mlp = prof[2].fwd_ms + prof[2].bwd_ms;
        double head = prof[n1 - 1].fwd_ms + prof[n1 - 1].bwd_ms;
        int J = pipe_gpt_choose_head_blocks(prof, L);
        if (J > 1 && pipe_profile_gpt(&cfg, &eng_cpu_backend, c->B, c->T, J, false, 2, 5, prof, NULL, &err)) {
            fprintf(stderr, "%s: %s\n", c->name, err.message);
            continue;
        }
        int nb = 2 * L + 1 + J;
        for (int p = 2; p <= 8; p *= 2) {
            balance_row(c->name, "layers", coarse, L + 2, p);
            balance_row(c->name, "halves + slices", prof, nb, p);
        }
        printf("%s | profile | embedding %.2f ms, attention %.2f ms, MLP %.2f ms, head %.2f ms whole, cut into %d "
               "(forward + backward) | | | \n", c->name, prof[0].fwd_ms + prof[0].bwd_ms, attn, mlp, head, J);
        fflush(stdout);
    }
}

/* ---- 4. a model that fits a memory limit only when partitioned -------------------------------- */

static void part_limit(int steps)
{
    const int L = 8, C = 256, T = 128, m = 4, B = 2;
    const long limit = 112, rec_limit = 90;
    printf("\n## memory limit %ld MiB per rank: %d layers, C=%d, T=%d, %d microbatches of %d, interleaved\n", limit, L,
           C, T, m, B);
    eng_gpt_config_t cfg = {T, 256, 256, L, 4, C};
    pipe_block_profile_t prof[64];
    size_t over = 0;
    kiln_err_t err;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* profiling uses OpenMP: keep it out of the parent that forks ranks */
        eng_cpu_set_threads(1);
        pipe_profile_gpt(&cfg, &eng_cpu_backend, B, T, 1, false, 1, 3, prof, &over, &err);
        /* the process baseline counts, as the pipeline layer counts it */
        long pages = 0, resident = 0;
        FILE *sf = fopen("/proc/self/statm", "r");
        if (sf && fscanf(sf, "%ld %ld", &pages, &resident) == 2)
            over += (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
        if (sf)
            fclose(sf);
        pipe_partition_opts_t o = {.n_stages = 1, .microbatches = m, .optimize = PIPE_OPT_SPEED,
                                   .schedule = PIPE_SCHED_INTERLEAVED, .mem_limit_bytes = (size_t)limit << 20,
                                   .rank_overhead_bytes = over};
        pipe_plan_t plan;
        int rc = pipe_partition(prof, 2 * L + 2, &o, &plan, &err);
        printf("1 partition: %s\n", rc ? err.message : "fits");
        fflush(stdout);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    printf("partitions | ranks | fits | tokens/s | step ms | resident params+grads+AdamW per rank MiB | "
           "resident activations per rank MiB | predicted per rank MiB | peak RSS per rank MB\n");
    for (int k = 0; k < 3; k++) {
        int p = k == 0 ? 2 : k == 1 ? 4 : 2;
        bool rec = k == 2;
        gpt_run_t *g = gpt_run(p, p, m, B, "interleaved", L, C, T, steps, rec ? rec_limit : limit, 1, rec);
        if (rec)
            printf("(2 partitions with activation checkpointing under a %ld MiB limit, which 2 partitions without it "
                   "miss:)\n", rec_limit);
        if (g->rc[0]) {
            printf("%d | %d | no: %s\n", p, p, g->msg[0]);
        } else {
            char st[256] = "", ac[256] = "", pr[256] = "", rs[256] = "";
            size_t a = 0, b = 0, c = 0, d = 0;
            for (int r = 0; r < p; r++) {
                a += (size_t)snprintf(st + a, sizeof(st) - a, "%s%.1f", r ? " / " : "", g->state_res[r] / 1048576.0);
                b += (size_t)snprintf(ac + b, sizeof(ac) - b, "%s%.1f", r ? " / " : "", g->act_res[r] / 1048576.0);
                c += (size_t)snprintf(pr + c, sizeof(pr) - c, "%s%.1f", r ? " / " : "", g->pred_mb[r]);
                d += (size_t)snprintf(rs + d, sizeof(rs) - d, "%s%.1f", r ? " / " : "", g->peak_rss[r]);
            }
            printf("%d | %d | yes | %.0f | %.1f | %s | %s | %s | %s\n", p, p, (double)m * B * T / (g->step_ms / 1e3),
                   g->step_ms, st, ac, pr, rs);
        }
        fflush(stdout);
        munmap(g, sizeof(*g));
    }
}

int main(int argc, char **argv)
{
    const char *part = "all";
    int64_t steps = 6;
    config_flag_t flags[] = {
        {"part", NULL, CONFIG_STR, &part, CONFIG_ANY, "all, synthetic, gpt, balance or limit"},
        {"steps", NULL, CONFIG_INT, &steps, CONFIG_ANY, "training steps per GPT run (the first is not timed)"},
    };
    kiln_err_t err;
    log_init("pipe_bench");
    log_set_level(LOG_WARN);
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "[options]", NULL, &err);
    if (rc)
        return rc == 1 ? 0 : 2;
    signal(SIGPIPE, SIG_IGN);
    make_data();
    bool all = !strcmp(part, "all");
    if (all || !strcmp(part, "synthetic"))
        part_synthetic();
    if (all || !strcmp(part, "gpt"))
        part_gpt((int)steps);
    if (all || !strcmp(part, "limit"))
        part_limit((int)steps);
    if (all || !strcmp(part, "balance"))
        part_balance();
    unlink(g_data);
    return 0;
}
