/* test_schedule.c - pipeline schedules as data: every stage's action list forwards and backwards
 * each microbatch exactly once in a legal order, sends match receives between neighbouring stages
 * (played against each other by the simulator, which also finds no deadlock), peak live
 * activations are m (simple) and min(m, p - stage) (interleaved), the simulated bubble is
 * (p-1)/(m+p-1), and pipe_run drives a real multi-threaded pipeline whose numbers equal the
 * serial computation with activation slots reused. */
#include "engine/pipe/pipe.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *fmt(const pipe_sched_t *s)
{
    static char buf[4096];
    return pipe_sched_format(s, buf, sizeof(buf));
}

Test(schedule, known_lists)
{
    pipe_sched_t s;
    kiln_err_t err;
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_SIMPLE, 0, 2, 2, &s, &err), 0);
    cr_assert_str_eq(fmt(&s), "F0 SA0 F1 SA1 RG0 B0 RG1 B1");
    pipe_sched_deinit(&s);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_SIMPLE, 1, 2, 2, &s, &err), 0);
    cr_assert_str_eq(fmt(&s), "RA0 F0 RA1 F1 B0 SG0 B1 SG1");
    pipe_sched_deinit(&s);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_INTERLEAVED, 0, 2, 3, &s, &err), 0);
    cr_assert_str_eq(fmt(&s), "F0 SA0 F1 SA1 RG0 B0 F2 SA2 RG1 B1 RG2 B2");
    pipe_sched_deinit(&s);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_INTERLEAVED, 1, 3, 4, &s, &err), 0);
    cr_assert_str_eq(fmt(&s), "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 RA2 F2 SA2 RG1 B1 SG1 RA3 F3 SA3 RG2 B2 SG2 RG3 B3 SG3");
    pipe_sched_deinit(&s);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_INTERLEAVED, 2, 3, 2, &s, &err), 0);
    cr_assert_str_eq(fmt(&s), "RA0 F0 B0 SG0 RA1 F1 B1 SG1");
    pipe_sched_deinit(&s);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_INTERLEAVED, 0, 1, 2, &s, &err), 0);
    cr_assert_str_eq(fmt(&s), "F0 B0 F1 B1");
    pipe_sched_deinit(&s);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_SIMPLE, 2, 2, 2, &s, &err), KILN_EINVAL);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_SIMPLE, 0, 2, 0, &s, &err), KILN_EINVAL);
}

/* Checks one stage's list: each microbatch forwarded and backwarded exactly once, forward before
 * backward, receives before the compute that needs them, sends after, activation slots never
 * shared by two live microbatches and the peak as stated. */
static void check_stage(const pipe_sched_t *s)
{
    int p = s->n_stages, m = s->m, st = s->stage;
    int *pos_f = calloc(m, sizeof(int)), *pos_b = calloc(m, sizeof(int)), *pos_ra = calloc(m, sizeof(int)),
        *pos_sa = calloc(m, sizeof(int)), *pos_rg = calloc(m, sizeof(int)), *pos_sg = calloc(m, sizeof(int));
    int *slot = calloc(m, sizeof(int)), *owner = malloc(sizeof(int) * m);
    for (int i = 0; i < m; i++)
        owner[i] = -1;
    int live = 0, peak = 0;
    for (int i = 0; i < s->n; i++) {
        const pipe_action_t *a = &s->actions[i];
        cr_assert(a->mb >= 0 && a->mb < m);
        int *pos = NULL;
        switch (a->kind) {
        case PIPE_FORWARD: pos = pos_f; break;
        case PIPE_BACKWARD: pos = pos_b; break;
        case PIPE_RECV_ACT: pos = pos_ra; break;
        case PIPE_SEND_ACT: pos = pos_sa; break;
        case PIPE_RECV_GRAD: pos = pos_rg; break;
        case PIPE_SEND_GRAD: pos = pos_sg; break;
        }
        cr_assert_eq(pos[a->mb], 0, "stage %d: %s%d appears twice in %s", st, pipe_action_name(a->kind), a->mb, fmt(s));
        pos[a->mb] = i + 1;
        if ((a->kind == PIPE_FORWARD && st == 0) || a->kind == PIPE_RECV_ACT) {
            cr_assert(a->slot >= 0 && a->slot < m);
            cr_assert_eq(owner[a->slot], -1, "stage %d: slot %d given to mb %d while mb %d is live", st, a->slot,
                         a->mb, owner[a->slot]);
            owner[a->slot] = a->mb;
            slot[a->mb] = a->slot;
            if (++live > peak)
                peak = live;
        } else if (a->kind != PIPE_SEND_GRAD) {
            cr_assert_eq(a->slot, slot[a->mb], "stage %d: %s%d uses slot %d, its slot is %d", st,
                         pipe_action_name(a->kind), a->mb, a->slot, slot[a->mb]);
        }
        if (a->kind == PIPE_BACKWARD) {
            owner[a->slot] = -1;
            live--;
        }
    }
    for (int mb = 0; mb < m; mb++) {
        cr_assert(pos_f[mb] && pos_b[mb], "stage %d: mb %d not forwarded and backwarded", st, mb);
        cr_assert_lt(pos_f[mb], pos_b[mb]);
        if (st > 0) {
            cr_assert(pos_ra[mb] && pos_ra[mb] < pos_f[mb]);
            cr_assert(pos_sg[mb] && pos_sg[mb] > pos_b[mb]);
        } else {
            cr_assert(!pos_ra[mb] && !pos_sg[mb]);
        }
        if (st < p - 1) {
            cr_assert(pos_sa[mb] && pos_sa[mb] > pos_f[mb]);
            cr_assert(pos_rg[mb] && pos_rg[mb] < pos_b[mb]);
        } else {
            cr_assert(!pos_sa[mb] && !pos_rg[mb]);
        }
    }
    int want = pipe_sched_live_acts(s->kind, st, p, m);
    cr_assert_eq(peak, want, "%s stage %d of %d, m=%d: peak %d live, want %d", pipe_sched_name(s->kind), st, p, m,
                 peak, want);
    cr_assert_eq(s->peak_live, want);
    free(pos_f); free(pos_b); free(pos_ra); free(pos_sa); free(pos_rg); free(pos_sg); free(slot); free(owner);
}

Test(schedule, every_list_is_legal_and_matches_its_neighbours)
{
    for (int k = 0; k < 2; k++)
        for (int p = 1; p <= 6; p++)
            for (int m = 1; m <= 10; m++) {
                pipe_sched_t sc[6];
                kiln_err_t err;
                for (int s = 0; s < p; s++) {
                    cr_assert_eq(pipe_sched_build((pipe_sched_kind_t)k, s, p, m, &sc[s], &err), 0, "%s", err.message);
                    check_stage(&sc[s]);
                }
                pipe_sim_result_t r;
                cr_assert_eq(pipe_sim_run(sc, p, NULL, &r, &err), 0, "%s p=%d m=%d: %s", pipe_sched_name(k), p, m,
                             err.message);
                for (int s = 0; s < p; s++)
                    pipe_sched_deinit(&sc[s]);
            }
}

Test(schedule, uniform_bubble_is_theoretical)
{
    for (int k = 0; k < 2; k++)
        for (int p = 1; p <= 5; p++)
            for (int m = 1; m <= 16; m++) {
                pipe_sched_t sc[5];
                kiln_err_t err;
                for (int s = 0; s < p; s++)
                    cr_assert_eq(pipe_sched_build((pipe_sched_kind_t)k, s, p, m, &sc[s], &err), 0);
                /* forward = backward = 1, and backward = 2 x forward as on real models */
                double one[5] = {1, 1, 1, 1, 1}, two[5] = {2, 2, 2, 2, 2};
                pipe_sim_costs_t c1 = {.fwd = one, .bwd = one}, c2 = {.fwd = one, .bwd = two};
                pipe_sim_result_t r;
                double want = pipe_bubble_theory(p, m);
                cr_assert_eq(pipe_sim_run(sc, p, &c1, &r, &err), 0, "%s", err.message);
                cr_assert_float_eq(r.bubble, want, 1e-12, "%s p=%d m=%d: bubble %.4f, theory %.4f",
                                   pipe_sched_name(k), p, m, r.bubble, want);
                cr_assert_float_eq(r.makespan, 2.0 * (m + p - 1), 1e-9);
                cr_assert_eq(pipe_sim_run(sc, p, &c2, &r, &err), 0, "%s", err.message);
                cr_assert_float_eq(r.bubble, want, 1e-12, "%s p=%d m=%d b=2f: bubble %.4f, theory %.4f",
                                   pipe_sched_name(k), p, m, r.bubble, want);
                for (int s = 0; s < p; s++)
                    pipe_sched_deinit(&sc[s]);
            }
    cr_assert_float_eq(pipe_bubble_theory(4, 1), 0.75, 1e-12);
    cr_assert_float_eq(pipe_bubble_theory(2, 16), 1.0 / 17, 1e-12);
}

Test(schedule, simulator_finds_mismatches_and_deadlocks)
{
    pipe_sched_t sc[2];
    kiln_err_t err;
    pipe_sim_result_t r;
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_SIMPLE, 0, 2, 2, &sc[0], &err), 0);
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_SIMPLE, 1, 2, 2, &sc[1], &err), 0);
    /* stage 1 receives activation 1 twice (RA1 F0 RA1 F1 ...) */
    sc[1].actions[0].mb = 1;
    cr_assert_eq(pipe_sim_run(sc, 2, NULL, &r, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "twice") || strstr(err.message, "deadlock") || strstr(err.message, "never"),
              "%s", err.message);
    sc[1].actions[0].mb = 0;
    cr_assert_eq(pipe_sim_run(sc, 2, NULL, &r, &err), 0, "%s", err.message);
    /* a real deadlock: stage 0 waits for gradient 0 before sending activation 0 */
    pipe_action_t save = sc[0].actions[1];
    sc[0].actions[1] = sc[0].actions[4];
    sc[0].actions[4] = save;
    cr_assert_eq(pipe_sim_run(sc, 2, NULL, &r, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "schedule deadlocks: stage 0 waits forever at action 1 (RG0)"), "%s", err.message);
    pipe_sched_deinit(&sc[0]);
    pipe_sched_deinit(&sc[1]);
}

/* ---- a real pipeline on threads ----------------------------------------------------------
 * Stage s multiplies its input by w[s] (forward) and back-propagates (dx = w dy, dw += x dy); the
 * last stage's loss is sum(y^2)/2 so dy = y. Messages go through mailboxes (send never waits,
 * receive blocks), the same contract the comm layer's async sends give. */
#define T_P 4
#define T_M 6
#define T_N 8

typedef struct mailbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    float act[T_P][T_M][T_N]; /* act[s][mb]: output of stage s */
    bool act_ok[T_P][T_M];
    float grad[T_P][T_M][T_N]; /* grad[s][mb]: gradient of stage s's input */
    bool grad_ok[T_P][T_M];
} mailbox_t;

typedef struct stage_ctx {
    mailbox_t *mb;
    int s, p;
    float w, dw;
    float in[T_M][T_N], out[T_M][T_N], dout[T_M][T_N], din[T_M][T_N]; /* per slot */
    const float (*x)[T_N];  /* inputs for stage 0 (per microbatch) */
    float loss;
    int calls;
} stage_ctx_t;

static int h_forward(void *c_, int mb, int slot, kiln_err_t *err)
{
    (void)err;
    stage_ctx_t *c = c_;
    if (c->s == 0)
        memcpy(c->in[slot], c->x[mb], sizeof(c->in[slot]));
    for (int i = 0; i < T_N; i++)
        c->out[slot][i] = c->w * c->in[slot][i];
    if (c->s == c->p - 1)
        for (int i = 0; i < T_N; i++) {
            c->loss += 0.5f * c->out[slot][i] * c->out[slot][i];
            c->dout[slot][i] = c->out[slot][i];
        }
    c->calls++;
    return 0;
}

static int h_backward(void *c_, int mb, int slot, kiln_err_t *err)
{
    (void)err;
    (void)mb;
    stage_ctx_t *c = c_;
    for (int i = 0; i < T_N; i++) {
        c->dw += c->in[slot][i] * c->dout[slot][i];
        c->din[slot][i] = c->w * c->dout[slot][i];
    }
    /* poison the slot: a schedule that reused it too early would give wrong numbers */
    for (int i = 0; i < T_N; i++)
        c->in[slot][i] = c->out[slot][i] = c->dout[slot][i] = 1e30f;
    return 0;
}

static int h_send_act(void *c_, int mb, int slot, kiln_err_t *err)
{
    (void)err;
    stage_ctx_t *c = c_;
    pthread_mutex_lock(&c->mb->mu);
    memcpy(c->mb->act[c->s][mb], c->out[slot], sizeof(c->out[slot]));
    c->mb->act_ok[c->s][mb] = true;
    pthread_cond_broadcast(&c->mb->cv);
    pthread_mutex_unlock(&c->mb->mu);
    return 0;
}

static int h_recv_act(void *c_, int mb, int slot, kiln_err_t *err)
{
    (void)err;
    stage_ctx_t *c = c_;
    pthread_mutex_lock(&c->mb->mu);
    while (!c->mb->act_ok[c->s - 1][mb])
        pthread_cond_wait(&c->mb->cv, &c->mb->mu);
    memcpy(c->in[slot], c->mb->act[c->s - 1][mb], sizeof(c->in[slot]));
    pthread_mutex_unlock(&c->mb->mu);
    return 0;
}

static int h_send_grad(void *c_, int mb, int slot, kiln_err_t *err)
{
    (void)err;
    stage_ctx_t *c = c_;
    pthread_mutex_lock(&c->mb->mu);
    memcpy(c->mb->grad[c->s][mb], c->din[slot], sizeof(c->din[slot]));
    c->mb->grad_ok[c->s][mb] = true;
    pthread_cond_broadcast(&c->mb->cv);
    pthread_mutex_unlock(&c->mb->mu);
    return 0;
}

static int h_recv_grad(void *c_, int mb, int slot, kiln_err_t *err)
{
    (void)err;
    stage_ctx_t *c = c_;
    pthread_mutex_lock(&c->mb->mu);
    while (!c->mb->grad_ok[c->s + 1][mb])
        pthread_cond_wait(&c->mb->cv, &c->mb->mu);
    memcpy(c->dout[slot], c->mb->grad[c->s + 1][mb], sizeof(c->dout[slot]));
    pthread_mutex_unlock(&c->mb->mu);
    return 0;
}

typedef struct thread_arg {
    stage_ctx_t *ctx;
    pipe_sched_t *sched;
    pipe_trace_entry_t *trace;
    int rc;
} thread_arg_t;

static void *run_stage(void *a_)
{
    thread_arg_t *a = a_;
    static const pipe_hooks_t hooks = {h_forward, h_backward, h_send_act, h_recv_act, h_send_grad, h_recv_grad, NULL};
    kiln_err_t err;
    a->rc = pipe_run(a->sched, &hooks, a->ctx, a->trace, &err);
    return NULL;
}

Test(schedule, pipe_run_drives_a_threaded_pipeline)
{
    float x[T_M][T_N];
    for (int mb = 0; mb < T_M; mb++)
        for (int i = 0; i < T_N; i++)
            x[mb][i] = (float)((mb * 7 + i * 3) % 11) / 11.0f - 0.4f;
    float w[T_P] = {1.5f, -0.5f, 2.0f, 0.75f};
    /* serial reference: y = (prod w) x, L = sum y^2 / 2, dL/dw_s = sum y * (prod w) x / w_s */
    double prod = 1;
    for (int s = 0; s < T_P; s++)
        prod *= w[s];
    double ref_loss = 0, sumx2 = 0;
    for (int mb = 0; mb < T_M; mb++)
        for (int i = 0; i < T_N; i++) {
            ref_loss += 0.5 * prod * prod * x[mb][i] * x[mb][i];
            sumx2 += (double)x[mb][i] * x[mb][i];
        }
    for (int k = 0; k < 2; k++) {
        mailbox_t *box = calloc(1, sizeof(*box));
        pthread_mutex_init(&box->mu, NULL);
        pthread_cond_init(&box->cv, NULL);
        stage_ctx_t *ctx = calloc(T_P, sizeof(stage_ctx_t));
        pipe_sched_t sc[T_P];
        thread_arg_t args[T_P];
        pthread_t th[T_P];
        pipe_trace_entry_t *trace[T_P];
        kiln_err_t err;
        for (int s = 0; s < T_P; s++) {
            ctx[s] = (stage_ctx_t){.mb = box, .s = s, .p = T_P, .w = w[s], .x = (const float(*)[T_N])x};
            cr_assert_eq(pipe_sched_build((pipe_sched_kind_t)k, s, T_P, T_M, &sc[s], &err), 0);
            trace[s] = calloc(sc[s].n, sizeof(pipe_trace_entry_t));
            args[s] = (thread_arg_t){.ctx = &ctx[s], .sched = &sc[s], .trace = trace[s]};
            pthread_create(&th[s], NULL, run_stage, &args[s]);
        }
        for (int s = 0; s < T_P; s++) {
            pthread_join(th[s], NULL);
            cr_assert_eq(args[s].rc, 0);
            cr_assert_eq(ctx[s].calls, T_M);
            /* dL/dw_s = prod^2 / w_s * sum x^2 */
            double want = prod * prod / w[s] * sumx2;
            cr_assert_float_eq(ctx[s].dw, want, 1e-4 * (1 + fabs(want)), "%s stage %d: dw %.6f, want %.6f",
                               pipe_sched_name(k), s, ctx[s].dw, want);
            for (int i = 0; i < sc[s].n; i++) {
                cr_assert_eq(trace[s][i].kind, sc[s].actions[i].kind);
                cr_assert_leq(trace[s][i].t0, trace[s][i].t1);
                if (i)
                    cr_assert_leq(trace[s][i - 1].t1, trace[s][i].t0);
            }
            free(trace[s]);
            pipe_sched_deinit(&sc[s]);
        }
        cr_assert_float_eq(ctx[T_P - 1].loss, ref_loss, 1e-4 * (1 + ref_loss));
        free(ctx);
        free(box);
    }
}

static int h_fail(void *c, int mb, int slot, kiln_err_t *err)
{
    (void)c;
    (void)slot;
    return mb == 1 ? kiln_err_set(err, KILN_ECOMM, NULL, "peer gone at mb %d", mb) : 0;
}

Test(schedule, pipe_run_stops_at_the_first_failure)
{
    pipe_sched_t s;
    kiln_err_t err;
    cr_assert_eq(pipe_sched_build(PIPE_SCHED_INTERLEAVED, 0, 1, 3, &s, &err), 0);
    pipe_hooks_t h = {.forward = h_fail};
    cr_assert_eq(pipe_run(&s, &h, NULL, NULL, &err), KILN_ECOMM);
    cr_assert_str_eq(err.message, "peer gone at mb 1");
    pipe_sched_deinit(&s);
}
